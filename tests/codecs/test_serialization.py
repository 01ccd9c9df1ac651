"""The serializer helpers every codec shares (wireproto.codecs.serialization)."""

import json
import threading

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


_msgpack_integers = st.integers(-(2**63), 2**64 - 1)
_msgpack_values = st.recursive(
    st.none() | st.booleans() | _msgpack_integers | st.floats() | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=4) | _msgpack_integers, inner, max_size=4),
    max_leaves=12,
)


@given(_msgpack_values)
def test_msgpack_dumps_writes_what_packb_writes(value):
    assert msgpack_dumps(value) == msgpack.packb(value, use_bin_type=True)


def test_msgpack_dumps_after_a_failure_writes_only_the_next_value():
    with pytest.raises(errors.InvalidField, match="cannot be written as msgpack"):
        msgpack_dumps([b"x" * 1000, object()])  # fails after the bytes went into the buffer
    assert msgpack_dumps([1, 2]) == b"\x92\x01\x02"


def test_msgpack_dumps_after_a_large_value_writes_small_ones_alike():
    large = msgpack_dumps(b"x" * (2 * 1024 * 1024))
    assert msgpack_loads(large, "x") == b"x" * (2 * 1024 * 1024)
    assert msgpack_dumps({"a": 1}) == b"\x81\xa1a\x01"


def test_msgpack_dumps_in_threads_at_once_keeps_each_value_whole():
    values = [[i, "x" * (i % 50), b"y" * (i % 70)] for i in range(400)]
    results: dict[int, list[bytes]] = {}
    start = threading.Barrier(4)

    def pack(worker: int) -> None:
        start.wait()
        results[worker] = [msgpack_dumps(value) for value in values * 20]

    threads = [threading.Thread(target=pack, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = [msgpack.packb(value, use_bin_type=True) for value in values * 20]
    assert all(results[n] == expected for n in range(4))


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


# JSON through orjson keeps what the standard library gave: the same values, the same errors. The
# references below are the standard-library helpers these replaced.

def _stdlib_loads(text, what):
    def reject(name):
        raise ValueError(f"{name} is not JSON")

    if isinstance(text, bytes):
        text = utf8(text, what)
    try:
        return json.JSONDecoder(parse_constant=reject).decode(text)
    except json.JSONDecodeError as e:
        raise errors.BadJSON(f"{what}: invalid JSON at character {e.pos}: {e.msg}") from None
    except ValueError as e:
        raise errors.BadJSON(f"{what}: {e}") from None
    except RecursionError:
        raise errors.BadJSON(f"{what}: JSON nested too deeply") from None


def _outcome(read, text):
    try:
        value = read(text, "body")
    except errors.ProtocolError as e:
        return type(e), e.message
    return "value", repr(value)  # repr tells 1 from 1.0 and -0.0 from 0.0


@pytest.mark.parametrize("text", [
    b'18446744073709551616', b'[-9223372036854775809]', b'{"n":123456789012345678901234567890}',
    b'"id 1234567890123456789012"', b'[1e400]', b'-1e400', b'"\\ud800"', b'["\\udc00x"]',
    b'{"a":1,"a":2}', b' [1] ', b'[1,]', b'"\xff"', b'\xef\xbb\xbf[1]', b'1.5e', b'-0', b'-0.0',
    b'[1E2, 1e-5, 0.1]', b'"\\u0000"', b'"\x01"', b"[" * 1100 + b"]" * 1100, b'', b'nul',
    b'{"a" : [true, false, null]}', b'9223372036854775807', b'18446744073709551615',
])
def test_json_loads_reads_as_the_standard_library_did(text):
    assert _outcome(json_loads, text) == _outcome(_stdlib_loads, text)
    assert _outcome(json_loads, text.decode("utf-8", "replace")) == _outcome(
        _stdlib_loads, text.decode("utf-8", "replace"))


def test_json_loads_keeps_integers_beyond_64_bits_exact():
    assert json_loads(b'[18446744073709551616, -9223372036854775809]', "b") == [
        18446744073709551616, -9223372036854775809]
    assert type(json_loads(b'{"big":100000000000000000000}', "b")["big"]) is int


def test_json_parse_is_json_loads():
    from wireproto.codecs.serialization import json_parse

    for text in [b'[NaN, Infinity]', b'{"a":18446744073709551616}', '"\\ud800"', b'[1.0]']:
        assert repr(json_parse(text)) == repr(json.loads(text))
    for text in [b'[1,]', b'\xff', b'']:
        with pytest.raises(ValueError):
            json_parse(text)
        with pytest.raises(ValueError):
            json.loads(text)


def _nested(depth):
    value = []
    for _ in range(depth):  # deeper than orjson writes
        value = [value]
    return value


class _Text(str):
    pass


class _Number(int):
    def __repr__(self):
        return "not how JSON writes it"


@pytest.mark.parametrize("value", [
    {"a": [1, "é", None, True, 1.5]}, {1: "int key", None: "n", False: "f"}, [2 ** 64],
    [-2 ** 63 - 1],
    {"deep": _nested(300)},
    [_Text("sub"), _Number(7), (1, 2)], ["a\ud800"], "x" * 300, {"null": "null"},
])
def test_json_utf8_writes_the_same_json_values(value):
    written = json_utf8(value)
    today = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    assert json.loads(written) == json.loads(today)
    assert json_dumps(value).encode("utf-8", "backslashreplace") == written


@pytest.mark.parametrize("value", [
    float("nan"), [float("inf")], {"x": -float("inf")}, {1.5j: 1}, b"bytes", {1, 2}, object(),
])
def test_json_utf8_refuses_what_the_standard_library_refused(value):
    with pytest.raises(errors.InvalidField, match="cannot be written as JSON"):
        json_utf8(value)


def test_json_utf8_refuses_dataclasses_and_datetimes_which_orjson_would_write():
    import datetime
    from dataclasses import dataclass

    @dataclass
    class Point:
        x: int

    for value in [Point(1), datetime.datetime(2026, 1, 1), datetime.date(2026, 1, 1)]:
        with pytest.raises(errors.InvalidField):
            json_utf8({"v": value})


def test_json_utf8_refuses_a_circular_value():
    loop = []
    loop.append(loop)
    with pytest.raises(errors.InvalidField, match="Circular"):
        json_utf8(loop)


def test_json_utf8_writes_uuid_and_enum_values_a_decision():
    # orjson writes these, the standard library refused them: docs/performance.md says why this
    # widening stands.
    import enum
    import uuid

    class Colour(enum.Enum):
        RED = "red"

    assert json_utf8([uuid.UUID(int=1), Colour.RED]) == (
        b'["00000000-0000-0000-0000-000000000001","red"]')


def test_json_dumps_with_allow_nan_and_default_is_json_dumps():
    value = {"n": float("nan"), "b": b"raw", "x": [1.5, "é"]}
    assert json_dumps(value, allow_nan=True, default=repr) == json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), default=repr)


def test_json_spells_small_floats_as_javascript_does():
    # The one visible difference from the standard library (which wrote 1e-05): the same value.
    assert json_utf8([1e-05, 1e16, 0.1]) == b"[0.00001,1e+16,0.1]"


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2 ** 70, max_value=2 ** 70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(_json_values, st.data())
def test_json_loads_agrees_with_the_standard_library_on_texts_and_their_mutations(value, data):
    text = json.dumps(value, ensure_ascii=data.draw(st.booleans())).encode("utf-8", "surrogatepass")
    assert _outcome(json_loads, text) == _outcome(_stdlib_loads, text)
    if text:
        at = data.draw(st.integers(0, len(text) - 1))
        mutated = text[:at] + bytes([data.draw(st.integers(0, 255))]) + text[at + 1:]
        assert _outcome(json_loads, mutated) == _outcome(_stdlib_loads, mutated)


@settings(max_examples=400, deadline=None)
@given(_json_values)
def test_json_utf8_round_trips_every_value(value):
    assert json_loads(json_utf8(value), "v") == value


def _nested(depth):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


DOCUMENTS_WITHIN = [[1] * 9999, [[1]] * 4999, {f"k{n}": n for n in range(4999)}, _nested(32)]
DOCUMENTS_PAST = [([1] * 10_000, "more than 10000 values"),
                  ([[1]] * 5000, "more than 10000 values"),
                  ({f"k{n}": n for n in range(5000)}, "more than 10000 values"),
                  ([list(range(100))] * 9000, "more than 10000 values"),
                  (_nested(33), "arrays and maps nested more than 32 deep")]


@pytest.mark.parametrize("document", DOCUMENTS_WITHIN)
def test_documents_within_the_bounds_are_read_in_every_form(document):
    text = json.dumps(document)
    assert json_loads(text, "doc") == json_loads(text.encode(), "doc") == document
    assert msgpack_loads(msgpack.packb(document), "doc") == document


@pytest.mark.parametrize("document, why", DOCUMENTS_PAST)
def test_documents_past_the_bounds_are_refused_in_every_form(document, why):
    text = json.dumps(document)
    for data in (text, text.encode()):
        with pytest.raises(errors.BadJSON, match=f"doc: {why}"):
            json_loads(data, "doc")
    with pytest.raises(errors.BadEncoding, match=f"doc: {why}"):
        msgpack_loads(msgpack.packb(document), "doc")


def test_commas_and_colons_inside_strings_do_not_count_as_values():
    document = {f"key {n}": 'a, b: "c", {d: [e]}' * 20 for n in range(3000)}
    text = json.dumps(document)
    assert len(text) > 64 * 1024 and text.count(",") > 10_000
    assert json_loads(text, "doc") == json_loads(text.encode(), "doc") == document


def test_the_bounds_are_the_process_settings():
    from wireproto.codecs.serialization import (
        DEFAULT_MAX_DOCUMENT_DEPTH,
        DEFAULT_MAX_DOCUMENT_ELEMENTS,
        bound_documents,
    )

    try:
        bound_documents(20_000, 40)
        assert len(json_loads(json.dumps([1] * 15_000), "doc")) == 15_000
        assert msgpack_loads(msgpack.packb(_nested(40)), "doc") == _nested(40)
        with pytest.raises(ValueError):
            bound_documents(0, 40)
    finally:
        bound_documents(DEFAULT_MAX_DOCUMENT_ELEMENTS, DEFAULT_MAX_DOCUMENT_DEPTH)
    with pytest.raises(errors.BadJSON):
        json_loads(json.dumps([1] * 15_000), "doc")
