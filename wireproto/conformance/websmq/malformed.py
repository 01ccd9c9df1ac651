"""WEBSMQ cases for input a broker must refuse, and for connections that end badly: frames too
short for their header or topic, topics that are not URL-encoded ASCII, text frames, a stream's
length prefix beyond any limit, aborts in the middle of a frame. WEBSMQ has no error message, so
a refusal is the connection closed; every case here is followed by the check that the server
still serves (docs/websmq.md, "What we decided" and "The broker")."""

from __future__ import annotations

from wireproto.codecs.websmq import MessageType, Publish
from wireproto.conformance.context import Context
from wireproto.conformance.model import Level, NotApplicable
from wireproto.conformance.websmq.support import (
    BROKER,
    DECIDED,
    expect,
    header,
    kit,
    nothing,
    publish,
    raw,
    refused,
    settle,
    subscribe,
    will,
)

SHORT = "Header"
TOPIC = "Topics"


def _malformed(id: str, title: str, section: str, frame: bytes | None = None,
               topic: bytes | None = None, message_type: int = 0) -> None:
    """Add a case sending one malformed frame: `frame` as it is, or a frame of `message_type`
    whose topic is the run's prefix followed by `topic`."""
    async def body(ctx: Context) -> str:
        sent = frame
        if sent is None:
            assert topic is not None
            sent = raw(message_type, ctx.topic("").encode() + topic)
        return await refused(ctx, sent, "the malformed frame")

    body.__name__ = body.__qualname__ = id.rsplit(".", 1)[1].replace("-", "_")
    kit.case(id, title, section=section, level=Level.SHOULD, decision=DECIDED,
             harmful=True)(body)


_malformed("websmq.malformed.empty-frame",
           "An empty frame is refused: the connection closes", SHORT, frame=b"")
_malformed("websmq.malformed.one-byte",
           "A frame of one byte, too short for the header, is refused: the connection closes",
           SHORT, frame=b"\x40")
_malformed("websmq.malformed.topic-past-end",
           "A frame whose header announces a longer topic than follows is refused: the "
           "connection closes", SHORT, frame=header(MessageType.PUBLISH, 5) + b"abc")
_malformed("websmq.malformed.longest-past-end",
           "A frame announcing a topic of 16383 bytes followed by 3 is refused: the connection "
           "closes", SHORT, frame=b"\xbf\xff" + b"abc")
_malformed("websmq.malformed.empty-topic",
           "A Subscribe with an empty topic (length 0) is refused: the connection closes",
           TOPIC, frame=header(MessageType.SUBSCRIBE, 0))
_malformed("websmq.malformed.topic-space",
           "A Subscribe to a topic with an unescaped space is refused: the connection closes",
           TOPIC, topic=b"living room", message_type=MessageType.SUBSCRIBE)
_malformed("websmq.malformed.topic-non-ascii",
           "A Publish on a topic with a byte that is not ASCII is refused: the connection "
           "closes", TOPIC, topic=b"caf\xc3\xa9", message_type=MessageType.PUBLISH)
_malformed("websmq.malformed.topic-control",
           "An Unsubscribe from a topic with a control character is refused: the connection "
           "closes", TOPIC, topic=b"a\x00b", message_type=MessageType.UNSUBSCRIBE)
_malformed("websmq.malformed.topic-bad-escape",
           "A Publish on a topic with % not followed by two hex digits is refused: the "
           "connection closes", TOPIC, topic=b"%zz", message_type=MessageType.PUBLISH)
_malformed("websmq.malformed.topic-short-escape",
           "A Subscribe to a topic ending in an escape cut short is refused: the connection "
           "closes", TOPIC, topic=b"cut%4", message_type=MessageType.SUBSCRIBE)
_malformed("websmq.malformed.will-topic",
           "A Last Will on a topic with an unescaped ? is refused: the connection closes",
           TOPIC, topic=b"who?", message_type=MessageType.LAST_WILL)


@kit.case("websmq.malformed.text-frame",
          "A WebSocket text frame is refused: the connection closes (WEBSMQ is binary)",
          section="Protocol", level=Level.SHOULD, decision=DECIDED, harmful=True)
async def malformed_text_frame(ctx: Context) -> str:
    if not ctx.target.over_websocket:
        raise NotApplicable("a stream has no text frames")
    topic = ctx.topic("text")
    return await refused(ctx, publish(topic, b"as text"), "a text frame", binary=False)


@kit.case("websmq.malformed.before-kept",
          "Frames received before a malformed one are handled: a publish sent just before it "
          "is delivered", section="Protocol", level=Level.SHOULD, decision=BROKER,
          harmful=True)
async def malformed_before_kept(ctx: Context) -> None:
    subscriber, sender = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("kept")
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=sender)
    sender.send(publish(topic, b"accepted"))
    sender.send(b"\x40")
    await expect(subscriber, Publish(topic, b"accepted"), "the publish sent before the "
                 "malformed frame")


@kit.case("websmq.malformed.only-that-connection",
          "A malformed frame closes only the connection that sent it: others keep their "
          "subscriptions and wills", section="Protocol", level=Level.SHOULD, decision=BROKER,
          harmful=True)
async def malformed_only_that_connection(ctx: Context) -> None:
    subscriber, publisher, bad = await ctx.connect(), await ctx.connect(), await ctx.connect()
    topic, watched = ctx.topic("others"), ctx.topic("others/will")
    subscriber.send(subscribe(topic))
    subscriber.send(subscribe(watched))
    publisher.send(will(watched, b"later"))
    await settle(ctx, subscriber, publisher, via=publisher)
    bad.send(b"\x00")
    await bad.closed(3.0, "the server to close the connection that sent one byte")
    await nothing(ctx, subscriber, 0.2, "nothing on the other connections")
    for other in (subscriber, publisher):
        if other.closed_as is not None:
            raise ctx.fail(f"connection {other.number}, which sent nothing wrong, was closed "
                           f"too ({other.closed_as.described})")
    publisher.send(publish(topic, b"still here"))
    await expect(subscriber, Publish(topic, b"still here"), "a publish of another connection")


@kit.case("websmq.malformed.stream-length-over",
          "On a framed stream, a length prefix of 4 GiB is refused at once: the connection "
          "closes, nothing is awaited or allocated", section="Protocol", level=Level.SHOULD,
          decision=BROKER, harmful=True)
async def malformed_stream_length_over(ctx: Context) -> str:
    if ctx.target.over_websocket:
        raise NotApplicable("a WebSocket frames messages itself")
    if (ctx.target.framing or "length32") != "length32":
        raise NotApplicable(f"the {ctx.target.framing} framing has no length prefix")
    probe = await ctx.connect()
    probe.send_raw(b"\xff\xff\xff\xff" + b"\x00\x05hello", "a length32 prefix of 4 GiB - 1")
    closed = await probe.closed(3.0, "the server to close the connection")
    return closed.described


# --- Closing --------------------------------------------------------------------------------


@kit.case("websmq.close.clean",
          "A close from the client ends the connection cleanly", section="Protocol",
          level=Level.SHOULD)
async def close_clean(ctx: Context) -> str:
    probe = await ctx.connect()
    probe.send(subscribe(ctx.topic("clean")))
    await settle(ctx, probe)
    probe.close()
    closed = await probe.closed(3.0, "the connection to end after the kit's close")
    if ctx.target.over_websocket and not closed.clean:
        raise ctx.fail(f"the WebSocket closing handshake was not completed: "
                       f"{closed.described}")
    return closed.described


@kit.case("websmq.close.abort-mid-frame",
          "A connection aborted in the middle of a frame harms nothing: the server serves on",
          section="Protocol", harmful=True)
async def close_abort_mid_frame(ctx: Context) -> None:
    probe = await ctx.connect()
    probe.send(subscribe(ctx.topic("mid")))
    if ctx.target.over_websocket:
        # a masked binary frame announcing 100 bytes, of which 3 come
        probe.send_raw(b"\x82\xe4\x01\x02\x03\x04abc", "half a WebSocket frame")
    else:
        probe.send_raw(b"\x00\x00\x00\x64\x00\x05hel", "half a length32 frame")
    await ctx.sleep(0.1)
    probe.abort()


@kit.case("websmq.close.subscriber-gone",
          "Publishing to a topic whose subscriber has just gone harms nothing: the publisher "
          "and the other subscribers carry on", section="Subscribe to a topic", harmful=True)
async def close_subscriber_gone(ctx: Context) -> None:
    gone, staying, publisher = await ctx.connect(), await ctx.connect(), await ctx.connect()
    topic = ctx.topic("gone")
    gone.send(subscribe(topic))
    staying.send(subscribe(topic))
    await settle(ctx, gone, staying, via=publisher)
    gone.abort()
    for number in range(20):
        publisher.send(publish(topic, b"%d" % number))
    for number in range(20):
        await expect(staying, Publish(topic, b"%d" % number), f"publish number {number}")
    if not publisher.is_open:
        raise ctx.fail(f"the publisher's connection closed: {publisher.closed_as}")
