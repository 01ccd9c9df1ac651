"""The `wirecapture` PySpark data source (issue 9, item 2, batch): real capture files, from a
real broker and from `capture.CaptureWriter`, read through Spark local[2]."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from tests.test_capture_broker import drive_capturing_broker
from wireproto import capture
from wireproto.codecs import ubre, websmq

TOPIC = "plant/line1/temp"
PUBLISHES = 9
REQUESTS = 4


def load(spark: Any, path: Path, **options: Any) -> Any:
    return spark.read.format("wirecapture").options(**options).load(str(path))


@pytest_twisted.ensureDeferred
async def test_a_broker_capture_read_through_spark(tmp_path: Path, spark: Any) -> None:
    directory = tmp_path / "capture"
    await drive_capturing_broker(
        directory, TOPIC, [b"%d.5" % number for number in range(PUBLISHES)],
        [(number, 10) for number in range(REQUESTS)])

    frame = load(spark, directory)
    rows = frame.collect()
    counts = Counter((row.protocol, row.transport, row.kind, row.message_type) for row in rows)
    assert counts == {
        ("websmq", "ws", "open", "open"): 1,
        ("websmq", "ws", "in", "subscribe"): 1,
        ("websmq", "ws", "out", "publish"): PUBLISHES,
        ("websmq", "ws", "close", "close"): 1,
        ("websmq", "length32", "open", "open"): 1,
        ("websmq", "length32", "in", "publish"): PUBLISHES,
        ("websmq", "length32", "close", "close"): 1,
        ("ubre", "ws", "open", "open"): 1,
        ("ubre", "ws", "in", "request"): REQUESTS,
        ("ubre", "ws", "out", "success"): REQUESTS,
        ("ubre", "ws", "close", "close"): 1,
    }
    assert all(row.decode_error is None for row in rows)
    assert len({row.connection for row in rows}) == 3
    # Spark's rows agree with the Python reader's, message for message.
    assert sorted((row.file, row.offset, row.message_index, bytes(row.data)) for row in rows) == (
        sorted((str(path.resolve()), record.offset, index, data)
               for path in capture.capture_files(directory)
               for record in capture.iter_records(path)
               for index, data in enumerate(record.messages())))

    websmq_rows = [row for row in rows if row.protocol == "websmq" and row.kind in ("in", "out")]
    assert {row.topic for row in websmq_rows} == {TOPIC}
    published = sorted(bytes(row.data) for row in websmq_rows if row.kind == "in"
                       and row.message_type == "publish")
    assert published == sorted(websmq.encode(websmq.Publish(TOPIC, b"%d.5" % number))
                               for number in range(PUBLISHES))
    assert {row.body_size for row in websmq_rows if row.message_type == "publish"} == {3}

    # Every UBRE request is paired with its reply by request_id, in Spark.
    messages = frame.where("protocol = 'ubre' and kind in ('in', 'out')")
    requests = messages.where("message_type = 'request'").selectExpr(
        "connection", "request_id", "topic as route", "timestamp as sent")
    replies = messages.where("message_type in ('success', 'fail')").selectExpr(
        "connection", "request_id", "message_type as outcome", "timestamp as answered",
        "data as reply")
    pairs = requests.join(replies, ["connection", "request_id"], "full_outer").collect()
    assert len(pairs) == REQUESTS
    assert len({pair.request_id for pair in pairs}) == REQUESTS
    for pair in pairs:
        assert pair.route == "add" and pair.outcome == "success"
        assert pair.sent <= pair.answered
        assert isinstance(ubre.decode_json(bytes(pair.reply)), ubre.Success)
    assert sorted(ubre.decode_json(bytes(pair.reply)).body for pair in pairs) == [
        number + 10 for number in range(REQUESTS)]


def write_capture(directory: Path, *, messages: int, max_file_bytes: int) -> None:
    clock = iter(range(1_700_000_000_000_000_000, 1_800_000_000_000_000_000, 1_000_000))
    with capture.CaptureWriter(directory, max_file_bytes=max_file_bytes,
                               clock=lambda: next(clock)) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "length32")
        writer.open_connection(2, "127.0.0.1:5001", "ubre", "ws")
        for number in range(messages):
            writer.message(1, "in", websmq.encode(websmq.Publish(f"t/{number % 3}",
                                                                 b"%06d" % number)), True)
            writer.message(2, "in", ubre.encode(ubre.Request(number, number, name="echo")), False)
        writer.close_connection(1, "bye")
        writer.close_connection(2, "bye")


def test_one_partition_per_capture_file(tmp_path: Path, spark: Any) -> None:
    write_capture(tmp_path, messages=300, max_file_bytes=4096)
    files = capture.capture_files(tmp_path)
    assert len(files) >= 4
    frame = load(spark, tmp_path, batch_size=50)  # several Arrow batches per file
    assert frame.rdd.getNumPartitions() == len(files)
    per_file = {row.file: row["count"] for row in frame.groupBy("file").count().collect()}
    assert per_file == {
        str(path.resolve()): sum(1 for _ in capture.iter_records(path)) for path in files}
    counts = {(row.kind, row.message_type): row["count"]
              for row in frame.groupBy("kind", "message_type").count().collect()}
    # Each file after the first repeats the open records of both connections.
    assert counts == {("open", "open"): 2 * len(files), ("in", "publish"): 300,
                      ("in", "request"): 300, ("close", "close"): 2}
    topics = {row.topic: row["count"] for row in frame.where("message_type = 'publish'")
              .groupBy("topic").count().collect()}
    assert topics == {"t/0": 100, "t/1": 100, "t/2": 100}
    # Timestamps keep the microseconds of the records' nanoseconds.
    first, last = frame.selectExpr("min(unix_micros(timestamp))", "max(unix_micros(timestamp))"
                                   ).first()
    stamps = [record.timestamp_ns for path in files for record in capture.iter_records(path)]
    assert (first, last) == (min(stamps) // 1000, max(stamps) // 1000)
    assert min(stamps) >= 1_700_000_000_000_000_000


def test_a_torn_last_record_and_malformed_frames(tmp_path: Path, spark: Any) -> None:
    with capture.CaptureWriter(tmp_path) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "ws")
        writer.message(1, "in", websmq.encode(websmq.Publish("a", b"1")), True)
        writer.message(1, "in", b"\x00\x07a", True)  # announces a 7-byte topic
        writer.message(1, "in", b"\x00\x02a#", True)  # a bad topic
        writer.open_connection(2, "127.0.0.1:5001", "ubre", "ws")
        writer.message(2, "in", b'{"request": "add", "id": 1', False)  # cut-off JSON
        writer.message(1, "in", websmq.encode(websmq.Publish("a", b"torn away")), True)
    (path,) = capture.capture_files(tmp_path)
    whole = os.path.getsize(path)
    with open(path, "r+b") as file:  # a crash in the middle of the last record
        file.truncate(whole - 5)
    assert sum(1 for _ in capture.iter_records(path)) == 6

    for target in (tmp_path, path):  # a directory, or one file
        rows = load(spark, target).orderBy("offset").collect()
        assert [(row.kind, row.message_type) for row in rows] == [
            ("open", "open"), ("in", "publish"), ("in", None), ("in", None), ("open", "open"),
            ("in", None)]
        errors = Counter((row.connection, row.decode_error.split(":")[0]) for row in rows
                         if row.decode_error)
        assert errors == {(1, "TruncatedFrame"): 1, (1, "InvalidTopic"): 1, (2, "BadJSON"): 1}


def test_a_missing_path_fails(tmp_path: Path, spark: Any) -> None:
    with pytest.raises(Exception, match="no capture file or directory"):
        load(spark, tmp_path / "nowhere").collect()


def test_a_batch_record_is_one_row_per_message(tmp_path: Path, spark: Any) -> None:
    publishes = [websmq.encode(websmq.Publish(f"t/{n}", b"x" * n)) for n in range(3)]
    with capture.CaptureWriter(tmp_path) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "length32")
        writer.message(1, "out", capture.encode_batch(publishes), True, batch=True)
        writer.message(1, "in", b"\x00\x00\x00\x09abc", True, batch=True)  # does not split
    rows = load(spark, tmp_path).orderBy("offset", "message_index").collect()
    assert [(row.kind, row.message_index, row.topic, row.body_size, row.data)
            for row in rows[:4]] == [
        ("open", 0, None, 0, rows[0].data),
        ("out", 0, "t/0", 0, publishes[0]), ("out", 1, "t/1", 1, publishes[1]),
        ("out", 2, "t/2", 2, publishes[2]),
    ]
    assert len({row.offset for row in rows[1:4]}) == 1
    assert rows[4].decode_error.startswith("CorruptCapture: batch record")
    assert len(rows) == 5


def test_rows_name_the_broker_that_wrote_their_file(tmp_path: Path, spark: Any) -> None:
    for name in ("edge-1", "edge-2"):
        with capture.CaptureWriter(tmp_path / name, broker=name) as writer:
            writer.open_connection(1, "127.0.0.1:5000", "websmq", "ws")
            writer.message(1, "in", websmq.encode(websmq.Publish("a", b"1")), True)
    frame = load(spark, tmp_path / "edge-1").unionByName(load(spark, tmp_path / "edge-2"))
    counts = {row.broker: row["count"] for row in frame.groupBy("broker").count().collect()}
    assert counts == {"edge-1": 2, "edge-2": 2}


def test_a_large_file_is_split_into_record_ranges_read_once_each(tmp_path: Path,
                                                                 spark: Any) -> None:
    with capture.CaptureWriter(tmp_path) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "ws")
        for number in range(6000):
            payload = str(number).encode() * 40
            writer.message(1, "in", websmq.encode(websmq.Publish(f"t/{number % 7}", payload)),
                           True)
    (path,) = capture.capture_files(tmp_path)
    with open(path, "ab") as file:  # a torn last record, as after a crash
        file.write(b"\x40\x00\x00\x00torn")
    size = os.path.getsize(path)
    assert size > 1 << 20
    ranges = capture.split_ranges(path, 256 << 10)
    assert len(ranges) >= 4 and ranges[0][0] is None and ranges[-1][1] is None
    assert all(earlier[1] == later[0]
               for earlier, later in zip(ranges, ranges[1:], strict=False))

    frame = (spark.read.format("wirecapture").option("maxPartitionBytes", 256 << 10)
             .load(str(tmp_path)))
    assert frame.rdd.getNumPartitions() == len(ranges)
    offsets = [row.offset for row in frame.select("offset").collect()]
    expected = [record.offset for record in capture.iter_records(path)]
    assert sorted(offsets) == expected  # every whole record once, the torn one not at all
    whole = spark.read.format("wirecapture").load(str(tmp_path))
    assert whole.rdd.getNumPartitions() == 1
    assert whole.count() == len(expected)


def test_split_bytes_follows_sparks_rule() -> None:
    import doctest

    from wireproto.pipeline import datasource

    assert datasource.split_bytes([1 << 30], 128 << 20, 4 << 20, 2) == 128 << 20
    assert datasource.split_bytes([10 << 20] * 4, 128 << 20, 4 << 20, 2) == 28 << 20
    assert datasource.split_bytes([100], 128 << 20, 4 << 20, 64) == 4 << 20  # never below it
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(datasource.split_bytes, "split_bytes"):
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def test_a_schema_given_to_the_reader_picks_columns(tmp_path: Path, spark: Any) -> None:
    write_capture(tmp_path, messages=40, max_file_bytes=capture.MIN_FILE_BYTES)
    whole = load(spark, tmp_path).select("offset", "message_index", "connection", "topic",
                                         "data").collect()
    some = (spark.read.format("wirecapture").schema("offset long, message_index int, "
                                                    "connection long, topic string")
            .load(str(tmp_path)))
    assert some.columns == ["offset", "message_index", "connection", "topic"]
    assert sorted(some.collect()) == sorted(row[:4] for row in whole)
    assert len(whole) > 40 * 2 + 4  # files after the first repeat the opens
    # A stream takes one too.
    query = (spark.readStream.format("wirecapture").schema("topic string, kind string")
             .load(str(tmp_path)).writeStream.format("memory").queryName("picked")
             .trigger(availableNow=True).start())
    query.awaitTermination(60)
    assert Counter(tuple(row) for row in spark.table("picked").collect()) == Counter(
        (row.topic, row.kind) for row in load(spark, tmp_path).collect())


@pytest.mark.parametrize(("schema", "refusal"), [
    ("topic string, peer string", "not distinct columns"),
    ("topic string, connection int", "column connection is int64, not int32"),
])
def test_a_schema_with_columns_the_source_lacks_is_refused(tmp_path: Path, spark: Any,
                                                           schema: str, refusal: str) -> None:
    write_capture(tmp_path, messages=2, max_file_bytes=capture.MIN_FILE_BYTES)
    with pytest.raises(Exception, match=refusal):
        spark.read.format("wirecapture").schema(schema).load(str(tmp_path)).collect()


def test_ranges_from_a_shipped_files_index_cover_it_once(tmp_path: Path) -> None:
    from wireproto.capture.storage import file_index

    write_capture(tmp_path, messages=3000, max_file_bytes=64 << 20)
    (path,) = capture.capture_files(tmp_path)
    every_record = [record.offset for record in capture.iter_records(path)]
    boundaries = json.loads(file_index(path))["boundaries"]
    assert boundaries == []  # smaller than the index's grain: nothing to split
    boundaries = [start for start, _ in capture.split_ranges(path, 20_000)[1:]]
    assert len(boundaries) > 10
    assert capture.ranges_from_boundaries([], 10) == [(None, None)]
    for target in (1, 50_000, 1 << 30):
        ranges = capture.ranges_from_boundaries(boundaries, target)
        read = [offset for start, end in ranges
                for offset in capture.read_batch(path, start_offset=start, available=end).offset]
        assert read == every_record, target  # each record once, in order
    assert capture.ranges_from_boundaries(boundaries, 1) == (
        [(None, boundaries[0])] + list(zip(boundaries, boundaries[1:], strict=False))
        + [(boundaries[-1], None)])
