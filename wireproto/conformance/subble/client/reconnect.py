"""The SubbleSocket client kit's cases on closes and reconnection: each WebSocket close code
and an abrupt end, a server that vanishes and comes back, a server that refuses every
connection for a while (the pauses between attempts), and what a reconnecting client says in
its new handshake. A client that does not reconnect on its own is information, not a failure:
--run, or its user, starts it again."""

from __future__ import annotations

import secrets

from wireproto.codecs.subble import HandshakeRequest
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level, NotApplicable
from wireproto.conformance.subble.client.common import (
    DECIDED_HOST,
    Session,
    allowed,
    echo,
    greet,
    kit,
    read_handshake,
    welcome,
)
from wireproto.transports.websocket import WebSocketServerAdapter

RECONNECT = "Handshake"  # the spec says nothing of reconnecting: the handshake is what it redoes
# How long a case waits for the client to come back after the kit closed its connection.
COME_BACK = 6.0
# How long the backoff case refuses every connection, and how much longer than the first pause
# the last must be to count as growing.
REFUSED_FOR = 11.0
GROWTH = 1.2


async def returned(ctx: Context, wait: float) -> tuple[Session, float] | None:
    """The client's next connection, handshaken, and how long after now it came; None when it
    did not come back within `wait` seconds."""
    started = ctx.reactor.seconds()
    try:
        probe = await ctx.accept(wait, "the client to reconnect")
    except CaseFailed:
        return None
    took = ctx.reactor.seconds() - started
    return await greet(ctx, probe=probe), took


async def crashed(ctx: Context, what: str) -> None:
    """CaseFailed when the client's process (with --run) ended with an error after `what`."""
    client = ctx.client
    if client is not None and await client.ended(0.5) and client.status:
        raise CaseFailed(f"the client {client.described()} after {what}")


def close_with(session: Session, code: int | None) -> None:
    """Close the client's connection: with a WebSocket close `code`, or (None) by aborting."""
    transport = session.probe.transport
    if code is None:
        session.probe.abort()
    elif isinstance(transport, WebSocketServerAdapter) and code != 1000:
        session.probe.recorder.add(session.probe.number, "event",
                                   text=f"the kit closes with code {code}")
        transport.sendCloseFrame(code=code, reasonUtf8=f"conformance close {code}".encode())
    else:
        session.probe.close()


def _close_case(code: int | None, meaning: str) -> None:
    key = "abort" if code is None else str(code)

    @kit.case(f"subble.client.close.{key}",
              f"The client survives {meaning}; whether it reconnects", section=RECONNECT,
              timeout=12.0)
    async def closed(ctx: Context) -> str:
        if code not in (None, 1000) and not ctx.target.over_websocket:
            raise NotApplicable("a framed stream has no close codes")
        session = await greet(ctx)
        await echo(session, "before the close")
        close_with(session, code)
        wait = allowed(ctx, COME_BACK, 4.0)
        back = await returned(ctx, wait)
        if back is None:
            await crashed(ctx, meaning)
            return f"it did not reconnect within {wait:g} s"
        await echo(back[0], "after the close")
        return f"it reconnected after {back[1]:.1f} s and works"


for _code, _meaning in ((1000, "a normal close (1000, or a stream's end)"),
                        (1001, "a close going away (1001)"),
                        (1011, "a close for a server error (1011)"),
                        (4000, "a close with an application's code (4000)"),
                        (None, "an abrupt end of the connection")):
    _close_case(_code, _meaning)


@kit.case("subble.client.reconnect.same-client",
          "A client that reconnects handshakes again with the client ID the server gave it and "
          "the same subscribe and produce lists", section="Client ID", level=Level.SHOULD,
          decision=DECIDED_HOST, timeout=12.0)
async def same_client(ctx: Context) -> str:
    session = await greet(ctx)
    await echo(session, "before")
    session.probe.close()
    wait = allowed(ctx, COME_BACK, 4.0)
    try:
        probe = await ctx.accept(wait, "the client to reconnect")
    except CaseFailed:
        raise NotApplicable(f"the client did not reconnect within {wait:g} s") from None
    request = await read_handshake(probe)
    welcome(probe, request)
    first = session.request
    wrong = []
    if request.client_id != session.client_id:
        wrong.append(f"the client ID {request.client_id!r}, not {session.client_id!r}")
    if set(request.subscribe) != set(first.subscribe):
        wrong.append(f"the subscribe list {list(request.subscribe)}, not "
                     f"{list(first.subscribe)}")
    if set(request.produce) != set(first.produce):
        wrong.append(f"the produce list {list(request.produce)}, not {list(first.produce)}")
    if wrong:
        raise ctx.fail("the new handshake has " + "; ".join(wrong))
    return f"client ID {request.client_id!r}"


def _lists(request: HandshakeRequest) -> str:
    return f"{list(request.subscribe)} / {list(request.produce)}"


@kit.case("subble.client.reconnect.server-back",
          "A client that reconnects comes back when a server that vanished for 3 s listens "
          "again", section=RECONNECT, level=Level.SHOULD, timeout=20.0)
async def server_back(ctx: Context) -> str:
    session = await greet(ctx)
    await echo(session, "before")
    listener = ctx.listener
    assert listener is not None
    await listener.pause()
    try:
        session.probe.abort()
        await ctx.sleep(3.0)
    finally:
        await listener.resume()
    wait = allowed(ctx, 10.0, 6.0)
    back = await returned(ctx, wait)
    if back is None:
        await crashed(ctx, "the server vanishing")
        raise ctx.fail(f"the client did not come back within {wait:g} s of the server's return (a "
                       "client that never reconnects fails this too: see "
                       "subble.client.close.1000)")
    await echo(back[0], "after")
    return f"it came back {back[1]:.1f} s after the server did"


@kit.case("subble.client.reconnect.backoff",
          f"While every connection is refused for {REFUSED_FOR:g} s, the client's pauses between "
          "attempts grow (no tight loop)", section=RECONNECT, level=Level.SHOULD, timeout=20.0)
async def backoff(ctx: Context) -> str:
    session = await greet(ctx)
    await echo(session, secrets.token_hex(2))
    listener = ctx.listener
    assert listener is not None
    start = len(listener.attempts)
    refused_for = allowed(ctx, REFUSED_FOR, 3.0)
    listener.refusing = True
    try:
        session.probe.abort()
        began = ctx.reactor.seconds()
        await ctx.sleep(refused_for)
    finally:
        listener.refusing = False
    attempts = [at - began for at in listener.attempts[start:] if at >= began]
    if not attempts:
        raise NotApplicable(f"the client did not try to reconnect within {refused_for:g} s")
    gaps = [later - earlier for earlier, later in zip(attempts, attempts[1:], strict=False)]
    seen = (f"{len(attempts)} attempts in {refused_for:g} s, the first after "
            f"{attempts[0]:.2f} s; pauses "
            + ", ".join(f"{gap:.2f}" for gap in gaps[:12]) + (" ..." if len(gaps) > 12 else ""))
    if len(attempts) > 40:
        raise ctx.fail(f"a tight loop: {seen}")
    # Jitter makes neighbouring pauses uneven: the trend is judged, the last against the first.
    if len(gaps) >= 4 and gaps[-1] <= GROWTH * gaps[0]:
        raise ctx.fail(f"the pauses do not grow: {seen}")
    return seen
