"""The WEBSMQ client conformance kit (docs/conformance.md, "WEBSMQ clients: the driver and
results"): the kit plays a WEBSMQ broker and judges the client that connects, which runs a small
driver (support.py says what it does) over WebSocket or a framed stream. Every frame the client
sends is judged by wireproto's codec.

The cases run in the order of the modules below: what the client sends, what it does with what
a server may send, then how it reconnects."""

from __future__ import annotations

from importlib import import_module

from wireproto.codecs.websmq import Publish
from wireproto.conformance.context import Context
from wireproto.conformance.websmq.client.support import IN, kit, session

__all__ = ["kit"]

for _cases in ("sending", "receiving", "reconnecting"):  # the catalogue's order
    import_module(f"{__name__}.{_cases}")


@kit.liveness
async def alive(ctx: Context) -> None:
    """The client connects, declares what the driver declares, and echoes a publish."""
    client = await session(ctx)
    await client.echoed(Publish(IN, b"alive"), "the echo of a publish on the 'in' topic")
