"""Table layout benchmark: what `wireproto ingest` writes for a fleet, and what reading one date,
broker or protocol of it saves.

    .venv/bin/python bench/table_layout.py [--brokers N] [--days N] [--records N] [--batches N]
                                           [--runs N] [--quick]

A fleet of --brokers brokers (default 4) over --days days (default 2): each broker's day is a
capture of --records messages (default 250,000) in bench/pipeline.py's broker mix (WEBSMQ
fan-out, UBRE, nydus, SubbleSocket), in --batches parts (default 3) ingested one after another
with `wireproto ingest --once` (start_ingest, Spark local[2]): a micro-batch each, as a
following ingest makes one per trigger. It prints the table's partitions, and the data files and
bytes of each (fewest, median, most, and by protocol); then, for queries through `read_table`
(a count and a sum of a hash of every column) with no filter and with a filter on date, broker,
protocol, all three, and a column that is no partition (topic): the files and bytes Spark's scan
read (its own metrics), and the wall and CPU seconds (medians of --runs after a warm-up). The
rows of the whole table, of a date and of a broker are checked against the captures'.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:  # for bench/'s shared harness
    sys.path.append(str(Path(__file__).resolve().parent))
import _harness as harness  # noqa: E402
import pipeline as bench_pipeline  # noqa: E402
from _harness import BenchError  # noqa: E402

DAY_NS = 86_400 * 10**9
FIRST_DAY_NS = 1_795_651_200 * 10**9  # 2026-11-26 00:00 UTC
BATCH_GAP_NS = 3_600 * 10**9  # each part of a day an hour after the last


@dataclass
class Query:
    name: str
    where: str | None
    rows: int  # what it must count
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    cpu: float = 0.0


def generate_fleet(directory: Path, options: argparse.Namespace) -> dict[tuple[str, str], int]:
    """The fleet's captures under `directory` (one folder per broker), and their rows by
    (broker, date)."""
    rows: dict[tuple[str, str], int] = {}
    per_part = max(1, options.records // options.batches)
    for part in range(options.batches):
        for broker_number in range(options.brokers):
            broker = f"site-{broker_number + 1}"
            for day in range(options.days):
                start = FIRST_DAY_NS + day * DAY_NS + 8 * BATCH_GAP_NS + part * BATCH_GAP_NS
                date = time.strftime("%Y-%m-%d", time.gmtime(start // 10**9))
                made = bench_pipeline.generate(
                    directory / broker / f"day{day}-part{part}", per_part, 2,
                    seed=part * 1000 + broker_number * 10 + day, broker=broker, start_ns=start)
                rows[broker, date] = rows.get((broker, date), 0) + made.rows
    return rows


def scan_metrics(frame: Any) -> tuple[int, int]:
    """The files and bytes the file scans of `frame`'s executed plan read (Spark's metrics)."""
    files = size = 0
    stack = [frame._jdf.queryExecution().executedPlan()]
    while stack:
        node = stack.pop()
        name = node.nodeName()
        if "AdaptiveSparkPlan" in name:
            stack.append(node.executedPlan())
            continue
        if "QueryStage" in name:
            stack.append(node.plan())
            continue
        metrics = node.metrics()
        if metrics.contains("numFiles") and metrics.contains("filesSize"):
            files += metrics.apply("numFiles").value()
            size += metrics.apply("filesSize").value()
        children = node.children()
        stack.extend(children.apply(index) for index in range(children.size()))
    return files, size


def layout_lines(table: Path) -> list[str]:
    files: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for path in table.rglob("part-*.parquet"):
        date, broker, protocol = (part.split("=", 1)[1] for part in path.parts[-4:-1])
        files[date, broker, protocol].append(path.stat().st_size)
    if not files:
        raise BenchError(f"no data files in {table}")
    counts = sorted(len(sizes) for sizes in files.values())
    sizes = sorted(sum(sizes) for sizes in files.values())
    by_protocol: Counter[str] = Counter()
    files_by_protocol: Counter[str] = Counter()
    for (_, _, protocol), found in files.items():
        by_protocol[protocol] += sum(found)
        files_by_protocol[protocol] += len(found)
    total = sum(sizes)
    lines = [f"table: {len(files)} partitions (date/broker/protocol), {sum(counts)} data files,"
             f" {total / (1 << 20):.1f} MiB",
             f"files per partition: fewest {counts[0]}, median {statistics.median(counts):g},"
             f" most {counts[-1]}",
             f"bytes per partition: fewest {_kib(sizes[0])}, median"
             f" {_kib(statistics.median(sizes))}, most {_kib(sizes[-1])}"]
    lines += [f"  {protocol}: {_kib(size)} in {files_by_protocol[protocol]} files"
              f" ({100 * size / total:.1f}% of the bytes)"
              for protocol, size in by_protocol.most_common()]
    return lines


def _kib(size: float) -> str:
    return f"{size / 1024:,.0f} KiB"


def run(options: argparse.Namespace, out: Callable[[str], None] = print) -> list[Query]:
    from wireproto.pipeline.table import read_table

    directory = Path(tempfile.mkdtemp(prefix="wireproto-bench-layout-"))
    spark, created = bench_pipeline.spark_session()
    try:
        captures, table = directory / "captures", directory / "table"
        started = time.perf_counter()
        rows = generate_fleet(captures, options)
        capture_bytes = sum(path.stat().st_size for path in captures.rglob("*.wpcap"))
        out(f"fleet: {options.brokers} brokers, {options.days} days, {sum(rows.values()):,} rows"
            f" in {capture_bytes / (1 << 20):.1f} MiB of captures, written in"
            f" {time.perf_counter() - started:.1f} s")
        jvm = bench_pipeline._jvm_pid(spark)

        def cpu() -> float:
            return sum(bench_pipeline.spark_cpu_split(jvm)) + time.process_time()

        # One ingest per part, each reading what the parts before it did not.
        parts = sorted({path.parent.name.split("-part")[1] for path in
                        captures.rglob("*.wpcap")}, key=int)
        staged = directory / "staged"
        for part in parts:
            for folder in captures.glob(f"*/day*-part{part}"):
                target = staged / folder.parent.name / folder.name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(folder, target)
            ingested = bench_pipeline.ingest_table(spark, staged, table)
        if ingested != sum(rows.values()):
            raise BenchError(f"the table holds {ingested:,} rows, the captures"
                             f" {sum(rows.values()):,}")
        for line in layout_lines(table):
            out(line)

        date = min(date for _, date in rows)
        queries = [
            Query("all", None, sum(rows.values())),
            Query(f"date = {date}", f"date = '{date}'",
                  sum(count for (_, day), count in rows.items() if day == date)),
            Query("broker = site-1", "broker = 'site-1'",
                  sum(count for (broker, _), count in rows.items() if broker == "site-1")),
            Query("protocol = ubre", "protocol = 'ubre'", -1),
            Query("all three", f"date = '{date}' and broker = 'site-1' and protocol = 'ubre'", -1),
            Query("topic (no partition)", "topic = 'plant/line0/sensor0'", -1),
        ]
        frame = read_table(spark, str(table))
        names = tuple(frame.columns)
        for query in queries:
            chosen = frame if query.where is None else frame.where(query.where)
            seconds, cpus = [], []
            for run_number in range(options.runs + 1):
                hashed = chosen.selectExpr(f"hash({', '.join(names)}) as h").selectExpr(
                    "count(*)", "sum(cast(h as long))")
                before, start = cpu(), time.perf_counter()
                count, _ = hashed.collect()[0]  # this plan runs, so its metrics fill
                if run_number:
                    seconds.append(time.perf_counter() - start)
                    cpus.append(cpu() - before)
            if query.rows >= 0 and count != query.rows:
                raise BenchError(f"{query.name}: {count:,} rows, the captures hold"
                                 f" {query.rows:,}")
            query.rows = count
            query.files, query.bytes = scan_metrics(hashed)
            query.seconds, query.cpu = statistics.median(seconds), statistics.median(cpus)
        whole = queries[0]
        out("")
        out(f"{'query (every column)':<22} {'rows':>10} {'files':>6} {'MiB read':>9} {'share':>6}"
            f" {'median s':>9} {'CPU s':>7}")
        for query in queries:
            out(f"{query.name:<22} {query.rows:>10,} {query.files:>6}"
                f" {query.bytes / (1 << 20):>9.1f} {100 * query.bytes / whole.bytes:>5.1f}%"
                f" {query.seconds:>9.3f} {query.cpu:>7.2f}")
        out(f"medians of {options.runs}; Spark local[2]; python {sys.version.split()[0]},"
            f" {os.cpu_count()} cores")
        if options.quick:
            out("--quick: a smoke run, too small for figures; run without it to compare")
        return queries
    finally:
        if created:
            spark.stop()
        shutil.rmtree(directory, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", type=int, default=4, help="brokers (default 4)")
    parser.add_argument("--days", type=int, default=2, help="days (default 2)")
    parser.add_argument("--records", type=int, help="messages per broker and day (default"
                        " 250,000, or 3,000 with --quick)")
    parser.add_argument("--batches", type=int, default=3, help="ingests, each of the next part"
                        " of every broker's day (default 3)")
    parser.add_argument("--runs", type=int, help="timed runs of each query after a warm-up"
                        " (default 3, 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a small fleet, one run")
    options = parser.parse_args(argv)
    if options.records is None:
        options.records = 3_000 if options.quick else 250_000
    if options.runs is None:
        options.runs = 1 if options.quick else 3
    for name in ("brokers", "days", "records", "batches", "runs"):
        if getattr(options, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(options, name)}")
    return options


def main(argv: list[str] | None = None) -> int:
    return harness.main("table_layout.py", run, parse_args(argv), reactor=False)


if __name__ == "__main__":
    raise SystemExit(main())
