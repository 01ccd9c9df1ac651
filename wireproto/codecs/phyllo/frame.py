"""Phyllo frame (type 0x20): the COBS encoding of a payload, so that it holds no 0x00.

One frame is one chunk of the chunked stream below. COBS adds one byte per 254, so a payload of
at most 253 bytes (the limit for interop with phyllo-cpp) fits a 255-byte chunk.
"""

from __future__ import annotations

from cobs import cobs

from wireproto.codecs.serialization import binary
from wireproto.errors import BadLength, FrameTooLarge, InvalidField, TruncatedFrame

__all__ = ["MAX_FRAME_PAYLOAD", "decode_frame", "encode_frame"]

MAX_FRAME_PAYLOAD = 253


def encode_frame(payload: bytes, max_length: int = MAX_FRAME_PAYLOAD) -> bytes:
    """The COBS encoding of `payload` (1 to `max_length` bytes)."""
    if not payload:
        raise BadLength("Phyllo frame payload is empty: there is nothing to send")
    if len(payload) > max_length:
        raise FrameTooLarge(
            f"Phyllo frame payload of {len(payload)} bytes is over the {max_length}-byte limit"
        )
    return cobs.encode(bytes(payload))


def decode_frame(chunk: bytes, max_length: int = MAX_FRAME_PAYLOAD) -> bytes:
    """The payload of one COBS-encoded chunk (without its delimiters)."""
    if type(chunk) is not bytes:
        chunk = binary(chunk, "Phyllo frame")  # the cobs extension refuses some memoryviews
    try:
        payload = cobs.decode(chunk)
    except cobs.DecodeError as e:
        zero = chunk.find(0)
        if zero >= 0:
            raise InvalidField(
                f"Phyllo frame has a 0x00 at byte {zero}: a COBS frame holds none", offset=zero
            ) from None
        raise TruncatedFrame(f"Phyllo frame of {len(chunk)} bytes is not valid COBS: {e}") from None
    if not payload:
        raise BadLength(f"Phyllo frame of {len(chunk)} bytes decodes to an empty payload")
    if len(payload) > max_length:
        raise FrameTooLarge(
            f"Phyllo frame payload of {len(payload)} bytes is over the {max_length}-byte limit"
        )
    return payload
