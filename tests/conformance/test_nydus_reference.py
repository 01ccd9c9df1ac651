"""The nydus kit against the real, unmodified nydus 5.3.2 server over engine.io 6 (npm,
tests/interop/nydus_server.mjs): every case's outcome is pinned by id. Where the real server
does not pass, docs/conformance.md ("nydus: results of wireproto and the references") says why.

A case that crashes the real server fails (the kit's check that the server still serves sees it
gone); the next case then runs on a new server, so that one crash does not fail the rest."""

from __future__ import annotations

from pathlib import Path

import pytest_twisted
from twisted.internet import reactor

from tests.node_peer import NodePeer, NodePeers
from tests.support import need_interop_peer
from wireproto.conformance.catalogue import CaseResult
from wireproto.conformance.kits import kit
from wireproto.conformance.model import Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import run_cases

INTEROP = Path(__file__).resolve().parents[1] / "interop"
SERVER = INTEROP / "nydus_server.mjs"
NYDUS = kit("nydus")

# The real server's results that are not a pass, by case id; every other case passes.
NOT_PASSED = {
    # What it does where a case only reports.
    "nydus.engineio.polling.binary": Outcome.INFORMATION,
    "nydus.ignored.welcome": Outcome.INFORMATION,
    "nydus.ignored.result": Outcome.INFORMATION,
    "nydus.ignored.error": Outcome.INFORMATION,
    "nydus.ignored.publish": Outcome.INFORMATION,
    "nydus.publish.unsubscribed": Outcome.INFORMATION,
    # engine.io leaves closing the WebSocket to the client that sent the close packet.
    "nydus.engineio.close.websocket": Outcome.NON_STRICT,
    # nydus-protocol 3.0.0 lets these in, where wireproto decided they are malformed (" |3", a
    # space for the type, it lets in too, but does not answer: a pass).
    "nydus.malformed.id-characters": Outcome.NON_STRICT,
    "nydus.malformed.id-too-long": Outcome.NON_STRICT,
    # (A path of 1025 characters it lets through too, and answers with an ERROR 404 for the
    # INVOKE's id: an answer the kit takes, since a server may refuse an invalid path so.)
    # The real server crashes on these, taking every client with it.
    "nydus.malformed.empty": Outcome.FAIL,
    "nydus.malformed.path-bad-escape": Outcome.FAIL,
    "nydus.malformed.path-not-utf8": Outcome.FAIL,
}
CRASHES = {id_ for id_, outcome in NOT_PASSED.items() if outcome is Outcome.FAIL}


async def run_against_the_real_server(peers: NodePeers) -> list[CaseResult]:
    results: list[CaseResult] = []
    node: NodePeer | None = None
    url = ""
    for case in NYDUS.cases:
        if node is None or node.ended.called:
            node = await peers.start(SERVER, ready="listening")
            url = f"http://127.0.0.1:{node.of('listening')[-1]['port']}/engine.io/"
        (result,) = await run_cases(reactor, Target("nydus", url), NYDUS, [case])
        results.append(result)
        if "stopped serving" in result.reason:
            await node.stop()  # it crashed, or hangs: a new one for the next case
            node = None
    return results


@pytest_twisted.ensureDeferred
async def test_the_real_nydus_server_results_are_pinned() -> None:
    executable = need_interop_peer(INTEROP / "node_modules" / "nydus", "the nydus server")
    peers = NodePeers(executable)
    try:
        results = await run_against_the_real_server(peers)
    finally:
        await peers.stop()
    got = {r.case.id: r.outcome for r in results}
    assert got == {case.id: NOT_PASSED.get(case.id, Outcome.PASS) for case in NYDUS.cases}
    reasons = {r.case.id: r.reason for r in results}
    assert {id_ for id_, reason in reasons.items() if "stopped serving" in reason} == CRASHES
    # It answers what wireproto refuses, as if the id or path were fine.
    assert '3$a b|{"message":"Not Found","status":404}' in reasons["nydus.malformed.id-characters"]
    assert "stayed open" in reasons["nydus.engineio.close.websocket"]
    # A binary message is no nydus string to it: a parser error, which closes the session.
    binary = reasons["nydus.engineio.polling.binary"]
    assert binary.startswith("took the POST and answered the poll with '") and \
        binary.endswith("1'"), binary  # ...its close packet, after a noop
    assert all(reasons[id_] == "ignored it: the INVOKE after it was answered"
               for id_ in reasons if id_.startswith("nydus.ignored."))
