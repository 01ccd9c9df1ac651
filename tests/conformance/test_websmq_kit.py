"""The WEBSMQ conformance kit against wireproto's own broker, over WebSocket and a length32
stream: every MUST passes, and every other outcome is pinned per case id."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.brokers import Broker
from wireproto.conformance.catalogue import CaseResult
from wireproto.conformance.kits import kit as kit_of
from wireproto.conformance.model import Level, Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import run_cases
from wireproto.hub.message import HubSettings

kit = kit_of("websmq")

LISTENERS = ("websmq+ws@tcp:0:interface=127.0.0.1", "websmq+length32@tcp:0:interface=127.0.0.1")

# What wireproto's broker does where the spec leaves it open (information cases).
INFORMATION = {
    "websmq.publish.to-own-publisher": "delivered back to its publisher: no",
    "websmq.topic.escape-case": "one topic: no",
    "websmq.topic.wildcard-plus": "a + level matches one level: no",
    "websmq.will.replaced": "published: a LastWill on ",
}


def outcomes(results: list[CaseResult]) -> dict[str, Outcome]:
    return {result.case.id: result.outcome for result in results}


def reasons(results: list[CaseResult]) -> dict[str, str]:
    return {result.case.id: result.reason for result in results}


async def addresses(broker: Broker, **tables: object) -> dict[str, str]:
    _, bound = await broker.start(*LISTENERS, **tables)
    return {"ws": bound[0].address, "stream": bound[1].address}


def expected(transport: str, *, longest_topics: bool) -> dict[str, Outcome]:
    """Pass everywhere, but for information cases, and for the topics over [hub]
    max_topic_length (1024 by default: a 16383-byte topic closes the connection)."""
    wanted = {case.id: Outcome.INFORMATION if case.level is Level.INFORMATION else Outcome.PASS
              for case in kit.cases}
    if not longest_topics:
        wanted["websmq.topic.longest"] = Outcome.NON_STRICT
        wanted["websmq.topic.one-over"] = Outcome.NON_STRICT
    return wanted


@pytest.mark.parametrize("transport", ["ws", "stream"])
@pytest_twisted.ensureDeferred
async def test_wireproto_broker_passes_every_must(broker, transport):
    where = await addresses(broker)
    target = Target("websmq", where[transport])
    results = await run_cases(reactor, target, kit)
    assert [result.case.id for result in results] == [case.id for case in kit.cases]
    assert outcomes(results) == expected(transport, longest_topics=False), reasons(results)
    said = reasons(results)
    for case_id, start in INFORMATION.items():
        assert said[case_id].startswith(start), (case_id, said[case_id])
    # the broker's own reading of the decisions the kit reports on
    assert "refused: close code 1002" in said["websmq.topic.wildcard-hash"] or \
        transport == "stream"
    assert said["websmq.will.replaced"].count("LastWill") == 1
    assert "second" in said["websmq.will.replaced"]
    if transport == "ws":
        assert said["websmq.body.one-over"].startswith("close code 1009")
        assert said["websmq.malformed.one-byte"].startswith("close code 1002")
    else:
        assert said["websmq.malformed.text-frame"].startswith("not applicable")
    assert len(kit.cases) >= 50


@pytest_twisted.ensureDeferred
async def test_the_longest_topic_passes_when_the_broker_takes_it(broker):
    """The two topic cases the default [hub] max_topic_length fails pass once it is 16383."""
    where = await addresses(broker, hub=HubSettings(max_topic_length=16383))
    for transport in ("ws", "stream"):
        results = await run_cases(reactor, Target("websmq", where[transport]), kit,
                                  kit.select(["websmq.topic.longest", "websmq.topic.one-over"]))
        assert outcomes(results) == {"websmq.topic.longest": Outcome.PASS,
                                     "websmq.topic.one-over": Outcome.PASS}, reasons(results)
