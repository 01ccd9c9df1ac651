"""bench/pipeline.py's filter pushdown figures: what the wirecapture source reads and spends when
a query filters on the broker, on the protocol, or on a time window.

The capture is a fleet of eight brokers, one directory and one file each, of the same traffic as
the main capture. Each query runs with Spark's Python filter pushdown off (Spark filters every
row the source makes) and on (the source skips what the filter rules out). Bytes read are the
capture's pages that the query brought into the page cache: every file is written to disk and
dropped from the cache first (posix_fadvise DONTNEED), and counted after (mincore).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BROKERS = 8
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


# --- Bytes read: the page cache -----------------------------------------------------------------


def evict(paths: list[Path]) -> None:
    """Write the files to disk and drop their pages from the page cache."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_bytes(paths: list[Path]) -> int:
    """Bytes of the files in the page cache (mincore over a mapping that touches no page)."""
    total = 0
    page = mmap.PAGESIZE
    for path in paths:
        size = os.path.getsize(path)
        if not size:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if address in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {path}")
            try:
                pages = (size + page - 1) // page
                vector = (ctypes.c_ubyte * pages)()
                if _libc.mincore(address, size, vector):
                    raise OSError(ctypes.get_errno(), f"mincore {path}")
                total += sum(byte & 1 for byte in vector) * page
            finally:
                _libc.munmap(address, size)
        finally:
            os.close(fd)
    return min(total, sum(os.path.getsize(path) for path in paths))


# --- The queries ----------------------------------------------------------------------------------


@dataclass
class Query:
    name: str
    where: str | None
    pushdown: bool


@dataclass
class Figures:
    rows: list[int] = field(default_factory=list)
    bytes_read: list[int] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    jvm: list[float] = field(default_factory=list)  # of which the JVM's
    seconds: list[float] = field(default_factory=list)


@dataclass
class PushdownReport:
    rows: int = 0  # of the whole fleet
    bytes: int = 0
    figures: dict[str, Figures] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


def queries(broker: str, start: str, end: str) -> list[Query]:
    return [
        Query("no filter", None, True),
        Query("broker, Spark filters", f"broker = '{broker}'", False),
        Query("broker, pushed", f"broker = '{broker}'", True),
        Query("protocol, Spark filters", "protocol = 'ubre'", False),
        Query("protocol, pushed", "protocol = 'ubre'", True),
        Query("time, Spark filters", f"timestamp >= '{start}' and timestamp < '{end}'", False),
        Query("time, pushed", f"timestamp >= '{start}' and timestamp < '{end}'", True),
    ]


def measure(spark: Any, directory: Path, messages: int, runs: int,
            generate: Callable[..., Any], columns: tuple[str, ...],
            cpu_clock: Callable[[], tuple[float, float]],
            hashed_count: Callable[[Any, tuple[str, ...]], int],
            out: Callable[[str], None] = print) -> PushdownReport:
    """Write the fleet, then time each query `runs` times after a warm-up."""
    from wireproto import capture

    report = PushdownReport()
    paths: list[Path] = []
    for number in range(BROKERS):
        written = generate(directory / f"broker-{number}", max(1, messages // BROKERS), 1,
                           seed=number, broker=f"broker-{number}")
        report.rows += written.rows
        paths += capture.capture_files(directory / f"broker-{number}")
    report.bytes = sum(path.stat().st_size for path in paths)
    stamps = [record.timestamp_ns for record in capture.iter_records(paths[0])]
    low, high = min(stamps), max(stamps)
    start, end = (_sql_time(low + (high - low) * 3 // 8), _sql_time(low + (high - low) // 2))
    out(f"pushdown: {BROKERS} brokers, {report.rows:,} rows in {len(paths)} files,"
        f" {report.bytes / (1 << 20):.1f} MiB; time window {start} to {end}")
    before = spark.conf.get(PUSHDOWN_CONF)
    try:
        for query in queries("broker-3", start, end):
            figures = report.figures[query.name] = Figures()
            spark.conf.set(PUSHDOWN_CONF, "true" if query.pushdown else "false")
            for run_number in range(runs + 1):  # the first is the warm-up
                frame = spark.read.format("wirecapture").load(str(directory))
                if query.where:
                    frame = frame.where(query.where)
                evict(paths)
                (cpu_start, jvm_start), started = cpu_clock(), time.perf_counter()
                rows = hashed_count(frame, columns)
                seconds = time.perf_counter() - started
                cpu_end, jvm_end = cpu_clock()
                if run_number:
                    figures.rows.append(rows)
                    figures.bytes_read.append(resident_bytes(paths))
                    figures.cpu.append(cpu_end - cpu_start)
                    figures.jvm.append(jvm_end - jvm_start)
                    figures.seconds.append(seconds)
    finally:
        spark.conf.set(PUSHDOWN_CONF, before)
    report.lines = table(report)
    return report


def _sql_time(nanoseconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(nanoseconds // 1_000_000_000)) + \
        f".{nanoseconds // 1000 % 1_000_000:06d}"


def table(report: PushdownReport) -> list[str]:
    lines = ["", f"{'pushdown query':<24} {'rows':>10} {'bytes read':>11} {'of all':>7}"
             f" {'CPU s':>7} {'CPU µs/row':>10} {'JVM µs/row':>10} {'median s':>9}"]
    for name, figures in report.figures.items():
        bytes_read = statistics.median(figures.bytes_read)
        cpu, jvm = statistics.median(figures.cpu), statistics.median(figures.jvm)
        lines.append(
            f"{name:<24} {figures.rows[0]:>10,} {bytes_read / (1 << 20):>7.1f} MiB"
            f" {bytes_read / report.bytes:>7.1%} {cpu:>7.2f} {cpu * 1e6 / report.rows:>10.2f}"
            f" {jvm * 1e6 / report.rows:>10.2f} {statistics.median(figures.seconds):>9.3f}")
    lines.append(f"CPU µs/row: per row of the whole fleet ({report.rows:,} rows)")
    lines.append("bytes read: the capture's pages the query brought into the page cache")
    return lines
