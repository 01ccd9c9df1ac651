"""Helpers for tests that run on the real reactor (through pytest-twisted)."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, reactor, task

__all__ = ["wait_for", "sleep", "eventually"]


async def wait_for(awaitable: Any, timeout: float = 5.0) -> Any:
    """Await a Deferred or coroutine, failing with TimeoutError instead of hanging."""
    d = defer.ensureDeferred(awaitable) if not isinstance(awaitable, defer.Deferred) else awaitable
    d.addTimeout(timeout, reactor)
    try:
        return await d
    except defer.TimeoutError as exc:
        raise TimeoutError(f"nothing happened within {timeout} s") from exc


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
