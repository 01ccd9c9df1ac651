"""The outbox on real sockets, on both fast paths: one read carrying many publishes reaches every
subscriber whole and in order; a subscriber that stops reading is held by its queue limit and
overflow policy; an aborted connection gets nothing more; a reply queued before a close arrives
before it; a message too large for one subscriber's connection is counted and not sent."""

from __future__ import annotations

import socket
import struct
from typing import Any, ClassVar

import pytest
import pytest_twisted
from cobs import cobs
from twisted.internet import reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint, wrapClientTLS
from twisted.internet.protocol import Factory
from twisted.internet.ssl import CertificateOptions
from twisted.logger import LogLevel

from tests.brokers import LOCAL, Broker
from tests.support import eventually, sleep, wait_for
from tests.test_log_events import logged
from tests.transports.conftest import Net, RawClient, Recorder
from wireproto import speedups
from wireproto.codecs import websmq
from wireproto.codecs.websmq import Publish, Subscribe
from wireproto.config import HubSettings
from wireproto.hub import Hub
from wireproto.protocols.websmq.server import server_factory
from wireproto.speedups import IMPLEMENTATIONS
from wireproto.transports import StreamOptions, stream_server_factory

pytestmark = pytest.mark.usefixtures("fast_path")


def length32(*messages: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(m)) + m for m in messages)


def frames(stream: bytes) -> list[bytes]:
    """The whole length32 frames of `stream` (a trailing partial one is left out)."""
    found, offset = [], 0
    while len(stream) - offset >= 4:
        (length,) = struct.unpack_from(">I", stream, offset)
        if len(stream) - offset - 4 < length:
            break
        found.append(stream[offset + 4:offset + 4 + length])
        offset += 4 + length
    return found


def published(stream: bytes) -> list[tuple[str, bytes]]:
    return [(m.topic, m.payload) for m in map(websmq.decode, frames(stream))]


def sub(*topics: str) -> bytes:
    return length32(*(websmq.encode(Subscribe(topic)) for topic in topics))


def pub(topic: str, *payloads: bytes) -> bytes:
    return length32(*(websmq.encode(Publish(topic, payload)) for payload in payloads))


async def websmq_tcp(broker: Broker, **hub: Any) -> tuple[Any, int]:
    service, bound = await broker.start(f"websmq+length32@tcp:0:{LOCAL}",
                                        hub=HubSettings(**hub))
    (listener,) = bound
    return service, int(listener.address.rsplit(":", 1)[1].split("/")[0])


async def subscribers(net: Net, service: Any, port: int, topic: str, count: int
                      ) -> list[RawClient]:
    before = len(service.hub.subscribers(topic))
    clients = [await net.raw_connect(port) for _ in range(count)]
    for client in clients:
        client.transport.write(sub(topic))
    await eventually(lambda: len(service.hub.subscribers(topic)) == before + count)
    return clients


@pytest_twisted.ensureDeferred
async def test_one_read_of_many_publishes_reaches_every_subscriber_whole_and_in_order(
        broker, net, fast_path):
    service, port = await websmq_tcp(broker)
    readers = await subscribers(net, service, port, "t", 4)
    # The connections run the path under test.
    for session in service.hub.subscribers("t"):
        assert type(session.transport.outbox) is IMPLEMENTATIONS[fast_path].Outbox
    publisher = await net.raw_connect(port)
    # Small enough for one read of the broker's: 200 publishes fanned out to 4 subscribers.
    payloads = [b"%d:" % n + bytes([n % 251]) * (n % 40) for n in range(200)]
    publisher.transport.write(pub("t", *payloads))
    # And bursts in many reads, cut anywhere, interleaved with a second topic nobody reads.
    more = [b"more %d" % n for n in range(3000)]
    stream = b"".join(pub("t", p) + pub("elsewhere", p) for p in more)
    for start in range(0, len(stream), 7919):
        publisher.transport.write(stream[start:start + 7919])
    expected = [("t", p) for p in payloads + more]
    await eventually(lambda: all(len(frames(r.received)) >= len(expected) for r in readers),
                     timeout=20)
    for reader in readers:
        assert published(reader.received) == expected
    assert publisher.received == b""  # a publish never goes back to its sender


@pytest_twisted.ensureDeferred
async def test_a_cobs_subscriber_gets_a_length32_reads_fan_out_whole_and_in_order(broker, net):
    service, bound = await broker.start(f"websmq+length32@tcp:0:{LOCAL}",
                                        f"websmq+cobs@tcp:0:{LOCAL}")
    length32_port, cobs_port = (int(b.address.rsplit(":", 1)[1].split("/")[0]) for b in bound)
    (plain,) = await subscribers(net, service, length32_port, "t", 1)
    cobs_reader = await net.raw_connect(cobs_port)
    cobs_reader.transport.write(cobs.encode(websmq.encode(Subscribe("t"))) + b"\x00")
    await eventually(lambda: len(service.hub.subscribers("t")) == 2)
    publisher = await net.raw_connect(length32_port)
    payloads = [bytes([n % 256]) * (n % 50) for n in range(500)]  # zero bytes included
    publisher.transport.write(pub("t", *payloads))

    def cobs_frames() -> list[bytes]:
        return [cobs.decode(f) for f in cobs_reader.received.split(b"\x00")[:-1] if f]

    await eventually(lambda: len(cobs_frames()) == 500 and len(frames(plain.received)) == 500)
    expected = [("t", p) for p in payloads]
    assert [(m.topic, m.payload) for m in map(websmq.decode, cobs_frames())] == expected
    assert published(plain.received) == expected


@pytest_twisted.ensureDeferred
async def test_a_publisher_subscribed_to_its_own_topic_gets_only_the_others(broker, net):
    service, port = await websmq_tcp(broker)
    first, second = await subscribers(net, service, port, "both", 2)
    first.transport.write(pub("both", *[b"first %d" % n for n in range(300)]))
    second.transport.write(pub("both", *[b"second %d" % n for n in range(300)]))
    await eventually(lambda: len(frames(first.received)) >= 300
                     and len(frames(second.received)) >= 300, timeout=10)
    await sleep(0.05)
    assert published(first.received) == [("both", b"second %d" % n) for n in range(300)]
    assert published(second.received) == [("both", b"first %d" % n) for n in range(300)]


def buffered(session: Any) -> int:
    """Bytes Twisted holds for `session`'s socket (written, not yet taken by the kernel)."""
    tcp = session.transport.transport
    return len(tcp.dataBuffer) - tcp.offset + tcp._tempDataLen


class Peak:
    """The most a slow session ever held, sampled between the reactor's reads."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.queued = self.buffered = self.outbox = 0
        self.loop = task.LoopingCall(self.sample)
        self.loop.start(0.001)

    def sample(self) -> None:
        session = self.session
        if session.closed:
            return
        self.queued = max(self.queued, session.queued_bytes)
        self.buffered = max(self.buffered, buffered(session))
        self.outbox = max(self.outbox, session.transport.outbox.waiting)

    def stop(self) -> None:
        if self.loop.running:
            self.loop.stop()


QUEUE = 16 * 1024
# Twisted pauses a session once its socket's buffer passes this; one read (at most 64 KiB,
# plus the partial frame kept from the read before) fans out to it before it can.
TWISTED_BUFFER = 65536
ONE_READ = 65536 + 1024


def stalled_reader(port: int) -> socket.socket:
    """A subscriber with a tiny receive window that reads nothing until told to."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


def read_some(sock: socket.socket, into: bytearray) -> bool:
    """Read all `sock` has now; whether it is closed."""
    while True:
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            return False
        except ConnectionResetError:
            return True
        if not data:
            return True
        into.extend(data)


@pytest.mark.parametrize("overflow", ["drop-oldest", "disconnect"])
@pytest_twisted.ensureDeferred
async def test_a_subscriber_that_stops_reading_is_bounded_while_reads_fan_out_to_it(
        broker, net, overflow):
    service, port = await websmq_tcp(broker, queue_bytes=QUEUE, overflow=overflow)
    (keeping_up,) = await subscribers(net, service, port, "firehose", 1)
    stalled = stalled_reader(port)
    try:
        stalled.sendall(sub("firehose"))
        await eventually(lambda: len(service.hub.subscribers("firehose")) == 2)
        (session,) = (s for s in service.hub.subscribers("firehose")
                      if s.transport.transport.getPeer().port == stalled.getsockname()[1])
        peak = Peak(session)
        publisher = await net.raw_connect(port)
        # 1000-byte payloads, 60 to a write: ~8 MB, many times what the stalled socket and
        # the kernel's buffers hold, in reads of up to 64 KiB that each fan out to both.
        count, payload = 8000, 1000
        try:
            for start in range(0, count, 60):
                publisher.transport.write(pub("firehose", *[
                    n.to_bytes(4, "big") * (payload // 4)
                    for n in range(start, min(count, start + 60))]))
                await sleep(0)
            await eventually(lambda: len(frames(keeping_up.received)) >= count, timeout=30)
        finally:
            peak.stop()
        assert [p[:4] for _, p in published(keeping_up.received)] == [
            n.to_bytes(4, "big") for n in range(count)]
        assert peak.queued <= QUEUE
        assert peak.outbox == 0  # nothing waits once a read is handled
        assert peak.buffered <= TWISTED_BUFFER + ONE_READ
        received = bytearray()
        if overflow == "disconnect":
            await eventually(lambda: read_some(stalled, received), timeout=10)
            assert service.hub.stats.overflow_disconnects == 1
            assert service.hub.stats.dropped_messages == 0
            return
        assert session.dropped_messages > 0 and not session.closed
        last = (count - 1).to_bytes(4, "big")

        def drained() -> bool:
            read_some(stalled, received)
            return [p[:4] for _, p in published(bytes(received))][-1:] == [last]

        await eventually(drained, timeout=30)
        kept = [int.from_bytes(p[:4], "big") for _, p in published(bytes(received))]
        assert kept == sorted(set(kept))  # the oldest dropped, nothing reordered or repeated
        assert len(kept) + session.dropped_messages == count
    finally:
        stalled.close()


class Switchboard(Recorder):
    """Each message says what to do: "to N:data" writes data to connection N (in the order
    they were made), "abort N" aborts it, "bye" replies and closes this connection, "fail"
    raises (a protocol's bug); anything else is answered."""

    board: ClassVar[list[Switchboard]] = []

    def connectionMade(self) -> None:
        super().connectionMade()
        self.board.append(self)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        super().messageReceived(data, binary)
        verb, _, rest = data.partition(b" ")
        if verb == b"to":
            index, _, payload = rest.partition(b":")
            self.board[int(index)].transport.sendMessage(payload)
        elif verb == b"abort":
            self.board[int(rest)].transport.abortConnection()
        elif verb == b"bye":
            self.transport.sendMessage(b"reply to bye")
            self.transport.loseConnection()
        elif verb == b"fail":
            raise RuntimeError("a protocol's bug")
        else:
            self.transport.sendMessage(b"reply to " + data)


@pytest.fixture
def board():
    Switchboard.board = []
    yield Switchboard.board
    Switchboard.board = []


class Carrier:
    """A switchboard listening on TCP or TLS, and raw peers connecting to it."""

    def __init__(self, net: Net, tls: Any) -> None:
        self.net = net
        self.tls = tls

    async def start(self) -> Carrier:
        factory = stream_server_factory(self.net.factory(Switchboard), StreamOptions())
        description = "tcp:0:interface=127.0.0.1"
        if self.tls is not None:
            description = (f"ssl:0:interface=127.0.0.1:privateKey={self.tls.key}"
                           f":certKey={self.tls.cert}")
        self.port = (await self.net.listen(factory, description)).getHost().port
        return self

    async def peer(self) -> RawClient:
        if self.tls is None:
            return await self.net.raw_connect(self.port)
        endpoint = wrapClientTLS(CertificateOptions(),  # the test's own self-signed server
                                 TCP4ClientEndpoint(reactor, "127.0.0.1", self.port))
        client = await wait_for(endpoint.connect(Factory.forProtocol(RawClient)))
        self.net.raw.append(client)
        return client


@pytest.fixture(params=["tcp", "tls"])
def carrier(request, net, board, tls_files):
    return Carrier(net, tls_files if request.param == "tls" else None)


def troubles(events: list[dict]) -> list[dict]:
    return [e for e in events if "log_failure" in e
            or e.get("log_level") in (LogLevel.error, LogLevel.critical)]


@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_a_connection_aborted_while_its_frames_wait_gets_nothing_more(carrier, board):
    await carrier.start()
    victim = await carrier.peer()
    witness = await carrier.peer()
    await eventually(lambda: len(board) == 2)
    with logged() as events:
        # One read: frames wait in the victim's outbox, it is aborted, more are written to it.
        witness.transport.write(length32(b"to 0:first", b"to 0:second", b"abort 0",
                                         b"to 0:after the abort", b"to 1:done"))
        await wait_for(victim.closed)
        await eventually(lambda: frames(witness.received) == [b"done"])
        await sleep(0.05)
    assert victim.received == b""
    assert troubles(events) == []


@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_a_reply_queued_before_the_protocol_closes_arrives_before_the_close(carrier,
                                                                                  board):
    await carrier.start()
    peer = await carrier.peer()
    await eventually(lambda: len(board) == 1)
    with logged() as events:
        peer.transport.write(length32(b"one", b"two", b"bye", b"never read"))
        await wait_for(peer.closed)
    assert frames(peer.received) == [b"reply to one", b"reply to two", b"reply to bye"]
    assert board[0].messages == [(b"one", True), (b"two", True), (b"bye", True)]
    assert troubles(events) == []


@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_frames_to_another_connection_closing_in_the_same_read_go_out_first(carrier,
                                                                                  board):
    await carrier.start()
    closing = await carrier.peer()
    sender = await carrier.peer()
    await eventually(lambda: len(board) == 2)
    # The sender's read writes to `closing`, then `closing` says bye in its own read.
    sender.transport.write(length32(*[b"to 0:%d" % n for n in range(100)]))
    await eventually(lambda: len(frames(closing.received)) == 100)
    closing.transport.write(length32(b"bye"))
    await wait_for(closing.closed)
    assert frames(closing.received) == [b"%d" % n for n in range(100)] + [b"reply to bye"]


@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_a_protocol_failing_mid_read_still_sends_what_it_wrote_to_others(carrier, board):
    await carrier.start()
    failing = await carrier.peer()
    other = await carrier.peer()
    await eventually(lambda: len(board) == 2)
    failing.transport.write(length32(b"to 1:before the bug", b"fail", b"to 1:never"))
    await wait_for(failing.closed)
    await eventually(lambda: frames(other.received) == [b"before the bug"])
    other.transport.write(length32(b"still served"))
    await eventually(lambda: frames(other.received)[-1:] == [b"reply to still served"])
    assert not speedups.batching()


@pytest_twisted.ensureDeferred
async def test_a_message_too_large_for_one_subscribers_connection_is_counted_not_sent(net):
    hub = Hub()
    protocols = server_factory(hub)
    roomy = await net.listen_tcp(stream_server_factory(protocols, StreamOptions()))
    narrow = await net.listen_tcp(stream_server_factory(
        protocols, StreamOptions(max_message_size=100)))
    big_reader = await net.raw_connect(roomy)
    small_reader = await net.raw_connect(narrow)
    for reader in (big_reader, small_reader):
        reader.transport.write(sub("t"))
    await eventually(lambda: len(hub.subscribers("t")) == 2)
    publisher = await net.raw_connect(roomy)
    payloads = [b"small", b"x" * 200, b"small again", b"y" * 300, b"last"]
    publisher.transport.write(pub("t", *payloads))
    await eventually(lambda: len(frames(big_reader.received)) == 5
                     and len(frames(small_reader.received)) == 3)
    assert published(big_reader.received) == [("t", p) for p in payloads]
    assert published(small_reader.received) == [("t", b"small"), ("t", b"small again"),
                                                 ("t", b"last")]
    narrow_session = next(s for s in hub.subscribers("t") if s.max_frame == 100)
    assert (narrow_session.too_large, narrow_session.sent) == (2, 3)


class BatchWitness(Recorder):
    """Answers each message, noting whether its read's writes wait (`speedups.batching()`)."""

    def __init__(self) -> None:
        super().__init__()
        self.batched: list[bool] = []

    def messageReceived(self, data: bytes, binary: bool) -> None:
        super().messageReceived(data, binary)
        self.batched.append(speedups.batching())
        self.transport.sendMessage(b"echo " + data)


FRAMED: dict[str, Any] = {
    "length32": lambda messages: length32(*messages),
    "lines": lambda messages: b"".join(m + b"\n" for m in messages),
    "cobs": lambda messages: b"".join(cobs.encode(m) + b"\x00" for m in messages),
}
UNFRAMED: dict[str, Any] = {
    "length32": frames,
    "lines": lambda stream: stream.split(b"\n")[:-1],
    "cobs": lambda stream: [cobs.decode(f) for f in stream.split(b"\x00")[:-1] if f],
}


@pytest.mark.parametrize("framing", ["length32", "lines", "cobs"])
@pytest_twisted.ensureDeferred
async def test_every_framings_read_is_handled_as_one_batch(net, framing):
    """docs/performance.md: the length32, lines and COBS readers handle a read between
    batch_begin and batch_end, so what it writes goes out as one write at its end (the lines
    and COBS readers wrote each message's answer straight through)."""
    witnesses: list[BatchWitness] = []

    def build() -> BatchWitness:
        witnesses.append(BatchWitness())
        return witnesses[-1]

    port = await net.listen_tcp(stream_server_factory(net.factory(build), StreamOptions(
        framing=framing)))
    peer = await net.raw_connect(port)
    messages = [b"message %d" % n for n in range(200)]
    peer.transport.write(FRAMED[framing](messages))
    await eventually(lambda: len(UNFRAMED[framing](peer.received)) == len(messages))
    assert UNFRAMED[framing](peer.received) == [b"echo " + m for m in messages]
    (witness,) = witnesses
    assert witness.batched == [True] * len(messages)
    assert not speedups.batching()
