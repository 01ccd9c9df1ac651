"""Capture files wherever pyarrow's filesystems reach them: a local path or ``file://``,
``s3://bucket/prefix`` (with an endpoint, region and credentials), ``gs://``, ``hdfs://``.

A `Store` is a filesystem and a root in it. Local files are read as before (mapped, and followed
as they grow); a file in object storage is an object, written whole, so it is read as bytes: the
header first, then the records of the range a task reads, in one request.

Options (the data source's, ``wireproto analyze``'s ``--storage-option``): ``s3.endpoint``
(``http://127.0.0.1:9000``: an S3 API server of one's own), ``s3.region``, ``s3.access_key``,
``s3.secret_key``, ``s3.session_token``, ``s3.anonymous``. Without credentials, pyarrow takes
them where the AWS tools do (the environment, ~/.aws, an instance role).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import pyarrow.fs as pafs

from wireproto.capture import reader as capture_reader
from wireproto.capture.format import (
    PREAMBLE,
    CaptureHeader,
    IncompleteCapture,
    decode_file_header,
)

__all__ = ["Store", "FileIndex", "open_store", "file_index", "STORAGE_OPTIONS"]

STORAGE_OPTIONS = ("s3.endpoint", "s3.region", "s3.access_key", "s3.secret_key",
                   "s3.session_token", "s3.anonymous")
# The first read of a file: its header is almost always shorter.
_HEADER_READ = 16 << 10
# The read of a header alone, choosing files before any is read.
_SMALL_HEADER_READ = 4 << 10


@dataclass(frozen=True)
class Store:
    """A filesystem and a location in it: a capture directory or one capture file."""

    filesystem: Any
    root: str
    scheme: str = ""  # "" for the local filesystem

    @property
    def local(self) -> bool:
        return not self.scheme

    def uri(self, path: str) -> str:
        """How rows and offsets name a file: its local path, or ``SCHEME://path``."""
        return path if self.local else f"{self.scheme}://{path}"

    def path_of(self, uri: str) -> str:
        return uri if self.local else uri.split("://", 1)[1]

    def capture_files(self, prefix: str = "wirecapture") -> list[tuple[str, int]]:
        """(path, size) of the capture files under the root (in it and below it: a fleet ships
        one prefix per broker), oldest first, or of the root itself when it is a file.
        FileNotFoundError when there is nothing there."""
        info = self.filesystem.get_file_info(self.root)
        if info.type == pafs.FileType.File:
            return [(info.path, info.size)]
        if info.type != pafs.FileType.Directory:
            raise FileNotFoundError(
                f"wirecapture: no capture file or directory {self.uri(self.root)!r}")
        pattern = capture_reader.file_name_pattern(prefix)
        found = [(entry.path, entry.size) for entry in self.filesystem.get_file_info(
            pafs.FileSelector(self.root, recursive=True))
            if entry.type == pafs.FileType.File and pattern.match(entry.base_name)]
        return sorted(found, key=lambda item: os.path.split(item[0]))

    def index(self, path: str, size: int) -> FileIndex | None:
        """The index of the object `path` (`file_index`), or None when it has none, or one
        that is not of an object of `size` bytes. An index written before it held the
        records' times has `segments` None."""
        try:
            with self.filesystem.open_input_file(path + INDEX_SUFFIX) as file:
                if file.size() > MAX_INDEX_BYTES:
                    return None  # not one a writer makes: a 1 GiB file's is about 60 KiB
                index = json.loads(file.readall())
        except (OSError, ValueError):
            return None
        if not isinstance(index, dict) or index.get("size") != size:
            return None
        boundaries = index.get("boundaries")
        if not _increasing(boundaries) or not all(0 < b < size for b in boundaries):
            return None
        return FileIndex(boundaries, _index_segments(index, boundaries, size))

    def boundaries(self, path: str, size: int) -> list[int] | None:
        """The record boundaries of the object `path` from its index, or None (`index`)."""
        index = self.index(path, size)
        return None if index is None else index.boundaries

    def header(self, path: str) -> CaptureHeader:
        """The header of the object `path`, read in one small request (two for a long one);
        `IncompleteCapture` if the object is shorter than it."""
        with self.filesystem.open_input_file(path) as file:
            size = file.size()
            head = file.read_at(min(size, _SMALL_HEADER_READ), 0)
            try:
                return decode_file_header(head)
            except IncompleteCapture:
                if size <= len(head):
                    raise
                length = PREAMBLE.unpack_from(head)[3]  # checked by decode_file_header
                return decode_file_header(file.read_at(min(size, PREAMBLE.size + length), 0))

    def read_range(self, path: str, start: int | None, end: int | None, max_records: int
                   ) -> Iterator[tuple[CaptureHeader, capture_reader.Batch]]:
        """The whole records of the object `path` from `start` (None: the first) to `end`
        (None: its end), as batches of at most `max_records`, each with the file's header."""
        with self.filesystem.open_input_file(path) as file:
            size = file.size()
            head = file.read_at(min(size, _HEADER_READ), 0)
            try:
                header = decode_file_header(head)
            except IncompleteCapture:
                if size <= len(head):
                    return  # not a whole header: no records
                header = decode_file_header(file.read_at(min(size, 1 << 20), 0))
            first = header.data_offset if start is None else start
            stop = size if end is None else min(end, size)
            if first >= stop:
                return
            buf = file.read_at(stop - first, first)
        offset: int | None = first
        while offset is not None:
            batch = capture_reader.read_batch_from(buf, first, header.data_offset, self.uri(path),
                                            offset, max_records, stop)
            if len(batch):
                yield header, batch
            offset = batch.end if batch.stop == "limit" and batch.end < stop else None


# A shipped file's index, beside it: its record boundaries about every INDEX_GRAIN bytes, and
# (version 2) the span of its records and the times of each segment between boundaries.
INDEX_SUFFIX = ".idx"
INDEX_GRAIN = 1 << 20
INDEX_VERSION = 2
MAX_INDEX_BYTES = 4 << 20


@dataclass(frozen=True)
class FileIndex:
    """What a shipped file's index says: its record boundaries, and, from version 2 on, its
    records in segments between them, each with its records' times (None before)."""

    boundaries: list[int]
    segments: list[capture_reader.Segment] | None


def file_index(path: str | os.PathLike[str]) -> bytes:
    """The index of the local capture file `path`, to store beside it: its size, its record
    boundaries about every `INDEX_GRAIN` bytes, so a reader can split the object into tasks
    without reading it first, and where its records start and end (``records``) with the
    earliest and latest time in each segment between boundaries (``times``), so a reader
    asking for a time range can skip the segments outside it."""
    size = os.path.getsize(path)
    parts = capture_reader.segments(path, INDEX_GRAIN, available=size)
    index: dict[str, object] = {"size": size, "boundaries": [part.start for part in parts[1:]],
                             "version": INDEX_VERSION}
    if parts:
        index["records"] = [parts[0].start, parts[-1].end]
        index["times"] = [[part.min_ns, part.max_ns] for part in parts]
    return json.dumps(index).encode()


def _increasing(values: object) -> TypeGuard[list[int]]:
    """A list of distinct integers, in increasing order."""
    return isinstance(values, list) and all(
        type(value) is int for value in values) and values == sorted(set(values))


def _index_segments(index: dict[str, object], boundaries: list[int], size: int
                    ) -> list[capture_reader.Segment] | None:
    """The segments a version 2 index describes, or None when it has none, or they do not
    fit together (then it is read as an index of boundaries alone)."""
    version = index.get("version")
    if type(version) is not int or version < 2:
        return None
    span, times = index.get("records"), index.get("times")
    if span is None and times is None and not boundaries:
        return []  # a file without records
    if not _increasing(span) or len(span) != 2 or not isinstance(times, list):
        return None
    first, end = span
    starts, ends = [first, *boundaries], [*boundaries, end]
    if not _increasing(starts + [end]) or first < 1 or end > size or \
            len(times) != len(starts):
        return None
    found = []
    for start, end, pair in zip(starts, ends, times, strict=True):
        if not isinstance(pair, list) or len(pair) != 2 or not all(
                type(value) is int for value in pair) or pair[0] > pair[1]:
            return None
        found.append(capture_reader.Segment(start, end, pair[0], pair[1]))
    return found


def open_store(location: str | os.PathLike[str], options: Mapping[str, str] | None = None
               ) -> Store:
    """The store `location` names: a local path, ``file://...``, ``s3://bucket/prefix``,
    ``gs://...``, ``hdfs://...``, with `options` (`STORAGE_OPTIONS`) for S3."""
    options = options or {}
    text = os.fspath(location)
    if "://" not in text:
        return Store(pafs.LocalFileSystem(), os.path.abspath(text))
    scheme, rest = text.split("://", 1)
    scheme = scheme.lower()
    if scheme == "file":
        return Store(pafs.LocalFileSystem(), os.path.abspath(rest))
    if scheme == "s3":
        return Store(_s3(options), rest.rstrip("/"), "s3")
    filesystem, path = pafs.FileSystem.from_uri(text)
    return Store(filesystem, path.rstrip("/"), scheme)


def _s3(options: Mapping[str, str]) -> Any:
    settings: dict[str, Any] = {}
    endpoint = options.get("s3.endpoint")
    if endpoint:
        scheme, _, host = endpoint.rpartition("://")
        settings["endpoint_override"] = host or endpoint
        if scheme:
            settings["scheme"] = scheme
    for option, name in (("s3.region", "region"), ("s3.access_key", "access_key"),
                         ("s3.secret_key", "secret_key"),
                         ("s3.session_token", "session_token")):
        if options.get(option):
            settings[name] = options[option]
    if str(options.get("s3.anonymous", "")).lower() in ("1", "true", "yes"):
        settings["anonymous"] = True
    return pafs.S3FileSystem(**settings)
