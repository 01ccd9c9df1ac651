"""The common WebSocket frames, written without Autobahn's per-frame machinery (sans-IO).

Nearly every frame a message broker sees is a whole text or binary message in one frame: FIN set,
no extension bits, a length within the connection's limit. Autobahn handles each such frame
through a dozen calls, a masker object and debug-log arguments formatted whether or not anyone
logs them, which is most of a WebSocket broker's time. The fast path's `ws_deliver`
(wireproto.speedups) reads exactly those frames and its `ws_frame` writes a server's; `frame`
here writes a client's, masked; every other frame (a ping, a close, a fragment, a compressed
or oversized message, bad UTF-8, a protocol violation) is left to Autobahn, which handles it as
before. tests/transports/test_websocket_frames.py holds both paths to the same bytes.
"""

from __future__ import annotations

import os
import struct

from autobahn.websocket import USES_NVX
from autobahn.websocket.xormasker import create_xor_masker

__all__ = ["frame", "unmask"]

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
