"""A payload as the status page shows it (`describe_payload`, for the tap and the topics' last
values): as it was sent, text when it is UTF-8, hex otherwise, never decoded and written again
(`raw_payload`); and its value decoded where it is JSON or msgpack, for scripts. Each bounded in
bytes, whatever the payload."""

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
    """What the tap and the topics' last values show of a payload: ``{"size": N}``, the payload
    as it was sent (`raw_payload`: ``"text"`` or ``"hex"``, never both) and, for scripts, its
    value decoded where the payload is JSON or msgpack of at most `limit` bytes (``"json"`` or
    ``"msgpack"``), left out where that value's JSON would pass ``2 * limit`` bytes. So each of
    the two takes at most about ``2 * limit`` bytes of JSON.

    >>> describe_payload(b'{"t": 21.5}', 100)
    {'size': 11, 'json': {'t': 21.5}, 'text': '{"t": 21.5}'}
    >>> describe_payload(bytes.fromhex("81a174cb4035800000000000"), 100)
    {'size': 12, 'msgpack': {'t': 21.5}, 'hex': '81a174cb4035800000000000'}
    >>> describe_payload("<b>\\u202eRTL".encode(), 100)
    {'size': 9, 'text': '<b>\\u202eRTL'}
    >>> describe_payload(b"\\xff\\x00", 100)
    {'size': 2, 'hex': 'ff00'}
    """
    described: dict[str, Any] = {"size": len(payload)}
    if 0 < len(payload) <= limit:
        decoded = _decoded(payload)
        if decoded is not None and len(orjson.dumps(decoded[1])) <= 2 * limit:
            described[decoded[0]] = decoded[1]
    described.update(raw_payload(payload, limit))
    return described


def _decoded(payload: bytes) -> tuple[str, Any] | None:
    """``("json", value)``, ``("msgpack", value)``, or None for a payload that is neither (or
    is readable text, which a single msgpack integer or string could also be)."""
    try:
        return "json", orjson.loads(payload)
    except orjson.JSONDecodeError:
        pass
    try:
        if _readable(payload.decode("utf-8")):
            return None
    except UnicodeDecodeError:
        pass
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError):
        return None
    return "msgpack", _plain(value)


def _readable(text: str) -> bool:
    """Printable text, line breaks and tabs included."""
    return text.isprintable() or text.translate(_WHITESPACE).isprintable()


_WHITESPACE = {ord("\n"): None, ord("\r"): None, ord("\t"): None}


def raw_payload(payload: bytes, limit: int) -> dict[str, str | bool]:
    """The payload as it was sent: ``{"text": ...}`` when it is UTF-8 (control characters and
    all: JSON escapes them), ``{"hex": ...}`` otherwise. Over `limit` bytes, its first `limit`
    bytes (to the last whole character) and ``"truncated": true``; text that JSON's escapes
    (six bytes a control character) would make longer than ``2 * limit`` bytes is cut there too.

    >>> raw_payload(b'{"t": 234e-1}', 100)
    {'text': '{"t": 234e-1}'}
    >>> raw_payload(b"\\x00\\x1b[2J", 100)
    {'text': '\\x00\\x1b[2J'}
    >>> raw_payload(b"\\xff\\xfe", 100)
    {'hex': 'fffe'}
    >>> raw_payload("\u00e9t\u00e9".encode(), 2)
    {'text': '\u00e9', 'truncated': True}
    >>> raw_payload(b"\\x00" * 10, 10)
    {'text': '\\x00\\x00\\x00', 'truncated': True}
    """
    shown = payload[:limit]
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError as error:
        # A character cut by the limit is left out; any other bad byte makes it bytes.
        if len(shown) == len(payload) or error.reason != "unexpected end of data":
            return _truncated({"hex": shown.hex()}, len(shown) < len(payload))
        text = shown[:error.start].decode("utf-8")
    cut = len(shown) < len(payload)
    if len(text) * 6 > 2 * limit:
        # JSON's escapes could take it past 2 * limit bytes (and its quotes): cut to fit.
        budget = 2 * limit + 2
        written = len(orjson.dumps(text))
        while written > budget:
            text = text[:len(text) * budget // written]
            written = len(orjson.dumps(text))
            cut = True
    return _truncated({"text": text}, cut)


def _truncated(raw: dict[str, str | bool], cut: bool) -> dict[str, str | bool]:
    if cut:
        raw["truncated"] = True
    return raw
