"""The serializer helpers every codec shares (wireproto.codecs.serialization)."""

import json

import pytest

from wireproto import errors
from wireproto.codecs.serialization import (
    json_dumps,
    json_loads,
    json_utf8,
    msgpack_dumps,
    msgpack_loads,
    utf8,
)


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a":-Infinity}'])
def test_json_loads_refuses_non_json_numbers(text):
    with pytest.raises(errors.BadJSON, match="test input"):
        json_loads(text, "test input")


def test_json_loads_survives_deep_nesting():
    with pytest.raises(errors.BadJSON, match="nested too deeply"):
        json_loads("[" * 200_000 + "]" * 200_000, "deep")


def test_json_loads_reports_position():
    with pytest.raises(errors.BadJSON) as info:
        json_loads('{"a":}', "msg")
    assert info.value.offset == 5


def test_json_dumps_is_compact_and_keeps_unicode():
    assert json_dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'
    with pytest.raises(errors.InvalidField):
        json_dumps(float("nan"))
    assert json.loads(json_dumps({"x": 1.5})) == {"x": 1.5}


def test_msgpack_keeps_str_and_bytes_apart():
    assert msgpack_loads(msgpack_dumps(["s", b"b"]), "x") == ["s", b"b"]


@pytest.mark.parametrize("data", [b"\xc1", b"\x92\x01", b"\x01\x02", b"\xd9\x05ab"])
def test_msgpack_loads_raises_protocol_error(data):
    with pytest.raises(errors.ProtocolError, match="payload"):
        msgpack_loads(data, "payload")


def test_msgpack_loads_says_when_nesting_is_too_deep():
    with pytest.raises(errors.BadEncoding, match="payload: msgpack nested too deeply"):
        msgpack_loads(b"\x91" * 100_000 + b"\x00", "payload")


def test_utf8_names_offending_byte():
    with pytest.raises(errors.BadEncoding, match="byte 2") as info:
        utf8(b"ab\xff", "topic")
    assert info.value.offset == 2


def test_unchecked_constructor_builds_equal_frozen_messages():
    from dataclasses import FrozenInstanceError, dataclass, field

    from wireproto.codecs.serialization import unchecked_constructor

    @dataclass(frozen=True, slots=True)
    class Sample:
        topic: str
        body: bytes = b""
        message: str = ""  # field names that a generated constructor's own names could shadow
        cls: str = ""
        flag: bool = field(default=False, kw_only=True)

        def __post_init__(self):
            raise AssertionError("the unchecked constructor must not validate")

    build = unchecked_constructor(Sample)
    made = build("t", b"x", "m", "c", True)
    assert (made.topic, made.body, made.message, made.cls, made.flag) == ("t", b"x", "m", "c", True)
    assert type(made) is Sample
    with pytest.raises(FrozenInstanceError):
        made.topic = "other"
    with pytest.raises(AssertionError):
        Sample("t")


def test_json_utf8_is_utf8_with_lone_surrogates_escaped():
    assert json_utf8({"t": "é"}) == '{"t":"é"}'.encode()
    written = json_utf8(["a\udc00b", "😀"])
    assert written == b'["a\\udc00b","\xf0\x9f\x98\x80"]'
    assert json.loads(written) == ["a\udc00b", "😀"]


def test_json_loads_names_an_integer_too_long_to_read():
    with pytest.raises(errors.BadJSON, match="more than 4300 digits") as info:
        json_loads("[" + "9" * 5000 + "]", "body")
    assert "set_int_max_str_digits" not in info.value.message
