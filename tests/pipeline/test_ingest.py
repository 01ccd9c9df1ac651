"""`start_ingest` and the table: each message once as the captures grow, a torn last record taken
once it is whole, the layout, `read_table`'s contract (older tables, refusals), the lock, and the
failures a running ingest meets. Real capture files, real Spark local[2] (the session fixture)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import need_module
from wireproto import capture
from wireproto.codecs import ubre, websmq

need_module("pyspark", "pip install -e '.[spark]'")

from wireproto.pipeline import ingest  # noqa: E402
from wireproto.pipeline.ingest import (  # noqa: E402
    TableBusy,
    lock_table,
    prepare_table,
    start_ingest,
    table_rows,
)
from wireproto.pipeline.ingest_command import failure_line  # noqa: E402
from wireproto.pipeline.table import (  # noqa: E402
    MARKER,
    PARTITIONED_BY,
    TABLE_SCHEMA,
    TABLE_VERSION,
    hadoop_marker,
    is_table,
    marker_text,
    read_table,
    table_version,
)

KEY = ("broker", "file", "offset", "message_index")
# 2026-11-26 23:59:59.990 UTC: the captures cross midnight after ten records.
BEFORE_MIDNIGHT_NS = 1_795_737_599_990_000_000
ODD_BROKER = "edge 1/ä%"  # Spark escapes '/' and '%' in a partition directory's name


def ticking(start: int = BEFORE_MIDNIGHT_NS, step: int = 1_000_000) -> Any:
    clock = iter(range(start, start + 10**15, step))
    return lambda: next(clock)


def publish(number: int) -> bytes:
    return websmq.encode(websmq.Publish(f"t/{number % 3}", b"%06d" % number))


def traffic(writer: capture.CaptureWriter, numbers: range) -> None:
    for number in numbers:
        writer.message(1, "in", publish(number), True)
        if number % 4 == 0:
            writer.message(2, "in", ubre.encode(ubre.Request(number, {"n": number},
                                                             name="add")), False)
        if number % 10 == 0:
            writer.message(1, "out", capture.encode_batch([publish(number)] * 3), True,
                           batch=True)


def opened(writer: capture.CaptureWriter) -> capture.CaptureWriter:
    writer.open_connection(1, "127.0.0.1:4000", "websmq", "length32")
    writer.open_connection(2, "127.0.0.1:4001", "ubre", "ws")
    writer.open_connection(3, "127.0.0.1:4002", "nosuch", "ws")  # no protocol: null
    return writer


def direct_keys(spark: Any, captures: Path) -> list[tuple[Any, ...]]:
    """(broker, file, offset, message_index) of every row a batch read of the captures gives."""
    frame = spark.read.format("wirecapture").load(str(captures))
    return [tuple(row) for row in frame.select(*KEY).collect()]


def table_keys(spark: Any, table: Path) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in read_table(spark, str(table)).select(*KEY).collect()]


def run_once(spark: Any, captures: Path, table: Path) -> Any:
    query = start_ingest(spark, str(captures), str(table), once=True)
    query.awaitTermination(180)
    assert not query.isActive, "the ingest did not finish"
    assert query.exception() is None, query.exception()
    return query


def data_files(table: Path) -> list[str]:
    return sorted(str(path.relative_to(table)) for path in table.rglob("part-*.parquet"))


def sink_batches(table: Path) -> list[str]:
    return sorted(name for name in os.listdir(table / "_spark_metadata")
                  if not name.startswith("."))


def test_each_message_once_as_the_captures_grow_and_a_torn_record_is_whole(
        tmp_path: Path, spark: Any) -> None:
    captures, table = tmp_path / "captures", tmp_path / "table"
    # Broker "7": a file whose last record is still being written at the first run.
    with opened(capture.CaptureWriter(captures / "seven", broker="7", clock=ticking())) as seven:
        traffic(seven, range(40))
    (seven_file,) = capture.capture_files(captures / "seven")
    whole = seven_file.read_bytes()
    starts = capture.scan_offsets(seven_file).starts
    cut = starts[-5] + 20  # inside the fifth record from the end
    seven_file.write_bytes(whole[:cut])
    # Another broker, its writer still at work, rotating files as it goes.
    edge = opened(capture.CaptureWriter(captures / "edge", broker=ODD_BROKER, clock=ticking(),
                                        max_file_bytes=4096))
    traffic(edge, range(60))
    edge.flush()

    run_once(spark, captures, table)
    first = table_keys(spark, table)
    expected = direct_keys(spark, captures)
    assert len(first) == len(expected) == len(set(expected))
    assert set(first) == set(expected)
    assert not any(offset >= starts[-5] for broker, _, offset, _ in first if broker == "7")

    # The layout: date, broker, protocol; one file for each partition of the one batch.
    files = data_files(table)
    layout = re.compile(r"date=(\d{4}-\d\d-\d\d)/broker=([^/]+)/protocol=([^/]+)/"
                        r"part-[^/]+\.snappy\.parquet")
    assert all(layout.fullmatch(name) for name in files), files
    partitions = {layout.fullmatch(name).groups() for name in files}
    escaped = {"7": "7", ODD_BROKER: "edge 1%2Fä%25"}
    direct = spark.read.format("wirecapture").load(str(captures))
    assert partitions == {
        (str(row.date), escaped[row.broker], row.protocol or "__HIVE_DEFAULT_PARTITION__")
        for row in table_rows(direct).select(*PARTITIONED_BY).distinct().collect()}
    assert {date for date, _, _ in partitions} == {"2026-11-26", "2026-11-27"}
    assert len(files) == len(partitions)
    rows = read_table(spark, str(table))
    assert rows.schema == spark.createDataFrame([], TABLE_SCHEMA).schema
    assert {row.broker for row in rows.select("broker").distinct().collect()} == \
        {"7", ODD_BROKER}
    assert {tuple(row) for row in rows.where("protocol is null").select("kind", "transport")
            .distinct().collect()} == {("open", "ws")}
    assert rows.where("protocol is null").count() == direct.where("protocol is null").count()
    assert rows.where("to_date(timestamp) != date").count() == 0

    # Between runs: the torn record is finished and more follows; the other writer goes on.
    with open(seven_file, "ab") as file:
        file.write(whole[cut:])
    traffic(edge, range(60, 150))
    edge.close()
    assert len(capture.capture_files(captures / "edge")) >= 3
    run_once(spark, captures, table)
    second = table_keys(spark, table)
    expected = direct_keys(spark, captures)
    assert len(second) == len(expected) == len(set(second))
    assert set(second) == set(expected)
    batches = sink_batches(table)
    assert batches == ["0", "1"]

    # Nothing new: a rerun reads nothing and writes nothing.
    query = run_once(spark, captures, table)
    assert sum(progress.numInputRows for progress in query.recentProgress) == 0
    assert sink_batches(table) == batches
    assert len(table_keys(spark, table)) == len(expected)


def older_table(spark: Any, captures: Path, table: Path, without: str) -> None:
    """A table as a version of wireproto would have written it without the column `without`."""
    table.mkdir()
    (table / MARKER).write_text(marker_text())
    rows = table_rows(spark.readStream.format("wirecapture").load(str(captures)))
    query = (rows.drop(without).writeStream.format("parquet").partitionBy(*PARTITIONED_BY)
             .option("path", str(table)).option("checkpointLocation", str(table / "_cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None


def test_read_table_reads_older_tables_and_refuses_what_it_cannot_read(
        tmp_path: Path, spark: Any) -> None:
    captures = tmp_path / "captures"
    with opened(capture.CaptureWriter(captures, broker="7", clock=ticking())) as writer:
        writer.message(1, "in", b"\x00\x09ab", True)  # malformed: a decode error
        traffic(writer, range(10))
    old = tmp_path / "old"
    older_table(spark, captures, old, without="decode_error")
    rows = read_table(spark, str(old))
    assert [field.name for field in rows.schema] == [
        column.split(" ")[0] for column in TABLE_SCHEMA.split(", ")]
    assert rows.where("decode_error is not null").count() == 0  # not in the files: null
    direct = spark.read.format("wirecapture").load(str(captures))
    assert direct.where("decode_error is not null").count() == 1
    same = [name for name in direct.columns if name != "decode_error"]
    assert sorted(map(tuple, rows.select(*same).collect())) == \
        sorted(map(tuple, direct.select(*same).collect()))

    # Marked, and no batch has begun: empty, with the table's columns.
    empty = tmp_path / "empty"
    prepare_table(str(empty))
    assert is_table(str(empty))
    assert read_table(spark, str(empty)).count() == 0
    assert read_table(spark, str(empty)).columns == rows.columns

    # Through Spark's Hadoop filesystem, as for a table on hdfs://: the same marker.
    hadoop = tmp_path / "hadoop"
    assert hadoop_marker(spark, str(hadoop), mark=True) == (marker_text(), False)
    assert hadoop_marker(spark, str(old)) == ((old / MARKER).read_text(), True)

    # What is not a table, or a newer one, is refused in one line.
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("hello")
    newer = tmp_path / "newer"
    shutil.copytree(old, newer)
    (newer / MARKER).write_text(marker_text().replace(f'"version": {TABLE_VERSION}',
                                                      f'"version": {TABLE_VERSION + 1}'))
    bad_marker = tmp_path / "bad"
    bad_marker.mkdir()
    (bad_marker / MARKER).write_text("{not json")
    for location, message in [
        (junk, f"{junk} is not a wireproto table (no {MARKER}; wireproto ingest writes one)"),
        (tmp_path / "missing", "is not a wireproto table"),
        (captures, "is not a wireproto table"),
        (bad_marker, f"{bad_marker} is not a wireproto table ({MARKER} is not a wireproto "
                     "table's marker)"),
        (newer, f"{newer} is a version {TABLE_VERSION + 1} wireproto table; this wireproto "
                f"(0.1.0.dev0) reads versions up to {TABLE_VERSION}: upgrade it"),
    ]:
        with pytest.raises(ValueError) as refused:
            read_table(spark, str(location))
        assert message in str(refused.value) and "\n" not in str(refused.value)
    assert is_table(str(newer)) and is_table(str(old))
    assert not any(is_table(str(path)) for path in (junk, bad_marker, captures,
                                                    tmp_path / "missing"))
    # Nor is an ingest into them begun.
    for location in (junk, newer, captures / os.listdir(captures)[0]):
        with pytest.raises(ValueError, match="wireproto table|not a directory"):
            start_ingest(spark, str(captures), str(location), once=True)
        if location != newer:  # marked: its version is the caller's to check
            with pytest.raises(ValueError, match="is not a wireproto table"):
                hadoop_marker(spark, str(location), mark=True)


def test_markers_and_versions() -> None:
    assert marker_text() == ('{"format": "wireproto-table", "version": 1, "partitioned_by": '
                             '["date", "broker", "protocol"], "writer": "wireproto 0.1.0.dev0"}\n')
    assert table_version("t", marker_text()) == TABLE_VERSION == 1
    assert table_version("t", '{"format": "wireproto-table", "version": 1}') == 1
    for text in ('{"format": "delta"}', "[]", '{"format": "wireproto-table", "version": "1"}',
                 '{"format": "wireproto-table", "version": 0}'):
        with pytest.raises(ValueError, match=r"^t is not a wireproto table \("):
            table_version("t", text)


@pytest.fixture
def immutable() -> Iterator[Any]:
    """chattr +i on directories (writes refused even to root), undone after."""
    marked: list[Path] = []

    def mark(*paths: Path) -> None:
        done = subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True)
        if done.returncode:
            pytest.skip(f"chattr +i is not permitted here: {done.stderr.decode().strip()}")
        marked.extend(paths)

    try:
        yield mark
    finally:
        if marked:
            subprocess.run(["chattr", "-i", *map(str, marked)], check=True)


def test_the_table_is_locked_against_a_second_writer(tmp_path: Path, immutable: Any) -> None:
    table = tmp_path / "table"
    prepare_table(str(table))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({str(table / ingest.LOCK)!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX); os.pwrite(fd, b'%d\\n' % os.getpid(), 0)\n"
         "print('held', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        started = time.monotonic()
        with pytest.raises(TableBusy) as busy:
            lock_table(str(table), wait=1.0)
        assert time.monotonic() - started >= 1.0
        assert str(busy.value) == (f"{table} is being written by another wireproto ingest "
                                   f"(pid {holder.pid}): one ingest writes a table at a time")
    finally:
        holder.kill()
        holder.wait()
    fd = lock_table(str(table), wait=5.0)
    assert lock_table(str(table)) == fd  # this process holds it
    assert (table / ingest.LOCK).read_text() == f"{os.getpid()}\n"

    # A file, an unwritable directory: refused in one line.
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"file is not a directory$"):
        prepare_table(str(tmp_path / "file"))
    locked = tmp_path / "locked"
    prepare_table(str(locked))
    immutable(locked)
    with pytest.raises(ValueError, match=r"locked: Operation not permitted$"):
        prepare_table(str(locked))


def following(spark: Any, captures: Path, table: Path) -> Any:
    return start_ingest(spark, str(captures), str(table), trigger_seconds=0.5)


def wait_for_batch(table: Path, batch: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (table / "_checkpoint" / "commits" / str(batch)).exists():
        assert time.monotonic() < deadline, f"no batch {batch} committed"
        time.sleep(0.2)


def failed(query: Any, timeout: float = 120) -> str:
    try:
        query.awaitTermination(timeout)
    except Exception:  # noqa: BLE001, S110 - it failed: query.exception() says how
        pass
    assert not query.isActive
    assert query.exception() is not None
    return failure_line(query.exception())


def test_a_running_ingest_keeps_its_table_to_itself_and_fails_in_one_line(
        tmp_path: Path, spark: Any, immutable: Any) -> None:
    captures, table = tmp_path / "captures", tmp_path / "table"
    writer = opened(capture.CaptureWriter(captures, broker="b", clock=ticking()))
    traffic(writer, range(20))
    writer.flush()
    run_once(spark, captures, table)
    kept = data_files(table)
    # A batch cut short left a file behind: no reader sees it, the next ingest removes it.
    orphan = table / Path(kept[0]).parent / "part-00007-0badf00d-dead-beef.c000.snappy.parquet"
    shutil.copy(table / kept[0], orphan)
    count = read_table(spark, str(table)).count()

    query = following(spark, captures, table)
    try:
        assert not orphan.exists() and data_files(table) == kept
        with pytest.raises(TableBusy, match=f"{table} is being written by query .* of this "
                                            "process: one ingest writes a table at a time"):
            start_ingest(spark, str(captures), str(table), once=True)
        traffic(writer, range(20, 40))
        writer.flush()
        wait_for_batch(table, 1)
        assert read_table(spark, str(table)).count() > count
        # Its table can no longer be written: the query fails, and says why in one line.
        immutable(*[path for path in table.rglob("*") if path.is_dir()
                    and path.name.startswith(("date=", "broker=", "protocol="))])
        traffic(writer, range(40, 60))
        writer.flush()
        line = failed(query)
        assert line.startswith(f"[TASK_WRITE_FAILED] Task failed while writing rows to "
                               f"file:{table}: "), line
        assert "Operation not permitted" in line, line
    finally:
        query.stop()

    # Its capture directory vanishes.
    subprocess.run(["chattr", "-R", "-i", str(table)], check=False)
    query = following(spark, captures, table)
    try:
        wait_for_batch(table, 2)
        writer.close()
        captures.rename(tmp_path / "gone")
        assert failed(query) == \
            f"FileNotFoundError: wirecapture: no capture file or directory {str(captures)!r}"
    finally:
        query.stop()


def test_a_failure_is_one_line_of_its_cause() -> None:
    class Captured(Exception):
        _cause: Exception | None = None

    top = Captured("[TASK_WRITE_FAILED] Task failed while writing rows to file:/t. "
                   "SQLSTATE: 58030\n=== Streaming Query ===\nIdentifier: wireproto-ingest")
    top._cause = Captured("org.apache.spark.SparkException: [TASK_WRITE_FAILED] Task failed "
                          "while writing rows to file:/t. SQLSTATE: 58030")
    top._cause._cause = Captured("java.io.IOException: No space left on device")
    assert failure_line(top) == ("[TASK_WRITE_FAILED] Task failed while writing rows to file:/t:"
                                 " IOException: No space left on device")
    python = Captured(
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source "
        "perform latestOffset: Traceback (most recent call last):\n"
        '  File "x.py", line 77, in capture_paths\n'
        '    raise FileNotFoundError(f"wirecapture: no capture file or directory {p!r}")\n'
        "FileNotFoundError: wirecapture: no capture file or directory '/c'\n"
        " SQLSTATE: 38000 SQLSTATE: XXKST\n=== Streaming Query ===\n")
    assert failure_line(python) == \
        "FileNotFoundError: wirecapture: no capture file or directory '/c'"
    # The first exception of a chain is the cause (pyspark's runner fails handling it).
    chained = Captured(
        "[PYTHON_DATA_SOURCE_ERROR] Failed to plan Python data source initialize source: "
        "Traceback (most recent call last):\n  File \"d.py\", line 77, in capture_paths\n"
        "FileNotFoundError: wirecapture: no capture file or directory '/c'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  File \"runner.py\", line 295, in main\n"
        "UnboundLocalError: cannot access local variable 'reader' where it is not associated "
        "with a value\n SQLSTATE: 38000")
    assert failure_line(chained) == \
        "FileNotFoundError: wirecapture: no capture file or directory '/c'"
    # An exception of wireproto's own, named by its module: a damaged capture names its file.
    damaged = Captured(
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source "
        "perform latestOffset: Traceback (most recent call last):\n"
        '  File "reader.py", line 123, in _scan\n    raise CorruptCapture(\n'
        "wireproto.capture.format.CorruptCapture: /c/w-1.wpcap: record at offset 29964: CRC "
        "mismatch with 35505 bytes after it: the file is corrupt, not torn\n SQLSTATE: 38000")
    assert failure_line(damaged) == (
        "wireproto.capture.format.CorruptCapture: /c/w-1.wpcap: record at offset 29964: CRC "
        "mismatch with 35505 bytes after it: the file is corrupt, not torn")
    assert failure_line(RuntimeError("")) == "RuntimeError"


def test_captures_in_object_storage_and_a_table_there_checked(tmp_path: Path, spark: Any,
                                                              s3: Any) -> None:
    from tests.pipeline.conftest import BUCKET

    local = tmp_path / "captures"
    with opened(capture.CaptureWriter(local, broker="edge-9", clock=ticking(),
                                      max_file_bytes=4096)) as writer:
        traffic(writer, range(40))
    for path in capture.capture_files(local):
        s3.upload(path, f"fleet/edge-9/{path.name}")
    remote = f"s3://{BUCKET}/fleet"
    table = tmp_path / "table"
    query = start_ingest(spark, remote, str(table), once=True, options=s3.options)
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    direct = spark.read.format("wirecapture").options(**s3.options).load(remote)
    expected = [tuple(row) for row in direct.select(*KEY).collect()]
    assert sorted(table_keys(spark, table)) == sorted(expected)
    assert {key[1] for key in expected} == {f"{remote}/edge-9/{path.name}"
                                           for path in capture.capture_files(local)}

    # A table in object storage: nothing there yet, or a table, may be written; else refused.
    from wireproto.pipeline.table import check_remote_table

    check_remote_table(f"s3://{BUCKET}/tables/new", s3.options)
    s3.upload(table / MARKER, "tables/old/_wireproto_table.json")
    check_remote_table(f"s3://{BUCKET}/tables/old", s3.options)
    assert is_table(f"s3://{BUCKET}/tables/old", s3.options)
    assert not is_table(remote, s3.options)
    with pytest.raises(ValueError, match=rf"^{remote} is not a wireproto table \(no {MARKER};"):
        check_remote_table(remote, s3.options)
    with pytest.raises(ValueError, match=rf"^{remote} is not a wireproto table"):
        read_table(spark, remote, s3.options)
    newer = tmp_path / "newer.json"
    newer.write_text(marker_text().replace('"version": 1', '"version": 5'))
    s3.upload(newer, "tables/newer/_wireproto_table.json")
    with pytest.raises(ValueError, match="is a version 5 wireproto table"):
        check_remote_table(f"s3://{BUCKET}/tables/newer", s3.options)
    if importlib.util.find_spec("wireproto.pipeline.tablestore") is None:
        with pytest.raises(ValueError, match="needs wireproto.pipeline.tablestore"):
            read_table(spark, f"s3://{BUCKET}/tables/old", s3.options)
