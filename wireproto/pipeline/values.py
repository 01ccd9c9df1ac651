"""The numeric readings a captured message carries, for the windowed aggregates of
`wireproto analyze`. Plain Python: no Spark, no JVM.

`numeric_values(protocol, kind, data, binary)` decodes one captured message with wireproto's
own codecs, takes the document it carries and returns its numbers as ``[(field, value), ...]``:

- a number alone is field ``"value"``; a map gives one value per numeric field, nested keys
  joined with dots (``{"env": {"temp": 21.5}}`` gives ``("env.temp", 21.5)``);
- booleans are not numbers, lists are skipped, and so are NaN and the infinities;
- a message that carries no document, or one that cannot be read, gives ``[]``. It never raises.

Where the document is, by protocol:

| protocol | messages | document |
|---|---|---|
| websmq | publish, last will | the payload, sniffed (`payload_values`) |
| ubre | publish | the body: a JSON message's as it is; a binary message's bytes, sniffed |
| nydus | publish | the data section (JSON) |
| subble | produce event, event | the payload in its declared format (msgpack or JSON) |
| phyllo | pub-sub message carrying a document (0x40) | the document: msgpack, JSON or CBOR |

A payload without a declared format (WEBSMQ, a UBRE binary body) is read as JSON text first
(the Phyllo bridge and the other protocols put JSON text into the hub), then as one whole msgpack
document. A single byte from 0x00 to 0x7f is text, not a msgpack number: ``b"7"`` is the JSON
number 7, and ``b"a"`` is nothing, not 97.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack

from wireproto import capture
from wireproto.codecs import nydus, subble, ubre, websmq
from wireproto.codecs import phyllo as phyllo_codec

__all__ = ["numeric_values", "payload_values", "document_values", "numeric_fields"]

Reading = tuple[str, float]

_NOTHING = object()
_MSGPACK = 0x11
_CBOR = 0x12
_JSON = 0x50
_DOCUMENT = 0x40
_MAX_DEPTH = 16  # nested maps deeper than this are not followed


def numeric_values(
    protocol: str | None, kind: str | int, data: bytes, binary: bool
) -> list[Reading]:
    """The readings in one captured message: `protocol` by name (``"websmq"``...), `kind`
    ``"in"``/``"out"`` (or the capture code), the message's raw bytes and its binary flag."""
    try:
        incoming = kind in ("in", capture.Kind.IN)
        value = _message_value(protocol, bytes(data), binary, incoming)
        return [] if value is _NOTHING else numeric_fields(value)
    except Exception:  # a malformed message holds no readings; the row already says why
        return []


def payload_values(payload: bytes) -> list[Reading]:
    """The readings in a payload of unknown format: JSON text, else one msgpack document."""
    try:
        value = _sniff(bytes(payload))
        return [] if value is _NOTHING else numeric_fields(value)
    except Exception:
        return []


def document_values(document: bytes) -> list[Reading]:
    """The readings in a Phyllo document (``format u8 | schema u8 | body``)."""
    try:
        value = _phyllo_document(bytes(document))
        return [] if value is _NOTHING else numeric_fields(value)
    except Exception:
        return []


def numeric_fields(value: Any) -> list[Reading]:
    """A decoded document's numbers: ``[("value", x)]`` for a number, dotted fields for maps."""
    readings: list[Reading] = []
    _collect(value, "", readings, 0)
    return readings


def _collect(value: Any, prefix: str, readings: list[Reading], depth: int) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        number = float(value)
        if math.isfinite(number):
            readings.append((prefix or "value", number))
        return
    if isinstance(value, dict) and depth < _MAX_DEPTH:
        for key, item in value.items():
            if isinstance(key, bytes):
                key = key.decode("utf-8", "replace")
            name = str(key)
            _collect(item, f"{prefix}.{name}" if prefix else name, readings, depth + 1)


def _message_value(protocol: str | None, data: bytes, binary: bool, incoming: bool) -> Any:
    if protocol == "websmq":
        message = websmq.decode(data)
        if isinstance(message, (websmq.Publish, websmq.LastWill)):
            return _sniff(message.payload)
    elif protocol == "ubre":
        message = ubre.decode(data) if binary else ubre.decode_json(data)
        if isinstance(message, ubre.Publish) and message.body is not ubre.NO_BODY:
            body = message.body
            return _sniff(bytes(body)) if isinstance(body, (bytes, bytearray, memoryview)) else body
    elif protocol == "nydus":
        message = nydus.decode(data)
        if isinstance(message, nydus.Publish) and message.data is not nydus.NO_DATA:
            return message.data
    elif protocol == "subble":
        sender = subble.Sender.CLIENT if incoming else subble.Sender.SERVER
        message = subble.decode(data, sender=sender)
        if isinstance(message, (subble.ProduceEvent, subble.Event)):
            return _subble_payload(message.payload, int(message.format))
    elif protocol == "phyllo":
        received = phyllo_codec.decode(data)
        if (isinstance(received, phyllo_codec.PubSubMessage)
                and received.payload_type == _DOCUMENT):
            return _phyllo_document(received.payload)
    return _NOTHING


def _subble_payload(payload: bytes, format: int) -> Any:
    if format == subble.SerializationFormat.MSGPACK:
        return _msgpack_whole(payload)
    if format == subble.SerializationFormat.JSON:
        return json.loads(payload)
    return _NOTHING  # an implementor's own format


def _phyllo_document(document: bytes) -> Any:
    if len(document) < 2:
        return _NOTHING
    format, body = document[0], document[2:]
    if format == _MSGPACK:
        return _msgpack_whole(body)
    if format == _JSON:
        return json.loads(body)
    if format == _CBOR:
        import cbor2

        return cbor2.loads(body)
    return _NOTHING


def _sniff(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:  # not UTF-8, or not JSON
        pass
    if len(payload) == 1 and payload[0] < 0x80:
        return _NOTHING  # one byte of text, not a msgpack positive fixint
    try:
        return _msgpack_whole(payload)
    except Exception:
        return _NOTHING


def _msgpack_whole(data: bytes) -> Any:
    """One msgpack document that fills `data` exactly; raises otherwise."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)  # ExtraData if more follows
