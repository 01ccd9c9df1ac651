"""Autobahn's logger for one WebSocket (`AutobahnLog`), apart from wireproto.transports.websocket
only to keep that module short: its events are that module's (``websocket_error``)."""

from __future__ import annotations

from typing import Any

from autobahn.twisted.websocket import WebSocketServerProtocol
from twisted.logger import Logger, formatEvent

from wireproto import peerlog
from wireproto.peerlog import address_key, describe_address

__all__ = ["AutobahnLog"]

log = Logger(namespace="wireproto.transports.websocket")


class AutobahnLog:
    """Autobahn's logger for one WebSocket: its warnings and errors (a handshake it drops, an
    unclean close, a TLS failure), which a peer can cause at will, logged as
    ``websocket_error`` with the peer, within the peers' log budget; its debug and info lines
    passed on to its own logger, as before."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self._own = WebSocketServerProtocol.log  # Autobahn's, as its connections have it

    def warn(self, format: str = "", **fields: Any) -> None:
        transport = getattr(self.connection, "transport", None)
        peer = transport.getPeer() if transport is not None else None
        peerlog.warn(log, address_key(peer) if peer is not None else "websocket",
                     "WebSocket from {peer}: {error}", event="websocket_error",
                     peer=describe_address(peer) if peer is not None else None,
                     error=formatEvent({"log_format": format, **fields}))

    error = critical = warn

    def debug(self, format: str = "", **fields: Any) -> None:
        self._own.debug(format, **fields)

    def info(self, format: str = "", **fields: Any) -> None:
        self._own.info(format, **fields)

    trace = debug
