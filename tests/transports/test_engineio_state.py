"""The Engine.IO session's state machine (wireproto/transports/engineio/state.py), sans-IO: every
legal move, and every illegal one raising whose fault it is."""

from __future__ import annotations

import itertools

import pytest

from wireproto.errors import ProtocolError, UnexpectedMessage
from wireproto.transports.engineio.state import (
    PEER_EVENTS,
    TRANSITIONS,
    CarrierState,
    LocalTransitionError,
    PeerTransitionError,
    SessionEvent,
    SessionMachine,
    SessionState,
)

OPEN, CLOSING, CLOSED = SessionState.OPEN, SessionState.CLOSING, SessionState.CLOSED
POLLING, UPGRADING, PROBED, WEBSOCKET = (
    CarrierState.POLLING, CarrierState.UPGRADING, CarrierState.PROBED, CarrierState.WEBSOCKET,
)
E = SessionEvent

# Written out here, not read from the table, so that a change to the table shows.
LEGAL = {
    ((OPEN, POLLING), E.UPGRADE_OPENED): (OPEN, UPGRADING),
    ((OPEN, POLLING), E.CLOSE): (CLOSING, POLLING),
    ((OPEN, UPGRADING), E.PROBE): (OPEN, PROBED),
    ((OPEN, UPGRADING), E.UPGRADE): (OPEN, WEBSOCKET),
    ((OPEN, UPGRADING), E.UPGRADE_FAILED): (OPEN, POLLING),
    ((OPEN, PROBED), E.PROBE): (OPEN, PROBED),
    ((OPEN, PROBED), E.UPGRADE): (OPEN, WEBSOCKET),
    ((OPEN, PROBED), E.UPGRADE_FAILED): (OPEN, POLLING),
    ((OPEN, WEBSOCKET), E.CLOSE): (CLOSING, WEBSOCKET),
    ((CLOSING, POLLING), E.FINISH): (CLOSED, POLLING),
    ((CLOSING, WEBSOCKET), E.FINISH): (CLOSED, WEBSOCKET),
}

REACHABLE = [(OPEN, POLLING), (OPEN, UPGRADING), (OPEN, PROBED), (OPEN, WEBSOCKET),
             (CLOSING, POLLING), (CLOSING, WEBSOCKET), (CLOSED, POLLING), (CLOSED, WEBSOCKET)]

ILLEGAL = [(state, event) for state, event in itertools.product(REACHABLE, SessionEvent)
           if (state, event) not in LEGAL]


def machine_in(state: SessionState, carrier: CarrierState) -> SessionMachine:
    """A machine brought to (state, carrier) by legal moves only."""
    machine = SessionMachine(WEBSOCKET if carrier is WEBSOCKET else POLLING)
    if carrier in (UPGRADING, PROBED):
        machine.process(E.UPGRADE_OPENED)
    if carrier is PROBED:
        machine.process(E.PROBE)
    if state is not OPEN:
        machine.process(E.CLOSE)
    if state is CLOSED:
        machine.process(E.FINISH)
    assert (machine.state, machine.carrier) == (state, carrier)
    return machine


def test_the_table_holds_exactly_the_legal_moves():
    table = {(state, event): after for state, moves in TRANSITIONS.items()
             for event, after in moves.items()}
    assert table == LEGAL
    assert sorted(TRANSITIONS, key=repr) == sorted(REACHABLE, key=repr)


@pytest.mark.parametrize(("before", "event"), list(LEGAL), ids=repr)
def test_every_legal_move(before, event):
    machine = machine_in(*before)
    assert machine.allows(event)
    machine.process(event)
    assert (machine.state, machine.carrier) == LEGAL[before, event]


@pytest.mark.parametrize(("before", "event"), ILLEGAL, ids=repr)
def test_every_illegal_move_raises_and_leaves_the_state_alone(before, event):
    machine = machine_in(*before)
    assert not machine.allows(event)
    expected = PeerTransitionError if event in PEER_EVENTS else LocalTransitionError
    with pytest.raises(expected) as raised:
        machine.process(event)
    assert (machine.state, machine.carrier) == before
    assert event.value in str(raised.value)
    assert before[0].value in str(raised.value)


def test_the_peers_illegal_moves_are_protocol_errors_and_ours_are_not():
    assert issubclass(PeerTransitionError, UnexpectedMessage)
    assert issubclass(PeerTransitionError, ProtocolError)
    assert not issubclass(LocalTransitionError, ProtocolError)
    assert PEER_EVENTS == {E.UPGRADE_OPENED, E.PROBE, E.UPGRADE}


def test_a_probe_on_polling_is_the_clients_fault_and_says_so():
    machine = SessionMachine()
    with pytest.raises(PeerTransitionError,
                       match=r"session open on polling cannot take an upgrade probe \(2probe\)"):
        machine.process(E.PROBE)


def test_a_second_upgrade_is_refused():
    machine = SessionMachine()
    machine.process(E.UPGRADE_OPENED)
    with pytest.raises(PeerTransitionError, match="upgrade under way"):
        machine.process(E.UPGRADE_OPENED)


def test_closing_during_an_upgrade_needs_the_upgrade_ended_first():
    machine = machine_in(OPEN, PROBED)
    with pytest.raises(LocalTransitionError):
        machine.process(E.CLOSE)
    machine.process(E.UPGRADE_FAILED)
    machine.process(E.CLOSE)
    assert (machine.state, machine.carrier) == (CLOSING, POLLING)


def test_the_whole_life_of_an_upgraded_session():
    machine = SessionMachine()
    for event in (E.UPGRADE_OPENED, E.PROBE, E.UPGRADE, E.CLOSE, E.FINISH):
        machine.process(event)
    assert (machine.state, machine.carrier) == (CLOSED, WEBSOCKET)


def test_an_upgrade_can_fail_and_be_tried_again():
    machine = SessionMachine()
    machine.process(E.UPGRADE_OPENED)
    machine.process(E.UPGRADE_FAILED)
    machine.process(E.UPGRADE_OPENED)
    machine.process(E.UPGRADE)
    assert machine.carrier is WEBSOCKET


def test_a_session_opens_on_polling_or_on_a_websocket_only():
    assert (SessionMachine().state, SessionMachine().carrier) == (OPEN, POLLING)
    assert SessionMachine(WEBSOCKET).carrier is WEBSOCKET
    for carrier in (UPGRADING, PROBED):
        with pytest.raises(ValueError, match="opens on polling or on a WebSocket"):
            SessionMachine(carrier)
