"""/metrics in a cluster: a scrape of any process reports every process (label ``worker``, its
node name) and their totals (``worker="total"``: sums, but for the gauges a sum would
misstate), gathered over a real nats-server."""

from __future__ import annotations

import pytest_twisted

from tests.brokers import LOCAL
from tests.support import eventually, wait_for
from tests.test_metrics import http_base, scrape
from wireproto.cluster.settings import ClusterSettings
from wireproto.hub import HubSettings


async def node(broker, nats, name: str, **tables):
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", f"ubre+lines@tcp:0:{LOCAL}",
        cluster=ClusterSettings(url=nats.url, node=name, heartbeat_interval=0.2,
                                lease=1.0), **tables)
    await wait_for(service.cluster.when_ready(), 10)
    return service, {entry.listener.protocol: entry.address for entry in bound}


@pytest_twisted.ensureDeferred
async def test_a_scrape_of_one_process_reports_each_process_and_their_total(broker, nats):
    first, at_first = await node(broker, nats, "alpha")
    second, at_second = await node(broker, nats, "beta")
    await eventually(lambda: first.cluster.roster.members() and second.cluster.roster.members(),
                     timeout=10)
    subscriber = await broker.client(at_second["websmq"])
    received: list = []
    subscriber.subscribe("m", received.append)
    await eventually(lambda: "m" in second.hub.topics())
    await wait_for(second.cluster.client.flush())
    publisher = await broker.client(at_first["websmq"])
    for index in range(3):
        publisher.publish("m", b"%d" % index)
    await eventually(lambda: len(received) == 3)
    page = await scrape(http_base(at_first["websmq"]))
    assert page.status == 200
    published = {labels["worker"] for labels in page.labels("wireproto_hub_published")}
    assert published == {"alpha", "beta", "total"}
    assert page.value("wireproto_hub_published_total", worker="alpha") == 3
    assert page.value("wireproto_hub_published_total", worker="beta") == 0
    assert page.value("wireproto_hub_published_total", worker="total") == 3
    assert page.value("wireproto_cluster_forwarded_total", worker="alpha") == 3
    assert page.value("wireproto_cluster_received_total", worker="beta") == 3
    assert page.value("wireproto_connections", worker="total", protocol="websmq",
                      transport="ws") == 2
    # Gauges that do not add up across processes have a total that says what they mean.
    for worker in ("alpha", "beta", "total"):
        assert page.value("wireproto_cluster_processes", worker=worker) == 2
        assert page.value("wireproto_cluster_connected", worker=worker) == 1
    assert {labels["worker"] for labels in page.labels("wireproto_hub_topics")} == {
        "alpha", "beta"}  # "m" has subscribers on one; on both, a sum would count it twice
    own = await scrape(http_base(at_second["websmq"]), "/metrics?scope=process")
    assert "worker" not in own.labels("wireproto_hub_published")[0]
    assert own.value("wireproto_cluster_received_total") == 3


@pytest_twisted.ensureDeferred
async def test_a_process_alone_answers_without_waiting_for_others(broker, nats):
    first, at_first = await node(broker, nats, "alone")
    page = await scrape(http_base(at_first["websmq"]))
    assert page.value("wireproto_cluster_connected", worker="alone") == 1
    assert page.value("wireproto_cluster_processes", worker="total") == 1


@pytest_twisted.ensureDeferred
async def test_last_values_every_process_keeps_are_not_summed(broker, nats):
    retain = HubSettings(retain=("sensors/#",))
    first, at_first = await node(broker, nats, "alpha", hub=retain)
    second, _ = await node(broker, nats, "beta", hub=retain)
    await eventually(lambda: first.cluster.last_values.available
                     and second.cluster.last_values.available
                     and first.cluster.roster.members(), timeout=10)
    publisher = await broker.client(at_first["websmq"])
    publisher.publish("sensors/temp", b"21.5")
    await eventually(lambda: second.hub.retained.get("sensors/temp") is not None, timeout=10)
    page = await scrape(http_base(at_first["websmq"]))
    assert page.value("wireproto_hub_retained", worker="alpha") == 1
    assert page.value("wireproto_hub_retained", worker="beta") == 1
    # One topic's last value, kept by both: 2 would be untrue, so there is no total.
    for name in ("wireproto_hub_retained", "wireproto_hub_retained_bytes"):
        assert {labels["worker"] for labels in page.labels(name)} == {"alpha", "beta"}


@pytest_twisted.ensureDeferred
async def test_one_restart_of_the_nats_server_is_one_reconnect(broker, nats):
    service, at = await node(broker, nats, "alone")
    nats.stop(kill=True)
    await eventually(lambda: not service.cluster.client.connected, timeout=10)
    page = await scrape(http_base(at["websmq"]), "/metrics?scope=process")
    assert page.value("wireproto_cluster_connected") == 0
    assert page.value("wireproto_cluster_reconnects_total") == 0  # lost, not back
    nats.start()
    await eventually(lambda: service.cluster.client.connected, timeout=15)
    page = await scrape(http_base(at["websmq"]), "/metrics?scope=process")
    assert page.value("wireproto_cluster_connected") == 1
    assert page.value("wireproto_cluster_reconnects_total") == 1
