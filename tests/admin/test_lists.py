"""The admin API's lists over real HTTP on a real broker: sessions and topics a page at a time,
filtered and sorted, with their counts; a topic's subscribers counted as delivery reaches them;
a bounded /api/status; and what hostile query strings get."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.protocol import ClientCreator, Protocol

from tests.admin.http import http, open_tap, start
from tests.brokers import LOCAL, Broker
from tests.support import eventually, wait_for
from wireproto.admin.listing import SESSIONS, TOPICS
from wireproto.hub import HubSettings
from wireproto.protocols.websmq.server import WebsmqSettings

WILD = (f"websmq+ws@tcp:0:{LOCAL}", f"websmq+length32@tcp:0:{LOCAL}")


def in_order(items: list[dict[str, Any]], field: str, descending: bool, tie: str) -> bool:
    """Whether `items` are sorted by `field` (None first, ascending), ties by `tie` ascending."""
    def value(item: dict[str, Any]) -> tuple[bool, Any]:
        return (item[field] is not None, item[field])

    for one, other in zip(items, items[1:], strict=False):
        first, second = value(one), value(other)
        if first == second:
            if one[tie] >= other[tie]:
                return False
        elif (first > second) != descending:
            return False
    return True


async def sessions_of(base: str, query: str = "") -> dict[str, Any]:
    answer = await http(base, "/api/sessions" + query)
    assert answer.status == 200, answer.body
    return answer.json


async def clients(broker: Broker, addresses: dict[str, str], count: int, *,
                  publish: bool = True) -> list[Any]:
    """`count` WEBSMQ clients, every third over a WebSocket and the others over length32
    framing; client N subscribes to ``room/N`` and (with `publish`) publishes N messages on
    ``noise``."""
    made = []
    for number in range(count):
        kind = "websmq+ws" if number % 3 == 0 else "websmq+length32"
        client = await broker.client(addresses[kind])
        await wait_for(client.subscribe(f"room/{number}"))
        for _ in range(number if publish else 0):
            await wait_for(client.publish("noise", b"x"))
        made.append(client)
    return made


@pytest_twisted.ensureDeferred
async def test_sessions_are_paged_filtered_and_sorted_by_every_field(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    await clients(broker, addresses, 12)
    await eventually(lambda: sum(s.received for s in service.hub.sessions) == sum(range(12)))
    ids = sorted(session.id for session in service.hub.sessions)

    every = await sessions_of(base)
    assert {key: value for key, value in every.items() if key != "items"} == {
        "total": 12, "matched": 12, "offset": 0, "limit": 100}
    assert [row["id"] for row in every["items"]] == ids
    assert set(every["items"][0]) >= {"id", "node", "protocol", "transport", "peer", "client",
                                      "principal", "roles", "age", "subscriptions", "received"}

    middle = await sessions_of(base, "?limit=5&offset=5")
    assert [row["id"] for row in middle["items"]] == ids[5:10]
    assert (middle["total"], middle["matched"], middle["offset"], middle["limit"]) == (
        12, 12, 5, 5)
    assert [row["id"] for row in (await sessions_of(base, "?offset=10"))["items"]] == ids[10:]
    counts_only = await sessions_of(base, "?limit=0")
    assert counts_only["items"] == [] and counts_only["total"] == 12
    assert (await sessions_of(base, "?offset=50"))["items"] == []

    # q: any case, in any of the fields it names, a subscription included.
    (room,) = (await sessions_of(base, "?q=ROOM/7"))["items"]
    assert room["subscriptions"] == ["room/7"]
    websockets = await sessions_of(base, "?q=Ws")
    assert websockets["matched"] == 4 and websockets["total"] == 12
    assert {row["transport"] for row in websockets["items"]} == {"ws"}
    assert (await sessions_of(base, "?q=websmq"))["matched"] == 12  # the protocol
    assert (await sessions_of(base, "?q=127.0.0.1"))["matched"] == 12  # the peer
    assert ids[3] in [row["id"] for row in (await sessions_of(base, f"?q={ids[3]}"))["items"]]
    node = every["items"][0]["node"]
    assert (await sessions_of(base, f"?q={quote(node.upper())}"))["matched"] == 12
    assert (await sessions_of(base, "?q=nothing-has-this"))["items"] == []

    for field in SESSIONS.fields:
        for descending in (False, True):
            sort = ("-" if descending else "") + field
            rows = (await sessions_of(base, f"?sort={sort}"))["items"]
            assert len(rows) == 12 and in_order(rows, field, descending, "id"), (sort, rows)
    busiest = (await sessions_of(base, "?sort=-received&limit=3"))["items"]
    assert [row["received"] for row in busiest] == [11, 10, 9]
    # Ties by id ascending whatever the direction: the length32 ones, then the WebSockets.
    by_transport = (await sessions_of(base, "?sort=-transport"))["items"]
    assert [row["transport"] for row in by_transport] == ["ws"] * 4 + ["length32"] * 8
    assert [row["id"] for row in by_transport[:4]] == sorted(r["id"] for r in by_transport[:4])
    # Filtered, sorted and paged at once; the last of a repeated parameter counts.
    page = await sessions_of(base, "?q=length32&sort=-id&limit=3&offset=1&limit=2")
    length32 = sorted((s.id for s in service.hub.sessions if s.transport_name == "length32"),
                      reverse=True)
    assert [row["id"] for row in page["items"]] == length32[1:3]
    assert (page["matched"], page["limit"]) == (8, 2)


@pytest_twisted.ensureDeferred
async def test_a_topic_counts_each_session_its_messages_reach_once(broker: Broker) -> None:
    service, addresses, base = await start(
        broker, *WILD, websmq=WebsmqSettings(wildcards=True),
        hub=HubSettings(retain=("sensors/#",)))
    address = addresses["websmq+length32"]
    everything = await broker.client(address, wildcards=True)
    await wait_for(everything.subscribe("#"))
    one_level = await broker.client(address, wildcards=True)
    await wait_for(one_level.subscribe("sensors/+"))
    publisher = await broker.client(address)
    await eventually(lambda: len(service.hub.patterns()) == 2)
    await wait_for(publisher.publish("sensors/humidity", b"40"))
    await eventually(lambda: service.hub.retained is not None and len(service.hub.retained))

    async def topic(name: str) -> dict[str, Any]:
        answer = await http(base, f"/api/topics?q={quote(name, safe='')}")
        (row,) = [row for row in answer.json["items"] if row["topic"] == name]
        return row

    humidity = await topic("sensors/humidity")
    assert humidity["subscribers"] == 2  # no exact subscriber: the two patterns' sessions
    assert humidity["last_value"] == {"size": 2, "json": 40, "text": "40"}
    # One session with both patterns, and an exact subscription too, counts once.
    both = await broker.client(address, wildcards=True)
    await wait_for(both.subscribe("#"))
    await wait_for(both.subscribe("sensors/+"))
    await wait_for(both.subscribe("sensors/humidity"))
    await eventually(lambda: "sensors/humidity" in service.hub.topics())
    assert (await topic("sensors/humidity"))["subscribers"] == 3
    assert (await topic("#")) == {"topic": "#", "subscribers": 2, "rate": 0.0, "pattern": True}
    assert (await topic("sensors/+"))["subscribers"] == 2
    # A tap is no session: counted by neither the topic nor its pattern.
    response, reader = await open_tap(base, "#")
    await eventually(lambda: reader.lines)
    assert (await topic("sensors/humidity"))["subscribers"] == 3
    assert (await topic("#"))["subscribers"] == 2
    # The count is the connections delivery reaches: the API's own publish is told as many (the
    # tap gets it, and is no connection).
    delivered = await http(base, "/api/publish", {"topic": "sensors/humidity", "payload": "41"})
    assert delivered.json["delivered"] == 3
    # `#` does not match the broker's own topics.
    sys_reader = await broker.client(address)
    await wait_for(sys_reader.subscribe("$SYS/broker/uptime"))
    await eventually(lambda: "$SYS/broker/uptime" in service.hub.topics())
    assert (await topic("$SYS/broker/uptime"))["subscribers"] == 1
    response._transport.stopProducing()
    await wait_for(reader.done)


@pytest_twisted.ensureDeferred
async def test_topics_are_paged_sorted_and_the_sys_topics_folded(broker: Broker) -> None:
    service, addresses, base = await start(broker, *WILD, websmq=WebsmqSettings(wildcards=True))
    address = addresses["websmq+length32"]
    for number in range(6):
        client = await broker.client(address, wildcards=True)
        for subscribed in range(number + 1):
            await wait_for(client.subscribe(f"t/{subscribed}"))
    watcher = await broker.client(address, wildcards=True)
    await wait_for(watcher.subscribe("$SYS/broker/uptime"))
    await wait_for(watcher.subscribe("$SYS/#"))
    publisher = await broker.client(address)
    rates = service.admin.rates
    rates.sample()
    for _ in range(4):
        await wait_for(publisher.publish("t/5", b"x"))
    await eventually(lambda: service.hub.topic_counts.get("t/5") == 4)
    rates._last_time -= 2.0
    rates.sample()

    every = (await http(base, "/api/topics")).json
    names = [row["topic"] for row in every["items"]]
    assert names == ["$SYS/#", "$SYS/broker/uptime"] + [f"t/{n}" for n in range(6)]
    assert (every["total"], every["matched"], every["sys"]) == (8, 8, 0)
    folded = (await http(base, "/api/topics?sys=0")).json
    assert [row["topic"] for row in folded["items"]] == [f"t/{n}" for n in range(6)]
    assert (folded["total"], folded["matched"], folded["sys"]) == (8, 6, 2)
    assert (await http(base, "/api/topics?sys=0&q=broker")).json["sys"] == 1

    most = (await http(base, "/api/topics?sort=-subscribers&limit=2&sys=0")).json
    assert [(row["topic"], row["subscribers"]) for row in most["items"]] == [("t/0", 6),
                                                                            ("t/1", 5)]
    busy = (await http(base, "/api/topics?sort=-rate&limit=1")).json["items"]
    assert busy[0]["topic"] == "t/5" and busy[0]["rate"] > 0
    for field in TOPICS.fields:
        for sort in (field, "-" + field):
            rows = (await http(base, f"/api/topics?sort={sort}")).json["items"]
            assert in_order(rows, field, sort.startswith("-"), "topic"), (sort, rows)
    paged = (await http(base, "/api/topics?q=T/&offset=2&limit=3")).json
    assert [row["topic"] for row in paged["items"]] == ["t/2", "t/3", "t/4"]
    assert (paged["total"], paged["matched"], paged["offset"], paged["limit"]) == (8, 6, 2, 3)


@pytest_twisted.ensureDeferred
async def test_the_status_keeps_its_shape_with_pages_of_its_lists(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    await clients(broker, addresses, 7, publish=False)
    lobby = await broker.client(addresses["websmq+length32"])
    await wait_for(lobby.subscribe("lobby"))
    await eventually(lambda: len(service.hub.topics()) == 8)

    status = (await http(base, "/api/status")).json
    assert list(status) == ["broker", "nodes", "listeners", "links", "sessions", "topics",
                            "pages"]
    assert len(status["sessions"]) == 8 and len(status["topics"]) == 8
    assert status["pages"] == {
        "sessions": {"total": 8, "matched": 8, "offset": 0, "limit": 100},
        "topics": {"total": 8, "matched": 8, "offset": 0, "limit": 100, "sys": 0}}

    narrow = (await http(base, "/api/status?limit=2&sessions.offset=1&sessions.sort=-id"
                               "&topics.q=room&topics.limit=3&topics.sort=-topic")).json
    ids = sorted((s.id for s in service.hub.sessions), reverse=True)
    assert [row["id"] for row in narrow["sessions"]] == ids[1:3]
    assert [row["topic"] for row in narrow["topics"]] == ["room/6", "room/5", "room/4"]
    assert narrow["pages"]["sessions"] == {"total": 8, "matched": 8, "offset": 1, "limit": 2}
    assert narrow["pages"]["topics"] == {"total": 8, "matched": 7, "offset": 0, "limit": 3,
                                         "sys": 0}
    sessions_only = (await http(base, "/api/status?sessions.q=length32&topics.limit=0")).json
    length32 = sum(1 for s in service.hub.sessions if s.transport_name == "length32")
    assert sessions_only["topics"] == [] and sessions_only["pages"]["sessions"]["matched"] == (
        length32)
    # The lists' own parameters, unprefixed, are no status parameters.
    assert (await http(base, "/api/status?sort=nonsense&q=x")).status == 200


@pytest.mark.parametrize("path, error", [
    ("/api/sessions?limit=-1", "limit is a whole number from 0 to 1000"),
    ("/api/sessions?limit=1001", "limit is a whole number from 0 to 1000"),
    ("/api/sessions?limit=99999999999999999999999", "limit is a whole number from 0 to 1000"),
    ("/api/sessions?limit=1e3", "limit is a whole number"),
    ("/api/sessions?limit=", "limit is a whole number"),
    ("/api/sessions?limit=%EF%BC%91", "limit is a whole number"),  # a fullwidth digit
    ("/api/topics?offset=-5", "offset is a whole number from 0 to 1000000000"),
    ("/api/topics?offset=ten", "offset is a whole number"),
    ("/api/topics?offset=1000000001", "offset is a whole number"),
    ("/api/sessions?sort=subscribers", "sort sessions by one of id, age, peer, protocol, "
                                       "transport, principal, received, sent, queued_bytes, "
                                       "dropped, node"),
    ("/api/topics?sort=--rate", "sort topics by one of topic, subscribers, rate"),
    ("/api/topics?sort=%FF", "sort topics by one of"),
    ("/api/topics?sys=yes", "sys is 1 (with the $ topics) or 0 (without)"),
    ("/api/sessions?q=%FF%FE", "q is not UTF-8"),
    ("/api/status?limit=2000", "limit is a whole number from 0 to 1000"),
    ("/api/status?sessions.limit=x", "sessions.limit is a whole number"),
    ("/api/status?topics.sort=id", "topics.sort 'id': sort topics by one of"),
    ("/api/status?topics.sys=2", "topics.sys is 1"),
    ("/api/status?sessions.q=%C3", "sessions.q is not UTF-8"),
])
@pytest_twisted.ensureDeferred
async def test_a_wrong_list_parameter_is_refused_with_a_clear_400(
    broker: Broker, path: str, error: str,
) -> None:
    service, addresses, base = await start(broker)
    answer = await http(base, path)
    assert answer.status == 400, answer.body
    assert error in answer.json["error"], answer.json


@pytest_twisted.ensureDeferred
async def test_hostile_query_strings_get_an_answer_and_leave_the_broker_serving(
    broker: Broker,
) -> None:
    service, addresses, base = await start(broker)
    await clients(broker, addresses, 2)
    await eventually(lambda: len(service.hub.sessions) == 2)
    far = (await http(base, "/api/sessions?offset=1000000000&limit=1000")).json
    assert far["items"] == [] and far["total"] == 2 and far["offset"] == 1_000_000_000
    started = time.monotonic()
    long_q = await http(base, "/api/sessions?q=" + "a" * 12_000)
    assert long_q.status == 200 and long_q.json["matched"] == 0
    assert time.monotonic() - started < 5
    # 100 kB of query string is past what the HTTP server reads of a request line (16 KiB):
    # answered 414 and closed (twisted.web closed it without a word); a header line past it,
    # 431; the head's lines together past 16 KiB, 431 too (twisted.web answered a bare 400).
    host, port = base.removeprefix("http://").split(":")
    for head, status in [
            (b"GET /api/topics?q=" + b"%41" * 33_000 + b" HTTP/1.1\r\nhost: " + host.encode(),
             b"414 URI Too Long"),
            (b"GET /api/topics?q=" + b"a" * 16_400 + b" HTTP/1.1\r\nhost: " + host.encode(),
             b"414 URI Too Long"),
            (b"GET /api/topics HTTP/1.1\r\nhost: " + host.encode() + b"\r\nx-big: "
             + b"b" * 17_000, b"431 Request Header Fields Too Large"),
            (b"GET /api/topics?q=" + b"a" * 9_000 + b" HTTP/1.1\r\nhost: " + host.encode()
             + b"\r\nx-big: " + b"b" * 9_000, b"431 Request Header Fields Too Large"),
            (b"GET /api/topics HTTP/1.1\r\nhost: " + host.encode() + b"".join(
                b"\r\nx-h%d: " % n + b"v" * 90 for n in range(300)),
             b"431 Request Header Fields Too Large")]:
        raw = await wait_for(ClientCreator(reactor, _Recorder).connectTCP(host, int(port)))
        raw.transport.write(head + b"\r\n\r\n")
        await wait_for(raw.closed, timeout=10)
        assert raw.received.startswith(b"HTTP/1.1 " + status), (len(head), raw.received)
        # Plain text, saying what it is.
        assert b"\r\nContent-Type: text/plain\r\n" in raw.received
        assert raw.received.endswith(b"\r\n\r\n" + status[4:] + b"\n"), raw.received
    assert sum(site.refusals["line_too_long"] for site in service.http_sites) == 5
    odd = await http(base, "/api/sessions?q=%00%0A%22%5C%E2%80%8F&sort=-peer&limit=0007")
    assert odd.status == 200 and odd.json["limit"] == 7 and odd.json["matched"] == 0
    assert (await http(base, "/api/status")).json["pages"]["sessions"]["total"] == 2


class _Recorder(Protocol):
    """What a raw connection receives, until it is closed."""

    def __init__(self) -> None:
        self.received = b""
        self.closed: defer.Deferred = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Any = None) -> None:
        self.closed.callback(None)


class _Quiet(Protocol):
    """A length32 WEBSMQ connection that says nothing: a session all the same."""


@pytest_twisted.ensureDeferred
async def test_a_status_poll_with_2000_sessions_stays_small(broker: Broker, capsys) -> None:
    service, addresses, base = await start(broker)
    host, port = addresses["websmq+length32"].split(":")[1:3]
    made = ClientCreator(reactor, _Quiet)
    # From four addresses (one may hold 1000 connections: [limits] connections), forty at a
    # time (the listening socket's backlog is 50).
    connections: list[Protocol] = []
    for batch in range(1, 51):
        connecting = [made.connectTCP(host, int(port), bindAddress=(f"127.0.0.{2 + n % 4}", 0))
                      for n in range(40)]
        connections += [await wait_for(each, timeout=30) for each in connecting]
        await eventually(lambda batch=batch: len(service.hub.sessions) == 40 * batch,
                         timeout=30)

    times = []
    sizes = set()
    for _ in range(20):
        started = time.perf_counter()
        answer = await http(base, "/api/status?limit=50&sessions.sort=-age&sessions.q=127")
        times.append(time.perf_counter() - started)
        sizes.add(len(answer.body))
        assert answer.status == 200
    status = answer.json
    assert len(status["sessions"]) == 50 and status["pages"]["sessions"]["total"] == 2000
    assert max(sizes) < 40_000  # fifty rows, not two thousand
    plain = [time.perf_counter()]
    for _ in range(20):
        await http(base, "/api/status")
        plain.append(time.perf_counter())
    with capsys.disabled():
        times.sort()
        steps = sorted(b - a for a, b in zip(plain, plain[1:], strict=False))
        print(f"\n/api/status at 2000 sessions: filtered, sorted, 50 rows: median "
              f"{times[10] * 1000:.1f} ms, slowest {times[-1] * 1000:.1f} ms, "
              f"{max(sizes)} bytes; default page of 100: median {steps[10] * 1000:.1f} ms")
    for connection in connections:
        connection.transport.abortConnection()
