"""The UBRE client role against wireproto's own UBRE server, on real sockets.

Each route is a transport and a format: WebSocket (JSON, or binary=True), TCP with the lines
framing (the JSON default for tcp: addresses), TCP with length32 (the binary=True default), and a
unix socket (lines). Reconnection tests stop a server and start a new one on the same port.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ServerEndpoint, UNIXServerEndpoint
from twisted.internet.error import ConnectionRefusedError
from twisted.python.failure import Failure

from tests.support import Inbox, eventually, failure_of, free_port, sleep, wait_for
from wireproto.codecs.ubre import Publish
from wireproto.errors import FrameTooLarge, InvalidField
from wireproto.hub import Hub
from wireproto.protocols.rpc import ConnectionClosed, RequestFailed, RequestTimeout
from wireproto.protocols.ubre.client import OfflineQueueFull, UbreClient
from wireproto.protocols.ubre.server import UbreServer, UbreServerProtocol
from wireproto.transports.stream import StreamOptions, stream_server_factory
from wireproto.transports.websocket_http import websocket_resource, websocket_site

# Retry quickly, so a test waits for a reconnection a few hundredths of a second.
FAST_RETRY: Callable[[int], float] = lambda attempt: 0.05  # noqa: E731

# route -> (listener kind, UbreClient options)
ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "ws-json": ("ws", {}),
    "ws-binary": ("ws", {"binary": True}),
    "lines": ("lines", {}),
    "length32-binary": ("length32", {"binary": True}),
    "length32-json": ("length32", {"framing": "length32"}),
    "unix": ("unix", {}),
}
JSON_ROUTES = [route for route, (_, options) in ROUTES.items() if not options.get("binary")]
BINARY_ROUTES = [route for route, (_, options) in ROUTES.items() if options.get("binary")]


class Server:
    """A hub and its UbreServer, listening on any of ws, lines, length32 (127.0.0.1) and unix.

    Its `echo` handler and its default handler answer with the body they got. Clients made
    with `client()` are closed by `stop()`.
    """

    def __init__(self, socket_dir: Path | None = None) -> None:
        self.hub = Hub()
        self.ubre = UbreServer(self.hub)
        self.ubre.handle("echo", lambda body, peer: body)
        self.ubre.default_handler = lambda body, peer: body
        self.socket_dir = socket_dir
        self.ports: dict[str, Any] = {}
        self.addresses: dict[str, str] = {}
        self.clients: list[UbreClient] = []

    def factory(self, kind: str) -> Any:
        if kind == "ws":
            return websocket_site({"/ubre": websocket_resource(self.ubre)})
        framing = "length32" if kind == "length32" else "lines"
        return stream_server_factory(self.ubre, StreamOptions(framing=framing))

    async def listen(self, kind: str, port: int = 0) -> Server:
        if kind == "unix":
            path = str(self.socket_dir / "ubre.sock")
            endpoint: Any = UNIXServerEndpoint(reactor, path)
        else:
            endpoint = TCP4ServerEndpoint(reactor, port, interface="127.0.0.1")
        listening = await wait_for(endpoint.listen(self.factory(kind)))
        self.ports[kind] = listening
        if kind == "unix":
            self.addresses[kind] = f"unix:path={path}"
        else:
            number = listening.getHost().port
            self.addresses[kind] = (
                f"ws://127.0.0.1:{number}/ubre" if kind == "ws"
                else f"tcp:host=127.0.0.1:port={number}"
            )
        return self

    def port(self, kind: str) -> int:
        return self.ports[kind].getHost().port

    def make_client(self, route: str, **options: Any) -> UbreClient:
        """A client for `route`, not connected yet."""
        kind, route_options = ROUTES[route]
        client = UbreClient(reactor, self.addresses[kind], **route_options, **options)
        self.clients.append(client)
        return client

    async def client(self, route: str, **options: Any) -> UbreClient:
        client = self.make_client(route, **options)
        await wait_for(client.connect())
        return client

    async def peer(self) -> UbreServerProtocol:
        """The one connected client's side on the server."""
        await eventually(lambda: len(self.ubre.peers) == 1)
        return next(iter(self.ubre.peers))

    async def subscribed(self, topic: str, count: int = 1) -> None:
        """Wait until `count` connections subscribe to `topic` (UBRE has no acknowledgement)."""
        await eventually(lambda: len(self.hub.subscribers(topic)) >= count)

    async def drop(self) -> None:
        """Stop listening and abort every connection, as a server that goes down."""
        for listening in self.ports.values():
            await wait_for(defer.maybeDeferred(listening.stopListening))
        self.ports.clear()
        for peer in tuple(self.ubre.peers):
            peer.transport.abortConnection()
        await eventually(lambda: not self.ubre.peers)

    async def stop(self) -> None:
        for client in self.clients:
            await wait_for(client.close())
        await self.drop()
        self.ubre.close()


@pytest.fixture
def socket_dir():
    # A short path: a unix socket path must fit in about 100 bytes.
    path = Path(tempfile.mkdtemp(prefix="ubre"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest_twisted.async_yield_fixture
async def server(socket_dir):
    running = Server(socket_dir)
    try:
        for kind in ("ws", "lines", "length32", "unix"):
            await running.listen(kind)
        yield running
    finally:
        await running.stop()




def as_sent(client: UbreClient, value: Any) -> Any:
    """`value` as the server's hooks and handlers see it from `client`: binary-format bodies are
    bytes, and anything but bytes goes as its compact JSON text."""
    if not client.binary or isinstance(value, bytes):
        return value
    return json.dumps(value, separators=(",", ":")).encode()




async def barrier(client: UbreClient) -> None:
    """A request round trip: the server has read everything the client sent before it."""
    await wait_for(client.request(None, b"ping" if client.binary else "ping", timeout=5))


async def barrier_sent(server: Server, client: UbreClient) -> None:
    """Wait until the server has started answering the client's requests."""
    await eventually(lambda: any(peer._answering for peer in server.ubre.peers))


# -- pub/sub ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
@pytest_twisted.ensureDeferred
async def test_a_subscriber_callback_gets_each_publish_with_its_body_decoded(server, route):
    client = await server.client(route)
    inbox = Inbox()
    client.subscribe("news", inbox)
    await server.subscribed("news")
    assert server.ubre.publish("news", {"title": "hello"}) == 1
    assert server.ubre.publish("news") == 1  # no body at all
    assert server.ubre.publish("news", b"\x00\xff") == 1  # bytes JSON cannot carry as text
    lines_framing = route in ("lines", "unix")
    messages = await inbox.wait(2 if lines_framing else 3)
    if client.binary:
        assert messages == [
            Publish("news", b'{"title":"hello"}'),
            Publish("news", b""),
            Publish("news", b"\x00\xff"),
        ]
    elif not lines_framing:
        # Bytes JSON cannot carry come as a binary-format message (in a binary frame on ws).
        assert messages == [
            Publish("news", {"title": "hello"}), Publish("news", None), Publish("news", b"\x00\xff")
        ]
    else:
        await barrier(client)  # on lines framing such bytes are skipped: nothing more comes
        assert messages == [Publish("news", {"title": "hello"}), Publish("news", None)]


@pytest.mark.parametrize("route", ROUTES)
@pytest_twisted.ensureDeferred
async def test_a_publish_reaches_the_other_clients_and_not_its_sender(server, route):
    publisher = await server.client(route)
    json_subscriber = await server.client("ws-json")
    binary_subscriber = await server.client("length32-binary")
    inboxes = {name: Inbox() for name in ("publisher", "json", "binary")}
    publisher.subscribe("temps", inboxes["publisher"])
    json_subscriber.subscribe("temps", inboxes["json"])
    binary_subscriber.subscribe("temps", inboxes["binary"])
    await server.subscribed("temps", 3)
    assert await wait_for(publisher.publish("temps", as_sent(publisher, {"c": 21.5}))) is None
    assert await inboxes["json"].wait() == [Publish("temps", {"c": 21.5})]
    assert await inboxes["binary"].wait() == [Publish("temps", b'{"c":21.5}')]
    await barrier(publisher)
    assert inboxes["publisher"].messages == []


@pytest.mark.parametrize("route", ROUTES)
@pytest_twisted.ensureDeferred
async def test_the_subscribe_body_reaches_the_servers_on_subscribe_hook(server, route):
    seen: list[tuple[str, Any, Any]] = []
    server.ubre.on_subscribe = lambda topic, body, peer: seen.append((topic, body, peer))
    client = await server.client(route)
    client.subscribe("with", body={"since": 5})
    client.subscribe("without")
    await eventually(lambda: len(seen) == 2)
    peer = await server.peer()
    assert seen == [
        ("with", as_sent(client, {"since": 5}), peer),
        ("without", b"" if client.binary else None, peer),
    ]


@pytest.mark.parametrize("route", ["ws-json", "length32-binary", "lines"])
@pytest_twisted.ensureDeferred
async def test_cancel_unsubscribes_only_when_the_topics_last_callback_goes(server, route):
    unsubscribed: list[tuple[str, Any]] = []
    server.ubre.on_unsubscribe = lambda topic, body, peer: unsubscribed.append((topic, body))
    client = await server.client(route)
    first, second = Inbox(), Inbox()
    first_subscription = client.subscribe("t", first)
    second_subscription = client.subscribe("t", second)
    await server.subscribed("t")

    first_subscription.cancel()
    await barrier(client)
    assert unsubscribed == []
    assert server.ubre.publish("t", "one") == 1
    await second.wait()
    assert first.messages == []

    second_subscription.cancel()
    await eventually(lambda: unsubscribed)
    assert unsubscribed == [("t", b"" if client.binary else None)]
    assert server.hub.subscribers("t") == ()
    # Cancelling again changes nothing.
    first_subscription.cancel()
    second_subscription.unsubscribe()
    await barrier(client)
    assert len(unsubscribed) == 1


@pytest.mark.parametrize("route", ["ws-json", "ws-binary", "unix"])
@pytest_twisted.ensureDeferred
async def test_unsubscribe_drops_every_callback_on_the_topic_and_carries_its_body(server, route):
    unsubscribed: list[tuple[str, Any]] = []
    server.ubre.on_unsubscribe = lambda topic, body, peer: unsubscribed.append((topic, body))
    client = await server.client(route)
    first, second, other = Inbox(), Inbox(), Inbox()
    client.subscribe("t", first)
    client.subscribe("t", second)
    client.subscribe("other", other)
    await server.subscribed("t")
    await server.subscribed("other")
    client.unsubscribe("t", body={"why": "done"})
    await eventually(lambda: unsubscribed)
    assert unsubscribed == [("t", as_sent(client, {"why": "done"}))]
    assert server.ubre.publish("t", 1) == 0
    assert server.ubre.publish("other", 2) == 1
    await other.wait()
    assert first.messages == second.messages == []


@pytest_twisted.ensureDeferred
async def test_a_subscription_without_a_callback_still_subscribes(server):
    client = await server.client("lines")
    client.subscribe("quiet")
    await server.subscribed("quiet")
    assert server.ubre.publish("quiet", 1) == 1
    await barrier(client)


@pytest_twisted.ensureDeferred
async def test_a_raising_callback_does_not_stop_the_others(server):
    client = await server.client("ws-json")
    inbox = Inbox()
    client.subscribe("t", lambda message: 1 / 0)
    client.subscribe("t", inbox)
    await server.subscribed("t")
    server.ubre.publish("t", 1)
    server.ubre.publish("t", 2)
    assert [m.body for m in await inbox.wait(2)] == [1, 2]
    assert client.connected


# -- requests --------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", JSON_ROUTES)
@pytest_twisted.ensureDeferred
async def test_json_requests_succeed_or_fail_with_the_fail_body(server, route):
    async def add(body: list[int], peer: Any) -> int:
        await sleep(0.01)
        return sum(body)

    def divide(body: list[int], peer: Any) -> float:
        return body[0] / body[1]

    server.ubre.handle("add", add)
    server.ubre.handle("divide", divide)
    client = await server.client(route)

    assert await wait_for(client.request("add", [1, 2], timeout=5)) == 3
    # The spec's form carries no name: the server's default handler answers it.
    assert await wait_for(client.request(None, {"x": [1]}, timeout=5)) == {"x": [1]}
    assert await wait_for(client.request("echo", timeout=5)) is None

    not_found = await failure_of(client.request("nope", [1], timeout=5))
    assert isinstance(not_found, RequestFailed)
    assert not_found.body == "NotFound"

    raised = await failure_of(client.request("divide", [1, 0], timeout=5))
    assert isinstance(raised, RequestFailed)
    assert raised.body == {"name": "ZeroDivisionError", "message": "division by zero"}
    assert "ZeroDivisionError: division by zero" in str(raised)

    index_error = await failure_of(client.request("divide", [1], timeout=5))
    assert index_error.body == {"name": "IndexError", "message": "list index out of range"}


@pytest.mark.parametrize("route", BINARY_ROUTES)
@pytest_twisted.ensureDeferred
async def test_binary_requests_go_to_the_default_handler(server, route):
    calls: list[Any] = []

    def upper(body: bytes, peer: Any) -> bytes:
        calls.append(body)
        if body == b"boom":
            raise RequestFailed(b"chosen by the handler")
        return body.upper()

    server.ubre.default_handler = upper
    client = await server.client(route)
    assert await wait_for(client.request(None, b"abc", timeout=5)) == b"ABC"
    assert calls == [b"abc"]
    failed = await failure_of(client.request(None, b"boom", timeout=5))
    assert isinstance(failed, RequestFailed)
    assert failed.body == b"chosen by the handler"
    # The binary format has no handler names.
    with pytest.raises(ValueError, match="name=None"):
        client.request("upper", b"abc")


@pytest.mark.parametrize("route", BINARY_ROUTES)
@pytest_twisted.ensureDeferred
async def test_binary_requests_fail_with_not_found_and_a_raising_handlers_error(server, route):
    server.ubre.default_handler = None
    client = await server.client(route)
    not_found = await failure_of(client.request(None, b"x", timeout=5))
    assert isinstance(not_found, RequestFailed)
    assert not_found.body == b"NotFound"

    server.ubre.default_handler = lambda body, peer: {}[body]
    raised = await failure_of(client.request(None, b"key", timeout=5))
    assert isinstance(raised, RequestFailed)
    assert json.loads(raised.body) == {"name": "KeyError", "message": "b'key'"}


@pytest.mark.parametrize("route", ["ws-json", "ws-binary", "lines", "length32-binary"])
@pytest_twisted.ensureDeferred
async def test_a_request_with_no_reply_times_out(server, route):
    never: list[defer.Deferred] = []
    server.ubre.handle("never", lambda body, peer: never.append(defer.Deferred()) or never[-1])
    server.ubre.default_handler = server.ubre.handlers["never"]
    client = await server.client(route)
    name = None if client.binary else "never"
    timed_out = await failure_of(client.request(name, timeout=0.3))
    assert isinstance(timed_out, RequestTimeout)
    assert len(never) == 1
    # The connection is fine, and a late reply answers nothing.
    never[0].callback("late")
    server.ubre.default_handler = lambda body, peer: body
    await barrier(client)


@pytest_twisted.ensureDeferred
async def test_the_clients_request_timeout_is_the_default(server):
    server.ubre.handle("never", lambda body, peer: defer.Deferred())
    client = await server.client("lines", request_timeout=0.2)
    assert isinstance(await failure_of(client.request("never")), RequestTimeout)


@pytest.mark.parametrize("route", ["ws-json", "ws-binary", "lines", "length32-binary", "unix"])
@pytest_twisted.ensureDeferred
async def test_every_pending_request_fails_when_the_connection_closes(server, route):
    server.ubre.handle("never", lambda body, peer: defer.Deferred())
    server.ubre.default_handler = lambda body, peer: defer.Deferred()
    disconnects: list[Failure] = []
    client = await server.client(route)
    client.on_disconnect = disconnects.append
    name = None if client.binary else "never"
    pending = [client.request(name, timeout=None), client.request(name, timeout=None)]
    await barrier_sent(server, client)
    (await server.peer()).transport.abortConnection()
    for d in pending:
        assert isinstance(await failure_of(d), ConnectionClosed)
    assert len(disconnects) == 1
    assert not client.connected


@pytest_twisted.ensureDeferred
async def test_not_connected_without_reconnect_requests_and_publishes_fail(server):
    client = UbreClient(reactor, server.addresses["lines"])
    assert not client.connected
    assert isinstance(await failure_of(client.publish("t", 1)), ConnectionClosed)
    assert isinstance(await failure_of(client.request("echo", 1)), ConnectionClosed)

    server.clients.append(client)
    await wait_for(client.connect())
    assert await wait_for(client.request("echo", 1, timeout=5)) == 1
    await wait_for(client.close())
    assert not client.connected
    assert isinstance(await failure_of(client.publish("t", 1)), ConnectionClosed)
    assert isinstance(await failure_of(client.request("echo", 1)), ConnectionClosed)


@pytest_twisted.ensureDeferred
async def test_connect_without_reconnect_fails_when_nothing_listens():
    client = UbreClient(reactor, f"tcp:host=127.0.0.1:port={free_port()}")
    error = await failure_of(client.connect())
    assert isinstance(error, ConnectionRefusedError)
    assert not client.connected


@pytest.mark.parametrize("route", ["ws-json", "lines"])
@pytest_twisted.ensureDeferred
async def test_close_fails_pending_requests_and_fires_once_closed(server, route):
    server.ubre.handle("never", lambda body, peer: defer.Deferred())
    client = await server.client(route, reconnect=True, retry_policy=FAST_RETRY)
    pending = client.request("never", timeout=None)
    await barrier_sent(server, client)
    await wait_for(client.close())
    assert isinstance(await failure_of(pending), ConnectionClosed)
    await eventually(lambda: not server.ubre.peers)
    await sleep(0.2)  # several retry delays: closed means no reconnection
    assert not server.ubre.peers
    assert not client.connected


@pytest.mark.parametrize("route", ["ws-json", "lines"])
@pytest_twisted.ensureDeferred
async def test_close_straight_after_connecting_with_reconnect(server, route):
    # The connect() Deferred fires from connectionMade, before the connection attempt's own
    # Deferred: closing there once made Twisted refuse to stop connecting a made connection.
    client = server.make_client(route, reconnect=True, retry_policy=FAST_RETRY)
    await wait_for(client.connect())
    await wait_for(client.close())
    await eventually(lambda: not server.ubre.peers)
    assert not client.connected


@pytest.mark.parametrize("route", ["ws-json", "lines"])
@pytest_twisted.ensureDeferred
async def test_a_request_retried_when_its_connection_closed_waits_for_the_next(server, route):
    server.ubre.handle("never", lambda body, peer: defer.Deferred())
    hooks_seen: list[bool] = []
    client = server.make_client(route, reconnect=True, retry_policy=FAST_RETRY)
    client.on_disconnect = lambda reason: hooks_seen.append(client.connected)
    await wait_for(client.connect())
    pending = client.request("never", timeout=None)
    await barrier_sent(server, client)
    (await server.peer()).transport.abortConnection()
    assert isinstance(await failure_of(pending), ConnectionClosed)
    # Code the failure resumes sees the client disconnected, after its on_disconnect hook...
    assert hooks_seen == [False]
    assert not client.connected
    # ...so a retry goes to the offline queue and is answered on the next connection.
    assert await wait_for(client.request("echo", "again", timeout=5)) == "again"


# -- the server's side of a client -----------------------------------------------------------------


@pytest.mark.parametrize("route", JSON_ROUTES)
@pytest_twisted.ensureDeferred
async def test_the_server_requests_and_the_clients_handlers_answer(server, route):
    client = await server.client(route)
    asked: list[tuple[Any, Any]] = []

    @client.handle("whoami")
    def whoami(body: Any, who: Any) -> str:
        asked.append((body, who))
        return f"bob ({body})"

    async def fail(body: Any, who: Any) -> None:
        raise RequestFailed({"reason": "not today"})

    client.handle({"fail": fail, "divide": lambda body, who: 1 / 0})
    peer = await server.peer()
    assert await wait_for(peer.request("whoami", "q", timeout=5)) == "bob (q)"
    assert asked == [("q", client)]
    assert (await failure_of(peer.request("fail", timeout=5))).body == {"reason": "not today"}
    assert (await failure_of(peer.request("divide", timeout=5))).body == {
        "name": "ZeroDivisionError", "message": "division by zero"
    }
    assert (await failure_of(peer.request("nope", timeout=5))).body == "NotFound"


@pytest.mark.parametrize("route", ["ws-binary", "length32-binary", "ws-json"])
@pytest_twisted.ensureDeferred
async def test_the_clients_default_handler_answers_binary_requests(server, route):
    client = await server.client(route)
    got: list[tuple[Any, Any]] = []
    client.default_handler = lambda body, who: got.append((body, who)) or body[::-1]
    peer = await server.peer()
    assert await wait_for(peer.request(None, b"abc", binary=True, timeout=5)) == b"cba"
    assert got == [(b"abc", client)]
    client.default_handler = None
    assert (await failure_of(peer.request(None, b"x", binary=True, timeout=5))).body == (
        b"NotFound"
    )


@pytest.mark.parametrize("route", ROUTES)
@pytest_twisted.ensureDeferred
async def test_server_topics_follow_the_servers_announcements(server, route):
    server.hub.subscribe_callback("existing", lambda message: None)
    watcher = server.make_client(route)
    announced: list[tuple[str, str, Any]] = []
    watcher.on_subscribe = lambda topic, body: announced.append(("subscribe", topic, body))
    watcher.on_unsubscribe = lambda topic, body: announced.append(("unsubscribe", topic, body))
    await wait_for(watcher.connect())
    # On connection, the server names every topic the hub has subscribers for.
    await eventually(lambda: announced == [("subscribe", "existing", None)])
    assert watcher.server_topics == {"existing"}

    other = await server.client("lines")
    other.subscribe("news")
    await eventually(lambda: len(announced) == 2)
    assert announced[1] == ("subscribe", "news", None)
    assert watcher.server_topics == {"existing", "news"}
    other.unsubscribe("news")
    await eventually(lambda: len(announced) == 3)
    assert announced[2] == ("unsubscribe", "news", None)
    assert watcher.server_topics == {"existing"}


# -- reconnection ----------------------------------------------------------------------------------


class Hooks:
    """Counts a client's on_connect and on_disconnect calls."""

    def __init__(self, client: UbreClient) -> None:
        self.connects = 0
        self.disconnects: list[Failure] = []
        client.on_connect = self.connected
        client.on_disconnect = self.disconnects.append

    def connected(self) -> None:
        self.connects += 1


@pytest.mark.parametrize("kind", ["ws", "lines"])
@pytest_twisted.ensureDeferred
async def test_reconnects_subscribes_again_and_sends_the_offline_queue_in_order(kind):
    first = await Server().listen(kind)
    second = Server()
    first.ubre.handle("never", lambda body, peer: defer.Deferred())
    client = UbreClient(reactor, first.addresses[kind], reconnect=True, retry_policy=FAST_RETRY)
    hooks = Hooks(client)
    try:
        await wait_for(client.connect())
        assert hooks.connects == 1
        port = first.port(kind)
        inbox = Inbox()
        client.subscribe("news", inbox, body={"since": 5})
        client.subscribe("dropped", Inbox())
        await first.subscribed("news")
        await first.subscribed("dropped")
        in_flight = client.request("never", timeout=None)
        await barrier_sent(first, client)

        await first.drop()
        # A request already sent cannot be answered by the next connection.
        assert isinstance(await failure_of(in_flight), ConnectionClosed)
        await eventually(lambda: hooks.disconnects)
        assert not client.connected
        client.unsubscribe("dropped")  # while disconnected: not subscribed again
        queued = [
            client.publish("log", "one"),
            client.request("add", [1, 2], timeout=5),
            client.publish("log", "two"),
        ]
        await sleep(0.15)  # a few failed attempts
        assert not any(d.called for d in queued)

        events: list[tuple[Any, ...]] = []
        second.ubre.on_subscribe = lambda topic, body, peer: events.append(
            ("subscribe", topic, body)
        )
        second.hub.subscribe_callback("log", lambda m: events.append(("log", m.payload)))

        def add(body: list[int], peer: Any) -> int:
            events.append(("request", body))
            return sum(body)

        second.ubre.handle("add", add)
        await second.listen(kind, port=port)
        assert await wait_for(queued[1]) == 3
        assert await wait_for(queued[0]) is None
        assert await wait_for(queued[2]) is None
        assert events == [
            ("subscribe", "news", {"since": 5}),
            ("log", b'"one"'),
            ("request", [1, 2]),
            ("log", b'"two"'),
        ]
        assert hooks.connects == 2
        assert len(hooks.disconnects) == 1
        assert client.connected
        # The subscription works on the new server.
        assert second.ubre.publish("news", "after") == 1
        assert await inbox.wait() == [Publish("news", "after")]
    finally:
        await wait_for(client.close())
        await first.stop()
        await second.stop()


@pytest_twisted.ensureDeferred
async def test_binary_client_reconnects_and_sends_its_queue():
    first = await Server().listen("length32")
    second = Server()
    client = UbreClient(reactor, first.addresses["length32"], binary=True, reconnect=True,
                        retry_policy=FAST_RETRY)
    try:
        await wait_for(client.connect())
        port = first.port("length32")
        client.subscribe("raw", body=b"\x01")
        await first.subscribed("raw")
        await first.drop()
        await eventually(lambda: not client.connected)
        published = client.publish("raw", b"\x00\xff")
        answered = client.request(None, b"abc", timeout=5)
        seen: list[tuple[Any, ...]] = []
        second.ubre.on_subscribe = lambda topic, body, peer: seen.append((topic, body))
        second.hub.subscribe_callback("raw", lambda message: seen.append(("raw", message.payload)))
        second.ubre.default_handler = lambda body, peer: body.upper()
        await second.listen("length32", port=port)
        assert await wait_for(answered) == b"ABC"
        await wait_for(published)
        assert seen == [("raw", b"\x01"), ("raw", b"\x00\xff")]
    finally:
        await wait_for(client.close())
        await first.stop()
        await second.stop()


@pytest_twisted.ensureDeferred
async def test_connect_keeps_trying_until_the_server_is_up():
    port = free_port()
    attempts: list[int] = []

    def policy(failed_attempts: int) -> float:
        attempts.append(failed_attempts)
        return 0.05

    client = UbreClient(reactor, f"tcp:host=127.0.0.1:port={port}", reconnect=True,
                        retry_policy=policy)
    hooks = Hooks(client)
    server = Server()
    try:
        connecting = client.connect()
        await eventually(lambda: len(attempts) >= 2)
        assert attempts[:2] == [1, 2]
        assert not connecting.called
        assert hooks.connects == 0
        await server.listen("lines", port=port)
        assert await wait_for(connecting) is client
        assert hooks.connects == 1
        assert await wait_for(client.request("echo", "hi", timeout=5)) == "hi"
    finally:
        await wait_for(client.close())
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_the_offline_queue_is_bounded_and_close_fails_what_waits():
    port = free_port()
    client = UbreClient(reactor, f"tcp:host=127.0.0.1:port={port}", reconnect=True,
                        retry_policy=FAST_RETRY, offline_queue=2)
    connecting = client.connect()
    first = client.publish("t", 1)
    second = client.request("echo", 2, timeout=None)
    assert isinstance(await failure_of(client.publish("t", 3)), OfflineQueueFull)
    assert isinstance(await failure_of(client.request("echo", 4)), OfflineQueueFull)
    assert not first.called and not second.called

    await wait_for(client.close())
    for d in (connecting, first, second):
        assert isinstance(await failure_of(d), ConnectionClosed)
    # Closed: nothing more is queued.
    assert isinstance(await failure_of(client.publish("t", 5)), ConnectionClosed)


@pytest_twisted.ensureDeferred
async def test_a_queued_requests_timeout_counts_while_it_waits():
    port = free_port()
    client = UbreClient(reactor, f"tcp:host=127.0.0.1:port={port}", reconnect=True,
                        retry_policy=FAST_RETRY)
    server = Server()
    calls: list[Any] = []
    server.ubre.handle("slow", lambda body, peer: calls.append(body))
    try:
        connecting = client.connect()
        timed_out = await failure_of(client.request("slow", "queued", timeout=0.2))
        assert isinstance(timed_out, RequestTimeout)
        assert "not connected" in str(timed_out)
        waiting = client.request("slow", "later", timeout=5)
        await server.listen("lines", port=port)
        await wait_for(connecting)
        assert await wait_for(waiting) is None
        # The request that timed out in the queue was never sent.
        assert calls == ["later"]
    finally:
        await wait_for(client.close())
        await server.stop()


def test_a_binary_client_refuses_a_named_request_even_while_disconnected():
    client = UbreClient(reactor, f"tcp:host=127.0.0.1:port={free_port()}", binary=True,
                        reconnect=True)
    # Queued, it could never be sent: the binary format has no handler names.
    with pytest.raises(ValueError, match="name=None"):
        client.request("add", b"x")


@pytest_twisted.ensureDeferred
async def test_a_queued_request_the_connection_cannot_send_fails(socket_dir):
    # binary=True on the lines framing: a binary request cannot be written as a line.
    server = Server(socket_dir)
    client = UbreClient(reactor, f"unix:path={socket_dir / 'ubre.sock'}", binary=True,
                        framing="lines", reconnect=True, retry_policy=FAST_RETRY)
    server.clients.append(client)
    try:
        connecting = client.connect()
        refused = client.request(None, b"x", timeout=5)
        await server.listen("unix")
        await wait_for(connecting)
        error = await failure_of(refused)
        assert isinstance(error, ValueError)
        assert "JSON only" in str(error)
        assert client.connected
    finally:
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_close_while_reconnecting_stops_trying():
    first = await Server().listen("lines")
    second = Server()
    attempts: list[int] = []

    def policy(failed_attempts: int) -> float:
        attempts.append(failed_attempts)
        return 0.05

    client = UbreClient(reactor, first.addresses["lines"], reconnect=True, retry_policy=policy)
    hooks = Hooks(client)
    try:
        await wait_for(client.connect())
        port = first.port("lines")
        await first.drop()
        await eventually(lambda: len(attempts) >= 2)
        queued_publish = client.publish("t", 1)
        queued_request = client.request("echo", 1)
        connecting = client.connect()
        await wait_for(client.close())
        for d in (queued_publish, queued_request, connecting):
            assert isinstance(await failure_of(d), ConnectionClosed)
        tried = len(attempts)
        await second.listen("lines", port=port)
        await sleep(0.2)  # several retry delays
        assert len(attempts) == tried
        assert not second.ubre.peers
        assert not client.connected
        assert hooks.connects == 1
        assert len(hooks.disconnects) == 1
    finally:
        await wait_for(client.close())
        await first.stop()
        await second.stop()


@pytest_twisted.ensureDeferred
async def test_a_subscribe_body_that_cannot_be_sent_is_refused_at_once(server):
    client = server.make_client("lines", reconnect=True)
    with pytest.raises(InvalidField):
        client.subscribe("t", body={"not json": {1, 2}})
    assert "t" not in client._subscriptions  # nothing left to fail on a (re)connection
    await wait_for(client.connect())
    assert await wait_for(client.request("echo", 1, timeout=5)) == 1


@pytest.mark.parametrize("route", ["ws-json", "length32-binary"])
@pytest_twisted.ensureDeferred
async def test_a_request_over_the_size_limit_fails_and_nothing_is_sent(server, route):
    client = await server.client(route)
    big = b"x" * (2 << 20) if client.binary else "x" * (2 << 20)
    error = await failure_of(client.request(None if client.binary else "echo", big))
    assert isinstance(error, FrameTooLarge)
    assert len(client.protocol.pending) == 0
    assert client.connected


@pytest_twisted.ensureDeferred
async def test_a_bad_address_fails_connect_and_leaves_nothing_waiting() -> None:
    client = UbreClient(reactor, "tcp:nonsense=1")
    failure = await failure_of(client.connect())
    assert isinstance(failure, ValueError) and "cannot connect to 'tcp:nonsense=1'" in str(failure)
    assert client._connect_waiters == []
    await wait_for(client.close())  # nothing left to fail: no "Unhandled error in Deferred"
