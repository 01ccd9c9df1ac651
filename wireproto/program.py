"""What every process of the ``wireproto`` program shares: its name, which starts every line it
prints, and how it sets its logging up from the ``[log]`` table.

The command (`wireproto.cli`) and the workers of ``--workers`` (`wireproto.supervisor`) both use
it, so neither needs the other.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from twisted.logger import ILogFilterPredicate, ILogObserver

    from wireproto.config.tables import LogSettings

__all__ = ["PROG", "open_log_file", "start_logging"]

PROG = "wireproto"


def open_log_file(path: str) -> IO[str]:
    """`path` opened for appending; made readable by its owner only if it is new (a log names
    peers and principals), an existing file keeping the mode it was given; its directory made
    (0700) if missing."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    return open(descriptor, "a", encoding="utf-8")  # noqa: SIM115


def start_logging(settings: LogSettings, verbose: bool, worker: int | None = None) -> None:
    """Log to stderr (or `settings.file`, its directory made if missing, created readable by
    its owner only) at `settings.level`, info with -v; as text, or as JSON Lines (`format =
    "json"`, `wireproto.logs.json_line`); never Twisted's own chatter (`wireproto.logs`).
    OSError if the file cannot be opened.

    A worker of ``--workers`` (`worker`: its index) shares its supervisor's stderr or log file
    with the other workers, so each of its lines says which it is: the fields ``worker`` (the
    index) and ``pid`` in JSON, ``[worker 1 pid 4242]`` after the time in text."""
    from twisted.logger import (
        FileLogObserver,
        FilteringLogObserver,
        LogLevel,
        LogLevelFilterPredicate,
        globalLogBeginner,
    )

    from wireproto.logs import is_chatter, json_line, set_debugging, text_line

    level = LogLevel.levelWithName(settings.level)
    if verbose and level > LogLevel.info:
        level = LogLevel.info
    set_debugging(level <= LogLevel.debug)
    stream = open_log_file(settings.file) if settings.file else sys.stderr
    output: ILogObserver
    if settings.format == "json":
        output = FileLogObserver(stream, json_line)
    else:
        # Twisted's text, its control characters escaped, with the worker after the time.
        whose = "" if worker is None else f"[worker {worker} pid {os.getpid()}] "
        output = FileLogObserver(stream, lambda event: text_line(event, whose))
    if worker is not None:
        output = _stamped(output, {"worker": worker, "pid": os.getpid()})
    observer = FilteringLogObserver(output, [
        LogLevelFilterPredicate(defaultLogLevel=level),
        _without(is_chatter),
    ])
    # stdout stays ours: it carries the listener lines that scripts parse.
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)


def _without(unwanted: Callable[[dict], bool]) -> ILogFilterPredicate:
    """A filter predicate that drops the events `unwanted` says yes to."""
    from twisted.logger import ILogFilterPredicate, PredicateResult
    from zope.interface import provider

    @provider(ILogFilterPredicate)
    def predicate(event: dict) -> PredicateResult:
        return PredicateResult.no if unwanted(event) else PredicateResult.maybe

    return predicate


def _stamped(observer: ILogObserver, fields: dict[str, object]) -> ILogObserver:
    """`observer`, given each event with `fields` added (a copy: other observers see the
    event as it was)."""
    from twisted.logger import ILogObserver
    from zope.interface import provider

    @provider(ILogObserver)
    def stamp(event: dict) -> None:
        observer({**event, **fields})

    return stamp
