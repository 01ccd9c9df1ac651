"""WEBSMQ topic patterns: MQTT-style wildcards (an opt-in extension, see docs/websmq.md) over
WEBSMQ topic text, checked the same way by the server and the client roles."""

from __future__ import annotations

from wireproto.codecs import websmq
from wireproto.topics import validate_pattern

__all__ = ["validate_websmq_pattern"]


def validate_websmq_pattern(pattern: str) -> None:
    """A wildcard pattern whose wildcards are whole levels and whose other levels are valid
    WEBSMQ topic text."""
    validate_pattern(pattern)
    websmq.validate_topic(pattern.replace("#", "x").replace("+", "x"))
