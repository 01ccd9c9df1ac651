"""SubbleSocket: the host's server role (`server`), its client registry (`registry`) and the
client role (`client`).

See docs/subblesocket.md. The names below are the public API of both roles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wireproto.lazy import later
from wireproto.protocols.subble.client import SubbleClient, SubbleEvent, connect
from wireproto.protocols.subble.registry import ClientRegistry

if TYPE_CHECKING:
    from wireproto.protocols.subble.server import SubbleHost, server_factory

# The server role, imported when first used: a client (wireproto pub) imports none of it.
__getattr__ = later(__name__, {
    "wireproto.protocols.subble.server": ("SubbleHost", "server_factory"),
})

__all__ = [
    "ClientRegistry",
    "SubbleHost",
    "SubbleClient",
    "SubbleEvent",
    "server_factory",
    "connect",
]
