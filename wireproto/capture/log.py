"""The sans-IO core of the capture writers (`CaptureLog`): records encoded, batched per connection
and direction, and cut into chunks for rotated files, with the open records each new file
repeats."""

from __future__ import annotations

import os
import socket
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anycrc

from wireproto import __version__
from wireproto.capture.format import (
    CRC_COVERED,
    FLAG_BATCH,
    FLAG_BINARY,
    FORMAT_VERSION,
    HEADER_SIZE,
    LENGTH_CRC,
    PROTOCOLS,
    RECORD_FIELDS,
    RECORD_HEADER,
    TRANSPORTS,
    Kind,
    encode_file_header,
    encode_record,
)
from wireproto.capture.reader import file_name_pattern
from wireproto.codecs.serialization import json_utf8

# zlib.crc32's CRC-32, computed about twice as fast (and without giving the GIL to the writer
# thread and taking it back at each batch): the broker's thread computes one per batch record.
_crc32 = anycrc.Model("CRC32").calc

__all__ = [
    "Chunk",
    "CaptureLog",
    "encode_json",
    "default_broker_name",
]


def default_broker_name() -> str:
    """What names a broker that was given no name: its host and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(slots=True)
class Chunk:
    """Bytes for one file; `new` if they start it (file header and repeated opens first)."""

    path: Path
    new: bool
    data: bytearray = field(default_factory=bytearray)
    records: int = 0


class CaptureLog:
    """Sans-IO core of both writers: encodes records, decides rotation, collects chunks."""

    def __init__(self, directory: Path, max_file_bytes: int, prefix: str,
                 clock: Callable[[], int], broker: str | None = None,
                 cluster: str | None = None) -> None:
        self.directory = directory
        self.max_file_bytes = max_file_bytes
        self.prefix = prefix
        self.clock = clock
        self.host = socket.gethostname()
        # Which broker wrote the files (default: host:pid), and the cluster it belongs to.
        self.broker = broker or default_broker_name()
        self.cluster = cluster
        existing = [int(match[1]) for path in directory.iterdir()
                    if (match := file_name_pattern(prefix).match(path.name))]
        self.sequence = max(existing, default=0)
        # connection id -> (its encoded open record, protocol code, transport code)
        self.connections: dict[int, tuple[bytes, int, int]] = {}
        self.pending: list[Chunk] = []
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
            Kind.OPEN, conn_id, encode_json(info), protocol=proto, transport=trans,
            timestamp_ns=self.clock() if timestamp_ns is None else timestamp_ns)
        self._append(record)
        self.connections[conn_id] = (record, proto, trans)

    def message(self, conn_id: int, direction: str | Kind, data: bytes | str, binary: bool,
                timestamp_ns: int | None, batch: bool = False) -> None:
        kind = DIRECTIONS.get(direction)
        if kind is None:
            raise ValueError(f"capture direction {direction!r}: use 'in' or 'out'")
        if isinstance(data, str):
            data = data.encode("utf-8")
        _, proto, trans = self.connections.get(conn_id, UNKNOWN_CONNECTION)
        covered = CRC_COVERED.pack(
            self.clock() if timestamp_ns is None else timestamp_ns, conn_id, kind, proto, trans,
            (FLAG_BINARY if binary else 0) | (FLAG_BATCH if batch else 0), 0)
        self._append(LENGTH_CRC.pack(len(data), zlib.crc32(data, zlib.crc32(covered)))
                     + covered + data)

    def batches(self, batches: list[tuple[int, int, bytes, bool, int]]) -> None:
        """Batch records: (conn_id, kind, data, binary, timestamp_ns) each, data made by
        `encode_batch` or with the length32 framing."""
        if not batches:
            return
        connections = self.connections
        pack_covered = CRC_COVERED.pack
        pack_head = LENGTH_CRC.pack
        crc32 = _crc32
        total = HEADER_SIZE * len(batches) + sum(len(batch[2]) for batch in batches)
        # Most calls fit in the file as it is: one buffer, counted once. Else record by record.
        whole = not self.rotate and self.file_bytes + total <= self.max_file_bytes
        if whole:
            out = self._reserve(total)
            self.pending[-1].records += len(batches) - 1
        for conn_id, kind, data, binary, timestamp_ns in batches:
            _, proto, trans = connections.get(conn_id, UNKNOWN_CONNECTION)
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
            Kind.CLOSE, conn_id, encode_json({} if reason is None else {"reason": reason}),
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
        path = self.path
        assert path is not None  # a file is started above if none was
        chunk = self.pending[-1] if self.pending else None
        if chunk is None or chunk.path is not path:
            chunk = Chunk(path, False)
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
        chunk = Chunk(self.path, True, bytearray(encode_file_header(self._info(now))))
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
            "broker": self.broker,
            "cluster": self.cluster,
            "writer": f"wireproto {__version__}",
            "sequence": self.sequence,
            "max_file_bytes": self.max_file_bytes,
            "record_header": RECORD_HEADER.format,
            "fields": list(RECORD_FIELDS),
            "crc": "zlib.crc32 of record bytes 8 to 32 and the data",
            "kinds": {kind.name.lower(): kind.value for kind in Kind},
            "protocols": dict(PROTOCOLS),
            "transports": TRANSPORTS,
            "flags": {"binary": FLAG_BINARY, "batch": FLAG_BATCH},
            "dropped_batches": self.dropped_batches,
            "dropped_records": self.dropped_records,
        }

    def take(self) -> list[Chunk]:
        chunks, self.pending, self.pending_bytes = self.pending, [], 0
        return chunks

    def lost(self, records: int) -> None:
        """A batch was dropped or failed: start a new file, so every file stays whole."""
        self.dropped_batches += 1
        self.dropped_records += records
        self.rotate = True


def encode_json(value: dict[str, Any]) -> bytes:
    return json_utf8(value, allow_nan=True)


DIRECTIONS: dict[str | Kind, int] = {"in": Kind.IN.value, "out": Kind.OUT.value,
                               Kind.IN: Kind.IN.value, Kind.OUT: Kind.OUT.value}
UNKNOWN_CONNECTION = (b"", 0, 0)
