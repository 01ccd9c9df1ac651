"""WEBSMQ codec: the spec's and NOTES.md's vectors, round trips, fuzzing and every error path."""

import dataclasses
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from wireproto.codecs.websmq import (
    HEADER_SIZE,
    MAX_TOPIC_LENGTH,
    LastWill,
    MessageType,
    Publish,
    Subscribe,
    Unsubscribe,
    decode,
    decode_header,
    encode,
    encode_header,
    encode_publish,
    text_from_topic,
    topic_from_text,
    validate_topic,
)
from wireproto.errors import (
    BadEncoding,
    BadLength,
    InvalidField,
    InvalidTopic,
    ProtocolError,
    TruncatedFrame,
    UnknownType,
)

# Written out here rather than imported, so that a change to the codec's set shows up as a failure.
PLAIN = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/"
HEX = "0123456789abcdefABCDEF"
ORACLE_TOPIC = re.compile(rb"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})+")
CLASS_OF_BITS = {0b00: Publish, 0b01: Subscribe, 0b10: Unsubscribe, 0b11: LastWill}
CLASSES = [Publish, Subscribe, Unsubscribe, LastWill]


def header(type_bits: int, length: int) -> bytes:
    """The header as the spec draws it: two type bits, then six and eight bits of length."""
    return bytes([type_bits << 6 | length >> 8, length & 0xFF])


def oracle(frame: bytes):
    """What decode must return for `frame`, or None where it must raise ProtocolError."""
    if len(frame) < 2:
        return None
    length = (frame[0] & 0b0011_1111) * 256 + frame[1]
    topic = frame[2 : 2 + length]
    if length == 0 or len(topic) < length or not ORACLE_TOPIC.fullmatch(topic):
        return None
    return CLASS_OF_BITS[frame[0] >> 6](topic.decode("ascii"), frame[2 + length :])


escapes = st.tuples(st.sampled_from(HEX), st.sampled_from(HEX)).map(lambda d: "%" + "".join(d))
topics = st.lists(st.one_of(st.sampled_from(PLAIN), escapes), min_size=1, max_size=30).map(
    "".join
)
payloads = st.binary(max_size=64)
messages = st.one_of(*(st.builds(cls, topics, payloads) for cls in CLASSES))


# --- Vectors -------------------------------------------------------------------------------------

VECTORS = [
    ("40 05 68656c6c6f", Subscribe("hello")),
    ("00 05 68656c6c6f 776f726c64", Publish("hello", b"world")),
    ("80 05 68656c6c6f", Unsubscribe("hello")),
    ("c0 05 68656c6c6f 776f726c64", LastWill("hello", b"world")),
]


@pytest.mark.parametrize(("hex_frame", "message"), VECTORS)
def test_vector_decodes(hex_frame, message):
    assert decode(bytes.fromhex(hex_frame)) == message


@pytest.mark.parametrize(("hex_frame", "message"), VECTORS)
def test_vector_encodes(hex_frame, message):
    assert encode(message) == bytes.fromhex(hex_frame)


def test_encode_publish_matches_vector():
    assert encode_publish("hello", b"world") == bytes.fromhex("00 05 68656c6c6f 776f726c64")


@pytest.mark.parametrize(
    ("hex_header", "message_type", "length"),
    [
        ("bf ff", MessageType.UNSUBSCRIBE, 16383),  # NOTES.md
        ("00 00", MessageType.PUBLISH, 0),  # the Rust reference's own tests
        ("40 7b", MessageType.SUBSCRIBE, 123),
        ("c0 05", MessageType.LAST_WILL, 5),
    ],
)
def test_header_vectors(hex_header, message_type, length):
    raw = bytes.fromhex(hex_header)
    assert decode_header(raw) == (message_type, length)
    assert encode_header(message_type, length) == raw


def test_bf_ff_takes_a_topic_of_16383_bytes():
    topic = ("sensors/" * 2048)[:16383]
    assert decode(b"\xbf\xff" + topic.encode()) == Unsubscribe(topic)
    assert decode(b"\xbf\xff" + topic.encode() + b"rest") == Unsubscribe(topic, b"rest")
    assert encode(Unsubscribe(topic)) == b"\xbf\xff" + topic.encode()


def test_bf_ff_with_one_topic_byte_short_is_truncated():
    with pytest.raises(TruncatedFrame, match="topic of 16383 bytes but only 16382 follow"):
        decode(b"\xbf\xff" + b"a" * 16382)


def test_longest_topic_encodes_and_one_more_byte_does_not():
    assert encode_publish("t" * 16383, b"")[:2] == b"\x3f\xff"
    with pytest.raises(InvalidTopic, match="16384 bytes is too long: the header allows 16383"):
        encode_publish("t" * 16384, b"")
    assert MAX_TOPIC_LENGTH == 16383 and HEADER_SIZE == 2


# --- What decode keeps ---------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "cls"), [(0x40, Subscribe), (0x80, Unsubscribe)])
def test_subscribe_and_unsubscribe_keep_their_payload(first, cls):
    frame = bytes([first, 3]) + b"a/b" + b"\x00ignored"
    assert decode(frame) == cls("a/b", b"\x00ignored")
    assert encode(decode(frame)) == frame


def test_payload_is_bytes_whatever_the_input():
    frame = bytearray(b"\x00\x01t" + b"\xffdata")
    for data in (frame, memoryview(frame), memoryview(b"xx" + bytes(frame))[2:]):
        message = decode(data)
        assert type(message.payload) is bytes and type(message.topic) is str
        assert message == Publish("t", b"\xffdata")
    decoded = decode(frame)
    frame[3] = 0
    assert decoded.payload == b"\xffdata"  # a copy, not a view into the caller's buffer


def test_a_strided_memoryview_is_read_like_its_bytes():
    frame = b"\x00\x01t\xffdata"
    strided = memoryview(bytes(b for byte in frame for b in (byte, 0)))[::2]
    assert decode(strided) == Publish("t", b"\xffdata")
    assert decode_header(strided) == (MessageType.PUBLISH, 1)


def test_decoded_messages_behave_like_constructed_ones():
    decoded = decode(b"\xc0\x01t" + b"p")
    built = LastWill("t", b"p")
    assert decoded == built and hash(decoded) == hash(built) and repr(decoded) == repr(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.topic = "u"


def test_message_types_are_the_header_bits():
    assert [cls.message_type for cls in CLASSES] == [0b00, 0b01, 0b10, 0b11]


# --- Round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES)
@given(data=st.data())
def test_round_trip(cls, data):
    message = data.draw(st.builds(cls, topics, payloads))
    assert decode(encode(message)) == message


@given(topic=topics, payload=payloads)
def test_encode_publish_is_encode_of_publish(topic, payload):
    assert encode_publish(topic, payload) == encode(Publish(topic, payload))


@given(type_bits=st.integers(0, 3), topic=topics, payload=payloads)
def test_frame_layout(type_bits, topic, payload):
    raw = topic.encode()
    frame = header(type_bits, len(raw)) + raw + payload
    message = decode(frame)
    assert type(message) is CLASS_OF_BITS[type_bits]
    assert (message.topic, message.payload) == (topic, payload)
    assert encode(message) == frame  # decoding is exact, so a broker may forward the frame


@given(type_bits=st.sampled_from(list(MessageType)), length=st.integers(0, MAX_TOPIC_LENGTH))
def test_header_round_trip(type_bits, length):
    raw = encode_header(type_bits, length)
    assert raw == header(type_bits, length)
    assert decode_header(raw) == (type_bits, length)


def test_every_header_decodes():
    for value in range(1 << 16):
        raw = value.to_bytes(2, "big")
        assert decode_header(raw) == (value >> 14, value & 0x3FFF)


# --- The topic character set ----------------------------------------------------------------------


def test_each_single_byte_topic():
    for byte in range(256):
        frame = b"\x40\x01" + bytes([byte])
        if chr(byte) in PLAIN:
            assert decode(frame) == Subscribe(chr(byte))
        else:
            with pytest.raises(InvalidTopic):
                decode(frame)


@pytest.mark.parametrize("topic", list("?# \"<>\\^`{|}[]"))
def test_characters_that_must_be_escaped(topic):
    with pytest.raises(InvalidTopic, match=f"must be percent-encoded as %{ord(topic):02X}"):
        validate_topic("a/" + topic)


def test_escapes_of_either_case_are_kept_as_sent():
    assert decode(b"\x00\x08a%2Fb%c3" + b"p") == Publish("a%2Fb%c3", b"p")
    assert decode(b"\x00\x03%2f").topic != decode(b"\x00\x03%2F").topic  # matched exactly


@pytest.mark.parametrize("topic", ["/", "a//b", "/leading", "trailing/", "%00", "a:b@c;d=e"])
def test_unusual_but_valid_topics(topic):
    validate_topic(topic)
    assert decode(encode(Subscribe(topic))) == Subscribe(topic)


# --- Errors from decode --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "message", "offset"),
    [
        (b"", "WEBSMQ frame of 0 bytes: the header needs 2", 0),
        (b"\x40", "WEBSMQ frame of 1 byte: the header needs 2", 1),
        (b"\x00\x05hel", "Publish frame: the header announces a topic of 5 bytes but only 3", 5),
        (b"\xc0\x01", "LastWill frame: .* topic of 1 bytes but only 0 follow", 2),
    ],
)
def test_truncated(frame, message, offset):
    with pytest.raises(TruncatedFrame, match=message) as info:
        decode(frame)
    assert info.value.offset == offset


@pytest.mark.parametrize("frame", [b"\x40\x00", b"\x00\x00payload", b"\xc0\x00"])
def test_empty_topic(frame):
    with pytest.raises(InvalidTopic, match="frame has an empty topic") as info:
        decode(frame)
    assert info.value.offset == 0


@pytest.mark.parametrize(
    ("frame", "message", "offset"),
    [
        (b"\x00\x02\xc3\xa9", "Publish frame: topic byte at offset 2: byte 0xc3 is not ASCII", 2),
        (b"\x40\x0bliving room", "offset 8: character ' ' must be percent-encoded as %20", 8),
        (b"\x40\x03a?b", "character '\\?' must be percent-encoded as %3F", 3),
        (b"\x40\x01\x00", "character '\\\\x00' must be percent-encoded as %00", 2),
        (b"\x80\x05a%zzb", "Unsubscribe frame: .*offset 3: '%' must start an escape .*b'%zz'", 3),
        (b"\x80\x03a%4", "'%' must start an escape of two hex digits, not b'%4'", 3),
        (b"\x80\x01%", "not b'%'", 2),
        (b"\x00\x05%41%g1", "offset 5: '%' must start an escape", 5),
    ],
)
def test_invalid_topic(frame, message, offset):
    with pytest.raises(InvalidTopic, match=message) as info:
        decode(frame)
    assert info.value.offset == offset


def test_text_is_refused():
    with pytest.raises(BadEncoding, match="WEBSMQ frame is binary: got text"):
        decode("\x00\x05hello")
    with pytest.raises(BadEncoding, match="got text"):
        decode_header("ab")


@pytest.mark.parametrize("thing", [None, 5, ["a"]])
def test_not_bytes_is_a_type_error(thing):
    with pytest.raises(TypeError, match="WEBSMQ frame is binary: decode takes bytes, not"):
        decode(thing)


# --- Errors from encode --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "error", "message"),
    [
        ("", InvalidTopic, "topic is empty"),
        ("café", InvalidTopic, "'é' at index 3 is not ASCII; percent-encode .* \\(%C3%A9\\)"),
        ("living room", InvalidTopic, "at index 6, character ' ' must be percent-encoded as %20"),
        ("100%", InvalidTopic, "at index 3, '%' must start an escape"),
        (b"bytes", InvalidTopic, "topic must be str, not bytes"),
        (None, InvalidTopic, "topic must be str, not NoneType"),
    ],
)
def test_encode_refuses_bad_topics(topic, error, message):
    for make in (lambda: encode(Subscribe(topic)), lambda: encode_publish(topic, b"")):
        with pytest.raises(error, match=message):
            make()


def test_error_messages_show_long_topics_cut_short():
    with pytest.raises(InvalidTopic) as info:
        validate_topic("a" * 5000 + " ")
    assert len(info.value.message) < 200 and "index 5000" in info.value.message


@pytest.mark.parametrize("payload", ["text", 5, None])
def test_encode_refuses_a_payload_that_is_not_bytes(payload):
    with pytest.raises(InvalidField, match="payload must be bytes, bytearray or memoryview"):
        encode(Publish("t", payload))


def test_encode_takes_any_bytes_like_payload():
    assert encode(LastWill("t", bytearray(b"ab"))) == b"\xc0\x01tab"
    assert encode_publish("t", memoryview(b"xab")[1:]) == b"\x00\x01tab"
    assert encode_publish("t", memoryview(b"axbx")[::2]) == b"\x00\x01tab"


def test_encode_refuses_what_is_not_a_message():
    with pytest.raises(TypeError, match="not a WEBSMQ message"):
        encode(("hello", b"world"))


@pytest.mark.parametrize(
    ("message_type", "length", "error", "message"),
    [
        (4, 0, UnknownType, "message type 4 does not exist"),
        (-1, 0, UnknownType, "types are 0-3"),
        (0, 16384, BadLength, "topic length 16384 does not fit the header"),
        (0, -1, BadLength, "must be 0-16383"),
    ],
)
def test_encode_header_ranges(message_type, length, error, message):
    with pytest.raises(error, match=message):
        encode_header(message_type, length)


# --- Topics from text ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "topic"),
    [
        ("living room/temp", "living%20room/temp"),
        ("sensors/temps/living_room", "sensors/temps/living_room"),
        ("a?b#c", "a%3Fb%23c"),
        ("100%", "100%25"),
        ("café/é", "caf%C3%A9/%C3%A9"),
        ("a+b", "a%2Bb"),
    ],
)
def test_topic_from_text(text, topic):
    assert topic_from_text(text) == topic
    assert text_from_topic(topic) == text


def test_text_from_topic_decodes_escaped_slashes_too():
    assert text_from_topic("a%2Fb/c") == "a/b/c"


@given(st.text(min_size=1, max_size=40))  # hypothesis leaves out lone surrogates
@example("\x00")
def test_text_round_trips_through_a_topic(text):
    topic = topic_from_text(text)
    validate_topic(topic)
    assert text_from_topic(topic) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "topic is empty"), ("\ud800", "lone surrogate"), ("é" * 3000, "too long")],
)
def test_topic_from_text_refuses(text, message):
    with pytest.raises(InvalidTopic, match=message):
        topic_from_text(text)


def test_text_from_topic_refuses_escapes_that_are_not_utf8():
    with pytest.raises(BadEncoding, match="percent-escapes are not UTF-8"):
        text_from_topic("a%FF")
    with pytest.raises(InvalidTopic):
        text_from_topic("a b")


# --- Fuzzing -------------------------------------------------------------------------------------


def check_against_oracle(frame: bytes) -> None:
    expected = oracle(frame)
    if expected is None:
        with pytest.raises(ProtocolError):
            decode(frame)
        return
    for data in (frame, bytearray(frame), memoryview(frame)):
        assert decode(data) == expected
    assert encode(expected) == frame


@given(st.binary(max_size=80))
def test_fuzz_any_bytes(frame):
    check_against_oracle(frame)


@given(st.text(max_size=20))
def test_fuzz_any_text_is_refused(text):
    with pytest.raises(BadEncoding):
        decode(text)


valid_ish_topics = st.text(alphabet=PLAIN[:5] + "%%%" + HEX[:4] + " ?é\x00\x7f", max_size=12)


@given(
    type_bits=st.integers(0, 3),
    length=st.integers(0, 20),
    rest=st.one_of(st.binary(max_size=30), valid_ish_topics.map(str.encode)),
)
def test_fuzz_valid_header_then_anything(type_bits, length, rest):
    check_against_oracle(header(type_bits, length) + rest)


@given(type_bits=st.integers(0, 3), topic=valid_ish_topics, payload=payloads)
def test_fuzz_topics_near_the_rules(type_bits, topic, payload):
    raw = topic.encode()
    check_against_oracle(header(type_bits, len(raw)) + raw + payload)


@given(message=messages, data=st.data())
def test_fuzz_one_byte_changed(message, data):
    frame = bytearray(encode(message))
    index = data.draw(st.integers(0, len(frame) - 1))
    frame[index] = data.draw(st.integers(0, 255))
    check_against_oracle(bytes(frame))


@given(message=messages, data=st.data())
def test_fuzz_truncated(message, data):
    frame = encode(message)
    check_against_oracle(frame[: data.draw(st.integers(0, len(frame)))])
