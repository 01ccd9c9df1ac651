"""Phyllo document (type 0x40): structured data, carried as a pub-sub message's payload.

    format u8 | schema u8 | body

The format says how the body is serialized: msgpack 0x11 (the only one the references
implement; packed with bin types, read with raw=False so str and bytes stay distinct), CBOR 0x12
and JSON 0x50. The schema byte names the shape of the value for the application (0x00 is
schemaless); this codec carries it through and never interprets it. A document keeps its body
serialized: `deserialize()` reads it when the application asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from wireproto.codecs.serialization import (
    binary,
    json_loads,
    json_utf8,
    msgpack_dumps,
    msgpack_loads,
    unchecked_constructor,
)
from wireproto.errors import InvalidField, TruncatedFrame, UnknownType

from .codes import TypeCode, type_name
from .message import PubSubMessage, topic_bytes

__all__ = [
    "Document",
    "Format",
    "Schema",
    "decode_document",
    "deserialize",
    "document_from_message",
    "encode_document",
    "message_from_document",
    "serialize",
]


class Format(IntEnum):
    MSGPACK = 0x11
    CBOR = 0x12
    JSON = 0x50


class Schema(IntEnum):
    """Generic schema codes (phyllo-cpp). 0x30-0x4f are for phyllo frameworks, 0x50-0xff for
    applications (by convention 0x5* tuples, 0x6* arrays, 0x7* maps)."""

    SCHEMALESS = 0x00
    NONE = 0x01
    BOOLEAN = 0x02
    UINT = 0x03
    UINT8 = 0x04
    UINT16 = 0x05
    UINT32 = 0x06
    UINT64 = 0x07
    INT = 0x08
    INT8 = 0x09
    INT16 = 0x0A
    INT32 = 0x0B
    INT64 = 0x0C
    FLOAT32 = 0x0D
    FLOAT64 = 0x0E
    STRING = 0x10
    STRING8 = 0x11
    STRING16 = 0x12
    STRING32 = 0x13
    STRING64 = 0x14
    BINARY = 0x15
    BINARY8 = 0x16
    BINARY16 = 0x17
    BINARY32 = 0x18
    BINARY64 = 0x19


_DOCUMENT = int(TypeCode.DOCUMENT)
_MSGPACK = int(Format.MSGPACK)
_JSON = int(Format.JSON)
_SCHEMALESS = int(Schema.SCHEMALESS)


@dataclass(frozen=True, slots=True)
class Document:
    format: int
    schema: int
    body: bytes


_build_document = unchecked_constructor(Document)  # Document validates nothing, so no check is lost


def encode_document(document: Document) -> bytes:
    try:
        header = bytes((document.format, document.schema))
    except (TypeError, ValueError):
        raise InvalidField(
            f"Phyllo document format {document.format!r} and schema {document.schema!r} "
            "must each be a byte (0-255)"
        ) from None
    return header + document.body


def decode_document(data: bytes) -> Document:
    if type(data) is not bytes:
        data = binary(data, "Phyllo document")
    if len(data) < 2:
        raise TruncatedFrame(
            f"Phyllo document of {len(data)} byte{'' if len(data) == 1 else 's'}: "
            "the header (format and schema) needs 2"
        )
    return _build_document(data[0], data[1], data[2:])


def serialize(value: Any, format: int = _MSGPACK, schema: int = _SCHEMALESS) -> Document:
    """A document holding `value` serialized in `format`."""
    if format == _MSGPACK:
        body, format = msgpack_dumps(value), _MSGPACK
    elif format == _JSON:
        body, format = json_utf8(value), _JSON
    else:
        raise _unreadable(format)
    if type(schema) is not int:
        schema = int(schema)
    return _build_document(format, schema, body)  # encode_document checks the schema byte


def deserialize(document: Document) -> Any:
    """The value in a document's body; raises BadEncoding/BadJSON if the body is not valid."""
    format = document.format
    if format == _MSGPACK:
        return msgpack_loads(document.body, "Phyllo msgpack document")
    if format == _JSON:
        return json_loads(document.body, "Phyllo JSON document")
    raise _unreadable(format)


def _unreadable(format: int) -> InvalidField | UnknownType:
    if format == Format.CBOR:
        return InvalidField(
            "Phyllo CBOR document (format 0x12): wireproto carries its body but does not "
            "serialize or read CBOR"
        )
    return UnknownType(
        f"Phyllo document format 0x{format:02x} is not one wireproto reads "
        "(msgpack 0x11, JSON 0x50)"
    )


def message_from_document(topic: bytes | str, document: Document) -> PubSubMessage:
    """The pub-sub message (payload type 0x40) that carries `document` on `topic`."""
    return PubSubMessage(_DOCUMENT, topic_bytes(topic), encode_document(document))


def document_from_message(message: PubSubMessage) -> Document:
    """The document a pub-sub message carries; refuses a message that carries something else."""
    if message.payload_type != _DOCUMENT:
        raise UnknownType(
            f"Phyllo pub-sub message on topic {message.topic!r} carries payload type "
            f"{type_name(message.payload_type)}, not a document (0x40)"
        )
    return decode_document(message.payload)
