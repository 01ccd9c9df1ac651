"""`GET /api/history`: the broker's figures each second over the last ten minutes, from the API's
start, bounded however long the broker runs.

Over real HTTP against a real broker; the ten thousand seconds of a long uptime run on
twisted's Clock (the real one cannot be hurried), with a real hub."""

from __future__ import annotations

import tracemalloc

import pytest_twisted
from twisted.internet.task import Clock

from tests.admin.http import http, start
from tests.brokers import Broker
from tests.support import eventually, wait_for
from wireproto import __version__
from wireproto.admin.history import KEPT, History, history_answer, merge_rows
from wireproto.hub import Hub, HubMessage


def published(points: list[dict]) -> float:
    return sum(point["published"] for point in points)


@pytest_twisted.ensureDeferred
async def test_history_has_a_point_a_second_with_what_passed(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    subscriber = await broker.client(addresses["websmq+ws"])
    await wait_for(subscriber.subscribe("charts", lambda message: None))
    publisher = await broker.client(addresses["websmq+length32"])
    for _ in range(7):
        await wait_for(publisher.publish("charts", b"x"))

    history = service.admin.history
    await eventually(lambda: sum(row[1] for row in history.rows()) == 7, timeout=10)
    answer = (await http(base, "/api/history")).json
    assert answer["interval"] == 1
    assert answer["nodes"] == [service.node]
    points = answer["points"]
    assert set(points[-1]) == {"time", "published", "delivered", "dropped", "connections"}
    times = [point["time"] for point in points]
    assert all(isinstance(time, int) for time in times)
    assert times == list(range(times[0], times[0] + len(times)))  # a point every second
    assert sum(point["delivered"] for point in points) == 7
    assert sum(point["dropped"] for point in points) == 0
    assert points[-1]["connections"] == 2
    assert (await http(base, "/api/history?scope=process")).json["interval"] == 1


@pytest_twisted.ensureDeferred
async def test_status_says_the_version(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    assert (await http(base, "/api/status")).json["broker"]["version"] == __version__


def test_a_long_uptime_keeps_ten_minutes_and_no_more() -> None:
    clock = Clock()
    clock.advance(1_700_000_000.25)
    hub = Hub()
    history = History(hub, clock)
    history.start()
    tracemalloc.start()
    try:
        for second in range(10_000):
            for _ in range(second % 3):
                hub.publish(HubMessage("t", b"x"))
            clock.advance(1)
            if second == 1_000:
                settled = tracemalloc.take_snapshot()
        grown = tracemalloc.take_snapshot().compare_to(settled, "filename")
    finally:
        tracemalloc.stop()
        history.stop()
    # All of it: a point is made by namedtuple's generated code, "<string>".
    growth = sum(stat.size_diff for stat in grown)
    assert growth < 16_384, grown[:5]
    rows = history.rows()
    assert len(rows) == KEPT
    now = 1_700_000_000 + 10_000
    assert [row[0] for row in rows] == list(range(now - KEPT + 1, now + 1))
    # Each second's point counts the publishes made in the second before it.
    assert [row[1] for row in rows[-3:]] == [(now - 1_700_000_000 - 3 + i) % 3 for i in range(3)]
    assert not clock.getDelayedCalls()  # stopped


def test_a_late_sample_gives_each_second_it_missed_a_share() -> None:
    clock = Clock()
    clock.advance(1000.5)
    hub = Hub()
    history = History(hub, clock)
    history.start()  # 1000: what the first point counts from
    clock.advance(0.5)  # 1001: a quiet second
    for _ in range(30):
        hub.publish(HubMessage("t", b"x"))
    # The reactor is busy for three seconds: the sample due at 1002 comes at 1004.2.
    (call,) = clock.getDelayedCalls()
    call.reset(3.2)
    clock.advance(3.2)
    rows = history.rows()
    assert [row[0] for row in rows] == [1001, 1002, 1003, 1004]
    assert [row[1] for row in rows] == [0, 10, 10, 10]
    history.stop()


def test_a_clock_set_back_starts_again_rather_than_keep_the_future() -> None:
    clock = Clock()
    clock.advance(5000)
    hub = Hub()
    history = History(hub, clock)
    history.sample(5000)
    history.sample(5001)
    history.sample(5002)
    assert len(history.rows()) == 2
    history.sample(4000)
    assert history.rows() == []
    history.sample(4001)
    clock.rightNow = 4001
    assert [row[0] for row in history.rows()] == [4001]


def test_the_processes_histories_are_summed_per_second() -> None:
    first = [[10, 1, 1, 0, 2], [11, 2, 2, 0, 2]]
    second = [[11, 5, 0, 1, 3], [12, 1, 1, 0, 3]]
    hostile = [[11, "x", 0, 0, 0], [True, 1, 1, 1, 1], [11, float("nan"), 0, 0, 0], "rows", None]
    merged = merge_rows([first, second, hostile, "not rows"])
    assert merged == [[10, 1, 1, 0, 2], [11, 7, 2, 1, 5], [12, 1, 1, 0, 3]]
    assert first == [[10, 1, 1, 0, 2], [11, 2, 2, 0, 2]]  # not changed by the sum
    points = history_answer(merged, ["a", "b"])["points"]
    assert points[1] == {"time": 11, "published": 7, "delivered": 2, "dropped": 1,
                         "connections": 5}
    many = [[[time, 1, 1, 1, 1] for time in range(start, start + KEPT)]
            for start in (0, 10_000)]
    assert len(merge_rows(many)) == KEPT
