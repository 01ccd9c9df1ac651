"""nydus messages as analysis columns and readings, for the capture pipeline (sans-IO)."""

from __future__ import annotations

from typing import Any

from wireproto.codecs import nydus
from wireproto.payloads import NO_VALUE

__all__ = ["columns", "value", "published"]

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


# The route a nydus client publishes through (server.py, HUB_ROUTES).
_PUBLISH_ROUTE = "/_hub/publish"


def published(data: bytes, binary: bool) -> tuple[str, bytes] | None:
    """A client's publish (an INVOKE of ``/_hub/publish`` with ``{"path", "data"}``) as the
    broker put it into the hub: the path's topic and the data's compact JSON (b"" without
    data); None for any other message."""
    from wireproto.payloads import payload_from_value
    from wireproto.protocols.nydus.paths import topic_of_path

    message = nydus.decode(data)
    if not isinstance(message, nydus.Invoke) or message.path != _PUBLISH_ROUTE:
        return None
    body = message.data
    if not isinstance(body, dict) or not isinstance(body.get("path"), str):
        return None
    data_value = body.get("data", nydus.NO_DATA)
    payload = b"" if data_value is nydus.NO_DATA else payload_from_value(data_value)
    return topic_of_path(body["path"]), payload
