"""What nydus handlers raise: `InvokeError` for an answer of the handler's choosing (as the hub
routes do for data that is no path: `path_data`), and the data an ERROR carries (docs/nydus.md,
"Handlers"). What they get, an `Invocation`, is the server's (wireproto.protocols.nydus.server)."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from twisted.internet import defer
from twisted.python.failure import Failure

from wireproto.codecs.nydus import NO_DATA
from wireproto.protocols import calls
from wireproto.protocols.rpc import RequestFailed, run_handler

_INTERNAL_ERROR = HTTPStatus.INTERNAL_SERVER_ERROR

__all__ = [
    "answer_by",
    "error_data",
    "InvokeError",
    "NOT_FOUND",
    "TOO_MANY_REQUESTS",
    "FORBIDDEN",
    "GATEWAY_TIMEOUT",
    "SERVICE_UNAVAILABLE",
    "unanswered_data",
    "needs_connection",
    "path_data",
]

# -- what handlers raise -----------------------------------------------------------------


class InvokeError(Exception):
    """An INVOKE failed with an HTTP-like `status`, a `message` and an optional `body`.

    Raised by a server handler, it becomes the ERROR ``{"message", "status"[, "body"]}``; a
    `NydusClient` fails an invoke with it when the ERROR has a numeric status and a string message.
    `message` defaults to the status's HTTP reason phrase; a `body` of None is left out.
    """

    def __init__(self, status: int, message: str | None = None, body: Any = None) -> None:
        if not isinstance(status, int) or isinstance(status, bool):
            raise TypeError(f"an InvokeError status is an int, not {status!r}")
        if message is None:
            try:
                message = HTTPStatus(status).phrase
            except ValueError:
                message = "Error"
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body

    def __str__(self) -> str:
        return f"{self.status} {self.message}"

    def __repr__(self) -> str:
        body = "" if self.body is None else f", body={self.body!r}"
        return f"InvokeError({self.status!r}, {self.message!r}{body})"

    def to_data(self) -> dict[str, Any]:
        """The ERROR data nydus sends for this error: message, status, and body if there is one."""
        data: dict[str, Any] = {"message": self.message, "status": self.status}
        if self.body is not None:
            data["body"] = self.body
        return data


def path_data(data: Any) -> str:
    """The path a hub route's INVOKE gives as its data; InvokeError 400 if it gives none."""
    if not isinstance(data, str) or not data.startswith("/"):
        raise InvokeError(400, f"expected a path that starts with '/', not {data!r:.60}")
    return data


def needs_connection(client: object, route: str) -> None:
    """InvokeError 400 for a hub route that subscribes the calling connection, called from
    outside any (the admin page), which has nothing to subscribe."""
    if isinstance(client, calls.RemoteCaller):
        raise InvokeError(400, f"{route} subscribes the calling connection; a call from "
                          "outside one has none")


def answer_by(handler: Callable[..., object], invocation: object, *, debug: bool,
              observe: Callable[[float, bool], object] | None,
              unexpected: Callable[[Failure], object]) -> defer.Deferred[calls.Answer]:
    """The Answer of ``handler(invocation)`` to an INVOKE made from outside a connection
    (another process's client, the admin page): an ERROR's data when it fails. `unexpected`
    is told of a failure the handler did not mean (neither InvokeError nor RequestFailed)."""
    answered: defer.Deferred[calls.Answer] = defer.Deferred()

    def succeeded(value: object) -> None:
        try:
            answer = calls.Answer.sendable(True, calls.NO_BODY if value is None else value)
        except (TypeError, ValueError) as error:
            failed(Failure(error))
            return
        answered.callback(answer)

    def failed(failure: Failure) -> None:
        error = failure.value
        if not isinstance(error, (InvokeError, RequestFailed)):
            unexpected(failure)
        answered.callback(calls.Answer(False, error_data(error, debug)))

    run_handler(handler, (invocation,), succeeded, failed, observe)
    return answered


def error_data(error: BaseException, debug: bool) -> Any:
    """What an ERROR says for `error`, as nydus's defaultErrorConverter says it."""
    if isinstance(error, InvokeError):
        return error.to_data()
    if isinstance(error, RequestFailed):
        return NO_DATA if error.body is NO_DATA else error.body
    data: dict[str, Any] = {"message": _INTERNAL_ERROR.phrase, "status": 500}
    if debug:
        data["message"] = str(error) or type(error).__name__
        data["body"] = "".join(traceback.format_exception(error))
    return data


# -- the data of the ERRORs the server sends of itself -----------------------------------------

NOT_FOUND = {"message": "Not Found", "status": 404}
TOO_MANY_REQUESTS = {"message": "Too Many Requests", "status": 429}
FORBIDDEN = {"message": "Forbidden", "status": 403}
# A route that another broker process was to answer did not (docs/cluster.md).
GATEWAY_TIMEOUT = {"message": "Gateway Timeout", "status": 504}
SERVICE_UNAVAILABLE = {"message": "Service Unavailable", "status": 503}
UNANSWERED: dict[type[BaseException], dict[str, Any]] = {
    calls.CallNotFound: NOT_FOUND, calls.CallTooManyRequests: TOO_MANY_REQUESTS,
    calls.CallTimeout: GATEWAY_TIMEOUT,
}


def unanswered_data(error: BaseException) -> dict[str, Any]:
    """The ERROR data of an INVOKE no process answered, because of `error`."""
    return calls.unanswered(error, UNANSWERED, SERVICE_UNAVAILABLE)


