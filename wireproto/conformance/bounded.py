"""A short form of what a server sent, for a case's reason: never the whole of it, and built
without first writing out the whole of it (a message may be 64 MiB)."""

from __future__ import annotations

import dataclasses
import reprlib

__all__ = ["bounded"]

_LIMIT = 60
_parts = reprlib.Repr()
_parts.maxstring = _LIMIT
_parts.maxother = _LIMIT
_parts.maxlist = _parts.maxtuple = _parts.maxdict = _parts.maxset = 6
_parts.maxlevel = 3


def bounded(value: object, limit: int = _LIMIT) -> str:
    """`repr(value)` kept short: text and bytes cut to `limit` characters or bytes (with "...
    and N more"), a message's fields each so, containers to their first few items."""
    if isinstance(value, (str, bytes, bytearray)):
        shown = repr(value[:limit])
        more = len(value) - limit
        return shown + (f"... and {more} more" if more > 0 else "")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{field.name}={bounded(getattr(value, field.name), limit)}"
                           for field in dataclasses.fields(value) if field.repr)
        return f"{type(value).__name__}({fields})"
    if isinstance(value, int) and value.bit_length() > 3 * limit:
        return f"an integer of {value.bit_length()} bits"
    return _parts.repr(value)  # containers to their first items, long numbers cut
