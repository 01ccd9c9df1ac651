"""nydus messages as analysis columns and readings, for the capture pipeline (sans-IO)."""

from __future__ import annotations

from typing import Any

from wireproto.codecs import nydus
from wireproto.payloads import NO_VALUE

__all__ = ["columns", "value"]

_TYPES = {
    nydus.Welcome: "welcome", nydus.Invoke: "invoke", nydus.Result: "result",
    nydus.Error: "error", nydus.Publish: "publish",
}


def columns(data: bytes, binary: bool, incoming: bool) -> tuple[str, str | None, str | None, int]:
    message = nydus.decode(data)
    # Ids have no '|' and paths are URI-encoded, so the first '|' starts the data section.
    size = len(data) - data.index(b"|") - 1 if message.data is not nydus.NO_DATA else 0
    if isinstance(message, nydus.Welcome):
        return "welcome", None, None, size
    topic = getattr(message, "path", None)
    request_id = getattr(message, "id", None)
    return _TYPES[type(message)], topic, request_id, size


def value(data: bytes, binary: bool, incoming: bool) -> Any:
    message = nydus.decode(data)
    if isinstance(message, nydus.Publish) and message.data is not nydus.NO_DATA:
        return message.data
    return NO_VALUE
