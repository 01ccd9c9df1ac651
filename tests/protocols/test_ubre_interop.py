"""wireproto's UBRE with the real, unmodified ubre.js 0.0.23 (npm `ubre`), both ways round.

ubre.js runs in Node child processes through its own WebSocket wrappers on `ws` 7:
tests/interop/ubre_ws_client.js (`Ubre.ws`, a client of our UbreServer) and
tests/interop/ubre_ws_server.js (`Ubre.wss`, a peer server for our UbreClient). Both take
commands on stdin and print JSON events on stdout.

ubre.js keeps quiet about what it does not like: it drops a frame that is not text starting with
`{`, a reply whose id is not `===` to its request's, and a request without an "id". So every
reply or publish it reports here is one it accepted as it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ServerEndpoint

from tests.node_peer import NodePeer, NodePeers
from tests.support import Inbox, eventually, failure_of, need_interop_peer, sleep, wait_for
from wireproto.codecs.ubre import Publish
from wireproto.hub import Hub
from wireproto.protocols import websmq
from wireproto.protocols.rpc import ConnectionClosed, RequestFailed, RequestTimeout
from wireproto.protocols.ubre.client import UbreClient
from wireproto.protocols.ubre.server import UbreServer, UbreServerProtocol
from wireproto.transports.websocket_http import websocket_resource, websocket_site

INTEROP = Path(__file__).resolve().parents[1] / "interop"
CLIENT = INTEROP / "ubre_ws_client.js"
SERVER = INTEROP / "ubre_ws_server.js"


Spawn = Callable[..., Awaitable[NodePeer]]


@pytest.fixture
def node_executable() -> str:
    # Checked in a plain fixture: a skip raised in an async fixture's setup leaves pytest's
    # fixture state broken for the tests after it.
    need_interop_peer(INTEROP / "node_modules" / "ws7", "ubre.js's WebSocket wrapper")
    return need_interop_peer(INTEROP / "node_modules" / "ubre", "ubre.js")


@pytest_twisted.async_yield_fixture
async def spawn(node_executable: str) -> AsyncIterator[Spawn]:
    """Start Node scripts; every one is killed when the test ends, however it ends."""
    peers = NodePeers(node_executable)
    try:
        yield peers.start
    finally:
        await peers.stop()


class Broker:
    """A hub with wireproto's UbreServer on ws://127.0.0.1:PORT/ubre and a WEBSMQ server on
    /websmq of the same port; its Python clients are closed by `stop()`."""

    def __init__(self) -> None:
        self.hub = Hub()
        self.ubre = UbreServer(self.hub)
        self.site = websocket_site({
            "/ubre": websocket_resource(self.ubre),
            "/websmq": websocket_resource(websmq.server_factory(self.hub)),
        })
        self.clients: list[UbreClient] = []

    async def start(self) -> Broker:
        endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
        self.port = await wait_for(endpoint.listen(self.site))
        number = self.port.getHost().port
        self.url = f"ws://127.0.0.1:{number}/ubre"
        self.websmq_url = f"ws://127.0.0.1:{number}/websmq"
        return self

    async def client(self) -> UbreClient:
        client = UbreClient(reactor, self.url)
        self.clients.append(client)
        return await wait_for(client.connect())

    async def subscribed(self, topic: str, count: int = 1) -> None:
        """Wait until `count` connections subscribe to `topic` (UBRE has no acknowledgement)."""
        await eventually(lambda: len(self.hub.subscribers(topic)) >= count)

    async def stop(self) -> None:
        for client in self.clients:
            await wait_for(client.close())
        await wait_for(defer.maybeDeferred(self.port.stopListening))
        for peer in tuple(self.ubre.peers):
            peer.transport.abortConnection()
        await eventually(lambda: not self.ubre.peers)
        self.ubre.close()


@pytest_twisted.async_yield_fixture
async def broker() -> AsyncIterator[Broker]:
    running = await Broker().start()
    try:
        yield running
    finally:
        await running.stop()


async def ubre_js_client(spawn: Spawn, broker: Broker, *commands: str) -> NodePeer:
    """A ubre.js client of `broker`, connected; `commands` run before it connects."""
    return await spawn(CLIENT, broker.url, *commands, ready="open")






# -- ubre.js client, wireproto server --------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_ubre_js_connects_and_hears_which_topics_the_broker_has(spawn, broker):
    connected: list[UbreServerProtocol] = []
    broker.ubre.on_connect = connected.append
    python = await broker.client()
    python.subscribe("weather", Inbox())
    await broker.subscribed("weather")

    assert len(connected) == 1  # the Python client

    node = await ubre_js_client(spawn, broker)
    await eventually(lambda: len(connected) == 2)
    assert connected == list(broker.ubre.peers)
    # On connect, a subscribe for every topic with subscribers: ubre.js publishes only on those.
    await node.wait("peer-subscribe", topic="weather")

    python.subscribe("traffic", Inbox())  # a topic that starts later is announced too
    await node.wait("peer-subscribe", topic="traffic")
    assert not node.of("error") and not node.of("close")


@pytest_twisted.ensureDeferred
async def test_ubre_js_receives_publishes_from_a_python_and_a_websmq_client(spawn, broker):
    node = await ubre_js_client(spawn, broker, "sub news")
    await broker.subscribed("news")
    python = await broker.client()
    websmq_client = await wait_for(websmq.connect(reactor, broker.websmq_url))
    try:
        await python.publish("news", {"title": "héllo", "tags": ["a", 1, None]})
        await node.wait("publish", topic="news")
        await websmq_client.publish("news", b'{"from": "websmq"}')
        # Not UTF-8, so it goes as a binary-format message in a binary frame, which ubre.js
        # ignores: it must not lose the connection for it.
        await websmq_client.publish("news", b"\xff\x00 not text")
        await websmq_client.publish("news", b"plain text")
        await node.wait("publish", 3, topic="news")
        assert node.bodies("publish") == [
            {"title": "héllo", "tags": ["a", 1, None]},
            {"from": "websmq"},  # a WEBSMQ payload that is JSON text arrives as that JSON
            "plain text",  # other UTF-8 as a JSON string
        ]

        node.command("unsub news")
        await eventually(lambda: not broker.hub.subscribers("news"))
        await python.publish("news", "after unsubscribe")
        node.command("sub sports")
        await broker.subscribed("sports")
        await python.publish("sports", 1)
        await node.wait("publish", topic="sports")
        # In order on one connection: had "news" still reached ubre.js, it would be here by now.
        assert node.bodies("publish")[3:] == [1]
    finally:
        await wait_for(websmq_client.disconnect())


@pytest_twisted.ensureDeferred
async def test_ubre_js_publish_reaches_a_python_subscriber_and_another_ubre_js(spawn, broker):
    sender = await ubre_js_client(spawn, broker, "sub chat")
    other = await ubre_js_client(spawn, broker, "sub chat")
    python = await broker.client()
    inbox = Inbox()
    python.subscribe("chat", inbox)
    await broker.subscribed("chat", 3)
    await sender.wait("peer-subscribe", topic="chat")  # so ubre.js will publish on "chat"

    sender.command('pub chat {"text":"hi from ubre.js","n":1}')
    assert await inbox.wait() == [Publish("chat", {"text": "hi from ubre.js", "n": 1})]
    await other.wait("publish", topic="chat")
    assert other.bodies("publish") == [{"text": "hi from ubre.js", "n": 1}]

    await python.publish("chat", {"n": 2})
    await other.wait("publish", 2)
    await sender.wait("publish")
    # The broker never echoes a publish to its sender: ubre.js got {"n": 2} only.
    assert sender.bodies("publish") == [{"n": 2}]
    assert len(inbox.messages) == 1


@pytest_twisted.ensureDeferred
async def test_ubre_js_requests_succeed_fail_with_not_found_and_with_the_error(spawn, broker):
    broker.ubre.handle("add", lambda body, peer: sum(body))

    @broker.ubre.handle("shout")
    async def shout(body: str, peer: UbreServerProtocol) -> str:
        await sleep(0.01)
        return body.upper() + "!"

    def divide(body: dict, peer: UbreServerProtocol) -> float:
        return body["a"] / body["b"]

    def refuse(body: Any, peer: UbreServerProtocol) -> None:
        raise RequestFailed({"reason": "closed on Sundays", "retry": False})

    broker.ubre.handle({"divide": divide, "refuse": refuse})
    node = await ubre_js_client(spawn, broker)
    for line in ("req add [1,2,39]", 'req shout "hello"', "req nowhere {}",
                 'req divide {"a":1,"b":0}', "req refuse"):
        node.command(line)

    # ubre.js numbers its ids 1, 2, ...: a reply it takes carries the id back as a JSON number.
    assert (await node.wait("success", request="add"))[0]["body"] == 42
    assert (await node.wait("success", request="shout"))[0]["body"] == "HELLO!"
    assert (await node.wait("fail", request="nowhere"))[0]["body"] == "NotFound"
    assert (await node.wait("fail", request="divide"))[0]["body"] == {
        "name": "ZeroDivisionError", "message": "division by zero",
    }
    assert (await node.wait("fail", request="refuse"))[0]["body"] == {
        "reason": "closed on Sundays", "retry": False,
    }
    assert len(node.of("success")) == 2 and len(node.of("fail")) == 3


@pytest_twisted.ensureDeferred
async def test_ubre_js_answers_the_servers_requests(spawn, broker):
    asked: list[defer.Deferred] = []
    # A request from the on_connect hook: the handlers exist before ubre.js connects.
    broker.ubre.on_connect = lambda peer: asked.append(peer.request("hello", {"from": "python"}))
    node = await ubre_js_client(
        spawn, broker, "handle hello", "handle-async later", "handle-throw broken"
    )
    await eventually(lambda: asked)
    assert await wait_for(asked[0]) == {"handled": {"from": "python"}}

    peer = next(iter(broker.ubre.peers))
    # ubre.js drops the spec's id-only form without a word: only our timeout ends it.
    spec_form = peer.request(None, "anyone?", timeout=0.5)
    assert await wait_for(peer.request("later", [1, "two", None])) == {
        "handled": [1, "two", None]
    }
    assert await wait_for(peer.request("hello")) == {}  # no body: ubre.js gets undefined

    failure = await failure_of(peer.request("broken", {"x": 1}))
    assert isinstance(failure, RequestFailed)
    # ubre.js's unwrapError: the error's name, message and stack.
    assert failure.body["name"] == "TypeError"
    assert failure.body["message"] == 'cannot handle {"x":1}'
    assert "TypeError" in failure.body["stack"]

    missing = await failure_of(peer.request("nobody-handles-this", 1))
    assert isinstance(missing, RequestFailed) and missing.body == "NotFound"
    assert node.bodies("handling") == [{"from": "python"}, [1, "two", None], None, {"x": 1}]
    assert isinstance(await failure_of(spec_form), RequestTimeout)
    assert not node.of("close")


@pytest_twisted.ensureDeferred
async def test_subscribe_bodies_and_topic_hooks_from_ubre_js(spawn, broker):
    calls: list[tuple[Any, ...]] = []
    broker.ubre.on_subscribe = lambda topic, body, peer: calls.append(("subscribe", topic, body))
    broker.ubre.on_unsubscribe = (
        lambda topic, body, peer: calls.append(("unsubscribe", topic, body))
    )
    broker.ubre.on_topic_start = lambda topic: calls.append(("start", topic))
    broker.ubre.on_topic_end = lambda topic: calls.append(("end", topic))
    node = await ubre_js_client(spawn, broker)

    node.command('sub prices {"since":1700000000,"currency":"EUR"}')
    node.command("sub bare")
    await broker.subscribed("bare")
    node.command("unsub prices")
    await eventually(lambda: not broker.hub.subscribers("prices"))
    assert calls == [
        ("start", "prices"),
        ("subscribe", "prices", {"since": 1700000000, "currency": "EUR"}),
        ("start", "bare"),
        ("subscribe", "bare", None),  # no body at all
        ("end", "prices"),
        # ubre.js sends the subscribe's body again with its unsubscribe.
        ("unsubscribe", "prices", {"since": 1700000000, "currency": "EUR"}),
    ]
    # The broker told ubre.js as topics came and went.
    await node.wait("peer-unsubscribe", topic="prices")
    assert [e["topic"] for e in node.of("peer-subscribe")] == ["prices", "bare"]


# -- wireproto client, ubre.js peer server ---------------------------------------------------


@pytest_twisted.async_yield_fixture
async def js_server(spawn: Spawn) -> AsyncIterator[tuple[NodePeer, str]]:
    node = await spawn(SERVER, ready="listening")
    yield node, f"ws://127.0.0.1:{node.of('listening')[0]['port']}/ubre"


@pytest_twisted.async_yield_fixture
async def client_of_js(js_server) -> AsyncIterator[tuple[NodePeer, UbreClient]]:
    node, url = js_server
    client = UbreClient(reactor, url)
    await wait_for(client.connect())
    try:
        await node.wait("connection")
        yield node, client
    finally:
        await wait_for(client.close())


@pytest_twisted.ensureDeferred
async def test_python_requests_to_a_ubre_js_server(client_of_js):
    node, client = client_of_js
    assert await wait_for(client.request("echo", {"n": [1, 2]})) == {"echo": {"n": [1, 2]}}
    assert await wait_for(client.request("later", "soon")) == {"echo": "soon"}

    missing = await failure_of(client.request("nowhere", 1))
    assert isinstance(missing, RequestFailed) and missing.body == "NotFound"
    thrown = await failure_of(client.request("throws", [3]))
    assert isinstance(thrown, RequestFailed)
    assert thrown.body["name"] == "RangeError"
    assert thrown.body["message"] == "out of range: [3]"
    assert "RangeError: out of range" in str(thrown)


@pytest_twisted.ensureDeferred
async def test_python_requests_ubre_js_never_answers_time_out(client_of_js):
    node, client = client_of_js
    # ubre.js drops the spec's id-only form without a word; "never" is a promise that never
    # settles. ubre.js has no timeouts: wireproto's client does.
    spec_form = client.request(None, "anyone?", timeout=0.5)
    unsettled = client.request("never", {}, timeout=0.5)
    assert isinstance(await failure_of(spec_form), RequestTimeout)
    assert isinstance(await failure_of(unsettled), RequestTimeout)
    assert node.bodies("handling", request="never") == [{}]
    # Both are forgotten, and the connection carries on.
    assert await wait_for(client.request("echo", 1)) == {"echo": 1}


@pytest_twisted.ensureDeferred
async def test_a_pending_request_fails_when_the_ubre_js_server_goes(client_of_js):
    node, client = client_of_js
    pending = client.request("never", None, timeout=None)
    await node.wait("handling", request="never")
    await node.stop()
    assert isinstance(await failure_of(pending), ConnectionClosed)


@pytest_twisted.ensureDeferred
async def test_python_subscriber_gets_a_ubre_js_servers_publishes(client_of_js):
    node, client = client_of_js
    inbox = Inbox()
    client.subscribe("ticks", inbox)
    await node.wait("subscribe", topic="ticks")
    node.command('pub ticks {"n":1}')
    node.command("pub elsewhere 2")  # nobody subscribed: ubre.js sends nothing
    node.command("pub ticks")
    assert await inbox.wait(2) == [Publish("ticks", {"n": 1}), Publish("ticks", None)]

    client.unsubscribe("ticks")
    await node.wait("unsubscribe", topic="ticks")
    node.command('pub ticks "gone"')
    assert await wait_for(client.request("echo", 0)) == {"echo": 0}  # a round trip after it
    assert len(inbox.messages) == 2


@pytest_twisted.ensureDeferred
async def test_python_client_answers_a_ubre_js_servers_requests(client_of_js):
    node, client = client_of_js
    client.handle("double", lambda body, me: body * 2)

    @client.handle("greet")
    async def greet(body: dict, me: UbreClient) -> str:
        await sleep(0.01)
        return f"hello {body['name']}"

    def broken(body: Any, me: UbreClient) -> None:
        raise KeyError("no such thing")

    client.handle("broken", broken)
    node.command("req double 21")
    node.command('req greet {"name":"ubre.js"}')
    node.command("req broken")
    node.command("req unknown []")
    assert (await node.wait("success", request="double"))[0]["body"] == 42
    assert (await node.wait("success", request="greet"))[0]["body"] == "hello ubre.js"
    assert (await node.wait("fail", request="broken"))[0]["body"] == {
        "name": "KeyError", "message": "'no such thing'",
    }
    assert (await node.wait("fail", request="unknown"))[0]["body"] == "NotFound"


@pytest_twisted.ensureDeferred
async def test_python_publishes_to_a_topic_the_ubre_js_server_subscribed(client_of_js):
    node, client = client_of_js
    announced: list[tuple[str, Any]] = []
    client.on_subscribe = lambda topic, body: announced.append((topic, body))
    node.command("sub to-server")
    await eventually(lambda: "to-server" in client.server_topics)
    assert announced == [("to-server", None)]
    await client.publish("to-server", {"from": "wireproto"})
    await client.publish("to-server")
    await node.wait("publish", 2, topic="to-server")
    assert node.bodies("publish") == [{"from": "wireproto"}, None]
