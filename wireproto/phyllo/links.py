"""The transport layers of Phyllo as wrappers: chunked stream, frame, datagram, validated datagram.

docs/phyllo.md ("What we decided") fixes their bytes, and `wireproto.codecs.phyllo` encodes and
decodes them; these classes only join the codecs into layers:

- `ChunkedStream` (0x12), the bottom over a byte stream: a Twisted `Protocol`, so it sits on a
  serial port (the ``serial:`` endpoint), a TCP stream or a pty. It cuts the stream into chunks at
  0x00 delimiters, drops a chunk over `max_length` up to the next delimiter (the resync after line
  noise) and sends each chunk as ``00 chunk 00``.

Both bottoms count the carrier's health (`BottomHealth`): bytes in and out, over-long chunks
dropped (resyncs), and when the last chunk came; `counters.received` counts the chunks.
- `MessageChunks`, the bottom over an `IMessageTransport` whose messages are already delimited
  (WebSocket binary): one message is one chunk, so the same stack runs above it.
- `FrameLayer` (0x20): COBS.
- `DatagramLayer` (0x21) and `ValidatedDatagramLayer` (0x22, with the Ray32sub8 CRC): each
  carries one payload type, by default that of the layer that wraps it (0x22 under a validated
  datagram, 0x60 under a message link).
"""

from __future__ import annotations

from collections.abc import Callable
from time import time as _now
from typing import TYPE_CHECKING, Any, ClassVar

from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure

from wireproto.codecs.phyllo.chunks import MAX_CHUNK_LENGTH, ChunkSplitter, encode_chunk
from wireproto.codecs.phyllo.codes import LAYER_TYPE_LIMIT, TypeCode, type_name
from wireproto.codecs.phyllo.datagram import (
    Datagram,
    ValidatedDatagram,
    _pack_datagram,
    _pack_validated_datagram,
    _unpack_datagram,
    _unpack_validated_datagram,
)
from wireproto.codecs.phyllo.frame import MAX_FRAME_PAYLOAD, decode_frame, encode_frame
from wireproto.errors import BadEncoding, FrameTooLarge, InvalidField, ProtocolError, UnknownType
from wireproto.transports.base import IMessageTransport, MessageProtocol

from .base import DEFAULT_MAX_QUEUE, Layer, LayerBase, log

__all__ = [
    "BottomHealth",
    "ChunkedStream",
    "DatagramLayer",
    "FrameLayer",
    "MessageChunks",
    "ValidatedDatagramLayer",
]


class BottomHealth:
    """What a bottom saw of its carrier: plain integers and one time, so a device that floods
    the line makes them larger, never more."""

    __slots__ = ("bytes_received", "bytes_sent", "resyncs", "last_chunk_at")

    def __init__(self) -> None:
        self.bytes_received = 0
        self.bytes_sent = 0
        self.resyncs = 0
        """Over-long chunks dropped up to the next delimiter (a message, over WebSocket)."""
        self.last_chunk_at: float | None = None
        """Unix time of the last chunk received, or None before the first."""


class _Bottom(Layer[bytes]):
    """What both bottoms share: chunks up, chunks down, the carrier's events and its health."""

    connected: Any
    max_length: int
    health: BottomHealth

    def _send_chunk(self, chunk: bytes) -> None:
        raise NotImplementedError

    def send(self, chunk: bytes) -> None:
        """Send one chunk (no 0x00 in it). Dropped and counted in `unsent` while the carrier
        is not connected, as a hub's fan-out may race a disconnect."""
        wire = encode_chunk(chunk, self.max_length)  # refuses what the peer would misread
        if not self.connected:
            self.counters.unsent += 1
            log.debug("Phyllo {layer}: not connected, chunk not sent", event="phyllo_not_connected",
                      layer=self.name)
            return
        self._send_chunk(wire)
        self.counters.sent += 1


class ChunkedStream(_Bottom, Protocol):
    """The chunked stream (0x12) over a byte stream: a Twisted protocol and the bottom layer."""

    name: ClassVar[str] = "chunked stream"

    def __init__(
        self, *, max_length: int = MAX_CHUNK_LENGTH, max_queue: int = DEFAULT_MAX_QUEUE
    ) -> None:
        self.max_length = max_length
        self._splitter = ChunkSplitter(max_length)
        self.health = BottomHealth()
        super().__init__(None, max_queue=max_queue)

    # -- Twisted protocol -------------------------------------------------------------------

    def connectionMade(self) -> None:
        self.link_made()

    def dataReceived(self, data: bytes) -> None:
        health = self.health
        health.bytes_received += len(data)
        chunks = self._splitter.feed(data)
        errors = self._splitter.errors
        if errors:  # each one an over-long chunk dropped: a resync
            health.resyncs += len(errors)
            for error in errors:
                self._reject(error)
        if chunks:
            health.last_chunk_at = _now()  # one clock read per read from the carrier
            for chunk in chunks:
                self._deliver(chunk)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.connected = 0
        self.link_lost(reason)

    # -- layer ----------------------------------------------------------------------------

    def _send_chunk(self, chunk: bytes) -> None:
        if self.transport is not None:  # connected: `send` checked
            self.transport.write(chunk)
            self.health.bytes_sent += len(chunk)

    def lose_connection(self) -> None:
        if self.connected and self.transport is not None:
            self.transport.loseConnection()


class MessageChunks(_Bottom, MessageProtocol):
    """The bottom layer over an `IMessageTransport` where one message is one chunk (WebSocket
    binary). Text messages are not chunks: they are dropped and counted as framing errors."""

    name: ClassVar[str] = "message chunks"
    transport: IMessageTransport | None

    def __init__(
        self, *, max_length: int = MAX_CHUNK_LENGTH, max_queue: int = DEFAULT_MAX_QUEUE
    ) -> None:
        self.max_length = max_length
        self.health = BottomHealth()
        super().__init__(None, max_queue=max_queue)

    # -- message protocol -----------------------------------------------------------------

    def connectionMade(self) -> None:
        self.link_made()

    def messageReceived(self, data: bytes, binary: bool) -> None:
        health = self.health
        health.bytes_received += len(data)
        if not binary:
            self._reject(
                BadEncoding(f"Phyllo chunk came as a {len(data)}-byte text message"),
                "framing_errors",
            )
        elif len(data) > self.max_length:
            health.resyncs += 1
            self._reject(
                FrameTooLarge(
                    f"Phyllo chunk of {len(data)} bytes is over the {self.max_length}-byte limit"
                )
            )
        elif data:  # empty chunks are ignored, as on a stream
            health.last_chunk_at = _now()
            self._deliver(bytes(data))

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        self.link_lost(reason)

    # -- layer ----------------------------------------------------------------------------

    def _send_chunk(self, chunk: bytes) -> None:
        # encode_chunk checked it and added delimiters that a message does not need.
        if self.transport is not None:  # connected: `send` checked
            self.transport.sendMessage(chunk[1:-1], True)
            self.health.bytes_sent += len(chunk) - 2

    def lose_connection(self) -> None:
        if self.connected and self.transport is not None:
            self.transport.loseConnection()


class FrameLayer(Layer[bytes]):
    """The frame (0x20): each payload COBS-encoded into one chunk."""

    name: ClassVar[str] = "frame"
    type_code: ClassVar[int] = TypeCode.FRAME

    def __init__(
        self,
        below: LayerBase,
        *,
        max_length: int = MAX_FRAME_PAYLOAD,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> None:
        self.max_length = max_length
        super().__init__(below, max_queue=max_queue)

    def below_received(self, chunk: bytes) -> None:
        try:
            payload = decode_frame(chunk, self.max_length)
        except ProtocolError as error:
            self._reject(error)
            return
        self._deliver(payload)

    def send(self, payload: bytes) -> None:
        self.send_below(encode_frame(payload, self.max_length))


class _TypedLayer(Layer[bytes]):
    """A datagram layer: carries one payload type; types below 0x10 are its own messages."""

    type_code: ClassVar[int]
    if TYPE_CHECKING:  # what each subclass sets: its layer message, and its codec's functions
        @staticmethod
        def unit(payload_type: int, payload: bytes) -> Datagram | ValidatedDatagram: ...
        @staticmethod
        def _pack(payload_type: int, payload: bytes) -> bytes: ...
        @staticmethod
        def _unpack(data: bytes) -> tuple[int, bytes]: ...

    def __init__(
        self,
        below: LayerBase,
        *,
        carries: int | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> None:
        self._carries_fixed = carries is not None
        self.carries: int = TypeCode.PUBSUB if carries is None else carries
        if not 0 <= self.carries <= 0xFF:
            raise ValueError(f"carries must be a type code byte (0-255), not {self.carries}")
        self.on_layer_message: Callable[[Any], object] | None = None
        super().__init__(below, max_queue=max_queue)

    def _attach(self, layer: LayerBase) -> None:
        super()._attach(layer)
        # Composing is enough: a datagram under a validated datagram carries 0x22, and so on.
        code = getattr(layer, "type_code", None)
        if not self._carries_fixed and code is not None:
            self.carries = int(code)

    def below_received(self, data: bytes) -> None:
        try:
            payload_type, payload = type(self)._unpack(data)
        except ProtocolError as error:
            self._reject(error)
            return
        if payload_type == self.carries:
            self._deliver(payload)
        elif payload_type < LAYER_TYPE_LIMIT:
            self._layer_message(type(self).unit(payload_type, payload))
        else:
            self._reject(
                UnknownType(
                    f"Phyllo {self.name} carries payload type {type_name(payload_type)}; this "
                    f"stack expects {type_name(self.carries)}"
                )
            )

    def send(self, payload: bytes) -> None:
        """Send `payload` as the type this layer carries."""
        self.send_below(type(self)._pack(self.carries, payload))

    def send_layer_message(self, payload_type: int, payload: bytes) -> None:
        """Send this layer's own message (type 0x00-0x0f), such as 0x05 info."""
        if not 0 <= payload_type < LAYER_TYPE_LIMIT:
            raise InvalidField(
                f"Phyllo layer message type must be 0x00-0x0f, not {payload_type!r}"
            )
        self.send_below(type(self)._pack(payload_type, payload))


class DatagramLayer(_TypedLayer):
    """The datagram (0x21): ``len | type | payload``; a wrong length is a framing error."""

    name: ClassVar[str] = "datagram"
    type_code: ClassVar[int] = TypeCode.DATAGRAM
    unit = Datagram
    _pack = staticmethod(_pack_datagram)
    _unpack = staticmethod(_unpack_datagram)


class ValidatedDatagramLayer(_TypedLayer):
    """The validated datagram (0x22): ``crc32 | type | payload``; a bad CRC is a crc_error."""

    name: ClassVar[str] = "validated datagram"
    type_code: ClassVar[int] = TypeCode.VALIDATED_DATAGRAM
    unit = ValidatedDatagram
    _pack = staticmethod(_pack_validated_datagram)
    _unpack = staticmethod(_unpack_validated_datagram)
