"""SubbleSocket messages as analysis columns and readings, for the capture pipeline (sans-IO).

In records come from the client, out records from the broker (the host): the direction says
which side's codec reads a message.
"""

from __future__ import annotations

from typing import Any

from wireproto.codecs import subble
from wireproto.codecs.serialization import json_parse
from wireproto.payloads import NO_VALUE, whole_msgpack

__all__ = ["columns", "value", "published"]

_TYPES = {
    subble.HandshakeRequest: "handshake_request", subble.HandshakeResponse: "handshake_response",
    subble.ProduceEvent: "produce_event", subble.Event: "event", subble.EventError: "event_error",
}


def _decode(data: bytes, incoming: bool) -> Any:
    sender = subble.Sender.CLIENT if incoming else subble.Sender.SERVER
    return subble.decode(data, sender=sender)


def columns(data: bytes, binary: bool, incoming: bool) -> tuple[str, str | None, None, int]:
    message = _decode(data, incoming)
    topic = getattr(message, "event_type", None)
    size = len(getattr(message, "payload", b""))
    return _TYPES[type(message)], topic, None, size


def value(data: bytes, binary: bool, incoming: bool) -> Any:
    message = _decode(data, incoming)
    if not isinstance(message, (subble.ProduceEvent, subble.Event)):
        return NO_VALUE
    if message.format == subble.SerializationFormat.MSGPACK:
        return whole_msgpack(message.payload)
    if message.format == subble.SerializationFormat.JSON:
        return json_parse(message.payload)
    return NO_VALUE  # an implementor's own format


def published(data: bytes, binary: bool) -> tuple[str, bytes] | None:
    """A client's produce as the broker put it into the hub (connection.py, hub_payload): the
    event type and the payload, JSON text where JSON can say it; None for any other message."""
    from wireproto.protocols.subble.connection import hub_payload

    message = _decode(data, incoming=True)
    if not isinstance(message, subble.ProduceEvent):
        return None
    return message.event_type, hub_payload(message.payload, message.format)
