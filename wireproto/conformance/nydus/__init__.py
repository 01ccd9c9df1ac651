"""The nydus conformance kit: nydus-protocol 3.0.0 over Engine.IO 4, as a server serves it
(docs/conformance.md; docs/nydus.md for nydus and Engine.IO). `kit` is its catalogue: the
Engine.IO cases first (wireproto.conformance.nydus.transport), then nydus's own
(wireproto.conformance.nydus.messages)."""

# messages imports transport: the Engine.IO cases come first in the catalogue.
from wireproto.conformance.nydus import messages  # noqa: F401 - it adds the cases
from wireproto.conformance.nydus.common import kit

__all__ = ["kit"]
