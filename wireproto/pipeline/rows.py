"""Capture records as Arrow rows: one row per message, decoded (`wireproto.pipeline.decode`).

Needs pyarrow (the ``spark`` extra brings it) and numpy but no Spark: the `wirecapture` data
source yields these batches, and a plain Python process can make them too.

Speed: the record header columns come from `Batch.headers` through numpy and Arrow, with no
per-row Python. Each distinct message of a batch is decoded once: a broker's fan-out writes the
same bytes to every subscriber, and decoding depends only on (protocol, kind, binary flag,
bytes), so rows point into a table of distinct messages and Arrow `take` makes the columns.
A reader that asks for some columns only (`columns`) gets only those made: without a decoded
column no message is decoded, and without `data` no bytes are copied.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterable
from typing import cast

import numpy as np
import pyarrow as pa

from wireproto import capture
from wireproto.pipeline.decode import (
    KIND_NAMES,
    Decoded,
    decode_message,
    decode_on_wildcards,
    error_row,
)
from wireproto.protocols import PROTOCOLS

__all__ = ["SCHEMA", "ARROW_SCHEMA", "DECODED_COLUMNS", "decode_batch", "broker_of",
           "projected_schema", "Openings"]

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

# The columns `decode_message` makes: a reader that asks for none of them decodes nothing.
DECODED_COLUMNS = frozenset(("message_type", "topic", "request_id", "body_size", "decode_error"))


def projected_schema(names: list[str] | tuple[str, ...]) -> pa.Schema:
    """The Arrow schema of the columns `names` of `ARROW_SCHEMA`, in that order. Raises
    ValueError naming a column that is not one (or is asked for twice)."""
    unknown = [name for name in names if name not in ARROW_SCHEMA.names]
    if unknown or len(set(names)) != len(names) or not names:
        raise ValueError(f"wirecapture: columns {list(names)} are not distinct columns of "
                         f"{ARROW_SCHEMA.names}")
    return pa.schema([ARROW_SCHEMA.field(name) for name in names])


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


class Openings:
    """What the open records of one file's records, read in order, say of their connections'
    listeners: whether each took wildcard subscriptions (``"wildcards": true``; a record
    without the key, as files written before it have, says no). `earlier` gives the (connection,
    data) of the open records before the first record read, for a reader that starts in the
    middle of a file: called once, and only when a message needs it."""

    def __init__(self, earlier: Callable[[], Iterable[tuple[int, bytes]]] | None = None
                 ) -> None:
        self.raw: dict[int, bytes] = {}  # connection -> its open record's data
        self.wildcard: dict[int, bool] = {}
        self.earlier = earlier

    def learn(self, batch: capture.Batch) -> None:
        """Keep the open records of `batch`, next in the file."""
        kinds = np.frombuffer(batch.headers, _HEADER_DTYPE)["kind"]
        for index in np.flatnonzero(kinds == capture.Kind.OPEN):
            self.raw[batch.connection[index]] = batch.data[index]

    def wildcards(self, connection: int) -> bool:
        known = self.wildcard.get(connection)
        if known is not None:
            return known
        raw = self.raw.get(connection)
        if raw is None and self.earlier is not None:
            earlier, self.earlier = self.earlier, None
            for number, data in earlier():
                self.raw.setdefault(number, data)
            raw = self.raw.get(connection)
        try:
            known = json.loads(bytes(raw)).get("wildcards") is True if raw else False
        except (ValueError, AttributeError):
            known = False
        self.wildcard[connection] = known
        return known


def decode_batch(path: str, batch: capture.Batch, broker: str | None = None,
                 schema: pa.Schema = ARROW_SCHEMA, opened: Openings | None = None
                 ) -> pa.RecordBatch:
    """The rows of a `capture.Batch` read from file `path`, written by `broker` (its header's
    name, `broker_of`), as an Arrow record batch of `schema` (`ARROW_SCHEMA`, or some of its
    columns: `projected_schema`): one row per message, each decoded. `opened` knows the open
    records of the file read so far: a message a connection's listener reads differently (a
    WEBSMQ pattern subscription where wildcards are on) is decoded as it was read there;
    without it, as everywhere."""
    _follow_registry()
    if opened is not None:
        opened.learn(batch)
    decoding = not DECODED_COLUMNS.isdisjoint(schema.names)
    if not decoding and "data" not in schema.names:
        return _columns(path, broker, batch, None, _message_counts(batch), [], [], schema)
    distinct: list[Decoded] = []  # each distinct message's columns ...
    distinct_data: list[bytes] = []  # ... and bytes
    tables: dict[tuple[int, int, int], dict[bytes, int]] = {}  # by (protocol, kind, binary)
    shared: dict[tuple[int, int, int], dict[bytes, int]] = {}  # by `_decoding_key`
    codes = array("q")  # per row: its message in `distinct`
    counts = array("q")  # per record: its rows
    append_code = codes.append
    append_count = counts.append
    split = capture.record_messages
    undecoded = _UNDECODED
    failed: list[tuple[int, int, int, int]] = []  # (code, protocol, kind, binary) of errors

    def add(table: dict[bytes, int], message: bytes, protocol: int, kind: int, binary: int
            ) -> int:
        code = table[message] = len(distinct)
        decoded = decode_message(protocol, kind, message, bool(binary)) if decoding \
            else undecoded
        if decoded.decode_error is not None:
            failed.append((code, protocol, kind, binary))
        distinct.append(decoded)
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
        codes.extend(cast("list[int]", found))  # each None was filled in above
        append_count(len(messages))
    if failed and opened is not None:
        _as_listeners_read(batch, codes, counts, failed, distinct, distinct_data, opened)
    return _columns(path, broker, batch, codes, counts, distinct, distinct_data, schema)


def _as_listeners_read(batch: capture.Batch, codes: array[int], counts: array[int],
                       failed: list[tuple[int, int, int, int]], distinct: list[Decoded],
                       distinct_data: list[bytes], opened: Openings) -> None:
    """Point the rows of messages that did not decode, but read otherwise on a connection whose
    listener takes wildcard subscriptions, at that reading, where their connection's did."""
    readings: dict[int, int] = {}  # the code of a failed message -> the code of its reading
    for code, protocol, kind, binary in failed:
        reading = decode_on_wildcards(protocol, kind, distinct_data[code], bool(binary))
        if reading is not None:
            readings[code] = len(distinct)
            distinct.append(reading)
            distinct_data.append(distinct_data[code])
    if not readings:
        return
    per_row = np.frombuffer(codes, np.int64)
    record_of_row = np.repeat(np.arange(len(counts)), np.frombuffer(counts, np.int64))
    for row in np.flatnonzero(np.isin(per_row, list(readings))):
        if opened.wildcards(batch.connection[record_of_row[row]]):
            codes[row] = readings[codes[row]]


_UNDECODED = Decoded(None, None, None, None, None)


def _message_counts(batch: capture.Batch) -> array[int]:
    """Rows per record, for a reader that wants neither the bytes nor the decoded columns: a
    batch record's messages are counted, not copied. A batch record that does not split is one
    row, as it is when decoded."""
    counts = array("q", [1]) * len(batch.kind)
    count_messages = capture.count_messages
    for index, (kind, flags, raw) in enumerate(zip(batch.kind, batch.flags, batch.data,
                                                   strict=True)):
        if flags & capture.FLAG_BATCH and kind in _MESSAGE_KINDS:
            try:
                counts[index] = count_messages(raw)
            except capture.CorruptCapture:
                pass
    return counts


def broker_of(header: capture.CaptureHeader) -> str:
    """The broker that wrote a capture file: its header's ``broker``, or, in files written
    before brokers were named, its host and process id."""
    info = header.info
    return str(info.get("broker") or f"{info.get('host', '?')}:{info.get('pid', '?')}")


def _columns(path: str, broker: str | None, batch: capture.Batch, codes: array[int] | None,
             counts: array[int], distinct: list[Decoded], distinct_data: list[bytes],
             schema: pa.Schema) -> pa.RecordBatch:
    """The Arrow columns of `schema`, each made only when asked for."""
    per_record = np.frombuffer(counts, np.int64)
    count = int(per_record.sum())
    headers = np.frombuffer(batch.headers, _HEADER_DTYPE)
    record_of_row = np.repeat(np.arange(len(per_record)), per_record)
    take = None if codes is None else pa.array(np.frombuffer(codes, np.int64))

    def per_row(name: str) -> np.ndarray:
        return np.ascontiguousarray(headers[name])[record_of_row]

    def message_index() -> pa.Array:
        first_row = np.cumsum(per_record) - per_record
        index = np.arange(count, dtype=np.int64) - np.repeat(first_row, per_record)
        return pa.array(index.astype(np.int32), pa.int32())

    def decoded(position: int, kind: pa.DataType) -> pa.Array:
        return pa.array([row[position] for row in distinct], kind).take(take)

    makers = {
        "file": lambda: pa.repeat(pa.scalar(path, pa.string()), count),
        "broker": lambda: pa.repeat(pa.scalar(broker, pa.string()), count),
        "offset": lambda: pa.array(np.asarray(batch.offset, np.int64)[record_of_row],
                                   pa.int64()),
        "message_index": message_index,
        "timestamp": lambda: pa.array(per_row("timestamp_ns") // 1000, pa.int64()).view(
            ARROW_SCHEMA.field("timestamp").type),
        "connection": lambda: pa.array(per_row("connection"), pa.int64()),
        "kind": lambda: _KIND_LOOKUP.take(pa.array(per_row("kind"))),
        "protocol": lambda: _protocol_lookup.take(pa.array(per_row("protocol"))),
        "transport": lambda: _TRANSPORT_LOOKUP.take(pa.array(per_row("transport"))),
        "binary": lambda: pa.array((per_row("flags") & capture.FLAG_BINARY).astype(bool),
                                   pa.bool_()),
        "data": lambda: pa.array(distinct_data, pa.binary()).take(take),
        "message_type": lambda: decoded(0, pa.string()),
        "topic": lambda: decoded(1, pa.string()),
        "request_id": lambda: decoded(2, pa.string()),
        "body_size": lambda: decoded(3, pa.int32()),
        "decode_error": lambda: decoded(4, pa.string()),
    }
    return pa.RecordBatch.from_arrays([makers[name]() for name in schema.names], schema=schema)
