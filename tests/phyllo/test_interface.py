"""The service interface every Phyllo layer offers, on a real pty: send, has_receive and receive,
next_receive (Deferred), on_receive, the bounded queue, and the end of the connection."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.defer import CancelledError

from tests.phyllo.conftest import MESSAGE_MINIMAL_WIRE, received
from tests.support import eventually, failure_of, wait_for
from wireproto.codecs.phyllo import MINIMAL
from wireproto.phyllo import MessageLink, PubSubMessage, minimal_stack

ECHO = PubSubMessage(0x10, b"echo", b"hello")


def numbered(n: int) -> tuple[PubSubMessage, bytes]:
    message = PubSubMessage(0x10, "n", b"%d" % n)
    return message, MINIMAL.encode(message)


@pytest_twisted.ensureDeferred
async def test_synchronous_has_receive_and_receive(line):
    top = await line.open(minimal_stack)
    assert not top.has_receive()
    with pytest.raises(LookupError, match="nothing received on the Phyllo message link"):
        top.receive()
    line.write(MESSAGE_MINIMAL_WIRE)
    await eventually(top.has_receive)
    assert top.receive() == ECHO
    assert not top.has_receive()


@pytest_twisted.ensureDeferred
async def test_next_receive_is_a_deferred(line):
    top = await line.open(minimal_stack)
    waiting = top.next_receive()
    assert not waiting.called
    line.write(MESSAGE_MINIMAL_WIRE)
    assert await wait_for(waiting) == ECHO
    # A cancelled wait gives up its turn: the next unit is queued, not lost.
    cancelled = top.next_receive()
    cancelled.cancel()
    assert isinstance(await failure_of(cancelled), CancelledError)
    first, wire = numbered(1)
    line.write(wire)
    await eventually(top.has_receive)
    ready = top.next_receive()
    assert ready.called  # fires at once from the queue
    assert await ready == first


@pytest_twisted.ensureDeferred
async def test_on_receive_takes_units_instead_of_the_queue(line):
    top = await line.open(minimal_stack)
    units = [numbered(n) for n in range(5)]
    line.write(units[0][1])
    await eventually(top.has_receive)
    got: list[PubSubMessage] = []
    top.on_receive = got.append  # takes what was queued before it was set
    assert got == [units[0][0]] and not top.has_receive()
    line.write(units[1][1])
    await eventually(lambda: len(got) == 2)

    def faulty(message: PubSubMessage) -> None:
        got.append(message)
        raise RuntimeError("a bug in the application")

    # A callback that raises is counted, and the units after it still arrive.
    top.on_receive = faulty
    line.write(units[2][1] + units[3][1])
    await eventually(lambda: len(got) == 4)
    assert top.counters.callback_errors == 2
    top.on_receive = None
    line.write(units[4][1])
    await eventually(top.has_receive)
    assert [top.receive()] == [units[4][0]]
    assert got == [message for message, _ in units[:4]]


@pytest_twisted.ensureDeferred
async def test_the_receive_queue_is_bounded_and_counts_what_it_drops(line):
    top = await line.open(lambda: minimal_stack(max_queue=2))
    units = [numbered(n) for n in range(3)]
    line.write(b"".join(wire for _, wire in units))
    await eventually(lambda: top.counters.received == 3)
    assert top.counters.dropped == 1
    assert [top.receive(), top.receive()] == [units[0][0], units[1][0]]  # the oldest are kept
    assert not top.has_receive()
    # Read, the queue takes units again.
    last, wire = numbered(9)
    line.write(wire)
    assert await received(top, 1) == [last]
    assert top.counters.dropped == 1


@pytest_twisted.ensureDeferred
async def test_losing_the_connection_fails_the_waiting_deferreds(line):
    top = await line.open(minimal_stack)
    waiting = top.next_receive()
    lost = top.when_lost()
    top.lose_connection()
    await wait_for(lost)
    reason = top.lost_reason
    assert reason is not None and all(layer.lost_reason is reason for layer in top.layers())
    assert await failure_of(waiting) is reason.value
    assert await failure_of(top.next_receive()) is reason.value


def test_a_wrapped_layer_hands_everything_up():
    top = minimal_stack()
    datagram = top.below
    with pytest.raises(ValueError, match="wrapped by the message link"):
        datagram.on_receive = print
    with pytest.raises(ValueError, match="use next_receive"):
        datagram.next_receive()
    with pytest.raises(ValueError, match="already wrapped by the message link"):
        MessageLink(datagram)
    with pytest.raises(ValueError, match="max_queue must be at least 1"):
        minimal_stack(max_queue=0)


def test_sending_without_a_carrier_is_counted_not_raised():
    top = minimal_stack()
    top.send(ECHO)
    assert top.bottom.counters.unsent == 1
    assert top.bottom.counters.sent == 0
