"""UBRE codec: the spec's and NOTES.md's examples, what ubre.js 0.0.23 sends, round trips, fuzzing
and every error path."""

import enum
import json
import mmap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wireproto.codecs import ubre
from wireproto.codecs.ubre import (
    NO_BODY,
    Fail,
    Publish,
    Request,
    Subscribe,
    Success,
    Unsubscribe,
    decode,
    encode,
)
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

h = bytes.fromhex

# --- Vectors: NOTES.md, binary ----------------------------------------------------------------

BINARY_VECTORS = [
    # NOTES.md: subscribe "news"
    (h("53 0004 00000000 6e657773"), Subscribe("news")),
    # NOTES.md: publish "temps" with body {"c":21.5}
    (h("50 0005 0000000a 74656d7073 7b2263223a32312e357d"), Publish("temps", b'{"c":21.5}')),
    # NOTES.md: streaming publish "log"; the body is whatever follows the name
    (h("50 0003 ffffffff 6c6f67") + b"line 1\nline 2\n",
     Publish("log", b"line 1\nline 2\n", streaming=True)),
    (h("50 0003 ffffffff 6c6f67"), Publish("log", b"", streaming=True)),
    # the name holds the id for request, success and fail
    (h("52 0001 00000005 31 5b312c325d"), Request("1", b"[1,2]")),
    (h("73 0001 00000001 31 33"), Success("1", b"3")),
    (h("66 0001 00000008 31 4e6f74466f756e64"), Fail("1", b"NotFound")),
    (h("66 0002 00000000 6964"), Fail("id")),
    # U 0x55: wireproto's unsubscribe extension
    (h("55 0004 00000000 6e657773"), Unsubscribe("news")),
    # names are UTF-8
    (h("53 0002 00000000 c3a9"), Subscribe("\u00e9")),
    (h("53 0000 00000000"), Subscribe("")),
]


@pytest.mark.parametrize(("wire", "message"), BINARY_VECTORS)
def test_binary_vector_decodes(wire, message):
    assert decode(wire) == message


@pytest.mark.parametrize(("wire", "message"), BINARY_VECTORS)
def test_binary_vector_encodes(wire, message):
    assert encode(message, binary=True) == wire


def test_binary_fail_with_the_spec_tables_0x63_is_read_and_answered_with_0x66():
    assert decode(h("63 0001 00000001 37 78")) == Fail("7", b"x")
    assert encode(decode(h("63 0001 00000001 37 78")), binary=True) == h("66 0001 00000001 37 78")


def test_binary_int_id_is_written_as_decimal_text_and_read_back_as_str():
    assert encode(Success(42, b"ok"), binary=True) == h("73 0002 00000002 3432 6f6b")
    assert encode(Fail(-1), binary=True) == h("66 0002 00000000 2d31")
    assert decode(encode(Request(7, b"x"), binary=True)).id == "7"


def test_binary_body_may_be_bytearray_or_memoryview_and_decodes_to_bytes():
    wire = h("50 0001 00000002 74 6162")
    assert encode(Publish("t", bytearray(b"ab")), binary=True) == wire
    assert encode(Publish("t", memoryview(b"ab")), binary=True) == wire
    assert type(decode(bytearray(wire)).body) is bytes
    assert decode(memoryview(wire)) == Publish("t", b"ab")


def test_binary_body_may_be_a_strided_memoryview():
    wire = h("50 0001 00000002 74 6162")
    assert encode(Publish("t", memoryview(b"axbx")[::2]), binary=True) == wire
    assert decode(memoryview(bytes(b for byte in wire for b in (byte, 0)))[::2]) == Publish(
        "t", b"ab"
    )


# --- Vectors: the spec's JSON examples, as printed there (indented) -----------------------------

SPEC_JSON = [
    ('{\n    "subscribe": "some topic"\n}', Subscribe("some topic"),
     b'{"subscribe":"some topic"}'),
    ('{\n    "publish": "some topic",\n    "body": "some topic data"\n}',
     Publish("some topic", "some topic data"),
     b'{"publish":"some topic","body":"some topic data"}'),
    ('{\n    "unsubscribe": "some topic"\n}', Unsubscribe("some topic"),
     b'{"unsubscribe":"some topic"}'),
    ('{\n    "request": "unique id",\n    "body": "some request body"\n}',
     Request("unique id", "some request body"),
     b'{"request":"unique id","body":"some request body"}'),
    ('{\n    "success": "id",\n    "body": "some success data"\n}',
     Success("id", "some success data"), b'{"success":"id","body":"some success data"}'),
    ('{\n    "fail": "id",\n    "body": "some fail data"\n}', Fail("id", "some fail data"),
     b'{"fail":"id","body":"some fail data"}'),
    # ubre.js's own UBRE.md shows the named form
    ('{\n    "request": "some request",\n    "id": "uniqueid",\n    "body": "some request body"\n}',
     Request("uniqueid", "some request body", name="some request"),
     b'{"request":"some request","id":"uniqueid","body":"some request body"}'),
]


@pytest.mark.parametrize(("text", "message", "compact"), SPEC_JSON)
def test_spec_json_example(text, message, compact):
    assert decode(text) == message
    assert decode(text.encode()) == message  # bytes that start with "{"
    assert encode(message) == compact


# --- Vectors: exactly what ubre.js 0.0.23 sent (captured with node, see docs/ubre.md) ----------

UBREJS_JSON = [
    (b'{"subscribe":"news"}', Subscribe("news")),
    (b'{"subscribe":"news","body":{"since":5}}', Subscribe("news", {"since": 5})),
    (b'{"unsubscribe":"news","body":{"since":5}}', Unsubscribe("news", {"since": 5})),
    (b'{"request":"add","id":1,"body":[1,2]}', Request(1, [1, 2], name="add")),
    (b'{"request":"ping","id":2}', Request(2, name="ping")),
    (b'{"request":"x","id":"abc","body":null}', Request("abc", None, name="x")),
    (b'{"fail":2,"body":"NotFound"}', Fail(2, "NotFound")),
    (b'{"success":1,"body":3}', Success(1, 3)),
    (b'{"success":"s3"}', Success("s3")),
    (b'{"success":4,"body":null}', Success(4, None)),
    (b'{"fail":5,"body":{"name":"TypeError","message":"bad"}}',
     Fail(5, {"name": "TypeError", "message": "bad"})),
    (b'{"publish":"temps","body":{"c":21.5}}', Publish("temps", {"c": 21.5})),
    (b'{"publish":"temps"}', Publish("temps")),
    (b'{"publish":"temps","body":null}', Publish("temps", None)),
    (b'{"request":"","id":3}', Request(3, name="")),
]


@pytest.mark.parametrize(("wire", "message"), UBREJS_JSON)
def test_ubrejs_json_decodes(wire, message):
    decoded = decode(wire)
    assert decoded == message
    assert type(decoded.body) is type(message.body)


@pytest.mark.parametrize(("wire", "message"), UBREJS_JSON)
def test_ubrejs_json_encodes_byte_for_byte(wire, message):
    assert encode(message) == wire


def test_ids_keep_their_json_type():
    assert type(decode(b'{"success":1}').id) is int
    assert type(decode(b'{"success":"1"}').id) is str
    assert decode(b'{"success":"1"}') != decode(b'{"success":1}')
    assert encode(Success("1")) == b'{"success":"1"}'
    assert encode(Success(1)) == b'{"success":1}'
    assert decode(b'{"request":"add","id":"7"}').id == "7"


def test_no_body_and_null_body_differ():
    assert decode(b'{"publish":"t"}').body is NO_BODY
    assert decode(b'{"publish":"t","body":null}').body is None
    assert repr(NO_BODY) == "NO_BODY"
    assert repr(Publish("t")) == "Publish(topic='t', body=NO_BODY, streaming=False)"


def test_unknown_keys_are_ignored_and_not_written_back():
    message = decode(b'{"x":0,"publish":"t","body":1,"meta":{"a":2}}')
    assert message == Publish("t", 1)
    assert encode(message) == b'{"publish":"t","body":1}'
    # "id" belongs to a request only; elsewhere it is one more unknown key
    assert decode(b'{"success":1,"id":9}') == Success(1)


def test_keys_in_any_order_are_written_type_key_id_body():
    assert encode(decode(b'{"body":[1],"id":1,"request":"add"}')) == (
        b'{"request":"add","id":1,"body":[1]}'
    )


def test_json_with_leading_whitespace_is_json():
    assert decode(b' \r\n\t{"subscribe":"a"}') == Subscribe("a")
    assert decode('\n{"subscribe":"a"}') == Subscribe("a")


def test_json_text_stays_utf8_and_lone_surrogates_are_escaped_as_json_does():
    assert encode(Publish("caf\u00e9", "\u2603")) == '{"publish":"café","body":"☃"}'.encode()
    wire = b'{"publish":"t","body":"\\ud800x"}'  # JSON.stringify's output for a lone surrogate
    assert decode(wire).body == "\ud800x"
    assert encode(decode(wire)) == wire


# --- Round trips --------------------------------------------------------------------------------

json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
json_bodies = st.just(NO_BODY) | json_values
json_ids = st.integers(-(2**63), 2**64) | st.text()

json_messages = st.one_of(
    st.builds(Subscribe, st.text(), json_bodies),
    st.builds(Publish, st.text(), json_bodies),
    st.builds(Unsubscribe, st.text(), json_bodies),
    st.builds(Request, json_ids, json_bodies, name=st.none() | st.text()),
    st.builds(Success, json_ids, json_bodies),
    st.builds(Fail, json_ids, json_bodies),
)


def _same_json(a, b):
    """Equal with types checked too: True == 1 == 1.0 in Python, not on the wire."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) and type(a) is type(b)


@given(json_messages)
def test_json_round_trip(message):
    wire = encode(message)
    assert wire[:1] == b"{"
    decoded = decode(wire)
    assert decoded == message
    key_value = decoded.topic if hasattr(decoded, "topic") else decoded.id
    original = message.topic if hasattr(message, "topic") else message.id
    assert type(key_value) is type(original)
    if message.body is not NO_BODY:
        assert _same_json(decoded.body, message.body)
    assert decode(wire.decode()) == message


@given(json_messages)
def test_json_is_what_a_json_parser_reads_in_order(message):
    parsed = json.loads(encode(message))
    keys = list(parsed)
    if message.body is NO_BODY:
        assert "body" not in keys
    else:
        assert keys[-1] == "body"
    assert keys[0] in ("subscribe", "publish", "unsubscribe", "request", "success", "fail")
    assert ("id" in keys) == (getattr(message, "name", None) is not None)


binary_names = st.text(max_size=40)
binary_bodies = st.just(NO_BODY) | st.binary(min_size=1, max_size=64)
streaming_bodies = st.binary(max_size=64)


def _binary_messages(body, streaming):
    return st.one_of(
        st.builds(Subscribe, binary_names, body, streaming=st.just(streaming)),
        st.builds(Publish, binary_names, body, streaming=st.just(streaming)),
        st.builds(Unsubscribe, binary_names, body, streaming=st.just(streaming)),
        st.builds(Request, binary_names, body, streaming=st.just(streaming)),
        st.builds(Success, binary_names, body, streaming=st.just(streaming)),
        st.builds(Fail, binary_names, body, streaming=st.just(streaming)),
    )


binary_messages = _binary_messages(binary_bodies, False) | _binary_messages(streaming_bodies, True)


@given(binary_messages)
def test_binary_round_trip(message):
    wire = encode(message, binary=True)
    assert decode(wire) == message
    name = (message.topic if hasattr(message, "topic") else message.id).encode()
    body = b"" if message.body is NO_BODY else message.body
    assert len(wire) == 7 + len(name) + len(body)
    assert wire[1:3] == len(name).to_bytes(2, "big")
    body_length = 0xFFFFFFFF if message.streaming else len(body)
    assert wire[3:7] == body_length.to_bytes(4, "big")
    assert wire[7:].startswith(name) and wire.endswith(body)


# --- Fuzzing ------------------------------------------------------------------------------------


def _decodes_or_protocol_error(data):
    try:
        return decode(data)
    except ProtocolError:
        return None


@given(st.binary(max_size=80))
def test_fuzz_arbitrary_bytes(data):
    _decodes_or_protocol_error(data)


@given(st.text(max_size=80))
def test_fuzz_arbitrary_text(text):
    _decodes_or_protocol_error(text)
    _decodes_or_protocol_error(text.encode("utf-8", "surrogatepass"))


@given(
    st.sampled_from(b"SPRsfUc"),
    st.integers(0, 12) | st.sampled_from([0xFFFF]),
    st.integers(0, 12) | st.sampled_from([0xFFFFFFFF, 0xFFFFFFFE]),
    st.binary(max_size=30),
)
def test_fuzz_valid_header_then_random_bytes(code, name_length, body_length, rest):
    wire = bytes([code]) + name_length.to_bytes(2, "big") + body_length.to_bytes(4, "big") + rest
    message = _decodes_or_protocol_error(wire)
    if message is not None:
        # whatever is accepted is written back byte for byte (0x63 becomes 0x66)
        sent_type = b"f" if code == ord("c") else bytes([code])
        assert encode(message, binary=True) == sent_type + wire[1:]


@given(binary_messages | json_messages, st.data())
def test_fuzz_one_byte_mutated_or_truncated(message, data):
    wire = bytearray(encode(message, binary=isinstance(message.body, bytes)))
    if data.draw(st.booleans()):
        del wire[data.draw(st.integers(0, len(wire) - 1)):]
    else:
        wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    _decodes_or_protocol_error(bytes(wire))


json_keys = st.sampled_from(
    ["subscribe", "publish", "unsubscribe", "request", "success", "fail", "id", "body", "x"]
)


@given(st.dictionaries(json_keys, json_values, max_size=4) | json_values)
def test_fuzz_json_shapes(value):
    wire = json.dumps(value).encode()
    message = _decodes_or_protocol_error(wire)
    if message is not None:
        assert decode(encode(message)) == message


# --- Errors: binary -----------------------------------------------------------------------------


def test_empty_input():
    with pytest.raises(TruncatedFrame, match="UBRE message is empty"):
        decode(b"")
    with pytest.raises(BadJSON, match="UBRE JSON message: invalid JSON at character 0"):
        decode("")


def test_first_byte_is_neither_json_nor_a_binary_type():
    with pytest.raises(UnknownType, match=r"starts with byte 0x41: neither '\{' \(JSON\) nor"):
        decode(b"A\x00\x00\x00\x00\x00\x00")
    with pytest.raises(UnknownType, match="byte 0x5b"):
        decode(b"[1,2]")


def test_binary_header_too_short():
    with pytest.raises(TruncatedFrame, match=r"binary message of 3 byte\(s\): the header needs 7"):
        decode(h("53 0004"))


def test_binary_name_longer_than_the_message():
    with pytest.raises(TruncatedFrame, match="name length 4 but only 2 bytes follow the header"):
        decode(h("53 0004 00000000 6e65"))


def test_binary_body_longer_than_the_message():
    with pytest.raises(
        TruncatedFrame, match="body length 10 but only 3 bytes follow the name"
    ) as caught:
        decode(h("50 0005 0000000a 74656d7073 7b2263"))
    assert caught.value.offset == 12


def test_binary_trailing_bytes_after_the_body():
    with pytest.raises(
        BadLength, match=r"body length 1 but 3 bytes follow the name: 2 trailing byte\(s\)"
    ) as caught:
        decode(h("50 0001 00000001 74 61 6263"))
    assert caught.value.offset == 9


def test_binary_no_body_but_bytes_follow():
    with pytest.raises(BadLength, match=r"body length 0 \(no body\) but 4 bytes follow the name"):
        decode(h("53 0004 00000000 6e657773 78787878"))


def test_binary_name_not_utf8():
    with pytest.raises(BadEncoding, match="name is not valid UTF-8 at byte 8") as caught:
        decode(h("53 0002 00000000 61ff"))
    assert caught.value.offset == 8


# --- Errors: JSON -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "error", "match"),
    [
        (b'{"subscribe":', BadJSON, "UBRE JSON message: invalid JSON at character"),
        (b'{"publish":"t","body":NaN}', BadJSON, "NaN is not JSON"),
        (b'{"publish":"\xff"}', BadEncoding, "UBRE JSON message is not valid UTF-8 at byte 12"),
        (b" [1,2]", BadJSON, "must be an object, got an array"),
        ('"subscribe"', BadJSON, "must be an object, got a string 'subscribe'"),
        (b'{"body":1,"topic":"t"}', UnknownType,
         r"no type key \(subscribe, publish.*\); its keys are \['body', 'topic'\]"),
        (b"{}", UnknownType, r"no type key .*its keys are \[\]"),
        (b'{"subscribe":"a","publish":"a"}', BadJSON,
         "two type keys, 'subscribe' and 'publish': a message has exactly one"),
        (b'{"subscribe":5}', BadJSON, "subscribe: the topic must be a string, got an integer 5"),
        (b'{"publish":null}', BadJSON, "publish: the topic must be a string, got null"),
        (b'{"unsubscribe":["a"]}', BadJSON, "topic must be a string, got an array"),
        (b'{"success":true}', BadJSON, "success: the id must be a string or an integer, got true"),
        (b'{"fail":1.5}', BadJSON, "fail: the id must be a string or an integer, got a number 1.5"),
        (b'{"fail":1.0}', BadJSON, "got a number 1.0"),
        (b'{"request":null}', BadJSON, "request: the id must be .*, got null"),
        (b'{"request":{}}', BadJSON, "got an object"),
        (b'{"request":"add","id":false}', BadJSON, "request: the id must be .*, got false"),
        (b'{"request":7,"id":1}', BadJSON,
         r'request with an "id": the handler name in "request" must be a string, got an integer 7'),
    ],
)
def test_json_shape_errors(wire, error, match):
    with pytest.raises(error, match=match):
        decode(wire)


def test_json_decode_bytes_in_text_frame_is_never_binary():
    # a str is always JSON, even when it looks like a binary message
    with pytest.raises(BadJSON):
        decode("S\x00\x04\x00\x00\x00\x00news")


# --- Errors: encode -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "binary", "error", "match"),
    [
        (Subscribe(5), False, InvalidTopic, "subscribe topic must be a str, got an integer 5"),
        (Publish(None), True, InvalidTopic, "publish topic must be a str, got null"),
        (Success(True), False, InvalidField, "success id must be an int or a str, got true"),
        (Fail(1.0), True, InvalidField, "fail id must be an int or a str, got a number 1.0"),
        (Request(1, name=3), False, InvalidField, "handler name must be a str, got an integer 3"),
        (Publish("t", b"x", streaming=True), False, InvalidField,
         "streaming body exists only in the binary format"),
        (Publish("t", b"x"), False, InvalidField,
         "UBRE publish: value cannot be written as JSON: .*bytes"),
        (Publish("t", {1, 2}), False, InvalidField, "cannot be written as JSON"),
        (Publish("t", float("nan")), False, InvalidField, "cannot be written as JSON"),
        (Request(1, b"x", name="add"), True, InvalidField,
         "the handler name 'add' cannot be sent; send this request as JSON"),
        (Publish("t", {"c": 1}), True, InvalidField, "binary publish body must be bytes, got dict"),
        (Publish("t", "text"), True, InvalidField, "body must be bytes, got str"),
        (Publish("t", b""), True, InvalidField,
         "an empty body cannot be sent, since body length 0 means no body"),
        (Publish("t", streaming=True), True, InvalidField,
         "a streaming message needs a body, even an empty one"),
        (Subscribe("x" * 65536), True, InvalidTopic,
         "subscribe topic of 65536 bytes: the name length field holds at most 65535"),
        (Success("\u00e9" * 32768), True, InvalidField, "success id of 65536 bytes"),
        (Subscribe("\ud800"), True, InvalidTopic, "topic cannot be written as UTF-8"),
        (Fail("\udfff"), True, InvalidField, "fail id cannot be written as UTF-8"),
    ],
)
def test_encode_refuses(message, binary, error, match):
    with pytest.raises(error, match=match):
        encode(message, binary=binary)


def test_encode_takes_subclasses_of_str_and_int():
    class Topic(str):
        pass

    class Code(enum.IntEnum):
        SEVEN = 7

    assert encode(Subscribe(Topic("news"))) == b'{"subscribe":"news"}'
    assert encode(Subscribe(Topic("news")), binary=True) == h("53 0004 00000000 6e657773")
    assert encode(Success(Code.SEVEN)) == b'{"success":7}'
    assert encode(Success(Code.SEVEN), binary=True) == h("73 0001 00000000 37")


def test_encode_longest_name_is_accepted():
    wire = encode(Subscribe("x" * 65535), binary=True)
    assert wire[:3] == h("53 ffff") and decode(wire) == Subscribe("x" * 65535)


def test_encode_refuses_a_body_too_long_for_the_length_field():
    try:
        huge = mmap.mmap(-1, 2**32)  # virtual memory only: encode must refuse before copying
    except (OSError, OverflowError, MemoryError):
        pytest.skip("cannot map 4 GiB of virtual memory here")
    with huge, pytest.raises(FrameTooLarge, match="body of 4294967296 bytes.*streaming=True"):
        encode(Publish("t", memoryview(huge)), binary=True)


def test_encode_refuses_what_is_not_a_message():
    with pytest.raises(TypeError, match="not a UBRE message"):
        encode({"publish": "t"})


# The requester's and replier's hot paths write and read the very bytes `encode` and `decode` do.

@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([ubre.Request, ubre.Success, ubre.Fail, ubre.Publish]),
    st.one_of(st.integers(min_value=-2 ** 70, max_value=2 ** 70), st.text(max_size=20),
              st.booleans(), st.just("\ud800")),
    st.binary(max_size=40),
)
def test_encode_binary_regular_is_encode(cls, name, body):
    def outcome(write):
        try:
            return write()
        except Exception as error:  # noqa: BLE001 - the same error, whichever it is
            return type(error), str(error)

    assert outcome(lambda: ubre.encode_binary_regular(cls, name, body)) == outcome(
        lambda: ubre.encode(cls(name, body or ubre.NO_BODY), binary=True))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=30), st.data())
def test_decode_binary_answer_reads_what_decode_reads(tail, data):
    message = data.draw(st.sampled_from([
        ubre.Success("7", tail or ubre.NO_BODY), ubre.Fail("x\u00e9", tail or ubre.NO_BODY),
        ubre.Request("7", tail or ubre.NO_BODY), ubre.Success("s", tail, streaming=True),
    ]))
    encoded = ubre.encode(message, binary=True)
    frame = data.draw(st.sampled_from([encoded, encoded[:-1], encoded + b"!", encoded[:6],
                                       encoded[:7] + b"\xff" + encoded[8:]]))
    answer = ubre.decode_binary_answer(frame)
    if answer is None:
        return  # left to decode, which reads it or refuses it
    decoded = ubre.decode(frame)
    assert type(decoded) in (ubre.Success, ubre.Fail) and not decoded.streaming
    body = b"" if decoded.body is ubre.NO_BODY else decoded.body
    assert answer == (type(decoded) is ubre.Success, decoded.id, body)
