"""Message transport over a byte stream: any Twisted endpoint (tcp:, ssl:, unix:) or a serial port.

A stream has no message boundaries of its own, so each connection uses one named framing:

- ``length32``: a 4-byte big-endian length, then the message.
- ``lines``: one message per line, ended by ``b"\\n"`` (a ``b"\\r"`` before it is dropped);
  messages arrive with ``binary=False`` and may not contain ``b"\\n"``.
- ``cobs``: each message COBS-encoded and ended by a zero byte, as serial links use.

A frame over the size limit, or a COBS frame that does not decode, is a `ProtocolError`: it is
logged, the messages before it are delivered, nothing after it is, and only that connection closes.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cobs import cobs
from twisted.internet.address import UNIXAddress
from twisted.internet.error import ConnectionLost
from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IHandshakeListener,
    ISSLTransport,
)
from twisted.internet.protocol import (
    ClientFactory,
    Factory,
    Protocol,
    ServerFactory,
    connectionDone,
)
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto import peerlog, speedups
from wireproto.errors import BadEncoding, CredentialEnded, FrameTooLarge, ProtocolError
from wireproto.peerlog import address_key, describe_address
from wireproto.settings import seconds_or_never, setting
from wireproto.transports.base import (
    ByteTransportDelegate,
    IFrameObserver,
    ILengthPrefixedFrames,
    IMessageProtocol,
    IMessageTransport,
)

if TYPE_CHECKING:
    from wireproto.access import Principal

__all__ = [
    "FRAMINGS",
    "StreamOptions",
    "StreamMessageTransport",
    "stream_server_factory",
    "stream_client_factory",
]

FRAMINGS = ("length32", "lines", "cobs")

log = Logger()


@dataclass(frozen=True)
class StreamOptions:
    """Settings for a framed stream. Limits are on by default. The [stream] table holds them
    for every stream listener and attached link; the framing is chosen per listener."""

    framing: str = setting("length32", in_config=False)
    max_message_size: int = 1_048_576
    max_connections: int = 10_000
    # TCP keepalive on every TCP (and TLS) connection, so that a peer that vanished without a
    # FIN or RST (a network partition) is noticed: probes start after keepalive_idle seconds
    # of silence, every keepalive_interval seconds, and keepalive_count unanswered probes
    # drop the connection (at the defaults, within 60 s). keepalive_idle 0 turns it off.
    keepalive_idle: float = setting(30.0, read=seconds_or_never)
    keepalive_interval: float = 10.0
    keepalive_count: int = 3
    # A connection that sends nothing for this long is closed (0: never). It is checked every
    # idle_timeout seconds, so a silent peer goes after idle_timeout to twice that.
    idle_timeout: float = setting(0.0, read=seconds_or_never)

    def __post_init__(self) -> None:
        if self.framing not in FRAMINGS:
            raise ValueError(
                f"unknown stream framing {self.framing!r}: use one of {', '.join(FRAMINGS)}"
            )
        if not 0 < self.max_message_size < 2**32:
            raise ValueError(
                f"max_message_size must be between 1 and {2**32 - 1} bytes, "
                f"not {self.max_message_size}"
            )
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {self.max_connections}")
        if self.idle_timeout < 0:
            raise ValueError(f"idle_timeout must be 0 (off) or more, not {self.idle_timeout}")
        if self.keepalive_idle < 0 or self.keepalive_interval < 1 or self.keepalive_count < 1:
            raise ValueError(
                "keepalive_idle must be 0 (off) or more, keepalive_interval and keepalive_count "
                "at least 1"
            )


def _tcp_socket(transport: Any) -> socket.socket | None:
    """The TCP socket under `transport` (through TLS), or None (unix, serial, pty)."""
    while transport is not None:
        handle = getattr(transport, "getHandle", lambda: None)()
        if isinstance(handle, socket.socket):
            return handle if handle.family in (socket.AF_INET, socket.AF_INET6) else None
        transport = getattr(transport, "transport", None)
    return None


def set_keepalive(transport: Any, options: StreamOptions) -> bool:
    """Turn on TCP keepalive with `options`' timing on `transport`'s socket, if it has one."""
    sock = _tcp_socket(transport)
    if sock is None or not options.keepalive_idle:
        return False
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", options.keepalive_idle),
                        ("TCP_KEEPINTVL", options.keepalive_interval),
                        ("TCP_KEEPCNT", options.keepalive_count)):
        if hasattr(socket, name):  # Linux; macOS has TCP_KEEPALIVE for the idle time
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), max(1, int(value)))
    return True


def _carrier_kind(transport: Any) -> str:
    """'ssl', 'unix', 'serial' or 'tcp', from what the byte transport provides."""
    if ISSLTransport.providedBy(transport):
        return "ssl"
    host = transport.getHost()
    if isinstance(host, UNIXAddress):
        return "unix"
    # Twisted's IPv4Address/IPv6Address say type "TCP"; serial.SerialAddress says "SERIAL".
    return "serial" if getattr(host, "type", None) == "SERIAL" else "tcp"


@implementer(IMessageTransport, IHandshakeListener)
class StreamMessageTransport(ByteTransportDelegate, Protocol):
    """The part of every framed stream adapter that does not depend on the framing.

    Subclasses add the framing: they call ``self.wrapped.messageReceived`` for each whole message
    (a straight call, since this is the broker's hot path) and `_frameError` for a bad frame.
    """

    framing = ""
    kind = "tcp"
    textOnly = False
    prepareKey: tuple[str, str] = ("stream", "")
    factory: _StreamFactory
    wrapped: IMessageProtocol | None = None
    # Who the peer is (None: anonymous).
    principal: Principal | None = None
    _awaitingHandshake = False
    paused = False
    # Set when this connection is closed because of a ProtocolError (ours or the wrapped one's).
    _error: ProtocolError | None = None
    _counted = False
    _refused = False
    _active = False
    _idleCheck: IDelayedCall | None = None
    _gone = False
    outbox: speedups.Outbox | None = None
    # What a cut left, when it is short: joined to the next read.
    _buffer = b""
    # The start of a large frame still coming, kept as the reads that bring it and joined once
    # it can be whole (`_pieces_until` bytes, or a read holding the framing's end), so that a
    # peer sending a large frame in small pieces costs one copy of it, not one per piece.
    _pieces: list[bytes] | None = None
    _pieces_size = 0
    _pieces_until = 0

    def __init__(self, max_message_size: int) -> None:
        self.max_message_size = max_message_size

    @property
    def maxMessageSize(self) -> int:
        return self.max_message_size

    # -- byte side (called by Twisted) -------------------------------------------------------

    def connectionMade(self) -> None:
        factory = self.factory
        if factory.max_connections is not None:
            factory.connection_count += 1
            self._counted = True
            if factory.connection_count > factory.max_connections:
                self._refused = True
                peer = self.transport.getPeer()
                peerlog.warn(
                    log, address_key(peer),
                    "refused a {framing} connection from {peer}: already "
                    "{limit} connections (StreamOptions.max_connections)",
                    event="stream_refused",
                    framing=self.framing,
                    peer=describe_address(peer),
                    limit=factory.max_connections,
                )
                self.abortConnection()
                return
        self.kind = _carrier_kind(self.transport)
        set_keepalive(self.transport, factory.options)
        # A prepared message is the framed bytes: the fan-out path writes them to the outbox,
        # which holds them while a read is handled and writes them as one at its end.
        self._writeThrough(self.transport.write)
        if factory.identify is not None and ISSLTransport.providedBy(self.transport):
            # A TLS peer's certificate is known once the handshake is done: until then no
            # message can arrive, and the protocol is not connected.
            self._awaitingHandshake = True
        else:
            self._connectWrapped()
        if factory.options.idle_timeout:
            self._watchIdle(factory.options.idle_timeout)

    def _writeThrough(self, write: Callable[[bytes], object]) -> None:
        """Write through a new outbox to `write`, what waits in the old one written first."""
        if self.outbox is not None:
            self.outbox.flush()
        self.outbox = speedups.Outbox(write)
        self.sendPrepared = self.outbox.write  # type: ignore[method-assign]

    def handshakeCompleted(self) -> None:
        """IHandshakeListener: TLS is up, so the peer's certificate can be read."""
        if self._awaitingHandshake:
            self._awaitingHandshake = False
            self._connectWrapped()

    def _connectWrapped(self) -> None:
        factory = self.factory
        if factory.identify is not None:
            self.principal = factory.identify(self.transport)
            if self.principal is None:
                self._refused = True
                self.abortConnection()
                return
        self.wrapped = factory.protocol_factory()
        self.wrapped.makeConnection(self)

    def _watchIdle(self, timeout: float) -> None:
        """Close the connection once a whole `timeout` passes with nothing received. Only then
        does each read mark the connection active (wrapping whatever reads it now, capture's
        reader included), so the default costs the read path nothing."""
        from twisted.internet import reactor

        reading = self.dataReceived
        self._active = False

        def read(data: bytes) -> None:
            self._active = True
            reading(data)

        def check() -> None:
            if self.wrapped is None and not self._awaitingHandshake:
                return
            if not self._active:
                log.info("closing an idle {framing} connection from {peer}: nothing in "
                         "{timeout:g} s", event="idle_closed", framing=self.framing,
                         peer=describe_address(self.transport.getPeer()), timeout=timeout)
                self._idleCheck = None
                self.transport.loseConnection()
                return
            self._active = False
            self._idleCheck = reactor.callLater(timeout, check)

        self.dataReceived = read  # type: ignore[method-assign]
        self._idleCheck = reactor.callLater(timeout, check)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._gone = True
        if self.outbox is not None:
            self.outbox.close()
        check = self._idleCheck
        if check is not None and check.active():
            check.cancel()
        if self._counted:
            self._counted = False
            self.factory.connection_count -= 1
        wrapped, self.wrapped = self.wrapped, None
        if wrapped is None or self._refused:
            return
        if isinstance(self._error, CredentialEnded):
            reason = Failure(ConnectionLost(f"closed: {self._error}"))
        elif self._error is not None:
            reason = Failure(ConnectionLost(f"closed after a protocol error: {self._error}"))
        wrapped.connectionLost(reason)

    def _stopDelivery(self) -> None:
        """Deliver nothing more from this connection, not even what is already buffered.

        `paused` is the flag every framing's parsing loop checks. Pausing the peer
        (pauseProducing) does not set it: that only stops reading.
        """
        self.paused = True

    def dataReceived(self, data: bytes) -> None:
        wrapped = self.wrapped
        if self.paused or wrapped is None:  # refused, closing, or not connected yet
            return
        buffer = self._take(data)
        if buffer is None:
            return
        self._readStarting()
        # What the read's messages publish is written as one write to each connection.
        speedups.batch_begin()
        try:
            offset, error = self._cut(buffer, wrapped.messageReceived)
            if error is not None:
                self._buffer = b""
                self._frameError(error)
        finally:
            speedups.batch_end()
        if offset:
            self._framesRead(buffer[:offset])
        if not self.paused:
            self._keep(buffer[offset:])

    def _cut(self, buffer: bytes, deliver: Callable[[bytes, bool], object]
             ) -> tuple[int, ProtocolError | None]:
        """Deliver the whole frames at the start of `buffer` (the framing's part): where the
        first frame not delivered starts, and the error that stopped the cut, if one did."""
        raise NotImplementedError

    def _readStarting(self) -> None:
        """A read is about to be cut (Length32's frame observer hears of it)."""

    def _framesRead(self, frames: bytes) -> None:
        """The whole frames a read delivered, as they came."""

    def _take(self, data: bytes) -> bytes | None:
        """The bytes to cut now: what was kept and `data`; None while a large frame gathers."""
        pieces = self._pieces
        if pieces is None:
            return self._buffer + data if self._buffer else data
        pieces.append(data)
        self._pieces_size += len(data)
        if self._pieces_size < self._pieces_until and not self._ends_frame(data):
            return None
        self._pieces = None
        return b"".join(pieces)

    def _keep(self, rest: bytes) -> None:
        """Keep what the cut left, for the reads to come."""
        if len(rest) < GATHER_FROM:
            self._buffer = rest
            return
        self._buffer = b""
        self._pieces = [rest]
        self._pieces_size = len(rest)
        self._pieces_until = self._frame_needs(rest)

    def _ends_frame(self, data: bytes) -> bool:
        """Whether `data` holds the end of a frame (the framing's delimiter)."""
        return False

    def _frame_needs(self, start: bytes) -> int:
        """How many bytes the frame beginning `start` needs before a cut can take it, or find
        it over the limit."""
        raise NotImplementedError

    def _frameError(self, error: ProtocolError) -> None:
        """A bad frame: nothing more is delivered and this connection alone closes."""
        peer = self.transport.getPeer()
        peerlog.warn(log, address_key(peer), "closing {kind} connection with {peer}: {error}",
                     event="frame_error", kind=self.kind, peer=describe_address(peer), error=error)
        self.loseConnection(error)

    # -- IMessageTransport -------------------------------------------------------------------

    def sendMessage(self, data: bytes, binary: bool = True) -> None:
        self.sendPrepared(self.prepareMessage(data, binary))

    def prepareMessage(self, data: bytes, binary: bool = True) -> bytes:
        raise NotImplementedError

    def sendPrepared(self, prepared: bytes) -> None:
        # Until connectionMade puts the outbox's write here.
        self.transport.write(prepared)

    def loseConnection(self, error: ProtocolError | None = None) -> None:
        # Whoever found `error` has logged it (the protocol, or _frameError).
        if error is not None and self._error is None:
            self._error = error
        self._stopDelivery()
        if self.outbox is not None:
            self.outbox.flush()  # what was accepted goes out before the close
        self.transport.loseConnection()
        self.release_producer()

    def abortConnection(self) -> None:
        if self.outbox is not None:
            self.outbox.close()  # nothing more is written, not even what this read still sends
        if self._gone:  # TLS's abort would raise, its state torn down; TCP's does nothing
            return
        self._stopDelivery()
        abort = getattr(self.transport, "abortConnection", None)
        if abort is None:
            self.transport.loseConnection()
        else:
            abort()

    def write(self, data: bytes) -> None:
        """IConsumer.write: one message (a producer registered here writes whole messages)."""
        self.sendMessage(data)


_length32 = struct.Struct(">I")
_pack_length32 = _length32.pack
# A frame's start kept from a read at least this long is gathered as pieces (see `_take`).
GATHER_FROM = 65536


@implementer(ILengthPrefixedFrames)
class Length32MessageTransport(StreamMessageTransport):
    """Frames: a 4-byte big-endian length, then the message.

    The frames are cut here rather than by Twisted's Int32StringReceiver so that an observer
    (`observeFrames`) can be handed the whole frames of each read as they came."""

    framing = "length32"
    prepareKey = ("stream", "length32")

    def __init__(self, max_message_size: int) -> None:
        super().__init__(max_message_size)
        self._observer: IFrameObserver | None = None

    def _cut(self, buffer: bytes, deliver: Callable[[bytes, bool], object]
             ) -> tuple[int, ProtocolError | None]:
        limit = self.max_message_size
        offset, too_large = speedups.length32_deliver(buffer, limit, deliver, self)
        if too_large < 0:
            return offset, None
        return offset, FrameTooLarge(f"length32 frame of {too_large} bytes is over the limit of "
                                     f"{limit} bytes (StreamOptions.max_message_size)")

    def _readStarting(self) -> None:
        if self._observer is not None:
            self._observer.readStarting()

    def _framesRead(self, frames: bytes) -> None:
        if self._observer is not None:
            self._observer.framesReceived(frames)

    def _frame_needs(self, start: bytes) -> int:
        return 4 + _length32.unpack_from(start)[0]

    def prepareMessage(self, data: bytes, binary: bool = True) -> bytes:
        return _pack_length32(len(data)) + data

    def observeFrames(self, observer: IFrameObserver) -> None:
        self._observer = observer
        # The observer sees what is written, when it is written: frames gathered while a read
        # is handled are told once, joined, and those an abort discards never.
        write = self.transport.write
        sent = observer.framesSent

        def write_observed(frames: bytes) -> None:
            write(frames)
            sent(frames)

        self._writeThrough(write_observed)


class LinesMessageTransport(StreamMessageTransport):
    """Frames: one message per line, ended by b"\\n"; a b"\\r" before it is dropped."""

    framing = "lines"
    prepareKey = ("stream", "lines")
    textOnly = True

    def _cut(self, buffer: bytes, deliver: Callable[[bytes, bool], object]
             ) -> tuple[int, ProtocolError | None]:
        limit = self.max_message_size
        offset, too_large = speedups.lines_deliver(buffer, limit, deliver, self)
        if too_large < 0:
            return offset, None
        return offset, FrameTooLarge(f"line of {too_large} bytes or more is over the limit of "
                                     f"{limit} bytes (StreamOptions.max_message_size)")

    def _ends_frame(self, data: bytes) -> bool:
        return b"\n" in data

    def _frame_needs(self, start: bytes) -> int:
        return self.max_message_size + 2  # past the room of a b"\r": over the limit

    def prepareMessage(self, data: bytes, binary: bool = True) -> bytes:
        if b"\n" in data:
            raise ValueError(
                "a message sent with the 'lines' framing cannot contain b'\\n'; "
                "use the 'length32' or 'cobs' framing for binary data"
            )
        return data + b"\n"


class CobsMessageTransport(StreamMessageTransport):
    """Frames: COBS-encoded message, then a zero byte. Empty frames are skipped."""

    framing = "cobs"
    prepareKey = ("stream", "cobs")

    def __init__(self, max_message_size: int) -> None:
        super().__init__(max_message_size)
        # COBS adds one byte per 254 and one more; a longer frame cannot decode to a legal message.
        self._max_frame = max_message_size + max_message_size // 254 + 1

    def _cut(self, buffer: bytes, deliver: Callable[[bytes, bool], object]
             ) -> tuple[int, ProtocolError | None]:
        offset, problem, size = speedups.cobs_deliver(buffer, self._max_frame,
                                                      self.max_message_size, deliver, self)
        if not problem:
            return offset, None
        if problem == speedups.COBS_TOO_LARGE:
            return offset, self._tooLarge(size)
        return offset, BadEncoding(f"COBS frame of {size} bytes does not decode: not enough "
                                   "input bytes for length code")

    def _ends_frame(self, data: bytes) -> bool:
        return b"\x00" in data

    def _frame_needs(self, start: bytes) -> int:
        return self._max_frame + 1  # past it, over the limit

    def _tooLarge(self, size: int) -> FrameTooLarge:
        return FrameTooLarge(
            f"COBS frame of {size} bytes or more is over the limit of "
            f"{self.max_message_size} bytes (StreamOptions.max_message_size)"
        )

    def prepareMessage(self, data: bytes, binary: bool = True) -> bytes:
        return cobs.encode(data) + b"\x00"


_TRANSPORTS: dict[str, type[StreamMessageTransport]] = {
    "length32": Length32MessageTransport,
    "lines": LinesMessageTransport,
    "cobs": CobsMessageTransport,
}


class _StreamFactory(Factory[StreamMessageTransport]):
    """Builds one framed adapter per connection around a new wrapped message protocol."""

    # None: no limit and no counting (clients).
    max_connections: int | None = None
    connection_count = 0

    def __init__(
        self, protocol_factory: Callable[[], IMessageProtocol], options: StreamOptions,
        identify: Callable[[Any], Principal | None] | None = None,
    ) -> None:
        self.protocol_factory = protocol_factory
        self.options = options
        # identify(byte transport) -> the peer's principal, or None to refuse it.
        self.identify = identify
        self._transport_class = _TRANSPORTS[options.framing]

    def buildProtocol(self, addr: IAddress | None) -> StreamMessageTransport:
        transport = self._transport_class(self.options.max_message_size)
        transport.factory = self
        return transport


class StreamServerFactory(_StreamFactory, ServerFactory[StreamMessageTransport]):
    """Server side: counts connections and refuses those beyond `max_connections`."""

    def __init__(
        self, protocol_factory: Callable[[], IMessageProtocol], options: StreamOptions,
        identify: Callable[[Any], Principal | None] | None = None,
    ) -> None:
        super().__init__(protocol_factory, options, identify)
        self.max_connections = options.max_connections


class StreamClientFactory(_StreamFactory, ClientFactory[StreamMessageTransport]):
    """Client side, usable with endpoints and with reactor.connectTCP alike."""


def stream_server_factory(
    protocol_factory: Callable[[], IMessageProtocol], options: StreamOptions = StreamOptions(),
    *, identify: Callable[[Any], Principal | None] | None = None,
) -> StreamServerFactory:
    """A factory to listen with on any stream endpoint (``tcp:``, ``ssl:``, ``unix:``).

    Each connection gets a new ``protocol_factory()`` message protocol. With `identify`, each
    connection is first given the principal ``identify(byte_transport)`` returns, or closed if
    it returns None.
    """
    return StreamServerFactory(protocol_factory, options, identify)


def stream_client_factory(
    protocol_factory: Callable[[], IMessageProtocol], options: StreamOptions = StreamOptions(),
    *, identify: Callable[[Any], Principal | None] | None = None,
) -> StreamClientFactory:
    """A factory to connect with to a stream endpoint (or a serial port); `identify` as for
    `stream_server_factory` (an attached link is the principal its config names)."""
    return StreamClientFactory(protocol_factory, options, identify)
