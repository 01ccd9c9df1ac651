"""The SubbleSocket client role, on real sockets: against wireproto's own SubbleHost over TCP with
the length32 framing and over WebSocket binary frames, and against a raw peer built from the
codec for what the host never does (answer garbage, answer late, or never answer).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ServerEndpoint

from tests.support import Inbox, eventually, failure_of, wait_for
from wireproto.codecs import subble
from wireproto.codecs.subble import (
    Event,
    EventError,
    HandshakeRequest,
    HandshakeResponse,
    MessageCode,
    ProduceEvent,
    SerializationFormat,
    Version,
)
from wireproto.errors import (
    BadEncoding,
    FrameTooLarge,
    InvalidField,
    TruncatedFrame,
    UnexpectedMessage,
    UnknownType,
)
from wireproto.hub import Hub
from wireproto.protocols.rpc import ConnectionClosed, RequestTimeout
from wireproto.protocols.subble.client import (
    EventFailed,
    EventForbidden,
    EventRefused,
    HandshakeRefused,
    SubbleClient,
    SubbleEvent,
)
from wireproto.protocols.subble.server import SubbleHost
from wireproto.transports.base import MessageProtocol
from wireproto.transports.stream import StreamOptions, stream_server_factory
from wireproto.transports.websocket_http import websocket_resource, websocket_site

# Retry quickly, so a test waits for a reconnection a few hundredths of a second.
FAST_RETRY: Callable[[int], float] = lambda attempt: 0.05  # noqa: E731

KINDS = ("length32", "ws")


def listener_factory(kind: str, protocol_factory: Callable[[], Any]) -> Any:
    if kind == "ws":
        return websocket_site({"/subble": websocket_resource(protocol_factory)})
    return stream_server_factory(protocol_factory, StreamOptions(framing="length32"))


def address(kind: str, port: int) -> str:
    if kind == "ws":
        return f"ws://127.0.0.1:{port}/subble"
    return f"tcp:host=127.0.0.1:port={port}"


async def listen(kind: str, protocol_factory: Callable[[], Any], port: int = 0) -> Any:
    endpoint = TCP4ServerEndpoint(reactor, port, interface="127.0.0.1")
    return await wait_for(endpoint.listen(listener_factory(kind, protocol_factory)))


# -- a raw peer, for what the host never does --------------------------------------------------


class RawPeer(MessageProtocol):
    """One connection to `RawHost`: keeps what the client sends, decoded, and sends only what
    the test tells it to."""

    def __init__(self, host: RawHost) -> None:
        self.host = host
        self.received: list[Any] = []
        self.lost = False

    def connectionMade(self) -> None:
        self.host.peers.append(self)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        self.received.append(subble.decode(data, sender="client"))

    def send(self, message: Any, binary: bool = True) -> None:
        data = message if isinstance(message, bytes) else subble.encode(message)
        self.transport.sendMessage(data, binary)

    def accept(self, client_id: str = "raw-1") -> None:
        self.send(HandshakeResponse(MessageCode.OK_NEW_CLIENT_ID, client_id))

    def echo(self, produce: ProduceEvent, request_data: bytes | None = None) -> None:
        """Send back `produce` as an echo, with its own request data unless told otherwise."""
        self.send(Event(
            MessageCode.CLIENT_EVENT, produce.format, 1_700_000_000_000, produce.event_type,
            "guid-" + str(len(self.received)), produce.client_id, produce.payload,
            produce.request_data if request_data is None else request_data,
        ))

    def connectionLost(self, reason: Any) -> None:
        self.lost = True


class RawHost:
    def __init__(self) -> None:
        self.peers: list[RawPeer] = []
        self.port: Any = None
        self.kind = "length32"

    def __call__(self) -> RawPeer:
        return RawPeer(self)

    @property
    def address(self) -> str:
        return address(self.kind, self.port.getHost().port)

    async def peer(self, received: int = 1) -> RawPeer:
        """The first connection, once it has sent `received` messages."""
        await eventually(lambda: self.peers and len(self.peers[0].received) >= received)
        return self.peers[0]

    async def stop(self) -> None:
        for peer in self.peers:
            if not peer.lost:
                peer.transport.abortConnection()
        await eventually(lambda: all(peer.lost for peer in self.peers))
        await wait_for(defer.maybeDeferred(self.port.stopListening))


@pytest_twisted.async_yield_fixture(params=KINDS)
async def raw_host(request):
    host = RawHost()
    host.kind = request.param
    host.port = await listen(request.param, host)
    try:
        yield host
    finally:
        await host.stop()


@pytest_twisted.async_yield_fixture
async def clients():
    """Clients made by the test, closed at its end."""
    made: list[SubbleClient] = []

    def make(address: str, **options: Any) -> SubbleClient:
        client = SubbleClient(reactor, address, **options)
        made.append(client)
        return client

    try:
        yield make
    finally:
        for client in made:
            await wait_for(client.close())


async def raw_connected(raw_host: RawHost, clients: Any, **options: Any) -> tuple[Any, RawPeer]:
    client = clients(raw_host.address, **options)
    connecting = client.connect()
    peer = await raw_host.peer()
    peer.accept()
    await wait_for(connecting)
    return client, peer


# -- against a raw peer ---------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_the_handshake_request_carries_every_setting(raw_host, clients):
    client = clients(raw_host.address, client_id="known", subscribe=["a", "b"], produce=["c"],
                     separator="||", request_data=b"\x00hi", version=Version(1, 0, 3))
    connecting = client.connect()
    peer = await raw_host.peer()
    assert peer.received == [
        HandshakeRequest(Version(1, 0, 3), "known", "||", ("a", "b"), ("c",), b"\x00hi")
    ]
    peer.send(HandshakeResponse(MessageCode.OK, "", b"\x00hi"))
    assert await wait_for(connecting) is client
    assert client.client_id == "known"
    assert client.response_code == MessageCode.OK
    assert client.response == HandshakeResponse(MessageCode.OK, "", b"\x00hi")


@pytest_twisted.ensureDeferred
async def test_no_handshake_response_times_out(raw_host, clients):
    client = clients(raw_host.address, handshake_timeout=0.2)
    error = await failure_of(client.connect())
    assert isinstance(error, RequestTimeout)
    assert "no SubbleSocket handshake response within 0.2 s" in str(error)
    await eventually(lambda: raw_host.peers[0].lost)
    assert not client.connected


GARBAGE = {
    "unknown-code": (b"\x63", UnknownType, "SubbleSocket code 99 from a server"),
    "truncated": (b"\x03\x05\x00\x00\x00ab", TruncatedFrame, "response message length 5"),
    "bad-utf8": (b"\x03\x02\x00\x00\x00\xc3\x28", BadEncoding, "not valid UTF-8"),
    "event-first": (
        subble.encode(Event(MessageCode.SERVER_EVENT, 0, 0, "t", "g", "s", b"\xc0")),
        UnexpectedMessage, "code 26 before the handshake response",
    ),
    "no-client-id": (
        subble.encode(HandshakeResponse(MessageCode.OK_NEW_CLIENT_ID, "")),
        InvalidField, "handshake response 3 gives no client ID",
    ),
}


@pytest_twisted.ensureDeferred
async def test_close_while_the_handshake_waits(raw_host, clients):
    client = clients(raw_host.address)
    connecting = client.connect()
    peer = await raw_host.peer()
    await wait_for(client.close())
    error = await failure_of(connecting)
    assert isinstance(error, ConnectionClosed)
    await eventually(lambda: peer.lost)


@pytest.mark.parametrize("garbage", GARBAGE)
@pytest_twisted.ensureDeferred
async def test_a_bad_first_answer_fails_the_connect_and_closes(raw_host, clients, garbage):
    answer, error_type, words = GARBAGE[garbage]
    client = clients(raw_host.address)
    connecting = client.connect()
    peer = await raw_host.peer()
    peer.send(answer)
    error = await failure_of(connecting)
    assert isinstance(error, error_type)
    assert words in str(error)
    await eventually(lambda: peer.lost)
    assert not client.connected


@pytest.mark.parametrize("raw_host", ["ws"], indirect=True)  # only WebSocket marks text
@pytest_twisted.ensureDeferred
async def test_a_text_message_closes_the_connection(raw_host, clients):
    client = clients(raw_host.address)
    connecting = client.connect()
    peer = await raw_host.peer()
    peer.send(subble.encode(HandshakeResponse(MessageCode.OK_NEW_CLIENT_ID, "x")), binary=False)
    error = await failure_of(connecting)
    assert isinstance(error, BadEncoding)
    assert "SubbleSocket is binary" in str(error)
    await eventually(lambda: peer.lost)


@pytest_twisted.ensureDeferred
async def test_garbage_after_the_handshake_closes_and_fails_what_waits(raw_host, clients):
    disconnected = Inbox()
    client, peer = await raw_connected(raw_host, clients)
    client.on_disconnect = disconnected
    waiting = client.produce("t", 1)
    await raw_host.peer(2)
    peer.send(subble.encode(HandshakeResponse(MessageCode.OK, "again")))
    error = await failure_of(waiting)
    assert isinstance(error, ConnectionClosed)
    await eventually(lambda: peer.lost)
    await disconnected.wait()
    assert not client.connected
    later = await failure_of(client.produce("t", 2))
    assert isinstance(later, ConnectionClosed)
    assert "not connected" in str(later)


@pytest_twisted.ensureDeferred
async def test_a_produce_with_no_answer_times_out(raw_host, clients):
    client, peer = await raw_connected(raw_host, clients)
    error = await failure_of(client.produce("t", {"n": 1}, timeout=0.2))
    assert isinstance(error, RequestTimeout)
    assert "request 'produce t' got no reply within 0.2 s" in str(error)
    assert client.connected  # a timeout does not close the connection
    # A generated token is forgotten with its produce: nothing is left waiting for an answer.
    assert not client.protocol._order


@pytest_twisted.ensureDeferred
async def test_pending_produces_fail_when_the_host_drops_the_connection(raw_host, clients):
    client, peer = await raw_connected(raw_host, clients)
    first = client.produce("t", 1)
    second = client.produce("t", 2, request_data=b"mine")
    await raw_host.peer(3)
    peer.transport.abortConnection()
    for waiting in (first, second):
        error = await failure_of(waiting)
        assert isinstance(error, ConnectionClosed)
        assert "the SubbleSocket connection closed" in str(error)


@pytest_twisted.ensureDeferred
async def test_a_late_answer_keeps_its_place_among_equal_request_data(raw_host, clients):
    client, peer = await raw_connected(raw_host, clients)
    late = client.produce("t", "late", request_data=b"same", timeout=0.2)
    assert isinstance(await failure_of(late), RequestTimeout)
    waiting = client.produce("t", "waiting", request_data=b"same")
    await raw_host.peer(3)
    first, second = peer.received[1:]
    # The answer to the produce that timed out is dropped; it does not answer the next one.
    peer.echo(first)
    peer.echo(second)
    event = await wait_for(waiting)
    assert event.payload == "waiting"
    assert event.request_data == b"same"


@pytest_twisted.ensureDeferred
async def test_generated_request_data_matches_answers_out_of_order(raw_host, clients):
    client, peer = await raw_connected(raw_host, clients)
    first = client.produce("t", 1)
    second = client.produce("t", 2, format="json")
    await raw_host.peer(3)
    produce_1, produce_2 = peer.received[1:]
    assert produce_1.request_data != produce_2.request_data
    assert len(produce_1.request_data) == 12 and produce_1.request_data.isascii()
    peer.send(EventError(MessageCode.UNKNOWN_SERVER_ERROR, "no", produce_2.request_data))
    peer.echo(produce_1)
    assert (await wait_for(first)).payload == 1
    error = await failure_of(second)
    assert isinstance(error, EventFailed)
    assert (error.code, error.message, error.request_data) == (52, "no", produce_2.request_data)
    # An answer nothing waits for (here, a second one) is dropped; the connection stays.
    peer.echo(produce_1)
    third = client.produce("t", 3)
    await raw_host.peer(4)
    peer.echo(peer.received[3])
    assert (await wait_for(third)).payload == 3


@pytest_twisted.ensureDeferred
async def test_an_event_with_a_bad_payload_is_dropped(raw_host, clients):
    inbox = Inbox()
    client, peer = await raw_connected(raw_host, clients, subscribe=["t"], on_event=inbox)
    peer.send(Event(MessageCode.SERVER_EVENT, 1, 0, "t", "g1", "s", b"{nope"))
    peer.send(Event(MessageCode.SERVER_EVENT, 0, 0, "t", "g2", "s", b"\x01"))
    events = await inbox.wait(1)
    assert [event.guid for event in events] == ["g2"]
    assert client.connected


@pytest_twisted.ensureDeferred
async def test_an_implementor_format_is_carried_as_bytes(raw_host, clients):
    inbox = Inbox()
    client, peer = await raw_connected(raw_host, clients, subscribe=["t"], on_event=inbox)
    peer.send(Event(MessageCode.SERVER_EVENT, 200, 0, "t", "g", "s", b"\xde\xad"))
    (event,) = await inbox.wait(1)
    assert (event.format, event.payload, event.raw_payload) == (200, b"\xde\xad", b"\xde\xad")
    echo = client.produce("t", b"\xbe\xef", format=200)
    await raw_host.peer(2)
    assert peer.received[1].payload == b"\xbe\xef"
    peer.echo(peer.received[1])
    assert (await wait_for(echo)).payload == b"\xbe\xef"
    with pytest.raises(TypeError, match="payload must be bytes"):
        client.produce("t", {"a": 1}, format=200)


@pytest.mark.parametrize("raw_host", ["length32"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_produce_over_the_message_limit_fails(raw_host, clients):
    client, peer = await raw_connected(
        raw_host, clients, stream=StreamOptions(framing="length32", max_message_size=100)
    )
    error = await failure_of(client.produce("t", b"x" * 200))
    assert isinstance(error, FrameTooLarge)
    assert client.connected


@pytest_twisted.ensureDeferred
async def test_a_refused_reconnection_stops_the_client(raw_host, clients):
    refused = Inbox()
    client = clients(raw_host.address, reconnect=True, retry_policy=FAST_RETRY)
    client.on_refused = refused
    connecting = client.connect()
    peer = await raw_host.peer()
    peer.send(HandshakeResponse(MessageCode.INVALID_CLIENT_ID, "who?"))
    error = await failure_of(connecting)
    assert isinstance(error, HandshakeRefused)
    (told,) = await refused.wait()
    assert told is error
    assert client.closing
    assert not client._reconnector.running


# -- against wireproto's SubbleHost ------------------------------------------------------------


class Host:
    """A hub and its SubbleHost, listening on length32 (TCP) and WebSocket on 127.0.0.1."""

    def __init__(self, **options: Any) -> None:
        self.hub = Hub()
        self.subble = SubbleHost(self.hub, **options)
        self.ports: dict[str, Any] = {}

    async def listen(self, kind: str, port: int = 0) -> Host:
        self.ports[kind] = await listen(kind, self.subble, port)
        return self

    def port(self, kind: str) -> int:
        return self.ports[kind].getHost().port

    def address(self, kind: str) -> str:
        return address(kind, self.port(kind))

    async def stop(self) -> None:
        """Stop listening and abort every connection, as a host that goes down."""
        for listening in self.ports.values():
            await wait_for(defer.maybeDeferred(listening.stopListening))
        self.ports.clear()
        for client in tuple(self.subble.clients.values()):
            client.transport.abortConnection()
        await eventually(lambda: not self.subble.clients)
        self.subble.close()


@pytest_twisted.async_yield_fixture
async def hosts():
    """start(**SubbleHost options) -> a Host listening on both kinds; stopped at the end."""
    started: list[Host] = []

    async def start(**options: Any) -> Host:
        host = Host(**options)
        started.append(host)
        for kind in KINDS:
            await host.listen(kind)
        return host

    try:
        yield start
    finally:
        for host in started:
            await host.stop()


@pytest.mark.parametrize("kind", KINDS)
@pytest_twisted.ensureDeferred
async def test_no_client_id_gets_a_new_one(hosts, clients, kind):
    host = await hosts()
    client = clients(host.address(kind), request_data=b"hello")
    assert await wait_for(client.connect()) is client
    assert client.response_code == MessageCode.OK_NEW_CLIENT_ID == 3
    assert client.client_id and client.client_id == client.response.message
    assert client.response.request_data == b"hello"
    assert client.client_id in host.subble.registry
    assert host.subble.clients[client.client_id].transport.kind == ("ws" if kind == "ws" else "tcp")


@pytest.mark.parametrize("kind", KINDS)
@pytest_twisted.ensureDeferred
async def test_a_known_client_id_is_confirmed(hosts, clients, kind):
    host = await hosts(enforce_registry=True, allow_new_clients=False)
    host.subble.registry.add("sensor-7")
    client = clients(host.address(kind), client_id="sensor-7")
    await wait_for(client.connect())
    assert client.response_code == MessageCode.OK == 2
    assert client.client_id == "sensor-7"
    assert "sensor-7" in host.subble.clients


REFUSALS = {
    "ip-not-allowed": (
        {"deny": ["127.0.0.0/8"]}, {}, 10, "address 127.0.0.1 is not allowed",
    ),
    "new-clients-not-allowed": (
        {"allow_new_clients": False}, {}, 11,
        "this host does not create client IDs: send one it knows",
    ),
    "invalid-client-id": (
        {"enforce_registry": True}, {"client_id": "stranger"}, 12,
        "unknown client ID 'stranger'",
    ),
    "unsupported-version": (
        {}, {"version": Version(2, 0, 0)}, 25,
        "unsupported version 2.0.0; this host speaks SubbleSocket 1.x.y from 1.0.0",
    ),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("refusal", REFUSALS)
@pytest_twisted.ensureDeferred
async def test_a_refused_handshake_fails_with_its_code_and_message(hosts, clients, kind, refusal):
    host_options, client_options, code, message = REFUSALS[refusal]
    host = await hosts(**host_options)
    client = clients(host.address(kind), request_data=b"r", **client_options)
    error = await failure_of(client.connect())
    assert isinstance(error, HandshakeRefused)
    assert (error.code, error.message, error.request_data) == (code, message, b"r")
    assert str(error).startswith(f"SubbleSocket handshake refused with {code} (")
    assert not client.connected
    assert client.client_id == client_options.get("client_id")
    assert not host.subble.clients


@pytest.mark.parametrize("kind", KINDS)
@pytest_twisted.ensureDeferred
async def test_events_come_with_msgpack_and_json_payloads_decoded(hosts, clients, kind):
    host = await hosts()
    every, temperatures = Inbox(), Inbox()
    client = clients(host.address(kind), subscribe=["temperature", "wind"], on_event=every)
    client.listen("temperature", temperatures)
    await wait_for(client.connect())
    assert host.subble.publish("temperature", {"celsius": 21.5, "raw": b"\x01"}) == 1
    assert host.subble.publish("wind", [1, "nw"], source="anemometer",
                               format=SerializationFormat.JSON) == 1
    assert host.subble.publish("rain", 3) == 0  # no one subscribes
    first, second = await every.wait(2)
    assert isinstance(first, SubbleEvent)
    assert (first.type, first.source, first.format, first.payload) == (
        "temperature", "host", SerializationFormat.MSGPACK, {"celsius": 21.5, "raw": b"\x01"}
    )
    assert first.raw_payload == subble.pack_payload(first.payload, SerializationFormat.MSGPACK)
    assert (second.type, second.source, second.format, second.payload, second.raw_payload) == (
        "wind", "anemometer", SerializationFormat.JSON, [1, "nw"], b'[1,"nw"]'
    )
    for event in (first, second):
        assert event.code == MessageCode.SERVER_EVENT
        assert event.request_data == b""
        assert event.datetime.utcoffset() == timedelta(0)
        assert abs(event.datetime - datetime.now(UTC)) < timedelta(minutes=5)
    assert first.guid and first.guid != second.guid
    assert temperatures.messages == [first]
    with pytest.raises(ValueError, match="not in the subscribe list"):
        client.listen("rain", temperatures)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("format", ["msgpack", "json", SerializationFormat.JSON])
@pytest_twisted.ensureDeferred
async def test_a_produce_fires_with_the_echo_matched_by_generated_request_data(
    hosts, clients, kind, format
):
    host = await hosts()
    events = Inbox()
    client = clients(host.address(kind), subscribe=["cmd"], produce=["cmd"], on_event=events)
    await wait_for(client.connect())
    echo = await wait_for(client.produce("cmd", {"heat": True}, format=format))
    expected_format = SerializationFormat.MSGPACK if format == "msgpack" else 1
    assert isinstance(echo, SubbleEvent)
    assert (echo.code, echo.type, echo.source, echo.format, echo.payload) == (
        MessageCode.CLIENT_EVENT, "cmd", client.client_id, expected_format, {"heat": True}
    )
    assert len(echo.request_data) == 12
    assert echo.guid
    # The producer gets its own event once, as the echo: on_event does not see it.
    assert not events.messages


@pytest.mark.parametrize("kind", KINDS)
@pytest_twisted.ensureDeferred
async def test_the_callers_request_data_is_echoed_and_matched_in_order(hosts, clients, kind):
    host = await hosts()
    client = clients(host.address(kind), produce=["cmd"])
    await wait_for(client.connect())
    produced = [
        client.produce("cmd", n, request_data=b"same" if n < 3 else b"other") for n in range(4)
    ]
    echoes = [await wait_for(d) for d in produced]
    assert [echo.payload for echo in echoes] == [0, 1, 2, 3]
    assert [echo.request_data for echo in echoes] == [b"same"] * 3 + [b"other"]
    empty = await wait_for(client.produce("cmd", None, request_data=b""))
    assert (empty.payload, empty.request_data) == (None, b"")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("request_data", [None, b"\x00mine"])
@pytest_twisted.ensureDeferred
async def test_a_type_not_in_the_produce_list_fails_with_51(hosts, clients, kind, request_data):
    host = await hosts()
    client = clients(host.address(kind), produce=["cmd"])
    await wait_for(client.connect())
    error = await failure_of(client.produce("other", 1, request_data=request_data))
    assert isinstance(error, EventForbidden) and isinstance(error, EventRefused)
    assert error.code == MessageCode.EVENT_NOT_DECLARED == 51
    assert error.message == "event type 'other' is not in this client's produce list"
    assert error.event_type == "other"
    if request_data is None:
        assert len(error.request_data) == 12
    else:
        assert error.request_data == request_data
    # The connection stays up.
    assert (await wait_for(client.produce("cmd", 2))).payload == 2


@pytest.mark.parametrize("kind", KINDS)
@pytest_twisted.ensureDeferred
async def test_an_event_the_host_fails_to_create_fails_with_52(hosts, clients, kind):
    host = await hosts()
    seen = []

    def on_event(client: Any, event_type: str, payload: bytes, format: Any) -> None:
        seen.append((event_type, payload, format))
        raise RuntimeError("the plugin is down")

    host.subble.on_event = on_event
    client = clients(host.address(kind), produce=["cmd"])
    await wait_for(client.connect())
    error = await failure_of(client.produce("cmd", "go", format="json", request_data=b"q"))
    assert isinstance(error, EventFailed) and isinstance(error, EventRefused)
    assert (error.code, error.request_data) == (52, b"q")
    assert error.message == "event 'cmd' was not created: the host failed (RuntimeError)"
    assert seen == [("cmd", b'"go"', SerializationFormat.JSON)]
    assert client.connected


@pytest_twisted.ensureDeferred
async def test_three_clients_with_different_lists(hosts, clients):
    host = await hosts()
    inboxes = {name: Inbox() for name in "abc"}
    a = clients(host.address("length32"), subscribe=["b"], produce=["a"], on_event=inboxes["a"])
    b = clients(host.address("ws"), subscribe=["a"], produce=["b"], on_event=inboxes["b"])
    c = clients(host.address("length32"), subscribe=["a", "b"], on_event=inboxes["c"])
    for client in (a, b, c):
        await wait_for(client.connect())
    await wait_for(a.produce("a", {"from": "a"}, format="json"))
    await wait_for(b.produce("b", b"\xff"))
    assert isinstance(await failure_of(c.produce("a", 1)), EventForbidden)
    await inboxes["c"].wait(2)
    await inboxes["b"].wait(1)
    await inboxes["a"].wait(1)
    seen = {
        name: [(e.type, e.source, e.payload) for e in inbox.messages]
        for name, inbox in inboxes.items()
    }
    assert seen == {
        "a": [("b", b.client_id, b"\xff")],
        "b": [("a", a.client_id, {"from": "a"})],
        "c": [("a", a.client_id, {"from": "a"}), ("b", b.client_id, b"\xff")],
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest_twisted.ensureDeferred
async def test_a_produce_waiting_when_the_host_drops_the_connection_fails(hosts, clients, kind):
    host = await hosts()
    # Host code that drops the producer before the event is answered.
    host.subble.on_event = lambda peer, *_: peer.transport.abortConnection()
    disconnected = Inbox()
    client = clients(host.address(kind), produce=["cmd"])
    client.on_disconnect = disconnected
    await wait_for(client.connect())
    error = await failure_of(client.produce("cmd", 1))
    assert isinstance(error, ConnectionClosed)
    await disconnected.wait()
    assert not client.connected


@pytest.mark.parametrize("kind", KINDS)
@pytest_twisted.ensureDeferred
async def test_close_ends_the_connection(hosts, clients, kind):
    host = await hosts()
    client = clients(host.address(kind))
    await wait_for(client.connect())
    await eventually(lambda: host.subble.clients)
    await wait_for(client.close())
    assert not client.connected
    await eventually(lambda: not host.subble.clients)
    error = await failure_of(client.produce("cmd", 1))
    assert isinstance(error, ConnectionClosed)


@pytest.mark.parametrize("kind", KINDS)
@pytest_twisted.ensureDeferred
async def test_reconnect_handshakes_again_with_the_assigned_id_after_a_restart(
    clients, kind, tmp_path
):
    registry = tmp_path / "clients.sqlite"
    first = Host(registry_path=registry)
    second: Host | None = None
    try:
        await first.listen(kind)
        port = first.port(kind)
        connected, events = Inbox(), Inbox()
        client = clients(first.address(kind), subscribe=["news"], reconnect=True,
                         retry_policy=FAST_RETRY, on_event=events)
        client.on_connect = lambda: connected(client.response_code)
        await wait_for(client.connect())
        assigned = client.client_id
        assert client.response_code == MessageCode.OK_NEW_CLIENT_ID
        await first.stop()
        # The same port and registry file; only IDs it knows get in now.
        second = Host(registry_path=registry, enforce_registry=True, allow_new_clients=False)
        await second.listen(kind, port)
        await connected.wait(2)
        assert connected.messages == [MessageCode.OK_NEW_CLIENT_ID, MessageCode.OK]
        assert client.client_id == assigned
        assert assigned in second.subble.clients
        # Its subscriptions came back with it.
        assert second.subble.publish("news", "again") == 1
        (event,) = await events.wait(1)
        assert event.payload == "again"
    finally:
        for host in (first, second):
            if host is not None and host.ports:
                await host.stop()
