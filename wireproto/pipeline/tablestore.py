"""A wireproto table in object storage (``s3://``, ``gs://``), and keeping a table tidy.

Spark writes a table only where Hadoop reaches (a local path, ``hdfs://``): pyspark ships no S3
or GCS connector. So ingest writes into a local staging table, and `TableMirror` uploads it
with pyarrow; a reader gets a local copy with `fetch_table`. No Spark runs here.

The table's file-sink log (``_spark_metadata/``: one file per micro-batch, every tenth a
``.compact`` file holding all the entries still in force) is what a reader goes by: it names
every data file of the table, and nothing else is in the table. A reader reads the latest
compact file and the batch files after it. So the mirror uploads a batch's data files before
the batch's log file, and the log file before the checkpoint's note that the batch is done: a
reader never sees a file that is not all there, and a crash between any two uploads leaves a
table a reader reads right and the next `TableMirror.sync` completes.

The log's entries name files by URL: the staging table's are ``file:///...``; the mirror writes
the remote table's log with its own URLs (``s3://bucket/table/date=.../part-...parquet``), and a
local copy's with the copy's paths.

Files leave a table only through the sink's ``retention`` option: a compaction of the log drops
the entries of files written longer ago than that. `remove_expired` then deletes such files,
and any other file no log entry names, once they have been out of the log for a grace period,
so that a reader who read the log before the compaction still finds them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote, unquote, urlsplit

import pyarrow.fs as pafs

from wireproto.capture.storage import Store, open_store

__all__ = ["TableMirror", "SyncReport", "fetch_table", "default_cache_dir", "remove_expired",
           "listed_files", "duration_seconds", "LOG_DIR", "CHECKPOINT_DIR", "MARKER"]

LOG_DIR = "_spark_metadata"
CHECKPOINT_DIR = "_checkpoint"
MARKER = "_wireproto_table.json"
# Where a local copy notes the table it copies, and `remove_expired` the files out of the log.
_COPY_OF = "_wireproto_copy_of.json"
_TIDY = "_wireproto_tidy.json"
_LOG_NAME = re.compile(r"(\d+)(\.compact)?")
_LOG_VERSION = "v1"  # the file-sink log's format, as Spark 3 and 4 write it
_OBJECT_STORES = ("s3", "gcs")  # pyarrow type names: an object appears whole, or not at all
_THREADS = 8
_ATTEMPTS = 5  # reads of a log a compaction may be rewriting meanwhile
_CHUNK = 8 << 20
T = TypeVar("T")


def _batch_of(name: str) -> int | None:
    match = _LOG_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def _view(names: Iterable[str]) -> list[str]:
    """The log files a reader reads, in order: the latest compact file and every batch file
    after it (as Spark's own reader does)."""
    batches = sorted((_batch_of(name), name) for name in names if _batch_of(name) is not None)
    compacts = [index for index, (_, name) in enumerate(batches) if name.endswith(".compact")]
    return [name for _, name in batches[compacts[-1] if compacts else 0:]]


def _parse_log(text: bytes, name: str) -> tuple[str, list[dict[str, object]]]:
    lines = text.decode().splitlines()
    if not lines or lines[0] != _LOG_VERSION:
        raise ValueError(f"{LOG_DIR}/{name}: not a file-sink log of version {_LOG_VERSION} "
                         f"(it starts {lines[0][:20] if lines else ''!r})")
    entries = [json.loads(line) for line in lines[1:] if line.strip()]
    if not all(isinstance(entry, dict) and isinstance(entry.get("path"), str)
               for entry in entries):
        raise ValueError(f"{LOG_DIR}/{name}: an entry without a path")
    return lines[0], entries


def _check_relative(rel: str, url: str) -> str:
    """`rel` when it names a data file inside a table: no ``..``, no ``_`` or ``.`` names (the
    log, the checkpoint, the marker), so a hostile log cannot make a copy write elsewhere."""
    parts = rel.split("/")
    if not rel or any(not part or part in (".", "..") or part[0] in "_." for part in parts) \
            or "\\" in rel or "\0" in rel:
        raise ValueError(f"the table's log names {url!r}, which is not a data file of the table")
    return rel


class _Table:
    """A table's directory in a store, and how its log's entries name its files."""

    def __init__(self, location: str | os.PathLike[str],
                 options: Mapping[str, str] | None = None) -> None:
        self.store: Store = open_store(location, options)
        self.fs = self.store.filesystem
        self.root = self.store.root
        text = os.fspath(location)
        if self.store.local:
            self.prefix = "file://" + quote(self.root)
            self._roots = {self.root, os.path.realpath(self.root)}
        elif self.store.scheme in ("s3", "gs", "gcs"):
            self.prefix = f"{self.store.scheme}://{self.root}"
        else:
            self.prefix = text.rstrip("/")
        self.name = self.store.uri(self.root)

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def url(self, rel: str) -> str:
        """How this table's log names its file `rel`."""
        return f"{self.prefix}/{quote(rel, safe='/=')}"

    def relative(self, url: str) -> str:
        """The file a log entry's URL names, relative to the table; ValueError when it is not a
        data file of this table."""
        if url.startswith(self.prefix + "/"):
            return _check_relative(unquote(url[len(self.prefix) + 1:]), url)
        if self.store.local and url.startswith("file:"):  # Hadoop's own spelling of the path
            path = os.path.normpath(unquote(urlsplit(url).path))
            for root in self._roots:
                if path.startswith(root.rstrip("/") + "/"):
                    return _check_relative(path[len(root.rstrip("/")) + 1:], url)
        return _check_relative("", url)

    # -- reading

    def listing(self, rel: str = "", recursive: bool = False) -> list[pafs.FileInfo]:
        """The files under `rel` (none when it is missing)."""
        selector = pafs.FileSelector(self.path(rel) if rel else self.root, recursive=recursive,
                                     allow_not_found=True)
        return [info for info in self.fs.get_file_info(selector)
                if info.type == pafs.FileType.File]

    def log_files(self) -> dict[str, pafs.FileInfo]:
        return {info.base_name: info for info in self.listing(LOG_DIR)
                if _batch_of(info.base_name) is not None}

    def read(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.path(rel)) as stream:
            return bytes(stream.read())

    def read_log(self) -> list[tuple[str, str, list[dict[str, object]]]]:
        """(name, version line, entries) of the log files a reader reads, in order. A batch
        file that is gone meanwhile (a compaction, then Spark's clean-up of the files before
        it) means reading the log again; FileNotFoundError when it keeps happening."""
        for attempt in range(_ATTEMPTS):
            try:
                return [(name, *_parse_log(self.read(f"{LOG_DIR}/{name}"), name))
                        for name in _view(self.log_files())]
            except FileNotFoundError:
                if attempt == _ATTEMPTS - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def data_files(self) -> list[pafs.FileInfo]:
        """The files of the table's partitions: every file but those under a ``_`` or ``.``
        name, which Spark leaves out of a table too."""
        found = []
        for info in self.listing(recursive=True):
            rel = info.path[len(self.root) + 1:]
            if not any(part[:1] in ("_", ".") for part in rel.split("/")):
                found.append(info)
        return found

    # -- writing

    def put(self, rel: str, source: bytes | str) -> int:
        """Write `source` (bytes, or a local file's path) as `rel`, whole: in object storage an
        object appears when its upload completes; elsewhere it is written beside and moved into
        place. Bytes written."""
        path = self.path(rel)
        whole = self.fs.type_name in _OBJECT_STORES
        target = path if whole else f"{os.path.dirname(path)}/.{os.path.basename(path)}.part"
        if not whole:
            self.fs.create_dir(os.path.dirname(path), recursive=True)
        written = 0
        with self.fs.open_output_stream(target) as out:
            if isinstance(source, bytes):
                out.write(source)
                written = len(source)
            else:
                with open(source, "rb") as file:
                    while chunk := file.read(_CHUNK):
                        out.write(chunk)
                        written += len(chunk)
        if not whole:
            self.fs.move(target, path)
        return written

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(self.path(rel))
        except FileNotFoundError:
            pass


def _rewritten(version: str, entries: list[dict[str, object]], source: _Table,
               target: _Table) -> bytes:
    """A log file's text with each entry's path moved from table `source` to `target`; every
    other field (size, modification time, action) as it was."""
    lines = [version]
    for entry in entries:
        moved = dict(entry, path=target.url(source.relative(str(entry["path"]))))
        lines.append(json.dumps(moved, separators=(",", ":")))
    return "\n".join(lines).encode()


def _added(entries: Iterable[dict[str, object]], table: _Table) -> dict[str, int]:
    """The files log entries add, in order (Spark 4 writes only "add"; an older Spark's
    "delete" takes a file out again), with their sizes."""
    files: dict[str, int] = {}
    for entry in entries:
        rel = table.relative(str(entry["path"]))
        if entry.get("action", "add") == "delete":
            files.pop(rel, None)
        else:
            size = entry.get("size")
            files[rel] = size if isinstance(size, int) else -1
    return files


def _in_force(log: list[tuple[str, str, list[dict[str, object]]]], table: _Table
              ) -> dict[str, int]:
    """The files a log read by `_Table.read_log` names."""
    return _added((entry for _, _, entries in log for entry in entries), table)


def _parallel(calls: list[Callable[[], T]]) -> list[T]:
    """Each call's result, the calls made on a few threads (pyarrow's I/O releases the GIL)."""
    if len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(min(_THREADS, len(calls))) as pool:
        return list(pool.map(lambda call: call(), calls))


def listed_files(table: str | os.PathLike[str], options: Mapping[str, str] | None = None
                 ) -> dict[str, int]:
    """The data files the log of `table` names, as a reader sees them (path relative to the
    table -> size in bytes)."""
    store = _Table(table, options)
    return _in_force(store.read_log(), store)


def _remove_local(root: str, rel: str, prune: bool = False) -> None:
    """Remove the file `rel` of the local table `root`; with `prune`, the partition directories
    it leaves empty too (never in a table Spark writes: a task may be about to write there)."""
    path = Path(root, rel)
    path.unlink(missing_ok=True)
    for parent in path.parents if prune else ():
        if parent == Path(root) or not str(parent).startswith(root):
            break
        try:
            parent.rmdir()
        except OSError:
            break


# -- the mirror ------------------------------------------------------------------------------------


@dataclass
class SyncReport:
    """What one `TableMirror.sync` uploaded: micro-batches, their data files and bytes."""

    batches: int = 0
    files: int = 0
    bytes: int = 0


def _is_commit(rel: str) -> bool:
    return rel.startswith("commits/")


class TableMirror:
    """The local staging table `staging` that a streaming query writes, kept uploaded to the
    table `remote` (``s3://bucket/table``, any location `open_store` reaches, with its
    `options`), and its checkpoint (`checkpoint`, by default ``staging/_checkpoint``) to
    ``remote/_checkpoint``.

    One query writes a table at a time: two ingests of one table, from one machine or two,
    would number their micro-batches alike, as two queries on one checkpoint would."""

    def __init__(self, staging: str | os.PathLike[str], remote: str | os.PathLike[str],
                 options: Mapping[str, str] | None = None, *,
                 checkpoint: str | os.PathLike[str] | None = None) -> None:
        self.staging = _Table(staging)
        self.remote = _Table(remote, options)
        self.checkpoint = Path(checkpoint if checkpoint is not None
                               else Path(self.staging.root, CHECKPOINT_DIR)).absolute()
        self._done: set[str] = set()  # log files uploaded, their data files gone from staging
        self._marker: bytes | None = None  # the marker known to be in the remote table

    def sync(self) -> SyncReport:
        """Upload what the staging table has that the remote one has not: for each micro-batch
        in turn, its data files, then its log file; the checkpoint's offsets (the batches
        planned) before them and its commits (the batches done) after them. Data files
        uploaded are removed from staging. Safe to call while the query runs (only the
        micro-batches logged when it starts are uploaded), and again after a crash."""
        report = SyncReport()
        local = self.staging.log_files()
        self._put_marker()
        remote_log = set(self.remote.log_files())
        last = max((_batch_of(name) or 0 for name in local), default=-1)
        remote_checkpoint = {info.path[len(self.remote.path(CHECKPOINT_DIR)) + 1:]: info.size
                             for info in self.remote.listing(CHECKPOINT_DIR, recursive=True)}
        self._put_checkpoint(remote_checkpoint, lambda rel: not _is_commit(rel))
        for name in sorted(local, key=lambda name: _batch_of(name) or 0):
            if name in self._done:
                continue
            try:
                version, entries = _parse_log(self.staging.read(f"{LOG_DIR}/{name}"), name)
            except FileNotFoundError:  # Spark cleaned it up after a compaction
                continue
            files = _added(entries, self.staging)
            present = [rel for rel in files if os.path.isfile(self.staging.path(rel))]
            if name not in remote_log:
                if not name.endswith(".compact"):
                    self._check_uploaded(name, [rel for rel in files if rel not in present])
                sizes = _parallel([partial(self.remote.put, rel, self.staging.path(rel))
                                   for rel in present])
                self.remote.put(f"{LOG_DIR}/{name}",
                                _rewritten(version, entries, self.staging, self.remote))
                report.batches += 1
                report.files += len(present)
                report.bytes += sum(sizes)
            for rel in present:
                _remove_local(self.staging.root, rel)
            self._done.add(name)
        self._put_checkpoint(remote_checkpoint, lambda rel: _is_commit(rel) and (
            _batch_of(os.path.basename(rel)) or 0) <= last)
        self._forget(remote_log, set(local), remote_checkpoint)
        return report

    def restore(self) -> None:
        """Bring the remote table's log, marker and checkpoint into the staging directory, so
        that a query resumes where the last one stopped, on this machine or another. The log
        comes last, in one move: a staging directory without one is restored again.

        A staging directory that already holds a table (a run before, on this machine) is
        synced instead (what a run killed before its last sync left there is uploaded);
        ValueError when the remote table has micro-batches it lacks, or when the remote
        location is neither a wireproto table nor empty."""
        if self.staging.log_files():
            self.sync()
            here = max((_batch_of(name) or 0 for name in self.staging.log_files()), default=-1)
            there = max((_batch_of(name) or 0 for name in self.remote.log_files()), default=-1)
            if there > here:
                raise ValueError(
                    f"the staging directory {self.staging.root} is behind {self.remote.name} "
                    f"(micro-batch {here}, the table has {there}): another ingest wrote to "
                    "it; use an empty staging directory")
            return
        remote_log = self.remote.log_files()
        try:
            marker = self.remote.read(MARKER)
        except FileNotFoundError:
            if remote_log or self.remote.fs.get_file_info(
                    pafs.FileSelector(self.remote.root, allow_not_found=True)):
                raise ValueError(f"{self.remote.name} is not a wireproto table ({MARKER} is "
                                 "missing) and not empty") from None
            return  # a new table
        shutil.rmtree(self.checkpoint, ignore_errors=True)
        base = self.remote.path(CHECKPOINT_DIR)
        for info in self.remote.listing(CHECKPOINT_DIR, recursive=True):
            target = self.checkpoint / info.path[len(base) + 1:]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.remote.read(info.path[len(self.remote.root) + 1:]))
        Path(self.staging.root).mkdir(parents=True, exist_ok=True)
        Path(self.staging.path(MARKER)).write_bytes(marker)
        restoring = Path(self.staging.path(LOG_DIR + ".restoring"))
        shutil.rmtree(restoring, ignore_errors=True)
        restoring.mkdir()
        for name in remote_log:
            version, entries = _parse_log(self.remote.read(f"{LOG_DIR}/{name}"), name)
            (restoring / name).write_bytes(_rewritten(version, entries, self.remote,
                                                      self.staging))
        shutil.rmtree(self.staging.path(LOG_DIR), ignore_errors=True)
        os.replace(restoring, self.staging.path(LOG_DIR))
        self._done.update(remote_log)

    def _put_marker(self) -> None:
        try:
            marker = Path(self.staging.path(MARKER)).read_bytes()
        except FileNotFoundError:
            return
        if marker == self._marker:
            return
        try:
            known = self.remote.read(MARKER)
        except FileNotFoundError:
            known = None
        if known != marker:
            self.remote.put(MARKER, marker)
        self._marker = marker

    def _local_checkpoint(self) -> dict[str, int]:
        found = {}
        for directory, subdirectories, names in os.walk(self.checkpoint):
            subdirectories[:] = [name for name in subdirectories if not name.startswith(".")]
            for name in names:
                if not name.startswith(".") and not name.endswith(".tmp"):
                    path = Path(directory, name)
                    found[path.relative_to(self.checkpoint).as_posix()] = path.stat().st_size
        return found

    def _put_checkpoint(self, remote: dict[str, int], wanted: Callable[[str], bool]) -> None:
        """Upload the checkpoint's files that `wanted` takes and `remote` lacks (each file of a
        checkpoint is written once); note them in `remote`."""
        missing = {rel: size for rel, size in self._local_checkpoint().items()
                   if wanted(rel) and remote.get(rel) != size}
        _parallel([partial(self.remote.put, f"{CHECKPOINT_DIR}/{rel}", str(self.checkpoint / rel))
                   for rel in missing])
        remote.update(missing)

    def _check_uploaded(self, name: str, gone: list[str]) -> None:
        """A micro-batch's data files that staging no longer has must be in the remote table
        already (staging drops them only once uploaded)."""
        if not gone:
            return
        infos = self.remote.fs.get_file_info([self.remote.path(rel) for rel in gone])
        lost = [rel for rel, info in zip(gone, infos, strict=True)
                if info.type != pafs.FileType.File]
        if lost:
            raise RuntimeError(f"micro-batch {name} of {self.staging.root}: its file {lost[0]} "
                               f"is neither in staging nor in {self.remote.name}")

    def _forget(self, remote_log: set[str], local_log: set[str],
                remote_checkpoint: dict[str, int]) -> None:
        """Delete what Spark deleted in staging since: log files before the latest compaction,
        and the oldest offsets and commits of the checkpoint. A reader that listed the log
        before reads it again (`_Table.read_log`), as Spark's own reader does."""
        compacts = [_batch_of(name) or 0 for name in local_log if name.endswith(".compact")]
        for name in remote_log - local_log:
            if compacts and (_batch_of(name) or 0) < max(compacts):
                self.remote.delete(f"{LOG_DIR}/{name}")
        local = self._local_checkpoint()
        for directory in ("offsets", "commits"):
            kept = [_batch_of(rel.split("/", 1)[1]) for rel in local
                    if rel.startswith(directory + "/")]
            oldest = min((batch for batch in kept if batch is not None), default=None)
            for rel in list(remote_checkpoint):
                batch = _batch_of(rel.split("/", 1)[1]) if rel.startswith(directory + "/") \
                    else None
                if oldest is not None and batch is not None and batch < oldest:
                    self.remote.delete(f"{CHECKPOINT_DIR}/{rel}")
                    del remote_checkpoint[rel]


# -- a reader's copy -------------------------------------------------------------------------------


def default_cache_dir(remote: str) -> str:
    """Where a reader keeps its copy of the table `remote` unless told: under
    ``$XDG_CACHE_HOME/wireproto/tables/`` (``~/.cache``), one directory per table."""
    import hashlib

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(remote.rstrip("/").encode()).hexdigest()[:16]
    return os.path.join(base, "wireproto", "tables", digest)


def fetch_table(remote: str | os.PathLike[str], cache_dir: str | os.PathLike[str],
                options: Mapping[str, str] | None = None) -> str:
    """A local copy of the table `remote` in `cache_dir` that Spark reads as a table (its log
    names the copy's files), brought up to date: only the data files the copy lacks are
    downloaded, and those the table's log no longer names are removed. The copy's path.

    ValueError when `remote` is not a wireproto table, or `cache_dir` holds something else
    than a copy of it. The copy is the reader's own: a read of it while another fetch brings
    it up to date can miss a file that fetch removes."""
    table = _Table(remote, options)
    cache = _Table(Path(cache_dir).absolute())
    Path(cache.root).mkdir(parents=True, exist_ok=True)
    origin = json.dumps({"table": table.name}).encode()
    try:
        if Path(cache.path(_COPY_OF)).read_bytes() != origin:
            raise ValueError(f"{cache.root} holds a copy of another table than {table.name}")
    except FileNotFoundError:
        if any(Path(cache.root).iterdir()):
            raise ValueError(f"{cache.root} is not empty, and not a copy of {table.name}"
                             ) from None
        Path(cache.path(_COPY_OF)).write_bytes(origin)
    try:
        marker = table.read(MARKER)
    except FileNotFoundError:
        raise ValueError(f"{table.name} is not a wireproto table ({MARKER} is missing)"
                         ) from None
    for attempt in range(_ATTEMPTS):
        log = table.read_log()
        files = _in_force(log, table)
        wanted = [rel for rel, size in files.items() if not _has(cache.path(rel), size)]
        try:
            _parallel([partial(_download, table, rel, cache.path(rel), files[rel])
                       for rel in wanted])
            break
        except FileNotFoundError:  # removed after a compaction left it out: read the log again
            if attempt == _ATTEMPTS - 1:
                raise
    cache.put(MARKER, marker)
    names = set()
    for name, version, entries in log:
        text = _rewritten(version, entries, table, cache)
        names.add(name)
        if not _has_bytes(cache.path(f"{LOG_DIR}/{name}"), text):
            cache.put(f"{LOG_DIR}/{name}", text)
    for info in cache.listing(LOG_DIR):
        if info.base_name not in names:
            cache.delete(f"{LOG_DIR}/{info.base_name}")
    for info in cache.data_files():
        rel = info.path[len(cache.root) + 1:]
        if rel not in files:
            _remove_local(cache.root, rel, prune=True)
    return cache.root


def _has(path: str, size: int) -> bool:
    try:
        return os.path.getsize(path) == size
    except OSError:
        return False


def _has_bytes(path: str, data: bytes) -> bool:
    try:
        return Path(path).read_bytes() == data
    except OSError:
        return False


def _download(table: _Table, rel: str, target: str, size: int) -> None:
    """Copy the file `rel` of `table` to the local path `target`, whole, checking its size
    against the log's."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    partial_path = f"{os.path.dirname(target)}/.{os.path.basename(target)}.part"
    written = 0
    with table.fs.open_input_stream(table.path(rel)) as stream, \
            open(partial_path, "wb") as out:
        while chunk := stream.read(_CHUNK):
            out.write(chunk)
            written += len(chunk)
    if size >= 0 and written != size:
        os.unlink(partial_path)
        raise ValueError(f"{table.name}: {rel} is {written} bytes, its log says {size}")
    os.replace(partial_path, target)


# -- keeping a table tidy --------------------------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> float:
    """A duration as the sink's ``retention`` option takes it (``30d``, ``12h``, ``90m``,
    ``45s``), in seconds; ValueError for anything else, so it is refused before Spark starts."""
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|min|h|d)\s*", text.lower())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a duration such as 30d, 12h, 90m or 45s")
    return int(match.group(1)) * _UNITS[match.group(2)]


def remove_expired(table: str | os.PathLike[str], *, grace_seconds: float = 3600.0,
                   options: Mapping[str, str] | None = None, now: float | None = None
                   ) -> list[str]:
    """Delete the data files of `table` that its log has not named for `grace_seconds`: those
    a compaction left out (the sink's ``retention``), and those of micro-batches that failed
    before their log file was written. The files deleted, relative to the table.

    A file is first noted (in ``_wireproto_tidy.json``) and deleted by a later call once the
    grace period has passed since, so that a query that read the log before still finds it:
    make it longer than the longest query of the table. A file written after the newest log
    file may belong to a micro-batch still being written, and is left alone."""
    now = time.time() if now is None else now
    store = _Table(table, options)
    log = store.log_files()
    if not log:
        return []
    # Listed first: a micro-batch logged after it wrote its files after this log file too.
    newest = max(info.mtime_ns or 0 for info in log.values())
    listed = _in_force(store.read_log(), store)
    try:
        noted = json.loads(store.read(_TIDY)).get("unlisted_since", {})
    except (FileNotFoundError, ValueError, AttributeError):
        noted = {}
    removed, still = [], {}
    for info in store.data_files():
        rel = info.path[len(store.root) + 1:]
        if rel in listed or (info.mtime_ns or 0) >= newest:
            continue
        since = noted.get(rel)
        since = since if isinstance(since, (int, float)) else now
        if now - since >= grace_seconds:
            store.delete(rel)
            removed.append(rel)
        else:
            still[rel] = since
    if still or noted:
        store.put(_TIDY, json.dumps({"unlisted_since": still}, sort_keys=True).encode())
    return removed
