"""The SubbleSocket host (server role) on real sockets, driven by raw peers.

Peers speak raw bytes: over TCP they frame each message by hand (length32: a 4-byte big-endian
length), over WebSocket they are bare Autobahn clients that see each frame's type. Messages are
built with the codec's `encode` and read with its `decode` (the codec has its own tests); a few
tests check exact bytes against the layout in the spec and NOTES.md. A WEBSMQ client on the same
hub shows events crossing protocols.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sqlite3
import stat
import struct
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgpack
import pytest
import pytest_twisted
from autobahn.twisted.websocket import WebSocketClientFactory
from twisted.internet import reactor
from twisted.internet.endpoints import (
    TCP4ClientEndpoint,
    TCP4ServerEndpoint,
    TCP6ClientEndpoint,
    TCP6ServerEndpoint,
    UNIXClientEndpoint,
    UNIXServerEndpoint,
)
from twisted.internet.protocol import Factory

from tests.raw_peers import RawConnection, RawStream, RawWebSocket
from tests.support import Inbox, eventually, wait_for
from wireproto.codecs.subble import (
    PROTOCOL_VERSION,
    Event,
    EventError,
    HandshakeRequest,
    HandshakeResponse,
    Message,
    MessageCode,
    ProduceEvent,
    SerializationFormat,
    Version,
    decode,
    encode,
)
from wireproto.errors import LimitExceeded
from wireproto.hub import Hub
from wireproto.protocols import websmq
from wireproto.protocols.subble.registry import ClientRegistry
from wireproto.protocols.subble.server import SubbleHost, SubbleHostProtocol, server_factory
from wireproto.transports.stream import StreamOptions, stream_server_factory
from wireproto.transports.websocket import WebSocketOptions
from wireproto.transports.websocket_http import websocket_resource, websocket_site

MSGPACK = SerializationFormat.MSGPACK
JSON = SerializationFormat.JSON
WAYS = ["ws", "length32"]
MAX_MESSAGE_SIZE = 64 * 1024


class Host:
    """A SubbleHost on a hub, served over WebSocket at /subble and over TCP with length32, both
    on 127.0.0.1; `listen("ipv6")`, `listen("unix")` and `listen("websmq")` add listeners."""

    def __init__(self, hub: Hub | None = None, **options: Any) -> None:
        self.hub = hub if hub is not None else Hub()
        self.host = server_factory(self.hub, **options)
        self.ports: dict[str, Any] = {}
        self.unix_dir: str | None = None
        self._stopped = False

    async def start(self) -> Host:
        site = websocket_site({"/subble": websocket_resource(
            self.host, WebSocketOptions(max_message_size=MAX_MESSAGE_SIZE))})
        self.ports["ws"] = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site)
        self.ports["length32"] = await TCP4ServerEndpoint(
            reactor, 0, interface="127.0.0.1"
        ).listen(self._stream())
        return self

    def _stream(self) -> Any:
        return stream_server_factory(
            self.host, StreamOptions(framing="length32", max_message_size=MAX_MESSAGE_SIZE)
        )

    async def listen(self, name: str) -> None:
        if name in self.ports:
            return
        if name == "ipv6":
            endpoint: Any = TCP6ServerEndpoint(reactor, 0, interface="::1")
            factory = self._stream()
        elif name == "unix":
            # A short path: a unix socket's path is limited to about 100 bytes.
            self.unix_dir = tempfile.mkdtemp(prefix="sb")
            endpoint = UNIXServerEndpoint(reactor, os.path.join(self.unix_dir, "s"))
            factory = self._stream()
        else:
            endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
            factory = stream_server_factory(websmq.server_factory(self.hub))
        self.ports[name] = await endpoint.listen(factory)

    def port(self, name: str) -> int:
        return self.ports[name].getHost().port

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for port in self.ports.values():
            await port.stopListening()
        for client in list(self.host.clients.values()):
            client.transport.loseConnection()
        try:
            await eventually(lambda: not self.host.clients, timeout=7)
        except TimeoutError:
            for client in list(self.host.clients.values()):
                client.transport.abortConnection()
        self.host.close()
        if self.unix_dir is not None:
            shutil.rmtree(self.unix_dir, ignore_errors=True)


def frame32(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def unframe32(stream: bytes) -> list[bytes]:
    messages, offset = [], 0
    while offset + 4 <= len(stream):
        (size,) = struct.unpack_from(">I", stream, offset)
        if offset + 4 + size > len(stream):
            break
        messages.append(stream[offset + 4 : offset + 4 + size])
        offset += 4 + size
    return messages


class Peer(RawConnection):
    """One raw connection: "ws", or length32 over "length32" (TCP), "ipv6" or "unix"."""

    def __init__(self, host: Host, way: str, protocol: RawWebSocket | RawStream) -> None:
        self.host = host
        self.way = way
        self.protocol = protocol
        self.read_count = 0
        self.client_id = ""
        self._sync_ids = itertools.count(1)

    @property
    def messages(self) -> list[bytes]:
        if isinstance(self.protocol, RawWebSocket):
            for data, binary in self.protocol.frames:
                assert binary, f"the host sent a text frame: {data!r}"
            return [data for data, _ in self.protocol.frames]
        return unframe32(bytes(self.protocol.received))

    @property
    def remote(self) -> SubbleHostProtocol:
        return self.host.host.clients[self.client_id]

    def send(self, data: bytes, *, text: bool = False) -> None:
        if isinstance(self.protocol, RawWebSocket):
            self.protocol.sendMessage(data, isBinary=not text)
        else:
            self.protocol.transport.write(frame32(data))

    def send_message(self, message: Message) -> None:
        self.send(encode(message))

    async def read(self, count: int = 1) -> list[bytes]:
        """The next `count` whole messages, as bytes."""
        await eventually(lambda: len(self.messages) >= self.read_count + count)
        got = self.messages[self.read_count : self.read_count + count]
        self.read_count += count
        return got

    async def next(self) -> Message:
        (data,) = await self.read()
        return decode(data, sender="server")

    async def handshake(
        self,
        client_id: str = "",
        subscribe: tuple[str, ...] = (),
        produce: tuple[str, ...] = (),
        *,
        version: Version = PROTOCOL_VERSION,
        request_data: bytes = b"",
    ) -> HandshakeResponse:
        self.send_message(
            HandshakeRequest(version, client_id, ";", subscribe, produce, request_data)
        )
        response = await self.next()
        assert type(response) is HandshakeResponse
        if response.code == MessageCode.OK:
            self.client_id = client_id
        elif response.code == MessageCode.OK_NEW_CLIENT_ID:
            self.client_id = response.message
        return response

    def produce(
        self,
        event_type: str,
        payload: bytes,
        format: SerializationFormat | int = MSGPACK,
        request_data: bytes = b"",
        *,
        client_id: str | None = None,
    ) -> None:
        self.send_message(ProduceEvent(
            self.client_id if client_id is None else client_id, format, event_type, payload,
            request_data,
        ))

    async def sync(self) -> list[Message]:
        """Every message the host sends this peer before it answers a request sent now. The
        host handles a connection's messages in order and sends through one queue, so this
        proves what did NOT arrive, without sleeping. The request produces a type no one
        declares: its answer is a 51 with the request data echoed."""
        marker = f"sync-{next(self._sync_ids)}".encode()
        self.produce("test.sync (never declared)", b"\xc0", MSGPACK, marker)
        before = []
        while True:
            message = await self.next()
            if type(message) is EventError and message.request_data == marker:
                assert message.code == MessageCode.EVENT_NOT_DECLARED
                return before
            before.append(message)



class Peers:
    """The connections of one test, closed at its end."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.raw_peers: list[Peer] = []
        self.websmq_clients: list[websmq.WebsmqClientProtocol] = []

    async def raw(self, way: str = "length32") -> Peer:
        host = self.host
        if way == "ws":
            factory: Any = WebSocketClientFactory(f"ws://127.0.0.1:{host.port('ws')}/subble")
            factory.protocol = RawWebSocket
        else:
            factory = Factory.forProtocol(RawStream)
        if way in ("ws", "length32"):
            endpoint: Any = TCP4ClientEndpoint(reactor, "127.0.0.1", host.port(way))
        elif way == "ipv6":
            await host.listen("ipv6")
            endpoint = TCP6ClientEndpoint(reactor, "::1", host.port("ipv6"))
        else:
            await host.listen("unix")
            endpoint = UNIXClientEndpoint(reactor, host.ports["unix"].getHost().name)
        protocol = await wait_for(endpoint.connect(factory))
        peer = Peer(host, way, protocol)
        self.raw_peers.append(peer)
        if way == "ws":
            await wait_for(protocol.opened)
        return peer

    async def client(
        self, way: str = "length32", client_id: str = "", **handshake: Any
    ) -> Peer:
        """A raw peer that has completed its handshake."""
        peer = await self.raw(way)
        response = await peer.handshake(client_id, **handshake)
        assert response.code in (MessageCode.OK, MessageCode.OK_NEW_CLIENT_ID), response
        return peer

    async def websmq(self) -> websmq.WebsmqClientProtocol:
        """A WEBSMQ client (length32) of a WEBSMQ server on the same hub."""
        await self.host.listen("websmq")
        address = f"tcp:host=127.0.0.1:port={self.host.port('websmq')}"
        client = await wait_for(websmq.connect(reactor, address))
        self.websmq_clients.append(client)
        return client

    async def close(self) -> None:
        for client in self.websmq_clients:
            await wait_for(client.disconnect())
        for peer in self.raw_peers:
            await peer.close()


Launch = Callable[..., Awaitable[tuple[Host, Peers]]]


@pytest_twisted.async_yield_fixture
async def launch() -> AsyncIterator[Launch]:
    """`await launch(**host_options)`: a host of the test's own and its Peers, both stopped at
    the end of the test (a test may stop a host earlier, to restart it)."""
    started: list[tuple[Host, Peers]] = []

    async def start(*, hub: Hub | None = None, **options: Any) -> tuple[Host, Peers]:
        running = await Host(hub, **options).start()
        started.append((running, Peers(running)))
        return started[-1]

    try:
        yield start
    finally:
        for running, its_peers in reversed(started):
            await its_peers.close()
            await running.stop()


async def subscribed(hub: Hub, topic: str, count: int) -> None:
    """Wait until `topic` has `count` subscribers on the hub (WEBSMQ has no acknowledgement)."""
    await eventually(lambda: len(hub.subscribers(topic)) == count)


async def closed_with_error(peer: Peer, words: str) -> None:
    """The host closed `peer` because of bad input, saying why where the carrier can."""
    info = await peer.closed()
    if peer.way == "ws":
        code, reason = info
        assert code == 1002
        assert words in reason
    else:
        assert peer.messages[peer.read_count:] == []


async def refused(peer: Peer, response: HandshakeResponse, code: MessageCode) -> None:
    """A refusal: the code, then the host closes the connection."""
    assert response.code == code
    await peer.closed()
    assert peer.messages[peer.read_count:] == []


def is_uuid4(text: str) -> bool:
    return uuid.UUID(text).version == 4 and str(uuid.UUID(text)) == text


# -- exact bytes ----------------------------------------------------------------------------------


def test_encoded_messages_match_the_layout_in_the_spec() -> None:
    """The requests the raw peers send are the spec's bytes (NOTES.md: 1-byte versions, a
    "1 + N" separator, little-endian int32 lengths, request data to the end)."""
    request = HandshakeRequest(Version(1, 0, 0), "", ";", ("temp",), ("cmd",), b"\x07")
    assert encode(request) == bytes.fromhex(
        "01 010000"  # code 1, version 1.0.0
        "00000000"  # empty client ID
        "01 3b"  # separator ";"
        "04000000 74656d70"  # subscribe "temp"
        "03000000 636d64"  # produce "cmd"
        "07"  # request data
    )
    produce = ProduceEvent("c-1", JSON, "cmd", b"[1]", b"r1")
    assert encode(produce) == bytes.fromhex(
        "1b 03000000 632d31 01 03000000 636d64 03000000 5b315d 7231"
    )


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_responses_and_events_have_the_spec_layout(launch: Launch, way: str) -> None:
    host, peers = await launch()
    host.host.registry.add("c-1")
    sub = await peers.client(way, "sub", subscribe=("cmd",))
    producer = await peers.raw(way)
    producer.send(encode(HandshakeRequest(client_id="c-1", produce=("cmd",), request_data=b"r1")))
    (response,) = await producer.read()
    assert response == bytes.fromhex("02 00000000 7231")  # OK, no message, "r1" echoed
    producer.client_id = "c-1"

    producer.produce("cmd", b"\x93\x01\x02\x03", MSGPACK, b"\xff\x00")
    (own,) = await producer.read()
    (event,) = await sub.read()
    # u8 code | u8 format | i64 LE ms | 4+N type | 4+N GUID | 4+N source | 4+N payload | data
    assert event[:2] == b"\x1a\x00"  # server event, msgpack
    (datetime_ms,) = struct.unpack_from("<q", event, 2)
    assert abs(datetime_ms - reactor.seconds() * 1000) < 60_000
    fields, at = [], 10
    for _ in range(4):
        (length,) = struct.unpack_from("<i", event, at)
        fields.append(event[at + 4 : at + 4 + length])
        at += 4 + length
    event_type, guid, source, payload = fields
    assert (event_type, source, payload) == (b"cmd", b"c-1", b"\x93\x01\x02\x03")
    assert is_uuid4(guid.decode())
    assert at == len(event)  # no request data for a subscriber
    # The producer's copy: code 27, the same event, and its own request data.
    assert own == b"\x1b" + event[1:] + b"\xff\x00"

    producer.produce("nope", b"\xc0", MSGPACK, b"r2")
    (error,) = await producer.read()
    message = b"event type 'nope' is not in this client's produce list"
    assert error == b"\x33" + struct.pack("<i", len(message)) + message + b"r2"


# -- handshake codes ------------------------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_an_empty_client_id_gets_a_new_one_with_code_3(launch: Launch, way: str) -> None:
    host, peers = await launch()
    calls = []
    host.host.on_handshake = calls.append
    peer = await peers.raw(way)
    response = await peer.handshake("", request_data=b"hello")
    assert response.code == MessageCode.OK_NEW_CLIENT_ID
    assert is_uuid4(response.message)
    assert response.request_data == b"hello"
    assert response.message in host.host.registry
    assert calls == [host.host.clients[response.message]]
    other = await peers.client(way)
    assert other.client_id != peer.client_id


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_a_known_client_id_gets_code_2(launch: Launch, way: str) -> None:
    host, peers = await launch(enforce_registry=True)
    host.host.registry.add("known")
    peer = await peers.raw(way)
    response = await peer.handshake("known", request_data=b"\x00\x01")
    assert response == HandshakeResponse(MessageCode.OK, "", b"\x00\x01")
    assert host.host.clients["known"].client_id == "known"
    assert await peer.sync() == []  # the connection is open and answers


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_without_enforcement_an_unknown_id_is_accepted_and_remembered(
    launch: Launch, way: str
) -> None:
    host, peers = await launch()
    peer = await peers.raw(way)
    response = await peer.handshake("stranger")
    assert response.code == MessageCode.OK
    assert "stranger" in host.host.registry


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_an_empty_id_is_refused_with_11_when_new_clients_are_disabled(
    launch: Launch, way: str
) -> None:
    host, peers = await launch(allow_new_clients=False)
    host.host.registry.add("known")
    peer = await peers.raw(way)
    response = await peer.handshake("", request_data=b"rd")
    assert response.request_data == b"rd"
    assert "does not create client IDs" in response.message
    await refused(peer, response, MessageCode.NEW_CLIENTS_NOT_ALLOWED)
    assert len(host.host.registry) == 1
    await peers.client(way, "known")  # a known ID still gets in


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_an_unknown_id_is_refused_with_12_when_the_registry_is_enforced(
    launch: Launch, way: str
) -> None:
    host, peers = await launch(enforce_registry=True)
    peer = await peers.raw(way)
    response = await peer.handshake("stranger", request_data=b"rd")
    assert response.message == "unknown client ID 'stranger'"
    assert response.request_data == b"rd"
    await refused(peer, response, MessageCode.INVALID_CLIENT_ID)
    assert "stranger" not in host.host.registry
    assert host.host.clients == {}
    await peers.client(way, "")  # new IDs are still given out


@pytest.mark.parametrize(
    ("allow", "deny", "code"),
    [
        pytest.param((), ("127.0.0.0/8",), MessageCode.IP_NOT_ALLOWED, id="denied"),
        pytest.param(("10.0.0.0/8", "::1/128"), (), MessageCode.IP_NOT_ALLOWED, id="not-allowed"),
        pytest.param(("127.0.0.1/32",), (), MessageCode.OK, id="allowed"),
        pytest.param(("127.0.0.0/8",), ("127.0.0.1",), MessageCode.IP_NOT_ALLOWED,
                     id="deny-wins"),
        pytest.param((), ("10.0.0.0/8", "::/0"), MessageCode.OK, id="other-denied"),
    ],
)
@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_allow_and_deny_lists_refuse_with_10(
    launch: Launch, way: str, allow: tuple, deny: tuple, code: MessageCode
) -> None:
    host, peers = await launch(allow=allow, deny=deny)
    peer = await peers.raw(way)
    response = await peer.handshake("c", request_data=b"rd")
    assert response.request_data == b"rd"
    if code == MessageCode.OK:
        assert response.code == code
        assert "c" in host.host.clients
    else:
        assert response.message == "address 127.0.0.1 is not allowed"
        await refused(peer, response, code)
        assert "c" not in host.host.registry  # refused before the ID is looked at


@pytest.mark.parametrize(
    ("allow", "deny", "code"),
    [
        pytest.param(("::1/128",), (), MessageCode.OK, id="allowed"),
        pytest.param(("127.0.0.0/8",), (), MessageCode.IP_NOT_ALLOWED, id="not-allowed"),
        pytest.param((), ("::/0",), MessageCode.IP_NOT_ALLOWED, id="denied"),
        pytest.param((), ("0.0.0.0/0",), MessageCode.OK, id="other-family-denied"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_ipv6_peers_are_checked_too(
    launch: Launch, allow: tuple, deny: tuple, code: MessageCode
) -> None:
    _, peers = await launch(allow=allow, deny=deny)
    peer = await peers.raw("ipv6")
    response = await peer.handshake("c")
    if code == MessageCode.OK:
        assert response.code == code
    else:
        assert response.message == "address ::1 is not allowed"
        await refused(peer, response, code)


@pytest.mark.parametrize(
    ("allow", "deny", "code"),
    [
        pytest.param((), ("0.0.0.0/0", "::/0"), MessageCode.OK, id="deny-list"),
        pytest.param(("0.0.0.0/0",), (), MessageCode.IP_NOT_ALLOWED, id="allow-list"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_unix_socket_peer_has_no_ip_and_gets_in_unless_there_is_an_allow_list(
    launch: Launch, allow: tuple, deny: tuple, code: MessageCode
) -> None:
    _, peers = await launch(allow=allow, deny=deny)
    peer = await peers.raw("unix")
    response = await peer.handshake("c")
    assert response.code == code
    if code != MessageCode.OK:
        assert response.message == "address without an IP is not allowed"
        await refused(peer, response, code)


def test_bad_networks_are_refused_when_the_host_is_made() -> None:
    with pytest.raises(ValueError, match="'10.0.0.300/8' is not an IP network"):
        SubbleHost(Hub(), allow=["10.0.0.300/8"])
    with pytest.raises(ValueError, match="list of CIDR networks"):
        SubbleHost(Hub(), deny="10.0.0.0/8")


@pytest.mark.parametrize(
    ("version", "accepted"),
    [
        pytest.param(Version(1, 0, 0), True, id="1.0.0"),
        pytest.param(Version(1, 0, 5), True, id="newer-patch"),
        pytest.param(Version(1, 3, 0), True, id="newer-minor"),
        pytest.param(Version(0, 9, 0), False, id="too-old"),
        pytest.param(Version(2, 0, 0), False, id="too-new"),
    ],
)
@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_versions_compatible_with_1_0_0_are_accepted_and_others_get_25(
    launch: Launch, way: str, version: Version, accepted: bool
) -> None:
    host, peers = await launch()
    peer = await peers.raw(way)
    response = await peer.handshake("", version=version, request_data=b"rd")
    assert response.request_data == b"rd"
    if accepted:
        assert response.code == MessageCode.OK_NEW_CLIENT_ID
        assert await peer.sync() == []
    else:
        assert response.message == (
            f"unsupported version {version}; this host speaks SubbleSocket 1.x.y from 1.0.0"
        )
        await refused(peer, response, MessageCode.UNKNOWN_HANDSHAKE_ERROR)
        assert len(host.host.registry) == 0  # no ID was made for it


@pytest.mark.parametrize(
    ("handshake", "words"),
    [
        pytest.param({"subscribe": ("a", "b", "c")}, "3 names in the subscribe list: this host "
                     "takes at most 2", id="subscribe-names"),
        pytest.param({"produce": ("a", "b", "c")}, "3 names in the produce list", id="produce"),
        pytest.param({"subscribe": ("x" * 17,)}, "event type of 17 characters in the subscribe "
                     "list: this host takes at most 16", id="type-length"),
        pytest.param({"client_id": "i" * 33}, "client ID of 33 characters: this host takes at "
                     "most 32", id="client-id-length"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_handshakes_past_a_limit_get_25(
    launch: Launch, handshake: dict, words: str
) -> None:
    _, peers = await launch(max_names=2, max_event_type_length=16, max_client_id_length=32)
    peer = await peers.raw()
    client_id = handshake.pop("client_id", "")
    response = await peer.handshake(client_id, **handshake)
    assert words in response.message
    await refused(peer, response, MessageCode.UNKNOWN_HANDSHAKE_ERROR)


@pytest_twisted.ensureDeferred
async def test_the_subscribe_list_is_bounded_by_the_hubs_subscription_limit(
    launch: Launch,
) -> None:
    _, peers = await launch(hub=Hub(max_subscriptions=2))
    peer = await peers.raw()
    response = await peer.handshake("", subscribe=("a", "b", "c"))
    assert "at most 2" in response.message
    await refused(peer, response, MessageCode.UNKNOWN_HANDSHAKE_ERROR)


@pytest.mark.parametrize(("hub", "subscribe", "words"), [
    pytest.param(Hub(max_subscription_bytes=1000), [f"{n}".ljust(100, "t") for n in range(11)],
                 "more than 1000 topic bytes on one connection", id="bytes"),
    pytest.param(Hub(max_topic_length=10), ["t" * 11], "topic of 11 characters", id="length"),
    pytest.param(Hub(max_total_subscription_bytes=400),
                 [f"{n}".ljust(100, "t") for n in range(2)], "no one may hold more than 25%",
                 id="share"),
])
@pytest_twisted.ensureDeferred
async def test_a_subscribe_list_past_a_hub_limit_is_refused_with_25_before_any_answer(
    launch: Launch, hub: Hub, subscribe: list[str], words: str,
) -> None:
    """The handshake is answered before its subscriptions are made (their last values follow
    the answer), so a list the hub would refuse got an OK, then an unhandled error."""
    from tests.test_log_events import logged

    _, peers = await launch(hub=hub)
    peer = await peers.raw()
    with logged() as events:
        response = await peer.handshake("", subscribe=tuple(subscribe))
        assert words in response.message
        await refused(peer, response, MessageCode.UNKNOWN_HANDSHAKE_ERROR)
    assert not [event for event in events if event.get("isError")]
    assert not hub.sessions and hub.subscription_bytes == 0


@pytest_twisted.ensureDeferred
async def test_a_full_registry_that_learns_ids_makes_room_for_a_newcomer(launch: Launch) -> None:
    """Clients that fill the registry with new IDs keep no one out: the unowned ID seen longest
    ago is forgotten (and learned again if it comes back)."""
    host, peers = await launch(max_registry_ids=2)
    await peers.client("length32", "first")
    await peers.client("length32", "second")
    await peers.client("length32", "first")  # seen again: "second" is now the oldest
    newcomer = await peers.raw()
    response = await newcomer.handshake("")
    assert response.code == MessageCode.OK_NEW_CLIENT_ID
    registry = host.host.registry
    assert "first" in registry and response.message in registry
    assert "second" not in registry and registry.forgotten == 1
    await peers.client("length32", "second")  # learned again


@pytest_twisted.ensureDeferred
async def test_a_full_registry_of_ids_that_never_expire_refuses_new_ids_with_25(
        launch: Launch) -> None:
    host, peers = await launch(max_registry_ids=1, registry_ttl=None)
    await peers.client("length32", "first")
    peer = await peers.raw()
    response = await peer.handshake("")
    assert "the client registry is full" in response.message
    await refused(peer, response, MessageCode.UNKNOWN_HANDSHAKE_ERROR)


@pytest_twisted.ensureDeferred
async def test_a_failing_registry_refuses_with_25_and_the_host_carries_on(
    launch: Launch,
) -> None:
    host, peers = await launch()
    registry = host.host.registry

    class Broken(ClientRegistry):
        def __contains__(self, client_id: str) -> bool:
            raise OSError("disk on fire")

    host.host.registry = Broken()
    peer = await peers.raw()
    response = await peer.handshake("someone")
    assert response.message == "the host could not check the client ID"
    await refused(peer, response, MessageCode.UNKNOWN_HANDSHAKE_ERROR)
    host.host.registry = registry
    await peers.client("length32", "someone")


# -- a client comes back after a restart ----------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_a_client_comes_back_with_its_id_after_the_host_restarts(
    launch: Launch, way: str, tmp_path: Any
) -> None:
    path = tmp_path / "clients.sqlite"
    first, peers = await launch(registry_path=path)
    peer = await peers.client(way, "")
    client_id = peer.client_id
    await peers.close()
    await first.stop()

    second, peers = await launch(registry_path=path, enforce_registry=True)
    again = await peers.raw(way)
    response = await again.handshake(client_id, subscribe=("t",))
    assert response == HandshakeResponse(MessageCode.OK)
    stranger = await peers.raw(way)
    await refused(stranger, await stranger.handshake("stranger"), MessageCode.INVALID_CLIENT_ID)


def test_the_registry_keeps_ids_in_sqlite(tmp_path: Any) -> None:
    path = tmp_path / "ids.sqlite"
    registry = ClientRegistry(path)
    new = registry.new_id()
    registry.add("named")
    registry.add("named")
    assert len(registry) == 2
    registry.close()
    reopened = ClientRegistry(str(path))
    assert new in reopened and "named" in reopened and "other" not in reopened
    assert len(reopened) == 2
    reopened.close()
    memory = ClientRegistry()
    memory.add("a")
    assert "a" in memory and "b" not in memory and len(memory) == 1


def test_ids_not_seen_for_the_ttl_are_forgotten_and_the_file_is_the_owners(tmp_path: Any) -> None:
    # One client filled the registry with 10^6 made-up IDs for good; now they expire.
    now = [1_000_000.0]
    path = tmp_path / "ids.sqlite"
    registry = ClientRegistry(path, max_ids=3, ttl=100, clock=lambda: now[0])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for client_id in ("old", "kept", "other"):
        registry.add(client_id)
    now[0] += 60
    registry.seen("kept")
    now[0] += 60
    registry.add("new")  # full: the IDs unseen for 100 s make room
    assert "old" not in registry and "other" not in registry
    assert "kept" in registry and "new" in registry and len(registry) == 2
    registry.close()
    assert {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()} == {0o600}
    memory = ClientRegistry(max_ids=1, ttl=None, clock=lambda: now[0])
    memory.add("a")
    with pytest.raises(LimitExceeded):
        memory.add("b")
    for where in (None, tmp_path / "full.sqlite"):
        # Learned IDs (a ttl): a full registry forgets the one seen longest ago, never an
        # owned one, and refuses only when every ID is owned.
        learned = ClientRegistry(where, max_ids=3, ttl=100, clock=lambda: now[0])
        for client_id in ("a", "b", "c"):
            learned.add(client_id, "alice" if client_id == "b" else None)
            now[0] += 1
        learned.seen("a")
        learned.add("d")
        assert "c" not in learned and {"a", "b", "d"} <= {x for x in "abcd" if x in learned}
        learned.add("e")
        assert "a" not in learned and "b" in learned and learned.forgotten == 2
        learned.add("f", "alice")
        learned.add("g", "alice")
        with pytest.raises(LimitExceeded):
            learned.add("h")
        learned.close()
    forever = ClientRegistry(max_ids=1, ttl=None, clock=lambda: now[0])
    forever.add("a")
    now[0] += 10**9
    assert forever.expire() == 0 and "a" in forever


@pytest.mark.parametrize("where", ["memory", "file"])
def test_an_ids_owner_is_kept_until_the_id_expires(tmp_path: Any, where: str) -> None:
    now = [1_000_000.0]
    path = tmp_path / "ids.sqlite" if where == "file" else None
    registry = ClientRegistry(path, ttl=100, clock=lambda: now[0], max_ids_per_owner=2)
    assert registry.add("a", "alice") == "alice"
    assert registry.add("a", "bob") == "alice" and registry.add("a") == "alice"
    assert registry.add("b") is None and registry.owner("b") is None
    assert registry.add("b", "alice") == "alice" and registry.owned_by("alice") == 2
    with pytest.raises(LimitExceeded, match="alice owns 2 client IDs"):
        registry.add("c", "alice")
    with pytest.raises(LimitExceeded):
        registry.new_id("alice")
    assert "c" not in registry and len(registry) == 2  # nothing kept for a refused owner
    now[0] += 60
    registry.seen("a")
    now[0] += 60
    assert registry.expire() == 1  # "b" went, and alice's room with it
    assert registry.owned_by("alice") == 1 and registry.owner("b") is None
    assert registry.owner(registry.new_id("alice")) == "alice"
    registry.close()


def test_a_registry_file_from_before_owners_gets_them(tmp_path: Any) -> None:
    path = tmp_path / "ids.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE clients (id TEXT PRIMARY KEY, last_seen INTEGER NOT NULL DEFAULT 0)"
               " WITHOUT ROWID")
    db.execute("INSERT INTO clients VALUES ('old', 1)")
    db.commit()
    db.close()
    registry = ClientRegistry(path, ttl=None)
    assert registry.owner("old") is None
    assert registry.add("old", "alice") == "alice"
    registry.close()
    reopened = ClientRegistry(path)
    assert reopened.owner("old") == "alice"
    reopened.close()


@pytest_twisted.ensureDeferred
async def test_an_address_may_register_only_so_many_new_ids_a_minute(launch: Launch) -> None:
    host, peers = await launch(new_ids_per_minute=3)
    for client_id in ("", "made-up-1", ""):
        await peers.client("length32", client_id)
    for client_id in ("", "made-up-2"):
        peer = await peers.raw()
        response = await peer.handshake(client_id)
        assert "more than 3 new client IDs a minute" in response.message
        await refused(peer, response, MessageCode.UNKNOWN_HANDSHAKE_ERROR)
    assert len(host.host.registry) == 3
    await peers.client("length32", "made-up-1")  # a known ID costs nothing


def test_an_enforced_registry_never_expires(tmp_path: Any) -> None:
    host = SubbleHost(Hub(), enforce_registry=True, registry_ttl=1.0)
    assert host.registry.ttl is None
    host.close()


# -- one connection per client ID -----------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_a_newer_connection_with_the_same_id_replaces_the_older(
    launch: Launch, way: str
) -> None:
    host, peers = await launch()
    disconnected = []
    host.host.on_disconnect = lambda client, reason: disconnected.append(client)
    older = await peers.client(way, "same", subscribe=("t",))
    older_remote = older.remote
    producer = await peers.client(way, "producer", produce=("t",))
    newer = await peers.client(way, "same", subscribe=("t",))
    await older.closed()
    assert host.host.clients["same"] is newer.remote is not older_remote
    await eventually(lambda: disconnected == [older_remote])
    producer.produce("t", b"\x01", MSGPACK, b"p")
    assert (await producer.next()).code == MessageCode.CLIENT_EVENT
    event = await newer.next()
    assert event.code == MessageCode.SERVER_EVENT
    assert host.host.clients["same"] is newer.remote


# -- what comes before the handshake, and after it ------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_a_message_before_the_handshake_closes_the_connection(
    launch: Launch, way: str
) -> None:
    _, peers = await launch()
    other = await peers.client(way, "other")
    peer = await peers.raw(way)
    peer.send_message(ProduceEvent("x", MSGPACK, "t", b"\xc0"))
    await closed_with_error(peer, "before the handshake")
    assert peer.messages == []
    assert await other.sync() == []


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_a_second_handshake_closes_the_connection(launch: Launch, way: str) -> None:
    host, peers = await launch()
    peer = await peers.client(way, "twice")
    peer.send_message(HandshakeRequest(client_id="twice"))
    await closed_with_error(peer, "a second SubbleSocket handshake")
    await eventually(lambda: "twice" not in host.host.clients)


@pytest_twisted.ensureDeferred
async def test_no_handshake_in_time_closes_the_connection(launch: Launch) -> None:
    _, peers = await launch(handshake_timeout=0.05)
    peer = await peers.raw("ws")
    await closed_with_error(peer, "no SubbleSocket handshake within 0.05 s")
    quick = await peers.client("length32")  # a handshake in time cancels the timer
    assert await quick.sync() == []


# -- malformed messages ---------------------------------------------------------------------------

GOOD_HANDSHAKE = encode(HandshakeRequest(client_id="m"))
# The client ID's length says 40 but 3 bytes follow.
TRUNCATED = bytes.fromhex("01 010000 28000000 616263")
# A negative length for the subscribe list.
BAD_LENGTH = bytes.fromhex("01 010000 00000000 01 3b ffffffff")
# A subscribe list that is not UTF-8.
BAD_UTF8_NAME = bytes.fromhex("01 010000 00000000 01 3b 02000000 c328 00000000")
MALFORMED = [
    pytest.param(TRUNCATED, "client ID length 40 but only 3 bytes remain", id="truncated"),
    pytest.param(BAD_LENGTH, "subscribe list length -1 is negative", id="bad-length"),
    pytest.param(BAD_UTF8_NAME, "subscribe list is not valid UTF-8", id="bad-utf8-name"),
    pytest.param(b"", "empty SubbleSocket message", id="empty"),
    pytest.param(b"\x1a", "SubbleSocket code 26 from a client", id="server-code"),
    pytest.param(b"\x63", "code 99", id="unknown-code"),
]


@pytest.mark.parametrize(("data", "words"), MALFORMED)
@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_a_malformed_handshake_closes_only_its_connection(
    launch: Launch, way: str, data: bytes, words: str
) -> None:
    host, peers = await launch()
    other = await peers.client(way, "other", subscribe=("t",), produce=("t",))
    peer = await peers.raw(way)
    peer.send(data)
    await closed_with_error(peer, words)
    assert peer.messages == []
    assert await other.sync() == []
    assert list(host.host.clients) == ["other"]


PRODUCE_MALFORMED = [
    # The event type's length says 9 but 1 byte follows.
    pytest.param(bytes.fromhex("1b 01000000 70 00 09000000 74"), "event type name length 9",
                 id="truncated"),
    pytest.param(bytes.fromhex("1b 01000000 70 00 feffffff"), "event type name length -2 is "
                 "negative", id="bad-length"),
    pytest.param(bytes.fromhex("1b 01000000 70 00 01000000 ff 00000000"), "event type name is "
                 "not valid UTF-8", id="bad-utf8-name"),
    pytest.param(bytes.fromhex("1b 01000000 70 07 01000000 74 00000000"), "serialization "
                 "format 7 is reserved", id="reserved-format"),
]


@pytest.mark.parametrize(("data", "words"), PRODUCE_MALFORMED)
@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_a_malformed_produce_request_closes_only_its_connection(
    launch: Launch, way: str, data: bytes, words: str
) -> None:
    host, peers = await launch()
    other = await peers.client(way, "other", subscribe=("t",))
    peer = await peers.client(way, "p", subscribe=("t",), produce=("t",))
    peer.send(data)
    await closed_with_error(peer, words)
    await eventually(lambda: list(host.host.clients) == ["other"])
    assert await other.sync() == []


@pytest_twisted.ensureDeferred
async def test_a_text_frame_closes_only_its_websocket(launch: Launch) -> None:
    _, peers = await launch()
    other = await peers.client("ws", "other")
    peer = await peers.raw("ws")
    peer.send(GOOD_HANDSHAKE, text=False)
    assert (await peer.next()).code == MessageCode.OK
    peer.send(b"hello", text=True)
    await closed_with_error(peer, "a text message is not SubbleSocket")
    assert await other.sync() == []


@pytest_twisted.ensureDeferred
async def test_a_frame_over_the_size_limit_closes_only_its_connection(launch: Launch) -> None:
    _, peers = await launch()
    other = await peers.client("length32", "other")
    peer = await peers.client("length32", "big", produce=("t",))
    peer.protocol.transport.write(struct.pack(">I", MAX_MESSAGE_SIZE + 1) + b"\x1b")
    await peer.closed()
    assert await other.sync() == []


# -- producing: 51 and 52 -------------------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_an_undeclared_type_gets_51_with_the_request_data(launch: Launch, way: str) -> None:
    _, peers = await launch()
    sub = await peers.client(way, "sub", subscribe=("a", "b"))
    peer = await peers.client(way, "p", subscribe=("b",), produce=("a",))
    peer.produce("b", b"\x01", MSGPACK, b"\x00rd\xff")
    assert await peer.next() == EventError(
        MessageCode.EVENT_NOT_DECLARED, "event type 'b' is not in this client's produce list",
        b"\x00rd\xff",
    )
    peer.produce("A", b"\x01", MSGPACK, b"case")  # types are case-sensitive
    assert (await peer.next()).request_data == b"case"
    assert await sub.sync() == []  # no event
    peer.produce("a", b"\x01", MSGPACK, b"ok")  # the connection is still open
    assert (await peer.next()).request_data == b"ok"


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_producing_under_another_clients_id_gets_51(launch: Launch, way: str) -> None:
    _, peers = await launch()
    sub = await peers.client(way, "sub", subscribe=("a",))
    peer = await peers.client(way, "p", produce=("a",))
    peer.produce("a", b"\x01", MSGPACK, b"rd", client_id="sub")
    error = await peer.next()
    assert error.code == MessageCode.EVENT_NOT_DECLARED
    assert error.message.startswith("client ID 'sub' is not this connection's")
    assert error.request_data == b"rd"
    peer.produce("a", b"\x01", MSGPACK, b"rd2", client_id="")
    assert (await peer.next()).code == MessageCode.EVENT_NOT_DECLARED
    assert await sub.sync() == []


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_a_hook_that_raises_gets_52_and_no_event(launch: Launch, way: str) -> None:
    """An unexpected failure while creating the event: the event is not created (52)."""
    host, peers = await launch()
    seen = []

    def on_event(client: Any, event_type: str, payload: bytes, format: Any) -> None:
        seen.append((client.client_id, event_type, payload, format))
        if payload == b"\xc2":
            raise RuntimeError("the plugin broke")

    host.host.on_event = on_event
    sub = await peers.client(way, "sub", subscribe=("a",))
    peer = await peers.client(way, "p", produce=("a",))
    peer.produce("a", b"\xc2", MSGPACK, b"rd-52")
    error = await peer.next()
    assert error == EventError(
        MessageCode.UNKNOWN_SERVER_ERROR,
        "event 'a' was not created: the host failed (RuntimeError)",
        b"rd-52",
    )
    assert await sub.sync() == []
    peer.produce("a", b"\xc3", MSGPACK, b"rd-ok")
    assert (await peer.next()).code == MessageCode.CLIENT_EVENT
    assert (await sub.next()).payload == b"\xc3"
    assert seen == [("p", "a", b"\xc2", MSGPACK), ("p", "a", b"\xc3", MSGPACK)]


@pytest.mark.parametrize(
    ("format", "payload", "words"),
    [
        pytest.param(JSON, b"{nope", "invalid JSON", id="json"),
        pytest.param(JSON, b"\xff", "not valid UTF-8", id="json-not-utf8"),
        pytest.param(MSGPACK, b"\x93\x01", "invalid msgpack", id="msgpack"),
        pytest.param(MSGPACK, b"\x01\x02", "bytes left over", id="msgpack-extra"),
    ],
)
@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_a_payload_invalid_in_its_format_gets_52(
    launch: Launch, way: str, format: SerializationFormat, payload: bytes, words: str
) -> None:
    _, peers = await launch()
    sub = await peers.client(way, "sub", subscribe=("a",))
    peer = await peers.client(way, "p", produce=("a",))
    peer.produce("a", payload, format, b"\x01\x02")
    error = await peer.next()
    assert error.code == MessageCode.UNKNOWN_SERVER_ERROR
    assert error.message.startswith("event 'a' was not created: ")
    assert words in error.message
    assert error.request_data == b"\x01\x02"
    assert await sub.sync() == []


@pytest_twisted.ensureDeferred
async def test_an_event_too_large_to_send_back_gets_52(launch: Launch) -> None:
    _, peers = await launch()
    sub = await peers.client("ws", "sub", subscribe=("a",))
    peer = await peers.client("ws", "p", produce=("a",))
    # Fits as a request, but the event adds a date time, a GUID and a source.
    payload = msgpack.packb(b"x" * (MAX_MESSAGE_SIZE - 40))
    peer.produce("a", payload, MSGPACK, b"big")
    error = await peer.next()
    assert error.code == MessageCode.UNKNOWN_SERVER_ERROR
    assert "over this connection's limit" in error.message
    assert error.request_data == b"big"
    assert await sub.sync() == []


# -- events ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("format", "payload"),
    [
        pytest.param(MSGPACK, msgpack.packb({"c": 21.5, "raw": b"\x00\xff"}), id="msgpack"),
        pytest.param(JSON, b'{ "c": 21.5, "tags": ["a"] }', id="json"),
        pytest.param(77, b"\x00 anything \xff", id="implementor-format"),
    ],
)
@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_an_event_reaches_subscribers_in_its_original_format(
    launch: Launch, way: str, format: int, payload: bytes
) -> None:
    host, peers = await launch()
    other_way = "length32" if way == "ws" else "ws"
    subs = [
        await peers.client(way, "s1", subscribe=("temp",)),
        await peers.client(other_way, "s2", subscribe=("other", "temp")),
    ]
    producer = await peers.client(way, "p", subscribe=("temp",), produce=("temp",))
    before = reactor.seconds() * 1000
    producer.produce("temp", payload, format, b"req-1")
    own = await producer.next()
    events = [await sub.next() for sub in subs]
    first = events[0]
    assert first == events[1]  # encoded once for everyone
    assert first.code == MessageCode.SERVER_EVENT
    assert (first.format, first.event_type, first.source, first.payload) == (
        format, "temp", "p", payload
    )
    assert first.request_data == b""
    assert is_uuid4(first.guid)
    assert before - 1 <= first.datetime_ms <= reactor.seconds() * 1000 + 1
    assert own == Event(
        MessageCode.CLIENT_EVENT, format, first.datetime_ms, "temp", first.guid, "p", payload,
        b"req-1",
    )
    # The producer subscribes to the type too, but gets only its own copy.
    assert await producer.sync() == []
    producer.produce("temp", payload, format, b"req-2")
    again = await producer.next()
    assert again.guid != first.guid and again.request_data == b"req-2"


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_the_producer_gets_its_event_back_without_subscribing(
    launch: Launch, way: str
) -> None:
    _, peers = await launch()
    producer = await peers.client(way, "p", produce=("t",))
    producer.produce("t", b'"x"', JSON, b"")
    own = await producer.next()
    assert (own.code, own.payload, own.request_data) == (MessageCode.CLIENT_EVENT, b'"x"', b"")


@pytest_twisted.ensureDeferred
async def test_three_clients_with_different_lists(launch: Launch) -> None:
    host, peers = await launch()
    alice = await peers.client("ws", "alice", subscribe=("temp", "wind"), produce=("cmd",))
    bob = await peers.client("length32", "bob", subscribe=("cmd",), produce=("temp",))
    carol = await peers.client("ws", "carol", subscribe=("cmd", "temp"), produce=("wind", "temp"))
    assert sorted(host.host.clients) == ["alice", "bob", "carol"]
    assert host.host.clients["carol"].produce == frozenset({"wind", "temp"})

    bob.produce("temp", msgpack.packb(20), MSGPACK, b"b1")
    carol.produce("wind", b"{\"kmh\":3}", JSON, b"c1")
    alice.produce("cmd", msgpack.packb("on"), MSGPACK, b"a1")
    carol.produce("cmd", b"1", JSON, b"c2")  # carol may not produce cmd
    alice.produce("temp", b"1", JSON, b"a2")  # nor alice temp

    def summary(messages: list[Message]) -> list[tuple]:
        # Sorted: events from different connections may come in either order.
        return sorted(
            (m.code, m.event_type, m.source, m.request_data) if type(m) is Event
            else (m.code, m.request_data)
            for m in messages
        )

    # Each sync goes after the others' echoes, so every event has reached every subscriber.
    for peer, request_data in ((alice, b"a2"), (bob, b"b1"), (carol, b"c2")):
        await eventually(lambda p=peer, r=request_data: any(
            m.endswith(r) for m in p.messages[p.read_count:]))
    assert summary(await alice.sync()) == [
        (26, "temp", "bob", b""), (26, "wind", "carol", b""), (27, "cmd", "alice", b"a1"),
        (51, b"a2"),
    ]
    assert summary(await bob.sync()) == [(26, "cmd", "alice", b""), (27, "temp", "bob", b"b1")]
    assert summary(await carol.sync()) == [
        (26, "cmd", "alice", b""), (26, "temp", "bob", b""), (27, "wind", "carol", b"c1"),
        (51, b"c2"),
    ]


# -- across protocols -----------------------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_a_websmq_publish_reaches_subble_subscribers(launch: Launch, way: str) -> None:
    host, peers = await launch()
    subs = [await peers.client(way, f"s{n}", subscribe=("sensors/temp",)) for n in range(2)]
    mq = await peers.websmq()
    await mq.publish("sensors/temp", b'{"c": 21.5}')
    await mq.publish("sensors/temp", b"\xff\x00 not json")
    for sub in subs:
        as_json, as_msgpack = await sub.next(), await sub.next()
        assert (as_json.code, as_json.format, as_json.event_type, as_json.source) == (
            MessageCode.SERVER_EVENT, JSON, "sensors/temp", "websmq"
        )
        assert as_json.payload == b'{"c": 21.5}'
        assert (as_msgpack.format, as_msgpack.source) == (MSGPACK, "websmq")
        assert msgpack.unpackb(as_msgpack.payload) == b"\xff\x00 not json"
        assert is_uuid4(as_json.guid) and as_json.guid != as_msgpack.guid
    # One GUID per hub message, the same for every subscriber.
    assert subs[0].messages == subs[1].messages


@pytest.mark.parametrize(
    ("format", "payload", "hub_payload"),
    [
        pytest.param(MSGPACK, msgpack.packb({"c": 21.5}), b'{"c":21.5}', id="msgpack-map"),
        pytest.param(MSGPACK, msgpack.packb("hi"), b'"hi"', id="msgpack-str"),
        pytest.param(MSGPACK, msgpack.packb(b"\x00\xff"), b"\x00\xff", id="msgpack-bin"),
        pytest.param(MSGPACK, msgpack.packb([b"\x00"]), msgpack.packb([b"\x00"]),
                     id="msgpack-not-json"),
        pytest.param(JSON, b'{ "c" : [1, 2] }', b'{"c":[1,2]}', id="json"),
        pytest.param(99, b"\x01\x02", b"\x01\x02", id="implementor-format"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_subble_event_reaches_a_websmq_subscriber(
    launch: Launch, format: int, payload: bytes, hub_payload: bytes
) -> None:
    host, peers = await launch()
    mq = await peers.websmq()
    inbox = Inbox()
    await mq.subscribe("sensors/temp", inbox)
    await subscribed(host.hub, "sensors/temp", 1)
    producer = await peers.client("ws", "p", produce=("sensors/temp",))
    producer.produce("sensors/temp", payload, format, b"rd")
    assert (await producer.next()).request_data == b"rd"
    (message,) = await inbox.wait()
    assert (message.topic, message.payload) == ("sensors/temp", hub_payload)


# -- host code publishes --------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_host_code_publishes_server_events(launch: Launch) -> None:
    host, peers = await launch()
    sub = await peers.client("ws", "sub", subscribe=("alerts",))
    mq = await peers.websmq()
    inbox = Inbox()
    await mq.subscribe("alerts", inbox)
    await subscribed(host.hub, "alerts", 2)

    assert host.host.publish("alerts", {"level": 3}, source="watchdog") == 2
    assert host.host.publish("alerts", [1], source="watchdog", format=JSON) == 2
    assert host.host.publish("alerts", b'"raw"', format=JSON) == 2
    assert host.host.publish("nobody", 1) == 0
    events = [await sub.next() for _ in range(3)]
    assert [(e.code, e.format, e.source, e.payload, e.request_data) for e in events] == [
        (26, MSGPACK, "watchdog", msgpack.packb({"level": 3}), b""),
        (26, JSON, "watchdog", b"[1]", b""),
        (26, JSON, "host", b'"raw"', b""),
    ]
    assert len({e.guid for e in events}) == 3
    await inbox.wait(3)
    assert [m.payload for m in inbox.messages] == [b'{"level":3}', b"[1]", b'"raw"']


def test_publish_refuses_what_it_cannot_send() -> None:
    host = SubbleHost(Hub())
    with pytest.raises(ValueError, match="not allowed"):
        host.publish("t", b"x", format=7)
    with pytest.raises(ValueError, match="invalid JSON"):
        host.publish("t", b"{", format=JSON)
    with pytest.raises(ValueError, match="at most 1024"):
        host.publish("t" * 1025, 1)
    host.close()


# -- hooks ----------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_hooks_see_handshakes_and_disconnects(launch: Launch) -> None:
    host, peers = await launch()
    calls = []
    host.host.on_handshake = lambda client: calls.append(("hello", client.client_id,
                                                          client.subscribe))
    host.host.on_disconnect = lambda client, reason: calls.append(("bye", client.client_id))
    refused_peer = await peers.raw()
    await refused_peer.handshake("", version=Version(3, 0, 0))
    peer = await peers.client("ws", "hooked", subscribe=("a", "b", "a"))
    await peer.close()
    await eventually(lambda: len(calls) == 2)
    assert calls == [("hello", "hooked", ("a", "b")), ("bye", "hooked")]
    assert host.hub.topics() == []
    await refused_peer.closed()
