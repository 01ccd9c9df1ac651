"""The WEBSMQ broker and client on real sockets: WebSocket, TCP (length32) and pty serial."""

from __future__ import annotations

import socket
import struct

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint

from tests.support import Inbox, eventually, sleep, wait_for
from wireproto.codecs import websmq
from wireproto.codecs.websmq import LastWill, Publish, Subscribe
from wireproto.hub import Hub
from wireproto.protocols.websmq.client import connect
from wireproto.protocols.websmq.server import server_factory
from wireproto.transports.stream import (
    StreamOptions,
    stream_client_factory,
    stream_server_factory,
)
from wireproto.transports.websocket import WebSocketOptions
from wireproto.transports.websocket_http import websocket_resource, websocket_site

# Every test on both fast paths: slow-consumer policies and length32 fan-out must hold on each.
pytestmark = pytest.mark.usefixtures("fast_path")


class Broker:
    """A broker with a WebSocket listener and a length32 TCP listener on 127.0.0.1."""

    def __init__(self, hub: Hub, *, wildcards: bool = False, max_message_size: int = 1 << 20):
        self.hub = hub
        factory = server_factory(hub, wildcards=wildcards)
        self.site = websocket_site(
            {"/websmq": websocket_resource(
                factory, WebSocketOptions(max_message_size=max_message_size))}
        )
        self.stream_factory = stream_server_factory(
            factory, StreamOptions(framing="length32", max_message_size=max_message_size)
        )
        self.ports = []

    async def start(self):
        for factory in (self.site, self.stream_factory):
            endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
            self.ports.append(await endpoint.listen(factory))
        self.ws_url = f"ws://127.0.0.1:{self.ports[0].getHost().port}/websmq"
        self.tcp = f"tcp:host=127.0.0.1:port={self.ports[1].getHost().port}"
        return self

    async def stop(self):
        for port in self.ports:
            await port.stopListening()


@pytest_twisted.async_yield_fixture
async def broker():
    hub = Hub()
    running = await Broker(hub).start()
    yield running
    await running.stop()




async def subscribed(hub: Hub, client, topic: str, inbox=None):
    """Subscribe and wait until the broker has it (WEBSMQ has no acknowledgement)."""
    before = len(hub.subscribers(topic))
    await client.subscribe(topic, inbox)
    await eventually(lambda: len(hub.subscribers(topic)) > before)


async def closed(client):
    await wait_for(client.disconnect())


@pytest_twisted.ensureDeferred
async def test_ws_and_tcp_clients_exchange_messages(broker):
    ws = await wait_for(connect(reactor, broker.ws_url))
    tcp = await wait_for(connect(reactor, broker.tcp))
    try:
        ws_inbox, tcp_inbox = Inbox(), Inbox()
        await subscribed(broker.hub, ws, "sensors/temp", ws_inbox)
        await subscribed(broker.hub, tcp, "sensors/temp", tcp_inbox)
        await tcp.publish("sensors/temp", b"21.5")
        await ws.publish("sensors/temp", b"22.0")
        assert await ws_inbox.wait() == [Publish("sensors/temp", b"21.5")]
        assert await tcp_inbox.wait() == [Publish("sensors/temp", b"22.0")]
        await sleep(0.05)  # nothing echoed back to either sender
        assert len(ws_inbox.messages) == len(tcp_inbox.messages) == 1
    finally:
        await closed(ws)
        await closed(tcp)


@pytest_twisted.ensureDeferred
async def test_unsubscribe_stops_delivery(broker):
    sub = await wait_for(connect(reactor, broker.tcp))
    pub = await wait_for(connect(reactor, broker.tcp))
    try:
        inbox = Inbox()
        await subscribed(broker.hub, sub, "t", inbox)
        await pub.publish("t", b"1")
        await inbox.wait(1)
        await sub.unsubscribe("t")
        await eventually(lambda: not broker.hub.subscribers("t"))
        await pub.publish("t", b"2")
        await subscribed(broker.hub, sub, "u", inbox)
        await pub.publish("u", b"3")
        assert [m.payload for m in await inbox.wait(2)] == [b"1", b"3"]
    finally:
        await closed(sub)
        await closed(pub)


@pytest_twisted.ensureDeferred
async def test_will_is_published_with_the_will_header_after_abort(broker):
    watcher = await wait_for(connect(reactor, broker.ws_url))
    doomed = await wait_for(connect(reactor, broker.tcp))
    try:
        inbox = Inbox()
        await subscribed(broker.hub, watcher, "clients/doomed", inbox)
        await doomed.set_will("clients/doomed", b"gone")
        await eventually(lambda: any(s.will for s in broker.hub.sessions))
        doomed.transport.abortConnection()
        assert await inbox.wait() == [LastWill("clients/doomed", b"gone")]
    finally:
        await closed(watcher)


@pytest_twisted.ensureDeferred
async def test_will_is_published_on_a_clean_disconnect_too(broker):
    watcher = await wait_for(connect(reactor, broker.tcp))
    leaving = await wait_for(connect(reactor, broker.ws_url))
    try:
        inbox = Inbox()
        await subscribed(broker.hub, watcher, "w", inbox)
        await leaving.set_will("w", b"bye")
        await eventually(lambda: any(s.will for s in broker.hub.sessions))
        await closed(leaving)
        assert await inbox.wait() == [LastWill("w", b"bye")]
    finally:
        await closed(watcher)


def raw_tcp(broker) -> socket.socket:
    port = broker.ports[1].getHost().port
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setblocking(False)
    return sock


def length32(frame: bytes) -> bytes:
    return struct.pack("!I", len(frame)) + frame


async def peer_closed(sock: socket.socket, timeout=5.0) -> bytes:
    """Read until the broker closes the socket; return what it sent."""
    received = bytearray()

    def drained():
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            return False
        except ConnectionResetError:
            return True
        received.extend(chunk)
        return not chunk

    await eventually(drained, timeout)
    return bytes(received)


MALFORMED = {
    "one byte": b"\x40",
    "empty frame": b"",
    "topic length past the end": b"\x00\x09abc",
    "empty topic": b"\x40\x00",
    "topic with a space": b"\x40\x03a b",
    "non-ASCII topic": b"\x40\x02\xc3\xa9",
    "bad escape": b"\x00\x03%zz",
}


@pytest.mark.parametrize("frame", MALFORMED.values(), ids=MALFORMED.keys())
@pytest_twisted.ensureDeferred
async def test_a_malformed_tcp_frame_closes_only_that_connection(broker, frame):
    sub = await wait_for(connect(reactor, broker.ws_url))
    pub = await wait_for(connect(reactor, broker.tcp))
    bad = raw_tcp(broker)
    try:
        inbox = Inbox()
        await subscribed(broker.hub, sub, "ok", inbox)
        await eventually(lambda: len(broker.hub.sessions) == 3)
        bad.sendall(length32(frame))
        await peer_closed(bad)
        await eventually(lambda: len(broker.hub.sessions) == 2)
        await pub.publish("ok", b"still here")
        assert await inbox.wait() == [Publish("ok", b"still here")]
    finally:
        bad.close()
        await closed(sub)
        await closed(pub)


@pytest_twisted.ensureDeferred
async def test_frames_before_a_malformed_one_are_kept(broker):
    sub = await wait_for(connect(reactor, broker.tcp))
    bad = raw_tcp(broker)
    try:
        inbox = Inbox()
        await subscribed(broker.hub, sub, "kept", inbox)
        bad.sendall(length32(websmq.encode(Publish("kept", b"accepted"))) + length32(b"\x40"))
        await peer_closed(bad)
        assert await inbox.wait() == [Publish("kept", b"accepted")]
    finally:
        bad.close()
        await closed(sub)


@pytest_twisted.ensureDeferred
async def test_ws_text_frame_and_bad_frame_close_with_a_reason(broker):
    from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
    from twisted.internet import defer
    from twisted.internet.endpoints import TCP4ClientEndpoint

    async def close_for(send):
        done = defer.Deferred()

        class Raw(WebSocketClientProtocol):
            def onOpen(self):
                send(self)

            def onClose(self, wasClean, code, reason):
                done.callback((code, reason))

        factory = WebSocketClientFactory(broker.ws_url)
        factory.protocol = Raw
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", broker.ports[0].getHost().port)
        await endpoint.connect(factory)
        return await wait_for(done)

    code, reason = await close_for(lambda p: p.sendMessage(b"hello", isBinary=False))
    assert code == 1002 and "text frame" in reason
    code, reason = await close_for(lambda p: p.sendMessage(b"\x40\x03a b", isBinary=True))
    assert code == 1002 and "topic" in reason and len(reason.encode()) <= 123
    assert len(broker.hub.sessions) == 0


@pytest_twisted.ensureDeferred
async def test_broker_sends_only_publish_and_will_frames(broker):
    """Subscribe and unsubscribe frames from one client never reach another."""
    listener = raw_tcp(broker)
    other = await wait_for(connect(reactor, broker.tcp))
    try:
        listener.sendall(length32(websmq.encode(Subscribe("x", b""))))
        await eventually(lambda: broker.hub.subscribers("x"))
        await other.subscribe("x")
        await other.unsubscribe("x")
        await other.set_will("x", b"w")
        await other.publish("x", b"p")
        await closed(other)
        received = bytearray()

        def got_both():
            try:
                received.extend(listener.recv(65536))
            except BlockingIOError:
                pass
            return len(received) >= 2 * 4 + 2 * 4

        await eventually(got_both)
        frames, rest = [], bytes(received)
        while rest:
            (size,) = struct.unpack("!I", rest[:4])
            frames.append(websmq.decode(rest[4 : 4 + size]))
            rest = rest[4 + size :]
        assert frames == [Publish("x", b"p"), LastWill("x", b"w")]
    finally:
        listener.close()


@pytest_twisted.ensureDeferred
async def test_fan_out_to_100_clients():
    hub = Hub()
    broker = await Broker(hub).start()
    clients = []
    try:
        inboxes = []
        for index in range(100):
            address = broker.ws_url if index % 2 else broker.tcp
            client = await wait_for(connect(reactor, address))
            inbox = Inbox()
            await client.subscribe("fan/out", inbox)
            clients.append(client)
            inboxes.append(inbox)
        await eventually(lambda: len(hub.subscribers("fan/out")) == 100)
        publisher = clients[0]
        for n in range(5):
            await publisher.publish("fan/out", b"%d" % n)
        for inbox in inboxes[1:]:
            await inbox.wait(5)
        expected = [Publish("fan/out", b"%d" % n) for n in range(5)]
        assert all(inbox.messages == expected for inbox in inboxes[1:])
        assert inboxes[0].messages == []
        assert hub.stats.delivered == 5 * 99
    finally:
        for client in clients:
            await closed(client)
        await broker.stop()


@pytest_twisted.ensureDeferred
async def test_subscription_limit_closes_the_connection():
    hub = Hub(max_subscriptions=3)
    broker = await Broker(hub).start()
    client = await wait_for(connect(reactor, broker.tcp))
    try:
        for topic in ("a", "b", "c", "d"):
            await client.subscribe(topic)
        reason = await wait_for(client.when_closed())
        assert reason is not None
        assert len(hub.sessions) == 0
    finally:
        await broker.stop()


@pytest_twisted.ensureDeferred
async def test_a_wildcard_subscription_is_refused_by_a_plain_broker():
    hub = Hub()
    broker = await Broker(hub).start()
    try:
        sub = await wait_for(connect(reactor, broker.tcp, wildcards=True))
        await sub.subscribe("alarms/#")
        # '#' is not a WEBSMQ topic character, so a broker without the extension refuses it
        reason = await wait_for(sub.when_closed())
        assert reason is not None and not hub.sessions
    finally:
        await broker.stop()


@pytest_twisted.ensureDeferred
async def test_wildcard_subscriptions_when_the_broker_enables_them():
    hub = Hub()
    broker = await Broker(hub, wildcards=True).start()
    try:
        sub = await wait_for(connect(reactor, broker.tcp, wildcards=True))
        pub = await wait_for(connect(reactor, broker.tcp))
        inbox = Inbox()
        await sub.subscribe("sensors/+/temp", inbox)
        await sub.subscribe("alarms/#", inbox)
        await eventually(lambda: hub._patterns.count == 2)
        for topic in ("sensors/kitchen/temp", "sensors/kitchen/hum", "alarms", "alarms/fire"):
            await pub.publish(topic, b"")
        got = await inbox.wait(3)
        assert [m.topic for m in got] == ["sensors/kitchen/temp", "alarms", "alarms/fire"]
        await sub.unsubscribe("alarms/#")
        await eventually(lambda: hub._patterns.count == 1)
        await closed(sub)
        await closed(pub)
        assert hub._patterns.count == 0
    finally:
        await broker.stop()

def slow_reader(broker) -> socket.socket:
    """A TCP subscriber with a tiny receive window that reads nothing until told to."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", broker.ports[1].getHost().port))
    sock.setblocking(False)
    return sock


async def flood(hub, broker, topic, count, size):
    pub = await wait_for(connect(reactor, broker.tcp))
    try:
        for n in range(count):
            await pub.publish(topic, n.to_bytes(4, "big") * (size // 4))
            if n % 16 == 0:
                await sleep(0)
        await eventually(lambda: hub.stats.published >= count, timeout=20)
    finally:
        await closed(pub)


@pytest_twisted.ensureDeferred
async def test_slow_consumer_queue_drops_oldest_and_counts():
    hub = Hub(queue_bytes=256 * 1024, overflow="drop-oldest")
    broker = await Broker(hub).start()
    slow = slow_reader(broker)
    try:
        slow.sendall(length32(websmq.encode(Subscribe("firehose", b""))))
        await eventually(lambda: hub.subscribers("firehose"))
        (session,) = hub.subscribers("firehose")
        count, size = 300, 64 * 1024
        await flood(hub, broker, "firehose", count, size)
        assert session.stats.dropped_messages > 0
        assert hub.stats.dropped_messages == session.stats.dropped_messages
        assert session.queued_bytes <= 256 * 1024
        # Reading now drains what was kept: the newest messages, ending with the last one.
        received = bytearray()

        def drained_last():
            try:
                received.extend(slow.recv(1 << 20))
            except BlockingIOError:
                pass
            return bytes(received[-4:]) == (count - 1).to_bytes(4, "big")

        await eventually(drained_last, timeout=20)
        frames = len(received) // (4 + 2 + len("firehose") + size)
        assert frames + session.stats.dropped_messages == count
    finally:
        slow.close()
        await broker.stop()


@pytest_twisted.ensureDeferred
async def test_slow_consumer_is_disconnected_under_the_disconnect_policy():
    hub = Hub(queue_bytes=256 * 1024, overflow="disconnect")
    broker = await Broker(hub).start()
    slow = slow_reader(broker)
    other = await wait_for(connect(reactor, broker.ws_url))
    try:
        inbox = Inbox()
        await subscribed(hub, other, "firehose", inbox)
        slow.sendall(length32(websmq.encode(Subscribe("firehose", b""))))
        await eventually(lambda: len(hub.subscribers("firehose")) == 2)
        await flood(hub, broker, "firehose", 300, 64 * 1024)
        assert hub.stats.overflow_disconnects == 1
        assert len(hub.subscribers("firehose")) == 1
        await inbox.wait(300, timeout=20)  # the subscriber that keeps up loses nothing
        assert hub.stats.dropped_messages == 0
    finally:
        slow.close()
        await closed(other)
        await broker.stop()


@pytest_twisted.ensureDeferred
async def test_ws_tcp_and_serial_clients_of_one_broker(broker, null_modem):
    """A device on a serial line (COBS framing) is one more WEBSMQ client of the broker."""
    from twisted.internet.endpoints import clientFromString

    broker_end, device_end = null_modem
    line = await wait_for(
        clientFromString(reactor, f"serial:{broker_end}:baudrate=115200").connect(
            stream_client_factory(server_factory(broker.hub), StreamOptions(framing="cobs"))
        )
    )
    serial_client = await wait_for(connect(reactor, f"serial:{device_end}:baudrate=115200"))
    ws = await wait_for(connect(reactor, broker.ws_url))
    tcp = await wait_for(connect(reactor, broker.tcp))
    clients = {"serial": serial_client, "ws": ws, "tcp": tcp}
    try:
        inboxes = {name: Inbox() for name in clients}
        for name, client in clients.items():
            await subscribed(broker.hub, client, "room/temp", inboxes[name])
        for name, client in clients.items():
            await client.publish("room/temp", name.encode())
        for name, inbox in inboxes.items():
            got = sorted(m.payload for m in await inbox.wait(2))
            assert got == sorted(other.encode() for other in clients if other != name)
        await serial_client.set_will("devices/serial", b"unplugged")
        await eventually(lambda: any(s.will for s in broker.hub.sessions))
        watcher = Inbox()
        await subscribed(broker.hub, ws, "devices/serial", watcher)
        line.transport.loseConnection()  # the broker's side of the cable goes away
        assert await watcher.wait() == [LastWill("devices/serial", b"unplugged")]
    finally:
        for client in clients.values():
            if client.connected:
                await closed(client)


@pytest_twisted.ensureDeferred
async def test_a_known_topic_does_not_let_a_truncated_publish_through(broker):
    """Publishes on topics the broker has seen skip full decoding; a frame whose topic runs past
    its end must still be refused, even when its bytes start like a known topic."""
    sub = await wait_for(connect(reactor, broker.tcp))
    pub = await wait_for(connect(reactor, broker.tcp))
    bad = raw_tcp(broker)
    try:
        inbox = Inbox()
        await subscribed(broker.hub, sub, "ab", inbox)
        await pub.publish("ab", b"1")
        await inbox.wait(1)
        bad.sendall(length32(b"\x00\x05ab"))  # announces a 5-byte topic; only "ab" follows
        await peer_closed(bad)
        await pub.publish("ab", b"2")
        assert [m.payload for m in await inbox.wait(2)] == [b"1", b"2"]
    finally:
        bad.close()
        await closed(sub)
        await closed(pub)
