"""The nydus kit against wireproto's own nydus server (a broker's `nydus+engineio` listener,
with short ping timings so the heartbeat cases run): every MUST passes, and every case's
outcome is pinned by id."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.protocol import Factory, Protocol

from tests.brokers import Broker
from tests.conformance.broken_nydus import FLAWS, BrokenServer
from tests.support import free_port, wait_for
from wireproto.conformance.kits import kit
from wireproto.conformance.model import Level, Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import CouldNotRun, run_case, run_cases
from wireproto.transports.engineio import EngineIOOptions

NYDUS = kit("nydus")

# What wireproto's server does where a case only reports.
INFORMATION = {
    "nydus.engineio.polling.binary",
    "nydus.ignored.welcome",
    "nydus.ignored.result",
    "nydus.ignored.error",
    "nydus.ignored.publish",
    "nydus.publish.unsubscribed",
}


def expected_outcome(case_id: str) -> Outcome:
    return Outcome.INFORMATION if case_id in INFORMATION else Outcome.PASS


async def start_wireproto(broker: Broker) -> str:
    port = free_port()
    await broker.start(f"nydus+engineio@tcp:{port}:interface=127.0.0.1",
                       engineio=EngineIOOptions(ping_interval=1.0, ping_timeout=1.0))
    return f"http://127.0.0.1:{port}/engine.io/"


def test_catalogue_is_thorough() -> None:
    ids = [case.id for case in NYDUS.cases]
    assert len(ids) == len(set(ids)) >= 60
    groups = {case.group for case in NYDUS.cases}
    assert {"nydus.engineio.handshake", "nydus.engineio.polling", "nydus.engineio.upgrade",
            "nydus.engineio.ping", "nydus.engineio.close", "nydus.engineio.packet",
            "nydus.welcome", "nydus.invoke", "nydus.publish", "nydus.malformed"} <= groups
    assert all(case.harmful for case in NYDUS.cases if case.group == "nydus.malformed")
    assert all(case.timeout < 10 for case in NYDUS.cases)
    assert NYDUS.alive is not None


@pytest_twisted.ensureDeferred
async def test_wireproto_passes_every_case(broker: Broker) -> None:
    url = await start_wireproto(broker)
    results = await run_cases(reactor, Target("nydus", url), NYDUS)
    got = {result.case.id: result.outcome for result in results}
    reasons = {r.case.id: r.reason for r in results if r.outcome is not expected_outcome(r.case.id)}
    assert reasons == {}
    assert got == {case.id: expected_outcome(case.id) for case in NYDUS.cases}
    said = {r.case.id: r.reason for r in results if r.case.id in INFORMATION}
    # A binary message is read as a UTF-8 nydus string, as on wireproto's raw WebSocket.
    assert said.pop("nydus.engineio.polling.binary") == (
        "took the POST and answered the poll with "
        "'43$b1|{\"message\":\"Not Found\",\"status\":404}'")
    assert said.pop("nydus.publish.unsubscribed") == "PUBLISH unasked: none within 1 s"
    assert set(said.values()) == {"ignored it: the INVOKE after it was answered"}
    assert all(r.exchanges for r in results)
    assert not [r.case.id for r in results
                if r.case.level is Level.MUST and r.outcome is not Outcome.PASS]


@pytest_twisted.ensureDeferred
async def test_ws_address_is_the_same_server(broker: Broker) -> None:
    url = await start_wireproto(broker)
    target = Target("nydus", url.replace("http://", "ws://"))
    chosen = NYDUS.select(["nydus.engineio.upgrade", "nydus.invoke.pairing"])
    results = await run_cases(reactor, target, NYDUS, chosen)
    assert {r.case.id: r.outcome for r in results} == {case.id: Outcome.PASS for case in chosen}


@pytest_twisted.ensureDeferred
async def test_a_ping_too_slow_to_wait_for_is_not_applicable(broker: Broker) -> None:
    """With engine.io's pingInterval of 25 s the heartbeat cases cannot wait for a ping: they
    say so, as information, where they passed without looking."""
    port = free_port()
    await broker.start(f"nydus+engineio@tcp:{port}:interface=127.0.0.1",
                       engineio=EngineIOOptions(ping_interval=25.0, ping_timeout=20.0))
    chosen = NYDUS.select(["nydus.engineio.ping.server", "nydus.engineio.ping.timeout"])
    results = await run_cases(reactor, Target("nydus", f"http://127.0.0.1:{port}/engine.io/"),
                              NYDUS, chosen)
    assert {r.case.id: (r.outcome, r.reason) for r in results} == {
        "nydus.engineio.ping.server": (
            Outcome.INFORMATION,
            "not applicable: pingInterval is 25000 ms, longer than the case's 7 s can wait "
            "(--timeout gives it longer)"),
        "nydus.engineio.ping.timeout": (
            Outcome.INFORMATION,
            "not applicable: pingInterval + pingTimeout is 45 s, longer than the case's 7 s "
            "can wait (--timeout gives it longer)"),
    }


@pytest_twisted.ensureDeferred
async def test_a_longer_timeout_lets_the_heartbeat_case_wait(broker: Broker) -> None:
    """--timeout reaches the heartbeat cases: given 12 s, the ping of an 8 s pingInterval is
    waited for and judged (the case's wait was fixed at 7 s whatever --timeout said)."""
    port = free_port()
    await broker.start(f"nydus+engineio@tcp:{port}:interface=127.0.0.1",
                       engineio=EngineIOOptions(ping_interval=8.0, ping_timeout=5.0))
    chosen = [dataclasses.replace(case, timeout=12.0)
              for case in NYDUS.select(["nydus.engineio.ping.server"])]
    results = await run_cases(reactor, Target("nydus", f"http://127.0.0.1:{port}/engine.io/"),
                              NYDUS, chosen)
    assert [(r.outcome, r.reason) for r in results] == [(Outcome.PASS, "")]


# -- Broken servers -------------------------------------------------------------------------

# For each broken server (tests/conformance/broken_nydus.py), the cases it does not pass, with
# their outcomes, where wireproto's server passes (or, for information cases, says) them.
F, N = Outcome.FAIL, Outcome.NON_STRICT
MALFORMED = {case.id: F if case.level is Level.MUST else N
             for case in NYDUS.cases if case.group == "nydus.malformed"}
CAUGHT: dict[str, dict[str, Outcome]] = {
    # Only the case that judges the WELCOME: the others note it and go on.
    "wrong-welcome": {"nydus.welcome.version": F},
    "cuts-ids": {"nydus.invoke.id-longest": F},
    "answers-twice": {
        "nydus.engineio.polling.payload": F,  # p1 answered twice before p2
        "nydus.invoke.one-answer": F,
        "nydus.invoke.pairing": F,
        "nydus.invoke.data-types": F,
    },
    "no-status": {"nydus.invoke.not-found-404": N},
    # Ignoring what does not parse is no MUST failed: only the SHOULD that it ends the session.
    "keeps-malformed": {"nydus.malformed.closes": N},
    "answers-malformed": MALFORMED,
    # An ERROR for the id of an INVOKE that does not parse is what the spec asks of an invalid
    # path: no case fails (it failed four MUSTs: found by an attack).
    "refuses-invalid-invokes": {},
    # The crash is seen by the check that the server still serves after the case; every case
    # after it fails too, as the server is gone (so only two cases are run there).
    "crashes-on-escape": {"nydus.malformed.path-bad-escape": F},
    # Every case that opens a polling session.
    "bad-open-packet": {
        "nydus.engineio.handshake.polling": F,
        "nydus.engineio.handshake.upgrades": N,
        "nydus.engineio.polling.payload": F,
        "nydus.engineio.polling.largest": F,
        "nydus.engineio.polling.over-max-payload": N,
        "nydus.engineio.polling.close": N,
        "nydus.engineio.polling.unknown-packet": N,
        "nydus.engineio.upgrade.probe": F,
        "nydus.engineio.upgrade.noop": F,
        "nydus.engineio.upgrade.complete": F,
    },
    "unknown-sid-ok": {
        "nydus.engineio.polling.unknown-sid": F,
        "nydus.engineio.polling.unknown-sid-post": F,
        "nydus.engineio.polling.close": N,  # a poll after the close packet gets 200
    },
    # Over-publishing is allowed: the cases pass PUBLISHes over, and one reports them.
    "over-publishes": {},
    "short-paths": {"nydus.invoke.path-longest": N},
    "takes-over-max-payload": {"nydus.engineio.polling.over-max-payload": N},
}


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("flaw", sorted(FLAWS))
async def test_a_broken_server_fails_the_right_cases(flaw: str) -> None:
    server = BrokenServer(flaw)
    url = await server.start()
    cases = None
    if flaw == "crashes-on-escape":
        cases = NYDUS.select(["nydus.malformed.bad-json", "nydus.malformed.path-bad-escape"])
    try:
        results = await run_cases(reactor, Target("nydus", url), NYDUS, cases)
    finally:
        await server.stop()
    got = {r.case.id: r.outcome for r in results if r.outcome is not expected_outcome(r.case.id)}
    assert got == CAUGHT[flaw]
    if flaw == "crashes-on-escape":
        assert "the server stopped serving after this case" in results[-1].reason
    if flaw == "over-publishes":
        said = {r.case.id: r.reason for r in results}
        assert said["nydus.publish.unsubscribed"] == (
            "PUBLISH unasked: yes, Publish(path='/news', data={'headline': 'over-published'})")


class Silent(Protocol):
    """Takes a connection and says nothing, ever."""


@pytest_twisted.ensureDeferred
async def test_a_silent_server_hangs_no_case() -> None:
    port = await wait_for(TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
        Factory.forProtocol(Silent)))
    url = f"http://127.0.0.1:{port.getHost().port}/engine.io/"
    target = Target("nydus", url, receive_timeout=0.5)
    try:
        for case_id in ("nydus.engineio.handshake.polling", "nydus.engineio.upgrade.noop",
                        "nydus.welcome.version"):
            case = next(case for case in NYDUS.cases if case.id == case_id)
            started = reactor.seconds()
            result = await run_case(reactor, target, NYDUS, case, "silent")
            assert result.outcome is Outcome.FAIL, case_id
            assert reactor.seconds() - started < case.timeout + 3, case_id
        with pytest.raises(CouldNotRun):
            await run_cases(reactor, target, NYDUS)
    finally:
        await wait_for(defer.maybeDeferred(port.stopListening))


@pytest_twisted.ensureDeferred
async def test_over_tls_with_a_cafile(broker: Broker, tls_files: Any) -> None:
    """https:// and wss:// with the target's --cafile: polling, the upgrade and a session."""
    tls = f"ssl:0:interface=127.0.0.1:privateKey={tls_files.key}:certKey={tls_files.cert}"
    _, bound = await broker.start(f"nydus+engineio@{tls}")
    port = int(bound[0].address.split(":")[2].split("/")[0])
    chosen = NYDUS.select(["nydus.engineio.handshake.polling", "nydus.engineio.upgrade.complete",
                           "nydus.invoke.not-found"])
    trusted = Target("nydus", f"https://localhost:{port}/engine.io/", cafile=str(tls_files.cert))
    results = await run_cases(reactor, trusted, NYDUS, chosen)
    assert {r.case.id: r.outcome for r in results} == {case.id: Outcome.PASS for case in chosen}
    # The system's trust roots do not know that certificate: on polling as on the WebSocket.
    untrusted = Target("nydus", f"https://localhost:{port}/engine.io/")
    polled = await run_case(reactor, untrusted, NYDUS, chosen[0], "tls")
    assert polled.outcome is Outcome.FAIL
    assert "certificate verify failed" in polled.reason
    with pytest.raises(CouldNotRun):
        await run_cases(reactor, untrusted, NYDUS, chosen)


@pytest_twisted.ensureDeferred
async def test_a_huge_max_payload_is_not_sent(broker: Broker) -> None:
    """A server may announce any maxPayload: the kit goes over it only up to 16 MiB."""
    port = free_port()
    await broker.start(f"nydus+engineio@tcp:{port}:interface=127.0.0.1",
                       engineio=EngineIOOptions(max_payload=64 * 1024 * 1024))
    chosen = NYDUS.select(["nydus.engineio.polling.over-max-payload",
                           "nydus.engineio.packet.over-max-payload"])
    target = Target("nydus", f"http://127.0.0.1:{port}/engine.io/")
    results = await run_cases(reactor, target, NYDUS, chosen)
    assert [(r.outcome, r.reason) for r in results] == [
        (Outcome.PASS, "not tried: maxPayload 67108864 is more than the kit sends")] * 2
