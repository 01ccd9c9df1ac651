"""Capture records as Arrow rows: one row per message, decoded (`wireproto.pipeline.decode`).

Needs pyarrow (the ``spark`` extra brings it) and numpy but no Spark: the `wirecapture` data
source yields these batches, and a plain Python process can make them too.

Speed: the record header columns come from `Batch.headers` through numpy and Arrow, with no
per-row Python. Each distinct message of a batch is decoded once: a broker's fan-out writes the
same bytes to every subscriber, and decoding depends only on (protocol, kind, binary flag,
bytes), so rows point into a table of distinct messages and Arrow `take` makes the columns.
"""

from __future__ import annotations

from array import array

import numpy as np
import pyarrow as pa

from wireproto import capture
from wireproto.pipeline.decode import KIND_NAMES, Decoded, decode_message, error_row
from wireproto.protocols import PROTOCOLS

__all__ = ["SCHEMA", "ARROW_SCHEMA", "decode_batch", "broker_of"]

_TRANSPORT_NAMES = {code: name for name, code in capture.TRANSPORTS.items()}

# One row per message, named by (file, offset, message_index): `message_index` counts the
# messages of a batch record from 0 (a record of one message, an open or a close has 0).
SCHEMA = (
    "file string, broker string, offset long, message_index int, timestamp timestamp, "
    "connection long, "
    "kind string, protocol string, transport string, binary boolean, data binary, "
    "message_type string, topic string, request_id string, body_size int, decode_error string"
)
ARROW_SCHEMA = pa.schema([
    ("file", pa.string()),
    ("broker", pa.string()),
    ("offset", pa.int64()),
    ("message_index", pa.int32()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("connection", pa.int64()),
    ("kind", pa.string()),
    ("protocol", pa.string()),
    ("transport", pa.string()),
    ("binary", pa.bool_()),
    ("data", pa.binary()),
    ("message_type", pa.string()),
    ("topic", pa.string()),
    ("request_id", pa.string()),
    ("body_size", pa.int32()),
    ("decode_error", pa.string()),
])

# The 32-byte record header (capture.RECORD_HEADER) as a numpy record.
_HEADER_DTYPE = np.dtype([
    ("length", "<u4"), ("crc", "<u4"), ("timestamp_ns", "<i8"), ("connection", "<u8"),
    ("kind", "u1"), ("protocol", "u1"), ("transport", "u1"), ("flags", "u1"),
    ("reserved", "<u4"),
])
assert _HEADER_DTYPE.itemsize == capture.HEADER_SIZE


def _names(names: dict[int, str]) -> pa.Array:
    """A code (0-255) to name lookup for `take`: null for codes without a name."""
    return pa.array([names.get(code) for code in range(256)], pa.string())


_KIND_LOOKUP = _names(KIND_NAMES)
_TRANSPORT_LOOKUP = _names(_TRANSPORT_NAMES)
_MESSAGE_KINDS = (capture.Kind.IN.value, capture.Kind.OUT.value)


# The registry as (name, code, what its columns read) for each protocol, and what was made of it.
_registry_seen: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
_protocol_lookup: pa.Array = _names({})
_reads_direction: frozenset[int] = frozenset()
_reads_binary: frozenset[int] = frozenset()


def _follow_registry() -> None:
    """Rebuild the protocol lookups if a protocol was registered since they were made."""
    global _registry_seen, _protocol_lookup, _reads_direction, _reads_binary
    seen = tuple((d.name, d.capture_code, d.decoding_reads) for d in PROTOCOLS.values())
    if seen == _registry_seen:
        return
    _registry_seen = seen
    _protocol_lookup = _names({code: name for name, code, _ in seen})
    _reads_direction = frozenset(code for _, code, reads in seen if "direction" in reads)
    _reads_binary = frozenset(code for _, code, reads in seen if "binary" in reads)


def _decoding_key(protocol: int, kind: int, binary: int) -> tuple[int, int, int]:
    """What a message's columns depend on besides its bytes: the binary flag or the direction,
    for the protocols whose descriptors say their columns read them (UBRE: a text frame holds
    only JSON; SubbleSocket: each side has its own messages); for others, neither."""
    if kind not in _MESSAGE_KINDS:
        return (protocol, kind, binary)
    return (protocol, kind if protocol in _reads_direction else -1,
            binary if protocol in _reads_binary else -1)


def decode_batch(path: str, batch: capture.Batch, broker: str | None = None
                 ) -> pa.RecordBatch:
    """The rows of a `capture.Batch` read from file `path`, written by `broker` (its header's
    name, `broker_of`), as an Arrow record batch of `ARROW_SCHEMA`: one row per message, each
    decoded."""
    _follow_registry()
    distinct: list[Decoded] = []  # each distinct message's columns ...
    distinct_data: list[bytes] = []  # ... and bytes
    tables: dict[tuple[int, int, int], dict[bytes, int]] = {}  # by (protocol, kind, binary)
    shared: dict[tuple[int, int, int], dict[bytes, int]] = {}  # by `_decoding_key`
    codes = array("q")  # per row: its message in `distinct`
    counts = array("q")  # per record: its rows
    append_code = codes.append
    append_count = counts.append
    split = capture.record_messages

    def add(table: dict[bytes, int], message: bytes, protocol: int, kind: int, binary: int
            ) -> int:
        code = table[message] = len(distinct)
        distinct.append(decode_message(protocol, kind, message, bool(binary)))
        distinct_data.append(message)
        return code

    for kind, protocol, flags, raw in zip(
            batch.kind, batch.protocol, batch.flags, batch.data, strict=True):
        binary = flags & capture.FLAG_BINARY
        table = tables.get((protocol, kind, binary))
        if table is None:
            table = tables[protocol, kind, binary] = shared.setdefault(
                _decoding_key(protocol, kind, binary), {})
        if not flags & capture.FLAG_BATCH or kind not in _MESSAGE_KINDS:
            code = table.get(raw)
            append_code(add(table, raw, protocol, kind, binary) if code is None else code)
            append_count(1)
            continue
        try:
            messages = split(flags, raw)
        except capture.CorruptCapture as error:
            append_code(len(distinct))
            append_count(1)
            distinct.append(error_row(f"CorruptCapture: {error}"))
            distinct_data.append(bytes(raw))
            continue
        found = list(map(table.get, messages))
        if None in found:  # messages not seen before; one may repeat within the record
            for index, code in enumerate(found):
                if code is None:
                    message = messages[index]
                    code = table.get(message)
                    found[index] = add(table, message, protocol, kind, binary) if code is None \
                        else code
        codes.extend(found)
        append_count(len(messages))
    return _columns(path, broker, batch, codes, counts, distinct, distinct_data)


def broker_of(header: capture.CaptureHeader) -> str:
    """The broker that wrote a capture file: its header's ``broker``, or, in files written
    before brokers were named, its host and process id."""
    info = header.info
    return str(info.get("broker") or f"{info.get('host', '?')}:{info.get('pid', '?')}")


def _columns(path: str, broker: str | None, batch: capture.Batch, codes: array[int],
             counts: array[int], distinct: list[Decoded], distinct_data: list[bytes]
             ) -> pa.RecordBatch:
    count = len(codes)
    headers = np.frombuffer(batch.headers, _HEADER_DTYPE)
    per_record = np.frombuffer(counts, np.int64)
    record_of_row = np.repeat(np.arange(len(per_record)), per_record)
    first_row = np.cumsum(per_record) - per_record
    message_index = np.arange(count, dtype=np.int64) - np.repeat(first_row, per_record)
    take = pa.array(np.frombuffer(codes, np.int64))
    message_type, topic, request_id, body_size, decode_error = (
        zip(*distinct, strict=True) if distinct else ((),) * 5)

    def per_row(name: str) -> np.ndarray:
        return np.ascontiguousarray(headers[name])[record_of_row]

    columns = [
        pa.repeat(pa.scalar(path, pa.string()), count),
        pa.repeat(pa.scalar(broker, pa.string()), count),
        pa.array(np.asarray(batch.offset, np.int64)[record_of_row], pa.int64()),
        pa.array(message_index.astype(np.int32), pa.int32()),
        pa.array(per_row("timestamp_ns") // 1000, pa.int64()).view(
            ARROW_SCHEMA.field("timestamp").type),
        pa.array(per_row("connection"), pa.int64()),
        _KIND_LOOKUP.take(pa.array(per_row("kind"))),
        _protocol_lookup.take(pa.array(per_row("protocol"))),
        _TRANSPORT_LOOKUP.take(pa.array(per_row("transport"))),
        pa.array((per_row("flags") & capture.FLAG_BINARY).astype(bool), pa.bool_()),
        pa.array(distinct_data, pa.binary()).take(take),
        pa.array(message_type, pa.string()).take(take),
        pa.array(topic, pa.string()).take(take),
        pa.array(request_id, pa.string()).take(take),
        pa.array(body_size, pa.int32()).take(take),
        pa.array(decode_error, pa.string()).take(take),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
