"""The document link, endpoints (exact and prefix), endpoint handlers and the router, on a pty."""

from __future__ import annotations

import pytest
import pytest_twisted

from tests.phyllo.conftest import received
from tests.support import eventually
from wireproto.codecs.phyllo import MINIMAL, REDUCED, message_from_document, serialize
from wireproto.errors import InvalidTopic
from wireproto.phyllo import (
    Document,
    DocumentLink,
    Endpoint,
    EndpointHandler,
    Format,
    PubSubDocument,
    PubSubMessage,
    Router,
    SingleEndpointHandler,
    TopicFilter,
    minimal_stack,
    reduced_stack,
)


def document_wire(topic: str, value: object, stack=MINIMAL) -> bytes:
    return stack.encode(message_from_document(topic, serialize(value)))


@pytest_twisted.ensureDeferred
async def test_an_endpoint_passes_its_topic_exactly(line):
    top = await line.open(lambda: Endpoint(DocumentLink(minimal_stack()), "temp"))
    line.write(
        document_wire("temp2", 1)
        + document_wire("tem", 2)
        + document_wire("temp", 21.5)
        + document_wire("temp", 22.0)
    )
    assert await received(top, 2) == [
        PubSubDocument.of("temp", 21.5),
        PubSubDocument.of("temp", 22.0),
    ]
    assert top.counters.filtered == 2
    top.send_value(23)
    wire = document_wire("temp", 23)
    assert await line.read(len(wire)) == wire
    with pytest.raises(InvalidTopic, match="does not belong to the endpoint of topic b'temp'"):
        top.send(PubSubDocument.of("humidity", 40))


@pytest_twisted.ensureDeferred
async def test_a_prefix_endpoint_passes_every_topic_under_it(line):
    top = await line.open(lambda: Endpoint(DocumentLink(minimal_stack()), "sensor/", prefix=True))
    line.write(
        document_wire("sensor/a", 1)
        + document_wire("sensors", 2)
        + document_wire("sensor", 3)
        + document_wire("sensor/b", 4)
    )
    got = await received(top, 2)
    assert [(d.topic, d.value) for d in got] == [(b"sensor/a", 1), (b"sensor/b", 4)]
    assert top.counters.filtered == 2
    assert top.filter.suffix(got[1].topic) == b"b"
    # A Document goes on the prefix itself; a PubSubDocument on any topic under it.
    top.send(serialize(5))
    top.send(PubSubDocument.of("sensor/c", 6))
    wire = document_wire("sensor/", 5) + document_wire("sensor/c", 6)
    assert await line.read(len(wire)) == wire


def test_topic_filters():
    assert TopicFilter("temp").matches(b"temp")
    assert not TopicFilter("temp").matches(b"temp/1")
    assert TopicFilter(b"", prefix=True).matches(b"anything")
    with pytest.raises(InvalidTopic, match="at most 15 fit"):
        TopicFilter("a-topic-that-is-too-long")


class Led(SingleEndpointHandler):
    """A firmware-style handler: keeps the state it is sent and acknowledges it."""

    def __init__(self) -> None:
        super().__init__("led")
        self.states: list[object] = []

    def on_receive(self, document: PubSubDocument) -> None:
        self.states.append(document.value)
        self.send_value({"ack": document.value})


@pytest_twisted.ensureDeferred
async def test_the_router_gives_each_document_to_its_handlers(line):
    parts: dict[str, object] = {}

    def build() -> Router:
        router = Router(DocumentLink(reduced_stack()))
        parts["temps"] = []
        parts["sensors"] = []
        parts["all"] = []
        router.subscribe(SingleEndpointHandler("temp", on_receive=parts["temps"].append))
        router.subscribe(
            SingleEndpointHandler("sensor/", prefix=True, on_receive=parts["sensors"].append)
        )
        parts["led"] = router.subscribe(Led())
        parts["everything"] = router.subscribe(EndpointHandler(parts["all"].append))
        parts["log"] = Endpoint(router, "log")  # an endpoint layer, sharing the router
        return router

    router = await line.open(build)
    assert router.top is router and parts["log"].bottom is router.bottom
    documents = [("temp", 21.5), ("led", True), ("sensor/x", 1), ("log", "boot"), ("misc", 0)]
    line.write(b"".join(document_wire(topic, value, REDUCED) for topic, value in documents))
    assert await received(parts["log"], 1) == [PubSubDocument.of("log", "boot")]
    await eventually(lambda: len(parts["all"]) == 5)
    assert [(d.topic.decode(), d.value) for d in parts["all"]] == documents
    assert [d.value for d in parts["temps"]] == [21.5]
    assert [d.value for d in parts["sensors"]] == [1]
    assert parts["led"].states == [True]
    ack = document_wire("led", {"ack": True}, REDUCED)
    assert await line.read(len(ack)) == ack
    assert router.counters.filtered == 0  # the catch-all handler took "misc"

    # Without the catch-all, a document on no handler's topic is counted, not lost silently.
    router.unsubscribe(parts["everything"])
    line.write(document_wire("misc", 1, REDUCED) + document_wire("temp", 22.0, REDUCED))
    await eventually(lambda: len(parts["temps"]) == 2)
    assert router.counters.filtered == 1
    assert router.counters.received == 7


@pytest_twisted.ensureDeferred
async def test_a_failing_handler_does_not_stop_the_others(line):
    got: list[PubSubDocument] = []

    def broken(document: PubSubDocument) -> None:
        raise RuntimeError("handler bug")

    def build() -> Router:
        router = Router(DocumentLink(minimal_stack()))
        router.subscribe(SingleEndpointHandler("temp", on_receive=broken))
        router.subscribe(SingleEndpointHandler("temp", on_receive=got.append))
        return router

    router = await line.open(build)
    line.write(document_wire("temp", 1) + document_wire("temp", 2))
    await eventually(lambda: len(got) == 2)
    assert router.counters.callback_errors == 2


@pytest_twisted.ensureDeferred
async def test_the_document_link_reads_json_carries_cbor_and_drops_the_rest(line):
    top = await line.open(lambda: DocumentLink(minimal_stack()))
    top.send_value("cfg", {"a": 1}, format=Format.JSON)
    wire = MINIMAL.encode(PubSubMessage(0x40, "cfg", b'\x50\x00{"a":1}'))
    assert await line.read(len(wire)) == wire

    def doc(payload: bytes, payload_type: int = 0x40) -> bytes:
        return MINIMAL.encode(PubSubMessage(payload_type, "d", payload))

    line.write(
        doc(b'\x50\x00{"a":1}')  # JSON
        + doc(b"\x12\x00\xa1\x61\x61\x01")  # CBOR {"a": 1}: carried, not read
        + doc(b"\x11\x00\xc1")  # msgpack 0xc1 is never used: a decode error
        + doc(b'\x50\x00{"a":')  # truncated JSON: a decode error
        + doc(b"\x13\x00\x05")  # BSON: a format wireproto does not carry
        + doc(b"raw bytes", payload_type=0x10)  # not a document
        + doc(b"\x11")  # no schema byte
        + doc(b"\x11\x00\x2a")  # msgpack 42
    )
    got = await received(top, 3)
    assert got == [
        PubSubDocument(b"d", Document(0x50, 0x00, b'{"a":1}'), {"a": 1}),
        PubSubDocument(b"d", Document(0x12, 0x00, b"\xa1\x61\x61\x01"), None),
        PubSubDocument(b"d", Document(0x11, 0x00, b"\x2a"), 42),
    ]
    counters = top.counters
    assert (counters.decode_errors, counters.type_errors, counters.framing_errors) == (2, 2, 1)
