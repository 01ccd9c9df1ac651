"""What the tools read of the protocol registry (wireproto.protocols): which protocol an address
speaks, and the pub/sub link and the caller class of each protocol, as its descriptor names them.

The classes a descriptor names (wireproto.tools.links, wireproto.tools.callers) never read the
registry themselves, so the registry and the tools do not lean on each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from wireproto.protocols import PROTOCOLS, load
from wireproto.tools._common import EXIT_USAGE, ToolError
from wireproto.tools.callers import Caller
from wireproto.tools.links import Link

__all__ = ["protocol_of", "links", "call_protocols"]


def _path_protocols() -> dict[str, str]:
    """A ws:// or http:// URL's last path segment -> the protocol served there by default: each
    descriptor's default path, and engine.io for the protocol that runs over Engine.IO."""
    found = {}
    for name, descriptor in PROTOCOLS.items():
        if descriptor.default_path:
            found[descriptor.default_path.strip("/").split("/")[-1]] = name
        if "engineio" in descriptor.transports:
            found["engine.io"] = name
    return found


def protocol_of(address: str, given: str | None, allowed: Sequence[str]) -> str:
    """The protocol to speak at `address`: `given` (--protocol), else the one a URL's path
    names (``ws://host:8765/ubre``), the one spoken over Engine.IO for an ``http://`` URL,
    phyllo on a ``serial:`` port if allowed."""
    if given is not None:
        protocol = given
    elif address.lower().startswith(("http://", "https://", "http+unix://")):
        # Only Engine.IO is spoken over http://, whatever the path.
        protocol = next((name for name, descriptor in PROTOCOLS.items()
                         if "engineio" in descriptor.transports and name in allowed), "")
    elif "://" in address:
        path = urlsplit(address).path.strip("/").split("/")
        protocol = _path_protocols().get(path[-1] if path else "", "")
    elif address.startswith("serial:") and "phyllo" in allowed:
        protocol = "phyllo"
    else:
        protocol = ""
    if not protocol:
        raise ToolError(
            f"cannot tell the protocol of {address!r}: give --protocol ({', '.join(allowed)})",
            EXIT_USAGE,
        )
    if protocol not in allowed:
        raise ToolError(
            f"{protocol} is not spoken here; use {', '.join(allowed)}", EXIT_USAGE
        )
    return protocol


def links() -> dict[str, type[Link]]:
    """The protocols the tools publish and subscribe in, each with its link class (the
    `pubsub_link` of its descriptor in wireproto.protocols)."""
    return {name: load(d.pubsub_link) for name, d in PROTOCOLS.items() if d.pubsub_link}


def call_protocols() -> dict[str, Callable[..., Caller]]:
    """The protocols ``wireproto call`` speaks, each with its caller class (the `caller` of its
    descriptor in wireproto.protocols)."""
    return {name: load(d.caller) for name, d in PROTOCOLS.items() if d.caller}
