"""Hub payloads (bytes) and the JSON values that JSON protocols (UBRE, nydus) carry.

A JSON value published into the hub travels as its compact JSON text, so every protocol sees the
same bytes. Coming out to a JSON protocol, a payload that is JSON text is that value, other UTF-8
text is a JSON string, and other bytes cannot be said in JSON at all.

For analysis, `sniff_value` reads a payload of unknown format as the document it holds (JSON
text, else one whole msgpack document), or `NO_VALUE`.
"""

from __future__ import annotations

from typing import Any

import msgpack

from wireproto.codecs.serialization import json_loads, json_parse, json_utf8
from wireproto.errors import ProtocolError

__all__ = [
    "payload_from_value",
    "json_from_payload",
    "value_from_payload",
    "NO_VALUE",
    "sniff_value",
    "whole_msgpack",
]

NO_VALUE: Any = type("NoValue", (), {"__repr__": lambda self: "NO_VALUE"})()


def payload_from_value(value: Any) -> bytes:
    """A value as a hub payload: bytes as they are, anything else as its compact JSON text."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return json_utf8(value)


def json_from_payload(payload: bytes) -> bytes | None:
    """A hub payload as compact JSON text: JSON text as it is (made compact), other UTF-8 as a
    JSON string, b"" for an empty payload. None if JSON cannot carry it (not UTF-8)."""
    if not payload:
        return b""
    try:
        return json_utf8(json_loads(payload, "payload"))
    except ProtocolError:
        pass
    try:
        return json_utf8(payload.decode())
    except (UnicodeDecodeError, ProtocolError):
        return None


def value_from_payload(payload: bytes) -> Any:
    """A hub payload as a value: JSON text as that value, other UTF-8 as a string, b"" as None,
    and other bytes as they are."""
    if not payload:
        return None
    try:
        return json_loads(payload, "payload")
    except ProtocolError:
        pass
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return payload


def sniff_value(payload: bytes) -> Any:
    """The document in a payload of unknown format: JSON text, else one whole msgpack document;
    `NO_VALUE` if it is neither."""
    try:
        return json_parse(payload)
    except ValueError:  # not UTF-8, or not JSON
        pass
    if len(payload) == 1 and payload[0] < 0x80:
        return NO_VALUE  # one byte of text, not a msgpack positive fixint
    try:
        return whole_msgpack(payload)
    except Exception:
        return NO_VALUE


def whole_msgpack(data: bytes) -> Any:
    """One msgpack document that fills `data` exactly; raises otherwise."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)  # ExtraData if more follows
