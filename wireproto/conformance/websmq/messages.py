"""WEBSMQ cases for what a broker does with well-formed messages: publishing, subscribing and
unsubscribing, the message types it may send, and last wills (the spec's "Features" and
"Message Type")."""

from __future__ import annotations

from wireproto.codecs.websmq import LastWill, Publish
from wireproto.conformance.context import Context
from wireproto.conformance.model import Level
from wireproto.conformance.probe import Probe
from wireproto.conformance.websmq.support import (
    BROKER,
    DECIDED,
    collect,
    described,
    expect,
    kit,
    next_message,
    nothing,
    publish,
    settle,
    subscribe,
    unsubscribe,
    will,
)

QUIET = 0.5  # how long a case waits to be sure that nothing comes


# --- Publish to a topic ---------------------------------------------------------------------


@kit.case("websmq.publish.delivered",
          "A publish reaches a subscriber of its topic as a binary Publish frame with the same "
          "topic and payload", section="Publish to a topic")
async def publish_delivered(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("delivered")
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(topic, b"hello"))
    await expect(subscriber, Publish(topic, b"hello"), "the publish")


@kit.case("websmq.publish.all-subscribers",
          "A publish reaches every subscriber of its topic, and no connection that did not "
          "subscribe", section="Publish to a topic")
async def publish_all_subscribers(ctx: Context) -> None:
    topic = ctx.topic("all")
    subscribers = [await ctx.connect() for _ in range(3)]
    bystander, publisher = await ctx.connect(), await ctx.connect()
    for subscriber in subscribers:
        subscriber.send(subscribe(topic))
    await settle(ctx, *subscribers, bystander, via=publisher)
    publisher.send(publish(topic, b"to all"))
    for subscriber in subscribers:
        await expect(subscriber, Publish(topic, b"to all"),
                     f"the publish on connection {subscriber.number}")
    await nothing(ctx, bystander, QUIET, "nothing on a connection that did not subscribe")


@kit.case("websmq.publish.to-own-publisher",
          "Reports whether a publish is delivered back to its publisher when it is subscribed "
          "to the topic (wireproto: no, only to the other subscribers)",
          section="Publish to a topic", level=Level.INFORMATION, decision=DECIDED)
async def publish_to_own_publisher(ctx: Context) -> str:
    publisher, other = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("own")
    publisher.send(subscribe(topic))
    other.send(subscribe(topic))
    await settle(ctx, publisher, other, via=publisher)
    publisher.send(publish(topic, b"mine"))
    await expect(other, Publish(topic, b"mine"), "the publish on the other subscriber")
    back = await collect(ctx, publisher, QUIET)
    if back:
        return f"delivered back to its publisher: yes ({described(back[0])})"
    return "delivered back to its publisher: no"


@kit.case("websmq.publish.in-order",
          "Publishes from one connection reach a subscriber in the order they were sent",
          section="Publish to a topic", level=Level.SHOULD)
async def publish_in_order(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("order")
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    for number in range(100):
        publisher.send(publish(topic, b"%d" % number))
    for number in range(100):
        await expect(subscriber, Publish(topic, b"%d" % number), f"publish number {number}")


@kit.case("websmq.publish.two-topics",
          "A subscriber of one topic gets nothing published on another",
          section="Publish to a topic")
async def publish_two_topics(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    mine, other = ctx.topic("two/a"), ctx.topic("two/b")
    subscriber.send(subscribe(mine))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(other, b"not yours"))
    publisher.send(publish(mine, b"yours"))
    await expect(subscriber, Publish(mine, b"yours"), "the publish on its own topic only")


# --- Subscribe to a topic -------------------------------------------------------------------


@kit.case("websmq.subscribe.unsubscribe",
          "After an Unsubscribe, publishes on that topic no longer arrive",
          section="Subscribe to a topic")
async def subscribe_unsubscribe(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("unsub")
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(topic, b"before"))
    await expect(subscriber, Publish(topic, b"before"), "the publish before the Unsubscribe")
    subscriber.send(unsubscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(topic, b"after"))
    await nothing(ctx, subscriber, QUIET, "nothing after the Unsubscribe")


@kit.case("websmq.subscribe.unsubscribe-one",
          "An Unsubscribe from one topic leaves the connection's other subscriptions in place",
          section="Subscribe to a topic")
async def subscribe_unsubscribe_one(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    kept, dropped = ctx.topic("one/kept"), ctx.topic("one/dropped")
    subscriber.send(subscribe(kept))
    subscriber.send(subscribe(dropped))
    subscriber.send(unsubscribe(dropped))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(dropped, b"dropped"))
    publisher.send(publish(kept, b"kept"))
    await expect(subscriber, Publish(kept, b"kept"), "the publish on the topic still subscribed")


@kit.case("websmq.subscribe.again",
          "A subscription after an Unsubscribe delivers again", section="Subscribe to a topic")
async def subscribe_again(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("again")
    subscriber.send(subscribe(topic))
    subscriber.send(unsubscribe(topic))
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(topic, b"again"))
    await expect(subscriber, Publish(topic, b"again"), "the publish after subscribing again")


@kit.case("websmq.subscribe.twice",
          "Subscribing twice to one topic delivers each publish once",
          section="Subscribe to a topic", level=Level.SHOULD)
async def subscribe_twice(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("twice")
    subscriber.send(subscribe(topic))
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(topic, b"once"))
    await expect(subscriber, Publish(topic, b"once"), "the publish")
    await nothing(ctx, subscriber, QUIET, "the publish only once")


@kit.case("websmq.subscribe.many",
          "A connection subscribed to 50 topics gets the publishes of each",
          section="Subscribe to a topic", level=Level.SHOULD)  # a broker may limit the count
async def subscribe_many(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topics = [ctx.topic(f"many/{number}") for number in range(50)]
    for topic in topics:
        subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    for topic in topics:
        publisher.send(publish(topic, topic.encode()))
    for topic in topics:
        await expect(subscriber, Publish(topic, topic.encode()), f"the publish on {topic}")


@kit.case("websmq.subscribe.payload-ignored",
          "A Subscribe with a payload subscribes, its payload ignored",
          section="Payload", level=Level.SHOULD, decision=DECIDED)
async def subscribe_payload_ignored(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("sub-payload")
    subscriber.send(subscribe(topic, b"ignore me"))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(topic, b"delivered"))
    await expect(subscriber, Publish(topic, b"delivered"), "the publish")


@kit.case("websmq.subscribe.unsubscribe-payload-ignored",
          "An Unsubscribe with a payload unsubscribes, its payload ignored",
          section="Payload", level=Level.SHOULD, decision=DECIDED)
async def unsubscribe_payload_ignored(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("unsub-payload")
    subscriber.send(subscribe(topic))
    subscriber.send(unsubscribe(topic, b"ignore me"))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(topic, b"not delivered"))
    await nothing(ctx, subscriber, QUIET, "nothing after the Unsubscribe")


@kit.case("websmq.subscribe.unsubscribe-unknown",
          "An Unsubscribe from a topic never subscribed is harmless: the connection stays open "
          "and serves", section="Subscribe to a topic", level=Level.SHOULD, harmful=True)
async def unsubscribe_unknown(ctx: Context) -> None:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("unknown")
    subscriber.send(unsubscribe(ctx.topic("never")))
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=publisher)
    publisher.send(publish(topic, b"still here"))
    await expect(subscriber, Publish(topic, b"still here"), "the publish")


@kit.case("websmq.subscribe.not-forwarded",
          "Subscribe and Unsubscribe frames of other clients never reach a subscriber: the "
          "broker sends neither type", section="Message Type")
async def subscribe_not_forwarded(ctx: Context) -> None:
    subscriber, other = await ctx.connect(), await ctx.connect()
    topic = ctx.topic("types")
    subscriber.send(subscribe(topic))
    await settle(ctx, subscriber, via=other)
    other.send(subscribe(topic))
    other.send(unsubscribe(topic, b"with a payload"))
    other.send(subscribe(topic, b"with a payload"))
    other.send(unsubscribe(topic))
    other.send(publish(topic, b"end"))
    await expect(subscriber, Publish(topic, b"end"), "only the publish")


# --- Declare a last will --------------------------------------------------------------------


async def _will_declared(ctx: Context, topic: str, payload: bytes) -> tuple[Probe, Probe]:
    watcher, leaver = await ctx.connect(), await ctx.connect()
    watcher.send(subscribe(topic))
    leaver.send(will(topic, payload))
    await settle(ctx, watcher, leaver, via=leaver)
    return watcher, leaver


@kit.case("websmq.will.on-close",
          "A client's last will is published with the Last Will (11) type when it closes",
          section="Declare a last will")
async def will_on_close(ctx: Context) -> None:
    topic = ctx.topic("will/close")
    watcher, leaver = await _will_declared(ctx, topic, b"gone")
    leaver.close()
    await expect(watcher, LastWill(topic, b"gone"), "the will, as a Last Will frame")


@kit.case("websmq.will.on-abort",
          "A client's last will is published when its connection is aborted (no close "
          "handshake)", section="Declare a last will", harmful=True)
async def will_on_abort(ctx: Context) -> None:
    topic = ctx.topic("will/abort")
    watcher, leaver = await _will_declared(ctx, topic, b"aborted")
    leaver.abort()
    await expect(watcher, LastWill(topic, b"aborted"), "the will, as a Last Will frame")


@kit.case("websmq.will.on-malformed",
          "A client's last will is published when the server closes its connection for a "
          "malformed frame", section="Declare a last will", level=Level.SHOULD,
          decision=BROKER, harmful=True)
async def will_on_malformed(ctx: Context) -> None:
    topic = ctx.topic("will/malformed")
    watcher, leaver = await _will_declared(ctx, topic, b"refused")
    leaver.send(b"\x40")
    await expect(watcher, LastWill(topic, b"refused"), "the will, as a Last Will frame")


@kit.case("websmq.will.not-while-connected",
          "A last will is not published while its client is still connected",
          section="Declare a last will")
async def will_not_while_connected(ctx: Context) -> None:
    topic = ctx.topic("will/connected")
    watcher, leaver = await _will_declared(ctx, topic, b"not yet")
    await nothing(ctx, watcher, QUIET, "nothing while the will's client is connected")
    leaver.send(publish(topic, b"a publish"))
    await expect(watcher, Publish(topic, b"a publish"), "the client's publish, not its will")


@kit.case("websmq.will.empty-payload",
          "A last will with an empty payload is published with an empty payload",
          section="Declare a last will")
async def will_empty_payload(ctx: Context) -> None:
    topic = ctx.topic("will/empty")
    watcher, leaver = await _will_declared(ctx, topic, b"")
    leaver.close()
    await expect(watcher, LastWill(topic, b""), "the will, as a Last Will frame")


@kit.case("websmq.will.replaced",
          "Reports which will is published when a client declares two (wireproto: the second "
          "replaces the first)", section="Declare a last will", level=Level.INFORMATION,
          decision=BROKER)
async def will_replaced(ctx: Context) -> str:
    topic = ctx.topic("will/twice")
    watcher, leaver = await _will_declared(ctx, topic, b"first")
    leaver.send(will(topic, b"second"))
    await settle(ctx, leaver)
    leaver.close()
    first = await next_message(watcher, "a will")
    published = [first, *await collect(ctx, watcher, QUIET)]
    return "published: " + "; ".join(described(message) for message in published)
