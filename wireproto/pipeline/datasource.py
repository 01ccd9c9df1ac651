"""`wirecapture`: capture files as a Spark table, through a PySpark Python data source.

```python
from wireproto.pipeline.datasource import WireCaptureDataSource

spark.dataSource.register(WireCaptureDataSource)
messages = spark.read.format("wirecapture").load("/var/lib/wireproto/capture")
```

PATH is a directory of capture files (those named as a writer names them, see
`wireproto.capture.capture_files`; option ``prefix``, default ``wirecapture``), read with the
directories below it (a fleet's, one per broker), or one capture file, local or in object
storage (`wireproto.capture.storage`). Each file is one partition, or several record ranges of
a large one (`split_bytes`; an object in storage by the index shipped beside it), read by a
Python worker with `wireproto.capture.read_batch` (which stops cleanly at a torn last record)
and yielded as Arrow record batches made from at
most ``batch_size`` records (option, default 8192). A row is one message: a batch record gives
one row per message in it. Every message is decoded with wireproto's own codecs
(`wireproto.pipeline.decode`). The schema is `SCHEMA`.

Columns: a schema given to the reader (``spark.read.format("wirecapture").schema("timestamp
timestamp, topic string")``) picks some of `SCHEMA`'s columns, by name and with their types, and
only those are made: without a decoded column (`rows.DECODED_COLUMNS`) no message is decoded,
and without ``data`` no message bytes travel to Spark. A Python data source gets no column
pruning from Spark's optimizer, so a query that needs a few columns reads faster for saying so.

Filters: where ``spark.sql.python.filterPushdown.enabled`` is on, a batch read takes the filters
of a query it can apply exactly (`wireproto.pipeline.pushdown`) and skips the files (by their
headers' broker), segments (by a shipped file's index, or a scan of a local file's record
headers), records and rows they rule out; Spark applies the rest. Where it is off (Spark's
default) every row is read and Spark filters them, as before.

Streaming: ``spark.readStream.format("wirecapture").load(PATH)`` reads what the writer appends
and the files it rotates to (`WireCaptureStreamReader`). An offset is ``{file path: byte offset}``,
each offset a record boundary: a record still being written (or a file header not yet complete)
waits for a later micro-batch. Options ``maxRecordsPerTrigger`` and ``maxFilesPerTrigger`` cap a
micro-batch; ``trigger(availableNow=True)`` reads what is there when the query starts.

Needs the ``spark`` extra (pyspark[sql] >= 4.2, which brings pyarrow).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from wireproto import capture
from wireproto.capture.storage import STORAGE_OPTIONS, open_store
from wireproto.pipeline.pushdown import Pushdown, conditions, select_records
from wireproto.pipeline.rows import (
    ARROW_SCHEMA,
    SCHEMA,
    Openings,
    broker_of,
    decode_batch,
    projected_schema,
)

__all__ = ["SCHEMA", "WireCaptureDataSource", "WireCaptureReader", "WireCaptureStreamReader",
           "CaptureFilePartition", "CaptureRangePartition", "capture_paths", "ReadProgress",
           "bytes_read"]

DEFAULT_BATCH_SIZE = 8192
# A local file's task that filters on times or offsets scans its record headers and reads the
# segments of about this many bytes that may match (a scan costs the same whatever the grain).
SCAN_GRAIN = 256 << 10


def capture_paths(path: str | os.PathLike[str], prefix: str = "wirecapture") -> list[str]:
    """The capture files to read: `path` itself if it is a file, else the capture files in the
    directory `path` and its subdirectories (a fleet's, one per broker), oldest first. Raises
    FileNotFoundError if there is no such path."""
    target = Path(path)
    if target.is_file():
        return [os.fspath(target.resolve())]
    if not target.is_dir():
        raise FileNotFoundError(f"wirecapture: no capture file or directory {os.fspath(path)!r}")
    return [os.fspath(file.resolve())
            for file in capture.capture_files(target, prefix, recursive=True)]


class CaptureFilePartition(InputPartition):
    """One capture file: one Spark task."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class WireCaptureDataSource(DataSource):
    """``spark.read.format("wirecapture").load(PATH)``; options ``prefix`` and ``batch_size``.
    ``spark.readStream`` also takes ``maxRecordsPerTrigger`` and ``maxFilesPerTrigger``."""

    @classmethod
    def name(cls) -> str:
        return "wirecapture"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> WireCaptureReader:
        return WireCaptureReader(self.options, arrow_schema(schema))

    def streamReader(self, schema: StructType) -> WireCaptureStreamReader:
        return WireCaptureStreamReader(self.options, arrow_schema(schema))


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of the columns a reader makes: all of `SCHEMA`'s, or those a schema given
    to the reader names. Raises ValueError for a column that is not one of `SCHEMA`'s, or one
    given another type."""
    from pyspark.sql.pandas.types import to_arrow_schema

    wanted = to_arrow_schema(schema, timezone="UTC")
    chosen = projected_schema(wanted.names)
    for field in wanted:
        if field.type != chosen.field(field.name).type:
            raise ValueError(f"wirecapture: column {field.name} is "
                             f"{ARROW_SCHEMA.field(field.name).type}, not {field.type}")
    return chosen


Default = TypeVar("Default", bound=int | None)


def _positive_option(options: Any, name: str, default: Default) -> int | Default:
    """An option that must be a positive integer, or `default` when it is not given."""
    text = options.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = 0
    if value < 1:
        raise ValueError(f"wirecapture: {name} must be a positive integer, not {text!r}")
    return value


class _CaptureReading:
    """What the batch and the stream readers share: the options ``path``, ``prefix`` and
    ``batch_size``, and reading a file's records as Arrow batches of rows."""

    def __init__(self, options: Any, schema: pa.Schema = ARROW_SCHEMA) -> None:
        self.schema = schema
        path = options.get("path")
        if not path:
            raise ValueError('wirecapture: give a capture directory or file: .load(PATH) or '
                             '.option("path", PATH)')
        self.path = path
        self.prefix = options.get("prefix", "wirecapture")
        self.progress = options.get("progress")
        self.batch_size = _positive_option(options, "batch_size", DEFAULT_BATCH_SIZE)
        # Where the files are: local (read as before), or object storage (read as bytes).
        self.store = open_store(path, {name: options[name] for name in STORAGE_OPTIONS
                                       if options.get(name) is not None})
        # The filters Spark pushed that the reader applies (a batch read's; none for a stream).
        self.pushdown = Pushdown()

    def _files(self) -> list[tuple[str, int]]:
        """(file as rows name it, size) of every capture file to read, oldest first."""
        if self.store.local:
            found = []
            for path in capture_paths(self.path, self.prefix):
                try:
                    found.append((path, os.path.getsize(path)))
                except FileNotFoundError:
                    continue  # removed since it was listed
            return found
        return [(self.store.uri(path), size)
                for path, size in self.store.capture_files(self.prefix)]

    def _read_file(self, path: str, start: int | None, end: int | None
                   ) -> Iterator[pa.RecordBatch]:
        """The rows of `path` from `start` (None: the first record), up to `end` (None: as far
        as the file holds whole records; a torn last record, or one being written, ends it)."""
        first = start
        opened = Openings(None if first is None else lambda: self._opens_before(path, first))
        progress = ReadProgress(self.progress, path, start)
        if not self.store.local:
            for header, batch in self.store.read_range(self.store.path_of(path), start, end,
                                                       self.batch_size):
                progress.read_to(batch.end)  # said before its rows go, as a reader sees them
                yield from self._rows(path, batch, broker_of(header), opened)
            return
        try:
            broker = broker_of(capture.read_header(path))
        except capture.IncompleteCapture:
            return  # a file whose header is not written yet has no records either
        ranges = [(start, end)]
        if self.pushdown.skips_segments:
            ranges = self._kept_ranges(path, start, end)
        for range_start, range_end in ranges:
            if range_start is not None and range_start != first:
                # A range after skipped records looks back for its connections' opens itself.
                opened = Openings(functools.partial(self._opens_before, path, range_start))
            yield from self._read_local(path, broker, range_start, range_end, opened, progress)

    def _read_local(self, path: str, broker: str, start: int | None, end: int | None,
                    opened: Openings, progress: ReadProgress) -> Iterator[pa.RecordBatch]:
        while end is None or start is None or start < end:
            batch = capture.read_batch(path, start_offset=start, max_records=self.batch_size,
                                       available=end)
            progress.read_to(batch.end)  # said before its rows go, as a reader sees them
            yield from self._rows(path, batch, broker, opened)
            if batch.stop != "limit":
                return
            start = batch.end

    def _kept_ranges(self, path: str, start: int | None, end: int | None
                     ) -> list[tuple[int | None, int | None]]:
        """The parts of a local file's range whose records may match the offsets and times
        asked for, from a scan of its record headers (lengths and timestamps; no CRC, no
        data). Records past the scan's end (written since) are read as a plain read would."""
        parts = capture.segments(path, SCAN_GRAIN, start, available=end)
        if not parts:
            return [(start, end)]
        kept: list[tuple[int | None, int | None]] = []
        for part in parts:
            if not self.pushdown.keeps_segment(part):
                continue
            if kept and kept[-1][1] == part.start:
                kept[-1] = (kept[-1][0], part.end)
            else:
                kept.append((part.start, part.end))
        if end is None:
            if kept and kept[-1][1] == parts[-1].end:
                kept[-1] = (kept[-1][0], None)
            else:
                kept.append((parts[-1].end, None))
        return kept

    def _rows(self, path: str, batch: capture.Batch, broker: str, opened: Openings
              ) -> Iterator[pa.RecordBatch]:
        """The rows of a batch of records that the pushed filters keep: the records they rule
        out by their headers are never decoded."""
        if not len(batch):
            return
        mask = self.pushdown.record_mask(batch)
        if mask is not None:
            # What the open records say of their connections holds for the records kept.
            opened.learn(batch)
            if not mask.any():
                return
            batch = select_records(batch, mask)
        rows = decode_batch(path, batch, broker, self.schema, opened)
        keep = self.pushdown.row_mask(rows)
        if keep is not None:
            rows = rows.filter(pa.array(keep))
        if rows.num_rows:
            yield rows
    def _opens_before(self, path: str, start: int) -> Iterator[tuple[int, bytes]]:
        """(connection, data) of the open records of `path` before offset `start`."""
        if not self.store.local:
            for _, batch in self.store.read_range(self.store.path_of(path), None, start,
                                                  self.batch_size):
                yield from ((connection, data) for connection, kind, data in zip(
                    batch.connection, batch.kind, batch.data, strict=True)
                    if kind == capture.Kind.OPEN)
            return
        for record in capture.iter_records(path, None, available=start):
            if record.kind == capture.Kind.OPEN:
                yield record.connection, record.data


class ReadProgress:
    """Option ``progress``, a local directory: a read task keeps in a file of its own there how
    many bytes of its file it has read, for a progress line on the driver (`wireproto
    analyze`'s) to add up. Where the directory is not (a worker on another machine), nothing
    is kept."""

    def __init__(self, directory: str | None, path: str, start: int | None) -> None:
        self.file: str | None = None
        self.start = start or 0
        if directory and os.path.isdir(directory):
            name = hashlib.sha1(f"{path}\0{start}".encode()).hexdigest()[:20]
            self.file = os.path.join(directory, name)

    def read_to(self, offset: int) -> None:
        """The task has read its file up to `offset`."""
        if self.file is None:
            return
        try:
            descriptor = os.open(self.file, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.pwrite(descriptor, f"{offset - self.start:>20}".encode(), 0)
            finally:
                os.close(descriptor)
        except OSError:
            self.file = None  # progress is a nicety: the read goes on without it


def bytes_read(directory: str) -> int:
    """The bytes the read tasks have said they read, in `directory` (option ``progress``)."""
    total = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        try:
            with open(os.path.join(directory, name), "rb") as file:
                total += int(file.read(20) or b"0")
        except (OSError, ValueError):
            continue
    return total


class CaptureRangePartition(InputPartition):
    """The records of one capture file from `start` (None: the first record) to `end` (None:
    as far as the file holds whole records), both record boundaries: one Spark task of a
    micro-batch, or of a batch read that splits a large file."""

    def __init__(self, path: str, start: int | None, end: int | None) -> None:
        super().__init__((path, start, end))
        self.path = path
        self.start = start
        self.end = end


def split_bytes(sizes: list[int], max_partition_bytes: int, open_cost: int,
                min_partitions: int) -> int:
    """How many bytes one task reads at most, as Spark sizes its file splits: no more than
    `max_partition_bytes` (spark.sql.files.maxPartitionBytes), and few enough that the files
    make `min_partitions` tasks (spark.sql.files.minPartitionNum, by default the cluster's
    cores), each file counted `open_cost` bytes more (spark.sql.files.openCostInBytes).

    >>> split_bytes([1 << 30], 128 << 20, 4 << 20, 2)    # one 1 GiB file on 2 cores
    134217728
    >>> split_bytes([64 << 20], 128 << 20, 4 << 20, 8)   # 64 MiB on 8 cores: 8.5 MiB each
    8912896
    """
    total = sum(size + open_cost for size in sizes)
    return min(max_partition_bytes, max(open_cost, total // max(1, min_partitions)))


class WireCaptureReader(_CaptureReading, DataSourceReader):
    """A batch read: each file, or each range of about `split_bytes` of a larger one, is one
    Spark task. Filters Spark pushes (`pushFilters`) leave out the files, ranges, records and
    rows they rule out (`wireproto.pipeline.pushdown`)."""

    def __init__(self, options: Any, schema: pa.Schema = ARROW_SCHEMA) -> None:
        super().__init__(options, schema)
        self.max_partition_bytes = _positive_option(options, "maxPartitionBytes", 128 << 20)
        self.open_cost = _positive_option(options, "openCostInBytes", 4 << 20)
        self.min_partitions = _positive_option(options, "minPartitions", 1)
        # Spark refuses to plan a read whose reader overrides pushFilters while
        # spark.sql.python.filterPushdown.enabled is off (its default), for sources whose rows
        # would be wrong without it. This reader's rows are the same either way, only cheaper
        # with it, so it answers pushFilters without overriding it: reads work in every
        # session, and skip what they can where pushdown is on.
        vars(self)["pushFilters"] = _PushFilters(self)

    def push_filters(self, filters: list[Filter]) -> list[Filter]:
        """Take the filters this reader applies in full; give back the others, for Spark."""
        taken, left = conditions(filters, self.schema.names)
        self.pushdown = Pushdown(tuple(taken))
        return left

    def partitions(self) -> list[InputPartition]:
        files = self._files()
        if self.pushdown:
            files = self._chosen(files)
        target = split_bytes([size for _, size in files], self.max_partition_bytes,
                             self.open_cost, self.min_partitions)
        partitions: list[InputPartition] = []
        for path, size in files:
            if not self.store.local and (size > target or self.pushdown.skips_segments):
                partitions += self._object_ranges(path, size, target)
            elif size <= target:
                partitions.append(CaptureFilePartition(path))
            else:
                partitions += [CaptureRangePartition(path, start, end)
                               for start, end in capture.split_ranges(path, target)]
        return partitions

    def _chosen(self, files: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The files whose rows may match the filters on `file` and `broker` (read from each
        file's header, an object's in one small request)."""
        files = [(path, size) for path, size in files if self.pushdown.keeps_file(path)]
        if not self.pushdown.needs_broker:
            return files
        if self.store.local:
            brokers = [self._broker(path) for path, _ in files]
        else:
            with ThreadPoolExecutor(max_workers=16) as pool:
                brokers = list(pool.map(self._broker, [path for path, _ in files]))
        return [file for file, broker in zip(files, brokers, strict=True)
                if self.pushdown.keeps_file(file[0], broker)]

    def _broker(self, path: str) -> str | None:
        """The broker that wrote `path`, or None when its header cannot say (a file being
        created, or not a capture: its task reads it as a plain read would)."""
        try:
            if self.store.local:
                return broker_of(capture.read_header(path))
            return broker_of(self.store.header(self.store.path_of(path)))
        except (capture.CaptureError, OSError):
            return None

    def _object_ranges(self, path: str, size: int, target: int) -> list[InputPartition]:
        """An object's tasks, by the index shipped beside it: ranges of about `target` bytes,
        leaving out the segments the filters on offsets and times rule out. Without an index
        it is one task, since finding its record boundaries would mean reading it."""
        index = self.store.index(self.store.path_of(path), size)
        if index is None:
            return [CaptureFilePartition(path)]
        if not self.pushdown.skips_segments or index.segments is None:
            return [CaptureRangePartition(path, start, end) for start, end in
                    capture.ranges_from_boundaries(index.boundaries, target)]
        ranges: list[tuple[int, int]] = []
        for part in index.segments:
            if not self.pushdown.keeps_segment(part):
                continue
            if ranges and ranges[-1][1] == part.start and \
                    ranges[-1][1] - ranges[-1][0] < target:
                ranges[-1] = (ranges[-1][0], part.end)
            else:
                ranges.append((part.start, part.end))
        return [CaptureRangePartition(path, start, end) for start, end in ranges]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, CaptureRangePartition):
            return self._read_file(partition.path, partition.start, partition.end)
        if isinstance(partition, CaptureFilePartition):
            return self._read_file(partition.path, None, None)
        return iter(())  # Spark's one stand-in partition when there are none: nothing to read


class _PushFilters:
    """`WireCaptureReader.pushFilters`, seen by Spark's planner as the method it inherits
    (its ``__func__``), and calling the reader's `push_filters`."""

    __func__ = staticmethod(DataSourceReader.pushFilters)

    def __init__(self, reader: WireCaptureReader) -> None:
        self.reader = reader

    def __call__(self, filters: list[Filter]) -> list[Filter]:
        return self.reader.push_filters(filters)


class WireCaptureStreamReader(_CaptureReading, DataSourceStreamReader,
                              SupportsTriggerAvailableNow):
    """``spark.readStream.format("wirecapture").load(PATH)``.

    An offset maps each capture file read so far to the record boundary where its next read
    starts; a file missing from it is read from its first record. `latestOffset` lists the
    files (new ones appear as the writer rotates) and scans each from its offset to the size it
    has now: a half-written last record, or a header not yet complete, is left for a later
    micro-batch, never read torn and never skipped."""

    def __init__(self, options: Any, schema: pa.Schema = ARROW_SCHEMA) -> None:
        super().__init__(options, schema)
        self.max_records = _positive_option(options, "maxRecordsPerTrigger", None)
        self.max_files = _positive_option(options, "maxFilesPerTrigger", None)
        self._files()  # fails now if there is no such path
        # trigger(availableNow=True): the file sizes when the query started, read no further.
        self.target: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        return {}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_records is not None:
            return ReadMaxRows(self.max_records)
        if self.max_files is not None:
            return ReadMaxFiles(self.max_files)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = dict(self._files())

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        max_records, max_files = None, None
        if not isinstance(limit, ReadAllAvailable):
            # Spark passes our default limit; both options apply together.
            max_records, max_files = self.max_records, self.max_files
            if isinstance(limit, ReadMaxRows):
                max_records = limit.max_rows
            elif isinstance(limit, ReadMaxFiles):
                max_files = limit.max_files
        latest = dict(start)
        files = 0
        for path, size in self._files():
            if max_records is not None and max_records <= 0:
                break
            if max_files is not None and files >= max_files:
                break
            if self.target is not None:
                if path not in self.target:
                    continue  # appeared after an availableNow query started
                size = min(size, self.target[path])
            offset = start.get(path)
            if offset is not None and offset >= size:
                continue
            if not self.store.local:
                # An object is written whole: read once, to its end (a torn tail ends it).
                latest[path] = size
                files += 1
                continue
            try:
                scan = capture.scan_offsets(path, offset, limit=max_records, available=size)
            except FileNotFoundError:
                continue  # removed since it was listed
            if not scan.starts:
                continue  # nothing whole yet
            latest[path] = scan.end
            files += 1
            if max_records is not None:
                max_records -= len(scan.starts)
        return dict(sorted(latest.items()))

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [CaptureRangePartition(path, start.get(path), offset)
                for path, offset in sorted(end.items()) if start.get(path) != offset]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        return self._read_file(partition.path, partition.start, partition.end)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: capture files are the writer's to rotate and remove."""
