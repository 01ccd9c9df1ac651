"""nydus-protocol 3.0.0: the nydus RPC and pub-sub message format, sans-IO.

Implements nydus as docs/nydus.md describes it ("The message model", "What we decided"), and
mirrors what the reference `nydus-protocol` 3.0.0 (npm) really does wherever the spec is silent.

A nydus message is one string, carried as one Engine.IO text packet::

    <type>[$<id>][~<path>]|[data]

- `type` is one character, `0` WELCOME, `1` INVOKE, `2` RESULT, `3` ERROR or `4` PUBLISH.
- `id` follows `$`: 1 to 32 characters matching `/^[A-z0-9-]+$/`, where JavaScript's `A-z` is
  the ASCII range 0x41..0x7A and so takes in ``[\\]^_`` and the backtick too.
- `path` follows `~`: an HTTP-like path, written as JavaScript's encodeURI writes it (at most
  1024 characters that way) and read as decodeURI reads it, which leaves the escapes of
  ``;/?:@&=+$,#`` alone: `/p%2Fq%20r%3F` reads as `/p%2Fq r%3F`.
- `data` follows `|`: compact JSON, or nothing at all. Nothing (`2$id|`) is not JSON null
  (`2$id|null`): nothing decodes to `NO_DATA`, null to `None`.

Which sections each type carries:

=========  ==========  ========  =========  ===================================
type       id          path      data       direction
=========  ==========  ========  =========  ===================================
WELCOME    no          no        3          server -> client, on connect
INVOKE     yes         yes       optional   client -> server
RESULT     yes         no        optional   server -> client, answers an INVOKE
ERROR      yes         no        optional   server -> client, answers an INVOKE
PUBLISH    no          yes       optional   server -> client
=========  ==========  ========  =========  ===================================

Where nydus-protocol returns its PARSER_ERROR message, `decode` raises a `ProtocolError`
subclass that says why; so does a malformed percent-escape, which makes the JavaScript decoder
throw. `encode` refuses what `decode` would refuse, so nothing invalid goes on the wire.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from wireproto.codecs.serialization import json_dumps, json_loads, unchecked_constructor, utf8
from wireproto.errors import (
    BadEncoding,
    BadJSON,
    InvalidField,
    InvalidTopic,
    TruncatedFrame,
    UnknownType,
)

__all__ = [
    "PROTOCOL_VERSION",
    "MAX_ID_LENGTH",
    "MAX_PATH_LENGTH",
    "NO_DATA",
    "NoData",
    "Welcome",
    "Invoke",
    "Result",
    "Error",
    "Publish",
    "Message",
    "encode",
    "decode",
]

PROTOCOL_VERSION: Final = 3
"""The version a WELCOME carries; nydus-protocol 3.0.0 refuses a WELCOME with any other."""

MAX_ID_LENGTH: Final = 32
MAX_PATH_LENGTH: Final = 1024
"""Counted on the wire (percent-encoded) in UTF-16 code units, as JavaScript counts."""


class NoData(enum.Enum):
    """The type of `NO_DATA`: a message whose data section is empty (JavaScript's undefined)."""

    NO_DATA = "NO_DATA"

    def __repr__(self) -> str:
        return "NO_DATA"

    def __bool__(self) -> bool:
        return False


NO_DATA: Final = NoData.NO_DATA


# -- Messages ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Welcome:
    """`0|3`: the server greets a client that has just connected."""

    data: int = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class Invoke:
    """`1$id~path|data`: the client calls the procedure at `path`."""

    id: str
    path: str
    data: Any = NO_DATA


@dataclass(frozen=True, slots=True)
class Result:
    """`2$id|data`: the answer to the INVOKE with the same id."""

    id: str
    data: Any = NO_DATA


@dataclass(frozen=True, slots=True)
class Error:
    """`3$id|data`: the INVOKE with the same id failed; data is conventionally
    `{"message": ..., "status": ...[, "body": ...]}`."""

    id: str
    data: Any = NO_DATA


@dataclass(frozen=True, slots=True)
class Publish:
    """`4~path|data`: an event the server pushes about the resource at `path`."""

    path: str
    data: Any = NO_DATA


Message = Welcome | Invoke | Result | Error | Publish

# Decoders build messages from checked values; see unchecked_constructor.
_build_invoke = unchecked_constructor(Invoke)
_build_result = unchecked_constructor(Result)
_build_error = unchecked_constructor(Error)
_build_publish = unchecked_constructor(Publish)

_NAMES: Final = ("WELCOME", "INVOKE", "RESULT", "ERROR", "PUBLISH")
_KINDS: Final = {str(code): code for code in range(len(_NAMES))}
# Which sections each type must carry (True) or must not carry (False); nothing is optional.
_HAS_ID: Final = (False, True, True, True, False)
_HAS_PATH: Final = (False, True, False, False, True)
_DATA_WHAT: Final = tuple(f"nydus {name} data" for name in _NAMES)

_ID_CHARS: Final = r"0-9A-z-"  # A-z as in JavaScript: 0x41..0x7A, with [\]^_ and backtick
_ID: Final = re.compile(rf"[{_ID_CHARS}]{{1,{MAX_ID_LENGTH}}}")
_NOT_ID_CHAR: Final = re.compile(rf"[^{_ID_CHARS}]")

# encodeURI leaves these as they are and percent-encodes everything else as UTF-8.
_URI_KEPT: Final = ";,/?:@&=+$-_.!~*'()#"
_URI_UNESCAPED: Final = re.compile(r"[A-Za-z0-9;,/?:@&=+$\-_.!~*'()#]+")
# decodeURI leaves the escapes of these alone.
_URI_RESERVED: Final = frozenset(";/?:@&=+$,#")
_ESCAPE_RUN: Final = re.compile(r"(?:%[0-9A-Fa-f]{2})+")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


# -- Encoding ------------------------------------------------------------------------------------


def encode(message: Message) -> str:
    """The nydus string for `message`, ready to send as one Engine.IO text packet.

    Raises InvalidField for an id outside `/^[A-z0-9-]+$/` or 1..32 characters, for data that is
    not JSON, or for a WELCOME that does not carry `PROTOCOL_VERSION`; InvalidTopic for an empty
    path, one longer than 1024 characters once encoded, or one with a lone surrogate.
    """
    if type(message) is Result:
        return f"2${_check_id(message.id, 2)}|{_encode_data(message.data, 2)}"
    if type(message) is Publish:
        return f"4~{_encode_path(message.path, 4)}|{_encode_data(message.data, 4)}"
    if type(message) is Invoke:
        return (
            f"1${_check_id(message.id, 1)}~{_encode_path(message.path, 1)}"
            f"|{_encode_data(message.data, 1)}"
        )
    if type(message) is Error:
        return f"3${_check_id(message.id, 3)}|{_encode_data(message.data, 3)}"
    if type(message) is Welcome:
        if message.data != PROTOCOL_VERSION:
            raise InvalidField(
                f"nydus WELCOME carries the protocol version {PROTOCOL_VERSION}, "
                f"not {message.data!r}"
            )
        return f"0|{PROTOCOL_VERSION}"
    raise TypeError(f"nydus cannot encode {type(message).__name__}: not a nydus message")


def _check_id(id_: Any, kind: int) -> str:
    if isinstance(id_, str) and _ID.fullmatch(id_):
        return id_
    raise InvalidField(f"nydus {_NAMES[kind]} id {id_!r}: {_id_problem(id_)}")


def _encode_path(path: Any, kind: int) -> str:
    if not isinstance(path, str) or not path:
        raise InvalidTopic(f"nydus {_NAMES[kind]} path {path!r}: a path is a non-empty str")
    if _URI_UNESCAPED.fullmatch(path):
        encoded = path
    else:
        try:
            encoded = _encode_uri(path)
        except UnicodeEncodeError:
            raise InvalidTopic(
                f"nydus {_NAMES[kind]} path {path!r} holds a lone surrogate, which cannot be "
                "percent-encoded (JavaScript's encodeURI throws URIError)"
            ) from None
    if len(encoded) > MAX_PATH_LENGTH:
        raise InvalidTopic(
            f"nydus {_NAMES[kind]} path is {len(encoded)} characters long once encoded; "
            f"at most {MAX_PATH_LENGTH}"
        )
    return encoded


def _encode_uri(path: str) -> str:
    try:
        return quote(path, safe=_URI_KEPT)
    except UnicodeEncodeError:
        return quote(_join_surrogate_pairs(path), safe=_URI_KEPT)


def _encode_data(data: Any, kind: int) -> str:
    if data is NO_DATA:
        return ""
    try:
        text = json_dumps(data)
    except InvalidField as e:
        raise InvalidField(f"nydus {_NAMES[kind]} data: {e}") from None
    # JSON.stringify escapes lone surrogates; raw, they could not be sent as UTF-8 at all.
    if not text.isascii() and _SURROGATE.search(text):
        text = _SURROGATE.sub(_escape_surrogate, _join_surrogate_pairs(text))
    return text


def _join_surrogate_pairs(text: str) -> str:
    """A surrogate pair held as two code points is one character, as it is to JavaScript."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _escape_surrogate(match: re.Match[str]) -> str:
    return f"\\u{ord(match[0]):04x}"


# -- Decoding ------------------------------------------------------------------------------------


def decode(data: str | bytes | bytearray | memoryview) -> Message:
    """The message in one nydus string (or its UTF-8 bytes).

    Raises a ProtocolError subclass wherever nydus-protocol returns PARSER_ERROR or throws:
    TruncatedFrame (too short, or no `|`), UnknownType (type not 0..4), InvalidField (a bad id,
    a section the type must or must not have, a WELCOME for another protocol version),
    InvalidTopic (a bad path), BadEncoding (not UTF-8, or a path's escapes are not UTF-8) or
    BadJSON. `offset` is the character position in the message (the byte, for bad UTF-8).
    """
    text = data if type(data) is str else _as_text(data)
    size = len(text)
    if size < 2:
        raise TruncatedFrame(
            f"nydus message {_excerpt(text)} is too short: it needs at least a type and '|'",
            offset=size,
        )
    kind = _KINDS.get(text[0])
    if kind is None:
        raise UnknownType(
            f"nydus message {_excerpt(text)} has unknown type {text[0]!r}: the types are "
            "0 WELCOME, 1 INVOKE, 2 RESULT, 3 ERROR and 4 PUBLISH",
            offset=0,
        )
    marker = text[1]
    id_ = path = None
    start = 2
    if marker == "$":
        bar = _find_bar(text, kind)
        end = text.find("~", 2, bar)
        if end < 0:
            end = bar
        id_ = text[2:end]
        if not _ID.fullmatch(id_):
            raise _bad_id(text, kind, id_)
        marker = text[end]
        start = end + 1
    if marker == "~":
        bar = _find_bar(text, kind)
        path = _decode_path(text, kind, start, bar)
        start = bar + 1
    elif marker != "|":
        raise InvalidField(
            f"nydus {_NAMES[kind]} message {_excerpt(text)}: after the type comes '$' (id), "
            f"'~' (path) or '|' (data), not {marker!r}",
            offset=1,
        )
    if (id_ is not None) != _HAS_ID[kind] or (path is not None) != _HAS_PATH[kind]:
        raise _bad_sections(text, kind, id_, path)

    body = NO_DATA
    if start < size:
        try:
            body = json_loads(text[start:], _DATA_WHAT[kind])
        except BadJSON as e:
            raise BadJSON(
                f"{e.message} (the data starts at character {start})",
                offset=None if e.offset is None else start + e.offset,
            ) from None

    if kind == 1:
        return _build_invoke(id_, path, body)
    if kind == 2:
        return _build_result(id_, body)
    if kind == 4:
        return _build_publish(path, body)
    if kind == 3:
        return _build_error(id_, body)
    if body != PROTOCOL_VERSION:
        raise InvalidField(
            f"nydus WELCOME {_excerpt(text)} is for protocol version {body!r}; this codec "
            f"speaks version {PROTOCOL_VERSION}",
            offset=start,
        )
    return Welcome(PROTOCOL_VERSION)


def _as_text(data: Any) -> str:
    if isinstance(data, str):  # a subclass of str
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        return utf8(data, "nydus message")
    raise TypeError(f"nydus message must be str or UTF-8 bytes, not {type(data).__name__}")


def _find_bar(text: str, kind: int) -> int:
    bar = text.find("|", 2)
    if bar < 0:
        section = "path" if "~" in text else "id"
        raise TruncatedFrame(
            f"nydus {_NAMES[kind]} message {_excerpt(text)} ends inside its {section}: "
            "no '|' before the data",
            offset=len(text),
        )
    return bar


def _decode_path(text: str, kind: int, start: int, end: int) -> str:
    raw = text[start:end]
    if not raw:
        raise InvalidTopic(
            f"nydus {_NAMES[kind]} message {_excerpt(text)}: empty path after '~'",
            offset=start,
        )
    length = len(raw) if raw.isascii() else len(raw.encode("utf-16-le", "surrogatepass")) // 2
    if length > MAX_PATH_LENGTH:
        raise InvalidTopic(
            f"nydus {_NAMES[kind]} path is {length} characters long; at most {MAX_PATH_LENGTH}",
            offset=start,
        )
    if "%" not in raw:
        return raw
    return _decode_uri(raw, kind, start)


def _decode_uri(raw: str, kind: int, start: int) -> str:
    """JavaScript's decodeURI: escapes of reserved characters stay as written (case too)."""
    pieces = []
    done = 0
    for run in _ESCAPE_RUN.finditer(raw):
        _check_no_stray_percent(raw, done, run.start(), kind, start)
        pieces.append(raw[done : run.start()])
        pieces.append(_decode_escapes(run[0], raw, kind, start + run.start()))
        done = run.end()
    _check_no_stray_percent(raw, done, len(raw), kind, start)
    pieces.append(raw[done:])
    return "".join(pieces)


def _check_no_stray_percent(raw: str, begin: int, end: int, kind: int, start: int) -> None:
    stray = raw.find("%", begin, end)
    if stray >= 0:
        raise InvalidTopic(
            f"nydus {_NAMES[kind]} path {_excerpt(raw)}: '%' at character {start + stray} "
            "does not start a %XX escape",
            offset=start + stray,
        )


def _decode_escapes(run: str, raw: str, kind: int, offset: int) -> str:
    octets = bytes.fromhex(run.replace("%", ""))
    pieces = []
    i = 0
    while i < len(octets):
        lead = octets[i]
        if lead < 0x80:
            char = chr(lead)
            pieces.append(run[3 * i : 3 * i + 3] if char in _URI_RESERVED else char)
            i += 1
            continue
        # The leading 1 bits of the first byte say how many bytes the character takes.
        width = 2 if lead & 0xE0 == 0xC0 else 3 if lead & 0xF0 == 0xE0 else 4
        try:
            pieces.append(octets[i : i + width].decode("utf-8"))
        except UnicodeDecodeError:
            escapes = run[3 * i : 3 * (i + width)]
            raise BadEncoding(
                f"nydus {_NAMES[kind]} path {_excerpt(raw)}: the escapes {escapes} at "
                f"character {offset + 3 * i} do not encode a valid UTF-8 character",
                offset=offset + 3 * i,
            ) from None
        i += width
    return "".join(pieces)


# -- Error messages (off the hot path) -----------------------------------------------------------


def _excerpt(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def _id_problem(id_: Any) -> str:
    if not isinstance(id_, str):
        return f"an id is a str, not {type(id_).__name__}"
    if not id_:
        return f"an id is 1 to {MAX_ID_LENGTH} characters, and this one is empty"
    if len(id_) > MAX_ID_LENGTH:
        return f"an id is 1 to {MAX_ID_LENGTH} characters, and this one has {len(id_)}"
    bad = _NOT_ID_CHAR.search(id_)
    assert bad is not None
    return (
        f"{bad[0]!r} at character {bad.start()} is not allowed; ids match /^[A-z0-9-]+$/ "
        "(letters, digits, '-', and [\\]^_` from JavaScript's A-z range)"
    )


def _bad_id(text: str, kind: int, id_: str) -> InvalidField:
    bad = _NOT_ID_CHAR.search(id_)
    return InvalidField(
        f"nydus {_NAMES[kind]} message {_excerpt(text)}: id {_excerpt(id_)}: {_id_problem(id_)}",
        offset=2 if bad is None else 2 + bad.start(),
    )


def _bad_sections(text: str, kind: int, id_: str | None, path: str | None) -> InvalidField:
    name = _NAMES[kind]
    if (id_ is not None) != _HAS_ID[kind]:
        rule = "needs an id ('$')" if _HAS_ID[kind] else "takes no id"
    else:
        rule = "needs a path ('~')" if _HAS_PATH[kind] else "takes no path"
    return InvalidField(f"nydus {name} message {_excerpt(text)}: {name} {rule}", offset=1)
