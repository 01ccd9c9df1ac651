"""nydus: the broker's server role (`server`), the client role (`client`) and the route patterns
both use (`routes`, a port of ruta3).

See docs/nydus.md. The names below are the public API of both roles.
"""

from wireproto.protocols.nydus.client import NydusClient, connect
from wireproto.protocols.nydus.routes import Match, RouteTable
from wireproto.protocols.nydus.server import Invocation, InvokeError, NydusServer, server_factory

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
