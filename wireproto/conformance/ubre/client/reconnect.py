"""How the client takes a closed connection and a server that goes away: whether it reconnects
(a client that does not is information, not a failure: UBRE leaves connections to the
application), subscribes again, and waits longer and longer while the server refuses it."""

from __future__ import annotations

from twisted.internet import defer, protocol
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IReactorTime

from wireproto.conformance.context import Context
from wireproto.conformance.model import Level, NotApplicable
from wireproto.conformance.ubre.client.session import Session, kit, session

RECONNECTING = "docs/ubre.md#reconnecting"
SECTION = "Introduction (connection management is left to the application)"
# How long the kit waits for a client to come back.
COME_BACK = 8.0


async def _close(s: Session, code: int | None) -> None:
    transport = s.probe.transport
    if code is None or not s.over_websocket:
        s.probe.close()
    else:
        s.probe.recorder.add(s.probe.number, "event", text=f"the kit closes with {code}")
        # Autobahn's own call: the message transport's loseConnection says 1000 or 1002.
        getattr(transport, "sendCloseFrame")(code=code, reasonUtf8=b"conformance")  # noqa: B009
    await s.probe.closed(3.0, "the close to complete")


async def _comes_back(ctx: Context, since: float) -> tuple[Session, float]:
    """The client's next connection, past its subscribes, and how long after `since` it came;
    NotApplicable when it does not come (or its process ended: it does not reconnect)."""
    listener = ctx.listener
    deadline = ctx.reactor.seconds() + COME_BACK
    while listener is not None and not listener.held:
        if ctx.client is not None and not ctx.client.running:
            raise NotApplicable(f"the client does not reconnect: it {ctx.client.described()} "
                                "when its connection closed")
        if ctx.reactor.seconds() >= deadline:
            raise NotApplicable(f"the client did not reconnect within {COME_BACK:g} s")
        await ctx.sleep(0.05)
    attempts = [at for at in listener.attempts if at >= since] if listener else []
    first = attempts[0] if attempts else ctx.reactor.seconds()
    again = await session(ctx, max(1.0, deadline - ctx.reactor.seconds()))
    return again, first - since


async def _watch(ctx: Context, seconds: float) -> None:
    """Wait `seconds`, less when the client's process ends (it will not reconnect)."""
    deadline = ctx.reactor.seconds() + seconds
    while ctx.reactor.seconds() < deadline:
        if ctx.client is not None and not ctx.client.running:
            return
        await ctx.sleep(min(0.1, deadline - ctx.reactor.seconds()))


@kit.case("ubre.client.reconnect.after-close",
          "Whether and how soon the client reconnects after the server closes its connection "
          "normally (1000)",
          section=SECTION, level=Level.INFORMATION, decision=RECONNECTING, timeout=15.0)
async def after_close(ctx: Context) -> str:
    await _close(await session(ctx), None)
    again, delay = await _comes_back(ctx, ctx.reactor.seconds())
    await again.works("reconnecting")
    return f"it reconnected after {delay:.2f} s"


@kit.case("ubre.client.reconnect.going-away",
          "Whether the client reconnects after a close with 1001 (going away) or 1011 (server "
          "error), and keeps working",
          section=SECTION, level=Level.INFORMATION, decision=RECONNECTING, timeout=20.0)
async def going_away(ctx: Context) -> str:
    s = await session(ctx)
    if not s.over_websocket:
        raise NotApplicable("close codes are WebSocket's")
    seen = []
    for code in (1001, 1011):
        await _close(s, code)
        s, delay = await _comes_back(ctx, ctx.reactor.seconds())
        await s.works(f"a close with {code}")
        seen.append(f"after {code}: back in {delay:.2f} s")
    return "; ".join(seen)


@kit.case("ubre.client.reconnect.resubscribes",
          "A client that reconnects subscribes again to its topics on the new connection",
          section=SECTION, level=Level.SHOULD, decision=RECONNECTING, timeout=15.0)
async def resubscribes(ctx: Context) -> None:
    s = await session(ctx)
    s.probe.abort()
    # _comes_back waits for the three subscribes: not seeing them is the failure.
    again, _ = await _comes_back(ctx, ctx.reactor.seconds())
    await again.works("reconnecting")


@kit.case("ubre.client.reconnect.server-gone",
          "Whether the client comes back when the server vanishes for 2 s and listens again, "
          "and how long it takes",
          section=SECTION, level=Level.INFORMATION, decision=RECONNECTING, timeout=20.0)
async def server_gone(ctx: Context) -> str:
    s = await session(ctx)
    listener = ctx.listener
    if listener is None:
        raise NotApplicable("no listener")
    await listener.pause()
    s.probe.abort()
    await ctx.sleep(2.0)
    await listener.resume()
    resumed = ctx.reactor.seconds()
    again, delay = await _comes_back(ctx, resumed)
    await again.works("the server coming back")
    return f"it was back {delay:.2f} s after the server listened again"


class _Refuse(protocol.Protocol):
    """Takes a TCP connection and closes it at once: the WebSocket handshake (or TLS) fails,
    which a client counts as a failed attempt."""

    def connectionMade(self) -> None:
        if len(self.factory.attempts) < ATTEMPTS_KEPT:  # a client in a tight loop
            self.factory.attempts.append(self.factory.reactor.seconds())
        else:
            self.factory.more += 1
        if self.transport is not None:
            self.transport.loseConnection()


class _Refusing(protocol.Factory):
    protocol = _Refuse

    def __init__(self, reactor: IReactorTime) -> None:
        self.reactor = reactor
        self.attempts: list[float] = []
        self.more = 0


# The attempts the backoff case keeps the time of; more are only counted.
ATTEMPTS_KEPT = 1000
# How long the backoff case watches the client's attempts.
BACKOFF_WATCH = 12.0


@kit.case("ubre.client.reconnect.backoff",
          "While every connection fails (the server takes it and drops it before the WebSocket "
          "handshake), the client waits longer and longer between attempts: no tight loop",
          section=SECTION, level=Level.SHOULD, decision=RECONNECTING, timeout=20.0)
async def backoff(ctx: Context) -> str:
    s = await session(ctx)
    listener = ctx.listener
    if listener is None or not s.over_websocket or listener.bound_port is None:
        raise NotApplicable("a failed handshake is a WebSocket's, on TCP: on a stream, a "
                            "connection the kit can count is one the client made")
    fields = listener.endpoint.split(":")
    refusing = _Refusing(ctx.reactor)
    await listener.pause()
    s.probe.abort()
    port = await serverFromString(
        ctx.reactor, ":".join([fields[0], str(listener.bound_port), *fields[2:]])
    ).listen(refusing)
    try:
        await _watch(ctx, BACKOFF_WATCH)
    finally:
        await defer.maybeDeferred(port.stopListening)
        await listener.resume()
    attempts = refusing.attempts
    if refusing.more:
        raise ctx.fail(f"it reconnects in a tight loop: {len(attempts) + refusing.more} "
                       f"attempts in {BACKOFF_WATCH:g} s")
    if len(attempts) < 2:
        raise NotApplicable(f"the client made {len(attempts)} attempt(s) in "
                            f"{BACKOFF_WATCH:g} s: it does not reconnect on its own"
                            + _ended(ctx))
    gaps = [round(b - a, 2) for a, b in zip(attempts, attempts[1:], strict=False)]
    said = f"{len(attempts)} attempts in {BACKOFF_WATCH:g} s, pauses {gaps[:12]}"
    if len(attempts) > 30:
        raise ctx.fail(f"it reconnects in a tight loop: {said}")
    if len(gaps) >= 3 and gaps[-1] <= gaps[0] + 0.25:
        raise ctx.fail(f"its pauses do not grow: {said}")
    return said


@kit.case("ubre.client.reconnect.dropped-at-once",
          "How often the client reconnects when each connection is dropped as soon as it is "
          "open (a server that takes the handshake and then refuses the client)",
          section=SECTION, level=Level.INFORMATION, decision=RECONNECTING, timeout=20.0)
async def dropped_at_once(ctx: Context) -> str:
    s = await session(ctx)
    listener = ctx.listener
    if listener is None:
        raise NotApplicable("no listener")
    listener.refusing = True
    start = ctx.reactor.seconds()
    try:
        s.probe.abort()
        await _watch(ctx, 8.0)
    finally:
        listener.refusing = False
    attempts = [at for at in listener.attempts if at >= start]
    if len(attempts) < 2:
        raise NotApplicable(f"the client made {len(attempts)} attempt(s) in 8 s: it does not "
                            "reconnect on its own" + _ended(ctx))
    gaps = [round(b - a, 2) for a, b in zip(attempts, attempts[1:], strict=False)]
    return f"{len(attempts)} connections in 8 s, pauses {gaps[:12]}"


def _ended(ctx: Context) -> str:
    if ctx.client is not None and not ctx.client.running:
        return f" (it {ctx.client.described()})"
    return ""
