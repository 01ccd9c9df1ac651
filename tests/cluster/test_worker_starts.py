"""How `wireproto serve --workers 2` starts, and stops, when its workers do not start as they
should: no process can be made for one, an app stops its worker's reactor, blocks for ever or
forks a process that outlives its worker (docs/cluster.md, "On one machine")."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest_twisted

from tests.cluster.conftest import _need_nats_server
from tests.cluster.test_app_workers import supervised
from tests.cluster.test_workers import workers_of
from tests.support import eventually
from tests.test_app import WIREPROTO, run
from tests.test_cli import Child
from tests.test_start_failures import one_line

LISTEN = ("--listen", "websmq+length32@tcp:0:interface=127.0.0.1")

APPS = '''
import os
import time

from twisted.internet import reactor

HERE = os.path.dirname(os.path.abspath(__file__))


def stops(service):
    reactor.stop()


def blocks(service):
    time.sleep(3600)


def forks(service):
    # A process of the app's own, which keeps what the worker leaves it (its pipes, its sockets)
    # for longer than the worker lives; its pid is written down for the test to end it.
    child = os.fork()
    if child == 0:
        time.sleep(120)
        os._exit(0)
    with open(os.path.join(HERE, "forked.txt"), "a") as file:
        file.write(f"{child}\\n")
'''


def write_apps(directory: Path) -> Path:
    (directory / "apps.py").write_text(APPS)
    return directory


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_worker_that_cannot_be_made_fails_the_start_in_one_line(tmp_path: Path) -> None:
    # A descriptor above the limit of open files: a worker, given every descriptor the
    # supervisor passes on, cannot be made.
    _need_nats_server()
    started = time.monotonic()
    done = run("bash", "-c", 'exec 251>/dev/null; ulimit -n 100; exec "$@"', "bash",
               WIREPROTO, "serve", "--workers", "2", *LISTEN, cwd=tmp_path, timeout=60)
    assert done.returncode == 1, done.stderr
    assert re.fullmatch(r"wireproto: worker 0: could not be started: .+", one_line(done))
    assert time.monotonic() - started < 30


def test_an_app_that_stops_its_workers_reactor_fails_the_start(tmp_path: Path) -> None:
    # Before, each worker ended "cleanly" and was started again, for ever.
    _need_nats_server()
    write_apps(tmp_path)
    done = run(WIREPROTO, "serve", "--workers", "2", "--app", "apps:stops", *LISTEN,
               cwd=tmp_path, timeout=60)
    assert done.returncode == 1, done.stderr
    assert re.fullmatch(r"wireproto: worker [01]: ended before it was ready \(.+\)",
                        one_line(done))


@pytest_twisted.ensureDeferred
async def test_workers_blocked_in_their_app_are_noted_and_die_with_their_supervisor(
        tmp_path: Path) -> None:
    _need_nats_server()
    write_apps(tmp_path)
    child = Child(WIREPROTO, "serve", "--workers", "2", "--app", "apps:blocks", *LISTEN,
                  cwd=tmp_path)
    try:
        noted = re.compile(r"worker \d \(pid \d+\) is not ready after 10 s")
        await eventually(lambda: any(map(noted.search, child.stderr)), timeout=60)
        workers = workers_of(child.process.pid)
        assert len(workers) == 2
        child.process.kill()
        await child.exit_code(15)
        # Before, they went on blocking, with ppid 1, holding the listening socket.
        await eventually(lambda: not any(alive(pid) for pid in workers), timeout=10)
    finally:
        child.kill()


@pytest_twisted.ensureDeferred
async def test_a_worker_whose_app_forked_is_started_again_and_the_supervisor_stops(
        tmp_path: Path) -> None:
    write_apps(tmp_path)
    child, pids = await supervised("--app", "apps:forks", *LISTEN, cwd=tmp_path)
    forked = [int(line) for line in (tmp_path / "forked.txt").read_text().split()]
    try:
        os.kill(pids[0], signal.SIGKILL)
        # Before, the supervisor waited for the worker's pipes, held by its forked process,
        # and neither started it again nor could stop.
        await eventually(lambda: len(set(workers_of(child.process.pid)) - set(pids)) == 1,
                         timeout=30)
        started = time.monotonic()
        child.process.send_signal(signal.SIGTERM)
        # (Its forked processes hold its stderr: the process's end is what counts.)
        await eventually(lambda: child.process.poll() is not None, timeout=30)
        assert child.process.returncode in (0, -signal.SIGTERM), child.output()
        assert time.monotonic() - started < 15
    finally:
        child.kill()
        for pid in [int(line) for line in (tmp_path / "forked.txt").read_text().split()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert len(forked) == 2
