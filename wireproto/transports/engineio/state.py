"""Where an Engine.IO server session is in its life."""

from enum import Enum

__all__ = ["SessionState"]


class SessionState(Enum):
    """OPEN takes a slot; CLOSING has told the protocol and waits to give the client its close
    packet; CLOSED is forgotten, and its sid refused as unknown."""

    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
