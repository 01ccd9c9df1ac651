"""WEBSMQ cases for topics and payloads: levels, the characters of a URL path, escapes, the
longest topic the header can announce, and payloads empty, binary, as large as the server takes
and one byte larger (the spec's "Topics", "Topic", "Header" and "Payload")."""

from __future__ import annotations

from wireproto.codecs.websmq import MAX_TOPIC_LENGTH, MessageType, Publish
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level
from wireproto.conformance.websmq.support import (
    DECIDED,
    TOPICS,
    WILDCARDS,
    collect,
    expect,
    header,
    kit,
    nothing,
    publish,
    settle,
    subscribe,
)

QUIET = 0.5


async def _delivered(ctx: Context, topic: str, payload: bytes = b"x",
                     what: str = "the publish", timeout: float | None = None) -> None:
    """A subscriber of `topic` gets a publish on it, topic and payload unchanged."""
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(topic, payload))
    await expect(subscriber, Publish(topic, payload), what, timeout)


# --- Topics ---------------------------------------------------------------------------------


@kit.case("websmq.topic.levels", "A topic of several levels is delivered whole",
          section="Topics")
async def topic_levels(ctx: Context) -> None:
    await _delivered(ctx, ctx.topic("sensors/temps/living_room"))


@kit.case("websmq.topic.characters",
          "A topic made of every character a URL path takes unescaped is delivered whole",
          section="Topics", level=Level.SHOULD, decision=TOPICS)
async def topic_characters(ctx: Context) -> None:
    await _delivered(ctx, ctx.topic("AZaz09-._~/!$&'()*,;=:@/x+y"))


@kit.case("websmq.topic.escapes",
          "A topic with percent escapes (of a space and of UTF-8) is delivered as it was sent",
          section="Topics")
async def topic_escapes(ctx: Context) -> None:
    await _delivered(ctx, ctx.topic("living%20room/caf%C3%A9"))


@kit.case("websmq.topic.empty-levels",
          "Topics with empty levels (a//b, a trailing /) are delivered whole",
          section="Topics", level=Level.SHOULD, decision=DECIDED)
async def topic_empty_levels(ctx: Context) -> None:
    await _delivered(ctx, ctx.topic("a//b"), what="the publish on a//b")
    await _delivered(ctx, ctx.topic("trail/"), what="the publish on trail/")


@kit.case("websmq.topic.exact",
          "Topics match exactly: a subscriber gets nothing published below its topic, nor on a "
          "topic differing only in case", section="Topics", level=Level.SHOULD,
          decision=DECIDED)
async def topic_exact(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("exact")
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(topic + "/below", b"below"))
    publisher.send(publish(ctx.topic("EXACT"), b"upper case"))
    publisher.send(publish(topic, b"exact"))
    await expect(subscriber, Publish(topic, b"exact"), "only the publish on its very topic")


@kit.case("websmq.topic.escape-case",
          "Reports whether %2F and %2f are one topic (wireproto: no, topics match byte for "
          "byte)", section="Topics", level=Level.INFORMATION, decision=DECIDED)
async def topic_escape_case(ctx: Context) -> str:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    upper, lower = ctx.topic("a%2Fb"), ctx.topic("a%2fb")
    subscriber.send(subscribe(upper))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(upper, b"upper"))
    publisher.send(publish(lower, b"lower"))
    await expect(subscriber, Publish(upper, b"upper"), "at least the publish on %2F")
    got = await collect(ctx, subscriber, QUIET)
    return "one topic: yes" if got else "one topic: no"


@kit.case("websmq.topic.length-decides",
          "The header's topic length says where the topic ends: the bytes after it are the "
          "payload, even when they look like more topic", section="Topic")
async def topic_length_decides(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("len")
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    raw = topic.encode()
    publisher.send(header(MessageType.PUBLISH, len(raw)) + raw + b"/more/topic")
    await expect(subscriber, Publish(topic, b"/more/topic"), "the publish, its payload "
                 "starting where the announced topic ends")


def _longest(ctx: Context) -> str:
    start = ctx.topic("longest/")
    return start + "x" * (MAX_TOPIC_LENGTH - len(start))


@kit.case("websmq.topic.longest",
          "A topic of 16383 bytes, the longest the header can announce, is subscribed to and "
          "delivered whole", section="Topics", level=Level.SHOULD, harmful=True)
async def topic_longest(ctx: Context) -> None:
    await _delivered(ctx, _longest(ctx), b"long", "the publish on a topic of 16383 bytes")


@kit.case("websmq.topic.one-over",
          "No topic is longer than 16383 bytes: after a header announcing 16383, a 16384th "
          "topic character is the payload's first byte", section="Header", level=Level.SHOULD,
          harmful=True)
async def topic_one_over(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = _longest(ctx)
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(header(MessageType.PUBLISH, MAX_TOPIC_LENGTH) + topic.encode() + b"y")
    await expect(subscriber, Publish(topic, b"y"), "the publish on the 16383-byte topic")


@kit.case("websmq.topic.wildcard-plus",
          "Reports whether a subscription to a topic with a + level matches other topics "
          "(the spec has no wildcards; wireproto: only with --wildcards)",
          section="Topics", level=Level.INFORMATION, decision=WILDCARDS, harmful=True)
async def topic_wildcard_plus(ctx: Context) -> str:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    subscriber.send(subscribe(ctx.topic("plus/+")))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(ctx.topic("plus/level"), b"matched"))
    got = await collect(ctx, subscriber, QUIET)
    return "a + level matches one level: " + ("yes" if got else "no")


@kit.case("websmq.topic.wildcard-hash",
          "Reports what a server does with a Subscribe to a topic ending in # (not a WEBSMQ "
          "topic character; wireproto: refused, or a wildcard with --wildcards)",
          section="Topics", level=Level.INFORMATION, decision=WILDCARDS, harmful=True)
async def topic_wildcard_hash(ctx: Context) -> str:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    raw = ctx.topic("hash/#").encode()
    subscriber.send(header(MessageType.SUBSCRIBE, len(raw)) + raw)
    try:
        await settle(ctx, subscriber, via=publisher)
    except CaseFailed:
        if subscriber.closed_as is not None:
            return f"refused: {subscriber.closed_as.described}"
        raise
    publisher.send(publish(ctx.topic("hash/below/it"), b"matched"))
    got = await collect(ctx, subscriber, QUIET)
    return "taken; it matches the levels below: " + ("yes" if got else "no")


# --- Payload --------------------------------------------------------------------------------


@kit.case("websmq.body.empty", "A publish with an empty payload is delivered with an empty "
          "payload", section="Payload")
async def body_empty(ctx: Context) -> None:
    await _delivered(ctx, ctx.topic("empty"), b"")


@kit.case("websmq.body.every-byte",
          "A payload of every byte value 0-255 is delivered unchanged", section="Payload")
async def body_every_byte(ctx: Context) -> None:
    await _delivered(ctx, ctx.topic("bytes"), bytes(range(256)) * 4)


@kit.case("websmq.body.looks-like-a-frame",
          "A payload that looks like WEBSMQ frames is delivered as payload, not read as frames",
          section="Payload")
async def body_looks_like_a_frame(ctx: Context) -> None:
    topic = ctx.topic("frames")
    await _delivered(ctx, topic, subscribe(topic) + b"\x00\x00" + publish(topic, b"inner"))


@kit.case("websmq.body.largest",
          "A publish frame as large as the server takes (--max-message-size) is delivered "
          "whole", section="Payload", timeout=8.0, harmful=True)
async def body_largest(ctx: Context) -> None:
    topic = ctx.topic("largest")
    size = ctx.target.max_message_size - 2 - len(topic)
    payload = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    # a large frame may take a while to cross a slow link, and the server's own checks
    await _delivered(ctx, topic, payload, f"the publish of {ctx.target.max_message_size} bytes",
                     timeout=max(ctx.target.receive_timeout, 5.0))


@kit.case("websmq.body.one-over",
          "A publish frame one byte over the server's limit closes that connection alone "
          "(WebSocket 1009, or the stream closed), and is not delivered",
          section="Payload", level=Level.SHOULD, timeout=8.0, harmful=True)
async def body_one_over(ctx: Context) -> str:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("over")
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    size = ctx.target.max_message_size + 1 - 2 - len(topic)
    publisher.send(publish(topic, b"o" * size))
    closed = await publisher.closed(5.0, "the server to close the connection that sent the "
                                         "frame over its limit")
    await nothing(ctx, subscriber, QUIET, "nothing delivered of the frame over the limit")
    publisher2 = await ctx.connect()
    publisher2.send(publish(topic, b"after"))
    await expect(subscriber, Publish(topic, b"after"), "a later publish, on the subscriber's "
                 "connection, still open")
    return closed.described
