"""UBRE messages as analysis columns and readings, for the capture pipeline (sans-IO)."""

from __future__ import annotations

from typing import Any

from wireproto.codecs import ubre
from wireproto.codecs.serialization import json_dumps
from wireproto.payloads import NO_VALUE, sniff_value

__all__ = ["columns", "value", "published"]

_TYPES = {
    ubre.Subscribe: "subscribe", ubre.Publish: "publish", ubre.Unsubscribe: "unsubscribe",
    ubre.Request: "request", ubre.Success: "success", ubre.Fail: "fail",
}


def _decode(data: bytes, binary: bool) -> Any:
    # A text frame (or a line) can only hold JSON; a binary frame holds either format.
    return ubre.decode(data) if binary else ubre.decode_json(data)


def columns(data: bytes, binary: bool, incoming: bool) -> tuple[str, str | None, str | None, int]:
    """A body's size is its bytes, or a JSON body's compact JSON."""
    message = _decode(data, binary)
    kind = _TYPES[type(message)]
    body = message.body
    if body is ubre.NO_BODY:
        size = 0
    elif isinstance(body, (bytes, bytearray, memoryview)):
        size = len(body)
    else:
        text = json_dumps(body, allow_nan=True)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if isinstance(message, (ubre.Subscribe, ubre.Publish, ubre.Unsubscribe)):
        return kind, message.topic, None, size
    topic = message.name if isinstance(message, ubre.Request) else None
    return kind, topic, str(message.id), size


def value(data: bytes, binary: bool, incoming: bool) -> Any:
    message = _decode(data, binary)
    if isinstance(message, ubre.Publish) and message.body is not ubre.NO_BODY:
        body = message.body
        if isinstance(body, (bytes, bytearray, memoryview)):
            return sniff_value(bytes(body))
        return body
    return NO_VALUE


def published(data: bytes, binary: bool) -> tuple[str, bytes] | None:
    """A client's publish as the broker put it into the hub (server.py, publishReceived): a
    binary-format body's bytes as they are, a JSON body as its compact JSON text; None for any
    other message."""
    from wireproto.protocols.ubre.peer import payload_from_body

    message = _decode(data, binary)
    if not isinstance(message, ubre.Publish):
        return None
    if binary:
        return message.topic, b"" if message.body is ubre.NO_BODY else bytes(message.body)
    return message.topic, payload_from_body(message.body)
