"""The fast path in plain Python: what runs when the compiled twin (`_compiled.pyx`) is not
built, and what the differential tests hold it to. Every name here has a twin there that
behaves the same; docs/performance.md ("The compiled fast path") says what each is for."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from cobs import cobs
from twisted.logger import Logger

__all__ = ["Outbox", "batch_begin", "batch_end", "batching", "deliver_frames",
           "length32_deliver",
           # websocket
           "FrameGate", "ws_frame", "ws_unmask", "ws_deliver",
           # readers: the lines and COBS cuts
           "lines_deliver",
           "cobs_deliver",
           "COBS_TOO_LARGE",
           "COBS_UNDECODABLE"]

log = Logger(namespace="wireproto.speedups")


class FrameTarget(Protocol):
    """What `deliver_frames` writes to (the hub's sessions; see wireproto.hub.subscribers)."""

    writes_now: bool
    frame_key: object
    sent: int
    sent_bytes: int

    def frame_from_cache(self, cache: dict) -> tuple[bytes, int] | None: ...

    def write_frame(self, frame: bytes) -> None: ...


class Reader(Protocol):
    """A connection reading frames: `paused` stops the delivery of the rest."""

    paused: bool


Target = TypeVar("Target", bound=FrameTarget)
_unpack_length32 = struct.Struct(">I").unpack_from

# How many reads are being handled now (they nest when a read's handling reads again), and the
# outboxes holding frames until the outermost ends.
_depth = 0
_dirty: list[Outbox] = []
# Twisted's own buffer size (FileDescriptor.bufferSize): an outbox holding more writes it to
# its transport at once, whose producer check then pauses the session, so what one read makes
# the broker send to a peer that does not read goes to the session's queue, under its limit
# and overflow policy, and never waits here past this.
FLUSH_AT = 65536


class Outbox:
    """A connection's writes, gathered while a read is handled and written as one at its end.

    Outside a read (`batch_begin`..`batch_end`) a write goes straight through. Inside one,
    frames wait here in order and are joined into one write when the outermost read ends (or
    once more than FLUSH_AT bytes wait), so a publish read with many messages costs each
    subscriber one write instead of one per message. Every write of the connection goes
    through here, so nothing overtakes what waits. Once `close`d, writes are dropped."""

    __slots__ = ("_write", "_pending", "_waiting", "_listed", "_closed")

    def __init__(self, write: Callable[[bytes], object]) -> None:
        self._write = write
        self._pending: list[bytes] = []
        self._waiting = 0
        self._listed = False
        self._closed = False

    def write(self, prepared: bytes) -> None:
        """Write a framed message now, or when the read being handled ends."""
        if self._closed:
            return
        if not _depth:
            self._write(prepared)
            return
        self._pending.append(prepared)
        self._waiting += len(prepared)
        if not self._listed:
            self._listed = True
            _dirty.append(self)
        if self._waiting > FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Write what waits, as one write."""
        pending = self._pending
        if pending:
            self._pending = []
            self._waiting = 0
            self._write(pending[0] if len(pending) == 1 else b"".join(pending))

    def discard(self) -> None:
        """Forget what waits."""
        self._pending = []
        self._waiting = 0

    def close(self) -> None:
        """Forget what waits and drop every later write (the connection is aborted or lost)."""
        self.discard()
        self._closed = True

    @property
    def waiting(self) -> int:
        """Bytes waiting for the end of the read."""
        return self._waiting


def batch_begin() -> None:
    """A read's handling starts: writes wait in their outboxes until it ends."""
    global _depth
    _depth += 1


def batch_end() -> None:
    """A read's handling ended: when it is the outermost, every outbox written to is flushed,
    the batch held open meanwhile, so that a write made while one is flushed (a transport that
    calls back) waits its turn behind what waits already. RuntimeError without a batch."""
    global _depth
    if _depth <= 0:
        raise RuntimeError("batch_end without batch_begin")
    if _depth > 1 or not _dirty:
        _depth -= 1
        return
    try:
        while _dirty:
            dirty = _dirty[:]
            del _dirty[:]
            for outbox in dirty:
                outbox._listed = False
                try:
                    outbox.flush()
                except Exception:  # one connection's failure leaves the others' frames written
                    log.failure("writing a connection's waiting frames failed",
                                event="write_failed")
    finally:
        _depth -= 1


def batching() -> bool:
    """Whether a read's handling is under way (writes wait)."""
    return _depth > 0


def deliver_frames(targets: Iterable[Target], sender: object, cache: dict
                   ) -> tuple[int, list[Target] | None]:
    """The hub's fan-out loop: write the prepared frame to every target but `sender` whose
    transport takes writes now. Return how many targets there were and those that need the
    message itself (another format not yet encoded, a queue, a host callback), or None."""
    if type(cache) is not dict:  # as the compiled twin, which takes a dict exactly
        raise TypeError(f"deliver_frames takes a dict as its cache, not {type(cache).__name__}")
    delivered = 0
    rest: list[Target] | None = None
    for subscriber in targets:
        if subscriber is sender:
            continue
        delivered += 1
        if subscriber.writes_now:
            prepared = cache.get(subscriber.frame_key) or subscriber.frame_from_cache(cache)
            if prepared is not None:
                frame, size = prepared
                subscriber.sent += 1
                subscriber.sent_bytes += size
                subscriber.write_frame(frame)
                continue
        if rest is None:
            rest = []
        rest.append(subscriber)
    return delivered, rest


def length32_deliver(buffer: bytes, limit: int, deliver: Callable[[bytes, bool], object],
                     reader: Reader) -> tuple[int, int]:
    """Hand `deliver` the message of each whole length32 frame at the start of `buffer`, until
    the frames end or `reader.paused` is set. Return where the first frame not delivered
    starts, and the length of a frame over `limit` that stopped it (else -1)."""
    if type(buffer) is not bytes:  # as the compiled twin, which reads its bytes in place
        raise TypeError(f"length32_deliver reads bytes, not {type(buffer).__name__}")
    end = len(buffer)
    offset = 0
    while end - offset >= 4 and not reader.paused:
        (length,) = _unpack_length32(buffer, offset)
        if length > limit:
            return offset, length
        frame_end = offset + 4 + length
        if frame_end > end:
            break
        message = buffer[offset + 4:frame_end]
        offset = frame_end
        deliver(message, True)
    return offset, -1


# -- websocket: the frames of a WebSocket connection (wireproto/transports/websocket.py) --------

_WS_FIN_TEXT, _WS_FIN_BINARY = 0x81, 0x82
_ws_length16 = struct.Struct("!H")
_ws_header16 = struct.Struct("!BBH")
_ws_header64 = struct.Struct("!BBQ")


class Gate(Protocol):
    """What stops `ws_deliver`: the connection's `FrameGate`, closed once it stops being open."""

    open: bool


class FrameGate:
    """A WebSocket connection's data frames on their way to its outbox, while it is open.

    `close` (the close frame went out, or the connection was dropped) turns every later `write`
    into nothing, as RFC 6455 asks: no data frame follows a close frame."""

    __slots__ = ("_write", "open")

    def __init__(self, write: Callable[[bytes], object]) -> None:
        self._write = write
        self.open = True

    def write(self, prepared: bytes) -> None:
        """Pass a framed message on, unless the gate is closed."""
        if self.open:
            self._write(prepared)

    def close(self) -> None:
        """Drop every later write."""
        self.open = False


def ws_frame(payload: bytes, binary: bool) -> bytes:
    """`payload` as one whole, unfragmented, unmasked frame (a server's)."""
    if type(payload) is not bytes:  # as the compiled twin
        raise TypeError(f"ws_frame frames bytes, not {type(payload).__name__}")
    first = _WS_FIN_BINARY if binary else _WS_FIN_TEXT
    size = len(payload)
    if size < 126:
        return bytes((first, size)) + payload
    if size < 0x10000:
        return _ws_header16.pack(first, 126, size) + payload
    return _ws_header64.pack(first, 127, size) + payload


# From this many bytes Autobahn's native masker (its NVX code, when built) beats the big integer.
_NATIVE_UNMASK_FROM = 1024


@functools.cache
def _native_masker() -> Callable[[bytes, int], XorMasker] | None:
    from autobahn.websocket import USES_NVX
    from autobahn.websocket.xormasker import create_xor_masker

    return create_xor_masker if USES_NVX else None


class XorMasker(Protocol):
    def process(self, data: bytes) -> bytes: ...


def ws_unmask(payload: bytes, mask: bytes) -> bytes:
    """`payload` XORed with the repeating four-byte `mask` (masking and unmasking are one);
    ValueError for a mask of another length."""
    if type(payload) is not bytes or type(mask) is not bytes:  # as the compiled twin
        raise TypeError("ws_unmask takes bytes")
    if len(mask) != 4:
        raise ValueError("a WebSocket mask is four bytes")
    size = len(payload)
    if size >= _NATIVE_UNMASK_FROM:
        native = _native_masker()
        if native is not None:
            return native(mask, size).process(payload)
    key = (mask * ((size >> 2) + 1))[:size]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(
        size, "little")


def ws_deliver(buffer: bytes, start: int, masked: bool, limit: int, check_utf8: bool,
               deliver: Callable[[bytes, bool], object], gate: Gate) -> int:
    """Hand `deliver` the payload of each whole frame from `buffer[start:]` while `gate` is
    open and the frames are whole, unfragmented, uncompressed text or binary frames, masked
    exactly when `masked`, with a length under 64 KiB in its shortest encoding and of at most
    `limit` bytes (0: no limit), and if text and `check_utf8`, valid UTF-8. Return where the
    first frame not delivered starts: what is there (a control frame, a fragment, a frame cut
    short, a bad one) is the caller's to read. TypeError for a buffer not of bytes, ValueError
    for a `start` outside it."""
    if type(buffer) is not bytes:  # as the compiled twin, which reads its bytes in place
        raise TypeError(f"ws_deliver reads bytes, not {type(buffer).__name__}")
    if type(limit) is not int:  # as the compiled twin
        raise TypeError("ws_deliver takes an int limit")
    masked = bool(masked)
    end = len(buffer)
    if not 0 <= start <= end:
        raise ValueError(f"ws_deliver starts within its buffer of {end} bytes, not at {start}")
    while gate.open and end - start >= 2:
        first = buffer[start]
        if first != _WS_FIN_BINARY and first != _WS_FIN_TEXT:
            break
        second = buffer[start + 1]
        if bool(second & 0x80) != masked:
            break
        length = second & 0x7F
        at = start + 2
        if length == 126:
            if end - start < 4:
                break
            (length,) = _ws_length16.unpack_from(buffer, at)
            if length < 126:  # not the shortest encoding: a protocol error, the caller's
                break
            at += 2
        elif length == 127:
            break
        if limit and length > limit:
            break
        if masked:
            mask = buffer[at:at + 4]
            at += 4
        frame_end = at + length
        if frame_end > end:
            break
        payload = buffer[at:frame_end]
        if masked and length:
            payload = ws_unmask(payload, mask)
        if first == _WS_FIN_TEXT and check_utf8:
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError:
                break
        start = frame_end
        deliver(payload, first == _WS_FIN_BINARY)
    return start
# -- readers: the lines and COBS cuts ------------------------------------------------------------

_CR = 13


def lines_deliver(buffer: bytes, limit: int, deliver: Callable[[bytes, bool], object],
                  reader: Reader) -> tuple[int, int]:
    """Hand `deliver` each whole line at the start of `buffer` (ended by b"\\n", a b"\\r"
    before it dropped) as a text message, until the lines end or `reader.paused` is set.
    Return where the first line not delivered starts, and the length of a line over `limit`
    that stopped it, or of what follows the last line when no line that long could be legal
    (over `limit` + 1 bytes, the room of a b"\\r"), else -1."""
    if type(buffer) is not bytes:  # as the compiled twin, which reads its bytes in place
        raise TypeError(f"lines_deliver reads bytes, not {type(buffer).__name__}")
    lines = buffer.split(b"\n")
    rest = lines.pop()
    offset = 0
    for line in lines:
        if reader.paused:
            return offset, -1
        length = len(line)
        message = line[:-1] if length and line[-1] == _CR else line
        if len(message) > limit:
            return offset, len(message)
        offset += length + 1
        deliver(message, False)
    if not reader.paused and len(rest) > limit + 1:
        return offset, len(rest)
    return offset, -1


# What stopped `cobs_deliver`: a frame (or message) over the limit, or one that does not decode.
COBS_TOO_LARGE = 1
COBS_UNDECODABLE = 2


def cobs_deliver(buffer: bytes, max_frame: int, limit: int,
                 deliver: Callable[[bytes, bool], object], reader: Reader
                 ) -> tuple[int, int, int]:
    """Hand `deliver` the decoded message of each whole COBS frame (ended by a zero byte) at the
    start of `buffer`, skipping empty ones, until the frames end or `reader.paused` is set.
    Return where the first frame not delivered starts, what stopped it (0, `COBS_TOO_LARGE`:
    a frame over `max_frame`, a message over `limit`, or over `max_frame` bytes with no end;
    `COBS_UNDECODABLE`) and the size at fault (the frame's, the message's, what waits)."""
    if type(buffer) is not bytes:  # as the compiled twin, which reads its bytes in place
        raise TypeError(f"cobs_deliver reads bytes, not {type(buffer).__name__}")
    frames = buffer.split(b"\x00")
    rest = frames.pop()
    offset = 0
    decode = cobs.decode
    for frame in frames:
        if reader.paused:
            return offset, 0, 0
        size = len(frame)
        if not size:
            offset += 1
            continue
        if size > max_frame:
            return offset, COBS_TOO_LARGE, size
        try:
            message = decode(frame)
        except cobs.DecodeError:
            return offset, COBS_UNDECODABLE, size
        if len(message) > limit:
            return offset, COBS_TOO_LARGE, len(message)
        offset += size + 1
        deliver(message, True)
    if not reader.paused and len(rest) > max_frame:
        return offset, COBS_TOO_LARGE, len(rest)
    return offset, 0, 0
