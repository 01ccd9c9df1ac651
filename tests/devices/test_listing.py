"""Listing the serial ports off the reactor's thread: through real brokers, with listers that
record the thread they run in, take a while, raise or hang, while real clients on 127.0.0.1
talk through the broker. One listing at a time; a hung one is given up after its timeout,
logged once, costs a bounded number of threads, and the ports are listed again once the lister
returns; a broker stopped by SIGINT does not wait for it."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.logger import globalLogPublisher
from twisted.python.threadable import isInIOThread

from tests.support import eventually, sleep, wait_for
from wireproto.config import Config, parse_listen, parse_phyllo
from wireproto.devices import PollingWatcher, PortInfo, PortListing, PortsNotListed
from wireproto.devices.listing import MAX_HUNG
from wireproto.devices.standin import COMMON_BOARDS, StandInPorts
from wireproto.hub import Session
from wireproto.protocols.websmq.client import connect as websmq_connect
from wireproto.service import WireprotoService, make_service

LOCAL = "interface=127.0.0.1"
UNO = "vid=2341:pid=0043"


class Lister:
    """The stand-ins' lister, recording each call's thread, how many run at once, and made
    to hang (until released, 30 s at most) or to raise on demand."""

    def __init__(self, boards: StandInPorts) -> None:
        self.boards = boards
        self.threads: list[tuple[str, bool]] = []
        self.running = 0
        self.most_at_once = 0
        self.hang = False
        self.hanging = 0
        self.release = threading.Event()
        self.pause = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> list[PortInfo]:
        with self._lock:
            self.threads.append((threading.current_thread().name, isInIOThread()))
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            hang = self.hang
            if hang:
                self.hanging += 1
        try:
            if hang:
                self.release.wait(30)
            elif self.pause:
                self.release.wait(self.pause)
            return self.boards.ports()
        finally:
            with self._lock:
                self.running -= 1
                if hang:
                    self.hanging -= 1


@pytest.fixture
def boards():
    standins = StandInPorts()
    yield standins
    standins.close()


class Broker:
    def __init__(self, lister: Lister, timeout: float = 10.0) -> None:
        self.watcher = PollingWatcher(reactor, PortListing(reactor, lister, timeout), 0.05)
        self.service: WireprotoService | None = None
        self.events: list[dict[str, Any]] = []
        self.clients: list[Any] = []

    async def start(self, *phyllo: str) -> str:
        config = Config(listeners=(parse_listen(f"websmq+ws@tcp:0:{LOCAL}"),),
                        phyllo=tuple(parse_phyllo(spec) for spec in phyllo))
        self.service = make_service(config, reactor, retry_policy=lambda attempt: 0.05,
                                    ports=self.watcher)
        self.service.startService()
        self.watcher.start()
        (bound,) = await wait_for(self.service.when_listening())
        return str(bound.address)

    def said(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]

    def presence(self, link: str) -> Any:
        import json

        assert self.service is not None
        kept = self.service.hub.retained.get(f"$devices/{link}")
        return None if kept is None else json.loads(kept[0].payload)

    async def round_trip(self, address: str, topic: str) -> None:
        """Two WEBSMQ clients connect, one subscribes, and the other's publish reaches it,
        through the broker's sockets."""
        assert self.service is not None
        subscriber = await wait_for(websmq_connect(reactor, address), timeout=10)
        publisher = await wait_for(websmq_connect(reactor, address), timeout=10)
        self.clients += [subscriber, publisher]
        inbox: list[Any] = []
        await subscriber.subscribe(topic, inbox.append)
        hub = self.service.hub
        await eventually(lambda: any(isinstance(s, Session) for s in hub.subscribers(topic)),
                         timeout=10)
        await publisher.publish(topic, b"round trip")
        await eventually(lambda: inbox, timeout=10)
        assert inbox[0].payload == b"round trip"


@pytest_twisted.async_yield_fixture
async def started(boards) -> AsyncIterator[Callable[..., Any]]:
    made: list[tuple[Broker, Lister]] = []

    def make(timeout: float = 10.0) -> tuple[Broker, Lister]:
        lister = Lister(boards)
        broker = Broker(lister, timeout)
        globalLogPublisher.addObserver(broker.events.append)
        made.append((broker, lister))
        return broker, lister

    try:
        yield make
    finally:
        for broker, lister in made:
            lister.hang = False
            lister.release.set()
            globalLogPublisher.removeObserver(broker.events.append)
            for client in broker.clients:
                await wait_for(client.disconnect(), timeout=10)
            if broker.service is not None and broker.service.running:
                await wait_for(broker.service.stopService(), timeout=10)
            broker.watcher.stop()


@pytest_twisted.ensureDeferred
async def test_the_watcher_links_and_presence_list_off_the_reactor_thread(started, boards):
    broker, lister = started()
    uno = boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    pico = boards.plug(**COMMON_BOARDS["pico"], serial_number="E661")
    await broker.start(f"byid@serial:{UNO}", f"bypath@serial:{pico.device}")
    await eventually(lambda: broker.presence("byid") and broker.presence("bypath"), timeout=10)
    # the link by path is said online with the identity a listing found
    assert broker.presence("bypath")["identity"]["serial_number"] == "E661"
    assert broker.presence("byid")["port"] == uno.device
    await eventually(lambda: len(lister.threads) >= 5)
    assert not [thread for thread, in_reactor in lister.threads if in_reactor]
    assert {thread for thread, _ in lister.threads} == {"wireproto-port-listing"}


@pytest_twisted.ensureDeferred
async def test_callers_asking_during_a_listing_share_the_next_one(boards):
    lister = Lister(boards)
    lister.pause = 0.2
    listing = PortListing(reactor, lister)
    boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    first = listing.fresh()
    await eventually(lambda: lister.threads)
    later = [listing.fresh() for _ in range(10)]
    results = await wait_for(defer.gatherResults([first, *later]), timeout=10)
    assert listing.listings == 2 and lister.most_at_once == 1
    assert all(len(ports) == 1 for ports in results)


@pytest_twisted.ensureDeferred
async def test_a_hung_listing_holds_up_no_connection_and_is_given_up_then_recovered(
        started, boards):
    broker, lister = started(timeout=0.5)
    uno = boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    address = await broker.start(f"dev1@serial:{UNO}")
    await eventually(lambda: broker.presence("dev1") and broker.presence("dev1")["online"],
                     timeout=10)
    lister.hang = True
    await eventually(lambda: lister.hanging == 1, timeout=10)
    # While the lister blocks, the broker still carries other connections' traffic.
    await broker.round_trip(address, "while/hung")
    assert lister.hanging >= 1
    # Given up after its timeout, logged once; the ports known are kept; a second thread
    # hangs too, and then no listing starts: no thread per poll.
    await eventually(lambda: broker.said("ports_list_hung"), timeout=10)
    await eventually(lambda: broker.watcher.listing.hung == MAX_HUNG, timeout=10)
    listings = broker.watcher.checks
    await sleep(0.5)  # ten more poll intervals
    assert lister.hanging == MAX_HUNG and broker.watcher.checks == listings
    assert len([t for t in threading.enumerate() if t.name == "wireproto-port-listing"]) \
        <= MAX_HUNG
    assert len(broker.said("ports_list_hung")) == 1
    assert [port.device for port in broker.watcher.ports()] == [uno.device]
    # The lister returns: the ports are listed again, and a board plugged now is seen.
    lister.hang = False
    lister.release.set()
    await eventually(lambda: broker.said("ports_listed_again"), timeout=10)
    pico = boards.plug(**COMMON_BOARDS["pico"], serial_number="E661")
    await eventually(lambda: pico.device in [p.device for p in broker.watcher.ports()],
                     timeout=10)
    assert broker.watcher.listing.hung == 0
    assert lister.most_at_once <= MAX_HUNG + 1


@pytest_twisted.ensureDeferred
async def test_a_link_opening_while_the_listing_hangs_fails_and_opens_once_it_returns(
        started, boards):
    broker, lister = started(timeout=0.5)
    lister.hang = True
    await broker.start(f"dev1@serial:{UNO}")
    await eventually(lambda: [e for e in broker.said("link_open_failed")
                              if "has not returned after 0.5 s" in e["error"]], timeout=10)
    boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    lister.hang = False
    lister.release.set()
    await eventually(lambda: broker.presence("dev1") and broker.presence("dev1")["online"],
                     timeout=10)


@pytest_twisted.ensureDeferred
async def test_a_listing_slower_than_the_poll_interval_sets_the_pace(started, boards):
    broker, lister = started()
    lister.pause = 0.2  # four poll intervals
    await broker.start()
    await eventually(lambda: broker.said("ports_poll_slowed"), timeout=10)
    await eventually(lambda: broker.watcher.checks >= 4, timeout=10)
    assert lister.most_at_once == 1
    assert len(broker.said("ports_poll_slowed")) == 1


@pytest_twisted.ensureDeferred
async def test_a_stopped_listing_fails_its_callers_and_its_thread_is_not_waited_for(boards):
    lister = Lister(boards)
    lister.hang = True
    listing = PortListing(reactor, lister)
    asked = listing.fresh()
    await eventually(lambda: lister.hanging == 1)
    listing.stop()
    with pytest.raises(PortsNotListed):
        await wait_for(asked)
    lister.hang = False
    lister.release.set()
    assert len(await wait_for(listing.fresh())) == 0
    await eventually(lambda: listing.hung == 0)


@pytest_twisted.ensureDeferred
async def test_a_lister_that_exits_its_thread_fails_its_callers_at_once(boards):
    def lister() -> list[PortInfo]:
        raise SystemExit("a lister's sys.exit()")

    listing = PortListing(reactor, lister, timeout=60)
    with pytest.raises(PortsNotListed, match="a lister's sys.exit"):
        await wait_for(listing.fresh(), timeout=10)
    assert listing.hung == 0 and not listing.in_flight


@pytest_twisted.ensureDeferred
async def test_a_broker_stops_while_a_link_waits_on_a_hung_listing(started, boards):
    broker, lister = started()
    lister.hang = True
    await broker.start(f"dev1@serial:{UNO}")
    await eventually(lambda: lister.hanging == 1, timeout=10)
    assert broker.service is not None
    await wait_for(broker.service.stopService(), timeout=10)
    assert lister.hanging == 1 and not broker.watcher.listing.in_flight


STOPPED_WHILE_HUNG = textwrap.dedent("""
    import time
    from twisted.internet import reactor
    from wireproto.config import Config, parse_listen, parse_phyllo
    from wireproto.devices import PollingWatcher
    from wireproto.service import make_service

    def lister():
        print("listing", flush=True)
        time.sleep(3600)  # a sysfs read that never returns
        return []

    config = Config(listeners=(parse_listen("websmq+ws@tcp:0:interface=127.0.0.1"),),
                    phyllo=(parse_phyllo("dev1@serial:vid=2341:pid=0043"),))
    service = make_service(config, reactor, ports=PollingWatcher(reactor, lister, 0.05))
    reactor.callWhenRunning(service.startService)
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    reactor.run()
    print("stopped", flush=True)
""")


def test_a_broker_stopped_with_sigint_does_not_wait_for_a_hung_listing(tmp_path: Path):
    child = subprocess.Popen([sys.executable, "-c", STOPPED_WHILE_HUNG], cwd=os.getcwd(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 30)
        assert ready, "the lister was never called"
        assert child.stdout.readline() == b"listing\n"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert child.returncode == 0, err.decode()
    assert b"stopped\n" in out
