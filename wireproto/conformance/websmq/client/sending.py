"""WEBSMQ client cases for what the client sends: its will and subscriptions on connecting, its
publishes, subscribes and unsubscribes on command, the frames' type, header and topic, and what
it does with a topic that may not go on the wire (the spec's "Protocol" and "Topics")."""

from __future__ import annotations

from wireproto.codecs.websmq import LastWill, Publish, Subscribe, Unsubscribe
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level, NotApplicable
from wireproto.conformance.websmq.client.support import (
    DECIDED,
    IN,
    OUT,
    TOPICS,
    WILL,
    WILL_PAYLOAD,
    Session,
    kit,
    session,
)
from wireproto.conformance.websmq.support import described


@kit.case("websmq.client.send.binary-frames",
          "Every frame the client sends is a binary WebSocket frame", section="Protocol",
          decision=DECIDED)
async def send_binary(ctx: Context) -> None:
    client = await session(ctx)
    client.websocket_only("text and binary frames")
    await client.works("the echo of a publish")  # every frame read is judged: text fails


@kit.case("websmq.client.send.subscribe",
          "On connecting, the client subscribes with a Subscribe (01) frame whose header gives "
          "the topic's length", section="Subscribe to a topic")
async def send_subscribe(ctx: Context) -> None:
    await session(ctx)  # `ready` waits for exactly that frame, decoded


@kit.case("websmq.client.send.subscribe-no-payload",
          "The client's Subscribe frames carry no payload", section="Payload",
          level=Level.SHOULD)
async def send_subscribe_no_payload(ctx: Context) -> None:
    client = await session(ctx)
    for message in client.sent:
        if isinstance(message, Subscribe | Unsubscribe) and message.payload:
            raise CaseFailed(f"the client sent {described(message)}")


@kit.case("websmq.client.send.will",
          "The client declares its last will with a Last Will (11) frame: the will's topic and "
          "payload", section="Declare a last will")
async def send_will(ctx: Context) -> None:
    client = await session(ctx)
    wills = [message for message in client.sent if isinstance(message, LastWill)]
    if not wills:
        # A client "can" declare a will: a library without wills conforms.
        raise NotApplicable("the client declared no will; the spec makes wills a client's "
                            "choice, and this case judges one declared")
    if LastWill(WILL, WILL_PAYLOAD) not in wills:
        raise CaseFailed(f"expected a Last Will on {WILL!r} with {WILL_PAYLOAD!r} before the "
                         f"Subscribe to {IN!r}; the client sent {client.shown_sent(8)}")


@kit.case("websmq.client.send.order",
          "Reports the frames the client sends on connecting, in order",
          section="Protocol", level=Level.INFORMATION)
async def send_order(ctx: Context) -> str:
    client = await session(ctx)
    return "; ".join(f"{type(message).__name__} {message.topic!r}" for message in client.sent)


@kit.case("websmq.client.send.publish",
          "A publish from the client is a Publish (00) frame with its topic and payload",
          section="Publish to a topic")
async def send_publish(ctx: Context) -> None:
    client = await session(ctx)
    client.command(b"publish conformance/x/y hello there")
    published = await client.until(Publish, "conformance/x/y",
                                   "a Publish on 'conformance/x/y' for the command")
    if published.payload != b"hello there":
        raise CaseFailed(f"the client published {described(published)}")


@kit.case("websmq.client.send.publish-empty",
          "A publish with an empty payload is a Publish frame of the header and topic alone",
          section="Payload")
async def send_publish_empty(ctx: Context) -> None:
    client = await session(ctx)
    await client.echoed(Publish(IN, b""), "the echo of an empty payload")


@kit.case("websmq.client.send.unsubscribe",
          "An unsubscribe from the client is an Unsubscribe (10) frame with its topic",
          section="Subscribe to a topic")
async def send_unsubscribe(ctx: Context) -> None:
    client = await session(ctx)
    topic = "conformance/sub/gone"
    client.command(b"subscribe " + topic.encode())
    await client.until(Subscribe, topic, f"a Subscribe to {topic!r} for the command")
    client.command(b"unsubscribe " + topic.encode())
    await client.until(Unsubscribe, topic, f"an Unsubscribe from {topic!r} for the command")


@kit.case("websmq.client.send.subscribe-delivers",
          "What is published on a topic the client subscribed to on command reaches it",
          section="Subscribe to a topic")
async def send_subscribe_delivers(ctx: Context) -> None:
    client = await session(ctx)
    topic = "conformance/sub/new"
    client.command(b"subscribe " + topic.encode())
    await client.until(Subscribe, topic, f"a Subscribe to {topic!r} for the command")
    await client.echoed(Publish(topic, b"on the new topic"), "the echo of the publish")


# --- Topics ---------------------------------------------------------------------------------


async def _subscribed(client: Session, topic: str) -> None:
    client.command(b"subscribe " + topic.encode())
    await client.until(Subscribe, topic, f"a Subscribe to the {len(topic)}-byte topic")
    await client.echoed(Publish(topic, b"long"), "the echo of a publish on that topic")


@kit.case("websmq.client.topic.long",
          "A topic of 300 bytes goes in the header's 14 bits of length (not its second byte "
          "alone), and what is published there reaches the client", section="Header")
async def topic_long(ctx: Context) -> None:
    client = await session(ctx)
    await _subscribed(client, "conformance/" + "l" * 288)


@kit.case("websmq.client.topic.longest",
          "A topic of 16383 bytes, the longest the header holds, can be subscribed to and "
          "delivered", section="Topics", level=Level.SHOULD)
async def topic_longest(ctx: Context) -> None:
    client = await session(ctx)
    await _subscribed(client, "conformance/" + "m" * (16383 - 12))


async def _refused(client: Session, topic: bytes, what: str) -> str:
    """Ask the client to subscribe to `topic`, which may not go on the wire as it is: it must
    send no frame on it (an invalid frame fails the case as it is read), and still work."""
    client.command(b"subscribe " + topic)
    client.ctx.note(f"the kit asks the client to subscribe to {what}")
    answer = await client.answer(1.0)
    for message in client.sent:
        if isinstance(message, Subscribe) and message.topic.encode() == topic:
            raise CaseFailed(f"the client sent {described(message)}")
    await client.works()
    subscribes = [message.topic for message in client.sent
                  if isinstance(message, Subscribe) and message.topic.startswith(
                      "conformance/bad")]
    if subscribes:
        return f"it subscribed to {subscribes[0]!r} (percent-encoded)"
    if answer is not None:
        return f"refused: {answer[:200].decode('utf-8', 'replace')}"
    return "sent nothing, and reported no error"


@kit.case("websmq.client.topic.one-over",
          "A topic of 16384 bytes, one over what the header holds, is never sent with a "
          "wrapped length", section="Topics")
async def topic_one_over(ctx: Context) -> str:
    client = await session(ctx)
    return await _refused(client, b"conformance/bad/" + b"o" * (16384 - 16), "16384 bytes")


@kit.case("websmq.client.topic.space",
          "A topic with an unescaped space is not sent as it is (refused, or percent-encoded)",
          section="Topics", level=Level.SHOULD, decision=TOPICS)
async def topic_space(ctx: Context) -> str:
    client = await session(ctx)
    return await _refused(client, b"conformance/bad/a b", "'conformance/bad/a b'")


@kit.case("websmq.client.topic.non-ascii",
          "A topic that is not ASCII is not sent as it is (refused, or percent-encoded)",
          section="Topics", level=Level.SHOULD, decision=TOPICS)
async def topic_non_ascii(ctx: Context) -> str:
    client = await session(ctx)
    return await _refused(client, "conformance/bad/café".encode(), "'conformance/bad/café'")


@kit.case("websmq.client.topic.escaped",
          "A percent-encoded topic is sent and matched byte for byte", section="Topics",
          decision=TOPICS)
async def topic_escaped(ctx: Context) -> None:
    client = await session(ctx)
    await _subscribed(client, "conformance/caf%C3%A9/%2Fx")


@kit.case("websmq.client.send.will-not-published",
          "The client does not publish its will itself while it is connected",
          section="Declare a last will")
async def will_not_published(ctx: Context) -> None:
    client = await session(ctx)
    await client.works()
    for message in client.sent:
        if isinstance(message, Publish) and message.topic == WILL:
            raise CaseFailed(f"the client sent {described(message)}")
    if any(isinstance(message, Publish) and message.topic != OUT for message in client.sent):
        raise CaseFailed(f"the client published on its own: {client.shown_sent(8)}")
