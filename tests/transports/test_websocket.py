"""WebSocket adapter: limits, origin and connection caps, deflate, text/binary flags, close codes,
routing on one port, prepared messages and backpressure (also through twisted.web's takeover)."""

from __future__ import annotations

import socket

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.error import ConnectionDone, ConnectionLost

from tests.support import eventually, sleep, wait_for
from tests.transports.conftest import CHUNK, CHUNKS, Echo, Flooder, Net, Recorder
from wireproto.errors import InvalidField
from wireproto.transports import (
    HandshakeFailed,
    WebSocketOptions,
    close_reason,
    connect,
    websocket_resource,
    websocket_server_factory,
    websocket_site,
)

pytestmark = pytest.mark.usefixtures("fast_path")

UPGRADE = (
    "GET {path} HTTP/1.1\r\n"
    "Host: 127.0.0.1\r\n"
    "Upgrade: websocket\r\n"
    "Connection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    "Sec-WebSocket-Version: 13\r\n"
    "{extra}\r\n"
)


def upgrade_request(path: str = "/ws", **headers: str) -> bytes:
    extra = "".join(f"{name.replace('_', '-')}: {value}\r\n" for name, value in headers.items())
    return UPGRADE.format(path=path, extra=extra).encode()


async def serve(net: Net, protocol: type[Recorder] = Echo, **options) -> int:
    """An echo (or other) server at /ws; returns the port."""
    resource = websocket_resource(net.factory(protocol), WebSocketOptions(**options))
    return await net.listen_tcp(websocket_site({"/ws": resource}))


async def client(net: Net, port: int, path: str = "/ws", **options) -> Recorder:
    return await wait_for(
        connect(
            reactor,
            f"ws://127.0.0.1:{port}{path}",
            net.factory(Recorder),
            websocket=WebSocketOptions(**options),
        )
    )


async def http_response_head(net: Net, port: int, request: bytes) -> bytes:
    raw = await net.raw_connect(port)
    raw.transport.write(request)
    await eventually(lambda: b"\r\n\r\n" in raw.received)
    return raw.received.split(b"\r\n\r\n")[0]


@pytest_twisted.ensureDeferred
async def test_text_and_binary_flags_arrive_as_sent(net):
    port = await serve(net)
    peer = await client(net, port)
    sent = [(b"text", False), (b"\x00\xffbinary", True), ("\u2603".encode(), False), (b"", True)]
    for data, binary in sent:
        peer.transport.sendMessage(data, binary)
    assert await peer.received(len(sent)) == sent
    (server,) = [p for p in net.protocols if type(p) is Echo]
    assert server.messages == sent


@pytest_twisted.ensureDeferred
async def test_over_size_message_is_closed_with_1009(net):
    port = await serve(net, Recorder, max_message_size=1000)
    peer = await client(net, port)
    peer.transport.sendMessage(b"x" * 1000)
    peer.transport.sendMessage(b"y" * 1001)
    await wait_for(peer.lost)
    assert peer.transport.closeCode == 1009
    assert peer.reason.check(ConnectionLost)
    assert "1009" in str(peer.reason.value)
    (server,) = [p for p in net.protocols if p is not peer]
    await wait_for(server.lost)
    # What came before the over-size message was delivered; the over-size one was not.
    assert server.messages == [(b"x" * 1000, True)]
    assert server.reason.check(ConnectionLost)


class RejectsEverything(Recorder):
    error = InvalidField("WEBSMQ message type 9 is not defined; " + "\u00e9" * 200)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        super().messageReceived(data, binary)
        self.transport.loseConnection(self.error)


@pytest_twisted.ensureDeferred
async def test_protocol_error_closes_with_1002_and_truncated_reason(net):
    port = await serve(net, RejectsEverything)
    peer = await client(net, port)
    peer.transport.sendMessage(b"\x09")
    # Sent after the server decided to close: never delivered there.
    peer.transport.sendMessage(b"late")
    await wait_for(peer.lost)
    reason = close_reason(RejectsEverything.error)
    assert peer.transport.closeCode == 1002
    assert peer.transport.closeReason == reason
    assert len(reason.encode()) <= 123 and reason.startswith("WEBSMQ message type 9")
    (server,) = [p for p in net.protocols if p is not peer]
    await wait_for(server.lost)
    assert server.messages == [(b"\x09", True)]
    assert server.reason.check(ConnectionLost) and "1002" in str(server.reason.value)


@pytest_twisted.ensureDeferred
async def test_a_refusal_crossing_the_clients_own_close_still_reaches_it(net):
    # The client sends a message the server refuses, and closes at once: the server's 1002
    # and its reason, not the client's own 1000, are what the client hears. (The server
    # aborted the connection with its close frame unsent, and the client reported its own.)
    port = await serve(net, RejectsEverything)
    for _ in range(5):
        peer = await client(net, port)
        peer.transport.sendMessage(b"\x09")
        peer.transport.loseConnection()
        await wait_for(peer.lost)
        assert peer.reason.check(ConnectionLost), peer.reason
        assert peer.transport.closeCode == 1002
        assert peer.transport.closeReason == close_reason(RejectsEverything.error)


@pytest_twisted.ensureDeferred
async def test_origin_allowlist_refuses_other_origins_with_403(net):
    port = await serve(net, allowed_origins=("https://good.example:443", "http://*.good.example:*"))
    bad = await http_response_head(net, port, upgrade_request(Origin="https://evil.example"))
    assert bad.startswith(b"HTTP/1.1 403")
    for origin in ("https://good.example", "http://app.good.example:8080"):
        good = await http_response_head(net, port, upgrade_request(Origin=origin))
        assert good.startswith(b"HTTP/1.1 101"), good
    for origin in ("http://good.example", "https://good.example.evil.example", "null"):
        bad = await http_response_head(net, port, upgrade_request(Origin=origin))
        assert bad.startswith(b"HTTP/1.1 403"), bad
    # Only the two allowed handshakes reached a protocol.
    assert len([p for p in net.protocols if isinstance(p, Echo)]) == 2


@pytest_twisted.ensureDeferred
async def test_any_origin_by_default_including_null(net):
    port = await serve(net)
    for origin in ("https://anywhere.example", "null"):
        head = await http_response_head(net, port, upgrade_request(Origin=origin))
        assert head.startswith(b"HTTP/1.1 101"), head


@pytest_twisted.ensureDeferred
async def test_connections_beyond_max_connections_get_503(net):
    port = await serve(net, max_connections=2)
    first = await client(net, port)
    await client(net, port)
    with pytest.raises(HandshakeFailed, match="503"):
        await client(net, port)
    # A closed connection frees its slot.
    first.transport.loseConnection()
    await wait_for(first.lost)
    await eventually(lambda: sum(p.connected for p in net.protocols if type(p) is Echo) == 1)
    third = await client(net, port)
    third.transport.sendMessage(b"ok")
    assert await third.received(1) == [(b"ok", True)]


@pytest_twisted.ensureDeferred
async def test_deflate_is_off_by_default(net):
    port = await serve(net)
    head = await http_response_head(
        net, port, upgrade_request(Sec_WebSocket_Extensions="permessage-deflate")
    )
    assert head.startswith(b"HTTP/1.1 101")
    assert b"sec-websocket-extensions" not in head.lower()
    # Our own client offering deflate gets none from a default server...
    offering = await client(net, port, per_message_deflate=True)
    assert offering.transport.websocket_extensions_in_use == []
    # ...and gets it where the server turns it on; messages still arrive intact.
    deflating_port = await serve(net, per_message_deflate=True)
    deflating = await client(net, deflating_port, per_message_deflate=True)
    assert [e.EXTENSION_NAME for e in deflating.transport.websocket_extensions_in_use] == [
        "permessage-deflate"
    ]
    deflating.transport.sendMessage(b"squeeze me " * 1000)
    assert await deflating.received(1) == [(b"squeeze me " * 1000, True)]


class Tagged(Echo):
    def __init__(self, tag: bytes) -> None:
        super().__init__()
        self.tag = tag

    def messageReceived(self, data: bytes, binary: bool) -> None:
        self.transport.sendMessage(self.tag + data, binary)


@pytest_twisted.ensureDeferred
async def test_site_routes_each_path_to_its_protocol_and_404_elsewhere(net):
    routes = {
        path: websocket_resource(net.factory(Tagged, path.encode()))
        for path in ("/", "/websmq", "/a/b/c")
    }
    port = await net.listen_tcp(websocket_site(routes))
    for path in routes:
        peer = await client(net, port, path)
        peer.transport.sendMessage(b"!")
        assert await peer.received(1) == [(path.encode() + b"!", True)]
    for missing in ("/nope", "/a/b", "/a/b/d"):
        with pytest.raises(HandshakeFailed, match="404"):
            await client(net, port, missing)
    # A plain GET on a WebSocket path is told to upgrade, without Autobahn's status page, and
    # logs nothing (Autobahn logged a warning for each).
    from twisted.logger import LogLevel, globalLogPublisher

    warnings: list[dict] = []

    def keep(event: dict) -> None:
        if event.get("log_level") >= LogLevel.warn:
            warnings.append(event)

    globalLogPublisher.addObserver(keep)
    try:
        head = await http_response_head(net, port, b"GET /websmq HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        globalLogPublisher.removeObserver(keep)
    assert head.startswith(b"HTTP/1.1 426 Upgrade Required")
    assert warnings == []


def test_site_rejects_overlapping_or_relative_routes():
    resource = websocket_resource(Echo)
    with pytest.raises(ValueError, match="overlap"):
        websocket_site({"/a": resource, "/a/b": websocket_resource(Echo)})
    with pytest.raises(ValueError, match="start with '/'"):
        websocket_site({"a": resource})


@pytest_twisted.ensureDeferred
async def test_prepared_message_fans_out_to_many_clients(net):
    port = await serve(net, Recorder)
    peers = [await client(net, port) for _ in range(3)]
    await eventually(lambda: len([p for p in net.protocols if p not in peers]) == 3)
    servers = [p for p in net.protocols if p not in peers]
    prepared = servers[0].transport.prepareMessage(b"to all", False)
    assert {s.transport.prepareKey for s in servers} == {("ws", "server")}
    assert peers[0].transport.prepareKey == ("ws", "client")
    for server in servers:
        server.transport.sendPrepared(prepared)
    for peer in peers:
        assert await peer.received(1) == [(b"to all", False)]


@pytest_twisted.ensureDeferred
async def test_sends_after_close_are_dropped_silently(net):
    port = await serve(net, Recorder)
    peer = await client(net, port)
    prepared = peer.transport.prepareMessage(b"late")
    peer.transport.loseConnection()
    peer.transport.sendMessage(b"late")
    peer.transport.sendPrepared(prepared)
    await wait_for(peer.lost)
    peer.transport.sendMessage(b"later")
    assert peer.reason.check(ConnectionDone)
    (server,) = [p for p in net.protocols if p is not peer]
    await wait_for(server.lost)
    assert server.messages == []




@pytest.mark.parametrize("served_by", ["site", "factory"])
@pytest_twisted.ensureDeferred
async def test_backpressure_pauses_and_resumes_the_registered_producer(net, served_by):
    if served_by == "site":
        # The connection comes from twisted.web, whose HTTPChannel was its producer.
        port = await serve(net, Flooder)
    else:
        port = await net.listen_tcp(websocket_server_factory(net.factory(Flooder)))
    peer = await client(net, port)
    # This peer stops reading: the server's socket buffer fills up.
    peer.transport.pauseProducing()
    (server,) = [p for p in net.protocols if isinstance(p, Flooder)]
    server.transport.transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    for _ in range(CHUNKS):
        server.transport.sendMessage(CHUNK)
    assert "pause" in server.probe.calls
    await sleep(0.1)
    assert "resume" not in server.probe.calls, "resumed although the peer reads nothing"

    peer.transport.resumeProducing()
    await peer.received(CHUNKS)
    await eventually(lambda: server.probe.calls[-1] == "resume")
    assert "stop" not in server.probe.calls
    assert all(data == CHUNK for data, _ in peer.messages)


def test_options_refuse_nonsense():
    with pytest.raises(ValueError, match="max_message_size"):
        WebSocketOptions(max_message_size=0)
    with pytest.raises(ValueError, match="tuple of patterns"):
        WebSocketOptions(allowed_origins="https://example.com:443")
    with pytest.raises(ValueError, match="would never match.*'https://example.com:443'"):
        WebSocketOptions(allowed_origins=("https://example.com",))


@pytest_twisted.ensureDeferred
async def test_a_connection_that_never_sends_its_request_is_dropped(net):
    """twisted.web would wait 12 hours; the Site waits as long as an opening handshake may take,
    and an open WebSocket is left alone."""
    site = websocket_site({"/ws": websocket_resource(net.factory(Echo))}, idle_timeout=1)
    port = await net.listen_tcp(site)
    open_socket = await client(net, port)
    silent = await net.raw_connect(port)
    await wait_for(silent.closed, timeout=5)
    open_socket.transport.sendMessage(b"still here")
    assert await open_socket.received(1) == [(b"still here", True)]


@pytest_twisted.ensureDeferred
async def test_auto_ping_drops_a_peer_that_never_answers(net):
    from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
    from twisted.internet import defer
    from twisted.internet.endpoints import TCP4ClientEndpoint

    port = await serve(net, Recorder, auto_ping_interval=1, auto_ping_timeout=1)
    closed = defer.Deferred()

    class Deaf(WebSocketClientProtocol):
        def onPing(self, payload):
            pass  # never answers with a pong

        def onClose(self, wasClean, code, reason):
            closed.callback(code)

    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/ws")
    factory.protocol = Deaf
    await TCP4ClientEndpoint(reactor, "127.0.0.1", port).connect(factory)
    await wait_for(closed, timeout=8)
    (server_side,) = net.protocols
    await wait_for(server_side.lost)
    assert isinstance(server_side.reason.value, ConnectionLost)


@pytest_twisted.ensureDeferred
async def test_each_websocket_gets_the_principal_of_its_own_handshake(net):
    """Two handshakes whose credentials are checked at once, answered in the other order: each
    WebSocket acts as the principal its own handshake named."""
    checks: dict[str, defer.Deferred] = {}

    def identify(request):
        name = request.args[b"who"][0].decode()
        checks[name] = defer.Deferred()
        return checks[name]

    resource = websocket_resource(net.factory(Recorder), identify=identify)
    port = await net.listen_tcp(websocket_site({"/ws": resource}))
    alice = defer.ensureDeferred(client(net, port, "/ws?who=alice"))
    bob = defer.ensureDeferred(client(net, port, "/ws?who=bob"))
    await eventually(lambda: len(checks) == 2)
    checks["bob"].callback("principal of bob")
    checks["alice"].callback("principal of alice")
    await wait_for(alice)
    await wait_for(bob)
    servers = [p for p in net.protocols if p.transport.factory.isServer]
    assert sorted(p.transport.principal for p in servers) == ["principal of alice",
                                                               "principal of bob"]
    (server_factory,) = {p.transport.factory for p in servers}
    assert not hasattr(server_factory, "next_principal")
