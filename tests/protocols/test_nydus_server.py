"""The nydus server role on real sockets, driven by raw peers that share none of its code.

The server runs over raw WebSocket text frames and over TCP with the lines framing (wireproto's
extensions; Engine.IO is the transport's own business and is tested with it). WebSocket peers are
bare Autobahn clients, lines peers plain Twisted protocols that split lines by hand, so every
string is checked exactly as it travels. `NydusHost` at the top is reused by the client tests.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted
from autobahn.twisted.websocket import WebSocketClientFactory
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

from tests.raw_peers import RawConnection, RawStream, RawWebSocket
from tests.support import eventually, failure_of, sleep, wait_for
from wireproto.errors import InvalidField, InvalidTopic
from wireproto.hub import Hub
from wireproto.protocols.nydus.server import (
    Invocation,
    InvokeError,
    NydusServer,
    NydusServerProtocol,
    encode_for_nydus,
    nanoid,
    path_of_topic,
    server_factory,
    topic_of_path,
)
from wireproto.protocols.rpc import RequestFailed
from wireproto.transports.stream import StreamOptions, stream_server_factory
from wireproto.transports.websocket import WebSocketOptions
from wireproto.transports.websocket_http import websocket_resource, websocket_site

WAYS = ("ws", "lines")
NANOID = re.compile(r"[A-Za-z0-9_-]{21}")


class NydusHost:
    """A hub and a NydusServer on it on 127.0.0.1: over WebSocket at /nydus (`ws_url`) and over
    TCP with the lines framing (`lines`, an endpoint string). `server_options` go to NydusServer.
    `stop()` stops listening and closes every nydus connection still open."""

    def __init__(
        self, hub: Hub | None = None, *, max_message_size: int = 1 << 20, **server_options: Any
    ) -> None:
        self.hub = hub if hub is not None else Hub()
        self.server = NydusServer(self.hub, **server_options)
        self.max_message_size = max_message_size
        self.ports: dict[str, Any] = {}
        self.ws_url = self.lines = ""

    async def start(self, ports: dict[str, int] | None = None) -> NydusHost:
        factories = {
            "ws": websocket_site({"/nydus": websocket_resource(
                self.server, WebSocketOptions(max_message_size=self.max_message_size))}),
            "lines": stream_server_factory(
                self.server,
                StreamOptions(framing="lines", max_message_size=self.max_message_size),
            ),
        }
        for way, factory in factories.items():
            port = (ports or {}).get(way, 0)
            endpoint = TCP4ServerEndpoint(reactor, port, interface="127.0.0.1")
            self.ports[way] = await wait_for(endpoint.listen(factory))
        self.ws_url = f"ws://127.0.0.1:{self.port('ws')}/nydus"
        self.lines = f"tcp:host=127.0.0.1:port={self.port('lines')}"
        return self

    def port(self, way: str) -> int:
        return self.ports[way].getHost().port

    def address(self, way: str) -> str:
        return self.ws_url if way == "ws" else self.lines

    async def stop(self) -> None:
        for port in self.ports.values():
            await wait_for(defer.maybeDeferred(port.stopListening))
        self.ports.clear()
        self.server.close()
        try:
            await eventually(lambda: not self.server.clients, timeout=7)
        except TimeoutError:
            for client in list(self.server.clients.values()):
                client.transport.abortConnection()
            await eventually(lambda: not self.server.clients)


@pytest_twisted.async_yield_fixture
async def host() -> AsyncIterator[NydusHost]:
    running = await NydusHost().start()
    try:
        yield running
    finally:
        await running.stop()


# -- raw peers ------------------------------------------------------------------------------------


class Peer(RawConnection):
    """One raw nydus connection over `way` ("ws" or "lines"); `remote` is the server's side of
    it (the `client` that handlers and hooks get)."""

    def __init__(self, way: str, protocol: RawWebSocket | RawStream) -> None:
        self.way = way
        self.protocol = protocol
        self.remote: NydusServerProtocol | None = None
        self.read_count = 0
        self.skipped: list[str] = []
        self._ids = itertools.count(1)

    @property
    def messages(self) -> list[str]:
        """Every message received so far, as text. On WebSocket each must be a text frame."""
        if isinstance(self.protocol, RawWebSocket):
            for data, binary in self.protocol.frames:
                assert not binary, f"{data!r} came in a binary frame"
            return [data.decode() for data, _ in self.protocol.frames]
        return [line.decode() for line in bytes(self.protocol.received).split(b"\n")[:-1]]

    def send(self, text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        if isinstance(self.protocol, RawWebSocket):
            self.protocol.sendMessage(data, isBinary=False)
        else:
            self.protocol.transport.write(data + b"\n")

    async def read(self, count: int = 1) -> list[str]:
        await eventually(lambda: len(self.messages) >= self.read_count + count)
        got = self.messages[self.read_count : self.read_count + count]
        self.read_count += count
        return got

    async def read_one(self) -> str:
        (message,) = await self.read()
        return message

    def next_id(self) -> str:
        return f"t{next(self._ids)}"

    async def invoke(self, path: str, data: str = "", invoke_id: str | None = None) -> str:
        """Send ``1$id~path|data`` and return the reply to it (publishes before it are skipped
        over and kept in `skipped`)."""
        invoke_id = invoke_id or self.next_id()
        self.send(f"1${invoke_id}~{path}|{data}")
        return await self.reply_to(invoke_id)

    async def reply_to(self, invoke_id: str) -> str:
        while True:
            message = await self.read_one()
            if message.startswith((f"2${invoke_id}|", f"3${invoke_id}|")):
                return message
            self.skipped.append(message)

    async def sync(self) -> list[str]:
        """Every message the server sends before it answers an INVOKE sent now. The server
        handles a connection's messages in order and sends through one queue, so this proves
        what did NOT arrive, without sleeping."""
        self.skipped = []
        await self.invoke("/test.sync/barrier")
        return self.skipped



class Peers:
    """The raw peers of one test, all closed at its end."""

    def __init__(self, host: NydusHost) -> None:
        self.host = host
        self.peers: list[Peer] = []

    async def raw(self, way: str, *, welcome: bool = True) -> Peer:
        """A raw peer, once the server has attached it; its WELCOME is read unless `welcome`
        is False."""
        if way == "ws":
            factory = WebSocketClientFactory(self.host.ws_url)
            factory.protocol = RawWebSocket
        else:
            factory = Factory.forProtocol(RawStream)
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.host.port(way))
        protocol = await wait_for(endpoint.connect(factory))
        peer = Peer(way, protocol)
        self.peers.append(peer)
        if way == "ws":
            await wait_for(protocol.opened)
        # Two clients of different server ports may share a local port: match both ends.
        ends = (protocol.transport.getHost().port, self.host.port(way))

        def attached() -> NydusServerProtocol | None:
            for remote in self.host.server.clients.values():
                transport = remote.transport
                if (transport.getPeer().port, transport.getHost().port) == ends:
                    return remote
            return None

        peer.remote = await eventually(attached)
        if welcome:
            assert await peer.read_one() == "0|3"
        return peer

    async def close(self) -> None:
        for peer in self.peers:
            await peer.close()


@pytest_twisted.async_yield_fixture
async def peers(host: NydusHost) -> AsyncIterator[Peers]:
    made = Peers(host)
    try:
        yield made
    finally:
        await made.close()


# -- connecting ------------------------------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_welcome_first_and_the_connect_hook(host, peers, way):
    connected: list[NydusServerProtocol] = []
    host.server.on_connect = connected.append
    peer = await peers.raw(way, welcome=False)
    assert await peer.read_one() == "0|3"
    assert connected == [peer.remote]
    assert NANOID.fullmatch(peer.remote.id)
    assert host.server.clients == {peer.remote.id: peer.remote}
    assert peer.remote.subscriptions == frozenset()


@pytest_twisted.ensureDeferred
async def test_each_connection_gets_its_own_id(host, peers):
    first, second = await peers.raw("ws"), await peers.raw("lines")
    assert first.remote.id != second.remote.id
    assert len({nanoid() for _ in range(1000)}) == 1000


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_disconnect_hook_and_the_client_and_its_subscriptions_are_gone(host, peers, way):
    disconnected: list[tuple[NydusServerProtocol, Failure]] = []
    host.server.on_disconnect = lambda client, reason: disconnected.append((client, reason))
    peer = await peers.raw(way)
    remote = peer.remote
    assert host.server.subscribe_client(remote, "/chat/room")
    assert host.hub.subscribers("chat/room")
    await peer.close()
    await eventually(lambda: disconnected)
    assert disconnected[0][0] is remote
    assert isinstance(disconnected[0][1], Failure)
    assert host.server.clients == {}
    assert not host.hub.subscribers("chat/room")
    assert not host.server.subscribe_client(remote, "/chat/room")
    assert not host.server.unsubscribe_client(remote, "/chat/room")


# -- invoking ----------------------------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_a_result_and_a_handler_that_returns_nothing(host, peers, way):
    seen: list[Invocation] = []

    @host.server.register_route("/rooms/:room/*")
    def handler(invocation: Invocation) -> Any:
        seen.append(invocation)
        return invocation.body

    peer = await peers.raw(way)
    assert await peer.invoke("/rooms/lobby/a/b", '{"x":[1,"é"]}', "id-1") == (
        '2$id-1|{"x":[1,"é"]}'
    )
    # No data in, None to the handler, None back: RESULT with no data, not null.
    assert await peer.invoke("/rooms/lobby/", "", "id-2") == "2$id-2|"
    assert await peer.invoke("/ROOMS/x%20y/%E2%82%AC", "null", "id-3") == "2$id-3|"
    first = seen[0]
    assert (first.server, first.client, first.path, first.route) == (
        host.server, peer.remote, "/rooms/lobby/a/b", "/rooms/:room/*"
    )
    assert (first.params, first.splats, first.body, first.id) == (
        {"room": "lobby"}, ["a/b"], {"x": [1, "é"]}, "id-1"
    )
    assert seen[1].body is None
    assert (seen[2].path, seen[2].params, seen[2].splats) == (
        "/ROOMS/x y/€", {"room": "x y"}, ["€"]
    )


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_an_unknown_route_is_404_with_nydus_exact_bytes(host, peers, way):
    host.server.register_route("/known", lambda invocation: 1)
    peer = await peers.raw(way)
    assert await peer.invoke("/unknown", "1", "x") == '3$x|{"message":"Not Found","status":404}'
    assert await peer.invoke("/known", "", "y") == "2$y|1"


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_invoke_errors_keep_nydus_key_order(host, peers, way):
    def teapot(invocation: Invocation) -> None:
        raise InvokeError(418, "I'm a teapot", {"reset": True})

    def gone(invocation: Invocation) -> None:
        raise InvokeError(410)

    def odd(invocation: Invocation) -> None:
        raise InvokeError(420, "Enhance your calm", [None])

    host.server.register_route("/teapot", teapot)
    host.server.register_route("/gone", gone)
    host.server.register_route("/odd", odd)
    peer = await peers.raw(way)
    assert await peer.invoke("/teapot", "", "a") == (
        '3$a|{"message":"I\'m a teapot","status":418,"body":{"reset":true}}'
    )
    assert await peer.invoke("/gone", "", "b") == '3$b|{"message":"Gone","status":410}'
    assert await peer.invoke("/odd", "", "c") == (
        '3$c|{"message":"Enhance your calm","status":420,"body":[null]}'
    )


def test_invoke_error_values():
    assert InvokeError(999).message == "Error"
    assert str(InvokeError(404)) == "404 Not Found"
    assert repr(InvokeError(418, "tea", 1)) == "InvokeError(418, 'tea', body=1)"
    with pytest.raises(TypeError, match="status is an int"):
        InvokeError("404")


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_other_exceptions_are_500_without_details(host, peers, way):
    def broken(invocation: Invocation) -> None:
        raise KeyError("secret")

    host.server.register_route("/broken", broken)
    peer = await peers.raw(way)
    assert await peer.invoke("/broken", "", "z") == (
        '3$z|{"message":"Internal Server Error","status":500}'
    )


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_debug_mode_sends_the_message_and_the_stack(way):
    host = await NydusHost(debug=True).start()
    made = Peers(host)
    try:
        def broken(invocation: Invocation) -> None:
            raise ValueError("the reason")

        host.server.register_route("/broken", broken)
        peer = await made.raw(way)
        reply = await peer.invoke("/broken", "", "z")
        assert reply.startswith('3$z|{"message":"the reason","status":500,"body":"Traceback')
        assert "ValueError: the reason" in reply
        assert "in broken" in reply
    finally:
        await made.close()
        await host.stop()


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_deferred_and_coroutine_handlers_and_their_failures(host, peers, way):
    later: defer.Deferred = defer.Deferred()
    host.server.register_route("/later", lambda invocation: later)

    async def slow(invocation: Invocation) -> Any:
        await sleep(0.01)
        if invocation.body == "fail":
            raise InvokeError(409, "Conflict", {"why": "taken"})
        if invocation.body == "crash":
            raise RuntimeError("boom")
        return {"got": invocation.body}

    host.server.register_route("/slow", slow)
    host.server.register_route(
        "/failed", lambda invocation: defer.fail(InvokeError(403, "Forbidden"))
    )
    peer = await peers.raw(way)
    peer.send("1$d~/later|")
    assert await peer.invoke("/slow", '"ok"', "c1") == '2$c1|{"got":"ok"}'
    later.callback(["done"])
    assert await peer.reply_to("d") == '2$d|["done"]'
    assert await peer.invoke("/slow", '"fail"', "c2") == (
        '3$c2|{"message":"Conflict","status":409,"body":{"why":"taken"}}'
    )
    assert await peer.invoke("/slow", '"crash"', "c3") == (
        '3$c3|{"message":"Internal Server Error","status":500}'
    )
    assert await peer.invoke("/failed", "", "c4") == '3$c4|{"message":"Forbidden","status":403}'


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_request_failed_sends_its_data_as_it_is(host, peers, way):
    def refuse(invocation: Invocation) -> None:
        raise RequestFailed(["not", "conventional"])

    host.server.register_route("/refuse", refuse)
    peer = await peers.raw(way)
    assert await peer.invoke("/refuse", "", "r") == '3$r|["not","conventional"]'


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_a_result_that_cannot_be_sent_is_a_500_and_the_connection_lives(way):
    host = await NydusHost(max_message_size=200).start()
    made = Peers(host)
    try:
        host.server.register_route("/set", lambda invocation: {1, 2})
        host.server.register_route("/nan", lambda invocation: float("nan"))
        host.server.register_route("/big", lambda invocation: "x" * 500)
        host.server.register_route("/ok", lambda invocation: "fine")
        peer = await made.raw(way)
        for path in ("/set", "/nan", "/big"):
            assert await peer.invoke(path, "", "e") == (
                '3$e|{"message":"Internal Server Error","status":500}'
            )
        assert await peer.invoke("/ok", "", "k") == '2$k|"fine"'
        assert not peer.is_closed
    finally:
        await made.close()
        await host.stop()


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_only_invoke_is_acted_on(host, peers, way):
    calls: list[Invocation] = []
    host.server.register_route("*", lambda invocation: calls.append(invocation))
    peer = await peers.raw(way)
    for text in ("0|3", "2$abc|1", "3$abc|{}", "4~/chat|1", "4~/chat|"):
        peer.send(text)
    assert await peer.sync() == []
    assert [call.path for call in calls] == ["/test.sync/barrier"]
    assert not peer.is_closed


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_the_first_route_that_matches_wins(host, peers, way):
    host.server.register_route("/a/:x", lambda invocation: "first")
    host.server.register_route("/a/b", lambda invocation: "second")
    peer = await peers.raw(way)
    assert await peer.invoke("/a/b", "", "w") == '2$w|"first"'


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_invokes_being_answered_at_once_are_limited(way):
    host = await NydusHost(max_pending_invokes=2).start()
    made = Peers(host)
    try:
        waiting = [defer.Deferred(), defer.Deferred()]
        host.server.register_route("/wait/:n", lambda inv: waiting[int(inv.params["n"])])
        peer = await made.raw(way)
        peer.send("1$w0~/wait/0|")
        peer.send("1$w1~/wait/1|")
        assert await peer.invoke("/wait/0", "", "w2") == (
            '3$w2|{"message":"Too Many Requests","status":429}'
        )
        waiting[0].callback(0)
        assert await peer.reply_to("w0") == "2$w0|0"
        waiting[1].callback(1)
        assert await peer.reply_to("w1") == "2$w1|1"
    finally:
        await made.close()
        await host.stop()


@pytest_twisted.ensureDeferred
async def test_a_reply_for_a_client_that_left_is_dropped(host, peers):
    later: defer.Deferred = defer.Deferred()
    host.server.register_route("/later", lambda invocation: later)
    peer = await peers.raw("ws")
    peer.send("1$q~/later|")
    await eventually(lambda: peer.remote._answering)
    await peer.close()
    await eventually(lambda: not host.server.clients)
    later.callback("too late")
    assert peer.remote._answering == 0


def test_register_route_returns_the_handler_and_refuses_bad_patterns():
    server = NydusServer(Hub())

    def handler(invocation: Invocation) -> None:
        pass

    assert server.register_route("/x", handler) is handler
    assert server.register_route("/y")(handler) is handler
    with pytest.raises(ValueError, match="requires a path"):
        server.register_route("", handler)
    assert server_factory(Hub(), debug=True).debug


# -- parser errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(
    "bad", ["1$id~/%ZZ|1", "1$id~/path|fail me now!", "5|1", "1", "1$i d~/p|"]
)
@pytest_twisted.ensureDeferred
async def test_a_parser_error_closes_only_that_connection(host, peers, way, bad):
    errors: list[tuple[NydusServerProtocol, bytes]] = []
    host.server.on_parser_error = lambda client, raw: errors.append((client, raw))
    host.server.register_route("/echo", lambda invocation: invocation.body)
    bystander = await peers.raw(way)
    offender = await peers.raw(way)
    offender.send(bad)
    info = await offender.closed()
    if way == "ws":
        code, reason = info
        assert code == 1002
        assert reason.startswith("this serves nydus: nydus")  # what is served, then why
    assert errors == [(offender.remote, bad.encode())]
    assert offender.remote.id not in host.server.clients
    assert await bystander.invoke("/echo", "7", "b") == "2$b|7"


@pytest_twisted.ensureDeferred
async def test_an_empty_message_is_a_parser_error_on_websocket_and_nothing_on_lines(host, peers):
    ws = await peers.raw("ws")
    ws.send("")
    assert (await ws.closed())[0] == 1002
    lines = await peers.raw("lines")
    lines.send("")
    lines.send("\r")
    assert await lines.sync() == []
    assert not lines.is_closed


@pytest_twisted.ensureDeferred
async def test_a_raising_hook_changes_nothing(host, peers):
    def boom(*args: Any) -> None:
        raise RuntimeError("hook")

    host.server.on_connect = host.server.on_parser_error = host.server.on_disconnect = boom
    peer = await peers.raw("lines")
    assert await peer.invoke("/nothing", "", "h") == '3$h|{"message":"Not Found","status":404}'
    peer.send("garbage")
    await peer.closed()
    await eventually(lambda: not host.server.clients)


# -- subscriptions and publishing ------------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_initial_data_goes_to_the_new_subscriber_alone_and_only_once(host, peers, way):
    server = host.server
    first, second = await peers.raw(way), await peers.raw(way)
    assert server.subscribe_client(first.remote, "/chat/room", {"hello": 1})
    assert server.subscribe_client(second.remote, "/chat/room")
    # Already subscribed: no initial data again.
    assert not server.subscribe_client(first.remote, "/chat/room", "again")
    assert await first.sync() == ['4~/chat/room|{"hello":1}']
    assert await second.sync() == []
    assert first.remote.subscriptions == {"/chat/room"}
    assert server.subscribe_client(first.remote, "/a b/€", None)
    assert await first.sync() == ["4~/a%20b/%E2%82%AC|null"]


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_deferred_and_coroutine_initial_data(host, peers, way):
    server = host.server
    peer = await peers.raw(way)
    later: defer.Deferred = defer.Deferred()
    assert server.subscribe_client(peer.remote, "/later", later)

    ready: defer.Deferred = defer.Deferred()

    async def computed() -> Any:
        await ready  # the test says when: a timed wait would race a loaded machine
        return [1, 2]

    assert server.subscribe_client(peer.remote, "/computed", computed())
    assert await peer.sync() == []
    ready.callback(None)
    assert await peer.read_one() == "4~/computed|[1,2]"
    later.callback("now")
    assert await peer.sync() == ['4~/later|"now"']

    # Unsubscribed before it resolves: nothing is sent.
    too_late: defer.Deferred = defer.Deferred()
    assert server.subscribe_client(peer.remote, "/gone", too_late)
    assert server.unsubscribe_client(peer.remote, "/gone")
    too_late.callback("never seen")
    # Nothing (None) is nothing; a failure is logged, not sent.
    nothing: defer.Deferred = defer.Deferred()
    assert server.subscribe_client(peer.remote, "/nothing", nothing)
    nothing.callback(None)
    failing: defer.Deferred = defer.Deferred()
    assert server.subscribe_client(peer.remote, "/failing", failing)
    failing.errback(RuntimeError("no data"))
    unsendable: defer.Deferred = defer.Deferred()
    assert server.subscribe_client(peer.remote, "/unsendable", unsendable)
    unsendable.callback(object())
    assert await peer.sync() == []
    assert not peer.is_closed


@pytest_twisted.ensureDeferred
async def test_initial_data_that_is_not_json_is_refused_before_subscribing(host, peers):
    peer = await peers.raw("lines")
    with pytest.raises(InvalidField):
        host.server.subscribe_client(peer.remote, "/x", {1, 2})
    assert peer.remote.subscriptions == frozenset()


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_publish_reaches_the_subscribers_of_that_path_only(host, peers, way):
    server = host.server
    subscribed, other = await peers.raw(way), await peers.raw(way)
    server.subscribe_client(subscribed.remote, "/news")
    server.subscribe_client(other.remote, "/sport")
    assert server.publish("/news", {"title": "hi"}) == 1
    assert server.publish("/news") == 1
    assert server.publish("/news", None) == 1
    assert server.publish("/nobody", 1) == 0
    assert await subscribed.sync() == [
        '4~/news|{"title":"hi"}', "4~/news|", "4~/news|null"
    ]
    assert await other.sync() == []


@pytest.mark.parametrize("way", WAYS)
@pytest_twisted.ensureDeferred
async def test_unsubscribe_client_and_unsubscribe_all(host, peers, way):
    server = host.server
    first, second, third = [await peers.raw(way) for _ in range(3)]
    for peer in (first, second):
        server.subscribe_client(peer.remote, "/news")
    server.subscribe_client(third.remote, "/other")
    local = host.hub.subscribe_callback("news", lambda message: None)
    assert server.unsubscribe_client(first.remote, "/news")
    assert not server.unsubscribe_client(first.remote, "/news")
    assert server.publish("/news", 1) == 2  # the second peer and the host's callback
    assert server.unsubscribe_all("/news")
    assert not server.unsubscribe_all("/news")
    assert server.publish("/news", 2) == 1  # the callback, not a nydus client
    assert server.publish("/other", 3) == 1
    assert await first.sync() == []
    assert await second.sync() == ["4~/news|1"]
    assert await third.sync() == ["4~/other|3"]
    assert second.remote.subscriptions == frozenset()
    local.cancel()


@pytest_twisted.ensureDeferred
async def test_send_publish_to_one_client(host, peers):
    peer = await peers.raw("ws")
    assert peer.remote.send_publish("/direct", [1])
    assert await peer.sync() == ["4~/direct|[1]"]


def test_paths_and_topics():
    assert topic_of_path("/chat/room") == "chat/room"
    assert topic_of_path("/") == ""
    assert path_of_topic("chat/room") == "/chat/room"
    for bad in ("chat/room", "", None):
        with pytest.raises(ValueError, match="only paths that start with '/'"):
            topic_of_path(bad)
    server = NydusServer(Hub())
    with pytest.raises(ValueError, match="has no hub topic"):
        server.publish("chat", 1)
    with pytest.raises(ValueError, match="has no hub topic"):
        server.unsubscribe_all("chat")
    with pytest.raises(InvalidTopic):
        server.publish("/" + "x" * 2000, 1)
    with pytest.raises(InvalidField):
        server.publish("/x", object())


def test_hub_payloads_as_nydus_publishes():
    from wireproto.hub import HubMessage

    def encode(payload: bytes, topic: str = "t") -> Any:
        return encode_for_nydus(HubMessage(topic, payload))

    assert encode(b'{"a": 1}') == (b'4~/t|{"a":1}', False)
    assert encode(b"plain text") == (b'4~/t|"plain text"', False)
    assert encode(b"") == (b"4~/t|", False)
    assert encode(b"\xff\x00") is None
    assert encode(b"1", "a b") == (b"4~/a%20b|1", False)
    assert encode(b"1", "\ud800") is None


@pytest_twisted.ensureDeferred
async def test_close_closes_every_connection(host, peers):
    first, second = await peers.raw("ws"), await peers.raw("lines")
    host.server.close()
    await first.closed()
    await second.closed()
    await eventually(lambda: not host.server.clients)


@pytest_twisted.ensureDeferred
async def test_subscribe_client_refuses_bad_paths_and_closes_unused_coroutines(host, peers):
    peer = await peers.raw("ws")

    async def data() -> int:
        return 1

    with pytest.raises(ValueError):
        host.server.subscribe_client(peer.remote, "no-slash", data())
    assert host.server.subscribe_client(peer.remote, "/once")
    pending = data()
    assert not host.server.subscribe_client(peer.remote, "/once", pending)
    assert pending.cr_frame is None  # closed, so never "never awaited"


def test_a_client_on_another_process_is_not_subscribed_here_nor_publishes_from_here(host):
    """A handler answering an INVOKE made on another broker process gets a RemoteCaller as its
    client: unsubscribing it finds nothing here, and publishing as it is a TypeError, as
    subscribing it is (both failed on its session, which is its id on the other process)."""
    from wireproto.access import Principal
    from wireproto.protocols.calls import RemoteCaller

    caller = RemoteCaller("nydus", "127.0.0.1:50312", 7, nanoid(),
                          Principal("alice", frozenset()), "host:4711/1f2e3d4c")
    assert host.server.unsubscribe_client(caller, "/chat/room") is False
    with pytest.raises(TypeError, match="connected to another broker process"):
        host.server.publish("/chat/room", {"text": "hi"}, sender=caller)
    with pytest.raises(TypeError, match="connected to another broker process"):
        host.server.subscribe_client(caller, "/chat/room")


# -- hub routes -----------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_hub_routes_let_a_client_subscribe_and_publish_with_no_application_code() -> None:
    from wireproto.hub import HubMessage
    from wireproto.protocols.nydus.client import connect
    from wireproto.protocols.nydus.server import InvokeError

    running = await NydusHost(hub_routes=True).start()
    client = await wait_for(connect(reactor, running.ws_url, engineio=False))
    try:
        got: list[Any] = []
        client.register_route("/chat/:room", lambda match, data: got.append((match.path, data)))
        assert await wait_for(client.invoke("/_hub/subscribe", "/chat/lobby")) is None
        running.hub.publish(HubMessage("chat/lobby", b'{"text":"hi"}', protocol="websmq"))
        await eventually(lambda: got)
        assert got == [("/chat/lobby", {"text": "hi"})]

        at_hub: list[HubMessage] = []
        running.hub.subscribe_callback("chat/news", at_hub.append)
        result = await wait_for(client.invoke("/_hub/publish", {"path": "/chat/news", "data": 1}))
        assert result == {"delivered": 0, "processes": 1}  # host code's callback is no connection
        assert [(m.topic, m.payload, m.protocol) for m in at_hub] == [("chat/news", b"1", "nydus")]

        assert await wait_for(client.invoke("/_hub/unsubscribe", "/chat/lobby")) is None
        assert not running.hub.subscribers("chat/lobby")
        for path, data in [("/_hub/subscribe", "chat/lobby"), ("/_hub/publish", {"data": 1}),
                           ("/_hub/publish", "/chat"), ("/_hub/subscribe", "relative")]:
            failure = await failure_of(client.invoke(path, data))
            assert isinstance(failure, InvokeError) and failure.status == 400, (path, failure)
    finally:
        client.close()
        await running.stop()


@pytest_twisted.ensureDeferred
async def test_without_hub_routes_they_are_not_found(host: NydusHost) -> None:
    from wireproto.protocols.nydus.client import connect
    from wireproto.protocols.nydus.server import InvokeError

    client = await wait_for(connect(reactor, host.lines))
    try:
        failure = await failure_of(client.invoke("/_hub/subscribe", "/chat/lobby"))
        assert isinstance(failure, InvokeError) and failure.status == 404
    finally:
        client.close()


@pytest_twisted.ensureDeferred
async def test_a_publish_on_a_topic_past_max_topic_length_is_answered_then_closes() -> None:
    # As every protocol's: [hub] max_topic_length counts a published topic, and a longer one
    # closes the connection (a nydus path was held to nydus's 1024 characters only).
    from wireproto.protocols.nydus.client import connect
    from wireproto.protocols.nydus.server import InvokeError

    running = await NydusHost(Hub(max_topic_length=20), hub_routes=True).start()
    client = await wait_for(connect(reactor, running.lines))
    at_hub: list[Any] = []
    running.hub.subscribe_callback("#", at_hub.append)
    try:
        path = "/" + "x" * 20
        assert await wait_for(client.invoke("/_hub/publish", {"path": path, "data": 1})) == {
            "delivered": 0, "processes": 1}
        failure = await failure_of(client.invoke("/_hub/publish", {"path": path + "x",
                                                                   "data": 2}))
        assert isinstance(failure, InvokeError) and failure.status == 400
        assert "topic of 21 characters" in failure.message
        await eventually(lambda: not running.server.clients)
        assert [message.payload for message in at_hub] == [b"1"]
    finally:
        client.close()
        await running.stop()


@pytest_twisted.ensureDeferred
async def test_a_subscription_past_the_limit_is_answered_then_closes_the_connection() -> None:
    # docs/security.md's limits table: past max_subscriptions, the connection is closed.
    from wireproto.protocols.nydus.client import connect
    from wireproto.protocols.nydus.server import InvokeError

    running = await NydusHost(Hub(max_subscriptions=2), hub_routes=True).start()
    client = await wait_for(connect(reactor, running.lines))
    other = await wait_for(connect(reactor, running.lines))
    try:
        for path in ("/a", "/b"):
            assert await wait_for(client.invoke("/_hub/subscribe", path)) is None
        failure = await failure_of(client.invoke("/_hub/subscribe", "/c"))
        assert isinstance(failure, InvokeError) and failure.status == 400
        assert "more than 2 subscriptions" in failure.message
        await eventually(lambda: len(running.server.clients) == 1)
        assert not running.hub.subscribers("a")  # nothing of it is left in the hub
        assert await wait_for(other.invoke("/_hub/subscribe", "/a")) is None
    finally:
        client.close()
        other.close()
        await running.stop()
