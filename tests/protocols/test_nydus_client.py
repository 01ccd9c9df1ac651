"""The nydus client role against wireproto's nydus server, on real sockets, over raw WebSocket
(``engineio=False``) and TCP with the lines framing; and against scripted servers (plain Twisted
line protocols) for what the real server never does: another protocol version, no WELCOME, a
RESULT of null, garbage. Engine.IO addresses are covered by the interop tests.

The hub tests put a WEBSMQ client and a UBRE client on the nydus server's hub, to show nydus
paths and hub topics meet both ways.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.protocol import Factory
from twisted.protocols.basic import LineOnlyReceiver
from twisted.python.failure import Failure

from tests.protocols.test_nydus_server import NydusHost
from tests.support import Inbox, eventually, failure_of, free_port, sleep, wait_for
from wireproto.codecs.ubre import Publish as UbrePublish
from wireproto.codecs.websmq import Publish as WebsmqPublish
from wireproto.errors import FrameTooLarge, InvalidField, InvalidTopic
from wireproto.protocols import websmq
from wireproto.protocols.nydus.client import (
    IncompatibleVersion,
    NydusClient,
    _websocket_url,
    connect,
)
from wireproto.protocols.nydus.routes import Match
from wireproto.protocols.nydus.server import Invocation, InvokeError
from wireproto.protocols.rpc import ConnectionClosed, RequestFailed, RequestTimeout
from wireproto.protocols.ubre.client import UbreClient
from wireproto.protocols.ubre.server import UbreServer
from wireproto.transports.stream import StreamOptions, stream_server_factory
from wireproto.transports.websocket_http import websocket_resource, websocket_site

FAST_RETRY: Callable[[int], float] = lambda attempt: 0.05  # noqa: E731
WAYS = ("ws", "lines")


def client_options(way: str) -> dict[str, Any]:
    return {"engineio": False} if way == "ws" else {}


class Clients:
    """Every NydusClient a test makes, closed at its end."""

    def __init__(self, host: NydusHost) -> None:
        self.host = host
        self.made: list[NydusClient] = []

    def make(self, way: str, address: str | None = None, **options: Any) -> NydusClient:
        client = NydusClient(
            reactor, address or self.host.address(way), **client_options(way), **options
        )
        self.made.append(client)
        return client

    async def connect(self, way: str, **options: Any) -> NydusClient:
        client = self.make(way, **options)
        await wait_for(client.connect())
        return client

    async def close(self) -> None:
        for client in self.made:
            await wait_for(client.close())


@pytest_twisted.async_yield_fixture
async def host() -> AsyncIterator[NydusHost]:
    running = await NydusHost().start()
    try:
        yield running
    finally:
        await running.stop()


@pytest_twisted.async_yield_fixture
async def clients(host: NydusHost) -> AsyncIterator[Clients]:
    made = Clients(host)
    try:
        yield made
    finally:
        await made.close()


async def remote_of(host: NydusHost, count: int = 1) -> Any:
    """The server's side of the only (or the `count`th) connection."""
    await eventually(lambda: len(host.server.clients) >= count)
    return list(host.server.clients.values())[count - 1]


class Received:
    """A publish route handler that keeps (match, data) pairs."""

    def __init__(self) -> None:
        self.calls: list[tuple[Match, Any]] = []

    def __call__(self, match: Match, data: Any) -> None:
        self.calls.append((match, data))

    @property
    def data(self) -> list[Any]:
        return [data for _, data in self.calls]

    async def wait(self, count: int = 1) -> list[Any]:
        await eventually(lambda: len(self.calls) >= count)
        return self.data


# -- invoking ----------------------------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_invoke_results_from_sync_deferred_and_coroutine_handlers(host, clients, way):
    server = host.server
    server.register_route("/echo", lambda inv: inv.body)
    server.register_route("/nothing", lambda inv: None)
    server.register_route("/later", lambda inv: defer.succeed({"later": inv.body}))

    async def params(invocation: Invocation) -> Any:
        await sleep(0.01)
        return {"params": invocation.params, "splats": invocation.splats,
                "route": invocation.route, "path": invocation.path}

    server.register_route("/users/:id/*", params)
    client = await clients.connect(way)
    assert client.connected
    assert await wait_for(client.invoke("/echo", {"a": [1, "é"]})) == {"a": [1, "é"]}
    assert await wait_for(client.invoke("/echo", None)) is None
    assert await wait_for(client.invoke("/echo")) is None
    assert await wait_for(client.invoke("/nothing", 5)) is None
    assert await wait_for(client.invoke("/later", 3)) == {"later": 3}
    assert await wait_for(client.invoke("/users/a%2Fb/x y/z")) == {
        "params": {"id": "a/b"}, "splats": ["x y/z"], "route": "/users/:id/*",
        "path": "/users/a%2Fb/x y/z",
    }


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_invoke_errors(host, clients, way):
    server = host.server

    def teapot(invocation: Invocation) -> None:
        raise InvokeError(418, "I'm a teapot", {"reset": True})

    async def async_fail(invocation: Invocation) -> None:
        raise InvokeError(420, "Enhance your calm")

    def crash(invocation: Invocation) -> None:
        raise RuntimeError("secret detail")

    def odd(invocation: Invocation) -> None:
        raise RequestFailed({"status": "bad", "message": "not a number"})

    server.register_route("/teapot", teapot)
    server.register_route("/calm", async_fail)
    server.register_route("/crash", crash)
    server.register_route("/odd", odd)
    client = await clients.connect(way)

    error = await failure_of(client.invoke("/teapot"))
    assert isinstance(error, InvokeError)
    assert (error.status, error.message, error.body) == (418, "I'm a teapot", {"reset": True})
    error = await failure_of(client.invoke("/calm"))
    assert (error.status, error.message, error.body) == (420, "Enhance your calm", None)
    error = await failure_of(client.invoke("/missing"))
    assert (type(error), error.status, error.message, error.body) == (
        InvokeError, 404, "Not Found", None
    )
    error = await failure_of(client.invoke("/crash"))
    assert (error.status, error.message, error.body) == (500, "Internal Server Error", None)
    error = await failure_of(client.invoke("/odd"))
    assert type(error) is RequestFailed
    assert error.body == {"status": "bad", "message": "not a number"}


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_debug_mode_500_carries_the_message_and_stack(way):
    host = await NydusHost(debug=True).start()
    made = Clients(host)
    try:
        def crash(invocation: Invocation) -> None:
            raise RuntimeError("the detail")

        host.server.register_route("/crash", crash)
        client = await made.connect(way)
        error = await failure_of(client.invoke("/crash"))
        assert (error.status, error.message) == (500, "the detail")
        assert "Traceback" in error.body and "RuntimeError: the detail" in error.body
    finally:
        await made.close()
        await host.stop()


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_an_invoke_with_no_reply_times_out(host, clients, way):
    host.server.register_route("/never", lambda inv: defer.Deferred())
    host.server.register_route("/echo", lambda inv: inv.body)
    client = await clients.connect(way)
    error = await failure_of(client.invoke("/never", timeout=0.1))
    assert isinstance(error, RequestTimeout)
    assert "'/never'" in str(error)
    assert await wait_for(client.invoke("/echo", 1)) == 1


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_what_nydus_cannot_carry_fails_the_invoke_and_sends_nothing(host, clients, way):
    calls: list[Invocation] = []
    host.server.register_route("*", calls.append)
    client = await clients.connect(way)
    assert isinstance(await failure_of(client.invoke("", 1)), InvalidTopic)
    assert isinstance(await failure_of(client.invoke("/x", {1})), InvalidField)
    assert isinstance(await failure_of(client.invoke("/x", "y" * (2 << 20))), FrameTooLarge)
    await wait_for(client.invoke("/barrier"))
    assert [call.path for call in calls] == ["/barrier"]


# -- publishes and routes ------------------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_routes_get_params_splats_and_data_and_the_rest_is_unhandled(host, clients, way):
    client = clients.make(way)
    chat, files = Received(), Received()
    unhandled: list[tuple[str, Any]] = []
    client.register_route("/chat/:room", chat)

    @client.register_route("/files/*.*")
    def on_file(match: Match, data: Any) -> None:
        files(match, data)

    client.register_route("/chat/lobby", Received())  # never reached: the first route wins
    client.on_unhandled = lambda path, data: unhandled.append((path, data))
    await wait_for(client.connect())
    remote = await remote_of(host)
    remote.send_publish("/chat/lobby", {"text": "hi"})
    remote.send_publish("/CHAT/a%2Fb")
    remote.send_publish("/files/docs/report.pdf", None)
    remote.send_publish("/elsewhere", [1])
    await eventually(lambda: unhandled)
    assert unhandled == [("/elsewhere", [1])]
    assert chat.data == [{"text": "hi"}, None]
    assert [(m.route, m.params, m.splats, m.path) for m, _ in chat.calls] == [
        ("/chat/:room", {"room": "lobby"}, [], "/chat/lobby"),
        ("/chat/:room", {"room": "a/b"}, [], "/CHAT/a%2Fb"),
    ]
    assert [(m.params, m.splats) for m, _ in files.calls] == [({}, ["docs/report", "pdf"])]
    assert files.data == [None]


@pytest_twisted.ensureDeferred
async def test_a_raising_route_or_hook_does_not_stop_the_client(host, clients):
    client = clients.make("lines")

    def broken(match: Match, data: Any) -> None:
        raise RuntimeError("route")

    def broken_hook(*args: Any) -> None:
        raise RuntimeError("hook")

    client.register_route("/broken", broken)
    client.on_unhandled = client.on_connect = broken_hook
    good = Received()
    client.register_route("/good", good)
    await wait_for(client.connect())
    remote = await remote_of(host)
    remote.send_publish("/broken", 1)
    remote.send_publish("/unknown", 2)
    remote.send_publish("/good", 3)
    assert await good.wait() == [3]


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_subscriptions_with_initial_data_publish_and_unsubscribe_all(host, clients, way):
    server = host.server
    later: defer.Deferred = defer.Deferred()
    never_sent: defer.Deferred = defer.Deferred()

    @server.register_route("/rooms/:room/join")
    def join(invocation: Invocation) -> Any:
        room = invocation.params["room"]
        path = f"/chat/{room}"
        if room == "later":
            data: Any = later
        elif room == "gone":
            data = never_sent
        else:
            data = {"joined": room, "body": invocation.body}
        return server.subscribe_client(invocation.client, path, data)

    @server.register_route("/rooms/:room/leave")
    def leave(invocation: Invocation) -> bool:
        return server.unsubscribe_client(invocation.client, f"/chat/{invocation.params['room']}")

    first, second = clients.make(way), clients.make(way)
    received = {id(first): Received(), id(second): Received()}
    for client in (first, second):
        client.register_route("/chat/:room", received[id(client)])
        await wait_for(client.connect())
    mine, theirs = received[id(first)], received[id(second)]

    assert await wait_for(first.invoke("/rooms/lobby/join", "ada")) is True
    assert await mine.wait() == [{"joined": "lobby", "body": "ada"}]
    assert mine.calls[0][0].params == {"room": "lobby"}
    # Joining again: already subscribed, no initial data.
    assert await wait_for(first.invoke("/rooms/lobby/join")) is False
    assert await wait_for(second.invoke("/rooms/lobby/join", "bob")) is True
    assert await theirs.wait() == [{"joined": "lobby", "body": "bob"}]

    assert server.publish("/chat/lobby", {"text": "hello"}) == 2
    assert await mine.wait(2) == [{"joined": "lobby", "body": "ada"}, {"text": "hello"}]
    assert await theirs.wait(2) == [{"joined": "lobby", "body": "bob"}, {"text": "hello"}]

    # Deferred initial data, sent once it resolves.
    assert await wait_for(first.invoke("/rooms/later/join")) is True
    later.callback("finally")
    assert (await mine.wait(3))[-1] == "finally"
    # Unsubscribed before it resolves: nothing comes.
    assert await wait_for(first.invoke("/rooms/gone/join")) is True
    assert await wait_for(first.invoke("/rooms/gone/leave")) is True
    never_sent.callback("never seen")

    assert server.unsubscribe_all("/chat/lobby")
    assert server.publish("/chat/lobby", "nobody") == 0
    assert server.publish("/chat/later", "last") == 1
    assert (await mine.wait(4))[-1] == "last"
    await wait_for(first.invoke("/rooms/x/leave"))  # a barrier: what was sent has come
    assert "never seen" not in mine.data and "nobody" not in mine.data
    assert len(theirs.calls) == 2


# -- the hub: nydus paths and topics of other protocols --------------------------------------------


class HubPeers:
    """A WEBSMQ listener and a UBRE listener on the nydus host's hub, and clients of both."""

    def __init__(self, host: NydusHost) -> None:
        self.host = host
        self.ports: list[Any] = []
        self.ubre = UbreServer(host.hub)
        self.websmq_clients: list[websmq.WebsmqClientProtocol] = []
        self.ubre_clients: list[UbreClient] = []

    async def listen(self, factory: Any) -> int:
        endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
        port = await wait_for(endpoint.listen(factory))
        self.ports.append(port)
        return port.getHost().port

    async def websmq_client(self) -> websmq.WebsmqClientProtocol:
        port = await self.listen(websocket_site({"/websmq": websocket_resource(
            websmq.server_factory(self.host.hub))}))
        client = await wait_for(websmq.connect(reactor, f"ws://127.0.0.1:{port}/websmq"))
        self.websmq_clients.append(client)
        return client

    async def ubre_client(self) -> UbreClient:
        port = await self.listen(stream_server_factory(self.ubre, StreamOptions(framing="lines")))
        client = UbreClient(reactor, f"tcp:host=127.0.0.1:port={port}")
        self.ubre_clients.append(client)
        await wait_for(client.connect())
        return client

    async def close(self) -> None:
        for client in self.websmq_clients:
            await wait_for(client.disconnect())
        for client in self.ubre_clients:
            await wait_for(client.close())
        for port in self.ports:
            await wait_for(defer.maybeDeferred(port.stopListening))
        self.ubre.close()


@pytest_twisted.async_yield_fixture
async def hub_peers(host: NydusHost) -> AsyncIterator[HubPeers]:
    made = HubPeers(host)
    try:
        yield made
    finally:
        await made.close()


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_websmq_and_ubre_publishes_reach_nydus_subscribers(host, clients, hub_peers, way):
    host.server.register_route(
        "/subscribe/*", lambda inv: host.server.subscribe_client(inv.client, "/" + inv.splats[0])
    )
    nydus_client = clients.make(way)
    room = Received()
    nydus_client.register_route("/chat/:room", room)
    await wait_for(nydus_client.connect())
    assert await wait_for(nydus_client.invoke("/subscribe/chat/room")) is True

    websmq_client = await hub_peers.websmq_client()
    ubre_client = await hub_peers.ubre_client()
    await websmq_client.publish("chat/room", b'{"from": "websmq"}')
    await eventually(lambda: room.calls)
    await websmq_client.publish("chat/room", b"plain text")
    await websmq_client.publish("chat/room", b"\xff binary")  # JSON cannot carry it: not sent
    await eventually(lambda: len(room.calls) == 2)
    await ubre_client.publish("chat/room", {"from": "ubre"})
    await ubre_client.publish("chat/room")
    await room.wait(4)
    await wait_for(nydus_client.invoke("/subscribe/chat/room"))  # a barrier
    assert room.data == [{"from": "websmq"}, "plain text", {"from": "ubre"}, None]
    assert {match.params["room"] for match, _ in room.calls} == {"room"}


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_nydus_publishes_reach_websmq_and_ubre_subscribers(host, clients, hub_peers, way):
    websmq_inbox, ubre_inbox = Inbox(), Inbox()
    websmq_client = await hub_peers.websmq_client()
    await websmq_client.subscribe("chat/room", websmq_inbox)
    ubre_client = await hub_peers.ubre_client()
    ubre_client.subscribe("chat/room", ubre_inbox)
    await eventually(lambda: len(host.hub.subscribers("chat/room")) == 2)
    assert host.server.publish("/chat/room", {"from": "nydus"}) == 2
    assert host.server.publish("/chat/room") == 2
    assert await websmq_inbox.wait(2) == [
        WebsmqPublish("chat/room", b'{"from":"nydus"}'), WebsmqPublish("chat/room", b"")
    ]
    assert await ubre_inbox.wait(2) == [
        UbrePublish("chat/room", {"from": "nydus"}), UbrePublish("chat/room", None)
    ]


# -- connecting, closing and reconnecting ---------------------------------------------------------


class Hooks:
    def __init__(self, client: NydusClient) -> None:
        self.connects = 0
        self.disconnects: list[Failure] = []
        client.on_connect = self.connected
        client.on_disconnect = self.disconnects.append

    def connected(self) -> None:
        self.connects += 1


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_reconnects_and_fails_the_invokes_in_flight(way):
    first = await NydusHost().start()
    second = NydusHost()
    first.server.register_route("/never", lambda inv: defer.Deferred())
    client = NydusClient(reactor, first.address(way), reconnect=True, retry_policy=FAST_RETRY,
                         **client_options(way))
    hooks = Hooks(client)
    try:
        assert await wait_for(client.connect()) is client
        assert hooks.connects == 1
        in_flight = [client.invoke("/never", timeout=None), client.invoke("/never", 1)]
        await eventually(lambda: any(c._answering == 2 for c in first.server.clients.values()))
        ports = {name: first.port(name) for name in ("ws", "lines")}
        await first.stop()
        for d in in_flight:
            assert isinstance(await failure_of(d), ConnectionClosed)
        await eventually(lambda: hooks.disconnects)
        assert not client.connected
        # Not connected: an invoke fails at once rather than wait.
        assert isinstance(await failure_of(client.invoke("/echo")), ConnectionClosed)
        await sleep(0.15)  # a few failed attempts

        second.server.register_route("/echo", lambda inv: inv.body)
        await second.start(ports)
        await eventually(lambda: client.connected)
        assert hooks.connects == 2
        assert len(hooks.disconnects) == 1
        assert await wait_for(client.invoke("/echo", "again")) == "again"
    finally:
        await wait_for(client.close())
        await first.stop()
        await second.stop()


@pytest_twisted.ensureDeferred
async def test_connect_keeps_trying_until_the_server_is_up_and_close_stops_it():
    port = free_port()
    host = NydusHost()
    client = NydusClient(reactor, f"tcp:host=127.0.0.1:port={port}", reconnect=True,
                         retry_policy=FAST_RETRY)
    try:
        connecting = client.connect()
        await sleep(0.15)
        assert not connecting.called
        await host.start({"lines": port})
        assert await wait_for(connecting) is client
    finally:
        await wait_for(client.close())
        await host.stop()
    stopped = NydusClient(reactor, f"tcp:host=127.0.0.1:port={free_port()}", reconnect=True,
                          retry_policy=FAST_RETRY)
    connecting = stopped.connect()
    await sleep(0.1)
    await wait_for(stopped.close())
    assert isinstance(await failure_of(connecting), ConnectionClosed)
    assert not stopped._reconnector.running


@pytest_twisted.ensureDeferred
async def test_connect_without_reconnect_fails_when_nothing_listens():
    error = await failure_of(connect(reactor, f"tcp:host=127.0.0.1:port={free_port()}"))
    assert isinstance(error, ConnectionRefusedError)


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_close_fails_the_invokes_waiting_and_fires_once_closed(host, clients, way):
    host.server.register_route("/never", lambda inv: defer.Deferred())
    client = await clients.connect(way)
    hooks = Hooks(client)
    waiting = client.invoke("/never", timeout=None)
    await eventually(lambda: any(c._answering for c in host.server.clients.values()))
    await wait_for(client.close())
    assert not client.connected
    assert isinstance(await failure_of(waiting), ConnectionClosed)
    assert len(hooks.disconnects) == 1
    await eventually(lambda: not host.server.clients)
    assert isinstance(await failure_of(client.invoke("/never")), ConnectionClosed)
    await wait_for(client.close())  # again: nothing to do


# -- scripted servers ------------------------------------------------------------------------------


class Scripted(LineOnlyReceiver):
    """A line server that sends `greeting` lines on connect, then answers each line with what
    `answer(line)` returns (lines, or None for nothing)."""

    delimiter = b"\n"

    def connectionMade(self) -> None:
        self.factory.connections.append(self)
        for line in self.factory.greeting:
            self.sendLine(line)

    def lineReceived(self, line: bytes) -> None:
        self.factory.received.append(line)
        for reply in self.factory.answer(line) or ():
            self.sendLine(reply)

    def connectionLost(self, reason: Failure) -> None:
        self.factory.lost.append(reason)


class ScriptedServer:
    def __init__(self, greeting: list[bytes], answer: Callable[[bytes], Any] = lambda line: None):
        self.factory = Factory.forProtocol(Scripted)
        self.factory.greeting = greeting
        self.factory.answer = answer
        self.factory.connections = []
        self.factory.received = []
        self.factory.lost = []
        self.port: Any = None

    async def start(self) -> str:
        endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
        self.port = await wait_for(endpoint.listen(self.factory))
        return f"tcp:host=127.0.0.1:port={self.port.getHost().port}"

    async def stop(self) -> None:
        for connection in self.factory.connections:
            connection.transport.abortConnection()
        await wait_for(defer.maybeDeferred(self.port.stopListening))


@pytest_twisted.async_yield_fixture
async def scripted() -> AsyncIterator[Callable[..., Any]]:
    made: list[ScriptedServer] = []

    async def start(greeting: list[bytes], answer: Callable[[bytes], Any] = lambda line: None):
        server = ScriptedServer(greeting, answer)
        made.append(server)
        return server, await server.start()

    try:
        yield start
    finally:
        for server in made:
            await server.stop()


def answer_by_path(replies: dict[str, str]) -> Callable[[bytes], list[bytes]]:
    """Answer ``1$id~path|...`` with ``replies[path]``, its ``{id}`` filled in."""

    def answer(line: bytes) -> list[bytes]:
        text = line.decode()
        invoke_id, rest = text[2:].split("~", 1)
        path = rest.split("|", 1)[0]
        return [replies[path].replace("{id}", invoke_id).encode()]

    return answer


@pytest_twisted.ensureDeferred
async def test_no_data_and_null_results_are_both_none_and_error_data_of_any_shape(scripted):
    server, address = await scripted([b"0|3"], answer_by_path({
        "/no-data": "2${id}|",
        "/null": "2${id}|null",
        "/error-no-data": "3${id}|",
        "/error-string": '3${id}|"nope"',
        "/error-zero": '3${id}|{"message":"m","status":0}',
        "/error-empty": '3${id}|{"message":"","status":400}',
        "/error-bool": '3${id}|{"message":"m","status":true}',
    }))
    client = await wait_for(connect(reactor, address))
    try:
        assert await wait_for(client.invoke("/no-data")) is None
        assert await wait_for(client.invoke("/null")) is None
        for path, body in [
            ("/error-no-data", None),
            ("/error-string", "nope"),
            ("/error-zero", {"message": "m", "status": 0}),
            ("/error-empty", {"message": "", "status": 400}),
            ("/error-bool", {"message": "m", "status": True}),
        ]:
            error = await failure_of(client.invoke(path))
            assert type(error) is RequestFailed
            assert error.body == body
        # The ids are nanoids.
        sent_ids = [line.split(b"~")[0][2:] for line in server.factory.received]
        assert all(len(sent_id) == 21 for sent_id in sent_ids)
        assert len(set(sent_ids)) == len(sent_ids)
    finally:
        await wait_for(client.close())


@pytest.mark.parametrize("reconnect", [False, True])
@pytest_twisted.ensureDeferred
async def test_a_welcome_for_another_version_is_fatal(scripted, reconnect):
    server, address = await scripted([b"0|2"])
    client = NydusClient(reactor, address, reconnect=reconnect, retry_policy=FAST_RETRY)
    error = await failure_of(client.connect())
    assert isinstance(error, IncompatibleVersion)
    assert "protocol version 2" in str(error)
    await eventually(lambda: server.factory.lost)
    await sleep(0.15)
    assert len(server.factory.connections) == 1  # no second attempt
    assert not client.connected
    await wait_for(client.close())


@pytest_twisted.ensureDeferred
async def test_no_welcome_within_the_timeout(scripted):
    server, address = await scripted([])
    error = await failure_of(connect(reactor, address, welcome_timeout=0.1))
    assert isinstance(error, TimeoutError)
    assert "WELCOME" in str(error)
    await eventually(lambda: server.factory.lost)


@pytest_twisted.ensureDeferred
async def test_closed_before_the_welcome(scripted):
    server, address = await scripted([])
    client = NydusClient(reactor, address)
    connecting = client.connect()
    await eventually(lambda: server.factory.connections)
    server.factory.connections[0].transport.loseConnection()
    assert isinstance(await failure_of(connecting), ConnectionClosed)


@pytest_twisted.ensureDeferred
async def test_close_while_waiting_for_the_welcome(scripted):
    server, address = await scripted([])
    client = NydusClient(reactor, address)
    connecting = client.connect()
    await eventually(lambda: server.factory.connections)
    await wait_for(client.close())
    assert isinstance(await failure_of(connecting), ConnectionClosed)
    await eventually(lambda: server.factory.lost)


@pytest_twisted.ensureDeferred
async def test_garbage_from_the_server_closes_the_connection(scripted):
    server, address = await scripted([b"0|3", b"", b"0|3"], lambda line: [b"4~/%ZZ|1", b"2$x|1"])
    client = await wait_for(connect(reactor, address))
    hooks = Hooks(client)
    unhandled: list[Any] = []
    client.on_unhandled = lambda path, data: unhandled.append(path)
    waiting = client.invoke("/x", timeout=None)
    assert isinstance(await failure_of(waiting), ConnectionClosed)
    await eventually(lambda: hooks.disconnects)
    assert unhandled == []
    assert not client.connected
    await wait_for(client.close())


@pytest_twisted.ensureDeferred
async def test_unknown_ids_and_invokes_from_the_server_are_ignored(scripted):
    server, address = await scripted(
        [b"0|3", b"2$unknown|1", b"1$x~/p|1", b"3$other|{}"], answer_by_path({"/p": "2${id}|7"})
    )
    client = await wait_for(connect(reactor, address))
    try:
        assert await wait_for(client.invoke("/p")) == 7
        assert client.connected
    finally:
        await wait_for(client.close())


def test_addresses():
    assert NydusClient(reactor, "http://127.0.0.1:1").engineio
    assert NydusClient(reactor, "HTTPS://example.com/").engineio
    assert NydusClient(reactor, "ws://127.0.0.1:1/x").engineio
    raw = NydusClient(reactor, "ws://127.0.0.1:1/x", engineio=False)
    assert not raw.engineio and raw.connect_options == {}
    lines = NydusClient(reactor, "tcp:host=127.0.0.1:port=1")
    assert not lines.engineio and lines.connect_options == {"framing": "lines"}
    with pytest.raises(ValueError, match="needs an http://, https://, ws:// or wss:// URL"):
        NydusClient(reactor, "tcp:host=127.0.0.1:port=1", engineio=True)
    with pytest.raises(ValueError, match="needs a ws:// or wss:// URL"):
        NydusClient(reactor, "http://127.0.0.1:1", engineio=False)
    with pytest.raises(ValueError, match="framing: options for raw WebSocket"):
        NydusClient(reactor, "http://127.0.0.1:1", framing="lines", context_factory=None)
    assert _websocket_url("http://a:1/x?y") == "ws://a:1/x?y"
    assert _websocket_url("HTTPS://a") == "wss://a"
    assert _websocket_url("ws://a") == "ws://a"
    with pytest.raises(ValueError, match="apply only to Engine.IO"):
        NydusClient(reactor, "tcp:host=127.0.0.1:port=1", engineio_options=object())
