"""Request/response plumbing shared by the protocols that have it: ids, pending requests with
timeouts, calling handlers however they are written, and errors as data.

A protocol that sends requests keeps a `PendingRequests`. Each request gets a Deferred that fires
with the reply, or fails with `RequestFailed` (the peer said no, with a body), `RequestTimeout`,
or `ConnectionClosed` (every pending request fails when its connection goes).

A protocol that answers requests calls its handler through `run_handler`, so a handler may return
a value, a Deferred, or be a coroutine function, and turns a handler's exception into a body the
peer can read with `error_body`.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from inspect import iscoroutine
from time import perf_counter
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT",
    "RequestFailed",
    "RequestTimeout",
    "ConnectionClosed",
    "PendingRequests",
    "run_handler",
    "error_body",
]

DEFAULT_REQUEST_TIMEOUT = 30.0


class RequestFailed(Exception):
    """The peer answered a request with a failure; `body` is what it said.

    A handler may raise it too, to fail a request with a body of its choosing, as is.
    """

    def __init__(self, body: Any = None, *, request: Any = None) -> None:
        self.body = body
        self.request = request
        super().__init__(body)

    def __str__(self) -> str:
        what = f"request {self.request!r} failed" if self.request is not None else "failed"
        body = self.body
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            name = body.get("name")
            detail = f"{name}: {body['message']}" if isinstance(name, str) else body["message"]
        else:
            detail = repr(body)
        return f"{what}: {detail}"


class RequestTimeout(TimeoutError):
    """No reply came within the request's timeout."""


class ConnectionClosed(ConnectionError):
    """The connection closed (or was never open) before the request could be answered."""


class PendingRequests:
    """Requests sent and not yet answered, by id: 1, 2, 3... per connection or client.

    Ids are matched by their text, so a reply that says "7" answers request 7 (binary formats
    carry ids as text).
    """

    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self._last_id = 0
        self._waiting: dict[str, tuple[defer.Deferred, IDelayedCall | None, Any]] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def next_id(self) -> int:
        self._last_id += 1
        return self._last_id

    def add(self, request_id: Any, *, timeout: float | None, what: Any = None) -> defer.Deferred:
        """A Deferred for the reply to `request_id`; `what` names the request in errors."""
        key = str(request_id)
        if key in self._waiting:
            raise ValueError(f"request id {request_id!r} is already waiting for a reply")
        d: defer.Deferred = defer.Deferred(lambda _: self._forget(key))
        timer = None
        if timeout is not None:
            timer = self.clock.callLater(timeout, self._timed_out, key, timeout)
        self._waiting[key] = (d, timer, what)
        return d

    def resolve(self, request_id: Any, body: Any) -> bool:
        """Fire the request's Deferred with `body`. False if no such request waits."""
        entry = self._take(str(request_id))
        if entry is None:
            return False
        entry[0].callback(body)
        return True

    def reject(self, request_id: Any, body: Any) -> bool:
        """Fail the request's Deferred with RequestFailed(body). False if none waits."""
        entry = self._take(str(request_id))
        if entry is None:
            return False
        entry[0].errback(RequestFailed(body, request=entry[2]))
        return True

    def fail_all(self, error: Exception) -> None:
        waiting, self._waiting = self._waiting, {}
        for d, timer, _ in waiting.values():
            if timer is not None and timer.active():
                timer.cancel()
            d.errback(error)

    def _take(self, key: str) -> tuple[defer.Deferred, IDelayedCall | None, Any] | None:
        entry = self._waiting.pop(key, None)
        if entry is not None and entry[1] is not None and entry[1].active():
            entry[1].cancel()
        return entry

    def _forget(self, key: str) -> None:
        self._take(key)

    def _timed_out(self, key: str, timeout: float) -> None:
        entry = self._waiting.pop(key, None)
        if entry is not None:
            what = f" {entry[2]!r}" if entry[2] is not None else ""
            entry[0].errback(RequestTimeout(f"request{what} got no reply within {timeout:g} s"))


def run_handler(
    handler: Callable[..., Any],
    args: tuple[Any, ...],
    succeeded: Callable[[Any], Any],
    failed: Callable[[Failure], Any],
    observe: Callable[[float, bool], Any] | None = None,
) -> defer.Deferred | None:
    """Call ``handler(*args)``, then `succeeded(value)` or `failed(failure)`.

    A handler that returns a plain value or raises is answered at once, without a Deferred (the
    common case, and the fast one), and None is returned. A handler that returns a Deferred or is
    a coroutine function is waited for: the Deferred returned fires after `succeeded` or `failed`
    has run, so a caller can count the requests still being worked on.

    `observe(seconds, succeeded)`, if given, is told how long the handler and its answer took
    (wireproto.metrics' latency histogram).
    """
    if observe is not None:
        started = perf_counter()
        succeeded = _timed(succeeded, observe, True, started)
        failed = _timed(failed, observe, False, started)
    try:
        result = handler(*args)
    except Exception:
        failed(Failure())
        return None
    if not isinstance(result, defer.Deferred) and not iscoroutine(result):
        succeeded(result)
        return None
    d = defer.ensureDeferred(result)
    d.addCallbacks(succeeded, failed)
    return d


def _timed(
    answer: Callable[[Any], Any], observe: Callable[[float, bool], Any], outcome: bool,
    started: float,
) -> Callable[[Any], Any]:
    def answered(result: Any) -> Any:
        try:
            return answer(result)
        finally:
            observe(perf_counter() - started, outcome)

    return answered


def error_body(error: BaseException, *, debug: bool = False) -> dict[str, Any]:
    """An exception as a JSON object a peer can read: its class name and message, a string
    `code` if it has one, and the stack only when `debug` is on (a stack tells a stranger too
    much about the server)."""
    body: dict[str, Any] = {"name": type(error).__name__, "message": str(error)}
    code = getattr(error, "code", None)
    if isinstance(code, (str, int)) and not isinstance(code, bool):
        body["code"] = code
    if debug:
        body["stack"] = "".join(traceback.format_exception(error))
    return body
