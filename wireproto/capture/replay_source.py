"""What a ``replay:`` endpoint plays: its options, and the connection they select in a
capture, found by reading the capture through `capture/walk.py` as ``wireproto replay`` reads
it (docs/phyllo.md, "Replaying a capture"). The search is done a breath at a time: a reactor
runs it a turn at a time, a check of the config through.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from wireproto.capture.format import Kind, Record
from wireproto.capture.walk import CaptureRefused, RecordCursor, Steps, capture_at
from wireproto.transports.connect import split_endpoint

__all__ = [
    "REPLAY_KEYS",
    "ReplayError",
    "ReplayOptions",
    "Captured",
    "parse_replay",
    "capture_paths",
    "find_selection",
]

REPLAY_KEYS = ("path", "connection", "link", "speed", "loop", "stack")
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


def capture_paths(path: str) -> Steps[list[Path]]:
    """The capture files at `path` (a file, or a directory's and its subdirectories' files, as
    `capture_at` orders them), their headers read; a `ReplayError` naming the problem."""
    try:
        files = yield from capture_at(path)
    except CaptureRefused as error:
        raise ReplayError(f"replay: {error}") from None
    if not files:
        raise ReplayError(f"replay: {path} holds no capture files (wirecapture-*.wpcap)")
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


def find_selection(options: ReplayOptions, paths: list[Path]) -> Steps[Captured]:
    """The first connection `options` select, from its open record; for ``connection=ID``
    without one, a record of it in the capture will do. A `ReplayError` lists (bounded) the
    connections and links the capture has when there is none."""
    ids: dict[int, None] = {}
    links: dict[str, None] = {}
    records = RecordCursor(paths).records(lambda kind, conn: kind == Kind.OPEN
                                          or conn == options.connection)
    with closing(records):  # the file it has open, when found
        for record in records:
            if record is None:
                yield None
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
