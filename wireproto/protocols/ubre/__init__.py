"""UBRE: what both roles share (`peer`), the broker's server role (`server`) and the client role
(`client`).

See docs/ubre.md. The names below are the public API of both roles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wireproto.lazy import later
from wireproto.protocols.ubre.client import UbreClient, connect
from wireproto.protocols.ubre.peer import Handler

if TYPE_CHECKING:
    from wireproto.protocols.ubre.server import UbreServer, server_factory

# The server role, imported when first used: a client (wireproto pub) imports none of it.
__getattr__ = later(__name__, {
    "wireproto.protocols.ubre.server": ("UbreServer", "server_factory"),
})

__all__ = ["Handler", "UbreServer", "UbreClient", "server_factory", "connect"]
