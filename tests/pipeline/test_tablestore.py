"""A wireproto table in object storage (a real S3 API server on 127.0.0.1), written by a real
Spark file-sink streaming query into a staging directory and mirrored by `TableMirror`; and
keeping a table tidy while a reader reads it."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.conftest import BUCKET, S3Server
from wireproto import capture
from wireproto.codecs import websmq
from wireproto.pipeline import tablestore
from wireproto.pipeline.tablestore import (
    LOG_DIR,
    MARKER,
    TableMirror,
    fetch_table,
    listed_files,
    remove_expired,
)

DAY_NS = 86_400 * 10**9
START_NS = 1_700_000_000_000_000_000  # 2023-11-14
TABLE_MARKER = {"format": "wireproto-table", "version": 1,
                "partitioned_by": ["date", "broker", "protocol"], "writer": "wireproto tests"}
KEY = ("file", "offset", "message_index")


def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)
    return result


def write_capture(directory: Path, broker: str, messages: int, start_ns: int) -> None:
    """Capture files of one broker, a message a second from `start_ns`, rotated often."""
    clock = iter(range(start_ns, start_ns + 10**15, 10**9))
    with capture.CaptureWriter(directory, broker=broker, clock=lambda: next(clock),
                               max_file_bytes=4096) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "ws")
        for number in range(messages):
            writer.message(1, "in", websmq.encode(
                websmq.Publish(f"t/{number % 3}", b"%06d" % number)), True)


def fleet(root: Path, day: int = 0) -> Path:
    """Two brokers' captures over two days; partition values a path must escape."""
    write_capture(root / "a", "site 1", 240, START_NS + day * DAY_NS)
    write_capture(root / "b", "edge/2", 160, START_NS + (day + 1) * DAY_NS)
    return root


@contextmanager
def spark_conf(spark: Any, **settings: str) -> Iterator[None]:
    """The session's SQL settings `settings` (``fileSink_log_compactInterval`` for
    ``spark.sql.streaming.fileSink.log.compactInterval``) for a while."""
    names = {f"spark.sql.streaming.{key.replace('_', '.')}": value
             for key, value in settings.items()}
    before = {name: spark.conf.get(name, None) for name in names}
    for name, value in names.items():
        spark.conf.set(name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                spark.conf.unset(name)
            else:
                spark.conf.set(name, value)


def start_ingest(spark: Any, captures: Path, table: Path, retention: str | None = None,
                 **source: str) -> Any:
    """The table's query as `wireproto ingest` runs it: the wirecapture stream source, the
    Parquet file sink partitioned by date, broker and protocol, the checkpoint in the table."""
    from pyspark.sql import functions

    table.mkdir(parents=True, exist_ok=True)
    if not (table / MARKER).exists():
        (table / MARKER).write_text(json.dumps(TABLE_MARKER))
    frame = (spark.readStream.format("wirecapture").options(**source).load(str(captures))
             .withColumn("date", functions.to_date("timestamp")))
    sink = {"retention": retention} if retention else {}
    return (frame.writeStream.format("parquet").partitionBy("date", "broker", "protocol")
            .option("path", str(table)).option("checkpointLocation", str(table / "_checkpoint"))
            .options(**sink).trigger(availableNow=True).start())


def ingest_and_sync(spark: Any, captures: Path, staging: Path,
                    mirror: TableMirror | None = None, retention: str | None = None,
                    **source: str) -> None:
    """Run the query to its end, syncing after each micro-batch as the ingest command does."""
    query = start_ingest(spark, captures, staging, retention, **source)
    seen = None
    while query.isActive:
        progress = query.lastProgress
        if mirror is not None and progress is not None and progress["batchId"] != seen:
            seen = progress["batchId"]
            mirror.sync()
        time.sleep(0.1)
    assert query.exception() is None, query.exception()
    if mirror is not None:
        mirror.sync()


def table_schema() -> str:
    from wireproto.pipeline.rows import SCHEMA

    return SCHEMA + ", date date"


def read_keys(spark: Any, table: str | Path) -> list[tuple[str, int, int]]:
    frame = spark.read.schema(table_schema()).parquet(str(table))
    return [tuple(row) for row in frame.select(*KEY).collect()]


def direct_keys(spark: Any, captures: Path) -> set[tuple[str, int, int]]:
    return {tuple(row) for row in
            spark.read.format("wirecapture").load(str(captures)).select(*KEY).collect()}


def arrow_keys(table: str) -> list[tuple[str, int, int]]:
    """The rows of a local table's listed files, read without Spark."""
    import pyarrow.parquet as pq

    keys: list[tuple[str, int, int]] = []
    for rel in listed_files(table):
        columns = pq.read_table(os.path.join(table, rel), columns=list(KEY)).to_pydict()
        keys.extend(zip(*(columns[name] for name in KEY), strict=True))
    return keys


def remote_names(s3: S3Server, prefix: str) -> set[str]:
    import pyarrow.fs as pafs

    base = f"{BUCKET}/{prefix}"
    return {info.path[len(base) + 1:] for info in s3.filesystem().get_file_info(
        pafs.FileSelector(base, recursive=True, allow_not_found=True))
        if info.type == pafs.FileType.File}


# -- a table in object storage ---------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_mirrored_table_reads_as_written_and_resumes_on_another_machine(
        tmp_path: Path, spark: Any, s3: S3Server) -> None:
    captures = fleet(tmp_path / "captures")
    remote = f"s3://{BUCKET}/tables/messages"
    staging = tmp_path / "staging-1"
    mirror = TableMirror(staging, remote, s3.options)
    mirror.restore()  # a new table: nothing to bring
    # A compaction every third micro-batch, and Spark's clean-up of the log files before it
    # at once: the mirror deletes them in the table too.
    with spark_conf(spark, fileSink_log_compactInterval="3", fileSink_log_cleanupDelay="0"):
        ingest_and_sync(spark, captures, staging, mirror, maxFilesPerTrigger="1")
    assert "2.compact" in os.listdir(staging / LOG_DIR)
    names = remote_names(s3, "tables/messages")
    assert MARKER in names and "_checkpoint/commits/0" in names
    data = {name for name in names if name.endswith(".parquet")}
    assert {name.split("/part-")[0] for name in data} == {
        "date=2023-11-14/broker=site 1/protocol=websmq",
        "date=2023-11-15/broker=edge%2F2/protocol=websmq"}  # Spark's escape of the "/"
    assert not list(staging.rglob("*.parquet"))  # uploaded, so dropped from staging
    log = s3.filesystem().open_input_stream(f"{BUCKET}/tables/messages/{LOG_DIR}/0").read()
    assert all(json.loads(line)["path"].startswith(remote + "/date=")
               for line in log.decode().splitlines()[1:])
    assert {name for name in names if name.startswith(LOG_DIR)} == {
        f"{LOG_DIR}/{name}" for name in os.listdir(staging / LOG_DIR) if name[0] != "."}
    assert mirror.sync() == tablestore.SyncReport()  # nothing new: nothing uploaded

    copy = fetch_table(remote, tmp_path / "cache", s3.options)
    first = read_keys(spark, copy)
    expected = direct_keys(spark, captures)
    assert len(first) == len(expected) and set(first) == expected
    cached = {path: path.stat().st_mtime_ns for path in Path(copy).rglob("*.parquet")}

    # Another machine: an empty staging directory, the table's state from object storage, and
    # new captures meanwhile (another day of both brokers).
    fleet(tmp_path / "captures" / "later", day=2)
    elsewhere = TableMirror(tmp_path / "staging-2", remote, s3.options)
    elsewhere.restore()
    assert (tmp_path / "staging-2" / "_checkpoint" / "commits").is_dir()
    with spark_conf(spark, fileSink_log_compactInterval="3"):
        ingest_and_sync(spark, captures, tmp_path / "staging-2", elsewhere,
                        maxFilesPerTrigger="1")
    copy = fetch_table(remote, tmp_path / "cache", s3.options)
    keys = read_keys(spark, copy)
    expected = direct_keys(spark, captures)
    assert len(keys) == len(expected) and set(keys) == expected  # each row once
    assert all(path.stat().st_mtime_ns == mtime for path, mtime in cached.items())  # kept
    with pytest.raises(ValueError, match="copy of another table"):
        fetch_table(f"s3://{BUCKET}/tables/other", copy, s3.options)


# The sync a child runs, killed by SIGKILL right after its `kill_after`-th upload began.
KILLED_SYNC = """
import os, signal, sys, threading
from wireproto.pipeline import tablestore
staging, remote, kill_after, endpoint = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
options = {"s3.endpoint": endpoint, "s3.region": "us-east-1", "s3.access_key": "wireproto",
           "s3.secret_key": "wireproto-secret"}
put, lock, count = tablestore._Table.put, threading.Lock(), [0]
def counted(self, rel, source):
    with lock:
        count[0] += 1
        if count[0] > kill_after >= 0:
            os.kill(os.getpid(), signal.SIGKILL)
    return put(self, rel, source)
tablestore._Table.put = counted
report = tablestore.TableMirror(staging, remote, options).sync()
print(count[0])
"""


@pytest.fixture(scope="module")
def staged_table(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[Any]:
    """A staging table of several micro-batches that Spark wrote and no sync uploaded, kept
    aside to be put back at its own path (its log names files by their path)."""
    base = tmp_path_factory.mktemp("staged")
    captures = fleet(base / "captures")
    staging = base / "staging"
    with spark_conf(spark, fileSink_log_compactInterval="3"):
        ingest_and_sync(spark, captures, staging, maxFilesPerTrigger="1")
    assert "2.compact" in os.listdir(staging / LOG_DIR)
    shutil.copytree(staging, base / "pristine")
    expected = direct_keys(spark, captures)

    def reset() -> Path:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(base / "pristine", staging)
        return staging

    yield reset, expected


def check_remote(remote: str, s3: S3Server, prefix: str, cache: Path,
                 expected: set[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """What a reader of the remote table sees right now is right: every file its log names,
    whole; no row twice; no batch done (committed) whose log file is not there, and none
    logged whose offsets are not."""
    names = remote_names(s3, prefix)
    logged = {int(name.split("/")[1].split(".")[0]) for name in names
              if name.startswith(LOG_DIR + "/")}
    committed = {int(name.rsplit("/", 1)[1]) for name in names
                 if name.startswith("_checkpoint/commits/")}
    planned = {int(name.rsplit("/", 1)[1]) for name in names
               if name.startswith("_checkpoint/offsets/")}
    assert committed <= logged <= planned, (committed, logged, planned)
    if MARKER not in names:
        assert not logged
        return []
    keys = arrow_keys(fetch_table(remote, cache, s3.options))
    assert len(keys) == len(set(keys)) and set(keys) <= expected
    return keys


@pytest.mark.timeout(600)
def test_a_sync_killed_between_any_two_uploads_leaves_a_right_table_the_next_completes(
        tmp_path: Path, staged_table: Any, s3: S3Server) -> None:
    reset, expected = staged_table
    environment = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]))
    run = [sys.executable, "-c", KILLED_SYNC]
    staging = reset()
    whole = subprocess.run([*run, str(staging), f"s3://{BUCKET}/whole", "-1", s3.endpoint],
                           env=environment, capture_output=True, text=True, timeout=120)
    assert whole.returncode == 0, whole.stderr
    uploads = int(whole.stdout)
    assert uploads > 15  # marker, checkpoint, several batches' data and log files
    assert sorted(arrow_keys(fetch_table(f"s3://{BUCKET}/whole", tmp_path / "whole",
                                         s3.options))) == sorted(expected)
    for kill_after in range(uploads):
        staging = reset()
        prefix = f"killed-{kill_after}"
        remote = f"s3://{BUCKET}/{prefix}"
        child = subprocess.run([*run, str(staging), remote, str(kill_after), s3.endpoint],
                               env=environment, capture_output=True, text=True, timeout=120)
        assert child.returncode == -signal.SIGKILL, child.stderr
        check_remote(remote, s3, prefix, tmp_path / f"cache-{kill_after}", expected)
        TableMirror(staging, remote, s3.options).sync()  # the next run's
        keys = check_remote(remote, s3, prefix, tmp_path / f"cache-{kill_after}", expected)
        assert sorted(keys) == sorted(expected), kill_after

    # Killed at any moment, mid-upload too: a reader is right meanwhile, and after the
    # next sync every row is there once.
    for attempt in range(4):
        staging = reset()
        prefix = f"timed-{attempt}"
        remote = f"s3://{BUCKET}/{prefix}"
        child = subprocess.Popen([*run, str(staging), remote, "-1", s3.endpoint], env=environment,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(random.uniform(0.3, 2.0))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        check_remote(remote, s3, prefix, tmp_path / f"timed-{attempt}", expected)
        TableMirror(staging, remote, s3.options).sync()
        keys = check_remote(remote, s3, prefix, tmp_path / f"timed-{attempt}", expected)
        assert sorted(keys) == sorted(expected)


def test_a_hostile_or_foreign_remote_is_refused(tmp_path: Path, staged_table: Any,
                                                s3: S3Server) -> None:
    reset, _ = staged_table
    remote = f"s3://{BUCKET}/t"
    TableMirror(reset(), remote, s3.options).sync()
    filesystem = s3.filesystem()
    log = f"{BUCKET}/t/" + max((name for name in remote_names(s3, "t")
                                if name.startswith(LOG_DIR)), key=lambda name: int(
        name.rsplit("/", 1)[1].split(".")[0]))  # the last a reader reads
    honest = filesystem.open_input_stream(log).read()
    entry = json.loads(honest.decode().splitlines()[1])
    outside = tmp_path / "outside"
    for path in (f"s3://{BUCKET}/elsewhere/date=x/part-0.parquet",
                 f"{remote}/date=x/../../../{outside.name}/part-0.parquet",
                 f"{remote}/_checkpoint/offsets/0", f"{remote}/{MARKER}", "/etc/passwd"):
        with filesystem.open_output_stream(log) as out:
            out.write(b"v1\n" + json.dumps(dict(entry, path=path)).encode())
        with pytest.raises(ValueError, match="not a data file of the table"):
            fetch_table(remote, tmp_path / "cache", s3.options)
    assert not outside.exists()
    with filesystem.open_output_stream(log) as out:
        out.write(b"v9\n" + honest.split(b"\n", 1)[1])
    with pytest.raises(ValueError, match="not a file-sink log of version v1"):
        fetch_table(remote, tmp_path / "cache", s3.options)

    # Neither a table nor empty: not written into, nor read as one.
    s3.upload(Path(__file__), "reports/notes.py")
    with pytest.raises(ValueError, match="not a wireproto table"):
        TableMirror(tmp_path / "empty", f"s3://{BUCKET}/reports", s3.options).restore()
    with pytest.raises(ValueError, match="not a wireproto table"):
        fetch_table(f"s3://{BUCKET}/reports", tmp_path / "reports", s3.options)
    assert not (tmp_path / "empty" / LOG_DIR).exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty, and not a copy"):
        fetch_table(remote, mine, s3.options)
    assert os.listdir(mine) == ["notes.txt"]


def test_a_staging_directory_behind_the_table_is_refused(staged_table: Any,
                                                         s3: S3Server) -> None:
    reset, _ = staged_table
    remote = f"s3://{BUCKET}/t"
    TableMirror(reset(), remote, s3.options).sync()
    staging = reset()  # the same run's staging, as it was two micro-batches ago
    names = sorted((name for name in os.listdir(staging / LOG_DIR) if name[0] != "."),
                   key=lambda name: int(name.split(".")[0]))
    for name in names[-2:]:
        (staging / LOG_DIR / name).unlink()
    with pytest.raises(ValueError, match="is behind"):
        TableMirror(staging, remote, s3.options).restore()


def test_remove_expired_deletes_only_files_out_of_the_log_for_the_grace_period(
        staged_table: Any) -> None:
    reset, _ = staged_table
    table = reset()
    listed = listed_files(table)
    partition = table / next(iter(listed)).rsplit("/", 1)[0]
    newest_log = max((table / LOG_DIR / name).stat().st_mtime for name in
                     os.listdir(table / LOG_DIR) if name[0] != ".")
    orphan = partition / "part-99999-orphan.c000.snappy.parquet"  # a failed batch's file
    orphan.write_bytes(b"PAR1")
    os.utime(orphan, (newest_log - 60, newest_log - 60))
    writing = partition / "part-99998-writing.c000.snappy.parquet"  # a batch being written
    writing.write_bytes(b"PAR1")
    now = time.time()
    assert remove_expired(table, grace_seconds=600, now=now) == []  # noted, not deleted
    assert orphan.exists()
    assert remove_expired(table, grace_seconds=600, now=now + 599) == []
    removed = remove_expired(table, grace_seconds=600, now=now + 600)
    assert removed == [orphan.relative_to(table).as_posix()] and not orphan.exists()
    assert writing.exists() and all((table / rel).exists() for rel in listed)
    assert remove_expired(table, grace_seconds=0, now=now + 1200) == []


# -- keeping a table tidy --------------------------------------------------------------------------


def test_a_retention_is_checked_before_spark_starts() -> None:
    assert [tablestore.duration_seconds(text) for text in ("30d", "12h", "90m", "2min", "45s")
            ] == [30 * 86400, 12 * 3600, 90 * 60, 120, 45]
    for text in ("", "30", "0d", "-1d", "1.5h", "30 days", "1w"):
        with pytest.raises(ValueError, match="not a duration"):
            tablestore.duration_seconds(text)


@pytest.mark.timeout(300)
def test_files_expire_out_of_the_log_then_away_while_a_reader_reads(tmp_path: Path,
                                                                   spark: Any) -> None:
    root = tmp_path / "captures"
    write_capture(root / "old", "site 1", 240, START_NS)
    table = tmp_path / "table"
    batches = len(capture.capture_files(root / "old"))  # a micro-batch per file
    # The first compaction of the log is the second run's micro-batch.
    with spark_conf(spark, fileSink_log_compactInterval=str(batches + 1)):
        ingest_and_sync(spark, root, table, retention="3s", maxFilesPerTrigger="1")
        assert not [name for name in os.listdir(table / LOG_DIR) if "compact" in name]
        old = direct_keys(spark, root)
        first = set(listed_files(table))
        # Older than the retention now, but out of no compaction yet: still read.
        newest = max(os.path.getmtime(table / rel) for rel in first)
        until(lambda: time.time() > newest + 4, 10, "the files to be older than the retention")
        assert sorted(read_keys(spark, table)) == sorted(old)
        planned = spark.read.schema(table_schema()).parquet(str(table))  # reads the log now

        write_capture(root / "new", "site 2", 120, START_NS + DAY_NS)
        everything = direct_keys(spark, root)
        stop, errors, reads, removed = threading.Event(), [], [0], []

        def read() -> None:
            while not stop.is_set():
                try:
                    keys = read_keys(spark, table)
                    assert len(keys) == len(set(keys)) and set(keys) <= everything
                    reads[0] += 1
                except Exception as error:  # noqa: BLE001 - any failure of a read fails the test
                    errors.append(error)
                    return

        def tidy() -> None:
            while not stop.is_set():
                removed.extend(remove_expired(table, grace_seconds=8))
                time.sleep(0.1)

        threads = [threading.Thread(target=read), threading.Thread(target=tidy)]
        for thread in threads:
            thread.start()
        try:
            ingest_and_sync(spark, root, table, retention="3s")
            assert f"{batches}.compact" in os.listdir(table / LOG_DIR)
            assert not first & set(listed_files(table))  # left out of the compaction
            assert planned.count() == len(old)  # within the grace: still there to read
            until(lambda: set(removed) == first, 60, "the expired files removed")
            until(lambda: reads[0] >= 3 or errors, 60, "a few reads")
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
    assert not errors, errors
    assert sorted(read_keys(spark, table)) == sorted(everything - old)
    # A query that read the log before, and reads the files only past the grace period, is
    # what the period must be longer than.
    with pytest.raises(Exception, match="FILE_NOT_EXIST"):
        planned.count()


@pytest.mark.timeout(240)
def test_a_log_file_written_beside_the_query_costs_rows(tmp_path: Path, spark: Any) -> None:
    """Why no compaction of a table's files: the sink's log can change only through a new
    micro-batch's log file, and one written beside the query takes the query's next batch
    number, which the query then skips as written already."""
    root = tmp_path / "captures"
    write_capture(root / "a", "site-1", 20, START_NS)
    table = tmp_path / "table"
    ingest_and_sync(spark, root, table)
    (table / LOG_DIR / "1").write_text("v1")  # a rewrite's log file, naming its files
    write_capture(root / "b", "site-2", 20, START_NS)
    ingest_and_sync(spark, root, table)
    assert sorted(os.listdir(table / "_checkpoint" / "commits"))[-1] == "1"  # the query ran it
    assert set(read_keys(spark, table)) == direct_keys(spark, root / "a")  # site-2's rows lost


def test_remove_expired_works_in_object_storage(tmp_path: Path, staged_table: Any,
                                                s3: S3Server) -> None:
    import pyarrow.fs as pafs

    reset, expected = staged_table
    remote = f"s3://{BUCKET}/t"
    TableMirror(reset(), remote, s3.options).sync()
    filesystem = s3.filesystem()
    listed = listed_files(remote, s3.options)
    orphan = f"{BUCKET}/t/{next(iter(listed)).rsplit('/', 1)[0]}/part-99999-orphan.parquet"
    with filesystem.open_output_stream(orphan) as out:
        out.write(b"PAR1")
    assert remove_expired(remote, grace_seconds=0, options=s3.options) == []  # newer than the log
    last = max(name for name in remote_names(s3, "t") if name.startswith(LOG_DIR))

    def log_rewritten_later() -> bool:  # as a next micro-batch's log file would be
        text = filesystem.open_input_stream(f"{BUCKET}/t/{last}").read()
        with filesystem.open_output_stream(f"{BUCKET}/t/{last}") as out:
            out.write(text)
        times = filesystem.get_file_info([orphan, f"{BUCKET}/t/{last}"])
        return bool(times[1].mtime_ns > times[0].mtime_ns)

    until(log_rewritten_later, 10, "a log file newer than the orphan")
    assert remove_expired(remote, grace_seconds=0, options=s3.options) == [
        orphan.split("/t/", 1)[1]]
    assert filesystem.get_file_info(orphan).type == pafs.FileType.NotFound
    keys = arrow_keys(fetch_table(remote, tmp_path / "cache", s3.options))
    assert sorted(keys) == sorted(expected)
