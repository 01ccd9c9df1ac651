"""Reconnector: attempts, backoff after failures, a new attempt after a lost connection, stop,
and its transition table.

Time is a twisted.internet.task.Clock and each attempt is a Deferred the test fires itself, so
every delay is exact. Over real sockets: tests/transports/test_reconnect_sockets.py, and the
clients' own tests (tests/protocols/test_ubre_client.py...).
"""

from __future__ import annotations

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock

from wireproto.transports.reconnect import Reconnector


class Attempts:
    """The connect function: each call is an attempt, a Deferred the test fires."""

    def __init__(self) -> None:
        self.made: list[defer.Deferred] = []
        self.cancelled: list[defer.Deferred] = []

    def __call__(self) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred(self.cancelled.append)
        self.made.append(d)
        return d


class Policy:
    """A retry policy recording which failure counts it was asked about."""

    def __init__(self, *delays: float) -> None:
        self.delays = delays
        self.asked: list[int] = []

    def __call__(self, failed_attempts: int) -> float:
        self.asked.append(failed_attempts)
        return self.delays[min(failed_attempts, len(self.delays) - 1)]


def make(*delays: float) -> tuple[Clock, Attempts, Policy, Reconnector]:
    clock, attempts, policy = Clock(), Attempts(), Policy(*delays)
    return clock, attempts, policy, Reconnector(clock, attempts, retry_policy=policy, what="test")


def test_start_makes_one_attempt_and_a_second_start_none():
    clock, attempts, policy, reconnector = make(1.0)
    reconnector.start()
    reconnector.start()
    assert len(attempts.made) == 1
    assert reconnector.running


def test_failed_attempts_retry_after_the_policys_delays():
    clock, attempts, policy, reconnector = make(1.0, 2.0, 4.0, 8.0)
    reconnector.start()
    attempts.made[0].errback(ConnectionRefusedError())
    assert reconnector.failed_attempts == 1
    assert policy.asked == [1]
    clock.advance(1.999)
    assert len(attempts.made) == 1
    clock.advance(0.001)
    assert len(attempts.made) == 2
    attempts.made[1].errback(ConnectionRefusedError())
    assert policy.asked == [1, 2]
    clock.advance(3.999)
    assert len(attempts.made) == 2
    clock.advance(0.001)
    assert len(attempts.made) == 3


def test_a_successful_attempt_resets_the_count_and_stops_trying():
    clock, attempts, policy, reconnector = make(1.0)
    reconnector.start()
    attempts.made[0].errback(ConnectionRefusedError())
    clock.advance(1.0)
    protocol = object()
    attempts.made[1].callback(protocol)
    assert reconnector.failed_attempts == 0
    assert clock.getDelayedCalls() == []
    clock.advance(100)
    assert len(attempts.made) == 2
    # The attempt's Deferred still gives the protocol to whoever else waits on it.
    assert attempts.made[1].result is protocol


def test_lost_schedules_an_attempt_after_the_first_delay():
    clock, attempts, policy, reconnector = make(0.5, 9.0)
    reconnector.start()
    attempts.made[0].callback(object())
    reconnector.lost()
    assert policy.asked == [0]
    clock.advance(0.499)
    assert len(attempts.made) == 1
    clock.advance(0.001)
    assert len(attempts.made) == 2


def test_lost_after_failures_starts_the_backoff_over():
    clock, attempts, policy, reconnector = make(0.5, 3.0)
    reconnector.start()
    attempts.made[0].errback(ConnectionRefusedError())
    clock.advance(3.0)
    attempts.made[1].callback(object())
    reconnector.lost()
    assert policy.asked == [1, 0]


def test_lost_twice_schedules_one_attempt():
    clock, attempts, policy, reconnector = make(0.5)
    reconnector.start()
    attempts.made[0].callback(object())
    reconnector.lost()
    reconnector.lost()
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(0.5)
    assert len(attempts.made) == 2


def test_stop_cancels_an_attempt_under_way_and_retries_no_more():
    clock, attempts, policy, reconnector = make(0.5)
    reconnector.start()
    reconnector.stop()
    assert attempts.cancelled == [attempts.made[0]]
    assert not reconnector.running
    # The cancelled attempt's failure schedules nothing.
    assert policy.asked == []
    assert clock.getDelayedCalls() == []
    clock.advance(100)
    assert len(attempts.made) == 1


def test_stop_cancels_a_scheduled_retry():
    clock, attempts, policy, reconnector = make(0.5)
    reconnector.start()
    attempts.made[0].errback(ConnectionRefusedError())
    assert len(clock.getDelayedCalls()) == 1
    reconnector.stop()
    assert clock.getDelayedCalls() == []
    clock.advance(100)
    assert len(attempts.made) == 1


def test_lost_after_stop_does_nothing():
    clock, attempts, policy, reconnector = make(0.5)
    reconnector.start()
    attempts.made[0].callback(object())
    reconnector.stop()
    reconnector.lost()
    assert clock.getDelayedCalls() == []
    assert len(attempts.made) == 1


def test_start_after_stop_tries_again():
    clock, attempts, policy, reconnector = make(0.5)
    reconnector.start()
    attempts.made[0].errback(ConnectionRefusedError())
    reconnector.stop()
    reconnector.start()
    assert len(attempts.made) == 2
    attempts.made[1].callback(object())
    assert clock.getDelayedCalls() == []


def test_stop_after_connected_leaves_the_attempt_alone():
    # connectionMade runs before the attempt's Deferred fires; a stop() in between (a client
    # closed as soon as it connects) must not cancel a connection already made.
    clock, attempts, policy, reconnector = make(0.5)
    reconnector.start()
    reconnector.connected()
    reconnector.stop()
    assert attempts.cancelled == []
    protocol = object()
    attempts.made[0].callback(protocol)
    assert attempts.made[0].result is protocol
    assert clock.getDelayedCalls() == []


def test_connected_resets_the_failures_and_a_late_success_is_harmless():
    clock, attempts, policy, reconnector = make(0.5, 3.0)
    reconnector.start()
    attempts.made[0].errback(ConnectionRefusedError())
    clock.advance(3.0)
    reconnector.connected()
    assert reconnector.failed_attempts == 0
    reconnector.lost()  # lost before the attempt's Deferred fired
    attempts.made[1].callback(object())
    assert policy.asked == [1, 0]
    clock.advance(0.5)
    assert len(attempts.made) == 3
    # The new attempt is still the one a stop() cancels.
    reconnector.stop()
    assert attempts.cancelled == [attempts.made[2]]


# -- the transition table --------------------------------------------------------------------------


def in_state(state: str) -> tuple[Clock, Attempts, Reconnector]:
    clock, attempts, policy, reconnector = make(0.5)
    if state != "stopped":
        reconnector.start()
    if state == "connected":
        attempts.made[0].callback(object())
    elif state == "waiting to retry":
        attempts.made[0].errback(ConnectionRefusedError())
    assert reconnector.state.value == state
    return clock, attempts, reconnector


@pytest.mark.parametrize(("state", "call"), [
    ("stopped", "connected"), ("stopped", "lost"), ("stopped", "stop"),
    ("connecting", "start"), ("connecting", "lost"),
    ("connected", "start"), ("connected", "connected"),
    ("waiting to retry", "start"), ("waiting to retry", "connected"),
    ("waiting to retry", "lost"),
])
def test_what_the_table_has_no_transition_for_changes_nothing(state, call):
    clock, attempts, reconnector = in_state(state)
    made, waits = len(attempts.made), len(clock.getDelayedCalls())
    getattr(reconnector, call)()
    assert reconnector.state.value == state
    assert (len(attempts.made), len(clock.getDelayedCalls())) == (made, waits)
    assert attempts.cancelled == []


def test_every_transition_of_the_table_is_taken():
    from wireproto.transports.reconnect import TRANSITIONS, ReconnectEvent, ReconnectState

    taken = set()
    for state in ReconnectState:
        for event in ReconnectEvent:
            if (state, event) in TRANSITIONS:
                taken.add((state.value, event.value, TRANSITIONS[state, event].value))
    assert taken == {
        ("stopped", "start", "connecting"),
        ("connecting", "connected", "connected"),
        ("connecting", "attempt failed", "waiting to retry"),
        ("connected", "connection lost", "waiting to retry"),
        ("waiting to retry", "retry due", "connecting"),
        ("connecting", "stop", "stopped"),
        ("connected", "stop", "stopped"),
        ("waiting to retry", "stop", "stopped"),
    }
    # And each one is what the reconnector does.
    clock, attempts, reconnector = in_state("waiting to retry")
    clock.advance(0.5)
    assert reconnector.state is ReconnectState.CONNECTING
    reconnector.connected()
    assert reconnector.state is ReconnectState.CONNECTED
    reconnector.lost()
    assert reconnector.state is ReconnectState.WAITING
    for state in ("connecting", "connected", "waiting to retry"):
        reconnector = in_state(state)[2]
        reconnector.stop()
        assert reconnector.state is ReconnectState.STOPPED
