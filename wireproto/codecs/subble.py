"""SubbleSocket 1.0.0, as a sans-IO codec.

Implements SubbleSocket as docs/subblesocket.md describes it. The reference is the C#
`Subble/SocketCommunication` codec; where it and the spec differ, that page's "What we decided"
says which wins, and this module follows it to the byte.

A client connects and sends a handshake request; the server answers with a handshake response.
After that the client produces events (code 27) and the server sends events (26, or 27 when it
echoes an event this client produced) and event errors (51, 52). Every message starts with a
one-byte code. Every "4 + N" field is a little-endian int32 length and N bytes; the value
separator is "1 + N". "Request data" has no length: it is whatever is left of the message, so
SubbleSocket needs a transport that marks where each message ends. All text is UTF-8.

Code 27 means a produce request from a client and an event from a server, so `decode` must be
told who sent the bytes: `decode(data, sender="client")` or `decode(data, sender="server")`.

The codec reads any version; the host decides with `supports_version(request.version)`: a 1.0.0
host accepts 1.0.0 and every client compatible with it (1.0.5, 1.3.0), by the C# SemVersion rule
applied to the client's version.

Handshake request (client)::

    u8 code 1 | u8 major | u8 minor | u8 patch | i32 len + client ID
    | u8 len + value separator | i32 len + subscribe list | i32 len + produce list | request data

Handshake response (server)::

    u8 code (2, 3, 10, 11, 12, 25) | i32 len + message | request data echoed

Produce event (client)::

    u8 code 27 | i32 len + client ID | u8 serialization format | i32 len + event type name
    | i32 len + payload | request data

Event (server)::

    u8 code (26, 27) | u8 serialization format | i64 date time (ms since the Unix epoch, UTC)
    | i32 len + event type name | i32 len + event GUID | i32 len + source name
    | i32 len + payload | request data

Event error (server)::

    u8 code (51, 52) | i32 len + error message | request data echoed
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import IntEnum, StrEnum
from typing import Any, Literal, NamedTuple, final, overload

from wireproto.codecs.serialization import (
    binary,
    json_loads,
    json_utf8,
    msgpack_dumps,
    msgpack_loads,
    unchecked_constructor,
)
from wireproto.errors import (
    BadEncoding,
    BadLength,
    InvalidField,
    InvalidTopic,
    TruncatedFrame,
    UnknownType,
)

__all__ = [
    "MessageCode",
    "HANDSHAKE_RESPONSE_CODES",
    "EVENT_CODES",
    "EVENT_ERROR_CODES",
    "SerializationFormat",
    "Sender",
    "Version",
    "PROTOCOL_VERSION",
    "supports_version",
    "HandshakeRequest",
    "HandshakeResponse",
    "ProduceEvent",
    "Event",
    "EventError",
    "Message",
    "ClientMessage",
    "ServerMessage",
    "encode",
    "decode",
    "datetime_to_ms",
    "pack_payload",
    "unpack_payload",
]


# -- Subble codes -----------------------------------------------------------------------------


class MessageCode(IntEnum):
    """The spec's "Subble codes": 0-25 handshake, 26-100 events."""

    REQUEST_ACCESS = 1
    OK = 2
    OK_NEW_CLIENT_ID = 3
    IP_NOT_ALLOWED = 10
    NEW_CLIENTS_NOT_ALLOWED = 11
    INVALID_CLIENT_ID = 12
    UNKNOWN_HANDSHAKE_ERROR = 25
    SERVER_EVENT = 26
    CLIENT_EVENT = 27
    EVENT_NOT_DECLARED = 51
    UNKNOWN_SERVER_ERROR = 52
    # The C# reference's names for 51 and 52.
    EVENT_FORBIDDEN = 51
    EVENT_ERROR_UNKNOWN = 52


HANDSHAKE_RESPONSE_CODES = frozenset({2, 3, 10, 11, 12, 25})
EVENT_CODES = frozenset({26, 27})
EVENT_ERROR_CODES = frozenset({51, 52})
_CODES = {code.value: code for code in MessageCode}


class SerializationFormat(IntEnum):
    """The payload's serializer. 2 to 50 are reserved; 51 to 255 are the implementor's own."""

    MSGPACK = 0
    JSON = 1


# Index by the format byte: the enum member, None for a reserved value, or the implementor's int.
_FORMATS: tuple[SerializationFormat | int | None, ...] = (
    SerializationFormat.MSGPACK,
    SerializationFormat.JSON,
    *([None] * 49),
    *range(51, 256),
)


class Sender(StrEnum):
    """Who sent the bytes given to `decode`; code 27 means a different message from each side."""

    CLIENT = "client"
    SERVER = "server"


# -- Protocol version -------------------------------------------------------------------------


class Version(NamedTuple):
    """A protocol version; on the wire, one byte each."""

    major: int
    minor: int
    patch: int

    def is_compatible_with(self, other: Version) -> bool:
        """Whether an implementation at this version can serve a peer at `other`.

        C# SemVersion.IsCompatible: the same major, and this minor greater, or the same minor
        with this patch the same or greater. It is not symmetric: `supports_version` calls it on
        the client's version with the host's.
        """
        return self.major == other.major and (
            self.minor > other.minor or (self.minor == other.minor and self.patch >= other.patch)
        )

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


PROTOCOL_VERSION = Version(1, 0, 0)


def supports_version(client: Version, host: Version = PROTOCOL_VERSION) -> bool:
    """Whether a host at `host` accepts a handshake from a client at `client`: the client's
    version compatible with the host's, so a 1.0.0 host accepts 1.0.0, 1.0.5 and 1.3.0 ("1.0.0
    and everything compatible with it"), and refuses 0.9.0 and 2.0.0. A 1.2.3 host
    refuses 1.2.2 and 1.1.x: they may lack what it relies on.
    """
    return client.is_compatible_with(host)


# -- Messages ---------------------------------------------------------------------------------


@final  # so `type(message) is Event` tells the type checker what the message is not
@dataclass(frozen=True, slots=True)
class HandshakeRequest:
    """The client's first message (code 1).

    `subscribe` and `produce` are event type names. An empty `client_id` asks the server to
    generate one.
    """

    version: Version = PROTOCOL_VERSION
    client_id: str = ""
    separator: str = ";"
    subscribe: tuple[str, ...] = ()
    produce: tuple[str, ...] = ()
    request_data: bytes = b""


@final  # so `type(message) is Event` tells the type checker what the message is not
@dataclass(frozen=True, slots=True)
class HandshakeResponse:
    """The server's answer to a handshake request (codes 2, 3, 10, 11, 12, 25).

    With OK_NEW_CLIENT_ID the message is the new client ID.
    """

    code: MessageCode
    message: str = ""
    request_data: bytes = b""


@final  # so `type(message) is Event` tells the type checker what the message is not
@dataclass(frozen=True, slots=True)
class ProduceEvent:
    """A client's request to create an event (code 27 from a client)."""

    client_id: str
    format: SerializationFormat | int
    event_type: str
    payload: bytes
    request_data: bytes = b""


@final  # so `type(message) is Event` tells the type checker what the message is not
@dataclass(frozen=True, slots=True)
class Event:
    """An event sent by the server: 26 for a server event, 27 for this client's own event.

    `datetime_ms` is milliseconds since the Unix epoch, UTC; `.datetime` gives it as an aware
    datetime and `datetime_to_ms` goes the other way.
    """

    code: MessageCode
    format: SerializationFormat | int
    datetime_ms: int
    event_type: str
    guid: str
    source: str
    payload: bytes
    request_data: bytes = b""

    @property
    def datetime(self) -> datetime:
        try:
            return _EPOCH + timedelta(milliseconds=self.datetime_ms)
        except OverflowError:
            raise InvalidField(
                f"SubbleSocket event date time {self.datetime_ms} ms is outside the years "
                "1 to 9999 that a Python datetime can hold"
            ) from None


@final  # so `type(message) is Event` tells the type checker what the message is not
@dataclass(frozen=True, slots=True)
class EventError:
    """The server's answer to a request that failed (51 Event not declared, 52 Unknown)."""

    code: MessageCode
    message: str = ""
    request_data: bytes = b""


Message = HandshakeRequest | HandshakeResponse | ProduceEvent | Event | EventError
# What each side sends.
ClientMessage = HandshakeRequest | ProduceEvent
ServerMessage = HandshakeResponse | Event | EventError

# Decoders build messages from checked values; see unchecked_constructor.
_build_handshake_request = unchecked_constructor(HandshakeRequest)
_build_handshake_response = unchecked_constructor(HandshakeResponse)
_build_produce_event = unchecked_constructor(ProduceEvent)
_build_event = unchecked_constructor(Event)
_build_event_error = unchecked_constructor(EventError)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


def datetime_to_ms(value: datetime) -> int:
    """Milliseconds since the Unix epoch for an aware datetime, floored to the millisecond."""
    if value.utcoffset() is None:
        raise InvalidField("SubbleSocket event date time must be timezone-aware (use UTC)")
    return (value - _EPOCH) // _ONE_MS


# -- Decoding ---------------------------------------------------------------------------------

_I32 = struct.Struct("<i")
_HANDSHAKE_HEAD = struct.Struct("<4B")
_EVENT_HEAD = struct.Struct("<BBq")

_REQUEST = "SubbleSocket handshake request"
_RESPONSE = "SubbleSocket handshake response"
_PRODUCE = "SubbleSocket produce event request"
_EVENT = "SubbleSocket event"
_ERROR = "SubbleSocket event error"

_CLIENT_ID = ("client ID",)
_LISTS = ("subscribe list", "produce list")
_PRODUCE_FIELDS = ("event type name", "payload")
_EVENT_FIELDS = ("event type name", "event GUID", "source name", "payload")
_RESPONSE_MESSAGE = ("response message",)
_ERROR_MESSAGE = ("error message",)


def _bytes(count: int) -> str:
    return f"{count} byte" if count == 1 else f"{count} bytes"


def _fields(data: bytes, at: int, names: tuple[str, ...], where: str) -> tuple[list[bytes], int]:
    """Read consecutive "4 + N" fields from `at`; return their bytes and the offset after them."""
    size = len(data)
    unpack = _I32.unpack_from
    values = []
    for what in names:
        body = at + 4
        if body > size:
            raise TruncatedFrame(
                f"{where}: the {what} length needs 4 bytes but only {_bytes(size - at)} remain",
                offset=at,
            )
        (length,) = unpack(data, at)
        end = body + length
        if length < 0 or end > size:
            raise _length_error(length, at, size - body, what, where)
        values.append(data[body:end])
        at = end
    return values, at


def _length_error(
    length: int, at: int, left: int, what: str, where: str
) -> BadLength | TruncatedFrame:
    if length < 0:
        return BadLength(f"{where}: {what} length {length} is negative", offset=at)
    return TruncatedFrame(
        f"{where}: {what} length {length} but only {_bytes(left)} remain", offset=at
    )


def _utf8_error(raws: list[bytes], at: int, names: tuple[str, ...], where: str) -> BadEncoding:
    """The error for the first of `raws`, "4 + N" fields read from `at`, that is not UTF-8."""
    for raw, what in zip(raws, names, strict=True):
        at += 4
        try:
            raw.decode()
        except UnicodeDecodeError as e:
            return BadEncoding(
                f"{where}: the {what} is not valid UTF-8 at byte {e.start} of the field",
                offset=at + e.start,
            )
        at += len(raw)
    return BadEncoding(f"{where}: a text field is not valid UTF-8")


def _reserved_format(value: int, at: int, where: str) -> InvalidField:
    return InvalidField(
        f"{where}: serialization format {value} is reserved (2 to 50 are kept for the spec)",
        offset=at,
    )


def _decode_handshake_request(data: bytes) -> HandshakeRequest:
    size = len(data)
    if size < 4:
        raise TruncatedFrame(f"{_REQUEST} of {_bytes(size)}: the code and version need 4", offset=0)
    _, major, minor, patch = _HANDSHAKE_HEAD.unpack_from(data)
    raws, at = _fields(data, 4, _CLIENT_ID, _REQUEST)
    try:
        client_id = raws[0].decode()
    except UnicodeDecodeError:
        raise _utf8_error(raws, 4, _CLIENT_ID, _REQUEST) from None
    if at >= size:
        raise TruncatedFrame(
            f"{_REQUEST}: the value separator length needs 1 byte but none remain", offset=at
        )
    length = data[at]
    end = at + 1 + length
    if length == 0:
        raise InvalidField(f"{_REQUEST}: the value separator is empty", offset=at)
    if end > size:
        raise TruncatedFrame(
            f"{_REQUEST}: value separator length {length} but only {_bytes(size - at - 1)} remain",
            offset=at,
        )
    try:
        separator = data[at + 1 : end].decode()
    except UnicodeDecodeError as e:
        raise BadEncoding(
            f"{_REQUEST}: the value separator is not valid UTF-8 at byte {e.start} of the field",
            offset=at + 1 + e.start,
        ) from None
    raws, at = _fields(data, end, _LISTS, _REQUEST)
    try:
        subscribe, produce = raws[0].decode(), raws[1].decode()
    except UnicodeDecodeError:
        raise _utf8_error(raws, end, _LISTS, _REQUEST) from None
    return _build_handshake_request(
        Version(major, minor, patch),
        client_id,
        separator,
        # As the C# reference does (RemoveEmptyEntries), empty names between separators are
        # dropped, so an empty field is an empty list.
        tuple(filter(None, subscribe.split(separator))),
        tuple(filter(None, produce.split(separator))),
        data[at:],
    )


def _decode_produce_event(data: bytes) -> ProduceEvent:
    raws, at = _fields(data, 1, _CLIENT_ID, _PRODUCE)
    try:
        client_id = raws[0].decode()
    except UnicodeDecodeError:
        raise _utf8_error(raws, 1, _CLIENT_ID, _PRODUCE) from None
    if at >= len(data):
        raise TruncatedFrame(
            f"{_PRODUCE}: the serialization format needs 1 byte but none remain", offset=at
        )
    format = _FORMATS[data[at]]
    if format is None:
        raise _reserved_format(data[at], at, _PRODUCE)
    start = at + 1
    raws, at = _fields(data, start, _PRODUCE_FIELDS, _PRODUCE)
    try:
        event_type = raws[0].decode()
    except UnicodeDecodeError:
        raise _utf8_error(raws, start, _PRODUCE_FIELDS, _PRODUCE) from None
    return _build_produce_event(client_id, format, event_type, raws[1], data[at:])


def _decode_handshake_response(data: bytes) -> HandshakeResponse:
    raws, at = _fields(data, 1, _RESPONSE_MESSAGE, _RESPONSE)
    try:
        message = raws[0].decode()
    except UnicodeDecodeError:
        raise _utf8_error(raws, 1, _RESPONSE_MESSAGE, _RESPONSE) from None
    return _build_handshake_response(_CODES[data[0]], message, data[at:])


def _decode_event(data: bytes) -> Event:
    if len(data) < 10:
        raise TruncatedFrame(
            f"{_EVENT} of {_bytes(len(data))}: the code, serialization format and date time "
            "need 10",
            offset=0,
        )
    code, format, datetime_ms = _EVENT_HEAD.unpack_from(data)
    format = _FORMATS[format]
    if format is None:
        raise _reserved_format(data[1], 1, _EVENT)
    raws, at = _fields(data, 10, _EVENT_FIELDS, _EVENT)
    raw_type, raw_guid, raw_source, payload = raws
    try:
        event_type, guid, source = raw_type.decode(), raw_guid.decode(), raw_source.decode()
    except UnicodeDecodeError:
        raise _utf8_error(raws, 10, _EVENT_FIELDS, _EVENT) from None
    return _build_event(
        _CODES[code], format, datetime_ms, event_type, guid, source, payload, data[at:]
    )


def _decode_event_error(data: bytes) -> EventError:
    raws, at = _fields(data, 1, _ERROR_MESSAGE, _ERROR)
    try:
        message = raws[0].decode()
    except UnicodeDecodeError:
        raise _utf8_error(raws, 1, _ERROR_MESSAGE, _ERROR) from None
    return _build_event_error(_CODES[data[0]], message, data[at:])


_FROM_CLIENT: dict[int, Callable[[bytes], Message]] = {
    1: _decode_handshake_request,
    27: _decode_produce_event,
}
_FROM_SERVER: dict[int, Callable[[bytes], Message]] = {
    **dict.fromkeys(HANDSHAKE_RESPONSE_CODES, _decode_handshake_response),
    **dict.fromkeys(EVENT_CODES, _decode_event),
    **dict.fromkeys(EVENT_ERROR_CODES, _decode_event_error),
}
# Sender is a StrEnum, so "client" and Sender.CLIENT find the same entry.
_DECODERS: dict[str, dict[int, Callable[[bytes], Message]]] = {
    Sender.CLIENT: _FROM_CLIENT, Sender.SERVER: _FROM_SERVER,
}
_SENDS = {
    Sender.CLIENT: "1 (handshake request) and 27 (produce event)",
    Sender.SERVER: (
        "2, 3, 10, 11, 12, 25 (handshake response), 26, 27 (event) and 51, 52 (event error)"
    ),
}


@overload
def decode(data: bytes | bytearray | memoryview, *,
           sender: Literal[Sender.CLIENT, "client"]) -> ClientMessage: ...
@overload
def decode(data: bytes | bytearray | memoryview, *,
           sender: Literal[Sender.SERVER, "server"]) -> ServerMessage: ...
@overload
def decode(data: bytes | bytearray | memoryview, *, sender: Sender | str) -> Message: ...
def decode(data: bytes | bytearray | memoryview, *, sender: Sender | str) -> Message:
    """Read one whole SubbleSocket message sent by `sender` ("client" or "server")."""
    decoders = _DECODERS.get(sender)
    if decoders is None:
        raise ValueError(f"sender must be 'client' or 'server', not {sender!r}")
    if type(data) is not bytes:
        data = binary(data, "SubbleSocket")
    if not data:
        raise TruncatedFrame("empty SubbleSocket message: the code needs 1 byte", offset=0)
    decoder = decoders.get(data[0])
    if decoder is None:
        side = Sender(sender)
        raise UnknownType(
            f"SubbleSocket code {data[0]} from a {side}: a {side} sends only {_SENDS[side]}",
            offset=0,
        )
    return decoder(data)


# -- Encoding ---------------------------------------------------------------------------------

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_ALLOWED_FORMATS = frozenset(value for value in range(256) if _FORMATS[value] is not None)
_CODE_PRODUCE = bytes((MessageCode.CLIENT_EVENT,))


def _utf8(text: str, what: str, where: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as e:
        raise BadEncoding(
            f"{where}: the {what} cannot be written as UTF-8 ({e.reason} at character {e.start})"
        ) from None


def _bad_format(format: object, where: str) -> InvalidField:
    return InvalidField(
        f"{where}: serialization format {format} is not allowed "
        "(0 msgpack, 1 JSON, 51 to 255 implementor defined; 2 to 50 are reserved)"
    )


def _bad_code(code: object, allowed: frozenset[int], where: str) -> UnknownType:
    return UnknownType(f"{where}: code {code} is not one of {sorted(allowed)}")


def _names(names: tuple[str, ...], separator: str, what: str) -> bytes:
    if isinstance(names, str):
        raise TypeError(f"{_REQUEST}: the {what} is a tuple of names, not a str")
    for name in names:
        if not name:
            raise InvalidTopic(
                f"{_REQUEST}: the {what} has an empty name, which a reader would drop"
            )
        if separator in name:
            raise InvalidTopic(
                f"{_REQUEST}: the name {name!r} in the {what} contains the value separator "
                f"{separator!r}"
            )
    joined = separator.join(names)
    # A separator of several characters can also appear across a boundary ("a" + "aa" + "b").
    if len(names) > 1 and joined.split(separator) != list(names):
        raise InvalidTopic(
            f"{_REQUEST}: the {what} {list(names)!r} would not read back: a name runs into the "
            f"value separator {separator!r}"
        )
    return _utf8(joined, what, _REQUEST)


def _encode_handshake_request(m: HandshakeRequest) -> list[bytes]:
    version = tuple(m.version)
    if len(version) != 3 or not all(type(n) is int and 0 <= n <= 255 for n in version):
        raise InvalidField(
            f"{_REQUEST}: version {m.version!r} must be 3 numbers from 0 to 255 "
            "(major, minor and patch are 1 byte each)"
        )
    separator = _utf8(m.separator, "value separator", _REQUEST)
    if not 1 <= len(separator) <= 255:
        raise InvalidField(
            f"{_REQUEST}: the value separator is {len(separator)} bytes of UTF-8; "
            "it must be 1 to 255"
        )
    client_id = _utf8(m.client_id, "client ID", _REQUEST)
    subscribe = _names(m.subscribe, m.separator, "subscribe list")
    produce = _names(m.produce, m.separator, "produce list")
    return [
        _HANDSHAKE_HEAD.pack(MessageCode.REQUEST_ACCESS, *version),
        _I32.pack(len(client_id)),
        client_id,
        bytes((len(separator),)),
        separator,
        _I32.pack(len(subscribe)),
        subscribe,
        _I32.pack(len(produce)),
        produce,
        m.request_data,
    ]


def _encode_handshake_response(m: HandshakeResponse) -> list[bytes]:
    if m.code not in HANDSHAKE_RESPONSE_CODES:
        raise _bad_code(m.code, HANDSHAKE_RESPONSE_CODES, _RESPONSE)
    message = _utf8(m.message, "response message", _RESPONSE)
    return [bytes((m.code,)), _I32.pack(len(message)), message, m.request_data]


def _encode_produce_event(m: ProduceEvent) -> list[bytes]:
    if m.format not in _ALLOWED_FORMATS:
        raise _bad_format(m.format, _PRODUCE)
    client_id = _utf8(m.client_id, "client ID", _PRODUCE)
    event_type = _utf8(m.event_type, "event type name", _PRODUCE)
    payload = m.payload
    return [
        _CODE_PRODUCE,
        _I32.pack(len(client_id)),
        client_id,
        bytes((m.format,)),
        _I32.pack(len(event_type)),
        event_type,
        _I32.pack(len(payload)),
        payload,
        m.request_data,
    ]


def _encode_event(m: Event) -> list[bytes]:
    if m.code not in EVENT_CODES:
        raise _bad_code(m.code, EVENT_CODES, _EVENT)
    if m.format not in _ALLOWED_FORMATS:
        raise _bad_format(m.format, _EVENT)
    if type(m.datetime_ms) is not int or not _I64_MIN <= m.datetime_ms <= _I64_MAX:
        raise InvalidField(
            f"{_EVENT}: date time {m.datetime_ms!r} must be an int of milliseconds that fits "
            "in 8 bytes"
        )
    event_type = _utf8(m.event_type, "event type name", _EVENT)
    guid = _utf8(m.guid, "event GUID", _EVENT)
    source = _utf8(m.source, "source name", _EVENT)
    payload = m.payload
    return [
        _EVENT_HEAD.pack(m.code, m.format, m.datetime_ms),
        _I32.pack(len(event_type)),
        event_type,
        _I32.pack(len(guid)),
        guid,
        _I32.pack(len(source)),
        source,
        _I32.pack(len(payload)),
        payload,
        m.request_data,
    ]


def _encode_event_error(m: EventError) -> list[bytes]:
    if m.code not in EVENT_ERROR_CODES:
        raise _bad_code(m.code, EVENT_ERROR_CODES, _ERROR)
    message = _utf8(m.message, "error message", _ERROR)
    return [bytes((m.code,)), _I32.pack(len(message)), message, m.request_data]


_ENCODERS: dict[type, tuple[Callable[[Any], list[bytes]], str]] = {
    HandshakeRequest: (_encode_handshake_request, _REQUEST),
    HandshakeResponse: (_encode_handshake_response, _RESPONSE),
    ProduceEvent: (_encode_produce_event, _PRODUCE),
    Event: (_encode_event, _EVENT),
    EventError: (_encode_event_error, _ERROR),
}


def encode(message: Message) -> bytes:
    """The bytes of one SubbleSocket message; raises ProtocolError for anything the spec forbids."""
    try:
        encoder, where = _ENCODERS[type(message)]
    except KeyError:
        raise TypeError(f"not a SubbleSocket message: {type(message).__name__}") from None
    try:
        return b"".join(encoder(message))
    except struct.error as e:
        # Codes, formats, versions and the date time are checked first, so this is a length.
        raise BadLength(
            f"{where}: a field is longer than the 2147483647 bytes a 4-byte length can announce "
            f"({e})"
        ) from None


# -- Payloads ---------------------------------------------------------------------------------


def pack_payload(value: Any, format: SerializationFormat | int) -> bytes:
    """Serialize an event payload as msgpack (str and bytes kept apart) or compact JSON."""
    if format == SerializationFormat.MSGPACK:
        return msgpack_dumps(value)
    if format == SerializationFormat.JSON:
        return json_utf8(value)
    raise InvalidField(
        f"SubbleSocket payload: serialization format {format} is not one wireproto can write "
        "(0 msgpack, 1 JSON)"
    )


def unpack_payload(data: bytes | bytearray | memoryview, format: SerializationFormat | int) -> Any:
    """Read an event payload written in msgpack or JSON."""
    if format == SerializationFormat.MSGPACK:
        return msgpack_loads(data, "SubbleSocket event payload")
    if format == SerializationFormat.JSON:
        return json_loads(data, "SubbleSocket event payload")
    raise InvalidField(
        f"SubbleSocket payload: serialization format {format} is not one wireproto can read "
        "(0 msgpack, 1 JSON)"
    )
