"""Where a SubbleSocket connection is in its life, on either side of the handshake."""

from enum import Enum

__all__ = ["HandshakeState"]


class HandshakeState(Enum):
    """AWAITING the handshake's request (the host) or response (the client); ANSWERING a
    request (the host, while it decides); OPEN once accepted, when events flow; ENDED once
    refused, replaced or broken, when nothing more is read."""

    AWAITING = "awaiting"
    ANSWERING = "answering"
    OPEN = "open"
    ENDED = "ended"
