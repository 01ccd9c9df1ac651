"""The table `wireproto ingest` writes: its columns, its layout and its marker, as a contract.

A table is a directory of Parquet files written by Spark's file sink, one row per message of the
captures (the `wirecapture` data source's columns, `rows.SCHEMA`) plus ``date``, the UTC day of
``timestamp``, partitioned by ``date``, ``broker`` and ``protocol`` in that order::

    TABLE/_wireproto_table.json            the marker: what this directory is, and its version
    TABLE/_spark_metadata/                 the file sink's log: the files the table holds
    TABLE/_checkpoint/                     the ingest query's checkpoint (local and hdfs://)
    TABLE/date=2026-11-27/broker=site-1/protocol=websmq/part-....snappy.parquet

Readers go through the sink's log (a file that is not in it, left by a batch cut short, is not
the table's) and read with `TABLE_SCHEMA`, so a broker named ``7`` stays the string ``"7"``.
Columns are only ever added, nullable, with a new `TABLE_VERSION`: `COLUMNS` says which version
added each, and a table an older version wrote reads the columns it lacks as null.

Needs the ``spark`` extra for `read_table`; `is_table` and the marker need only pyarrow for a
table in object storage.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from wireproto import __version__
from wireproto.pipeline.rows import SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["TABLE_VERSION", "MARKER", "PARTITIONED_BY", "COLUMNS", "TABLE_SCHEMA", "SINK_LOG",
           "CHECKPOINT", "marker_text", "check_remote_table", "table_version", "is_table",
           "read_table", "is_spark_path", "hadoop_marker"]

TABLE_VERSION = 1
FORMAT = "wireproto-table"
MARKER = "_wireproto_table.json"
SINK_LOG = "_spark_metadata"
CHECKPOINT = "_checkpoint"
PARTITIONED_BY = ("date", "broker", "protocol")

# (name, Spark SQL type, the table version that added it), in the table's order.
COLUMNS: tuple[tuple[str, str, int], ...] = (
    *((name, kind, 1) for name, kind in
      (column.strip().split(" ", 1) for column in SCHEMA.split(","))),
    ("date", "date", 1),
)
TABLE_SCHEMA = ", ".join(f"{name} {kind}" for name, kind, _ in COLUMNS)


def marker_text() -> str:
    """The marker this version writes in a new table."""
    return json.dumps({"format": FORMAT, "version": TABLE_VERSION,
                       "partitioned_by": list(PARTITIONED_BY),
                       "writer": f"wireproto {__version__}"}) + "\n"


def table_version(location: str, text: str | None) -> int:
    """The version of the table at `location` whose marker reads `text` (None: there is none).
    ValueError, in one line, when it is no wireproto table or one newer than this code."""
    if text is None:
        raise ValueError(f"{location} is not a wireproto table (no {MARKER}; "
                         "wireproto ingest writes one)")
    try:
        marker = json.loads(text)
    except ValueError:
        marker = None
    if not isinstance(marker, dict) or marker.get("format") != FORMAT or \
            not isinstance(marker.get("version"), int) or marker["version"] < 1:
        raise ValueError(f"{location} is not a wireproto table ({MARKER} is not a "
                         "wireproto table's marker)")
    version: int = marker["version"]
    if version > TABLE_VERSION:
        raise ValueError(f"{location} is a version {version} wireproto table; this wireproto "
                         f"({__version__}) reads versions up to {TABLE_VERSION}: upgrade it")
    return version


def is_spark_path(location: str) -> bool:
    """Whether Spark itself reads and writes `location`: a local path or hdfs://. (pyspark
    brings no S3 or GCS connector: those go through a local copy.)"""
    return "://" not in location or location.startswith(("file://", "hdfs://"))


def _marker_from_storage(location: str, options: Mapping[str, str] | None) -> str | None:
    """The marker's text of the table at `location` (local, or anywhere pyarrow reaches), or
    None when there is none."""
    from wireproto.capture.storage import open_store

    store = open_store(location, options)
    try:
        with store.filesystem.open_input_stream(f"{store.root}/{MARKER}") as file:
            return bytes(file.read(1 << 16)).decode("utf-8", "replace")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def is_table(location: str, options: Mapping[str, str] | None = None) -> bool:
    """Whether `location` holds a wireproto table, of any version (a newer one than this code
    reads too)."""
    try:
        text = _marker_from_storage(location, options)
    except OSError:
        return False
    try:
        table_version(location, text)
    except ValueError as error:
        return "upgrade it" in str(error)
    return True


def readable_version(location: str, options: Mapping[str, str] | None = None) -> int:
    """The version of the table at `location`, which this code reads; ValueError, in one line,
    when it is no wireproto table, one newer than this code, or cannot be reached."""
    try:
        text = _marker_from_storage(location, options)
    except OSError as error:
        raise ValueError(f"{location}: {str(error).strip().splitlines()[0]}") from None
    return table_version(location, text)


def check_remote_table(location: str, options: Mapping[str, str] | None = None) -> None:
    """Before writing the table in object storage at `location`: ValueError, in one line,
    unless nothing is there yet or it is a table this code writes."""
    import pyarrow.fs as pafs

    from wireproto.capture.storage import open_store

    try:
        text = _marker_from_storage(location, options)
        if text is None:
            store = open_store(location, options)
            if store.filesystem.get_file_info(pafs.FileSelector(store.root,
                                                                allow_not_found=True)):
                table_version(location, None)
            return
    except OSError as error:
        raise ValueError(f"{location}: {str(error).strip().splitlines()[0]}") from None
    table_version(location, text)


def hadoop_marker(spark: SparkSession, location: str, *, mark: bool = False
                  ) -> tuple[str | None, bool]:
    """The marker's text of a table Spark reads itself (None when there is none), and whether
    the sink's log is there, through Spark's Hadoop filesystem (hdfs:// included). With
    `mark`, a missing or empty directory is made a table first, and anything else there that
    is not one refused (ValueError)."""
    jvm = spark._jvm
    if jvm is None:
        raise ValueError("Spark has stopped")
    root = jvm.org.apache.hadoop.fs.Path(location)
    filesystem = root.getFileSystem(spark._jsc.hadoopConfiguration())
    marker = root.suffix(f"/{MARKER}")
    if mark and not filesystem.isFile(marker):
        if filesystem.exists(root) and (not filesystem.isDirectory(root)
                                        or len(filesystem.listStatus(root))):
            table_version(location, None)
        filesystem.mkdirs(root)
        aside = root.suffix(f"/.marker-{os.getpid()}")  # whole or not at all, as locally
        out = filesystem.create(aside, True)
        try:
            out.write(marker_text().encode())
        finally:
            out.close()
        if not filesystem.rename(aside, marker):
            filesystem.delete(aside, False)
    text = None
    if filesystem.isFile(marker):
        stream = filesystem.open(marker)
        try:
            text = bytes(stream.readAllBytes()).decode("utf-8", "replace")
        finally:
            stream.close()
    return text, filesystem.isDirectory(root.suffix(f"/{SINK_LOG}"))


def read_table(spark: SparkSession, location: str, options: Mapping[str, str] | None = None
               ) -> DataFrame:
    """The table at `location` as a DataFrame of `TABLE_SCHEMA`, read through the file sink's
    log. A table in object storage (s3://, gs://) is read from a local copy
    (`wireproto.pipeline.tablestore`). ValueError, in one line, for a location that is not a
    wireproto table or has a newer version than this code reads."""
    if not is_spark_path(location):
        table_version(location, _marker_from_storage(location, options))
        location = _local_copy(location, options)
    local = "://" not in location or location.startswith("file://")
    if local:
        path = location.removeprefix("file://")
        try:
            with open(os.path.join(path, MARKER), encoding="utf-8", errors="replace") as file:
                text: str | None = file.read(1 << 16)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            text = None
        logged = os.path.isdir(os.path.join(path, SINK_LOG))
    else:
        text, logged = hadoop_marker(spark, location)
    table_version(location, text)
    if not logged:  # marked, but no batch has started yet: no files are the table's
        return spark.createDataFrame([], TABLE_SCHEMA)
    return spark.read.schema(TABLE_SCHEMA).parquet(location)


def _local_copy(location: str, options: Mapping[str, str] | None) -> str:
    """A local copy of the table in object storage at `location`."""
    import hashlib
    import importlib

    try:
        tablestore = importlib.import_module("wireproto.pipeline.tablestore")
    except ImportError:
        raise ValueError(f"{location}: reading a table in object storage needs "
                         "wireproto.pipeline.tablestore, which this wireproto lacks") from None
    # One cache directory per table, so that only what changed is fetched again.
    name = hashlib.sha256(location.rstrip("/").encode()).hexdigest()[:16]
    cache = os.path.join(os.path.expanduser("~"), ".cache", "wireproto", "tables", name)
    return str(tablestore.fetch_table(location, cache, dict(options or {})))
