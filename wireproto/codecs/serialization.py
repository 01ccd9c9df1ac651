"""Serializer helpers shared by the codecs: JSON and msgpack that fail only with ProtocolError.

`what` names the thing being read ("UBRE JSON message", "SubbleSocket event payload"), so the
error says where the problem is.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

import msgpack
import orjson

from wireproto.errors import BadEncoding, BadJSON, InvalidField

__all__ = [
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

T = TypeVar("T")

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
    data = text.encode() if type(text) is str else bytes(text)
    return _LONG_DIGIT_RUN in data.translate(_DIGITS_AS_NUL)


def json_loads(text: str | bytes | bytearray | memoryview, what: str) -> Any:
    """Parse JSON, refusing NaN and Infinity, raising BadJSON with `what` in the message."""
    try:
        value = _orjson_loads(text)
    except ValueError:  # orjson.JSONDecodeError is a ValueError
        return _stdlib_loads(text, what)
    if len(text) < 19 or (
        _LONG_DIGIT_RUN not in text.translate(_DIGITS_AS_NUL)
        if type(text) is bytes else not _may_hold_a_long_integer(text)
    ):
        return value
    return _stdlib_loads(text, what)


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


def msgpack_loads(data: bytes, what: str) -> Any:
    """Read exactly one msgpack value; str stays str and bin stays bytes."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except msgpack.ExtraData:
        raise BadEncoding(f"{what}: bytes left over after the msgpack value") from None
    except (msgpack.StackError, RecursionError):
        raise BadEncoding(f"{what}: msgpack nested too deeply") from None
    except Exception as e:  # msgpack raises a wide family (FormatError, ValueError...)
        raise BadEncoding(f"{what}: invalid msgpack: {e}") from None


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


def unchecked_constructor(cls: type[T]) -> Callable[..., T]:
    """A constructor for a frozen, slotted dataclass that skips `__init__` and `__post_init__`.

    It takes every field positionally, in declaration order (keyword-only fields included). A
    frozen dataclass's `__init__` goes through `object.__setattr__` once per field, which is
    most of a small message's decode time; decoders have already checked what they build, so
    they use this instead. Like dataclasses itself, it compiles the function once with exec.
    """
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
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
