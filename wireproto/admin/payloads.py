"""A payload as the status page shows it: JSON or msgpack decoded where it is either, UTF-8 text
where it is that, hex otherwise (`describe_payload`); and as it was sent, text or hex, never
decoded and written again (`raw_payload`, for the tap)."""

from __future__ import annotations

from typing import Any

import msgpack
import orjson

__all__ = ["describe_payload", "raw_payload"]


def _plain(value: Any) -> Any:
    """A msgpack value as JSON can say it: bytes as hex, map keys as text."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(_plain(key)): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, msgpack.ExtType):
        return {"ext": value.code, "data": value.data.hex()}
    return value


def describe_payload(payload: bytes, limit: int) -> dict[str, Any]:
    """``{"size": N, <kind>: value}``, kind one of json, msgpack, text, hex; a payload over
    `limit` bytes is shown as the hex of its first `limit` bytes, with ``"truncated": true``.

    >>> describe_payload(b'{"t": 21.5}', 100)
    {'size': 11, 'json': {'t': 21.5}}
    >>> describe_payload(bytes.fromhex("81a174cb4035800000000000"), 100)
    {'size': 12, 'msgpack': {'t': 21.5}}
    >>> describe_payload(b"hello", 100)
    {'size': 5, 'text': 'hello'}
    >>> describe_payload(b"\\xff\\x00", 100)
    {'size': 2, 'hex': 'ff00'}
    >>> describe_payload(b"\\x00\\x01", 100)
    {'size': 2, 'hex': '0001'}
    """
    size = len(payload)
    if size > limit:
        return {"size": size, "hex": payload[:limit].hex(), "truncated": True}
    if not payload:
        return {"size": 0, "text": ""}
    try:
        return {"size": size, "json": orjson.loads(payload)}
    except orjson.JSONDecodeError:
        pass
    # One msgpack value that takes every byte; a single byte below 0x80 is a msgpack integer
    # but more likely a character, so text wins for printable payloads.
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and _readable(text):
        return {"size": size, "text": text}
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError):
        return {"size": size, "hex": payload.hex()}
    return {"size": size, "msgpack": _plain(value)}


def _readable(text: str) -> bool:
    """Printable text, line breaks and tabs included."""
    return text.isprintable() or text.translate(_WHITESPACE).isprintable()


_WHITESPACE = {ord("\n"): None, ord("\r"): None, ord("\t"): None}


def raw_payload(payload: bytes, limit: int) -> dict[str, str | bool]:
    """The payload as it was sent: ``{"text": ...}`` when it is UTF-8 (control characters and
    all: JSON escapes them), ``{"hex": ...}`` otherwise. Over `limit` bytes, its first `limit`
    bytes (to the last whole character) and ``"truncated": true``.

    >>> raw_payload(b'{"t": 234e-1}', 100)
    {'text': '{"t": 234e-1}'}
    >>> raw_payload(b"\\x00\\x1b[2J", 100)
    {'text': '\\x00\\x1b[2J'}
    >>> raw_payload(b"\\xff\\xfe", 100)
    {'hex': 'fffe'}
    >>> raw_payload("\u00e9t\u00e9".encode(), 2)
    {'text': '\u00e9', 'truncated': True}
    """
    shown = payload[:limit]
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError as error:
        # A character cut by the limit is left out; any other bad byte makes it bytes.
        if len(shown) == len(payload) or error.reason != "unexpected end of data":
            return _truncated({"hex": shown.hex()}, shown, payload)
        text = shown[:error.start].decode("utf-8")
    return _truncated({"text": text}, shown, payload)


def _truncated(raw: dict[str, str | bool], shown: bytes, payload: bytes) -> dict[str, str | bool]:
    if len(shown) < len(payload):
        raw["truncated"] = True
    return raw
