"""Capture at the message-transport boundary: every message in and out of a connection, recorded
in capture files (wireproto.capture) as it crossed its transport, whatever the protocol.

`BrokerCapture` owns a service's `ThreadedCaptureWriter` and its connection ids. The service
wraps each connection's protocol in a `CapturingProtocol`, which hands the protocol a
`CapturingTransport` and writes the open and close records. Messages are not recorded one by
one: each connection's `ConnectionCapture` collects what it received and what it sent, and once
per reactor turn each direction with messages becomes one batch record (capture.FLAG_BATCH), the
messages length-prefixed, stamped when its first message was seen. A fan-out to many subscribers
thus costs each of them one list append. A service without capture builds none of these.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from itertools import count
from pathlib import Path
from typing import Any

from twisted.internet import defer, threads
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto.capture.format import DEFAULT_MAX_FILE_BYTES, Kind
from wireproto.capture.log import default_broker_name
from wireproto.capture.shipping import Shipper
from wireproto.capture.writer import DEFAULT_FILE_MODE, ThreadedCaptureWriter
from wireproto.hub import describe_address, transport_name
from wireproto.transports.base import (
    IFrameObserver,
    ILengthPrefixedFrames,
    IMessageProtocol,
    IMessageTransport,
)

__all__ = ["BrokerCapture", "ConnectionCapture", "CapturingTransport", "CapturingProtocol"]

IN, OUT = 0, 1
_KINDS = (int(Kind.IN), int(Kind.OUT))
_pack_length = struct.Struct(">I").pack


class BrokerCapture:
    """One service's capture: a writer (made at `start`, closed by `close`) and a connection-id
    counter. Records made while it is not running are not written."""

    def __init__(self, directory: str | Path, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 flush_interval: float = 0.5, file_mode: int = DEFAULT_FILE_MODE,
                 reactor: Any = None, broker: str | None = None,
                 cluster: str | None = None, upload: str = "",
                 upload_options: dict[str, str] | None = None) -> None:
        if reactor is None:
            from twisted.internet import reactor
        self.directory = Path(directory)
        self.max_file_bytes = max_file_bytes
        self.flush_interval = flush_interval
        self.file_mode = file_mode
        self.reactor = reactor
        self.writer: ThreadedCaptureWriter | None = None
        self.broker = broker
        self.cluster = cluster
        # Ids unique across a fleet's runs: a 31-bit hash of the broker's name and this run's
        # start in the high bits (so they fit a signed 64-bit column), a count from 1 in the
        # low 32.
        run = f"{broker or ''}/{time.time_ns()}/{os.getpid()}".encode()
        self._ids = count(((zlib.crc32(run) & 0x7FFFFFFF) << 32) + 1)
        # (connection, direction) with a batch begun this turn, in the order they began.
        self._begun: list[tuple[ConnectionCapture, int]] = []
        # Ships each closed file to object storage ([capture] upload), when there is one.
        # Under a folder of the broker's name (as the files' headers name it: host:pid when
        # it has none), so a fleet can share one upload target.
        self.shipper: Shipper | None = Shipper(
            self.directory, upload, reactor, options=upload_options,
            broker=broker or default_broker_name()) if upload else None

    def start(self) -> None:
        if self.writer is None:
            if self.shipper is not None:
                self.shipper.start()  # what a previous run left goes first
            # Creates the directory if it is missing.
            self.writer = ThreadedCaptureWriter(
                self.directory, max_file_bytes=self.max_file_bytes,
                flush_interval=self.flush_interval, file_mode=self.file_mode,
                broker=self.broker, cluster=self.cluster,
            )
            if self.shipper is not None:
                self.writer.on_file_closed = self.shipper.file_closed

    def close(self, reactor: Any) -> defer.Deferred[None]:
        """Stop recording; fires once the writer thread has written everything (the reactor
        waits for it in a pool thread, not in the reactor thread)."""
        self.record_batches()
        writer, self.writer = self.writer, None
        if writer is None:
            return defer.succeed(None)
        d = threads.deferToThreadPool(reactor, reactor.getThreadPool(), writer.close)
        shipper = self.shipper
        if shipper is not None:
            # The last file ships at the next start: stopping does not wait for storage.
            def stop_shipping(result: Failure | None) -> Failure | None:
                shipper.stop()
                return result

            d.addBoth(stop_shipping)
        return d

    def next_id(self) -> int:
        return next(self._ids)

    def opened(self, conn_id: int, peer: str, protocol: str, transport: str,
               **listener: object) -> None:
        """An open record; `listener` is what else it says of the connection's listener
        (JSON values: ``wildcards=True``)."""
        if self.writer is not None:
            self.writer.open_connection(conn_id, peer, protocol, transport, timestamp_ns=None,
                                        **listener)

    def closed(self, conn_id: int, reason: str | None) -> None:
        if self.writer is not None:
            self.writer.close_connection(conn_id, reason)

    def begin(self, connection: ConnectionCapture, direction: int) -> None:
        """`connection` has a first message in `direction` since its last batch: stamp the
        batch, and record it at the end of this reactor turn."""
        connection.started[direction] = time.time_ns()
        if not self._begun:
            self.reactor.callLater(0, self.record_batches)
        self._begun.append((connection, direction))

    def record_batches(self) -> None:
        """Record every batch begun, in the order they began."""
        begun, self._begun = self._begun, []
        batches = []
        for connection, direction in begun:
            parts = connection.parts[direction]
            if parts:
                batches.append((connection.connection_id, _KINDS[direction], b"".join(parts),
                                connection.binary[direction], connection.started[direction]))
                parts.clear()
        if batches and self.writer is not None:
            self.writer.batches(batches)

    def batch(self, conn_id: int, direction: int, data: bytes, binary: bool,
              timestamp_ns: int) -> None:
        if self.writer is not None:
            self.writer.batches([(conn_id, _KINDS[direction], data, binary, timestamp_ns)])


@implementer(IFrameObserver)
class ConnectionCapture:
    """One connection's messages not recorded yet: for each direction (IN, OUT) a list of parts
    that join into a batch record's data, and the batch's binary flag and start time."""

    __slots__ = ("capture", "connection_id", "parts", "binary", "started")

    def __init__(self, capture: BrokerCapture, connection_id: int) -> None:
        self.capture = capture
        self.connection_id = connection_id
        self.parts: tuple[list[bytes], list[bytes]] = ([], [])
        self.binary = [True, True]
        self.started = [0, 0]

    def add(self, direction: int, data: bytes, binary: bool) -> None:
        """One message, unframed."""
        parts = self.parts[direction]
        if parts and binary != self.binary[direction]:
            self.record(direction)  # a batch holds one kind of frame, text or binary
        if not parts:
            self.binary[direction] = binary
            self.capture.begin(self, direction)
        parts.append(_pack_length(len(data)))
        parts.append(data)

    # -- IFrameObserver, for transports whose frames are a batch's parts already ------------------

    def readStarting(self) -> None:
        """A read of length-prefixed frames is about to be handled: stamp the in batch now,
        before its messages are handled (and answered)."""
        parts = self.parts[IN]
        if parts and not self.binary[IN]:
            self.record(IN)
        if not parts:
            self.binary[IN] = True
            self.capture.begin(self, IN)

    def framesReceived(self, frames: bytes) -> None:
        """The whole frames of the read just handled: a batch's parts already."""
        self.parts[IN].append(frames)

    def framesSent(self, frames: bytes) -> None:
        """Whole frames just written: a batch's parts already."""
        parts = self.parts[OUT]
        if not parts:  # (over such a transport nothing adds a text message out)
            self.binary[OUT] = True
            self.capture.begin(self, OUT)
        parts.append(frames)

    def record(self, direction: int) -> None:
        parts = self.parts[direction]
        if parts:
            self.capture.batch(self.connection_id, direction, b"".join(parts),
                               self.binary[direction], self.started[direction])
            parts.clear()

    def record_all(self) -> None:
        self.record(IN)
        self.record(OUT)


@implementer(IMessageTransport)
class CapturingTransport:
    """An IMessageTransport that adds each message sent to its connection's batch, then passes
    it to `inner`.

    A prepared message is made once for all subscribers, so its batch part is made there too:
    the prepared message is (inner's, part, binary). Over a transport whose frames are
    length-prefixed (`ILengthPrefixedFrames`) its frames are the parts already and it tells the
    connection's capture (its frame observer) what it writes, as it writes it: then this wrapper
    adds nothing to sending, and a read's fan-out costs each subscriber one append, at its one
    write. Since every connection of a capturing service is wrapped, the prepareKey stays the
    inner one."""

    def __init__(self, inner: IMessageTransport, connection: ConnectionCapture) -> None:
        self.inner = inner
        self.connection = connection
        self.connection_id = connection.connection_id
        self._framed = ILengthPrefixedFrames.providedBy(inner)
        if self._framed:  # the inner's frame observer is told what it writes
            self.prepareMessage = inner.prepareMessage  # type: ignore[method-assign]
            self.sendPrepared = inner.sendPrepared  # type: ignore[method-assign]

    @property
    def prepareKey(self) -> Any:
        return self.inner.prepareKey

    def sendMessage(self, data: bytes, binary: bool = True) -> None:
        # Recorded once sent: a message the transport refuses (too large) is not in the capture.
        self.inner.sendMessage(data, binary)
        if not self._framed:
            self.connection.add(OUT, data, binary)

    def prepareMessage(self, data: bytes, binary: bool = True) -> Any:
        return self.inner.prepareMessage(data, binary), _pack_length(len(data)) + data, binary

    def sendPrepared(self, prepared: tuple[Any, bytes, bool]) -> None:
        inner, part, binary = prepared
        connection = self.connection
        parts = connection.parts[OUT]
        if not parts or binary != connection.binary[OUT]:
            if parts:
                connection.record(OUT)
            connection.binary[OUT] = binary
            connection.capture.begin(connection, OUT)
        parts.append(part)
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
    """Records a connection's open, in and close records around the protocol `wrapped`; its
    open record also holds `listener`, what its listener tells a reader of the capture (for
    WEBSMQ, whether it takes wildcard subscriptions)."""

    def __init__(self, wrapped: IMessageProtocol, capture: BrokerCapture, protocol: str,
                 listener: dict[str, object] | None = None) -> None:
        self.wrapped = wrapped
        self.capture = capture
        self.protocol = protocol
        self.listener = listener or {}
        self.connection_id: int | None = None
        self.connection: ConnectionCapture | None = None
        self.transport: CapturingTransport | None = None

    def makeConnection(self, transport: IMessageTransport) -> None:
        conn_id = self.connection_id = self.capture.next_id()
        self.connection = ConnectionCapture(self.capture, conn_id)
        if ILengthPrefixedFrames.providedBy(transport):
            # Its frames are a batch's parts already: they are recorded as they came in and
            # as they are written, and deliveries both ways skip this wrapper.
            transport.observeFrames(self.connection)
            self.messageReceived = self.wrapped.messageReceived  # type: ignore[method-assign]
        self.transport = CapturingTransport(transport, self.connection)
        self.connectionMade()
        # The protocol's own connectionMade runs in here, and may already send.
        self.wrapped.makeConnection(self.transport)

    def connectionMade(self) -> None:
        assert self.transport is not None and self.connection_id is not None
        inner = self.transport.inner
        self.capture.opened(self.connection_id, describe_address(inner.getPeer()),
                            self.protocol, transport_name(inner), **self.listener)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        # made by makeConnection, before any message; not narrowed on this hot path
        self.connection.add(IN, data, binary)  # type: ignore[union-attr]
        self.wrapped.messageReceived(data, binary)

    def connectionLost(self, reason: Failure) -> None:
        try:
            self.wrapped.connectionLost(reason)
        finally:
            if self.connection is not None:
                self.connection.record_all()
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
