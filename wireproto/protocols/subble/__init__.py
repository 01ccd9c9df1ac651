"""SubbleSocket: the host's server role (`server`), its client registry (`registry`) and the
client role (`client`).

See docs/subblesocket.md. The names below are the public API of both roles.
"""

from wireproto.protocols.subble.client import SubbleClient, SubbleEvent, connect
from wireproto.protocols.subble.registry import ClientRegistry
from wireproto.protocols.subble.server import SubbleHost, server_factory

__all__ = [
    "ClientRegistry",
    "SubbleHost",
    "SubbleClient",
    "SubbleEvent",
    "server_factory",
    "connect",
]
