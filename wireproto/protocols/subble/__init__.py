"""SubbleSocket: the host's server role (`server`), its client registry (`registry`) and the
client role (`client`).

See docs/subblesocket.md. The names below are the public API of both roles.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from wireproto.protocols.subble.client import SubbleClient, SubbleEvent, connect
from wireproto.protocols.subble.registry import ClientRegistry

if TYPE_CHECKING:
    from wireproto.protocols.subble.server import SubbleHost, server_factory

# The server role, imported when first used: a client (wireproto pub) imports none of it.
_SERVER = ("SubbleHost", "server_factory")


def __getattr__(attribute: str) -> object:
    if attribute in _SERVER:
        value = getattr(importlib.import_module("wireproto.protocols.subble.server"), attribute)
        globals()[attribute] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


__all__ = [
    "ClientRegistry",
    "SubbleHost",
    "SubbleClient",
    "SubbleEvent",
    "server_factory",
    "connect",
]
