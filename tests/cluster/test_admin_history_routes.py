"""The admin API of one process of a cluster lists and calls what every process answers, and
sums every process's history: processes of this test joined through a real nats-server, and
the workers of a real `wireproto serve --workers 2 --app`."""

from __future__ import annotations

import pytest_twisted
from twisted.internet import reactor

from tests.admin.http import base_of, http
from tests.brokers import LOCAL, Broker
from tests.cluster.test_app_workers import stop, supervised, write_app
from tests.cluster.test_calls import cluster_table, serving
from tests.support import eventually, sleep, wait_for
from tests.test_app import LISTENERS, addresses
from wireproto.protocols.ubre.client import connect as ubre_connect


async def process(broker: Broker, nats) -> tuple:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", f"ubre+lines@tcp:0:{LOCAL}", f"nydus+lines@tcp:0:{LOCAL}",
        cluster=cluster_table(nats))
    await wait_for(service.cluster.when_ready(), 10)
    return service, base_of(bound[0].address)


@pytest_twisted.ensureDeferred
async def test_routes_of_every_process_are_listed_and_answer_from_any(broker, nats) -> None:
    first, base = await process(broker, nats)
    second, _ = await process(broker, nats)
    first.server("ubre").handle("near", lambda body, caller: "near")
    second.server("ubre").handle("far", lambda body, caller: ["far", body])
    second.server("nydus").register_route("/far/:thing", lambda call: call.params["thing"])
    await serving(first, second)

    routes = (await http(base, "/api/routes")).json
    assert routes == {"ubre": ["far", "near"], "nydus": ["/_hub/publish", "/far/:thing"]}
    answers = {
        "far": await http(base, "/api/call", {"protocol": "ubre", "name": "far", "body": 1}),
        "near": await http(base, "/api/call", {"protocol": "ubre", "name": "near"}),
        "/far/x": await http(base, "/api/call", {"protocol": "nydus", "name": "/far/x"}),
        "/_hub/publish": await http(base, "/api/call", {
            "protocol": "nydus", "name": "/_hub/publish", "body": {"path": "/t", "data": 1}}),
    }
    assert {name: answer.json for name, answer in answers.items()} == {
        "far": {"ok": True, "body": ["far", 1]},
        "near": {"ok": True, "body": "near"},
        "/far/x": {"ok": True, "body": "x"},
        "/_hub/publish": {"ok": True, "body": {"delivered": 0, "processes": 2}},
    }
    assert second.cluster.calls.answered == 2


@pytest_twisted.ensureDeferred
async def test_history_sums_every_process_per_second(broker, nats) -> None:
    first, base = await process(broker, nats)
    second, _ = await process(broker, nats)
    await eventually(lambda: first.cluster.roster.members() and second.cluster.roster.members(),
                     timeout=10)
    for service, count in ((first, 3), (second, 5)):
        ubre = service.server("ubre")
        for _ in range(count):
            ubre.publish("history/only-here", "x")

    def published(service) -> float:
        return sum(row[1] for row in service.admin.history.rows())

    # Each process's own publishes, and those the other forwarded to it: none has a subscriber.
    await eventually(lambda: published(first) == 3 and published(second) == 5, timeout=10)
    whole = (await http(base, "/api/history")).json
    assert sum(point["published"] for point in whole["points"]) == 8
    # It names the processes it sums, so that a reader can tell a history one left out.
    assert sorted(whole["nodes"]) == sorted([first.cluster.origin, second.cluster.origin])
    times = [point["time"] for point in whole["points"]]
    assert times == sorted(set(times))
    alone = (await http(base, "/api/history?scope=process")).json
    assert sum(point["published"] for point in alone["points"]) == 3
    assert alone["nodes"] == [first.cluster.origin]


@pytest_twisted.ensureDeferred
async def test_under_workers_every_listed_route_answers_from_the_api(tmp_path) -> None:
    # `wireproto serve --workers 2 --app`: each worker serves routes of its own, and a request
    # to the API lands on either.
    child, _ = await supervised("--app", "myapp:setup", *LISTENERS, cwd=write_app(tmp_path))
    try:
        base = base_of(addresses(child)["ubre"])
        expected = {"ubre": ["first", "node"],
                    "nydus": ["/_hub/publish", "/first/:thing", "/here", "/node"]}

        async def listed() -> dict:
            return (await http(base, "/api/routes")).json

        for _attempt in range(100):  # until both workers have heard the other's
            if [await listed() for _ in range(2)] == [expected, expected]:
                break
            await sleep(0.1)
        assert [await listed() for _ in range(4)] == [expected] * 4
        examples = {"/first/:thing": "/first/x"}
        for protocol, names in expected.items():
            for name in names:
                body = {"path": "/t", "data": 1} if name == "/_hub/publish" else None
                answer = await http(base, "/api/call", {
                    "protocol": protocol, "name": examples.get(name, name), "body": body})
                assert answer.status == 200 and answer.json["ok"] is True, (name, answer.json)

        publisher = await wait_for(ubre_connect(reactor, addresses(child)["ubre"]), 10)
        try:
            for _ in range(4):
                publisher.publish("history/t", "x")
            total = 0.0
            for _attempt in range(100):
                points = (await http(base, "/api/history")).json["points"]
                total = sum(point["published"] for point in points)
                if total >= 5:  # the four, and the /_hub/publish
                    break
                await sleep(0.2)
            assert total == 5
        finally:
            await wait_for(publisher.close(), 10)
    finally:
        await stop(child)
