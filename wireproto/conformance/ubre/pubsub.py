"""The UBRE kit's publish, subscribe and unsubscribe cases, in both formats."""

from __future__ import annotations

from wireproto.codecs.ubre import NO_BODY, Publish, Subscribe, Unsubscribe
from wireproto.conformance.context import Context
from wireproto.conformance.model import Level
from wireproto.conformance.ubre.common import (
    BINARY_FORMAT,
    BROKER,
    DECIDED,
    FORMATS,
    JSON_FORMAT,
    decoded,
    expect_publish,
    json_bytes,
    kit,
    next_message,
    quiet,
    send,
    send_json,
    show,
    still_serves,
    subscriber,
    sync,
)

PUBSUB = "JSON Message Format: pub / sub"


async def _delivered(ctx: Context, sent: Publish, binary: bool = False,
                     subscribe_binary: bool | None = None) -> Publish:
    topic = sent.topic
    listener = await subscriber(ctx, topic, binary if subscribe_binary is None
                                else subscribe_binary)
    publisher = await ctx.connect()
    send(publisher, sent, binary)
    return await expect_publish(listener, topic)


@kit.case("ubre.publish.json", "A JSON publish with a body reaches a JSON subscriber on another "
          "connection with the same topic and body", section=PUBSUB)
async def publish_json(ctx: Context) -> None:
    sent = Publish(ctx.topic("json"), {"c": 21.5, "tags": ["a", "b"]})
    got = await _delivered(ctx, sent)
    if got.body != sent.body:
        raise ctx.fail(f"the body came as {show(got.body)}, not {show(sent.body)}")


@kit.case("ubre.publish.json-no-body", "A JSON publish without a body is delivered without one "
          "(no \"body\" key, not a null body)", section=PUBSUB, level=Level.SHOULD,
          decision=DECIDED)
async def publish_json_no_body(ctx: Context) -> None:
    got = await _delivered(ctx, Publish(ctx.topic("no-body")))
    if got.body is not NO_BODY:
        raise ctx.fail(f"the publish came with the body {show(got.body)}")


@kit.case("ubre.publish.json-null-body", "A JSON publish with a null body is delivered with a "
          "null body", section=PUBSUB, level=Level.SHOULD, decision=DECIDED)
async def publish_json_null_body(ctx: Context) -> None:
    got = await _delivered(ctx, Publish(ctx.topic("null-body"), None))
    if got.body is not None:
        raise ctx.fail(f"the publish came with the body {show(got.body)}, not null")


@kit.case("ubre.publish.json-body-values", "JSON bodies of every kind (string, empty string, "
          "number, true, false, array, object, non-ASCII text) are delivered equal, in order",
          section=PUBSUB)
async def publish_json_values(ctx: Context) -> None:
    topic = ctx.topic("values")
    values = ["text", "", 0, -7, 3.25, True, False, [], {}, [1, [2, {"x": None}]],
              {"k": "v"}, "zé 中 \U0001f600"]
    listener = await subscriber(ctx, topic)
    publisher = await ctx.connect()
    for value in values:
        send(publisher, Publish(topic, value))
    for value in values:
        got = await expect_publish(listener, topic)
        if got.body != value or type(got.body) is not type(value):
            raise ctx.fail(f"expected the body {show(value)}, got {show(got.body)}")


@kit.case("ubre.publish.binary", "A binary publish with a body reaches a binary subscriber with "
          "the same topic and body bytes", section=BINARY_FORMAT)
async def publish_binary(ctx: Context) -> None:
    sent = Publish(ctx.topic("binary"), bytes(range(256)))
    got = await _delivered(ctx, sent, binary=True)
    if got.body != sent.body:
        raise ctx.fail(f"the body came as {show(got.body)}")


@kit.case("ubre.publish.binary-no-body", "A binary publish with body length 0 is delivered "
          "without a body", section=BINARY_FORMAT)
async def publish_binary_no_body(ctx: Context) -> None:
    got = await _delivered(ctx, Publish(ctx.topic("binary-no-body")), binary=True)
    if got.body is not NO_BODY and got.body != b"":
        raise ctx.fail(f"the publish came with the body {show(got.body)}")


@kit.case("ubre.publish.binary-streaming", "A binary publish with body length 0xFFFFFFFF "
          "(streaming) is delivered with the body that ran to the end of the message",
          section=BINARY_FORMAT)
async def publish_binary_streaming(ctx: Context) -> None:
    sent = Publish(ctx.topic("streaming"), b"streamed \x00\xff body", streaming=True)
    got = await _delivered(ctx, sent, binary=True)
    if got.body != sent.body:
        raise ctx.fail(f"the body came as {show(got.body)}, not {show(sent.body)}")


@kit.case("ubre.publish.binary-streaming-empty", "A streaming binary publish whose body is "
          "empty is delivered, with an empty body or none", section=BINARY_FORMAT)
async def publish_binary_streaming_empty(ctx: Context) -> None:
    got = await _delivered(ctx, Publish(ctx.topic("streaming-empty"), b"", streaming=True),
                           binary=True)
    if got.body not in (b"", NO_BODY):
        raise ctx.fail(f"the body came as {show(got.body)}")


@kit.case("ubre.publish.fan-out", "A publish reaches every subscriber of its topic, once each",
          section=PUBSUB)
async def publish_fan_out(ctx: Context) -> None:
    topic = ctx.topic("fan-out")
    listeners = [await subscriber(ctx, topic) for _ in range(3)]
    publisher = await ctx.connect()
    send(publisher, Publish(topic, 1))
    for listener in listeners:
        await expect_publish(listener, topic)
    for listener in listeners:
        await quiet(listener, 0.3, "one publish only")


@kit.case("ubre.publish.order", "Publishes from one connection reach a subscriber in the order "
          "they were sent", section=PUBSUB, level=Level.SHOULD)
async def publish_order(ctx: Context) -> None:
    topic = ctx.topic("order")
    listener = await subscriber(ctx, topic)
    publisher = await ctx.connect()
    for number in range(50):
        send(publisher, Publish(topic, number))
    for number in range(50):
        got = await expect_publish(listener, topic)
        if got.body != number:
            raise ctx.fail(f"publish {number} came as {show(got.body)}: out of order or lost")


@kit.case("ubre.publish.no-subscriber", "A publish on a topic nobody subscribes to is taken "
          "quietly: the connection stays and answers the next request", section=PUBSUB)
async def publish_no_subscriber(ctx: Context) -> None:
    publisher = await ctx.connect()
    send(publisher, Publish(ctx.topic("nobody"), "x"))
    await still_serves(ctx, publisher, "the publish")


@kit.case("ubre.publish.sender-excluded", "Whether a publish reaches its own publisher when it "
          "subscribes to the topic", section=PUBSUB, level=Level.INFORMATION, decision=BROKER)
async def publish_to_sender(ctx: Context) -> str:
    topic = ctx.topic("own")
    probe = await subscriber(ctx, topic)
    send(probe, Publish(topic, "own"))
    try:
        await quiet(probe, 0.5, "its own publish")
    except Exception:  # noqa: BLE001 - it came back: that is the information
        return "the publisher gets its own publish: yes"
    return "the publisher gets its own publish: no"


@kit.case("ubre.publish.exact-topic", "Whether topics match exactly: a publish on T/x does not "
          "reach a subscriber of T", section=PUBSUB, level=Level.INFORMATION, decision=BROKER)
async def publish_exact(ctx: Context) -> str:
    topic = ctx.topic("exact")
    listener = await subscriber(ctx, topic)
    publisher = await ctx.connect()
    send(publisher, Publish(topic + "/x", 1))
    send(publisher, Publish(topic + "x", 2))
    try:
        await quiet(listener, 0.5, "nothing")
    except Exception:  # noqa: BLE001
        return "topics match exactly: no, a longer topic reached the subscriber"
    return "topics match exactly: yes"


@kit.case("ubre.publish.json-to-binary", "What a binary subscriber gets for a JSON publish",
          section=BINARY_FORMAT, level=Level.INFORMATION, decision=FORMATS)
async def publish_json_to_binary(ctx: Context) -> str:
    got = await _delivered(ctx, Publish(ctx.topic("j2b"), {"c": 1}), subscribe_binary=True)
    return f"the JSON body {{\"c\":1}} came as {show(got.body)}"


@kit.case("ubre.publish.binary-to-json", "What a JSON subscriber gets for a binary publish "
          "whose body is JSON text", section=BINARY_FORMAT, level=Level.INFORMATION,
          decision=FORMATS)
async def publish_binary_to_json(ctx: Context) -> str:
    got = await _delivered(ctx, Publish(ctx.topic("b2j"), b'{"c":1}'), binary=True,
                           subscribe_binary=False)
    return f"the binary body b'{{\"c\":1}}' came as {show(got.body)}"


@kit.case("ubre.publish.text-frames", "On WebSocket, JSON messages come in text frames (ubre.js "
          "reads only text frames)", section=JSON_FORMAT, level=Level.SHOULD, decision=FORMATS)
async def json_in_text_frames(ctx: Context) -> str | None:
    topic = ctx.topic("text")
    listener = await subscriber(ctx, topic)
    publisher = await ctx.connect()
    send(publisher, Publish(topic, "t"))
    while True:
        received = await listener.receive(what="the publish")
        message = decoded(received)
        if isinstance(message, Publish):
            break
    if not ctx.target.over_websocket:
        return "not a WebSocket: frames have no type"
    if received.binary:
        raise ctx.fail("the JSON publish came in a binary frame")
    return None


@kit.case("ubre.subscribe.twice", "Subscribing twice to a topic is one subscription: one "
          "delivery per publish", section=PUBSUB, level=Level.SHOULD, decision=BROKER)
async def subscribe_twice(ctx: Context) -> None:
    topic = ctx.topic("twice")
    listener = await ctx.connect()
    send(listener, Subscribe(topic))
    send(listener, Subscribe(topic))
    await sync(ctx, listener)
    publisher = await ctx.connect()
    send(publisher, Publish(topic, 1))
    await expect_publish(listener, topic)
    await quiet(listener, 0.4, "one delivery only")


@kit.case("ubre.subscribe.with-body", "A subscribe with a body (as ubre.js sends) is a "
          "subscription like any", section=PUBSUB, level=Level.SHOULD, decision=DECIDED)
async def subscribe_with_body(ctx: Context) -> None:
    topic = ctx.topic("sub-body")
    listener = await subscriber(ctx, topic, body={"since": 5})
    publisher = await ctx.connect()
    send(publisher, Publish(topic, 2))
    await expect_publish(listener, topic)


@kit.case("ubre.subscribe.binary-json-mixed", "Subscribers in both formats get the same "
          "publish, each in a form its format can read", section=BINARY_FORMAT,
          level=Level.SHOULD, decision=FORMATS)
async def subscribe_mixed(ctx: Context) -> None:
    topic = ctx.topic("mixed")
    text, binary = await subscriber(ctx, topic), await subscriber(ctx, topic, binary=True)
    publisher = await ctx.connect()
    send(publisher, Publish(topic, b"plain"), binary=True)
    for listener in (text, binary):
        got = await expect_publish(listener, topic)
        if got.body not in (b"plain", "plain"):
            raise ctx.fail(f"connection {listener.number} got the body {show(got.body)}")


@kit.case("ubre.subscribe.announced", "Whether the server tells a connection which topics have "
          "subscribers, with subscribe messages, as a ubre.js peer does", section=PUBSUB,
          level=Level.INFORMATION, decision=BROKER)
async def subscribe_announced(ctx: Context) -> str:
    topic = ctx.topic("announced")
    watcher = await ctx.connect()
    await sync(ctx, watcher)
    await subscriber(ctx, topic)
    deadline = ctx.reactor.seconds() + 1.0
    while ctx.reactor.seconds() < deadline:
        try:
            message = await next_message(watcher, "an announcement", 1.0, announcements=True)
        except Exception:  # noqa: BLE001
            break
        if isinstance(message, Subscribe) and message.topic == topic:
            return "announces topics others subscribe to: yes"
    return "announces topics others subscribe to: no"


@kit.case("ubre.unsubscribe.json", "After a JSON unsubscribe, publishes on the topic no longer "
          "arrive", section=PUBSUB)
async def unsubscribe_json(ctx: Context) -> None:
    topic = ctx.topic("unsub")
    listener = await subscriber(ctx, topic)
    send(listener, Unsubscribe(topic))
    await sync(ctx, listener)
    publisher = await ctx.connect()
    send(publisher, Publish(topic, 1))
    await sync(ctx, publisher)
    await quiet(listener, 0.5, "no publish after the unsubscribe")


@kit.case("ubre.unsubscribe.with-body", "An unsubscribe with a body (ubre.js repeats the "
          "subscribe's) ends the subscription", section=PUBSUB, level=Level.SHOULD,
          decision=DECIDED)
async def unsubscribe_with_body(ctx: Context) -> None:
    topic = ctx.topic("unsub-body")
    listener = await subscriber(ctx, topic, body={"since": 5})
    send(listener, Unsubscribe(topic, {"since": 5}))
    await sync(ctx, listener)
    publisher = await ctx.connect()
    send(publisher, Publish(topic, 1))
    await sync(ctx, publisher)
    await quiet(listener, 0.5, "no publish after the unsubscribe")


@kit.case("ubre.unsubscribe.binary", "Whether a binary unsubscribe (type U 0x55, an extension "
          "the spec's table lacks) ends a subscription", section=BINARY_FORMAT,
          level=Level.INFORMATION, decision=DECIDED, harmful=True)
async def unsubscribe_binary(ctx: Context) -> str:
    topic = ctx.topic("unsub-binary")
    listener = await subscriber(ctx, topic, binary=True)
    send(listener, Unsubscribe(topic), binary=True)
    await sync(ctx, listener, binary=True)
    if not listener.is_open:
        return "binary unsubscribe understood: no, the server closed the connection"
    publisher = await ctx.connect()
    send(publisher, Publish(topic, b"1"), binary=True)
    await sync(ctx, publisher)
    try:
        await quiet(listener, 0.5, "nothing")
    except Exception:  # noqa: BLE001
        return "binary unsubscribe understood: no, publishes still arrive"
    return "binary unsubscribe understood: yes"


@kit.case("ubre.unsubscribe.not-subscribed", "Unsubscribing from a topic never subscribed to "
          "does no harm: the connection stays and answers", section=PUBSUB, harmful=True)
async def unsubscribe_unknown(ctx: Context) -> None:
    probe = await ctx.connect()
    send(probe, Unsubscribe(ctx.topic("never")))
    await still_serves(ctx, probe, "the unsubscribe")


@kit.case("ubre.format.json-whitespace", "JSON with whitespace between its tokens (not compact) "
          "is read like compact JSON", section=JSON_FORMAT)
async def json_whitespace(ctx: Context) -> None:
    topic = ctx.topic("spaced")
    listener = await subscriber(ctx, topic)
    publisher = await ctx.connect()
    publisher.send(b' {\n  "publish" : ' + json_bytes(topic) + b' ,\t"body" : [ 1 , 2 ]\r\n}',
                   binary=False)
    got = await expect_publish(listener, topic)
    if got.body != [1, 2]:
        raise ctx.fail(f"the body came as {show(got.body)}")


@kit.case("ubre.format.unknown-keys", "A JSON message with keys UBRE does not define is read, "
          "those keys ignored", section=JSON_FORMAT, level=Level.SHOULD, decision=DECIDED)
async def json_unknown_keys(ctx: Context) -> None:
    topic = ctx.topic("extra")
    listener = await subscriber(ctx, topic)
    publisher = await ctx.connect()
    send_json(publisher, {"publish": topic, "body": 1, "extra": {"x": True}, "id": 9})
    got = await expect_publish(listener, topic)
    if got.body != 1:
        raise ctx.fail(f"the body came as {show(got.body)}")
