"""The nydus client kit: the kit plays a nydus server over Engine.IO 4 (long-polling and the
WebSocket upgrade, wireproto.conformance.nydus.client.site) and judges the client that connects
(docs/conformance.md, "nydus clients: the driver and results"). `kit` is its catalogue, the
Engine.IO cases first; `make_factory` is the Listener's for an ``http://`` address."""

# messages imports transport: the Engine.IO cases come first in the catalogue.
from wireproto.conformance.nydus.client import messages  # noqa: F401 - it adds the cases
from wireproto.conformance.nydus.client.common import kit
from wireproto.conformance.nydus.client.site import EngineIOSite, make_factory

__all__ = ["EngineIOSite", "kit", "make_factory"]
