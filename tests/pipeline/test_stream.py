"""The `wirecapture` streaming reader: offsets at record boundaries, a half-written last record
left for a later micro-batch, read limits, trigger(availableNow=True) and a restart from a
checkpoint. Real capture files (capture.CaptureWriter) read through Spark local[2]."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support import need_module
from wireproto import capture
from wireproto.codecs import websmq

need_module("pyspark", "pip install -e '.[spark]'")

from pyspark.sql.streaming.datasource import ReadAllAvailable  # noqa: E402

from wireproto.pipeline.datasource import WireCaptureStreamReader  # noqa: E402

START_NS = 1_700_000_000_000_000_000


def ticking(start: int = START_NS, step: int = 1_000_000) -> Any:
    clock = iter(range(start, start + 10**15, step))
    return lambda: next(clock)


def publish(number: int) -> bytes:
    return websmq.encode(websmq.Publish(f"t/{number % 3}", b"%06d" % number))


def write_messages(writer: capture.CaptureWriter, numbers: range) -> None:
    for number in numbers:
        writer.message(1, "in", publish(number), True)


def record_keys(directory: Path) -> set[tuple[str, int]]:
    """(file, offset) of every whole record in the directory, as the batch reader sees them."""
    return {(str(path.resolve()), record.offset)
            for path in capture.capture_files(directory) for record in capture.iter_records(path)}


class Batches:
    """A foreachBatch sink: each micro-batch's (file, offset, message_index) rows, by batch id.
    Spark calls it from its own thread."""

    def __init__(self) -> None:
        self.rows: dict[int, list[tuple[str, int, int]]] = {}
        self.lock = threading.Lock()

    def __call__(self, frame: Any, batch_id: int) -> None:
        rows = [(row.file, row.offset, row.message_index)
                for row in frame.select("file", "offset", "message_index").collect()]
        with self.lock:
            self.rows[batch_id] = rows

    def all_rows(self) -> list[tuple[str, int, int]]:
        return [row for rows in self.rows.values() for row in rows]


def run_available_now(spark: Any, directory: Path, checkpoint: Path, sink: Batches,
                      **options: Any) -> Any:
    query = (spark.readStream.format("wirecapture").options(**options).load(str(directory))
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(60)
    assert not query.isActive, "the availableNow query did not finish"
    assert query.exception() is None
    return query


# -- the reader's units, without a JVM -------------------------------------------------------------


def test_offsets_stop_before_a_half_written_record_and_a_half_written_header(
        tmp_path: Path) -> None:
    with capture.CaptureWriter(tmp_path, clock=ticking()) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "length32")
        write_messages(writer, range(5))
    (path,) = capture.capture_files(tmp_path)
    whole = path.read_bytes()
    starts = capture.scan_offsets(path).starts
    path.write_bytes(whole[:-4])  # the last record is still being written
    name = str(path.resolve())

    reader = WireCaptureStreamReader({"path": str(tmp_path)})
    assert reader.initialOffset() == {}
    first = reader.latestOffset({}, reader.getDefaultReadLimit())
    assert first == {name: starts[-1]}  # the boundary before the torn record
    (partition,) = reader.partitions({}, first)
    rows = [row for batch in reader.read(partition) for row in batch.to_pylist()]
    assert [row["offset"] for row in rows] == starts[:-1]

    # A new rotated file with only part of its header: not read yet, not in the offset.
    later = tmp_path / path.name.replace("-000001.", "-000002.")
    later.write_bytes(whole[:10])
    assert reader.latestOffset(first, reader.getDefaultReadLimit()) == first
    assert reader.partitions(first, first) == []

    path.write_bytes(whole)  # the writer finished both
    later.write_bytes(whole)
    second = reader.latestOffset(first, reader.getDefaultReadLimit())
    assert second == {name: len(whole), str(later.resolve()): len(whole)}
    partitions = reader.partitions(first, second)
    assert [(p.start, p.end) for p in partitions] == [(starts[-1], len(whole)), (None, len(whole))]
    rows = [row for p in partitions for batch in reader.read(p) for row in batch.to_pylist()]
    assert [(row["file"], row["offset"]) for row in rows] == (
        [(name, starts[-1])] + [(str(later.resolve()), start) for start in starts])


def test_read_limits_cap_each_offset(tmp_path: Path) -> None:
    with capture.CaptureWriter(tmp_path, clock=ticking(), max_file_bytes=4096) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "length32")
        write_messages(writer, range(200))
    files = capture.capture_files(tmp_path)
    assert len(files) >= 3
    reader = WireCaptureStreamReader({"path": str(tmp_path), "maxRecordsPerTrigger": "30"})
    offset: dict[str, int] = {}
    read = 0
    for _ in range(100):
        latest = reader.latestOffset(offset, reader.getDefaultReadLimit())
        if latest == offset:
            break
        count = sum(len(batch) for p in reader.partitions(offset, latest)
                    for batch in reader.read(p))
        assert 0 < count <= 30
        read += count
        offset = latest
    assert read == len(record_keys(tmp_path))

    by_file = WireCaptureStreamReader({"path": str(tmp_path), "maxFilesPerTrigger": "2"})
    latest = by_file.latestOffset({}, by_file.getDefaultReadLimit())
    assert sorted(latest) == [str(path.resolve()) for path in files[:2]]
    # ReadAllAvailable (what Spark asks for some triggers) ignores the options.
    everything = by_file.latestOffset({}, ReadAllAvailable())
    assert sorted(everything) == [str(path.resolve()) for path in files]
    for text in ("0", "-3", "many"):
        with pytest.raises(ValueError, match="maxFilesPerTrigger must be a positive integer"):
            WireCaptureStreamReader({"path": str(tmp_path), "maxFilesPerTrigger": text})


# -- through Spark ---------------------------------------------------------------------------------


def test_available_now_reads_every_file_to_a_parquet_sink(tmp_path: Path, spark: Any) -> None:
    directory = tmp_path / "capture"
    with capture.CaptureWriter(directory, clock=ticking(), max_file_bytes=4096) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "length32")
        write_messages(writer, range(300))
        writer.message(1, "out", capture.encode_batch([publish(n) for n in range(4)]), True,
                       batch=True)
        writer.close_connection(1, "bye")
    files = capture.capture_files(directory)
    assert len(files) >= 3
    out = tmp_path / "out"
    query = (spark.readStream.format("wirecapture").load(str(directory)).writeStream
             .format("parquet").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(60)
    assert not query.isActive and query.exception() is None
    frame = spark.read.parquet(str(out))
    counts = Counter((row.kind, row.message_type) for row in
                     frame.select("kind", "message_type").collect())
    # Each file after the first repeats the open record; the batch record is four rows.
    assert counts == {("open", "open"): len(files), ("in", "publish"): 300,
                      ("out", "publish"): 4, ("close", "close"): 1}
    assert frame.select("file", "offset", "message_index").distinct().count() == frame.count()


def test_a_half_written_record_is_read_once_when_it_is_whole(tmp_path: Path, spark: Any) -> None:
    directory = tmp_path / "capture"
    with capture.CaptureWriter(directory, clock=ticking()) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "length32")
        write_messages(writer, range(20))
    (path,) = capture.capture_files(directory)
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])  # the writer is in the middle of the last record
    sink = Batches()
    run_available_now(spark, directory, tmp_path / "checkpoint", sink)
    first = sink.all_rows()
    assert len(first) == 20  # the open and 19 whole publishes

    with open(path, "ab") as file:  # the rest of the record arrives
        file.write(whole[-7:])
    sink.rows.clear()
    run_available_now(spark, directory, tmp_path / "checkpoint", sink)
    second = sink.all_rows()
    assert second == [(str(path.resolve()), capture.scan_offsets(path).starts[-1], 0)]
    assert {(file, offset) for file, offset, _ in first + second} == record_keys(directory)


def test_read_limits_give_several_micro_batches(tmp_path: Path, spark: Any) -> None:
    directory = tmp_path / "capture"
    with capture.CaptureWriter(directory, clock=ticking(), max_file_bytes=4096) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "length32")
        write_messages(writer, range(250))
    files = capture.capture_files(directory)
    assert len(files) >= 3
    records = record_keys(directory)

    by_records = Batches()
    run_available_now(spark, directory, tmp_path / "c1", by_records, maxRecordsPerTrigger=100)
    sizes = [len(rows) for _, rows in sorted(by_records.rows.items())]
    assert len(sizes) == -(-len(records) // 100) and all(size <= 100 for size in sizes), sizes
    assert sorted(by_records.all_rows()) == sorted((f, o, 0) for f, o in records)

    by_files = Batches()
    run_available_now(spark, directory, tmp_path / "c2", by_files, maxFilesPerTrigger=1)
    assert len(by_files.rows) == len(files)
    assert [{file for file, _, _ in rows} for _, rows in sorted(by_files.rows.items())] == [
        {str(path.resolve())} for path in files]
    assert sorted(by_files.all_rows()) == sorted((f, o, 0) for f, o in records)


def test_a_restart_from_the_checkpoint_reads_only_what_is_new(tmp_path: Path,
                                                              spark: Any) -> None:
    directory = tmp_path / "capture"
    checkpoint = tmp_path / "checkpoint"
    writer = capture.CaptureWriter(directory, clock=ticking(), max_file_bytes=4096)
    writer.open_connection(1, "127.0.0.1:5000", "websmq", "length32")
    write_messages(writer, range(10))
    writer.flush()
    sink = Batches()
    run_available_now(spark, directory, checkpoint, sink)
    first = sink.all_rows()
    assert len(first) == 11
    seen = record_keys(directory)
    assert {(file, offset) for file, offset, _ in first} == seen

    # While the query is stopped: more records in the same file, then a rotation.
    write_messages(writer, range(10, 100))
    writer.close()
    assert len(capture.capture_files(directory)) >= 2
    sink.rows.clear()
    run_available_now(spark, directory, checkpoint, sink)
    second = sink.all_rows()
    assert len(second) == len(set(second))
    assert {(file, offset) for file, offset, _ in second} == record_keys(directory) - seen
