"""UBRE, pub/sub and request/response messages as JSON or binary and back, sans-IO.

Implements UBRE as docs/ubre.md describes it: the message model, what ubre.js 0.0.23 (the
reference) really sends, and what we decided where the spec is silent.

UBRE has six messages. Three are pub/sub and name a topic; three are request/response and carry
an id. Any of them may carry a body:

    Subscribe(topic)     Publish(topic)      Unsubscribe(topic)
    Request(id)          Success(id)         Fail(id)

JSON message format
-------------------

A JSON message is an object whose one type key holds the topic or the id, with an optional
"body". Requests come in two dialects, and both are read and written:

    {"subscribe":"news"}                      {"publish":"temps","body":{"c":21.5}}
    {"unsubscribe":"news","body":...}         {"request":"unique id","body":...}    (spec form)
    {"request":"add","id":1,"body":[1,2]}     (ubre.js form: a handler name plus an id)
    {"success":1,"body":3}                    {"fail":1,"body":"NotFound"}

A missing "body" (`NO_BODY`) is not a null body (`None`). Ids keep their JSON type, int or str,
because ubre.js matches ids with `===`. Keys other than the type key, "id" and "body" are ignored,
as a lenient peer would. `encode` writes compact JSON, starting with `{` (ubre.js's WebSocket
wrapper drops anything else), with the keys in the order type key, id, body.

Binary message format
---------------------

    +---------+------------------+------------------+---------------+---------------------+
    | type u8 | name length u16  | body length u32  | name (UTF-8)  | body                |
    +---------+------------------+------------------+---------------+---------------------+

Big-endian. The name holds the topic (subscribe, publish, unsubscribe) or the id (request,
success, fail). The type is one of:

    S 0x53 Subscribe   P 0x50 Publish   R 0x52 Request   s 0x73 Success   f 0x66 Fail
    U 0x55 Unsubscribe (a wireproto extension; the spec's table has none)

The spec's table gives 0x63 for fail, a typo for 'f' (decimal 102): 0x63 is read as Fail and
0x66 is always written. Body length 0 means no body. Body length 0xFFFFFFFF means the body streams
to the end of the message (`streaming=True`), which needs a transport that marks message ends.
Binary bodies are bytes and binary ids are text: an int id is written as its decimal digits and
read back as a str.

`decode` tells the formats apart by the first byte: `{` or JSON whitespace is JSON, a binary type
byte is binary; no binary type byte is either. A str is always JSON (a text frame).
"""

from __future__ import annotations

import enum
import reprlib
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wireproto.codecs.serialization import json_loads, json_utf8, unchecked_constructor
from wireproto.errors import (
    BadEncoding,
    BadJSON,
    BadLength,
    FrameTooLarge,
    InvalidField,
    InvalidTopic,
    ProtocolError,
    TruncatedFrame,
    UnknownType,
)

__all__ = [
    "NO_BODY",
    "NoBody",
    "HEADER_SIZE",
    "MAX_NAME_LENGTH",
    "MAX_BODY_LENGTH",
    "STREAMING_BODY_LENGTH",
    "Subscribe",
    "Publish",
    "Unsubscribe",
    "Request",
    "Success",
    "Fail",
    "Message",
    "Id",
    "encode",
    "decode",
    "decode_json",
    "decode_binary_answer",
    "encode_binary_regular",
    "is_json",
]


class NoBody(enum.Enum):
    """The type of `NO_BODY`: a message without a "body", as opposed to a null body."""

    NO_BODY = "NO_BODY"

    def __repr__(self) -> str:
        return "NO_BODY"


NO_BODY = NoBody.NO_BODY

HEADER_SIZE = 7
MAX_NAME_LENGTH = 0xFFFF
STREAMING_BODY_LENGTH = 0xFFFFFFFF
MAX_BODY_LENGTH = STREAMING_BODY_LENGTH - 1

Id = int | str


# Pub/sub ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscribe:
    topic: str
    body: Any = NO_BODY
    streaming: bool = field(default=False, kw_only=True)


@dataclass(frozen=True, slots=True)
class Publish:
    topic: str
    body: Any = NO_BODY
    streaming: bool = field(default=False, kw_only=True)


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    topic: str
    body: Any = NO_BODY
    streaming: bool = field(default=False, kw_only=True)


# Request/response ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """A request; `name` is the ubre.js handler name, None for the spec form (JSON or binary)."""

    id: Id
    body: Any = NO_BODY
    name: str | None = field(default=None, kw_only=True)
    streaming: bool = field(default=False, kw_only=True)


@dataclass(frozen=True, slots=True)
class Success:
    id: Id
    body: Any = NO_BODY
    streaming: bool = field(default=False, kw_only=True)


@dataclass(frozen=True, slots=True)
class Fail:
    id: Id
    body: Any = NO_BODY
    streaming: bool = field(default=False, kw_only=True)


Message = Subscribe | Publish | Unsubscribe | Request | Success | Fail

_TOPIC_TYPES: dict[type, tuple[str, int]] = {
    Subscribe: ("subscribe", 0x53),
    Publish: ("publish", 0x50),
    Unsubscribe: ("unsubscribe", 0x55),
}
_ID_TYPES: dict[type, tuple[str, int]] = {
    Request: ("request", 0x52),
    Success: ("success", 0x73),
    Fail: ("fail", 0x66),
}
_TYPES = _TOPIC_TYPES | _ID_TYPES
_JSON_TYPES: dict[str, type] = {key: cls for cls, (key, _) in _TYPES.items()}
# Decoders build messages from checked values; see unchecked_constructor. Request alone has `name`.
_BUILD: dict[type, Callable[..., Message]] = {
    cls: unchecked_constructor(cls) for cls in _TYPES if cls is not Request
}
_build_request = unchecked_constructor(Request)
_BINARY_TYPES: dict[int, type] = {code: cls for cls, (_, code) in _TYPES.items()}
_BINARY_TYPES[0x63] = Fail  # the spec table's typo for 'f'
_JSON_FIRST_BYTES = frozenset(b"{ \t\n\r")

_HEADER = struct.Struct(">BHI")


# Encoding -----------------------------------------------------------------------------------------


def encode(message: Message, *, binary: bool = False) -> bytes:
    """The message as compact UTF-8 JSON, or in the binary format if `binary`."""
    name: Id
    invalid: type[ProtocolError]
    if isinstance(message, (Subscribe, Publish, Unsubscribe)):
        key, code = _TOPIC_TYPES[type(message)]
        name, what, invalid = message.topic, "topic", InvalidTopic
        if not isinstance(name, str):
            raise InvalidTopic(f"UBRE {key} topic must be a str, got {_describe(name)}")
    elif isinstance(message, (Request, Success, Fail)):
        key, code = _ID_TYPES[type(message)]
        name, what, invalid = message.id, "id", InvalidField
        if not isinstance(name, (int, str)) or isinstance(name, bool):
            raise InvalidField(f"UBRE {key} id must be an int or a str, got {_describe(name)}")
    else:
        raise TypeError(f"not a UBRE message: {message!r}")
    handler = message.name if isinstance(message, Request) else None
    if handler is not None and not isinstance(handler, str):
        raise InvalidField(f"UBRE request handler name must be a str, got {_describe(handler)}")
    if not binary:
        if message.streaming:
            raise InvalidField(f"UBRE {key}: a streaming body exists only in the binary format")
        obj = {key: name} if handler is None else {key: handler, "id": name}
        if message.body is not NO_BODY:
            obj["body"] = message.body
        try:
            return json_utf8(obj)
        except InvalidField as e:
            raise InvalidField(f"UBRE {key}: {e.message}") from None

    if handler is not None:
        raise InvalidField(
            f"UBRE binary request: the name field holds the id, so the handler name "
            f"{reprlib.repr(handler)} cannot be sent; send this request as JSON"
        )
    try:
        name_bytes = (name if isinstance(name, str) else str(int(name))).encode()
    except UnicodeEncodeError as e:
        raise invalid(f"UBRE binary {key} {what} cannot be written as UTF-8: {e.reason}") from None
    if len(name_bytes) > MAX_NAME_LENGTH:
        raise invalid(
            f"UBRE binary {key} {what} of {len(name_bytes)} bytes: the name length field holds "
            f"at most {MAX_NAME_LENGTH}"
        )
    body = message.body
    if body is NO_BODY and not message.streaming:
        return _HEADER.pack(code, len(name_bytes), 0) + name_bytes
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise InvalidField(
            f"UBRE binary {key} body must be bytes, got {type(body).__name__}"
            + ("; a streaming message needs a body, even an empty one" if body is NO_BODY else "")
        )
    if isinstance(body, memoryview) and not body.c_contiguous:
        body = body.tobytes()  # a strided view, which join refuses
    size = body.nbytes if isinstance(body, memoryview) else len(body)
    if message.streaming:
        body_length = STREAMING_BODY_LENGTH
    elif not size:
        raise InvalidField(
            f"UBRE binary {key}: an empty body cannot be sent, since body length 0 means no "
            f"body; use NO_BODY, or streaming=True"
        )
    elif size > MAX_BODY_LENGTH:
        raise FrameTooLarge(
            f"UBRE binary {key} body of {size} bytes: the body length field holds at most "
            f"{MAX_BODY_LENGTH}; send it with streaming=True"
        )
    else:
        body_length = size
    return b"".join((_HEADER.pack(code, len(name_bytes), body_length), name_bytes, body))


def encode_binary_regular(cls: type, name: int | str, body: bytes) -> bytes:
    """`encode(cls(name, body or NO_BODY), binary=True)`, the same bytes, for the hot paths of
    requests and replies (Request, Success, Fail): a str or int id and a bytes body (b"" for
    none), not streaming. What this cannot write goes through `encode`, for its errors."""
    # exactly str or int: a bool id goes through `encode`, which refuses it
    name_bytes: bytes | None = None
    if cls in _ID_TYPES:
        try:
            if type(name) is str:
                name_bytes = name.encode()
            elif type(name) is int:
                name_bytes = str(name).encode()
        except UnicodeEncodeError:
            pass
    if name_bytes is None or len(name_bytes) > MAX_NAME_LENGTH or len(body) > MAX_BODY_LENGTH:
        return encode(cls(name, body or NO_BODY), binary=True)
    return _HEADER.pack(_TYPES[cls][1], len(name_bytes), len(body)) + name_bytes + body


def decode_binary_answer(data: bytes) -> tuple[bool, str, bytes] | None:
    """A regular binary success or fail as (succeeded, id, body), b"" for no body, without
    building the message; None for anything else, which `decode` then reads (or refuses)."""
    if len(data) < HEADER_SIZE:
        return None
    code, name_length, body_length = _HEADER.unpack_from(data)
    name_end = HEADER_SIZE + name_length
    if (code != 0x73 and code != 0x66) or name_end + body_length != len(data) or (
        body_length == STREAMING_BODY_LENGTH
    ):
        return None
    try:
        name = data[HEADER_SIZE:name_end].decode()
    except UnicodeDecodeError:
        return None
    return code == 0x73, name, data[name_end:]


# Decoding -----------------------------------------------------------------------------------------


def decode(data: bytes | bytearray | memoryview | str) -> Message:
    """One message from a whole JSON text or binary message; raises ProtocolError if it is bad."""
    if type(data) is not bytes:
        if isinstance(data, str):
            return _decode_json(data)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"UBRE message must be bytes or str, not {type(data).__name__}")
        data = bytes(data)
    if not data:
        raise TruncatedFrame("UBRE message is empty", offset=0)
    cls = _BINARY_TYPES.get(data[0])
    if cls is not None:
        return _decode_binary(data, cls)
    if data[0] in _JSON_FIRST_BYTES:
        return _decode_json(data)
    raise UnknownType(
        f"UBRE message starts with byte 0x{data[0]:02x}: neither '{{' (JSON) nor a binary "
        f"type (S P R s f U)",
        offset=0,
    )


def decode_json(data: bytes | bytearray | memoryview | str) -> Message:
    """One message from a JSON text only (a WebSocket text frame, a line): a binary-format message
    is refused here."""
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if isinstance(data, bytes) and data[:1] and data[0] in _BINARY_TYPES:
        raise BadJSON(
            f"UBRE message starts with byte 0x{data[0]:02x}, a binary-format type, where only "
            f"JSON can come (a text frame or a line); send the binary format in binary frames "
            f"or with a framing that marks message ends (length32, cobs)"
        )
    return _decode_json(data)


def is_json(data: bytes) -> bool:
    """True if a message that `decode` accepted is in the JSON format."""
    return data[0] in _JSON_FIRST_BYTES


def _decode_json(data: bytes | str) -> Message:
    obj = json_loads(data, "UBRE JSON message")
    if type(obj) is not dict:
        raise BadJSON(f"UBRE JSON message must be an object, got {_describe(obj)}")
    key = None
    for candidate in obj:
        if candidate in _JSON_TYPES:
            if key is not None:
                raise BadJSON(
                    f"UBRE JSON message has two type keys, {key!r} and {candidate!r}: "
                    f"a message has exactly one"
                )
            key = candidate
    if key is None:
        raise UnknownType(
            f"UBRE JSON message has no type key (subscribe, publish, unsubscribe, request, "
            f"success or fail); its keys are {reprlib.repr(list(obj))}"
        )
    cls = _JSON_TYPES[key]
    value = obj[key]
    body = obj.get("body", NO_BODY)
    if cls in _TOPIC_TYPES:
        if type(value) is not str:
            raise BadJSON(f"UBRE JSON {key}: the topic must be a string, got {_describe(value)}")
        return _BUILD[cls](value, body, False)
    if cls is Request and "id" in obj:
        if type(value) is not str:
            raise BadJSON(
                f'UBRE JSON request with an "id": the handler name in "request" must be a '
                f"string, got {_describe(value)}"
            )
        return _build_request(_json_id(obj["id"], "request"), body, value, False)
    if cls is Request:
        return _build_request(_json_id(value, key), body, None, False)
    return _BUILD[cls](_json_id(value, key), body, False)


def _json_id(value: Any, key: str) -> Id:
    if type(value) is int or type(value) is str:
        return value
    raise BadJSON(f"UBRE JSON {key}: the id must be a string or an integer, got {_describe(value)}")


def _decode_binary(data: bytes, cls: type) -> Message:
    try:
        _, name_length, body_length = _HEADER.unpack_from(data)
    except struct.error:
        raise TruncatedFrame(
            f"UBRE binary message of {len(data)} byte(s): the header needs {HEADER_SIZE}",
            offset=len(data),
        ) from None
    name_end = HEADER_SIZE + name_length
    if name_end + body_length != len(data) or body_length == STREAMING_BODY_LENGTH:
        return _decode_irregular_binary(data, cls, name_end, body_length)
    name = _binary_name(data, name_end)
    body = data[name_end:] if body_length else NO_BODY
    if cls is Request:
        return _build_request(name, body, None, False)
    return _BUILD[cls](name, body, False)


def _decode_irregular_binary(data: bytes, cls: type, name_end: int, body_length: int) -> Message:
    """A streaming message, or lengths that disagree with the size of the message."""
    size = len(data)
    if name_end > size:
        raise TruncatedFrame(
            f"UBRE binary message: name length {name_end - HEADER_SIZE} but only "
            f"{size - HEADER_SIZE} bytes follow the header",
            offset=HEADER_SIZE,
        )
    name = _binary_name(data, name_end)
    if body_length == STREAMING_BODY_LENGTH:
        return cls(name, data[name_end:], streaming=True)
    following = size - name_end
    if body_length > following:
        raise TruncatedFrame(
            f"UBRE binary message: body length {body_length} but only {following} bytes follow "
            f"the name",
            offset=name_end,
        )
    raise BadLength(
        f"UBRE binary message: body length {body_length}"
        f"{' (no body)' if body_length == 0 else ''} but {following} bytes follow the name: "
        f"{following - body_length} trailing byte(s) after the body",
        offset=name_end + body_length,
    )


def _binary_name(data: bytes, name_end: int) -> str:
    try:
        return data[HEADER_SIZE:name_end].decode()
    except UnicodeDecodeError as e:
        # Not _common.utf8: the offset should count from the start of the message.
        position = HEADER_SIZE + e.start
        raise BadEncoding(
            f"UBRE binary message: the name is not valid UTF-8 at byte {position}",
            offset=position,
        ) from None


def _describe(value: Any) -> str:
    """A JSON value's type, and the value if it is short, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return f"a string {reprlib.repr(value)}"
    if isinstance(value, int):
        return f"an integer {reprlib.repr(value)}"
    if isinstance(value, float):
        return f"a number {value!r}"
    return type(value).__name__
