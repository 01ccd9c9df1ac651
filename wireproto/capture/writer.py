"""Writing capture files: rotated, append-only files, written in batches by `CaptureWriter`, or by
`ThreadedCaptureWriter` on one background thread so that its caller never blocks on disk."""


from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wireproto.capture.format import (
    CONFIG_FILE_BYTES,
    DEFAULT_MAX_FILE_BYTES,
    MAX_FILE_BYTES,
    MIN_FILE_BYTES,
    Kind,
    MiB,
)
from wireproto.capture.log import (
    CaptureLog,
    Chunk,
)
from wireproto.settings import file_mode, integer, setting

__all__ = [
    "CaptureSettings",
    "CaptureCounters",
    "DEFAULT_FILE_MODE",
    "CaptureWriter",
    "ThreadedCaptureWriter",
]

# -- writing --------------------------------------------------------------------------------------


@dataclass(slots=True)
class CaptureCounters:
    """`records`, `bytes` (headers included) and `files` written; batches and records dropped
    because the writer thread's queue was full or a write failed."""

    records: int = 0
    bytes: int = 0
    files: int = 0
    dropped_batches: int = 0
    dropped_records: int = 0


# Capture files hold payloads: readable by their owner only, unless configured otherwise.
DEFAULT_FILE_MODE = 0o600


class _FileSink:
    """Writes chunks: one write per chunk, files created exclusively and only appended to."""

    def __init__(self, fsync: bool, mode: int) -> None:
        self.fsync = fsync
        self.mode = mode
        self.fd: int | None = None
        self.path: Path | None = None
        # Told of each file once it is closed, complete (in the writing thread).
        self.on_closed: Callable[[Path], object] | None = None

    def write(self, chunk: Chunk) -> int:
        """Write `chunk`; returns 1 if it started a file. A chunk for a file that is not open (its
        start was dropped or failed) raises, so nothing lands after a torn or missing part."""
        started = 0
        if chunk.new:
            self.close()
            self.fd = os.open(chunk.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                              | os.O_CLOEXEC, self.mode)
            self.path = chunk.path
            started = 1
        elif self.path != chunk.path or self.fd is None:
            raise OSError(f"capture file {chunk.path} is not open for writing")
        try:
            view = memoryview(chunk.data)
            while view:
                view = view[os.write(self.fd, view):]
            if self.fsync:
                os.fsync(self.fd)
        except BaseException:
            self.close()
            raise
        return started

    def close(self) -> None:
        closed = self.path if self.fd is not None else None
        if self.fd is not None:
            os.close(self.fd)
        self.fd = None
        self.path = None
        if closed is not None and self.on_closed is not None:
            self.on_closed(closed)


def _config_file_bytes(value: Any) -> int:
    low, high = CONFIG_FILE_BYTES  # 64 to 256 MiB: files small enough to give Spark many tasks
    if not low <= integer(value) <= high:
        raise ValueError(f"must be {low} to {high} bytes (64 to 256 MiB), not {value}")
    return value


@dataclass(frozen=True)
class CaptureSettings:
    """The [capture] table: capture files of every message in and out; `directory` "" is off."""

    directory: str = ""
    max_file_bytes: int = setting(DEFAULT_MAX_FILE_BYTES, read=_config_file_bytes)  # 128 MiB
    flush_interval: float = 0.5
    # Capture files' permissions: the owner's alone unless set otherwise.
    file_mode: int = setting(DEFAULT_FILE_MODE, read=file_mode)
    # The broker's name in its files' headers and rows ("": the cluster's node name, or
    # host:pid), so captures from a fleet say where each came from.
    node: str = ""
    # Where each closed file is uploaded ("": nowhere), e.g. "s3://bucket/prefix"; removed
    # locally once the upload is confirmed. The S3 endpoint and region, when not AWS's.
    upload: str = ""
    upload_endpoint: str = ""
    upload_region: str = ""

    def upload_options(self) -> dict[str, str]:
        """The storage options of `upload` (wireproto.capture.storage)."""
        options = {"s3.endpoint": self.upload_endpoint, "s3.region": self.upload_region}
        return {name: value for name, value in options.items() if value}


class _WriterBase:
    def __init__(self, directory: str | os.PathLike[str], *, max_file_bytes: int,
                 prefix: str, clock: Callable[[], int], fsync: bool, file_mode: int,
                 broker: str | None, cluster: str | None) -> None:
        if not MIN_FILE_BYTES <= max_file_bytes <= MAX_FILE_BYTES:
            raise ValueError(f"max_file_bytes {max_file_bytes}: use {MIN_FILE_BYTES} to "
                             f"{MAX_FILE_BYTES} (configuration allows {CONFIG_FILE_BYTES[0]} to "
                             f"{CONFIG_FILE_BYTES[1]})")
        self.directory = Path(directory)
        # Captured payloads are the owner's to read: the directory it makes, and every file.
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._log = CaptureLog(self.directory, max_file_bytes, prefix, clock, broker, cluster)
        self._sink = _FileSink(fsync, file_mode)
        self._counters = CaptureCounters()
        self._closed = False

    @property
    def on_file_closed(self) -> Callable[[Path], object] | None:
        """Called with each capture file once it is closed for good (rotated away from, or at
        close), in the thread that writes: what ships files elsewhere listens here."""
        return self._sink.on_closed

    @on_file_closed.setter
    def on_file_closed(self, callback: Callable[[Path], object] | None) -> None:
        self._sink.on_closed = callback

    def _write(self, chunks: list[Chunk]) -> None:
        """Write chunks in order; on a failure, count the rest as dropped and re-raise."""
        for index, chunk in enumerate(chunks):
            try:
                self._counters.files += self._sink.write(chunk)
            except Exception:
                lost = sum(chunk.records for chunk in chunks[index:])
                self._lost(lost)
                raise
            self._counters.records += chunk.records
            self._counters.bytes += len(chunk.data)

    def _lost(self, records: int) -> None:
        self._counters.dropped_batches += 1
        self._counters.dropped_records += records
        self._log.lost(records)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the capture writer is closed")


class CaptureWriter(_WriterBase):
    """Records go to an in-memory buffer; `flush()` writes it (one write per file) and, with
    `fsync`, syncs. The buffer is also flushed when it reaches `buffer_bytes`. The caller does
    the I/O: in a reactor, use `ThreadedCaptureWriter`. Not thread-safe.

    Files are ``{prefix}-{UTC YYYYmmddTHHMMSS}-{sequence:06d}.wpcap`` in `directory`, the
    sequence continuing from the files already there. A file is rotated when the next record
    would take it past `max_file_bytes`; a file holding only its header and repeated opens takes
    one record whatever its size. `clock` gives nanoseconds since the epoch."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, prefix: str = "wirecapture",
                 clock: Callable[[], int] = time.time_ns, fsync: bool = False,
                 buffer_bytes: int = MiB, file_mode: int = DEFAULT_FILE_MODE,
                 broker: str | None = None, cluster: str | None = None) -> None:
        super().__init__(directory, max_file_bytes=max_file_bytes, prefix=prefix, clock=clock,
                         fsync=fsync, file_mode=file_mode, broker=broker, cluster=cluster)
        self._buffer_bytes = buffer_bytes

    def open_connection(self, conn_id: int, peer: str, protocol: str, transport: str, *,
                        timestamp_ns: int | None = None, **extra: Any) -> None:
        self._check_open()
        self._log.open_connection(conn_id, peer, protocol, transport, timestamp_ns, extra)
        self._maybe_flush()

    def message(self, conn_id: int, direction: str | Kind, data: bytes | str, binary: bool,
                timestamp_ns: int | None = None, *, batch: bool = False) -> None:
        """Record one message in or out (`direction` "in" or "out"), or with `batch` several:
        `data` is then what `encode_batch` makes of them."""
        self._check_open()
        self._log.message(conn_id, direction, data, binary, timestamp_ns, batch)
        self._maybe_flush()

    def batches(self, batches: list[tuple[int, int, bytes, bool, int]]) -> None:
        """Several batch records at once, each (conn_id, kind, data, binary, timestamp_ns):
        `kind` is `Kind.IN` or `Kind.OUT`, `data` what `encode_batch` makes."""
        self._check_open()
        self._log.batches(batches)
        self._maybe_flush()

    def close_connection(self, conn_id: int, reason: str | None = None, *,
                         timestamp_ns: int | None = None) -> None:
        self._check_open()
        self._log.close_connection(conn_id, reason, timestamp_ns)
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self._log.pending_bytes >= self._buffer_bytes:
            self.flush()

    def flush(self) -> None:
        self._write(self._log.take())

    @property
    def counters(self) -> CaptureCounters:
        return CaptureCounters(**{name: getattr(self._counters, name)
                                  for name in CaptureCounters.__slots__})

    @property
    def path(self) -> Path | None:
        """The file records go to now (it may not be written yet)."""
        return self._log.path

    def close(self) -> None:
        """Flush and close the file. Connections still open get no close record."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._sink.close()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ThreadedCaptureWriter(_WriterBase):
    """The same records and files as `CaptureWriter`, written by one background thread, so the
    caller (the reactor) never waits for I/O. Records are encoded in the caller and batched; a
    batch is queued when it reaches `flush_bytes`, and the thread queues what is buffered when
    it has been idle for `flush_interval` seconds. The queue holds at most `queue_bytes` (a batch
    is always taken into an empty queue): when a batch does not fit it is dropped whole and
    counted, and the next record starts a new file, so every file still stands alone.

    `close()` queues what is left and returns after the thread's last write. `error` holds the
    last write error; its batch is counted as dropped."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, prefix: str = "wirecapture",
                 clock: Callable[[], int] = time.time_ns, fsync: bool = False,
                 flush_interval: float = 1.0, flush_bytes: int = MiB,
                 queue_bytes: int = 64 * MiB, file_mode: int = DEFAULT_FILE_MODE,
                 broker: str | None = None, cluster: str | None = None,
                 _before_write: Callable[[], None] | None = None) -> None:
        super().__init__(directory, max_file_bytes=max_file_bytes, prefix=prefix, clock=clock,
                         fsync=fsync, file_mode=file_mode, broker=broker, cluster=cluster)
        self._flush_interval = flush_interval
        self._flush_bytes = flush_bytes
        self._queue_bytes = queue_bytes
        self._before_write = _before_write  # tests only: runs in the thread before each write
        self._cond = threading.Condition()
        self._queue: deque[list[Chunk]] = deque()
        self._queued = 0  # bytes queued or being written
        self._closing = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="wireproto-capture", daemon=True)
        self._thread.start()

    def open_connection(self, conn_id: int, peer: str, protocol: str, transport: str, *,
                        timestamp_ns: int | None = None, **extra: Any) -> None:
        with self._cond:
            self._check_open()
            self._log.open_connection(conn_id, peer, protocol, transport, timestamp_ns, extra)
            self._maybe_queue()

    def message(self, conn_id: int, direction: str | Kind, data: bytes | str, binary: bool,
                timestamp_ns: int | None = None, *, batch: bool = False) -> None:
        """As `CaptureWriter.message`."""
        with self._cond:
            self._check_open()
            self._log.message(conn_id, direction, data, binary, timestamp_ns, batch)
            self._maybe_queue()

    def batches(self, batches: list[tuple[int, int, bytes, bool, int]]) -> None:
        """As `CaptureWriter.batches`."""
        with self._cond:
            self._check_open()
            self._log.batches(batches)
            self._maybe_queue()

    def close_connection(self, conn_id: int, reason: str | None = None, *,
                         timestamp_ns: int | None = None) -> None:
        with self._cond:
            self._check_open()
            self._log.close_connection(conn_id, reason, timestamp_ns)
            self._maybe_queue()

    def _maybe_queue(self) -> None:
        if self._log.pending_bytes >= self._flush_bytes:
            self._queue_pending(force=False)

    def _queue_pending(self, *, force: bool) -> None:
        """Move the buffer to the queue, or drop it if the queue is full. Called with the lock
        held, so the queue's order is the order records were made in."""
        chunks = self._log.take()
        if not chunks:
            return
        size = sum(len(chunk.data) for chunk in chunks)
        if not force and self._queued and self._queued + size > self._queue_bytes:
            self._lost(sum(chunk.records for chunk in chunks))
            return
        self._queue.append(chunks)
        self._queued += size
        self._cond.notify_all()

    def flush(self) -> None:
        """Queue what is buffered now, even past `queue_bytes`, without waiting for the write."""
        with self._cond:
            self._queue_pending(force=True)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._closing:
                    self._cond.wait(self._flush_interval)
                if not self._queue:
                    self._queue_pending(force=True)
                if not self._queue:
                    if self._closing:
                        break
                    continue
                chunks = self._queue.popleft()
            try:
                if self._before_write is not None:
                    self._before_write()
                self._write(chunks)
            except Exception as error:  # noqa: BLE001 - counted as dropped, kept in .error
                self.error = error
            finally:
                with self._cond:
                    self._queued -= sum(len(chunk.data) for chunk in chunks)
                    self._cond.notify_all()
        self._sink.close()

    def _lost(self, records: int) -> None:
        with self._cond:  # reentrant from the caller's side: Condition wraps an RLock
            super()._lost(records)

    @property
    def counters(self) -> CaptureCounters:
        with self._cond:
            return CaptureCounters(**{name: getattr(self._counters, name)
                                      for name in CaptureCounters.__slots__})

    def close(self) -> None:
        """Queue what is buffered, wait for the thread to write everything and stop."""
        with self._cond:
            if not self._closed:
                self._closed = True
                self._closing = True
                self._queue_pending(force=True)
                self._cond.notify_all()
        self._thread.join()

    def __enter__(self) -> ThreadedCaptureWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
