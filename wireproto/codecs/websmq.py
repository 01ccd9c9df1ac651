"""WEBSMQ, the WebSocket Message Queue: frames as bytes and back, sans-IO.

Implements WEBSMQ as docs/websmq.md describes it: the message model, and what we decided where
the spec is silent.

Every WEBSMQ message is one binary WebSocket frame:

    +---------------------+-----------------------------+---------------------+
    | header: u16 (BE)    | topic: <topic length> bytes | payload: the rest   |
    | type:2 | length:14  | ASCII, URL-encoded          | any bytes, maybe 0  |
    +---------------------+-----------------------------+---------------------+

The top two bits of the header are the message type:

    00 Publish    01 Subscribe    10 Unsubscribe    11 LastWill

The low fourteen bits are the topic length in bytes, so a topic is at most 16383 bytes. Whatever
follows the topic is the payload. A client subscribes to a topic, publishes to it, unsubscribes,
or declares a last will (a topic and a payload the broker publishes, with the LastWill type, when
the client disconnects). A broker sends only Publish and LastWill frames.

Topics are hierarchical (`sensors/temps/living_room`), ASCII and URL-encoded. wireproto reads
"URL-encoded" as "could be the path of a percent-encoded URL" (RFC 3986 `path-abempty`):

    A-Z a-z 0-9 - . _ ~        unreserved
    ! $ & ' ( ) * + , ; =      sub-delims
    : @                        allowed in a path segment
    /                          the segment separator
    %XX                        an escape, X a hex digit of either case

Anything else, space, `?` and `#` included, must be percent-encoded. A topic is at least one byte:
an empty topic names nothing a client could subscribe to. Topics match exactly, so `a%2Fb` and
`a%2fb` are different topics. `topic_from_text` makes a topic from any text.

The payload of Subscribe and Unsubscribe "should be ignored" by the server. decode keeps it (so
decode and encode lose nothing) and the broker ignores it.

Decoding is exact: `encode(decode(frame)) == frame` for every frame decode accepts, so a broker
may forward a received Publish, or a stored LastWill, byte for byte.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar
from urllib.parse import quote, unquote_to_bytes

from wireproto.codecs.serialization import binary, unchecked_constructor
from wireproto.errors import (
    BadEncoding,
    BadLength,
    InvalidField,
    InvalidTopic,
    ProtocolError,
    TruncatedFrame,
    UnknownType,
)

__all__ = [
    "HEADER_SIZE",
    "MAX_TOPIC_LENGTH",
    "MessageType",
    "Publish",
    "Subscribe",
    "Unsubscribe",
    "LastWill",
    "Message",
    "encode",
    "decode",
    "encode_publish",
    "encode_header",
    "decode_header",
    "validate_topic",
    "topic_from_text",
    "text_from_topic",
]

HEADER_SIZE = 2
MAX_TOPIC_LENGTH = 0x3FFF  # 14 bits

_HEADER = struct.Struct(">H")
_TYPE_SHIFT = 14


class MessageType(IntEnum):
    """The top two bits of the header."""

    PUBLISH = 0b00
    SUBSCRIBE = 0b01
    UNSUBSCRIBE = 0b10
    LAST_WILL = 0b11


# --- Messages ------------------------------------------------------------------------------------
# The dataclasses do not validate: decode has already checked what it builds, and encode checks
# what it is given, so the check runs once on either path.


@dataclass(frozen=True, slots=True)
class Publish:
    """Deliver `payload` to every other client subscribed to `topic`."""

    topic: str
    payload: bytes
    message_type: ClassVar[MessageType] = MessageType.PUBLISH


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Receive what is published to `topic` until unsubscribing or disconnecting.

    A payload is allowed on the wire and kept by decode; the broker ignores it.
    """

    topic: str
    payload: bytes = b""
    message_type: ClassVar[MessageType] = MessageType.SUBSCRIBE


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Stop receiving what is published to `topic`. A payload is kept but ignored, as above."""

    topic: str
    payload: bytes = b""
    message_type: ClassVar[MessageType] = MessageType.UNSUBSCRIBE


@dataclass(frozen=True, slots=True)
class LastWill:
    """Publish `payload` to `topic`, with the LastWill type, when this client disconnects."""

    topic: str
    payload: bytes
    message_type: ClassVar[MessageType] = MessageType.LAST_WILL


Message = Publish | Subscribe | Unsubscribe | LastWill

_CLASS_OF_TYPE = (Publish, Subscribe, Unsubscribe, LastWill)
_TYPE_OF_CLASS = {cls: int(cls.message_type) for cls in _CLASS_OF_TYPE}
_MESSAGE_TYPES = tuple(MessageType)


_BUILD_OF_TYPE = tuple(unchecked_constructor(cls) for cls in _CLASS_OF_TYPE)


# --- Topics --------------------------------------------------------------------------------------

_TOPIC_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/"
_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")
_HEX_DIGITS = frozenset(b"0123456789ABCDEFabcdef")


def _escapes_valid(raw: bytes, rest: bytes) -> bool:
    """Whether `rest`, what is left of `raw` without its plain characters, is only good escapes.

    Deleting the plain characters with `translate` is several times faster than matching a
    regex, and most topics have nothing left, so escapes are looked at only when there are some.
    """
    return not rest.strip(b"%") and _BAD_ESCAPE.search(raw) is None


def _topic_problem(raw: bytes) -> tuple[int, str]:
    """Where and why a non-empty topic is invalid (the slow path, for the error message)."""
    index = 0
    while index < len(raw):
        byte = raw[index]
        if byte == 0x25:  # '%'
            escape = raw[index : index + 3]
            if len(escape) < 3 or not _HEX_DIGITS.issuperset(escape[1:]):
                return index, f"'%' must start an escape of two hex digits, not {escape!r}"
            index += 3
            continue
        if byte >= 0x80:
            return index, f"byte 0x{byte:02x} is not ASCII"
        if byte not in _TOPIC_CHARS:
            return index, f"character {chr(byte)!r} must be percent-encoded as %{byte:02X}"
        index += 1
    raise AssertionError("_topic_problem called on a valid topic")


def _shown(topic: str) -> str:
    """The topic for an error message, cut short: messages become WebSocket close reasons."""
    return repr(topic) if len(topic) <= 40 else repr(topic[:40]) + "..."


def _topic_bytes(topic: str) -> bytes:
    """The ASCII bytes of `topic`, or InvalidTopic saying what is wrong and where."""
    try:
        raw = topic.encode("ascii")
    except AttributeError:
        raise InvalidTopic(f"WEBSMQ topic must be str, not {type(topic).__name__}") from None
    except UnicodeEncodeError as e:
        char = topic[e.start]
        escaped = "".join(f"%{b:02X}" for b in char.encode("utf-8", "surrogatepass"))
        raise InvalidTopic(
            f"WEBSMQ topic {_shown(topic)}: character {char!r} at index {e.start} is not ASCII;"
            f" percent-encode its UTF-8 bytes ({escaped}), e.g. with topic_from_text()",
            offset=e.start,
        ) from None
    if not raw:
        raise InvalidTopic("WEBSMQ topic is empty: a topic needs at least one character")
    if len(raw) > MAX_TOPIC_LENGTH:
        raise InvalidTopic(
            f"WEBSMQ topic of {len(raw)} bytes is too long: the header allows {MAX_TOPIC_LENGTH}"
        )
    rest = raw.translate(None, _TOPIC_CHARS)
    if rest and not _escapes_valid(raw, rest):
        index, why = _topic_problem(raw)
        raise InvalidTopic(
            f"WEBSMQ topic {_shown(topic)}: at index {index}, {why}"
            " (topic_from_text() percent-encodes text)",
            offset=index,
        )
    return raw


def validate_topic(topic: str) -> None:
    """Raise InvalidTopic unless `topic` may go on the wire as it is."""
    _topic_bytes(topic)


def topic_from_text(text: str) -> str:
    """Percent-encode any text as a topic, keeping `/` as the segment separator.

    Only unreserved characters and `/` stay as they are; everything else becomes UTF-8 `%XX`
    escapes (upper-case hex): `topic_from_text("living room/temp") == "living%20room/temp"`.
    """
    try:
        topic = quote(text, safe="/")
    except UnicodeEncodeError as e:
        raise InvalidTopic(
            f"text {_shown(text)} cannot be a WEBSMQ topic:"
            f" character {e.start} is a lone surrogate",
            offset=e.start,
        ) from None
    validate_topic(topic)  # still refuses empty and too-long topics
    return topic


def text_from_topic(topic: str) -> str:
    """The text a topic stands for: its escapes decoded as UTF-8 (`%2F` becomes `/` too)."""
    validate_topic(topic)
    try:
        return unquote_to_bytes(topic).decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadEncoding(
            f"WEBSMQ topic {_shown(topic)}: its percent-escapes are not UTF-8 text"
            f" (byte {e.start} of the unescaped topic)"
        ) from None


# --- Header --------------------------------------------------------------------------------------


def encode_header(message_type: int, topic_length: int) -> bytes:
    """The two header bytes for a message type (0-3) and a topic length (0-16383)."""
    if not 0 <= message_type <= 0b11:
        raise UnknownType(f"WEBSMQ message type {message_type!r} does not exist: types are 0-3")
    if not 0 <= topic_length <= MAX_TOPIC_LENGTH:
        raise BadLength(
            f"WEBSMQ topic length {topic_length} does not fit the header: it must be 0-16383"
        )
    return _HEADER.pack(message_type << _TYPE_SHIFT | topic_length)


def _short_frame(size: int) -> TruncatedFrame:
    unit = "byte" if size == 1 else "bytes"
    return TruncatedFrame(
        f"WEBSMQ frame of {size} {unit}: the header needs {HEADER_SIZE}", offset=size
    )


def decode_header(data: bytes | bytearray | memoryview) -> tuple[MessageType, int]:
    """The message type and topic length from the first two bytes of `data`."""
    frame = data if type(data) is bytes else binary(data, "WEBSMQ frame")
    if len(frame) < HEADER_SIZE:
        raise _short_frame(len(frame))
    (header,) = _HEADER.unpack_from(frame)
    return _MESSAGE_TYPES[header >> _TYPE_SHIFT], header & MAX_TOPIC_LENGTH


# --- Frames --------------------------------------------------------------------------------------


def _bad_topic_length(message_type: int, end: int, size: int) -> ProtocolError:
    name = _CLASS_OF_TYPE[message_type].__name__
    if end == HEADER_SIZE:
        return InvalidTopic(
            f"WEBSMQ {name} frame has an empty topic (topic length 0 in the header)", offset=0
        )
    return TruncatedFrame(
        f"WEBSMQ {name} frame: the header announces a topic of {end - HEADER_SIZE} bytes"
        f" but only {size - HEADER_SIZE} follow the header",
        offset=size,
    )


def _bad_topic(message_type: int, raw_topic: bytes) -> InvalidTopic:
    index, why = _topic_problem(raw_topic)
    return InvalidTopic(
        f"WEBSMQ {_CLASS_OF_TYPE[message_type].__name__} frame:"
        f" topic byte at offset {HEADER_SIZE + index}: {why}",
        offset=HEADER_SIZE + index,
    )


def decode(data: bytes | bytearray | memoryview) -> Message:
    """Read one WEBSMQ frame. Raises only ProtocolError subclasses on bad input."""
    frame = data if type(data) is bytes else binary(data, "WEBSMQ frame")
    size = len(frame)
    if size < HEADER_SIZE:
        raise _short_frame(size)
    (header,) = _HEADER.unpack_from(frame)
    message_type = header >> _TYPE_SHIFT
    end = HEADER_SIZE + (header & MAX_TOPIC_LENGTH)
    if end > size or end == HEADER_SIZE:
        raise _bad_topic_length(message_type, end, size)
    raw_topic = frame[HEADER_SIZE:end]
    payload = frame[end:]
    rest = raw_topic.translate(None, _TOPIC_CHARS)
    if rest and not _escapes_valid(raw_topic, rest):
        raise _bad_topic(message_type, raw_topic)
    return _BUILD_OF_TYPE[message_type](raw_topic.decode("ascii"), payload)


def _encode_frame(message_type: int, topic: str, payload: bytes) -> bytes:
    raw = _topic_bytes(topic)
    try:
        return _HEADER.pack(message_type << _TYPE_SHIFT | len(raw)) + raw + payload
    except TypeError:
        if isinstance(payload, memoryview):  # a strided view, which `+` refuses
            return _HEADER.pack(message_type << _TYPE_SHIFT | len(raw)) + raw + payload.tobytes()
        raise InvalidField(
            f"WEBSMQ payload must be bytes, bytearray or memoryview, not {type(payload).__name__}"
        ) from None


def encode(message: Message) -> bytes:
    """The frame for a message; refuses a topic or payload that could not be read back."""
    try:
        message_type = _TYPE_OF_CLASS[type(message)]
    except KeyError:
        raise TypeError(f"not a WEBSMQ message: {message!r}") from None
    return _encode_frame(message_type, message.topic, message.payload)


def encode_publish(topic: str, payload: bytes) -> bytes:
    """`encode(Publish(topic, payload))` without building the message: the broker's fan-out."""
    return _encode_frame(0b00, topic, payload)
