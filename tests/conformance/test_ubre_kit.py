"""The UBRE kit against wireproto's own UBRE server, over WebSocket and a length32 stream: it
passes every MUST case, and every case's outcome is pinned by id."""

from __future__ import annotations

import re
from pathlib import Path

import pytest_twisted
from twisted.internet import reactor

from tests.brokers import LOCAL, Broker
from wireproto.conformance.catalogue import CaseResult
from wireproto.conformance.kits import kit as kit_of
from wireproto.conformance.model import Level, Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import run_cases
from wireproto.hub.message import HubSettings
from wireproto.protocols.ubre.server import UbreSettings
from wireproto.transports.websocket import WebSocketOptions

kit = kit_of("ubre")
ROOT = Path(__file__).resolve().parents[2]

# What wireproto's server does where the spec leaves it open (the information cases), and the
# one SHOULD it does not meet by default: it takes topics of at most 1024 characters
# (max_topic_length), where the binary format can name 65535 bytes.
INFORMATION = {
    "ubre.publish.sender-excluded": "the publisher gets its own publish: no",
    "ubre.publish.exact-topic": "topics match exactly: yes",
    "ubre.publish.json-to-binary": "the JSON body {\"c\":1} came as b'{\"c\":1}'",
    "ubre.publish.binary-to-json": "the binary body b'{\"c\":1}' came as {'c': 1}",
    "ubre.subscribe.announced": "announces topics others subscribe to: yes",
    "ubre.unsubscribe.binary": "binary unsubscribe understood: yes",
    "ubre.request.json-in-binary-frame": "answered: yes",
    "ubre.topic.longer-json": "refused: the server closed the connection",
    "ubre.topic.wildcard-characters": "a subscriber of '{topic}' got nothing; connection 2 "
                                      "closed",
    "ubre.topic.empty": "delivered",
    "ubre.malformed.json-huge-integer": "not delivered: the server closed the connection",
    "ubre.malformed.json-number-overflow": "not delivered: the server closed the connection",
}
NON_STRICT = {"ubre.topic.longest-binary": "UBRE topic of 65535 characters: this server takes "
                                           "at most 1024"}


def check(results: list[CaseResult], websocket: bool) -> None:
    for result in results:
        print(f"{result.outcome:12} {result.case.id:45} {result.duration:6.2f} {result.reason}")
    assert [result.case.id for result in results] == [case.id for case in kit.cases]
    for result in results:
        case_id, reason = result.case.id, result.reason
        if case_id in INFORMATION:
            assert result.outcome is Outcome.INFORMATION, (case_id, reason)
            expected = INFORMATION[case_id]
            if not websocket and case_id == "ubre.request.json-in-binary-frame":
                expected = "not a WebSocket: frames have no type"
            if "{topic}" in expected:
                assert re.fullmatch(re.escape(expected).replace(r"\{topic\}", r"conformance/"
                                                                r"[0-9a-f]+/\+"), reason)
            else:
                assert reason.startswith(expected), (case_id, reason)
        elif case_id in NON_STRICT:
            assert result.outcome is Outcome.NON_STRICT, (case_id, reason)
            assert reason.startswith("the server closed the connection"), reason
            assert not websocket or NON_STRICT[case_id] in reason
        else:
            assert result.outcome is Outcome.PASS, (case_id, reason)
    by_id = {result.case.id: result for result in results}
    # How it refused, where the kit says: 1002 for what is not UBRE, 1009 for too big.
    if websocket:
        assert by_id["ubre.malformed.closes"].reason.startswith("close code 1002 ")
        assert by_id["ubre.body.one-over-json"].reason.startswith("close code 1009 ")
        assert by_id["ubre.malformed.json-invalid"].reason.startswith("close code 1002 ")
    else:
        assert by_id["ubre.publish.text-frames"].reason == \
            "not a WebSocket: frames have no type"
        assert by_id["ubre.body.one-over-binary"].reason == "closed"


@pytest_twisted.ensureDeferred
async def test_wireproto_passes_every_must_case_over_websocket(broker: Broker) -> None:
    _, bound = await broker.start(f"ubre+ws@tcp:0:{LOCAL}")
    results = await run_cases(reactor, Target("ubre", bound[0].address), kit)
    check(results, websocket=True)
    assert sum(result.duration for result in results) < 45


@pytest_twisted.ensureDeferred
async def test_wireproto_passes_every_must_case_over_a_length32_stream(broker: Broker) -> None:
    _, bound = await broker.start(f"ubre+length32@tcp:0:{LOCAL}")
    address = bound[0].address
    assert address.startswith("tcp:")
    results = await run_cases(reactor, Target("ubre", address, framing="length32"), kit)
    check(results, websocket=False)


@pytest_twisted.ensureDeferred
async def test_a_server_that_takes_long_topics_passes_the_longest_topic(broker: Broker) -> None:
    _, bound = await broker.start(f"ubre+ws@tcp:0:{LOCAL}",
                                  ubre=UbreSettings(max_topic_length=0xFFFF),
                                  hub=HubSettings(max_topic_length=0xFFFF))
    cases = kit.select(["ubre.topic.longest-binary", "ubre.topic.one-over-binary"])
    results = await run_cases(reactor, Target("ubre", bound[0].address), kit, cases)
    assert {r.case.id: r.outcome for r in results} == {
        "ubre.topic.longest-binary": Outcome.PASS, "ubre.topic.one-over-binary": Outcome.PASS}


@pytest_twisted.ensureDeferred
async def test_the_message_limit_is_the_one_the_target_names(broker: Broker) -> None:
    _, bound = await broker.start(f"ubre+ws@tcp:0:{LOCAL}",
                                  websocket=WebSocketOptions(max_message_size=4096))
    target = Target("ubre", bound[0].address, max_message_size=4096)
    cases = kit.select(["ubre.body"])
    results = await run_cases(reactor, target, kit, cases)
    assert {r.case.id: r.outcome for r in results} == dict.fromkeys(
        [case.id for case in cases], Outcome.PASS)
    # Told a larger limit than the server's, the largest message is refused: a failure.
    told = Target("ubre", bound[0].address, max_message_size=8192)
    results = await run_cases(reactor, told, kit, kit.select(["ubre.body.largest-json"]))
    assert results[0].outcome is Outcome.FAIL


def test_every_case_is_cited() -> None:
    headings = {_anchor(line) for line in (ROOT / "docs/ubre.md").read_text().splitlines()
                if line.startswith("#")}
    assert len(kit.cases) >= 60
    for case in kit.cases:
        assert case.id.startswith("ubre.") and case.section, case.id
        assert case.section.split(":")[0] in ("JSON Message Format", "Binary Message Format")
        if case.decision:
            page, anchor = case.decision.split("#")
            assert page == "docs/ubre.md" and anchor in headings, case.id
        assert case.timeout < 10
    levels = {case.level for case in kit.cases}
    assert levels == {Level.MUST, Level.SHOULD, Level.INFORMATION}


def _anchor(heading: str) -> str:
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
