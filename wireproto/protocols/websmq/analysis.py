"""WEBSMQ messages as analysis columns and readings, for the capture pipeline (sans-IO)."""

from __future__ import annotations

from typing import Any

from wireproto.codecs import websmq
from wireproto.payloads import NO_VALUE, sniff_value
from wireproto.protocols.websmq.patterns import pattern_subscription

__all__ = ["columns", "wildcard_columns", "value", "published"]

_TYPES = {
    websmq.Publish: "publish", websmq.Subscribe: "subscribe",
    websmq.Unsubscribe: "unsubscribe", websmq.LastWill: "last_will",
}
_TYPE_NAMES = ("publish", "subscribe", "unsubscribe", "last_will")
# Topic bytes the codec has accepted, and the topic it made of them; cleared when full.
_known_topics: dict[bytes, str] = {}
_KNOWN_TOPICS_MAX = 65536


def columns(data: bytes, binary: bool, incoming: bool) -> tuple[str, str | None, None, int]:
    # Fast path: a frame whose topic the codec has accepted before needs only its header read.
    if len(data) >= 2:
        header = data[0] << 8 | data[1]
        end = 2 + (header & websmq.MAX_TOPIC_LENGTH)
        if 2 < end <= len(data):
            topic = _known_topics.get(data[2:end])
            if topic is not None:
                return _TYPE_NAMES[header >> 14], topic, None, len(data) - end
    message = websmq.decode(data)
    if len(_known_topics) >= _KNOWN_TOPICS_MAX:
        _known_topics.clear()
    _known_topics[data[2:len(data) - len(message.payload)]] = message.topic
    return _TYPES[type(message)], message.topic, None, len(message.payload)


def wildcard_columns(data: bytes, binary: bool, incoming: bool
                     ) -> tuple[str, str, None, int] | None:
    """The columns of a frame sent on a connection whose listener takes wildcard subscriptions
    (its open record says so), where they differ from `columns`': a Subscribe or Unsubscribe
    of a pattern (`plant/#`), which the codec refuses as a topic, is read as what the broker
    did with it, with the pattern as its topic. None for any other frame."""
    found = pattern_subscription(data) if incoming else None
    if found is None:
        return None
    kind, pattern = found
    return _TYPES[kind], pattern, None, len(data) - websmq.HEADER_SIZE - len(pattern)


def value(data: bytes, binary: bool, incoming: bool) -> Any:
    message = websmq.decode(data)
    if isinstance(message, (websmq.Publish, websmq.LastWill)):
        return sniff_value(message.payload)
    return NO_VALUE


def published(data: bytes, binary: bool) -> tuple[str, bytes] | None:
    """A client's publish as the broker put it into the hub: (topic, payload), the payload's
    bytes as they are; None for any other message (a last will is published only when its
    connection is lost)."""
    message = websmq.decode(data)
    if isinstance(message, websmq.Publish):
        return message.topic, bytes(message.payload)
    return None
