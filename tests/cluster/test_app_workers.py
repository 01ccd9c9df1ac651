"""`wireproto serve --workers 2 --app MODULE:FUNCTION`: the application's function runs in each
worker (never in the supervisor), so examples/app.py's UBRE handler and nydus route answer real
clients landing on both workers, its SubbleSocket hook refuses and its hub callback alerts once
per reading across both; a handler registered in one worker only answers the clients of the
other through the cluster; a worker started again runs the function again, one whose function
fails then is logged and retried while the other serves, one whose function blocks takes no
connection meanwhile; SIGHUP does not run it again; a function that fails at the start stops the
supervisor in one line, status 1."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.cluster.conftest import _need_nats_server
from tests.cluster.test_workers import workers_of
from tests.support import eventually, sleep, wait_for
from tests.test_app import (
    EXAMPLES,
    FAILURES,
    LISTENERS,
    TWISTD,
    WIREPROTO,
    addresses,
    check_the_example,
    failing_apps,
    nydus_invoke,
    run,
    started,
    stopped,
    ubre_request,
)
from tests.test_cli import Child
from tests.test_start_failures import one_line
from wireproto.protocols.nydus import client as nydus_client
from wireproto.protocols.ubre.client import connect as ubre_connect

HOST = socket.gethostname()
NODES = {f"{HOST}/worker0", f"{HOST}/worker1"}
READY = r"wireproto: ready"

# The tests' application: `setup` runs in each worker; a file `refuse` or `slow` beside it makes
# the next call fail or block, as a worker started again finds it. Each import and each call is
# written down with the process's id.
APP = '''
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def note(what):
    with open(os.path.join(HERE, what + ".txt"), "a") as file:
        file.write(f"{os.getpid()}\\n")


note("imports")


def setup(service):
    if os.path.exists(os.path.join(HERE, "refuse")):
        raise RuntimeError("refused after a restart")
    if os.path.exists(os.path.join(HERE, "slow")):
        time.sleep(4)
    note("calls")
    node = service.node
    ubre = service.server("ubre")
    ubre.handle("node", lambda body, peer: node)
    if node.endswith("/worker0"):
        # Served by the first worker alone: the second's clients reach it through the cluster.
        ubre.handle("first", lambda body, peer: node)
        service.server("nydus").register_route("/first/:thing", lambda call: {
            "thing": call.params["thing"], "node": node})
    else:
        service.server("nydus").register_route("/node", lambda call: node)
    service.server("nydus").register_route("/here", lambda call: node)


def prints(service):
    print("failed: not really", flush=True)
    print("ready", flush=True)
    setup(service)
'''


def write_app(directory: Path) -> Path:
    (directory / "myapp.py").write_text(APP)
    return directory


def noted(directory: Path, what: str) -> list[int]:
    path = directory / f"{what}.txt"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


async def supervised(*args: str, cwd: Path, twistd: bool = False) -> tuple[Child, list[int]]:
    """`wireproto serve --workers 2` (or twistd's) with `args` in `cwd`, once ready: the process
    and its workers' pids."""
    _need_nats_server()
    program = (TWISTD, "-n", "--pidfile=", "wireproto") if twistd else (WIREPROTO, "serve")
    child = await started(*program, "--workers", "2", *args, cwd=cwd, ready=READY)
    pids = re.search(r"(\d+) (\d+)$", next(line for line in child.stdout if " workers, pids "
                                           in line))
    assert pids is not None
    return child, [int(pids.group(1)), int(pids.group(2))]


async def stop(child: Child) -> None:
    assert await stopped(child) in (0, -signal.SIGTERM), child.output()
    assert workers_of(child.process.pid) == []


async def answered_by(address: str, node: str, within: float = 30):
    """A UBRE client whose connection landed on the worker `node`, its `node` answer said;
    tried for `within` seconds (a worker just started accepts once it is ready)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        client = await wait_for(ubre_connect(reactor, address), 10)
        if await wait_for(client.request("node", timeout=10), 15) == node:
            return client
        await wait_for(client.close(), 10)
        await sleep(0.02)
    raise AssertionError(f"no connection landed on {node} in {within} s")


@pytest_twisted.ensureDeferred
async def test_the_example_answers_clients_of_both_workers() -> None:
    child, _ = await supervised("--app", "app:setup", *LISTENERS, cwd=EXAMPLES)
    try:
        served = addresses(child)
        nodes: set[str] = set()
        async def ubre() -> None:
            answer = await ubre_request(served["ubre"], "add", [1, 2])
            assert isinstance(answer, dict) and answer["sum"] == 3
            nodes.add(f"ubre {answer['node']}")

        async def nydus() -> None:
            answer = await nydus_invoke(served["nydus"], "/rooms/lobby/join")
            assert isinstance(answer, dict) and answer["joined"] == "lobby"
            nodes.add(f"nydus {answer['node']}")

        # New connections until each worker has answered both calls. The supervisor hands a
        # port's connections to the workers in turn, and a nydus call may make two (its
        # handshake and its POST): a spare connection every other time shifts its turn, or
        # every handshake could land on the same worker.
        for attempt in range(100):
            await ubre()
            await nydus()
            if len(nodes) == 4:
                break
            if attempt % 2:
                nydus_at = urlsplit(served["nydus"])
                socket.create_connection((nydus_at.hostname, nydus_at.port), timeout=10).close()
        assert nodes == {f"{kind} {node}" for kind in ("ubre", "nydus") for node in NODES}
        await check_the_example(served)
    finally:
        await stop(child)


@pytest_twisted.ensureDeferred
async def test_a_hot_reading_makes_one_alert_whichever_worker_takes_it() -> None:
    # Both workers follow `readings` (the hub callback) and hear each other's readings through
    # NATS: each acts on its own only, so every hot reading is one alert, not two.
    from wireproto.protocols.subble import client as subble_client

    child, _ = await supervised("--app", "app:setup", *LISTENERS, cwd=EXAMPLES)
    try:
        served = addresses(child)
        alerts: list = []
        watcher = await wait_for(subble_client.connect(
            reactor, served["subble"], subscribe=["alerts"], on_event=alerts.append), 10)
        sensors = [await wait_for(subble_client.connect(reactor, served["subble"],
                                                        produce=["readings"]), 10)
                   for _ in range(6)]
        for _ in range(50):  # until the watcher's worker hears of `alerts` from the other
            for sensor in sensors:
                await wait_for(sensor.produce("readings", {"room": "r", "celsius": 40},
                                              timeout=10), 15)
            await sleep(0.3)
            if len(alerts) >= len(sensors):
                break
        await sleep(1.0)
        before = len(alerts)
        for sensor in sensors:
            await wait_for(sensor.produce("readings", {"room": "r", "celsius": 40}, timeout=10),
                           15)
        await eventually(lambda: len(alerts) >= before + len(sensors), timeout=10)
        await sleep(1.0)
        assert len(alerts) == before + len(sensors)
        for client in (watcher, *sensors):
            await wait_for(client.close(), 10)
    finally:
        await stop(child)


@pytest_twisted.ensureDeferred
async def test_a_handler_of_one_worker_answers_clients_of_the_other(tmp_path: Path) -> None:
    write_app(tmp_path)
    child, pids = await supervised("--app", "myapp:setup", "--listen",
                                   "ubre+ws@tcp:0:interface=127.0.0.1", "--listen",
                                   "nydus+lines@tcp:0:interface=127.0.0.1", cwd=tmp_path)
    try:
        served = addresses(child)
        # Each worker imported the module and called the function once; the supervisor did
        # neither.
        assert sorted(noted(tmp_path, "imports")) == sorted(pids)
        assert sorted(noted(tmp_path, "calls")) == sorted(pids)
        second = await answered_by(served["ubre"], f"{HOST}/worker1")
        try:
            assert await wait_for(second.request("first", timeout=10), 15) == f"{HOST}/worker0"
        finally:
            await wait_for(second.close(), 10)
        first = await answered_by(served["ubre"], f"{HOST}/worker0")
        await wait_for(first.close(), 10)
        # nydus both ways: each worker's route answers the other's clients.
        lines = served["nydus"].replace("tcp:127.0.0.1:", "tcp:host=127.0.0.1:port=")
        seen = set()
        for _ in range(100):  # new connections until clients of both workers have asked
            client = await wait_for(nydus_client.connect(reactor, lines), 10)
            try:
                answer = await wait_for(client.invoke("/first/x", timeout=10), 15)
                assert answer == {"thing": "x", "node": f"{HOST}/worker0"}
                assert await wait_for(client.invoke("/node", timeout=10), 15) == \
                    f"{HOST}/worker1"
                seen.add(await wait_for(client.invoke("/here", timeout=10), 15))
            finally:
                await wait_for(client.close(), 10)
            if len(seen) == 2:
                break
        assert seen == NODES
    finally:
        await stop(child)


@pytest_twisted.ensureDeferred
async def test_each_worker_knows_the_others_routes_once_ready(tmp_path: Path) -> None:
    # A nydus route is known to the other processes from their heartbeats. With 5 s between
    # them, a worker ready before the other told it of none of the other's routes for up to 5 s,
    # and its clients were answered 404 for a route the other worker serves.
    write_app(tmp_path)
    config = tmp_path / "broker.toml"
    config.write_text("[cluster]\nheartbeat_interval = 5.0\nlease = 15.0\n")
    child, _ = await supervised("--config", str(config), "--app", "myapp:setup", "--listen",
                                "nydus+lines@tcp:0:interface=127.0.0.1", cwd=tmp_path)
    try:
        lines = addresses(child)["nydus"].replace("tcp:127.0.0.1:", "tcp:host=127.0.0.1:port=")
        began = time.monotonic()
        seen = set()
        while len(seen) < 2:
            assert time.monotonic() - began < 20, seen
            client = await wait_for(nydus_client.connect(reactor, lines), 10)
            try:
                here = await wait_for(client.invoke("/here", timeout=10), 15)
                # Each worker's clients call the route only the other serves.
                if here == f"{HOST}/worker0":
                    assert await wait_for(client.invoke("/node", timeout=10), 15) == \
                        f"{HOST}/worker1"
                else:
                    assert await wait_for(client.invoke("/first/x", timeout=10), 15) == {
                        "thing": "x", "node": f"{HOST}/worker0"}
                seen.add(here)
            finally:
                await wait_for(client.close(), 10)
        assert time.monotonic() - began < 4.0
    finally:
        await stop(child)


@pytest_twisted.ensureDeferred
async def test_sighup_does_not_run_the_app_again(tmp_path: Path) -> None:
    write_app(tmp_path)
    child, pids = await supervised("--app", "myapp:setup", "--listen",
                                   "ubre+ws@tcp:0:interface=127.0.0.1", cwd=tmp_path)
    try:
        child.process.send_signal(signal.SIGHUP)
        await eventually(lambda: sum("reload: no [auth] table" in line
                                     for line in child.stderr) == 2, timeout=15)
        assert sorted(noted(tmp_path, "calls")) == sorted(pids)
        assert sorted(noted(tmp_path, "imports")) == sorted(pids)
        await wait_for(ubre_request(addresses(child)["ubre"], "node"), 20)
    finally:
        await stop(child)


@pytest_twisted.ensureDeferred
async def test_a_worker_started_again_runs_the_app_again_and_is_retried_while_it_fails(
    tmp_path: Path,
) -> None:
    write_app(tmp_path)
    child, pids = await supervised("--app", "myapp:setup", "--listen",
                                   "ubre+ws@tcp:0:interface=127.0.0.1", cwd=tmp_path)
    try:
        address = addresses(child)["ubre"]
        (tmp_path / "refuse").write_text("")
        os.kill(pids[0], signal.SIGKILL)
        failed = re.compile(r".*worker 0 \(pid (\d+)\) could not start: app myapp:setup: "
                            r"raised RuntimeError: refused after a restart$")
        await eventually(lambda: any(map(failed.match, child.stderr)), timeout=20)
        # Meanwhile the other worker takes every connection, and answers.
        for _ in range(10):
            assert await ubre_request(address, "node") == f"{HOST}/worker1"
        assert "Traceback" not in child.output()
        (tmp_path / "refuse").unlink()
        # Started again after a pause that grew: it runs the function again, and serves.
        restarted = await eventually(
            lambda: [pid for pid in noted(tmp_path, "calls") if pid not in pids], timeout=40)
        assert restarted[0] in workers_of(child.process.pid)
        client = await answered_by(address, f"{HOST}/worker0")
        await wait_for(client.close(), 10)
        assert child.process.poll() is None
    finally:
        await stop(child)


@pytest_twisted.ensureDeferred
async def test_a_worker_whose_app_blocks_takes_no_connection_until_it_is_done(
    tmp_path: Path,
) -> None:
    write_app(tmp_path)
    child, pids = await supervised("--app", "myapp:setup", "--listen",
                                   "ubre+ws@tcp:0:interface=127.0.0.1", cwd=tmp_path)
    try:
        address = addresses(child)["ubre"]
        (tmp_path / "slow").write_text("")
        os.kill(pids[0], signal.SIGKILL)
        await eventually(lambda: [pid for pid in workers_of(child.process.pid)
                                  if pid not in pids], timeout=15)
        # The new worker blocks 4 s in its function: every connection meanwhile goes to the
        # other worker, at once, and is answered.
        began = time.monotonic()
        while time.monotonic() - began < 3.0:
            asked = time.monotonic()
            assert await ubre_request(address, "node") == f"{HOST}/worker1"
            assert time.monotonic() - asked < 1.0
        (tmp_path / "slow").unlink()
        client = await answered_by(address, f"{HOST}/worker0")
        await wait_for(client.close(), 10)
    finally:
        await stop(child)


@pytest.mark.parametrize(("spec", "why"), [f for f in FAILURES if f[0] in (
    "nosuch:setup", "broken_syntax:setup", "myapp:NOT_CALLABLE", "myapp:raises",
    "myapp:fails_later")], ids=["import", "syntax", "not callable", "raising", "failing later"])
def test_workers_whose_app_fails_stop_in_one_line(tmp_path: Path, spec: str, why: str) -> None:
    _need_nats_server()
    failing_apps(tmp_path)
    done = run(WIREPROTO, "serve", "--workers", "2", "--app", spec, "--listen",
               "ubre+ws@tcp:0:interface=127.0.0.1", cwd=tmp_path, timeout=60)
    assert done.returncode == 1
    assert one_line(done) in (f"wireproto: worker {index}: app {spec}: "
                              f"{why.format(cwd=tmp_path)}" for index in (0, 1))


@pytest_twisted.ensureDeferred
async def test_twistd_workers_run_the_app(tmp_path: Path) -> None:
    write_app(tmp_path)
    child, pids = await supervised("--app", "myapp:setup", "--listen",
                                   "ubre+ws@tcp:0:interface=127.0.0.1", cwd=tmp_path,
                                   twistd=True)
    try:
        assert sorted(noted(tmp_path, "calls")) == sorted(pids)
        client = await answered_by(addresses(child)["ubre"], f"{HOST}/worker1")
        assert await wait_for(client.request("first", timeout=10), 15) == f"{HOST}/worker0"
        await wait_for(client.close(), 10)
    finally:
        await stop(child)


@pytest_twisted.ensureDeferred
async def test_what_the_app_prints_never_passes_for_a_workers_report(tmp_path: Path) -> None:
    # A worker's stdout is its pipe to the supervisor, where "ready" and "failed: WHY" are its
    # reports: an app that printed "failed: ..." stopped the supervisor, one that printed
    # "ready" could make it ready early, and what it printed was never seen.
    write_app(tmp_path)
    child, pids = await supervised("--app", "myapp:prints", "--listen",
                                   "ubre+ws@tcp:0:interface=127.0.0.1", cwd=tmp_path)
    try:
        assert sorted(noted(tmp_path, "calls")) == sorted(pids)
        assert child.stderr.count("failed: not really") == 2, child.output()
        assert not any("not really" in line for line in child.stdout)
        client = await answered_by(addresses(child)["ubre"], f"{HOST}/worker1")
        await wait_for(client.close(), 10)
    finally:
        await stop(child)
