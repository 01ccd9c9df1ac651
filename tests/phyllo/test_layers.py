"""Phyllo layers on a real pty: the preset stacks put the NOTES.md wire examples on the line byte
for byte and read them back; line noise, corruption, layer messages, and a stack a user composed.
"""

from __future__ import annotations

import random

import pytest
import pytest_twisted

from tests.phyllo.conftest import (
    DOCUMENT_MINIMAL_WIRE,
    DOCUMENT_REDUCED_WIRE,
    MESSAGE_MINIMAL_WIRE,
    MESSAGE_REDUCED_WIRE,
    received,
)
from tests.support import eventually
from wireproto.codecs.phyllo import (
    MINIMAL,
    REDUCED,
    Datagram,
    ValidatedDatagram,
    encode_chunk,
    encode_datagram,
    encode_frame,
    encode_message,
    encode_validated_datagram,
    message_from_document,
    serialize,
)
from wireproto.phyllo import (
    ChunkedStream,
    DatagramLayer,
    DocumentLink,
    Endpoint,
    FrameLayer,
    MessageLink,
    PubSubDocument,
    PubSubMessage,
    ValidatedDatagramLayer,
    build_stack,
    minimal_stack,
    reduced_stack,
)

ECHO = PubSubMessage(0x10, b"echo", b"hello")
HELLO = PubSubDocument.of("echo", "hello")  # msgpack, schemaless

EXAMPLES = [
    pytest.param("minimal", False, MESSAGE_MINIMAL_WIRE, id="message-minimal"),
    pytest.param("reduced", False, MESSAGE_REDUCED_WIRE, id="message-reduced"),
    pytest.param("minimal", True, DOCUMENT_MINIMAL_WIRE, id="document-minimal"),
    pytest.param("reduced", True, DOCUMENT_REDUCED_WIRE, id="document-reduced"),
]


def preset(name: str, documents: bool):
    """A builder of the named preset stack, with a document link on top if asked."""
    if documents:
        return lambda: DocumentLink(build_stack(name))
    return lambda: build_stack(name)


# --- the NOTES.md wire examples ----------------------------------------------------------------


@pytest.mark.parametrize("name, documents, wire", EXAMPLES)
@pytest_twisted.ensureDeferred
async def test_the_wire_examples_go_out_byte_for_byte(line, name, documents, wire):
    top = await line.open(preset(name, documents))
    top.send(HELLO if documents else ECHO)
    assert await line.read(len(wire)) == wire


@pytest.mark.parametrize("name, documents, wire", EXAMPLES)
@pytest_twisted.ensureDeferred
async def test_the_wire_examples_are_read_back(line, name, documents, wire):
    top = await line.open(preset(name, documents))
    line.write(wire)
    assert await received(top, 1) == [HELLO if documents else ECHO]
    # Every layer decoded exactly one unit on the way up.
    assert [c.received for c in top.stack_counters().values()] == [1] * len(top.layers())


# --- noise and corruption -------------------------------------------------------------------


def reduced_wire(n: int) -> tuple[PubSubMessage, bytes]:
    message = PubSubMessage(0x10, "echo", b"n=%d" % n)
    return message, REDUCED.encode(message)


@pytest_twisted.ensureDeferred
async def test_garbage_before_and_between_frames_is_skipped(line):
    top = await line.open(minimal_stack)
    second = PubSubMessage(0x10, "echo", b"again")
    line.write(
        b"\x17noise"  # cut off by the frame's leading delimiter; not COBS
        + MESSAGE_MINIMAL_WIRE
        + b"\x05\x05\x05\x00"  # COBS announces more bytes than there are
        + b"\x03\x05\x60\x00"  # good COBS, but a datagram length of 5 with nothing after it
        + b"line noise"
        + MINIMAL.encode(second)
    )
    assert await received(top, 2) == [ECHO, second]
    counters = top.stack_counters()
    assert counters["frame"].framing_errors == 3
    assert counters["datagram"].framing_errors == 1
    assert counters["message link"].received == 2
    assert not top.has_receive()


@pytest_twisted.ensureDeferred
async def test_random_garbage_between_frames_costs_no_frame(line):
    rng = random.Random(7)
    top = await line.open(reduced_stack)
    sent = []
    stream = bytearray()
    for n in range(30):
        stream += rng.randbytes(rng.randrange(40))
        message, wire = reduced_wire(n)
        sent.append(message)
        stream += wire
    line.write(bytes(stream))
    # Nothing but the frames, in order: garbage never passes the CRC.
    assert await received(top, 30) == sent
    assert not top.has_receive()


@pytest_twisted.ensureDeferred
async def test_a_corrupted_byte_on_the_reduced_stack_is_counted_and_never_delivered(line):
    top = await line.open(reduced_stack)
    corrupted = bytearray(MESSAGE_REDUCED_WIRE)
    corrupted[MESSAGE_REDUCED_WIRE.index(b"hello")] ^= 0x01  # "iello": still valid COBS
    after, after_wire = reduced_wire(1)
    line.write(bytes(corrupted) + after_wire)
    assert await received(top, 1) == [after]
    counters = top.stack_counters()
    assert counters["validated datagram"].crc_errors == 1
    assert counters["validated datagram"].received == 1
    assert counters["message link"].received == 1


@pytest_twisted.ensureDeferred
async def test_one_percent_corruption_delivers_exactly_the_intact_frames(line):
    rng = random.Random(11)
    got: list[PubSubMessage] = []
    top = await line.open(reduced_stack)
    top.on_receive = got.append
    intact = []
    stream = bytearray()
    for n in range(150):
        message, wire = reduced_wire(n)
        noisy = bytes(b ^ rng.randrange(1, 256) if rng.random() < 0.01 else b for b in wire)
        if noisy == wire:
            intact.append(message)
        stream += noisy
    last, last_wire = reduced_wire(1000)
    line.write(bytes(stream) + last_wire)
    await eventually(lambda: got and got[-1] == last)
    assert got == [*intact, last]
    assert len(intact) < 150  # the seed does corrupt some frames
    assert top.stack_counters()["validated datagram"].crc_errors >= 1


# --- layer messages --------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_layer_messages_are_counted_and_never_handed_up(line):
    top = await line.open(minimal_stack)
    datagram = top.below
    seen: list[object] = []
    datagram.on_layer_message = seen.append
    top.on_layer_message = seen.append
    boot = encode_chunk(encode_frame(encode_datagram(Datagram(0x05, b"boot"))))
    info = MINIMAL.encode(PubSubMessage(0x05, "log", b"info"))
    reliable = encode_chunk(encode_frame(encode_datagram(Datagram(0x23, b"x"))))
    line.write(boot + info + reliable + MESSAGE_MINIMAL_WIRE)
    assert await received(top, 1) == [ECHO]
    assert seen == [Datagram(0x05, b"boot"), PubSubMessage(0x05, b"log", b"info")]
    assert datagram.counters.layer_messages == 1
    assert top.counters.layer_messages == 1
    assert datagram.counters.type_errors == 1  # 0x23 is not what a minimal datagram carries
    # A layer sends its own messages too.
    datagram.send_layer_message(0x05, b"hi")
    wire = encode_chunk(encode_frame(encode_datagram(Datagram(0x05, b"hi"))))
    assert await line.read(len(wire)) == wire


# --- composing ---------------------------------------------------------------------------------


def test_the_presets_are_compositions_of_the_layers():
    minimal = minimal_stack()
    assert [type(layer) for layer in minimal.layers()] == [
        ChunkedStream, FrameLayer, DatagramLayer, MessageLink,
    ]
    assert minimal.below.carries == 0x60
    reduced = reduced_stack()
    assert [type(layer) for layer in reduced.layers()] == [
        ChunkedStream, FrameLayer, DatagramLayer, ValidatedDatagramLayer, MessageLink,
    ]
    validated, datagram = reduced.below, reduced.below.below
    assert (datagram.carries, validated.carries) == (0x22, 0x60)
    assert reduced.bottom is reduced.layers()[0] and reduced.bottom.top is reduced
    with pytest.raises(ValueError, match="standard stack, with the reliable buffer, is not"):
        build_stack("standard")


def uno_crc_endpoint() -> Endpoint:
    """A user's stack: the validated datagram straight on the frame (no datagram layer), with an
    Uno's 80-byte chunks, documents, and an endpoint for `temp`."""
    chunks = ChunkedStream(max_length=80)
    link = MessageLink(ValidatedDatagramLayer(FrameLayer(chunks, max_length=78)))
    return Endpoint(DocumentLink(link), "temp")


def uno_wire(value: float) -> bytes:
    message = message_from_document("temp", serialize(value))
    validated = encode_validated_datagram(ValidatedDatagram(0x60, encode_message(message)))
    return encode_chunk(encode_frame(validated), 80)


@pytest_twisted.ensureDeferred
async def test_a_user_composed_stack(line):
    top = await line.open(uno_crc_endpoint)
    assert [type(layer).__name__ for layer in top.layers()] == [
        "ChunkedStream", "FrameLayer", "ValidatedDatagramLayer", "MessageLink", "DocumentLink",
        "Endpoint",
    ]
    top.send_value(21.5)
    wire = uno_wire(21.5)
    assert await line.read(len(wire)) == wire
    # An over-long chunk is dropped up to the next delimiter; the next frame arrives.
    line.write(b"\x00" + b"\x01" * 100 + uno_wire(22.0))
    assert await received(top, 1) == [PubSubDocument.of("temp", 22.0)]
    assert top.stack_counters()["chunked stream"].framing_errors == 1
