"""The common WebSocket frames, read and written without Autobahn's per-frame machinery (sans-IO).

Nearly every frame a message broker sees is a whole text or binary message in one frame: FIN set,
no extension bits, a length within the connection's limit. Autobahn handles each such frame
through a dozen calls, a masker object and debug-log arguments formatted whether or not anyone
logs them, which is most of a WebSocket broker's time. `whole_frame` reads exactly those frames
and `frame` writes them; every other frame (a ping, a close, a fragment, a compressed or
oversized message, bad UTF-8, a protocol violation) is left to Autobahn, which handles it as
before. tests/transports/test_websocket_frames.py holds both paths to the same bytes.
"""

from __future__ import annotations

import os
import struct

from autobahn.websocket import USES_NVX
from autobahn.websocket.xormasker import create_xor_masker

__all__ = ["whole_frame", "frame", "unmask"]

TEXT, BINARY = 0x1, 0x2
_FIN = 0x80
_MASK_BIT = 0x80
_LENGTH16 = struct.Struct("!H")
_HEADER16 = struct.Struct("!BBH")
_HEADER64 = struct.Struct("!BBQ")
# Below this many bytes, one big-integer XOR beats creating Autobahn's (native) masker; without
# its native code (AUTOBAHN_USE_NVX=0, as the short-lived tools run), Autobahn's masker goes byte
# by byte, and the big integer is faster at any size.
_NATIVE_UNMASK_FROM = 1024 if USES_NVX else float("inf")


def unmask(payload: bytes, mask: bytes) -> bytes:
    """`payload` XORed with the repeating four-byte `mask` (masking and unmasking are one)."""
    size = len(payload)
    if size >= _NATIVE_UNMASK_FROM:
        return create_xor_masker(mask, size).process(payload)
    key = (mask * ((size >> 2) + 1))[:size]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(
        size, "little"
    )


def whole_frame(
    data: bytes, start: int, masked: bool, limit: int, check_utf8: bool
) -> tuple[bytes, bool, int] | None:
    """The frame at `data[start:]` as (payload, binary, end) if it is a whole, unfragmented,
    uncompressed text or binary frame, masked exactly when `masked`, of at most `limit` bytes
    (0: no limit) and, if text and `check_utf8`, valid UTF-8. None for anything else."""
    available = len(data) - start
    if available < 2:
        return None
    first = data[start]
    if first != _FIN | BINARY and first != _FIN | TEXT:
        return None
    second = data[start + 1]
    if bool(second & _MASK_BIT) is not masked:
        return None
    length = second & 0x7F
    at = start + 2
    if length == 126:
        if available < 4:
            return None
        (length,) = _LENGTH16.unpack_from(data, at)
        if length < 126:  # not the shortest length encoding: Autobahn refuses it
            return None
        at += 2
    elif length == 127:  # 64 KiB and more: rare, and Autobahn's pace is fine there
        return None
    if limit and length > limit:
        return None
    if masked:
        mask = data[at : at + 4]
        at += 4
    end = at + length
    if end > len(data):
        return None
    payload = data[at:end]
    if masked and length:
        payload = unmask(payload, mask)
    if first == _FIN | TEXT and check_utf8:
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return payload, first == _FIN | BINARY, end


def frame(payload: bytes, binary: bool, masked: bool) -> bytes:
    """`payload` as one whole unfragmented frame; a client's (`masked`) gets a fresh random mask."""
    first = _FIN | (BINARY if binary else TEXT)
    size = len(payload)
    mask_bit = _MASK_BIT if masked else 0
    if size < 126:
        header = bytes((first, mask_bit | size))
    elif size < 0x10000:
        header = _HEADER16.pack(first, mask_bit | 126, size)
    else:
        header = _HEADER64.pack(first, mask_bit | 127, size)
    if not masked:
        return header + payload
    mask = os.urandom(4)
    return header + mask + unmask(payload, mask)
