"""nydus with the real peers: the unmodified nydus-client 5.3.1 (over engine.io-client 6) against
wireproto's server, with its default transports (long-polling, then the upgrade) and with WebSocket
only; and wireproto's client against the real nydus 5.3.2 server (over engine.io 6)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, task
from twisted.internet.endpoints import TCP4ServerEndpoint

from tests.node_peer import NodePeer, NodePeers
from tests.support import eventually, failure_of, need_interop_peer, wait_for
from wireproto.hub import Hub
from wireproto.protocols import websmq
from wireproto.protocols.nydus.client import NydusClient
from wireproto.protocols.nydus.server import Invocation, InvokeError, NydusServer
from wireproto.protocols.rpc import ConnectionClosed
from wireproto.transports.engineio import EngineIOOptions, engineio_resource
from wireproto.transports.websocket_http import websocket_resource, websocket_site

INTEROP = Path(__file__).resolve().parents[1] / "interop"
CLIENT = INTEROP / "nydus_client.mjs"
SERVER = INTEROP / "nydus_server.mjs"
# nydus-client's default transports (long-polling, then the upgrade), WebSocket only, polling only
MODES = ["default", "websocket", "polling"]

Spawn = Callable[..., Awaitable[NodePeer]]


@pytest.fixture
def node_executable() -> str:
    need_interop_peer(INTEROP / "node_modules" / "nydus", "the nydus server")
    return need_interop_peer(INTEROP / "node_modules" / "nydus-client", "nydus-client")


@pytest_twisted.async_yield_fixture
async def spawn(node_executable: str) -> AsyncIterator[Spawn]:
    """Start Node scripts; every one is killed when the test ends, however it ends."""
    peers = NodePeers(node_executable)
    try:
        yield peers.start
    finally:
        await peers.stop()


class Broker:
    """wireproto's NydusServer on a hub, at http://127.0.0.1:PORT/engine.io/, beside a WEBSMQ
    server at /websmq on the same port, with these routes:

    /echo/:what        {"what": ..., "body": ...}
    /calm              InvokeError(420, "Enhance your calm", {"retry": True})
    /subscribe/:topic  subscribes the caller to /news/:topic with initial data, answers
                       "subscribed"; /subscribe-later/:topic does it with a Deferred
    """

    def __init__(self, **engineio_options: Any) -> None:
        self.hub = Hub()
        self.nydus = NydusServer(self.hub)
        self.nydus.register_route("/echo/:what", self.echo)
        self.nydus.register_route("/calm", self.calm)
        self.nydus.register_route("/subscribe/:topic", self.subscribe)
        self.nydus.register_route("/subscribe-later/:topic", self.subscribe_later)
        self.parser_errors: list[bytes] = []
        self.nydus.on_parser_error = lambda client, raw: self.parser_errors.append(raw)
        options = EngineIOOptions(ping_interval=0.5, ping_timeout=0.5, **engineio_options)
        self.site = websocket_site({
            "/engine.io/": engineio_resource(self.nydus, options),
            "/websmq": websocket_resource(websmq.server_factory(self.hub)),
        })

    @staticmethod
    def echo(call: Invocation) -> Any:
        return {"what": call.params["what"], "body": call.body}

    @staticmethod
    async def calm(call: Invocation) -> Any:
        raise InvokeError(420, "Enhance your calm", {"retry": True})

    def subscribe(self, call: Invocation) -> str:
        topic = call.params["topic"]
        self.nydus.subscribe_client(call.client, f"/news/{topic}", {"initial": topic})
        return "subscribed"

    def subscribe_later(self, call: Invocation) -> str:
        topic = call.params["topic"]
        later = task.deferLater(reactor, 0.05, lambda: {"later": topic})
        self.nydus.subscribe_client(call.client, f"/news/{topic}", later)
        return "subscribed"

    async def start(self) -> Broker:
        endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
        self.port = await wait_for(endpoint.listen(self.site))
        number = self.port.getHost().port
        self.url = f"http://127.0.0.1:{number}"
        self.websmq_url = f"ws://127.0.0.1:{number}/websmq"
        return self

    async def stop(self) -> None:
        await wait_for(defer.maybeDeferred(self.port.stopListening))
        for client in tuple(self.nydus.clients.values()):
            client.transport.abortConnection()
        await eventually(lambda: not self.nydus.clients)
        self.nydus.close()


@pytest_twisted.async_yield_fixture
async def broker() -> AsyncIterator[Broker]:
    running = await Broker().start()
    try:
        yield running
    finally:
        await running.stop()


async def nydus_client(spawn: Spawn, broker: Broker, mode: str) -> NodePeer:
    node = await spawn(CLIENT, broker.url, mode, ready="connect")
    first = "websocket" if mode == "websocket" else "polling"
    assert node.of("connect") == [{"event": "connect", "transport": first}]
    if mode == "default":
        await node.wait("upgrade", transport="websocket")
    return node


# -- the real nydus-client, wireproto's server ----------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest_twisted.ensureDeferred
async def test_nydus_client_invokes(spawn: Spawn, broker: Broker, mode: str) -> None:
    node = await nydus_client(spawn, broker, mode)
    node.command('invoke a /echo/x%20y {"n":[1,2]}')
    node.command("invoke b /calm")
    node.command("invoke c /nowhere")
    node.command("invoke d /echo/z")
    (result,) = await node.wait("result", id="a")
    assert result["data"] == {"what": "x y", "body": {"n": [1, 2]}}
    (calm,) = await node.wait("error", id="b")
    assert (calm["status"], calm["message"], calm["body"]) == (
        420, "Enhance your calm", {"retry": True}
    )
    (missing,) = await node.wait("error", id="c")
    assert (missing["status"], missing["message"]) == (404, "Not Found")
    (no_body,) = await node.wait("result", id="d")
    assert no_body["data"] == {"what": "z", "body": None}


@pytest.mark.parametrize("mode", MODES)
@pytest_twisted.ensureDeferred
async def test_nydus_client_gets_initial_data_and_later_publishes(
    spawn: Spawn, broker: Broker, mode: str
) -> None:
    node = await nydus_client(spawn, broker, mode)
    node.command("invoke a /subscribe/weather")
    node.command("invoke b /subscribe-later/sports")
    await node.wait("result", id="a")
    await node.wait("result", id="b")
    (initial,) = await node.wait("publish", data={"initial": "weather"})
    # Route params come out on the client side, by nydus-client's own router.
    assert initial["route"] == "/news/:topic" and initial["params"] == {"topic": "weather"}
    await node.wait("publish", data={"later": "sports"})

    broker.nydus.publish("/news/weather", {"temp": 21.5})
    (later,) = await node.wait("publish", data={"temp": 21.5})
    assert later["params"] == {"topic": "weather"}

    # Hub topics: a WEBSMQ publish on news/weather reaches the nydus subscriber of /news/weather.
    publisher = await wait_for(websmq.connect(reactor, broker.websmq_url))
    try:
        await publisher.publish("news/weather", b'{"from":"websmq"}')
        await node.wait("publish", data={"from": "websmq"})
    finally:
        await wait_for(publisher.disconnect())
    assert node.of("unhandled") == []


@pytest.mark.parametrize("mode", MODES)
@pytest_twisted.ensureDeferred
async def test_a_parser_error_closes_that_connection_and_the_server_carries_on(
    spawn: Spawn, broker: Broker, mode: str
) -> None:
    calm = await nydus_client(spawn, broker, mode)
    doomed = await nydus_client(spawn, broker, mode)
    # An INVOKE whose path has a malformed escape, sent raw on nydus-client's own connection: the
    # real server crashes on it; ours closes that one connection.
    doomed.command("raw 1$a~/echo/%ZZ|1")
    await doomed.wait("disconnect")
    await eventually(lambda: broker.parser_errors)
    assert b"%ZZ" in broker.parser_errors[0]
    calm.command("invoke b /echo/still-here")
    (result,) = await calm.wait("result", id="b")
    assert result["data"]["what"] == "still-here"


@pytest.mark.parametrize("mode", MODES)
@pytest_twisted.ensureDeferred
async def test_nydus_client_stays_connected_across_pings(
    spawn: Spawn, broker: Broker, mode: str
) -> None:
    node = await nydus_client(spawn, broker, mode)
    await task.deferLater(reactor, 2.0, lambda: None)  # four ping intervals of 0.5 s
    node.command("invoke a /echo/alive")
    await node.wait("result", id="a")
    assert node.of("disconnect") == []


@pytest_twisted.ensureDeferred
async def test_a_refused_handshake_is_unauthorized_to_nydus_client(spawn: Spawn) -> None:
    asked: list[Any] = []

    def refuse(request: Any) -> bool:
        asked.append(request)
        return False

    broker = await Broker(allow_request=refuse).start()
    try:
        node = await spawn(CLIENT, broker.url, "default", ready="unauthorized")
        assert node.of("connect") == [] and asked
    finally:
        await broker.stop()


# -- wireproto's client, the real nydus server ----------------------------------------------------


@pytest_twisted.async_yield_fixture
async def real_server(spawn: Spawn) -> AsyncIterator[tuple[NodePeer, str]]:
    node = await spawn(SERVER, ready="listening")
    (listening,) = node.of("listening")
    yield node, f"http://127.0.0.1:{listening['port']}"


@pytest_twisted.ensureDeferred
async def test_our_client_against_the_real_server(real_server: tuple[NodePeer, str]) -> None:
    node, url = real_server
    client = NydusClient(reactor, url)
    published: list[tuple[dict[str, Any], Any]] = []
    client.register_route(
        "/news/:topic", lambda match, data: published.append((dict(match.params), data))
    )
    await wait_for(client.connect())
    try:
        await node.wait("connection")
        assert await wait_for(client.invoke("/echo/a b", {"n": 1})) == {
            "what": "a b", "body": {"n": 1}
        }
        calm = await failure_of(client.invoke("/calm"))
        assert isinstance(calm, InvokeError)
        assert (calm.status, calm.message, calm.body) == (420, "Enhance your calm", {"retry": True})
        missing = await failure_of(client.invoke("/nowhere"))
        assert isinstance(missing, InvokeError) and missing.status == 404
        assert missing.message == "Not Found"

        assert await wait_for(client.invoke("/subscribe/weather")) == "subscribed"
        await eventually(lambda: published)
        assert published == [({"topic": "weather"}, {"initial": "weather"})]
        node.command('pub /news/weather {"temp":21.5}')
        await eventually(lambda: len(published) == 2)
        assert published[1] == ({"topic": "weather"}, {"temp": 21.5})
    finally:
        await wait_for(client.close())
    await node.wait("disconnect")  # a clean close: the server sees the client go
    assert node.of("error") == []


@pytest_twisted.ensureDeferred
async def test_our_client_outlives_the_real_servers_pings_and_sees_it_close(
    real_server: tuple[NodePeer, str],
) -> None:
    node, url = real_server
    client = NydusClient(reactor, url)
    lost: list[Any] = []
    client.on_disconnect = lost.append
    await wait_for(client.connect())
    try:
        # The real server pings every second and gives up after one more without a pong.
        await task.deferLater(reactor, 2.5, lambda: None)
        assert client.connected and not lost
        pending = client.invoke("/echo/x")
        assert await wait_for(pending) == {"what": "x"}  # no data: undefined, in JavaScript
        node.command("close")
        await eventually(lambda: lost)
        assert isinstance(await failure_of(client.invoke("/echo/y")), ConnectionClosed)
    finally:
        await wait_for(client.close())


# -- the real nydus-client, `wireproto serve` -----------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_nydus_client_reaches_wireproto_serve(spawn: Spawn) -> None:
    """A stock nydus-client against the broker as a user starts it: the address it prints."""
    from tests.test_cli import LISTENER_LINE, Child

    child = Child(sys.executable, "-m", "wireproto", "serve",
                  "--listen", "nydus+engineio@tcp:0:interface=127.0.0.1")
    try:
        listening = await child.line(LISTENER_LINE)
        assert listening.group(1, 2) == ("nydus", "engineio")
        url = listening.group(3)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/engine.io/")
        node = await spawn(CLIENT, url.removesuffix("/engine.io/"), "default", ready="connect")
        node.command("invoke a /anything")  # no routes: the broker alone answers 404
        (missing,) = await node.wait("error", id="a")
        assert (missing["status"], missing["message"]) == (404, "Not Found")
        await node.wait("upgrade", transport="websocket")
    finally:
        child.kill()
