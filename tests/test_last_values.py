"""Last values ([hub] retain): a subscriber that comes after a publish gets the topic's last
value at once, in its own protocol's form, on a real broker over real sockets. A pattern finds
its values through an index, and what a connection's pattern subscribes may examine is bounded
([hub] retained_examined_per_second)."""

from __future__ import annotations

import sqlite3
import time

import msgpack
import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import reactor
from twisted.logger import globalLogPublisher

from tests.brokers import LOCAL
from tests.support import eventually, sleep, wait_for
from tests.test_metrics import http_base, scrape
from wireproto.hub import HubMessage, HubSettings
from wireproto.hub.retained import LastValues
from wireproto.protocols.nydus.client import connect as nydus_connect
from wireproto.protocols.subble.client import connect as subble_connect
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.websmq.server import WebsmqSettings
from wireproto.topics import pattern_matches

LISTEN = (f"websmq+ws@tcp:0:{LOCAL}", f"ubre+lines@tcp:0:{LOCAL}",
          f"nydus+lines@tcp:0:{LOCAL}", f"subble+ws@tcp:0:{LOCAL}")


async def retaining(broker, **hub):
    settings = HubSettings(**{"retain": ("sensors/#", "status"), **hub})
    service, bound = await broker.start(*LISTEN, hub=settings,
                                        websmq=WebsmqSettings(wildcards=True))
    return service, {entry.listener.protocol: entry.address for entry in bound}


@pytest_twisted.ensureDeferred
async def test_a_late_subscriber_gets_the_last_value_in_every_protocol(broker):
    service, at = await retaining(broker)
    publisher = await broker.client(at["websmq"])
    for value in (b'{"c":20}', b'{"c":21}'):
        publisher.publish("sensors/kitchen", value)
    publisher.publish("other", b'{"c":1}')  # no retain pattern matches it
    await eventually(lambda: len(service.hub.retained) == 1)

    websmq_client = await broker.client(at["websmq"])
    via_websmq: list = []
    websmq_client.subscribe("sensors/kitchen", via_websmq.append)

    ubre = await wait_for(ubre_connect(reactor, at["ubre"]))
    via_ubre: list = []
    ubre.subscribe("sensors/kitchen", via_ubre.append)

    nydus = await wait_for(nydus_connect(reactor, at["nydus"]))
    via_nydus: list = []
    nydus.register_route("/sensors/:room", lambda match, data: via_nydus.append(
        (match.params["room"], data)))
    await wait_for(nydus.invoke("/_hub/subscribe", "/sensors/kitchen"))

    via_subble: list = []
    subble = await wait_for(subble_connect(reactor, at["subble"], subscribe=["sensors/kitchen"],
                                           on_event=via_subble.append))
    try:
        await eventually(lambda: via_websmq and via_ubre and via_nydus and via_subble)
        await sleep(0.1)
        assert [(m.topic, m.payload) for m in via_websmq] == [("sensors/kitchen", b'{"c":21}')]
        assert [m.body for m in via_ubre] == [{"c": 21}]
        assert via_nydus == [("kitchen", {"c": 21})]
        assert [(e.type, e.payload) for e in via_subble] == [("sensors/kitchen", {"c": 21})]
    finally:
        await wait_for(ubre.close())
        await wait_for(nydus.close())
        await wait_for(subble.close())


@pytest_twisted.ensureDeferred
async def test_a_pattern_subscriber_gets_every_matching_last_value_and_empty_clears(broker):
    service, at = await retaining(broker)
    publisher = await broker.client(at["websmq"])
    publisher.publish("sensors/a/t", b"1")
    publisher.publish("sensors/b/t", b"2")
    publisher.publish("sensors/c/t", b"3")
    publisher.publish("sensors/b/t", b"")  # clears b
    service.hub.publish(HubMessage("status", b"up"))  # host code's publishes are kept too
    await eventually(lambda: service.hub.retained.cleared == 1)
    by_pattern = {}
    for pattern in ("sensors/+/t", "#"):
        late = await broker.client(at["websmq"], wildcards=True)
        received: list = []
        late.subscribe(pattern, received.append)
        by_pattern[pattern] = received
    await eventually(lambda: len(by_pattern["sensors/+/t"]) == 2 and len(by_pattern["#"]) == 3)
    await sleep(0.1)
    assert sorted((m.topic, m.payload) for m in by_pattern["sensors/+/t"]) == [
        ("sensors/a/t", b"1"), ("sensors/c/t", b"3")]
    assert sorted((m.topic, m.payload) for m in by_pattern["#"]) == [
        ("sensors/a/t", b"1"), ("sensors/c/t", b"3"), ("status", b"up")]


@pytest_twisted.ensureDeferred
async def test_what_is_kept_is_bounded_and_counted(broker):
    service, at = await retaining(broker, max_retained=2, max_retained_bytes=1000)
    publisher = await broker.client(at["websmq"])
    publisher.publish("sensors/1", b"x")
    publisher.publish("sensors/2", b"x")
    publisher.publish("sensors/3", b"x")  # a third topic: refused
    publisher.publish("sensors/1", b"y" * 2000)  # too big: refused, and its old value dropped
    retained = service.hub.retained
    await eventually(lambda: retained.refused == 2)
    assert retained.topics() == ["sensors/2"] and retained.bytes == len("sensors/2") + 1
    page = await scrape(http_base(at["websmq"]))
    assert page.value("wireproto_hub_retained") == 1
    assert page.value("wireproto_hub_retained_bytes") == 10
    assert page.value("wireproto_hub_retained_refused_total") == 2
    late = await broker.client(at["websmq"])
    received: list = []
    late.subscribe("sensors/1", received.append)
    late.subscribe("sensors/2", received.append)
    await eventually(lambda: received)
    await sleep(0.1)
    assert [(m.topic, m.payload) for m in received] == [("sensors/2", b"x")]


@pytest_twisted.ensureDeferred
async def test_a_subble_event_kept_keeps_its_id_and_source(broker):
    service, at = await retaining(broker)
    producer = await wait_for(subble_connect(reactor, at["subble"], produce=["sensors/door"]))
    live: list = []
    watcher = await wait_for(subble_connect(reactor, at["subble"], subscribe=["sensors/door"],
                                            on_event=live.append))
    late_events: list = []
    late = None
    try:
        await wait_for(producer.produce("sensors/door", "open"))
        await eventually(lambda: live)
        late = await wait_for(subble_connect(reactor, at["subble"], subscribe=["sensors/door"],
                                             on_event=late_events.append))
        await eventually(lambda: late_events)
        first, kept = live[0], late_events[0]
        assert (kept.guid, kept.source, kept.datetime, kept.payload) == (
            first.guid, producer.client_id, first.datetime, "open")
    finally:
        for client in (producer, watcher, late):
            if client is not None:
                await wait_for(client.close())


@pytest_twisted.ensureDeferred
async def test_last_values_outlive_a_restart_with_a_retain_file(broker, tmp_path):
    path = tmp_path / "last.sqlite"
    service, at = await retaining(broker, retain_file=str(path))
    publisher = await broker.client(at["websmq"])
    publisher.publish("sensors/kept", b"42")
    publisher.publish("status", b"up")
    await eventually(lambda: len(service.hub.retained) == 2)
    await wait_for(publisher.disconnect())
    broker.clients.remove(publisher)
    await wait_for(service.stopService())
    assert oct(path.stat().st_mode & 0o777) == "0o600"

    again, at = await retaining(broker, retain_file=str(path), retain=("sensors/#",))
    assert again.hub.retained.topics() == ["sensors/kept"]  # "status" is no longer kept
    late = await broker.client(at["websmq"])
    received: list = []
    late.subscribe("sensors/kept", received.append)
    await eventually(lambda: received)
    assert [(m.topic, m.payload) for m in received] == [("sensors/kept", b"42")]
    await wait_for(again.stopService())
    third, _ = await retaining(broker, retain_file=str(path), retain=("sensors/#",))
    assert third.hub.retained.topics() == ["sensors/kept"]
    assert third.hub.retained.flush() == 0  # nothing left to forget


@pytest_twisted.ensureDeferred
async def test_a_retain_file_of_an_older_version_gives_no_value_on_a_pattern(broker, tmp_path):
    """An older version kept a publish on sensors/+ or sensors/# with retain = ["sensors/#"]:
    read back, such values are ignored (nothing is published on a pattern) and forgotten."""
    path = tmp_path / "last.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE last_values (topic TEXT PRIMARY KEY, payload BLOB NOT NULL, "
               "protocol TEXT NOT NULL, encodings BLOB NOT NULL) WITHOUT ROWID")
    for topic in ("sensors/+", "sensors/#", "sensors/kept", "sensors/a+b"):
        db.execute("INSERT INTO last_values VALUES (?, ?, 'websmq', ?)",
                   (topic, topic.encode(), msgpack.packb([])))
    db.commit()
    db.close()
    logged: list[dict] = []
    globalLogPublisher.addObserver(logged.append)
    try:
        service, at = await retaining(broker, retain_file=str(path))
    finally:
        globalLogPublisher.removeObserver(logged.append)
    assert sorted(service.hub.retained.topics()) == ["sensors/a+b", "sensors/kept"]
    (warning,) = [event for event in logged if event.get("event") == "retained_ignored"]
    assert warning["count"] == 2
    late = await broker.client(at["websmq"], wildcards=True)
    received: list = []
    late.subscribe("sensors/#", received.append)
    await eventually(lambda: len(received) == 2)
    await sleep(0.2)
    assert sorted(m.topic for m in received) == ["sensors/a+b", "sensors/kept"]
    await wait_for(service.stopService())
    db = sqlite3.connect(path)
    assert sorted(row[0] for row in db.execute("SELECT topic FROM last_values")) == [
        "sensors/a+b", "sensors/kept"]
    db.close()


# -- finding a pattern's values -----------------------------------------------------------------

_TOPICS = st.lists(st.sampled_from(["a", "b", "", "$a", "+"]), min_size=1, max_size=4).map(
    "/".join)
_PATTERNS = st.sampled_from(["#", "+", "a/#", "+/#", "+/+", "a/+/#", "$a/#", "+/b", "/#", "a"])


@given(st.lists(st.tuples(_TOPICS, st.sampled_from([b"", b"1", b"22", b"x" * 30])), max_size=60),
       st.integers(min_value=1, max_value=8))
def test_a_pattern_finds_what_the_linear_scan_found_oldest_kept_first(publishes, max_topics):
    kept = LastValues(["#", "$a/#"], max_topics=max_topics, max_bytes=100)
    for topic, payload in publishes:
        kept.keep(HubMessage(topic, payload), {})
    for pattern in ("#", "+", "a/#", "+/#", "+/+", "a/+/#", "$a/#", "+/b", "/#", "a", "+/a/b"):
        scanned = [kept.get(topic) for topic in kept.topics()
                   if pattern_matches(pattern, topic)]  # the scan it replaced, in kept order
        assert kept.matching(pattern) == scanned, pattern


def test_a_literal_first_level_examines_nothing_else():
    kept = LastValues(["#"], max_topics=10_000)
    for number in range(10_000):
        kept.keep(HubMessage(f"sensors/{number}", b"v"), {})
    kept.keep(HubMessage("sensors/0", b"again"), {})  # kept again: the newest now
    assert kept.matching("nothing/+/#") == [] and kept.examined == 0
    assert [message.topic for message, _ in kept.matching("sensors/1")] == ["sensors/1"]
    assert kept.examined <= 2
    found = [message.payload for message, _ in kept.matching("sensors/+")]
    assert found[0] == b"v" and found[-1] == b"again" and len(found) == 10_000


# -- a connection's subscribes are bounded -----------------------------------------------------

TCP = f"websmq+length32@tcp:0:{LOCAL}"


async def _kept(broker, count: int, **hub):
    settings = HubSettings(**{"retain": ("sensors/#",), **hub})
    service, bound = await broker.start(TCP, hub=settings, websmq=WebsmqSettings(wildcards=True))
    for number in range(count):
        service.hub.publish(HubMessage(f"sensors/{number}", b"%d" % number))
    assert len(service.hub.retained) == count
    return service, bound[0].address


async def _canary_round_trips(canary, seconds: float) -> float:
    """The slowest of the canary's subscribes, each answered with the topic's last value."""
    slowest, ends, number = 0.0, time.monotonic() + seconds, 0
    while time.monotonic() < ends and number < 100:
        number += 1
        received: list = []
        started = time.monotonic()
        canary.subscribe(f"sensors/{number}", received.append)
        await eventually(lambda received=received: received, timeout=60)
        slowest = max(slowest, time.monotonic() - started)
        assert [m.payload for m in received] == [b"%d" % number]
        canary.unsubscribe(f"sensors/{number}")
    return slowest


@pytest.mark.alone
@pytest_twisted.ensureDeferred
async def test_a_client_subscribing_a_thousand_patterns_slows_only_itself(broker):
    service, address = await _kept(broker, 10_000)
    canary = await broker.client(address)
    heavy = await broker.client(f"{address}:bindAddress=127.0.0.2", wildcards=True)
    for number in range(500):  # about 30 KB: literal first levels, and wildcards over them all
        heavy.subscribe(f"nothing/{number}/+/#", lambda message: None)
        heavy.subscribe(f"sensors/+/none{number}", lambda message: None)
    slowest = await _canary_round_trips(canary, 2)
    assert slowest < 5  # a loaded machine's bound; 16 s when every pattern scanned every value
    assert len(service.hub.patterns()) < 1000  # the heavy client's reading waits
    assert service.hub.limits.exceeded[("websmq", "retained_examined")] >= 1


@pytest.mark.alone
@pytest_twisted.ensureDeferred
async def test_many_connections_from_one_address_share_its_budget(broker):
    """60 connections of one address, 50 patterns each: each connection kept within its own
    budget while the broker stalled for seconds; the budget is the address's."""
    service, address = await _kept(broker, 10_000)
    canary = await broker.client(address)
    crowd = [await broker.client(f"{address}:bindAddress=127.0.0.2", wildcards=True)
             for _ in range(60)]
    for client in crowd:
        for number in range(50):
            client.subscribe(f"+/+/zzz/{number}", lambda message: None)
    slowest = await _canary_round_trips(canary, 3)
    assert slowest < 3.0  # a loaded machine's bound; 10 s with a budget per connection
    assert service.hub.limits.exceeded[("websmq", "retained_examined")] >= 1


@pytest_twisted.ensureDeferred
async def test_past_its_examined_rate_a_connection_is_slowed_and_loses_nothing(broker):
    service, address = await _kept(broker, 0, retain=("a/#", "b/#", "c/#", "status"),
                                   max_retained=30_001, retained_examined_per_second=10_000)
    hub = service.hub
    for prefix in "abc":
        for number in range(10_000):
            hub.publish(HubMessage(f"{prefix}/{number}", b"%d" % number))
    hub.publish(HubMessage("a/0", b"again"))  # kept again: the newest of a/ now
    hub.publish(HubMessage("status", b"up"))
    client = await broker.client(address, wildcards=True)
    received: list = []
    started = time.monotonic()
    for pattern in ("a/#", "b/#", "c/#", "status"):  # 10 000 each but the last
        client.subscribe(pattern, received.append)
    await eventually(lambda: len(received) == 30_001, timeout=30)
    elapsed = time.monotonic() - started
    assert elapsed >= 1.5  # 20 000 values past a burst of 10 000, at 10 000 a second
    expected = [f"{prefix}/{number}" for prefix in "abc" for number in range(10_000)]
    expected.remove("a/0")
    expected.insert(9_999, "a/0")  # oldest kept first
    assert [m.topic for m in received] == expected + ["status"]
    assert received[9_999].payload == b"again"
    assert hub.limits.exceeded[("websmq", "retained_examined")] >= 1
    assert hub.retained.examined >= 30_000
