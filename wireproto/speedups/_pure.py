"""The fast path in plain Python: what runs when the compiled twin (`_compiled.pyx`) is not
built, and what the differential tests hold it to. Every name here has a twin there that
behaves the same; docs/performance.md ("The compiled fast path") says what each is for."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from cobs import cobs
from twisted.logger import Logger

__all__ = ["Outbox", "batch_begin", "batch_end", "batching", "deliver_frames",
           "length32_deliver",
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


class Outbox:
    """A connection's writes, gathered while a read is handled and written as one at its end.

    Outside a read (`batch_begin`..`batch_end`) a write goes straight through. Inside one,
    frames wait here in order and are joined into one write when the outermost read ends, so a
    publish read with many messages costs each subscriber one write instead of one per message.
    Every write of the connection goes through here, so nothing overtakes what waits."""

    __slots__ = ("_write", "_pending")

    def __init__(self, write: Callable[[bytes], object]) -> None:
        self._write = write
        self._pending: list[bytes] = []

    def write(self, prepared: bytes) -> None:
        """Write a framed message now, or when the read being handled ends."""
        if not _depth:
            self._write(prepared)
            return
        pending = self._pending
        if not pending:
            _dirty.append(self)
        pending.append(prepared)

    def flush(self) -> None:
        """Write what waits, as one write."""
        pending = self._pending
        if pending:
            self._pending = []
            self._write(pending[0] if len(pending) == 1 else b"".join(pending))

    def discard(self) -> None:
        """Forget what waits (the connection is aborted)."""
        self._pending = []

    @property
    def waiting(self) -> int:
        """Bytes waiting for the end of the read."""
        return sum(map(len, self._pending))


def batch_begin() -> None:
    """A read's handling starts: writes wait in their outboxes until it ends."""
    global _depth
    _depth += 1


def batch_end() -> None:
    """A read's handling ended: when it is the outermost, every outbox written to is flushed."""
    global _depth
    _depth -= 1
    if _depth or not _dirty:
        return
    dirty = _dirty[:]
    del _dirty[:]
    for outbox in dirty:
        try:
            outbox.flush()
        except Exception:  # one connection's failure leaves the others' frames written
            log.failure("writing a connection's waiting frames failed", event="write_failed")


def batching() -> bool:
    """Whether a read's handling is under way (writes wait)."""
    return _depth > 0


def deliver_frames(targets: Iterable[Target], sender: object, cache: dict
                   ) -> tuple[int, list[Target] | None]:
    """The hub's fan-out loop: write the prepared frame to every target but `sender` whose
    transport takes writes now. Return how many targets there were and those that need the
    message itself (another format not yet encoded, a queue, a host callback), or None."""
    delivered = 0
    rest: list[Target] | None = None
    for subscriber in targets:
        if subscriber is sender:
            continue
        delivered += 1
        if subscriber.writes_now:
            prepared = cache.get(subscriber.frame_key) or subscriber.frame_from_cache(cache)
            if prepared is not None:
                subscriber.sent += 1
                subscriber.sent_bytes += prepared[1]
                subscriber.write_frame(prepared[0])
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


# -- readers: the lines and COBS cuts ------------------------------------------------------------

_CR = 13


def lines_deliver(buffer: bytes, limit: int, deliver: Callable[[bytes, bool], object],
                  reader: Reader) -> tuple[int, int]:
    """Hand `deliver` each whole line at the start of `buffer` (ended by b"\\n", a b"\\r"
    before it dropped) as a text message, until the lines end or `reader.paused` is set.
    Return where the first line not delivered starts, and the length of a line over `limit`
    that stopped it, or of what follows the last line when no line that long could be legal
    (over `limit` + 1 bytes, the room of a b"\\r"), else -1."""
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
