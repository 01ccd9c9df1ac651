"""Peers that speak raw bytes or raw WebSocket frames, for tests where the exact bytes matter
and our own clients must not be trusted to produce them."""

from __future__ import annotations

from typing import Any

from autobahn.twisted.websocket import WebSocketClientProtocol
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.internet import defer
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from tests.support import eventually

__all__ = ["RawWebSocket", "RawStream", "RawConnection"]


class RawWebSocket(WebSocketClientProtocol):
    """A bare Autobahn client: exact frames out, every frame in with its type."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[bytes, bool]] = []
        self.opened: defer.Deferred = defer.Deferred()
        self.close_info: tuple[int | None, str | None] | None = None

    def onOpen(self) -> None:
        self.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.frames.append((payload, isBinary))

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.close_info = (code, reason)
        if not self.opened.called:
            self.opened.errback(ConnectionError(f"WebSocket opening failed: {reason}"))


class RawStream(Protocol):
    """Bytes in, bytes out: framing is the test's business."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.close_info: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure) -> None:
        self.close_info = reason


class RawConnection:
    """Closing and waiting for the close of a raw peer held as `self.protocol`."""

    protocol: RawWebSocket | RawStream

    @property
    def is_closed(self) -> bool:
        return self.protocol.close_info is not None

    async def closed(self) -> Any:
        """Wait for the end: (code, reason) on WebSocket, the Failure on a stream."""
        await eventually(lambda: self.is_closed)
        return self.protocol.close_info

    async def close(self) -> None:
        if self.is_closed:
            return
        if isinstance(self.protocol, RawWebSocket):
            if self.protocol.state == WebSocketProtocol.STATE_OPEN:
                self.protocol.sendClose(1000)
        else:
            self.protocol.transport.loseConnection()
        try:
            await self.closed()
        except TimeoutError:
            self.protocol.transport.abortConnection()
            await self.closed()
