"""The UBRE client kit (wireproto/conformance/ubre/client/) against real clients started per
case with --run: wireproto's own client through examples/conformance/ubre_client_driver.py
(JSON and binary, over WebSocket and a framed stream: every MUST passes), the real ubre.js
0.0.23 through tests/interop/conform_ubre_client.js, and small clients each wrong in one way
(tests/conformance/broken_ubre_clients.py). Every result is asserted per case id."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.support import need_interop_peer
from wireproto.conformance.catalogue import CaseResult
from wireproto.conformance.clientprocess import ClientProcess
from wireproto.conformance.kits import kit as kit_of
from wireproto.conformance.listener import Listener
from wireproto.conformance.model import Level, Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import ClientRun, CouldNotRun, run_client_cases

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "examples" / "conformance" / "ubre_client_driver.py"
BROKEN = ROOT / "tests" / "conformance" / "broken_ubre_clients.py"
INTEROP = ROOT / "tests" / "interop"
kit = kit_of("ubre", "client")
P, F, N, INFO = Outcome.PASS, Outcome.FAIL, Outcome.NON_STRICT, Outcome.INFORMATION


async def run(command: str, address: str = "ws://127.0.0.1:0/ubre",
              framing: str | None = None,
              cases: Sequence[str] | None = None,
              first_wait: float = 20.0) -> dict[str, CaseResult]:
    listener = Listener(reactor, address, framing=framing)
    await listener.start()
    try:
        client_run = ClientRun(reactor, listener, command, first_wait=first_wait)
        results = await run_client_cases(client_run, Target("ubre", listener.url,
                                                            framing=framing),
                                         kit, kit.select(cases) if cases else None)
    finally:
        await listener.stop()
    for result in results:
        print(f"{result.outcome:12} {result.case.id:45} {result.duration:6.2f} "
              f"{result.reason[:200]}")
    return {result.case.id: result for result in results}


def outcomes(results: dict[str, CaseResult]) -> dict[str, Outcome]:
    return {case_id: result.outcome for case_id, result in results.items()}


def every(outcome: Outcome, *exceptions: dict[str, Outcome]) -> dict[str, Outcome]:
    """Every case of the kit: information cases as information, the others `outcome`, but for
    `exceptions`."""
    expected = {case.id: INFO if case.level is Level.INFORMATION else outcome
                for case in kit.cases}
    for exception in exceptions:
        expected.update(exception)
    return expected


PYTHON = sys.executable

# Not applicable (information) to a JSON client, and to a binary one.
BINARY_ONLY = {"ubre.client.receive.binary-streaming": INFO,
               "ubre.client.receive.binary-fail-0x63": INFO}
JSON_ONLY = {"ubre.client.send.text-frames": INFO, "ubre.client.send.null-body": INFO,
             "ubre.client.receive.request-fail": INFO, "ubre.client.receive.request-unknown": INFO}
WEBSOCKET_ONLY = {"ubre.client.send.text-frames": INFO, "ubre.client.receive.ping": INFO,
                  "ubre.client.reconnect.backoff": INFO}
# wireproto's client hands a JSON null body to its callback as None, which it also gives for
# no body; so the driver publishes it back without one (docs/conformance.md, "UBRE clients").
WIREPROTO_JSON = {"ubre.client.send.null-body": N}


@pytest_twisted.ensureDeferred
async def test_wireproto_client_json_over_websocket_passes_every_must() -> None:
    results = await run(f"{PYTHON} {DRIVER} {{url}}")
    assert outcomes(results) == every(P, BINARY_ONLY, WIREPROTO_JSON)
    assert results["ubre.client.send.request"].reason == "ubre.js's named form, id 1"
    assert results["ubre.client.receive.reply-id-type"].reason.startswith(
        "the reply with id '1' was taken for request 1")
    assert "came back" in results["ubre.client.malformed.invalid-json"].reason
    assert results["ubre.client.reconnect.after-close"].reason.startswith("it reconnected")
    assert results["ubre.client.receive.binary-to-json-client"].reason.startswith("delivered")


@pytest_twisted.ensureDeferred
async def test_wireproto_client_binary_over_websocket_passes_every_must() -> None:
    results = await run(f"{PYTHON} {DRIVER} --binary {{url}}")
    assert outcomes(results) == every(P, JSON_ONLY)
    assert results["ubre.client.send.subscribe"].reason == "binary"
    assert results["ubre.client.send.request"].reason == "the spec's id form, id '1'"


@pytest_twisted.ensureDeferred
async def test_wireproto_client_json_over_a_lines_stream_passes_every_must() -> None:
    results = await run(f"{PYTHON} {DRIVER} {{url}}", "tcp:0:interface=127.0.0.1", "lines")
    text_only = {"ubre.client.malformed.binary-truncated": INFO,
                 "ubre.client.malformed.binary-unknown-type": INFO,
                 "ubre.client.reconnect.going-away": INFO}
    assert outcomes(results) == every(P, BINARY_ONLY, WIREPROTO_JSON, WEBSOCKET_ONLY, text_only)


@pytest_twisted.ensureDeferred
async def test_wireproto_client_binary_over_a_length32_stream_passes_every_must() -> None:
    results = await run(f"{PYTHON} {DRIVER} --binary {{url}}", "tcp:0:interface=127.0.0.1",
                        "length32")
    assert outcomes(results) == every(P, JSON_ONLY, WEBSOCKET_ONLY,
                                      {"ubre.client.reconnect.going-away": INFO})


# ubre.js parses every text frame that starts with '{' with JSON.parse in its WebSocket
# listener, uncaught: JSON that does not parse ends the Node process. It has no reconnection
# of its own, so its driver exits when its connection closes.
UBRE_JS = {
    "ubre.client.malformed.invalid-json": F,
    "ubre.client.malformed.truncated-json": F,
    "ubre.client.reconnect.resubscribes": INFO,
    "ubre.client.reconnect.backoff": INFO,
}


@pytest_twisted.ensureDeferred
async def test_ubre_js_case_by_case() -> None:
    node = need_interop_peer(INTEROP / "node_modules" / "ubre", "ubre.js")
    need_interop_peer(INTEROP / "node_modules" / "ws7", "ubre.js's WebSocket wrapper")
    results = await run(f"{node} {INTEROP / 'conform_ubre_client.js'} {{url}}")
    assert outcomes(results) == every(P, BINARY_ONLY, UBRE_JS)
    for case_id in ("ubre.client.malformed.invalid-json", "ubre.client.malformed.truncated-json"):
        reason = results[case_id].reason
        assert "ended the client" in reason and "exited with status 1" in reason, reason
    assert any("SyntaxError" in (exchange.text or "")
               for exchange in results["ubre.client.malformed.invalid-json"].exchanges)
    said = {case_id: results[case_id].reason for case_id in results}
    assert said["ubre.client.receive.request-spec-form"] == \
        "no answer (the request was dropped)"
    assert said["ubre.client.receive.reply-id-type"] == \
        "the reply with id '1' was not taken for request 1"
    assert said["ubre.client.receive.binary-to-json-client"] == \
        "not delivered; it kept working"
    assert said["ubre.client.receive.huge"].startswith("delivered")
    for case_id in ("ubre.client.reconnect.after-close", "ubre.client.reconnect.server-gone"):
        assert "does not reconnect: it exited with status 0" in said[case_id]
    # It exits at once: the kit does not wait out its reconnection cases.
    assert results["ubre.client.reconnect.backoff"].duration < 6.0


# A flaw, the cases that catch it, and cases it must not fail.
UNRELATED = ["ubre.client.send.publish", "ubre.client.receive.request",
             "ubre.client.malformed.invalid-json"]
FLAWS = {
    "none": {},
    "crash-on-unknown": {"ubre.client.malformed.unknown-type": F,
                         "ubre.client.malformed.two-types": P},
    "hang-on-invalid": {"ubre.client.malformed.invalid-json": F,
                        "ubre.client.malformed.truncated-json": F,
                        "ubre.client.malformed.unknown-type": P},
    "same-ids": {"ubre.client.send.request-ids-unique": F, "ubre.client.send.request": P},
    "string-reply-ids": {"ubre.client.receive.request": F, "ubre.client.receive.success": P},
    "binary-frames": {"ubre.client.send.text-frames": N},
    "no-pong": {"ubre.client.receive.ping": F},
    "no-reconnect": {"ubre.client.reconnect.after-close": INFO,
                     "ubre.client.reconnect.resubscribes": INFO},
    "tight-loop": {"ubre.client.reconnect.backoff": N},
    "fixed-delay": {"ubre.client.reconnect.backoff": N,
                    "ubre.client.reconnect.resubscribes": P},
    "no-resubscribe": {"ubre.client.reconnect.resubscribes": N},
    # Attacks on the kit: each run ends in bounded time, and judges the client all the same.
    "flood": {},
    "huge": {"ubre.client.receive.huge": P},
    "connect-storm": {},
    # The spec's dialect of requests passes the MUST about answering one (it failed it, when
    # the kit sent only ubre.js's named form).
    # Unasked pongs do not hide the answer to the kit's ping (the first pong was judged).
    "heartbeat-pongs": {"ubre.client.receive.ping": P},
    "spec-dialect": {"ubre.client.receive.request": P,
                     "ubre.client.receive.request-spec-form": INFO},
}


@pytest.mark.parametrize("flaw", FLAWS)
@pytest_twisted.ensureDeferred
async def test_a_broken_client_fails_the_cases_about_its_flaw_and_no_others(flaw: str) -> None:
    expected = {case_id: P for case_id in UNRELATED} | FLAWS[flaw]
    started = time.monotonic()
    results = await run(f"{PYTHON} {BROKEN} {flaw} {{url}}", cases=list(expected))
    assert outcomes(results) == expected
    assert time.monotonic() - started < 20 + 10 * len(expected)
    reasons = {case_id: result.reason for case_id, result in results.items()}
    if flaw == "tight-loop":
        assert "tight loop" in reasons["ubre.client.reconnect.backoff"]
    if flaw == "fixed-delay":
        assert "do not grow" in reasons["ubre.client.reconnect.backoff"]
    if flaw == "no-reconnect":
        assert "does not reconnect" in reasons["ubre.client.reconnect.after-close"]
    if flaw == "crash-on-unknown":
        assert "exited with status 3" in reasons["ubre.client.malformed.unknown-type"]
    if flaw == "hang-on-invalid":
        assert "stopped answering" in reasons["ubre.client.malformed.invalid-json"]


@pytest_twisted.ensureDeferred
async def test_a_client_that_never_subscribes_cannot_be_judged() -> None:
    with pytest.raises(CouldNotRun) as raised:
        await run(f"{PYTHON} -c \"import time; time.sleep(60)\"", first_wait=2.0)
    assert "ubre client could not be judged" in str(raised.value)


def test_the_driver_in_the_docs_is_the_example_the_tests_run() -> None:
    page = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    section = page.split("## UBRE clients: the driver and results", 1)[1]
    shown = section.split("```text\n", 1)[1].split("```", 1)[0]
    example = DRIVER.read_text(encoding="utf-8")
    main = example[example.index("async def main"):example.index('\n\nif __name__')]
    assert shown.strip() == main.strip()


@pytest_twisted.ensureDeferred
async def test_a_client_the_user_started_serves_case_after_case() -> None:
    # Without --run the same client serves every case, reconnecting after each: a case that
    # makes it leave conformance/in has it join again (the cases after it failed before).
    listener = Listener(reactor, "ws://127.0.0.1:0/ubre")
    await listener.start()
    client = ClientProcess(reactor, f"{PYTHON} {DRIVER} {{url}}", listener.url)
    client.start()
    expected = {"ubre.client.send.unsubscribe": P, "ubre.client.receive.after-unsubscribe": P,
                "ubre.client.send.publish": P, "ubre.client.malformed.invalid-json": P,
                "ubre.client.reconnect.after-close": INFO, "ubre.client.receive.request": P}
    try:
        results = await run_client_cases(ClientRun(reactor, listener, None, first_wait=20.0),
                                         Target("ubre", listener.url), kit,
                                         kit.select(list(expected)))
        ran_through = client.running  # one process served every case
    finally:
        await client.stop()
        await listener.stop()
    assert {result.case.id: result.outcome for result in results} == expected
    assert ran_through


@pytest_twisted.ensureDeferred
async def test_a_longer_timeout_gives_a_slow_starting_client_time_to_connect() -> None:
    """--timeout gives each case longer (its cases waited 5 s whatever it said): a client that
    takes 6 s to start, as a runtime on a loaded machine may, passes with cases of 15 s."""
    listener = Listener(reactor, "ws://127.0.0.1:0/ubre")
    await listener.start()
    slow = f"/bin/sh -c 'sleep 6; exec {PYTHON} {DRIVER} \"$WIREPROTO_CONFORM_URL\"'"
    try:
        client_run = ClientRun(reactor, listener, slow, first_wait=30.0)
        cases = [dataclasses.replace(case, timeout=15.0)
                 for case in kit.select(["ubre.client.send.publish"])]
        results = await run_client_cases(client_run, Target("ubre", listener.url), kit, cases)
    finally:
        await listener.stop()
    assert [(result.case.id, result.outcome) for result in results] == [
        ("ubre.client.send.publish", Outcome.PASS)], [result.reason for result in results]
