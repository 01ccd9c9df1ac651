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

from wireproto import speedups

__all__ = ["frame"]

TEXT, BINARY = 0x1, 0x2
_FIN = 0x80
_MASK_BIT = 0x80
_HEADER16 = struct.Struct("!BBH")
_HEADER64 = struct.Struct("!BBQ")


def frame(payload: bytes, binary: bool, masked: bool) -> bytes:
    """`payload` as one whole unfragmented frame; a client's (`masked`) gets a fresh random mask
    (a server's is the fast path's `ws_frame`)."""
    if not masked:
        return speedups.ws_frame(payload, binary)
    first = _FIN | (BINARY if binary else TEXT)
    size = len(payload)
    if size < 126:
        header = bytes((first, _MASK_BIT | size))
    elif size < 0x10000:
        header = _HEADER16.pack(first, _MASK_BIT | 126, size)
    else:
        header = _HEADER64.pack(first, _MASK_BIT | 127, size)
    mask = os.urandom(4)
    return header + mask + speedups.ws_unmask(payload, mask)
