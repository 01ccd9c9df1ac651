"""Where an Engine.IO server session is in its life, and what carries it: a sans-IO state machine
with its transition table, in the manner of h11's ``_state.py``.

A session's state is a pair. Its `SessionState` is its life: OPEN takes a slot; CLOSING has told
the protocol and waits to give the client its close packet; CLOSED is forgotten, and its sid
refused as unknown. Its `CarrierState` is what carries it: long-polling, polling with an upgrade
to a WebSocket under way (before and after the client's probe), or the WebSocket.

`TRANSITIONS` lists every legal move; anything else raises. The client decides the upgrade's
events (`PEER_EVENTS`): one its session's state does not allow is the client's fault, a
`PeerTransitionError` (an `UnexpectedMessage`). Any other illegal event is a fault of this side,
a `LocalTransitionError`. Nothing here does I/O or keeps time: the session (``session.py``) feeds
the machine its events and acts on the state it reaches.
"""

from __future__ import annotations

from enum import Enum

from wireproto.errors import UnexpectedMessage

__all__ = [
    "SessionState",
    "CarrierState",
    "SessionEvent",
    "PEER_EVENTS",
    "TRANSITIONS",
    "SessionMachine",
    "PeerTransitionError",
    "LocalTransitionError",
]


class SessionState(Enum):
    """OPEN takes a slot; CLOSING has told the protocol and waits to give the client its close
    packet; CLOSED is forgotten, and its sid refused as unknown."""

    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class CarrierState(Enum):
    """What carries the session: polling, an upgrade under way (a WebSocket opened with the
    session's sid, then probed), or the WebSocket it moved to."""

    POLLING = "polling"
    UPGRADING = "upgrading"
    PROBED = "probed"
    WEBSOCKET = "websocket"


class SessionEvent(Enum):
    # The client opened a WebSocket with the session's sid, to move the session there.
    UPGRADE_OPENED = "a WebSocket opened to upgrade the session"
    # The client's "2probe" on that WebSocket (answered "3probe"; polls are released at once).
    PROBE = "an upgrade probe (2probe)"
    # The client's "5" on that WebSocket: the session moves to it.
    UPGRADE = "an upgrade packet (5)"
    # The upgrade ended without the move: its WebSocket closed, timed out or sent something
    # else, or the session is closing.
    UPGRADE_FAILED = "the end of an upgrade"
    # The session closes (for whatever reason: either side, a timeout, a lost carrier).
    CLOSE = "a close"
    # The session is over and forgotten (its close packet out, or no one left to take it).
    FINISH = "the end of the session"


PEER_EVENTS = frozenset({SessionEvent.UPGRADE_OPENED, SessionEvent.PROBE, SessionEvent.UPGRADE})

_OPEN, _CLOSING, _CLOSED = SessionState.OPEN, SessionState.CLOSING, SessionState.CLOSED
_POLLING, _UPGRADING, _PROBED, _WEBSOCKET = (
    CarrierState.POLLING, CarrierState.UPGRADING, CarrierState.PROBED, CarrierState.WEBSOCKET,
)

State = tuple[SessionState, CarrierState]

# Every legal move: state -> event -> next state. A session closes from polling or from its
# WebSocket; one with an upgrade under way ends the upgrade first.
TRANSITIONS: dict[State, dict[SessionEvent, State]] = {
    (_OPEN, _POLLING): {
        SessionEvent.UPGRADE_OPENED: (_OPEN, _UPGRADING),
        SessionEvent.CLOSE: (_CLOSING, _POLLING),
    },
    (_OPEN, _UPGRADING): {
        SessionEvent.PROBE: (_OPEN, _PROBED),
        # engine.io takes the upgrade packet without a probe before it.
        SessionEvent.UPGRADE: (_OPEN, _WEBSOCKET),
        SessionEvent.UPGRADE_FAILED: (_OPEN, _POLLING),
    },
    (_OPEN, _PROBED): {
        # Each probe is answered, as engine.io answers each.
        SessionEvent.PROBE: (_OPEN, _PROBED),
        SessionEvent.UPGRADE: (_OPEN, _WEBSOCKET),
        SessionEvent.UPGRADE_FAILED: (_OPEN, _POLLING),
    },
    (_OPEN, _WEBSOCKET): {
        SessionEvent.CLOSE: (_CLOSING, _WEBSOCKET),
    },
    (_CLOSING, _POLLING): {
        SessionEvent.FINISH: (_CLOSED, _POLLING),
    },
    (_CLOSING, _WEBSOCKET): {
        SessionEvent.FINISH: (_CLOSED, _WEBSOCKET),
    },
    (_CLOSED, _POLLING): {},
    (_CLOSED, _WEBSOCKET): {},
}


_WHERE = {
    _POLLING: "on polling",
    _UPGRADING: "on polling with an upgrade under way",
    _PROBED: "on polling with an upgrade probed",
    _WEBSOCKET: "on its WebSocket",
}


class PeerTransitionError(UnexpectedMessage):
    """The client did something its session's state does not allow."""


class LocalTransitionError(RuntimeError):
    """This side asked its session for a move its state does not allow (a bug here)."""


class SessionMachine:
    """One session's state: OPEN on `carrier` (polling after a polling handshake, the WebSocket
    for a WebSocket of its own), moved only by `process`."""

    __slots__ = ("state", "carrier")

    def __init__(self, carrier: CarrierState = CarrierState.POLLING) -> None:
        if carrier not in (_POLLING, _WEBSOCKET):
            raise ValueError(f"a session opens on polling or on a WebSocket, not {carrier}")
        self.state = _OPEN
        self.carrier = carrier

    def __repr__(self) -> str:
        return f"<SessionMachine {self.state.value} {_WHERE[self.carrier]}>"

    def allows(self, event: SessionEvent) -> bool:
        return event in TRANSITIONS[self.state, self.carrier]

    def process(self, event: SessionEvent) -> None:
        """Move on `event`, or raise: PeerTransitionError for one of the client's, else
        LocalTransitionError."""
        try:
            self.state, self.carrier = TRANSITIONS[self.state, self.carrier][event]
        except KeyError:
            message = (f"an Engine.IO session {self.state.value} {_WHERE[self.carrier]} "
                       f"cannot take {event.value}")
            if event in PEER_EVENTS:
                raise PeerTransitionError(message) from None
            raise LocalTransitionError(message) from None
