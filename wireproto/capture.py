"""Capture files: every message a broker sees, in append-only, rotated, self-describing files.

Issue 9, item 1 (docs/pipeline.md, "Capture files", is the reference). A capture file is:

- a file header: ``b"WPCAP"``, version byte 1, two reserved zero bytes, a u32 little-endian
  length N, then N bytes of UTF-8 JSON describing the file and the record layout;
- records, each a fixed 32-byte little-endian header (`RECORD_HEADER`, ``"<IIqQBBBBI"``: length,
  crc, timestamp_ns, connection, kind, protocol, transport, flags, reserved) and then `length`
  bytes of data. The crc is ``zlib.crc32`` of the 24 header bytes after it and the data.

Open records carry JSON (peer, protocol, transport), close records JSON ({"reason": ...}), and
in and out records the raw bytes of the messages: one message, or with `FLAG_BATCH` several
messages of one connection and direction, each a 4-byte big-endian length and the message
(`record_messages` splits them). Each file starts with an open record for every connection still
open, so each file stands alone.

The encoding and decoding here are sans-IO. `CaptureWriter` (synchronous, batched) and
`ThreadedCaptureWriter` (one background thread; never blocks its caller) write files;
`read_header`, `iter_records`, `scan_offsets` and `read_batch` read them, stopping cleanly at a
torn last record.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import socket
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path
from typing import Any

from wireproto import __version__

__all__ = [
    "MAGIC",
    "FORMAT_VERSION",
    "RECORD_HEADER",
    "RECORD_FIELDS",
    "Kind",
    "PROTOCOLS",
    "TRANSPORTS",
    "FLAG_BINARY",
    "FLAG_BATCH",
    "DEFAULT_MAX_FILE_BYTES",
    "MIN_FILE_BYTES",
    "MAX_FILE_BYTES",
    "CaptureError",
    "NotACapture",
    "IncompleteCapture",
    "CorruptCapture",
    "CaptureHeader",
    "Record",
    "Scan",
    "Batch",
    "CaptureCounters",
    "encode_file_header",
    "decode_file_header",
    "encode_record",
    "decode_record",
    "record_messages",
    "encode_batch",
    "read_header",
    "iter_records",
    "scan_offsets",
    "read_batch",
    "capture_files",
    "CaptureWriter",
    "ThreadedCaptureWriter",
]

MAGIC = b"WPCAP"
FORMAT_VERSION = 1
# magic, version, reserved (0), JSON length
PREAMBLE = struct.Struct("<5sBHI")
RECORD_HEADER = struct.Struct("<IIqQBBBBI")
RECORD_FIELDS = (
    "length", "crc", "timestamp_ns", "connection", "kind", "protocol", "transport", "flags",
    "reserved",
)
_LENGTH_CRC = struct.Struct("<II")
_CRC_COVERED = struct.Struct("<qQBBBBI")  # the 24 header bytes after the crc
HEADER_SIZE = RECORD_HEADER.size  # 32
_MAX_HEADER_JSON = 1 << 20


class Kind(IntEnum):
    OPEN = 0
    IN = 1
    OUT = 2
    CLOSE = 3


PROTOCOLS = {"websmq": 1, "ubre": 2, "nydus": 3, "subble": 4, "phyllo": 5}
# "stream": Phyllo's chunked serial stream; "chunks": Phyllo message chunks (one per message).
TRANSPORTS = {
    "ws": 1, "engineio": 2, "length32": 3, "lines": 4, "cobs": 5, "stream": 6, "chunks": 7,
}
_PROTOCOL_NAMES = {code: name for name, code in PROTOCOLS.items()}
_TRANSPORT_NAMES = {code: name for name, code in TRANSPORTS.items()}
FLAG_BINARY = 1
# The data is several messages, each a 4-byte big-endian length and the message.
FLAG_BATCH = 2
_BATCH_LENGTH = struct.Struct(">I")

MiB = 1 << 20
DEFAULT_MAX_FILE_BYTES = 128 * MiB
# The writer accepts 4 KiB (small enough for tests to rotate) to 1 GiB; [capture] holds
# operators to CONFIG_FILE_BYTES, files small enough to give Spark many tasks.
MIN_FILE_BYTES = 4096
MAX_FILE_BYTES = 1024 * MiB
CONFIG_FILE_BYTES = (64 * MiB, 256 * MiB)


class CaptureError(ValueError):
    """A capture file (or bytes) that cannot be read as one."""


class NotACapture(CaptureError):
    """The bytes do not start with a capture file header, or a version this reader knows."""


class IncompleteCapture(CaptureError):
    """The bytes end before a file header or a record is complete."""


class CorruptCapture(CaptureError):
    """A record whose CRC does not match, with whole data after it: damage, not a torn tail."""

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.path = path
        self.offset = offset


# -- sans-IO encoding and decoding ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CaptureHeader:
    """A decoded file header: its JSON `info`, and `data_offset`, where the first record starts."""

    info: dict[str, Any]
    data_offset: int


@dataclass(frozen=True, slots=True)
class Record:
    """One record. `offset` is where its header starts in the file (or buffer)."""

    offset: int
    timestamp_ns: int
    connection: int
    kind: Kind
    protocol: int
    transport: int
    flags: int
    data: bytes

    @property
    def binary(self) -> bool:
        return bool(self.flags & FLAG_BINARY)

    @property
    def protocol_name(self) -> str | None:
        return _PROTOCOL_NAMES.get(self.protocol)

    @property
    def transport_name(self) -> str | None:
        return _TRANSPORT_NAMES.get(self.transport)

    @property
    def size(self) -> int:
        return HEADER_SIZE + len(self.data)

    def messages(self) -> list[bytes]:
        """The messages of an in or out record: one, or a batch's several."""
        return record_messages(self.flags, self.data)

    def info(self) -> dict[str, Any]:
        """The JSON object of an open or close record."""
        if self.kind not in (Kind.OPEN, Kind.CLOSE):
            raise TypeError(f"a {self.kind.name.lower()} record holds a message, not JSON")
        return json.loads(self.data) if self.data else {}


def encode_file_header(info: dict[str, Any]) -> bytes:
    text = json.dumps(info, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, len(text)) + text


def decode_file_header(data: bytes | memoryview | mmap.mmap) -> CaptureHeader:
    """Raises `IncompleteCapture` if `data` is a prefix of a header, `NotACapture` otherwise."""
    available = min(len(data), PREAMBLE.size)
    if bytes(data[:min(available, len(MAGIC))]) != MAGIC[:min(available, len(MAGIC))]:
        raise NotACapture(f"not a capture file: it does not start with {MAGIC!r}")
    if len(data) < PREAMBLE.size:
        raise IncompleteCapture(f"capture file header of {len(data)} bytes: the header needs 12")
    _, version, reserved, length = PREAMBLE.unpack_from(data, 0)
    if version != FORMAT_VERSION or reserved != 0:
        raise NotACapture(f"capture format version {version} (reserved {reserved}): this reader "
                          f"reads version {FORMAT_VERSION}")
    if length > _MAX_HEADER_JSON:
        raise NotACapture(f"capture file header announces {length} bytes of JSON: at most "
                          f"{_MAX_HEADER_JSON}")
    end = PREAMBLE.size + length
    if len(data) < end:
        raise IncompleteCapture(f"capture file header needs {end} bytes, the file has {len(data)}")
    try:
        info = json.loads(bytes(data[PREAMBLE.size:end]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise NotACapture(f"capture file header is not UTF-8 JSON: {error}") from None
    if not isinstance(info, dict) or info.get("format") != "wirecapture":
        raise NotACapture('capture file header is not a {"format": "wirecapture", ...} object')
    return CaptureHeader(info, end)


def encode_record(
    kind: Kind | int, connection: int, data: bytes, *, timestamp_ns: int, protocol: int = 0,
    transport: int = 0, flags: int = 0,
) -> bytes:
    try:
        covered = _CRC_COVERED.pack(timestamp_ns, connection, kind, protocol, transport, flags, 0)
        head = _LENGTH_CRC.pack(len(data), zlib.crc32(data, zlib.crc32(covered)))
    except struct.error as error:
        raise ValueError(f"capture record field out of range: {error}") from None
    return head + covered + data


def decode_record(data: bytes | memoryview, offset: int = 0) -> tuple[Record, int]:
    """The record at `offset` and the offset after it. Raises `IncompleteCapture` if `data` ends
    before the record does and `CorruptCapture` if its CRC does not match."""
    view = memoryview(data)
    if len(view) - offset < HEADER_SIZE:
        raise IncompleteCapture(f"capture record at offset {offset}: fewer than 32 header bytes")
    length, crc, ts, conn, kind, proto, trans, flags, _ = RECORD_HEADER.unpack_from(view, offset)
    end = offset + HEADER_SIZE + length
    if len(view) < end:
        raise IncompleteCapture(f"capture record at offset {offset}: {length} data bytes "
                                f"announced, {len(view) - offset - HEADER_SIZE} present")
    if zlib.crc32(view[offset + 8:end]) != crc:
        raise CorruptCapture(f"capture record at offset {offset}: CRC mismatch", offset=offset)
    return _record(offset, ts, conn, kind, proto, trans, flags, bytes(view[offset + 32:end])), end


def encode_batch(messages: list[bytes]) -> bytes:
    """The data of a `FLAG_BATCH` record holding `messages`."""
    pack = _BATCH_LENGTH.pack
    return b"".join([part for message in messages for part in (pack(len(message)), message)])


def record_messages(flags: int, data: bytes | memoryview) -> list[bytes]:
    """The messages in an in or out record's data: `data` itself, or with `FLAG_BATCH` the
    length-prefixed messages in it. A batch that does not split exactly raises
    `CorruptCapture`."""
    if not flags & FLAG_BATCH:
        return [bytes(data)]
    messages = []
    offset, end = 0, len(data)
    unpack = _BATCH_LENGTH.unpack_from
    while offset < end:
        if end - offset < 4:
            raise CorruptCapture(f"batch record: {end - offset} bytes left where a 4-byte "
                                 "length belongs")
        (length,) = unpack(data, offset)
        offset += 4
        if offset + length > end:
            raise CorruptCapture(f"batch record: a message of {length} bytes announced, "
                                 f"{end - offset} left")
        messages.append(bytes(data[offset:offset + length]))
        offset += length
    return messages


def _record(offset: int, ts: int, conn: int, kind: int, proto: int, trans: int, flags: int,
            data: bytes) -> Record:
    try:
        return Record(offset, ts, conn, Kind(kind), proto, trans, flags, data)
    except ValueError:
        raise CorruptCapture(f"capture record at offset {offset}: unknown kind {kind}",
                             offset=offset) from None


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


def _scan(buf: Any, start: int, end: int, limit: int | None, path: str) -> Scan:
    """Chain the record lengths from `start`, checking every CRC."""
    starts: list[int] = []
    offset = start
    unpack = _LENGTH_CRC.unpack_from
    crc32 = zlib.crc32
    with memoryview(buf) as view:
        while True:
            if limit is not None and len(starts) >= limit:
                return Scan(starts, offset, LIMIT)
            if offset == end:
                return Scan(starts, offset, END)
            if end - offset < HEADER_SIZE:
                return Scan(starts, offset, PARTIAL)
            length, crc = unpack(view, offset)
            stop = offset + HEADER_SIZE + length
            if stop > end:
                return Scan(starts, offset, PARTIAL)
            if crc32(view[offset + 8:stop]) != crc:
                # A torn tail ends the bytes, or is followed only by zeros (a file extended but
                # not written, after a power loss). Anything else after it is corruption.
                if stop == end or not view[stop:end].tobytes().strip(b"\0"):
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


def read_header(path: str | os.PathLike[str]) -> CaptureHeader:
    """The file header; `IncompleteCapture` if the file is shorter than it."""
    with _mapped(path) as buf:
        try:
            return decode_file_header(buf)
        except CaptureError as error:
            raise type(error)(f"{os.fspath(path)}: {error}") from None


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
            yield _record(offset, ts, conn, kind, proto, trans, flags, data)


def read_batch(path: str | os.PathLike[str], start_offset: int | None = None,
               max_records: int | None = None, available: int | None = None) -> Batch:
    """Up to `max_records` whole records from `start_offset`, as columns: one scan chains the
    lengths and checks CRCs, then one `struct.iter_unpack` decodes every header."""
    name = os.fspath(path)
    with _mapped(path) as buf:
        bounds = _open_scan(buf, name, start_offset, available)
        scan = (Scan([], 0, PARTIAL) if bounds is None
                else _scan(buf, bounds[0], bounds[1], max_records, name))
        headers = b"".join([buf[offset:offset + HEADER_SIZE] for offset in scan.starts])
        rows = list(RECORD_HEADER.iter_unpack(headers))
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(RECORD_FIELDS)
        lengths = columns[0]
        data = [buf[offset + HEADER_SIZE:offset + HEADER_SIZE + length]
                for offset, length in zip(scan.starts, lengths, strict=True)]
    return Batch(
        offset=scan.starts, timestamp_ns=list(columns[2]), connection=list(columns[3]),
        kind=list(columns[4]), protocol=list(columns[5]), transport=list(columns[6]),
        flags=list(columns[7]), data=data, headers=headers, end=scan.end, stop=scan.stop,
    )


def capture_files(directory: str | os.PathLike[str], prefix: str = "wirecapture") -> list[Path]:
    """The capture files a writer with `prefix` wrote in `directory`, oldest first."""
    pattern = _file_pattern(prefix)
    return sorted(path for path in Path(directory).iterdir() if pattern.match(path.name))


def _file_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-\d{{8}}T\d{{6}}-(\d{{6,}})\.wpcap$")


# -- writing --------------------------------------------------------------------------------------


@dataclass(slots=True)
class CaptureCounters:
    """`records`, `bytes` (headers included) and `files` written; batches and records dropped
    because the writer thread's queue was full or a write failed."""

    records: int = 0
    bytes: int = 0
    files: int = 0
    dropped_batches: int = 0
    dropped_records: int = 0


@dataclass(slots=True)
class _Chunk:
    """Bytes for one file; `new` if they start it (file header and repeated opens first)."""

    path: Path
    new: bool
    data: bytearray = field(default_factory=bytearray)
    records: int = 0


class _CaptureLog:
    """Sans-IO core of both writers: encodes records, decides rotation, collects chunks."""

    def __init__(self, directory: Path, max_file_bytes: int, prefix: str,
                 clock: Callable[[], int]) -> None:
        self.directory = directory
        self.max_file_bytes = max_file_bytes
        self.prefix = prefix
        self.clock = clock
        self.host = socket.gethostname()
        existing = [int(match[1]) for path in directory.iterdir()
                    if (match := _file_pattern(prefix).match(path.name))]
        self.sequence = max(existing, default=0)
        # connection id -> (its encoded open record, protocol code, transport code)
        self.connections: dict[int, tuple[bytes, int, int]] = {}
        self.pending: list[_Chunk] = []
        self.pending_bytes = 0
        self.path: Path | None = None
        self.file_bytes = 0
        self.file_has_records = False
        self.rotate = True
        self.dropped_batches = 0
        self.dropped_records = 0

    def open_connection(self, conn_id: int, peer: str, protocol: str, transport: str,
                        timestamp_ns: int | None, extra: dict[str, Any]) -> None:
        info = {"peer": peer, "protocol": protocol, "transport": transport, **extra}
        proto, trans = PROTOCOLS.get(protocol, 0), TRANSPORTS.get(transport, 0)
        record = encode_record(
            Kind.OPEN, conn_id, _json(info), protocol=proto, transport=trans,
            timestamp_ns=self.clock() if timestamp_ns is None else timestamp_ns)
        self._append(record)
        self.connections[conn_id] = (record, proto, trans)

    def message(self, conn_id: int, direction: str | Kind, data: bytes | str, binary: bool,
                timestamp_ns: int | None, batch: bool = False) -> None:
        kind = _DIRECTIONS.get(direction)
        if kind is None:
            raise ValueError(f"capture direction {direction!r}: use 'in' or 'out'")
        if isinstance(data, str):
            data = data.encode("utf-8")
        _, proto, trans = self.connections.get(conn_id, _UNKNOWN_CONNECTION)
        covered = _CRC_COVERED.pack(
            self.clock() if timestamp_ns is None else timestamp_ns, conn_id, kind, proto, trans,
            (FLAG_BINARY if binary else 0) | (FLAG_BATCH if batch else 0), 0)
        self._append(_LENGTH_CRC.pack(len(data), zlib.crc32(data, zlib.crc32(covered)))
                     + covered + data)

    def batches(self, batches: list[tuple[int, int, bytes, bool, int]]) -> None:
        """Batch records: (conn_id, kind, data, binary, timestamp_ns) each, data made by
        `encode_batch` or with the length32 framing."""
        if not batches:
            return
        connections = self.connections
        pack_covered = _CRC_COVERED.pack
        pack_head = _LENGTH_CRC.pack
        crc32 = zlib.crc32
        total = HEADER_SIZE * len(batches) + sum(len(batch[2]) for batch in batches)
        # Most calls fit in the file as it is: one buffer, counted once. Else record by record.
        whole = not self.rotate and self.file_bytes + total <= self.max_file_bytes
        if whole:
            out = self._reserve(total)
            self.pending[-1].records += len(batches) - 1
        for conn_id, kind, data, binary, timestamp_ns in batches:
            _, proto, trans = connections.get(conn_id, _UNKNOWN_CONNECTION)
            covered = pack_covered(timestamp_ns, conn_id, kind, proto, trans,
                                   FLAG_BATCH | FLAG_BINARY if binary else FLAG_BATCH, 0)
            if not whole:
                out = self._reserve(HEADER_SIZE + len(data))
            # Straight into the buffer: a batch can be large, and this copies it once.
            out += pack_head(len(data), crc32(data, crc32(covered)))
            out += covered
            out += data

    def close_connection(self, conn_id: int, reason: str | None,
                         timestamp_ns: int | None) -> None:
        _, proto, trans = self.connections.get(conn_id, (b"", 0, 0))
        self._append(encode_record(
            Kind.CLOSE, conn_id, _json({} if reason is None else {"reason": reason}),
            protocol=proto, transport=trans,
            timestamp_ns=self.clock() if timestamp_ns is None else timestamp_ns))
        self.connections.pop(conn_id, None)

    def _append(self, record: bytes) -> None:
        self._reserve(len(record)).extend(record)

    def _reserve(self, size: int) -> bytearray:
        """Count a record of `size` bytes, rotating first if it is due; returns the buffer the
        caller appends the record's bytes to."""
        if self.rotate or (
            self.file_has_records and self.file_bytes + size > self.max_file_bytes
        ):
            self._start_file()
        chunk = self.pending[-1] if self.pending else None
        if chunk is None or chunk.path is not self.path:
            chunk = _Chunk(self.path, False)  # type: ignore[arg-type]
            self.pending.append(chunk)
        chunk.records += 1
        self.pending_bytes += size
        self.file_bytes += size
        self.file_has_records = True
        return chunk.data

    def _start_file(self) -> None:
        now = self.clock()
        self.sequence += 1
        stamp = datetime.fromtimestamp(now // 1_000_000_000, UTC).strftime("%Y%m%dT%H%M%S")
        self.path = self.directory / f"{self.prefix}-{stamp}-{self.sequence:06d}.wpcap"
        chunk = _Chunk(self.path, True, bytearray(encode_file_header(self._info(now))))
        for record, _, _ in self.connections.values():
            chunk.data += record
            chunk.records += 1
        self.pending.append(chunk)
        self.pending_bytes += len(chunk.data)
        self.file_bytes = len(chunk.data)
        self.file_has_records = False
        self.rotate = False

    def _info(self, now: int) -> dict[str, Any]:
        return {
            "format": "wirecapture",
            "version": FORMAT_VERSION,
            "created_ns": now,
            "host": self.host,
            "pid": os.getpid(),
            "writer": f"wireproto {__version__}",
            "sequence": self.sequence,
            "max_file_bytes": self.max_file_bytes,
            "record_header": RECORD_HEADER.format,
            "fields": list(RECORD_FIELDS),
            "crc": "zlib.crc32 of record bytes 8 to 32 and the data",
            "kinds": {kind.name.lower(): kind.value for kind in Kind},
            "protocols": PROTOCOLS,
            "transports": TRANSPORTS,
            "flags": {"binary": FLAG_BINARY, "batch": FLAG_BATCH},
            "dropped_batches": self.dropped_batches,
            "dropped_records": self.dropped_records,
        }

    def take(self) -> list[_Chunk]:
        chunks, self.pending, self.pending_bytes = self.pending, [], 0
        return chunks

    def lost(self, records: int) -> None:
        """A batch was dropped or failed: start a new file, so every file stays whole."""
        self.dropped_batches += 1
        self.dropped_records += records
        self.rotate = True


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


_DIRECTIONS: dict[Any, int] = {"in": Kind.IN.value, "out": Kind.OUT.value,
                               Kind.IN: Kind.IN.value, Kind.OUT: Kind.OUT.value}
_UNKNOWN_CONNECTION = (b"", 0, 0)


# Capture files hold payloads: readable by their owner only, unless configured otherwise.
DEFAULT_FILE_MODE = 0o600

class _FileSink:
    """Writes chunks: one write per chunk, files created exclusively and only appended to."""

    def __init__(self, fsync: bool, mode: int) -> None:
        self.fsync = fsync
        self.mode = mode
        self.fd: int | None = None
        self.path: Path | None = None

    def write(self, chunk: _Chunk) -> int:
        """Write `chunk`; returns 1 if it started a file. A chunk for a file that is not open (its
        start was dropped or failed) raises, so nothing lands after a torn or missing part."""
        started = 0
        if chunk.new:
            self.close()
            self.fd = os.open(chunk.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                              | os.O_CLOEXEC, self.mode)
            self.path = chunk.path
            started = 1
        elif self.path != chunk.path or self.fd is None:
            raise OSError(f"capture file {chunk.path} is not open for writing")
        try:
            view = memoryview(chunk.data)
            while view:
                view = view[os.write(self.fd, view):]
            if self.fsync:
                os.fsync(self.fd)
        except BaseException:
            self.close()
            raise
        return started

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.fd = None
        self.path = None


class _WriterBase:
    def __init__(self, directory: str | os.PathLike[str], *, max_file_bytes: int,
                 prefix: str, clock: Callable[[], int], fsync: bool, file_mode: int) -> None:
        if not MIN_FILE_BYTES <= max_file_bytes <= MAX_FILE_BYTES:
            raise ValueError(f"max_file_bytes {max_file_bytes}: use {MIN_FILE_BYTES} to "
                             f"{MAX_FILE_BYTES} (configuration allows {CONFIG_FILE_BYTES[0]} to "
                             f"{CONFIG_FILE_BYTES[1]})")
        self.directory = Path(directory)
        # Captured payloads are the owner's to read: the directory it makes, and every file.
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._log = _CaptureLog(self.directory, max_file_bytes, prefix, clock)
        self._sink = _FileSink(fsync, file_mode)
        self._counters = CaptureCounters()
        self._closed = False

    def _write(self, chunks: list[_Chunk]) -> None:
        """Write chunks in order; on a failure, count the rest as dropped and re-raise."""
        for index, chunk in enumerate(chunks):
            try:
                self._counters.files += self._sink.write(chunk)
            except Exception:
                lost = sum(chunk.records for chunk in chunks[index:])
                self._lost(lost)
                raise
            self._counters.records += chunk.records
            self._counters.bytes += len(chunk.data)

    def _lost(self, records: int) -> None:
        self._counters.dropped_batches += 1
        self._counters.dropped_records += records
        self._log.lost(records)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the capture writer is closed")


class CaptureWriter(_WriterBase):
    """Records go to an in-memory buffer; `flush()` writes it (one write per file) and, with
    `fsync`, syncs. The buffer is also flushed when it reaches `buffer_bytes`. The caller does
    the I/O: in a reactor, use `ThreadedCaptureWriter`. Not thread-safe.

    Files are ``{prefix}-{UTC YYYYmmddTHHMMSS}-{sequence:06d}.wpcap`` in `directory`, the
    sequence continuing from the files already there. A file is rotated when the next record
    would take it past `max_file_bytes`; a file holding only its header and repeated opens takes
    one record whatever its size. `clock` gives nanoseconds since the epoch."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, prefix: str = "wirecapture",
                 clock: Callable[[], int] = time.time_ns, fsync: bool = False,
                 buffer_bytes: int = MiB, file_mode: int = DEFAULT_FILE_MODE) -> None:
        super().__init__(directory, max_file_bytes=max_file_bytes, prefix=prefix, clock=clock,
                         fsync=fsync, file_mode=file_mode)
        self._buffer_bytes = buffer_bytes

    def open_connection(self, conn_id: int, peer: str, protocol: str, transport: str, *,
                        timestamp_ns: int | None = None, **extra: Any) -> None:
        self._check_open()
        self._log.open_connection(conn_id, peer, protocol, transport, timestamp_ns, extra)
        self._maybe_flush()

    def message(self, conn_id: int, direction: str | Kind, data: bytes | str, binary: bool,
                timestamp_ns: int | None = None, *, batch: bool = False) -> None:
        """Record one message in or out (`direction` "in" or "out"), or with `batch` several:
        `data` is then what `encode_batch` makes of them."""
        self._check_open()
        self._log.message(conn_id, direction, data, binary, timestamp_ns, batch)
        self._maybe_flush()

    def batches(self, batches: list[tuple[int, int, bytes, bool, int]]) -> None:
        """Several batch records at once, each (conn_id, kind, data, binary, timestamp_ns):
        `kind` is `Kind.IN` or `Kind.OUT`, `data` what `encode_batch` makes."""
        self._check_open()
        self._log.batches(batches)
        self._maybe_flush()

    def close_connection(self, conn_id: int, reason: str | None = None, *,
                         timestamp_ns: int | None = None) -> None:
        self._check_open()
        self._log.close_connection(conn_id, reason, timestamp_ns)
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self._log.pending_bytes >= self._buffer_bytes:
            self.flush()

    def flush(self) -> None:
        self._write(self._log.take())

    @property
    def counters(self) -> CaptureCounters:
        return CaptureCounters(**{name: getattr(self._counters, name)
                                  for name in CaptureCounters.__slots__})

    @property
    def path(self) -> Path | None:
        """The file records go to now (it may not be written yet)."""
        return self._log.path

    def close(self) -> None:
        """Flush and close the file. Connections still open get no close record."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._sink.close()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ThreadedCaptureWriter(_WriterBase):
    """The same records and files as `CaptureWriter`, written by one background thread, so the
    caller (the reactor) never waits for I/O. Records are encoded in the caller and batched; a
    batch is queued when it reaches `flush_bytes`, and the thread queues what is buffered when
    it has been idle for `flush_interval` seconds. The queue holds at most `queue_bytes` (a batch
    is always taken into an empty queue): when a batch does not fit it is dropped whole and
    counted, and the next record starts a new file, so every file still stands alone.

    `close()` queues what is left and returns after the thread's last write. `error` holds the
    last write error; its batch is counted as dropped."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, prefix: str = "wirecapture",
                 clock: Callable[[], int] = time.time_ns, fsync: bool = False,
                 flush_interval: float = 1.0, flush_bytes: int = MiB,
                 queue_bytes: int = 64 * MiB, file_mode: int = DEFAULT_FILE_MODE,
                 _before_write: Callable[[], None] | None = None) -> None:
        super().__init__(directory, max_file_bytes=max_file_bytes, prefix=prefix, clock=clock,
                         fsync=fsync, file_mode=file_mode)
        self._flush_interval = flush_interval
        self._flush_bytes = flush_bytes
        self._queue_bytes = queue_bytes
        self._before_write = _before_write  # tests only: runs in the thread before each write
        self._cond = threading.Condition()
        self._queue: deque[list[_Chunk]] = deque()
        self._queued = 0  # bytes queued or being written
        self._closing = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="wireproto-capture", daemon=True)
        self._thread.start()

    def open_connection(self, conn_id: int, peer: str, protocol: str, transport: str, *,
                        timestamp_ns: int | None = None, **extra: Any) -> None:
        with self._cond:
            self._check_open()
            self._log.open_connection(conn_id, peer, protocol, transport, timestamp_ns, extra)
            self._maybe_queue()

    def message(self, conn_id: int, direction: str | Kind, data: bytes | str, binary: bool,
                timestamp_ns: int | None = None, *, batch: bool = False) -> None:
        """As `CaptureWriter.message`."""
        with self._cond:
            self._check_open()
            self._log.message(conn_id, direction, data, binary, timestamp_ns, batch)
            self._maybe_queue()

    def batches(self, batches: list[tuple[int, int, bytes, bool, int]]) -> None:
        """As `CaptureWriter.batches`."""
        with self._cond:
            self._check_open()
            self._log.batches(batches)
            self._maybe_queue()

    def close_connection(self, conn_id: int, reason: str | None = None, *,
                         timestamp_ns: int | None = None) -> None:
        with self._cond:
            self._check_open()
            self._log.close_connection(conn_id, reason, timestamp_ns)
            self._maybe_queue()

    def _maybe_queue(self) -> None:
        if self._log.pending_bytes >= self._flush_bytes:
            self._queue_pending(force=False)

    def _queue_pending(self, *, force: bool) -> None:
        """Move the buffer to the queue, or drop it if the queue is full. Called with the lock
        held, so the queue's order is the order records were made in."""
        chunks = self._log.take()
        if not chunks:
            return
        size = sum(len(chunk.data) for chunk in chunks)
        if not force and self._queued and self._queued + size > self._queue_bytes:
            self._lost(sum(chunk.records for chunk in chunks))
            return
        self._queue.append(chunks)
        self._queued += size
        self._cond.notify_all()

    def flush(self) -> None:
        """Queue what is buffered now, even past `queue_bytes`, without waiting for the write."""
        with self._cond:
            self._queue_pending(force=True)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._closing:
                    self._cond.wait(self._flush_interval)
                if not self._queue:
                    self._queue_pending(force=True)
                if not self._queue:
                    if self._closing:
                        break
                    continue
                chunks = self._queue.popleft()
            try:
                if self._before_write is not None:
                    self._before_write()
                self._write(chunks)
            except Exception as error:  # noqa: BLE001 - counted as dropped, kept in .error
                self.error = error
            finally:
                with self._cond:
                    self._queued -= sum(len(chunk.data) for chunk in chunks)
                    self._cond.notify_all()
        self._sink.close()

    def _lost(self, records: int) -> None:
        with self._cond:  # reentrant from the caller's side: Condition wraps an RLock
            super()._lost(records)

    @property
    def counters(self) -> CaptureCounters:
        with self._cond:
            return CaptureCounters(**{name: getattr(self._counters, name)
                                      for name in CaptureCounters.__slots__})

    def close(self) -> None:
        """Queue what is buffered, wait for the thread to write everything and stop."""
        with self._cond:
            if not self._closed:
                self._closed = True
                self._closing = True
                self._queue_pending(force=True)
                self._cond.notify_all()
        self._thread.join()

    def __enter__(self) -> ThreadedCaptureWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
