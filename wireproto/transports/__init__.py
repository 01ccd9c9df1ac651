"""Transport adapters: WebSocket, framed streams (tcp/ssl/unix) and serial ports, all carrying
whole messages to `IMessageProtocol` spec protocols through one `IMessageTransport` interface."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wireproto.lazy import later
from wireproto.transports.base import (
    IMessageProtocol,
    IMessageTransport,
    MessageProtocol,
    close_reason,
)
from wireproto.transports.connect import client_endpoint, connect, default_framing

if TYPE_CHECKING:
    from wireproto.transports.engineio import EngineIOOptions, engineio_resource
    from wireproto.transports.engineio.client import engineio_client_connect
    from wireproto.transports.serial import (
        SerialAddress,
        SerialEndpoint,
        SerialOpenFailed,
        serial_endpoint_from_string,
    )
    from wireproto.transports.stream import (
        FRAMINGS,
        StreamOptions,
        stream_client_factory,
        stream_server_factory,
    )
    from wireproto.transports.websocket import (
        HandshakeFailed,
        WebSocketOptions,
        websocket_client_factory,
        websocket_server_factory,
    )
    from wireproto.transports.websocket_http import websocket_resource, websocket_site

# The rest imported when first used: a client imports no server's parts (Engine.IO, a site).
# (connect is imported at once: its module's name would hide the function.)
_LATER = {
    "wireproto.transports.engineio": ("EngineIOOptions", "engineio_resource"),
    "wireproto.transports.engineio.client": ("engineio_client_connect",),
    "wireproto.transports.serial": ("SerialAddress", "SerialEndpoint", "SerialOpenFailed",
                                     "serial_endpoint_from_string"),
    "wireproto.transports.stream": ("FRAMINGS", "StreamOptions", "stream_client_factory",
                                    "stream_server_factory"),
    "wireproto.transports.websocket": ("HandshakeFailed", "WebSocketOptions",
                                       "websocket_client_factory", "websocket_server_factory"),
    "wireproto.transports.websocket_http": ("websocket_resource", "websocket_site"),
}

__getattr__ = later(__name__, _LATER)


__all__ = [
    "IMessageProtocol",
    "IMessageTransport",
    "MessageProtocol",
    "close_reason",
    "connect",
    "client_endpoint",
    "default_framing",
    "EngineIOOptions",
    "engineio_client_connect",
    "engineio_resource",
    "SerialAddress",
    "SerialEndpoint",
    "SerialOpenFailed",
    "serial_endpoint_from_string",
    "FRAMINGS",
    "StreamOptions",
    "stream_client_factory",
    "stream_server_factory",
    "HandshakeFailed",
    "WebSocketOptions",
    "websocket_client_factory",
    "websocket_resource",
    "websocket_server_factory",
    "websocket_site",
]
