"""The WEBSMQ conformance kit against wireproto's own broker, over WebSocket and a length32
stream: every MUST passes, and every other outcome is pinned per case id."""

from __future__ import annotations

import os
import re
import signal

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.brokers import LOCAL, Broker
from tests.cluster.test_workers import WIREPROTO, start_supervised, stop_supervised
from tests.conformance.broken_websmq import BrokenBroker, Faults
from tests.test_cli import Child
from wireproto.conformance.catalogue import CaseResult
from wireproto.conformance.kits import kit as kit_of
from wireproto.conformance.model import Level, Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import CouldNotRun, run_case, run_cases
from wireproto.hub.message import HubSettings
from wireproto.protocols.websmq.server import WebsmqSettings
from wireproto.transports.stream import StreamOptions
from wireproto.transports.websocket import WebSocketOptions

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
    # what a transport has not is information, neither a pass nor a fail
    wanted["websmq.malformed.text-frame" if transport == "stream"
           else "websmq.malformed.stream-length-over"] = Outcome.INFORMATION
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
        assert said["websmq.malformed.stream-length-over"] == \
            "not applicable: a WebSocket frames messages itself"
    else:
        assert said["websmq.malformed.text-frame"] == \
            "not applicable: a stream has no text frames"
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



@pytest_twisted.ensureDeferred
async def test_limits_follow_the_message_size_the_kit_is_given(broker):
    """With the broker's message limit at 64 KiB and the kit told so, the largest frame and
    one byte more are judged at that size, over WebSocket (1009) and a stream."""
    limit = 65536
    where = await addresses(broker, websocket=WebSocketOptions(max_message_size=limit),
                            stream=StreamOptions(max_message_size=limit))
    for transport in ("ws", "stream"):
        target = Target("websmq", where[transport], max_message_size=limit)
        results = await run_cases(reactor, target, kit, kit.select(["websmq.body"]))
        assert outcomes(results) == baseline([case.id for case in kit.select(["websmq.body"])],
                                             transport)
        said = reasons(results)["websmq.body.one-over"]
        assert said.startswith("close code 1009" if transport == "ws" else "closed"), said


@pytest_twisted.ensureDeferred
async def test_wildcards_are_reported_when_the_broker_takes_them(broker):
    where = await addresses(broker, websmq=WebsmqSettings(wildcards=True))
    cases = kit.select(["websmq.topic.wildcard-plus", "websmq.topic.wildcard-hash"])
    results = await run_cases(reactor, Target("websmq", where["ws"]), kit, cases)
    assert reasons(results) == {
        "websmq.topic.wildcard-plus": "a + level matches one level: yes",
        "websmq.topic.wildcard-hash": "taken; it matches the levels below: yes"}


# --- Deliberately broken brokers (tests/conformance/broken_websmq.py) ------------------------


@pytest_twisted.async_yield_fixture
async def broken():
    """Start a BrokenBroker with the faults given; every one is stopped after the test."""
    started: list[BrokenBroker] = []

    async def start(faults: Faults) -> dict[str, str]:
        server = BrokenBroker(faults)
        started.append(server)
        return await server.start()

    yield start
    for server in started:
        await server.stop()


# The case each transport has no use for: information, its reason "not applicable: ..."
INAPPLICABLE = {"ws": "websmq.malformed.stream-length-over",
                "stream": "websmq.malformed.text-frame"}


def baseline(case_ids: list[str], transport: str) -> dict[str, Outcome]:
    levels = {case.id: case.level for case in kit.cases}
    return {case_id: Outcome.INFORMATION if levels[case_id] is Level.INFORMATION
            or case_id == INAPPLICABLE[transport] else Outcome.PASS for case_id in case_ids}


@pytest.mark.parametrize("transport", ["ws", "stream"])
@pytest_twisted.ensureDeferred
async def test_the_broken_brokers_control_passes_every_case(broken, transport):
    """Without faults, the broker the broken ones are made of passes every case, so that what
    they fail is their fault's doing."""
    where = await broken(Faults())
    results = await run_cases(reactor, Target("websmq", where[transport]), kit)
    assert outcomes(results) == baseline([case.id for case in kit.cases], transport), \
        reasons(results)
    assert reasons(results)["websmq.topic.wildcard-hash"].startswith("refused")


# name: (faults, transport, cases run, the outcomes that differ from the control's, and a
# fragment of each of their reasons)
BROKEN = {
    "publishes back to its sender": (
        Faults(echo=True), "stream", ["websmq.publish"],
        {"websmq.publish.to-own-publisher": (Outcome.INFORMATION, "publisher: yes")}),
    "forwards Subscribe and Unsubscribe frames": (
        Faults(forward_control=True), "ws", ["websmq.publish", "websmq.subscribe"],
        {"websmq.publish.all-subscribers": (Outcome.FAIL, "sent a Subscribe frame"),
         "websmq.publish.to-own-publisher": (Outcome.INFORMATION,
                                             "not seen: the server sent a Subscribe"),
         "websmq.subscribe.not-forwarded": (Outcome.FAIL, "must never send one")}),
    "never publishes a will": (
        Faults(no_will=True), "stream", ["websmq.will", "websmq.publish.delivered"],
        {"websmq.will.on-close": (Outcome.FAIL, "got nothing"),
         "websmq.will.on-abort": (Outcome.FAIL, "got nothing"),
         "websmq.will.on-malformed": (Outcome.NON_STRICT, "got nothing"),
         "websmq.will.empty-payload": (Outcome.FAIL, "got nothing"),
         "websmq.will.replaced": (Outcome.INFORMATION, "not seen")}),
    "publishes a will with the Publish type": (
        Faults(will_as_publish=True), "ws", ["websmq.will", "websmq.publish.delivered"],
        {"websmq.will.on-close": (Outcome.FAIL, "but got a Publish"),
         "websmq.will.on-abort": (Outcome.FAIL, "but got a Publish"),
         "websmq.will.on-malformed": (Outcome.NON_STRICT, "but got a Publish"),
         "websmq.will.empty-payload": (Outcome.FAIL, "but got a Publish"),
         "websmq.will.replaced": (Outcome.INFORMATION, "published: a Publish")}),
    "ignores Unsubscribe": (
        Faults(ignore_unsubscribe=True), "stream", ["websmq.subscribe", "websmq.publish"],
        {"websmq.subscribe.unsubscribe": (Outcome.FAIL, "after the Unsubscribe"),
         "websmq.subscribe.unsubscribe-one": (Outcome.FAIL, "but got a Publish"),
         "websmq.subscribe.unsubscribe-payload-ignored": (Outcome.NON_STRICT,
                                                          "after the Unsubscribe")}),
    "takes any topic bytes": (
        Faults(lenient_topics=True), "ws",
        ["websmq.malformed.one-byte", "websmq.malformed.topic-past-end",
         "websmq.malformed.empty-topic", "websmq.malformed.topic-non-ascii",
         "websmq.malformed.will-topic", "websmq.topic.wildcard-hash"],
        {"websmq.malformed.empty-topic": (Outcome.NON_STRICT, "it stayed open"),
         "websmq.malformed.topic-non-ascii": (Outcome.NON_STRICT, "it stayed open"),
         "websmq.malformed.will-topic": (Outcome.NON_STRICT, "it stayed open"),
         "websmq.topic.wildcard-hash": (Outcome.INFORMATION, "taken")}),
    "reads the topic length from one byte": (
        Faults(one_byte_length=True), "stream", ["websmq.topic"],
        {"websmq.topic.longest": (Outcome.NON_STRICT, "expected the publish on a topic of "
                                                      "16383 bytes"),
         "websmq.topic.one-over": (Outcome.NON_STRICT, "16383-byte topic")}),
    "cuts payloads at 64 KiB": (
        Faults(payload_cut=65536), "ws", ["websmq.body"],
        {"websmq.body.largest": (Outcome.FAIL, "with 1048546 bytes of payload")}),
    "takes frames over the limit it is said to have": (
        Faults(max_message_size=2 << 20), "stream", ["websmq.body"],
        {"websmq.body.one-over": (Outcome.NON_STRICT, "it stayed open")}),
    "stops reading after a malformed frame": (
        Faults(hang_on_malformed=True), "stream",
        ["websmq.publish.delivered", "websmq.malformed.one-byte", "websmq.malformed.before-kept",
         "websmq.will.on-malformed"],
        {"websmq.malformed.one-byte": (Outcome.NON_STRICT, "it stayed open"),
         "websmq.will.on-malformed": (Outcome.NON_STRICT, "got nothing")}),
    "closes every connection on a malformed frame": (
        Faults(drop_all_on_malformed=True), "ws",
        ["websmq.malformed.one-byte", "websmq.malformed.only-that-connection"],
        {"websmq.malformed.only-that-connection": (Outcome.NON_STRICT, "which sent nothing "
                                                   "wrong, was closed too")}),
    "crashes on a frame shorter than its header": (
        Faults(crash_on_short=True), "ws",
        ["websmq.publish.delivered", "websmq.malformed.empty-frame", "websmq.close.clean"],
        {"websmq.malformed.empty-frame": (Outcome.FAIL, "the server stopped serving after this "
                                                        "case: could not connect"),
         "websmq.close.clean": (Outcome.NON_STRICT, "could not connect")}),
}


@pytest.mark.parametrize("name", list(BROKEN))
@pytest_twisted.ensureDeferred
async def test_a_broken_broker_fails_the_right_cases(broken, name):
    faults, transport, patterns, wrong = BROKEN[name]
    where = await broken(faults)
    cases = kit.select(patterns)
    results = await run_cases(reactor, Target("websmq", where[transport]), kit, cases)
    wanted = baseline([case.id for case in cases], transport)
    wanted.update({case_id: outcome for case_id, (outcome, _) in wrong.items()})
    assert outcomes(results) == wanted, reasons(results)
    said = reasons(results)
    for case_id, (_, fragment) in wrong.items():
        assert fragment in said[case_id], (case_id, said[case_id])
    for result in results:  # a broken server cannot hold the run up past a case's timeout
        assert result.duration < result.case.timeout + 3, (result.case.id, result.duration)


@pytest_twisted.ensureDeferred
async def test_a_broker_that_delivers_nothing_cannot_be_judged(broken):
    where = await broken(Faults(delivers_nothing=True))
    started = reactor.seconds()
    with pytest.raises(CouldNotRun, match="a publish on a subscribed topic did not arrive "
                       "within 5 s of publishing it every 0.25 s"):
        await run_cases(reactor, Target("websmq", where["stream"]), kit)
    assert reactor.seconds() - started < 12


@pytest_twisted.ensureDeferred
async def test_what_a_broker_wrongly_delivers_is_said_in_short(broken):
    """Not the whole 3 MiB of it, in the error of a run that could not be run."""
    where = await broken(Faults(payload_padding=3 << 20, max_message_size=4 << 20))
    with pytest.raises(CouldNotRun) as raised:
        await run_cases(reactor, Target("websmq", where["ws"]), kit)
    said = str(raised.value)
    assert "came back as a Publish on" in said
    assert "3145733 bytes of payload b'alive" in said
    assert len(said) < 400


@pytest_twisted.ensureDeferred
async def test_a_broker_sending_text_frames_cannot_be_judged(broken):
    where = await broken(Faults(text_frames=True))
    with pytest.raises(CouldNotRun, match="text frame"):
        await run_cases(reactor, Target("websmq", where["ws"]), kit)


@pytest.mark.parametrize("transport", ["ws", "stream"])
@pytest_twisted.ensureDeferred
async def test_a_cluster_of_two_workers_passes_every_must(transport):
    """`wireproto serve --workers 2`: the kit's connections land on either worker, and what one
    publishes reaches the other's subscribers over NATS, as one broker's would."""
    supervised = await start_supervised("--listen", f"websmq+ws@tcp:0:{LOCAL}",
                                        "--listen", f"websmq+length32@tcp:0:{LOCAL}")
    try:
        address = next(address for address in supervised.addresses
                       if address.startswith("ws://" if transport == "ws" else "tcp:"))
        results = await run_cases(reactor, Target("websmq", address), kit)
    finally:
        await stop_supervised(supervised.child)
    assert outcomes(results) == expected(transport, longest_topics=False), reasons(results)


@pytest_twisted.ensureDeferred
async def test_a_paused_server_fails_cases_in_bounded_time_and_serves_again():
    """A real `wireproto serve` stopped with SIGSTOP mid-run: every case fails within its own
    timeout plus the check that follows a harmful one, and the run ends; once the process is
    continued, the same cases pass."""
    child = Child(WIREPROTO, "serve", "--listen", f"websmq+length32@tcp:0:{LOCAL}")
    try:
        await child.line(re.compile(r"wireproto: ready"), 60)
        address = next(re.match(r"wireproto: \S+ over \S+ on (\S+)", line).group(1)
                       for line in child.stdout if " over " in line)
        target = Target("websmq", address, receive_timeout=1.0)
        cases = kit.select(["websmq.publish.delivered", "websmq.malformed.one-byte"])
        assert outcomes(await run_cases(reactor, target, kit, cases)) == baseline(
            [case.id for case in cases], "stream")
        os.kill(child.process.pid, signal.SIGSTOP)
        try:
            started = reactor.seconds()
            results = [await run_case(reactor, target, kit, case, "paused") for case in cases]
            took = reactor.seconds() - started
        finally:
            os.kill(child.process.pid, signal.SIGCONT)
        assert outcomes(results) == {"websmq.publish.delivered": Outcome.FAIL,
                                     "websmq.malformed.one-byte": Outcome.FAIL}
        assert "stopped serving" in reasons(results)["websmq.malformed.one-byte"]
        assert took < 5 + 1 + 5 + 1 + 10 + 5, took  # case, close, case, close, check, slack
        assert outcomes(await run_cases(reactor, target, kit, cases)) == baseline(
            [case.id for case in cases], "stream")
    finally:
        child.process.terminate()
        await child.exit_code(30)
