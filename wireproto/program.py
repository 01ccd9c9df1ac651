"""What every process of the ``wireproto`` program shares: its name, which starts every line it
prints, and how it sets its logging up from the ``[log]`` table.

The command (`wireproto.cli`) and the workers of ``--workers`` (`wireproto.supervisor`) both use
it, so neither needs the other.
"""

from __future__ import annotations

import os
import sys
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
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


def start_logging(settings: LogSettings, verbose: bool) -> None:
    """Log to stderr (or `settings.file`, its directory made if missing, created readable by
    its owner only) at `settings.level`, info with -v; as text, or as one JSON object per line
    (`format = "json"`). OSError if the file cannot be opened."""
    from twisted.logger import (
        FilteringLogObserver,
        LogLevel,
        LogLevelFilterPredicate,
        globalLogBeginner,
        jsonFileLogObserver,
        textFileLogObserver,
    )

    level = LogLevel.levelWithName(settings.level)
    if verbose and level > LogLevel.info:
        level = LogLevel.info
    stream = open_log_file(settings.file) if settings.file else sys.stderr
    make = jsonFileLogObserver if settings.format == "json" else textFileLogObserver
    observer = FilteringLogObserver(
        make(stream), [LogLevelFilterPredicate(defaultLogLevel=level)]
    )
    # stdout stays ours: it carries the listener lines that scripts parse.
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)
