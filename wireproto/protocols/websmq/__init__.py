"""WEBSMQ: the broker's server role (`server`) and the client role (`client`).

See docs/websmq.md. The names below are the public API of both roles.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from wireproto.protocols.websmq.client import WebsmqClientProtocol, connect

if TYPE_CHECKING:
    from wireproto.protocols.websmq.server import WIRE_FORMAT, WebsmqServerProtocol, server_factory

# The server role, imported when first used: a client (wireproto pub) imports none of it.
_SERVER = ("WIRE_FORMAT", "WebsmqServerProtocol", "server_factory")


def __getattr__(attribute: str) -> object:
    if attribute in _SERVER:
        value = getattr(importlib.import_module("wireproto.protocols.websmq.server"), attribute)
        globals()[attribute] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


__all__ = [
    "WIRE_FORMAT",
    "WebsmqServerProtocol",
    "WebsmqClientProtocol",
    "server_factory",
    "connect",
]
