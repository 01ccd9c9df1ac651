"""Message transport over WebSocket (RFC 6455), server and client, on Autobahn's Twisted flavour.

A WebSocket text or binary message is already a whole message, so the adapters only translate
Autobahn's callbacks into `IMessageProtocol` calls and back. Autobahn does the rest (origin
check, size limits, pings, handshake timeouts); `WebSocketOptions` is applied to it through
``setProtocolOptions``.

Serving: `wireproto.transports.websocket_http`'s `websocket_resource` gives a twisted.web
resource, and its `websocket_site` mounts several of them on one port, one per path (a client
imports none of twisted.web). Connecting: see `wireproto.transports.connect`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autobahn.twisted.websocket import (
    WebSocketClientFactory,
    WebSocketClientProtocol,
    WebSocketServerFactory,
    WebSocketServerProtocol,
)
from autobahn.websocket.compress import (
    PerMessageDeflateOffer,
    PerMessageDeflateOfferAccept,
    PerMessageDeflateResponse,
    PerMessageDeflateResponseAccept,
)
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectError, ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto import speedups
from wireproto.errors import CredentialEnded, FrameTooLarge, ProtocolError
from wireproto.redaction import redact_url
from wireproto.settings import seconds_or_never, setting, strings
from wireproto.transports.base import (
    ByteTransportDelegate,
    IMessageProtocol,
    IMessageTransport,
    close_reason,
)
from wireproto.transports.websocket_frames import frame
from wireproto.transports.websocket_log import AutobahnLog

__all__ = [
    "WebSocketOptions",
    "WebSocketServerAdapter",
    "WebSocketClientAdapter",
    "HandshakeFailed",
    "websocket_server_factory",
    "websocket_client_factory",
    "common_options",
    "accept_deflate_offer",
    "accept_nothing",
    "close_failure",
    "DirectFrames",
]


CLOSE_NORMAL = WebSocketProtocol.CLOSE_STATUS_CODE_NORMAL
CLOSE_GOING_AWAY = WebSocketProtocol.CLOSE_STATUS_CODE_GOING_AWAY
CLOSE_PROTOCOL_ERROR = WebSocketProtocol.CLOSE_STATUS_CODE_PROTOCOL_ERROR
CLOSE_POLICY_VIOLATION = WebSocketProtocol.CLOSE_STATUS_CODE_POLICY_VIOLATION
# Close codes that mean something went wrong, even when the closing handshake itself was clean.
_ERROR_CLOSE_CODES = frozenset({1002, 1003, 1006, 1007, 1008, 1009, 1010, 1011, 1015})
_NORMAL_CLOSE_CODES = frozenset({CLOSE_NORMAL, CLOSE_GOING_AWAY})
REFUSAL_FLUSH = 2.0
_STATE_OPEN = WebSocketProtocol.STATE_OPEN


@dataclass(frozen=True)
class WebSocketOptions:
    """Settings for WebSocket servers and clients (the [websocket] table). Limits are on by
    default."""

    # Caps both a whole message and a single frame, in bytes.
    max_message_size: int = 1_048_576
    open_handshake_timeout: float = 10.0
    close_handshake_timeout: float = 5.0
    # Liveness: ping each peer this often and drop it when no pong comes within the timeout, so
    # a peer that vanished without closing (a network partition) is gone, and its will
    # published, within interval + timeout (45 s at the defaults). None or 0 turns it off.
    auto_ping_interval: float | None = setting(25.0, read=seconds_or_never)
    auto_ping_timeout: float | None = setting(20.0, read=seconds_or_never)
    # None accepts any Origin; otherwise Autobahn's allowedOrigins patterns, which are matched
    # against "scheme://host:port", port included: ("https://example.com:443", "http://*:8080").
    allowed_origins: tuple[str, ...] | None = setting(None, read=strings)
    # Off by default: compression costs CPU per connection and opens the door to zip bombs.
    per_message_deflate: bool = False
    max_connections: int = 10_000

    def __post_init__(self) -> None:
        if self.max_message_size <= 0:
            raise ValueError(f"max_message_size must be positive, not {self.max_message_size}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {self.max_connections}")
        if isinstance(self.allowed_origins, str):
            raise ValueError(
                "allowed_origins is a tuple of patterns, e.g. ('https://example.com:443',), "
                "not a single string"
            )
        for pattern in self.allowed_origins or ():
            if not (pattern.endswith("*") or re.search(r":\d+$", pattern)):
                raise ValueError(
                    f"allowed origin {pattern!r} would never match: origins are matched as "
                    f"'scheme://host:port', so write {pattern + ':443'!r} or {pattern + ':*'!r}"
                )


class HandshakeFailed(ConnectError):
    """WebSocket opening handshake failed; `status` and `headers` are the server's HTTP
    answer, if it gave one other than 101 (lower-case header names)."""

    def __init__(self, string: str = "", status: int | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(string=string)
        self.status = status
        self.headers = dict(headers or {})


def common_options(options: WebSocketOptions) -> dict[str, Any]:
    """Autobahn's protocol options for `options`, the same for servers and clients."""
    return {
        "maxFramePayloadSize": options.max_message_size,
        "maxMessagePayloadSize": options.max_message_size,
        "openHandshakeTimeout": options.open_handshake_timeout,
        "closeHandshakeTimeout": options.close_handshake_timeout,
        "autoPingInterval": options.auto_ping_interval or 0,
        "autoPingTimeout": options.auto_ping_timeout or 0,
        # Fail with a close frame (1009 too big, 1002 bad framing...) so the peer learns why,
        # instead of Autobahn's default of dropping the TCP connection.
        "failByDrop": False,
    }


def accept_deflate_offer(offers: list[Any]) -> PerMessageDeflateOfferAccept | None:
    """Accept a client's permessage-deflate offer (with per_message_deflate on)."""
    for offer in offers:
        if isinstance(offer, PerMessageDeflateOffer):
            return PerMessageDeflateOfferAccept(offer)
    return None


def _accept_deflate_response(response: Any) -> PerMessageDeflateResponseAccept | None:
    if isinstance(response, PerMessageDeflateResponse):
        return PerMessageDeflateResponseAccept(response)
    return None


def accept_nothing(_offers: Any) -> None:
    """Accept no compression offer (the default)."""
    return None


def close_failure(was_clean: bool, code: int | None, reason: str | None) -> Failure:
    """Why a WebSocket closed, as the Failure a protocol's connectionLost gets."""
    message = f"WebSocket closed with code {code}" if code else "WebSocket closed without a code"
    if reason:
        message += f": {reason}"
    if was_clean and code not in _ERROR_CLOSE_CODES:
        return Failure(ConnectionDone(message))
    return Failure(ConnectionLost(message))


if TYPE_CHECKING:
    from autobahn.twisted.websocket import WebSocketAdapterProtocol
    from autobahn.wamp.types import TransportDetails

    from wireproto.access import Principal

    class _AutobahnProtocol(WebSocketAdapterProtocol, WebSocketProtocol):
        """What the mixins below are mixed into, as the type checker sees it: an Autobahn
        protocol on Twisted, with the options Autobahn sets on each connection."""

        # Set once connected; Autobahn's two bases disagree on whether they may be None.
        peer: str
        _transport_details: TransportDetails
        # The byte transport (TCP or TLS, a producer too) and the factory, whose own class
        # names this protocol: Twisted's Factory typing has no narrower type that fits both.
        transport: Any
        factory: Any
        maxFramePayloadSize: int
        maxMessagePayloadSize: int
        applyMask: bool
        logFrames: bool
        logOctets: bool
        autoFragmentSize: int
        autoPingRestartOnAnyTraffic: bool
else:
    _AutobahnProtocol = object


class DirectFrames(_AutobahnProtocol):
    """Mixed into an Autobahn WebSocket protocol: whole text and binary frames are read and written
    here (`speedups.ws_deliver`, `speedups.ws_frame`), at a fraction of Autobahn's cost per frame,
    every other frame by Autobahn. Call `start_direct_frames` from onOpen. Off while Autobahn is
    asked to log frames or octets, to fragment, or to track timings. Autobahn's traffic counters
    and its "message" event do not see these frames. Every byte written, Autobahn's own too, goes
    through the `outbox` in order; a read is handled in ``speedups.batch_begin()``..``batch_end()``
    (what it sends goes out as one write at its end). Data frames pass through `gate`, closed
    with the close frame, so none follows it."""

    _direct_frames = False
    _frame_limit = 0
    _log: AutobahnLog | None = None
    outbox: speedups.Outbox | None = None
    gate: speedups.FrameGate | None = None

    @property
    def log(self) -> AutobahnLog:
        """Autobahn's logger, for this connection (`AutobahnLog`)."""
        if self._log is None:
            self._log = AutobahnLog(self)
        return self._log

    def connectionMade(self) -> None:
        self.outbox = speedups.Outbox(self.transport.write)
        super().connectionMade()

    def start_direct_frames(self) -> None:
        limits = [n for n in (self.maxFramePayloadSize, self.maxMessagePayloadSize) if n > 0]
        self._frame_limit = min(limits, default=0)
        self._direct_frames = bool(
            self.applyMask and not self.logFrames and not self.logOctets
            and not self.autoFragmentSize and not self.trackedTimings
        )
        outbox = self.outbox
        self.gate = speedups.FrameGate(outbox.write if outbox is not None else self.sendData)

    def dataReceived(self, data: bytes) -> None:
        if not self.factory.isServer:  # a client's read resumes its caller (opened): unbatched
            self._read(data)
            return
        speedups.batch_begin()
        try:
            self._read(data)
        finally:
            speedups.batch_end()

    def _read(self, data: bytes) -> None:
        gate = self.gate
        if not (self._direct_frames and gate is not None and gate.open):
            super().dataReceived(data)
            return
        # A flood's reads seldom end where a frame does: Autobahn reads the rest of the frame
        # it holds the start of, a frame's header cut short is taken back, and the fast path
        # reads on from there (else it would read nothing more once a read ended mid-frame).
        frame = self.current_frame
        if frame is not None and not self.data:
            rest = frame.length - self.current_frame_masker.pointer()
            if rest < len(data):
                self._dataReceived(data[:rest])
                data = data[rest:]
        elif self.data and not self.inside_message:
            data, self.data = self.data + data, b""
        if not (gate.open and self.current_frame is None and not self.data
                and not self.inside_message):
            self._dataReceived(data)
            return
        start = speedups.ws_deliver(data, 0, self.factory.isServer, self._frame_limit,
                                    self.utf8validateIncoming, self.onMessage, gate)
        if start and self.autoPingTimeoutCall and self.autoPingRestartOnAnyTraffic:
            self._cancelAutoPingTimeoutCall()
        if start < len(data):  # anything else, or what follows a close: Autobahn's
            self._dataReceived(data[start:] if start else data)

    def sendData(self, data: bytes, sync: bool = False, chopsize: int | None = None) -> None:
        outbox = self.outbox
        if outbox is None or sync or chopsize or self.send_queue:
            if outbox is not None:
                outbox.flush()  # what waits goes out before what Autobahn queues
            super().sendData(data, sync, chopsize)
            return
        outbox.write(data)
        if self.state == _STATE_OPEN:
            self.trafficStats.outgoingOctetsWireLevel += len(data)

    def sendCloseFrame(self, code: int | None = None, reasonUtf8: bytes | None = None,
                       isReply: bool = False) -> None:
        self._close_gate()  # the data frames that wait go out before the close frame
        super().sendCloseFrame(code, reasonUtf8, isReply)

    def dropConnection(self, abort: bool = False) -> None:
        self._close_gate()
        super().dropConnection(abort)

    def _close_gate(self) -> None:
        if self.gate is not None:
            self.gate.close()

    def _closeConnection(self, abort: bool = False) -> None:
        # Closing the TCP connection writes what waits first; aborting it forgets it.
        outbox = self.outbox
        if outbox is not None:
            if abort:
                outbox.close()
            else:
                outbox.flush()
        super()._closeConnection(abort)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._close_gate()
        if self.outbox is not None:
            self.outbox.close()
        super().connectionLost(reason)

    def send_whole(self, data: bytes, binary: bool) -> None:
        """sendMessage for an open connection, with the same bytes on the wire."""
        gate = self.gate
        if (self._direct_frames and self._perMessageCompress is None and gate is not None
                and not self.send_queue):
            server = self.factory.isServer
            gate.write(speedups.ws_frame(data, binary) if server else frame(data, binary, True))
        else:
            WebSocketProtocol.sendMessage(self, data, binary)


@implementer(IMessageTransport)
class _MessageTransportMixin(DirectFrames, ByteTransportDelegate):
    """IMessageTransport over an Autobahn WebSocket protocol (mixed into server and client)."""

    kind = "ws"
    prepareKey: tuple[str, ...]
    transport: Any
    state: int
    wrapped: IMessageProtocol | None = None
    # Who the peer is, as the handshake established it (None: anonymous).
    principal: Principal | None = None
    # The close code and reason of this connection's end, once it ended (for logs and tests).
    closeCode: int | None = None
    closeReason: str | None = None
    _attached = False
    _closing = False

    # -- Autobahn callbacks ------------------------------------------------------------------

    # Prepared messages are frames of bytes, else Autobahn's (masked, or compressed per peer).
    _frames_prepared = False

    def onOpen(self) -> None:
        self.start_direct_frames()
        if (self._direct_frames and self._perMessageCompress is None and self.factory.isServer
                and self.gate is not None):
            self._frames_prepared = True
            self.sendPrepared = self.gate.write  # fan-out's, straight to the outbox
        elif self.factory.isServer:  # Autobahn's PreparedMessage, which a client's key means
            self.prepareKey = (*self.prepareKey, "autobahn")
        wrapped = self.wrapped = self.factory.protocol_factory()
        self._attached = True
        wrapped.makeConnection(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        # After we started closing, the peer's last messages no longer have anyone to answer.
        wrapped = self.wrapped
        if wrapped is not None and not self._closing:
            wrapped.messageReceived(payload, isBinary)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        # Our own code and reason, unless we closed normally and the peer's close, crossing
        # ours, said what was wrong (a broker refusing what we sent as we closed).
        if self.closedByMe and self.localCloseCode in _NORMAL_CLOSE_CODES and (
                self.remoteCloseCode in _ERROR_CLOSE_CODES):
            code, reason = self.remoteCloseCode, self.remoteCloseReason
        elif self.closedByMe and self.localCloseCode is not None:
            code = self.localCloseCode
            raw = self.localCloseReason
            reason = raw.decode("utf-8", "replace") if raw else None
        self.closeCode, self.closeReason = code, reason
        wrapped = self.wrapped
        if not self._attached or wrapped is None:
            return
        self._attached = False
        wrapped.connectionLost(close_failure(wasClean, code, reason))

    # -- IMessageTransport -------------------------------------------------------------------

    def _canSend(self) -> bool:
        # Fan-out may race a disconnect or an unfinished handshake: such sends are dropped.
        return self.state == WebSocketProtocol.STATE_OPEN and not self._closing

    textOnly = False

    @property
    def maxMessageSize(self) -> int:
        """The largest message this connection takes, and sends (WebSocketOptions)."""
        return self.maxMessagePayloadSize

    def sendMessage(self, data: bytes, binary: bool = True, fragmentSize: int | None = None,
                    sync: bool = False, doNotCompress: bool = False) -> None:
        if not self._canSend():
            return
        limit = self.maxMessagePayloadSize
        if limit and len(data) > limit:
            # Autobahn would raise its own PayloadExceededError; say which setting to change.
            raise FrameTooLarge(
                f"WebSocket message of {len(data)} bytes is over this connection's limit of "
                f"{limit} bytes (WebSocketOptions.max_message_size)"
            )
        if fragmentSize is not None or sync or doNotCompress:  # Autobahn's own options
            super().sendMessage(data, binary, fragmentSize, sync, doNotCompress)
        else:
            self.send_whole(data, binary)

    def prepareMessage(self, data: bytes, binary: bool = True) -> Any:
        if self._frames_prepared:
            return speedups.ws_frame(data, binary)
        return self.factory.prepareMessage(data, binary)

    def _send_autobahn_prepared(self, prepared: Any) -> None:
        if self.state == _STATE_OPEN and not self._closing:
            self.sendPreparedMessage(prepared)  # compressed per connection, or as it stands

    # Fan-out's send: Autobahn's PreparedMessage, or once open, on a server connection without
    # compression, its gate's write of frames of bytes.
    sendPrepared: Callable[..., None] = _send_autobahn_prepared

    def loseConnection(self, error: ProtocolError | None = None) -> None:
        # The protocol that found `error` has logged it.
        if self.state == WebSocketProtocol.STATE_OPEN:
            self._closing = True
            if error is None:
                self.sendClose(CLOSE_NORMAL)
            else:
                # sendClose only takes 1000 and 3000-4999; 1002 and 1008 need the lower-level
                # call. A credential that ended is policy (1008), anything else the peer's error.
                reason = close_reason(error).encode("utf-8")
                code = (CLOSE_POLICY_VIOLATION if isinstance(error, CredentialEnded)
                        else CLOSE_PROTOCOL_ERROR)
                self.sendCloseFrame(code=code, reasonUtf8=reason)
        elif self.state != WebSocketProtocol.STATE_CLOSING:
            self.abortConnection()
        self.release_producer()

    def goAway(self) -> None:
        """Close with 1001 (going away), as RFC 6455 asks of a server shutting down."""
        if self.state == WebSocketProtocol.STATE_OPEN:
            self._closing = True
            self.sendCloseFrame(code=CLOSE_GOING_AWAY)
        else:
            self.loseConnection()

    def abortConnection(self) -> None:
        self._closing = True
        self.wasClean = False
        self.wasNotCleanReason = "connection aborted by this side"
        self.dropConnection(abort=True)

    def write(self, data: bytes) -> None:
        """IConsumer.write: one binary message."""
        self.sendMessage(data, True)


class WebSocketServerAdapter(_MessageTransportMixin, WebSocketServerProtocol):
    """Server side: one wrapped message protocol per accepted WebSocket."""

    prepareKey: tuple[str, ...] = ("ws", "server")

    def failHandshake(self, reason: str, code: int = 400, responseHeaders: Any = None) -> None:
        # Autobahn refuses a disallowed Origin with 400; RFC 6455 section 10.2 asks for 403.
        if reason.startswith("WebSocket connection denied: origin"):
            code = 403
        super().failHandshake(reason, code, responseHeaders)

    _flushed_abort: IDelayedCall | None = None

    def _closeConnection(self, abort: bool = False) -> None:
        # Autobahn aborts once the client's close answers ours, discarding a close that refused
        # the client if it closed as we did: flushed instead, for at most REFUSAL_FLUSH s.
        if abort and self.localCloseCode in _ERROR_CLOSE_CODES and self.transport is not None:
            super()._closeConnection(False)  # the outbox's frames, the close among them, first
            if self._flushed_abort is None and getattr(self.transport, "connected", True):
                self._flushed_abort = self.factory.reactor.callLater(
                    REFUSAL_FLUSH, self.transport.abortConnection)
        else:
            super()._closeConnection(abort)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        # A connection gone needs no abort: TLS's would raise, its state torn down.
        flushed_abort, self._flushed_abort = self._flushed_abort, None
        if flushed_abort is not None and flushed_abort.active():
            flushed_abort.cancel()
        super().connectionLost(reason)


class WebSocketClientAdapter(_MessageTransportMixin, WebSocketClientProtocol):
    """Client side. `opened` fires with the wrapped protocol once the handshake is done."""

    # Client frames are masked, so they cannot share prepared messages with servers.
    prepareKey: tuple[str, ...] = ("ws", "client")

    def __init__(self) -> None:
        super().__init__()
        self.opened: Deferred[IMessageProtocol] = Deferred(self._cancelOpening)

    def _cancelOpening(self, _opened: Deferred) -> None:
        self.abortConnection()

    def onOpen(self) -> None:
        super().onOpen()
        if not self.opened.called and self.wrapped is not None:
            self.opened.callback(self.wrapped)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        super().onClose(wasClean, code, reason)
        if not self.opened.called:
            status = getattr(self, "http_status_line", "").split()[1:2]  # the server's answer
            answered = status != ["101"] and status[0].isdigit() if status else False
            self.opened.errback(HandshakeFailed(
                f"{redact_url(self.factory.url)}: {reason}", int(status[0]) if answered else None,
                getattr(self, "http_headers", None) if answered else None))


class _MessageWebSocketServerFactory(WebSocketServerFactory):
    protocol = WebSocketServerAdapter

    def __init__(
        self,
        protocol_factory: Callable[[], IMessageProtocol],
        options: WebSocketOptions,
        url: str | None,
    ) -> None:
        super().__init__(url=url)
        self.protocol_factory = protocol_factory
        self.options = options
        origins = options.allowed_origins
        any_origin = origins is None
        self.setProtocolOptions(
            **common_options(options),
            allowedOrigins=["*"] if origins is None else list(origins),
            # Browsers send "Origin: null" from sandboxed pages; only "any origin" admits them.
            allowNullOrigin=any_origin,
            maxConnections=options.max_connections,
            perMessageCompressionAccept=(
                accept_deflate_offer if options.per_message_deflate else accept_nothing
            ),
            # A plain GET gets "426 Upgrade Required", not Autobahn's status page.
            webStatus=False,
        )


# Headers the opening handshake writes itself: one given again would be a second copy.
HANDSHAKE_HEADERS = frozenset({"host", "upgrade", "connection", "content-length",
                               "transfer-encoding", "pragma", "cache-control"})
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def check_header_value(value: str, what: str) -> None:
    """Refuse, with a ValueError that names `what` and never repeats `value`, a value a header
    cannot carry: one with a control character (a line break would start a header of its
    own) or that is not UTF-8 text (what the handshake sends)."""
    if _CONTROL.search(value):
        raise ValueError(f"{what} holds a control character (a line break, a tab...)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not UTF-8 text (a byte of another encoding?)") from None


def check_header(name: str, value: str) -> None:
    """Refuse, with a ValueError that never repeats the value, a header a client's opening
    handshake cannot carry: a name that is not an HTTP token, a value with a control character
    in it (a line break would start a header of its own) or that is not UTF-8 text (what the
    handshake sends), or one of the headers the handshake writes itself (`HANDSHAKE_HEADERS`,
    ``Sec-WebSocket-*``)."""
    if not _TOKEN.fullmatch(name):
        raise ValueError("a header's name is letters, digits and !#$%&'*+-.^_`|~ only")
    check_header_value(value, f"the value of header {name}")
    if name.lower() in HANDSHAKE_HEADERS or name.lower().startswith("sec-websocket-"):
        raise ValueError(f"the handshake sets {name} itself")


class _MessageWebSocketClientFactory(WebSocketClientFactory):
    protocol = WebSocketClientAdapter

    def __init__(
        self,
        url: str,
        protocol_factory: Callable[[], IMessageProtocol],
        options: WebSocketOptions,
        reactor: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        headers = dict(headers or {})
        for name, value in headers.items():
            check_header(name, value)
        # Autobahn writes its own User-Agent: one given replaces it, rather than repeat it.
        agent = next((name for name in headers if name.lower() == "user-agent"), None)
        useragent = headers.pop(agent) if agent is not None else None
        super().__init__(url=url, reactor=reactor, headers=headers)
        if useragent is not None:
            self.useragent = useragent
        self.protocol_factory = protocol_factory
        self.options = options
        deflate = options.per_message_deflate
        self.setProtocolOptions(
            **common_options(options),
            perMessageCompressionOffers=[PerMessageDeflateOffer()] if deflate else [],
            perMessageCompressionAccept=_accept_deflate_response if deflate else accept_nothing,
        )


def websocket_server_factory(
    protocol_factory: Callable[[], IMessageProtocol],
    options: WebSocketOptions = WebSocketOptions(),
    *,
    url: str | None = None,
) -> WebSocketServerFactory:
    """An Autobahn server factory to listen with directly on a stream endpoint."""
    return _MessageWebSocketServerFactory(protocol_factory, options, url)


def websocket_client_factory(
    url: str,
    protocol_factory: Callable[[], IMessageProtocol],
    options: WebSocketOptions = WebSocketOptions(),
    *,
    reactor: Any = None,
    headers: dict[str, str] | None = None,
) -> WebSocketClientFactory:
    """An Autobahn client factory for ``ws://`` or ``wss://`` `url` (connect.py uses it);
    `headers` go with the opening handshake."""
    return _MessageWebSocketClientFactory(url, protocol_factory, options, reactor, headers)
