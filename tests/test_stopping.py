"""Ctrl-C and SIGTERM at any moment of any command: each command runs as a real process (against
a real broker where it needs one) and gets SIGINT or SIGTERM 0.05, 0.2, 0.5 or 1 s after it
starts, while it still has work to do. It must exit with the status docs/tools.md and
docs/running.md give for a stop, with nothing on stderr: no traceback, whatever it was
importing or doing.

A moment counts from the start of `wireproto.cli.main`, seen as its SIGTERM handler in
/proc/PID/status (or, if none comes, 10 s after the process started): before it, the
interpreter is still starting and nothing of wireproto runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import defer

from tests.brokers import LOCAL, Broker
from tests.pipeline.conftest import need_spark
from tests.pipeline.test_analyze import small_capture
from tests.support import sleep, starts_its_own_spark

MOMENTS = (0.05, 0.2, 0.5, 1.0)
SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_LIMIT = 60.0  # seconds from its start for a process to be stopped and gone, on a busy CI
NO_HANDLER_AFTER = 10.0  # a process with no SIGTERM handler by then is signalled all the same
# The status after a stop: 130 for a command that had work left, 0 for one that runs until
# it is stopped (docs/tools.md, docs/running.md).
STOPPED = {"pub": 130, "sub": 0, "call": 130, "produce": 130, "events": 0, "passwd": 130,
           "check-config": 130, "serve": 0, "analyze": 130}


@dataclass
class Run:
    """One `wireproto ARGS` process, to be sent `signum` `moment` seconds after main started."""

    name: str
    args: list[str]
    signum: int
    moment: float
    directory: Path
    hold_stdin: bool = False
    env: dict[str, str] = field(default_factory=dict)
    sent_after: float | None = None

    def __post_init__(self) -> None:
        label = f"{self.name}-{self.signum}-{self.moment}"
        self.stdout_path = self.directory / f"{label}.out"
        self.stderr_path = self.directory / f"{label}.err"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "wireproto", *self.args], cwd=self.directory,
                stdin=subprocess.PIPE if self.hold_stdin else subprocess.DEVNULL,
                stdout=out, stderr=err, env={**os.environ, **self.env},
            )
        self.started = time.monotonic()
        self.main_started: float | None = None

    def step(self) -> None:
        """Send the signal once it is due."""
        if self.sent_after is not None or self.process.poll() is not None:
            return
        now = time.monotonic()
        if self.main_started is None and (catches_sigterm(self.process.pid)
                                          or now - self.started > NO_HANDLER_AFTER):
            self.main_started = now
        if self.main_started is not None and now - self.main_started >= self.moment:
            self.process.send_signal(self.signum)
            self.sent_after = now - self.main_started

    def describe(self) -> str:
        return (f"{self.name} {signal.Signals(self.signum).name} at {self.moment} s "
                f"(sent {self.sent_after} s after main started), exit "
                f"{self.process.returncode}:\nstdout:\n{self.stdout_path.read_text()}"
                f"\nstderr:\n{self.stderr_path.read_text()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        if self.process.stdin is not None:
            self.process.stdin.close()


def catches_sigterm(pid: int) -> bool:
    """Whether process `pid` has a handler for SIGTERM (wireproto's main installs one first)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


async def stop_all(runs: list[Run]) -> None:
    """Signal each run when due, and wait (keeping the reactor turning) until all are gone;
    each must have been signalled while running, and have exited as a stop says."""
    try:
        while any(run.process.poll() is None for run in runs):
            for run in runs:
                run.step()
                assert run.process.poll() is not None or \
                    time.monotonic() - run.started < EXIT_LIMIT, (
                        f"still running after {EXIT_LIMIT} s: " + run.describe())
            await sleep(0.005)
    finally:
        for run in runs:
            run.kill()
    for run in runs:
        assert run.sent_after is not None, "it ended before the signal: " + run.describe()
        assert run.process.returncode == STOPPED[run.name], run.describe()
        assert run.stderr_path.read_bytes() == b"", run.describe()


@pytest_twisted.async_yield_fixture
async def broker() -> AsyncIterator[dict[str, str]]:
    """A broker with WEBSMQ, UBRE (a call to "never" is never answered) and SubbleSocket over
    WebSocket."""
    running = Broker()
    try:
        service, bound = await running.start(f"websmq+ws@tcp:0:{LOCAL}",
                                             f"ubre+ws@tcp:0:{LOCAL}",
                                             f"subble+ws@tcp:0:{LOCAL}")
        service.server("ubre").handle("never", lambda body, peer: defer.Deferred())
        yield {entry.listener.protocol: entry.address for entry in bound}
    finally:
        await running.close()


def commands(address: dict[str, str], directory: Path) -> dict[str, tuple[list[str], bool]]:
    """Each command as it is still at work a second after it starts (its arguments, and
    whether its stdin is held open): waiting for stdin, for an answer, for messages, or
    importing an application that takes its time."""
    (directory / "slowapp.py").write_text("import time\ntime.sleep(120)\n\n\ndef setup(broker):\n"
                                          "    pass\n")
    (directory / "slow.toml").write_text('[app]\nsetup = "slowapp:setup"\n')
    return {
        "pub": (["pub", address["websmq"], "-t", "t"], True),
        "sub": (["sub", address["websmq"], "-t", "t"], False),
        "call": (["call", address["ubre"], "never", "1"], False),
        "produce": (["produce", address["subble"], "-t", "reading"], True),
        "events": (["events", address["subble"], "-t", "reading"], False),
        "passwd": (["passwd", str(directory / "passwords"), "alice"], True),
        "check-config": (["check-config", "slow.toml"], False),
        "serve": (["serve", "--listen", f"websmq+ws@tcp:0:{LOCAL}"], False),
    }


@pytest.mark.timeout(600)
@pytest_twisted.ensureDeferred
async def test_every_command_stops_quietly_at_any_moment(broker: dict[str, str],
                                                         tmp_path: Path) -> None:
    # Before, a signal in the first second printed a traceback (an AttributeError from a
    # module half imported) and exited 1, and call printed "KeyboardInterrupt:" and exited 1.
    for signum in SIGNALS:
        for moment in MOMENTS:
            directory = tmp_path / f"{signum}-{moment}"
            directory.mkdir()
            await stop_all([Run(name, args, signum, moment, directory, hold_stdin=held)
                            for name, (args, held) in commands(broker, directory).items()])


@starts_its_own_spark
@pytest.mark.timeout(600)
@pytest_twisted.ensureDeferred
async def test_analyze_stops_quietly_at_any_moment_of_its_start(tmp_path: Path) -> None:
    need_spark()  # with pyspark missing it would end at once, saying so
    small_capture(tmp_path / "capture")
    env = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    for moment in MOMENTS:
        runs = []
        for signum in SIGNALS:
            directory = tmp_path / f"{signum}-{moment}"
            directory.mkdir()
            runs.append(Run("analyze", ["analyze", str(tmp_path / "capture"), "--out", "out",
                                        "--master", "local[1]"], signum, moment, directory,
                            env=env))
        await stop_all(runs)
