"""Phyllo stacks: the layers composed, from the serial line up to the pub-sub message.

A stack is a chunked stream, a frame, then one or more transport layers, each naming the type of
the layer above it, up to the pub-sub message (0x60):

- minimal: datagram carrying 0x60;
- reduced: datagram carrying 0x22, validated datagram carrying 0x60.

These two interoperate with phyllo-python and phyllo-cpp today. A transport layer message (type
below 0x10) stops the climb and is surfaced as that layer's own dataclass; any other type that is
not the next layer's is an error.

Both take a fused path (`fused`) for a well-formed message, and the layers, one after another,
for everything else: the layered path is the reference, and the fused one must agree with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from wireproto.codecs.serialization import binary
from wireproto.errors import FrameTooLarge, InvalidField, ProtocolError, TruncatedFrame, UnknownType

from .chunks import DELIMITER, MAX_CHUNK_LENGTH, ChunkSplitter, _delimit
from .codes import LAYER_TYPE_LIMIT, TypeCode, type_name
from .datagram import (
    Datagram,
    ValidatedDatagram,
    _pack_datagram,
    _pack_validated_datagram,
    _unpack_datagram,
    _unpack_validated_datagram,
)
from .document import Document, document_from_message, message_from_document
from .frame import MAX_FRAME_PAYLOAD, decode_frame, encode_frame
from .fused import FusedPath, fused_path
from .message import PubSubMessage, _pack_message, decode_message

__all__ = [
    "DATAGRAM_LAYER",
    "MINIMAL",
    "REDUCED",
    "Received",
    "VALIDATED_DATAGRAM_LAYER",
    "Stack",
    "StackDecoder",
    "TransportLayer",
]

Received = PubSubMessage | Datagram | ValidatedDatagram


@dataclass(frozen=True, slots=True)
class TransportLayer:
    """A layer between the frame and the pub-sub message, as (payload type, payload) codecs."""

    name: str
    type_code: int
    pack: Callable[[int, bytes], bytes]
    unpack: Callable[[bytes], tuple[int, bytes]]
    unit: Callable[[int, bytes], Datagram | ValidatedDatagram]  # surfaces its layer messages


DATAGRAM_LAYER = TransportLayer(
    "datagram", TypeCode.DATAGRAM, _pack_datagram, _unpack_datagram, Datagram
)
VALIDATED_DATAGRAM_LAYER = TransportLayer(
    "validated datagram",
    TypeCode.VALIDATED_DATAGRAM,
    _pack_validated_datagram,
    _unpack_validated_datagram,
    ValidatedDatagram,
)


@dataclass(frozen=True, slots=True)
class Stack:
    """Transport layers bottom first (the one right above the frame), with the size limits."""

    name: str
    layers: tuple[TransportLayer, ...]
    max_chunk_length: int = MAX_CHUNK_LENGTH
    max_frame_payload: int = MAX_FRAME_PAYLOAD
    _carries: tuple[tuple[TransportLayer, int], ...] = field(init=False, repr=False, compare=False)
    fused: FusedPath | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        above = [int(layer.type_code) for layer in self.layers[1:]] + [int(TypeCode.PUBSUB)]
        object.__setattr__(self, "_carries", tuple(zip(self.layers, above, strict=True)))
        codes = tuple(int(layer.type_code) for layer in self.layers)
        fused = fused_path(codes, self.max_frame_payload, self.max_chunk_length)
        object.__setattr__(self, "fused", fused)

    def encode(self, message: PubSubMessage) -> bytes:
        """The wire bytes of one pub-sub message, delimiters included."""
        fused = self.fused
        if fused is not None:
            wire = fused.encode(message.payload_type, message.topic, message.payload)
            if wire is not None:
                return wire
        return self.encode_layered(message)

    def encode_layered(self, message: PubSubMessage) -> bytes:
        """`encode` through each layer in turn: the reference the fused path agrees with."""
        data = _pack_message(message.payload_type, message.topic, message.payload)
        for layer, carried in reversed(self._carries):
            data = layer.pack(carried, data)
        chunk = encode_frame(data, self.max_frame_payload)
        if len(chunk) > self.max_chunk_length:
            raise FrameTooLarge(
                f"Phyllo chunk of {len(chunk)} bytes is over the {self.max_chunk_length}-byte "
                f"limit of the {self.name} stack"
            )
        return _delimit(chunk)

    def decode(self, data: bytes) -> Received:
        """The message in the wire bytes of exactly one chunk, with or without its delimiters.

        Returns a `PubSubMessage`, or the `Datagram`/`ValidatedDatagram` of a transport layer's
        own message. For a stream, use `StackDecoder`.
        """
        fused = self.fused
        if fused is not None and type(data) is bytes:
            # COBS refuses a 0x00 inside the chunk, so the fused path needs no search for one.
            message = fused.decode_chunk(data.strip(DELIMITER))
            if message is not None:
                return message
        return self.decode_chunk_layered(self._one_chunk(data))

    def _one_chunk(self, data: bytes) -> bytes:
        if type(data) is not bytes:
            data = binary(data, f"Phyllo {self.name} stack")
        chunk = data.strip(DELIMITER)
        if not chunk:
            raise TruncatedFrame(f"Phyllo {self.name} stack: the input holds no chunk")
        inner = chunk.find(0)
        if inner >= 0:
            raise InvalidField(
                f"Phyllo {self.name} stack: the input holds more than one chunk (0x00 at byte "
                f"{inner} of the chunk); feed a stream to a StackDecoder",
                offset=inner,
            )
        return chunk

    def decode_chunk(self, chunk: bytes) -> Received:
        """Like `decode`, for a chunk as `ChunkSplitter` gives it (no delimiters)."""
        if type(chunk) is not bytes:
            chunk = binary(chunk, f"Phyllo {self.name} stack")
        fused = self.fused
        if fused is not None:
            message = fused.decode_chunk(chunk)
            if message is not None:
                return message
        return self.decode_chunk_layered(chunk)

    def decode_chunk_layered(self, chunk: bytes) -> Received:
        """`decode_chunk` through each layer in turn: the reference for the fused path."""
        if type(chunk) is not bytes:
            chunk = binary(chunk, f"Phyllo {self.name} stack")
        if len(chunk) > self.max_chunk_length:
            raise FrameTooLarge(
                f"Phyllo chunk of {len(chunk)} bytes is over the {self.max_chunk_length}-byte "
                f"limit of the {self.name} stack"
            )
        data = decode_frame(chunk, self.max_frame_payload)
        for layer, carried in self._carries:
            payload_type, payload = layer.unpack(data)
            if payload_type != carried:
                if payload_type < LAYER_TYPE_LIMIT:
                    return layer.unit(payload_type, payload)
                raise UnknownType(
                    f"Phyllo {layer.name} carries payload type {type_name(payload_type)}; in the "
                    f"{self.name} stack it carries {type_name(carried)}"
                )
            data = payload
        return decode_message(data)

    def encode_document(self, topic: bytes | str, document: Document) -> bytes:
        """The wire bytes of the pub-sub message that carries `document` on `topic`."""
        fused = self.fused
        if fused is not None:
            wire = fused.encode_document(topic, document)
            if wire is not None:
                return wire
        return self.encode_layered(message_from_document(topic, document))

    def decode_document(self, data: bytes) -> tuple[bytes, Document]:
        """The topic and document in the wire bytes of one chunk (delimiters optional); refuses
        a message that carries anything else."""
        fused = self.fused
        if fused is not None and type(data) is bytes:
            found = fused.decode_document_chunk(data.strip(DELIMITER))
            if found is not None:
                return found
        return self.decode_document_layered(data)

    def decode_document_layered(self, data: bytes) -> tuple[bytes, Document]:
        """`decode_document` through each layer in turn: the reference for the fused path."""
        received = self.decode_chunk_layered(self._one_chunk(data))
        if not isinstance(received, PubSubMessage):
            raise UnknownType(
                f"Phyllo {self.name} stack: a {type(received).__name__} of payload type "
                f"{type_name(received.payload_type)} is a layer's own message, not a document"
            )
        return received.topic, document_from_message(received)


MINIMAL = Stack("minimal", (DATAGRAM_LAYER,))
REDUCED = Stack("reduced", (DATAGRAM_LAYER, VALIDATED_DATAGRAM_LAYER))


class StackDecoder:
    """Incremental receiver for a stack: `feed()` bytes as they arrive, get messages back.

    `feed()` returns the application's pub-sub messages (payload type 0x10 and up), in order,
    and never raises on bad input. After each call, `layer_messages` holds the layers' own
    messages that arrived (type below 0x10, at any layer: a `Datagram`, `ValidatedDatagram` or
    `PubSubMessage`), and `errors` holds a `ProtocolError` for every chunk that was dropped
    (over-long, bad COBS, bad length, bad CRC, unknown type, truncated message). Both are new
    lists on each call. A dropped chunk never costs the chunks around it.
    """

    __slots__ = ("stack", "errors", "layer_messages", "_splitter")

    def __init__(self, stack: Stack = MINIMAL) -> None:
        self.stack = stack
        self.errors: list[ProtocolError] = []
        self.layer_messages: list[Received] = []
        self._splitter = ChunkSplitter(stack.max_chunk_length)

    def feed(self, data: bytes) -> list[PubSubMessage]:
        chunks = self._splitter.feed(data)
        errors = list(self._splitter.errors)
        layer_messages: list[Received] = []
        messages: list[PubSubMessage] = []
        decode_chunk = self.stack.decode_chunk
        for chunk in chunks:
            try:
                received = decode_chunk(chunk)
            except ProtocolError as e:
                errors.append(e)
                continue
            # transport units come back only as layer messages (a layer's unit is never one)
            if received.payload_type >= LAYER_TYPE_LIMIT and isinstance(received, PubSubMessage):
                messages.append(received)
            else:
                layer_messages.append(received)
        self.errors = errors
        self.layer_messages = layer_messages
        return messages
