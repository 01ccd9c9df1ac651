"""Engine.IO sessions held by another server that shares the listener
(wireproto.transports.engineio.handover), in one process: two servers that pass each other the
requests for their sessions over unix sockets, as two workers do; and owners that answer
nothing, too much, half an answer or nonsense, to see that the client's connection ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, UNIXClientEndpoint, connectProtocol
from twisted.internet.protocol import Factory, Protocol

from tests.raw_http import Answer, Raw
from tests.support import eventually, wait_for
from tests.transports.conftest import Echo
from wireproto.transports.engineio import EngineIOOptions, engineio_resource
from wireproto.transports.engineio.handover import SessionOwners
from wireproto.transports.websocket_http import websocket_site

# A passed request whose answer has not begun after ping_interval + ping_timeout is given up.
FAST = EngineIOOptions(ping_interval=0.2, ping_timeout=0.3)
HANDSHAKE = "/engine.io/?EIO=4&transport=polling"
UNKNOWN_SID = {"code": 1, "message": "Session ID unknown"}


async def request(port: int, method: str, target: str, body: bytes = b"",
                  headers: str = "") -> Answer:
    raw = Raw()
    await wait_for(connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), raw))
    raw.send(method, target, body, headers=headers)
    return await raw.answer(timeout=5)


async def serve(net, owners: SessionOwners, passed_on: str | None = None) -> int:
    """An Engine.IO server with `owners` on a TCP port; with `passed_on`, the requests passed
    to it on that unix socket, at the prefix /7."""
    resource = engineio_resource(net.factory(Echo), FAST, owners=owners)
    if passed_on is not None:
        await net.listen(websocket_site({"/7/engine.io/": resource.for_passed_requests()}),
                         f"unix:{passed_on}")
    return await net.listen_tcp(websocket_site({"/engine.io/": resource}))


@pytest_twisted.ensureDeferred
async def test_two_servers_serve_each_others_sessions_and_pass_nothing_on(net, tmp_path):
    paths = [str(tmp_path / f"{index}.sock") for index in (0, 1)]
    owners = [SessionOwners(str(index), {str(1 - index): UNIXClientEndpoint(
        reactor, paths[1 - index])}, prefix=b"/7") for index in (0, 1)]
    ports = [await serve(net, owners[index], paths[index]) for index in (0, 1)]
    handshake = await request(ports[1], "GET", HANDSHAKE)
    sid = json.loads(handshake.body[1:])["sid"]
    assert sid.startswith("1.") and len(sid) == 22
    poll = f"{HANDSHAKE}&sid={sid}"
    posted = await request(ports[0], "POST", poll, b"4hello\x1e4again")
    assert (posted.status, posted.body) == (200, b"ok")
    got = await request(ports[0], "GET", poll)
    assert (got.status, got.body) == (200, b"4hello\x1e4again")
    assert owners[0].counts == {"passed": 2}
    assert owners[1].counts == {"taken": 2}
    # Its own sid unknown, a mark that names no server: refused where it lands.
    for unknown in ("0.AAAAAAAAAAAAAAAAAAAA", "5.AAAAAAAAAAAAAAAAAAAA", "AAAA"):
        answer = await request(ports[0], "GET", f"{HANDSHAKE}&sid={unknown}")
        assert (answer.status, answer.json()) == (400, UNKNOWN_SID)
    assert owners[0].counts == {"passed": 2}
    # Straight on server 1's socket, a sid of server 0's is not passed back: no loop.
    own = json.loads((await request(ports[0], "GET", HANDSHAKE)).body[1:])["sid"]
    raw = Raw()
    await wait_for(connectProtocol(UNIXClientEndpoint(reactor, paths[1]), raw))
    raw.send("GET", f"/7{HANDSHAKE}&sid={own}")
    answer = await raw.answer()
    assert (answer.status, answer.json()) == (400, UNKNOWN_SID)
    assert owners[1].counts == {"taken": 3}


class ScriptedOwner(Protocol):
    """An owner that answers every request with `answer` (None: nothing), then closes if
    `close`; what it read, and whether its connection ended, are kept."""

    def __init__(self, answer: bytes | None, close: bool) -> None:
        self.answer = answer
        self.close = close
        self.read = b""
        self.ended = False

    def dataReceived(self, data: bytes) -> None:
        self.read += data
        if b"\r\n\r\n" in self.read and self.answer is not None:
            self.transport.write(self.answer)
            self.answer = None
            if self.close:
                self.transport.loseConnection()

    def connectionLost(self, reason: object = None) -> None:
        self.ended = True


async def scripted(net, tmp_path: Path, answer: bytes | None,
                   close: bool = True) -> tuple[int, SessionOwners, list[ScriptedOwner]]:
    path = str(tmp_path / "owner.sock")
    seen: list[ScriptedOwner] = []

    def build() -> ScriptedOwner:
        seen.append(ScriptedOwner(answer, close))
        return seen[-1]

    await net.listen(Factory.forProtocol(build), f"unix:{path}")
    owners = SessionOwners("0", {"1": UNIXClientEndpoint(reactor, path)}, prefix=b"/7")
    return await serve(net, owners), owners, seen


POLL = f"{HANDSHAKE}&sid=1.AAAAAAAAAAAAAAAAAAAA"


@pytest.mark.parametrize("answer", [
    None,  # no answer at all: the deadline
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",  # cut off
    b"HTTP/1.1 200 OK\r\n" + b"X-Filler: yes\r\n" * 2000,  # a head without end
    b"nonsense\r\n\r\n",
])
@pytest_twisted.ensureDeferred
async def test_an_answer_that_does_not_come_whole_ends_the_clients_connection(
        net, tmp_path, answer):
    port, owners, seen = await scripted(net, tmp_path, answer, close=answer is not None)
    raw = Raw()
    await wait_for(connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), raw))
    raw.send("GET", POLL, close=False)  # kept alive: only an abort ends it
    await wait_for(raw.ended, 5)
    # Ended, not answered (of the answer cut off, what came may have gone out first).
    if answer is None or b"nonsense" in answer:
        assert raw.data == b""
    assert owners.counts == {"passed": 1, "lost": 1}
    await eventually(lambda: seen[0].ended)


@pytest_twisted.ensureDeferred
async def test_an_answer_without_a_length_ends_with_the_owners_connection(net, tmp_path):
    port, _, _ = await scripted(
        net, tmp_path, b"HTTP/1.1 202 Accepted\r\nX-Owner: yes\r\n\r\nuntil the end")
    answer = await request(port, "GET", POLL)
    assert (answer.status, answer.body) == (202, b"until the end")
    assert "X-Owner: yes" in answer.headers


@pytest_twisted.ensureDeferred
async def test_the_owner_reads_the_request_again_without_what_concerns_one_connection(
        net, tmp_path):
    port, _, seen = await scripted(net, tmp_path, b"HTTP/1.1 200 OK\r\nContent-Length: 2"
                                                  b"\r\n\r\nok")
    raw = Raw()
    await wait_for(connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), raw))
    raw.send("POST", POLL, headers="Keep-Alive: timeout=5\r\nTE: trailers\r\n"
                                   "Transfer-Encoding: chunked\r\nOrigin: http://a.example\r\n"
                                   "X-Forwarded-For: 10.9.8.7\r\n")
    raw.transport.write(b"3\r\n4hi\r\n0\r\n\r\n")
    answer = await raw.answer()
    assert (answer.status, answer.body) == (200, b"ok")
    head, _, body = seen[0].read.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /7" + POLL.encode() + b" HTTP/1.1"
    names = [line.split(b":")[0].lower() for line in lines[1:]]
    for gone in (b"keep-alive", b"te", b"transfer-encoding"):
        assert gone not in names
    assert b"Connection: close" in lines and b"Content-Length: 3" in lines
    assert b"Origin: http://a.example" in lines
    # Passed as it came: the owner believes nothing a request says about its peer.
    assert b"X-Forwarded-For: 10.9.8.7" in lines
    assert body == b"4hi"


@pytest_twisted.ensureDeferred
async def test_a_client_that_leaves_ends_the_owners_connection(net, tmp_path):
    port, owners, seen = await scripted(net, tmp_path, None)
    raw = Raw()
    await wait_for(connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), raw))
    raw.send("GET", POLL)
    await eventually(lambda: seen and b"\r\n\r\n" in seen[0].read)
    raw.transport.abortConnection()
    await eventually(lambda: seen[0].ended, timeout=0.3)  # well before the deadline
    assert owners.counts == {"passed": 1}


@pytest_twisted.ensureDeferred
async def test_an_owner_that_cannot_be_reached_is_an_unknown_sid(net, tmp_path):
    owners = SessionOwners("0", {"1": UNIXClientEndpoint(reactor, str(tmp_path / "gone"))})
    port = await serve(net, owners)
    answer = await request(port, "GET", POLL)
    assert (answer.status, answer.json()) == (400, UNKNOWN_SID)
    assert owners.counts == {"unreachable": 1}


def test_a_mark_is_short_and_url_safe():
    for mark in ("", ".", "a.b", "x" * 17, "é"):
        with pytest.raises(ValueError):
            SessionOwners(mark, {})
    owners = SessionOwners("w-1", {"2": UNIXClientEndpoint(reactor, "/nowhere")})
    assert owners.new_sid("abc") == "w-1.abc"
    assert owners.owner_of("2.abc") is owners.owners["2"]
    for sid in ("w-1.abc", "3.abc", "2", "", ".2"):
        assert owners.owner_of(sid) is None
