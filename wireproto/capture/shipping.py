"""Shipping capture files to object storage (``[capture] upload``, docs/pipeline.md): each file
the writer closes is uploaded, checked, and only then removed from the local directory.

An upload that fails is retried with a growing delay (1 s doubling to 5 minutes), the file kept
where it is meanwhile; files wait their turn in the order they were closed, so the storage gets
them oldest first. At start, the files a previous run left (closed, never shipped) go first. So
an upload that fails never loses a file: it is removed only after the object in storage has the
file's size. Uploads run in a thread of the reactor's pool, never in the reactor thread.

Needs pyarrow (the ``spark`` extra), which reaches ``s3://``, ``gs://``, ``hdfs://`` and
``file://``; credentials come from where the AWS tools find them (the environment, ~/.aws, an
instance role).
"""

from __future__ import annotations

import os
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twisted.internet import threads
from twisted.logger import Logger

from wireproto.capture.reader import capture_files

if TYPE_CHECKING:
    from twisted.internet.interfaces import IDelayedCall

__all__ = ["Shipper", "ShippingCounters"]

log = Logger(namespace="wireproto.capture")

MIN_RETRY, MAX_RETRY = 1.0, 300.0
# A file goes up in pieces of this size, so an upload holds no more of it in memory.
UPLOAD_CHUNK = 8 << 20


@dataclass
class ShippingCounters:
    shipped: int = 0
    shipped_bytes: int = 0
    failed: int = 0


class Shipper:
    """Uploads the closed capture files of `directory` to `target` and removes them."""

    def __init__(self, directory: str | os.PathLike[str], target: str, reactor: Any, *,
                 options: dict[str, str] | None = None, prefix: str = "wirecapture",
                 broker: str = "", min_retry: float = MIN_RETRY,
                 max_retry: float = MAX_RETRY) -> None:
        try:
            from wireproto.capture.storage import open_store
        except ImportError:
            raise ValueError("[capture] upload needs pyarrow: pip install pyarrow (or the "
                             "spark extra)") from None
        self.directory = Path(directory)
        self.target = target
        self.store = open_store(target, options)
        # Each broker's files go under a folder of its name: a fleet can share one target.
        self.root = f"{self.store.root}/{_folder(broker)}" if broker else self.store.root
        self.reactor = reactor
        self.prefix = prefix
        self.min_retry, self.max_retry = min_retry, max_retry
        self.counters = ShippingCounters()
        self.pending: deque[Path] = deque()
        self._busy = False
        self._delay = 0.0
        self._timer: IDelayedCall | None = None
        self._running = False

    def start(self) -> None:
        """Ship what a previous run left, before the writer opens a new file."""
        self._running = True
        if self.directory.is_dir():
            for path in capture_files(self.directory, self.prefix):
                self._enqueue(path)

    def stop(self) -> None:
        """Stop retrying; files not shipped yet stay for the next start."""
        self._running = False
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def file_closed(self, path: Path) -> None:
        """The writer closed `path` (called in its thread)."""
        self.reactor.callFromThread(self._enqueue, Path(path))

    def _enqueue(self, path: Path) -> None:
        if path not in self.pending:
            self.pending.append(path)
        self._next()

    def _next(self) -> None:
        if self._busy or not self.pending or not self._running or self._timer is not None:
            return
        self._busy = True
        path = self.pending[0]
        d = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(),
                                      self._upload, path)
        d.addCallbacks(self._shipped, self._failed, callbackArgs=(path,),
                       errbackArgs=(path,))

    def _upload(self, path: Path) -> int:
        """Copy `path` to the store, check the object's size, then remove the file."""
        try:
            source = open(path, "rb")  # noqa: SIM115 - closed by the with below
        except FileNotFoundError:
            return -1  # shipped and removed before (a file queued twice)
        from wireproto.capture.storage import INDEX_SUFFIX, file_index  # loaded at __init__

        key = f"{self.root}/{path.name}"
        # Its index first: a reader that finds the file finds how to split it.
        with self.store.filesystem.open_output_stream(key + INDEX_SUFFIX) as out:
            out.write(file_index(path))
        with source, self.store.filesystem.open_output_stream(key) as out:
            size = 0
            while chunk := source.read(UPLOAD_CHUNK):
                out.write(chunk)
                size += len(chunk)
        stored = self.store.filesystem.get_file_info(key).size
        if stored != size:
            raise OSError(f"the stored object has {stored} bytes, the file {size}")
        path.unlink()
        return size

    def _shipped(self, size: int, path: Path) -> None:
        self._busy = False
        self._delay = 0.0
        if self.pending and self.pending[0] == path:
            self.pending.popleft()
        if size >= 0:
            self.counters.shipped += 1
            self.counters.shipped_bytes += size
            log.info("capture: shipped {file} to {target}", event="capture_shipped",
                     file=path.name, target=self.store.uri(f"{self.root}/{path.name}"))
        self._next()

    def _failed(self, failure: Any, path: Path) -> None:
        self._busy = False
        self.counters.failed += 1
        self._delay = min(self.max_retry, max(self.min_retry, self._delay * 2))
        log.warn("capture: uploading {file} to {target} failed ({why}); kept, retrying in "
                 "{delay} s", event="capture_ship_failed", file=path.name, target=self.target,
                 why=failure.getErrorMessage(), delay=self._delay)
        if self._running:
            self._timer = self.reactor.callLater(self._delay, self._retry)

    def _retry(self) -> None:
        self._timer = None
        self._next()


def _folder(broker: str) -> str:
    """A broker's name as one path segment of an object key."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", broker).strip(".") or "_"
