"""One-pass paths through the minimal and reduced stacks, for the common case.

The layered path in `stack` (one codec per layer, each handing its payload to the next) is the
reference. A fused path does the same work in one function for a well-formed pub-sub message
within the limits. For anything else (a limit crossed, a layer's own message, bad bytes, a
value of the wrong type) it returns None, and the stack takes the layered path, so every error
and every unusual result comes from the layers. tests/codecs/test_phyllo_fused.py checks that
both paths give the same bytes and the same values.

Minimal: ``len | 60 | message``. Reduced: ``len | 22 | crc32 | 60 | message``, where the CRC
covers ``60 | message``. A message is ``type | topic length | topic | payload``, and a document
is a message of type 0x40 whose payload is ``format | schema | body``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from cobs import cobs

from .codes import TypeCode
from .datagram import _calc_crc
from .document import Document, _build_document
from .message import MAX_TOPIC_LENGTH, PubSubMessage, _build_message

__all__ = ["FusedPath", "fused_path"]

_PUBSUB = int(TypeCode.PUBSUB)
_DOCUMENT = int(TypeCode.DOCUMENT)
_VALIDATED = int(TypeCode.VALIDATED_DATAGRAM)
_REDUCED_HEAD = struct.Struct(">BBI")  # length, 0x22, CRC
_CRC = struct.Struct(">I")
_cobs_encode = cobs.encode
_cobs_decode = cobs.decode
_CobsError = cobs.DecodeError


@dataclass(frozen=True, slots=True)
class FusedPath:
    """A stack's fused functions; each returns None where the layered path must answer."""

    encode: Callable[[int, bytes | str, bytes], bytes | None]
    decode_chunk: Callable[[bytes], PubSubMessage | None]
    encode_document: Callable[[bytes | str, Document], bytes | None]
    decode_document_chunk: Callable[[bytes], tuple[bytes, Document] | None]


def fused_path(layer_codes: tuple[int, ...], max_frame: int, max_chunk: int) -> FusedPath | None:
    """The fused path for a stack of these transport layers (type codes, bottom first), or None
    for a stack that has none."""
    if layer_codes == (TypeCode.DATAGRAM,):
        validated = False
    elif layer_codes == (TypeCode.DATAGRAM, TypeCode.VALIDATED_DATAGRAM):
        validated = True
    else:
        return None
    message_at = 7 if validated else 2  # headers below the message: len, type (, crc, type)
    shortest_frame = message_at + 2  # a message's payload type and topic length
    # The datagram's length byte counts what follows its two-byte header.
    longest_message = min(max_frame, 0xFF + 2) - message_at

    def encode(payload_type: int, topic: bytes | str, payload: bytes) -> bytes | None:
        if type(topic) is not bytes or type(payload) is not bytes or len(topic) > MAX_TOPIC_LENGTH:
            return None
        size = 2 + len(topic) + len(payload)
        if size > longest_message:
            return None
        try:
            if validated:
                protected = b"".join((bytes((_PUBSUB, payload_type, len(topic))), topic, payload))
                frame = _REDUCED_HEAD.pack(size + 5, _VALIDATED, _calc_crc(protected)) + protected
            else:
                frame = b"".join((bytes((size, _PUBSUB, payload_type, len(topic))), topic, payload))
        except (TypeError, ValueError):  # not a byte
            return None
        chunk = _cobs_encode(frame)
        if len(chunk) > max_chunk:
            return None
        return b"".join((b"\x00", chunk, b"\x00"))

    def encode_document(topic: bytes | str, document: Document) -> bytes | None:
        body = document.body
        if type(body) is not bytes:
            return None
        try:
            payload = bytes((document.format, document.schema)) + body
        except (TypeError, ValueError):  # not a byte
            return None
        return encode(_DOCUMENT, topic, payload)

    def frame_of_chunk(chunk: bytes) -> bytes | None:
        """The frame in a chunk that holds a well-formed pub-sub message, else None."""
        if len(chunk) > max_chunk:
            return None
        try:
            data = _cobs_decode(chunk)
        except _CobsError:
            return None
        size = len(data)
        if size < shortest_frame or size > max_frame or data[0] != size - 2:
            return None
        if validated:
            if (
                data[1] != _VALIDATED
                or data[6] != _PUBSUB
                or _CRC.unpack_from(data, 2)[0] != _calc_crc(data[6:])
            ):
                return None
        elif data[1] != _PUBSUB:
            return None
        return data

    topic_at = message_at + 2

    def decode_chunk(chunk: bytes) -> PubSubMessage | None:
        data = frame_of_chunk(chunk)
        if data is None:
            return None
        payload_at = topic_at + (data[message_at + 1] & 0x0F)
        if payload_at > len(data):
            return None
        return _build_message(data[message_at], data[topic_at:payload_at], data[payload_at:])

    def decode_document_chunk(chunk: bytes) -> tuple[bytes, Document] | None:
        data = frame_of_chunk(chunk)
        if data is None or data[message_at] != _DOCUMENT:
            return None
        payload_at = topic_at + (data[message_at + 1] & 0x0F)
        if payload_at + 2 > len(data):
            return None
        document = _build_document(data[payload_at], data[payload_at + 1], data[payload_at + 2 :])
        return data[topic_at:payload_at], document

    return FusedPath(encode, decode_chunk, encode_document, decode_document_chunk)
