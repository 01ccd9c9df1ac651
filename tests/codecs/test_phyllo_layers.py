"""Phyllo, layer by layer: chunk splitter, COBS frame, datagrams and CRC, pub-sub message, document.

Round trips for every unit, and each error path with its message.
"""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wireproto.codecs import phyllo
from wireproto.codecs.phyllo import (
    ChunkSplitter,
    Datagram,
    Document,
    Format,
    PubSubMessage,
    ValidatedDatagram,
)
from wireproto.errors import (
    BadChecksum,
    BadEncoding,
    BadJSON,
    BadLength,
    FrameTooLarge,
    InvalidField,
    InvalidTopic,
    TruncatedFrame,
    UnknownType,
)

h = bytes.fromhex

# --- chunked stream (0x12) ------------------------------------------------------------------------


def test_encode_chunk_writes_a_leading_and_a_trailing_delimiter():
    assert phyllo.encode_chunk(b"\x01\x02") == b"\x00\x01\x02\x00"
    assert phyllo.encode_chunk(bytearray(b"\xff")) == b"\x00\xff\x00"


def test_encode_chunk_errors():
    with pytest.raises(BadLength, match="chunk is empty"):
        phyllo.encode_chunk(b"")
    with pytest.raises(FrameTooLarge, match="chunk of 256 bytes is over the 255-byte limit"):
        phyllo.encode_chunk(b"\x01" * 256)
    with pytest.raises(FrameTooLarge, match="over the 80-byte limit"):
        phyllo.encode_chunk(b"\x01" * 81, max_length=80)
    with pytest.raises(InvalidField, match="0x00 at byte 2") as caught:
        phyllo.encode_chunk(b"\x01\x02\x00\x03")
    assert caught.value.offset == 2


def test_splitter_ignores_empty_chunks_and_keeps_a_partial_chunk():
    splitter = ChunkSplitter()
    assert splitter.feed(b"\x00\x00\x00ab\x00\x00c") == [b"ab"]
    assert splitter.feed(b"d") == []
    assert splitter.feed(b"e\x00f") == [b"cde"]
    assert splitter.feed(b"\x00") == [b"f"]
    assert splitter.errors == []


def test_splitter_drops_an_over_long_chunk_and_keeps_the_good_ones_of_the_same_feed():
    splitter = ChunkSplitter(max_length=4)
    assert splitter.feed(b"\x00abc\x00toolong\x00wxyz\x00") == [b"abc", b"wxyz"]
    [error] = splitter.errors
    assert isinstance(error, FrameTooLarge)
    assert error.offset == 5
    assert "chunk at stream byte 5 is longer than 4 bytes" in str(error)
    assert splitter.feed(b"ok\x00") == [b"ok"]
    assert splitter.errors == []


def test_splitter_resyncs_after_an_over_long_chunk_that_spans_feeds():
    splitter = ChunkSplitter(max_length=4)
    assert splitter.feed(b"\x00ab") == []
    assert splitter.feed(b"cde") == []
    [error] = splitter.errors
    assert error.offset == 1
    assert splitter.feed(b"fgh" * 100) == [] and splitter.errors == []  # dropped, reported once
    assert splitter.feed(b"ijk\x00good\x00") == [b"good"]
    assert splitter.errors == []


def test_splitter_fed_byte_by_byte_gives_the_long_chunk_whole():
    size = 50_000
    splitter = ChunkSplitter(size)
    stream = b"\x00" + b"a" * size + b"\x00"
    chunks = [chunk for i in range(len(stream)) for chunk in splitter.feed(stream[i : i + 1])]
    assert chunks == [b"a" * size] and splitter.errors == []


def test_splitter_limit_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        ChunkSplitter(max_length=0)


@given(
    st.lists(st.binary(min_size=1, max_size=255).map(lambda b: b.replace(b"\x00", b"\x01"))),
    st.data(),
)
def test_chunks_round_trip_through_any_split(chunks, data):
    stream = b"".join(phyllo.encode_chunk(chunk) for chunk in chunks)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    splitter = ChunkSplitter()
    received = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        received += splitter.feed(stream[start:end])
        assert splitter.errors == []
    assert received == chunks


# --- frame (0x20) ---------------------------------------------------------------------------------


def test_frame_vectors():
    assert phyllo.encode_frame(h("11 00 22 00")) == h("02 11 02 22 01")
    assert phyllo.decode_frame(h("02 11 02 22 01")) == h("11 00 22 00")
    assert phyllo.decode_frame(memoryview(h("02 11 02 22 01"))) == h("11 00 22 00")


def test_frame_errors():
    with pytest.raises(BadLength, match="frame payload is empty"):
        phyllo.encode_frame(b"")
    with pytest.raises(FrameTooLarge, match="payload of 254 bytes is over the 253-byte limit"):
        phyllo.encode_frame(b"\x01" * 254)
    with pytest.raises(InvalidField, match="0x00 at byte 1") as caught:
        phyllo.decode_frame(b"\x02\x00")
    assert caught.value.offset == 1
    with pytest.raises(TruncatedFrame, match="frame of 2 bytes is not valid COBS"):
        phyllo.decode_frame(b"\x05a")
    with pytest.raises(BadLength, match="decodes to an empty payload"):
        phyllo.decode_frame(b"\x01")
    with pytest.raises(BadLength, match="decodes to an empty payload"):
        phyllo.decode_frame(b"")
    with pytest.raises(FrameTooLarge, match="payload of 254 bytes is over the 253-byte limit"):
        phyllo.decode_frame(b"\xff" + b"\x01" * 254)
    assert phyllo.decode_frame(b"\xff" + b"\x01" * 254, max_length=254) == b"\x01" * 254


@given(st.binary(min_size=1, max_size=253))
def test_frame_round_trip(payload):
    frame = phyllo.encode_frame(payload)
    assert 0 not in frame and len(frame) <= 255
    assert phyllo.decode_frame(frame) == payload


# --- CRC Ray32sub8 --------------------------------------------------------------------------------


def reference_ray32sub8(data: bytes) -> int:
    """Bit by bit, straight from the parameters: nothing shared with the codec."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xB7800000 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def test_crc_check_value():
    assert phyllo.ray32sub8(b"123456789") == 0xB303B455
    assert reference_ray32sub8(b"123456789") == 0xB303B455


def test_crc_reflected_polynomial_is_the_normal_one_reversed():
    assert int(f"{0x000001ED:032b}"[::-1], 2) == 0xB7800000


@given(st.binary(max_size=300))
def test_crc_matches_the_bitwise_reference(data):
    assert phyllo.ray32sub8(data) == reference_ray32sub8(data)


# --- datagram (0x21) and validated datagram (0x22) ------------------------------------------------


def test_datagram_vectors():
    assert phyllo.encode_datagram(Datagram(0x60, b"abc")) == h("03 60 61 62 63")
    assert phyllo.decode_datagram(h("03 60 61 62 63")) == Datagram(0x60, b"abc")
    assert phyllo.decode_datagram(h("00 05")) == Datagram(0x05, b"")


def test_datagram_errors():
    with pytest.raises(TruncatedFrame, match="datagram of 1 byte: the header .* needs 2"):
        phyllo.decode_datagram(b"\x00")
    with pytest.raises(BadLength, match="says 5 payload bytes but 3 follow") as caught:
        phyllo.decode_datagram(h("05 60 61 62 63"))
    assert caught.value.offset == 0
    with pytest.raises(FrameTooLarge, match="payload of 256 bytes is over the 255"):
        phyllo.encode_datagram(Datagram(0x60, bytes(256)))
    with pytest.raises(InvalidField, match="datagram payload type 256 is not a byte"):
        phyllo.encode_datagram(Datagram(256, b""))


def test_validated_datagram_vectors():
    wire = h("3d bc 87 2b 60 10 04 65 63 68 6f 68 65 6c 6c 6f")
    validated = ValidatedDatagram(0x60, h("10 04 65 63 68 6f 68 65 6c 6c 6f"))
    assert phyllo.encode_validated_datagram(validated) == wire
    assert phyllo.decode_validated_datagram(wire) == validated


def test_validated_datagram_errors():
    with pytest.raises(TruncatedFrame, match="validated datagram of 4 bytes: .* needs 5"):
        phyllo.decode_validated_datagram(b"\x01\x02\x03\x04")
    wire = bytearray(h("3d bc 87 2b 60 10 04 65 63 68 6f 68 65 6c 6c 6f"))
    wire[-1] ^= 0x20
    computed = f"0x{reference_ray32sub8(bytes(wire[4:])):08x}"
    with pytest.raises(BadChecksum, match=f"CRC is 0x3dbc872b but .* give {computed}"):
        phyllo.decode_validated_datagram(wire)
    with pytest.raises(InvalidField, match="validated datagram payload type -1 is not a byte"):
        phyllo.encode_validated_datagram(ValidatedDatagram(-1, b""))


@given(st.integers(0, 255), st.binary(max_size=255))
def test_datagram_round_trip(payload_type, payload):
    datagram = Datagram(payload_type, payload)
    assert phyllo.decode_datagram(phyllo.encode_datagram(datagram)) == datagram


@given(st.integers(0, 255), st.binary(max_size=300))
def test_validated_datagram_round_trip(payload_type, payload):
    validated = ValidatedDatagram(payload_type, payload)
    wire = phyllo.encode_validated_datagram(validated)
    assert wire[:4] == reference_ray32sub8(wire[4:]).to_bytes(4, "big")
    assert phyllo.decode_validated_datagram(wire) == validated


# --- pub-sub message (0x60) -----------------------------------------------------------------------


def test_message_topic_length_upper_nibble_is_masked_on_receipt_and_zero_on_send():
    message = phyllo.decode_message(h("10 f2 30 31 aa"))
    assert message == PubSubMessage(0x10, b"01", b"\xaa")
    assert phyllo.encode_message(message) == h("10 02 30 31 aa")


def test_message_topic_may_be_str_or_empty_and_is_kept_as_bytes():
    assert PubSubMessage(0x10, "échø", b"").topic == "échø".encode()
    assert PubSubMessage(0x10, bytearray(b"ab"), b"").topic == b"ab"
    assert phyllo.encode_message(PubSubMessage(0x10, "", b"x")) == h("10 00 78")
    assert phyllo.decode_message(h("10 00")) == PubSubMessage(0x10, b"", b"")


def test_layer_messages_are_marked():
    assert phyllo.is_layer_message(phyllo.decode_message(h("05 00 68 69")))
    assert not phyllo.is_layer_message(phyllo.decode_message(h("10 00 68 69")))
    assert phyllo.type_name(0x05) == "0x05 (info)"


def test_message_errors():
    with pytest.raises(TruncatedFrame, match="pub-sub message of 1 byte: the header .* needs 2"):
        phyllo.decode_message(b"\x10")
    with pytest.raises(TruncatedFrame, match="topic length is 4 but only 2 bytes follow") as caught:
        phyllo.decode_message(h("10 04 65 63"))
    assert caught.value.offset == 1
    with pytest.raises(InvalidTopic, match="is 16 bytes: at most 15 fit"):
        PubSubMessage(0x10, b"a" * 16, b"")
    with pytest.raises(InvalidTopic, match="cannot be written as UTF-8"):
        PubSubMessage(0x10, "\udc80", b"")
    with pytest.raises(InvalidTopic, match="must be bytes or str, not int"):
        PubSubMessage(0x10, 7, b"")
    with pytest.raises(InvalidField, match="payload type 256 is not a byte"):
        phyllo.encode_message(PubSubMessage(256, b"", b""))


@given(st.integers(0, 255), st.binary(max_size=15), st.binary(max_size=300))
def test_message_round_trip(payload_type, topic, payload):
    message = PubSubMessage(payload_type, topic, payload)
    encoded = phyllo.encode_message(message)
    assert encoded[:2] == bytes((payload_type, len(topic)))
    assert phyllo.decode_message(encoded) == message


@given(st.text(max_size=3))  # UTF-8: at most 12 bytes
def test_str_topics_round_trip_as_their_utf8_bytes(topic):
    message = PubSubMessage(0x10, topic, b"x")
    assert phyllo.decode_message(phyllo.encode_message(message)).topic.decode() == topic


# --- document (0x40) ------------------------------------------------------------------------------


def test_json_document():
    document = phyllo.serialize({"a": [1, "é"]}, format=Format.JSON, schema=0x70)
    assert phyllo.encode_document(document) == b'\x50\x70{"a":[1,"\xc3\xa9"]}'
    assert phyllo.deserialize(document) == {"a": [1, "é"]}


def test_json_document_escapes_a_lone_surrogate_as_json_does():
    document = phyllo.serialize(["\ud800x"], format=Format.JSON)
    assert document.body == b'["\\ud800x"]'
    assert phyllo.deserialize(document) == ["\ud800x"]


def test_msgpack_keeps_str_and_bytes_apart():
    document = phyllo.serialize([b"\x01", "\x01"])
    assert document.body == h("92 c4 01 01 a1 01")
    assert phyllo.deserialize(document) == [b"\x01", "\x01"]


def test_cbor_and_unknown_formats_are_carried_but_not_read():
    cbor = phyllo.decode_document(h("12 00 64 61 62 63 64"))
    assert cbor == Document(Format.CBOR, 0x00, h("64 61 62 63 64"))
    assert phyllo.encode_document(cbor) == h("12 00 64 61 62 63 64")
    with pytest.raises(InvalidField, match="CBOR document .* does not serialize or read CBOR"):
        phyllo.deserialize(cbor)
    with pytest.raises(InvalidField, match="CBOR"):
        phyllo.serialize("abcd", format=Format.CBOR)
    bson = phyllo.decode_document(h("13 00 05"))
    with pytest.raises(UnknownType, match="format 0x13 is not one wireproto reads"):
        phyllo.deserialize(bson)
    with pytest.raises(UnknownType, match="format 0x99"):
        phyllo.serialize(1, format=0x99)


def test_document_errors():
    with pytest.raises(TruncatedFrame, match="document of 1 byte: the header .* needs 2"):
        phyllo.decode_document(b"\x11")
    with pytest.raises(InvalidField, match="format 256 and schema 0 must each be a byte"):
        phyllo.encode_document(Document(256, 0, b""))
    with pytest.raises(BadEncoding, match="msgpack document: invalid msgpack"):
        phyllo.deserialize(Document(Format.MSGPACK, 0, b"\xc1"))
    with pytest.raises(BadEncoding, match="msgpack document: bytes left over"):
        phyllo.deserialize(Document(Format.MSGPACK, 0, b"\x01\x02"))
    with pytest.raises(BadJSON, match="JSON document: invalid JSON"):
        phyllo.deserialize(Document(Format.JSON, 0, b"{"))
    with pytest.raises(InvalidField, match="cannot be written as msgpack"):
        phyllo.serialize(object())
    with pytest.raises(UnknownType, match=r"payload type 0x10 \(bytes buffer\), not a document"):
        phyllo.document_from_message(PubSubMessage(0x10, b"echo", b"\x11\x00\xc0"))


@given(st.integers(0, 255), st.integers(0, 255), st.binary(max_size=100))
def test_document_round_trip(format, schema, body):
    document = Document(format, schema, body)
    assert phyllo.decode_document(phyllo.encode_document(document)) == document


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=10)
)


def containers(inner):
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)


msgpack_values = st.recursive(scalars | st.binary(max_size=10), containers, max_leaves=10)
finite_scalars = scalars.filter(lambda v: not (isinstance(v, float) and math.isinf(v)))
json_values = st.recursive(finite_scalars, containers, max_leaves=10)


@given(msgpack_values, st.integers(0, 255), st.text(max_size=3))  # UTF-8: at most 12 bytes
def test_msgpack_document_round_trip_through_a_message(value, schema, topic):
    message = phyllo.message_from_document(topic, phyllo.serialize(value, schema=schema))
    document = phyllo.document_from_message(phyllo.decode_message(phyllo.encode_message(message)))
    assert document.schema == schema
    assert phyllo.deserialize(document) == value


@given(json_values)
def test_json_document_round_trip(value):
    document = phyllo.serialize(value, format=Format.JSON)
    assert phyllo.deserialize(phyllo.decode_document(phyllo.encode_document(document))) == value
