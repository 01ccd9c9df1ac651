"""The WEBSMQ conformance kit (docs/conformance.md): cases for a WEBSMQ broker over WebSocket
or a framed stream, judged by wireproto's codec against the spec and docs/websmq.md.

The cases run in the order of the modules below: well-formed messages (publish, subscribe, the
types a broker sends, last wills), topics and payloads, then malformed input and closes."""

from __future__ import annotations

from importlib import import_module

from wireproto.codecs.websmq import Publish
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed
from wireproto.conformance.websmq.support import (
    described,
    kit,
    next_message,
    publish,
    subscribe,
)

__all__ = ["kit"]

ALIVE_WITHIN = 5.0  # seconds the liveness check publishes for, every 0.25 s

for _cases in ("messages", "limits", "malformed"):  # the catalogue's order
    import_module(f"{__name__}.{_cases}")


@kit.liveness
async def alive(ctx: Context) -> None:
    """One connection subscribes, another publishes until the publish arrives."""
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("alive")
    subscriber.send(subscribe(topic))
    deadline = ctx.reactor.seconds() + ALIVE_WITHIN
    while True:
        publisher.send(publish(topic, b"alive"))
        try:
            got = await next_message(subscriber, "a publish on a subscribed topic", 0.25)
        except CaseFailed as failed:
            if subscriber.closed_as is not None:
                raise
            if ctx.reactor.seconds() > deadline:
                raise CaseFailed(f"a publish on a subscribed topic did not arrive within "
                                 f"{ALIVE_WITHIN:g} s of publishing it every 0.25 s (the last "
                                 f"try: {failed})") from None
            continue
        if got != Publish(topic, b"alive"):
            raise CaseFailed(f"a publish on a subscribed topic came back as {described(got)}")
        return
