"""`wirecapture`: capture files as a Spark table, through a PySpark Python data source.

```python
from wireproto.pipeline.datasource import WireCaptureDataSource

spark.dataSource.register(WireCaptureDataSource)
messages = spark.read.format("wirecapture").load("/var/lib/wireproto/capture")
```

PATH is a directory of capture files (those named as a writer names them, see
`wireproto.capture.capture_files`; option ``prefix``, default ``wirecapture``) or one capture
file. Each file is one partition, read by a Python worker with `wireproto.capture.read_batch`
(which stops cleanly at a torn last record) and yielded as Arrow record batches made from at
most ``batch_size`` records (option, default 8192). A row is one message: a batch record gives
one row per message in it. Every message is decoded with wireproto's own codecs
(`wireproto.pipeline.decode`). The schema is `SCHEMA`.

Needs the ``spark`` extra (pyspark[sql] >= 4.2, which brings pyarrow).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from wireproto import capture
from wireproto.pipeline.rows import SCHEMA, decode_batch

__all__ = ["SCHEMA", "WireCaptureDataSource", "WireCaptureReader", "CaptureFilePartition",
           "capture_paths"]

DEFAULT_BATCH_SIZE = 8192


def capture_paths(path: str | os.PathLike[str], prefix: str = "wirecapture") -> list[str]:
    """The capture files to read: `path` itself if it is a file, else the capture files in the
    directory `path`, oldest first. Raises FileNotFoundError if there is no such path."""
    target = Path(path)
    if target.is_file():
        return [os.fspath(target.resolve())]
    if not target.is_dir():
        raise FileNotFoundError(f"wirecapture: no capture file or directory {os.fspath(path)!r}")
    return [os.fspath(file.resolve()) for file in capture.capture_files(target, prefix)]


class CaptureFilePartition(InputPartition):
    """One capture file: one Spark task."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class WireCaptureDataSource(DataSource):
    """``spark.read.format("wirecapture").load(PATH)``; options ``prefix`` and ``batch_size``."""

    @classmethod
    def name(cls) -> str:
        return "wirecapture"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> WireCaptureReader:
        return WireCaptureReader(self.options)


class WireCaptureReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        path = options.get("path")
        if not path:
            raise ValueError('wirecapture: give a capture directory or file: .load(PATH) or '
                             '.option("path", PATH)')
        self.path = path
        self.prefix = options.get("prefix", "wirecapture")
        self.batch_size = int(options.get("batch_size", DEFAULT_BATCH_SIZE))
        if self.batch_size < 1:
            raise ValueError(f"wirecapture: batch_size must be at least 1, not {self.batch_size}")

    def partitions(self) -> list[InputPartition]:
        return [CaptureFilePartition(path) for path in capture_paths(self.path, self.prefix)]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        path = partition.path
        start = None
        while True:
            batch = capture.read_batch(path, start_offset=start, max_records=self.batch_size)
            if len(batch):
                yield decode_batch(path, batch)
            if batch.stop != "limit":
                return  # "end", or "partial": a torn last record (or one being written)
            start = batch.end
