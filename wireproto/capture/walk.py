"""A capture as a replay reads it: its files found and ordered one way, and their records read
in order with plain reads. The ``replay:`` endpoint (`capture/replay.py`) and ``wireproto
replay`` (`tools/replay.py`) both read through here, so a directory is walked, and a damaged,
torn, replaced or unreadable file is handled, the same in both (docs/phyllo.md, "Replaying a
capture"; docs/tools.md, "replay").

- The files (`capture_at`): a file is itself, if it is a regular file (a FIFO's open would wait
  for a writer; a device is no capture); a directory is its capture files and its
  subdirectories' (a fleet's brokers capture one directory each), each directory's oldest
  first, the directories in the order of their paths, as the pipeline reads a capture root
  (`Store.capture_files`). Then every file's header is read: a file that is not a capture, or
  that cannot be read, refuses the replay (`CaptureRefused`); in a directory, a file whose header
  is not whole yet (a writer has just begun it) is left out.
- The records (`RecordCursor`): read with plain reads, never by mapping a file, so a file cut
  short under a long replay ends early instead of raising SIGBUS. A file ends at its end, at a
  torn last record (the tail a writer had not finished: a record past the end, or one whose CRC
  fails with nothing but zeros after it), or early, at damage (a CRC that fails with records
  after it), at a file replaced, cut short or no longer readable since the replay began:
  `stops` says which, and the replay goes on with the next file.
- Every step is a generator that yields None after a bounded amount of work (names listed,
  headers read, files opened, records passed over), where a reactor may take a turn:
  `in_turns` runs one a breath per reactor turn, `to_the_end` runs one through.
"""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar, cast

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from wireproto.capture.format import (
    HEADER_SIZE,
    RECORD_HEADER,
    CaptureError,
    CorruptCapture,
    IncompleteCapture,
    Kind,
    Record,
    record_from_fields,
)
from wireproto.capture.reader import file_name_pattern, read_header_from

__all__ = [
    "MAX_RECORD_BYTES",
    "MAX_INFO_BYTES",
    "PASS_BEFORE_PAUSE",
    "FILES_BEFORE_PAUSE",
    "HEADERS_BEFORE_PAUSE",
    "NAMES_BEFORE_PAUSE",
    "CaptureRefused",
    "Steps",
    "Stop",
    "Wanted",
    "capture_at",
    "RecordCursor",
    "in_turns",
    "to_the_end",
]

T = TypeVar("T")
# A unit of work done a breath at a time: yields None where a reactor may take a turn, and
# returns what it found.
Steps = Generator[None, None, T]

# A record longer than this is skipped, not read: a hostile file cannot make a replay hold more.
MAX_RECORD_BYTES = 64 << 20
# An open or close record is a small JSON object: one longer is skipped, never parsed.
MAX_INFO_BYTES = 64 << 10
# At most this many records passed over (not wanted) between two breaths.
PASS_BEFORE_PAUSE = 4096
# At most this many files opened for their records between two breaths.
FILES_BEFORE_PAUSE = 16
# At most this many headers read between two breaths (the check before a replay).
HEADERS_BEFORE_PAUSE = 32
# At most this many directory entries listed between two breaths.
NAMES_BEFORE_PAUSE = 1024
# How far past a failing CRC is read, a chunk per breath, to tell a torn tail from damage.
_ZEROS_CHUNK = 1 << 20
# How many stops a cursor keeps the text of.
KEPT_STOPS = 8


class CaptureRefused(ValueError):
    """A capture that cannot be replayed at all: a path not there, not a regular file or a
    directory, one that cannot be read, a file that is not a capture. One line, naming it."""


class _NotRegular(OSError):
    pass


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file, without ever waiting on a FIFO (its
    open does not block); `_NotRegular` (an OSError) otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _NotRegular(0, "not a regular file")
        os.set_blocking(fd, True)
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def capture_at(path: str) -> Steps[list[Path]]:
    """The capture files at `path`, in the order a replay reads them, their headers read;
    `CaptureRefused` for a path or a file that cannot be replayed. A directory without
    capture files gives []: each user says what that means to it."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise CaptureRefused(_os_text(error, path)) from None
    if stat.S_ISDIR(mode):
        files = yield from _walk(path)
        in_directory = True
    elif stat.S_ISREG(mode):
        files, in_directory = [Path(path)], False
    else:
        raise CaptureRefused(f"{path}: not a regular file (a capture file, or a directory of "
                             "them)")
    return (yield from _checked(files, in_directory))


def _walk(top: str) -> Steps[list[Path]]:
    """The files named as a writer names them under `top`, at any depth (symbolic links to
    directories are not followed), ordered as `capture_at` says."""
    pattern = file_name_pattern("wirecapture")
    found: list[tuple[str, str]] = []  # (directory, name): the order
    pending = [top]
    listed = 0
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    listed += 1
                    if listed % NAMES_BEFORE_PAUSE == 0:
                        yield None
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                    elif pattern.match(entry.name) and entry.is_file():
                        found.append((directory, entry.name))
        except FileNotFoundError as error:
            if directory == top:
                raise CaptureRefused(_os_text(error, directory)) from None
            # gone since it was listed: none of its files are part of the capture
        except OSError as error:  # a directory this user may not read: not an empty one
            raise CaptureRefused(_os_text(error, directory)) from None
    found.sort()
    paths = []
    for number, (directory, name) in enumerate(found, 1):
        if number % NAMES_BEFORE_PAUSE == 0:
            yield None
        paths.append(Path(directory, name))
    return paths


def _checked(files: list[Path], in_directory: bool) -> Steps[list[Path]]:
    kept = []
    for number, file in enumerate(files, 1):
        if number % HEADERS_BEFORE_PAUSE == 0:
            yield None
        try:
            with open_regular(file) as opened:
                read_header_from(opened, os.fspath(file))
        except IncompleteCapture as error:
            if in_directory:
                continue  # a file a writer has just begun: nothing in it yet
            raise CaptureRefused(str(error)) from None
        except FileNotFoundError as error:
            if in_directory:
                continue  # gone since it was listed (shipped, say): not part of the capture
            raise CaptureRefused(_os_text(error, file)) from None
        except CaptureError as error:
            raise CaptureRefused(str(error).replace("\n", " ")) from None
        except OSError as error:
            raise CaptureRefused(_os_text(error, file)) from None
        kept.append(file)
    return kept


def _os_text(error: OSError, path: object) -> str:
    where = error.filename if error.filename is not None else path
    what = "no such file or directory" if isinstance(error, FileNotFoundError) \
        else error.strerror or str(error)
    return f"{where}: {what}"


@dataclass(frozen=True, slots=True)
class Stop:
    """A file that ended before its end: `torn` (the tail a writer had not finished: the file
    is whole up to it) or not (damage, a file replaced or cut short: records were lost)."""

    path: Path
    why: str
    torn: bool

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


# wanted(kind, connection): whether a record's data is read, or it is skipped by its length.
Wanted = Callable[[int, int], bool]


class RecordCursor:
    """A position in a capture's files, and the records from it on. `records(wanted)` reads
    the data only of the records `wanted(kind, connection)` wants, checking their CRCs; the
    rest are skipped by their length. `stops` keeps the first few files that ended early, and
    `damaged` counts those that were not just torn."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.index = 0
        self.offset: int | None = None  # None: the first record of paths[index]
        self.skipped = 0  # records over MAX_RECORD_BYTES (MAX_INFO_BYTES for open and close)
        self.stops: list[Stop] = []
        self.damaged = 0
        self._identity: tuple[int, int] | None = None  # the file paths[index] was, once read

    def rewind(self) -> None:
        self.index, self.offset, self._identity = 0, None, None

    @property
    def at_end(self) -> bool:
        return self.index >= len(self.paths)

    @property
    def problems(self) -> list[str]:
        return [str(stop) for stop in self.stops]

    def records(self, wanted: Wanted) -> Generator[Record | None, None, None]:
        """Records from the position on; the position moves past each record yielded. None
        now and then, after a bounded amount of work: where a caller may pause."""
        opened = 0
        while self.index < len(self.paths):
            path = self.paths[self.index]
            try:
                with open_regular(path) as file:
                    yield from self._file(file, path, wanted)
            except _NotRegular:
                self._stopped(path, "not a regular file any more")
            except OSError as error:
                self._stopped(path, error.strerror or str(error))
            except CaptureError as error:  # its header: replaced, or cut, since it was found
                self._stopped(path, str(error).removeprefix(f"{path}: "))
            self.index, self.offset, self._identity = self.index + 1, None, None
            opened += 1
            if opened % FILES_BEFORE_PAUSE == 0 and self.index < len(self.paths):
                yield None

    def _file(self, file: BinaryIO, path: Path, wanted: Wanted
              ) -> Generator[Record | None, None, None]:
        status = os.fstat(file.fileno())
        identity, size = (status.st_dev, status.st_ino), status.st_size
        if self.offset is None:
            self.offset = read_header_from(file, os.fspath(path)).data_offset
            self._identity = identity
        elif identity != self._identity:
            self._stopped(path, "replaced since the replay began reading it")
            return
        elif size < self.offset:
            self._stopped(path, f"cut to {size} bytes under the replay, which had read "
                                f"{self.offset}")
            return
        file.seek(self.offset)
        passed = 0
        while True:
            offset = self.offset
            head = file.read(HEADER_SIZE)
            if len(head) < HEADER_SIZE:
                if size - offset >= HEADER_SIZE:
                    self._cut(path, file, size)
                elif head:
                    self._stopped(path, f"a torn record at offset {offset}", torn=True)
                return
            length, crc, ts, conn, kind, proto, trans, flags, _ = RECORD_HEADER.unpack(head)
            end = offset + HEADER_SIZE + length
            if end > size:
                self._stopped(path, f"a torn record at offset {offset}", torn=True)
                return
            too_long = length > (MAX_INFO_BYTES if kind in (Kind.OPEN, Kind.CLOSE)
                                 else MAX_RECORD_BYTES)
            if too_long or not wanted(kind, conn):
                if too_long:
                    self.skipped += 1
                else:
                    passed += 1
                file.seek(end)
                self.offset = end
                if passed >= PASS_BEFORE_PAUSE:
                    passed = 0
                    yield None  # a breath: a sparse selection does not hold the reactor
                continue
            data = file.read(length)
            if len(data) < length:
                self._cut(path, file, size)
                return
            if zlib.crc32(data, zlib.crc32(head[8:])) != crc:
                torn = yield from self._only_zeros_after(file, end, size)
                self._stopped(path, f"a torn record at offset {offset}" if torn else
                              f"record at offset {offset}: CRC mismatch with {size - end} "
                              "bytes after it: the file is corrupt, not torn", torn=torn)
                return
            try:
                record = record_from_fields(offset, ts, conn, kind, proto, trans, flags, data)
            except CorruptCapture as error:  # a kind no writer writes
                self._stopped(path, str(error).removeprefix("capture "))
                return
            self.offset = end
            yield record

    def _only_zeros_after(self, file: BinaryIO, end: int, size: int
                          ) -> Generator[None, None, bool]:
        """Whether nothing but zeros follows `end` (a file extended but never written, after
        a power loss): what makes a failing CRC a torn tail rather than damage."""
        file.seek(end)
        left = size - end
        while left > 0:
            chunk = file.read(min(left, _ZEROS_CHUNK))
            if not chunk or chunk.strip(b"\0"):
                return not chunk
            left -= len(chunk)
            if left > 0:
                yield None
        return True

    def _cut(self, path: Path, file: BinaryIO, size: int) -> None:
        """A short read where the size seen at the open promised more: the file was cut."""
        now = os.fstat(file.fileno()).st_size
        self._stopped(path, f"cut to {now} bytes under the replay (it had {size})")

    def _stopped(self, path: Path, why: str, *, torn: bool = False) -> None:
        if not torn:
            self.damaged += 1
        if len(self.stops) < KEPT_STOPS:
            self.stops.append(Stop(path, why, torn))


def to_the_end(steps: Steps[T]) -> T:
    """What `steps` returns, run through without a pause."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return cast(T, done.value)


def in_turns(reactor: IReactorTime, steps: Steps[T]) -> defer.Deferred[T]:
    """Runs `steps` a breath per reactor turn: fires with what it returns, or fails with what
    it raises. Cancelling the Deferred stops it at its breath, closing what it holds open."""
    timer: list[IDelayedCall] = []

    def cancel(_: defer.Deferred[T]) -> None:
        if timer and timer[0].active():
            timer[0].cancel()
        steps.close()

    done: defer.Deferred[T] = defer.Deferred(cancel)

    def step() -> None:
        timer.clear()
        try:
            next(steps)
        except StopIteration as finished:
            done.callback(finished.value)
        except Exception:
            done.errback()
        else:
            timer.append(reactor.callLater(0, step))

    timer.append(reactor.callLater(0, step))
    return done
