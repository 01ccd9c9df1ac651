"""Capture at the message-transport boundary: every message in and out of a connection, recorded
in capture files (wireproto.capture) as it crossed its transport, whatever the protocol.

`BrokerCapture` owns a service's `ThreadedCaptureWriter` and its connection ids. The service
wraps each connection's protocol in a `CapturingProtocol`, which hands the protocol a
`CapturingTransport` and writes the open, in and close records on the way through (the
transport writes the out records). A service without capture builds none of these.
"""

from __future__ import annotations

from itertools import count
from pathlib import Path
from typing import Any

from twisted.internet import defer, threads
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto.capture import DEFAULT_MAX_FILE_BYTES, ThreadedCaptureWriter
from wireproto.hub import describe_address, transport_name
from wireproto.transports.base import IMessageProtocol, IMessageTransport

__all__ = ["BrokerCapture", "CapturingTransport", "CapturingProtocol"]


class BrokerCapture:
    """One service's capture: a writer (made at `start`, closed by `close`) and a connection-id
    counter. Records made while it is not running are not written."""

    def __init__(self, directory: str | Path, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 flush_interval: float = 0.5) -> None:
        self.directory = Path(directory)
        self.max_file_bytes = max_file_bytes
        self.flush_interval = flush_interval
        self.writer: ThreadedCaptureWriter | None = None
        self._ids = count(1)

    def start(self) -> None:
        if self.writer is None:
            # Creates the directory if it is missing.
            self.writer = ThreadedCaptureWriter(
                self.directory, max_file_bytes=self.max_file_bytes,
                flush_interval=self.flush_interval,
            )

    def close(self, reactor: Any) -> defer.Deferred[None]:
        """Stop recording; fires once the writer thread has written everything (the reactor
        waits for it in a pool thread, not in the reactor thread)."""
        writer, self.writer = self.writer, None
        if writer is None:
            return defer.succeed(None)
        return threads.deferToThreadPool(reactor, reactor.getThreadPool(), writer.close)

    def next_id(self) -> int:
        return next(self._ids)

    def opened(self, conn_id: int, peer: str, protocol: str, transport: str) -> None:
        if self.writer is not None:
            self.writer.open_connection(conn_id, peer, protocol, transport)

    def message(self, conn_id: int, direction: str, data: bytes, binary: bool) -> None:
        if self.writer is not None:
            self.writer.message(conn_id, direction, data, binary)

    def closed(self, conn_id: int, reason: str | None) -> None:
        if self.writer is not None:
            self.writer.close_connection(conn_id, reason)


@implementer(IMessageTransport)
class CapturingTransport:
    """An IMessageTransport that records each message sent, then passes it to `inner`.
    Prepared messages carry their data so `sendPrepared` can record it too; since every
    connection of a capturing service is wrapped, the prepareKey stays the inner one."""

    def __init__(self, inner: IMessageTransport, capture: BrokerCapture, conn_id: int) -> None:
        self.inner = inner
        self.capture = capture
        self.connection_id = conn_id

    @property
    def prepareKey(self) -> Any:
        return self.inner.prepareKey

    def sendMessage(self, data: bytes, binary: bool = True) -> None:
        self.capture.message(self.connection_id, "out", data, binary)
        self.inner.sendMessage(data, binary)

    def prepareMessage(self, data: bytes, binary: bool = True) -> tuple[Any, bytes, bool]:
        return self.inner.prepareMessage(data, binary), data, binary

    def sendPrepared(self, prepared: tuple[Any, bytes, bool]) -> None:
        inner, data, binary = prepared
        self.capture.message(self.connection_id, "out", data, binary)
        self.inner.sendPrepared(inner)

    def __getattr__(self, name: str) -> Any:
        # Everything else (loseConnection, getPeer, kind, framing, producers...) is the inner's.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"<CapturingTransport {self.connection_id} over {self.inner!r}>"


@implementer(IMessageProtocol)
class CapturingProtocol:
    """Records a connection's open, in and close records around the protocol `wrapped`."""

    def __init__(self, wrapped: IMessageProtocol, capture: BrokerCapture, protocol: str) -> None:
        self.wrapped = wrapped
        self.capture = capture
        self.protocol = protocol
        self.connection_id: int | None = None
        self.transport: CapturingTransport | None = None

    def makeConnection(self, transport: IMessageTransport) -> None:
        conn_id = self.connection_id = self.capture.next_id()
        self.transport = CapturingTransport(transport, self.capture, conn_id)
        self.connectionMade()
        # The protocol's own connectionMade runs in here, and may already send.
        self.wrapped.makeConnection(self.transport)

    def connectionMade(self) -> None:
        assert self.transport is not None and self.connection_id is not None
        inner = self.transport.inner
        self.capture.opened(self.connection_id, describe_address(inner.getPeer()),
                            self.protocol, transport_name(inner))

    def messageReceived(self, data: bytes, binary: bool) -> None:
        assert self.connection_id is not None
        self.capture.message(self.connection_id, "in", data, binary)
        self.wrapped.messageReceived(data, binary)

    def connectionLost(self, reason: Failure) -> None:
        try:
            self.wrapped.connectionLost(reason)
        finally:
            if self.connection_id is not None:
                message = (reason.getErrorMessage() if isinstance(reason, Failure)
                           else str(reason))
                self.capture.closed(self.connection_id, message)

    @property
    def connected(self) -> bool:
        return bool(getattr(self.wrapped, "connected", False))

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":
            raise AttributeError(name)
        return getattr(self.wrapped, name)
