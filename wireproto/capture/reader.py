"""Reading capture files: the header, records one by one or in batches, and the files of a
directory. Every reader stops cleanly at a torn last record (a file still being written)."""


from __future__ import annotations

import mmap
import os
import re
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from wireproto.capture.format import (
    HEADER_SIZE,
    LENGTH_CRC,
    PREAMBLE,
    RECORD_FIELDS,
    RECORD_HEADER,
    CaptureError,
    CaptureHeader,
    CorruptCapture,
    IncompleteCapture,
    NotACapture,
    Record,
    decode_file_header,
    record_from_fields,
)

__all__ = [
    "Scan",
    "Batch",
    "Segment",
    "read_header",
    "read_header_from",
    "scan_offsets",
    "segments",
    "iter_records",
    "read_batch",
    "read_batch_from",
    "split_ranges",
    "ranges_from_boundaries",
    "capture_files",
]

# -- reading files --------------------------------------------------------------------------------

# Why a scan stopped: at the exact end of the bytes, at the record limit, or before bytes that do
# not (yet) make a whole record: a torn last record, or one still being written.
END, LIMIT, PARTIAL = "end", "limit", "partial"


@dataclass(frozen=True, slots=True)
class Scan:
    """Record boundaries: `starts` of whole records, `end` the boundary after the last of them
    (where the next scan starts) and `stop`: "end", "limit" or "partial"."""

    starts: list[int]
    end: int
    stop: str


@dataclass(frozen=True, slots=True)
class Batch:
    """Columns of whole records. `headers` is their 32-byte headers back to back, for a
    vectorised decoder (numpy.frombuffer, Arrow); the other columns are lists."""

    offset: list[int]
    timestamp_ns: list[int]
    connection: list[int]
    kind: list[int]
    protocol: list[int]
    transport: list[int]
    flags: list[int]
    data: list[bytes]
    headers: bytes
    end: int
    stop: str

    def __len__(self) -> int:
        return len(self.offset)


@contextmanager
def _mapped(path: str | os.PathLike[str]) -> Iterator[bytes | mmap.mmap]:
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            yield b""
            return
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            yield mapped


def _scan(buf: Any, start: int, end: int, limit: int | None, path: str,
          base: int = 0) -> Scan:
    """Chain the record lengths from `start`, checking every CRC. `buf` holds the file's bytes
    from offset `base` on; offsets in and out are the file's."""
    starts: list[int] = []
    offset = start
    unpack = LENGTH_CRC.unpack_from
    crc32 = zlib.crc32
    with memoryview(buf) as view:
        while True:
            if limit is not None and len(starts) >= limit:
                return Scan(starts, offset, LIMIT)
            if offset == end:
                return Scan(starts, offset, END)
            if end - offset < HEADER_SIZE:
                return Scan(starts, offset, PARTIAL)
            at = offset - base
            length, crc = unpack(view, at)
            stop = offset + HEADER_SIZE + length
            if stop > end:
                return Scan(starts, offset, PARTIAL)
            if crc32(view[at + 8:stop - base]) != crc:
                # A torn tail ends the bytes, or is followed only by zeros (a file extended but
                # not written, after a power loss). Anything else after it is corruption.
                if stop == end or not view[stop - base:end - base].tobytes().strip(b"\0"):
                    return Scan(starts, offset, PARTIAL)
                raise CorruptCapture(
                    f"{path}: record at offset {offset}: CRC mismatch with {end - stop} bytes "
                    "after it: the file is corrupt, not torn", path=path, offset=offset)
            starts.append(offset)
            offset = stop


def _open_scan(buf: Any, path: str, start: int | None, available: int | None
               ) -> tuple[int, int] | None:
    """(start, end) for a scan of `buf`, or None for a file whose header is not complete."""
    end = len(buf) if available is None else min(available, len(buf))
    try:
        header = decode_file_header(buf[:end] if end < PREAMBLE.size else buf)
    except IncompleteCapture:
        return None
    except NotACapture as error:
        raise NotACapture(f"{path}: {error}") from None
    if header.data_offset > end:
        return None
    if start is None:
        start = header.data_offset
    if not header.data_offset <= start <= end:
        raise ValueError(f"{path}: start offset {start} is outside the records "
                         f"({header.data_offset} to {end})")
    return start, end


# The first read of a header: almost every header is shorter.
_HEADER_READ = 4096


def read_header(path: str | os.PathLike[str]) -> CaptureHeader:
    """The file header; `IncompleteCapture` if the file is shorter than it. Read with plain
    reads of about its size, not by mapping the file: a fault in a mapping may read ahead
    megabytes of records that a reader after the header alone never wanted."""
    with open(path, "rb") as file:
        return read_header_from(file, os.fspath(path))


def read_header_from(file: BinaryIO, name: str) -> CaptureHeader:
    """`read_header` of a file open at its start; `name` names it in an error."""
    data = file.read(_HEADER_READ)
    try:
        try:
            return decode_file_header(data)
        except IncompleteCapture:
            if len(data) < _HEADER_READ:
                raise
            # A longer header: decode_file_header checked its announced length.
            length = PREAMBLE.unpack_from(data)[3]
            return decode_file_header(data + file.read(PREAMBLE.size + length - len(data)))
    except CaptureError as error:
        raise type(error)(f"{name}: {error}") from None


def scan_offsets(path: str | os.PathLike[str], start: int | None = None,
                 limit: int | None = None, available: int | None = None) -> Scan:
    """The offsets of whole records from `start` (a record boundary; by default the first
    record), at most `limit` of them, reading at most `available` bytes of the file (a size seen
    earlier: a file being written may end mid-record). A file whose header is not complete yet
    scans as no records, stop "partial", end 0."""
    name = os.fspath(path)
    with _mapped(path) as buf:
        bounds = _open_scan(buf, name, start, available)
        if bounds is None:
            return Scan([], 0, PARTIAL)
        return _scan(buf, bounds[0], bounds[1], limit, name)


def iter_records(path: str | os.PathLike[str], start: int | None = None,
                 available: int | None = None) -> Iterator[Record]:
    """Every whole record, in order, stopping cleanly at a torn last one. A CRC mismatch that is
    not at the tail raises `CorruptCapture`, naming the file and the offset."""
    name = os.fspath(path)
    with _mapped(path) as buf:
        bounds = _open_scan(buf, name, start, available)
        if bounds is None:
            return
        scan = _scan(buf, bounds[0], bounds[1], None, name)
        for offset in scan.starts:
            length, _, ts, conn, kind, proto, trans, flags, _ = RECORD_HEADER.unpack_from(
                buf, offset)
            data = buf[offset + HEADER_SIZE:offset + HEADER_SIZE + length]
            yield record_from_fields(offset, ts, conn, kind, proto, trans, flags, data)


def read_batch(path: str | os.PathLike[str], start_offset: int | None = None,
               max_records: int | None = None, available: int | None = None) -> Batch:
    """Up to `max_records` whole records from `start_offset`, as columns: one scan chains the
    lengths and checks CRCs, then one `struct.iter_unpack` decodes every header."""
    name = os.fspath(path)
    with _mapped(path) as buf:
        bounds = _open_scan(buf, name, start_offset, available)
        scan = (Scan([], 0, PARTIAL) if bounds is None
                else _scan(buf, bounds[0], bounds[1], max_records, name))
        return _batch(buf, 0, scan)


def read_batch_from(buf: Any, base: int, data_offset: int, path: str,
                    start_offset: int | None = None, max_records: int | None = None,
                    end: int | None = None) -> Batch:
    """`read_batch` over bytes already read: `buf` holds the file from offset `base` on (a
    range fetched from object storage, say), `data_offset` is where its header says the
    records start, and `end` (by default the end of `buf`) where to stop."""
    stop = base + len(buf) if end is None else min(end, base + len(buf))
    start = max(data_offset, base) if start_offset is None else start_offset
    if not base <= start <= stop:
        raise ValueError(f"{path}: start offset {start} is outside the bytes read "
                         f"({base} to {stop})")
    return _batch(buf, base, _scan(buf, start, stop, max_records, path, base))


def _batch(buf: Any, base: int, scan: Scan) -> Batch:
    """The columns of the records `scan` found in `buf` (the file's bytes from `base` on)."""
    headers = b"".join([buf[offset - base:offset - base + HEADER_SIZE]
                        for offset in scan.starts])
    rows = list(RECORD_HEADER.iter_unpack(headers))
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(RECORD_FIELDS)
    lengths = columns[0]
    data = [buf[offset - base + HEADER_SIZE:offset - base + HEADER_SIZE + length]
            for offset, length in zip(scan.starts, lengths, strict=True)]
    return Batch(
        offset=scan.starts, timestamp_ns=list(columns[2]), connection=list(columns[3]),
        kind=list(columns[4]), protocol=list(columns[5]), transport=list(columns[6]),
        flags=list(columns[7]), data=data, headers=headers, end=scan.end, stop=scan.stop,
    )


def split_ranges(path: str | os.PathLike[str], target_bytes: int
                 ) -> list[tuple[int | None, int | None]]:
    """The file's records as ranges of about `target_bytes` each, (start, end) at record
    boundaries: the first starts at None (the first record) and the last ends at None (as far as
    the file holds whole records), so each range reads alone and together they read the file
    once. Only the lengths are chained here; each range's reader checks the CRCs."""
    if target_bytes < 1:
        raise ValueError(f"target_bytes must be positive, not {target_bytes}")
    name = os.fspath(path)
    ranges: list[tuple[int | None, int | None]] = []
    with _mapped(path) as buf:
        bounds = _open_scan(buf, name, None, None)
        if bounds is None:
            return [(None, None)]
        offset, end = bounds
        start: int | None = None
        range_start = offset
        unpack = LENGTH_CRC.unpack_from
        while end - offset >= HEADER_SIZE:
            stop = offset + HEADER_SIZE + unpack(buf, offset)[0]
            if stop > end:
                break
            offset = stop
            if offset - range_start >= target_bytes and end - offset >= HEADER_SIZE:
                ranges.append((start, offset))
                start = range_start = offset
    ranges.append((start, None))
    return ranges


@dataclass(frozen=True, slots=True)
class Segment:
    """Whole records from `start` to `end` (record boundaries), their times between `min_ns`
    and `max_ns`: the records' own, since a wall clock may step back."""

    start: int
    end: int
    min_ns: int
    max_ns: int


_LENGTH_TIME = struct.Struct("<I4xq")  # a record header's length and timestamp_ns


def segments(path: str | os.PathLike[str], grain: int, start: int | None = None,
             available: int | None = None) -> list[Segment]:
    """The records of the file from `start` (a record boundary; by default the first record)
    up to `available` bytes (by default the file's size), in segments of about `grain` bytes,
    each with the span of its records' times. Only lengths and timestamps are read, as
    `split_ranges` reads lengths; each reader checks the CRCs. A file whose header is not
    complete has none."""
    if grain < 1:
        raise ValueError(f"grain must be positive, not {grain}")
    name = os.fspath(path)
    with _mapped(path) as buf:
        bounds = _open_scan(buf, name, start, available)
        if bounds is None:
            return []
        offset, end = bounds
        found: list[Segment] = []
        unpack = _LENGTH_TIME.unpack_from
        segment_start, low, high = offset, 0, 0
        while end - offset >= HEADER_SIZE:
            length, timestamp = unpack(buf, offset)
            stop = offset + HEADER_SIZE + length
            if stop > end:
                break
            if offset == segment_start:
                low = high = timestamp
            elif timestamp < low:
                low = timestamp
            elif timestamp > high:
                high = timestamp
            offset = stop
            if offset - segment_start >= grain:
                found.append(Segment(segment_start, offset, low, high))
                segment_start = offset
        if offset > segment_start:
            found.append(Segment(segment_start, offset, low, high))
        return found


def ranges_from_boundaries(boundaries: list[int], target_bytes: int
                           ) -> list[tuple[int | None, int | None]]:
    """Ranges as `split_ranges` gives them, of about `target_bytes` each, made from record
    boundaries found before (a shipped file's index, at a finer grain): a range ends at the
    first boundary at least `target_bytes` past its start.

    >>> ranges_from_boundaries([100, 200, 300, 400], 150)
    [(None, 200), (200, 400), (400, None)]
    """
    ranges: list[tuple[int | None, int | None]] = []
    start: int | None = None
    range_start = 0
    for boundary in boundaries:
        if boundary - range_start >= target_bytes:
            ranges.append((start, boundary))
            start = range_start = boundary
    ranges.append((start, None))
    return ranges


def capture_files(directory: str | os.PathLike[str], prefix: str = "wirecapture", *,
                  recursive: bool = False) -> list[Path]:
    """The capture files a writer with `prefix` wrote in `directory`, oldest first; with
    `recursive`, in its subdirectories too (a fleet's, one directory per broker), each
    directory's oldest first."""
    pattern = file_name_pattern(prefix)
    found = Path(directory).rglob("*") if recursive else Path(directory).iterdir()
    return sorted((path for path in found if pattern.match(path.name) and path.is_file()),
                  key=lambda path: (str(path.parent), path.name))


def file_name_pattern(prefix: str) -> re.Pattern[str]:
    """How a writer with `prefix` names its files; group 1 is the sequence number."""
    return re.compile(rf"^{re.escape(prefix)}-\d{{8}}T\d{{6}}-(\d{{6,}})\.wpcap$")
