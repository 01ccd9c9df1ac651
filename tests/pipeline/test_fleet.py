"""A fleet's captures analysed together (issue 22): two brokers in a cluster on a real
nats-server, each capturing to its own directory; a client of one calls a handler on the other.
`wireproto analyze` over the fleet's directory gives each broker's rates and pairs every call
across the two captures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import reactor

from tests.brokers import LOCAL, Broker
from tests.cluster.conftest import nats  # noqa: F401 - the fixture
from tests.support import failure_of, wait_for
from wireproto import capture
from wireproto.cluster.settings import ClusterSettings
from wireproto.config import CaptureSettings
from wireproto.pipeline.analyze import analyze
from wireproto.protocols.rpc import RequestFailed
from wireproto.protocols.ubre.client import connect as ubre_connect

CALLS = 5


async def fleet_broker(broker: Broker, server: Any, directory: Path, node: str) -> tuple:
    service, (bound,) = await broker.start(
        f"ubre+lines@tcp:0:{LOCAL}",
        cluster=ClusterSettings(url=server.url, node=node, heartbeat_interval=0.2, lease=1.0),
        capture=CaptureSettings(directory=str(directory / node), flush_interval=0.05))
    await wait_for(service.cluster.when_ready(), 10)
    return service, bound.address


@pytest_twisted.ensureDeferred
async def test_a_fleets_captures_give_broker_rates_and_calls_paired_across_brokers(
        tmp_path: Path, broker: Broker, nats: Any, spark: Any) -> None:  # noqa: F811
    from tests.cluster.test_calls import serving

    fleet = tmp_path / "fleet"
    answering, _ = await fleet_broker(broker, nats, fleet, "edge-a")
    calling, address = await fleet_broker(broker, nats, fleet, "edge-b")
    answering.server("ubre").handle("add", lambda numbers, peer: sum(numbers))
    await serving(answering, calling)
    client = await wait_for(ubre_connect(reactor, address))
    try:
        for number in range(CALLS):
            assert await wait_for(client.request("add", [number, 1])) == number + 1
        missing = await failure_of(client.request("missing", [1]))
        assert isinstance(missing, RequestFailed) and missing.body == "NotFound"
    finally:
        await wait_for(client.close())
    for service in (calling, answering):
        await wait_for(service.stopService(), timeout=10)
    # Each broker wrote its own directory; its cluster calls are one connection of its capture.
    for node in ("edge-a", "edge-b"):
        (path,) = capture.capture_files(fleet / node)
        assert capture.read_header(path).info["broker"] == node

    summary = analyze(spark, fleet, tmp_path / "out")

    assert summary.brokers == 2
    assert summary.cluster_calls == CALLS + 1
    calls = spark.read.parquet(summary.tables["cluster_calls"]).collect()
    replied = [call for call in calls if call.outcome == "reply"]
    assert len(replied) == CALLS
    for call in replied:
        assert (call.caller, call.answerer) == ("edge-b", "edge-a")
        assert call.route.endswith(".call.ubre.add")
        assert call.round_trip_ms >= call.handled_ms >= 0
        assert call.transit_ms == call.round_trip_ms - call.handled_ms
    (refused,) = [call for call in calls if call.outcome != "reply"]
    assert (refused.outcome, refused.caller, refused.answerer) == ("refused", "edge-b", None)
    assert refused.route.endswith(".call.ubre.missing")

    rates = {(row.broker, row.protocol): row
             for row in spark.read.parquet(summary.tables["broker_rates"]).collect()}
    assert rates["edge-b", "ubre"].messages_in == CALLS + 1  # the client's requests
    assert rates["edge-b", "ubre"].messages_out == CALLS + 1  # and their answers
    assert rates["edge-b", "ubre"].connections == 1
    assert (rates["edge-b", "cluster"].messages_out, rates["edge-b", "cluster"].messages_in) \
        == (CALLS + 1, CALLS + 1)  # the calls made, their replies and the no-responders
    assert (rates["edge-a", "cluster"].messages_in, rates["edge-a", "cluster"].messages_out) \
        == (CALLS, CALLS)
    assert ("edge-a", "ubre") not in rates or rates["edge-a", "ubre"].messages_in == 0

    report = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "## Brokers" in report and "| **fleet** |" in report
    assert "## Calls between brokers" in report
    assert any(line.startswith("| edge-b | edge-a | ") and line.split(" | ")[3] == str(CALLS)
               for line in report.splitlines()), report
    assert "brokers: 2; calls between them: 6" in summary.lines()
