"""`wireproto ingest`: capture files into the table (`wireproto.pipeline.table`), once each.

`start_ingest` starts a Structured Streaming query: the `wirecapture` stream source
(`WireCaptureStreamReader`: offsets at record boundaries, a record still being written left for
a later batch) into Spark's Parquet file sink, append mode, partitioned by date, broker and
protocol. Exactly once comes from Spark: the checkpoint's offset log fixes what each micro-batch
reads before it runs, a batch cut short runs again over the same records, and the sink's log
(``_spark_metadata``) lists a batch's files only once all of them are written, and a batch only
once. Files a batch cut short left behind are in no log, so no reader sees them; the next
ingest removes them before it starts. With a `retention`, the sink's log leaves out files older
than it, and `wireproto.pipeline.tablestore.remove_expired` deletes them (and those of batches
cut short) once they have been out of the log for `TIDY_GRACE_SECONDS`.

Each micro-batch is repartitioned by the table's partition columns, so it writes one file per
table partition it touches rather than one per task and partition.

One ingest at a time writes a table: a lock file in a local table
(``_wireproto_ingest.lock``, flock) refuses a second one with `TableBusy`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wireproto.pipeline.table import (
    CHECKPOINT,
    MARKER,
    PARTITIONED_BY,
    SINK_LOG,
    TABLE_SCHEMA,
    hadoop_marker,
    is_spark_path,
    marker_text,
    table_version,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["start_ingest", "table_rows", "prepare_table", "lock_table", "TableBusy",
           "remove_orphans", "DEFAULT_TRIGGER_SECONDS", "LOCK", "TIDY_GRACE_SECONDS"]

DEFAULT_TRIGGER_SECONDS = 60.0
LOCK = "_wireproto_ingest.lock"
# How long a file stays after it left the table's log, for a query that read the log before.
TIDY_GRACE_SECONDS = 3600.0
LOCK_WAIT = 10.0  # seconds: a killed ingest's Spark may take a moment to end and let go
_MICROS_PER_DAY = 86_400_000_000
# The table's Parquet files: no dictionary for the columns that hardly repeat (one is built and
# dropped for them, which cost a fifth of the write's CPU in bench/pipeline.py).
WRITE_OPTIONS = {f"parquet.enable.dictionary#{column}": "false"
                 for column in ("offset", "timestamp", "request_id")}


class TableBusy(ValueError):
    """Another ingest is writing the table."""


def is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file://")


def _local_path(location: str) -> str:
    return location.removeprefix("file://")


def table_rows(rows: DataFrame) -> DataFrame:
    """The table's rows from the `wirecapture` source's: its columns, then ``date``, the UTC
    day of ``timestamp`` (whatever the session's time zone)."""
    from pyspark.sql import functions as F

    day = F.floor(F.unix_micros("timestamp") / F.lit(_MICROS_PER_DAY)).cast("int")
    return rows.withColumn("date", F.date_from_unix_date(day))


# -- the table's directory -----------------------------------------------------------------------


def prepare_table(table_dir: str, spark: SparkSession | None = None) -> None:
    """Make `table_dir` a table, or check it is one this code writes: created with its marker
    when missing or empty. ValueError, in one line, for anything else there (a file, a
    directory that is not a table, a newer table). A table on hdfs:// needs `spark`."""
    if not is_local(table_dir):
        _prepare_hadoop(spark, table_dir)
        return
    path = Path(_local_path(table_dir))
    marker = path / MARKER
    try:
        path.mkdir(parents=True, exist_ok=True)
        text = marker.read_text(encoding="utf-8", errors="replace") if marker.exists() else None
        if text is None and any(name != LOCK and not name.startswith(".marker-")
                                for name in os.listdir(path)):
            table_version(table_dir, None)  # refused: something else lives there
        if text is not None:
            table_version(table_dir, text)
        # Whole or not at all: a marker is written aside, then renamed into place. For a
        # table already marked, the same file tells whether the table can be written.
        with tempfile.NamedTemporaryFile("w", dir=path, prefix=".marker-", delete=False,
                                         encoding="utf-8") as file:
            file.write(marker_text())
        if text is None:
            os.replace(file.name, marker)
        else:
            os.unlink(file.name)
    except FileExistsError:
        raise ValueError(f"{table_dir} is not a directory") from None
    except OSError as error:
        raise ValueError(f"{table_dir}: {error.strerror or error}") from None


def _prepare_hadoop(spark: SparkSession | None, table_dir: str) -> None:
    if spark is None:
        raise ValueError(f"{table_dir}: a table on hdfs:// is prepared through Spark")
    text, _ = hadoop_marker(spark, table_dir, mark=True)
    table_version(table_dir, text)


@dataclass
class _Held:
    """A table's lock this process holds, and the query last started on the table."""

    fd: int
    query: StreamingQuery | None = None


_held: dict[str, _Held] = {}  # by the table's real path


def lock_table(table_dir: str, *, lock_file: str | None = None, wait: float = LOCK_WAIT) -> int:
    """Take the lock of the local table `table_dir` (a directory already) for this process, and
    return its file descriptor; give it to a child process too (the JVM) and the lock lasts
    as long as either. The lock is `lock_file`, by default `LOCK` in the table. Waits up to
    `wait` seconds for another holder to let go, then raises TableBusy naming its process.
    Taken again by this process, it is the same lock."""
    key = os.path.realpath(_local_path(table_dir))
    if key in _held:
        return _held[key].fd
    fd = os.open(lock_file or os.path.join(key, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                 0o600)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as error:
            busy = error.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
            if busy and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            if not busy:
                raise ValueError(f"{table_dir}: cannot lock it: {error.strerror}") from None
            raise TableBusy(f"{table_dir} is being written by another wireproto ingest"
                            f"{f' (pid {holder})' if holder.isdigit() else ''}: one ingest "
                            "writes a table at a time") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = _Held(fd)
    return fd


def remove_orphans(spark: SparkSession, table_dir: str) -> int:
    """Remove the data files of the local table `table_dir` that its sink log does not list:
    what batches cut short wrote before they ran again. Only while holding its lock. Returns
    how many went."""
    path = Path(_local_path(table_dir))
    if not (path / SINK_LOG).is_dir():
        return 0
    # By name (a part file's holds a UUID): the log of a table kept in object storage may name
    # its files by their URLs there.
    kept = {urllib.parse.unquote(uri.rstrip("/").rsplit("/", 1)[-1])
            for uri in spark.read.schema(TABLE_SCHEMA).parquet(str(path)).inputFiles()}
    removed = 0
    for directory, subdirectories, files in os.walk(path):
        if directory == str(path):
            subdirectories[:] = [name for name in subdirectories
                                 if not name.startswith(("_", "."))]
            continue
        for name in files:
            if name.startswith("part-") and name not in kept:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))
                    removed += 1
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, f".{name}.crc"))
    return removed


# -- the query -----------------------------------------------------------------------------------


def start_ingest(spark: SparkSession, captures: str, table_dir: str, *,
                 checkpoint: str | None = None, once: bool = False,
                 trigger_seconds: float = DEFAULT_TRIGGER_SECONDS,
                 options: Mapping[str, str] | None = None,
                 repartition: bool = True, retention: str | None = None) -> StreamingQuery:
    """Start ingesting the captures at `captures` (a capture directory or file, local or in
    object storage with `options`) into the table at `table_dir` (a local path or hdfs://:
    a path Spark writes), and return the query (a `pyspark.sql.streaming.StreamingQuery`).
    `checkpoint` defaults to ``TABLE/_checkpoint``; keep it with the table, since together
    they say what was read. With `once` the query reads what is there and stops
    (``Trigger.AvailableNow``); otherwise it runs a micro-batch every `trigger_seconds`.
    Without `repartition` a batch skips its shuffle, and each of its tasks (a capture file)
    writes a file of its own to each partition it has rows for.

    With `retention` (the file sink's option: ``30d``, ``12h``), a compaction of the sink's log
    leaves out the files written longer ago than that, and a local table's files out of the
    log go once they have been out of it for `TIDY_GRACE_SECONDS` (``remove_expired``: call
    it again as the query runs; without a retention, files of batches cut short go at once).

    ValueError for a table directory that is not a table this code writes, and TableBusy when
    another ingest writes it."""
    from wireproto.pipeline.datasource import WireCaptureDataSource

    if not is_spark_path(table_dir):
        raise ValueError(f"{table_dir}: Spark writes only local and hdfs:// paths; a table in "
                         "object storage is written through a local copy (wireproto ingest)")
    if not once and not trigger_seconds > 0:
        raise ValueError(f"trigger_seconds must be positive, not {trigger_seconds}")
    prepare_table(table_dir, spark)
    key = None
    if is_local(table_dir):
        lock_table(table_dir)
        key = os.path.realpath(_local_path(table_dir))
        running = _held[key].query
        if running is not None and running.isActive:
            raise TableBusy(f"{table_dir} is being written by query {running.id} of this "
                            "process: one ingest writes a table at a time")
        if retention is None:
            remove_orphans(spark, table_dir)
        else:
            # Not remove_orphans: files the retention took out of the log stay for a while,
            # for a reader that read the log before.
            from wireproto.pipeline.tablestore import remove_expired

            remove_expired(_local_path(table_dir), grace_seconds=TIDY_GRACE_SECONDS)
    spark.dataSource.register(WireCaptureDataSource)
    rows = spark.readStream.format("wirecapture").options(**dict(options or {})).load(captures)
    rows = table_rows(rows)
    if repartition:
        rows = rows.repartition(*PARTITIONED_BY)
    writer = (rows.writeStream.format("parquet").outputMode("append").partitionBy(*PARTITIONED_BY)
              .options(**WRITE_OPTIONS)
              .options(**({} if retention is None else {"retention": retention}))
              .option("path", table_dir)
              .option("checkpointLocation", checkpoint or _join(table_dir, CHECKPOINT))
              .queryName("wireproto-ingest"))
    if once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    query = writer.start()
    if key is not None:
        _held[key].query = query
    return query


def _join(location: str, name: str) -> str:
    return f"{location.rstrip('/')}/{name}"
