"""A small Phyllo device kit of the command's own tests (the Phyllo kit is tested apart): a
device that echoes each COBS frame passes its liveness check and the echo case, fails the case
that asks for what it never sends, and the information case says which --stack reached it.
`EchoDevice` is that device."""

from __future__ import annotations

from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.model import Level
from wireproto.transports.base import MessageProtocol

kit = Catalogue("phyllo", "Phyllo", "docs/phyllo.md", mode="device")


async def _echoed(ctx: Context, payload: bytes) -> None:
    probe = await ctx.connect()
    probe.send(payload)
    got = await probe.receive(what="the echo")
    if got.data != payload:
        raise ctx.fail(f"expected {payload!r} back, got {got.data!r}")


@kit.liveness
async def alive(ctx: Context) -> None:
    await _echoed(ctx, b"alive")


@kit.case("phyllo.sample.echo", "The device echoes a frame", section="Framing")
async def echo(ctx: Context) -> None:
    await _echoed(ctx, b"\x00\x01zero bytes inside")


@kit.case("phyllo.sample.impossible", "The device sends what nobody asked for",
          section="Framing", timeout=2.0)
async def impossible(ctx: Context) -> None:
    probe = await ctx.connect()
    await probe.receive(what="a frame nobody asked for", timeout=0.3)


@kit.case("phyllo.sample.stack", "The kit knows the device's stack", section="Stacks",
          level=Level.INFORMATION)
async def stack(ctx: Context) -> str:
    return f"stack {ctx.target.stack}, framing {ctx.target.framing}"


class EchoDevice(MessageProtocol):
    def messageReceived(self, data: bytes, binary: bool) -> None:
        self.transport.sendMessage(data, binary)
