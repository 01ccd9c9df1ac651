"""WEBSMQ client cases for a connection lost: the server closes (each way), aborts, goes away
for a while, or accepts and drops every connection. The spec says nothing of reconnecting, so
whether a client does is information; one that does should declare its will and subscribe
again, and should wait longer and longer while the server keeps dropping it."""

from __future__ import annotations

from wireproto.codecs.websmq import LastWill
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level, NotApplicable
from wireproto.conformance.websmq.client.support import (
    ANSWER_WAIT,
    WILL,
    WILL_PAYLOAD,
    Session,
    kit,
    session,
)

RECONNECT_WAIT = 8.0  # how long a case waits for the client to connect again
SECTION = "Declare a last will"  # the spec's only word on a connection's end


async def _again(ctx: Context, lost_at: float) -> str:
    """How long after `lost_at` the client connected again, or NotApplicable-worthy text."""
    try:
        await ctx.accept(RECONNECT_WAIT, "the client to connect again")
    except CaseFailed:
        return f"did not connect again within {RECONNECT_WAIT:g} s"
    attempts = [at for at in ctx.listener.attempts if at >= lost_at] if ctx.listener else []
    delay = (attempts[0] if attempts else ctx.reactor.seconds()) - lost_at
    return f"connected again after {delay:.1f} s"


def _info(id: str, title: str, how: str) -> None:
    async def body(ctx: Context) -> str:
        client = await session(ctx)
        lost_at = ctx.reactor.seconds()
        if how == "abort":
            client.probe.abort()
        else:
            client.close_with(1000 if how == "close" else 1011,
                              b"" if how == "close" else b"internal error")
        return await _again(ctx, lost_at)

    body.__name__ = body.__qualname__ = id.rsplit(".", 1)[1].replace("-", "_")
    kit.case(id, title, section=SECTION, level=Level.INFORMATION, timeout=12.0)(body)


_info("websmq.client.reconnect.after-close",
      "Reports whether, and how soon, the client connects again after the server closes "
      "(1000)", "close")
_info("websmq.client.reconnect.after-error",
      "Reports whether, and how soon, the client connects again after the server closes with "
      "1011 (internal error)", "error")
_info("websmq.client.reconnect.after-abort",
      "Reports whether, and how soon, the client connects again after the connection is "
      "aborted", "abort")


@kit.case("websmq.client.reconnect.resubscribes",
          "A client that connects again declares its will and subscribes again, and works",
          section=SECTION, level=Level.SHOULD, timeout=12.0)
async def reconnect_resubscribes(ctx: Context) -> str:
    client = await session(ctx)
    client.close_with(1000)
    try:
        probe = await ctx.accept(RECONNECT_WAIT, "the client to connect again")
    except CaseFailed:
        raise NotApplicable(f"the client did not connect again within {RECONNECT_WAIT:g} s") \
            from None
    again = Session(ctx, probe)
    await again.ready(ANSWER_WAIT)
    if LastWill(WILL, WILL_PAYLOAD) not in again.sent:
        raise CaseFailed(f"on connecting again the client did not declare its will; it sent "
                         f"{again.shown_sent(8)}")
    await again.works("the echo of a publish on the new connection")
    return "subscribed again and declared its will"


@kit.case("websmq.client.reconnect.server-gone",
          "Reports whether, and how soon, the client connects again once a server that "
          "stopped listening for 3 s listens again", section=SECTION,
          level=Level.INFORMATION, timeout=16.0)
async def reconnect_server_gone(ctx: Context) -> str:
    assert ctx.listener is not None
    client = await session(ctx)
    await ctx.listener.pause()
    try:
        client.probe.abort()
        await ctx.sleep(3.0)
    finally:
        await ctx.listener.resume()
    return await _again(ctx, ctx.reactor.seconds()) + " (after the server listened again)"


BACKOFF_WATCH = 12.0  # seconds the kit drops every connection for


@kit.case("websmq.client.reconnect.backoff",
          "While the server drops every connection at once, the client waits longer and longer "
          "between attempts (no tight loop)", section=SECTION, level=Level.SHOULD,
          timeout=16.0)
async def reconnect_backoff(ctx: Context) -> str:
    listener = ctx.listener
    assert listener is not None
    client = await session(ctx)
    listener.refusing = True
    try:
        started = ctx.reactor.seconds()
        client.probe.abort()
        await ctx.sleep(BACKOFF_WATCH)
    finally:
        listener.refusing = False
    times = [at for at in listener.attempts if started <= at <= started + BACKOFF_WATCH]
    if not times:
        raise NotApplicable(f"the client did not connect again within {BACKOFF_WATCH:g} s")
    pauses = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    seen = (f"{len(times)} attempts in {BACKOFF_WATCH:g} s; first after "
            f"{times[0] - started:.2f} s, then pauses of "
            + (", ".join(f"{pause:.2f}" for pause in pauses[:12]) or "none") + " s")
    if len(pauses) < 2:
        return seen  # one or two attempts in that time: no loop to speak of
    if pauses[-1] < 1.5 * pauses[0] or len(times) > 20:
        raise CaseFailed(f"the pauses did not grow: {seen}")
    return seen
