"""A small WEBSMQ client kit of the command's own tests (the protocol kits are tested apart):
a liveness check, a MUST met, a SHOULD a crashing client does not meet, a MUST no client meets,
and an information case that sees the client reconnect; tests/conformance/sample_client.py is
the client it judges."""

from __future__ import annotations

from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.listener import ClientProbe
from wireproto.conformance.model import Level

kit = Catalogue("websmq", "WEBSMQ", "docs/websmq.md", mode="client")


async def _hello(ctx: Context) -> ClientProbe:
    probe = await ctx.accept()
    got = await probe.receive(what="hello")
    if got.data != b"hello":
        raise ctx.fail(f"expected hello, got {got.data!r}")
    return probe


@kit.liveness
async def alive(ctx: Context) -> None:
    await _hello(ctx)


@kit.case("websmq.client.sample.echo", "The client echoes a message", section="Messages")
async def echo(ctx: Context) -> None:
    probe = await _hello(ctx)
    probe.send(b"ping")
    got = await probe.receive(what="the echo")
    if got.data != b"ping":
        raise ctx.fail(f"expected ping, got {got.data!r}")


@kit.case("websmq.client.sample.crash", "The client survives a message it dislikes",
          section="Messages", level=Level.SHOULD)
async def crash(ctx: Context) -> None:
    probe = await _hello(ctx)
    probe.send(b"crash")
    probe.send(b"after")
    await probe.receive(what="the echo of a message after it")


@kit.case("websmq.client.sample.impossible", "The client sends what nobody asked for",
          section="Messages", timeout=2.0)
async def impossible(ctx: Context) -> None:
    probe = await _hello(ctx)
    await probe.receive(what="a message nobody asked for", timeout=0.3)


@kit.case("websmq.client.sample.reconnects", "The client connects again when the server "
          "goes away", section="Connections", level=Level.INFORMATION, timeout=8.0)
async def reconnects(ctx: Context) -> str:
    assert ctx.listener is not None
    probe = await _hello(ctx)
    await ctx.listener.pause()
    probe.abort()
    await ctx.sleep(0.5)
    await ctx.listener.resume()
    await _hello(ctx)
    return "connected again"
