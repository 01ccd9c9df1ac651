"""Phyllo pub-sub, sans-IO: every layer from the serial line up to the document.

Implements Phyllo pub-sub as docs/phyllo.md describes it ("Message model", "What we decided": the
bytes, multi-byte fields big-endian), as the references phyllo-python 0.2.0 and phyllo-cpp 0.2.1
put them on the wire. One small module per layer, each with its own encode and decode, from the
serial line up:

- `chunks` -- chunked stream (0x12): `00 chunk 00`; `ChunkSplitter` cuts a stream into chunks.
- `frame` -- frame (0x20): COBS of a payload of at most 253 bytes.
- `datagram` -- datagram (0x21) `len | type | payload` and validated datagram (0x22)
  `crc32 | type | payload`, with the Ray32sub8 CRC.
- `message` -- pub-sub message (0x60): `payload type | topic length | topic | payload`.
- `document` -- document (0x40): `format | schema | body`, msgpack or JSON.
- `stack` -- the minimal and reduced stacks composed of the layers above, and `StackDecoder`.

Payload types below 0x10 are the layers' own messages: the codecs decode them like any other
(nothing is swallowed, not even phyllo's 0x05 info message), and `is_layer_message` tells them
apart so that they are never handed to the application.

The module-level `encode` and `decode` speak the minimal stack, the one every phyllo peer
understands: `encode(message)` gives the wire bytes of one pub-sub message, delimiters included,
and `decode(wire)` reads them back. `Decoder`, the incremental decoder of a serial line's bytes
as they arrive, is `StackDecoder` (the minimal stack unless given another).
"""

from __future__ import annotations

from .chunks import DELIMITER, MAX_CHUNK_LENGTH, ChunkSplitter, encode_chunk
from .codes import LAYER_TYPE_LIMIT, TypeCode, is_layer_message, type_name
from .datagram import (
    Datagram,
    ValidatedDatagram,
    decode_datagram,
    decode_validated_datagram,
    encode_datagram,
    encode_validated_datagram,
    ray32sub8,
)
from .document import (
    Document,
    Format,
    Schema,
    decode_document,
    deserialize,
    document_from_message,
    encode_document,
    message_from_document,
    serialize,
)
from .frame import MAX_FRAME_PAYLOAD, decode_frame, encode_frame
from .message import MAX_TOPIC_LENGTH, PubSubMessage, decode_message, encode_message
from .stack import (
    DATAGRAM_LAYER,
    MINIMAL,
    REDUCED,
    VALIDATED_DATAGRAM_LAYER,
    Received,
    Stack,
    StackDecoder,
    TransportLayer,
)

__all__ = [
    "DATAGRAM_LAYER",
    "DELIMITER",
    "Decoder",
    "LAYER_TYPE_LIMIT",
    "MAX_CHUNK_LENGTH",
    "MAX_FRAME_PAYLOAD",
    "MAX_TOPIC_LENGTH",
    "MINIMAL",
    "REDUCED",
    "VALIDATED_DATAGRAM_LAYER",
    "ChunkSplitter",
    "Datagram",
    "Document",
    "Format",
    "PubSubMessage",
    "Received",
    "Schema",
    "Stack",
    "StackDecoder",
    "TransportLayer",
    "TypeCode",
    "ValidatedDatagram",
    "decode",
    "decode_datagram",
    "decode_document",
    "decode_frame",
    "decode_message",
    "decode_validated_datagram",
    "deserialize",
    "document_from_message",
    "encode",
    "encode_chunk",
    "encode_datagram",
    "encode_document",
    "encode_frame",
    "encode_message",
    "encode_validated_datagram",
    "is_layer_message",
    "message_from_document",
    "ray32sub8",
    "serialize",
    "type_name",
]


Decoder = StackDecoder


def encode(message: PubSubMessage) -> bytes:
    """The minimal-stack wire bytes of one pub-sub message, delimiters included."""
    return MINIMAL.encode(message)


def decode(data: bytes) -> Received:
    """The message in minimal-stack wire bytes of one chunk (delimiters optional).

    Returns a `PubSubMessage` (which may be a layer message, see `is_layer_message`), or the
    `Datagram` of a datagram-layer message.
    """
    return MINIMAL.decode(data)
