"""What the ``wireproto`` program writes to stdout, the lines scripts read: `write_output` ends
the process at once when stdout can no longer be written, as a C program killed by SIGPIPE would,
rather than print a traceback for every line it could not write. Imports nothing of wireproto:
the command, the tools and the pipeline all use it.
"""

from __future__ import annotations

import os
import sys
from typing import IO, NoReturn

__all__ = ["EXIT_OUTPUT_CLOSED", "output_failed", "write_output"]

EXIT_OUTPUT_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for a program a closed pipe ended


def write_output(text: str | bytes, who: str = "wireproto", stream: IO[str] | None = None) -> None:
    """Write `text` to stdout (bytes as they are), or to `stream`, flushed at once. If it
    cannot be written the process ends there (`output_failed`)."""
    try:
        if isinstance(text, bytes):
            sys.stdout.buffer.write(text)
            sys.stdout.buffer.flush()
        else:
            out = sys.stdout if stream is None else stream
            out.write(text)
            out.flush()
    except OSError as error:
        output_failed(error, who)


def output_failed(error: OSError, who: str = "wireproto") -> NoReturn:
    """stdout cannot be written: end the process at once, as a C program killed by SIGPIPE
    would, whatever it was doing. A closed pipe (the reader gone: ``| head -1``) ends it
    quietly with EXIT_OUTPUT_CLOSED; any other error (a full disk) with one line on stderr,
    ``WHO: cannot write the output: WHY``, and 1."""
    if isinstance(error, BrokenPipeError):
        os._exit(EXIT_OUTPUT_CLOSED)
    try:
        sys.stderr.write(f"{who}: cannot write the output: {error.strerror or error}\n")
        sys.stderr.flush()
    finally:
        os._exit(1)
