"""Phyllo type codes: the one byte with which every layer says what its payload is.

From phyllo's type table (as phyllo-cpp 0.2.1 defines it). Codes 0x00-0x0f are a layer's own
messages (control, version, ..., metrics; 0x09-0x0f are the layer's to define): they carry no
application data and are never handed to the application (docs/phyllo.md, "What we decided").
"""

from __future__ import annotations

from enum import IntEnum
from typing import Protocol

__all__ = ["LAYER_TYPE_LIMIT", "TypeCode", "is_layer_message", "type_name"]

LAYER_TYPE_LIMIT = 0x10
"""Payload types below this are the layers' own messages."""


class TypeCode(IntEnum):
    CONTROL = 0x00
    VERSION = 0x01
    CAPABILITIES = 0x02
    ERROR = 0x03
    WARN = 0x04
    INFO = 0x05
    DEBUG = 0x06
    TRACE = 0x07
    METRICS = 0x08
    BYTES_BUFFER = 0x10
    BYTES_STREAM = 0x11
    BYTES_CHUNK = 0x12
    FRAME = 0x20
    DATAGRAM = 0x21
    VALIDATED_DATAGRAM = 0x22
    RELIABLE_BUFFER = 0x23
    DOCUMENT = 0x40
    PUBSUB = 0x60


class _Typed(Protocol):
    @property
    def payload_type(self) -> int: ...


def is_layer_message(unit: _Typed) -> bool:
    """True for a datagram, validated datagram or pub-sub message that is a layer's own message."""
    return unit.payload_type < LAYER_TYPE_LIMIT


def type_name(code: int) -> str:
    """`0x05 (info)`, for error messages."""
    try:
        return f"0x{code:02x} ({TypeCode(code).name.lower().replace('_', ' ')})"
    except ValueError:
        return f"0x{code:02x}"
