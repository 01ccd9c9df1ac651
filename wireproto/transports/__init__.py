"""Transport adapters: WebSocket, framed streams (tcp/ssl/unix) and serial ports, all carrying
whole messages to `IMessageProtocol` spec protocols through one `IMessageTransport` interface."""

from wireproto.transports.base import (
    IMessageProtocol,
    IMessageTransport,
    MessageProtocol,
    close_reason,
)
from wireproto.transports.connect import client_endpoint, connect, default_framing
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
    websocket_resource,
    websocket_server_factory,
    websocket_site,
)

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
