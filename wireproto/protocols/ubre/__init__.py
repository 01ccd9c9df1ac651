"""UBRE: what both roles share (`peer`), the broker's server role (`server`) and the client role
(`client`).

See docs/ubre.md. The names below are the public API of both roles.
"""

from wireproto.protocols.ubre.client import UbreClient, connect
from wireproto.protocols.ubre.peer import Handler
from wireproto.protocols.ubre.server import UbreServer, server_factory

__all__ = ["Handler", "UbreServer", "UbreClient", "server_factory", "connect"]
