"""The admin API of one process of a cluster shows and acts on every process: their
connections side by side, their topics summed, a connection on another process closed."""

from __future__ import annotations

import pytest_twisted

from tests.admin.http import base_of, http
from tests.cluster.test_link import cluster_broker
from tests.support import eventually, wait_for


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
    only_here = (await http(base, "/api/sessions?scope=process")).json
    assert [session["node"] for session in only_here] == [first.cluster.origin]

    far = by_node[second.cluster.origin]
    answer = await http(base, f"/api/sessions/{far['id']}/close?node={second.cluster.origin}", {})
    assert answer.status == 200 and answer.json == {"closed": far["id"]}
    await wait_for(there.when_closed())
    missing = await http(base, f"/api/sessions/{far['id']}/close?node={second.cluster.origin}", {})
    assert missing.status == 404
