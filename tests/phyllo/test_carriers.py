"""The same Phyllo stack above the chunk layer on other carriers: a real WebSocket over 127.0.0.1,
where one binary message is one chunk, and a TCP stream, where the chunked stream cuts bytes."""

from __future__ import annotations

import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, serverFromString

from tests.phyllo.conftest import MESSAGE_REDUCED_WIRE, received
from tests.support import eventually, wait_for
from tests.transports.conftest import Recorder
from wireproto.phyllo import (
    DocumentLink,
    LayerBase,
    MessageChunks,
    PubSubDocument,
    PubSubMessage,
    StackFactory,
    connect_stack,
    reduced_stack,
)
from wireproto.transports import connect, websocket_resource, websocket_site

ECHO = PubSubMessage(0x10, b"echo", b"hello")


class Carriers:
    """Listening ports and stacks a test opened, closed at its end."""

    def __init__(self) -> None:
        self.ports: list = []
        self.stacks: list[LayerBase] = []
        self.recorders: list[Recorder] = []

    async def listen(self, factory) -> int:
        endpoint = serverFromString(reactor, "tcp:0:interface=127.0.0.1")
        port = await wait_for(endpoint.listen(factory))
        self.ports.append(port)
        return port.getHost().port

    def recorder(self) -> Recorder:
        recorder = Recorder()
        self.recorders.append(recorder)
        return recorder

    def echo_stack(self, bottom=None) -> LayerBase:
        """A reduced stack that sends every message back."""
        top = reduced_stack(bottom)
        top.on_receive = top.send
        self.stacks.append(top)
        return top

    async def close(self) -> None:
        for top in self.stacks:
            if top.lost_reason is None:
                lost = top.when_lost()
                top.lose_connection()
                await wait_for(lost)
        for recorder in self.recorders:
            if recorder.connected:
                recorder.transport.abortConnection()
                await wait_for(recorder.lost)
        for port in self.ports:
            await wait_for(defer.maybeDeferred(port.stopListening))


@pytest_twisted.async_yield_fixture
async def carriers():
    tracker = Carriers()
    try:
        yield tracker
    finally:
        await tracker.close()


@pytest_twisted.ensureDeferred
async def test_over_websocket_one_binary_message_is_one_chunk(carriers):
    port = await carriers.listen(
        websocket_site(
            {
                "/raw": websocket_resource(carriers.recorder),
                "/echo": websocket_resource(lambda: carriers.echo_stack(MessageChunks()).bottom),
            }
        )
    )

    def client(documents: bool = False):
        def build() -> MessageChunks:
            top = reduced_stack(MessageChunks())
            top = DocumentLink(top) if documents else top
            carriers.stacks.append(top)
            return top.bottom

        return build

    # Byte for byte: one message is the chunk of the NOTES.md example, without delimiters.
    bottom = await wait_for(connect(reactor, f"ws://127.0.0.1:{port}/raw", client()))
    top = bottom.top
    await eventually(lambda: carriers.recorders and carriers.recorders[0].connected)
    server = carriers.recorders[0]
    top.send(ECHO)
    assert await server.received(1) == [(MESSAGE_REDUCED_WIRE[1:-1], True)]
    server.transport.sendMessage(b"not a chunk", False)
    server.transport.sendMessage(MESSAGE_REDUCED_WIRE[1:-1])
    assert await received(top, 1) == [ECHO]
    assert bottom.counters.framing_errors == 1  # the text message

    # The same document stack on both ends, one of them echoing.
    echo_client = await wait_for(connect(reactor, f"ws://127.0.0.1:{port}/echo", client(True)))
    echo_client.top.send_value("echo", {"t": 21.5})
    assert await received(echo_client.top, 1) == [PubSubDocument.of("echo", {"t": 21.5})]


@pytest_twisted.ensureDeferred
async def test_over_tcp_the_chunked_stream_cuts_the_bytes(carriers):
    port = await carriers.listen(StackFactory(carriers.echo_stack))
    top = await wait_for(
        connect_stack(TCP4ClientEndpoint(reactor, "127.0.0.1", port), reduced_stack)
    )
    carriers.stacks.append(top)
    top.send(ECHO)
    assert await received(top, 1) == [ECHO]


@pytest_twisted.ensureDeferred
async def test_over_websocket_the_health_counts_messages_as_chunks(carriers):
    port = await carriers.listen(websocket_site({"/raw": websocket_resource(carriers.recorder)}))

    def build() -> MessageChunks:
        top = reduced_stack(MessageChunks())
        carriers.stacks.append(top)
        return top.bottom

    bottom = await wait_for(connect(reactor, f"ws://127.0.0.1:{port}/raw", build))
    await eventually(lambda: carriers.recorders and carriers.recorders[0].connected)
    server = carriers.recorders[0]
    assert bottom.health.last_chunk_at is None
    bottom.top.send(ECHO)
    await server.received(1)
    server.transport.sendMessage(b"\x7f" * 300)  # over the 255-byte chunk limit
    server.transport.sendMessage(b"not a chunk", False)
    server.transport.sendMessage(MESSAGE_REDUCED_WIRE[1:-1])
    assert await received(bottom.top, 1) == [ECHO]
    health = bottom.health
    assert health.bytes_sent == len(MESSAGE_REDUCED_WIRE) - 2  # no delimiters on a message
    assert health.bytes_received == 300 + len(b"not a chunk") + len(MESSAGE_REDUCED_WIRE) - 2
    assert health.resyncs == 1 and bottom.counters.framing_errors == 2
    assert bottom.counters.received == 1 and health.last_chunk_at is not None
