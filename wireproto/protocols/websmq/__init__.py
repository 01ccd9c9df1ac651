"""WEBSMQ: the broker's server role (`server`) and the client role (`client`).

See docs/websmq.md. The names below are the public API of both roles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wireproto.lazy import later
from wireproto.protocols.websmq.client import WebsmqClientProtocol, connect

if TYPE_CHECKING:
    from wireproto.protocols.websmq.server import WIRE_FORMAT, WebsmqServerProtocol, server_factory

# The server role, imported when first used: a client (wireproto pub) imports none of it.
__getattr__ = later(__name__, {
    "wireproto.protocols.websmq.server": ("WIRE_FORMAT", "WebsmqServerProtocol", "server_factory"),
})

__all__ = [
    "WIRE_FORMAT",
    "WebsmqServerProtocol",
    "WebsmqClientProtocol",
    "server_factory",
    "connect",
]
