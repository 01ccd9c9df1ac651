"""Capture records as Arrow rows: one row per message, decoded (`wireproto.pipeline.decode`).

Needs pyarrow (the ``spark`` extra brings it) but no Spark: the `wirecapture` data source
yields these batches, and a plain Python process can make them too.
"""

from __future__ import annotations

import pyarrow as pa

from wireproto import capture
from wireproto.pipeline.decode import KIND_NAMES, Decoded, decode_message, error_row

__all__ = ["SCHEMA", "ARROW_SCHEMA", "decode_batch"]

_PROTOCOL_NAMES = {code: name for name, code in capture.PROTOCOLS.items()}
_TRANSPORT_NAMES = {code: name for name, code in capture.TRANSPORTS.items()}

# One row per message, named by (file, offset, message_index): `message_index` counts the
# messages of a batch record from 0 (a record of one message, an open or a close has 0).
SCHEMA = (
    "file string, offset long, message_index int, timestamp timestamp, connection long, "
    "kind string, protocol string, transport string, binary boolean, data binary, "
    "message_type string, topic string, request_id string, body_size int, decode_error string"
)
ARROW_SCHEMA = pa.schema([
    ("file", pa.string()),
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


def decode_batch(path: str, batch: capture.Batch) -> pa.RecordBatch:
    """The rows of a `capture.Batch` read from file `path`, as an Arrow record batch of
    `ARROW_SCHEMA`: one row per message, each decoded."""
    offsets: list[int] = []
    indexes: list[int] = []
    rows: list[int] = []  # the record each row comes from
    data: list[bytes] = []
    decoded: list[Decoded] = []
    message_kinds = (capture.Kind.IN, capture.Kind.OUT)
    for position, (offset, kind, protocol, flags, raw) in enumerate(zip(
            batch.offset, batch.kind, batch.protocol, batch.flags, batch.data, strict=True)):
        binary = bool(flags & capture.FLAG_BINARY)
        if kind in message_kinds and flags & capture.FLAG_BATCH:
            try:
                messages = capture.record_messages(flags, raw)
            except capture.CorruptCapture as error:
                messages = None
                fault = error_row(f"CorruptCapture: {error}")
        else:
            messages = [bytes(raw)]
        if messages is None:
            offsets.append(offset)
            indexes.append(0)
            rows.append(position)
            data.append(bytes(raw))
            decoded.append(fault)
            continue
        for index, message in enumerate(messages):
            offsets.append(offset)
            indexes.append(index)
            rows.append(position)
            data.append(message)
            decoded.append(decode_message(protocol, kind, message, binary))
    message_type, topic, request_id, body_size, decode_error = (
        zip(*decoded, strict=True) if decoded else ((),) * 5)
    count = len(offsets)
    timestamps = batch.timestamp_ns
    connections = batch.connection
    kinds = batch.kind
    protocols = batch.protocol
    transports = batch.transport
    flags = batch.flags
    columns = [
        pa.array([path] * count, pa.string()),
        pa.array(offsets, pa.int64()),
        pa.array(indexes, pa.int32()),
        pa.array([timestamps[row] // 1000 for row in rows], pa.int64()).cast(
            ARROW_SCHEMA.field("timestamp").type),
        pa.array([connections[row] for row in rows], pa.int64()),
        pa.array([KIND_NAMES.get(kinds[row]) for row in rows], pa.string()),
        pa.array([_PROTOCOL_NAMES.get(protocols[row]) for row in rows], pa.string()),
        pa.array([_TRANSPORT_NAMES.get(transports[row]) for row in rows], pa.string()),
        pa.array([bool(flags[row] & capture.FLAG_BINARY) for row in rows], pa.bool_()),
        pa.array(data, pa.binary()),
        pa.array(message_type, pa.string()),
        pa.array(topic, pa.string()),
        pa.array(request_id, pa.string()),
        pa.array(body_size, pa.int32()),
        pa.array(decode_error, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
