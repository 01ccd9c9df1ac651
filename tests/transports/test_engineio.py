"""The Engine.IO 4 transport: the server with raw HTTP and raw WebSocket peers, the client against
the server, and the real engine.io-client (tests/interop/engineio_client.js) when it is there.

Raw HTTP requests are written byte for byte on a TCP connection (with "Connection: close", so
the server's close ends each answer), to see exactly what engine.io clients see.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import defer, protocol, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.web.resource import Resource
from twisted.web.server import Site

from tests.support import eventually, failure_of, need_interop_peer, sleep, wait_for
from tests.transports.conftest import Echo, Flooder, Recorder
from wireproto.errors import BadEncoding, InvalidField
from wireproto.hub import Hub, HubMessage
from wireproto.transports import (
    EngineIOOptions,
    MessageProtocol,
    engineio_client_connect,
    engineio_resource,
    websocket_resource,
    websocket_site,
)
from wireproto.transports.engineio import SessionState, engineio_url
from wireproto.transports.websocket import HandshakeFailed

INTEROP = Path(__file__).resolve().parents[1] / "interop"
FAST = EngineIOOptions(ping_interval=0.2, ping_timeout=0.3)


# -- raw peers ------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def parse_answer(raw: bytes) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        assert len(body) == int(headers["content-length"])
    return Answer(int(lines[0].split()[1]), headers, body)


class EIO:
    """A server on 127.0.0.1 with the Engine.IO resource and a plain WebSocket route beside it,
    and the raw peers a test opens."""

    def __init__(self, net: Any) -> None:
        self.net = net
        self.ws_clients: list[RawWebSocket] = []
        self.nodes: list[NodeClient] = []
        self.resource: Any = None

    async def start(self, protocol_cls: type = Echo, options: EngineIOOptions = FAST,
                    site: Any = None) -> EIO:
        self.resource = engineio_resource(self.net.factory(protocol_cls), options)
        if site is None:
            site = websocket_site({
                "/engine.io/": self.resource,
                "/ws": websocket_resource(self.net.factory(Echo)),
            })
        self.port = await self.net.listen_tcp(site)
        return self

    @property
    def sessions(self) -> dict[str, Any]:
        return self.resource.engine.sessions

    async def send(self, method: str, target: str, body: bytes = b"",
                   headers: dict[str, str] | None = None) -> Any:
        """Start one request on its own connection; `answer` waits for what comes back."""
        client = await self.net.raw_connect(self.port)
        lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
                 f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        client.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        return client

    async def answer(self, client: Any, timeout: float = 5.0) -> Answer:
        await wait_for(client.closed, timeout)
        return parse_answer(client.received)

    async def request(self, method: str, target: str, body: bytes = b"",
                      headers: dict[str, str] | None = None) -> Answer:
        return await self.answer(await self.send(method, target, body, headers))

    async def handshake(self) -> tuple[str, Recorder]:
        """A polling handshake: the sid and the server's protocol for it."""
        before = len(self.net.protocols)
        answer = await self.request("GET", "/engine.io/?EIO=4&transport=polling&t=N1")
        assert answer.status == 200, answer
        assert answer.body.startswith(b"0")
        assert len(self.net.protocols) == before + 1
        return json.loads(answer.body[1:])["sid"], self.net.protocols[-1]

    def poll(self, sid: str) -> str:
        return f"/engine.io/?EIO=4&transport=polling&t=N2&sid={sid}"

    async def ws(self, query: str) -> RawWebSocket:
        factory = WebSocketClientFactory(f"ws://127.0.0.1:{self.port}/engine.io/?{query}")
        factory.protocol = RawWebSocket
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port)
        client = await wait_for(endpoint.connect(factory))
        self.ws_clients.append(client)
        await wait_for(client.opened)
        return client

    async def close(self) -> None:
        for client in self.ws_clients:
            if client.state != client.STATE_CLOSED:
                client.dropConnection(abort=True)
            await wait_for(client.closed)
        for node in self.nodes:
            node.kill()
            await wait_for(node.ended)
        if self.resource is not None:
            # Sessions that wait for a last GET to give it the close packet.
            for session in list(self.sessions.values()):
                if session.state is SessionState.CLOSING:
                    session.finish()


class RawWebSocket(WebSocketClientProtocol):
    """An Autobahn client that records each frame: str for text, bytes for binary."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[str | bytes] = []
        self.opened: defer.Deferred[None] = defer.Deferred()
        self.closed: defer.Deferred[None] = defer.Deferred()
        self.close_code: int | None = None

    def onOpen(self) -> None:
        self.opened.callback(None)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.frames.append(payload if isBinary else payload.decode("utf-8"))

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.close_code = code
        if not self.opened.called:
            self.opened.errback(ConnectionLost(f"WebSocket refused: {reason}"))
        if not self.closed.called:
            self.closed.callback(None)

    def send_text(self, text: str) -> None:
        self.sendMessage(text.encode("utf-8"), False)

    async def received(self, count: int) -> list[str | bytes]:
        await eventually(lambda: len(self.frames) >= count)
        return self.frames


def upgrade_request(query: str) -> tuple[str, dict[str, str]]:
    return f"/engine.io/?{query}", {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }


@pytest_twisted.async_yield_fixture
async def eio(net):
    server = EIO(net)
    try:
        yield server
    finally:
        await server.close()


# -- the polling handshake and long-polling -------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_handshake_answers_the_open_packet_as_engine_io(eio):
    await eio.start(Recorder, EngineIOOptions())
    answer = await eio.request("GET", "/engine.io/?EIO=4&transport=polling&t=PZQ1a2b")
    assert answer.status == 200
    assert answer.headers["content-type"] == "text/plain; charset=UTF-8"
    assert answer.headers["cache-control"] == "no-store"
    assert answer.body.startswith(b'0{"sid":"')
    sid = json.loads(answer.body[1:])["sid"]
    assert answer.body == (
        b'0{"sid":"' + sid.encode() + b'","upgrades":["websocket"],"pingInterval":25000,'
        b'"pingTimeout":20000,"maxPayload":1000000}'
    )
    assert len(sid) == 20
    (server,) = eio.net.protocols
    assert server.connected and server.transport.kind == "engineio"
    assert server.transport.getPeer().host == "127.0.0.1"
    assert server.transport.getHost().port == eio.port


@pytest_twisted.ensureDeferred
async def test_no_upgrades_offered_when_turned_off(eio):
    await eio.start(Recorder, EngineIOOptions(upgrades=False))
    answer = await eio.request("GET", "/engine.io/?EIO=4&transport=polling")
    assert json.loads(answer.body[1:])["upgrades"] == []


@pytest_twisted.ensureDeferred
async def test_long_poll_is_held_until_a_message_is_sent(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    waiting = await eio.send("GET", eio.poll(sid))
    await sleep(0.1)
    assert waiting.received == b""
    server.transport.sendMessage(b"hi \xe2\x82\xac", False)
    answer = await eio.answer(waiting)
    assert (answer.status, answer.body) == (200, "4hi €".encode())
    assert answer.headers["content-type"] == "text/plain; charset=UTF-8"


@pytest_twisted.ensureDeferred
async def test_packets_queued_between_polls_come_joined_by_the_separator(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    server.transport.sendMessage(b"one", False)
    server.transport.sendMessage(b"\x01\x02\x03\x04", True)
    server.transport.write(b"\xff")
    answer = await eio.request("GET", eio.poll(sid))
    assert answer.body == b"4one\x1ebAQIDBA==\x1eb/w=="


@pytest_twisted.ensureDeferred
async def test_what_the_protocol_sends_at_connection_made_goes_with_the_next_poll(eio):
    # Pings far apart: on a loaded machine a 0.2 s ping could join the poll's answer.
    await eio.start(Echo, EngineIOOptions(ping_interval=5, ping_timeout=5))

    class Greeter(Recorder):
        def connectionMade(self) -> None:
            self.transport.sendMessage(b"0|3", False)

    eio.resource.engine.protocol_factory = eio.net.factory(Greeter)
    sid, _ = await eio.handshake()
    answer = await eio.request("GET", eio.poll(sid))
    assert answer.body == b"40|3"


@pytest_twisted.ensureDeferred
async def test_post_is_answered_ok_and_its_packets_delivered(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    answer = await eio.request("POST", eio.poll(sid), b"4abc\x1e4d\xc3\xa9f\x1ebAQID\x1e6",
                               {"Content-Type": "text/plain;charset=UTF-8"})
    assert (answer.status, answer.body) == (200, b"ok")
    assert answer.headers["content-type"] == "text/html"
    assert server.messages == [(b"abc", False), ("déf".encode(), False), (b"\x01\x02\x03", True)]


@pytest_twisted.ensureDeferred
async def test_echo_over_polling(eio):
    await eio.start(Echo)
    sid, _ = await eio.handshake()
    waiting = await eio.send("GET", eio.poll(sid))
    await eio.request("POST", eio.poll(sid), b"4ping me")
    assert (await eio.answer(waiting)).body == b"4ping me"


@pytest_twisted.ensureDeferred
async def test_a_bad_payload_closes_only_that_session(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    other_sid, other = await eio.handshake()
    answer = await eio.request("POST", eio.poll(sid), b"4fine\x1e9bad")
    assert answer.status == 400
    assert answer.json() == {"code": 3, "message": "Bad request"}
    await wait_for(server.lost)
    assert server.messages == []
    assert "packet 2 of the polling payload" in str(server.reason.value)
    assert other.connected
    assert (await eio.request("POST", eio.poll(other_sid), b"4still here")).body == b"ok"
    assert other.messages == [(b"still here", False)]


# -- closing ---------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_close_packet_from_the_client_releases_the_poll_with_a_noop(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    waiting = await eio.send("GET", eio.poll(sid))
    await sleep(0.05)
    assert (await eio.request("POST", eio.poll(sid), b"1")).body == b"ok"
    assert (await eio.answer(waiting)).body == b"6"
    await wait_for(server.lost)
    assert server.reason.check(ConnectionDone)
    assert server.lost_calls == 1
    answer = await eio.request("GET", eio.poll(sid))
    assert (answer.status, answer.json()) == (400, {"code": 1, "message": "Session ID unknown"})


@pytest_twisted.ensureDeferred
async def test_server_close_sends_the_close_packet_after_what_is_queued(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    server.transport.sendMessage(b"last words", False)
    server.transport.loseConnection()
    await wait_for(server.lost)
    assert server.reason.check(ConnectionDone)
    # The session lingers for the client's next poll, to hand it the close packet.
    assert (await eio.request("GET", eio.poll(sid))).body == b"4last words\x1e1"
    assert (await eio.request("GET", eio.poll(sid))).status == 400
    assert server.lost_calls == 1


@pytest_twisted.ensureDeferred
async def test_server_close_releases_a_held_poll_with_the_close_packet(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    waiting = await eio.send("GET", eio.poll(sid))
    await sleep(0.05)
    server.transport.loseConnection()
    assert (await eio.answer(waiting)).body == b"1"
    assert sid not in eio.sessions


@pytest_twisted.ensureDeferred
async def test_a_second_poll_while_one_is_held_closes_the_session(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    first = await eio.send("GET", eio.poll(sid))
    await sleep(0.05)
    second = await eio.request("GET", eio.poll(sid))
    assert second.status == 400
    assert (await eio.answer(first)).body == b"1"
    await wait_for(server.lost)
    assert "overlap" in str(server.reason.value)


@pytest_twisted.ensureDeferred
async def test_dropping_the_held_poll_connection_ends_the_session(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    waiting = await eio.send("GET", eio.poll(sid))
    await sleep(0.05)
    waiting.transport.abortConnection()
    await wait_for(server.lost)
    assert server.reason.check(ConnectionLost)
    assert sid not in eio.sessions or eio.sessions[sid].state is not SessionState.OPEN


# -- ping and pong -------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_pongs_keep_a_polling_session_alive_and_silence_ends_it(eio):
    await eio.start(Recorder, EngineIOOptions(ping_interval=0.2, ping_timeout=0.3))
    sid, server = await eio.handshake()
    for _ in range(3):
        # Each held poll is released by the next ping.
        assert (await eio.request("GET", eio.poll(sid))).body == b"2"
        assert (await eio.request("POST", eio.poll(sid), b"3")).body == b"ok"
    assert server.connected
    # One more ping, and no pong.
    assert (await eio.request("GET", eio.poll(sid))).body == b"2"
    await wait_for(server.lost)
    assert "ping timeout" in str(server.reason.value)
    assert server.reason.check(ConnectionLost)
    assert (await eio.request("GET", eio.poll(sid))).body == b"1"
    await sleep(0.1)
    assert server.lost_calls == 1


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "query", "status", "body"),
    [
        ("GET", "EIO=3&transport=polling", 400, {"code": 5, "message":
                                                   "Unsupported protocol version"}),
        ("GET", "transport=polling", 400, {"code": 5, "message": "Unsupported protocol version"}),
        ("GET", "EIO=4&transport=carrier-pigeon", 400, {"code": 0, "message":
                                                          "Transport unknown"}),
        ("GET", "EIO=4", 400, {"code": 0, "message": "Transport unknown"}),
        ("GET", "EIO=4&transport=polling&sid=nope", 400, {"code": 1, "message":
                                                            "Session ID unknown"}),
        ("POST", "EIO=4&transport=polling", 400, {"code": 2, "message": "Bad handshake method"}),
        ("GET", "EIO=4&transport=websocket", 400, {"code": 3, "message": "Bad request"}),
    ],
)
@pytest_twisted.ensureDeferred
async def test_bad_requests_get_engine_io_error_bodies(eio, method, query, status, body):
    await eio.start(Recorder)
    answer = await eio.request(method, f"/engine.io/?{query}")
    assert answer.status == status
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == body
    assert eio.net.protocols == []


@pytest_twisted.ensureDeferred
async def test_engine_io_path_needs_its_trailing_slash(eio):
    await eio.start(Recorder)
    assert (await eio.request("GET", "/engine.io?EIO=4&transport=polling")).status == 404
    assert (await eio.request("GET", "/engine.io/x?EIO=4&transport=polling")).status == 404


@pytest_twisted.ensureDeferred
async def test_a_polling_request_on_an_upgraded_session_is_a_bad_request(eio):
    await eio.start(Recorder)
    sid, _ = await eio.handshake()
    ws = await eio.ws(f"EIO=4&transport=websocket&sid={sid}")
    ws.send_text("5")
    await eventually(lambda: eio.sessions[sid].transportName == "websocket")
    answer = await eio.request("GET", eio.poll(sid))
    assert (answer.status, answer.json()["code"]) == (400, 3)


@pytest_twisted.ensureDeferred
async def test_allow_request_can_refuse_polling_and_websocket_handshakes(eio):
    seen = []

    def allow(request: Any) -> bool:
        seen.append(request.getHeader(b"x-token"))
        return request.getHeader(b"x-token") == b"good"

    await eio.start(Recorder, EngineIOOptions(allow_request=allow))
    answer = await eio.request("GET", "/engine.io/?EIO=4&transport=polling",
                               headers={"X-Token": "bad"})
    assert answer.status == 403
    assert answer.json() == {"code": 4, "message": "Forbidden"}
    target, headers = upgrade_request("EIO=4&transport=websocket")
    refused = await eio.request("GET", target, headers={**headers, "X-Token": "bad"})
    assert refused.status == 403
    assert refused.json() == {"code": 4, "message": "Forbidden"}
    assert eio.net.protocols == []
    allowed = await eio.request("GET", "/engine.io/?EIO=4&transport=polling",
                                headers={"X-Token": "good"})
    assert allowed.status == 200
    assert seen == [b"bad", b"bad", b"good"]


@pytest_twisted.ensureDeferred
async def test_allowed_origins_refuse_a_browser_on_another_origin(eio):
    await eio.start(Recorder, EngineIOOptions(allowed_origins=("https://app.example:443",
                                                               "http://127.0.0.1:*")))
    polling = "/engine.io/?EIO=4&transport=polling"
    for origin, status in [
        ("https://evil.example", 403), ("null", 403), ("https://app.example", 200),
        ("http://127.0.0.1:8080", 200), ("https://app.example:8443", 403),
    ]:
        answer = await eio.request("GET", polling, headers={"Origin": origin})
        assert answer.status == status, origin
    assert (await eio.request("GET", polling)).status == 200  # no Origin: not a browser
    target, headers = upgrade_request("EIO=4&transport=websocket")
    refused = await eio.request("GET", target, headers={**headers, "Origin": "https://evil.example"})
    assert refused.status == 403 and refused.json() == {"code": 4, "message": "Forbidden"}


@pytest_twisted.ensureDeferred
async def test_a_page_of_an_allowed_origin_may_read_its_polls_cors(eio):
    await eio.start(Recorder, EngineIOOptions(allowed_origins=("http://127.0.0.1:*",)))
    polling = "/engine.io/?EIO=4&transport=polling"
    page = "http://127.0.0.1:8080"
    answer = await eio.request("GET", polling, headers={"Origin": page})
    assert answer.status == 200
    assert answer.headers["access-control-allow-origin"] == page
    assert "access-control-allow-credentials" not in answer.headers
    preflight = await eio.request("OPTIONS", polling, headers={
        "Origin": page, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization, bad header"})
    assert preflight.status == 204
    assert preflight.headers["access-control-allow-methods"] == "GET, POST, OPTIONS"
    assert preflight.headers["access-control-allow-headers"] == "content-type, authorization"
    elsewhere = await eio.request("OPTIONS", polling, headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert elsewhere.status == 403
    assert "access-control-allow-origin" not in elsewhere.headers
    assert (await eio.request("GET", polling)).headers.get("access-control-allow-origin") is None


@pytest_twisted.ensureDeferred
async def test_without_allowed_origins_no_page_elsewhere_may_read_a_poll(eio):
    # As engine.io without its cors option: any origin may open a session, none may read it.
    await eio.start(Recorder)
    polling = "/engine.io/?EIO=4&transport=polling"
    page = {"Origin": "http://evil.example"}
    answer = await eio.request("GET", polling, headers=page)
    assert answer.status == 200
    assert "access-control-allow-origin" not in answer.headers
    preflight = await eio.request("OPTIONS", polling, headers={
        **page, "Access-Control-Request-Method": "POST"})
    assert preflight.status == 403
    assert not any(name.startswith("access-control-") for name in preflight.headers)


@pytest_twisted.ensureDeferred
async def test_max_connections_refuses_more_sessions_with_503(eio):
    await eio.start(Recorder, EngineIOOptions(max_connections=1))
    await eio.handshake()
    assert (await eio.request("GET", "/engine.io/?EIO=4&transport=polling")).status == 503
    target, headers = upgrade_request("EIO=4&transport=websocket")
    assert (await eio.request("GET", target, headers=headers)).status == 503
    assert len(eio.net.protocols) == 1


@pytest_twisted.ensureDeferred
async def test_sessions_are_capped_per_address(eio):
    await eio.start(Recorder, EngineIOOptions(max_sessions_per_address=2))
    sid, first = await eio.handshake()
    await eio.handshake()
    assert (await eio.request("GET", "/engine.io/?EIO=4&transport=polling")).status == 503
    target, headers = upgrade_request("EIO=4&transport=websocket")
    assert (await eio.request("GET", target, headers=headers)).status == 503
    assert (await eio.request("POST", eio.poll(sid), b"1")).body == b"ok"  # the client closes
    await wait_for(first.lost)
    await eio.handshake()


@pytest_twisted.ensureDeferred
async def test_a_session_that_never_polls_frees_its_slot_soon(eio):
    # 10,000 handshakes that never poll held every slot for 65 s (ping, pong timeout, linger).
    options = EngineIOOptions(max_connections=1, first_request_timeout=0.3)
    await eio.start(Recorder, options)
    sid, server = await eio.handshake()
    assert (await eio.request("GET", "/engine.io/?EIO=4&transport=polling")).status == 503
    await wait_for(server.lost, timeout=2)
    assert "no request within 0.3 s of the handshake" in str(server.reason.value)
    assert sid not in eio.sessions  # forgotten at once: no GET will come for a close packet
    await eio.handshake()


@pytest_twisted.ensureDeferred
async def test_a_session_that_polled_is_not_expired_by_the_first_request_timeout(eio):
    options = EngineIOOptions(first_request_timeout=0.2, ping_interval=5, ping_timeout=5)
    await eio.start(Echo, options)
    sid, server = await eio.handshake()
    assert (await eio.request("POST", eio.poll(sid), b"4hi")).body == b"ok"
    await sleep(0.4)
    assert server.connected
    assert (await eio.request("GET", eio.poll(sid))).body == b"4hi"


@pytest_twisted.ensureDeferred
async def test_a_closing_session_holds_no_slot(eio):
    # A session closed by the server waits for a GET to take its close packet; meanwhile the
    # slot is free, so the sessions counted are the sessions that are open.
    options = EngineIOOptions(max_connections=1, ping_interval=5, ping_timeout=5)
    await eio.start(Recorder, options)
    sid, server = await eio.handshake()
    server.transport.loseConnection()
    assert eio.sessions[sid].state is SessionState.CLOSING
    _, other = await eio.handshake()
    assert other.connected
    assert (await eio.request("GET", eio.poll(sid))).body == b"1"


@pytest_twisted.ensureDeferred
async def test_a_post_over_max_payload_gets_413_and_closes_that_session(eio):
    await eio.start(Recorder, EngineIOOptions(max_payload=100))
    sid, server = await eio.handshake()
    assert json.loads((await eio.request("GET", "/engine.io/?EIO=4&transport=polling")).body[1:])[
        "maxPayload"] == 100
    assert (await eio.request("POST", eio.poll(sid), b"4" + b"x" * 99)).body == b"ok"
    answer = await eio.request("POST", eio.poll(sid), b"4" + b"x" * 100)
    assert answer.status == 413
    await wait_for(server.lost)
    assert "over 100 bytes" in str(server.reason.value)
    assert server.messages == [(b"x" * 99, False)]


@pytest_twisted.ensureDeferred
async def test_a_websocket_frame_over_max_payload_closes_that_session_with_1009(eio):
    await eio.start(Recorder, EngineIOOptions(max_payload=100))
    ws = await eio.ws("EIO=4&transport=websocket")
    await ws.received(1)
    (server,) = eio.net.protocols
    ws.send_text("4" + "x" * 99)
    ws.send_text("4" + "x" * 100)
    await wait_for(ws.closed)
    assert ws.close_code == 1009
    await wait_for(server.lost)
    assert server.messages == [(b"x" * 99, False)]


def test_websocket_message_limit_is_raised_to_max_payload():
    options = EngineIOOptions(max_payload=5_000_000)
    assert options.websocket.max_message_size == 5_000_000
    with pytest.raises(ValueError, match="ping_interval"):
        EngineIOOptions(ping_interval=0)


@pytest_twisted.ensureDeferred
async def test_send_over_max_payload_raises(eio):
    await eio.start(Recorder, EngineIOOptions(max_payload=10))
    _, server = await eio.handshake()
    assert server.transport.maxMessageSize == 10
    with pytest.raises(Exception, match="max_payload"):
        server.transport.sendMessage(b"x" * 11)


# -- the upgrade and WebSocket sessions ---------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_upgrade_dance_moves_the_session_to_the_websocket(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    waiting = await eio.send("GET", eio.poll(sid))
    ws = await eio.ws(f"EIO=4&transport=websocket&sid={sid}")
    ws.send_text("2probe")
    assert await ws.received(1) == ["3probe"]
    # The held poll is released with a noop so the client can pause polling.
    assert (await eio.answer(waiting)).body == b"6"
    assert eio.sessions[sid].transportName == "polling"
    # Sent before the client's "5": queued for polling, then flushed over the WebSocket.
    server.transport.sendMessage(b"meanwhile", False)
    server.transport.sendMessage(b"\x00\xff", True)
    ws.send_text("5")
    assert await ws.received(3) == ["3probe", "4meanwhile", b"\x00\xff"]
    assert eio.sessions[sid].transportName == "websocket"
    ws.send_text("4up")
    ws.sendMessage(b"\x01", True)
    await server.received(2)
    assert server.messages == [(b"up", False), (b"\x01", True)]
    server.transport.sendMessage(b"down", False)
    assert (await ws.received(4))[3] == "4down"
    assert server.transport.getPeer().port == ws.transport.getHost().port
    server.transport.loseConnection()
    await wait_for(ws.closed)
    assert ws.frames[-1] == "1"
    assert ws.close_code == 1000
    await wait_for(server.lost)
    assert server.reason.check(ConnectionDone)


@pytest_twisted.ensureDeferred
async def test_a_poll_during_the_upgrade_is_answered_at_once(eio):
    await eio.start(Recorder)
    sid, _ = await eio.handshake()
    ws = await eio.ws(f"EIO=4&transport=websocket&sid={sid}")
    ws.send_text("2probe")
    await ws.received(1)
    assert (await eio.request("GET", eio.poll(sid))).body == b"6"


@pytest_twisted.ensureDeferred
async def test_anything_else_during_the_upgrade_closes_only_the_websocket(eio):
    await eio.start(Echo)
    sid, server = await eio.handshake()
    ws = await eio.ws(f"EIO=4&transport=websocket&sid={sid}")
    ws.send_text("4too early")
    await wait_for(ws.closed)
    assert server.connected
    assert eio.sessions[sid].transportName == "polling"
    waiting = await eio.send("GET", eio.poll(sid))
    await eio.request("POST", eio.poll(sid), b"4still polling")
    assert (await eio.answer(waiting)).body == b"4still polling"


@pytest_twisted.ensureDeferred
async def test_ping_timeout_closes_an_upgraded_session(eio):
    await eio.start(Recorder, EngineIOOptions(ping_interval=0.1, ping_timeout=0.2))
    sid, server = await eio.handshake()
    ws = await eio.ws(f"EIO=4&transport=websocket&sid={sid}")
    ws.send_text("5")
    await wait_for(server.lost)
    assert "ping timeout" in str(server.reason.value)
    await wait_for(ws.closed)
    assert "2" in ws.frames


@pytest_twisted.ensureDeferred
async def test_websocket_without_sid_is_a_session_of_its_own(eio):
    await eio.start(Echo, EngineIOOptions(ping_interval=0.2, ping_timeout=0.3))
    ws = await eio.ws("EIO=4&transport=websocket")
    (opening,) = await ws.received(1)
    handshake = json.loads(opening[1:])
    assert opening.startswith("0{")
    assert list(handshake) == ["sid", "upgrades", "pingInterval", "pingTimeout", "maxPayload"]
    assert handshake["upgrades"] == []
    assert handshake["pingInterval"] == 200
    (server,) = eio.net.protocols
    ws.send_text("4hello")
    ws.sendMessage(b"\x00\x01", True)
    assert await ws.received(3) == [opening, "4hello", b"\x00\x01"]
    # Answer pings for a while: the session stays.
    for answered in range(3):
        await eventually(lambda count=answered: ws.frames.count("2") > count)
        ws.send_text("3")
    assert server.connected
    ws.send_text("1")
    await wait_for(ws.closed)
    assert ws.close_code == 1000
    await wait_for(server.lost)
    assert server.reason.check(ConnectionDone)


@pytest.mark.parametrize(("frame", "why"), [
    ("2", "only the server pings"),
    ("bé", "not valid base64"),  # base64 of non-ASCII text raised ValueError, not ProtocolError
])
@pytest_twisted.ensureDeferred
async def test_a_bad_websocket_packet_closes_that_session_with_1002(eio, frame, why):
    await eio.start(Recorder)
    ws = await eio.ws("EIO=4&transport=websocket")
    (server,) = eio.net.protocols
    ws.send_text(frame)
    await wait_for(ws.closed)
    assert ws.close_code == 1002
    await wait_for(server.lost)
    assert why in str(server.reason.value)


@pytest_twisted.ensureDeferred
async def test_non_ascii_base64_in_a_post_is_a_bad_request_that_closes_the_session(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    answer = await eio.request("POST", eio.poll(sid), "bé".encode())
    assert answer.status == 400
    assert answer.json() == {"code": 3, "message": "Bad request"}
    await wait_for(server.lost)
    assert "not valid base64" in str(server.reason.value)


# -- flow control --------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_slow_poller_pauses_the_producer_until_a_poll_drains_the_queue(eio):
    await eio.start(Flooder, EngineIOOptions(poll_high_water=100))
    sid, server = await eio.handshake()
    server.transport.sendMessage(b"a" * 60, False)
    assert server.probe.calls == []
    server.transport.sendMessage(b"b" * 60, False)
    assert server.probe.calls == ["pause"]
    answer = await eio.request("GET", eio.poll(sid))
    assert answer.body == b"4" + b"a" * 60 + b"\x1e4" + b"b" * 60
    assert server.probe.calls == ["pause", "resume"]


@pytest_twisted.ensureDeferred
async def test_pausing_a_polling_session_holds_the_next_post(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    server.transport.pauseProducing()
    posting = await eio.send("POST", eio.poll(sid), b"4held")
    await sleep(0.1)
    assert (posting.received, server.messages) == (b"", [])
    server.transport.resumeProducing()
    assert (await eio.answer(posting)).body == b"ok"
    assert server.messages == [(b"held", False)]


@pytest_twisted.ensureDeferred
async def test_a_text_message_with_the_payload_separator_cannot_be_sent(eio):
    await eio.start(Recorder)
    _, server = await eio.handshake()
    with pytest.raises(InvalidField, match="U\\+001E"):
        server.transport.sendMessage(b"a\x1eb", False)
    with pytest.raises(BadEncoding):
        server.transport.sendMessage(b"\xff", False)
    server.transport.sendMessage(b"a\x1eb", True)


@pytest_twisted.ensureDeferred
async def test_a_poller_that_never_polls_is_closed_past_max_poll_buffer(eio):
    await eio.start(Recorder, EngineIOOptions(max_poll_buffer=1000))
    _, server = await eio.handshake()
    for _ in range(20):
        server.transport.sendMessage(b"x" * 100, False)
    await wait_for(server.lost)
    assert "max_poll_buffer" in str(server.reason.value)


class HubMember(Recorder):
    """Subscribed to topic "t" through the hub, as the spec protocols are."""

    hub: Hub

    def connectionMade(self) -> None:
        self.session = self.hub.attach(
            self.transport, protocol="test", wire_format="raw",
            encode=lambda message: (message.payload, False),
        )
        self.session.subscribe("t")

    def connectionLost(self, reason: Any) -> None:
        self.session.close()
        super().connectionLost(reason)


@pytest_twisted.ensureDeferred
async def test_hub_publishes_to_a_slow_poller_wait_in_the_hubs_bounded_queue(eio):
    hub = Hub(queue_bytes=10_000)
    HubMember.hub = hub
    await eio.start(HubMember, EngineIOOptions(poll_high_water=1000))
    sid, member = await eio.handshake()
    engine_session = eio.sessions[sid]
    for index in range(20):
        hub.publish(HubMessage("t", b"%03d" % index + b"x" * 197))
    # The engine.io queue stopped near its high-water mark; the rest waits in the hub.
    assert engine_session.queued_bytes <= 1000 + 201
    assert member.session.queued_bytes >= 20 * 200 - 1201
    received = []
    while len(received) < 20:
        body = (await eio.request("GET", eio.poll(sid))).body
        received += [packet[1:4] for packet in body.split(b"\x1e")]
    assert received == [b"%03d" % index for index in range(20)]
    assert member.session.queued_bytes == 0


# -- coexisting with other resources ---------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_websocket_site_serves_engine_io_beside_a_websocket_route(eio):
    await eio.start(Recorder)
    await eio.handshake()
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{eio.port}/ws")
    factory.protocol = RawWebSocket
    client = await wait_for(
        TCP4ClientEndpoint(reactor, "127.0.0.1", eio.port).connect(factory)
    )
    eio.ws_clients.append(client)
    await wait_for(client.opened)
    client.send_text("plain ws")
    assert await client.received(1) == ["plain ws"]


class Page(Resource):
    isLeaf = True

    def render_GET(self, request: Any) -> bytes:
        return b"other page"


@pytest_twisted.ensureDeferred
async def test_a_plain_site_mounts_it_as_the_child_engine_io(eio):
    root = Resource()
    root.putChild(b"other", Page())
    eio.resource = engineio_resource(eio.net.factory(Recorder), FAST)
    root.putChild(b"engine.io", eio.resource)
    await eio.start(Recorder, FAST, site=Site(root))
    # start() made its own resource; serve the one mounted above.
    eio.resource = root.children[b"engine.io"]
    await eio.handshake()
    assert (await eio.request("GET", "/other")).body == b"other page"


# -- the client -----------------------------------------------------------------------------------


def test_client_url_gets_the_default_path_and_the_query():
    assert engineio_url("ws://h:1") == "ws://h:1/engine.io/?EIO=4&transport=websocket"
    assert engineio_url("wss://h/") == "wss://h/engine.io/?EIO=4&transport=websocket"
    assert engineio_url("ws://h:1/x/?a=b") == "ws://h:1/x/?a=b&EIO=4&transport=websocket"
    with pytest.raises(ValueError, match="ws://"):
        engineio_url("http://h:1")


@pytest_twisted.ensureDeferred
async def test_client_and_server_exchange_and_pings_keep_them_alive(eio):
    await eio.start(Echo, EngineIOOptions(ping_interval=0.1, ping_timeout=0.5))
    client = await wait_for(engineio_client_connect(
        reactor, f"ws://127.0.0.1:{eio.port}", eio.net.factory(Recorder)
    ))
    (server, _) = eio.net.protocols
    assert client.transport.kind == "engineio"
    assert client.transport.handshake.ping_interval == 100
    assert client.transport.handshake.ping_timeout == 500
    assert client.transport.maxMessageSize == 1_000_000 - 1
    client.transport.sendMessage(b"text", False)
    client.transport.sendMessage(b"\x00bin", True)
    await client.received(2)
    assert client.messages == [(b"text", False), (b"\x00bin", True)]
    # Past a ping interval and timeout: both sides would have given up without pings and pongs.
    (session,) = eio.sessions.values()
    await sleep(0.7)
    assert client.connected and server.connected and session.state is SessionState.OPEN
    prepared = client.transport.prepareMessage(b"prepared", False)
    client.transport.sendPrepared(prepared)
    await client.received(3)
    client.transport.loseConnection()
    await wait_for(server.lost)
    await wait_for(client.lost)
    assert server.reason.check(ConnectionDone)
    assert client.reason.check(ConnectionDone)


@pytest_twisted.ensureDeferred
async def test_server_close_reaches_the_client_cleanly(eio):
    await eio.start(Recorder)
    client = await wait_for(engineio_client_connect(
        reactor, f"ws://127.0.0.1:{eio.port}/engine.io/", eio.net.factory(Recorder)
    ))
    (server, _) = eio.net.protocols
    server.transport.sendMessage(b"bye", False)
    server.transport.loseConnection()
    await wait_for(client.lost)
    assert client.messages == [(b"bye", False)]
    assert client.reason.check(ConnectionDone)
    assert client.transport.closeCode == 1000


@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_client_over_wss_with_a_given_trust_root(eio, tls_files):
    site = websocket_site({"/engine.io/": engineio_resource(eio.net.factory(Echo), FAST)})
    description = (f"ssl:0:interface=127.0.0.1:privateKey={tls_files.key}"
                   f":certKey={tls_files.cert}")
    port = (await eio.net.listen(site, description)).getHost().port
    trust = optionsForClientTLS("localhost", trustRoot=Certificate.loadPEM(tls_files.cert_pem))
    client = await wait_for(engineio_client_connect(
        reactor, f"wss://localhost:{port}", eio.net.factory(Recorder), context_factory=trust
    ))
    client.transport.sendMessage(b"secure", False)
    assert await client.received(1) == [(b"secure", False)]
    with pytest.raises(ValueError, match="TLS options are for wss://"):
        engineio_client_connect(reactor, f"ws://localhost:{port}", Recorder,
                                context_factory=trust)


class SilentEngineIO(MessageProtocol):
    """A WebSocket server that sends an open packet and then never pings."""

    opening = '0{"sid":"s","upgrades":[],"pingInterval":100,"pingTimeout":100,"maxPayload":9}'

    def connectionMade(self) -> None:
        self.transport.sendMessage(self.opening.encode(), False)


@pytest_twisted.ensureDeferred
async def test_client_closes_when_no_ping_comes(net):
    port = await net.listen_tcp(websocket_site({"/engine.io/": websocket_resource(SilentEngineIO)}))
    client = await wait_for(engineio_client_connect(
        reactor, f"ws://127.0.0.1:{port}", net.factory(Recorder)
    ))
    assert client.transport.maxMessageSize == 8
    with pytest.raises(Exception, match="maxPayload"):
        client.transport.sendMessage(b"x" * 9)
    await wait_for(client.lost, timeout=2)
    assert "no Engine.IO ping within 0.2 s" in str(client.reason.value)


class BadOpening(MessageProtocol):
    def connectionMade(self) -> None:
        self.transport.sendMessage(b"4not an open packet", False)


@pytest_twisted.ensureDeferred
async def test_client_refuses_a_server_that_does_not_open(net):
    port = await net.listen_tcp(websocket_site({"/engine.io/": websocket_resource(BadOpening)}))
    error = await failure_of(engineio_client_connect(
        reactor, f"ws://127.0.0.1:{port}", net.factory(Recorder)
    ))
    assert isinstance(error, HandshakeFailed)
    assert "before the open packet" in str(error)
    assert net.protocols == []


@pytest_twisted.ensureDeferred
async def test_client_sees_a_refused_handshake(eio):
    await eio.start(Recorder, EngineIOOptions(allow_request=lambda request: False))
    error = await failure_of(engineio_client_connect(
        reactor, f"ws://127.0.0.1:{eio.port}", eio.net.factory(Recorder)
    ))
    assert isinstance(error, HandshakeFailed)
    assert "403" in str(error)


# -- the real engine.io-client --------------------------------------------------------------------


class NodeClient(protocol.ProcessProtocol):
    """tests/interop/engineio_client.js: commands in on stdin, JSON events out on stdout."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self._partial = b""
        self.ended: defer.Deferred[None] = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        self.events.extend(json.loads(line) for line in lines if line)

    def processEnded(self, reason: Any) -> None:
        self.ended.callback(None)

    def command(self, line: str) -> None:
        self.transport.write(line.encode() + b"\n")

    def kill(self) -> None:
        if not self.ended.called:
            os.kill(self.transport.pid, signal.SIGKILL)

    def of(self, event: str) -> list[dict]:
        return [e for e in self.events if e["event"] == event]


async def start_node(eio: EIO, transports: str | None) -> NodeClient:
    executable = need_interop_peer(INTEROP / "node_modules" / "engine.io-client",
                                   "the real engine.io-client")
    node = NodeClient()
    args = ["node", str(INTEROP / "engineio_client.js"), f"http://127.0.0.1:{eio.port}"]
    reactor.spawnProcess(node, executable, args + ([transports] if transports else []),
                         env=os.environ)
    eio.nodes.append(node)
    await eventually(lambda: node.of("open") or node.of("close"), timeout=10)
    return node


@pytest.mark.parametrize("transports", [None, "polling", "websocket"])
@pytest_twisted.ensureDeferred
async def test_real_engine_io_client(eio, transports):
    await eio.start(Echo, EngineIOOptions(ping_interval=0.15, ping_timeout=0.5))
    node = await start_node(eio, transports)
    assert node.of("open")[0]["transport"] == (transports or "polling")
    if transports is None:
        # The default client upgrades to WebSocket.
        await eventually(lambda: node.of("upgrade"))
        assert node.of("upgrade")[0]["transport"] == "websocket"
    (server,) = eio.net.protocols
    node.command("send héllo")
    node.command("sendbin 00ff01")
    await eventually(lambda: len(node.of("message")) >= 2)
    assert node.of("message")[:2] == [{"event": "message", "text": "héllo"},
                                      {"event": "message", "hex": "00ff01"}]
    assert server.messages == [("héllo".encode(), False), (b"\x00\xff\x01", True)]
    # Past several ping intervals and timeouts the session is alive.
    await sleep(0.8)
    assert server.connected and not node.of("close")
    node.command("close")
    await wait_for(server.lost)
    assert server.reason.check(ConnectionDone), server.reason
    await wait_for(node.ended)
