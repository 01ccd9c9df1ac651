"""The nydus client kit (wireproto conform client --protocol nydus) against real clients,
each started by the kit for each case (--run): wireproto's own client through
examples/conformance/nydus_client_driver.py passes every MUST; the real nydus-client 5.3.1 on
engine.io-client 6.6 (tests/interop/conform_nydus_client.mjs), over long-polling with the
WebSocket upgrade and over long-polling alone, has every outcome pinned by id (docs/
conformance.md, "nydus clients: the driver and results", says why where it does not pass);
deliberately broken clients (broken_nydus_clients.py) fail the cases that catch their flaw and
no others; and a hostile client cannot exhaust the kit's site."""

from __future__ import annotations

import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor, threads

from tests.support import need_interop_peer
from wireproto.conformance.catalogue import CaseResult
from wireproto.conformance.kits import kit
from wireproto.conformance.listener import Listener
from wireproto.conformance.model import Level, Outcome
from wireproto.conformance.nydus.client import EngineIOSite
from wireproto.conformance.nydus.client.site import KEPT_TEXT, TRACED_SESSIONS
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import ClientRun, run_client_cases

ROOT = Path(__file__).resolve().parents[2]
INTEROP = ROOT / "tests" / "interop"
DRIVER = ROOT / "examples" / "conformance" / "nydus_client_driver.py"
BROKEN = Path(__file__).resolve().parent / "broken_nydus_clients.py"
NYDUS = kit("nydus", "client")

# What a WebSocket-only client (wireproto's) cannot show: the polling and upgrade cases.
NOT_POLLING = {
    "nydus.client.handshake.timestamp", "nydus.client.polling.sid",
    "nydus.client.polling.payload", "nydus.client.upgrade.taken", "nydus.client.upgrade.dance",
    "nydus.client.packet.bad-base64",
}
REPORTS = {case.id for case in NYDUS.cases if case.level is Level.INFORMATION}

# wireproto's client: every case it can be judged by passes, or reports.
WIREPROTO = {case_id: Outcome.INFORMATION for case_id in REPORTS | NOT_POLLING}

# nydus-client 5.3.1 with its default transports (polling, then the upgrade).
NYDUS_CLIENT = {
    **{case_id: Outcome.INFORMATION for case_id in REPORTS},
    # engine.io-parser 5 decodes "4" as a message whose data is undefined, and nydus-protocol's
    # decode(undefined) throws inside the client's message handler: the process ends.
    "nydus.client.packet.empty-message": Outcome.FAIL,
}
# Over long-polling alone: no WebSocket to judge.
NYDUS_CLIENT_POLLING = {
    **NYDUS_CLIENT,
    "nydus.client.upgrade.dance": Outcome.INFORMATION,
    "nydus.client.websocket.frames": Outcome.INFORMATION,
}


def _outcomes(results: list[CaseResult]) -> dict[str, Outcome]:
    return {result.case.id: result.outcome for result in results}


def _said(results: list[CaseResult]) -> str:
    return "\n".join(f"{r.case.id}: {r.outcome} {r.reason[:300]}" for r in results)


async def _run(command: str, cases: list[str] | None = None) -> list[CaseResult]:
    listener = Listener(reactor, "http://127.0.0.1:0/engine.io/",
                        make_factory=EngineIOSite(reactor).make_factory)
    await listener.start()
    try:
        run = ClientRun(reactor, listener, command)
        return await run_client_cases(run, Target("nydus", listener.url), NYDUS,
                                      NYDUS.select(cases))
    finally:
        await listener.stop()


def _expected(not_passed: dict[str, Outcome], cases: list[str] | None = None) -> dict[str, Outcome]:
    return {case.id: not_passed.get(case.id, Outcome.PASS) for case in NYDUS.select(cases)}


@pytest_twisted.ensureDeferred
async def test_wireprotos_client_passes_every_must() -> None:
    results = await _run(f"{sys.executable} {DRIVER} {{url}}")
    assert _outcomes(results) == _expected(WIREPROTO), _said(results)
    assert all(r.outcome is Outcome.PASS for r in results if r.case.level is Level.MUST
               and r.case.id not in NOT_POLLING), _said(results)


@pytest.mark.parametrize(("mode", "pinned"), [("", NYDUS_CLIENT),
                                               ("polling", NYDUS_CLIENT_POLLING)])
@pytest_twisted.ensureDeferred
async def test_nydus_client(mode: str, pinned: dict[str, Outcome]) -> None:
    node = need_interop_peer(INTEROP / "node_modules" / "nydus-client", "nydus-client")
    results = await _run(f"{node} {INTEROP / 'conform_nydus_client.mjs'} {{url}} {mode}")
    assert _outcomes(results) == _expected(pinned), _said(results)
    crashed = {r.case.id: r.reason for r in results if r.outcome is Outcome.FAIL}
    assert "TypeError" in crashed["nydus.client.packet.empty-message"] or \
        "exited with status 1" in crashed["nydus.client.packet.empty-message"]


# Each broken client, the cases that catch it and how, and unrelated cases it passes.
BROKEN_CASES = {
    "crash-unknown": {
        "nydus.client.message.unknown-type": Outcome.FAIL,
        "nydus.client.message.garbage": Outcome.FAIL,
        "nydus.client.message.bad-json": Outcome.FAIL,
        "nydus.client.packet.empty-message": Outcome.FAIL,
        "nydus.client.packet.unknown": Outcome.PASS,
        "nydus.client.result.data": Outcome.PASS,
        "nydus.client.publish.data": Outcome.PASS,
    },
    "no-pong": {
        "nydus.client.ping.pong": Outcome.FAIL,
        "nydus.client.ping.none": Outcome.PASS,
        "nydus.client.publish.data": Outcome.PASS,
    },
    # Closing the session on garbage is a fair answer; not coming back is the reconnection
    # cases' to report (it failed the MUST, as "did not work again").
    "no-reconnect": {
        "nydus.client.message.garbage": Outcome.PASS,
        "nydus.client.reconnect.closed": Outcome.INFORMATION,
        "nydus.client.publish.data": Outcome.PASS,
        "nydus.client.message.invoke": Outcome.PASS,
    },
    "tight-loop": {
        "nydus.client.reconnect.backoff": Outcome.NON_STRICT,
        "nydus.client.publish.data": Outcome.PASS,
    },
    "no-error-body": {
        "nydus.client.error.body": Outcome.NON_STRICT,
        "nydus.client.error.status": Outcome.PASS,
        "nydus.client.result.data": Outcome.PASS,
    },
    "wrong-result": {
        "nydus.client.result.data": Outcome.FAIL,
        "nydus.client.result.null": Outcome.FAIL,
        "nydus.client.error.status": Outcome.PASS,
        "nydus.client.publish.data": Outcome.PASS,
    },
    # A path written raw works with every server: the spec's "should" (it failed a MUST).
    "raw-path": {
        "nydus.client.invoke.path": Outcome.NON_STRICT,
        "nydus.client.invoke.valid": Outcome.PASS,
        "nydus.client.result.data": Outcome.PASS,
    },
}


@pytest.mark.parametrize("mode", sorted(BROKEN_CASES))
@pytest_twisted.ensureDeferred
async def test_broken_client_fails_the_right_cases(mode: str) -> None:
    expected = BROKEN_CASES[mode]
    results = await _run(f"{sys.executable} {BROKEN} {{url}} {mode}", list(expected))
    assert _outcomes(results) == expected, _said(results)


def _hostile(port: int) -> tuple[list[bytes], bytes]:
    """Hundreds of handshakes, then a POST that says it holds 100 MB: the answers' first
    lines."""
    answers = []
    for _ in range(300):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
            connection.sendall(b"GET /engine.io/?EIO=4&transport=polling HTTP/1.1\r\n"
                               b"Host: x\r\n\r\n")
            answers.append(connection.recv(200).split(b"\r\n", 1)[0])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(b"POST /engine.io/?EIO=4&transport=polling&sid=x HTTP/1.1\r\n"
                           b"Host: x\r\nContent-Length: 100000000\r\n\r\n" + b"4" * 65536)
        big = connection.recv(200).split(b"\r\n", 1)[0]
    return answers, big


@pytest_twisted.ensureDeferred
async def test_a_hostile_client_cannot_exhaust_the_site() -> None:
    site = EngineIOSite(reactor)
    listener = Listener(reactor, "http://127.0.0.1:0/engine.io/", make_factory=site.make_factory)
    await listener.start()
    try:
        assert listener.bound_port is not None
        answers, big = await threads.deferToThread(_hostile, listener.bound_port)
    finally:
        await listener.stop()
    # The site's own session limit refuses what is over it; nothing is kept without end.
    assert set(answers) <= {b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable"}, answers
    assert b"HTTP/1.1 200 OK" in answers
    assert big.startswith(b"HTTP/1.1 413"), big
    assert len(site.traces) <= TRACED_SESSIONS
    assert len(listener.held) <= 16
    assert len(site.stray) <= 200


@pytest_twisted.ensureDeferred
async def test_a_flooding_client_is_cut_off_and_its_record_bounded() -> None:
    """A client that sends thousands of messages no case reads, then a frame over maxPayload:
    the kit aborts the session past its queue limit, and its record stops at its limit."""
    from twisted.internet import defer

    from wireproto.conformance.probe import QUEUE_LIMIT, RECORD_LIMIT
    from wireproto.transports.base import MessageProtocol
    from wireproto.transports.engineio import EngineIOOptions, engineio_client_connect
    from wireproto.transports.websocket import WebSocketClientAdapter, WebSocketOptions

    site = EngineIOSite(reactor)
    listener = Listener(reactor, "http://127.0.0.1:0/engine.io/", make_factory=site.make_factory)
    await listener.start()
    lost: defer.Deferred[None] = defer.Deferred()

    class Flood(MessageProtocol):
        def connectionMade(self) -> None:
            for number in range(3 * QUEUE_LIMIT):
                self.transport.sendMessage(f'1$f{number}~/flood|"{"x" * 100}"'.encode(), False)

        def connectionLost(self, reason: object) -> None:
            if not lost.called:
                lost.callback(None)

    try:
        options = EngineIOOptions(websocket=WebSocketOptions(max_message_size=4_000_000))
        # The kit may cut it off before its connect has fired: only the end is awaited.
        engineio_client_connect(reactor, f"ws://127.0.0.1:{listener.bound_port}", Flood,
                                options).addErrback(lambda failure: None)
        await lost.addTimeout(10, reactor)
        assert len(listener.held) == 1
        flooded = listener.held[0]
        assert len(flooded.received) <= QUEUE_LIMIT
        assert len(flooded.recorder.exchanges) <= RECORD_LIMIT
        assert any("aborts the connection" in e.text for e in flooded.recorder.exchanges)
        # A second client's one frame over maxPayload closes its session.
        big: defer.Deferred[None] = defer.Deferred()

        class Big(MessageProtocol):
            def connectionMade(self) -> None:
                # Past the client's own check of maxPayload, as a hostile client would.
                WebSocketClientAdapter.sendMessage(self.transport, b"4" * 2_000_000, False)

            def connectionLost(self, reason: object) -> None:
                big.callback(None)

        engineio_client_connect(reactor, f"ws://127.0.0.1:{listener.bound_port}", Big,
                                options).addErrback(lambda failure: None)
        await big.addTimeout(10, reactor)
        assert len(listener.held) == 2
        too_big = listener.held[1]
        await too_big.closed(5.0)
        assert not too_big.received
        # Refused by the WebSocket's own limit (maxPayload), before the kit reads it.
        assert not [seen for trace in site.traces.values() for seen in trace.of("frame")
                    if seen.size > KEPT_TEXT]
    finally:
        await listener.stop()


def test_the_driver_in_the_docs_is_the_example() -> None:
    """docs/conformance.md shows the driver the tests above run, every line of it."""
    page = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    section = page.split("## nydus clients: the driver and results", 1)[1]
    shown = section.split("```text\n", 1)[1].split("```", 1)[0]
    example = (ROOT / "examples" / "conformance" / "nydus_client_driver.py").read_text()
    assert shown.strip() and shown in example


@pytest_twisted.ensureDeferred
async def test_a_clients_credentials_in_its_query_are_kept_out_of_the_record() -> None:
    """?token= and the like, as Engine.IO clients send them, are recorded as *** (the query
    was recorded as it came, and a report would have shown it)."""
    from twisted.internet import threads

    from wireproto.conformance.nydus.client.site import EngineIOSite

    site = EngineIOSite()
    listener = Listener(reactor, "http://127.0.0.1:0/engine.io/", make_factory=site.make_factory)
    await listener.start()
    url = (f"{listener.url}?EIO=4&transport=polling&token=hunter2secret"
           "&access_token=abcdefgh1234")

    def get() -> int:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as error:
            return error.code

    try:
        listener.refusing = True
        assert await threads.deferToThread(get) == 503
        listener.refusing = False
        assert await threads.deferToThread(get) == 200
    finally:
        await listener.stop()
    recorded = repr(list(site.stray)) + repr(list(site.traces.values()))
    assert "hunter2secret" not in recorded and "abcdefgh1234" not in recorded
    assert "'token': '***'" in recorded, recorded[:500]


@pytest_twisted.ensureDeferred
async def test_refused_handshakes_keep_the_attempts_bounded(monkeypatch) -> None:
    """The handshakes the site refuses count as the Listener's attempts, within its bound
    (they were appended past it)."""
    from twisted.internet import threads

    from wireproto.conformance import listener as listening
    from wireproto.conformance.nydus.client.site import EngineIOSite

    monkeypatch.setattr(listening, "ATTEMPTS_KEPT", 10)
    site = EngineIOSite()
    listener = Listener(reactor, "http://127.0.0.1:0/engine.io/", make_factory=site.make_factory)
    await listener.start()

    def handshakes() -> None:
        for _ in range(25):
            try:
                urllib.request.urlopen(f"{listener.url}?EIO=4&transport=polling", timeout=10)
            except urllib.error.HTTPError as error:
                assert error.code == 503

    try:
        listener.refusing = True
        await threads.deferToThread(handshakes)
    finally:
        await listener.stop()
    assert listener.refused == 25
    assert 10 <= len(listener.attempts) <= 20
