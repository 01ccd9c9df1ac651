"""The SubbleSocket 1.0.0 conformance kit: its catalogue is `kit`, cases in the order they run
(docs/conformance.md). The cases judge a SubbleSocket server (a host) by decoding what it sends
with wireproto's codec, as docs/subblesocket.md reads the spec."""

from __future__ import annotations

from importlib import import_module

from wireproto.conformance.subble.common import kit

# Each module adds its cases to `kit` as it is imported, in the order they run.
for _cases in ("handshake", "events", "malformed"):
    import_module(f"{__name__}.{_cases}")

__all__ = ["kit"]
