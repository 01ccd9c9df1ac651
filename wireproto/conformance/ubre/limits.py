"""The UBRE kit's cases about limits (the largest body, one over; the longest topic, one over),
topic encodings, and connections lost abruptly."""

from __future__ import annotations

import struct

from wireproto.codecs.ubre import Publish, Request, Subscribe
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level
from wireproto.conformance.probe import Probe
from wireproto.conformance.ubre.common import (
    BINARY_FORMAT,
    BROKER,
    DECIDED,
    JSON_FORMAT,
    expect_publish,
    json_bytes,
    kit,
    next_message,
    quiet,
    refused,
    send,
    show,
    still_serves,
    subscriber,
    sync,
)

PUBSUB = "JSON Message Format: pub / sub"
MAX_NAME = 0xFFFF


def _json_publish_of_size(topic: str, size: int) -> bytes:
    head = b'{"publish":' + json_bytes(topic) + b',"body":"'
    return head + b"x" * _json_body_length(topic, size) + b'"}'


def _json_body_length(topic: str, size: int) -> int:
    return size - len(b'{"publish":' + json_bytes(topic) + b',"body":"') - 2


def _binary_publish_of_size(topic: str, size: int) -> bytes:
    name = topic.encode()
    body_length = size - 7 - len(name)
    return struct.pack(">BHI", 0x50, len(name), body_length) + name + b"\xa5" * body_length


async def _largest(ctx: Context, binary: bool) -> str:
    topic = ctx.topic("largest")
    size = ctx.target.max_message_size
    data = (_binary_publish_of_size if binary else _json_publish_of_size)(topic, size)
    listener = await subscriber(ctx, topic, binary)
    publisher = await ctx.connect()
    publisher.send(data, binary=binary)
    got = await expect_publish(listener, topic, timeout=6.0)
    body_length = size - 7 - len(topic.encode()) if binary else _json_body_length(topic, size)
    whole = (b"\xa5" if binary else "x") * body_length
    if got.body != whole:
        length = len(got.body) if isinstance(got.body, (bytes, str)) else None
        raise ctx.fail(f"the body of {body_length} bytes came as {length} bytes, or changed")
    return ""


async def _one_over(ctx: Context, binary: bool) -> str:
    topic = ctx.topic("one-over")
    size = ctx.target.max_message_size + 1
    data = (_binary_publish_of_size if binary else _json_publish_of_size)(topic, size)
    listener = await subscriber(ctx, topic, binary)
    publisher = await ctx.connect()
    publisher.send(data, binary=binary)
    closed = await publisher.closed(6.0, f"the server to close the connection that sent "
                                         f"{size} bytes")
    await quiet(listener, 0.3, "nothing from the message over the limit")
    if not listener.is_open:
        raise ctx.fail("the server also closed another connection")
    await still_serves(ctx, listener, "another connection's message over the limit")
    return closed.described


@kit.case("ubre.body.largest-json", "A JSON publish as large as the server's message limit is "
          "delivered whole", section=JSON_FORMAT, timeout=9.0)
async def largest_json(ctx: Context) -> str:
    return await _largest(ctx, binary=False)


@kit.case("ubre.body.one-over-json", "A JSON message one byte over the server's message limit "
          "closes that connection alone (1009 on WebSocket), and nothing of it is delivered",
          section=JSON_FORMAT, level=Level.SHOULD, timeout=9.0, harmful=True)
async def one_over_json(ctx: Context) -> str:
    return await _one_over(ctx, binary=False)


@kit.case("ubre.body.largest-binary", "A binary publish as large as the server's message limit "
          "is delivered whole", section=BINARY_FORMAT, timeout=9.0)
async def largest_binary(ctx: Context) -> str:
    return await _largest(ctx, binary=True)


@kit.case("ubre.body.one-over-binary", "A binary message one byte over the server's message "
          "limit closes that connection alone, and nothing of it is delivered",
          section=BINARY_FORMAT, level=Level.SHOULD, timeout=9.0, harmful=True)
async def one_over_binary(ctx: Context) -> str:
    return await _one_over(ctx, binary=True)


@kit.case("ubre.topic.spaces-and-slashes", "A topic with spaces, slashes and punctuation (the "
          "spec's own \"some topic\") is delivered as it is", section=PUBSUB)
async def topic_spaces(ctx: Context) -> None:
    topic = ctx.topic("some topic/with.dots, commas;=&?")
    listener = await subscriber(ctx, topic)
    publisher = await ctx.connect()
    send(publisher, Publish(topic, 1))
    await expect_publish(listener, topic)


@kit.case("ubre.topic.unicode-json", "A non-ASCII topic is delivered as it is in JSON",
          section=PUBSUB)
async def topic_unicode_json(ctx: Context) -> None:
    topic = ctx.topic("zé/中文/\U0001f600")
    listener = await subscriber(ctx, topic)
    publisher = await ctx.connect()
    send(publisher, Publish(topic, 1))
    await expect_publish(listener, topic)


@kit.case("ubre.topic.unicode-binary", "A non-ASCII topic is delivered as its UTF-8 bytes in "
          "binary", section=BINARY_FORMAT)
async def topic_unicode_binary(ctx: Context) -> None:
    topic = ctx.topic("zé/中文/\U0001f600")
    listener = await subscriber(ctx, topic, binary=True)
    publisher = await ctx.connect()
    send(publisher, Publish(topic, b"1"), binary=True)
    await expect_publish(listener, topic)


def _longest_topic(ctx: Context) -> str:
    head = ctx.topic("longest-")
    return head + "t" * (MAX_NAME - len(head.encode()))


@kit.case("ubre.topic.longest-binary", "A topic of 65535 bytes (the most the binary name length "
          "holds) is subscribed to and delivered whole", section=BINARY_FORMAT,
          level=Level.SHOULD, harmful=True)
async def topic_longest(ctx: Context) -> None:
    topic = _longest_topic(ctx)
    listener = await subscriber(ctx, topic, binary=True)
    publisher = await ctx.connect()
    send(publisher, Publish(topic, b"long"), binary=True)
    try:
        await expect_publish(listener, topic)
    except CaseFailed as failed:
        closed = listener.closed_as or publisher.closed_as
        if closed is not None:
            raise ctx.fail(f"the server closed the connection ({closed.text})") from None
        raise failed


@kit.case("ubre.topic.one-over-binary", "A binary message whose name is one byte longer than "
          "the name length says (65535, with 65536 bytes before no body) is refused, not "
          "delivered", section=BINARY_FORMAT, level=Level.SHOULD, decision=DECIDED,
          harmful=True)
async def topic_one_over(ctx: Context) -> str:
    topic = _longest_topic(ctx)
    watcher = await subscriber(ctx, topic, binary=True)
    probe = await ctx.connect()
    probe.send(struct.pack(">BHI", 0x50, MAX_NAME, 0) + topic.encode() + b"t")
    return await refused(ctx, probe, watcher if watcher.is_open else None, topic)


@kit.case("ubre.topic.longer-json", "What the server does with a JSON topic of 65536 bytes, "
          "longer than the binary format can name", section=JSON_FORMAT,
          level=Level.INFORMATION, harmful=True)
async def topic_longer_json(ctx: Context) -> str:
    head = ctx.topic("longer-")
    topic = head + "t" * (MAX_NAME + 1 - len(head.encode()))
    listener = await ctx.connect()
    send(listener, Subscribe(topic))
    answered = await sync(ctx, listener)
    if listener.closed_as is not None:
        return f"refused: the server closed the connection ({listener.closed_as.text})"
    publisher = await ctx.connect()
    send(publisher, Publish(topic, 1))
    try:
        await expect_publish(listener, topic)
    except CaseFailed as failed:
        return f"not delivered ({failed}); the subscribe was {'' if answered else 'not '}" \
               "followed by an answer"
    return "delivered"


@kit.case("ubre.topic.wildcard-characters", "What the server does with topics holding + and "
          "# (UBRE has no wildcards; some brokers do)", section=PUBSUB,
          level=Level.INFORMATION, decision=BROKER, harmful=True)
async def topic_wildcards(ctx: Context) -> str:
    pattern = ctx.topic("+")
    listener = await subscriber(ctx, pattern)
    publisher = await ctx.connect()
    send(publisher, Publish(ctx.topic("x"), 1))
    send(publisher, Publish(pattern, 2))
    seen = []
    for _ in range(2):
        try:
            message = await next_message(listener, "a publish", 0.6)
        except CaseFailed:
            break
        seen.append(show(getattr(message, "topic", message)))
    closed = [f"connection {probe.number} closed" for probe in (listener, publisher)
              if probe.closed_as is not None]
    return f"a subscriber of {show(pattern)} got {seen or 'nothing'}" + \
        (f"; {', '.join(closed)}" if closed else "")


@kit.case("ubre.topic.empty", "What the server does with the empty topic \"\" (the spec leaves "
          "topics to the user)", section=PUBSUB, level=Level.INFORMATION, harmful=True)
async def topic_empty(ctx: Context) -> str:
    listener = await subscriber(ctx, "")
    if listener.closed_as is not None:
        return "refused: the subscribe closed the connection"
    publisher = await ctx.connect()
    send(publisher, Publish("", ctx.topic("empty")))
    try:
        while True:
            message = await expect_publish(listener, "", timeout=1.0)
            if message.body == ctx.topic("empty"):
                return "delivered"
    except CaseFailed as failed:
        return f"not delivered: {failed}"


@kit.case("ubre.close.subscriber-aborts", "A subscriber whose connection is lost abruptly harms "
          "nothing: the others on its topic still get publishes", section=PUBSUB, harmful=True)
async def subscriber_aborts(ctx: Context) -> None:
    topic = ctx.topic("aborted")
    lost, kept = await subscriber(ctx, topic), await subscriber(ctx, topic)
    lost.abort()
    publisher = await ctx.connect()
    for number in range(3):
        send(publisher, Publish(topic, number))
    for _ in range(3):
        await expect_publish(kept, topic)
    await still_serves(ctx, publisher, "a subscriber's connection was lost")


@kit.case("ubre.close.mid-message", "A connection lost in the middle of a message harms "
          "nothing", section=BINARY_FORMAT, harmful=True)
async def mid_message(ctx: Context) -> str:
    probe = await ctx.connect()
    await sync(ctx, probe)
    if ctx.target.over_websocket:
        probe.send_raw(b"\x82\xfe\x01\x00\x00\x00\x00\x00P\x00", "half a masked binary frame")
    else:
        probe.send_raw(b"\x00\x00\x01\x00P\x00\x04\x00", "half a length32 frame")
    await ctx.sleep(0.1)
    probe.abort()
    return ""


@kit.case("ubre.close.requests-pending", "A connection lost with requests still unanswered "
          "harms nothing", section="JSON Message Format: req / res", harmful=True)
async def requests_pending(ctx: Context) -> None:
    probe: Probe = await ctx.connect()
    for number in range(50):
        send(probe, Request(number, name="conformance.no-such-request"))
    probe.abort()
