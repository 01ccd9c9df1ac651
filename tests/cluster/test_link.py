"""Broker processes joined through a real nats-server: one topic space, in every protocol,
exactly once and in order, with interest-based NATS subscriptions.

Each broker here is a whole service with its own hub and its own NATS connection, as a worker
process has; they share this test's reactor only to keep the tests quick (tests/cluster/
test_workers.py runs them as real processes)."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.brokers import LOCAL, Broker
from tests.support import eventually, sleep, wait_for
from wireproto.cluster.client import NatsClient, NatsOptions
from wireproto.cluster.settings import ClusterSettings
from wireproto.codecs import websmq
from wireproto.hub import HubSettings
from wireproto.protocols.subble.client import connect as subble_connect
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.websmq.server import WebsmqSettings
from wireproto.service import WireprotoService


async def cluster_broker(broker: Broker, nats, **tables) -> tuple[WireprotoService, dict]:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", f"websmq+length32@tcp:0:{LOCAL}",
        f"ubre+lines@tcp:0:{LOCAL}",
        cluster=ClusterSettings(url=nats.url if hasattr(nats, "url") else nats,
                                heartbeat_interval=0.2, lease=1.0),
        websmq=WebsmqSettings(wildcards=True), **tables)
    await wait_for(service.cluster.when_ready(), 10)
    addresses = {entry.listener.protocol + "+" + entry.listener.transport: entry.address
                 for entry in bound}
    return service, addresses


async def websmq_subscriber(broker, service, address, topic, *, wildcards=False):
    client = await broker.client(address, wildcards=wildcards)
    received: list = []
    client.subscribe(topic, received.append)
    await eventually(lambda: topic in service.hub.topics() or topic in service.hub.patterns())
    return client, received


async def interest_reaches_nats(*services) -> None:
    for service in services:
        await wait_for(service.cluster.client.flush())


@pytest_twisted.ensureDeferred
async def test_a_publish_reaches_every_process_once_in_every_protocol(broker, nats):
    first, at_first = await cluster_broker(broker, nats)
    second, at_second = await cluster_broker(broker, nats)
    _, local = await websmq_subscriber(broker, first, at_first["websmq+ws"], "sensors/t")
    _, remote = await websmq_subscriber(broker, second, at_second["websmq+length32"], "sensors/t")
    ubre = await wait_for(ubre_connect(reactor, at_second["ubre+lines"]))
    try:
        via_ubre: list = []
        ubre.subscribe("sensors/t", via_ubre.append)
        await eventually(lambda: len(second.hub.subscribers("sensors/t")) == 2)
        await interest_reaches_nats(second)
        publisher = await broker.client(at_first["websmq+length32"])
        for index in range(100):
            publisher.publish("sensors/t", b"%d" % index)
        await eventually(lambda: len(remote) == 100 and len(via_ubre) == 100 and len(local) == 100)
        await sleep(0.2)
        expected = [websmq.Publish("sensors/t", b"%d" % index) for index in range(100)]
        assert local == expected and remote == expected
        assert [message.body for message in via_ubre] == list(range(100))
        assert first.hub.stats.published == 100 and second.hub.stats.published == 0
        assert second.cluster.received == 100 and first.cluster.forwarded == 100
    finally:
        await wait_for(ubre.close())


@pytest_twisted.ensureDeferred
async def test_overlapping_subscriptions_on_one_process_get_one_copy(broker, nats):
    first, at_first = await cluster_broker(broker, nats)
    second, at_second = await cluster_broker(broker, nats)
    _, exact = await websmq_subscriber(broker, second, at_second["websmq+ws"], "a/b")
    _, pattern = await websmq_subscriber(broker, second, at_second["websmq+ws"], "a/+",
                                         wildcards=True)
    _, everything = await websmq_subscriber(broker, second, at_second["websmq+ws"], "#",
                                            wildcards=True)
    await interest_reaches_nats(second)
    assert sorted(second.cluster.interest()) == [
        "wireproto.topic.>", "wireproto.topic.a.*", "wireproto.topic.a.b"]
    publisher = await broker.client(at_first["websmq+ws"])
    for index in range(20):
        publisher.publish("a/b", b"%d" % index)
    await eventually(lambda: len(exact) == len(pattern) == len(everything) == 20)
    await sleep(0.2)
    assert len(exact) == len(pattern) == len(everything) == 20
    assert second.cluster.duplicates == 40


@pytest.mark.parametrize("patterns", [("#", "users/alice/#"), ("a/+/c", "a/b/+", "a/b/c")])
@pytest_twisted.ensureDeferred
async def test_a_plain_nats_publish_reaches_overlapping_subscriptions_once(
        broker, nats, patterns):
    """A publish from a NATS client that is not a broker carries no Wp header, so no sequence
    number tells its copies apart: the process takes it from one of its subscriptions only."""
    (process, at_process) = await cluster_broker(broker, nats)
    received = []
    for pattern in patterns:
        _, got = await websmq_subscriber(broker, process, at_process["websmq+ws"], pattern,
                                         wildcards=True)
        received.append(got)
    await interest_reaches_nats(process)
    topic = "users/alice/x" if patterns[0] == "#" else "a/b/c"
    outsider = NatsClient(reactor, NatsOptions(servers=(nats.url,)))
    outsider.start()
    try:
        await wait_for(outsider.when_ready())
        for index in range(10):
            outsider.publish(process.cluster.subjects.topic(topic), b"%d" % index)
        await wait_for(outsider.flush())
        await eventually(lambda: all(len(got) >= 10 for got in received))
        await sleep(0.3)
        expected = [websmq.Publish(topic, b"%d" % index) for index in range(10)]
        assert all(got == expected for got in received)
        # A plain publish: no will, no member's name.
        assert process.hub.stats.published == 0 and process.cluster.received == 10
    finally:
        await wait_for(outsider.stop())


@pytest_twisted.ensureDeferred
async def test_a_plain_nats_publish_on_a_pattern_is_refused(broker, nats):
    """A NATS client that is not a broker publishes on the subject of `tt/+`: no process
    publishes on a pattern, whichever way it comes."""
    (process, at_process) = await cluster_broker(broker, nats)
    _, got = await websmq_subscriber(broker, process, at_process["websmq+ws"], "#",
                                     wildcards=True)
    await interest_reaches_nats(process)
    outsider = NatsClient(reactor, NatsOptions(servers=(nats.url,)))
    outsider.start()
    try:
        await wait_for(outsider.when_ready())
        for topic in ("tt/+", "tt/#", "+", "tt/x"):
            outsider.publish(process.cluster.subjects.topic(topic), b"0")
        await wait_for(outsider.flush())
        await eventually(lambda: got)
        await sleep(0.3)
        assert got == [websmq.Publish("tt/x", b"0")]
        assert process.cluster.refused == 3 and process.cluster.received == 1
    finally:
        await wait_for(outsider.stop())


@pytest_twisted.ensureDeferred
async def test_only_topics_with_subscribers_are_subscribed_on_nats(broker, nats):
    first, at_first = await cluster_broker(broker, nats)
    assert first.cluster.interest() == []
    client, _ = await websmq_subscriber(broker, first, at_first["websmq+ws"], "x/#",
                                        wildcards=True)
    assert sorted(first.cluster.interest()) == ["wireproto.topic.x", "wireproto.topic.x.>"]
    client.unsubscribe("x/#")
    await eventually(lambda: first.cluster.interest() == [])


@pytest.mark.parametrize("topic", ["a.b/c d", "*", ">/x", "", "a//b/", "%2E", "ünï/cödé"])
@pytest_twisted.ensureDeferred
async def test_any_topic_crosses_as_itself(broker, nats, topic):
    first, at_first = await cluster_broker(broker, nats)
    second, at_second = await cluster_broker(broker, nats)
    subscriber = await wait_for(ubre_connect(reactor, at_second["ubre+lines"]))
    publisher = await wait_for(ubre_connect(reactor, at_first["ubre+lines"]))
    try:
        remote: list = []
        subscriber.subscribe(topic, remote.append)
        await eventually(lambda: topic in second.hub.topics())
        await interest_reaches_nats(second)
        publisher.publish(topic, "as itself")
        await eventually(lambda: remote)
        assert [(message.topic, message.body) for message in remote] == [(topic, "as itself")]
    finally:
        await wait_for(subscriber.close())
        await wait_for(publisher.close())


@pytest_twisted.ensureDeferred
async def test_a_restarted_nats_server_drops_what_was_published_meanwhile_never_twice(
        broker, nats):
    first, at_first = await cluster_broker(broker, nats)
    second, at_second = await cluster_broker(broker, nats)
    _, remote = await websmq_subscriber(broker, second, at_second["websmq+ws"], "r")
    _, local = await websmq_subscriber(broker, first, at_first["websmq+ws"], "r")
    await interest_reaches_nats(second)
    publisher = await broker.client(at_first["websmq+ws"])
    publisher.publish("r", b"before")
    await eventually(lambda: remote)
    nats.stop()
    await eventually(lambda: not first.cluster.client.connected)
    publisher.publish("r", b"during")
    await eventually(lambda: len(local) == 2)
    assert first.cluster.client.dropped == 1
    nats.start()
    await eventually(lambda: first.cluster.client.connected and second.cluster.client.connected,
                     timeout=15)
    await interest_reaches_nats(second)
    publisher.publish("r", b"after")
    await eventually(lambda: len(remote) == 2)
    await sleep(0.3)
    assert [message.payload for message in remote] == [b"before", b"after"]
    assert [message.payload for message in local] == [b"before", b"during", b"after"]


@pytest_twisted.ensureDeferred
async def test_brokers_move_to_another_nats_node_when_theirs_is_killed(broker, nats_cluster):
    first_node, _, third_node = nats_cluster
    first, at_first = await cluster_broker(broker, first_node)
    second, at_second = await cluster_broker(broker, third_node)
    await eventually(lambda: len(first.cluster.client.servers) == 3, timeout=10)
    _, received = await websmq_subscriber(broker, first, at_first["websmq+ws"], "moving")
    publisher = await broker.client(at_second["websmq+ws"])

    async def crosses(payload: bytes) -> None:
        count = len(received)
        await eventually(lambda: publisher.publish("moving", payload) and len(received) > count,
                         timeout=15, interval=0.2)

    await crosses(b"before")
    first_node.stop(kill=True)
    await eventually(lambda: first.cluster.client.connected
                     and first.cluster.client.reconnects == 1, timeout=15)
    await crosses(b"after")
    assert {message.payload for message in received} <= {b"before", b"after"}


@pytest_twisted.ensureDeferred
async def test_a_slow_subscriber_on_one_process_slows_no_one_else(broker, nats):
    hub = HubSettings(queue_bytes=64 * 1024)
    first, at_first = await cluster_broker(broker, nats, hub=hub)
    second, at_second = await cluster_broker(broker, nats, hub=hub)
    slow, _ = await websmq_subscriber(broker, first, at_first["websmq+length32"], "flood")
    slow.transport.pauseProducing()  # it reads nothing more
    _, fast_here = await websmq_subscriber(broker, first, at_first["websmq+ws"], "flood")
    _, fast_there = await websmq_subscriber(broker, second, at_second["websmq+ws"], "flood")
    await interest_reaches_nats(first, second)
    publisher = await broker.client(at_second["websmq+length32"])
    payload = b"x" * 4096
    # The fast readers share this test's reactor with both brokers, so the publisher waits for
    # them every few messages: "fast" must not hinge on how busy the machine is.
    window = 10
    for start in range(0, 3000, window):
        for index in range(start, start + window):
            publisher.publish("flood", b"%06d" % index + payload)
        sent = start + window
        await eventually(lambda sent=sent: min(len(fast_here), len(fast_there)) >= sent,
                         timeout=30)
    expected = [b"%06d" % i for i in range(3000)]
    assert [m.payload[:6] for m in fast_here] == expected
    assert [m.payload[:6] for m in fast_there] == expected
    assert first.hub.stats.dropped_messages > 0  # the slow one's queue overflowed, alone
    assert second.hub.stats.dropped_messages == 0
    slow.transport.resumeProducing()


@pytest_twisted.ensureDeferred
async def test_a_subble_event_is_the_same_event_on_every_process(broker, nats):
    services = []
    for _ in range(2):
        service, bound = await broker.start(
            f"subble+ws@tcp:0:{LOCAL}", f"ubre+lines@tcp:0:{LOCAL}",
            cluster=ClusterSettings(url=nats.url, heartbeat_interval=0.2, lease=1.0))
        await wait_for(service.cluster.when_ready(), 10)
        services.append((service, {entry.listener.protocol: entry.address for entry in bound}))
    (first, at_first), (second, at_second) = services
    here, there = [], []
    clients = [
        await wait_for(subble_connect(reactor, at_first["subble"], subscribe=["t"],
                                      on_event=here.append)),
        await wait_for(subble_connect(reactor, at_second["subble"], subscribe=["t"],
                                      on_event=there.append)),
    ]
    try:
        producer = await wait_for(subble_connect(reactor, at_first["subble"], produce=["t"]))
        clients.append(producer)
        await eventually(lambda: "t" in second.hub.topics())
        await interest_reaches_nats(second)
        await wait_for(producer.produce("t", {"n": 1}))
        first.server("subble").publish("t", [2], source="plugin")
        ubre = await wait_for(ubre_connect(reactor, at_first["ubre"]))
        ubre.publish("t", {"n": 3})
        await eventually(lambda: len(here) == 3 and len(there) == 3)
        await wait_for(ubre.close())
    finally:
        for client in clients:
            await wait_for(client.close())
    made_here = [(e.guid, e.source, e.datetime, e.payload) for e in here[:2]]
    assert [(e.guid, e.source, e.datetime, e.payload) for e in there[:2]] == made_here
    assert [e.source for e in there] == [producer.client_id, "plugin", "ubre"]
    assert there[2].payload == {"n": 3}
