"""The numeric readings a captured message carries, for the windowed aggregates of
`wireproto analyze`. Plain Python: no Spark, no JVM.

`numeric_values(protocol, kind, data, binary)` decodes one captured message with wireproto's
own codecs, takes the document it carries and returns its numbers as ``[(field, value), ...]``:

- a number alone is field ``"value"``; a map gives one value per numeric field, nested keys
  joined with dots (``{"env": {"temp": 21.5}}`` gives ``("env.temp", 21.5)``);
- booleans are not numbers, lists are skipped, and so are NaN and the infinities;
- a message that carries no document, or one that cannot be read, gives ``[]``. It never raises.

Where the document is, by protocol (each protocol's analysis module, named by its descriptor in
`wireproto.protocols`, says; its ``value`` function reads it):

| protocol | messages | document |
|---|---|---|
| websmq | publish, last will | the payload, sniffed (`payload_values`) |
| ubre | publish | the body: a JSON message's as it is; a binary message's bytes, sniffed |
| nydus | publish | the data section (JSON) |
| subble | produce event, event | the payload in its declared format (msgpack or JSON) |
| phyllo | pub-sub message carrying a document (0x40) | the document: msgpack, JSON or CBOR |

A payload without a declared format (WEBSMQ, a UBRE binary body) is read as JSON text first
(the Phyllo bridge and the other protocols put JSON text into the hub), then as one whole msgpack
document. A single byte from 0x00 to 0x7f is text, not a msgpack number: ``b"7"`` is the JSON
number 7, and ``b"a"`` is nothing, not 97.
"""

from __future__ import annotations

import math
from typing import Any

from wireproto import capture
from wireproto.payloads import NO_VALUE, sniff_value
from wireproto.phyllo.analysis import document_value
from wireproto.protocols import PROTOCOLS

__all__ = ["numeric_values", "payload_values", "document_values", "numeric_fields"]

Reading = tuple[str, float]

_MAX_DEPTH = 16  # nested maps deeper than this are not followed


def numeric_values(
    protocol: str | None, kind: str | int, data: bytes, binary: bool
) -> list[Reading]:
    """The readings in one captured message: `protocol` by name (``"websmq"``...), `kind`
    ``"in"``/``"out"`` (or the capture code), the message's raw bytes and its binary flag."""
    try:
        incoming = kind in ("in", capture.Kind.IN)
        value = _message_value(protocol, bytes(data), binary, incoming)
        return [] if value is NO_VALUE else numeric_fields(value)
    except Exception:  # a malformed message holds no readings; the row already says why
        return []


def payload_values(payload: bytes) -> list[Reading]:
    """The readings in a payload of unknown format: JSON text, else one msgpack document."""
    try:
        value = sniff_value(bytes(payload))
        return [] if value is NO_VALUE else numeric_fields(value)
    except Exception:
        return []


def document_values(document: bytes) -> list[Reading]:
    """The readings in a Phyllo document (``format u8 | schema u8 | body``)."""
    try:
        value = document_value(bytes(document))
        return [] if value is NO_VALUE else numeric_fields(value)
    except Exception:
        return []


def numeric_fields(value: Any) -> list[Reading]:
    """A decoded document's numbers: ``[("value", x)]`` for a number, dotted fields for maps."""
    readings: list[Reading] = []
    _collect(value, "", readings, 0)
    return readings


def _collect(value: Any, prefix: str, readings: list[Reading], depth: int) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        number = float(value)
        if math.isfinite(number):
            readings.append((prefix or "value", number))
        return
    if isinstance(value, dict) and depth < _MAX_DEPTH:
        for key, item in value.items():
            if isinstance(key, bytes):
                key = key.decode("utf-8", "replace")
            name = str(key)
            _collect(item, f"{prefix}.{name}" if prefix else name, readings, depth + 1)


def _message_value(protocol: str | None, data: bytes, binary: bool, incoming: bool) -> Any:
    descriptor = PROTOCOLS.get(protocol or "")
    if descriptor is None or descriptor.analysis is None:
        return NO_VALUE
    return descriptor.analysis_module().value(data, binary, incoming)
