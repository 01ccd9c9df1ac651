"""Framed stream adapter: each framing's edge cases, bad frames closing only their connection,
the connection cap, prepared messages, pausing and backpressure."""

from __future__ import annotations

import socket
import struct

import pytest
import pytest_twisted
from cobs import cobs
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import reactor
from twisted.internet.error import ConnectionLost

from tests.support import eventually, sleep, wait_for
from tests.transports.conftest import CHUNK, CHUNKS, Echo, Flooder, Net, Recorder
from wireproto.errors import InvalidField
from wireproto.transports import FRAMINGS, StreamOptions, connect, stream_server_factory

# Every test on both fast paths: the length32 cut and its frame limit are theirs.
pytestmark = pytest.mark.usefixtures("fast_path")


def length32(*messages: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(m)) + m for m in messages)


def cobs_frames(*messages: bytes) -> bytes:
    return b"".join(cobs.encode(m) + b"\x00" for m in messages)


async def serve(net: Net, protocol: type[Recorder] = Echo, **options) -> int:
    factory = stream_server_factory(net.factory(protocol), StreamOptions(**options))
    return await net.listen_tcp(factory)


async def client(net: Net, port: int, framing: str = "length32") -> Recorder:
    address = f"tcp:host=127.0.0.1:port={port}"
    return await wait_for(connect(reactor, address, net.factory(Recorder), framing=framing))


def servers(net: Net, protocol: type[Recorder] = Echo) -> list[Recorder]:
    return [p for p in net.protocols if type(p) is protocol]


@pytest_twisted.ensureDeferred
async def test_over_size_length32_frame_closes_only_that_connection(net):
    port = await serve(net, max_message_size=1000)
    bystander = await client(net, port)
    raw = await net.raw_connect(port)
    raw.transport.write(length32(b"first", b"x" * 1000) + struct.pack(">I", 1001) + b"x" * 10)
    await wait_for(raw.closed)
    # The complete messages before the bad frame were delivered (and echoed), nothing after.
    assert raw.received == length32(b"first", b"x" * 1000)
    offender = next(p for p in servers(net) if not p.connected)
    assert offender.messages == [(b"first", True), (b"x" * 1000, True)]
    assert offender.reason.check(ConnectionLost)
    assert "length32 frame of 1001 bytes is over the limit of 1000 bytes" in str(
        offender.reason.value
    )
    bystander.transport.sendMessage(b"still here")
    assert await bystander.received(1) == [(b"still here", True)]
    assert bystander.connected


@pytest_twisted.ensureDeferred
async def test_cobs_skips_empty_frames_and_closes_on_one_that_does_not_decode(net):
    port = await serve(net, framing="cobs")
    raw = await net.raw_connect(port)
    good = cobs_frames(b"one") + b"\x00\x00" + cobs_frames(b"", b"t\x00o")
    raw.transport.write(good + b"\x05ab\x00" + cobs_frames(b"never"))
    await wait_for(raw.closed)
    (server,) = servers(net)
    assert server.messages == [(b"one", True), (b"", True), (b"t\x00o", True)]
    assert raw.received == cobs_frames(b"one", b"", b"t\x00o")
    assert "COBS frame of 3 bytes does not decode" in str(server.reason.value)


@pytest.mark.parametrize(
    "payload",
    [cobs_frames(b"y" * 101), b"\x01" * 200],
    ids=["whole-frame", "unterminated"],
)
@pytest_twisted.ensureDeferred
async def test_cobs_frame_over_the_limit_closes(net, payload):
    port = await serve(net, Recorder, framing="cobs", max_message_size=100)
    raw = await net.raw_connect(port)
    raw.transport.write(cobs_frames(b"y" * 100) + payload)
    await wait_for(raw.closed)
    (server,) = servers(net, Recorder)
    assert server.messages == [(b"y" * 100, True)]
    assert "is over the limit of 100 bytes" in str(server.reason.value)


@pytest_twisted.ensureDeferred
async def test_lines_strip_crlf_deliver_text_and_refuse_newlines_in_messages(net):
    port = await serve(net, Recorder, framing="lines", max_message_size=10)
    peer = await client(net, port, "lines")
    with pytest.raises(ValueError, match="cannot contain"):
        peer.transport.sendMessage(b"two\nlines")
    with pytest.raises(ValueError, match="cannot contain"):
        peer.transport.prepareMessage(b"two\nlines")
    raw = await net.raw_connect(port)
    raw.transport.write(b"crlf\r\nlf\n\n0123456789\r\n" + b"z" * 11 + b"\n")
    await wait_for(raw.closed)
    server = next(p for p in servers(net, Recorder) if not p.connected)
    lines = [b"crlf", b"lf", b"", b"0123456789"]
    assert server.messages == [(line, False) for line in lines]
    assert "line of 11 bytes" in str(server.reason.value)


@pytest_twisted.ensureDeferred
async def test_unterminated_line_over_the_limit_closes(net):
    port = await serve(net, Recorder, framing="lines", max_message_size=10)
    raw = await net.raw_connect(port)
    raw.transport.write(b"ok\n" + b"z" * 50)
    await wait_for(raw.closed)
    (server,) = servers(net, Recorder)
    assert server.messages == [(b"ok", False)]
    assert "over the limit of 10 bytes" in str(server.reason.value)


class RejectsFirst(Recorder):
    def messageReceived(self, data: bytes, binary: bool) -> None:
        super().messageReceived(data, binary)
        self.transport.loseConnection(InvalidField(f"bad message {data!r}"))


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest_twisted.ensureDeferred
async def test_nothing_is_delivered_after_the_protocol_closes_with_an_error(net, framing):
    port = await serve(net, RejectsFirst, framing=framing)
    raw = await net.raw_connect(port)
    frame = {"length32": length32, "cobs": cobs_frames}.get(
        framing, lambda *m: b"".join(x + b"\n" for x in m)
    )
    raw.transport.write(frame(b"a", b"b", b"c"))
    await wait_for(raw.closed)
    (server,) = servers(net, RejectsFirst)
    assert [data for data, _ in server.messages] == [b"a"]
    assert server.reason.check(ConnectionLost)
    assert "bad message b'a'" in str(server.reason.value)


@pytest_twisted.ensureDeferred
async def test_connections_beyond_max_connections_are_closed_at_once(net):
    factory = stream_server_factory(net.factory(Echo), StreamOptions(max_connections=1))
    port = await net.listen_tcp(factory)
    first = await client(net, port)
    refused = await net.raw_connect(port)
    await wait_for(refused.closed)
    assert refused.received == b""
    assert len(servers(net)) == 1
    first.transport.sendMessage(b"served")
    assert await first.received(1) == [(b"served", True)]
    # A closed connection frees its slot.
    first.transport.loseConnection()
    await eventually(lambda: factory.connection_count == 0)
    second = await client(net, port)
    second.transport.sendMessage(b"served too")
    assert await second.received(1) == [(b"served too", True)]


@pytest_twisted.ensureDeferred
async def test_prepared_message_fans_out(net):
    port = await serve(net, Recorder, framing="cobs")
    peers = [await client(net, port, "cobs") for _ in range(3)]
    await eventually(lambda: len(servers(net, Recorder)) == 6)
    senders = [p for p in servers(net, Recorder) if p not in peers]
    prepared = senders[0].transport.prepareMessage(b"to\x00all")
    assert prepared == cobs_frames(b"to\x00all")
    assert {s.transport.prepareKey for s in senders} == {peers[0].transport.prepareKey}
    for sender in senders:
        sender.transport.sendPrepared(prepared)
    for peer in peers:
        assert await peer.received(1) == [(b"to\x00all", True)]


@pytest_twisted.ensureDeferred
async def test_pausing_stops_reading_until_resumed(net):
    port = await serve(net, Recorder)
    peer = await client(net, port)
    await eventually(lambda: len(servers(net, Recorder)) == 2)
    (server,) = [p for p in servers(net, Recorder) if p is not peer]
    server.transport.pauseProducing()
    peer.transport.sendMessage(b"wait")
    await sleep(0.1)
    assert server.messages == []
    server.transport.resumeProducing()
    assert await server.received(1) == [(b"wait", True)]


@pytest_twisted.ensureDeferred
async def test_backpressure_from_a_peer_that_does_not_read(net):
    port = await net.listen_tcp(stream_server_factory(net.factory(Flooder)))
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        (server,) = await eventually(lambda: servers(net, Flooder))
        handle = server.transport.transport.getHandle()
        handle.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        for _ in range(CHUNKS):
            server.transport.sendMessage(CHUNK)
        assert "pause" in server.probe.calls
        await sleep(0.1)
        assert "resume" not in server.probe.calls, "resumed although the peer reads nothing"

        expected = CHUNKS * (4 + len(CHUNK))
        received = bytearray()

        def drain() -> bool:
            while True:
                try:
                    chunk = sock.recv(1 << 20)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                received.extend(chunk)
            return len(received) >= expected

        await eventually(drain, interval=0.002)
        assert bytes(received) == length32(*[CHUNK] * CHUNKS)
        await eventually(lambda: server.probe.calls[-1] == "resume")
    finally:
        sock.close()


def test_options_refuse_unknown_framing_and_bad_limits():
    with pytest.raises(ValueError, match="unknown stream framing 'json': use one of length32"):
        StreamOptions(framing="json")
    with pytest.raises(ValueError, match="max_message_size"):
        StreamOptions(max_message_size=2**32)
    with pytest.raises(ValueError, match="max_connections"):
        StreamOptions(max_connections=0)


class FrameLog:
    """An IFrameObserver that keeps what it is told."""

    def __init__(self) -> None:
        self.reads = 0
        self.frames: list[bytes] = []
        self.sent: list[bytes] = []

    def readStarting(self) -> None:
        self.reads += 1

    def framesReceived(self, frames: bytes) -> None:
        self.frames.append(frames)

    def framesSent(self, frames: bytes) -> None:
        self.sent.append(frames)


class Messages:
    def __init__(self) -> None:
        self.received: list[bytes] = []

    def messageReceived(self, data: bytes, binary: bool) -> None:
        self.received.append(data)


def length32_transport(max_message_size: int = 64):
    from twisted.internet.testing import StringTransport

    from wireproto.transports.base import ILengthPrefixedFrames
    from wireproto.transports.stream import Length32MessageTransport

    transport = Length32MessageTransport(max_message_size)
    assert ILengthPrefixedFrames.providedBy(transport)
    transport.transport = StringTransport()
    transport.wrapped = Messages()
    observer = FrameLog()
    transport.observeFrames(observer)
    return transport, observer


@given(
    messages=st.lists(st.binary(max_size=40), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10),
)
def test_length32_frames_cut_anywhere_come_out_whole_and_are_observed_as_they_came(
    messages, cuts
):
    stream = length32(*messages)
    points = sorted({cut % (len(stream) + 1) for cut in cuts} | {0, len(stream)})
    pieces = [stream[a:b] for a, b in zip(points, points[1:], strict=False)]
    transport, observer = length32_transport()
    for piece in pieces:
        transport.dataReceived(piece)
    assert transport.wrapped.received == messages
    assert b"".join(observer.frames) == stream
    assert observer.reads == len(pieces)
    assert all(frames for frames in observer.frames)


def test_an_oversized_length32_frame_stops_delivery_after_the_frames_before_it():
    transport, observer = length32_transport(max_message_size=8)
    good = length32(b"one", b"two")
    transport.dataReceived(good + struct.pack(">I", 9) + b"x" * 9 + length32(b"three"))
    assert transport.wrapped.received == [b"one", b"two"]
    assert observer.frames == [good]
    assert transport.paused and transport.transport.disconnecting
    transport.dataReceived(length32(b"four"))
    assert transport.wrapped.received == [b"one", b"two"]
