"""WEBSMQ topic patterns: MQTT-style wildcards (an opt-in extension, see docs/websmq.md) over
WEBSMQ topic text, checked the same way by the server and the client roles."""

from __future__ import annotations

from wireproto.codecs import websmq
from wireproto.errors import ProtocolError
from wireproto.topics import is_pattern, validate_pattern

__all__ = ["validate_websmq_pattern", "pattern_subscription"]


def validate_websmq_pattern(pattern: str) -> None:
    """A wildcard pattern whose wildcards are whole levels and whose other levels are valid
    WEBSMQ topic text."""
    validate_pattern(pattern)
    websmq.validate_topic(pattern.replace("#", "x").replace("+", "x"))


def pattern_subscription(data: bytes) -> tuple[type, str] | None:
    """The frame `data` as a Subscribe or Unsubscribe of a valid wildcard pattern: its codec
    class and the pattern; None for any other frame (the codec refuses a pattern as a topic)."""
    try:
        message_type, length = websmq.decode_header(data)
        if message_type not in (websmq.MessageType.SUBSCRIBE, websmq.MessageType.UNSUBSCRIBE):
            return None
        pattern = data[websmq.HEADER_SIZE : websmq.HEADER_SIZE + length].decode("ascii")
        if len(pattern) != length or not is_pattern(pattern):
            return None
        validate_websmq_pattern(pattern)
    except (ProtocolError, UnicodeDecodeError):
        return None
    kind = websmq.Subscribe if message_type == websmq.MessageType.SUBSCRIBE else \
        websmq.Unsubscribe
    return kind, pattern
