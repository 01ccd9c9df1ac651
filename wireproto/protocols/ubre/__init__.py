"""UBRE: what both roles share (`peer`), the broker's server role (`server`) and the client role
(`client`).

See docs/ubre.md. The names below are the public API of both roles.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from wireproto.protocols.ubre.client import UbreClient, connect
from wireproto.protocols.ubre.peer import Handler

if TYPE_CHECKING:
    from wireproto.protocols.ubre.server import UbreServer, server_factory

# The server role, imported when first used: a client (wireproto pub) imports none of it.
_SERVER = ("UbreServer", "server_factory")


def __getattr__(attribute: str) -> object:
    if attribute in _SERVER:
        value = getattr(importlib.import_module("wireproto.protocols.ubre.server"), attribute)
        globals()[attribute] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


__all__ = ["Handler", "UbreServer", "UbreClient", "server_factory", "connect"]
