"""The admin API of one process of a cluster shows and acts on every process: their
connections side by side, paged and sorted across processes, their topics summed, a connection
on another process closed."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any
from urllib.parse import quote

import pytest_twisted
from twisted.internet import defer, reactor

from tests.admin.http import base_of, http
from tests.admin.test_lists import in_order
from tests.brokers import LOCAL
from tests.cluster.processes import serve, stop
from tests.cluster.test_link import cluster_broker
from tests.support import eventually, sleep, wait_for
from wireproto.admin.listing import SESSIONS, TOPICS
from wireproto.protocols.websmq.client import connect


@pytest_twisted.ensureDeferred
async def test_the_api_of_one_process_shows_and_closes_the_connections_of_every_process(
    broker, nats,
) -> None:
    first, at_first = await cluster_broker(broker, nats)
    second, at_second = await cluster_broker(broker, nats)
    await eventually(lambda: first.cluster.roster.members() and second.cluster.roster.members(),
                     timeout=10)
    here = await broker.client(at_first["websmq+ws"])
    there = await broker.client(at_second["websmq+length32"])
    await wait_for(here.subscribe("shared", lambda message: None))
    await wait_for(there.subscribe("shared", lambda message: None))
    base = base_of(at_first["websmq+ws"])

    status = (await http(base, "/api/status")).json
    assert status["nodes"] == [first.cluster.origin, second.cluster.origin]
    by_node = {session["node"]: session for session in status["sessions"]}
    assert by_node[first.cluster.origin]["transport"] == "ws"
    assert by_node[second.cluster.origin]["transport"] == "length32"
    (shared,) = [topic for topic in status["topics"] if topic["topic"] == "shared"]
    assert shared["subscribers"] == 2
    only_here = (await http(base, "/api/sessions?scope=process")).json["items"]
    assert [session["node"] for session in only_here] == [first.cluster.origin]

    far = by_node[second.cluster.origin]
    answer = await http(base, f"/api/sessions/{far['id']}/close?node={second.cluster.origin}", {})
    assert answer.status == 200 and answer.json == {"closed": far["id"]}
    await wait_for(there.when_closed())
    missing = await http(base, f"/api/sessions/{far['id']}/close?node={second.cluster.origin}", {})
    assert missing.status == 404


# A WebSocket listener (the admin API's port) and WEBSMQ's wildcards, besides length32.
WEB = f"""
[websmq]
wildcards = true
[[listen]]
protocol = "websmq"
transport = "ws"
endpoint = "tcp:0:{LOCAL}"
"""


def web_address(served: Any) -> str:
    return next(re.search(r"on (ws://\S+)", line).group(1)
                for line in served.child.stdout if " over ws " in line)


@pytest_twisted.ensureDeferred
async def test_two_processes_lists_are_paged_sorted_and_counted_as_one(tmp_path, nats) -> None:
    processes = [await serve(tmp_path, name, nats.url, heartbeat=0.2, more=WEB)
                 for name in ("a", "b")]
    try:
        await lists_of_two(processes)
    finally:
        for served in processes:
            await stop(served)


@pytest_twisted.ensureDeferred
async def test_pages_by_age_neither_repeat_nor_lose_a_connection(tmp_path, nats) -> None:
    """Connections opened within milliseconds of each other on two processes: each process
    took its `now` when it answered, a few milliseconds apart and never by the same amount,
    so the order by age changed between two pages (a row shown twice, another never)."""
    processes = [await serve(tmp_path, name, nats.url, heartbeat=0.2, more=WEB)
                 for name in ("a", "b")]
    clients: list[Any] = []
    try:
        base = base_of(web_address(processes[0]))
        count = 60
        # Opened at once, half on each process, their open times interleaved.
        clients = await wait_for(defer.gatherResults([
            connect(reactor, processes[number % 2].address) for number in range(count)]), 20)

        async def page(query: str) -> dict[str, Any]:
            answer = await http(base, "/api/sessions" + query)
            assert answer.status == 200, answer.body
            return answer.json

        for _ in range(100):  # until both processes are in the roster
            if (await page("?limit=0"))["total"] == count:
                break
        assert (await page("?limit=0"))["total"] == count
        for sort in ("age", "-age") * 3:
            paged: list[tuple[str, int]] = []
            rows: list[dict[str, Any]] = []
            young_first = sort == "age"
            for offset in range(0, count, 7):
                items = (await page(f"?sort={sort}&limit=7&offset={offset}"))["items"]
                paged += [(row["node"], row["id"]) for row in items]
                rows += items
                # A page's ages agree with its order, counted from one moment.
                ages = [row["age"] for row in items]
                assert ages == sorted(ages, reverse=not young_first), sort
            assert len(paged) == len(set(paged)) == count, sort
            # In the order of their open times (wall clock, Unix seconds): youngest first by
            # age; ties by id, then process.
            opened = [(row["opened"], row["id"], row["node"]) for row in rows]
            assert opened == sorted(opened, key=lambda key: (-key[0] if young_first else key[0],
                                                             *key[1:])), sort
            now = time.time()
            assert all(now - 60 < row["opened"] <= now for row in rows), sort
    finally:
        for client in clients:
            await wait_for(client.disconnect(), 10)
        for served in processes:
            await stop(served)


@pytest_twisted.ensureDeferred
async def test_a_publish_from_the_api_says_its_deliveries_are_this_processs(
        tmp_path, nats) -> None:
    """A publish reaches the other processes over NATS, after the answer: `delivered` counts
    this process's subscribers, beside the topic's `subscribers` that count every process's,
    and `processes` says how many processes the message went to."""
    nydus = f"""
[[listen]]
protocol = "nydus"
transport = "engineio"
endpoint = "tcp:0:{LOCAL}"
"""
    processes = [await serve(tmp_path, name, nats.url, heartbeat=0.2, more=WEB + nydus)
                 for name in ("a", "b")]
    clients: list[Any] = []
    try:
        base = base_of(web_address(processes[0]))
        inboxes: list[list[Any]] = [[], [], []]
        for number, inbox in enumerate(inboxes):  # two here, one there
            client = await wait_for(connect(reactor, processes[number // 2].address), 10)
            await wait_for(client.subscribe("news", inbox.append))
            clients.append(client)

        async def subscribers() -> int:
            rows = (await http(base, "/api/topics?q=news")).json["items"]
            return rows[0]["subscribers"] if rows else 0

        for _ in range(100):  # until both processes are in the roster
            if await subscribers() == 3:
                break
        assert await subscribers() == 3
        answer = await http(base, "/api/publish", {"topic": "news", "payload": "one"})
        assert answer.json == {"delivered": 2, "processes": 2}
        await eventually(lambda: all(len(inbox) == 1 for inbox in inboxes), timeout=10)
        # nydus's /_hub/publish answers alike, from the page's Call form as from a client.
        answer = await http(base, "/api/call", {
            "protocol": "nydus", "name": "/_hub/publish",
            "body": {"path": "/news", "data": "two"}})
        assert answer.json == {"ok": True, "body": {"delivered": 2, "processes": 2}}
        await eventually(lambda: all(len(inbox) == 2 for inbox in inboxes), timeout=10)
        # The answering process alone: its deliveries are all there are.
        await stop(processes[1])
        for _ in range(100):  # until the roster has left it out
            answer = await http(base, "/api/publish", {"topic": "news", "payload": "three"})
            if answer.json["processes"] == 1:
                break
        assert answer.json == {"delivered": 2, "processes": 1}
    finally:
        for client in clients:
            await wait_for(client.disconnect(), 10)
        for served in processes:
            await stop(served)


async def lists_of_two(processes: list[Any]) -> None:
    first, second = processes
    base = base_of(web_address(first))
    clients = []
    # Client N is on process N % 2 and has published N messages: its `received`.
    for number in range(9):
        client = await wait_for(connect(reactor, processes[number % 2].address,
                                        wildcards=True), 10)
        await wait_for(client.subscribe(f"room/{number}"))
        await wait_for(client.subscribe("shared"))
        for _ in range(number):
            await wait_for(client.publish("noise", b"x"))
        clients.append(client)

    async def sessions(query: str = "") -> dict[str, Any]:
        answer = await http(base, "/api/sessions" + query)
        assert answer.status == 200, answer.body
        return answer.json

    async def both_answer() -> bool:
        listed = await sessions("?sort=-received")
        return listed["total"] == 9 and [row["received"] for row in listed["items"]] == list(
            range(8, -1, -1))

    for _ in range(100):  # until both processes are in the roster and have read everything
        if await both_answer():
            break
    assert await both_answer()
    every = (await sessions())["items"]
    nodes = {row["node"] for row in every}
    assert len(nodes) == 2
    key = [(row["id"], row["node"]) for row in every]  # ids repeat across processes
    assert key == sorted(key)

    # Sorted across the processes, then paged: the pages join into the whole, in order.
    top = (await sessions("?sort=-received&limit=3"))["items"]
    assert [row["received"] for row in top] == [8, 7, 6]
    assert {row["node"] for row in top} == nodes
    for sort in ("-received", "received", "id", "-id", "node", "-node", "transport", "age",
                 "-age"):
        whole = (await sessions(f"?sort={sort}"))["items"]
        paged = []
        for offset in range(0, 9, 2):
            page = await sessions(f"?sort={sort}&limit=2&offset={offset}")
            assert (page["total"], page["matched"], page["offset"]) == (9, 9, offset)
            paged += page["items"]
        key = [(row["node"], row["id"]) for row in whole]
        assert [(row["node"], row["id"]) for row in paged] == key, sort
    for field in SESSIONS.fields:
        for sort in (field, "-" + field):
            rows = (await sessions(f"?sort={sort}"))["items"]
            assert len(rows) == 9, sort
            ties = [(row[field], row["id"], row["node"]) for row in rows]
            shown = [(value is not None, value) for value, _, _ in ties]
            assert shown == sorted(shown, reverse=sort.startswith("-")), sort
            for one, other in zip(ties, ties[1:], strict=False):
                if one[0] == other[0]:
                    assert one[1:] < other[1:], (sort, ties)
    found = await sessions("?q=ROOM/4")
    assert [row["subscriptions"] for row in found["items"]] == [["room/4", "shared"]]
    assert (found["total"], found["matched"]) == (9, 1)

    # Topics: summed over the processes, each counted once in the totals.
    async def topics(query: str = "") -> dict[str, Any]:
        answer = await http(base, "/api/topics" + query)
        assert answer.status == 200, answer.body
        return answer.json

    every_topic = await topics("?q=room")
    assert [row["topic"] for row in every_topic["items"]] == [f"room/{n}" for n in range(9)]
    assert every_topic["matched"] == 9
    (shared,) = (await topics("?q=shared"))["items"]
    assert shared["subscribers"] == 9
    # A topic subscribed exactly on one process reaches the pattern subscribers of the other,
    # which has no row of its own for it.
    lone = await wait_for(connect(reactor, first.address, wildcards=True), 10)
    await wait_for(lone.subscribe("sensors/humidity"))
    wide = await wait_for(connect(reactor, second.address, wildcards=True), 10)
    await wait_for(wide.subscribe("#"))
    await wait_for(wide.subscribe("sensors/+"))
    level = await wait_for(connect(reactor, second.address, wildcards=True), 10)
    await wait_for(level.subscribe("sensors/+"))

    async def humidity() -> int:
        rows = (await topics("?q=" + quote("sensors/humidity", safe="")))["items"]
        return rows[0]["subscribers"] if rows else 0

    for _ in range(100):
        if await humidity() == 3:
            break
    assert await humidity() == 3
    # "noise" is listed while it was published on lately (its rate's 2 s): the topics are
    # counted once it is not, so that their total holds still for the status below.
    for _ in range(100):
        if not (await topics("?q=noise&limit=0"))["matched"]:
            break
        await sleep(0.1)
    counted = await topics()
    names = [row["topic"] for row in counted["items"]]
    assert len(names) == len(set(names)) == counted["total"] == counted["matched"]
    assert {"#", "sensors/+", "sensors/humidity", "shared"} <= set(names)
    assert {row["topic"]: row["subscribers"] for row in counted["items"]}["sensors/+"] == 2
    # The `#` of the second process reaches every topic but the broker's own.
    by_count = (await topics("?sort=-subscribers&limit=2"))["items"]
    assert [(row["topic"], row["subscribers"]) for row in by_count] == [("shared", 10),
                                                                        ("sensors/humidity", 3)]
    assert {row["subscribers"] for row in (await topics("?q=room"))["items"]} == {2}
    for field in TOPICS.fields:
        for sort in (field, "-" + field):
            rows = (await topics(f"?sort={sort}"))["items"]
            assert in_order(rows, field, sort.startswith("-"), "topic"), (sort, rows)

    # The status: both lists as pages, with the cluster's counts.
    status = (await http(base, "/api/status?limit=4&topics.q=room&sessions.sort=-received")
              ).json
    assert [row["received"] for row in status["sessions"]] == [8, 7, 6, 5]
    assert status["pages"]["sessions"] == {"total": 12, "matched": 12, "offset": 0, "limit": 4}
    assert [row["topic"] for row in status["topics"]] == [f"room/{n}" for n in range(4)]
    assert status["pages"]["topics"]["matched"] == 9
    assert status["pages"]["topics"]["total"] == counted["total"]
    assert len(status["nodes"]) == 2

    # A process that does not answer (paused) is left out after a second: the page is the
    # other's rows, in order, and says so in its counts.
    os.kill(second.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        alone = await sessions("?sort=-received&limit=3")
        waited = time.monotonic() - started
    finally:
        os.kill(second.pid, signal.SIGCONT)
    assert 0.5 < waited < 5
    first_node = next(row["node"] for row in every if row["received"] == 8)
    assert {row["node"] for row in alone["items"]} == {first_node}
    assert [row["received"] for row in alone["items"]] == [8, 6, 4]
    assert alone["total"] == 6  # five clients and `lone`
    for client in clients + [lone, wide, level]:
        await wait_for(client.disconnect(), 10)
