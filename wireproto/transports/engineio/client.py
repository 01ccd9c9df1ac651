"""Engine.IO 4 as a client: a WebSocket to an Engine.IO server (engine.io 6, or
`wireproto.transports.engineio`), presented to a message protocol as an IMessageTransport.

The client opens the WebSocket at once (no long-polling first): `/engine.io/?EIO=4&transport=
websocket`, as engine.io-client does with ``transports: ['websocket']``. It answers the server's
pings, and closes the connection when no ping comes within pingInterval + pingTimeout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionLost
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.codecs.engineio import (
    Handshake,
    PacketType,
    decode_handshake,
    decode_packet,
)
from wireproto.errors import (
    FrameTooLarge,
    ProtocolError,
    UnexpectedMessage,
)
from wireproto.redaction import redact_url
from wireproto.transports.base import (
    IMessageProtocol,
)
from wireproto.transports.connect import websocket_client
from wireproto.transports.engineio.options import DEFAULT_PATH, EngineIOOptions
from wireproto.transports.engineio.packets import Outgoing, deliver, prepare_outgoing
from wireproto.transports.websocket import (
    HandshakeFailed,
    WebSocketClientAdapter,
)

__all__ = ["EngineIOClientAdapter", "engineio_client_connect", "engineio_url"]

log = Logger()

# Frozen, so one shared default is safe.
_DEFAULT_OPTIONS = EngineIOOptions()


class EngineIOClientAdapter(WebSocketClientAdapter):
    """Engine.IO 4 over a client WebSocket. `opened` fires with the wrapped protocol once the
    server's open packet is in."""

    kind = "engineio"
    prepareKey = ("engineio",)
    textOnly = False
    handshake: Handshake | None = None
    _watchdog: IDelayedCall | None = None
    _lost_reason: Failure | None = None

    @property
    def maxMessageSize(self) -> int:
        """The largest message the server takes: its maxPayload caps a frame, and a text
        frame has the type digit too."""
        if self.handshake is None:
            return self.maxMessagePayloadSize
        return self.handshake.max_payload - 1

    def _arm_watchdog(self, seconds: float, why: str) -> None:
        if self._watchdog is not None and self._watchdog.active():
            self._watchdog.cancel()
        self._watchdog = self.factory.reactor.callLater(seconds, self._watchdog_fired, why)

    def _watchdog_fired(self, why: str) -> None:
        self._watchdog = None
        self._lost_reason = Failure(ConnectionLost(why))
        log.warn("closing Engine.IO connection to {url}: {why}", event="engineio_client_timeout",
                 url=redact_url(self.factory.url), why=why)
        self.abortConnection()

    # -- Autobahn callbacks ------------------------------------------------------------------

    def onOpen(self) -> None:
        # No protocol yet: it is made when the open packet comes.
        timeout = self.factory.options.open_handshake_timeout
        self._arm_watchdog(timeout, f"no Engine.IO open packet within {timeout:g} s")

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        if self._closing:
            return
        try:
            if self.handshake is None:
                self._on_open_packet(payload, isBinary)
                return
            packet = decode_packet(payload if isBinary else payload.decode("utf-8"))
        except ProtocolError as error:
            if self.handshake is None:
                self._lost_reason = Failure(ConnectionLost(str(error)))
            self.loseConnection(error)
            return
        packet_type = packet.type
        if packet_type == PacketType.MESSAGE:
            wrapped = self.wrapped
            if wrapped is not None:  # made when the open packet came
                deliver(wrapped, packet)
        elif packet_type == PacketType.PING:
            if self._canSend():
                # The pong carries the ping's data back, as "2probe" gets "3probe".
                WebSocketClientAdapter.sendMessage(self, b"3" + payload[1:], False)
            handshake = self.handshake
            timeout = (handshake.ping_interval + handshake.ping_timeout) / 1000
            self._arm_watchdog(timeout, f"no Engine.IO ping within {timeout:g} s")
        elif packet_type == PacketType.CLOSE:
            # The server closes the WebSocket next: deliver nothing more until it does (the
            # ping watchdog still ends a connection whose server never closes it).
            self._closing = True
        # open, pong, upgrade and noop mean nothing to a WebSocket-only client.

    def _on_open_packet(self, payload: bytes, isBinary: bool) -> None:
        if isBinary:
            raise UnexpectedMessage("Engine.IO server sent a binary frame before the open packet")
        packet = decode_packet(payload.decode("utf-8"))
        if packet.type != PacketType.OPEN:
            raise UnexpectedMessage(
                f"Engine.IO server sent a {packet.type.name} packet before the open packet"
            )
        handshake = decode_handshake(str(packet.data))
        self.handshake = handshake
        timeout = (handshake.ping_interval + handshake.ping_timeout) / 1000
        self._arm_watchdog(timeout, f"no Engine.IO ping within {timeout:g} s")
        WebSocketClientAdapter.onOpen(self)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        if self._watchdog is not None and self._watchdog.active():
            self._watchdog.cancel()
        self._watchdog = None
        lost, wrapped = self._lost_reason, self.wrapped
        if lost is not None:
            if self._attached and wrapped is not None:
                self._attached = False
                self.closeCode, self.closeReason = code, reason
                wrapped.connectionLost(lost)
            if not self.opened.called:
                self.opened.errback(HandshakeFailed(
                    string=f"{redact_url(self.factory.url)}: {lost.value}"))
        super().onClose(wasClean, code, reason)

    # -- IMessageTransport -------------------------------------------------------------------

    def sendMessage(self, data: bytes, binary: bool = True, fragmentSize: int | None = None,
                    sync: bool = False, doNotCompress: bool = False) -> None:
        # Autobahn's own options (fragmentSize, sync, doNotCompress) have no meaning for the
        # Engine.IO packet the message is.
        if len(data) > self.maxMessageSize:
            raise FrameTooLarge(
                f"Engine.IO message of {len(data)} bytes is over the server's limit of "
                f"{self.maxMessageSize} bytes (its maxPayload, less the type digit)"
            )
        self.sendPrepared(prepare_outgoing(data, binary))

    def prepareMessage(self, data: bytes, binary: bool = True) -> Outgoing:
        return prepare_outgoing(data, binary)

    def sendPrepared(self, prepared: Outgoing) -> None:
        if self._canSend():
            WebSocketClientAdapter.sendMessage(self, prepared.frame, prepared.binary)

    # loseConnection is the WebSocket's: engine.io-client sends no close packet over WebSocket,
    # the closing handshake says it all.


def engineio_url(url: str) -> str:
    """The WebSocket URL of an Engine.IO 4 server: ws://host:port[/path] (or
    ws+unix://SOCKET:/path) with the path defaulting to /engine.io/ and
    EIO=4&transport=websocket added to the query."""
    if url.lower().startswith("ws+unix://"):
        from wireproto.transports.connect import split_unix_url

        socket, inner = split_unix_url(url)
        asked = urlsplit(engineio_url(inner))
        return f"ws+unix://{socket}:{urlunsplit(('', '', asked.path, asked.query, ''))}"
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("ws", "wss"):
        raise ValueError(f"Engine.IO URL {url!r} must start with ws:// or wss://")
    path = parts.path if parts.path not in ("", "/") else DEFAULT_PATH
    query = "EIO=4&transport=websocket"
    if parts.query:
        query = f"{parts.query}&{query}"
    return urlunsplit((parts.scheme, parts.netloc, path, query, ""))


def engineio_client_connect(
    reactor: Any,
    url: str,
    protocol_factory: Callable[[], IMessageProtocol],
    options: EngineIOOptions = _DEFAULT_OPTIONS,
    context_factory: Any = None,
    *,
    cafile: str | None = None,
    insecure: bool = False,
    headers: dict[str, str] | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
) -> Deferred[IMessageProtocol]:
    """Connect a new ``protocol_factory()`` protocol to the Engine.IO server at `url`
    (``ws://host:port[/path]`` or ``wss://``), over WebSocket.

    The Deferred fires with that protocol once the server's open packet is in, or fails:
    ConnectionRefusedError, `HandshakeFailed` (a refused WebSocket, e.g. 403 from the
    server's allow_request, or no open packet)... `context_factory` is the TLS client options
    for ``wss://``; the default verifies the server against the system's trust roots (or
    `cafile`'s certificates; `insecure` verifies nothing); `certfile` and `keyfile` are this
    client's own, for a server that asks for one. `headers` go with the handshake.
    """
    full_url = engineio_url(url)
    endpoint, factory = websocket_client(
        reactor, full_url, protocol_factory, options.websocket, context_factory,
        cafile=cafile, insecure=insecure, headers=headers, certfile=certfile, keyfile=keyfile,
    )
    factory.protocol = EngineIOClientAdapter
    connecting = endpoint.connect(factory)
    connecting.addCallback(lambda adapter: adapter.opened)
    return connecting

