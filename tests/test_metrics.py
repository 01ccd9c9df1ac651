"""Prometheus metrics on a real broker: scraped over HTTP from the port the WebSocket and Engine.IO
listeners share, parsed with prometheus_client's own parser, and checked count for count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer, protocol, reactor
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from tests.brokers import Broker
from tests.support import eventually, failure_of, wait_for
from wireproto.codecs import websmq
from wireproto.codecs.phyllo.document import Format, Schema, message_from_document, serialize
from wireproto.codecs.phyllo.stack import REDUCED, StackDecoder
from wireproto.config import CaptureSettings, HubSettings, MetricsSettings, parse_phyllo
from wireproto.hub import HubMessage
from wireproto.protocols.nydus.client import connect as nydus_connect
from wireproto.protocols.rpc import RequestFailed
from wireproto.protocols.ubre.client import connect as ubre_connect

# Tests whose promises the fast path must keep run on both of its paths.
on_both_fast_paths = pytest.mark.usefixtures("fast_path")


LOCAL = "interface=127.0.0.1"


class Scrape:
    """One GET of a metrics page: its status, content type and samples."""

    def __init__(self, status: int, content_type: str, text: str) -> None:
        self.status = status
        self.content_type = content_type
        self.text = text
        self.families = (
            {family.name: family for family in text_string_to_metric_families(text)}
            if status == 200 else {}
        )

    def value(self, name: str, **labels: str) -> float:
        """The one sample called `name` whose labels include `labels`."""
        found = [
            sample.value
            for family in self.families.values()
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        ]
        assert len(found) == 1, f"{len(found)} samples {name} {labels}"
        return found[0]

    def labels(self, name: str) -> list[dict[str, str]]:
        return [sample.labels for sample in self.families[name].samples]


class BodyReader(protocol.Protocol):
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done: defer.Deferred[bytes] = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.chunks.append(data)

    def connectionLost(self, reason: Any) -> None:
        self.done.callback(b"".join(self.chunks))


async def scrape(base: str, path: str = "/metrics", accept: str | None = None) -> Scrape:
    headers = Headers({b"accept": [accept.encode()]}) if accept else None
    response = await wait_for(Agent(reactor).request(b"GET", f"{base}{path}".encode(), headers))
    reader = BodyReader()
    response.deliverBody(reader)
    body = await wait_for(reader.done)
    (content_type,) = response.headers.getRawHeaders(b"content-type", [b""])
    return Scrape(response.code, content_type.decode(), body.decode())


def http_base(address: str) -> str:
    """``ws://127.0.0.1:PORT/websmq`` -> ``http://127.0.0.1:PORT``."""
    scheme, rest = address.split("://", 1)
    return "http://" + rest.split("/", 1)[0]


async def subscribed(service: Any, client: Any, topic: str) -> list:
    received: list = []
    client.subscribe(topic, received.append)
    await eventually(lambda: service.hub.subscribers(topic))
    return received


def refuse(*args: Any) -> None:
    raise RequestFailed({"message": "no"})


@pytest_twisted.ensureDeferred
async def test_connections_messages_and_rpc_latency_are_counted(broker: Broker) -> None:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", f"ubre+ws@tcp:0:{LOCAL}", f"nydus+engineio@tcp:0:{LOCAL}",
        f"websmq+length32@tcp:0:{LOCAL}",
    )
    ws, ubre_url, nydus_url, tcp = (entry.address for entry in bound)
    base = http_base(ws)
    assert http_base(ubre_url) == http_base(nydus_url) == base  # one HTTP port

    ubre = service.server("ubre")
    ubre.handle("add", lambda body, peer: body["a"] + body["b"])
    ubre.handle("refuse", refuse)
    nydus_server = service.server("nydus")
    nydus_server.register_route("/echo", lambda call: call.body)
    nydus_server.register_route("/refuse", refuse)

    subscriber = await broker.client(ws)
    publisher = await broker.client(tcp)
    inbox = await subscribed(service, subscriber, "room/temp")
    count = 5
    for number in range(count):
        publisher.publish("room/temp", b"%d" % number)
    await eventually(lambda: len(inbox) == count)
    frame_size = len(websmq.encode(websmq.Publish("room/temp", b"0")))

    rpc = await wait_for(ubre_connect(reactor, ubre_url))
    nydus = await wait_for(nydus_connect(reactor, nydus_url))
    try:
        assert await wait_for(rpc.request("add", {"a": 1, "b": 2})) == 3
        assert isinstance(await failure_of(rpc.request("refuse")), RequestFailed)
        assert await wait_for(nydus.invoke("/echo", {"x": 1})) == {"x": 1}
        assert isinstance(await failure_of(nydus.invoke("/refuse")), RequestFailed)

        page = await scrape(base)
        assert page.status == 200 and page.content_type.startswith("text/plain")
        for protocol_name, transport in (
            ("websmq", "ws"), ("websmq", "length32"), ("ubre", "ws"), ("nydus", "engineio"),
        ):
            labels = {"protocol": protocol_name, "transport": transport}
            assert page.value("wireproto_connections", **labels) == 1
            assert page.value("wireproto_connections_accepted_total", **labels) == 1
        assert page.value("wireproto_messages_received_total", protocol="websmq") == count
        assert page.value("wireproto_messages_sent_total", protocol="websmq") == count
        assert page.value("wireproto_bytes_sent_total", protocol="websmq") == count * frame_size
        # UBRE: the announcement of the hub's topic, then the two replies; nydus: the WELCOME
        # and the two replies.
        assert page.value("wireproto_messages_sent_total", protocol="ubre") == 3
        assert page.value("wireproto_messages_sent_total", protocol="nydus") == 3
        assert page.value("wireproto_hub_published_total") == count
        assert page.value("wireproto_hub_delivered_total") == count
        assert page.value("wireproto_hub_topics") == 1
        assert page.value("wireproto_dropped_messages_total", protocol="websmq") == 0
        assert page.value("wireproto_queued_bytes", protocol="websmq") == 0

        histogram = "wireproto_rpc_handling_seconds_count"
        assert page.value(histogram, protocol="ubre", outcome="success") == 1
        assert page.value(histogram, protocol="ubre", outcome="fail") == 1
        assert page.value(histogram, protocol="nydus", outcome="success") == 1
        assert page.value(histogram, protocol="nydus", outcome="fail") == 1
        assert page.value(
            "wireproto_rpc_handling_seconds_bucket", protocol="ubre", outcome="success", le="+Inf"
        ) == 1
    finally:
        await wait_for(rpc.close())
        await wait_for(nydus.close())

    # A closed connection's counts stay in the totals; only the gauges go down.
    await wait_for(subscriber.disconnect())
    await eventually(lambda: len(service.hub.sessions) == 1)
    page = await scrape(base)
    assert page.value("wireproto_connections", protocol="websmq", transport="ws") == 0
    assert page.value("wireproto_connections", protocol="ubre", transport="ws") == 0
    assert page.value("wireproto_connections_accepted_total", protocol="websmq",
                      transport="ws") == 1
    assert page.value("wireproto_messages_sent_total", protocol="websmq") == count
    assert page.value("wireproto_bytes_sent_total", protocol="websmq") == count * frame_size
    assert page.value("wireproto_messages_sent_total", protocol="ubre") == 3
    assert page.value("wireproto_messages_received_total", protocol="websmq") == count
    assert page.value("wireproto_hub_topics") == 0


@pytest_twisted.ensureDeferred
async def test_a_nydus_clients_hub_publishes_are_counted_as_received(broker: Broker) -> None:
    # Fixed: a nydus client's /_hub/publish went into the hub, and
    # wireproto_messages_received_total{protocol="nydus"} stayed 0.
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}",
                                        f"nydus+engineio@tcp:0:{LOCAL}")
    ws, nydus_url = (entry.address for entry in bound)
    inbox = await subscribed(service, await broker.client(ws), "room/temp")
    nydus = await wait_for(nydus_connect(reactor, nydus_url))
    try:
        for number in range(2):
            assert await wait_for(nydus.invoke(
                "/_hub/publish", {"path": "/room/temp", "data": number})) == {
                    "delivered": 1, "processes": 1}
        await eventually(lambda: len(inbox) == 2)
        page = await scrape(http_base(ws))
        assert page.value("wireproto_messages_received_total", protocol="nydus") == 2
        assert page.value("wireproto_hub_published_total") == 2
    finally:
        await wait_for(nydus.close())


@on_both_fast_paths
@pytest_twisted.ensureDeferred
async def test_queue_depth_drops_and_wills(broker: Broker) -> None:
    frame_size = len(websmq.encode(websmq.Publish("t", b"x" * 20)))
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", hub=HubSettings(queue_bytes=3 * frame_size)
    )
    (address,) = (entry.address for entry in bound)
    subscriber = await broker.client(address)
    inbox = await subscribed(service, subscriber, "t")
    (session,) = service.hub.sessions
    session.pauseProducing()  # as Twisted does when the socket's buffer is full
    for _ in range(5):
        service.hub.publish(HubMessage("t", b"x" * 20))

    page = await scrape(http_base(address))
    assert page.value("wireproto_queued_messages", protocol="websmq") == 3
    assert page.value("wireproto_queued_bytes", protocol="websmq") == 3 * frame_size
    assert page.value("wireproto_dropped_messages_total", protocol="websmq") == 2
    assert page.value("wireproto_dropped_bytes_total", protocol="websmq") == 2 * frame_size
    assert page.value("wireproto_messages_sent_total", protocol="websmq") == 0
    assert page.value("wireproto_overflow_disconnects_total", protocol="websmq") == 0

    session.resumeProducing()
    await eventually(lambda: len(inbox) == 3)
    await subscriber.set_will("gone", b"bye")
    await eventually(lambda: session.will is not None)
    await wait_for(subscriber.disconnect())
    await eventually(lambda: not service.hub.sessions)
    page = await scrape(http_base(address))
    assert page.value("wireproto_queued_messages", protocol="websmq") == 0
    assert page.value("wireproto_messages_sent_total", protocol="websmq") == 3
    assert page.value("wireproto_dropped_messages_total", protocol="websmq") == 2
    assert page.value("wireproto_hub_wills_total") == 1
    assert page.value("wireproto_hub_published_total") == 6


@on_both_fast_paths
@pytest_twisted.ensureDeferred
async def test_overflow_disconnects_are_counted(broker: Broker) -> None:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", hub=HubSettings(queue_bytes=100, overflow="disconnect")
    )
    (address,) = (entry.address for entry in bound)
    subscriber = await broker.client(address)
    await subscribed(service, subscriber, "t")
    (session,) = service.hub.sessions
    session.pauseProducing()
    service.hub.publish(HubMessage("t", b"x" * 200))
    await wait_for(subscriber.when_closed())
    page = await scrape(http_base(address))
    assert page.value("wireproto_overflow_disconnects_total", protocol="websmq") == 1
    assert page.value("wireproto_connections", protocol="websmq", transport="ws") == 0


class StreamDevice(protocol.Protocol):
    """A Phyllo device behind a TCP port, speaking the reduced stack."""

    def connectionMade(self) -> None:
        self.factory.devices.append(self)
        self.decoder = StackDecoder(REDUCED)
        self.received: list = []

    def dataReceived(self, data: bytes) -> None:
        self.received += self.decoder.feed(data)


@pytest_twisted.ensureDeferred
async def test_phyllo_links_have_per_link_metrics(broker: Broker) -> None:
    factory = protocol.ServerFactory.forProtocol(StreamDevice)
    factory.devices = []
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    try:
        service, bound = await broker.start(
            f"websmq+ws@tcp:0:{LOCAL}",
            phyllo=(parse_phyllo(f"esp32@tcp:127.0.0.1:{port.getHost().port}"),),
        )
        base = http_base(bound[0].address)
        bridge = service.phyllo["esp32"]
        (device,) = await eventually(lambda: factory.devices)
        await eventually(lambda: bridge.top is not None)
        good = REDUCED.encode(
            message_from_document("temp", serialize(7, Format.MSGPACK, Schema.SCHEMALESS))
        )
        corrupt = bytearray(good)
        corrupt[8] ^= 0x40  # inside the CRC-covered part
        device.transport.write(bytes(corrupt) + good)
        await eventually(lambda: bridge.counters()["to_hub"] == 1)
        service.hub.publish(HubMessage("phyllo/esp32/led", json.dumps(True).encode()))
        await eventually(lambda: device.received)

        page = await scrape(base)
        assert page.value("wireproto_phyllo_connected", link="esp32") == 1
        assert page.value("wireproto_phyllo_crc_errors_total", link="esp32") == 1
        assert page.value("wireproto_phyllo_framing_errors_total", link="esp32") == 0
        assert page.value("wireproto_phyllo_to_hub_total", link="esp32") == 1
        assert page.value("wireproto_phyllo_to_device_total", link="esp32") == 1
        assert page.value("wireproto_phyllo_dropped_total", link="esp32") == 0
        assert page.value("wireproto_phyllo_connections_total", link="esp32") == 1
    finally:
        await wait_for(port.stopListening())
    device.transport.loseConnection()  # and nothing listens to reopen it
    await eventually(lambda: bridge.top is None)
    page = await scrape(base)
    assert page.value("wireproto_phyllo_connected", link="esp32") == 0
    assert page.value("wireproto_phyllo_crc_errors_total", link="esp32") == 1  # kept


@pytest_twisted.ensureDeferred
async def test_capture_has_its_metrics(broker: Broker, tmp_path: Path) -> None:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}",
        capture=CaptureSettings(directory=str(tmp_path), flush_interval=0.05),
    )
    base = http_base(bound[0].address)
    client = await broker.client(bound[0].address)
    await subscribed(service, client, "room/temp")
    await eventually(lambda: service.capture.writer.counters.records >= 2)  # open, subscribe

    page = await scrape(base)
    written = service.capture.writer.counters
    assert page.value("wireproto_capture_records_total") >= 2
    assert page.value("wireproto_capture_bytes_total") > 0
    assert page.value("wireproto_capture_files_total") == written.files == 1
    assert page.value("wireproto_capture_dropped_batches_total") == 0
    assert page.value("wireproto_capture_dropped_records_total") == 0

    _, plain = await broker.start(f"websmq+ws@tcp:0:{LOCAL}")  # no capture, no capture metrics
    plain_page = await scrape(http_base(plain[0].address))
    assert not [name for name in plain_page.families if name.startswith("wireproto_capture")]


@pytest_twisted.ensureDeferred
async def test_every_served_protocol_is_shown_before_any_connection(broker: Broker) -> None:
    service, bound = await broker.start(f"subble+ws@tcp:0:{LOCAL}", f"ubre+lines@tcp:0:{LOCAL}")
    page = await scrape(http_base(bound[0].address))
    assert sorted(map(sorted, (d.items() for d in page.labels("wireproto_connections")))) == [
        [("protocol", "subble"), ("transport", "ws")],
        [("protocol", "ubre"), ("transport", "lines")],
    ]
    assert page.value("wireproto_messages_received_total", protocol="subble") == 0
    assert page.value("wireproto_hub_published_total") == 0
    assert "wireproto_phyllo_connected" not in page.families  # no links configured


@pytest_twisted.ensureDeferred
async def test_openmetrics_when_the_scraper_asks(broker: Broker) -> None:
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}")
    page = await scrape(
        http_base(bound[0].address), accept="application/openmetrics-text; version=1.0.0"
    )
    assert page.status == 200
    assert page.content_type.startswith("application/openmetrics-text")
    assert page.text.rstrip().endswith("# EOF")


@pytest_twisted.ensureDeferred
async def test_disabled_metrics_are_not_served(broker: Broker) -> None:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", metrics=MetricsSettings(enabled=False)
    )
    assert service.metrics is None
    page = await scrape(http_base(bound[0].address))
    assert page.status == 404
    client = await broker.client(bound[0].address)  # the WebSocket path still works
    await subscribed(service, client, "t")


@pytest_twisted.ensureDeferred
async def test_two_services_have_their_own_registries_at_their_own_paths(broker: Broker) -> None:
    first, first_bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", metrics=MetricsSettings(path="/stats/prometheus")
    )
    second, second_bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}")
    assert first.metrics.registry is not second.metrics.registry
    client = await broker.client(first_bound[0].address)
    await subscribed(first, client, "t")
    first.hub.publish(HubMessage("t", b"1"))

    first_base, second_base = (http_base(bound[0].address) for bound in (first_bound, second_bound))
    assert (await scrape(first_base)).status == 404
    page = await scrape(first_base, "/stats/prometheus")
    assert page.value("wireproto_hub_published_total") == 1
    assert page.value("wireproto_connections", protocol="websmq", transport="ws") == 1
    other = await scrape(second_base)
    assert other.value("wireproto_hub_published_total") == 0
    assert other.value("wireproto_connections", protocol="websmq", transport="ws") == 0


def test_a_listener_at_the_metrics_path_is_refused() -> None:
    from wireproto.config import Config, parse_listen
    from wireproto.service import make_service

    config = Config(listeners=(parse_listen(f"websmq+ws/metrics@tcp:0:{LOCAL}"),))
    with pytest.raises(ValueError, match="metrics"):
        make_service(config, reactor)


@pytest_twisted.ensureDeferred
async def test_http_refusals_are_counted_by_reason(broker: Broker) -> None:
    from wireproto.transports.http import HTTPLimits

    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", http=HTTPLimits(max_pending_per_address=1)
    )
    base = http_base(bound[0].address)
    before = await scrape(base)
    assert before.value("wireproto_http_refused_total", reason="too_many_pending") == 0
    port = int(base.rsplit(":", 1)[1])
    silent = await wait_for(protocol.ClientCreator(reactor, protocol.Protocol).connectTCP(
        "127.0.0.1", port))
    await eventually(lambda: service.http_sites[0].pending == 1)
    refused = await scrape(base)  # the scrape is the second pending request: refused
    silent.transport.loseConnection()
    await eventually(lambda: service.http_sites[0].pending == 0)
    assert refused.status == 503
    metrics = await scrape(base)
    assert metrics.value("wireproto_http_refused_total", reason="too_many_pending") == 1
