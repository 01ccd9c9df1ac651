"""The WebSocket side of Engine.IO: the server's WebSockets, a session's frames, and the upgrade
from polling to WebSocket."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.python.failure import Failure

from wireproto.codecs.engineio import (
    decode_packet,
)
from wireproto.errors import (
    FrameTooLarge,
    ProtocolError,
)
from wireproto.transports.engineio.options import CLOSE_NORMAL
from wireproto.transports.engineio.packets import PROBE_PONG, Outgoing, close_websocket
from wireproto.transports.websocket import (
    DirectFrames,
    accept_deflate_offer,
    accept_nothing,
    close_failure,
    common_options,
)

if TYPE_CHECKING:
    from wireproto.transports.engineio.server import EngineIOServer
    from wireproto.transports.engineio.session import EngineIOSession
from wireproto.transports.engineio.state import SessionState

__all__ = [
    "ServerWebSocket",
    "ServerWebSocketFactory",
    "WebSocketCarrier",
]

# -- the server's WebSockets ----------------------------------------------------------------------


class ServerWebSocket(DirectFrames, WebSocketServerProtocol):
    """A WebSocket at /engine.io/: a session of its own (no sid) or one being upgraded."""

    factory: ServerWebSocketFactory
    session: EngineIOSession | None = None
    _upgrade_of: EngineIOSession | None = None
    # Who the handshake said the peer is (a session of its own only).
    principal: Any = None

    def connectionMade(self) -> None:
        # The resource set this just before handing the connection over, in the same call.
        self._upgrade_of = self.factory.upgrade_of
        super().connectionMade()

    def onOpen(self) -> None:
        self.start_direct_frames()
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
            session._ws_closed(self, close_failure(wasClean, code, reason))

    def sendPacket(self, packet: Outgoing) -> None:
        if self.state == WebSocketProtocol.STATE_OPEN:
            self.send_whole(packet.frame, packet.binary)


class ServerWebSocketFactory(WebSocketServerFactory):
    protocol = ServerWebSocket

    def __init__(self, server: EngineIOServer) -> None:
        super().__init__()
        self.server = server
        self.upgrade_of: EngineIOSession | None = None
        options = server.options.websocket
        self.setProtocolOptions(
            **common_options(options),
            maxConnections=options.max_connections,
            perMessageCompressionAccept=(
                accept_deflate_offer if options.per_message_deflate else accept_nothing
            ),
            webStatus=False,
        )



class WebSocketCarrier:
    """The WebSocket side of an `EngineIOSession`: frames from its WebSocket, and the upgrade
    from polling (probe, pause, switch). Mixed into the session, whose state it shares."""

    def _on_ws_frame(self, payload: bytes, is_binary: bool) -> None:
        if self.state is not SessionState.OPEN:
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

    # -- the upgrade -------------------------------------------------------------------------------

    @property
    def canUpgrade(self) -> bool:
        return self.state is SessionState.OPEN and self._ws is None and self._upgrading is None

    def _begin_upgrade(self, ws: ServerWebSocket) -> None:
        self._requested()
        if not self.canUpgrade:
            close_websocket(ws, CLOSE_NORMAL, "the session cannot be upgraded now")
            return
        ws.session = self
        self._upgrading = ws
        self._upgrade_deadline = self._reactor.callLater(
            self.server.options.upgrade_timeout, self._upgrade_timed_out
        )

    def _on_upgrade_frame(self, ws: ServerWebSocket, payload: bytes, is_binary: bool) -> None:
        if not is_binary and payload == b"2probe":
            ws.sendPacket(PROBE_PONG)
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
            close_websocket(ws, CLOSE_NORMAL, why)

    def _upgrade_ended(self) -> None:
        self._upgrading = None
        self._probed = False
        if self._upgrade_deadline is not None:
            if self._upgrade_deadline.active():
                self._upgrade_deadline.cancel()
            self._upgrade_deadline = None

    def _switch_to(self, ws: ServerWebSocket) -> None:
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

    def _ws_closed(self, ws: ServerWebSocket, reason: Failure) -> None:
        if ws is self._ws:
            self._carrier_lost(reason)
        elif ws is self._upgrading:
            # A failed upgrade leaves the session on polling.
            self._upgrade_ended()
