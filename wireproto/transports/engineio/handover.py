"""Engine.IO sessions held by another process that shares the listener.

The workers of ``wireproto serve --workers N`` are handed the connections of shared listeners
in turn, so a client's requests (each long-poll GET, each POST and the WebSocket upgrade,
which browsers make on different connections) may reach any of them. Each process marks the
sids it makes: its mark and a dot before engine.io's 15 random bytes in URL-safe base64, so a
sid is still URL-safe, as unguessable as engine.io's, and says which process holds its session.

A request whose sid another process marked is *passed* to that process (`pass_request`): sent
again, whole, over the owner's endpoint (a unix socket only this user may reach), and the
owner's answer given back to the client. An answer 101 (the upgrade to a WebSocket) joins the
two connections byte for byte, both ways, for as long as both last, each side read only as fast
as the other takes it. TLS ends at the process that accepted the connection.

- The owner serves a passed request as any other; its session keeps the addresses of its
  handshake, and nothing the request says about its peer is believed. It never passes a request
  on (`EngineIOResource.for_passed_requests`), and refuses one without a sid: a handshake is
  served where it lands, and never passed.
- A sid whose mark names no process gets engine.io's 400 (unknown sid) at once; so does one whose
  owner cannot be reached (its socket is gone: it died).
- The owner's connection ends before its answer is whole (it died), or its answer has not begun
  after `deadline` seconds: the client's connection is aborted. The client's connection ends:
  the owner's is aborted too.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import connectProtocol
from twisted.internet.interfaces import (
    IConsumer,
    IDelayedCall,
    IPushProducer,
    IReactorTime,
    IStreamClientEndpoint,
    ITCPTransport,
)
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper
from twisted.python.failure import Failure
from twisted.web.server import NOT_DONE_YET, Request

from wireproto.transports.engineio.options import UNKNOWN_SID
from wireproto.transports.engineio.polling import refuse

__all__ = ["SessionOwners", "pass_request"]

log = Logger()

# Between a process's mark and engine.io's random part of a sid: not in URL-safe base64.
MARK_END = "."
_MARK = re.compile(r"[A-Za-z0-9_-]{1,16}")
# Request headers about one connection, not the request: not passed on.
_HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding",
    b"upgrade", b"content-length", b"expect",
})
# The most an owner's answer may take before its body.
MAX_ANSWER_HEAD = 16_384


@dataclass(frozen=True)
class SessionOwners:
    """The processes that share an Engine.IO listener with this one: this one's `mark`, and
    how to reach each other one, by its mark."""

    mark: str
    owners: Mapping[str, IStreamClientEndpoint]
    # Before a passed request's target: which of the owner's listeners it is for.
    prefix: bytes = b""
    # Requests passed to their owner ("passed"), taken from another process ("taken"), refused
    # for an owner that could not be reached ("unreachable"), cut off ("lost"). Several
    # listeners of a process may share one.
    counts: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        for mark in (self.mark, *self.owners):
            if not _MARK.fullmatch(mark):
                raise ValueError(f"a process's mark is 1 to 16 of A-Z a-z 0-9 - _, not {mark!r}")

    def new_sid(self, random_part: str) -> str:
        return f"{self.mark}{MARK_END}{random_part}"

    def owner_of(self, sid: str) -> IStreamClientEndpoint | None:
        """How to reach the process that made `sid`, if it is another one that exists."""
        mark, end, _ = sid.partition(MARK_END)
        if not end or mark == self.mark:
            return None
        return self.owners.get(mark)


def pass_request(request: Request, owner: IStreamClientEndpoint, owners: SessionOwners,
                 deadline: float, reactor: IReactorTime) -> int:
    """Pass `request` (read whole) to the process `owner` reaches, and answer it with what that
    one answers: see the module's docstring. For a resource's render."""
    passing = _Passing(request, owners, deadline, reactor)
    passing.connecting = connectProtocol(owner, passing)
    passing.connecting.addErrback(passing.unreachable)
    return NOT_DONE_YET


def _request_bytes(request: Request, prefix: bytes, upgrade: bool) -> bytes:
    """`request` again, for its owner: a request of its own on a connection of its own."""
    lines = [b"%s %s%s HTTP/1.1" % (request.method, prefix, request.uri)]
    for name, values in request.requestHeaders.getAllRawHeaders():
        if name.lower() not in _HOP_BY_HOP:
            lines.extend(name + b": " + value for value in values)
    lines.append(b"Upgrade: websocket\r\nConnection: Upgrade" if upgrade else
                 b"Connection: close")
    body = b""
    if request.content is not None:
        request.content.seek(0)
        body = request.content.read()
    if body or request.method != b"GET":
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _client_of(request: Request) -> ITCPTransport | None:
    """The client's connection of `request`, while its HTTP channel has it."""
    return cast("ITCPTransport | None", getattr(request.channel, "transport", None))


class _Passing(Protocol):
    """The connection to a session's owner for one passed request: it sends the request,
    gives the client the answer, and joins the two connections after a 101."""

    connecting: Deferred[Protocol] | None = None

    def __init__(self, request: Request, owners: SessionOwners, deadline: float,
                 reactor: IReactorTime) -> None:
        self.request = request
        self._counts = owners.counts
        self._prefix = owners.prefix
        self._upgrade = (request.getHeader(b"upgrade") or b"").lower() == b"websocket"
        # The connection to the owner, while it is open.
        self._owner: ITCPTransport | None = None
        self._head = b""
        self._answering = False
        # The answer's body bytes still to come; None: until the owner closes.
        self._left: int | None = None
        # The client's connection, once joined to this one (after a 101).
        self._client: ITCPTransport | None = None
        # The client's request is over: answered, or its connection ended.
        self._over = False
        self._timer: IDelayedCall | None = reactor.callLater(deadline, self._too_late)
        request.notifyFinish().addBoth(self._request_over)

    # -- the client's side ------------------------------------------------------------------------

    def unreachable(self, reason: Failure) -> None:
        """The owner could not be reached (it is gone): engine.io's unknown sid."""
        self._stop_timer()
        if self._over:
            return
        self._counts["unreachable"] += 1
        log.debug("an Engine.IO request's owner could not be reached: {why}",
                  event="engineio_owner_unreachable", why=reason.getErrorMessage())
        refuse(self.request, UNKNOWN_SID)

    def _request_over(self, result: object) -> None:
        self._over = True
        if isinstance(result, Failure):  # the client's connection ended first
            self._stop_timer()
            self._end_owner()

    def _too_late(self) -> None:
        self._timer = None
        self._lost()

    def _stop_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _end_owner(self) -> None:
        if self._owner is not None:
            self._owner.abortConnection()
        elif self.connecting is not None:
            self.connecting.cancel()  # nothing if it is connected, or failed, already

    def _lost(self) -> None:
        """The owner's answer will not come whole: both connections end now."""
        self._stop_timer()
        if not self._over:
            self._over = True
            self._counts["lost"] += 1
            client = _client_of(self.request)
            if client is not None:
                client.abortConnection()
        self._end_owner()

    # -- the owner's side ---------------------------------------------------------------------

    def connectionMade(self) -> None:
        owner = self._owner = cast(ITCPTransport, self.transport)
        if self._over:  # the client went while this connected
            owner.abortConnection()
            return
        self._counts["passed"] += 1
        owner.write(_request_bytes(self.request, self._prefix, self._upgrade))

    def dataReceived(self, data: bytes) -> None:
        if self._client is not None:
            self._client.write(data)
            return
        if not self._answering:
            self._head += data
            head, end, rest = self._head.partition(b"\r\n\r\n")
            if not end:
                if len(self._head) > MAX_ANSWER_HEAD:
                    self._lost()
                return
            self._head = b""
            if not self._answer(head):
                return
            data = rest
        if self._over or not data:
            return
        if self._left is not None:
            data = data[:self._left]
            self._left -= len(data)
        self.request.write(data)
        if self._left == 0:
            self._done()

    def _answer(self, head: bytes) -> bool:
        """Give the client the answer's status and headers; False if there is nothing more
        to read here."""
        self._stop_timer()
        lines = head.split(b"\r\n")
        status = lines[0].split(b" ", 2)
        try:
            code = int(status[1])
            headers = [(name.strip().lower(), value.strip()) for name, _, value in
                       (line.partition(b":") for line in lines[1:])]
        except (IndexError, ValueError):
            self._lost()
            return False
        if code == 101:
            self._join(head + b"\r\n\r\n")
            return True
        if self._over:  # the client went meanwhile
            self._end_owner()
            return False
        request = self.request
        request.setResponseCode(code, status[2] if len(status) > 2 else None)
        values: dict[bytes, list[bytes]] = {}
        for name, value in headers:
            values.setdefault(name, []).append(value)
        for name, value_list in values.items():
            if name not in _HOP_BY_HOP or name == b"content-length":
                # The owner's answer wins over what this process set (its CORS headers).
                request.responseHeaders.setRawHeaders(name, value_list)
        self._answering = True
        length = values.get(b"content-length")
        if request.method == b"HEAD" or code in (204, 304) or 100 <= code < 200:
            self._left = 0
        elif length is not None:
            try:
                self._left = int(length[0])
            except ValueError:
                self._lost()
                return False
        if self._left == 0:
            self._done()
            return False
        return True

    def _done(self) -> None:
        """The answer is whole: the client has it, and this connection ends."""
        if not self._over:
            self.request.finish()
        if self._owner is not None:
            self._owner.loseConnection()

    def _join(self, head: bytes) -> None:
        """The owner took the upgrade: the client's connection is no longer HTTP, and what
        comes either way goes to the other."""
        request, owner = self.request, self._owner
        channel = request.channel
        client = _client_of(request)
        if self._over or client is None or owner is None:
            self._end_owner()
            return
        # Taken from the HTTP channel as Autobahn takes it for a WebSocket.
        cast(IConsumer, client).unregisterProducer()
        channel.transport = None
        joined = _Joined(owner)
        if isinstance(client, ProtocolWrapper):  # TLS
            client.wrappedProtocol = joined
        else:
            wrapper = getattr(client, "protocol", None)
            if isinstance(wrapper, ProtocolWrapper):
                wrapper.wrappedProtocol = joined
            else:
                # Not an attribute ITCPTransport names, so set as one mypy does not check.
                setattr(client, "protocol", joined)  # noqa: B010
        joined.makeConnection(client)
        self._client = client
        client.write(head)
        # What the client sent after its request, which the HTTP channel held.
        held = b"".join(getattr(channel, "_dataBuffer", ()))
        if held:
            owner.write(held)
        # Each side read only as fast as the other takes it.
        cast(IConsumer, client).registerProducer(cast(IPushProducer, owner), True)
        cast(IConsumer, owner).registerProducer(cast(IPushProducer, client), True)
        cast(IPushProducer, client).resumeProducing()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._stop_timer()
        self._owner = None
        client, self._client = self._client, None
        if client is not None:
            client.loseConnection()
        elif not self._over:
            if self._answering and self._left is None:
                self.request.finish()  # an answer without a length ends with its connection
            else:
                self._lost()


class _Joined(Protocol):
    """The client's connection, joined to its owner's after a 101."""

    def __init__(self, owner: ITCPTransport) -> None:
        self._owner = owner

    def dataReceived(self, data: bytes) -> None:
        self._owner.write(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._owner.loseConnection()
