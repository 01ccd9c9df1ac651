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
from typing import Any

import pyarrow.fs as pafs

from wireproto.capture import reader as capture_reader
from wireproto.capture.format import CaptureHeader, IncompleteCapture, decode_file_header

__all__ = ["Store", "open_store", "STORAGE_OPTIONS"]

STORAGE_OPTIONS = ("s3.endpoint", "s3.region", "s3.access_key", "s3.secret_key",
                   "s3.session_token", "s3.anonymous")
# The first read of a file: its header is almost always shorter.
_HEADER_READ = 16 << 10


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

    def boundaries(self, path: str, size: int) -> list[int] | None:
        """The record boundaries of the object `path` from its index (`file_index`), or None
        when it has none, or one that is not of an object of `size` bytes."""
        try:
            with self.filesystem.open_input_file(path + INDEX_SUFFIX) as file:
                index = json.loads(file.readall())
        except (OSError, ValueError):
            return None
        if not isinstance(index, dict) or index.get("size") != size:
            return None
        boundaries = index.get("boundaries")
        if not isinstance(boundaries, list) or not all(
                isinstance(b, int) and 0 < b < size for b in boundaries) or \
                boundaries != sorted(set(boundaries)):
            return None
        return boundaries

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


# A shipped file's index, beside it: its record boundaries about every INDEX_GRAIN bytes.
INDEX_SUFFIX = ".idx"
INDEX_GRAIN = 4 << 20


def file_index(path: str | os.PathLike[str]) -> bytes:
    """The index of the local capture file `path`, to store beside it: its size and its record
    boundaries about every `INDEX_GRAIN` bytes, so a reader can split the object into tasks
    without reading it first."""
    boundaries = [start for start, _ in capture_reader.split_ranges(path, INDEX_GRAIN)[1:]]
    return json.dumps({"size": os.path.getsize(path), "boundaries": boundaries}).encode()


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
