"""Phyllo: the byte-for-byte vectors of the spec and NOTES.md, the stacks and the module API.

Per-layer tests are in test_phyllo_layers.py; fuzzing and incremental feeding in
test_phyllo_fuzz.py.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wireproto.codecs import phyllo
from wireproto.codecs.phyllo import (
    DATAGRAM_LAYER,
    MINIMAL,
    REDUCED,
    Datagram,
    Document,
    Format,
    PubSubMessage,
    Schema,
    Stack,
    StackDecoder,
    ValidatedDatagram,
)
from wireproto.errors import (
    BadChecksum,
    BadLength,
    FrameTooLarge,
    InvalidField,
    TruncatedFrame,
    UnknownType,
)

h = bytes.fromhex

ECHO_HELLO = PubSubMessage(0x10, b"echo", b"hello")
MINIMAL_WIRE = h("00 0e 0b 60 10 04 65 63 68 6f 68 65 6c 6c 6f 00")
REDUCED_WIRE = h("00 13 10 22 3d bc 87 2b 60 10 04 65 63 68 6f 68 65 6c 6c 6f 00")
# A document "hello" (msgpack, schemaless) as the payload of a pub-sub message (type 0x40).
DOCUMENT_MESSAGE = PubSubMessage(0x40, b"echo", h("11 00 a5 68 65 6c 6c 6f"))
DOCUMENT_MINIMAL_WIRE = h("00 0a 0e 60 40 04 65 63 68 6f 11 07 a5 68 65 6c 6c 6f 00")
DOCUMENT_REDUCED_WIRE = h("00 0f 13 22 b4 dc 85 41 60 40 04 65 63 68 6f 11 07 a5 68 65 6c 6c 6f 00")


# --- NOTES.md vectors, on the wire including delimiters -----------------------------------------


@pytest.mark.parametrize(
    "stack, message, wire",
    [
        (MINIMAL, ECHO_HELLO, MINIMAL_WIRE),
        (REDUCED, ECHO_HELLO, REDUCED_WIRE),
        (MINIMAL, DOCUMENT_MESSAGE, DOCUMENT_MINIMAL_WIRE),
        (REDUCED, DOCUMENT_MESSAGE, DOCUMENT_REDUCED_WIRE),
    ],
    ids=["message-minimal", "message-reduced", "document-minimal", "document-reduced"],
)
def test_notes_wire_vectors(stack, message, wire):
    assert stack.encode(message) == wire
    assert stack.decode(wire) == message
    assert StackDecoder(stack).feed(wire) == [message]


def test_module_encode_and_decode_speak_the_minimal_stack():
    assert phyllo.encode(ECHO_HELLO) == MINIMAL_WIRE
    assert phyllo.decode(MINIMAL_WIRE) == ECHO_HELLO
    assert phyllo.decode(MINIMAL_WIRE[1:-1]) == ECHO_HELLO  # delimiters are optional
    assert phyllo.decode(bytearray(MINIMAL_WIRE)) == ECHO_HELLO
    assert phyllo.decode(memoryview(MINIMAL_WIRE)) == ECHO_HELLO


def test_document_vectors_through_the_document_helpers():
    document = phyllo.serialize("hello")
    assert document == Document(0x11, 0x00, h("a5 68 65 6c 6c 6f"))
    assert phyllo.encode(phyllo.message_from_document("echo", document)) == DOCUMENT_MINIMAL_WIRE
    assert REDUCED.encode(phyllo.message_from_document(b"echo", document)) == DOCUMENT_REDUCED_WIRE
    received = phyllo.document_from_message(REDUCED.decode(DOCUMENT_REDUCED_WIRE))
    assert received == Document(Format.MSGPACK, Schema.SCHEMALESS, b"\xa5hello")
    assert phyllo.deserialize(received) == "hello"


def test_documents_without_the_serial_stack():
    string8 = h("11 11 a4 61 62 63 64")
    assert phyllo.encode_document(phyllo.serialize("abcd", schema=Schema.STRING8)) == string8
    assert phyllo.decode_document(string8) == Document(0x11, 0x11, b"\xa4abcd")
    assert phyllo.deserialize(phyllo.decode_document(string8)) == "abcd"

    pair = h("11 70 92 c3 a4 61 62 63 64")
    assert phyllo.encode_document(phyllo.serialize((True, "abcd"), schema=0x70)) == pair
    assert phyllo.decode_document(pair) == Document(0x11, 0x70, h("92 c3 a4 61 62 63 64"))
    assert phyllo.deserialize(phyllo.decode_document(pair)) == [True, "abcd"]


def test_spec_pubsub_message_example():
    body = h("10 02 30 31 01 02 03 04 00")
    message = PubSubMessage(0x10, b"\x30\x31", h("01 02 03 04 00"))
    assert phyllo.encode_message(message) == body
    assert phyllo.decode_message(body) == message


def test_spec_example_on_the_minimal_stack_cobs_encodes_its_trailing_zero():
    # datagram 09 60 + the 9 bytes above; COBS: 0b + ten non-zero bytes, then 01 for the 00.
    wire = h("00 0b 09 60 10 02 30 31 01 02 03 04 01 00")
    message = PubSubMessage(0x10, b"01", h("01 02 03 04 00"))
    assert phyllo.encode(message) == wire
    assert phyllo.decode(wire) == message


def test_notes_vectors_layer_by_layer():
    chunk = phyllo.ChunkSplitter().feed(REDUCED_WIRE)
    assert chunk == [REDUCED_WIRE[1:-1]]
    datagram_bytes = h("10 22 3d bc 87 2b 60 10 04 65 63 68 6f 68 65 6c 6c 6f")
    assert phyllo.decode_frame(chunk[0]) == datagram_bytes
    datagram = phyllo.decode_datagram(datagram_bytes)
    assert datagram == Datagram(0x22, h("3d bc 87 2b 60 10 04 65 63 68 6f 68 65 6c 6c 6f"))
    validated = phyllo.decode_validated_datagram(datagram.payload)
    assert validated == ValidatedDatagram(0x60, h("10 04 65 63 68 6f 68 65 6c 6c 6f"))
    assert phyllo.decode_message(validated.payload) == ECHO_HELLO
    assert phyllo.ray32sub8(h("60 10 04 65 63 68 6f 68 65 6c 6c 6f")) == 0x3DBC872B


# --- layer messages are surfaced, never swallowed and never handed over as data ----------------

INFO_DATAGRAM_WIRE = h("00 07 04 05 62 6f 6f 74 00")  # datagram type 0x05 (info), payload "boot"


def test_datagram_info_message_is_surfaced_by_decode():
    assert phyllo.decode(INFO_DATAGRAM_WIRE) == Datagram(0x05, b"boot")
    assert phyllo.is_layer_message(phyllo.decode(INFO_DATAGRAM_WIRE))


def test_stack_decoder_keeps_layer_messages_apart_from_application_messages():
    info_message = PubSubMessage(0x05, b"sys", b"up")
    decoder = StackDecoder(MINIMAL)
    stream = INFO_DATAGRAM_WIRE + MINIMAL_WIRE + phyllo.encode(info_message)
    assert decoder.feed(stream) == [ECHO_HELLO]
    assert decoder.layer_messages == [Datagram(0x05, b"boot"), info_message]
    assert decoder.errors == []
    assert decoder.feed(b"") == [] and decoder.layer_messages == []


def test_reduced_stack_surfaces_layer_messages_of_both_transport_layers():
    validated_info = phyllo.encode_validated_datagram(ValidatedDatagram(0x05, b"v"))
    wire = phyllo.encode_chunk(
        phyllo.encode_frame(phyllo.encode_datagram(Datagram(0x22, validated_info)))
    )
    assert REDUCED.decode(wire) == ValidatedDatagram(0x05, b"v")
    datagram_info = phyllo.encode_chunk(phyllo.encode_frame(h("01 03 ff")))
    assert REDUCED.decode(datagram_info) == Datagram(0x03, b"\xff")


def test_unknown_type_between_layers_is_rejected():
    wire = phyllo.encode_chunk(phyllo.encode_frame(phyllo.encode_datagram(Datagram(0x23, b"x"))))
    with pytest.raises(UnknownType, match=r"datagram carries payload type 0x23 \(reliable buffer"):
        MINIMAL.decode(wire)
    with pytest.raises(UnknownType, match=r"in the reduced stack it carries 0x22"):
        REDUCED.decode(MINIMAL_WIRE)


# --- stack errors ---------------------------------------------------------------------------------


def test_stack_decode_errors():
    with pytest.raises(TruncatedFrame, match="holds no chunk"):
        phyllo.decode(b"\x00\x00")
    with pytest.raises(InvalidField, match="more than one chunk"):
        phyllo.decode(MINIMAL_WIRE + MINIMAL_WIRE)
    with pytest.raises(FrameTooLarge, match="chunk of 256 bytes is over the 255-byte limit"):
        phyllo.decode(b"\x01" * 256)
    corrupted = bytearray(REDUCED_WIRE)
    corrupted[-2] ^= 0x01
    with pytest.raises(BadChecksum, match="CRC is 0x3dbc872b but its type and payload give 0x"):
        REDUCED.decode(corrupted)
    short_length = bytearray(MINIMAL_WIRE)
    short_length[2] = 0x0A
    with pytest.raises(BadLength, match="length byte says 10 payload bytes but 11 follow"):
        phyllo.decode(short_length)


def test_stack_encode_refuses_what_does_not_fit():
    phyllo.encode(PubSubMessage(0x10, b"", bytes(249)))  # 251-byte message, 253-byte datagram
    with pytest.raises(FrameTooLarge, match="frame payload of 254 bytes is over the 253-byte"):
        phyllo.encode(PubSubMessage(0x10, b"", bytes(250)))
    with pytest.raises(FrameTooLarge, match="datagram payload of 300 bytes"):
        phyllo.encode(PubSubMessage(0x10, b"", bytes(298)))


def test_a_stack_for_small_buffers_is_configuration():
    uno = Stack("uno", (DATAGRAM_LAYER,), max_chunk_length=80, max_frame_payload=79)
    fits = PubSubMessage(0x10, b"t", bytes(range(1, 75)))  # 77-byte message, 79-byte datagram
    assert uno.decode(uno.encode(fits)) == fits
    with pytest.raises(FrameTooLarge, match="over the 79-byte limit"):
        uno.encode(PubSubMessage(0x10, b"t", bytes(range(1, 76))))
    with pytest.raises(FrameTooLarge, match="chunk of 81 bytes is over the 80-byte limit"):
        uno.decode(MINIMAL.encode(PubSubMessage(0x10, b"t", bytes(range(1, 76)))))


def test_stack_decoder_drops_bad_chunks_and_keeps_good_ones_in_the_same_feed():
    corrupted = bytearray(REDUCED_WIRE)
    corrupted[5] ^= 0xFF
    decoder = StackDecoder(REDUCED)
    stream = REDUCED_WIRE + bytes(corrupted) + b"\x05\x05\x00" + b"\x01" * 300 + REDUCED_WIRE
    assert decoder.feed(stream) == [ECHO_HELLO, ECHO_HELLO]
    assert sorted(type(e).__name__ for e in decoder.errors) == [
        "BadChecksum",
        "FrameTooLarge",
        "TruncatedFrame",
    ]
    assert decoder.feed(REDUCED_WIRE) == [ECHO_HELLO]
    assert decoder.errors == []


# --- round trips through the stacks ---------------------------------------------------------------

application_messages = st.builds(
    PubSubMessage,
    st.integers(0x10, 0xFF),
    st.binary(max_size=15),
    st.binary(max_size=229),  # fits the reduced stack: 246-byte message, 253-byte datagram
)


@given(application_messages)
def test_minimal_and_reduced_round_trip(message):
    assert phyllo.decode(phyllo.encode(message)) == message
    assert REDUCED.decode(REDUCED.encode(message)) == message


@given(st.integers(0x00, 0x0F), st.binary(max_size=15), st.binary(max_size=229))
def test_layer_messages_round_trip_and_are_marked(payload_type, topic, payload):
    message = PubSubMessage(payload_type, topic, payload)
    assert phyllo.decode(phyllo.encode(message)) == message
    decoder = StackDecoder(REDUCED)
    assert decoder.feed(REDUCED.encode(message)) == []
    assert decoder.layer_messages == [message]


@given(st.integers(0x00, 0x0F), st.binary(max_size=250))
def test_datagram_layer_messages_round_trip_through_the_minimal_stack(payload_type, payload):
    wire = phyllo.encode_chunk(
        phyllo.encode_frame(phyllo.encode_datagram(Datagram(payload_type, payload)))
    )
    assert phyllo.decode(wire) == Datagram(payload_type, payload)
