"""The SubbleSocket client kit against wireproto's own client (examples/conformance/
subble_client_driver.py, started by the kit for each case as --run does, over WebSocket and
over length32 TCP), and against a small client written apart from it
(tests/conformance/broken_subble_clients.py) with one flaw at a time, each reported as failing
the cases it breaks and no others; and a client that floods the kit, which stays bounded."""

from __future__ import annotations

import re
import resource
import sys
import time
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from wireproto.conformance.catalogue import CaseResult
from wireproto.conformance.clientprocess import ClientProcess
from wireproto.conformance.kits import kit
from wireproto.conformance.listener import Listener
from wireproto.conformance.model import Level, Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import ClientRun, run_client_cases

KIT = kit("subble", "client")
ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "examples/conformance/subble_client_driver.py"
BROKEN = ROOT / "tests/conformance/broken_subble_clients.py"
INFORMATION = {case.id for case in KIT.cases if case.level is Level.INFORMATION}
PASS, FAIL, NON_STRICT, INFO = (Outcome.PASS, Outcome.FAIL, Outcome.NON_STRICT,
                                Outcome.INFORMATION)
ADDRESSES = {"ws": "ws://127.0.0.1:0/subble", "length32": "tcp:0:interface=127.0.0.1"}
# What only a WebSocket has: on a framed stream these cases do not apply (information).
WEBSOCKET_ONLY = {"subble.client.handshake.binary", "subble.client.malformed.text-frame",
                  "subble.client.websocket.ping", "subble.client.close.1001",
                  "subble.client.close.1011", "subble.client.close.4000"}


def outcomes(results: list[CaseResult]) -> dict[str, Outcome]:
    return {result.case.id: result.outcome for result in results}


def reasons(results: list[CaseResult]) -> dict[str, str]:
    return {result.case.id: result.reason for result in results}


def expected(ids: list[str], not_passed: dict[str, Outcome]) -> dict[str, Outcome]:
    """Every case of `ids` passes (or informs), except those of `not_passed`."""
    return {case_id: not_passed.get(case_id, INFO if case_id in INFORMATION else PASS)
            for case_id in ids}


async def run(address: str, command: str, ids: list[str] | None = None,
              max_message_size: int = 1_048_576) -> list[CaseResult]:
    listener = Listener(reactor, address)
    await listener.start()
    try:
        client_run = ClientRun(reactor, listener, command, first_wait=20.0)
        target = Target("subble", listener.url, max_message_size=max_message_size)
        return await run_client_cases(client_run, target, KIT,
                                      KIT.select(ids) if ids else None)
    finally:
        await listener.stop()


def test_the_catalogue_is_thorough_and_cited() -> None:
    ids = [case.id for case in KIT.cases]
    assert len(ids) == len(set(ids)) >= 50
    assert KIT.alive is not None and KIT.mode == "client"
    assert all(case_id.startswith("subble.client.") for case_id in ids)
    groups = {case.group for case in KIT.cases}
    assert {"subble.client.handshake", "subble.client.refusal", "subble.client.produce",
            "subble.client.error", "subble.client.event", "subble.client.malformed",
            "subble.client.websocket", "subble.client.close",
            "subble.client.reconnect"} <= groups
    for case in KIT.cases:
        slow = case.group in ("subble.client.reconnect", "subble.client.close") or \
            case.id == "subble.client.handshake.no-response"
        assert case.timeout <= (20 if slow else 10), case.id
    docs = (ROOT / "docs/subblesocket.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
               for heading in re.findall(r"^#+ (.+)$", docs, re.M)}
    for case in KIT.cases:
        if case.decision:
            page, anchor = case.decision.split("#")
            assert page == "docs/subblesocket.md" and anchor in anchors, case.id


# -- wireproto's own client -------------------------------------------------------------------

@pytest.mark.parametrize("way", ["ws", "length32"])
@pytest_twisted.ensureDeferred
async def test_wireprotos_client_passes_every_must(way: str) -> None:
    started = time.monotonic()
    results = await run(ADDRESSES[way], f"{sys.executable} {DRIVER} {{url}}")
    took = time.monotonic() - started
    inapplicable = dict.fromkeys(WEBSOCKET_ONLY, INFO) if way == "length32" else {}
    assert outcomes(results) == expected([case.id for case in KIT.cases], inapplicable)
    said = reasons(results)
    # What the information cases see of wireproto's client, and how the MUSTs were met.
    assert said["subble.client.handshake.fields"] == \
        "client ID '', separator ';', request data b''"
    assert said["subble.client.handshake.code-2-id"] == "the ID the 2 named"
    assert said["subble.client.handshake.code-2-empty"].startswith(
        "it closed the connection after a 2 that gives no client ID")
    assert re.fullmatch(r"it closed the connection after 1\d\.\d s",
                        said["subble.client.handshake.no-response"])
    assert said["subble.client.refusal.retry"] == "1 connection(s) in 3 s, the first included"
    assert said["subble.client.refusal.25"] == "it closed the connection"
    assert said["subble.client.produce.implementor-format"].startswith(
        "it echoed it in format 200 with the same bytes; it kept working")
    assert said["subble.client.event.datetime-extreme"].startswith(
        "delivered the events dated -1 ms; it kept working")
    assert said["subble.client.event.unsubscribed"] == \
        "delivered it to the application, which echoed it"
    assert said["subble.client.error.unsolicited-echo"].startswith("ignored it")
    assert said["subble.client.malformed.bad-msgpack"].startswith("it kept working")
    assert said["subble.client.malformed.truncated"].startswith("it closed the connection")
    assert re.match(r"it reconnected after \d\.\d s and works", said["subble.client.close.abort"])
    assert re.match(r"\d+ attempts in 11 s, the first after",
                    said["subble.client.reconnect.backoff"])
    assert took < 180, took


# Six cases that judge only the handshake request, in a row: unanswered, they would leave
# wireproto's client waiting 5.7 s and more (its backoff after six failed attempts) before the
# seventh came.
BY_HAND = ["subble.client.handshake.first", "subble.client.handshake.binary",
           "subble.client.handshake.version", "subble.client.handshake.lists",
           "subble.client.handshake.fields", "subble.client.handshake.waits",
           "subble.client.handshake.new-id-used",
           "subble.client.produce.msgpack-map", "subble.client.malformed.truncated",
           "subble.client.close.abort", "subble.client.reconnect.same-client",
           "subble.client.produce.json"]


@pytest_twisted.ensureDeferred
async def test_wireprotos_client_started_by_hand_comes_back_for_each_case() -> None:
    """Without --run, one driver process serves every case: the kit answers even the
    handshakes it only judges, so the client's backoff never outgrows a case's wait, and it
    comes back with the ID it was given (answered 2)."""
    listener = Listener(reactor, ADDRESSES["ws"])
    await listener.start()
    driver = ClientProcess(reactor, f"{sys.executable} {DRIVER} {{url}}", listener.url)
    driver.start()
    try:
        client_run = ClientRun(reactor, listener, None, first_wait=20.0)
        results = await run_client_cases(client_run, Target("subble", listener.url), KIT,
                                         KIT.select(BY_HAND))
    finally:
        await driver.stop()
        await listener.stop()
    assert outcomes(results) == expected(BY_HAND, {}), reasons(results)
    assert driver.status is not None


# -- a client written apart, with and without flaws -------------------------------------------

BASELINE = ["subble.client.handshake.first", "subble.client.handshake.version",
            "subble.client.produce.msgpack-map", "subble.client.malformed.truncated",
            "subble.client.malformed.bad-msgpack"]

# Each flaw: the cases that also run, and the outcomes that are not a pass among them and
# BASELINE's.
FLAWED = {
    "wrong-version": ([], {"subble.client.handshake.version": FAIL}),
    "old-id": (["subble.client.handshake.new-id-used", "subble.client.reconnect.same-client"],
               {"subble.client.handshake.new-id-used": FAIL}),
    "crash-unknown": (["subble.client.handshake.unknown-code", "subble.client.malformed.empty",
                       "subble.client.malformed.text-frame",
                       "subble.client.malformed.second-response"],
                      {"subble.client.handshake.unknown-code": FAIL,
                       "subble.client.malformed.truncated": FAIL,
                       "subble.client.malformed.empty": FAIL,
                       "subble.client.malformed.text-frame": FAIL}),
    "crash-payload": (["subble.client.malformed.bad-json",
                       "subble.client.malformed.bad-payload-kept"],
                      {"subble.client.malformed.bad-msgpack": FAIL,
                       "subble.client.malformed.bad-json": FAIL,
                       "subble.client.malformed.bad-payload-kept": NON_STRICT}),
    "no-pong": (["subble.client.websocket.ping"], {"subble.client.websocket.ping": FAIL}),
    "no-reconnect": (["subble.client.close.1000", "subble.client.reconnect.same-client",
                      "subble.client.reconnect.server-back"],
                     {"subble.client.reconnect.same-client": INFO,
                      "subble.client.reconnect.server-back": NON_STRICT}),
    "tight-loop": (["subble.client.refusal.retry", "subble.client.reconnect.backoff",
                    "subble.client.close.abort"],
                   {"subble.client.refusal.retry": NON_STRICT,
                    "subble.client.reconnect.backoff": NON_STRICT}),
    "next-error": (["subble.client.error.51-reported", "subble.client.error.unsolicited"],
                   {"subble.client.error.unsolicited": NON_STRICT}),
    "acts-refused": (["subble.client.refusal.11", "subble.client.refusal.25",
                      "subble.client.malformed.event-first"],
                     {"subble.client.refusal.11": FAIL, "subble.client.refusal.25": FAIL}),
    "bin-as-str": (["subble.client.produce.msgpack-bin", "subble.client.produce.unicode"],
                   {"subble.client.produce.msgpack-bin": NON_STRICT}),
}


@pytest.mark.parametrize("flaw", ["none", *FLAWED])
@pytest_twisted.ensureDeferred
async def test_each_flaw_fails_its_cases_and_no_others(flaw: str) -> None:
    extra, not_passed = FLAWED.get(flaw, ([], {}))
    ids = BASELINE + extra
    results = await run(ADDRESSES["ws"], f"{sys.executable} {BROKEN} {flaw} {{url}}", ids)
    got = outcomes(results)
    assert got == expected(list(got), not_passed), reasons(results)
    said = reasons(results)
    if flaw == "crash-unknown":
        assert "the client exited with status 1" in said["subble.client.malformed.truncated"]
    if flaw == "tight-loop":
        assert said["subble.client.reconnect.backoff"].startswith("a tight loop: ")
    if flaw == "no-reconnect":
        assert said["subble.client.close.1000"] == "it did not reconnect within 6 s"


@pytest_twisted.ensureDeferred
async def test_a_correct_client_passes_the_whole_kit_over_length32() -> None:
    """The client written apart, with no flaw: every case but the WebSocket ones passes."""
    results = await run(ADDRESSES["length32"], f"{sys.executable} {BROKEN} none {{url}}")
    inapplicable = dict.fromkeys(WEBSOCKET_ONLY, INFO)
    assert outcomes(results) == expected([case.id for case in KIT.cases], inapplicable)
    assert reasons(results)["subble.client.handshake.no-response"] == \
        "it waited 12 s and more with the connection open"


@pytest.mark.parametrize("flaw, way", [("flood", "ws"), ("huge", "length32")])
@pytest_twisted.ensureDeferred
async def test_a_flooding_client_cannot_exhaust_the_kit(flaw: str, way: str) -> None:
    """A client that answers an event with 2000 produces of 64 KiB (128 MiB), or with one
    message of 100 MiB: the kit fails the case, keeps what it holds bounded, and goes on."""
    started = time.monotonic()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results = await run(ADDRESSES[way], f"{sys.executable} {BROKEN} {flaw} {{url}}",
                        ["subble.client.produce.burst", "subble.client.handshake.first"])
    assert outcomes(results) == {"subble.client.produce.burst": NON_STRICT,
                                 "subble.client.handshake.first": PASS}
    said = reasons(results)["subble.client.produce.burst"]
    if flaw == "flood":
        assert "not what its format 200 says" in said
    else:
        assert "closed" in said
    assert time.monotonic() - started < 60
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak  # KiB on Linux
    assert grown < 64 * 1024, f"the kit grew by {grown} KiB"


def test_the_driver_in_the_docs_is_the_example() -> None:
    """docs/conformance.md shows the whole driver that the tests above run."""
    docs = (ROOT / "docs/conformance.md").read_text()
    section = docs[docs.index("## SubbleSocket clients: the driver and results"):]
    shown = re.search(r"```text\n(\"\"\"wireproto's SubbleSocket client.*?)```", section, re.S)
    assert shown is not None
    assert shown.group(1) == DRIVER.read_text()
