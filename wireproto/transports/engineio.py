"""Message transport over Engine.IO protocol 4: the server, as a twisted.web resource.

Implements Engine.IO 4 as the engine.io 6 server and engine.io-client 6 speak it, settled by
shared/specs/NOTES.md, section "nydus" (from a wire capture); the packets are in
`wireproto.codecs.engineio`. nydus runs over it, and so can any other message protocol.

Server (`engineio_resource`, mounted at ``/engine.io/``):

- The handshake ``GET /engine.io/?EIO=4&transport=polling`` is answered with the open packet
  ``0{"sid":..,"upgrades":["websocket"],"pingInterval":..,"pingTimeout":..,"maxPayload":..}``.
- HTTP long-polling: a GET is held until a packet is queued, and answers every queued packet,
  joined by U+001E; a second GET while one is held closes the session, as in engine.io. A POST
  body is a payload of packets, answered ``ok``.
- The upgrade: a WebSocket with ``transport=websocket&sid=..``, the client's ``2probe``
  answered ``3probe``, the held GET released with a noop ``6``, then the client's ``5``
  moves the session to the WebSocket, which gets whatever was queued meanwhile.
- A WebSocket with no sid is a session of its own; its first frame is the open packet, with
  ``"upgrades":[]``.
- The server pings (``2``) every ping_interval and closes a session whose pong (``3``) does not
  come within ping_timeout. A close packet (``1``) from the client ends the session.
- max_payload caps a POST body (413) and a WebSocket frame (close code 1009), like engine.io's
  maxHttpBufferSize; the session that sent it is closed. Past max_connections sessions a
  handshake gets 503; `allow_request` may refuse a handshake with 403.
- Refusals carry engine.io's JSON error bodies, ``{"code":N,"message":..}``: 0 unknown transport,
  1 unknown sid, 2 bad handshake method, 3 bad request, 4 forbidden, 5 unsupported protocol
  version. Where engine.io answers a refused WebSocket with a bare 400, this answers as for
  polling (403 for a refused handshake).

Each session is one `IMessageTransport` (`EngineIOSession`) for one protocol made by
``protocol_factory()`` at the handshake. A polling session's queue pauses a registered producer
above `EngineIOOptions.poll_high_water` bytes and resumes it once a GET has taken them. A text
message cannot hold U+001E, which would split it in a polling payload: sending one raises
InvalidField. Served by `websocket_site` (a `wireproto.transports.http.GuardedSite`), a POST
body over max_payload is refused with 413 before it is read; on a plain twisted.web Site it is
read whole first, and refused (413) only once it is in.

The client is `wireproto.transports.engineio_client`.

`EngineIOOptions.allowed_origins` checks the Origin header of each handshake, polling or
WebSocket, with the patterns `WebSocketOptions.allowed_origins` takes: a browser on a page of
another origin gets 403. A request without an Origin header (not from a browser) is let through.
engine.io has no such check; `allow_request` may add others.

Not handled: cookies, CORS, JSONP, Engine.IO 3, WebTransport.
"""

from __future__ import annotations

import secrets
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.util import wildcards2patterns
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.internet.error import ConnectionAborted, ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.pages import notFound
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET
from zope.interface import implementer

from wireproto import peerlog
from wireproto.codecs.engineio import (
    Handshake,
    Packet,
    PacketType,
    decode_packet,
    decode_payload,
    encode_handshake,
    encode_packet,
    encode_payload,
)
from wireproto.codecs.serialization import json_dumps, utf8
from wireproto.errors import (
    FrameTooLarge,
    InvalidField,
    LimitExceeded,
    ProtocolError,
    UnexpectedMessage,
)
from wireproto.peerlog import address_key, describe_address
from wireproto.transports.base import (
    IMessageProtocol,
    IMessageTransport,
    close_reason,
)
from wireproto.transports.websocket import (
    WebSocketOptions,
    _accept_deflate_offer,
    _accept_nothing,
    _close_failure,
    _common_options,
    _MessageWebSocketResource,
)

__all__ = [
    "EngineIOOptions",
    "EngineIOSession",
    "engineio_resource",
]

log = Logger()

POLLING = "polling"
WEBSOCKET = "websocket"
DEFAULT_PATH = "/engine.io/"

# engine.io's Server.errors and Server.errorMessages.
UNKNOWN_TRANSPORT = 0
UNKNOWN_SID = 1
BAD_HANDSHAKE_METHOD = 2
BAD_REQUEST = 3
FORBIDDEN = 4
UNSUPPORTED_PROTOCOL_VERSION = 5
ERROR_MESSAGES = {
    UNKNOWN_TRANSPORT: "Transport unknown",
    UNKNOWN_SID: "Session ID unknown",
    BAD_HANDSHAKE_METHOD: "Bad handshake method",
    BAD_REQUEST: "Bad request",
    FORBIDDEN: "Forbidden",
    UNSUPPORTED_PROTOCOL_VERSION: "Unsupported protocol version",
}

CLOSE_NORMAL = WebSocketProtocol.CLOSE_STATUS_CODE_NORMAL
CLOSE_PROTOCOL_ERROR = WebSocketProtocol.CLOSE_STATUS_CODE_PROTOCOL_ERROR
CLOSE_TOO_BIG = WebSocketProtocol.CLOSE_STATUS_CODE_MESSAGE_TOO_BIG


@dataclass(frozen=True)
class EngineIOOptions:
    """Settings for Engine.IO servers; the defaults are engine.io 6's. Times are in seconds.

    The client uses only `websocket`: its ping timing comes from the server's open packet.
    """

    ping_interval: float = 25.0
    ping_timeout: float = 20.0
    # Caps a POST body and a WebSocket frame, in bytes (engine.io's maxHttpBufferSize).
    max_payload: int = 1_000_000
    # Offer the upgrade from polling to WebSocket in the handshake.
    upgrades: bool = True
    # Open sessions at once, polling or WebSocket; a handshake past it gets 503...
    max_connections: int = 10_000
    # ...and past this many open sessions from the handshake's address.
    max_sessions_per_address: int = 100
    # A polling session that makes no request (GET, POST or upgrade) this soon after its
    # handshake is dropped, and frees its slot at once.
    first_request_timeout: float = 10.0
    # Called with the twisted.web request of each handshake (polling GET or WebSocket without a
    # sid); False refuses it with 403.
    allow_request: Callable[[IRequest], bool] | None = None
    # None accepts any Origin; else patterns matched against "scheme://host:port", as
    # WebSocketOptions.allowed_origins (the broker passes those).
    allowed_origins: tuple[str, ...] | None = None
    # For the WebSockets. Its max_message_size is raised to max_payload if it is lower.
    websocket: WebSocketOptions = field(default_factory=WebSocketOptions)
    # A WebSocket that has not finished the upgrade dance by then is closed (engine.io's).
    upgrade_timeout: float = 10.0
    # Queued bytes waiting for a polling GET above which a registered producer is paused...
    poll_high_water: int = 1_048_576
    # ...and above which the session is closed (a poller that does not poll, no producer).
    max_poll_buffer: int = 16_777_216

    def __post_init__(self) -> None:
        for name in ("ping_interval", "ping_timeout", "upgrade_timeout", "first_request_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")
        for name in ("max_payload", "max_connections", "max_sessions_per_address",
                     "poll_high_water", "max_poll_buffer"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.websocket.max_message_size < self.max_payload:
            object.__setattr__(
                self, "websocket", replace(self.websocket, max_message_size=self.max_payload)
            )

    def _handshake(self, sid: str, upgrades: tuple[str, ...]) -> Handshake:
        return Handshake(
            sid,
            upgrades,
            round(self.ping_interval * 1000),
            round(self.ping_timeout * 1000),
            self.max_payload,
        )


# -- packets ready to send ------------------------------------------------------------------------


class _Outgoing:
    """A packet ready for either carrier: its WebSocket frame and, once asked, its polling form.

    This is what prepareMessage returns, so a hub encodes a publish once for every session,
    polling or WebSocket.
    """

    __slots__ = ("frame", "binary", "_segment")

    def __init__(self, frame: bytes, binary: bool, segment: str | None = None) -> None:
        self.frame = frame
        self.binary = binary
        self._segment = segment

    @property
    def size(self) -> int:
        return len(self.frame)

    def segment(self) -> str:
        """This packet in a polling payload."""
        if self._segment is None:
            packet = Packet(PacketType.MESSAGE, self.frame)
            self._segment = encode_payload([packet]) if self.binary else self.frame.decode()
        return self._segment


def _control(packet_type: PacketType, data: str = "") -> _Outgoing:
    text = encode_packet(Packet(packet_type, data))
    return _Outgoing(text.encode("utf-8"), False, text)


_PING = _control(PacketType.PING)
_CLOSE = _control(PacketType.CLOSE)
_NOOP = _control(PacketType.NOOP)
_PROBE_PONG = _control(PacketType.PONG, "probe")


def _prepare(data: bytes, binary: bool) -> _Outgoing:
    if binary:
        return _Outgoing(bytes(data), True)
    text = utf8(data, "Engine.IO text message")
    segment = encode_packet(Packet(PacketType.MESSAGE, text))  # refuses U+001E
    return _Outgoing(b"4" + bytes(data), False, segment)


def _deliver(protocol: IMessageProtocol, packet: Packet) -> None:
    data = packet.data
    if isinstance(data, bytes):
        protocol.messageReceived(data, True)
    else:
        protocol.messageReceived(data.encode("utf-8"), False)


def _close_ws(ws: WebSocketProtocol, code: int, reason: str | None) -> None:
    if ws.state != WebSocketProtocol.STATE_OPEN:
        if ws.state != WebSocketProtocol.STATE_CLOSING:
            ws.dropConnection(abort=True)
        return
    raw = reason.encode("utf-8") if reason else None
    # sendClose takes only 1000 and 3000-4999; 1002 and 1009 need the lower-level call.
    ws.sendCloseFrame(code=code, reasonUtf8=raw)


def _close_code(error: BaseException | None) -> int:
    if isinstance(error, FrameTooLarge):
        return CLOSE_TOO_BIG
    if isinstance(error, ProtocolError):
        return CLOSE_PROTOCOL_ERROR
    return CLOSE_NORMAL


def _respond(
    request: Any, code: int, body: bytes, content_type: bytes, *, no_store: bool = False
) -> None:
    request.setResponseCode(code)
    request.setHeader(b"content-type", content_type)
    request.setHeader(b"content-length", b"%d" % len(body))
    if no_store:
        request.setHeader(b"cache-control", b"no-store")
    request.write(body)
    request.finish()


def _origin_allowed(request: IRequest, allowed: tuple[str, ...] | None) -> bool:
    """Whether a handshake's Origin header matches `allowed` (None: any origin)."""
    origin = request.getHeader(b"origin")
    if allowed is None or origin is None:
        return True
    try:
        parts = urlsplit(origin.decode("ascii"))
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme.lower())
    except (UnicodeDecodeError, ValueError):
        return False
    if not parts.hostname or port is None:  # "null" (a sandboxed page, a file) and the like
        return False
    text = f"{parts.scheme.lower()}://{parts.hostname}:{port}"
    return any(pattern.match(text) for pattern in wildcards2patterns(allowed))


def _refuse(request: Any, code: int) -> int:
    """engine.io's abortRequest: 403 for FORBIDDEN, else 400, with its JSON body."""
    body = json_dumps({"code": code, "message": ERROR_MESSAGES[code]}).encode("utf-8")
    _respond(request, 403 if code == FORBIDDEN else 400, body, b"application/json")
    return NOT_DONE_YET


# -- the server session ---------------------------------------------------------------------------

_OPEN, _CLOSING, _CLOSED = "open", "closing", "closed"


@implementer(IMessageTransport)
class EngineIOSession:
    """One Engine.IO session on the server, carried by polling or by a WebSocket, as the
    IMessageTransport of its one message protocol."""

    kind = "engineio"
    # Prepared messages are carrier-neutral (_Outgoing), so every session shares one key.
    prepareKey = ("engineio",)
    textOnly = False
    protocol: IMessageProtocol | None = None

    def __init__(self, server: _Server, sid: str, peer: Any, host: Any) -> None:
        self.server = server
        self.sid = sid
        self._peer = peer
        self._host = host
        # The handshake's address: what max_sessions_per_address counts.
        self.address = address_key(peer)
        self._state = _OPEN
        # Until the client's first request after the handshake (polling sessions only).
        self._first_request_deadline: IDelayedCall | None = None
        # The WebSocket carrying the session, once it is on one.
        self._ws: _ServerWebSocket | None = None
        # A WebSocket in the middle of the upgrade dance, and whether it has probed.
        self._upgrading: _ServerWebSocket | None = None
        self._probed = False
        self._upgrade_deadline: IDelayedCall | None = None
        # Polling: packets waiting for a GET, and the GET held until there are some.
        self._queue: deque[_Outgoing] = deque()
        self._queued_bytes = 0
        self._poll: Any = None
        self._linger: IDelayedCall | None = None
        # Flow control: a producer feeding this session, and whether we paused it; a POST held
        # while the protocol has paused us.
        self._producer: Any = None
        self._streaming = True
        self._producer_paused = False
        self._reading_paused = False
        self._held_post: tuple[Any, bytes] | None = None
        self._ping_call: IDelayedCall | None = None
        self._pong_deadline: IDelayedCall | None = None
        self._pong_deadline_extended = False

    def __repr__(self) -> str:
        return f"<EngineIOSession {self.sid} {self.transportName} {self._state}>"

    @property
    def transportName(self) -> str:
        """The carrier now: "polling" or "websocket"."""
        return POLLING if self._ws is None else WEBSOCKET

    @property
    def maxMessageSize(self) -> int:
        return self.server.options.max_payload

    @property
    def _reactor(self) -> Any:
        return self.server.reactor

    def _start(self, protocol: IMessageProtocol) -> None:
        self.protocol = protocol
        self._schedule_ping()
        if self._ws is None:
            self._first_request_deadline = self._reactor.callLater(
                self.server.options.first_request_timeout, self._never_requested
            )
        protocol.makeConnection(self)

    def _requested(self) -> None:
        deadline, self._first_request_deadline = self._first_request_deadline, None
        if deadline is not None and deadline.active():
            deadline.cancel()

    def _never_requested(self) -> None:
        self._first_request_deadline = None
        timeout = self.server.options.first_request_timeout
        # No GET will come to take a close packet: the slot is freed at once.
        self._close(Failure(ConnectionLost(
            f"no request within {timeout:g} s of the handshake"
        )), abort=True)

    # -- IMessageTransport -------------------------------------------------------------------

    def sendMessage(self, data: bytes, binary: bool = True) -> None:
        limit = self.server.options.max_payload
        if len(data) > limit:
            raise FrameTooLarge(
                f"Engine.IO message of {len(data)} bytes is over this connection's limit of "
                f"{limit} bytes (EngineIOOptions.max_payload)"
            )
        self.sendPrepared(_prepare(data, binary))

    def prepareMessage(self, data: bytes, binary: bool = True) -> _Outgoing:
        return _prepare(data, binary)

    def sendPrepared(self, prepared: _Outgoing) -> None:
        # Fan-out may race the end of a session: such sends are dropped.
        if self._state is not _OPEN:
            return
        self._transmit(prepared)
        if self._ws is None and self._queued_bytes > self.server.options.max_poll_buffer:
            limit = self.server.options.max_poll_buffer
            error = LimitExceeded(
                f"over {limit} bytes waiting for a polling GET (EngineIOOptions.max_poll_buffer)"
            )
            self._fail(error, drop_queue=True)

    def write(self, data: bytes) -> None:
        """IConsumer.write: one binary message."""
        self.sendMessage(data, True)

    def loseConnection(self, error: ProtocolError | None = None) -> None:
        if error is None:
            self._close(Failure(ConnectionDone("Engine.IO session closed by this side")))
        else:
            self._close(error=error)

    def abortConnection(self) -> None:
        self._close(
            Failure(ConnectionAborted("Engine.IO session aborted by this side")), abort=True
        )

    def getPeer(self) -> Any:
        return self._peer

    def getHost(self) -> Any:
        return self._host

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        if self._producer is not None:
            raise RuntimeError(f"{self!r} already has a producer: {self._producer!r}")
        self._producer, self._streaming = producer, streaming
        if self._ws is not None:
            self._ws.registerProducer(producer, streaming)
        elif self._queued_bytes > self.server.options.poll_high_water:
            self._pause_producer()
        elif not streaming:
            # A pull producer is asked for data once now and after each poll, as Twisted's
            # transports ask after each write.
            producer.resumeProducing()

    def unregisterProducer(self) -> None:
        if self._producer is not None and self._ws is not None:
            self._ws.unregisterProducer()
        self._producer = None
        self._producer_paused = False

    def pauseProducing(self) -> None:
        """Stop taking the peer's packets: a WebSocket stops reading, and a POST is not
        answered (so the client sends no other) until resumeProducing."""
        self._reading_paused = True
        if self._ws is not None:
            self._ws.transport.pauseProducing()

    def resumeProducing(self) -> None:
        self._reading_paused = False
        if self._ws is not None:
            self._ws.transport.resumeProducing()
        held, self._held_post = self._held_post, None
        if held is not None:
            self._answer_post(*held)

    def stopProducing(self) -> None:
        self.abortConnection()

    # -- sending, on either carrier ------------------------------------------------------------

    def _transmit(self, packet: _Outgoing) -> None:
        ws = self._ws
        if ws is not None:
            ws.sendPacket(packet)
            return
        self._queue.append(packet)
        self._queued_bytes += packet.size
        if self._poll is not None:
            self._answer_poll(self._poll)
        elif (
            self._queued_bytes > self.server.options.poll_high_water
            and self._producer is not None
        ):
            self._pause_producer()

    def _pause_producer(self) -> None:
        if self._streaming and not self._producer_paused:
            self._producer_paused = True
            self._producer.pauseProducing()

    def _answer_poll(self, request: Any) -> None:
        """Answer a GET with everything queued (a noop if nothing is)."""
        if request is self._poll:
            self._poll = None
        queue = self._queue
        if queue:
            body = "\x1e".join(packet.segment() for packet in queue)
            queue.clear()
            self._queued_bytes = 0
        else:
            body = _NOOP.segment()
        _respond(
            request, 200, body.encode("utf-8"), b"text/plain; charset=UTF-8", no_store=True
        )
        if self._state is _CLOSING:
            # The close packet was the last thing queued: it is out, the session is over.
            self._finish()
            return
        producer = self._producer
        if producer is not None:
            if self._producer_paused:
                self._producer_paused = False
                producer.resumeProducing()
            elif not self._streaming:
                producer.resumeProducing()

    # -- polling requests ----------------------------------------------------------------------

    def _on_poll(self, request: Any) -> Any:
        self._requested()
        if self._poll is not None:
            self._fail(UnexpectedMessage(
                "Engine.IO client sent a polling GET while another was held (overlap)"
            ))
            return _refuse(request, BAD_REQUEST)
        if self._queue or self._probed:
            # During the upgrade, a GET is released at once so the client can switch.
            self._answer_poll(request)
            return NOT_DONE_YET
        self._poll = request
        request.notifyFinish().addErrback(self._poll_lost, request)
        return NOT_DONE_YET

    def _poll_lost(self, _reason: Failure, request: Any) -> None:
        if self._poll is request:
            self._poll = None
            self._close(Failure(ConnectionLost(
                "the held polling GET's connection closed before it was answered"
            )))

    def _on_post(self, request: Any) -> Any:
        self._requested()
        if self._state is not _OPEN:
            _respond(request, 200, b"ok", b"text/html")
            return NOT_DONE_YET
        if request.getHeader(b"content-type") == b"application/octet-stream":
            self._fail(InvalidField(
                "Engine.IO 4 POST bodies are text, not application/octet-stream"
            ))
            return _refuse(request, BAD_REQUEST)
        limit = self.server.options.max_payload
        body = request.content.read(limit + 1)
        if len(body) > limit:
            return self._post_too_large(request)
        if self._held_post is not None:
            self._fail(UnexpectedMessage(
                "Engine.IO client sent a POST while another was held"
            ))
            return _refuse(request, BAD_REQUEST)
        if self._reading_paused:
            self._held_post = (request, body)
            request.notifyFinish().addErrback(self._post_lost, request)
            return NOT_DONE_YET
        self._answer_post(request, body)
        return NOT_DONE_YET

    def _post_too_large(self, request: Any) -> Any:
        limit = self.server.options.max_payload
        self._fail(FrameTooLarge(
            f"Engine.IO POST body is over {limit} bytes (EngineIOOptions.max_payload)"
        ))
        _respond(request, 413, b"", b"text/html")
        return NOT_DONE_YET

    def _post_lost(self, _reason: Failure, request: Any) -> None:
        if self._held_post is not None and self._held_post[0] is request:
            self._held_post = None

    def _answer_post(self, request: Any, body: bytes) -> None:
        if self._state is _OPEN:
            try:
                packets = decode_payload(body)
            except ProtocolError as error:
                self._fail(error)
                _refuse(request, BAD_REQUEST)
                return
            for packet in packets:
                if self._state is not _OPEN:
                    break
                self._on_packet(packet)
        # text/html, as engine.io: text/plain would make some browsers offer a download.
        _respond(request, 200, b"ok", b"text/html")

    # -- packets from the client, on either carrier ---------------------------------------------

    def _on_packet(self, packet: Packet) -> None:
        packet_type = packet.type
        if (
            self._pong_deadline is not None
            and not self._pong_deadline_extended
            and packet_type != PacketType.PONG
        ):
            # A busy client whose pong is behind other packets gets one more ping_timeout.
            self._pong_deadline_extended = True
            self._pong_deadline.reset(self.server.options.ping_timeout)
        if packet_type == PacketType.MESSAGE:
            _deliver(self.protocol, packet)
        elif packet_type == PacketType.PONG:
            if self._pong_deadline is not None:
                self._pong_deadline.cancel()
                self._pong_deadline = None
                self._schedule_ping()
        elif packet_type == PacketType.CLOSE:
            self._close(
                Failure(ConnectionDone("the Engine.IO client sent a close packet")),
                peer_closed=True,
            )
        elif packet_type == PacketType.PING:
            self._fail(UnexpectedMessage(
                "Engine.IO 4 client sent a ping: only the server pings"
            ))
        # open, upgrade and noop are ignored, as engine.io does.

    def _on_ws_frame(self, payload: bytes, is_binary: bool) -> None:
        if self._state is not _OPEN:
            return
        limit = self.server.options.max_payload
        try:
            if len(payload) > limit:
                raise FrameTooLarge(
                    f"Engine.IO WebSocket frame of {len(payload)} bytes is over {limit} bytes "
                    "(EngineIOOptions.max_payload)"
                )
            packet = decode_packet(payload if is_binary else payload.decode("utf-8"))
        except ProtocolError as error:
            self._fail(error)
            return
        self._on_packet(packet)

    # -- pings -----------------------------------------------------------------------------------

    def _schedule_ping(self) -> None:
        self._ping_call = self._reactor.callLater(self.server.options.ping_interval, self._ping)

    def _ping(self) -> None:
        self._ping_call = None
        self._pong_deadline_extended = False
        self._pong_deadline = self._reactor.callLater(
            self.server.options.ping_timeout, self._ping_timed_out
        )
        self._transmit(_PING)

    def _ping_timed_out(self) -> None:
        self._pong_deadline = None
        timeout = self.server.options.ping_timeout
        self._close(Failure(ConnectionLost(
            f"no pong within {timeout:g} s of a ping (Engine.IO ping timeout)"
        )), reason_text="ping timeout")

    # -- the upgrade -------------------------------------------------------------------------------

    @property
    def canUpgrade(self) -> bool:
        return self._state is _OPEN and self._ws is None and self._upgrading is None

    def _begin_upgrade(self, ws: _ServerWebSocket) -> None:
        self._requested()
        if not self.canUpgrade:
            _close_ws(ws, CLOSE_NORMAL, "the session cannot be upgraded now")
            return
        ws.session = self
        self._upgrading = ws
        self._upgrade_deadline = self._reactor.callLater(
            self.server.options.upgrade_timeout, self._upgrade_timed_out
        )

    def _on_upgrade_frame(self, ws: _ServerWebSocket, payload: bytes, is_binary: bool) -> None:
        if not is_binary and payload == b"2probe":
            ws.sendPacket(_PROBE_PONG)
            self._probed = True
            if self._poll is not None:
                self._answer_poll(self._poll)
        elif not is_binary and payload == b"5":
            self._switch_to(ws)
        else:
            # engine.io closes an upgrading WebSocket that sends anything else.
            self._abandon_upgrade("unexpected packet during the upgrade")

    def _upgrade_timed_out(self) -> None:
        self._upgrade_deadline = None
        self._abandon_upgrade("the upgrade did not finish in time")

    def _abandon_upgrade(self, why: str) -> None:
        ws = self._upgrading
        self._upgrade_ended()
        if ws is not None:
            ws.session = None
            _close_ws(ws, CLOSE_NORMAL, why)

    def _upgrade_ended(self) -> None:
        self._upgrading = None
        self._probed = False
        if self._upgrade_deadline is not None:
            if self._upgrade_deadline.active():
                self._upgrade_deadline.cancel()
            self._upgrade_deadline = None

    def _switch_to(self, ws: _ServerWebSocket) -> None:
        self._upgrade_ended()
        if self._poll is not None:
            self._answer_poll(self._poll)
        self._ws = ws
        self._peer, self._host = ws.transport.getPeer(), ws.transport.getHost()
        queue = self._queue
        while queue:
            ws.sendPacket(queue.popleft())
        self._queued_bytes = 0
        if self._reading_paused:
            ws.transport.pauseProducing()
        producer = self._producer
        if producer is not None:
            ws.registerProducer(producer, self._streaming)
            if self._producer_paused:
                self._producer_paused = False
                producer.resumeProducing()

    def _ws_closed(self, ws: _ServerWebSocket, reason: Failure) -> None:
        if ws is self._ws:
            self._close(reason, ws_gone=True)
        elif ws is self._upgrading:
            # A failed upgrade leaves the session on polling.
            self._upgrade_ended()

    # -- the end -----------------------------------------------------------------------------------

    def _fail(self, error: ProtocolError, *, drop_queue: bool = False) -> None:
        """The client broke Engine.IO: log it (within the peers' log budget) and close."""
        peerlog.warn(
            log, address_key(self._peer), "closing Engine.IO session {sid} with {peer}: {error}",
            sid=self.sid, peer=describe_address(self._peer), error=error,
        )
        self._close(error=error, drop_queue=drop_queue)

    def _close(
        self,
        reason: Failure | None = None,
        *,
        error: ProtocolError | None = None,
        abort: bool = False,
        peer_closed: bool = False,
        ws_gone: bool = False,
        drop_queue: bool = False,
        reason_text: str | None = None,
    ) -> None:
        """End the session once: tell the client where it can, then the protocol. An `error`
        (the peer broke the protocol, logged by whoever found it) becomes the reason."""
        if reason is None:
            reason = Failure(ConnectionLost(f"closed after a protocol error: {error}"))
        if self._state is not _OPEN:
            if abort:
                self._finish()
            return
        self._state = _CLOSING
        self.server.session_closing(self)
        self._requested()
        for call in (self._ping_call, self._pong_deadline):
            if call is not None and call.active():
                call.cancel()
        self._ping_call = self._pong_deadline = None
        if self._upgrading is not None:
            self._abandon_upgrade("the session is closing")
        if abort or drop_queue:
            self._queue.clear()
            self._queued_bytes = 0
        ws = self._ws
        if ws is not None:
            if abort:
                ws.dropConnection(abort=True)
            elif not ws_gone:
                if not peer_closed:
                    ws.sendPacket(_CLOSE)
                text = close_reason(error) if error is not None else reason_text
                _close_ws(ws, _close_code(error), text)
            self._finish()
        elif peer_closed:
            # engine.io answers a held GET with a noop when the client closes.
            self._queue.clear()
            self._queued_bytes = 0
            if self._poll is not None:
                self._answer_poll(self._poll)  # which finishes the session
            self._finish()
        else:
            self._queue.append(_CLOSE)
            if self._poll is not None:
                self._answer_poll(self._poll)  # which finishes the session
            elif abort:
                self._finish()
            else:
                # Wait a little for the client's next GET, to give it the close packet.
                self._linger = self._reactor.callLater(
                    self.server.options.ping_timeout, self._finish
                )
        held, self._held_post = self._held_post, None
        if held is not None:
            _respond(held[0], 200, b"ok", b"text/html")
        producer, self._producer = self._producer, None
        if producer is not None and ws is None:
            # As a Twisted transport does when its connection is lost.
            producer.stopProducing()
        protocol, self.protocol = self.protocol, None
        if protocol is not None:
            protocol.connectionLost(reason)

    def _finish(self) -> None:
        """Forget the session: later requests for its sid are refused as unknown."""
        if self._state is _CLOSED:
            return
        self._state = _CLOSED
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        self._linger = None
        self._queue.clear()
        self._queued_bytes = 0
        if self._poll is not None:
            request, self._poll = self._poll, None
            _respond(request, 200, _CLOSE.frame, b"text/plain; charset=UTF-8", no_store=True)
        if self.server.sessions.get(self.sid) is self:
            del self.server.sessions[self.sid]


# -- the server's WebSockets ----------------------------------------------------------------------


class _ServerWebSocket(WebSocketServerProtocol):
    """A WebSocket at /engine.io/: a session of its own (no sid) or one being upgraded."""

    factory: _ServerWebSocketFactory
    session: EngineIOSession | None = None
    _upgrade_of: EngineIOSession | None = None

    def connectionMade(self) -> None:
        # The resource set this just before handing the connection over, in the same call.
        self._upgrade_of = self.factory.upgrade_of
        super().connectionMade()

    def onOpen(self) -> None:
        if self._upgrade_of is not None:
            self._upgrade_of._begin_upgrade(self)
        else:
            self.factory.server._open_websocket_session(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        session = self.session
        if session is None:
            return
        if session._ws is self:
            session._on_ws_frame(payload, isBinary)
        elif session._upgrading is self:
            session._on_upgrade_frame(self, payload, isBinary)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        session, self.session = self.session, None
        if session is not None:
            session._ws_closed(self, _close_failure(wasClean, code, reason))

    def sendPacket(self, packet: _Outgoing) -> None:
        if self.state == WebSocketProtocol.STATE_OPEN:
            self.sendMessage(packet.frame, packet.binary)


class _ServerWebSocketFactory(WebSocketServerFactory):
    protocol = _ServerWebSocket

    def __init__(self, server: _Server) -> None:
        super().__init__()
        self.server = server
        self.upgrade_of: EngineIOSession | None = None
        options = server.options.websocket
        self.setProtocolOptions(
            **_common_options(options),
            maxConnections=options.max_connections,
            perMessageCompressionAccept=(
                _accept_deflate_offer if options.per_message_deflate else _accept_nothing
            ),
            webStatus=False,
        )


# -- the resource ---------------------------------------------------------------------------------


def _query_value(request: Any, name: bytes) -> str | None:
    values = request.args.get(name)
    # URLSearchParams, as engine.io reads the query: the last value wins.
    return values[-1].decode("utf-8", "replace") if values else None


class _Server:
    """Every session of one engineio_resource, and the request handling."""

    def __init__(
        self, protocol_factory: Callable[[], IMessageProtocol], options: EngineIOOptions
    ) -> None:
        from twisted.internet import reactor

        self.protocol_factory = protocol_factory
        self.options = options
        self.reactor: Any = reactor
        # Every session until it is forgotten, open or closing (waiting to give a GET the close
        # packet); only open ones take a slot.
        self.sessions: dict[str, EngineIOSession] = {}
        self.open_sessions = 0
        self._open_by_address: Counter[str] = Counter()
        self.ws_factory = _ServerWebSocketFactory(self)
        self.ws_resource = _MessageWebSocketResource(self.ws_factory)

    def _slot_refusal(self, address: str) -> str | None:
        """Why a new session from `address` cannot have a slot, or None if it can."""
        options = self.options
        if self.open_sessions >= options.max_connections:
            return f"already {options.max_connections} sessions (max_connections)"
        if self._open_by_address[address] >= options.max_sessions_per_address:
            return (f"already {options.max_sessions_per_address} sessions from that address "
                    "(max_sessions_per_address)")
        return None

    def _add_session(self, session: EngineIOSession) -> None:
        self.sessions[session.sid] = session
        self.open_sessions += 1
        self._open_by_address[session.address] += 1

    def session_closing(self, session: EngineIOSession) -> None:
        """`session` left the open state: its slot is free."""
        self.open_sessions -= 1
        left = self._open_by_address[session.address] - 1
        if left > 0:
            self._open_by_address[session.address] = left
        else:
            del self._open_by_address[session.address]

    def _new_sid(self) -> str:
        # engine.io's base64id: 15 random bytes, URL-safe base64.
        while True:
            sid = secrets.token_urlsafe(15)
            if sid not in self.sessions:
                return sid

    def handle(self, request: Any) -> Any:
        if request.postpath != [b""]:
            # engine.io's path is "/engine.io/", trailing slash included.
            return notFound().render(request)
        transport = _query_value(request, b"transport")
        sid = _query_value(request, b"sid")
        version = _query_value(request, b"EIO")
        upgrade = (request.getHeader(b"upgrade") or b"").lower() == b"websocket"
        if transport not in (POLLING, WEBSOCKET):
            return _refuse(request, UNKNOWN_TRANSPORT)
        if sid:
            session = self.sessions.get(sid)
            if session is None:
                return _refuse(request, UNKNOWN_SID)
            if version != "4":
                return _refuse(request, BAD_REQUEST)
            if upgrade:
                if transport != WEBSOCKET or not self.options.upgrades or not session.canUpgrade:
                    return _refuse(request, BAD_REQUEST)
                return self._websocket(request, upgrade_of=session)
            if transport != session.transportName:
                return _refuse(request, BAD_REQUEST)
            if request.method == b"GET":
                return session._on_poll(request)
            if request.method == b"POST":
                return session._on_post(request)
            return _refuse(request, BAD_REQUEST)
        if request.method != b"GET":
            return _refuse(request, BAD_HANDSHAKE_METHOD)
        if (transport == WEBSOCKET) != upgrade:
            return _refuse(request, BAD_REQUEST)
        if not _origin_allowed(request, self.options.allowed_origins):
            log.info("refused an Engine.IO handshake from {peer}: origin {origin} is not allowed",
                     peer=request.getClientAddress(), origin=request.getHeader(b"origin"))
            return _refuse(request, FORBIDDEN)
        allow = self.options.allow_request
        if allow is not None and not allow(request):
            return _refuse(request, FORBIDDEN)
        if version != "4":
            return _refuse(request, UNSUPPORTED_PROTOCOL_VERSION)
        peer = request.getClientAddress()
        refusal = self._slot_refusal(address_key(peer))
        if refusal is not None:
            peerlog.warn(log, address_key(peer), "refused an Engine.IO handshake from {peer}: "
                         "{why}", peer=describe_address(peer), why=refusal)
            _respond(request, 503, b"Too many Engine.IO sessions", b"text/plain")
            return NOT_DONE_YET
        if upgrade:
            return self._websocket(request, upgrade_of=None)
        return self._polling_handshake(request)

    def _polling_handshake(self, request: Any) -> Any:
        protocol = self.protocol_factory()
        sid = self._new_sid()
        session = EngineIOSession(self, sid, request.getClientAddress(), request.getHost())
        self._add_session(session)
        upgrades = (WEBSOCKET,) if self.options.upgrades else ()
        body = "0" + encode_handshake(self.options._handshake(sid, upgrades))
        _respond(request, 200, body.encode("utf-8"), b"text/plain; charset=UTF-8", no_store=True)
        # After the answer, as engine.io: what the protocol sends now goes with the next GET.
        session._start(protocol)
        return NOT_DONE_YET

    def _websocket(self, request: Any, upgrade_of: EngineIOSession | None) -> Any:
        self.ws_factory.upgrade_of = upgrade_of
        try:
            return self.ws_resource.render(request)
        finally:
            self.ws_factory.upgrade_of = None

    def _open_websocket_session(self, ws: _ServerWebSocket) -> None:
        if self._slot_refusal(address_key(ws.transport.getPeer())) is not None:
            _close_ws(ws, CLOSE_NORMAL, "too many Engine.IO sessions")
            return
        protocol = self.protocol_factory()
        sid = self._new_sid()
        session = EngineIOSession(self, sid, ws.transport.getPeer(), ws.transport.getHost())
        session._ws = ws
        ws.session = session
        self._add_session(session)
        open_packet = "0" + encode_handshake(self.options._handshake(sid, ()))
        ws.sendMessage(open_packet.encode("utf-8"), False)
        session._start(protocol)


class _EngineIOResource(Resource):
    isLeaf = True

    def __init__(self, engine: _Server) -> None:
        super().__init__()
        # Not "server": twisted.web gives every Resource a `server` attribute of its own.
        self.engine = engine
        # A polling POST's payload: a GuardedSite refuses a larger body before reading it.
        self.max_request_body = engine.options.max_payload

    def render(self, request: Any) -> Any:
        return self.engine.handle(request)

    def render_content_too_large(self, request: Any) -> None:
        """A GuardedSite's answer to a POST over max_payload, which it did not read: 413, and
        the session that sent it is closed, as engine.io does."""
        session = self.engine.sessions.get(_query_value(request, b"sid") or "")
        if session is not None and request.method == b"POST":
            session._post_too_large(request)
        else:
            _respond(request, 413, b"", b"text/html")


def engineio_resource(
    protocol_factory: Callable[[], IMessageProtocol],
    options: EngineIOOptions = EngineIOOptions(),
) -> IResource:
    """A twisted.web resource serving `protocol_factory()` protocols over Engine.IO 4.

    Mount it as the child b"engine.io" of a Site's root (or at "/engine.io/" with
    `websocket_site`); it answers at "/engine.io/", trailing slash included.
    """
    return _EngineIOResource(_Server(protocol_factory, options))
