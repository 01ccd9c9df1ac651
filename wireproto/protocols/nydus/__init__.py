"""nydus: the broker's server role (`server`), the client role (`client`) and the route patterns
both use (`routes`, a port of ruta3).

See docs/nydus.md. The names below are the public API of both roles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wireproto.lazy import later
from wireproto.protocols.nydus.client import NydusClient, connect
from wireproto.protocols.nydus.routes import Match, RouteTable

if TYPE_CHECKING:
    from wireproto.protocols.nydus.server import (
        Invocation,
        InvokeError,
        NydusServer,
        server_factory,
    )

# The server role, imported when first used: a client (wireproto pub) imports none of it.
__getattr__ = later(__name__, {
    "wireproto.protocols.nydus.server": (
        "Invocation",
        "InvokeError",
        "NydusServer",
        "server_factory",
    ),
})

__all__ = [
    "InvokeError",
    "Invocation",
    "Match",
    "RouteTable",
    "NydusServer",
    "NydusClient",
    "server_factory",
    "connect",
]
