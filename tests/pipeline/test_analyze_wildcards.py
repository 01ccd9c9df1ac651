"""A WEBSMQ pattern subscription (`plant/#`) is what its listener made of it: a broker records in
each connection's open record whether its listener takes wildcards, and the rows read a pattern
subscription on such a connection as a subscription, on a listener without wildcards (or in a
capture whose open records do not say) as malformed, as the broker refused it; also for a task
that starts in the middle of a file, after the connection's open record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.pipeline.conftest import need_spark
from tests.support import eventually, wait_for
from tests.test_capture_broker import LOCAL, records_in, start
from wireproto import capture
from wireproto.codecs import websmq
from wireproto.config import CaptureSettings, Config, parse_listen
from wireproto.protocols.websmq.client import connect as websmq_connect
from wireproto.protocols.websmq.server import WebsmqSettings

PATTERN = "plant/#"


# -- wildcard subscriptions -------------------------------------------------------------------


def wildcard_capture(directory: Path) -> dict[int, str]:
    """Three WEBSMQ connections subscribing to PATTERN: one whose listener takes wildcards, one
    whose listener does not, and one recorded before open records said (no key)."""
    subscribe = websmq.encode_header(websmq.MessageType.SUBSCRIBE, len(PATTERN)) + \
        PATTERN.encode()
    unsubscribe = websmq.encode_header(websmq.MessageType.UNSUBSCRIBE, len(PATTERN)) + \
        PATTERN.encode()
    writer = capture.CaptureWriter(directory)
    listeners: dict[int, dict[str, bool]] = {1: {"wildcards": True}, 2: {"wildcards": False},
                                             3: {}}
    for connection, listener in listeners.items():
        writer.open_connection(connection, f"127.0.0.1:{4000 + connection}", "websmq",
                               "length32", **listener)
    # Enough publishes between the opens and the subscriptions for a reader to start between.
    for number in range(2000):
        writer.message(1, "in", websmq.encode(websmq.Publish("plant/temp", b"%d" % number)),
                       True)
    for connection in listeners:
        writer.message(connection, "in", subscribe, True)
    writer.message(1, "in", unsubscribe, True)
    writer.close()
    return {1: "wildcards", 2: "no wildcards", 3: "written before the key"}


def pattern_rows(rows: list[dict[str, Any]]) -> dict[int, list[tuple[Any, ...]]]:
    found: dict[int, list[tuple[Any, ...]]] = {}
    for row in rows:
        if row["kind"] == "in" and row["message_type"] != "publish":
            found.setdefault(row["connection"], []).append(
                (row["message_type"], row["topic"], (row["decode_error"] or "").split(":")[0]))
    return found


EXPECTED = {
    1: [("subscribe", PATTERN, ""), ("unsubscribe", PATTERN, "")],
    2: [(None, None, "InvalidTopic")],
    3: [(None, None, "InvalidTopic")],
}


def test_a_pattern_subscription_is_malformed_only_where_wildcards_are_off(
        tmp_path: Path) -> None:
    need_spark()  # the data source's reader, run here without a session
    from wireproto.pipeline.datasource import WireCaptureReader

    wildcard_capture(tmp_path)
    (path,) = capture.capture_files(tmp_path)
    reader = WireCaptureReader({"path": str(path), "batch_size": "100"})
    whole = [row for batch in reader._read_file(str(path), None, None)
             for row in batch.to_pylist()]
    assert pattern_rows(whole) == EXPECTED
    # A reader of the file's second half, after every open record, reads them the same.
    ranges = capture.split_ranges(path, path.stat().st_size // 2)
    assert len(ranges) == 2 and ranges[1][0] is not None
    second = [row for batch in reader._read_file(str(path), *ranges[1])
              for row in batch.to_pylist()]
    assert pattern_rows(second) == EXPECTED


@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("wildcards", [True, False])
async def test_a_broker_records_whether_its_listeners_take_wildcards(
        tmp_path: Path, wildcards: bool) -> None:
    need_spark()
    from wireproto.pipeline.datasource import WireCaptureReader

    config = Config(
        listeners=(parse_listen(f"websmq+length32@tcp:0:{LOCAL}"),
                   parse_listen(f"ubre+ws@tcp:0:{LOCAL}")),
        websmq=WebsmqSettings(wildcards=wildcards),
        capture=CaptureSettings(directory=str(tmp_path), flush_interval=0.05),
    )
    service, (address, _) = await start(config)
    subscribe = websmq.encode_header(websmq.MessageType.SUBSCRIBE, len(PATTERN)) + \
        PATTERN.encode()
    try:
        client = await wait_for(websmq_connect(reactor, address, wildcards=True))
        heard: list[Any] = []
        client.subscribe(PATTERN, heard.append)
        if wildcards:  # the broker takes it: a publish below the pattern reaches the client
            publisher = await wait_for(websmq_connect(reactor, address))
            await eventually(lambda: publisher.publish("plant/temp", b"1") or heard)
            await wait_for(publisher.disconnect())
            await wait_for(client.disconnect())
        else:  # the broker refuses the pattern, closing the connection
            await eventually(lambda: not client.connected)
    finally:
        await wait_for(service.stopService(), timeout=10)
    opens = [json.loads(record.data) for record in records_in(tmp_path)
             if record.kind == capture.Kind.OPEN]
    assert opens and all(info["wildcards"] is wildcards for info in opens), opens
    rows = [row for path in capture.capture_files(tmp_path)
            for batch in WireCaptureReader({"path": str(path)})._read_file(str(path), None, None)
            for row in batch.to_pylist()]
    (subscription,) = [row for row in rows if row["kind"] == "in" and row["data"] == subscribe]
    assert (subscription["message_type"], subscription["topic"]) == (
        ("subscribe", PATTERN) if wildcards else (None, None))
    assert (subscription["decode_error"] is None) is wildcards
    assert wildcards or subscription["decode_error"].startswith("InvalidTopic")
