"""/metrics in a cluster: a scrape of any process reports every process (label ``worker``, its
node name) and their sums (``worker="total"``), gathered over a real nats-server."""

from __future__ import annotations

import pytest_twisted

from tests.brokers import LOCAL
from tests.support import eventually, wait_for
from tests.test_metrics import http_base, scrape
from wireproto.cluster.settings import ClusterSettings


async def node(broker, nats, name: str):
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", f"ubre+lines@tcp:0:{LOCAL}",
        cluster=ClusterSettings(url=nats.url, node=name, heartbeat_interval=0.2,
                                lease=1.0))
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
    assert page.value("wireproto_cluster_processes", worker="total") == 4
    own = await scrape(http_base(at_second["websmq"]), "/metrics?scope=process")
    assert "worker" not in own.labels("wireproto_hub_published")[0]
    assert own.value("wireproto_cluster_received_total") == 3


@pytest_twisted.ensureDeferred
async def test_a_process_alone_answers_without_waiting_for_others(broker, nats):
    first, at_first = await node(broker, nats, "alone")
    page = await scrape(http_base(at_first["websmq"]))
    assert page.value("wireproto_cluster_connected", worker="alone") == 1
    assert page.value("wireproto_cluster_processes", worker="total") == 1
