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
- **Text.** `text_line`: Twisted's classic line (``TIME [namespace#level] message``), with
  every control character of the message written as an escape (``\\r``, ``\\n``, ``\\x1b``,
  ``\\u202e``): what a peer sends (a client ID, a topic, a reason) can neither end a line,
  start a forged one, nor move the cursor or hide text. A traceback keeps its lines, each
  continued with a tab.
- **JSON Lines.** `json_line`: one event as one JSON object on one line, with the keys
  docs/observability.md lists: ``time`` (ISO 8601, UTC, milliseconds), ``level``,
  ``namespace``, ``event``, ``message`` (the rendered text), the event's own fields, and for a
  failure ``error`` and ``traceback``; nothing of twisted.logger's own ``log_*`` fields.
"""

from __future__ import annotations

import json
import math
import re
import time

from twisted.logger import LogLevel, formatEvent, formatTime
from twisted.python.failure import Failure

__all__ = ["debugging", "set_debugging", "is_chatter", "json_line", "text_line",
           "escape_controls", "FIXED_KEYS"]

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


# C0 and C1 controls, DEL, the line and paragraph separators, and the marks and overrides that
# change the direction text is shown in.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROLS_BUT_NEWLINE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    character = match.group()
    code = ord(character)
    return _NAMED.get(character) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape_controls(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with each control character written as its escape (``\\n``, ``\\x1b``);
    line breaks kept with `keep_newlines`."""
    return (_CONTROLS_BUT_NEWLINE if keep_newlines else _CONTROLS).sub(_escape, text)


def _failure_of(event: dict[str, object]) -> tuple[bool, object]:
    """Whether `event` is an old-style ``twisted.python.log`` one, and the failure it carries
    (None if none): twisted.logger's ``log_failure``, or an old-style error's ``failure``."""
    legacy = "isError" in event or event.get("log_namespace") == "log_legacy"
    return legacy, event.get("log_failure") or (event.get("failure") if legacy else None)


def text_line(event: dict[str, object], whose: str = "") -> str | None:
    """`event` as one line of text (a traceback's lines after it, each begun with a tab), with
    `whose` (``[worker 1 pid 4242] ``) after the time; None for an event with nothing to say."""
    legacy, failure = _failure_of(event)
    if legacy and failure is not None:  # its text holds the traceback: it is written below
        message = _text(event.get("why") or "Unhandled Error")
    else:
        message = formatEvent({key: value for key, value in event.items()
                               if key != "log_failure"})
    text = escape_controls(message) if message else ""
    if isinstance(failure, Failure):
        trace = _traceback(failure) or _failure_text(failure)
        text = "\n".join((text, escape_controls(trace.rstrip("\n"), keep_newlines=True)))
    if not text:
        return None
    when = event.get("log_time")
    stamp = formatTime(when if isinstance(when, (int, float)) else None)
    return f"{stamp} {whose}[{_system(event)}] {text.replace(chr(10), chr(10) + chr(9))}\n"


def _system(event: dict[str, object]) -> str:
    """``namespace#level``, or the event's ``log_system``, as Twisted's text shows it."""
    system = event.get("log_system")
    if system is not None:
        return escape_controls(_text(system))
    level = event.get("log_level")
    return f"{event.get('log_namespace', '-')}#{getattr(level, 'name', '-')}"


FIXED_KEYS = ("time", "level", "namespace", "event", "message")
# What twisted.python.log's old-style events carry besides their log_* fields.
_LEGACY_KEYS = frozenset({"message", "isError", "system", "time", "format", "why", "failure"})
_DEPTH = 6


def json_line(event: dict[str, object]) -> str:
    """`event` as one line of JSON (with its newline). Values JSON has no type for are written
    as their text; a field named as one of `FIXED_KEYS` is written with ``field_`` before it."""
    legacy, failure = _failure_of(event)
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
