"""The server's WebSockets at /engine.io/, each one carrier of an Engine.IO session: a session of
its own, or the one a polling session upgrades to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.python.failure import Failure

from wireproto.codecs.engineio import Packet, decode_packet
from wireproto.errors import FrameTooLarge
from wireproto.transports.engineio.packets import Outgoing, close_websocket
from wireproto.transports.websocket import (
    DirectFrames,
    WebSocketOptions,
    accept_deflate_offer,
    accept_nothing,
    close_failure,
    common_options,
)

__all__ = [
    "WebSocketOwner",
    "ServerWebSocket",
    "ServerWebSocketFactory",
    "decode_frame",
]


class WebSocketOwner(Protocol):
    """What a `ServerWebSocket` tells the session it carries, or is upgrading."""

    def websocket_message(self, ws: ServerWebSocket, payload: bytes, binary: bool) -> None: ...

    def websocket_closed(self, ws: ServerWebSocket, reason: Failure) -> None: ...


class ServerWebSocket(DirectFrames, WebSocketServerProtocol):
    """A WebSocket at /engine.io/. It is made for its one request with `opened`, called with it
    once it is open: the session it upgrades, or the server, to make it a session of its own.
    From then on it tells its owner (`attach`) what comes, and the session asks it to send,
    close or pause."""

    transport: Any

    def __init__(self, opened: Callable[[ServerWebSocket], None], *,
                 passed: bool = False) -> None:
        super().__init__()
        self._opened = opened
        self._owner: WebSocketOwner | None = None
        # Passed by the process that accepted the connection: its peer is that process.
        self.passed = passed

    # -- Autobahn's callbacks --------------------------------------------------------------------

    def onOpen(self) -> None:
        self.start_direct_frames()
        self._opened(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        if self._owner is not None:
            self._owner.websocket_message(self, payload, isBinary)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.websocket_closed(self, close_failure(wasClean, code, reason))

    # -- what its session asks of it -------------------------------------------------------------

    def attach(self, owner: WebSocketOwner) -> None:
        """Tell `owner` the frames that come and the close."""
        self._owner = owner

    def detach(self) -> None:
        self._owner = None

    def addresses(self) -> tuple[Any, Any]:
        """The peer's address and ours."""
        return self.transport.getPeer(), self.transport.getHost()

    def send_packet(self, packet: Outgoing) -> None:
        if self.state == WebSocketProtocol.STATE_OPEN:
            self.send_whole(packet.frame, packet.binary)

    def close_with(self, code: int, reason: str | None) -> None:
        """Close with `code` (dropped if the closing handshake cannot be started)."""
        close_websocket(self, code, reason)

    def drop(self) -> None:
        self.dropConnection(abort=True)

    def pause_reading(self) -> None:
        self.transport.pauseProducing()

    def resume_reading(self) -> None:
        self.transport.resumeProducing()


def decode_frame(payload: bytes, binary: bool, limit: int) -> Packet:
    """The packet in one WebSocket frame of a session; raises ProtocolError."""
    if len(payload) > limit:
        raise FrameTooLarge(
            f"Engine.IO WebSocket frame of {len(payload)} bytes is over {limit} bytes "
            "(EngineIOOptions.max_payload)"
        )
    return decode_packet(payload if binary else payload.decode("utf-8"))


class ServerWebSocketFactory(WebSocketServerFactory):
    """The settings and the count of every WebSocket of one Engine.IO server. It holds nothing
    of any one connection: each `ServerWebSocket` is made for its request (see
    MessageWebSocketResource.hand_over)."""

    def __init__(self, options: WebSocketOptions) -> None:
        super().__init__()
        self.setProtocolOptions(
            **common_options(options),
            maxConnections=options.max_connections,
            perMessageCompressionAccept=(
                accept_deflate_offer if options.per_message_deflate else accept_nothing
            ),
            webStatus=False,
        )

    def buildProtocol(self, addr: Any) -> ServerWebSocket:
        raise TypeError("an Engine.IO WebSocket is made for its request, with what it carries "
                        "(MessageWebSocketResource.hand_over)")
