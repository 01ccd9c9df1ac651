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
from heapq import heapify, heappop, heappush
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
    carry ids as text). Timeouts share one timer, set for the earliest deadline, so a request
    and its reply cost no timer of their own: deadlines wait in a heap, and those of answered
    requests are dropped when they come up, or sooner once they outnumber the waiting ones.
    """

    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self._last_id = 0
        # key -> (Deferred, its deadline's heap entry or None, what)
        self._waiting: dict[str, tuple[defer.Deferred, tuple | None, Any]] = {}
        self._deadlines: list[tuple[float, int, str, float]] = []  # (at, seq, key, timeout)
        self._timer: IDelayedCall | None = None
        self._added = 0  # orders deadlines that fall at the same time

    def __len__(self) -> int:
        return len(self._waiting)

    def next_id(self) -> int:
        self._last_id += 1
        return self._last_id

    def add(self, request_id: Any, *, timeout: float | None, what: Any = None) -> defer.Deferred:
        """A Deferred for the reply to `request_id`; `what` names the request in errors."""
        key = str(request_id)
        waiting = self._waiting
        if key in waiting:
            raise ValueError(f"request id {request_id!r} is already waiting for a reply")
        d: defer.Deferred = defer.Deferred(lambda _: self._forget(key))
        deadline = None
        if timeout is not None:
            self._added += 1
            deadline = (self.clock.seconds() + timeout, self._added, key, timeout)
            heappush(self._deadlines, deadline)
            timer = self._timer
            if timer is None:
                self._timer = self.clock.callLater(timeout, self._expire)
            elif deadline[0] < timer.getTime():
                timer.reset(timeout)
            if len(self._deadlines) > 2 * len(waiting) + 1024:
                self._compact()
        waiting[key] = (d, deadline, what)
        return d

    def resolve(self, request_id: Any, body: Any) -> bool:
        """Fire the request's Deferred with `body`. False if no such request waits."""
        entry = self._waiting.pop(str(request_id), None)
        if entry is None:
            return False
        entry[0].callback(body)
        return True

    def reject(self, request_id: Any, body: Any) -> bool:
        """Fail the request's Deferred with RequestFailed(body). False if none waits."""
        entry = self._waiting.pop(str(request_id), None)
        if entry is None:
            return False
        entry[0].errback(RequestFailed(body, request=entry[2]))
        return True

    def fail(self, request_id: Any, error: Exception) -> bool:
        """Fail the request's Deferred with `error`. False if none waits."""
        entry = self._waiting.pop(str(request_id), None)
        if entry is None:
            return False
        entry[0].errback(error)
        return True

    def fail_all(self, error: Exception) -> None:
        waiting, self._waiting = self._waiting, {}
        self._deadlines = []
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        for d, _, _ in waiting.values():
            d.errback(error)

    def _forget(self, key: str) -> None:
        self._waiting.pop(key, None)

    def _compact(self) -> None:
        """Drop the deadlines of requests already answered."""
        self._deadlines = [entry[1] for entry in self._waiting.values() if entry[1] is not None]
        heapify(self._deadlines)

    def _expire(self) -> None:
        self._timer = None
        now = self.clock.seconds()
        deadlines, waiting = self._deadlines, self._waiting
        expired = []
        while deadlines and deadlines[0][0] <= now:
            deadline = heappop(deadlines)
            entry = waiting.get(deadline[2])
            if entry is not None and entry[1] is deadline:
                del waiting[deadline[2]]
                expired.append((entry, deadline[3]))
        while deadlines and deadlines[0][2] not in waiting:
            heappop(deadlines)
        if deadlines:
            self._timer = self.clock.callLater(max(0.0, deadlines[0][0] - now), self._expire)
        for (d, _, what), timeout in expired:
            named = f" {what!r}" if what is not None else ""
            d.errback(RequestTimeout(f"request{named} got no reply within {timeout:g} s"))


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
