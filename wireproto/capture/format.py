"""The capture file format, sans-IO: the file header, records and batches, encoded and decoded.

docs/pipeline.md, "Capture files", describes the layout byte by byte."""


from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from wireproto.codecs.serialization import json_parse, json_utf8
from wireproto.protocols import PROTOCOLS as PROTOCOL_REGISTRY

__all__ = [
    "MAGIC",
    "FORMAT_VERSION",
    "PREAMBLE",
    "RECORD_HEADER",
    "RECORD_FIELDS",
    "HEADER_SIZE",
    "Kind",
    "PROTOCOLS",
    "TRANSPORTS",
    "FLAG_BINARY",
    "FLAG_BATCH",
    "MiB",
    "DEFAULT_MAX_FILE_BYTES",
    "MIN_FILE_BYTES",
    "MAX_FILE_BYTES",
    "CONFIG_FILE_BYTES",
    "CaptureError",
    "NotACapture",
    "IncompleteCapture",
    "CorruptCapture",
    "CaptureHeader",
    "Record",
    "encode_file_header",
    "decode_file_header",
    "encode_record",
    "decode_record",
    "encode_batch",
    "record_messages",
    "count_messages",
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
LENGTH_CRC = struct.Struct("<II")
CRC_COVERED = struct.Struct("<qQBBBBI")  # the 24 header bytes after the crc
HEADER_SIZE = RECORD_HEADER.size  # 32
MAX_HEADER_JSON = 1 << 20


class Kind(IntEnum):
    OPEN = 0
    IN = 1
    OUT = 2
    CLOSE = 3


class _ProtocolCodes(Mapping[str, int]):
    """Protocol name -> the code records carry, read live from the protocol registry (each
    `ProtocolDescriptor.capture_code`), so a protocol registered later is captured too."""

    def __getitem__(self, name: str) -> int:
        descriptor = PROTOCOL_REGISTRY.get(name)
        if descriptor is None:
            raise KeyError(name)
        return descriptor.capture_code

    def __iter__(self) -> Iterator[str]:
        return iter(PROTOCOL_REGISTRY)

    def __len__(self) -> int:
        return len(PROTOCOL_REGISTRY)


class _ProtocolNames(Mapping[int, str]):
    """The code records carry -> protocol name, read live from the protocol registry."""

    def __getitem__(self, code: int) -> str:
        for name, descriptor in PROTOCOL_REGISTRY.items():
            if descriptor.capture_code == code:
                return name
        raise KeyError(code)

    def __iter__(self) -> Iterator[int]:
        return iter([descriptor.capture_code for descriptor in PROTOCOL_REGISTRY.values()])

    def __len__(self) -> int:
        return len(PROTOCOL_REGISTRY)


PROTOCOLS: Mapping[str, int] = _ProtocolCodes()
# "stream": Phyllo's chunked serial stream; "chunks": Phyllo message chunks (one per message);
# "nats": the calls between a cluster's broker processes.
TRANSPORTS = {
    "ws": 1, "engineio": 2, "length32": 3, "lines": 4, "cobs": 5, "stream": 6, "chunks": 7,
    "nats": 8,
}
PROTOCOL_NAMES: Mapping[int, str] = _ProtocolNames()
TRANSPORT_NAMES = {code: name for name, code in TRANSPORTS.items()}
FLAG_BINARY = 1
# The data is several messages, each a 4-byte big-endian length and the message.
FLAG_BATCH = 2
BATCH_LENGTH = struct.Struct(">I")

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
        return PROTOCOL_NAMES.get(self.protocol)

    @property
    def transport_name(self) -> str | None:
        return TRANSPORT_NAMES.get(self.transport)

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
        return json_parse(self.data) if self.data else {}


def encode_file_header(info: dict[str, Any]) -> bytes:
    text = json_utf8(info, allow_nan=True)
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
    if length > MAX_HEADER_JSON:
        raise NotACapture(f"capture file header announces {length} bytes of JSON: at most "
                          f"{MAX_HEADER_JSON}")
    end = PREAMBLE.size + length
    if len(data) < end:
        raise IncompleteCapture(f"capture file header needs {end} bytes, the file has {len(data)}")
    try:
        info = json_parse(bytes(data[PREAMBLE.size:end]))
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
        covered = CRC_COVERED.pack(timestamp_ns, connection, kind, protocol, transport, flags, 0)
        head = LENGTH_CRC.pack(len(data), zlib.crc32(data, zlib.crc32(covered)))
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
    data = bytes(view[offset + 32:end])
    return record_from_fields(offset, ts, conn, kind, proto, trans, flags, data), end


def encode_batch(messages: list[bytes]) -> bytes:
    """The data of a `FLAG_BATCH` record holding `messages`."""
    pack = BATCH_LENGTH.pack
    return b"".join([part for message in messages for part in (pack(len(message)), message)])


def record_messages(flags: int, data: bytes | memoryview) -> list[bytes]:
    """The messages in an in or out record's data: `data` itself, or with `FLAG_BATCH` the
    length-prefixed messages in it. A batch that does not split exactly raises
    `CorruptCapture`."""
    if not flags & FLAG_BATCH:
        return [bytes(data)]
    messages = []
    offset, end = 0, len(data)
    unpack = BATCH_LENGTH.unpack_from
    while offset < end:  # runs once per message read: kept inline
        if end - offset < 4:
            _short_length(end - offset)
        (length,) = unpack(data, offset)
        offset += 4
        if offset + length > end:
            _overrun(length, end - offset)
        messages.append(bytes(data[offset:offset + length]))
        offset += length
    return messages


def count_messages(data: bytes | memoryview) -> int:
    """How many messages a batch record's data holds, without copying them; `CorruptCapture` as
    `record_messages`."""
    count, offset, end = 0, 0, len(data)
    unpack = BATCH_LENGTH.unpack_from
    while offset < end:
        if end - offset < 4:
            _short_length(end - offset)
        (length,) = unpack(data, offset)
        offset += 4 + length
        if offset > end:
            _overrun(length, end - offset + length)
        count += 1
    return count


def _short_length(left: int) -> None:
    raise CorruptCapture(f"batch record: {left} bytes left where a 4-byte length belongs")


def _overrun(length: int, left: int) -> None:
    raise CorruptCapture(f"batch record: a message of {length} bytes announced, {left} left")


def record_from_fields(offset: int, ts: int, conn: int, kind: int, proto: int, trans: int,
                       flags: int, data: bytes) -> Record:
    try:
        return Record(offset, ts, conn, Kind(kind), proto, trans, flags, data)
    except ValueError:
        raise CorruptCapture(f"capture record at offset {offset}: unknown kind {kind}",
                             offset=offset) from None
