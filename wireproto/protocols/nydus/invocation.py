"""What nydus handlers get and raise: the `Invocation` of a route, `InvokeError` for an answer of
the handler's choosing, and the data an ERROR carries (docs/nydus.md, "Handlers")."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from wireproto.codecs.nydus import NO_DATA
from wireproto.protocols.rpc import RequestFailed

_INTERNAL_ERROR = HTTPStatus.INTERNAL_SERVER_ERROR

if TYPE_CHECKING:
    from wireproto.protocols.nydus.server import NydusServer, NydusServerProtocol

__all__ = [
    "error_data",
    "InvokeError",
    "Invocation",
    "Handler",
]

# -- what handlers get and raise -----------------------------------------------------------------


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


@dataclass(frozen=True)
class Invocation:
    """One INVOKE, as its handler gets it (nydus's handler data).

    `path` is the path the client invoked, decoded; `route` the pattern that matched it (what
    nydus calls `path`); `params` and `splats` its captures (wireproto.routes); `body` the
    INVOKE's data, None when it had none. `client` is the connection, to subscribe or to reply
    to later; `server` the NydusServer.
    """

    server: NydusServer
    client: NydusServerProtocol
    path: str
    route: str
    params: dict[str, str | None] = field(default_factory=dict)
    splats: list[str | None] = field(default_factory=list)
    body: Any = None
    id: str = ""


# handler(invocation) -> result, a Deferred of one, or a coroutine. Raise InvokeError to fail.
Handler = Callable[[Invocation], Any]


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
