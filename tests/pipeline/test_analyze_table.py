"""`wireproto analyze --table`: the analysis of a table `wireproto ingest` wrote, which decodes
nothing again, gives the same report numbers as the analysis of the capture files it was
ingested from.

The table is built here as ingest builds it: a real Spark streaming query,
``readStream.format("wirecapture")`` into Spark's Parquet file sink, partitioned by date, broker
and protocol, with `trigger(availableNow=True)`. The capture spans two brokers (one named ``7``,
which a table must keep a string, one with a character Spark escapes in a directory name), two
UTC dates, a connection of no known protocol (a null partition value), calls between the
brokers, batch records, malformed frames and requests that fail or are never answered.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import wireproto
from tests.pipeline.conftest import need_spark
from tests.support import starts_its_own_spark
from wireproto import capture
from wireproto.cluster.callcapture import encode_nats_message
from wireproto.codecs import nydus, subble, ubre, websmq
from wireproto.pipeline.analyze import TABLES, analyze, analyze_rows

# 2026-11-26 23:59:59 UTC: the records cross midnight into the 27th.
BEFORE_MIDNIGHT_NS = 1_795_737_599_000_000_000
STEP_NS = 7_000_000  # 7 ms between records
TEMP = "plant/temp"


def ticking(start: int) -> Callable[[], int]:
    moments = iter(range(start, start + 10**12, STEP_NS))
    return lambda: next(moments)


def write_broker(directory: Path, broker: str, start: int, first: int) -> None:
    """A broker's capture over several files, of every protocol and what goes wrong; its
    connections are numbered from `first` (ids are unique across a fleet)."""
    publisher, subscriber, requester, invoker, producer, stranger, peers = range(first, first + 7)
    with capture.CaptureWriter(directory / broker.replace(":", "_"), broker=broker,
                               clock=ticking(start), max_file_bytes=4096) as writer:
        writer.open_connection(publisher, "127.0.0.1:4000", "websmq", "length32")
        writer.open_connection(subscriber, "127.0.0.1:4001", "websmq", "length32")
        writer.open_connection(requester, "127.0.0.1:4002", "ubre", "ws")
        writer.open_connection(invoker, "127.0.0.1:4003", "nydus", "ws")
        writer.open_connection(producer, "127.0.0.1:4004", "subble", "ws")
        writer.open_connection(stranger, "127.0.0.1:4005", "mystery", "ws")  # no protocol code
        writer.open_connection(peers, "nats", "cluster", "nats")
        for number in range(40):
            # Readings that add up exactly in any order: quarters.
            frame = websmq.encode(websmq.Publish(TEMP, f"{number / 4}".encode()))
            writer.message(publisher, "in", frame, True)
            writer.message(subscriber, "out", capture.encode_batch([frame] * (1 + number % 3)),
                           True, batch=True)
            if number % 10 == 0:
                writer.message(publisher, "in", b"\x00\x09ab", True)  # truncated
            route = ("add", "boom", "slow")[number % 3]
            writer.message(requester, "in", ubre.encode(ubre.Request(number, {"a": number},
                                                             name=route)), False)
            if route == "add":
                writer.message(requester, "out", ubre.encode(ubre.Success(number, number)), False)
            elif route == "boom":
                writer.message(requester, "out", ubre.encode(ubre.Fail(number, {"m": "no"})), False)
            call = f"c{number}"
            writer.message(invoker, "in", nydus.encode(nydus.Invoke(
                call, "/sensors/a", {"n": number})).encode(), False)
            writer.message(invoker, "out", nydus.encode(nydus.Result(call, [number])).encode(),
                           False)
            if number % 4 == 0:
                payload = json.dumps({"n": number}).encode()
                writer.message(producer, "in", subble.encode(subble.ProduceEvent(
                    "p", subble.SerializationFormat.JSON, "reading", payload)), True)
                writer.message(producer, "out", subble.encode(subble.Event(
                    subble.MessageCode.CLIENT_EVENT, subble.SerializationFormat.JSON,
                    1_700_000_000_000 + number, "reading", f"g{number}", "p", payload)), True)
            writer.message(stranger, "in", b"who knows", True)
            inbox = f"_INBOX.{number}"
            if broker != "7":  # it calls 7, which answers
                writer.message(peers, "out", encode_nats_message(
                    "wireproto.call.ubre.add", inbox, None, b"[1, 2]"), True)
                writer.message(peers, "in", encode_nats_message(inbox, None, None, b"3"), True)
            else:
                writer.message(peers, "in", encode_nats_message(
                    "wireproto.call.ubre.add", inbox, None, b"[1, 2]"), True)
                writer.message(peers, "out", encode_nats_message(inbox, None, None, b"3"), True)
        for connection in range(first, first + 7):
            writer.close_connection(connection, "bye")


def write_fleet(directory: Path) -> None:
    write_broker(directory, "edge:a", BEFORE_MIDNIGHT_NS, 1)
    write_broker(directory, "7", BEFORE_MIDNIGHT_NS + 3_000_000, 101)


def ingest(spark: Any, captures: Path, table: Path) -> None:
    """The table `wireproto ingest --once` writes: its marker, then one streaming query."""
    from pyspark.sql import functions as F

    table.mkdir(parents=True)
    (table / "_wireproto_table.json").write_text(json.dumps({
        "format": "wireproto-table", "version": 1,
        "partitioned_by": ["date", "broker", "protocol"], "writer": "the tests"}))
    query = (spark.readStream.format("wirecapture").load(str(captures))
             .withColumn("date", F.to_date("timestamp"))
             .writeStream.format("parquet").partitionBy("date", "broker", "protocol")
             .option("path", str(table)).option("checkpointLocation", str(table / "_checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180), "the ingest query did not end"
    assert query.exception() is None, query.exception()


def rows_of(spark: Any, directory: str) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(row) for row in spark.read.parquet(directory).collect())


@pytest.mark.timeout(400)
def test_a_table_gives_the_report_numbers_of_its_captures(tmp_path: Path, spark: Any) -> None:
    captures, table = tmp_path / "captures", tmp_path / "table"
    write_fleet(captures)
    assert len(capture.capture_files(captures, recursive=True)) >= 4
    ingest(spark, captures, table)
    partitions = {path.relative_to(table).parts for path in table.glob("*/*/*") if path.is_dir()}
    assert {date for date, _, _ in partitions} == {"date=2026-11-26", "date=2026-11-27"}
    assert {broker for _, broker, _ in partitions} == {"broker=edge%3Aa", "broker=7"}
    assert "protocol=__HIVE_DEFAULT_PARTITION__" in {protocol for _, _, protocol in partitions}
    # A file the sink never committed (a batch that failed half way) is not the table's.
    committed = next(table.glob("date=*/broker=7/protocol=websmq/*.parquet"))
    shutil.copy(committed, committed.with_name("part-uncommitted.snappy.parquet"))

    from_captures = analyze(spark, str(captures), str(tmp_path / "a"))
    from_table = analyze(spark, None, str(tmp_path / "b"), table=str(table))

    def figures(summary: Any) -> dict[str, Any]:
        return {name: value for name, value in vars(summary).items()
                if name not in ("out", "tables", "report", "plots")}

    assert figures(from_table) == figures(from_captures)
    assert from_captures.brokers == 2 and from_captures.cluster_calls == 40
    assert from_captures.paired["ubre"] == 54 and from_captures.unpaired["ubre"] == 26
    # The truncated frames, and every message of no known protocol.
    assert from_captures.malformed == 8 + 80 == from_captures.counts["unknown"]["in"] + 8
    # Nothing decoded or copied again: the table is the messages table.
    assert from_table.tables["messages"] == str(table)
    assert not (tmp_path / "b" / "messages").exists()
    for name in TABLES[1:]:
        assert rows_of(spark, from_table.tables[name]) == \
            rows_of(spark, from_captures.tables[name]), name
    brokers = {row.broker for row in spark.read.parquet(from_table.tables["broker_rates"])
               .collect()}
    assert brokers == {"edge:a", "7"}

    def report(summary: Any) -> list[str]:
        return [line for line in Path(summary.report).read_text(encoding="utf-8").splitlines()
                if not line.startswith("- [`messages`](")]

    assert report(from_table) == [line.replace(str(tmp_path / "a"), str(tmp_path / "b"))
                                  for line in report(from_captures)]

    # Any selection of the rows is analysed the same way: here one broker's.
    from pyspark.sql import functions as F

    rows = spark.read.parquet(from_captures.tables["messages"])
    one = analyze_rows(rows.where(F.col("broker") == "7"), str(tmp_path / "c"))
    assert one.brokers == 1 and "messages" not in one.tables
    assert one.messages == rows.where(F.col("broker") == "7").count() < from_table.messages


def small_capture(directory: Path) -> None:
    """A WEBSMQ publish, a UBRE call that works and one that fails, from a broker whose
    name reads as a number."""
    with capture.CaptureWriter(directory, broker="7") as writer:
        writer.open_connection(1, "127.0.0.1:4000", "websmq", "length32")
        writer.message(1, "in", websmq.encode(websmq.Publish("t", b"1.5")), True)
        writer.open_connection(2, "127.0.0.1:4001", "ubre", "ws")
        writer.message(2, "in", ubre.encode(ubre.Request(1, {"a": 1}, name="add")), False)
        writer.message(2, "out", ubre.encode(ubre.Success(1, 2)), False)
        writer.message(2, "in", ubre.encode(ubre.Request(2, {}, name="boom")), False)
        writer.message(2, "out", ubre.encode(ubre.Fail(2, {"message": "no"})), False)
        writer.close_connection(1)
        writer.close_connection(2)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    return subprocess.run([sys.executable, "-m", "wireproto", "analyze", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@starts_its_own_spark
@pytest.mark.timeout(300)
def test_the_analyze_command_reads_a_table(tmp_path: Path, spark: Any) -> None:
    need_spark()
    captures, table, out = tmp_path / "captures", tmp_path / "table", tmp_path / "out"
    small_capture(captures)
    ingest(spark, captures, table)
    done = run_cli("--table", str(table), "--out", str(out), "--master", "local[2]",
                   timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wireproto: ubre requests: 2 paired, 0 unpaired" in done.stdout.splitlines()
    assert all(line.startswith("wireproto") for line in done.stdout.splitlines()), done.stdout
    assert all(line.startswith("wireproto analyze") for line in done.stderr.splitlines()), \
        done.stderr
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "| ubre | boom | 1 | 0 | 1 | 0 | 0 | - | - | - | - |" in report
    # The table is outside --out: the report links it where it is.
    assert f"- [`messages`]({Path(table).as_uri()})" in report.splitlines()
    assert not (out / "messages").exists() and (out / "rpc_latency_summary").is_dir()
    # The broker partition stays a string, though its only value reads as a number.
    (broker,) = spark.read.parquet(str(out / "broker_rates")).select("broker").distinct().collect()
    assert broker.broker == "7"


def test_table_usage_errors_come_before_spark(tmp_path: Path) -> None:
    captures, not_a_table = tmp_path / "captures", tmp_path / "plain"
    small_capture(captures)
    not_a_table.mkdir()
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "_wireproto_table.json").write_text(
        '{"format": "wireproto-table", "version": 99, "partitioned_by": []}')
    out = str(tmp_path / "out")
    for args, message in [
        ((str(captures), "--table", str(not_a_table)),
         "give CAPTURES (capture files) or --table TABLE, one of them"),
        ((), "give CAPTURES (capture files) or --table TABLE, one of them"),
        (("--table", str(not_a_table)),
         f"--table {not_a_table} is not a wireproto table (no _wireproto_table.json; "
         "wireproto ingest writes one)"),
        (("--table", str(tmp_path / "nowhere")),
         f"--table {tmp_path / 'nowhere'} is not a wireproto table (no "
         "_wireproto_table.json; wireproto ingest writes one)"),
        (("--table", str(newer)),
         f"--table {newer} is a version 99 wireproto table; this wireproto "
         f"({wireproto.__version__}) reads versions up to 1: upgrade it"),
        (("--table", str(not_a_table), "--follow"),
         "--follow reads capture files as they grow, not a --table"),
    ]:
        done = run_cli(*args, "--out", out)
        assert (done.returncode, done.stderr.splitlines()) == (
            2, [f"wireproto analyze: {message}"]), args
    assert not (tmp_path / "out").exists()
