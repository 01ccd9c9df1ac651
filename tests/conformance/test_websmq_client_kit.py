"""The WEBSMQ client kit against wireproto's own WEBSMQ client (examples/conformance/
websmq_client_driver.py, started by the kit for each case as --run does), over WebSocket and a
length32 stream: every MUST passes and every other outcome is pinned per case id; then
deliberately broken clients (tests/conformance/broken_websmq_clients.py), each caught by the
right cases, and clients that attack the kit."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from wireproto.conformance.catalogue import CaseResult
from wireproto.conformance.kits import kit as kit_of
from wireproto.conformance.listener import HELD_LIMIT, Listener
from wireproto.conformance.model import Level, Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import ClientRun, CouldNotRun, run_client_cases

kit = kit_of("websmq", "client")

ROOT = Path(__file__).resolve().parents[2]
DRIVER = f"{sys.executable} {ROOT / 'examples' / 'conformance' / 'websmq_client_driver.py'} {{url}}"
ADDRESSES = {"ws": "ws://127.0.0.1:0/websmq", "stream": "tcp:0:interface=127.0.0.1"}

# The cases a transport has not the means for: information, "not applicable: ...".
WEBSOCKET_ONLY = ("websmq.client.send.binary-frames", "websmq.client.malformed.text-frame",
                  "websmq.client.websocket.ping", "websmq.client.websocket.fragmented",
                  "websmq.client.websocket.close-echoed")
STREAM_ONLY = ("websmq.client.malformed.stream-length-over",)

# What wireproto's client (and driver) does where the spec leaves it open, by reason's start.
INFORMATION = {
    "websmq.client.send.order": "LastWill 'conformance/will'; Subscribe 'conformance/command'; "
                                "Subscribe 'conformance/in'",
    "websmq.client.receive.megabyte": "echoed whole",
    "websmq.client.reconnect.after-close": "connected again after",
    "websmq.client.reconnect.after-error": "connected again after",
    "websmq.client.reconnect.after-abort": "connected again after",
    "websmq.client.reconnect.server-gone": "connected again after",
}


def outcomes(results: list[CaseResult]) -> dict[str, Outcome]:
    return {result.case.id: result.outcome for result in results}


def reasons(results: list[CaseResult]) -> dict[str, str]:
    return {result.case.id: result.reason for result in results}


def baseline(case_ids: list[str], transport: str) -> dict[str, Outcome]:
    """Pass, but for information cases and the cases the transport has not the means for."""
    levels = {case.id: case.level for case in kit.cases}
    inapplicable = STREAM_ONLY if transport == "ws" else WEBSOCKET_ONLY
    return {case_id: Outcome.INFORMATION if levels[case_id] is Level.INFORMATION
            or case_id in inapplicable else Outcome.PASS for case_id in case_ids}


async def run(command: str | None, transport: str = "ws",
              patterns: list[str] | None = None) -> list[CaseResult]:
    listener = Listener(reactor, ADDRESSES[transport],
                        framing="length32" if transport == "stream" else None)
    await listener.start()
    try:
        client_run = ClientRun(reactor, listener, command, first_wait=20.0)
        cases = kit.select(patterns) if patterns else None
        return await run_client_cases(client_run, Target("websmq", listener.url), kit, cases)
    finally:
        await listener.stop()


def broken(fault: str) -> str:
    return f"{sys.executable} -m tests.conformance.broken_websmq_clients {fault} {{url}}"


@pytest.mark.parametrize("transport", ["ws", "stream"])
@pytest_twisted.ensureDeferred
async def test_wireproto_client_passes_every_must(transport):
    started = time.monotonic()
    results = await run(DRIVER, transport)
    assert time.monotonic() - started < 150
    assert [result.case.id for result in results] == [case.id for case in kit.cases]
    assert outcomes(results) == baseline([case.id for case in kit.cases], transport), \
        reasons(results)
    said = reasons(results)
    for case_id, start in INFORMATION.items():
        assert said[case_id].startswith(start), (case_id, said[case_id])
    # it refuses a topic that may not go on the wire, and says why
    assert said["websmq.client.topic.one-over"].startswith("refused: error: WEBSMQ topic of "
                                                           "16384 bytes is too long")
    assert said["websmq.client.topic.space"].startswith("refused: error: ")
    # it closes on a frame it cannot read: over WebSocket with 1002 and what was wrong
    closes = said["websmq.client.malformed.closes"]
    if transport == "ws":
        assert closes == ("closed the connection (close code 1002 'WEBSMQ frame of 1 byte: "
                          "the header needs 2')")
        assert said["websmq.client.websocket.close-echoed"] == "close code 1000"
    else:
        assert closes == "closed the connection (closed)"
        assert said["websmq.client.malformed.stream-length-over"].startswith("closed")
    assert said["websmq.client.receive.unsubscribed-topic"].startswith("kept working")
    # pauses of about 0.5, 1, 2, 4, 8 s: 4 attempts in 12 s, 3 on a slow machine
    backoff = said["websmq.client.reconnect.backoff"]
    assert re.match(r"[345] attempts in 12 s; first after 0\.\d+ s, then pauses of ",
                    backoff), backoff


@pytest_twisted.ensureDeferred
async def test_the_broken_clients_control_passes_every_case():
    """Without a fault, the client the broken ones are made of passes every case, so that what
    they fail is their fault's doing; unlike wireproto's, it ignores what it cannot read."""
    results = await run(broken("control"))
    assert outcomes(results) == baseline([case.id for case in kit.cases], "ws"), \
        reasons(results)
    said = reasons(results)
    assert said["websmq.client.malformed.closes"].startswith("kept working")
    assert said["websmq.client.malformed.one-byte"].startswith("kept working")


# fault: (cases run, the outcomes that differ from the control's, a fragment of each reason)
NOT_SEEN = "not seen: "
BROKEN = {
    # A driver that ends (status 0) when a hostile frame made it close passes: the contract
    # lets it (it failed each such MUST, its end taken for a crash).
    "exits-on-close": (
        ["websmq.client.malformed.empty-frame", "websmq.client.malformed.one-byte"],
        {}),
    # A client "can" declare a will: one that does not is not judged on it (it failed a MUST).
    "no-will": (
        ["websmq.client.send", "websmq.client.receive.publish"],
        {"websmq.client.send.will": (Outcome.INFORMATION, "not applicable: the client "
                                     "declared no will"),
         "websmq.client.send.order": (Outcome.INFORMATION, "Subscribe 'conformance/command'")}),
    "wrong-will": (
        ["websmq.client.send", "websmq.client.receive.publish"],
        {"websmq.client.send.will": (Outcome.FAIL, "expected a Last Will on 'conformance/will'"),
         "websmq.client.send.order": (Outcome.INFORMATION, "LastWill 'conformance/will'")}),
    "publishes-will": (
        ["websmq.client.send", "websmq.client.receive.publish"],
        {"websmq.client.send.will-not-published": (Outcome.FAIL, "a Publish on "
                                                   "'conformance/will'"),
         "websmq.client.send.order": (Outcome.INFORMATION, "Publish 'conformance/will'")}),
    "subscribe-payload": (
        ["websmq.client.send", "websmq.client.receive.publish"],
        {"websmq.client.send.subscribe-no-payload": (Outcome.NON_STRICT, "7 bytes of payload")}),
    "second-byte-length": (
        ["websmq.client.topic", "websmq.client.send.subscribe"],
        {"websmq.client.topic.long": (Outcome.FAIL, "expected a Subscribe to the 300-byte "
                                                    "topic"),
         "websmq.client.topic.longest": (Outcome.NON_STRICT, "the 16383-byte topic")}),
    "no-topic-check": (
        ["websmq.client.topic", "websmq.client.send.subscribe"],
        {"websmq.client.topic.one-over": (Outcome.FAIL, "empty topic"),
         "websmq.client.topic.space": (Outcome.NON_STRICT, "must be percent-encoded"),
         "websmq.client.topic.non-ascii": (Outcome.NON_STRICT, "not ASCII")}),
    "crash-on-unknown-type": (
        ["websmq.client.receive", "websmq.client.malformed.one-byte"],
        {"websmq.client.receive.subscribe-frame": (Outcome.FAIL, "exited with status 4"),
         "websmq.client.receive.unsubscribe-frame": (Outcome.FAIL, "exited with status 4")}),
    "crash-on-malformed": (
        ["websmq.client.malformed", "websmq.client.receive.subscribe-frame"],
        {f"websmq.client.malformed.{name}": (Outcome.FAIL, "exited with status 3")
         for name in ("empty-frame", "one-byte", "topic-past-end", "empty-topic",
                      "topic-invalid", "garbage", "text-frame")}
        | {"websmq.client.malformed.closes": (Outcome.INFORMATION,
                                              "and its process exited with status 3")}),
    "ignores-wills": (
        ["websmq.client.receive.publish", "websmq.client.receive.last-will"],
        {"websmq.client.receive.last-will": (Outcome.FAIL, "expected the echo of the will")}),
    "drops-empty": (
        ["websmq.client.receive.empty-payload", "websmq.client.send.publish-empty",
         "websmq.client.receive.publish"],
        {"websmq.client.receive.empty-payload": (Outcome.FAIL, "the echo of an empty payload"),
         "websmq.client.send.publish-empty": (Outcome.FAIL, "the echo of an empty payload")}),
    "small-limit": (
        ["websmq.client.receive"],
        {"websmq.client.receive.large": (Outcome.NON_STRICT, "closed"),
         "websmq.client.receive.megabyte": (Outcome.INFORMATION, NOT_SEEN)}),
    "no-pong": (
        ["websmq.client.websocket", "websmq.client.receive.publish"],
        {"websmq.client.websocket.ping": (Outcome.FAIL, "expected a pong with 'conformance'")}),
    "no-close-reply": (
        ["websmq.client.websocket", "websmq.client.receive.publish"],
        {"websmq.client.websocket.close-echoed": (Outcome.FAIL, "without the close "
                                                  "handshake")}),
    "no-reconnect": (
        ["websmq.client.reconnect.after-close", "websmq.client.reconnect.after-abort",
         "websmq.client.reconnect.resubscribes", "websmq.client.reconnect.backoff",
         "websmq.client.receive.publish"],
        {"websmq.client.reconnect.after-close": (Outcome.INFORMATION, "did not connect again"),
         "websmq.client.reconnect.after-abort": (Outcome.INFORMATION, "did not connect again"),
         "websmq.client.reconnect.resubscribes": (Outcome.INFORMATION, "not applicable"),
         "websmq.client.reconnect.backoff": (Outcome.INFORMATION, "not applicable")}),
    "tight-loop": (
        ["websmq.client.reconnect.backoff", "websmq.client.receive.publish"],
        {"websmq.client.reconnect.backoff": (Outcome.NON_STRICT, "the pauses did not grow")}),
    "freezes": (
        ["websmq.client.receive.unsubscribed-topic", "websmq.client.receive.publish",
         "websmq.client.malformed.one-byte"],
        {"websmq.client.receive.unsubscribed-topic": (Outcome.FAIL, "neither kept working nor "
                                                      "closed the connection"),
         "websmq.client.malformed.one-byte": (Outcome.FAIL, "neither kept working")}),
    "no-resubscribe": (
        ["websmq.client.reconnect.resubscribes", "websmq.client.reconnect.after-close",
         "websmq.client.receive.publish"],
        {"websmq.client.reconnect.resubscribes": (Outcome.NON_STRICT, "expected the client's "
                                                  "Subscribe to 'conformance/in'")}),
}


@pytest.mark.parametrize("fault", list(BROKEN))
@pytest_twisted.ensureDeferred
async def test_a_broken_client_fails_the_right_cases(fault):
    patterns, wrong = BROKEN[fault]
    cases = kit.select(patterns)
    results = await run(broken(fault), "ws", patterns)
    wanted = baseline([case.id for case in cases], "ws")
    wanted.update({case_id: outcome for case_id, (outcome, _) in wrong.items()})
    assert outcomes(results) == wanted, reasons(results)
    said = reasons(results)
    for case_id, (_, fragment) in wrong.items():
        assert fragment in said[case_id], (case_id, said[case_id])
    for result in results:  # a broken client cannot hold the run up past a case's timeout
        assert result.duration < result.case.timeout + 4, (result.case.id, result.duration)


@pytest_twisted.ensureDeferred
async def test_a_client_sending_text_frames_cannot_be_judged():
    with pytest.raises(CouldNotRun, match="websmq client could not be judged: .*(text|UTF-8)"):
        await run(broken("text-frames"), "ws", ["websmq.client.receive.publish"])


# --- Clients that attack the kit -------------------------------------------------------------


# What stops a run against a client that attacks the kit before the first case (None: none).
ATTACKS = {
    "flood": "but the client published 1000000 bytes",
    "huge": "WebSocket closed with code 1009",
    "many-connections": None,
    "never-closes": None,
}


@pytest.mark.parametrize("fault", list(ATTACKS))
@pytest_twisted.ensureDeferred
async def test_a_client_attacking_the_kit_cannot_hang_or_swell_it(fault):
    """A flood of 1 MB frames, one frame of 100 MB (over the kit's 64 MiB), 300 connections at
    once, a connection that is never closed: the run ends in bounded time (the first two as
    "could not be judged", saying why), the kit holds at most HELD_LIMIT connections no case
    took, and what it recorded of each case stays bounded."""
    listener = Listener(reactor, ADDRESSES["ws"])
    await listener.start()
    started = time.monotonic()
    try:
        client_run = ClientRun(reactor, listener, broken(fault), first_wait=20.0)
        cases = kit.select(["websmq.client.receive.publish", "websmq.client.send.will"])
        try:
            results = await run_client_cases(client_run, Target("websmq", listener.url), kit,
                                             cases)
        except CouldNotRun as error:
            assert ATTACKS[fault] is not None and ATTACKS[fault] in str(error), error
            assert len(str(error)) < 600
            results = []
        else:
            assert ATTACKS[fault] is None, reasons(results)
        assert len(listener.held) <= HELD_LIMIT
    finally:
        await listener.stop()
    assert time.monotonic() - started < 60
    for result in results:
        assert result.duration < result.case.timeout + 4, (result.case.id, result.duration)
        kept = sum(len(exchange.data or b"") for exchange in result.exchanges)
        assert kept < 2_000_000, (result.case.id, kept)
    if ATTACKS[fault] is None:
        assert outcomes(results) == baseline([case.id for case in cases], "ws"), \
            reasons(results)


@pytest_twisted.ensureDeferred
async def test_a_client_started_by_hand_is_judged_case_after_case(tmp_path):
    """Without --run the kit judges the one client the user started: it connects again after
    each case (the kit closes the case's connection at its end)."""
    listener = Listener(reactor, ADDRESSES["stream"], framing="length32")
    await listener.start()
    output = (tmp_path / "driver.log").open("w")
    driver = subprocess.Popen([*DRIVER.replace("{url}", listener.url).split()],
                              stdout=output, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        patterns = ["websmq.client.receive.publish", "websmq.client.malformed.one-byte",
                    "websmq.client.reconnect.after-close", "websmq.client.send.will"]
        client_run = ClientRun(reactor, listener, None, first_wait=20.0)
        results = await run_client_cases(client_run, Target("websmq", listener.url), kit,
                                         kit.select(patterns))
    finally:
        driver.kill()
        driver.wait(10)
        output.close()
        await listener.stop()
    assert outcomes(results) == baseline([result.case.id for result in results], "stream"), \
        reasons(results)


def test_the_driver_docs_show_is_the_example_driver():
    """docs/conformance.md shows the driver's heart; every line of it is the example's."""
    page = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    section = page.split("## WEBSMQ clients: the driver and results", 1)[1]
    shown = section.split("`wireproto.protocols.websmq.connect`:\n\n```text\n", 1)[1]
    shown = shown.split("```", 1)[0]
    example = (ROOT / "examples" / "conformance" / "websmq_client_driver.py").read_text(
        encoding="utf-8")
    lines = [line.split("  # again():")[0].rstrip() for line in shown.splitlines()]
    missing = [line for line in lines if line.strip() and line not in example]
    assert not missing, missing
    assert len([line for line in lines if line.strip()]) >= 20
