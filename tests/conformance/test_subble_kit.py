"""The SubbleSocket conformance kit against wireproto's own host (over WebSocket and length32
TCP), against a small independent host (tests/conformance/broken_subble.py) that passes it, and
against that host with one flaw at a time, each reported as failing the cases it breaks and no
others."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.brokers import LOCAL
from tests.conformance.broken_subble import MiniHost
from wireproto.config import config_from_toml
from wireproto.conformance.catalogue import CaseResult
from wireproto.conformance.kits import kit
from wireproto.conformance.model import Level, Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import CouldNotRun, run_case, run_cases

KIT = kit("subble")
INFORMATION = {case.id for case in KIT.cases if case.level is Level.INFORMATION}
FAIL, NON_STRICT = Outcome.FAIL, Outcome.NON_STRICT
ROOT = Path(__file__).resolve().parents[2]


def outcomes(results: list[CaseResult]) -> dict[str, Outcome]:
    return {result.case.id: result.outcome for result in results}


def expected(not_passed: dict[str, Outcome], ids: list[str]) -> dict[str, Outcome]:
    """Every case of `ids` passes (or informs), except those of `not_passed`."""
    return {case_id: not_passed.get(case_id, Outcome.INFORMATION if case_id in INFORMATION
                                    else Outcome.PASS) for case_id in ids}


def reasons(results: list[CaseResult]) -> dict[str, str]:
    return {result.case.id: result.reason for result in results}


def test_the_catalogue_is_thorough_and_cited() -> None:
    ids = [case.id for case in KIT.cases]
    assert len(ids) == len(set(ids)) >= 70
    assert KIT.alive is not None
    groups = {case.group for case in KIT.cases}
    assert {"subble.handshake", "subble.version", "subble.produce", "subble.event",
            "subble.format", "subble.error", "subble.malformed"} <= groups
    assert all(case.harmful for case in KIT.cases if case.group == "subble.malformed")
    assert all(case.timeout < 10 for case in KIT.cases)
    docs = (ROOT / "docs/subblesocket.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
               for heading in re.findall(r"^#+ (.+)$", docs, re.M)}
    for case in KIT.cases:
        if case.decision:
            page, anchor = case.decision.split("#")
            assert page == "docs/subblesocket.md" and anchor in anchors, case.id


# -- wireproto's own host ---------------------------------------------------------------------

@pytest.mark.parametrize("way", ["ws", "length32"])
@pytest_twisted.ensureDeferred
async def test_wireprotos_host_passes_every_case(broker, way: str) -> None:
    _, bound = await broker.start(f"subble+{way}@tcp:0:{LOCAL}")
    started = time.monotonic()
    results = await run_cases(reactor, Target("subble", bound[0].address), KIT)
    assert outcomes(results) == expected({}, [case.id for case in KIT.cases])
    said = reasons(results)
    assert said["subble.produce.echo-once"] == "once, as 27"
    assert said["subble.event.datetime-unit"] == "milliseconds"
    assert said["subble.version.refusal-closes"].startswith("yes: closed")
    assert said["subble.handshake.same-client-id"].startswith("the second got 2 ''; the first "
                                                              "was closed")
    assert said["subble.format.invalid-msgpack"].startswith("refused with event error 52")
    assert said["subble.format.invalid-json"].startswith("refused with event error 52")
    assert said["subble.version.next-major"].startswith("refused with 25 'unsupported version")
    assert said["subble.error.undeclared-51"].startswith("51 ")
    assert said["subble.format.implementor"].startswith("an event (27)")
    closing = "close code 1002" if way == "ws" else "closed"
    assert said["subble.malformed.handshake-client-id-truncated"].startswith(
        f"the server closed the connection ({closing}")
    assert said["subble.produce.one-over"].startswith(
        "the server closed the connection (close code 1009" if way == "ws"
        else "the server closed the connection (closed)")
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("way", ["ws", "length32"])
@pytest_twisted.ensureDeferred
async def test_the_limit_cases_follow_the_limit_the_kit_is_given(broker, way: str) -> None:
    table = "websocket" if way == "ws" else "stream"
    tables = config_from_toml(f"[{table}]\nmax_message_size = 5000\n", reactor=reactor)
    _, bound = await broker.start(f"subble+{way}@tcp:0:{LOCAL}",
                                  **{table: getattr(tables, table)})
    limits = KIT.select(["subble.produce.largest", "subble.produce.one-over"])
    right = Target("subble", bound[0].address, max_message_size=5000)
    assert outcomes(await run_cases(reactor, right, KIT, limits)) == {
        "subble.produce.largest": Outcome.PASS, "subble.produce.one-over": Outcome.PASS}
    # Told a larger limit than the host's, the kit sees the largest event refused.
    wrong = Target("subble", bound[0].address, max_message_size=6000)
    assert outcomes(await run_cases(reactor, wrong, KIT, limits[:1])) == {
        "subble.produce.largest": FAIL}
    # A limit too small for any event is said, not an OverflowError.
    tiny = Target("subble", bound[0].address, max_message_size=60)
    (result,) = await run_cases(reactor, tiny, KIT, limits[:1])
    assert result.outcome is FAIL
    assert result.reason == "a limit of 60 bytes leaves no room for an event's payload"


# -- an independent host, right and wrong ---------------------------------------------------

FLAWED = {
    "wrong-handshake-code": {"subble.handshake.new-client-id": FAIL,
                             "subble.handshake.new-ids-differ": FAIL},
    "any-version": {"subble.version.next-major": FAIL, "subble.version.before-1": NON_STRICT,
                    "subble.version.refusal-code": NON_STRICT,
                    "subble.version.then-nothing": FAIL},
    "response-lengths": {"subble.handshake.new-client-id": FAIL,
                         "subble.handshake.new-ids-differ": FAIL,
                         "subble.version.next-major": FAIL,
                         "subble.version.before-1": NON_STRICT,
                         "subble.version.refusal-code": NON_STRICT,
                         "subble.version.then-nothing": FAIL},
    "error-lengths": {"subble.error.undeclared-51": NON_STRICT},
    "no-event-error": {"subble.error.undeclared-51": NON_STRICT},
    "delivers-undeclared": {"subble.error.undeclared-not-delivered": FAIL,
                            "subble.error.undeclared-51": NON_STRICT,
                            "subble.error.connection-stays": NON_STRICT},
    "echo-as-26": {"subble.produce.echo": FAIL, "subble.produce.case-sensitive": FAIL,
                   "subble.produce.exact-type": FAIL, "subble.produce.largest": FAIL,
                   "subble.event.guid": FAIL},
    # The spec gives no unit, nor how near the clock: a SHOULD (a MUST failed, before the attack)
    "stale-datetime": {"subble.event.datetime": NON_STRICT},
    "ignores-bad-input": {"subble.malformed.reported": NON_STRICT},
    # The spec does not forbid a second handshake: a SHOULD, not a MUST.
    "rehandshake": {"subble.handshake.second-request": NON_STRICT},
}


async def run_against(host: MiniHost, cases: list[str] | None = None) -> list[CaseResult]:
    address = host.listen()
    try:
        return await run_cases(reactor, Target("subble", address), KIT,
                               None if cases is None else KIT.select(cases))
    finally:
        await host.stop()


@pytest_twisted.ensureDeferred
async def test_an_independent_host_passes_every_case() -> None:
    results = await run_against(MiniHost())
    assert outcomes(results) == expected({}, [case.id for case in KIT.cases])
    said = reasons(results)
    # It reads the spec differently from wireproto where the spec leaves it open.
    assert said["subble.format.invalid-msgpack"].startswith("delivered (an event (27)")
    assert said["subble.malformed.handshake-short"] == "the server closed the connection (closed)"


@pytest.mark.parametrize("flaw", sorted(FLAWED))
@pytest_twisted.ensureDeferred
async def test_each_flaw_fails_the_cases_it_breaks_and_no_others(flaw: str) -> None:
    # The groups the flaw touches (every case in them: the others must still pass), and a
    # control from the handshake and from events.
    groups = sorted({case_id.rsplit(".", 1)[0] for case_id in FLAWED[flaw]})
    cases = [case.id for case in KIT.select([*groups, "subble.handshake.client-id",
                                             "subble.produce.delivered"])]
    results = await run_against(MiniHost(flaw), cases)
    assert outcomes(results) == expected(FLAWED[flaw], cases)
    said = reasons(results)
    if flaw == "response-lengths":
        assert "response message length 603979776 but only 36 bytes remain" in \
            said["subble.handshake.new-client-id"]
    if flaw == "error-lengths":
        assert "the server sent a message that is not SubbleSocket" in \
            said["subble.error.undeclared-51"]
    if flaw == "echo-as-26":
        assert said["subble.produce.echo-once"] == "codes 26"
    if flaw == "stale-datetime":
        assert said["subble.event.datetime-unit"] == "unknown (0)"


@pytest_twisted.ensureDeferred
async def test_a_host_that_dies_on_bad_input_fails_that_case_and_what_follows() -> None:
    host = MiniHost("crash")
    results = await run_against(host, ["subble.produce.delivered",
                                       "subble.malformed.produce-type-negative",
                                       "subble.close.abrupt"])
    assert host.crashed
    assert outcomes(results) == {"subble.produce.delivered": Outcome.PASS,
                                 "subble.malformed.produce-type-negative": FAIL,
                                 "subble.close.abrupt": FAIL}
    said = reasons(results)
    assert "the server stopped serving after this case: could not connect" in \
        said["subble.malformed.produce-type-negative"]
    assert said["subble.close.abrupt"].startswith("could not connect")


@pytest_twisted.ensureDeferred
async def test_a_host_that_never_answers_cannot_be_run_and_hangs_no_case() -> None:
    host = MiniHost("mute")
    target = Target("subble", host.listen())
    try:
        started = time.monotonic()
        with pytest.raises(CouldNotRun, match="expected the handshake response within 2 s"):
            await run_cases(reactor, target, KIT)
        assert time.monotonic() - started < 8
        for case in KIT.select(["subble.produce.largest", "subble.handshake.silent-before",
                                "subble.version.next-major"]):
            started = time.monotonic()
            result = await run_case(reactor, target, KIT, case, "mute")
            # Its own timeout, then for a harmful case the liveness check's.
            assert time.monotonic() - started < case.timeout + (11 if case.harmful else 1)
            expected_outcome = Outcome.PASS if case.id.endswith("silent-before") else FAIL
            assert result.outcome is expected_outcome, (case.id, result.reason)
    finally:
        await host.stop()
