"""The runner against a real wireproto broker and against servers that misbehave: every case's
outcome and reason, harm detected by the check after a harmful case, "could not run" for a server
that does not serve, and a case that never ends or a server that floods bounded."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.conformance.sample_kit import ToyServer, kit, kit_with
from tests.support import free_port
from wireproto.conformance.model import Outcome
from wireproto.conformance.probe import QUEUE_LIMIT, RECORD_LIMIT, Target
from wireproto.conformance.runner import CouldNotRun, check_alive, run_case, run_cases


def outcomes(results) -> dict[str, Outcome]:
    return {result.case.id.removeprefix("websmq.sample."): result.outcome for result in results}


@pytest_twisted.ensureDeferred
async def test_each_case_against_wireprotos_broker(broker) -> None:
    port = free_port()
    await broker.start(f"websmq+ws@tcp:{port}:interface=127.0.0.1")
    heard = []
    results = await run_cases(reactor, Target("websmq", f"ws://127.0.0.1:{port}/websmq"), kit,
                              on_result=heard.append)
    assert heard == results
    assert outcomes(results) == {
        "delivered": Outcome.PASS,
        "echo-back": Outcome.PASS,
        "never-answers": Outcome.NON_STRICT,
        "impossible": Outcome.FAIL,
        "own-publish": Outcome.INFORMATION,
        "poison": Outcome.PASS,
        "stuck": Outcome.NON_STRICT,
        "hostile": Outcome.INFORMATION,
    }
    by_id = {result.case.id.removeprefix("websmq.sample."): result for result in results}
    assert by_id["impossible"].reason == ("expected a message nobody sent within 0.3 s, got "
                                          "nothing")
    assert by_id["own-publish"].reason == "delivered to its own publisher: no"
    assert by_id["stuck"].reason == "no outcome within the case's 0.5 s"
    assert by_id["stuck"].duration < 3
    assert by_id["hostile"].reason.startswith("not seen: expected the server's first message")
    # The bytes of every case are kept, in order, by connection.
    poison = by_id["poison"].exchanges
    assert [(e.connection, e.direction, e.data) for e in poison[:2]] == [
        (1, "event", None), (1, "sent", b"\xde\xad")]
    assert any(e.text == "the kit checks that the server still serves" for e in poison)


@pytest_twisted.ensureDeferred
async def test_a_server_that_dies_on_bad_input_fails_that_case() -> None:
    server = ToyServer(dies=True)
    address = await server.start()
    try:
        results = await run_cases(reactor, Target("websmq", address),
                                  kit_with("delivered", "poison", "hostile")())
    finally:
        await server.stop()
    assert outcomes(results) == {"delivered": Outcome.PASS, "poison": Outcome.FAIL,
                                 "hostile": Outcome.INFORMATION}
    poison, after = results[1], results[2]
    assert poison.reason == ("the server stopped serving after this case: could not connect: "
                             "Connection was refused by other side: 111: Connection refused.")
    assert after.reason.startswith("not seen: could not connect")


@pytest_twisted.ensureDeferred
async def test_a_harmful_should_case_that_stops_the_server_fails() -> None:
    catalogue = kit_with("poison")()
    catalogue.cases = [type(case)(case.id, case.title, case.section, type(case.level).SHOULD,
                                  case.body, case.decision, case.timeout, case.harmful)
                       for case in catalogue.cases]
    server = ToyServer(dies=True)
    address = await server.start()
    try:
        (result,) = await run_cases(reactor, Target("websmq", address), catalogue)
    finally:
        await server.stop()
    assert result.outcome is Outcome.FAIL, result.reason


@pytest_twisted.ensureDeferred
async def test_a_dead_port_cannot_be_run() -> None:
    address = f"ws://127.0.0.1:{free_port()}/websmq"
    with pytest.raises(CouldNotRun) as raised:
        await run_cases(reactor, Target("websmq", address), kit)
    assert "websmq server does not serve: could not connect" in str(raised.value)
    assert "refused" in str(raised.value).lower()


@pytest_twisted.ensureDeferred
async def test_a_server_that_serves_nothing_cannot_be_run(broker) -> None:
    # A WEBSMQ listener at another path: the WebSocket handshake is refused.
    port = free_port()
    await broker.start(f"websmq+ws/elsewhere@tcp:{port}:interface=127.0.0.1")
    why = await check_alive(reactor, Target("websmq", f"ws://127.0.0.1:{port}/websmq"), kit)
    assert why is not None and why.startswith("could not connect"), why


@pytest_twisted.ensureDeferred
async def test_a_flooding_server_is_bounded_per_case() -> None:
    server = ToyServer()
    address = await server.start()
    try:
        # A case that reads nothing meets the flood.
        server.flood = QUEUE_LIMIT * 3
        catalogue = kit_with("stuck")()
        result = await run_case(reactor, Target("websmq", address), catalogue,
                                catalogue.cases[0], "flood")
    finally:
        await server.stop()
    # The flood is messages it did not read: the kit drops the connection, and records no more
    # than its limit.
    assert len(result.exchanges) <= RECORD_LIMIT
    assert any("the kit aborts the connection" in e.text for e in result.exchanges)
    assert result.duration < 10
    assert result.outcome is Outcome.NON_STRICT


@pytest_twisted.ensureDeferred
async def test_a_server_that_never_answers_is_bounded() -> None:
    # It takes the connection and says nothing: not even the WebSocket handshake's answer.
    from twisted.internet.endpoints import TCP4ServerEndpoint
    from twisted.internet.protocol import Factory, Protocol

    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
        Factory.forProtocol(Protocol))
    address = f"ws://127.0.0.1:{port.getHost().port}/websmq"
    try:
        started = reactor.seconds()
        with pytest.raises(CouldNotRun) as raised:
            await run_cases(reactor, Target("websmq", address), kit)
        assert reactor.seconds() - started < 20
        catalogue = kit_with("delivered")()
        result = await run_case(reactor, Target("websmq", address), catalogue,
                                catalogue.cases[0], "silent")
    finally:
        await port.stopListening()
    assert "websmq server does not serve" in str(raised.value)
    assert result.outcome is Outcome.FAIL and result.duration < 10, result.reason


def test_a_cases_record_is_bounded_in_exchanges_and_bytes() -> None:
    from wireproto.conformance.probe import RECORD_BYTES, Recorder

    recorder = Recorder()
    big = b"x" * (RECORD_BYTES // 2 + 1)
    for _ in range(3):
        recorder.add(1, "received", big)
    first, second, third = recorder.exchanges
    assert first.data == big and second.data is None and third.data is None
    assert second.direction == "event" and second.text == (
        f"received {len(big)} bytes, not kept: the case's record already holds {len(big)} bytes")
    for _ in range(RECORD_LIMIT * 2):
        recorder.add(1, "sent", b"y")
    assert len(recorder.exchanges) == RECORD_LIMIT
    assert recorder.exchanges[-1].text == (
        f"the kit stops recording this case here ({RECORD_LIMIT} exchanges)")
    assert recorder.unrecorded == RECORD_LIMIT * 2 + 3 - RECORD_LIMIT + 1
