"""Phyllo stacks: the fused path agrees with the layered one, byte for byte and error for error.

The layered path (each layer's codec in turn) is the reference. For every input, valid or not,
`encode`, `decode`, `encode_document` and `decode_document` must give what the layers give:
the same bytes, the same values, or the same error with the same words.
"""

import pytest
from cobs import cobs
from hypothesis import given
from hypothesis import strategies as st

from wireproto.codecs import phyllo
from wireproto.codecs.phyllo import (
    DATAGRAM_LAYER,
    MINIMAL,
    REDUCED,
    VALIDATED_DATAGRAM_LAYER,
    Document,
    PubSubMessage,
    Stack,
)
from wireproto.codecs.phyllo.datagram import (
    _pack_datagram,
    _pack_validated_datagram,
    ray32sub8,
)
from wireproto.errors import ProtocolError, UnknownType

SMALL_MINIMAL = Stack("minimal", (DATAGRAM_LAYER,), max_chunk_length=80, max_frame_payload=60)
SMALL_REDUCED = Stack(
    "reduced", (DATAGRAM_LAYER, VALIDATED_DATAGRAM_LAYER), max_chunk_length=80
)
# Past 257 bytes of frame, the datagram's length byte is the limit rather than the frame's.
LARGE_MINIMAL = Stack("minimal", (DATAGRAM_LAYER,), max_chunk_length=400, max_frame_payload=300)
LARGE_REDUCED = Stack(
    "reduced", (DATAGRAM_LAYER, VALIDATED_DATAGRAM_LAYER), max_chunk_length=400,
    max_frame_payload=300,
)
STACKS = [MINIMAL, REDUCED, SMALL_MINIMAL, SMALL_REDUCED, LARGE_MINIMAL, LARGE_REDUCED]


def outcome(function, *args):
    """What a call gives: ("value", result) or ("error", type, message)."""
    try:
        return ("value", function(*args))
    except (ProtocolError, TypeError) as error:
        return ("error", type(error), str(error))


topics = st.binary(max_size=15) | st.text(max_size=3)  # at most 12 bytes of UTF-8
messages = st.builds(PubSubMessage, st.integers(-1, 0x100), topics, st.binary(max_size=260))
documents = st.builds(
    Document, st.integers(-1, 0x101), st.integers(-1, 0x101), st.binary(max_size=260)
)


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: f"{s.name}-{s.max_chunk_length}")
@given(message=messages)
def test_encode_agrees_with_the_layers(stack, message):
    assert outcome(stack.encode, message) == outcome(stack.encode_layered, message)


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: f"{s.name}-{s.max_chunk_length}")
@given(topic=topics | st.binary(min_size=15, max_size=17), document=documents)
def test_encode_document_agrees_with_the_layers(stack, topic, document):
    def layered(topic, document):
        return stack.encode_layered(phyllo.message_from_document(topic, document))

    assert outcome(stack.encode_document, topic, document) == outcome(layered, topic, document)


@st.composite
def frames(draw, stack):
    """The frame of a message in `stack` (before COBS), often a document, sometimes a layer's
    own message, then perhaps mangled: a byte changed, cut short, or bytes inserted."""
    payload_type = draw(st.sampled_from([0x10, 0x40, 0x05]) | st.integers(0, 0xFF))
    body = draw(st.binary(max_size=40))
    if payload_type == 0x40 and draw(st.booleans()):
        body = bytes((draw(st.sampled_from([0x11, 0x50, 0x12])), 0)) + body
    topic = draw(st.binary(max_size=15))
    frame = bytes((payload_type, len(topic))) + topic + body
    carried = 0x60 if draw(st.integers(0, 5)) else draw(st.integers(0, 0xFF))
    if stack.layers == REDUCED.layers:
        frame = _pack_validated_datagram(carried, frame)
        carried = 0x22 if draw(st.integers(0, 5)) else draw(st.integers(0, 0xFF))
    frame = bytearray(_pack_datagram(carried, frame))
    how = draw(st.sampled_from(["keep", "keep", "flip", "cut", "insert"]))
    if how == "flip":
        frame[draw(st.integers(0, len(frame) - 1))] ^= draw(st.integers(1, 255))
    elif how == "cut":
        del frame[draw(st.integers(0, len(frame))) :]
    elif how == "insert":
        at = draw(st.integers(0, len(frame)))
        frame[at:at] = draw(st.binary(min_size=1, max_size=4))
    return bytes(frame)


def wires(stack):
    """Wire bytes of a (perhaps mangled) frame, delimited or not, sometimes with a 0x00 inside."""
    return st.tuples(frames(stack), st.sampled_from(["delimited", "bare", "zero", "empty"])).map(
        lambda pair: {
            "delimited": b"\x00" + cobs.encode(pair[0]) + b"\x00",
            "bare": cobs.encode(pair[0]),
            "zero": cobs.encode(pair[0])[:3] + b"\x00" + cobs.encode(pair[0])[3:],
            "empty": b"\x00\x00",
        }[pair[1]]
    )


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: f"{s.name}-{s.max_chunk_length}")
@given(data=st.data())
def test_decode_agrees_with_the_layers(stack, data):
    wire = data.draw(wires(stack))
    assert outcome(stack.decode, wire) == outcome(
        lambda w: stack.decode_chunk_layered(stack._one_chunk(w)), wire
    )
    assert outcome(stack.decode_document, wire) == outcome(stack.decode_document_layered, wire)
    chunk = wire.strip(b"\x00")
    if chunk and b"\x00" not in chunk:
        assert outcome(stack.decode_chunk, chunk) == outcome(stack.decode_chunk_layered, chunk)


def raw_frame(stack, carried, message):
    """The frame of `message` bytes in `stack`, built by hand so that no limit is checked."""
    if stack.layers == REDUCED.layers:
        protected = bytes((carried,)) + message
        inner = ray32sub8(protected).to_bytes(4, "big") + protected
        return bytes((len(inner) % 256, 0x22)) + inner
    return bytes((len(message) % 256, carried)) + message


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: f"{s.name}-{s.max_chunk_length}")
def test_every_length_up_to_and_past_the_limits_agrees(stack):
    """Each limit (frame payload, chunk, the datagram's length byte) is crossed at one length:
    every length is tried, with payloads that COBS lengthens least and most."""
    for topic in (b"", b"fifteen-bytes!!"):
        for fill in (b"\x00", b"\x01"):
            for size in range(300):
                message = PubSubMessage(0x10, topic, fill * size)
                assert outcome(stack.encode, message) == outcome(stack.encode_layered, message)
                for topic_byte in (len(topic), 0xF0 | len(topic), 0x0F):
                    frame = raw_frame(stack, 0x60, bytes((0x40, topic_byte)) + topic + fill * size)
                    wire = cobs.encode(frame)
                    assert outcome(stack.decode, wire) == outcome(
                        lambda w: stack.decode_chunk_layered(stack._one_chunk(w)), wire
                    )
                    assert outcome(stack.decode_document, wire) == outcome(
                        stack.decode_document_layered, wire
                    )


@pytest.mark.parametrize("stack", [MINIMAL, REDUCED], ids=lambda s: s.name)
@given(
    message=st.builds(PubSubMessage, st.integers(0, 0xFF), topics, st.binary(max_size=200))
)
def test_the_fused_path_answers_for_every_well_formed_message(stack, message):
    """Without this, the agreement tests could pass with the fused path never taken."""
    wire = stack.fused.encode(message.payload_type, message.topic, message.payload)
    assert wire == stack.encode_layered(message)
    assert stack.fused.decode_chunk(wire[1:-1]) == message


@pytest.mark.parametrize("stack", [MINIMAL, REDUCED], ids=lambda s: s.name)
def test_the_fused_path_answers_for_a_document(stack):
    document = phyllo.serialize({"c": 21.5})
    wire = stack.fused.encode_document(b"temp", document)
    assert wire == stack.encode_layered(phyllo.message_from_document(b"temp", document))
    assert stack.fused.decode_document_chunk(wire[1:-1]) == (b"temp", document)
    assert stack.decode_document(wire) == (b"temp", document)


def test_a_layer_message_is_not_a_document():
    wire = MINIMAL.encode_layered(PubSubMessage(0x40, b"t", b"\x11\x00\xc0"))
    datagram_info = b"\x00" + cobs.encode(_pack_datagram(0x05, b"hi")) + b"\x00"
    assert MINIMAL.decode_document(wire) == (b"t", Document(0x11, 0, b"\xc0"))
    with pytest.raises(UnknownType, match="Datagram of payload type .* own message, not a doc"):
        MINIMAL.decode_document(datagram_info)


def test_a_stack_without_a_fused_path_takes_the_layers():
    validated_only = Stack("validated only", (VALIDATED_DATAGRAM_LAYER,))
    assert validated_only.fused is None
    message = PubSubMessage(0x10, b"t", b"payload")
    assert validated_only.decode(validated_only.encode(message)) == message
