"""Phyllo: every decoder fed arbitrary and nearly-valid bytes, and streams fed in any pieces.

Decoders may only return a value or raise ProtocolError. The chunk splitter and the stack
decoder must give the same result whether a stream comes at once or one byte at a time.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wireproto.codecs import phyllo
from wireproto.codecs.phyllo import MINIMAL, REDUCED, ChunkSplitter, PubSubMessage, StackDecoder
from wireproto.errors import ProtocolError


def decode_document_fully(data):
    return phyllo.deserialize(phyllo.decode_document(data))


def decode_reduced(data):
    return REDUCED.decode(data)


DECODERS = [
    phyllo.decode,
    decode_reduced,
    phyllo.decode_frame,
    phyllo.decode_datagram,
    phyllo.decode_validated_datagram,
    phyllo.decode_message,
    phyllo.decode_document,
    decode_document_fully,
]


def only_protocol_errors(decoder, data):
    try:
        decoder(data)
    except ProtocolError:
        pass


messages = st.builds(
    PubSubMessage, st.integers(0, 0xFF), st.binary(max_size=15), st.binary(max_size=229)
)


@st.composite
def mangled(draw, valid):
    """A valid encoding with one byte changed, cut short, or bytes inserted."""
    data = bytearray(draw(valid))
    how = draw(st.sampled_from(["flip", "cut", "insert"]))
    if how == "flip" and data:
        data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
    elif how == "cut":
        del data[draw(st.integers(0, len(data))) :]
    else:
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=4))
    return bytes(data)


wires = messages.map(MINIMAL.encode) | messages.map(REDUCED.encode)
layer_bytes = st.one_of(
    messages.map(phyllo.encode_message),
    messages.map(MINIMAL.encode).map(lambda w: phyllo.decode_frame(w[1:-1])),
    st.binary(max_size=250).map(
        lambda p: phyllo.encode_validated_datagram(phyllo.ValidatedDatagram(0x60, p))
    ),
    st.sampled_from([b"\x11\x00", b"\x50\x00", b"\x12\x00"]).flatmap(
        lambda header: st.binary(max_size=20).map(lambda body: header + body)
    ),
)


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda d: d.__name__)
@given(data=st.binary(max_size=300) | mangled(wires) | mangled(layer_bytes))
def test_decoders_raise_only_protocol_errors(decoder, data):
    only_protocol_errors(decoder, data)


@given(st.binary(max_size=600) | mangled(wires))
def test_stream_receivers_never_raise(data):
    ChunkSplitter().feed(data)
    decoder = StackDecoder(REDUCED)
    decoder.feed(data)
    assert all(isinstance(e, ProtocolError) for e in decoder.errors)


# --- incremental feeding --------------------------------------------------------------------------


def reference_chunks(stream, max_length):
    """What a splitter must give for the whole stream, and how many chunks it must report."""
    *complete, tail = stream.split(b"\x00")
    good = [part for part in complete if 0 < len(part) <= max_length]
    dropped = sum(len(part) > max_length for part in complete) + (len(tail) > max_length)
    return good, dropped


def feed_in_pieces(receiver, stream, cuts):
    received, errors = [], []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        received += receiver.feed(stream[start:end])
        errors += receiver.errors
    return received, errors


noisy_streams = st.lists(
    st.binary(max_size=12) | st.binary(max_size=12).map(lambda b: b.replace(b"\x00", b"\x01")),
    max_size=12,
).map(b"\x00".join)


@given(noisy_streams, st.integers(1, 8), st.data())
def test_splitter_matches_a_plain_split_whatever_the_pieces(stream, max_length, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    received, errors = feed_in_pieces(ChunkSplitter(max_length), stream, cuts)
    good, dropped = reference_chunks(stream, max_length)
    assert received == good
    assert len(errors) == dropped
    byte_by_byte = feed_in_pieces(ChunkSplitter(max_length), stream, range(1, len(stream)))
    assert [e.offset for e in byte_by_byte[1]] == [e.offset for e in errors]


def error_summary(errors):
    return sorted((type(e).__name__, str(e), e.offset) for e in errors)


@pytest.mark.parametrize("stack", [MINIMAL, REDUCED], ids=["minimal", "reduced"])
@given(
    sent=st.lists(messages, max_size=5),
    noise=st.lists(st.binary(max_size=40) | st.binary(min_size=250, max_size=300), max_size=6),
    data=st.data(),
)
def test_stack_decoder_byte_by_byte_equals_all_at_once(stack, sent, noise, data):
    pieces = [stack.encode(message) for message in sent]
    for junk in noise:
        pieces.insert(data.draw(st.integers(0, len(pieces))), junk)
    stream = b"".join(pieces)

    whole = StackDecoder(stack)
    at_once = whole.feed(stream)
    at_once_layer, at_once_errors = whole.layer_messages, whole.errors

    one_by_one, layer, errors = [], [], []
    decoder = StackDecoder(stack)
    for i in range(len(stream)):
        one_by_one += decoder.feed(stream[i : i + 1])
        layer += decoder.layer_messages
        errors += decoder.errors

    assert one_by_one == at_once
    assert layer == at_once_layer
    assert error_summary(errors) == error_summary(at_once_errors)
    # every message sent arrives, in order, whatever noise lies between them
    arrived = iter(at_once)
    assert all(any(m == got for got in arrived) for m in sent if m.payload_type >= 0x10)
