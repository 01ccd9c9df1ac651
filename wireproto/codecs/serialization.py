"""Serializer helpers shared by the codecs: JSON and msgpack that fail only with ProtocolError.

`what` names the thing being read ("UBRE JSON message", "SubbleSocket event payload"), so the
error says where the problem is.
"""

from __future__ import annotations

import gc
import json
import re
import threading
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeVar

import msgpack
import orjson

from wireproto.errors import BadEncoding, BadJSON, InvalidField, ProtocolError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "DEFAULT_MAX_DOCUMENT_ELEMENTS",
    "DEFAULT_MAX_DOCUMENT_DEPTH",
    "bound_documents",
    "json_dumps",
    "json_loads",
    "json_parse",
    "json_utf8",
    "msgpack_dumps",
    "msgpack_loads",
    "binary",
    "unchecked_constructor",
    "utf8",
]

Dataclass = TypeVar("Dataclass", bound="DataclassInstance")

# JSON goes through orjson (about ten times the standard library's pace). Where orjson's result
# would differ from the standard library's, the standard library answers instead, so values and
# errors are what they always were; docs/performance.md lists the cases.
_ORJSON_OPTIONS = (
    orjson.OPT_PASSTHROUGH_SUBCLASS  # str, int, dict and list subclasses: as the stdlib writes them
    | orjson.OPT_PASSTHROUGH_DATACLASS  # not JSON values: refused, as before
    | orjson.OPT_PASSTHROUGH_DATETIME
)
_orjson_dumps = orjson.dumps
_orjson_loads = orjson.loads
_OrjsonDecodeError = orjson.JSONDecodeError

# orjson reads an integer beyond 64 bits as a float. Such an integer needs a run of at least 19
# digits, which this finds at C speed (valid JSON holds no raw NUL byte).
_DIGITS_AS_NUL = bytes.maketrans(b"0123456789", bytes(10))
_LONG_DIGIT_RUN = bytes(19)


# What one decoded JSON or msgpack document may hold: its values (a map's keys count too) and
# how deep its arrays and maps nest. Each value costs a Python object, and every protocol that
# turns the document into another format walks it; a megabyte of one-byte msgpack values would
# cost a quarter of a second of the broker's only core, and leave as several megabytes of JSON.
DEFAULT_MAX_DOCUMENT_ELEMENTS = 10_000
DEFAULT_MAX_DOCUMENT_DEPTH = 32
_bounds = [DEFAULT_MAX_DOCUMENT_ELEMENTS, DEFAULT_MAX_DOCUMENT_DEPTH]

# msgpack's array and map type bytes (fixarray, fixmap, array 16/32, map 16/32), as 1.
_MSGPACK_CONTAINERS = bytes(
    1 if 0x80 <= byte <= 0x9F or 0xDC <= byte <= 0xDF else 0 for byte in range(256))


def bound_documents(elements: int, depth: int) -> None:
    """Set, for this process, how many values and how deep a nesting every decoded JSON and
    msgpack document may have ([hub] max_document_elements and max_document_depth)."""
    if elements < 1 or depth < 1:
        raise ValueError(f"document bounds must be at least 1, not {elements} and {depth}")
    _bounds[:] = [elements, depth]


def _check_document(value: Any, what: str, error: type[ProtocolError]) -> None:
    """Raise `error` if `value` holds more values, or nests deeper, than the bounds allow. It
    walks one level at a time and stops as soon as a bound is passed."""
    max_elements, max_depth = _bounds
    count, depth, level = 1, 0, [value]
    while level:
        depth += 1
        if depth > max_depth:
            raise error(f"{what}: arrays and maps nested more than {max_depth} deep")
        below: list[Any] = []
        for item in level:
            if type(item) is dict:
                count += 2 * len(item)
                children: Any = item.values()
            else:
                count += len(item)
                children = item
            if count > max_elements:
                raise error(f"{what}: more than {max_elements} values in one document")
            below.extend(child for child in children
                         if type(child) is dict or type(child) is list)
        level = below


# A document this large is decoded with the garbage collector paused: the many containers it
# may make would set off collections (most of the decoding time) that find no cycles to free.
_LARGE = 64 * 1024


def _without_gc(decode: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if not gc.isenabled():
        return decode(*args, **kwargs)
    gc.disable()
    try:
        return decode(*args, **kwargs)
    finally:
        gc.enable()


# A JSON string, escapes and all (bytes and text).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_JSON_STRING_TEXT = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def _refuse_many_json_values(text: str | bytes | bytearray | memoryview, what: str) -> None:
    """BadJSON, before any decoding, for a large JSON text with more values than the bounds
    allow. Outside its strings, each comma and colon of a JSON text stands between two values
    (or a key and its value), so their count is a floor of the document's values."""
    if isinstance(text, str):
        bare = _JSON_STRING_TEXT.sub('""', text)
        separators = bare.count(",") + bare.count(":")
    else:
        bare_bytes = _JSON_STRING.sub(b'""', bytes(text))
        separators = bare_bytes.count(b",") + bare_bytes.count(b":")
    max_elements = _bounds[0]
    if 1 + separators > max_elements:
        raise BadJSON(f"{what}: more than {max_elements} values in one document")


def _json_within_bounds(text: str | bytes | bytearray | memoryview) -> bool:
    """Whether JSON `text` surely keeps the bounds, from its length and punctuation alone:
    every value takes a character, every value after the first follows a comma, colon or
    opening bracket, and each level of nesting needs an opening bracket."""
    max_elements, max_depth = _bounds
    if len(text) <= max_depth:
        return True
    data: Any = text if isinstance(text, str) or type(text) is bytes else bytes(text)
    brackets = ("[", "{", ",", ":") if isinstance(data, str) else (b"[", b"{", b",", b":")
    opens = data.count(brackets[0]) + data.count(brackets[1])
    if opens > max_depth:
        return False
    return len(data) <= max_elements or (
        1 + opens + data.count(brackets[2]) + data.count(brackets[3]) <= max_elements)


def _stdlib_encoder(allow_nan: bool, default: Callable[[Any], Any] | None) -> json.JSONEncoder:
    return json.JSONEncoder(
        ensure_ascii=False, allow_nan=allow_nan, separators=(",", ":"), default=default
    )


_strict_encoder = _stdlib_encoder(False, None)


def _stdlib_dumps(value: Any, allow_nan: bool, default: Callable[[Any], Any] | None) -> str:
    encoder = _strict_encoder if not allow_nan and default is None else _stdlib_encoder(
        allow_nan, default
    )
    try:
        return encoder.encode(value)
    except (TypeError, ValueError, RecursionError) as e:
        raise InvalidField(f"value cannot be written as JSON: {e}") from None


def json_utf8(
    value: Any, *, allow_nan: bool = False, default: Callable[[Any], Any] | None = None
) -> bytes:
    """Compact JSON as UTF-8 bytes, with no NaN or Infinity unless `allow_nan`; non-ASCII stays
    text. `default`, as json.dumps's, turns other objects into JSON values. A lone surrogate
    (JSON can carry one as an escape, and JavaScript peers send them) can stand only inside a
    JSON string, where Python's \\uXXXX backslash escape is exactly JSON's, so it is written as
    that escape."""
    try:
        data = _orjson_dumps(value, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        pass
    else:
        if b"null" not in data:  # orjson writes NaN and Infinity as null
            return data
    return _stdlib_dumps(value, allow_nan, default).encode("utf-8", "backslashreplace")


def json_dumps(
    value: Any, *, allow_nan: bool = False, default: Callable[[Any], Any] | None = None
) -> str:
    """`json_utf8` as text (a lone surrogate stays one)."""
    try:
        data = _orjson_dumps(value, option=_ORJSON_OPTIONS)
    except TypeError:
        pass
    else:
        if b"null" not in data:
            return data.decode("utf-8")
    return _stdlib_dumps(value, allow_nan, default)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_strict_json_decoder = json.JSONDecoder(parse_constant=_reject_constant)


def _may_hold_a_long_integer(text: str | bytes | bytearray | memoryview) -> bool:
    data = text.encode() if isinstance(text, str) else bytes(text)
    return _LONG_DIGIT_RUN in data.translate(_DIGITS_AS_NUL)


def json_loads(text: str | bytes | bytearray | memoryview, what: str) -> Any:
    """Parse JSON, refusing NaN and Infinity and documents past the bounds
    (`bound_documents`), raising BadJSON with `what` in the message."""
    if len(text) >= _LARGE and not _json_within_bounds(text):
        _refuse_many_json_values(text, what)
    try:
        value = _orjson_loads(text) if len(text) < _LARGE else _without_gc(_orjson_loads, text)
    except ValueError:  # orjson.JSONDecodeError is a ValueError
        value = _stdlib_loads(text, what)
    else:
        if len(text) >= 19 and (
            _LONG_DIGIT_RUN in text.translate(_DIGITS_AS_NUL)
            if type(text) is bytes else _may_hold_a_long_integer(text)
        ):
            value = _stdlib_loads(text, what)
    if type(value) is dict or type(value) is list:
        # The common case written out (every UBRE message is a map): a text shorter than the
        # value bound holds fewer values, and one with few brackets nests no deeper.
        max_elements, max_depth = _bounds
        if type(text) is bytes:
            opens = text.count(b"[") + text.count(b"{")
        elif type(text) is str:
            opens = text.count("[") + text.count("{")
        else:
            opens = max_depth + 1
        if (opens > max_depth or len(text) > max_elements) and not _json_within_bounds(text):
            _check_document(value, what, BadJSON)
    return value


def _stdlib_loads(text: str | bytes | bytearray | memoryview, what: str) -> Any:
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = utf8(text, what)
    try:
        return _strict_json_decoder.decode(text)
    except json.JSONDecodeError as e:
        raise BadJSON(f"{what}: invalid JSON at character {e.pos}: {e.msg}", offset=e.pos) from None
    except ValueError as e:
        if "integer string conversion" in str(e):  # Python's guard against huge int parsing
            raise BadJSON(f"{what}: a JSON integer has more than 4300 digits") from None
        raise BadJSON(f"{what}: {e}") from None
    except RecursionError:
        raise BadJSON(f"{what}: JSON nested too deeply") from None


def json_parse(text: str | bytes | bytearray | memoryview) -> Any:
    """`json.loads`, at orjson's pace: NaN and Infinity are read, and errors are json's own
    (ValueError, which UnicodeDecodeError and json.JSONDecodeError are)."""
    try:
        value = _orjson_loads(text)
    except ValueError:
        pass
    else:
        if len(text) < 19 or not _may_hold_a_long_integer(text):
            return value
    return json.loads(bytes(text) if isinstance(text, (bytearray, memoryview)) else text)


# msgpack.packb builds a Packer on every call, which costs as much as packing a small map. One
# Packer per thread is reused instead: a Packer is not safe to share between threads, and it
# empties its buffer when a pack fails. Its buffer keeps the size of the largest value packed,
# so a Packer that grew past its initial size, or failed, is let go.
_packers = threading.local()
_PACKER_BUFFER = 256 * 1024  # msgpack's default buf_size


def msgpack_dumps(value: Any) -> bytes:
    """msgpack with str and bytes kept distinct (use_bin_type)."""
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True, buf_size=_PACKER_BUFFER)
    try:
        packed = packer.pack(value)
    except (TypeError, ValueError, OverflowError) as e:
        del _packers.packer  # it may have grown before it failed
        raise InvalidField(f"value cannot be written as msgpack: {e}") from None
    if len(packed) > _PACKER_BUFFER:
        del _packers.packer
    return packed


def msgpack_loads(data: bytes | bytearray | memoryview, what: str) -> Any:
    """Read exactly one msgpack value, within the bounds (`bound_documents`); str stays str
    and bin stays bytes."""
    max_elements, max_depth = _bounds
    try:
        value = _without_gc(msgpack.unpackb, data, raw=False, strict_map_key=False,
                            max_array_len=max_elements, max_map_len=max_elements) \
            if len(data) >= _LARGE else msgpack.unpackb(
                data, raw=False, strict_map_key=False, max_array_len=max_elements,
                max_map_len=max_elements)
    except msgpack.ExtraData:
        raise BadEncoding(f"{what}: bytes left over after the msgpack value") from None
    except (msgpack.StackError, RecursionError):
        raise BadEncoding(f"{what}: msgpack nested too deeply") from None
    except Exception as e:  # msgpack raises a wide family (FormatError, ValueError...)
        if "exceeds max_" in str(e):
            raise BadEncoding(
                f"{what}: more than {max_elements} values in one document") from None
        raise BadEncoding(f"{what}: invalid msgpack: {e}") from None
    # Every value takes at least a byte, and every level of nesting a container byte.
    if (type(value) is dict or type(value) is list) and len(data) > max_depth and (
            len(data) > max_elements
            or bytes(data).translate(_MSGPACK_CONTAINERS).count(1) > max_depth):
        _check_document(value, what, BadEncoding)
    return value


def binary(data: bytes | bytearray | memoryview, what: str) -> bytes:
    """`data` as bytes, for a codec of a binary protocol.

    Text is bad input (a peer sent a text frame), so it raises BadEncoding; any other type is a
    programming error and raises TypeError. Callers skip the call when `type(data) is bytes`.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        raise BadEncoding(f"{what} is binary: got text (str), not bytes")
    raise TypeError(f"{what} is binary: decode takes bytes, not {type(data).__name__}")


def utf8(data: bytes | bytearray | memoryview, what: str) -> str:
    """Decode UTF-8, raising BadEncoding that names `what` and the offending byte."""
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadEncoding(f"{what} is not valid UTF-8 at byte {e.start}", offset=e.start) from None


def unchecked_constructor(cls: type[Dataclass]) -> Callable[..., Dataclass]:
    """A constructor for a frozen, slotted dataclass that skips `__init__` and `__post_init__`.

    It takes every field positionally, in declaration order (keyword-only fields included). A
    frozen dataclass's `__init__` goes through `object.__setattr__` once per field, which is
    most of a small message's decode time; decoders have already checked what they build, so
    they use this instead. Like dataclasses itself, it compiles the function once with exec.
    """
    names = [f.name for f in fields(cls)]
    # Helper names start with "__" so that no field name can shadow them.
    namespace: dict[str, Any] = {"__new": object.__new__, "__cls": cls}
    lines = [f"def build({', '.join(names)}):", "    __built = __new(__cls)"]
    for name in names:
        namespace[f"__set_{name}"] = getattr(cls, name).__set__  # the slot's descriptor
        lines.append(f"    __set_{name}(__built, {name})")
    lines.append("    return __built")
    exec("\n".join(lines), namespace)
    build = namespace["build"]
    build.__qualname__ = f"unchecked_constructor({cls.__name__})"
    return build
