"""With a cluster, the links to devices open once NATS is reachable, so what a device says as
its port opens reaches the other processes' subscribers too (a worker started again opened its
links before it had reached NATS, and a board's first publishes reached that worker alone);
after `cluster_wait` seconds without NATS they open anyway, said once (docs/cluster.md, "Links
to devices"). A real nats-server, started late, and a device that listens on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.application.service import Service
from twisted.internet import defer, protocol, reactor

from tests.brokers import LOCAL, Broker
from tests.cluster.conftest import _need_nats_server
from tests.support import eventually, quiet_port, sleep, wait_for
from tests.test_log_events import logged, named
from wireproto.cluster.settings import ClusterSettings
from wireproto.config import Attach, Config, parse_listen
from wireproto.service import make_service
from wireproto.supervisor.natsserver import NatsServer


class _Device(protocol.Protocol):
    def connectionMade(self) -> None:
        # Whether this broker had reached NATS when it opened the link.
        self.factory.opened.append(self.factory.reached())


class _Broken(Service):
    """A link that cannot start."""

    name = "broken"

    def startService(self) -> None:
        raise OSError("no such device")


class Device:
    """A peer an attached link dials, noting whether the broker had reached NATS then."""

    def __init__(self) -> None:
        self.factory = protocol.ServerFactory.forProtocol(_Device)
        self.factory.opened = []
        self.factory.reached = lambda: None
        self.port = reactor.listenTCP(0, self.factory, interface="127.0.0.1")

    @property
    def opened(self) -> list[Any]:
        return self.factory.opened

    def link(self) -> Attach:
        return Attach("websmq", f"tcp:127.0.0.1:{self.port.getHost().port}", "length32")


@pytest_twisted.async_yield_fixture
async def device():
    made = Device()
    yield made
    await wait_for(made.port.stopListening())


@pytest_twisted.async_yield_fixture
async def late_device():
    """A second device, for a link added later."""
    made = Device()
    yield made
    await wait_for(made.port.stopListening())


@pytest.fixture
def late_nats(tmp_path) -> Iterator[NatsServer]:
    """A nats-server on a port of its own, not started yet."""
    _need_nats_server()
    server = NatsServer(directory=str(tmp_path / "nats"), port=quiet_port())
    try:
        yield server
    finally:
        server.stop()


async def broker_with_link(broker: Broker, device: Device, url: str, wait: float | None = None,
                           ready: defer.Deferred | None = None, broken: bool = False) -> Any:
    config = Config(listeners=(parse_listen(f"websmq+ws@tcp:0:{LOCAL}"),),
                    attach=(device.link(),), cluster=ClusterSettings(url=url))
    service = make_service(config, reactor, retry_policy=lambda attempt: 0.05)
    if wait is not None:
        service.links.cluster_wait = wait
    if ready is not None:  # the cluster is reached when the test says
        service.links.cluster_ready = lambda: ready
    if broken:
        _Broken().setServiceParent(service.links)
    device.factory.reached = lambda: service.cluster.client.connected
    broker.services.append(service)
    service.startService()
    await wait_for(service.when_listening())
    return service


@pytest_twisted.ensureDeferred
async def test_the_links_open_once_the_cluster_is_reachable(broker: Broker, device: Device,
                                                            late_nats: NatsServer) -> None:
    url = f"nats://127.0.0.1:{late_nats.port}"
    service = await broker_with_link(broker, device, url)
    await sleep(1.0)
    assert device.opened == [] and not service.links.opened
    late_nats.start()
    await eventually(lambda: device.opened, timeout=15)
    assert device.opened == [True]


@pytest_twisted.ensureDeferred
async def test_without_the_cluster_the_links_open_after_the_wait_said_once(
        broker: Broker, device: Device) -> None:
    with logged() as events:
        service = await broker_with_link(broker, device, f"nats://127.0.0.1:{quiet_port()}",
                                         wait=0.5)
        await eventually(lambda: device.opened, timeout=10)
    assert device.opened == [False]
    (said,) = named(events, "links_opened_without_cluster")
    assert said["wait"] == 0.5
    assert service.links.opened


@pytest_twisted.ensureDeferred
async def test_a_broker_stopped_while_its_links_wait_leaves_nothing_behind(
        broker: Broker, device: Device) -> None:
    service = await broker_with_link(broker, device, f"nats://127.0.0.1:{quiet_port()}",
                                     wait=2.0)
    await wait_for(service.stopService(), timeout=10)
    assert service.links._waiting is None and not service.links.opened
    await sleep(2.5)  # past the wait: nothing opens a link of a stopped broker
    assert device.opened == []


@pytest_twisted.ensureDeferred
async def test_a_link_that_cannot_start_is_said_and_the_others_open(broker: Broker,
                                                                    device: Device) -> None:
    ready: defer.Deferred = defer.Deferred()
    with logged() as events:
        service = await broker_with_link(broker, device, f"nats://127.0.0.1:{quiet_port()}",
                                         ready=ready, broken=True)
        assert device.opened == []
        ready.callback(None)
        await eventually(lambda: device.opened, timeout=10)
    (said,) = named(events, "links_open_failed")
    assert said["link"] == "broken" and service.links.opened


@pytest_twisted.ensureDeferred
async def test_the_cluster_reached_after_a_stop_opens_nothing(broker: Broker, device: Device,
                                                              late_device: Device) -> None:
    ready: defer.Deferred = defer.Deferred()
    service = await broker_with_link(broker, device, f"nats://127.0.0.1:{quiet_port()}",
                                     ready=ready)
    # A link added while the others wait starts at once, and stops with them.
    service.add_attach(late_device.link(), lambda attempt: 0.05)
    await eventually(lambda: late_device.opened, timeout=10)
    await wait_for(service.stopService(), timeout=10)
    assert not any(child.running for child in service.links)
    ready.callback(None)
    await sleep(0.3)
    assert device.opened == [] and not service.links.opened
