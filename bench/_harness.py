"""What every benchmark shares: `BenchError` for a run that cannot be trusted, and `main`, which
runs a benchmark (under the Twisted reactor, or plainly) and turns its failures into one line on
stderr and exit status 1."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet import defer, task

__all__ = ["BenchError", "main"]


class BenchError(Exception):
    """The run cannot be trusted: a delivery, a reply or a row was lost, added or changed, or
    something stalled."""


def main(name: str, run: Callable[[Any], Any], options: Any, *, reactor: bool = True) -> int:
    """Run `run(options)` (a coroutine function under the reactor when `reactor`), and return
    the exit status: 0, or 1 with each failure on stderr as ``bench/NAME: why``."""
    failures: list[str] = []
    if not reactor:
        try:
            run(options)
        except BenchError as error:
            failures.append(str(error))
    else:
        async def bench(_reactor: Any) -> None:
            try:
                await run(options)
            except BenchError as error:
                failures.append(str(error))

        def start(reactor: Any) -> Awaitable[None]:
            return defer.ensureDeferred(bench(reactor))

        try:
            task.react(start)
        except SystemExit as exit:
            if exit.code:
                return int(exit.code)
    for failure in failures:
        print(f"bench/{name}: {failure}", file=sys.stderr)
    return 1 if failures else 0


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_table() -> tuple[dict[int, list[int]], dict[int, float]]:
    """Every process's children, and its utime+stime with its reaped children's, from /proc."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it exited
        children.setdefault(int(fields[1]), []).append(int(entry))
        times[int(entry)] = sum(int(value) for value in fields[11:15]) / CLOCK_TICKS
    return children, times
