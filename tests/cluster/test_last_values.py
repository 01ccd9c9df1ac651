"""Last values shared by the processes of a cluster, through a JetStream bucket on a real
nats-server: a subscriber on any process gets a topic's last value, wherever it was published
and even if no process subscribed to it then."""

from __future__ import annotations

import msgpack
import pytest_twisted
from twisted.internet import reactor
from twisted.logger import globalLogPublisher

from tests.brokers import LOCAL
from tests.cluster.test_link import cluster_broker
from tests.support import Inbox, eventually, sleep, wait_for
from wireproto.cluster.client import NatsClient, NatsOptions
from wireproto.cluster.lastvalues import key_of_topic, topic_of_key
from wireproto.cluster.settings import ClusterSettings
from wireproto.hub import HubMessage, HubSettings

RETAIN = HubSettings(retain=("sensors/#",))


@pytest_twisted.ensureDeferred
async def test_a_late_subscriber_on_another_process_gets_the_last_value(broker, nats):
    first, at_first = await cluster_broker(broker, nats, hub=RETAIN)
    second, at_second = await cluster_broker(broker, nats, hub=RETAIN)
    await eventually(lambda: first.cluster.last_values.available
                     and second.cluster.last_values.available, timeout=10)
    publisher = await broker.client(at_first["websmq+length32"])
    await wait_for(publisher.publish("sensors/temp", b"21.5"))
    await wait_for(publisher.publish("sensors/temp", b"22.0"))
    await wait_for(publisher.publish("other", b"not kept"))
    # No process subscribes to sensors/temp, yet the second keeps its value.
    await eventually(lambda: second.hub.retained.get("sensors/temp") is not None
                     and second.hub.retained.get("sensors/temp")[0].payload == b"22.0",
                     timeout=10)
    late = await broker.client(at_second["websmq+ws"])
    inbox = Inbox()
    await wait_for(late.subscribe("sensors/temp", inbox))
    (message,) = await inbox.wait()
    assert message.payload == b"22.0"
    assert second.hub.retained.get("other") is None

    # An empty publish clears it on every process.
    await wait_for(publisher.publish("sensors/temp", b""))
    await eventually(lambda: second.hub.retained.get("sensors/temp") is None, timeout=10)

    # A process that starts later reads every kept value.
    await wait_for(publisher.publish("sensors/humidity", b"48"))
    await eventually(lambda: second.hub.retained.get("sensors/humidity") is not None, timeout=10)
    third, at_third = await cluster_broker(broker, nats, hub=RETAIN)
    await eventually(lambda: third.hub.retained.get("sensors/humidity") is not None, timeout=10)
    assert third.hub.retained.get("sensors/temp") is None
    assert third.cluster.last_values.read >= 1


@pytest_twisted.ensureDeferred
async def test_a_last_value_on_a_pattern_from_the_bucket_is_ignored(broker, nats):
    """A NATS client that is no broker (or an older version) writes values on kept/+ and kept/#
    to the bucket: no process keeps them, or gives them to a subscriber, as nothing is published
    on a pattern; each is counted, and logged once however often the consumer sends it."""
    process, _ = await cluster_broker(broker, nats, hub=HubSettings(retain=("kept/#",)))
    await eventually(lambda: process.cluster.last_values.available, timeout=10)
    logged: list[dict] = []
    globalLogPublisher.addObserver(logged.append)
    outsider = NatsClient(reactor, NatsOptions(servers=(nats.url,)))
    outsider.start()
    try:
        await wait_for(outsider.when_ready())
        for topic in ("kept/+", "kept/#", "kept/x"):
            _, ack = await wait_for(outsider.request(
                process.cluster.last_values.subject(topic),
                msgpack.packb([topic, b"injected", "nats", []]), timeout=5))
            assert b'"seq"' in ack, ack
    finally:
        await wait_for(outsider.stop())
    retained = process.hub.retained
    await eventually(lambda: retained.get("kept/x") is not None, timeout=10)
    await sleep(0.3)
    assert retained.topics() == ["kept/x"]
    assert process.cluster.last_values.on_patterns == 2
    assert process.cluster.stats().refused == 2
    # Followed again (as after a reconnect): sent again, counted again, not logged again.
    process.cluster.last_values.following.run(process.cluster.last_values._follow)
    await eventually(lambda: process.cluster.last_values.on_patterns == 4, timeout=10)
    globalLogPublisher.removeObserver(logged.append)
    assert retained.topics() == ["kept/x"]
    refusals = sorted(event["why"] for event in logged
                      if event.get("event") == "cluster_refused")
    assert refusals == ["'kept/#' is a pattern, where nothing is published",
                        "'kept/+' is a pattern, where nothing is published"]


def test_any_topic_is_one_key_token() -> None:
    for topic in ["sensors/temp", "a b/c.d", "$SYS/x", "é/>/*", "x" * 1024]:
        key = key_of_topic(topic)
        assert key.startswith("v.") and "." not in key[2:] and " " not in key
        assert topic_of_key(key) == topic


@pytest_twisted.ensureDeferred
async def test_a_value_kept_before_the_process_reached_the_cluster_is_shared_once_it_does(
        broker, nats):
    """A serial link's presence is published as its broker starts, before it has reached NATS:
    that last value reaches the other processes once it has, where it was dropped."""
    second, _ = await cluster_broker(broker, nats, hub=RETAIN)
    await eventually(lambda: second.cluster.last_values.available, timeout=10)
    first, _ = await broker.start(
        f"websmq+length32@tcp:0:{LOCAL}", hub=RETAIN,
        cluster=ClusterSettings(url=nats.url, heartbeat_interval=0.2, lease=1.0))
    assert not first.cluster.last_values.available
    first.hub.publish(HubMessage("sensors/early", b"1", protocol="websmq"))
    first.hub.publish(HubMessage("sensors/early", b"2", protocol="websmq"))
    await eventually(lambda: second.hub.retained.get("sensors/early") is not None
                     and second.hub.retained.get("sensors/early")[0].payload == b"2",
                     timeout=10)
