"""The contract of a call that one broker process makes of another (docs/cluster.md, "Calls").

A UBRE request or a nydus INVOKE that no handler of its own process takes may be answered by a
handler on another process of the cluster. Both sides speak of it in these terms only:

- a `Call`: which protocol, the name it is addressed to (as the answering server names what it
  serves), the body, who is calling (a `RemoteCaller`), and for nydus the path invoked;
- its `Answer`: succeeded or not, and a body (a Fail's or an ERROR's when not);
- or one of the `CallUnanswered` errors, which each protocol says in its own words.

A protocol server that answers calls is a `CallServer`: it says what it serves and answers a
`Call` with a Deferred `Answer`. How a call crosses between processes (the subjects, the
envelope, its status codes) is the cluster's alone (wireproto.cluster.calls); this module knows
no transport and no cluster.

A body is `NO_BODY` (UBRE's missing body, nydus's empty data), bytes, or a JSON value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from wireproto.access.policy import Principal
from wireproto.codecs.serialization import json_loads, json_utf8

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

__all__ = [
    "NO_BODY",
    "Body",
    "CallName",
    "RemoteCaller",
    "Call",
    "Answer",
    "CallServer",
    "pack_body",
    "to_call",
    "from_call",
    "unpack_body",
    "CallUnanswered",
    "CallNotFound",
    "CallTooManyRequests",
    "CallTimeout",
    "CallUnavailable",
    "unanswered",
]


class _NoBody:
    """The type of `NO_BODY`: a call or answer without a body, as opposed to a null one."""

    _instance: _NoBody | None = None

    def __new__(cls) -> _NoBody:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NO_BODY"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "NO_BODY"


NO_BODY = _NoBody()

# bytes, a JSON value, or NO_BODY
Body = Any
T = TypeVar("T")
# What a server answers, as it names it: a UBRE request name, a nydus route's key; None for a
# protocol's unnamed call (UBRE's default handler).
CallName = str | None


@dataclass(frozen=True)
class RemoteCaller:
    """The client behind a call made on another broker process: what a handler gets where it
    would get the calling connection. It cannot be written to; `remote` is True.

    `protocol` is the caller's protocol, `peer` its address as that process saw it, `session`
    its session id there, `client` the protocol's own name for it (a nydus id), `principal`
    who it authenticated as, and `node` the process (its cluster origin, filled in where the
    call leaves that process)."""

    protocol: str
    peer: str
    session: int
    client: str | None
    principal: Principal
    node: str
    remote = True


@dataclass(frozen=True)
class Call:
    """A call to `name` of `protocol`'s servers, made by `caller` with `body`.

    `path` is what a nydus client invoked (its route is `name`); `id` the caller's own id for
    the call; `binary` whether the caller's connection carries bytes as they are (UBRE's binary
    format), so a handler's bytes reach it unchanged."""

    protocol: str
    name: CallName
    body: Body
    caller: RemoteCaller
    path: str | None = None
    id: str | None = None
    binary: bool = False


@dataclass(frozen=True)
class Answer:
    """A call's answer: its body, a failure's (a UBRE Fail's, a nydus ERROR's) when not
    `succeeded`. `packed` is the body as `pack_body` packs it, when the answering server has
    packed it already (`Answer.sendable`), so it is packed once."""

    succeeded: bool
    body: Body = NO_BODY
    packed: tuple[int, bytes] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def sendable(cls, succeeded: bool, body: Body) -> Answer:
        """An answer whose body is known to cross to the caller: TypeError or ValueError if it
        cannot (a value JSON cannot say)."""
        return cls(succeeded, body, pack_body(body))


class CallServer(Protocol):
    """What a protocol server that answers calls from other processes offers."""

    def served_calls(self) -> list[CallName]:
        """The names this server answers, in its order."""

    def answer(self, call: Call) -> Deferred[Answer]:
        """Answer `call` with a handler of this process's."""

    def call(self, target: str, body: Body, caller: RemoteCaller) -> Deferred[Answer]:
        """Make a call from outside any connection (the admin page) as `caller`: `target` is a
        UBRE request name, a nydus path. A handler of this process's answers it, else one of
        another's; a call no one answers gets the protocol's own failure as its Answer."""

    def callable_names(self) -> list[str]:
        """What `call` answers, as a caller names it (a UBRE request name, a nydus route's
        pattern), served here or by another process, each once, sorted."""


def to_call(value: Any, absent: object) -> Body:
    """A protocol's body as a call carries it: its own "no body" (`absent`: UBRE's NO_BODY,
    nydus's NO_DATA) is this contract's NO_BODY."""
    return NO_BODY if value is absent else value


def from_call(body: Body, absent: object) -> Any:
    """A call's body in a protocol's terms: NO_BODY is its own `absent`."""
    return absent if body is NO_BODY else body


_NONE, _JSON, _BYTES = 0, 1, 2


def pack_body(body: Body) -> tuple[int, bytes]:
    """A body as (kind, bytes): how it crosses between processes, and the proof that it can.
    TypeError or ValueError for a value JSON cannot say."""
    if body is NO_BODY:
        return _NONE, b""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return _BYTES, bytes(body)
    return _JSON, json_utf8(body)


def unpack_body(kind: int, data: bytes) -> Body:
    """The body `pack_body` packed; a ProtocolError if its JSON does not parse."""
    if kind == _NONE:
        return NO_BODY
    if kind == _BYTES:
        return bytes(data)
    return json_loads(data, "body")


class CallUnanswered(Exception):
    """A call got no answer; each protocol says why in its own words (`unanswered`)."""


class CallNotFound(CallUnanswered, LookupError):
    """No broker process serves the call's name."""


class CallTooManyRequests(CallUnanswered):
    """The process that serves it is answering as many calls as it may
    (``[cluster] max_remote_calls``)."""


class CallTimeout(CallUnanswered, TimeoutError):
    """No answer came in time (``[cluster] call_timeout``)."""


class CallUnavailable(CallUnanswered):
    """The other processes are out of reach, the one that serves the call could not answer
    (its log says why), or the one that took it is gone (died or stopped) before answering."""


def unanswered(error: BaseException, said: Mapping[type[BaseException], T], otherwise: T) -> T:
    """What a protocol says (`said`, by CallUnanswered class) of a call that got no answer
    because of `error`: the entry of its nearest class, else `otherwise` (for CallUnavailable,
    and for any failure that is no CallUnanswered, so that the client is always answered)."""
    for kind in type(error).__mro__:
        if kind in said:
            return said[kind]
    return otherwise
