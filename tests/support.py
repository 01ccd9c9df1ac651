"""Helpers for tests that run on the real reactor (through pytest-twisted)."""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from twisted.internet import defer, reactor, task

__all__ = ["wait_for", "sleep", "eventually", "failure_of", "free_port", "quiet_port", "Inbox",
           "need_interop_peer", "write_secret", "on_the_default_ports", "starts_its_own_spark"]

# The tests that run a broker on the built-in default ports (8765-8769), as a user's first
# `wireproto serve` does: the suite's parallel workers (pytest-xdist, --dist loadgroup) run
# them all on one worker, one after another, since only one broker at a time can hold them.
on_the_default_ports = pytest.mark.xdist_group("default-ports")

# The tests that start a Spark of their own, a JVM each (a `wireproto analyze` child, or the
# pipeline benchmark's session): one worker runs them one after another, so that with the
# worker holding the shared SparkSession (tests/pipeline/conftest.py) at most two JVMs share
# the cores; more made each of them several times slower, past their time limits.
starts_its_own_spark = pytest.mark.xdist_group("own-spark")


def write_secret(path: Path, data: bytes) -> Path:
    """Write a key or password file as the broker wants one: its owner's alone (0600)."""
    path.write_bytes(data)
    path.chmod(0o600)
    return path


async def wait_for(awaitable: Any, timeout: float = 5.0) -> Any:
    """Await a Deferred or coroutine, failing with TimeoutError instead of hanging."""
    d = defer.ensureDeferred(awaitable) if not isinstance(awaitable, defer.Deferred) else awaitable
    d.addTimeout(timeout, reactor)
    try:
        return await d
    except defer.TimeoutError as exc:
        raise TimeoutError(f"nothing happened within {timeout} s") from exc


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (for now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def quiet_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, below the kernel's ephemeral range.

    For a server a test stops and starts again on the same port: a port of the ephemeral
    range may meanwhile be handed to any connection or port-0 listener of another test, and
    the restart then fails with "address already in use". No such port is handed out here."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as limits:
            ephemeral_low = int(limits.read().split()[0])
    except (OSError, ValueError, IndexError):
        return free_port()
    if ephemeral_low <= 20000:
        return free_port()
    pick = random.SystemRandom()
    for _ in range(100):
        port = pick.randrange(20000, ephemeral_low)
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    return free_port()


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


async def eventually(check: Any, timeout: float = 5.0, interval: float = 0.01) -> Any:
    """Poll `check()` until it returns something truthy; fail after `timeout` seconds."""
    loops = max(1, int(timeout / interval))
    for _ in range(loops):
        result = check()
        if result:
            return result
        await sleep(interval)
    raise TimeoutError(f"condition not met within {timeout} s: {check}")


async def failure_of(d: defer.Deferred, timeout: float = 5.0) -> BaseException:
    """The exception `d` fails with (within `timeout` s); fails the test if `d` succeeds."""
    try:
        result = await wait_for(d, timeout)
    except Exception as error:
        return error
    raise AssertionError(f"expected a failure, got {result!r}")


class Inbox:
    """A subscription callback that keeps every message it is given."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    def __call__(self, message: Any) -> None:
        self.messages.append(message)

    async def wait(self, count: int = 1, timeout: float = 5.0) -> list[Any]:
        await eventually(lambda: len(self.messages) >= count, timeout)
        return self.messages


def need_interop_peer(path: Path, what: str) -> str:
    """The `node` executable, if it and `path` (a package in tests/interop) are there. Without
    them a test is skipped on a developer's machine but fails under CI, where `make test` has
    installed both, so a real-peer test can never pass by not running."""
    node = shutil.which("node")
    need_peer(
        "node is not installed" if node is None
        else None if path.exists()
        else f"{path} is missing; run `npm ci` in tests/interop",
        what,
    )
    assert node is not None
    return node


def need_module(name: str, install: str) -> None:
    """At a test module's top: skip the module (on a developer's machine) or fail (under CI)
    when `name` cannot be imported; `install` says how to get it."""
    if importlib.util.find_spec(name) is not None:
        return
    message = f"{name} is not installed: {install}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)


def need_peer(missing: str | None, what: str) -> None:
    """Skip (on a developer's machine) or fail (under CI) a real-peer test, saying what is
    `missing`; do nothing if nothing is."""
    if missing is None:
        return
    message = f"{what} needs a real peer: {missing}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
