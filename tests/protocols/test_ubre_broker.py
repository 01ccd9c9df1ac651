"""The UBRE broker (server role) on real sockets, driven by raw peers that share none of its code.

WebSocket peers are bare Autobahn clients, so each frame's type is seen as sent; stream peers
(lines, length32, cobs) are plain Twisted protocols that read and write bytes, framed here by
hand. Binary-format messages are built byte by byte from the spec's layout (`packed`), never by
the codec under test. Whole clients (UbreClient, the WEBSMQ client) are used only where the bytes
do not matter.

`Broker` at the top is reused by the UBRE client tests.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import pytest_twisted
from autobahn.twisted.websocket import WebSocketClientFactory
from cobs import cobs
from twisted.internet import defer, reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.protocol import Factory
from twisted.logger import LogLevel, globalLogPublisher
from twisted.python.failure import Failure

from tests.raw_peers import RawConnection, RawStream, RawWebSocket
from tests.support import eventually, sleep, wait_for
from wireproto.codecs import websmq as websmq_codec
from wireproto.codecs.ubre import Publish
from wireproto.config import Config, parse_listen
from wireproto.hub import Hub
from wireproto.protocols import websmq
from wireproto.protocols.rpc import RequestFailed
from wireproto.protocols.ubre.client import UbreClient
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.ubre.server import UbreServer, UbreServerProtocol
from wireproto.service import make_service
from wireproto.transports.stream import StreamOptions, stream_server_factory
from wireproto.transports.websocket import WebSocketOptions
from wireproto.transports.websocket_http import websocket_resource, websocket_site

FRAMINGS = ("lines", "length32", "cobs")
STREAMING = 0xFFFFFFFF


class Broker:
    """A UBRE broker on 127.0.0.1: a Hub and a UbreServer on it, served over WebSocket at /ubre
    and over TCP with each framing (lines, length32, cobs), each on a port of its own.

    After `start()`, `ws_url` is the WebSocket URL and `lines`, `length32`, `cobs` are client
    endpoint strings ("tcp:host=127.0.0.1:port=N"). `server_options` go to UbreServer.
    `stop()` stops listening and closes the UBRE connections still open.
    """

    def __init__(
        self, hub: Hub | None = None, *, max_message_size: int = 1 << 20, **server_options: Any
    ) -> None:
        self.max_message_size = max_message_size
        self.hub = hub if hub is not None else Hub()
        self.server = UbreServer(self.hub, **server_options)
        self.ports: dict[str, Any] = {}
        self.ws_url = self.lines = self.length32 = self.cobs = ""
        self._stopped = False

    async def start(self) -> Broker:
        factories: dict[str, Any] = {
            "ws": websocket_site({"/ubre": websocket_resource(
                self.server, WebSocketOptions(max_message_size=self.max_message_size))}),
        }
        for framing in FRAMINGS:
            factories[framing] = stream_server_factory(
                self.server,
                StreamOptions(framing=framing, max_message_size=self.max_message_size),
            )
        for name, factory in factories.items():
            endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
            self.ports[name] = await endpoint.listen(factory)
        self.ws_url = f"ws://127.0.0.1:{self.port('ws')}/ubre"
        self.lines, self.length32, self.cobs = (
            f"tcp:host=127.0.0.1:port={self.port(framing)}" for framing in FRAMINGS
        )
        return self

    def port(self, name: str) -> int:
        """The port of the "ws", "lines", "length32" or "cobs" listener."""
        return self.ports[name].getHost().port

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for port in self.ports.values():
            await port.stopListening()
        for peer in list(self.server.peers):
            peer.transport.loseConnection()
        try:
            await eventually(lambda: not self.server.peers, timeout=7)
        except TimeoutError:
            for peer in list(self.server.peers):
                peer.transport.abortConnection()
        self.server.close()


@pytest_twisted.async_yield_fixture
async def broker() -> AsyncIterator[Broker]:
    running = await Broker().start()
    try:
        yield running
    finally:
        await running.stop()


# -- raw peers ------------------------------------------------------------------------------------


def packed(kind: bytes, name: bytes, body: bytes = b"", *, length: int | None = None) -> bytes:
    """A binary-format message, by hand from the spec: u8 type, u16 name length, u32 body
    length (0 without a body, 0xFFFFFFFF streaming), name, body; big-endian."""
    body_length = len(body) if length is None else length
    return kind + struct.pack(">HI", len(name), body_length) + name + body


def frame(framing: str, data: bytes) -> bytes:
    if framing == "lines":
        return data + b"\n"
    if framing == "length32":
        return struct.pack(">I", len(data)) + data
    return cobs.encode(data) + b"\x00"


def unframe(framing: str, stream: bytes) -> list[tuple[bytes, bool]]:
    """The whole messages in what a stream peer has received, each with the binary flag its
    framing gives (lines are text; length32 and cobs frames are binary)."""
    if framing == "lines":
        return [(line, False) for line in stream.split(b"\n")[:-1]]
    if framing == "cobs":
        return [(cobs.decode(part), True) for part in stream.split(b"\x00")[:-1]]
    messages, offset = [], 0
    while offset + 4 <= len(stream):
        (size,) = struct.unpack_from(">I", stream, offset)
        if offset + 4 + size > len(stream):
            break
        messages.append((stream[offset + 4 : offset + 4 + size], True))
        offset += 4 + size
    return messages


class Peer(RawConnection):
    """One raw connection to the broker over `way`: "ws" or a stream framing. `remote` is the
    broker's side of it (the `peer` that handlers and hooks get)."""

    def __init__(self, way: str, protocol: RawWebSocket | RawStream) -> None:
        self.way = way
        self.protocol = protocol
        self.remote: UbreServerProtocol | None = None
        self.read_count = 0
        self._sync_ids = itertools.count(1)

    @property
    def messages(self) -> list[tuple[bytes, bool]]:
        """Every whole message received so far, with its binary flag."""
        if isinstance(self.protocol, RawWebSocket):
            return list(self.protocol.frames)
        return unframe(self.way, bytes(self.protocol.received))

    def send(self, data: bytes, *, text: bool | None = None) -> None:
        """One message, as it is: on WebSocket in a text frame if it is JSON and a binary frame
        otherwise, unless `text` says which; on a stream, framed."""
        if isinstance(self.protocol, RawWebSocket):
            if text is None:
                text = data[:1] == b"{"
            self.protocol.sendMessage(data, isBinary=not text)
        else:
            self.protocol.transport.write(frame(self.way, data))

    async def read(self, count: int = 1) -> list[bytes]:
        """The next `count` messages. Each must have come the way its format goes: on WebSocket
        JSON in a text frame and the binary format in a binary frame; on lines, JSON only."""
        await eventually(lambda: len(self.messages) >= self.read_count + count)
        got = self.messages[self.read_count : self.read_count + count]
        self.read_count += count
        for data, binary in got:
            is_json = data[:1] == b"{"
            if self.way == "ws":
                kind = "binary" if binary else "text"
                assert binary != is_json, f"{data!r} came in a {kind} frame"
            elif self.way == "lines":
                assert is_json, f"{data!r} on a lines connection"
        return [data for data, _ in got]

    async def sync(self) -> list[bytes]:
        """Every message the broker sends before it answers a request sent now. The broker
        handles a connection's messages in order and sends through one queue, so this proves
        what did NOT arrive, without sleeping. The request names no handler: its reply is
        NotFound."""
        sync_id = f"sync-{next(self._sync_ids)}".encode()
        self.send(b'{"request":"test.sync","id":"%s"}' % sync_id)
        reply = b'{"fail":"%s","body":"NotFound"}' % sync_id
        before = []
        while True:
            (data,) = await self.read()
            if data == reply:
                return before
            before.append(data)



class Peers:
    """The connections of one test (raw peers, UBRE clients, WEBSMQ clients), all closed at its
    end, and a WEBSMQ listener on the broker's hub, started when first needed."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.raw_peers: list[Peer] = []
        self.clients: list[UbreClient] = []
        self.websmq_clients: list[websmq.WebsmqClientProtocol] = []
        self.websmq_port: Any = None

    async def raw(self, way: str) -> Peer:
        """A raw peer, once the broker has attached it (so its hooks have run)."""
        if way == "ws":
            factory = WebSocketClientFactory(self.broker.ws_url)
            factory.protocol = RawWebSocket
        else:
            factory = Factory.forProtocol(RawStream)
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.broker.port(way))
        protocol = await wait_for(endpoint.connect(factory))
        peer = Peer(way, protocol)
        self.raw_peers.append(peer)
        if way == "ws":
            await wait_for(protocol.opened)
        # Two clients of different server ports may share a local port: match both ends.
        ends = (protocol.transport.getHost().port, self.broker.port(way))

        def attached() -> UbreServerProtocol | None:
            for remote in self.broker.server.peers:
                transport = remote.transport
                if (transport.getPeer().port, transport.getHost().port) == ends:
                    return remote
            return None

        peer.remote = await eventually(attached)
        return peer

    async def client(self, address: str, **options: Any) -> UbreClient:
        client = await wait_for(ubre_connect(reactor, address, **options))
        self.clients.append(client)
        return client

    async def websmq(self) -> websmq.WebsmqClientProtocol:
        """A WEBSMQ client (length32) of a WEBSMQ server on the same hub."""
        if self.websmq_port is None:
            endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
            self.websmq_port = await endpoint.listen(
                stream_server_factory(websmq.server_factory(self.broker.hub))
            )
        address = f"tcp:host=127.0.0.1:port={self.websmq_port.getHost().port}"
        client = await wait_for(websmq.connect(reactor, address))
        self.websmq_clients.append(client)
        return client

    async def close(self) -> None:
        for client in self.clients:
            await wait_for(client.close())
        for mq in self.websmq_clients:
            await wait_for(mq.disconnect())
        for peer in self.raw_peers:
            await peer.close()
        if self.websmq_port is not None:
            await self.websmq_port.stopListening()


@pytest_twisted.async_yield_fixture
async def peers(broker: Broker) -> AsyncIterator[Peers]:
    running = Peers(broker)
    try:
        yield running
    finally:
        await running.close()


Launch = Callable[..., Awaitable[tuple[Broker, Peers]]]


@pytest_twisted.async_yield_fixture
async def launch() -> AsyncIterator[Launch]:
    """`await launch(hub_options={...}, **server_options)`: a broker of the test's own, and its
    Peers; both stopped at the end of the test."""
    started: list[tuple[Broker, Peers]] = []

    async def start(*, hub_options: dict | None = None, **options: Any) -> tuple[Broker, Peers]:
        running = await Broker(Hub(**(hub_options or {})), **options).start()
        started.append((running, Peers(running)))
        return started[-1]

    try:
        yield start
    finally:
        for running, its_peers in reversed(started):
            await its_peers.close()
            await running.stop()


async def quiet(launch: Launch, **options: Any) -> tuple[Broker, Peers]:
    """A broker that announces no topics, for tests where announcements are noise."""
    return await launch(announce_topics=False, **options)


@contextmanager
def logged() -> Iterator[list[dict]]:
    """The Twisted log events emitted inside the block."""
    events: list[dict] = []
    observer = events.append
    globalLogPublisher.addObserver(observer)
    try:
        yield events
    finally:
        globalLogPublisher.removeObserver(observer)


def warnings_in(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("log_level", LogLevel.info) >= LogLevel.warn]


JSON_WAYS = ["ws", "lines", "length32", "cobs"]
BINARY_WAYS = ["ws", "length32", "cobs"]
FORMAT_WAYS = [pytest.param(way, False, id=f"json-{way}") for way in JSON_WAYS] + [
    pytest.param(way, True, id=f"binary-{way}") for way in BINARY_WAYS
]


def test_packed_matches_the_vectors_in_notes() -> None:
    """The hand-built binary messages the tests compare with are the spec's own bytes."""
    assert packed(b"S", b"news") == bytes.fromhex("530004000000006e657773")
    assert packed(b"P", b"temps", b'{"c":21.5}') == bytes.fromhex(
        "5000050000000a74656d70737b2263223a32312e357d"
    )
    assert packed(b"P", b"log", b"...", length=STREAMING) == bytes.fromhex(
        "500003ffffffff6c6f67"
    ) + b"..."


# -- subscribe and unsubscribe --------------------------------------------------------------------


@pytest.mark.parametrize(("way", "binary"), FORMAT_WAYS)
@pytest_twisted.ensureDeferred
async def test_subscribe_and_unsubscribe_reach_the_hub_and_the_hooks(
    launch: Launch, way: str, binary: bool
) -> None:
    broker, peers = await quiet(launch)
    calls = []
    broker.server.on_subscribe = lambda topic, body, peer: calls.append(("sub", topic, body, peer))
    broker.server.on_unsubscribe = lambda topic, body, peer: calls.append(
        ("unsub", topic, body, peer)
    )
    peer = await peers.raw(way)
    if binary:
        sent = [
            packed(b"S", b"news", b"since 5"),
            bytes.fromhex("530005000000007374617465"),  # subscribe "state", no body
            packed(b"U", b"news", b"bye"),
            packed(b"U", b"never"),  # not subscribed: no hook
        ]
        bodies = [b"since 5", b"", b"bye"]
    else:
        sent = [
            b'{"subscribe":"news","body":{"since":5}}',
            b'{"subscribe":"state"}',
            b'{"unsubscribe":"news","body":{"since":5}}',
            b'{"unsubscribe":"never"}',
        ]
        bodies = [{"since": 5}, None, {"since": 5}]
    for message in sent:
        peer.send(message)
    assert await peer.sync() == []  # UBRE acknowledges neither
    remote = peer.remote
    assert calls == [
        ("sub", "news", bodies[0], remote),
        ("sub", "state", bodies[1], remote),
        ("unsub", "news", bodies[2], remote),
    ]
    assert broker.hub.topics() == ["state"]
    assert list(broker.hub.subscribers("state")) == [remote.session]


# -- publish --------------------------------------------------------------------------------------


async def three_subscribers(peers: Peers, topic: bytes) -> tuple[Peer, Peer, Peer]:
    """A JSON subscriber on WebSocket, one on lines, and a binary one on length32."""
    json_ws, lines, binary = [await peers.raw(way) for way in ("ws", "lines", "length32")]
    json_ws.send(b'{"subscribe":"%s"}' % topic)
    lines.send(b'{"subscribe":"%s"}' % topic)
    binary.send(packed(b"S", topic))
    for peer in (json_ws, lines, binary):
        assert await peer.sync() == []
    return json_ws, lines, binary


@pytest.mark.parametrize("way", JSON_WAYS)
@pytest_twisted.ensureDeferred
async def test_a_json_publish_reaches_json_and_binary_subscribers(launch: Launch, way: str) -> None:
    broker, peers = await quiet(launch)
    json_ws, lines, binary = await three_subscribers(peers, b"temps")
    publisher = await peers.raw(way)
    for message in (
        b'{"publish":"temps","body":{ "c" : 21.5 }}',
        b'{"publish":"temps"}',
        b'{"publish":"temps","body":null}',
        '{"publish":"temps","body":"h\u00e9"}'.encode(),
        b'{"publish":"temperature","body":1}',  # exact topics only
    ):
        publisher.send(message)
    assert await publisher.sync() == []
    as_json = [
        b'{"publish":"temps","body":{"c":21.5}}',
        b'{"publish":"temps"}',
        b'{"publish":"temps","body":null}',
        '{"publish":"temps","body":"h\u00e9"}'.encode(),
    ]
    assert await json_ws.sync() == as_json
    assert await lines.sync() == as_json
    assert await binary.sync() == [
        bytes.fromhex("5000050000000a74656d70737b2263223a32312e357d"),
        packed(b"P", b"temps"),
        packed(b"P", b"temps", b"null"),
        packed(b"P", b"temps", '"h\u00e9"'.encode()),
    ]


@pytest.mark.parametrize("way", BINARY_WAYS)
@pytest_twisted.ensureDeferred
async def test_a_binary_publish_reaches_binary_and_json_subscribers(
    launch: Launch, way: str
) -> None:
    broker, peers = await quiet(launch)
    json_ws, lines, binary = await three_subscribers(peers, b"temps")
    publisher = await peers.raw(way)
    not_utf8 = packed(b"P", b"temps", b"\xff\x00\xfe")
    sent = [
        packed(b"P", b"temps", b'{"c": 21.5}'),  # UTF-8 JSON
        packed(b"P", b"temps", b"hello"),  # UTF-8, not JSON
        packed(b"P", b"temps"),  # no body
        not_utf8,
        packed(b"P", b"temps", b'"tail"', length=STREAMING),
        packed(b"P", b"temps", b"", length=STREAMING),
        packed(b"P", b"temperature", b"1"),  # exact topics only
    ]
    for message in sent:
        publisher.send(message)
    assert await publisher.sync() == []
    assert await binary.sync() == sent[:-1]  # forwarded byte for byte, streaming kept
    as_json = [
        b'{"publish":"temps","body":{"c":21.5}}',
        b'{"publish":"temps","body":"hello"}',
        b'{"publish":"temps"}',
    ]
    tail = [b'{"publish":"temps","body":"tail"}', b'{"publish":"temps"}']
    # JSON cannot carry the non-UTF-8 payload: WebSocket sends it as a binary-format message in
    # a binary frame (read() checks the frame type), lines skips it.
    assert await json_ws.sync() == [*as_json, not_utf8, *tail]
    assert (not_utf8, True) in json_ws.protocol.frames
    assert await lines.sync() == [*as_json, *tail]


@pytest.mark.parametrize("way", JSON_WAYS + ["ws-binary"])
@pytest_twisted.ensureDeferred
async def test_a_publish_is_never_echoed_to_its_sender(launch: Launch, way: str) -> None:
    broker, peers = await quiet(launch)
    sender = await peers.raw(way.removesuffix("-binary"))
    other = await peers.raw("lines")
    if way.endswith("-binary"):
        subscribe, publish = packed(b"S", b"t"), packed(b"P", b"t", b"1")
    else:
        subscribe, publish = b'{"subscribe":"t"}', b'{"publish":"t","body":1}'
    sender.send(subscribe)
    other.send(b'{"subscribe":"t"}')
    assert await other.sync() == []
    sender.send(publish)
    assert await sender.sync() == []
    assert await other.sync() == [b'{"publish":"t","body":1}']
    assert broker.hub.stats.delivered == 1


@pytest_twisted.ensureDeferred
async def test_a_connection_gets_publishes_in_the_format_of_its_latest_subscribe(
    launch: Launch,
) -> None:
    broker, peers = await quiet(launch)
    subscriber = await peers.raw("ws")
    publisher = await peers.raw("lines")

    async def publish(n: int) -> None:
        publisher.send(b'{"publish":"a","body":{"n":%d}}' % n)
        assert await publisher.sync() == []

    subscriber.send(b'{"subscribe":"a"}')
    assert await subscriber.sync() == []
    await publish(1)
    subscriber.send(packed(b"S", b"b"))  # binary from now on, topic "a" too
    assert await subscriber.sync() == [b'{"publish":"a","body":{"n":1}}']
    await publish(2)
    subscriber.send(b'{"subscribe":"c"}', text=False)  # JSON, even in a binary frame
    assert await subscriber.sync() == [packed(b"P", b"a", b'{"n":2}')]
    await publish(3)
    assert await subscriber.sync() == [b'{"publish":"a","body":{"n":3}}']
    publications = [f for f in subscriber.protocol.frames if b"publish" in f[0] or f[0][:1] == b"P"]
    assert publications == [
        (b'{"publish":"a","body":{"n":1}}', False),
        (packed(b"P", b"a", b'{"n":2}'), True),
        (b'{"publish":"a","body":{"n":3}}', False),
    ]


# -- requests from a client -----------------------------------------------------------------------


@pytest.mark.parametrize("way", JSON_WAYS)
@pytest_twisted.ensureDeferred
async def test_json_requests_in_both_dialects(launch: Launch, way: str) -> None:
    broker, peers = await quiet(launch)
    broker.server.handle("add", lambda body, peer: sum(body))
    broker.server.handle("nothing", lambda body, peer: None)
    broker.server.default_handler = lambda body, peer: {"echo": body}
    peer = await peers.raw(way)
    sent = [
        b'{"request":"add","id":1,"body":[1,2]}',  # ubre.js form
        b'{"request":"add","id":"1","body":[3,4]}',  # the id's JSON type is kept
        b'{"request":"add","id":-7,"body":[]}',
        b'{"request":"nothing","id":2}',
        b'{"request":"missing","id":3}',
        b'{"request":"unique id","body":"x"}',  # spec form: "request" is the id
        b'{"request":5}',
        b'{"body":[5,6],"id":9,"request":"add"}',  # key order does not matter
    ]
    for message in sent:
        peer.send(message)
    assert await peer.read(len(sent)) == [
        b'{"success":1,"body":3}',
        b'{"success":"1","body":7}',
        b'{"success":-7,"body":0}',
        b'{"success":2}',
        b'{"fail":3,"body":"NotFound"}',
        b'{"success":"unique id","body":{"echo":"x"}}',
        b'{"success":5,"body":{"echo":null}}',
        b'{"success":9,"body":11}',
    ]


@pytest.mark.parametrize("way", BINARY_WAYS)
@pytest_twisted.ensureDeferred
async def test_binary_requests_go_to_the_default_handler(launch: Launch, way: str) -> None:
    broker, peers = await quiet(launch)
    results = {b"str": "\u00e9", b"json": {"a": [1]}, b"none": None}
    broker.server.default_handler = lambda body, peer: results.get(body, body.upper())
    peer = await peers.raw(way)
    sent = [
        packed(b"R", b"1", b"abc"),
        packed(b"R", b"2"),  # no body: the handler gets b""
        packed(b"R", b"3", b"stream", length=STREAMING),
        packed(b"R", b"4", b"str"),
        packed(b"R", b"5", b"json"),
        packed(b"R", b"6", b"none"),
        packed(b"R", "\u00efd".encode(), b"x"),
    ]
    for message in sent:
        peer.send(message)
    assert await peer.read(len(sent)) == [
        packed(b"s", b"1", b"ABC"),
        packed(b"s", b"2"),
        packed(b"s", b"3", b"STREAM"),
        packed(b"s", b"4", "\u00e9".encode()),
        packed(b"s", b"5", b'{"a":[1]}'),
        packed(b"s", b"6"),
        packed(b"s", "\u00efd".encode(), b"X"),
    ]
    broker.server.default_handler = None
    peer.send(packed(b"R", b"7", b"abc"))
    assert await peer.read() == [b"f\x00\x01\x00\x00\x00\x087NotFound"]  # fail is 0x66


@pytest_twisted.ensureDeferred
async def test_replies_come_in_the_requests_format_and_frame_type(launch: Launch) -> None:
    broker, peers = await quiet(launch)
    broker.server.handle("echo", lambda body, peer: body)
    broker.server.default_handler = lambda body, peer: body
    peer = await peers.raw("ws")
    peer.send(b'{"request":"echo","id":1,"body":"a"}')
    peer.send(packed(b"R", b"2", b"b"))
    peer.send(b'{"request":"echo","id":3,"body":"c"}', text=False)  # JSON in a binary frame
    peer.send(b' \n{"request":4}', text=False)  # JSON may start with whitespace
    await peer.read(4)
    assert peer.protocol.frames == [
        (b'{"success":1,"body":"a"}', False),
        (packed(b"s", b"2", b"b"), True),
        (b'{"success":3,"body":"c"}', False),
        (b'{"success":4}', False),
    ]


@pytest_twisted.ensureDeferred
async def test_lines_is_newline_json_that_nc_users_can_type(launch: Launch) -> None:
    broker, peers = await quiet(launch)
    broker.server.handle("add", lambda body, peer: sum(body))
    peer = await peers.raw("lines")
    peer.protocol.transport.write(b'{"request":"add","id":1,"body":[1,2]}\r\n')  # nc -C, telnet
    peer.protocol.transport.write(b'{"request":"add",')
    peer.protocol.transport.write(b'"id":2,"body":[3]}\n')
    await peer.read(2)
    assert bytes(peer.protocol.received) == b'{"success":1,"body":3}\n{"success":2,"body":3}\n'


@pytest_twisted.ensureDeferred
async def test_empty_lines_and_empty_text_frames_are_ignored(launch: Launch) -> None:
    broker, peers = await quiet(launch)
    broker.server.handle("add", lambda body, peer: sum(body))
    lines, ws = await peers.raw("lines"), await peers.raw("ws")
    lines.protocol.transport.write(b'\n\r\n  \n{"request":"add","id":1,"body":[1,2]}\n')
    ws.send(b"", text=True)
    ws.send(b'{"request":"add","id":2,"body":[3]}')
    assert await lines.read() == [b'{"success":1,"body":3}']
    assert await ws.read() == [b'{"success":2,"body":3}']
    assert not lines.is_closed and not ws.is_closed


@pytest_twisted.ensureDeferred
async def test_bytes_returned_to_a_json_request_map_like_a_hub_payload(launch: Launch) -> None:
    broker, peers = await quiet(launch)
    broker.server.handle({
        "json": lambda body, peer: b'{ "c": 21.5 }',
        "text": lambda body, peer: b"hello",
        "empty": lambda body, peer: b"",
        "raw": lambda body, peer: b"\xff\x00",
    })
    peer = await peers.raw("ws")
    for n, name in enumerate((b"json", b"text", b"empty", b"raw"), 1):
        peer.send(b'{"request":"%s","id":%d}' % (name, n))
    replies = await peer.read(4)
    assert replies[:3] == [
        b'{"success":1,"body":{"c":21.5}}', b'{"success":2,"body":"hello"}', b'{"success":3}',
    ]
    failed = json.loads(replies[3])
    assert failed["fail"] == 4 and failed["body"]["name"] == "InvalidField"
    assert "not UTF-8" in failed["body"]["message"]


@pytest.mark.parametrize("way", ["ws", "length32"])
@pytest_twisted.ensureDeferred
async def test_a_reply_over_the_size_limit_fails_instead(launch: Launch, way: str) -> None:
    broker, peers = await quiet(launch, max_message_size=4096)
    broker.server.handle("big", lambda body, peer: "x" * 5000)
    peer = await peers.raw(way)
    peer.send(b'{"request":"big","id":1}', text=True)
    (reply,) = await peer.read()
    failed = json.loads(reply)
    assert failed["fail"] == 1 and failed["body"]["name"] == "FrameTooLarge"
    assert "4096" in failed["body"]["message"]
    assert await peer.sync() == [] and not peer.is_closed


@pytest.mark.parametrize("way", ["ws", "length32", "cobs"])
@pytest_twisted.ensureDeferred
async def test_a_binary_request_with_a_long_streaming_body(launch: Launch, way: str) -> None:
    broker, peers = await quiet(launch)
    broker.server.default_handler = lambda body, peer: len(body)
    peer = await peers.raw(way)
    body = bytes(range(256)) * 1000
    peer.send(packed(b"R", b"big", body, length=STREAMING))
    assert await peer.read() == [packed(b"s", b"big", b"256000")]


# -- handlers -------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_sync_deferred_and_coroutine_handlers(launch: Launch) -> None:
    broker, peers = await quiet(launch)
    server = broker.server
    server.handle("sync", lambda body, peer: body * 2)
    server.handle(
        "deferred", lambda body, peer: task.deferLater(reactor, 0.01, lambda: body * 3)
    )

    @server.handle("coroutine")
    async def coroutine(body: int, peer: Any) -> int:
        await sleep(0.01)
        return body * 4

    server.handle({"mapped": lambda body, peer: -body})
    peer = await peers.raw("ws")
    for n, name in enumerate((b"sync", b"deferred", b"coroutine", b"mapped"), 1):
        peer.send(b'{"request":"%s","id":%d,"body":10}' % (name, n))
    replies = await peer.read(4)
    assert sorted(replies) == [
        b'{"success":1,"body":20}',
        b'{"success":2,"body":30}',
        b'{"success":3,"body":40}',
        b'{"success":4,"body":-10}',
    ]


@pytest.mark.parametrize("debug", [False, True], ids=["quiet", "debug"])
@pytest_twisted.ensureDeferred
async def test_a_raising_handler_fails_the_request_with_a_flattened_error(
    launch: Launch, debug: bool
) -> None:
    broker, peers = await quiet(launch, debug=debug)

    def broken(body: Any, peer: Any) -> None:
        raise ValueError("bad input")

    async def broken_later(body: Any, peer: Any) -> None:
        await sleep(0)
        raise KeyError("k")

    broker.server.handle({"broken": broken, "later": broken_later})
    broker.server.default_handler = broken
    json_peer, binary_peer = await peers.raw("ws"), await peers.raw("length32")
    with logged() as events:
        json_peer.send(b'{"request":"broken","id":1}')
        json_peer.send(b'{"request":"later","id":2}')
        binary_peer.send(packed(b"R", b"3"))
        (broken_reply, later_reply), (binary_reply,) = (
            await json_peer.read(2), await binary_peer.read()
        )
    if not debug:
        assert broken_reply == b'{"fail":1,"body":{"name":"ValueError","message":"bad input"}}'
        assert later_reply == b'{"fail":2,"body":{"name":"KeyError","message":"\'k\'"}}'
        assert binary_reply == packed(
            b"f", b"3", b'{"name":"ValueError","message":"bad input"}'
        )
    else:
        assert binary_reply[:1] + binary_reply[7:8] == b"f3"
        bodies = [json.loads(broken_reply)["body"], json.loads(binary_reply[8:])]
        for body in bodies:
            assert set(body) == {"name", "message", "stack"}
            assert (body["name"], body["message"]) == ("ValueError", "bad input")
            assert "Traceback" in body["stack"] and "ValueError: bad input" in body["stack"]
    failures = [e for e in events if "log_failure" in e]
    assert len(failures) == 3  # the server's own log has every one


@pytest_twisted.ensureDeferred
async def test_raising_request_failed_fails_with_that_body_as_it_is(launch: Launch) -> None:
    broker, peers = await quiet(launch)

    def raising(body: Any) -> Callable[[Any, Any], Any]:
        def handler(request_body: Any, peer: Any) -> None:
            raise RequestFailed(body)

        return handler

    async def coroutine(body: Any, peer: Any) -> None:
        raise RequestFailed("late")

    broker.server.handle({
        "object": raising({"code": 42, "why": "no"}),
        "text": raising("plain"),
        "none": raising(None),
        "deferred": lambda body, peer: defer.fail(RequestFailed([1, 2])),
        "coroutine": coroutine,
    })
    broker.server.default_handler = raising(b"\x00raw")
    json_peer, binary_peer = await peers.raw("ws"), await peers.raw("cobs")
    with logged() as events:
        for n, name in enumerate((b"object", b"text", b"none", b"deferred", b"coroutine"), 1):
            json_peer.send(b'{"request":"%s","id":%d}' % (name, n))
        binary_peer.send(packed(b"R", b"6"))
        assert await json_peer.read(5) == [
            b'{"fail":1,"body":{"code":42,"why":"no"}}',
            b'{"fail":2,"body":"plain"}',
            b'{"fail":3}',
            b'{"fail":4,"body":[1,2]}',
            b'{"fail":5,"body":"late"}',
        ]
        assert await binary_peer.read() == [packed(b"f", b"6", b"\x00raw")]
    assert warnings_in(events) == []  # a deliberate fail is not an error of the server's


@pytest_twisted.ensureDeferred
async def test_a_result_json_cannot_encode_fails_and_the_connection_lives_on(
    launch: Launch,
) -> None:
    broker, peers = await quiet(launch)
    cycle: list = []
    cycle.append(cycle)
    broker.server.handle({
        "object": lambda body, peer: object(),
        "nan": lambda body, peer: float("nan"),
        "cycle": lambda body, peer: cycle,
        "deep": lambda body, peer: {"set": {1, 2}},
    })
    broker.server.default_handler = lambda body, peer: object()
    json_peer, binary_peer = await peers.raw("lines"), await peers.raw("length32")
    for n, name in enumerate((b"object", b"nan", b"cycle", b"deep"), 1):
        json_peer.send(b'{"request":"%s","id":%d}' % (name, n))
    binary_peer.send(packed(b"R", b"5", b"x"))
    replies = [json.loads(reply) for reply in await json_peer.read(4)]
    (binary_reply,) = await binary_peer.read()
    assert binary_reply[:1] == b"f" and binary_reply[7:8] == b"5"
    replies.append({"fail": 5, "body": json.loads(binary_reply[8:])})
    for n, reply in enumerate(replies, 1):
        assert set(reply) == {"fail", "body"} and reply["fail"] == n
        assert reply["body"]["name"] == "InvalidField"
        assert "JSON" in reply["body"]["message"]
    assert await json_peer.sync() == []
    assert await binary_peer.sync() == []


@pytest_twisted.ensureDeferred
async def test_a_handler_gets_the_peer_that_asked_and_can_ask_it_back(launch: Launch) -> None:
    broker, peers = await quiet(launch)
    seen = []

    def who(body: Any, peer: UbreServerProtocol) -> int:
        seen.append(peer)
        return peer.transport.getPeer().port

    async def ask_back(body: Any, peer: UbreServerProtocol) -> Any:
        return await peer.request("double", body)

    broker.server.handle({"who": who, "ask back": ask_back})
    ws, lines = await peers.raw("ws"), await peers.raw("lines")
    ws.send(b'{"request":"who","id":1}')
    lines.send(b'{"request":"who","id":1}')
    ws_port = ws.protocol.transport.getHost().port
    lines_port = lines.protocol.transport.getHost().port
    assert await ws.read() == [b'{"success":1,"body":%d}' % ws_port]
    assert await lines.read() == [b'{"success":1,"body":%d}' % lines_port]
    assert seen == [ws.remote, lines.remote]
    assert ws.remote.session in broker.hub.sessions

    lines.send(b'{"request":"ask back","id":"q","body":21}')
    assert await lines.read() == [b'{"request":"double","id":1,"body":21}']
    lines.send(b'{"success":1,"body":42}')
    assert await lines.read() == [b'{"success":"q","body":42}']


# A limit the fast path must keep: on both of its paths.
@pytest.mark.usefixtures("fast_path")
@pytest_twisted.ensureDeferred
async def test_requests_past_max_pending_requests_fail_with_too_many_requests(
    launch: Launch,
) -> None:
    broker, peers = await quiet(launch, max_pending_requests=2)
    waiting: list[defer.Deferred] = []

    def slow(body: Any, peer: Any) -> defer.Deferred:
        waiting.append(defer.Deferred())
        return waiting[-1]

    broker.server.handle("slow", slow)
    broker.server.default_handler = slow
    peer, other = await peers.raw("ws"), await peers.raw("lines")
    for n in (1, 2, 3):
        peer.send(b'{"request":"slow","id":%d}' % n)
    assert await peer.read() == [b'{"fail":3,"body":"TooManyRequests"}']
    peer.send(packed(b"R", b"4"))
    assert await peer.read() == [packed(b"f", b"4", b"TooManyRequests")]
    other.send(b'{"request":"slow","id":1}')  # the limit is per connection
    await eventually(lambda: len(waiting) == 3)
    waiting[0].callback("one")
    waiting[1].callback("two")
    waiting[2].callback("other")
    assert await peer.read(2) == [b'{"success":1,"body":"one"}', b'{"success":2,"body":"two"}']
    assert await other.read() == [b'{"success":1,"body":"other"}']
    peer.send(b'{"request":"slow","id":5}')  # room again
    await eventually(lambda: len(waiting) == 4)
    waiting[3].callback("five")
    assert await peer.read() == [b'{"success":5,"body":"five"}']


@pytest_twisted.ensureDeferred
async def test_a_reply_to_a_client_that_left_is_dropped_quietly(launch: Launch) -> None:
    broker, peers = await quiet(launch)
    waiting: defer.Deferred = defer.Deferred()
    asked = []
    broker.server.handle("slow", lambda body, peer: (asked.append(peer), waiting)[1])
    leaving, staying = await peers.raw("ws"), await peers.raw("length32")
    leaving.send(b'{"request":"slow","id":1}')
    await eventually(lambda: asked)
    await leaving.close()
    await eventually(lambda: leaving.remote not in broker.server.peers)
    with logged() as events:
        waiting.callback("too late")
    assert not asked[0].connected
    assert warnings_in(events) == []
    assert leaving.messages == []
    assert await staying.sync() == []


# -- the server asks a client ---------------------------------------------------------------------


@pytest.mark.parametrize("way", JSON_WAYS)
@pytest_twisted.ensureDeferred
async def test_the_server_asks_a_json_client(launch: Launch, way: str) -> None:
    broker, peers = await quiet(launch)
    peer = await peers.raw(way)
    asking = peer.remote.request("ping", {"n": 1})
    assert await peer.read() == [b'{"request":"ping","id":1,"body":{"n":1}}']
    peer.send(b'{"success":1,"body":"pong"}')
    assert await wait_for(asking) == "pong"

    asking = peer.remote.request("ping")
    assert await peer.read() == [b'{"request":"ping","id":2}']
    peer.send(b'{"fail":2,"body":{"why":"no"}}')
    with pytest.raises(RequestFailed) as failed:
        await wait_for(asking)
    assert failed.value.body == {"why": "no"}

    asking = peer.remote.request(None, "spec form")
    assert await peer.read() == [b'{"request":3,"body":"spec form"}']
    peer.send(b'{"success":3}')
    assert await wait_for(asking) is None

    asking = peer.remote.request("ping")
    assert await peer.read() == [b'{"request":"ping","id":4}']
    peer.send(b'{"fail":4}')
    with pytest.raises(RequestFailed) as failed:
        await wait_for(asking)
    assert failed.value.body is None
    if way == "lines":
        with pytest.raises(ValueError, match="lines"):
            peer.remote.request(None, b"x", binary=True)


@pytest.mark.parametrize("way", BINARY_WAYS)
@pytest_twisted.ensureDeferred
async def test_the_server_asks_a_binary_client(launch: Launch, way: str) -> None:
    broker, peers = await quiet(launch)
    peer = await peers.raw(way)
    peer.send(packed(b"S", b"t"))  # binary from now on: requests too
    assert await peer.sync() == []

    async def ask(body: Any, request: bytes, reply: bytes) -> Any:
        asking = peer.remote.request(None, body)
        assert await peer.read() == [request]
        peer.send(reply)
        return await wait_for(asking)

    assert await ask(b"data", packed(b"R", b"1", b"data"), packed(b"s", b"1", b"ok")) == b"ok"
    assert await ask(None, packed(b"R", b"2"), packed(b"s", b"2")) == b""
    streamed = packed(b"s", b"3", b"streamed", length=STREAMING)
    assert await ask({"n": 1}, packed(b"R", b"3", b'{"n":1}'), streamed) == b"streamed"
    for n, code in ((4, b"f"), (5, b"c")):  # 0x63, the spec table's typo, is read as fail
        with pytest.raises(RequestFailed) as failed:
            await ask("why", packed(b"R", b"%d" % n, b"why"), packed(code, b"%d" % n, b"no"))
        assert failed.value.body == b"no"
    with pytest.raises(ValueError, match="name"):
        peer.remote.request("named", b"x")
    # A JSON request can still be sent to a binary-format connection, and is answered in JSON.
    asking = peer.remote.request("ping", binary=False)
    assert await peer.read() == [b'{"request":"ping","id":6}']
    peer.send(b'{"success":6,"body":"pong"}')
    assert await wait_for(asking) == "pong"


# -- hooks ----------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_connect_and_disconnect_hooks(launch: Launch) -> None:
    broker, peers = await quiet(launch)
    events: list[tuple] = []
    broker.server.on_connect = lambda peer: events.append(("connect", peer))
    broker.server.on_disconnect = lambda peer, reason: events.append(("disconnect", peer, reason))
    ws, lines = await peers.raw("ws"), await peers.raw("lines")
    assert events == [("connect", ws.remote), ("connect", lines.remote)]
    await ws.close()
    await eventually(lambda: len(events) == 3)
    await lines.close()
    await eventually(lambda: len(events) == 4)
    assert [event[:2] for event in events[2:]] == [
        ("disconnect", ws.remote), ("disconnect", lines.remote)
    ]
    assert all(isinstance(event[2], Failure) for event in events[2:])
    assert not broker.server.peers and not broker.hub.sessions


@pytest_twisted.ensureDeferred
async def test_topic_start_and_end_hooks_follow_the_hub_across_protocols(
    launch: Launch,
) -> None:
    broker, peers = await quiet(launch)
    events: list[tuple[str, str]] = []
    broker.server.on_topic_start = lambda topic: events.append(("start", topic))
    broker.server.on_topic_end = lambda topic: events.append(("end", topic))
    first, second = await peers.raw("ws"), await peers.raw("length32")
    first.send(b'{"subscribe":"t"}')
    second.send(packed(b"S", b"t"))
    assert await first.sync() == [] and await second.sync() == []
    assert events == [("start", "t")]
    first.send(b'{"unsubscribe":"t"}')
    assert await first.sync() == []
    assert events == [("start", "t")]
    await second.close()  # its last subscriber leaves without unsubscribing
    await eventually(lambda: len(events) == 2)
    assert events[1] == ("end", "t")

    mq = await peers.websmq()
    await mq.subscribe("w")
    await eventually(lambda: len(events) == 3)
    await wait_for(mq.disconnect())
    await eventually(lambda: len(events) == 4)
    assert events[2:] == [("start", "w"), ("end", "w")]


@pytest_twisted.ensureDeferred
async def test_a_raising_hook_does_not_break_the_connection(launch: Launch) -> None:
    broker, peers = await quiet(launch)
    hooks = (
        "on_connect", "on_disconnect", "on_subscribe", "on_unsubscribe",
        "on_topic_start", "on_topic_end",
    )

    def boom(*args: Any) -> None:
        raise RuntimeError("hook")

    for name in hooks:
        setattr(broker.server, name, boom)
    broker.server.handle("add", lambda body, peer: sum(body))
    with logged() as events:
        subscriber, publisher = await peers.raw("lines"), await peers.raw("ws")
        subscriber.send(b'{"subscribe":"t"}')
        assert await subscriber.sync() == []
        publisher.send(b'{"publish":"t","body":1}')
        publisher.send(b'{"request":"add","id":1,"body":[1,2]}')
        assert await publisher.read() == [b'{"success":1,"body":3}']
        assert await subscriber.sync() == [b'{"publish":"t","body":1}']
        subscriber.send(b'{"unsubscribe":"t"}')
        assert await subscriber.sync() == []
        await publisher.close()
        await eventually(lambda: publisher.remote not in broker.server.peers)
    raised = {e.get("hook") for e in events if "log_failure" in e}
    assert raised == set(hooks)
    assert subscriber.remote in broker.server.peers and not subscriber.is_closed


# -- announcements --------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_topics_are_announced_on_connect_and_as_they_start_and_end(
    broker: Broker, peers: Peers
) -> None:
    a = await peers.raw("ws")
    assert await a.sync() == []  # no topics yet
    a.send(b'{"subscribe":"news"}')
    assert await a.sync() == [b'{"subscribe":"news"}']  # its own, too: the broker wants it now
    b = await peers.raw("lines")
    assert await b.sync() == [b'{"subscribe":"news"}']  # on connect
    c = await peers.raw("length32")
    c.send(packed(b"S", b"bin"))
    # JSON on connect (no subscribe yet), then in the format of its binary subscribe
    assert await c.sync() == [b'{"subscribe":"news"}', packed(b"S", b"bin")]
    assert await a.sync() == [b'{"subscribe":"bin"}']
    assert await b.sync() == [b'{"subscribe":"bin"}']

    b.send(b'{"subscribe":"news"}')  # not a new topic
    a.send(b'{"unsubscribe":"news"}')  # b still has it
    assert await b.sync() == [] and await a.sync() == [] and await c.sync() == []

    await c.close()  # "bin" ends with its connection
    assert await a.sync() == [b'{"unsubscribe":"bin"}']
    assert await b.sync() == [b'{"unsubscribe":"bin"}']
    b.send(b'{"unsubscribe":"news"}')
    assert await b.sync() == [b'{"unsubscribe":"news"}']
    assert await a.sync() == [b'{"unsubscribe":"news"}']

    mq = await peers.websmq()  # a WEBSMQ subscriber starts a topic too
    await mq.subscribe("sensors/temp")
    await eventually(lambda: broker.hub.subscribers("sensors/temp"))
    assert await a.sync() == [b'{"subscribe":"sensors/temp"}']
    d = await peers.raw("cobs")
    assert await d.sync() == [b'{"subscribe":"sensors/temp"}']


@pytest_twisted.ensureDeferred
async def test_announce_topics_false_announces_nothing(launch: Launch) -> None:
    broker, peers = await launch(announce_topics=False)
    a = await peers.raw("ws")
    a.send(b'{"subscribe":"news"}')
    assert await a.sync() == []
    b = await peers.raw("lines")
    b.send(b'{"subscribe":"more"}')
    b.send(b'{"unsubscribe":"more"}')
    assert await b.sync() == []
    await b.close()
    assert await a.sync() == []
    assert broker.hub.topics() == ["news"]


# -- publishing from the host ---------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_peer_publish_reaches_that_one_subscriber(launch: Launch) -> None:
    broker, peers = await quiet(launch)
    results: list[bool] = []
    broker.server.on_subscribe = lambda topic, body, peer: results.append(
        peer.publish(topic, {"current": 21.5})
    )
    json_ws = await peers.raw("ws")
    json_ws.send(b'{"subscribe":"state"}')
    assert await json_ws.sync() == [b'{"publish":"state","body":{"current":21.5}}']
    binary = await peers.raw("length32")
    binary.send(packed(b"S", b"state"))
    assert await binary.sync() == [packed(b"P", b"state", b'{"current":21.5}')]
    lines = await peers.raw("lines")
    lines.send(b'{"subscribe":"state"}')
    assert await lines.sync() == [b'{"publish":"state","body":{"current":21.5}}']
    assert await json_ws.sync() == []  # the others' welcomes are theirs alone
    assert results == [True, True, True]

    assert json_ws.remote.publish("elsewhere", 1) is False  # not subscribed
    assert json_ws.remote.publish("state", b"\xff") is True  # binary format, binary frame
    assert lines.remote.publish("state", b"\xff") is False  # lines cannot carry it
    assert lines.remote.publish("state") is True
    assert await json_ws.sync() == [packed(b"P", b"state", b"\xff")]
    assert await lines.sync() == [b'{"publish":"state"}']
    assert await binary.sync() == []


@pytest_twisted.ensureDeferred
async def test_server_publish_reaches_every_protocol(launch: Launch) -> None:
    broker, peers = await quiet(launch)
    json_ws, binary = await peers.raw("ws"), await peers.raw("cobs")
    json_ws.send(b'{"subscribe":"sensors/temp"}')
    binary.send(packed(b"S", b"sensors/temp"))
    client = await peers.client(broker.lines)
    at_client: list[Publish] = []
    client.subscribe("sensors/temp", at_client.append)
    mq = await peers.websmq()
    at_mq: list = []
    await mq.subscribe("sensors/temp", at_mq.append)
    await eventually(lambda: len(broker.hub.subscribers("sensors/temp")) == 4)

    assert broker.server.publish("sensors/temp", {"c": 21.5}) == 4
    assert broker.server.publish("sensors/temp", b"raw") == 4
    assert broker.server.publish("sensors/temp") == 4
    assert await json_ws.sync() == [
        b'{"publish":"sensors/temp","body":{"c":21.5}}',
        b'{"publish":"sensors/temp","body":"raw"}',
        b'{"publish":"sensors/temp"}',
    ]
    assert await binary.sync() == [
        packed(b"P", b"sensors/temp", b'{"c":21.5}'),
        packed(b"P", b"sensors/temp", b"raw"),
        packed(b"P", b"sensors/temp"),
    ]
    await eventually(lambda: len(at_client) == 3 and len(at_mq) == 3)
    assert [m.body for m in at_client] == [{"c": 21.5}, "raw", None]
    assert at_mq == [
        websmq_codec.Publish("sensors/temp", b'{"c":21.5}'),
        websmq_codec.Publish("sensors/temp", b"raw"),
        websmq_codec.Publish("sensors/temp", b""),
    ]


# -- with WEBSMQ on the same hub ------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_websmq_and_ubre_share_topics_both_ways(launch: Launch) -> None:
    broker, peers = await quiet(launch)
    mq = await peers.websmq()
    at_mq: list = []
    await mq.subscribe("sensors/temp", at_mq.append)
    json_ws, binary = await peers.raw("ws"), await peers.raw("cobs")
    json_ws.send(b'{"subscribe":"sensors/temp"}')
    binary.send(packed(b"S", b"sensors/temp"))
    client = await peers.client(broker.ws_url)
    at_client: list[Publish] = []
    client.subscribe("sensors/temp", at_client.append)
    await eventually(lambda: len(broker.hub.subscribers("sensors/temp")) == 4)

    await mq.publish("sensors/temp", b'{"c":21.5}')
    await eventually(lambda: at_client)
    assert at_client == [Publish("sensors/temp", {"c": 21.5})]
    assert await json_ws.sync() == [b'{"publish":"sensors/temp","body":{"c":21.5}}']
    assert await binary.sync() == [packed(b"P", b"sensors/temp", b'{"c":21.5}')]

    json_ws.send(b'{"publish":"sensors/temp","body":{"c":22}}')
    binary.send(packed(b"P", b"sensors/temp", b"\x00\x01"))
    await client.publish("sensors/temp", "text")
    await eventually(lambda: len(at_mq) == 3)
    assert sorted(m.payload for m in at_mq) == sorted([b'{"c":22}', b"\x00\x01", b'"text"'])
    assert all(m.topic == "sensors/temp" for m in at_mq)


# -- bad input ------------------------------------------------------------------------------------

# name: (way, the culprit's last messages as (data, text frame?), words in the reason, options)
BAD_INPUT = {
    "invalid JSON in a text frame": ("ws", [(b'{"publish":', True)], "JSON", {}),
    "a JSON array": ("ws", [(b"[1,2]", True)], "object", {}),
    "binary format in a text frame": ("ws", [(packed(b"S", b"x"), True)], "binary", {}),
    "truncated binary frame": ("ws", [(packed(b"P", b"topic", b"body")[:-2], False)], "body", {}),
    "unknown first byte": ("ws", [(b"hello", False)], "0x68", {}),
    "invalid JSON line": ("lines", [(b"{nope", None)], "JSON", {}),
    "binary format on lines": ("lines", [(packed(b"S", b"x"), None)], "binary", {}),
    "truncated length32 frame": ("length32", [(packed(b"P", b"topic")[:-1], None)], "name", {}),
    "trailing bytes in cobs": ("cobs", [(packed(b"S", b"x") + b"!", None)], "trailing", {}),
    "topic too long": (
        "ws",
        [(b'{"subscribe":"12345678"}', True), (b'{"subscribe":"123456789"}', True)],
        "at most 8",
        {"max_topic_length": 8},
    ),
    "binary publish topic too long": (
        "length32", [(packed(b"P", b"123456789", b"x"), None)], "at most 8",
        {"max_topic_length": 8},
    ),
    "too many subscriptions": (
        "ws",
        [(b'{"subscribe":"s1"}', True), (packed(b"S", b"s2"), False),
         (b'{"subscribe":"s3"}', True)],
        "subscriptions",
        {"hub_options": {"max_subscriptions": 2}},
    ),
}


@pytest.mark.parametrize(("way", "bad", "why", "options"), BAD_INPUT.values(), ids=BAD_INPUT)
@pytest_twisted.ensureDeferred
async def test_bad_input_closes_only_that_connection(
    launch: Launch, way: str, bad: list[tuple[bytes, bool | None]], why: str, options: dict
) -> None:
    broker, peers = await quiet(launch, **options)
    broker.server.handle("add", lambda body, peer: sum(body))
    watcher, other = await peers.raw("ws"), await peers.raw("lines")
    watcher.send(b'{"subscribe":"ok"}')
    assert await watcher.sync() == []
    culprit = await peers.raw(way)
    culprit.send(b'{"publish":"ok","body":"accepted"}')
    culprit.send(b'{"request":"add","id":1,"body":[1,2]}')
    for data, text in bad:
        culprit.send(data, text=text)
    culprit.send(b'{"publish":"ok","body":"too late"}')
    closed = await culprit.closed()
    # What came before the bad message was handled, its reply sent; nothing after it was.
    assert culprit.messages == [(b'{"success":1,"body":3}', way in ("length32", "cobs"))]
    assert await watcher.sync() == [b'{"publish":"ok","body":"accepted"}']
    if way == "ws":
        code, reason = closed
        assert code == 1002
        assert why in reason and len(reason.encode()) <= 123, reason
    await eventually(lambda: culprit.remote not in broker.server.peers)
    assert len(broker.hub.sessions) == 2
    assert not [t for t in broker.hub.topics() if t != "ok"]  # its subscriptions are gone
    other.send(b'{"publish":"ok","body":"still here"}')
    other.send(b'{"request":"add","id":2,"body":[2,2]}')
    assert await other.read() == [b'{"success":2,"body":4}']
    assert await watcher.sync() == [b'{"publish":"ok","body":"still here"}']


# -- the service ----------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_the_service_shares_one_ubre_server_between_its_listeners() -> None:
    config = Config(listeners=(
        parse_listen("ubre+ws@tcp:0:interface=127.0.0.1"),
        parse_listen("ubre+lines@tcp:0:interface=127.0.0.1"),
    ))
    service = make_service(config, reactor)
    service.startService()
    clients: list[UbreClient] = []
    try:
        ws_address, lines_address = (
            bound.address for bound in await wait_for(service.when_listening())
        )
        assert ws_address.startswith("ws://127.0.0.1:") and ws_address.endswith("/ubre")
        server = service.server("ubre")
        assert isinstance(server, UbreServer) and server is service.server("ubre")
        started_after_stop: list[str] = []
        assert server.hub is service.hub
        server.on_topic_start = started_after_stop.append
        server.handle("where", lambda body, peer: peer.transport.kind)  # registered once
        for address in (ws_address, lines_address):
            clients.append(await wait_for(ubre_connect(reactor, address)))
        ws, lines = clients
        assert await wait_for(ws.request("where")) == "ws"
        assert await wait_for(lines.request("where")) == "tcp"
        assert len(server.peers) == 2

        at_lines: list[Publish] = []
        lines.subscribe("news", at_lines.append)
        await eventually(lambda: service.hub.subscribers("news"))
        await ws.publish("news", {"n": 1})
        await eventually(lambda: at_lines)
        assert at_lines == [Publish("news", {"n": 1})]
    finally:
        for client in clients:
            await wait_for(client.close())
        await wait_for(service.stopService(), timeout=10)
    # Stopped, the server no longer follows the hub's topics.
    started_after_stop.clear()
    service.hub.subscribe_callback("after", lambda message: None)
    assert started_after_stop == []
