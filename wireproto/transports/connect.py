"""One call to connect a message protocol to any address: WebSocket URL or Twisted endpoint string.

``ws://`` and ``wss://`` URLs connect over WebSocket (``wss`` verifies the server's certificate
unless given other TLS options). Anything else is a Twisted client endpoint string (``tcp:``,
``ssl:``, ``unix:``, ``serial:``) carrying a framed stream: ``cobs`` on serial links,
``length32`` elsewhere, unless told otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint, clientFromString, wrapClientTLS
from twisted.internet.ssl import optionsForClientTLS

from wireproto.transports.base import IMessageProtocol
from wireproto.transports.serial import serial_endpoint_from_string
from wireproto.transports.stream import StreamOptions, stream_client_factory
from wireproto.transports.websocket import WebSocketOptions, websocket_client_factory

__all__ = [
    "client_endpoint",
    "connect",
    "default_framing",
    "is_websocket_address",
    "websocket_client",
]

WEBSOCKET_SCHEMES = ("ws://", "wss://")
# Frozen, so one shared default is safe.
_DEFAULT_WEBSOCKET_OPTIONS = WebSocketOptions()


def is_websocket_address(address: str) -> bool:
    """True for ``ws://`` and ``wss://`` URLs."""
    return address.lower().startswith(WEBSOCKET_SCHEMES)


def default_framing(address: str) -> str:
    """The framing a stream address gets when none is named: COBS on serial links."""
    return "cobs" if address.startswith("serial:") else "length32"


def client_endpoint(reactor: Any, address: str) -> Any:
    """The Twisted client endpoint for a stream address, with a clear error for a bad one.

    ``serial:`` is parsed here as well as by the endpoint plugin, so connecting to a serial
    port does not depend on Twisted finding the plugin.
    """
    try:
        if address.startswith("serial:"):
            return serial_endpoint_from_string(reactor, address)
        return clientFromString(reactor, address)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(
            f"cannot connect to {address!r}: {exc}. Use ws://host:port/path, wss://..., or an "
            "endpoint string such as tcp:host=127.0.0.1:port=9000, unix:path=/run/x.sock or "
            "serial:/dev/ttyACM0:baudrate=115200"
        ) from exc


def websocket_client(
    reactor: Any,
    address: str,
    protocol_factory: Callable[[], IMessageProtocol],
    websocket: WebSocketOptions = _DEFAULT_WEBSOCKET_OPTIONS,
    context_factory: Any = None,
) -> tuple[Any, Any]:
    """The client endpoint and the Autobahn factory that connect to a ``ws://`` or ``wss://``
    `address`; each connection's message protocol is a new ``protocol_factory()``."""
    try:
        factory = websocket_client_factory(address, protocol_factory, websocket, reactor=reactor)
    except Exception as exc:  # Autobahn raises bare Exception for a bad URL
        raise ValueError(f"cannot connect to {address!r}: {exc}") from exc
    endpoint: Any = HostnameEndpoint(reactor, factory.host, factory.port)
    if factory.isSecure:
        tls = context_factory if context_factory is not None else optionsForClientTLS(
            factory.host
        )
        endpoint = wrapClientTLS(tls, endpoint)
    elif context_factory is not None:
        raise ValueError(f"context_factory is for wss:// URLs, not {address!r}")
    return endpoint, factory


def connect(
    reactor: Any,
    address: str,
    protocol_factory: Callable[[], IMessageProtocol],
    *,
    framing: str | None = None,
    websocket: WebSocketOptions = _DEFAULT_WEBSOCKET_OPTIONS,
    stream: StreamOptions | None = None,
    context_factory: Any = None,
) -> Deferred[IMessageProtocol]:
    """Connect a new ``protocol_factory()`` protocol to `address`.

    The Deferred fires with that protocol once it can send (after the WebSocket opening
    handshake for ws/wss), or fails with a clear error: ConnectionRefusedError,
    `HandshakeFailed`, `SerialOpenFailed`, a TLS verification error...

    `framing` (for stream addresses) overrides `stream.framing`. `context_factory` is the TLS
    client options for ``wss://``, e.g. ``optionsForClientTLS("host", trustRoot=...)``; the
    default verifies the server against the system's trust roots.
    """
    if is_websocket_address(address):
        if framing is not None or stream is not None:
            raise ValueError(f"{address!r} is a WebSocket URL: framing and stream do not apply")
        endpoint, factory = websocket_client(
            reactor, address, protocol_factory, websocket, context_factory
        )
        opening = endpoint.connect(factory)
        opening.addCallback(lambda adapter: adapter.opened)
        return opening

    if context_factory is not None:
        raise ValueError(
            f"context_factory is for wss:// URLs; for TLS on a stream use an ssl: endpoint "
            f"string instead of {address!r}"
        )
    if stream is None:
        stream = StreamOptions(framing=framing or default_framing(address))
    elif framing is not None:
        stream = replace(stream, framing=framing)
    endpoint = client_endpoint(reactor, address)
    connecting = endpoint.connect(stream_client_factory(protocol_factory, stream))
    connecting.addCallback(lambda adapter: adapter.wrapped)
    return connecting
