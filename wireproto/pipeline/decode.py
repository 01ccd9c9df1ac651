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

Decoding never raises: a malformed message gives a row with `decode_error` set.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from wireproto import capture
from wireproto.codecs import nydus, subble, ubre, websmq
from wireproto.codecs import phyllo as phyllo_codec

__all__ = ["Decoded", "decode_record", "decode_message", "error_row", "KIND_NAMES"]

KIND_NAMES = {int(kind): kind.name.lower() for kind in capture.Kind}
_PROTOCOL_NAMES = {code: name for name, code in capture.PROTOCOLS.items()}


class Decoded(NamedTuple):
    message_type: str | None
    topic: str | None
    request_id: str | None
    body_size: int | None
    decode_error: str | None


_OPEN = Decoded("open", None, None, 0, None)
_CLOSE = Decoded("close", None, None, 0, None)

_WEBSMQ_TYPES = {
    websmq.Publish: "publish", websmq.Subscribe: "subscribe",
    websmq.Unsubscribe: "unsubscribe", websmq.LastWill: "last_will",
}
_UBRE_TYPES = {
    ubre.Subscribe: "subscribe", ubre.Publish: "publish", ubre.Unsubscribe: "unsubscribe",
    ubre.Request: "request", ubre.Success: "success", ubre.Fail: "fail",
}
_NYDUS_TYPES = {
    nydus.Welcome: "welcome", nydus.Invoke: "invoke", nydus.Result: "result",
    nydus.Error: "error", nydus.Publish: "publish",
}
_SUBBLE_TYPES = {
    subble.HandshakeRequest: "handshake_request", subble.HandshakeResponse: "handshake_response",
    subble.ProduceEvent: "produce_event", subble.Event: "event", subble.EventError: "event_error",
}


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
    decoder = _DECODERS.get(protocol)
    if decoder is None:
        return error_row(f"unknown protocol code {protocol}")
    try:
        return decoder(bytes(data), binary, kind == capture.Kind.IN)
    except Exception as error:  # a malformed message is a row, never a failed task
        return error_row(f"{type(error).__name__}: {error}")


def error_row(message: str) -> Decoded:
    return Decoded(None, None, None, None, message)


_WEBSMQ_TYPE_NAMES = ("publish", "subscribe", "unsubscribe", "last_will")
# Topic bytes the codec has accepted, and the topic it made of them; cleared when full.
_known_topics: dict[bytes, str] = {}
_KNOWN_TOPICS_MAX = 65536


def _websmq(data: bytes, binary: bool, incoming: bool) -> Decoded:
    # Fast path: a frame whose topic the codec has accepted before needs only its header read.
    if len(data) >= 2:
        header = data[0] << 8 | data[1]
        end = 2 + (header & websmq.MAX_TOPIC_LENGTH)
        if 2 < end <= len(data):
            topic = _known_topics.get(data[2:end])
            if topic is not None:
                return Decoded(_WEBSMQ_TYPE_NAMES[header >> 14], topic, None, len(data) - end,
                               None)
    message = websmq.decode(data)
    if len(_known_topics) >= _KNOWN_TOPICS_MAX:
        _known_topics.clear()
    _known_topics[data[2:len(data) - len(message.payload)]] = message.topic
    return Decoded(_WEBSMQ_TYPES[type(message)], message.topic, None, len(message.payload), None)


# json.dumps(body, separators=(",", ":"), ensure_ascii=False), without a new encoder per call.
_compact_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _ubre(data: bytes, binary: bool, incoming: bool) -> Decoded:
    # A text frame (or a line) can only hold JSON; a binary frame holds either format.
    message = ubre.decode(data) if binary else ubre.decode_json(data)
    kind = _UBRE_TYPES[type(message)]
    body = message.body
    if body is ubre.NO_BODY:
        size = 0
    elif isinstance(body, (bytes, bytearray, memoryview)):
        size = len(body)
    else:
        text = _compact_json(body)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if isinstance(message, (ubre.Subscribe, ubre.Publish, ubre.Unsubscribe)):
        return Decoded(kind, message.topic, None, size, None)
    topic = message.name if isinstance(message, ubre.Request) else None
    return Decoded(kind, topic, str(message.id), size, None)


def _nydus(data: bytes, binary: bool, incoming: bool) -> Decoded:
    message = nydus.decode(data)
    # Ids have no '|' and paths are URI-encoded, so the first '|' starts the data section.
    size = len(data) - data.index(b"|") - 1 if message.data is not nydus.NO_DATA else 0
    if isinstance(message, nydus.Welcome):
        return Decoded("welcome", None, None, size, None)
    topic = getattr(message, "path", None)
    request_id = getattr(message, "id", None)
    return Decoded(_NYDUS_TYPES[type(message)], topic, request_id, size, None)


def _subble(data: bytes, binary: bool, incoming: bool) -> Decoded:
    # In records come from the client, out records from the broker (the host).
    sender = subble.Sender.CLIENT if incoming else subble.Sender.SERVER
    message = subble.decode(data, sender=sender)
    topic = getattr(message, "event_type", None)
    size = len(getattr(message, "payload", b""))
    return Decoded(_SUBBLE_TYPES[type(message)], topic, None, size, None)


def _phyllo(data: bytes, binary: bool, incoming: bool) -> Decoded:
    # Best effort: one minimal-stack chunk (a datagram holding a pub-sub message).
    received: Any = phyllo_codec.decode(data)
    payload_type = received.payload_type
    try:
        name = phyllo_codec.TypeCode(payload_type).name.lower()
    except ValueError:
        name = f"0x{payload_type:02x}"
    if isinstance(received, phyllo_codec.PubSubMessage):
        topic = received.topic.decode("utf-8", "replace")
        return Decoded(name, topic, None, len(received.payload), None)
    return Decoded(name, None, None, len(received.payload), None)


_DECODERS = {
    capture.PROTOCOLS["websmq"]: _websmq,
    capture.PROTOCOLS["ubre"]: _ubre,
    capture.PROTOCOLS["nydus"]: _nydus,
    capture.PROTOCOLS["subble"]: _subble,
    capture.PROTOCOLS["phyllo"]: _phyllo,
}

