"""What the program's log shows, and how a line reads.

- **Debug or not.** `debugging` says whether debug events may be shown; `wireproto serve` (and
  the twistd plugin) set it from ``[log] level``. Code that logs often at debug (a subscribe,
  an HTTP request) asks it first, so it builds no event when debug is off. Until told, it says
  yes: whoever embeds the hub filters events as it likes.
- **Twisted's own chatter.** `is_chatter`: Twisted's, Autobahn's and txaio's events below warn,
  old-style ``twisted.python.log`` messages below warn, and the "Starting factory" and
  "Stopping factory" lines Twisted writes for every factory (whichever namespace it gives
  them: a factory's class). The program's log leaves them out at every level; their warnings
  and errors (an unhandled error in a Deferred, a failure) stay.
- **JSON Lines.** `json_line`: one event as one JSON object on one line, with the keys
  docs/observability.md lists: ``time`` (ISO 8601, UTC, milliseconds), ``level``,
  ``namespace``, ``event``, ``message`` (the rendered text), the event's own fields, and for a
  failure ``error`` and ``traceback``; nothing of twisted.logger's own ``log_*`` fields.
"""

from __future__ import annotations

import json
import math
import time

from twisted.logger import LogLevel, formatEvent
from twisted.python.failure import Failure

__all__ = ["debugging", "set_debugging", "is_chatter", "json_line", "FIXED_KEYS"]

_debugging = True


def debugging() -> bool:
    """Whether debug events may be shown (so are worth building)."""
    return _debugging


def set_debugging(shown: bool) -> None:
    """Say whether debug events are shown, in this process, from now on."""
    global _debugging
    _debugging = shown


_CHATTY_NAMESPACES = frozenset({"twisted", "autobahn", "txaio", "log_legacy"})
_SHOWN_LEVELS = frozenset({LogLevel.warn, LogLevel.error, LogLevel.critical})
_FACTORY_LINES = frozenset({"Starting factory {factory!r}", "Stopping factory {factory!r}"})


def is_chatter(event: dict[str, object]) -> bool:
    """Whether `event` is Twisted's (or Autobahn's) own chatter, as the module docstring says."""
    if event.get("log_level") in _SHOWN_LEVELS:
        return False
    if event.get("log_format") in _FACTORY_LINES:
        return True
    namespace = event.get("log_namespace")
    return isinstance(namespace, str) and namespace.partition(".")[0] in _CHATTY_NAMESPACES


FIXED_KEYS = ("time", "level", "namespace", "event", "message")
# What twisted.python.log's old-style events carry besides their log_* fields.
_LEGACY_KEYS = frozenset({"message", "isError", "system", "time", "format", "why", "failure"})
_DEPTH = 6


def json_line(event: dict[str, object]) -> str:
    """`event` as one line of JSON (with its newline). Values JSON has no type for are written
    as their text; a field named as one of `FIXED_KEYS` is written with ``field_`` before it."""
    legacy = "isError" in event or event.get("log_namespace") == "log_legacy"
    failure = event.get("log_failure") or (event.get("failure") if legacy else None)
    level = event.get("log_level")
    if legacy and failure is not None:
        message = str(event.get("why") or "Unhandled Error")
    else:
        message = formatEvent(event)
    if not message and isinstance(failure, Failure):  # Twisted's second line of an error
        message = _failure_text(failure)
    record: dict[str, object] = {
        "time": _timestamp(event.get("log_time")),
        "level": getattr(level, "name", None),
        "namespace": event.get("log_namespace"),
        "event": _plain(event.get("event"), 0),
        "message": message,
    }
    for key, value in event.items():
        if not isinstance(key, str) or key.startswith("log_") or key == "event" or (
                legacy and key in _LEGACY_KEYS):
            continue
        record["field_" + key if key in FIXED_KEYS else key] = _plain(value, 0)
    if isinstance(failure, Failure):
        record.setdefault("error", _failure_text(failure))
        record["traceback"] = _traceback(failure)
    return json.dumps(record, allow_nan=False) + "\n"


def _timestamp(when: object) -> str | None:
    """``2026-01-05T10:12:01.270Z``: `when` (seconds since the epoch) in UTC, to the
    millisecond."""
    if not isinstance(when, (int, float)) or not math.isfinite(when):
        return None
    seconds = math.floor(when)
    milliseconds = min(int((when - seconds) * 1000), 999)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{milliseconds:03d}Z"


def _plain(value: object, depth: int) -> object:
    """`value` as JSON takes it: its own types kept, containers converted, anything else (an
    object, bytes, a float that is not finite) as its text."""
    if value is None or type(value) in (str, bool, int):
        return value
    if isinstance(value, int):  # an IntEnum's number, say
        return int(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth < _DEPTH:
        if isinstance(value, dict):
            return {str(key): _plain(item, depth + 1) for key, item in value.items()}
        if isinstance(value, (list, tuple, set, frozenset)):
            return [_plain(item, depth + 1) for item in value]
    return _text(value)


def _text(value: object) -> str:
    """`value`'s text, never an exception."""
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _failure_text(failure: Failure) -> str:
    """``ValueError: what went wrong``."""
    kind = getattr(failure, "type", None)
    name = getattr(kind, "__name__", None) or _text(kind)
    try:
        return f"{name}: {failure.getErrorMessage()}"
    except Exception:
        return name


def _traceback(failure: Failure) -> str | None:
    try:
        return str(failure.getTraceback())
    except Exception:
        return None
