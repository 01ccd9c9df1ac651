"""The UBRE client kit: `kit`, the catalogue of cases that judge a UBRE client, which connects
to the kit playing a server and runs the driver contract (docs/conformance.md, "UBRE clients:
the driver and results").

The cases are in this package's modules, registered in the order they run: what the client
sends, what it does with what a server sends (malformed input too), and how it reconnects."""

from wireproto.conformance.ubre.client import sends, receives, reconnect  # noqa: F401, I001
from wireproto.conformance.ubre.client.session import kit

__all__ = ["kit"]
