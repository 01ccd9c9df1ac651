"""The UBRE kit against small brokers that are each wrong in one way (tests/conformance/
broken_ubre.py): each is reported failing the cases about its fault, and no others."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.protocol import Factory, Protocol

from tests.conformance import broken_ubre
from wireproto.conformance.catalogue import CaseResult
from wireproto.conformance.kits import kit as kit_of
from wireproto.conformance.model import Level, Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import CouldNotRun, run_cases

kit = kit_of("ubre")
F, N = Outcome.FAIL, Outcome.NON_STRICT


async def run(broker: broken_ubre.MiniBroker, cases: Sequence[str] | None = None,
              framing: str | None = None) -> list[CaseResult]:
    address = await broker.listen(framing)
    try:
        return await run_cases(reactor, Target("ubre", address, framing=framing), kit,
                               kit.select(cases) if cases else None)
    finally:
        await broker.stop()


def judged(results: list[CaseResult]) -> dict[str, Outcome]:
    """The cases that did not pass, information cases aside."""
    for result in results:
        print(f"{result.outcome:12} {result.case.id:45} {result.reason}")
    return {result.case.id: result.outcome for result in results
            if result.outcome not in (Outcome.PASS, Outcome.INFORMATION)}


def information(results: list[CaseResult], case_id: str) -> str:
    (result,) = [result for result in results if result.case.id == case_id]
    assert result.outcome is Outcome.INFORMATION
    return result.reason


@pytest_twisted.ensureDeferred
async def test_a_broker_that_does_what_the_spec_asks_passes_every_case() -> None:
    results = await run(broken_ubre.MiniBroker())
    assert judged(results) == {}
    assert information(results, "ubre.subscribe.announced") == \
        "announces topics others subscribe to: no"
    assert information(results, "ubre.topic.longer-json") == "delivered"
    assert all(result.outcome is Outcome.INFORMATION for result in results
               if result.case.level is Level.INFORMATION)


@pytest_twisted.ensureDeferred
async def test_a_broker_that_answers_every_request_with_a_success_fails_no_must() -> None:
    """The spec has no handler names, and a success is as much an answer as a fail."""
    results = await run(broken_ubre.CatchAll(), ["ubre.publish.json", "ubre.request",
                                                 "ubre.success", "ubre.fail"])
    assert judged(results) == {"ubre.request.unknown-name": N,
                               "ubre.request.not-found-body": N}


@pytest_twisted.ensureDeferred
async def test_a_broker_of_the_spec_form_alone_fails_only_the_ubre_js_cases() -> None:
    """ubre.js's request form (a handler's name and an id) is no part of the spec."""
    results = await run(broken_ubre.SpecFormOnly(), ["ubre.publish.json", "ubre.request",
                                                     "ubre.success", "ubre.fail"])
    assert judged(results) == {
        "ubre.request.unknown-name": N, "ubre.request.not-found-body": N,
        "ubre.request.int-id": N, "ubre.request.pairing": N}
    assert not [r.case.id for r in results
                if r.case.level is Level.MUST and r.outcome is not Outcome.PASS]


@pytest_twisted.ensureDeferred
async def test_wrong_body_lengths_fail_every_binary_delivery() -> None:
    results = await run(broken_ubre.WrongLengths(), framing="length32")
    assert judged(results) == {
        "ubre.publish.binary": F, "ubre.publish.binary-no-body": F,
        "ubre.subscribe.binary-json-mixed": N, "ubre.body.largest-binary": F,
        "ubre.topic.unicode-binary": F, "ubre.topic.longest-binary": N}
    assert "body length 257 but only 256 bytes follow" in {
        r.case.id: r.reason for r in results}["ubre.publish.binary"]
    assert information(results, "ubre.publish.json-to-binary").startswith(
        "not seen: the server sent what is not UBRE")


@pytest_twisted.ensureDeferred
async def test_ids_answered_as_strings_fail_the_id_cases() -> None:
    results = await run(broken_ubre.StringIds(), ["ubre.publish.json", "ubre.request"])
    assert judged(results) == {
        "ubre.request.unknown-name": N, "ubre.request.not-found-body": N,
        "ubre.request.int-id": N, "ubre.request.spec-form-int-id": N,
        "ubre.request.pairing": N}
    assert {r.case.id: r.reason for r in results}["ubre.request.int-id"] == \
        "the answer to request 7 has the id '7' (str)"


@pytest_twisted.ensureDeferred
async def test_two_answers_to_a_request_fail_the_pairing_cases() -> None:
    results = await run(broken_ubre.ReplyTwice(), ["ubre.publish", "ubre.request"])
    assert judged(results) == {
        "ubre.request.unknown-name": N, "ubre.request.spec-form": F,
        "ubre.request.pairing": N, "ubre.request.spec-form-pairing": F,
        "ubre.request.answered-once": F, "ubre.request.bodies": F, "ubre.request.binary": F}


@pytest_twisted.ensureDeferred
async def test_a_missing_reply_fails_the_request_cases_alone() -> None:
    results = await run(broken_ubre.NoReply(), [
        "ubre.publish.json", "ubre.publish.fan-out", "ubre.publish.no-subscriber",
        "ubre.unsubscribe.json", "ubre.success.unsolicited", "ubre.request.unknown-name",
        "ubre.request.int-id", "ubre.request.spec-form", "ubre.request.binary",
        "ubre.malformed.json-invalid"])
    assert judged(results) == {
        "ubre.request.unknown-name": N, "ubre.request.int-id": N, "ubre.request.spec-form": F,
        "ubre.request.binary": F}


@pytest_twisted.ensureDeferred
async def test_malformed_messages_ignored_by_a_broker_that_answers_nothing_pass() -> None:
    results = await run(broken_ubre.NoReplyIgnoresBadInput(), [
        "ubre.request.int-id", "ubre.malformed.json-invalid", "ubre.malformed.closes",
        "ubre.malformed.binary-body-truncated"])
    assert judged(results) == {"ubre.request.int-id": N, "ubre.malformed.closes": N}
    assert {r.case.id: r.reason for r in results}["ubre.malformed.json-invalid"] == \
        "ignored (the connection stayed open)"


@pytest_twisted.ensureDeferred
async def test_a_lenient_reader_is_caught_acting_on_malformed_messages() -> None:
    results = await run(broken_ubre.Lenient(), ["ubre.publish", "ubre.topic.one-over-binary",
                                                "ubre.malformed"])
    assert judged(results) == {
        "ubre.topic.one-over-binary": N, "ubre.malformed.binary-name-truncated": F,
        "ubre.malformed.binary-body-truncated": F, "ubre.malformed.binary-trailing-bytes": N,
        "ubre.malformed.binary-no-body-trailing": N, "ubre.malformed.closes": N}
    # What it ignores without closing passes: UBRE has no word for "cannot read that".
    assert {r.case.id: r.reason for r in results}["ubre.malformed.json-invalid"] == \
        "ignored (it answered the next request)"


@pytest_twisted.ensureDeferred
async def test_unsubscribes_not_acted_on_are_caught() -> None:
    results = await run(broken_ubre.IgnoresUnsubscribe(), ["ubre.subscribe", "ubre.unsubscribe"])
    assert judged(results) == {"ubre.unsubscribe.json": F, "ubre.unsubscribe.with-body": N}
    assert information(results, "ubre.unsubscribe.binary") == \
        "binary unsubscribe understood: no, publishes still arrive"


@pytest_twisted.ensureDeferred
async def test_the_spec_tables_fail_type_is_a_should_not_met() -> None:
    results = await run(broken_ubre.FailTypo(), ["ubre.request", "ubre.success"])
    assert judged(results) == {"ubre.request.binary-fail-type": N}


@pytest_twisted.ensureDeferred
async def test_a_crash_on_a_short_header_fails_that_case_and_the_rest() -> None:
    results = await run(broken_ubre.CrashOnShortHeader(), [
        "ubre.publish.json", "ubre.request.int-id", "ubre.malformed.json-invalid",
        "ubre.malformed.binary-short-header", "ubre.malformed.binary-trailing-bytes"])
    outcomes = [(r.case.id, r.outcome) for r in results]
    reasons = {r.case.id: r.reason for r in results}
    assert outcomes == [("ubre.publish.json", Outcome.PASS),
                        ("ubre.request.int-id", Outcome.PASS),
                        ("ubre.malformed.json-invalid", Outcome.PASS),
                        ("ubre.malformed.binary-short-header", F),
                        ("ubre.malformed.binary-trailing-bytes", F)]
    # The case itself saw the connection closed, as a refusal should; the check after it
    # found the server gone.
    assert reasons["ubre.malformed.binary-short-header"].startswith("closed; the server "
                                                                    "stopped serving after "
                                                                    "this case: could not "
                                                                    "connect")
    assert reasons["ubre.malformed.binary-trailing-bytes"].startswith("could not connect")


@pytest_twisted.ensureDeferred
async def test_a_mute_broker_cannot_hang_a_case() -> None:
    chosen = ["ubre.publish.order", "ubre.request.spec-form-pairing", "ubre.body.largest-json",
              "ubre.close.subscriber-aborts"]
    results = await run(broken_ubre.Mute(), chosen)
    assert {r.case.id: r.outcome for r in results} == {
        "ubre.publish.order": N, "ubre.request.spec-form-pairing": F,
        "ubre.body.largest-json": F,
        "ubre.close.subscriber-aborts": F}
    for result in results:
        assert result.duration < result.case.timeout + 3, (result.case.id, result.duration)


@pytest_twisted.ensureDeferred
async def test_a_server_that_never_speaks_cannot_hang_the_run() -> None:
    factory = Factory.forProtocol(Protocol)  # accepts, reads, never answers
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
    try:
        for address in (f"ws://127.0.0.1:{port.getHost().port}/ubre",
                        f"tcp:127.0.0.1:{port.getHost().port}"):
            started = time.monotonic()
            with pytest.raises(CouldNotRun):
                await run_cases(reactor, Target("ubre", address, framing="length32"), kit)
            assert time.monotonic() - started < 15
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_broker_that_does_not_serve_cannot_be_run() -> None:
    broker = broken_ubre.MiniBroker()
    address = await broker.listen()
    await broker.stop()
    with pytest.raises(CouldNotRun):
        await run_cases(reactor, Target("ubre", address), kit)
