"""The WebSocket fast path: the frame pieces of wireproto.speedups (compiled and plain Python, held
to the same answers on the same bytes, hostile ones included), and the connection's outbox on
real sockets: what a read's handling sends goes out in order with Autobahn's own frames (pongs,
closes), nothing follows a close frame, and an aborted connection forgets what waited."""

from __future__ import annotations

import os

import pytest
import pytest_twisted
from autobahn.websocket.protocol import PreparedMessage
from twisted.internet import reactor
from twisted.internet.endpoints import SSL4ClientEndpoint
from twisted.internet.protocol import Factory
from twisted.internet.ssl import CertificateOptions

from tests.support import eventually, wait_for
from tests.transports.conftest import Echo, RawClient, Recorder
from tests.transports.test_websocket import serve, upgrade_request
from tests.transports.test_websocket_frames import MASK, client_frame, handshake
from wireproto import speedups
from wireproto.hub import HubSettings
from wireproto.speedups import _pure
from wireproto.transports import WebSocketOptions, websocket_resource, websocket_site

pytestmark = pytest.mark.usefixtures("fast_path")

compiled = speedups.IMPLEMENTATIONS["compiled"]
twins = [_pure] + ([compiled] if compiled is not None else [])


class Gate:
    open = True


def read_all(module, data: bytes, *, masked: bool = True, limit: int = 0,
             check_utf8: bool = True, start: int = 0) -> tuple[list[tuple[bytes, bool]], int]:
    delivered: list[tuple[bytes, bool]] = []
    end = module.ws_deliver(data, start, masked, limit, check_utf8,
                            lambda payload, binary: delivered.append((payload, binary)), Gate())
    return delivered, end


def same_on_both(data: bytes, **options) -> tuple[list[tuple[bytes, bool]], int]:
    """What every built twin reads of `data`, which must be the same."""
    answers = [read_all(module, data, **options) for module in twins]
    assert all(answer == answers[0] for answer in answers), answers
    return answers[0]


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 70000])
@pytest.mark.parametrize("binary", [True, False])
def test_a_prepared_server_frame_is_the_one_autobahn_prepares(size, binary):
    payload = os.urandom(size) if binary else b"t" * size
    expected = PreparedMessage(payload, binary, False, True).payloadHybi
    assert speedups.ws_frame(payload, binary) == expected
    assert all(module.ws_frame(payload, binary) == expected for module in twins)


@pytest.mark.parametrize("size", [0, 1, 3, 4, 7, 8, 9, 125, 4097])
def test_unmasking_is_xor_with_the_repeating_mask_on_both(size):
    payload = os.urandom(size)
    expected = bytes(b ^ MASK[i % 4] for i, b in enumerate(payload))
    assert speedups.ws_unmask(payload, MASK) == expected
    assert all(module.ws_unmask(payload, MASK) == expected for module in twins)


@pytest.mark.parametrize("module", twins, ids=lambda module: module.__name__.rsplit(".")[-1])
def test_the_frame_pieces_take_bytes_alone_and_refuse_text_and_short_masks(module):
    """What the transports hand them is bytes: both twins refuse anything else alike (a
    memoryview of wider items framed by its item count would be a malformed frame)."""
    for payload in (bytearray(b"abc"), memoryview(b"xyz" * 100), 3):
        with pytest.raises(TypeError):
            module.ws_frame(payload, True)
        with pytest.raises(TypeError):
            module.ws_unmask(payload, MASK)
    with pytest.raises(TypeError):
        module.ws_frame("text", False)
    with pytest.raises(ValueError, match="four bytes"):
        module.ws_unmask(b"abc", b"12")


def test_whole_frames_are_read_one_after_another_with_their_flags():
    data = (client_frame(2, b"A") + client_frame(1, b"text") + client_frame(2, b"")
            + client_frame(2, b"L" * 300) + client_frame(1, "ü".encode() * 100))
    delivered, end = same_on_both(data)
    assert delivered == [(b"A", True), (b"text", False), (b"", True), (b"L" * 300, True),
                         ("ü".encode() * 100, False)]
    assert end == len(data)
    server_frames = speedups.ws_frame(b"one", True) + speedups.ws_frame(b"two", False)
    assert same_on_both(server_frames, masked=False) == ([(b"one", True), (b"two", False)],
                                                         len(server_frames))


GOOD = client_frame(2, b"good")
# Each is left where it starts, for Autobahn to read (and refuse, or handle in its own way).
HOSTILE = {
    "reserved opcode": client_frame(3, b"x"),
    "reserved control opcode": client_frame(0xB, b"x"),
    "continuation without a start": client_frame(0, b"x"),
    "first fragment": client_frame(2, b"x", fin=False),
    "ping": client_frame(9, b"x"),
    "close": client_frame(8, b"\x03\xe8"),
    "fragmented ping": client_frame(9, b"x", fin=False),
    "reserved bit": client_frame(2, b"x", rsv=4),
    "compressed bit": client_frame(2, b"x", rsv=4 | 2 | 1),
    "no mask": client_frame(2, b"x", mask=None),
    "16-bit length under 126": bytes([0x82, 0x80 | 126, 0, 5]) + MASK + b"12345",
    "64-bit length": client_frame(2, b"y" * 65536),
    "64-bit length of 5": bytes([0x82, 0x80 | 127]) + (5).to_bytes(8, "big") + MASK + b"12345",
    "64-bit length with the top bit": bytes([0x82, 0xFF]) + b"\xff" * 8 + MASK,
    "over the limit": client_frame(2, b"z" * 101),
    "bad UTF-8": client_frame(1, b"\xc3\x28"),
    "UTF-8 cut mid-character": client_frame(1, "ü".encode()[:1]),
    "header cut": client_frame(2, b"x" * 200)[:3],
    "mask cut": client_frame(2, b"x")[:4],
    "payload cut": client_frame(2, b"x" * 50)[:-1],
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_frame_the_fast_path_does_not_take_stops_it_where_it_starts(name):
    after = b"" if name.endswith(" cut") else GOOD  # a frame cut short ends the read
    delivered, end = same_on_both(GOOD + HOSTILE[name] + after, limit=100)
    assert (delivered, end) == ([(b"good", True)], len(GOOD))


def test_unchecked_text_is_delivered_as_it_came_and_a_server_frame_is_refused_by_a_server():
    assert same_on_both(client_frame(1, b"\xff"), check_utf8=False)[0] == [(b"\xff", False)]
    # A client reads unmasked frames only; a server, masked ones only.
    assert same_on_both(GOOD, masked=False) == ([], 0)
    assert same_on_both(speedups.ws_frame(b"x", True), masked=True) == ([], 0)


@pytest.mark.parametrize("module", twins, ids=lambda module: module.__name__.rsplit(".")[-1])
def test_a_closed_gate_stops_delivery_at_the_next_frame(module):
    gate = module.FrameGate(lambda frame: None)
    delivered = []

    def deliver(payload, binary):
        delivered.append(payload)
        if payload == b"close":
            gate.close()

    data = client_frame(2, b"a") + client_frame(2, b"close") + client_frame(2, b"never")
    end = module.ws_deliver(data, 0, True, 0, True, deliver, gate)
    assert delivered == [b"a", b"close"]
    assert end == len(data) - len(client_frame(2, b"never"))


@pytest.mark.parametrize("module", twins, ids=lambda module: module.__name__.rsplit(".")[-1])
def test_a_gate_passes_writes_until_it_is_closed(module):
    written = []
    gate = module.FrameGate(written.append)
    gate.write(b"1")
    assert gate.open
    gate.close()
    gate.write(b"2")
    assert written == [b"1"] and not gate.open


# -- on real sockets -------------------------------------------------------------------------


class WaitingEcho(Echo):
    """Echoes, and records how many bytes wait in its connection's outbox after each echo."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[int] = []

    def messageReceived(self, data: bytes, binary: bool) -> None:
        super().messageReceived(data, binary)
        self.waiting.append(self.transport.outbox.waiting)


@pytest_twisted.ensureDeferred
async def test_a_reads_echoes_wait_and_go_out_in_order_with_autobahns_pong(net):
    port = await serve(net, WaitingEcho)
    raw = await handshake(net, port)
    raw.transport.write(client_frame(2, b"A") + client_frame(9, b"ping") + client_frame(2, b"B"))
    expected = (speedups.ws_frame(b"A", True) + bytes([0x8A, 4]) + b"ping"
                + speedups.ws_frame(b"B", True))
    await eventually(lambda: len(raw.received) >= len(expected))
    # Without the pong in the outbox, it would overtake the echo of A waiting there.
    assert raw.received == expected
    (server,) = net.protocols
    assert server.waiting[0] > 0, "the echo of A waited for the end of the read"
    assert server.transport.outbox.waiting == 0


class CloseAfterEcho(Echo):
    """Echoes the first message, then closes, then tries to send one more."""

    def messageReceived(self, data: bytes, binary: bool) -> None:
        super().messageReceived(data, binary)
        if len(self.messages) == 1:
            self.transport.loseConnection()
            self.transport.sendMessage(b"after the close", True)
            self.transport.sendPrepared(self.transport.prepareMessage(b"prepared after", True))


@pytest_twisted.ensureDeferred
async def test_nothing_follows_the_close_frame_the_echo_before_it_goes_out(net):
    port = await serve(net, CloseAfterEcho)
    raw = await handshake(net, port)
    raw.transport.write(client_frame(2, b"A") + client_frame(2, b"B"))
    (server,) = net.protocols
    close = bytes([0x88, 2]) + (1000).to_bytes(2, "big")
    await eventually(lambda: close in raw.received)
    assert raw.received == speedups.ws_frame(b"A", True) + close
    raw.transport.write(client_frame(8, (1000).to_bytes(2, "big")))
    await wait_for(server.lost)
    await wait_for(raw.closed)
    assert raw.received == speedups.ws_frame(b"A", True) + close


class AbortAfterEcho(Echo):
    def messageReceived(self, data: bytes, binary: bool) -> None:
        super().messageReceived(data, binary)
        self.transport.abortConnection()


@pytest_twisted.ensureDeferred
async def test_an_abort_forgets_what_waits_and_other_connections_still_get_theirs(net):
    port = await serve(net, Recorder)
    watcher_raw = await handshake(net, port)
    (watcher,) = net.protocols
    aborting_port = await serve(net, AbortAfterEcho)
    raw = await handshake(net, aborting_port)
    (aborted,) = [p for p in net.protocols if isinstance(p, AbortAfterEcho)]

    # The aborting connection's read also sends to another connection: that one is written.
    def relay(data: bytes, binary: bool) -> None:
        watcher.transport.sendMessage(b"relayed " + data, binary)
        AbortAfterEcho.messageReceived(aborted, data, binary)

    aborted.messageReceived = relay
    raw.transport.write(client_frame(2, b"A") + client_frame(2, b"B"))
    await wait_for(raw.closed)
    await wait_for(aborted.lost)
    assert raw.received == b"", "the echo waiting in the outbox was discarded"
    assert aborted.messages == [(b"A", True)]
    await eventually(lambda: watcher_raw.received == speedups.ws_frame(b"relayed A", True))


@pytest_twisted.ensureDeferred
async def test_a_peer_closing_mid_read_gets_the_echoes_then_the_close_reply(net):
    port = await serve(net, Echo)
    raw = await handshake(net, port)
    raw.transport.write(client_frame(2, b"A") + client_frame(2, b"B")
                        + client_frame(8, (1000).to_bytes(2, "big")) + client_frame(2, b"C"))
    await wait_for(raw.closed)
    assert raw.received == (speedups.ws_frame(b"A", True) + speedups.ws_frame(b"B", True)
                            + bytes([0x88, 2]) + (1000).to_bytes(2, "big"))


# What Autobahn says of each hostile frame, after a good one: the same close code on both paths.
CLOSE_CODES = {
    "reserved opcode": 1002,
    "continuation without a start": 1002,
    "fragmented ping": 1002,
    "reserved bit": 1002,
    "no mask": 1002,
    "64-bit length of 5": 1002,
    "64-bit length with the top bit": 1002,
    "first fragment": 1002,  # then a new message before the last fragment
    "compressed bit": 1002,
    "reserved control opcode": 1002,
    "over the limit": 1009,
    "64-bit length": 1009,
    "bad UTF-8": 1007,
}


@pytest.mark.parametrize("name", list(CLOSE_CODES))
@pytest_twisted.ensureDeferred
async def test_a_hostile_frame_after_a_good_one_closes_with_autobahns_code(net, name):
    port = await serve(net, Recorder, max_message_size=100)
    raw = await handshake(net, port)
    raw.transport.write(GOOD + HOSTILE[name] + client_frame(2, b"never"))
    (server,) = net.protocols
    await eventually(lambda: len(raw.received) >= 4)
    raw.transport.write(client_frame(8, raw.received[2:4]))  # the close answered, as peers do
    await wait_for(server.lost)
    assert server.messages == [(b"good", True)]
    await wait_for(raw.closed)
    assert raw.received[0] == 0x88
    assert int.from_bytes(raw.received[2:4], "big") == CLOSE_CODES[name]


@pytest_twisted.ensureDeferred
async def test_a_ping_between_fragments_is_answered_and_the_message_delivered(net):
    port = await serve(net, Echo)
    raw = await handshake(net, port)
    raw.transport.write(GOOD + client_frame(2, b"one ", fin=False) + client_frame(9, b"p")
                        + client_frame(0, b"two") + GOOD)
    expected = (speedups.ws_frame(b"good", True) + bytes([0x8A, 1]) + b"p"
                + speedups.ws_frame(b"one two", True) + speedups.ws_frame(b"good", True))
    await eventually(lambda: len(raw.received) >= len(expected))
    assert raw.received == expected


@pytest_twisted.ensureDeferred
async def test_over_tls_a_peer_closing_mid_read_gets_the_echoes_then_the_close_reply(net,
                                                                                     tls_files):
    # TLS drops what is written after loseConnection: the outbox must be written before it.
    resource = websocket_resource(net.factory(Echo), WebSocketOptions())
    description = f"ssl:0:interface=127.0.0.1:privateKey={tls_files.key}:certKey={tls_files.cert}"
    port = (await net.listen(websocket_site({"/ws": resource}), description)).getHost().port
    endpoint = SSL4ClientEndpoint(reactor, "127.0.0.1", port, CertificateOptions())
    raw = await wait_for(endpoint.connect(Factory.forProtocol(RawClient)))
    net.raw.append(raw)
    raw.transport.write(upgrade_request("/ws"))
    await eventually(lambda: b"\r\n\r\n" in raw.received)
    raw.received = raw.received.split(b"\r\n\r\n", 1)[1]
    raw.transport.write(client_frame(2, b"A") + client_frame(2, b"B")
                        + client_frame(8, (1000).to_bytes(2, "big")))
    await wait_for(raw.closed)
    assert raw.received == (speedups.ws_frame(b"A", True) + speedups.ws_frame(b"B", True)
                            + bytes([0x88, 2]) + (1000).to_bytes(2, "big"))


@pytest_twisted.ensureDeferred
async def test_a_websocket_subscriber_that_stops_reading_is_held_to_its_queue_limit(broker):
    # Fan-out inside a publisher's reads: what waits in the stalled subscriber's outbox is at
    # most one read's, then Twisted pauses its session, whose queue drops past its limit.
    limit = 200_000
    service, bound = await broker.start("websmq+ws@tcp:0:interface=127.0.0.1", hub=HubSettings(
        queue_bytes=limit, overflow="drop-oldest"))
    (address,) = (entry.address for entry in bound)
    stalled, healthy, publisher = [await broker.client(address) for _ in range(3)]
    received: list = []
    stalled.subscribe("t")
    healthy.subscribe("t", received.append)
    await eventually(lambda: len(service.hub.subscribers("t")) == 2)
    stalled.transport.transport.pauseProducing()  # reads nothing more
    (session,) = [s for s in service.hub.sessions if s.protocol is not None
                  and s.transport.getPeer().port == stalled.transport.getHost().port]
    payload = b"p" * 30_000
    for sent in range(20, 241, 20):
        for _ in range(20):
            publisher.publish("t", payload)
        await eventually(lambda sent=sent: len(received) == sent, timeout=10)
        assert session.queued_bytes <= limit
        assert session.transport.outbox.waiting == 0  # written (or queued) at each read's end
    assert session.dropped_messages > 0
    assert len(received) == 240


@pytest_twisted.ensureDeferred
async def test_after_a_read_that_ends_mid_frame_the_next_frames_are_read_directly_again(net):
    """A flood's reads seldom end on a frame's end: Autobahn finishes the frame cut short, and
    the frames after it are the fast path's again (it took none once a read ended mid-frame)."""
    port = await serve(net, Recorder)
    raw = await handshake(net, port)
    messages = [b"message %d " % n + b"x" * (n % 300) for n in range(400)]
    frames = [client_frame(2, m) for m in messages]
    (server,) = net.protocols
    start = 0
    for part in range(10):
        # Each read ends inside the next one's first frame: in its header, or in its payload.
        whole = len(b"".join(frames[:40 * (part + 1)]))
        cut = whole + (1 if part % 2 else 9) if part < 9 else whole
        raw.transport.write(b"".join(frames)[start:cut])
        start = cut
        await eventually(lambda part=part: len(server.messages) >= 40 * (part + 1))
    assert server.messages == [(m, True) for m in messages]
    # Autobahn read only the five frames cut in their payload (a header cut short is the
    # fast path's again).
    assert server.transport.trafficStats.incomingWebSocketMessages == 5
