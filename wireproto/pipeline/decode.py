"""Decode a capture record's messages with wireproto's own codecs, into analysis columns.

No Spark and no JVM here: `decode_message` is plain Python, called for each distinct message
by the `wirecapture` data source (wireproto.pipeline.rows), and `decode_record` decodes every
message of one record; both are usable on their own.

The columns (docs/pipeline.md, "The wirecapture data source"):

- `message_type`: the codec's name for the message ("publish", "request", "invoke", ...);
  "open" or "close" for those records; None if the message could not be decoded.
- `topic`: the topic (WEBSMQ, UBRE pub/sub, Phyllo), the path (a UBRE request's handler name, a
  nydus INVOKE or PUBLISH path) or the event type (SubbleSocket); None if the message has none.
- `request_id`: the id that pairs a request with its answer, as a string: UBRE request, success
  and fail ids, nydus INVOKE, RESULT and ERROR ids; None otherwise.
- `body_size`: bytes of the message's body or payload (a UBRE JSON body counts as its compact
  JSON); 0 for open and close records and messages without a body; None if undecodable.
- `decode_error`: None, or why the message could not be decoded (`"TruncatedFrame: ..."`).

Decoding never raises: a malformed message gives a row with `decode_error` set. Each protocol's
messages are read by the `columns` function of its descriptor's analysis module
(`wireproto.protocols.ProtocolDescriptor`), looked up by the record's protocol code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from wireproto import capture
from wireproto.protocols import PROTOCOLS, ProtocolDescriptor, protocol_by_code

__all__ = ["Decoded", "decode_record", "decode_message", "decode_on_wildcards", "error_row",
           "KIND_NAMES"]

KIND_NAMES = {int(kind): kind.name.lower() for kind in capture.Kind}


class Decoded(NamedTuple):
    message_type: str | None
    topic: str | None
    request_id: str | None
    body_size: int | None
    decode_error: str | None


_OPEN = Decoded("open", None, None, 0, None)
_CLOSE = Decoded("close", None, None, 0, None)

Columns = Callable[[bytes, bool, bool], tuple[Any, ...]]
# Protocol code -> (its descriptor, its columns function), filled on first use.
_columns: dict[int, tuple[ProtocolDescriptor, Columns]] = {}


def columns_for(code: int) -> Columns | None:
    """The columns function of the protocol with capture code `code`, or None."""
    known = _columns.get(code)
    if known is not None and PROTOCOLS.get(known[0].name) is known[0]:
        return known[1]
    descriptor = protocol_by_code(code)
    if descriptor is None or descriptor.analysis is None:
        return None
    function = descriptor.analysis_module().columns
    _columns[code] = (descriptor, function)
    return function


def decode_record(record: capture.Record) -> list[Decoded]:
    """The columns of each message of one `capture.Record`: one for a record of one message,
    an open or a close; one per message of a batch record (one error row if it does not
    split)."""
    if record.kind not in (capture.Kind.IN, capture.Kind.OUT):
        return [decode_message(record.protocol, record.kind, record.data, record.binary)]
    try:
        messages = record.messages()
    except capture.CorruptCapture as error:
        return [error_row(f"CorruptCapture: {error}")]
    return [decode_message(record.protocol, record.kind, message, record.binary)
            for message in messages]


def decode_message(protocol: int, kind: int, data: bytes, binary: bool) -> Decoded:
    """The columns of one record, given its protocol code, kind code, data and binary flag.
    Never raises."""
    if kind == capture.Kind.OPEN:
        return _OPEN
    if kind == capture.Kind.CLOSE:
        return _CLOSE
    if kind not in (capture.Kind.IN, capture.Kind.OUT):
        return error_row(f"unknown record kind {kind}")
    columns = columns_for(protocol)
    if columns is None:
        return error_row(f"unknown protocol code {protocol}")
    try:
        message_type, topic, request_id, body_size = columns(
            bytes(data), binary, kind == capture.Kind.IN
        )
    except Exception as error:  # a malformed message is a row, never a failed task
        return error_row(f"{type(error).__name__}: {error}")
    return Decoded(message_type, topic, request_id, body_size, None)


def decode_on_wildcards(protocol: int, kind: int, data: bytes, binary: bool) -> Decoded | None:
    """The columns of a message sent on a connection whose listener takes wildcard
    subscriptions (its open record says ``"wildcards": true``), where they differ from
    `decode_message`'s: a WEBSMQ Subscribe of a pattern is a subscription there, not a
    malformed topic. None where they do not differ. Never raises."""
    if kind not in (capture.Kind.IN, capture.Kind.OUT) or columns_for(protocol) is None:
        return None
    descriptor = protocol_by_code(protocol)
    read = getattr(descriptor.analysis_module(), "wildcard_columns", None) if descriptor else None
    if read is None:
        return None
    try:
        found = read(bytes(data), binary, kind == capture.Kind.IN)
    except Exception:  # noqa: BLE001 - as decode_message: never a failed task
        return None
    if found is None:
        return None
    message_type, topic, request_id, body_size = found
    return Decoded(message_type, topic, request_id, body_size, None)


def error_row(message: str) -> Decoded:
    return Decoded(None, None, None, None, message)
