"""Phyllo messages as analysis columns and readings, for the capture pipeline (sans-IO).

Best effort: a captured message is one minimal-stack chunk, a datagram holding a pub-sub
message. A document (payload type 0x40) is ``format u8 | schema u8 | body``.
"""

from __future__ import annotations

from typing import Any

from wireproto.codecs import phyllo as phyllo_codec
from wireproto.codecs.serialization import json_parse
from wireproto.payloads import NO_VALUE, whole_msgpack

__all__ = ["columns", "value", "document_value", "published"]

_MSGPACK = 0x11
_CBOR = 0x12
_JSON = 0x50
_DOCUMENT = 0x40


def columns(data: bytes, binary: bool, incoming: bool) -> tuple[str, str | None, None, int]:
    received: Any = phyllo_codec.decode(data)
    payload_type = received.payload_type
    try:
        name = phyllo_codec.TypeCode(payload_type).name.lower()
    except ValueError:
        name = f"0x{payload_type:02x}"
    if isinstance(received, phyllo_codec.PubSubMessage):
        topic = received.topic.decode("utf-8", "replace")
        return name, topic, None, len(received.payload)
    return name, None, None, len(received.payload)


def value(data: bytes, binary: bool, incoming: bool) -> Any:
    received = phyllo_codec.decode(data)
    if isinstance(received, phyllo_codec.PubSubMessage) and received.payload_type == _DOCUMENT:
        return document_value(received.payload)
    return NO_VALUE


def document_value(document: bytes) -> Any:
    """The value a Phyllo document holds, or `NO_VALUE` for a format this cannot read."""
    if len(document) < 2:
        return NO_VALUE
    format, body = document[0], document[2:]
    if format == _MSGPACK:
        return whole_msgpack(body)
    if format == _JSON:
        return json_parse(body)
    if format == _CBOR:
        import cbor2

        return cbor2.loads(body)
    return NO_VALUE


def published(data: bytes, binary: bool) -> tuple[str, bytes] | None:
    """A device's message as its bridge put it into the hub (bridge.py, hub_payload): the
    device's topic (the bridge puts it under its link's prefix) and the payload, a msgpack or
    JSON document as JSON text; None for a message that is not a pub-sub message or whose topic
    the bridge did not publish on (bridge.py, from_device)."""
    from wireproto.phyllo.bridge import hub_payload
    from wireproto.topics import hub_topic_error

    received = phyllo_codec.decode(data)
    if not isinstance(received, phyllo_codec.PubSubMessage):
        return None
    topic = received.topic.decode("utf-8")  # a topic that is not UTF-8 was not published
    if hub_topic_error(topic) is not None:
        return None
    return topic, hub_payload(received)
