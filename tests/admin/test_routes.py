"""What the Call form may call: `GET /api/routes` lists the UBRE request names and nydus routes
the broker answers, its own hub routes included, and each one listed answers `POST /api/call`."""

from __future__ import annotations

import re
from typing import Any

import pytest_twisted
from twisted.internet import reactor

from tests.admin.http import http, start
from tests.brokers import Broker
from tests.support import Inbox, wait_for
from wireproto.protocols.nydus.client import connect as nydus_connect


@pytest_twisted.ensureDeferred
async def test_the_hub_publish_route_works_from_the_api_as_from_a_client(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    subscriber = await broker.client(addresses["websmq+length32"])
    inbox = Inbox()
    await wait_for(subscriber.subscribe("chat/room", inbox))

    answer = await http(base, "/api/call", {
        "protocol": "nydus", "name": "/_hub/publish",
        "body": {"path": "/chat/room", "data": {"text": "hi"}}})
    assert answer.status == 200
    assert answer.json == {"ok": True, "body": {"delivered": 1, "processes": 1}}
    (message,) = await inbox.wait()
    assert message.payload == b'{"text":"hi"}'

    # As a nydus client gets it, with the same answer.
    client = await wait_for(nydus_connect(reactor, addresses["nydus+engineio"]))
    try:
        result = await wait_for(client.invoke("/_hub/publish",
                                              {"path": "/chat/room", "data": 2}))
    finally:
        await wait_for(client.close())
    assert result == {"delivered": 1, "processes": 1}
    first, second = await inbox.wait(2)
    assert second.payload == b"2"


@pytest_twisted.ensureDeferred
async def test_the_hub_publish_route_from_the_api_keeps_off_the_brokers_own_topics(
    broker: Broker,
) -> None:
    service, addresses, base = await start(broker)
    for body, status in [({"path": "/$SYS/broker/uptime", "data": 1}, 403),
                         ({"path": "no-slash", "data": 1}, 400),
                         ({"data": 1}, 400),
                         ("/chat/room", 400)]:
        answer = await http(base, "/api/call",
                            {"protocol": "nydus", "name": "/_hub/publish", "body": body})
        assert answer.status == 200, body
        assert answer.json["ok"] is False and answer.json["body"]["status"] == status, body
    assert service.hub.stats.published == 0
    # The admin has no connection to subscribe: said so, not a handler's crash.
    for route in ("/_hub/subscribe", "/_hub/unsubscribe"):
        answer = await http(base, "/api/call",
                            {"protocol": "nydus", "name": route, "body": "/chat/room"})
        assert answer.json["ok"] is False, route
        assert answer.json["body"]["status"] == 400, route
        assert "connection" in answer.json["body"]["message"], route
@pytest_twisted.ensureDeferred
async def test_routes_lists_what_the_broker_answers_and_each_one_answers(
    broker: Broker,
) -> None:
    service, addresses, base = await start(broker)
    ubre = service.server("ubre")
    ubre.handle("add", lambda body, caller: sum(body))
    ubre.handle("echo", lambda body, caller: body)
    nydus = service.server("nydus")
    nydus.register_route("/double/:n", lambda call: int(call.params["n"]) * 2)
    nydus.register_route("/files/*", lambda call: call.splats)
    nydus.register_route(re.compile(r"^/re/(\d+)$"), lambda call: call.splats)

    routes = (await http(base, "/api/routes")).json
    assert routes == {
        "ubre": ["add", "echo"],
        "nydus": ["/_hub/publish", "/double/:n", "/files/*", r"^/re/(\d+)$"],
    }
    calls: list[tuple[str, str, Any, Any]] = [
        ("ubre", "add", [1, 2], 3),
        ("ubre", "echo", "x", "x"),
        ("nydus", "/_hub/publish", {"path": "/a", "data": 1},
         {"delivered": 0, "processes": 1}),
        ("nydus", "/double/21", None, 42),
        ("nydus", "/files/a/b", None, ["a/b"]),
        ("nydus", "/re/7", None, ["7"]),
    ]
    for protocol, name, body, expected in calls:
        answer = await http(base, "/api/call",
                            {"protocol": protocol, "name": name, "body": body})
        assert answer.json == {"ok": True, "body": expected}, name


@pytest_twisted.ensureDeferred
async def test_routes_of_a_broker_that_serves_no_calls_are_empty(broker: Broker) -> None:
    service, addresses, base = await start(broker, "websmq+ws@tcp:0:interface=127.0.0.1")
    assert (await http(base, "/api/routes")).json == {"ubre": [], "nydus": []}
