"""WEBSMQ: the broker's server role (`server`) and the client role (`client`).

See docs/websmq.md. The names below are the public API of both roles.
"""

from wireproto.protocols.websmq.client import WebsmqClientProtocol, connect
from wireproto.protocols.websmq.server import WIRE_FORMAT, WebsmqServerProtocol, server_factory

__all__ = [
    "WIRE_FORMAT",
    "WebsmqServerProtocol",
    "WebsmqClientProtocol",
    "server_factory",
    "connect",
]
