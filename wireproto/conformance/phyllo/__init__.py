"""The Phyllo device conformance kit (docs/conformance.md, "Phyllo devices: the driver and
results"): cases for a Phyllo device on a serial port (or a pty, TCP, a WebSocket) speaking the
minimal or the reduced stack, judged by wireproto's codec against the spec and docs/phyllo.md.

The device runs a small driver (the contract is in docs/conformance.md): it echoes the messages
on topics starting with ``echo``, and answers ``ping`` and ``reply``. The cases run in the order
of the modules below: the layers under the message (delimiters, COBS, datagrams, the CRC,
limits, resynchronising), then messages, documents and endpoints."""

from __future__ import annotations

from importlib import import_module

from wireproto.conformance.context import Context
from wireproto.conformance.phyllo.support import kit, open_line

__all__ = ["kit"]

ALIVE_WITHIN = 5.0  # seconds the liveness check sends an echo for, every 0.5 s

for _cases in ("line", "messages"):  # the catalogue's order
    import_module(f"{__name__}.{_cases}")


@kit.liveness
async def alive(ctx: Context) -> None:
    """A message on 'echo' comes back, sent again every 0.5 s for a while: a device that was
    just opened may reset first (an Arduino does)."""
    line = await open_line(ctx, settle=False)
    await line.settle(ALIVE_WITHIN)
