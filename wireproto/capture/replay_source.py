"""What a ``replay:`` endpoint plays, read from capture files: its options, the files, the
connection it names, and that connection's records one by one (docs/phyllo.md, "Replaying a
capture").

Records are read with plain reads, one at a time, never by mapping a file: a capture truncated
under a long replay must give an error, not a SIGBUS. Only what is played is held: the next
record, and the ids of the selected connections still open.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from wireproto.capture.format import (
    HEADER_SIZE,
    RECORD_HEADER,
    CaptureError,
    CorruptCapture,
    IncompleteCapture,
    Kind,
    Record,
    decode_record,
)
from wireproto.capture.reader import capture_files, read_header
from wireproto.transports.connect import split_endpoint

__all__ = [
    "REPLAY_KEYS",
    "MAX_RECORD_BYTES",
    "FILES_BEFORE_PAUSE",
    "ReplayError",
    "ReplayOptions",
    "Captured",
    "parse_replay",
    "capture_paths",
    "find_selection",
    "RecordCursor",
]

REPLAY_KEYS = ("path", "connection", "link", "speed", "loop", "stack")
# A record longer than this is skipped, not read: a hostile file cannot make a replay hold more.
MAX_RECORD_BYTES = 64 << 20
# An open or close record is a small JSON object: one longer is skipped, never parsed.
MAX_INFO_BYTES = 64 << 10
# A reader passes over at most this many records not wanted before it pauses.
PASS_BEFORE_PAUSE = 4096
# A reader opens at most this many files before it pauses (a directory of many small files).
FILES_BEFORE_PAUSE = 16
# How many connection ids and link names an error lists.
LISTED = 8
_TRUE, _FALSE = ("yes", "true", "1", "on"), ("no", "false", "0", "off")
MAX_SPEED = 1_000_000.0


class ReplayError(ValueError):
    """A replay that cannot be played as asked: a missing file, no such connection, a bad
    option. Its text is one line naming what was asked and what there is."""


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """A ``replay:`` endpoint string's options. `speed` None is "as fast as possible"."""

    path: str
    connection: int | None = None
    link: str | None = None
    speed: float | None = 1.0
    loop: bool = False
    stack: str | None = None

    def describe(self) -> str:
        what = (f"connection {self.connection}" if self.connection is not None
                else f"link {self.link}")
        return f"{what} of {self.path}"


def parse_replay(description: str) -> ReplayOptions:
    """The options of ``replay:path=CAPTURE[:connection=ID | :link=NAME][:speed=S][:loop=yes]
    [:stack=reduced|minimal]``, checked, or a `ReplayError`."""
    args, kwargs = split_endpoint(description)
    if not args or args[0].lower() != "replay":
        raise ReplayError(f"not a replay: endpoint: {description!r}")
    return options_from_fields(args[1:], kwargs)


def options_from_fields(args: list[str] | tuple[str, ...], kwargs: dict[str, str]
                        ) -> ReplayOptions:
    """`parse_replay` for fields already split (Twisted's parser hands them over so)."""
    if args:
        raise ReplayError(f"replay: takes key=value options only, not {':'.join(args)!r}; "
                          "write replay:path=CAPTURE:link=NAME")
    unknown = sorted(set(kwargs) - set(REPLAY_KEYS))
    if unknown:
        raise ReplayError(f"unknown replay: option(s) {', '.join(unknown)}: use "
                          f"{', '.join(REPLAY_KEYS)}")
    path = kwargs.get("path", "")
    if not path:
        raise ReplayError("replay: needs path=CAPTURE (a capture file or a directory of them)")
    connection = kwargs.get("connection")
    link = kwargs.get("link")
    if connection is not None and link is not None:
        raise ReplayError("replay: takes connection=ID or link=NAME, not both")
    if connection is None and link is None:
        raise ReplayError(f"replay: needs connection=ID or link=NAME: which connection of "
                          f"{path} to play")
    if connection is not None and not (connection.isdigit() and int(connection) < 1 << 64):
        raise ReplayError(f"replay: connection={connection!r} is not a connection id (a "
                          "whole number, as the capture's open records give it)")
    if link == "":
        raise ReplayError("replay: link= is empty: name a Phyllo link, link=dev1")
    return ReplayOptions(
        path=path, connection=None if connection is None else int(connection), link=link,
        speed=_speed(kwargs.get("speed", "1")), loop=_yes_no("loop", kwargs.get("loop", "no")),
        stack=_stack(kwargs.get("stack")))


def _speed(text: str) -> float | None:
    if text.lower() == "max":
        return None
    try:
        speed = float(text)
    except ValueError:
        speed = math.nan
    if not (0 < speed <= MAX_SPEED):  # refuses nan and inf too
        raise ReplayError(f"replay: speed={text!r}: use a number over 0 (1 is the recorded "
                          f"pace, 10 ten times faster, at most {MAX_SPEED:g}) or max (as fast "
                          "as possible)")
    return speed


def _yes_no(name: str, text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ReplayError(f"replay: {name}={text!r}: use yes or no")


def _stack(text: str | None) -> str | None:
    from wireproto.phyllo.presets import PRESETS

    if text is not None and text not in PRESETS:
        raise ReplayError(f"replay: stack={text!r}: use {' or '.join(sorted(PRESETS))}")
    return text


def capture_paths(path: str) -> list[Path]:
    """The capture files at `path` (a file, or a directory's files oldest first), each with a
    capture header; a `ReplayError` naming the problem otherwise."""
    try:
        return _capture_paths(path)
    except OSError as error:  # a directory this user may not read or enter
        raise ReplayError(f"replay: {error.filename or path}: {error.strerror}") from None


def _capture_paths(path: str) -> list[Path]:
    where = Path(path)
    if where.is_dir():
        files = capture_files(where)
        if not files:
            raise ReplayError(f"replay: {path} holds no capture files (wirecapture-*.wpcap)")
    elif where.is_file():
        files = [where]
    elif where.exists():  # a FIFO (its open would wait for a writer), a device
        raise ReplayError(f"replay: {path}: not a regular file (a capture file, or a "
                          "directory of them)")
    else:
        raise ReplayError(f"replay: {path}: no such file or directory")
    for file in files:
        try:
            read_header(file)
        except (CaptureError, OSError) as error:
            raise ReplayError(f"replay: {error}".replace("\n", " ")) from None
    return files


@dataclass(frozen=True, slots=True)
class Captured:
    """A selected connection, as its open record describes it (all None when the capture does
    not hold its open record: it opened in an earlier file)."""

    connection: int
    protocol: str | None = None
    transport: str | None = None
    link: str | None = None
    stack: str | None = None

    @classmethod
    def from_open(cls, record: Record) -> Captured:
        info = _info(record)
        return cls(record.connection, _text(info.get("protocol")), _text(info.get("transport")),
                   _text(info.get("link")), _text(info.get("stack")))

    @property
    def phyllo(self) -> bool:
        return self.protocol == "phyllo" or self.transport in ("stream", "chunks")


def _info(record: Record) -> dict[str, object]:
    try:
        info = record.info()
    except ValueError:  # an open record that is not JSON: nothing known of the connection
        return {}
    return info if isinstance(info, dict) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def matches(options: ReplayOptions, record: Record) -> bool:
    """Whether the open `record` is of a connection `options` select."""
    if options.connection is not None:
        return record.connection == options.connection
    info = _info(record)
    return info.get("link") == options.link and not _this_replay(options.path, info.get("peer"))


def _this_replay(path: str, peer: object) -> bool:
    """Whether a connection whose peer was `peer` is a replay of `path` itself, captured by a
    broker capturing into the directory it replays: played too, each run would play more."""
    if not (isinstance(peer, str) and peer.startswith("replay:")):
        return False
    return os.path.realpath(peer.removeprefix("replay:")) == os.path.realpath(path)


def find_selection(options: ReplayOptions, paths: list[Path]) -> Captured:
    """The first connection `options` select, from its open record; for ``connection=ID``
    without one, a record of it in the capture will do. A `ReplayError` lists (bounded) the
    connections and links the capture has when there is none."""
    ids: dict[int, None] = {}
    links: dict[str, None] = {}
    cursor = RecordCursor(paths)
    for record in cursor.records(lambda kind, conn: kind == Kind.OPEN
                                 or conn == options.connection):
        if record is None:
            continue
        if record.kind == Kind.OPEN and matches(options, record):
            return Captured.from_open(record)
        if record.kind != Kind.OPEN:
            return Captured(record.connection)  # opened in an earlier file
        if len(ids) <= LISTED:
            ids[record.connection] = None
        link = _info(record).get("link")
        if isinstance(link, str) and len(links) <= LISTED:
            links[link] = None
    has = (f"Phyllo links {_listed(links)}; " if links else "no Phyllo link; ")
    asked = (f"connection {options.connection}" if options.connection is not None
             else f"Phyllo link {options.link}")
    raise ReplayError(f"replay: {options.path} has no {asked}: it has {has}connections "
                      f"{_listed(ids) or 'none'}")


def _listed(names: Iterable[object]) -> str:
    names = list(names)
    shown = [str(name) for name in names[:LISTED]]
    more = ", ..." if len(names) > LISTED else ""
    return ", ".join(shown) + more


# wanted(kind, connection): whether a record's data is read, or it is skipped by its length.
Wanted = Callable[[int, int], bool]


class RecordCursor:
    """A position in a capture's files, and the records from it on. `records(wanted)` reads the
    data only of records `wanted(kind, connection)` says it wants, checking their CRCs; the
    rest are skipped by their length. A file ends at its end, at a torn last record, or at
    damage (`problems` says which files stopped early, and why)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.index = 0
        self.offset: int | None = None  # None: the first record of paths[index]
        self.skipped = 0  # records over MAX_RECORD_BYTES
        self.problems: list[str] = []

    def rewind(self) -> None:
        self.index, self.offset = 0, None

    @property
    def at_end(self) -> bool:
        return self.index >= len(self.paths)

    def records(self, wanted: Wanted) -> Generator[Record | None, None, None]:
        """Records from the position on; the position moves past each record yielded. None
        now and then, after many records not wanted: where a caller may pause."""
        opened = 0
        while self.index < len(self.paths):
            path = self.paths[self.index]
            try:
                with open(path, "rb") as file:
                    yield from self._file(file, path, wanted)
            except OSError as error:
                self._stopped(path, error.strerror or str(error))
            except CaptureError as error:  # replaced or cut since the replay began
                self._stopped(path, str(error).removeprefix(f"{path}: "))
            self.index, self.offset = self.index + 1, None
            opened += 1
            if opened % FILES_BEFORE_PAUSE == 0 and self.index < len(self.paths):
                yield None

    def _file(self, file: BinaryIO, path: Path, wanted: Wanted
              ) -> Generator[Record | None, None, None]:
        if self.offset is None:
            self.offset = read_header(path).data_offset
        size = os.fstat(file.fileno()).st_size
        passed = 0
        while True:
            file.seek(self.offset)
            head = file.read(HEADER_SIZE)
            if len(head) < HEADER_SIZE:
                if head:
                    self._stopped(path, f"a torn record at offset {self.offset}")
                return
            length, _, _, conn, kind, *_ = RECORD_HEADER.unpack(head)
            end = self.offset + HEADER_SIZE + length
            if end > size:
                self._stopped(path, f"a torn record at offset {self.offset}")
                return
            if length > (MAX_INFO_BYTES if kind in (Kind.OPEN, Kind.CLOSE)
                         else MAX_RECORD_BYTES):
                self.skipped += 1
            elif not wanted(kind, conn):
                passed += 1
                if passed >= PASS_BEFORE_PAUSE:
                    passed = 0
                    self.offset = end
                    yield None  # a breath: a sparse selection does not hold the reactor
                    continue
            else:
                data = file.read(length)
                try:
                    record, _ = decode_record(head + data)
                except IncompleteCapture:
                    self._stopped(path, f"a torn record at offset {self.offset}")
                    return
                except CorruptCapture as error:
                    self._stopped(path, f"{error}".replace("offset 0", f"offset {self.offset}"))
                    return
                self.offset = end
                yield record
                continue
            self.offset = end

    def _stopped(self, path: Path, why: str) -> None:
        if len(self.problems) < LISTED:
            self.problems.append(f"{path}: {why}")
