"""The runner against a real wireproto broker and against servers that misbehave: every case's
outcome and reason, harm detected by the check after a harmful case, "could not run" for a server
that does not serve, and a case that never ends or a server that floods bounded."""

from __future__ import annotations

import dataclasses

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.conformance.sample_kit import ToyServer, kit, kit_with
from tests.support import free_port
from wireproto.conformance.model import Outcome
from wireproto.conformance.probe import QUEUE_LIMIT, RECORD_LIMIT, RecordBudget, Target
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


@pytest.mark.parametrize("transport", ["ws+unix", "unix"])
@pytest_twisted.ensureDeferred
async def test_a_server_on_a_unix_socket(broker, tmp_path, transport) -> None:
    """A broker's unix listener, WebSocket or framed, is judged as one on TCP is."""
    socket = tmp_path / "broker.sock"
    if transport == "unix":
        await broker.start(f"websmq+length32@unix:{socket}")
        target = Target("websmq", f"unix:{socket}", framing="length32")
    else:
        await broker.start(f"websmq+ws@unix:{socket}")
        target = Target("websmq", f"ws+unix://{socket}:/websmq")
    results = await run_cases(reactor, target, kit, kit_with("delivered", "poison")().cases)
    assert outcomes(results) == {"delivered": Outcome.PASS, "poison": Outcome.PASS}


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
    from wireproto.conformance.probe import KEPT_BYTES, RecordBudget, Recorder

    recorder = Recorder(RecordBudget(2 * KEPT_BYTES + 10))
    big = bytes(range(256)) * (KEPT_BYTES // 128)  # two KEPT_BYTES
    for _ in range(3):
        recorder.add(1, "received", big)
    first, second, third = recorder.exchanges
    # the first bytes of each message, its whole length, until the run's budget is spent
    assert first.data == big[:KEPT_BYTES] and first.length == len(big)
    assert second.data == big[:KEPT_BYTES] and second.length == len(big)
    assert third.data is None and third.direction == "event" and third.length == len(big)
    assert third.text == (f"received {len(big)} bytes, not kept: the run's record already "
                          f"holds {16 * 1024 * 1024} bytes")
    for _ in range(RECORD_LIMIT * 2):
        recorder.add(1, "sent", None, text="y")
    assert len(recorder.exchanges) == RECORD_LIMIT
    assert recorder.exchanges[-1].text == (
        f"the kit stops recording this case here ({RECORD_LIMIT} exchanges)")
    assert recorder.unrecorded == RECORD_LIMIT * 2 + 3 - RECORD_LIMIT + 1


@pytest_twisted.ensureDeferred
async def test_a_run_keeps_a_bounded_record_however_much_the_server_sends() -> None:
    """Each case meets a server sending a thousand large messages: what the run keeps of them
    all stays within its budget, where every case's record once kept its bytes to the end."""
    from wireproto.conformance.probe import RUN_RECORD_BYTES

    server = ToyServer()
    address = await server.start()
    try:
        catalogue = kit_with("stuck")()
        server.flood = 900
        server.flood_size = 64 * 1024
        budget = RecordBudget()
        case = dataclasses.replace(catalogue.cases[0], timeout=3.0)  # time to take it all in
        results = [await run_case(reactor, Target("websmq", address), catalogue, case, "flood",
                                  budget) for _ in range(3)]
    finally:
        await server.stop()
    kept = sum(len(exchange.data or b"") for result in results for exchange in result.exchanges)
    assert kept <= RUN_RECORD_BYTES
    # Nor does the kit hold what its cases did not read once they are over (it held every
    # such message to the end of the run, 55 MB a case against a flooding server).
    import gc

    from wireproto.conformance.probe import Received

    held = sum(len(thing.data) for thing in gc.get_objects() if isinstance(thing, Received))
    assert held < 1024 * 1024, held
    assert sum(exchange.length for result in results for exchange in result.exchanges
               if exchange.direction != "sent") > RUN_RECORD_BYTES  # it did send more
