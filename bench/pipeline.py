"""Pipeline benchmark: the same capture rows read four ways in one run.

    one process     capture.read_batch + rows.decode_batch over every file in turn: the very
                    decode the wirecapture data source runs, in this process
    wirecapture     spark.read.format("wirecapture").load(DIR) in Spark local[2]
    parquet         Spark local[2] reading the same rows already in Parquet (written once by
                    this benchmark): what Spark itself costs per row, the floor
    table           Spark local[2] reading the table `wireproto ingest` makes of the capture
                    (ingested once by this benchmark, a streaming query), as `wireproto
                    analyze --table` reads it

Each reads two sets of columns: all 16 of the schema, and the 5 record columns (timestamp,
connection, kind, protocol, transport; the wirecapture source given that schema decodes no
message). Spark's queries take a count and a sum of a hash of every column read, so none is
pruned away.

    .venv/bin/python bench/pipeline.py [--records N] [--files N] [--runs N] [--quick]
    .venv/bin/python bench/pipeline.py --profile    # where the time goes, instead of timing
    .venv/bin/python bench/pipeline.py --small      # `wireproto analyze` of a small capture

--small times `wireproto analyze` of a capture of at most 10,000 rows from the command's start
to its exit, and tells where the time goes (bench/_analyze_small.py); goal at most 30 s.

--profile prints a cProfile of the one-process decode, py-spy's samples of Spark's Python
workers, and a Java Flight Recorder profile of the JVM, each over the wirecapture reads.

The capture (written once to a temporary directory, removed after) looks like a broker's output:
WEBSMQ publishes coming in over length32 in batch records of 2 to 8 and fanned out to length32
subscribers in batch records of 10 to 100 and to WebSocket subscribers one message per record;
UBRE JSON requests and successes over WebSocket, UBRE JSON publishes fanned out over lines in
batch records; nydus invokes and results; SubbleSocket produce events and their events; one
event in 500 is a pair of malformed frames. Every message is encoded once for real (unique
payloads and ids), so only fan-out repeats bytes, as it does in a broker. The row count of both
readers is checked against the count generated. A warm-up run comes first; the figures are
medians of --runs runs. Spark's fixed cost per query is measured too, on a tiny capture.
Goals (docs/performance.md): the wirecapture source's CPU per row within 1.5x of Spark's own
Parquet read, wirecapture local[2] at least 1.7x one process, and at least 1.5M rows/s; the
table read at least 3x the wirecapture source's rows per second, within 1.2x of the Parquet
floor's CPU per row. --analyze also times `analyze` over the capture and over the table.

Then filter pushdown (bench/_pushdown.py): a fleet of eight brokers of the same traffic, queried
for one broker, one protocol and a time window with Spark's Python filter pushdown off and on:
bytes read (pages brought into the page cache) and CPU.

Ingest: `wireproto ingest --once` (wireproto.pipeline.ingest.start_ingest) of the same capture into
a new table, with and without its shuffle by the partition columns, beside Spark's own
partitioned Parquet write of the same rows (read from the Parquet copy; its write's CPU is that
run's less the Parquet read's). Goal: ingest's CPU per row at most 1.1x the wirecapture read's
plus the Parquet write's, as measured and net of each query's fixed CPU (an ingest's and a
wirecapture read's over a tiny capture).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import math
import os
import pstats
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wireproto import capture
from wireproto.codecs import nydus, subble, ubre, websmq
from wireproto.pipeline.rows import ARROW_SCHEMA, SCHEMA, decode_batch, projected_schema

if str(Path(__file__).resolve().parent) not in sys.path:  # for bench/'s shared harness
    sys.path.append(str(Path(__file__).resolve().parent))
import _harness as harness  # noqa: E402
import _pushdown as pushdown  # noqa: E402
from _harness import BenchError  # noqa: E402

DEFAULT_BATCH_SIZE = None  # the data source's own default
SPEEDUP_GOAL = 1.7
RATE_GOAL = 1_500_000
PARQUET_GOAL = 1.5  # the source's CPU per row against Spark's own Parquet read, at most
TABLE_SPEEDUP_GOAL = 3.0  # the table's rows per second against the wirecapture source's
TABLE_PARQUET_GOAL = 1.2  # the table's CPU per row against the Parquet floor's, at most
INGEST_GOAL = 1.1  # ingest's CPU per row against the wirecapture read's plus a Parquet write's
TINY_MESSAGES = 2000
VIEWS = {
    "all": tuple(ARROW_SCHEMA.names),
    "record": ("timestamp", "connection", "kind", "protocol", "transport"),
}
READERS = ("one process", "wirecapture", "parquet", "table")


# --- The capture ---------------------------------------------------------------------------------


@dataclass
class Capture:
    directory: Path
    rows: int  # rows the data source must give: messages, opens (repeats too) and closes
    messages: int
    records: int
    files: int
    bytes: int
    mix: dict[str, int] = field(default_factory=dict)  # rows per protocol and direction


class _Generator:
    """Records as a broker writes them, kept in memory first so files can be sized to rotate."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.ops: list[tuple[Any, ...]] = []  # ("open", ...), ("message", ...), ("close", id)
        self.connections: dict[str, list[int]] = {}
        self.protocol_of: dict[int, str] = {}
        self.pending: dict[int, list[bytes]] = {}  # connection -> messages not yet in a record
        self.flush_at: dict[int, int] = {}
        self.messages = 0
        self.bytes = 0
        self.mix: dict[str, int] = {}
        self.sequence = 0

    def open(self, group: str, count: int, protocol: str, transport: str) -> None:
        ids = self.connections.setdefault(group, [])
        for _ in range(count):
            conn = len(self.protocol_of) + 1
            self.protocol_of[conn] = protocol
            ids.append(conn)
            self.ops.append(("open", conn, f"10.0.{conn // 250}.{conn % 250}:{40000 + conn}",
                             protocol, transport))

    def single(self, conn: int, direction: str, message: bytes, binary: bool) -> None:
        self._record(conn, direction, message, binary, batch=False, count=1)

    def batched(self, conn: int, direction: str, message: bytes, low: int, high: int) -> None:
        """Collect `message` for a batch record of `low` to `high` messages."""
        pending = self.pending.setdefault(conn, [])
        pending.append(message)
        if len(pending) >= self.flush_at.setdefault(conn, self.random.randint(low, high)):
            self.flush(conn, direction, low, high)

    def flush(self, conn: int, direction: str, low: int, high: int) -> None:
        pending = self.pending.pop(conn, [])
        if pending:
            self._record(conn, direction, capture.encode_batch(pending), True, batch=True,
                         count=len(pending))
        self.flush_at[conn] = self.random.randint(low, high)

    def _record(self, conn: int, direction: str, data: bytes, binary: bool, *, batch: bool,
                count: int) -> None:
        self.ops.append(("message", conn, direction, data, binary, batch))
        self.messages += count
        self.bytes += capture.HEADER_SIZE + len(data)
        key = f"{self.protocol_of[conn]} {direction}"
        self.mix[key] = self.mix.get(key, 0) + count

    def next_id(self) -> int:
        self.sequence += 1
        return self.sequence


def _payload(rng: random.Random, sequence: int) -> bytes:
    return sequence.to_bytes(8, "big") + rng.randbytes(rng.randint(8, 120))


def generate(directory: Path, messages: int, files: int, seed: int = 9, *,
             broker: str | None = None, start_ns: int = 1_700_000_000_000_000_000) -> Capture:
    """Write at least `messages` messages to about `files` capture files in `directory`, as
    `broker` (default: host:pid), the first at `start_ns`, 20 µs apart."""
    gen = _Generator(seed)
    rng = gen.random
    gen.open("publishers", 4, "websmq", "length32")
    gen.open("stream subscribers", 40, "websmq", "length32")
    gen.open("ws subscribers", 10, "websmq", "ws")
    gen.open("ubre clients", 4, "ubre", "ws")
    gen.open("ubre subscribers", 6, "ubre", "lines")
    gen.open("nydus clients", 4, "nydus", "ws")
    gen.open("subble clients", 6, "subble", "ws")
    group = gen.connections
    topics = [f"plant/line{line}/sensor{sensor}" for line in range(8) for sensor in range(25)]
    routes = ["add", "read_sensor", "set_point", "status"]
    while gen.messages < messages:
        draw = rng.random()
        number = gen.next_id()
        if number % 500 == 1:  # malformed: a truncated WEBSMQ frame, cut-off UBRE JSON
            gen.single(rng.choice(group["ws subscribers"]), "in", b"\x00\x09ab", True)
            gen.single(rng.choice(group["ubre clients"]), "in", b'{"request": "add", "id": 1',
                       False)
        elif draw < 0.55:  # a WEBSMQ publish, fanned out
            frame = websmq.encode(websmq.Publish(rng.choice(topics), _payload(rng, number)))
            gen.batched(rng.choice(group["publishers"]), "in", frame, 2, 8)
            for conn in rng.sample(group["stream subscribers"], rng.randint(6, 14)):
                gen.batched(conn, "out", frame, 10, 100)
            for conn in rng.sample(group["ws subscribers"], rng.randint(0, 3)):
                gen.single(conn, "out", frame, True)
        elif draw < 0.75:  # a UBRE JSON request and its success
            conn = rng.choice(group["ubre clients"])
            body = {"sensor": rng.choice(topics), "value": rng.random() * 100, "n": number}
            gen.single(conn, "in", ubre.encode(ubre.Request(number, body,
                                                            name=rng.choice(routes))), False)
            gen.single(conn, "out", ubre.encode(ubre.Success(number, {"ok": True, "n": number})),
                       False)
        elif draw < 0.85:  # a UBRE JSON publish, fanned out over lines
            frame = ubre.encode(ubre.Publish(rng.choice(topics), {"v": number, "unit": "C"}))
            gen.single(rng.choice(group["ubre clients"]), "in", frame, False)
            for conn in rng.sample(group["ubre subscribers"], rng.randint(2, 6)):
                gen.batched(conn, "out", frame, 10, 60)
        elif draw < 0.93:  # a nydus invoke and its result
            conn = rng.choice(group["nydus clients"])
            call = f"c{number}"
            gen.single(conn, "in", nydus.encode(nydus.Invoke(
                call, f"/sensors/dev{number % 50}", {"read": number})).encode(), False)
            gen.single(conn, "out", nydus.encode(nydus.Result(call, [number, 21.5])).encode(),
                       False)
        else:  # a SubbleSocket produce event and the events it makes
            source = rng.choice(group["subble clients"])
            event_type = f"reading{number % 10}"
            payload = _payload(rng, number)
            gen.single(source, "in", subble.encode(subble.ProduceEvent(
                f"client{source}", subble.SerializationFormat.MSGPACK, event_type, payload)),
                True)
            # The producer gets its own event back (the echo answering its produce); other
            # subscribers get it as a server event.
            recipients = rng.sample(group["subble clients"], rng.randint(1, 4))
            if source not in recipients:
                recipients[0] = source
            for conn in recipients:
                code = (subble.MessageCode.CLIENT_EVENT if conn == source
                        else subble.MessageCode.SERVER_EVENT)
                gen.single(conn, "out", subble.encode(subble.Event(
                    code, subble.SerializationFormat.MSGPACK, 1_700_000_000_000 + number,
                    event_type, f"guid-{number}", f"client{source}", payload)), True)
    for conn in list(gen.pending):
        gen.flush(conn, "out" if conn not in group["publishers"] else "in", 1, 1)
    for conn in gen.protocol_of:
        gen.ops.append(("close", conn))
    return _write(directory, gen, files, broker, start_ns)


def _write(directory: Path, gen: _Generator, files: int, broker: str | None,
           start_ns: int) -> Capture:
    max_file_bytes = max(capture.MIN_FILE_BYTES, -(-gen.bytes // files) + 65536)
    clock = iter(range(start_ns, start_ns + 200_000_000_000_000_000, 20_000))
    rows = 0
    open_now = 0
    with capture.CaptureWriter(directory, max_file_bytes=max_file_bytes, broker=broker,
                               clock=lambda: next(clock), buffer_bytes=8 << 20) as writer:
        path = None
        for op in gen.ops:
            before = open_now
            if op[0] == "message":
                _, conn, direction, data, binary, batch = op
                writer.message(conn, direction, data, binary, batch=batch)
            elif op[0] == "open":
                writer.open_connection(*op[1:])
                open_now += 1
                rows += 1
            else:
                writer.close_connection(op[1], "bye")
                open_now -= 1
                rows += 1
            if writer.path != path:
                if path is not None:  # a new file repeats the opens of connections still open
                    rows += before
                path = writer.path
    counters = writer.counters
    return Capture(directory, rows + gen.messages, gen.messages, counters.records,
                   counters.files, counters.bytes, gen.mix)


# --- The readers ---------------------------------------------------------------------------------


def decode_in_process(paths: list[str], batch_size: int, view: str = "all") -> int:
    """Rows decoded by one process, the data source's way: batches of `batch_size` records."""
    schema = projected_schema(VIEWS[view])
    rows = 0
    for path in paths:
        start = None
        while True:
            batch = capture.read_batch(path, start_offset=start, max_records=batch_size)
            if len(batch):
                rows += decode_batch(path, batch, None, schema).num_rows
            if batch.stop != "limit":
                break
            start = batch.end
    return rows


def write_parquet(paths: list[str], directory: Path, batch_size: int) -> None:
    """The rows of each capture file, as the source makes them, in one Parquet file each."""
    import pyarrow.parquet as parquet

    from wireproto.pipeline.rows import broker_of

    directory.mkdir()
    for number, path in enumerate(paths):
        broker = broker_of(capture.read_header(path))
        with parquet.ParquetWriter(directory / f"part-{number:03d}.parquet",
                                   ARROW_SCHEMA) as writer:
            start = None
            while True:
                batch = capture.read_batch(path, start_offset=start, max_records=batch_size)
                if len(batch):
                    writer.write_batch(decode_batch(path, batch, broker))
                if batch.stop != "limit":
                    break
                start = batch.end


def spark_session() -> tuple[Any, bool]:
    """The active SparkSession, or a new local[2] one (then True: stop it after)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from wireproto.pipeline.datasource import WireCaptureDataSource

    session = SparkSession.getActiveSession()
    created = session is None
    if created:
        session = (
            SparkSession.builder.master("local[2]")
            .appName("wireproto-bench-pipeline")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(WireCaptureDataSource)
    return session, created


def _hashed_count(frame: Any, names: tuple[str, ...]) -> int:
    """A count and a sum of a hash of every column in `names`: Spark reads each of them."""
    rows, _ = frame.selectExpr(f"hash({', '.join(names)}) as h").selectExpr(
        "count(*)", "sum(cast(h as long))").first()
    return int(rows)


def decode_in_spark(spark: Any, directory: Path, batch_size: int | None,
                    view: str = "all") -> int:
    """Rows the wirecapture source gave; given the view's columns as its schema (but all)."""
    reader = spark.read.format("wirecapture")
    if batch_size is not None:
        reader = reader.option("batch_size", str(batch_size))
    if view != "all":
        reader = reader.schema(", ".join(f"{name} {ARROW_TYPES[name]}" for name in VIEWS[view]))
    return _hashed_count(reader.load(str(directory)), VIEWS[view])


def read_parquet(spark: Any, directory: Path, view: str = "all") -> int:
    return _hashed_count(spark.read.parquet(str(directory)).select(*VIEWS[view]), VIEWS[view])


def read_table(spark: Any, table: Path, view: str = "all") -> int:
    """Rows of the ingested table, read as `wireproto analyze --table` reads it."""
    from wireproto.pipeline.table import read_table as read

    return _hashed_count(read(spark, str(table), None).select(*VIEWS[view]), VIEWS[view])


def table_files(table: Path) -> list[Path]:
    """The table's data files (not its log or checkpoint)."""
    return [path for path in table.rglob("*.parquet")
            if not any(part.startswith(("_", ".")) for part in path.relative_to(table).parts)]


def ingest_table(spark: Any, captures: Path, table: Path, repartition: bool = True) -> int:
    """Rows `wireproto ingest --once` of `captures` wrote into the new table `table`."""
    from wireproto.pipeline.ingest import start_ingest

    query = start_ingest(spark, str(captures), str(table), once=True, repartition=repartition)
    query.awaitTermination()
    if query.exception() is not None:
        raise BenchError(f"ingest failed: {query.exception()}")
    return parquet_rows(table)


def spark_write_table(spark: Any, parquet_dir: Path, table: Path) -> int:
    """Spark's own write of the rows in `parquet_dir` as the table's are written: with their
    date, partitioned by date, broker and protocol."""
    from wireproto.pipeline.ingest import table_rows
    from wireproto.pipeline.table import PARTITIONED_BY

    rows = table_rows(spark.read.parquet(str(parquet_dir)))
    rows.write.partitionBy(*PARTITIONED_BY).parquet(str(table))
    return parquet_rows(table)


def parquet_rows(table: Path) -> int:
    """Rows in the Parquet files under `table`, from their footers."""
    import pyarrow.parquet as parquet

    return sum(parquet.read_metadata(path).num_rows for path in table.rglob("part-*.parquet"))


INGESTS = ("ingest", "ingest, no shuffle", "parquet write")


def measure_ingest(spark: Any, cap: Capture, parquet_dir: Path, directory: Path, runs: int,
                   cpu_clock: Callable[[], tuple[float, float]], report: Report) -> None:
    """Each of INGESTS timed into a new table each run (removed after it is counted), the data
    files each wrote, and the fixed CPU cost of an ingest and of a wirecapture read (over a
    capture of TINY_MESSAGES)."""
    tables = itertools.count()

    def into_new_table(name: str, make: Callable[[Path], int]) -> Callable[[], int]:
        def once() -> int:
            table = directory / f"table-{next(tables)}"
            rows = make(table)
            report.ingest_files[name] = sum(1 for _ in table.rglob("part-*.parquet"))
            shutil.rmtree(table)
            return rows
        return once

    makers: dict[str, Callable[[Path], int]] = {
        "ingest": lambda table: ingest_table(spark, cap.directory, table),
        "ingest, no shuffle": lambda table: ingest_table(spark, cap.directory, table,
                                                         repartition=False),
        "parquet write": lambda table: spark_write_table(spark, parquet_dir, table),
    }
    for name, make in makers.items():
        report.ingest[name] = _timed(name, cap.rows, into_new_table(name, make), runs, cpu_clock)
    tiny = generate(directory / "tiny-ingest", TINY_MESSAGES, 1)
    report.fixed_rows = tiny.rows
    report.fixed_cpu["wirecapture"] = statistics.median(_timed(
        "wirecapture, tiny capture", tiny.rows, lambda: decode_in_spark(spark, tiny.directory,
                                                                        None),
        runs, cpu_clock).cpu)
    report.fixed_cpu["ingest"] = statistics.median(_timed(
        "ingest, tiny capture", tiny.rows, into_new_table(
            "tiny", lambda table: ingest_table(spark, tiny.directory, table)),
        runs, cpu_clock).cpu)


# Each column's type as the source's SCHEMA names it.
ARROW_TYPES = dict(item.strip().split(" ", 1) for item in SCHEMA.split(","))


# --- CPU time -----------------------------------------------------------------------------------

def tree_cpu_seconds(root: int) -> float:
    """utime+stime of process `root` and its descendants (the JVM and its Python workers), with
    their reaped children's, from /proc."""
    return sum(spark_cpu_split(root))


def spark_cpu_split(jvm: int) -> tuple[float, float]:
    """CPU seconds of the JVM itself, and of its descendants (the Python workers)."""
    children, times = harness.process_table()
    workers, stack = 0.0, list(children.get(jvm, ()))
    while stack:
        pid = stack.pop()
        workers += times.get(pid, 0.0)
        stack.extend(children.get(pid, ()))
    return times.get(jvm, 0.0), workers


def _jvm_pid(spark: Any) -> int:
    return spark.sparkContext._gateway.proc.pid


# --- The run -------------------------------------------------------------------------------------


@dataclass
class Timing:
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # all CPU seconds of each timed run
    jvm: list[float] = field(default_factory=list)  # of which the JVM's (Spark runs)


@dataclass
class Report:
    capture: Capture | None = None
    timings: dict[tuple[str, str], Timing] = field(default_factory=dict)  # (reader, view)
    query_seconds: list[float] = field(default_factory=list)  # a Spark query over a tiny capture
    analyze_seconds: dict[str, float] = field(default_factory=dict)  # --analyze: source -> s
    pushdown: pushdown.PushdownReport | None = None
    ingest: dict[str, Timing] = field(default_factory=dict)  # INGESTS
    ingest_files: dict[str, int] = field(default_factory=dict)  # data files each wrote
    fixed_cpu: dict[str, float] = field(default_factory=dict)  # CPU s over a tiny capture
    fixed_rows: int = 0  # its rows
    lines: list[str] = field(default_factory=list)

    def rate(self, reader: str, view: str = "all") -> float:
        return self.capture.rows / statistics.median(self.timings[reader, view].seconds)

    def cpu_per_row(self, reader: str, view: str = "all") -> float:
        """CPU µs per row."""
        return statistics.median(self.timings[reader, view].cpu) * 1e6 / self.capture.rows


def _timed(name: str, expected: int, read: Callable[[], int], runs: int,
           cpu_clock: Callable[[], tuple[float, float]] | None = None) -> Timing:
    """`runs` reads after a warm-up: wall seconds, and CPU seconds from `cpu_clock` (all, the
    JVM's), by default this process's."""
    clock = cpu_clock or (lambda: (time.process_time(), 0.0))
    timing = Timing()
    for run_number in range(runs + 1):  # the first is the warm-up
        (cpu_start, jvm_start), start = clock(), time.perf_counter()
        rows = read()
        seconds = time.perf_counter() - start
        cpu_end, jvm_end = clock()
        if rows != expected:
            raise BenchError(f"{name}: {rows:,} rows read, {expected:,} written")
        if run_number:
            timing.seconds.append(seconds)
            timing.cpu.append(cpu_end - cpu_start)
            timing.jvm.append(jvm_end - jvm_start)
    return timing


def run(options: argparse.Namespace, out: Callable[[str], None] = print) -> Report:
    report = Report()
    directory = Path(tempfile.mkdtemp(prefix="wireproto-bench-pipeline-"))
    try:
        started = time.perf_counter()
        cap = report.capture = generate(directory / "capture", options.records, options.files)
        out(f"capture: {cap.rows:,} rows ({cap.messages:,} messages) in {cap.records:,} records,"
            f" {cap.files} files, {cap.bytes / (1 << 20):.1f} MiB, written in"
            f" {time.perf_counter() - started:.1f} s")
        mix = sorted(cap.mix.items())
        out("mix (rows): " + ", ".join(f"{key} {count:,}" for key, count in mix))
        paths = [os.fspath(path.resolve()) for path in capture.capture_files(cap.directory)]
        batch_size = options.batch_size or _source_batch_size()
        parquet_dir = directory / "parquet"
        write_parquet(paths, parquet_dir, batch_size)
        parquet_bytes = sum(path.stat().st_size for path in parquet_dir.iterdir())
        out(f"parquet: the same rows in {len(paths)} files, {parquet_bytes / (1 << 20):.1f} MiB")
        for view in VIEWS:
            report.timings["one process", view] = _timed(
                f"one process, {view} columns", cap.rows,
                lambda view=view: decode_in_process(paths, batch_size, view), options.runs)
        spark, created = spark_session()
        try:
            jvm = _jvm_pid(spark)

            def spark_cpu() -> tuple[float, float]:
                own, workers = spark_cpu_split(jvm)
                return own + workers + time.process_time(), own

            if options.profile:
                _profile(report, paths, batch_size, spark, cap, options, out)
                return report
            table_dir = directory / "table"
            started = time.perf_counter()
            ingest_table(spark, cap.directory, table_dir)  # as `wireproto ingest --once`
            files = table_files(table_dir)
            out(f"table: the same rows in {len(files)} files, "
                f"{sum(path.stat().st_size for path in files) / (1 << 20):.1f} MiB, partitioned"
                f" by date, broker and protocol; ingested in {time.perf_counter() - started:.1f} s")
            for view in VIEWS:
                report.timings["wirecapture", view] = _timed(
                    f"wirecapture, {view} columns", cap.rows,
                    lambda view=view: decode_in_spark(spark, cap.directory, options.batch_size,
                                                      view), options.runs, spark_cpu)
                report.timings["parquet", view] = _timed(
                    f"parquet, {view} columns", cap.rows,
                    lambda view=view: read_parquet(spark, parquet_dir, view), options.runs,
                    spark_cpu)
                report.timings["table", view] = _timed(
                    f"table, {view} columns", cap.rows,
                    lambda view=view: read_table(spark, table_dir, view), options.runs,
                    spark_cpu)
            measure_ingest(spark, cap, parquet_dir, directory, options.runs, spark_cpu, report)
            # The fixed cost of a query: planning, and the Python workers that plan the read.
            tiny = generate(directory / "tiny", TINY_MESSAGES, 1)
            report.query_seconds = _timed(
                "wirecapture, tiny capture", tiny.rows,
                lambda: decode_in_spark(spark, tiny.directory, options.batch_size),
                options.runs).seconds
            if options.analyze:
                report.analyze_seconds = time_analyze(spark, cap.directory, table_dir,
                                                      directory)
            report.pushdown = pushdown.measure(
                spark, directory / "fleet", options.records, options.runs, generate,
                VIEWS["all"], spark_cpu, _hashed_count, out)
        finally:
            if created:
                spark.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    report.lines = table(report, options) + (report.pushdown.lines if report.pushdown else [])
    for line in report.lines:
        out(line)
    return report


def time_analyze(spark: Any, captures: Path, table: Path, directory: Path) -> dict[str, float]:
    """Seconds of one `analyze` over the capture files and one over the table (--analyze),
    each writing its tables and report to a directory of its own."""
    from wireproto.pipeline.analyze import analyze

    seconds: dict[str, float] = {}
    messages = set()
    for source in ("capture files", "table"):
        started = time.perf_counter()
        out = directory / f"analyze-{source.replace(' ', '-')}"
        summary = (analyze(spark, captures, out) if source == "capture files"
                   else analyze(spark, None, out, table=table))
        seconds[source] = time.perf_counter() - started
        messages.add(summary.messages)
    if len(messages) != 1:
        raise BenchError(f"analyze: {sorted(messages)} rows over the capture and the table")
    return seconds


def _source_batch_size() -> int:
    from wireproto.pipeline.datasource import DEFAULT_BATCH_SIZE as size

    return size


def table(report: Report, options: argparse.Namespace) -> list[str]:
    rows = report.capture.rows
    lines = ["", f"{'reader':<12} {'columns':<8} {'rows/s':>11} {'median s':>9} {'CPU s':>7}"
             f" {'CPU µs/row':>10} {'JVM µs/row':>10} {'Python µs/row':>13}"]
    for (reader, view), timing in report.timings.items():
        cpu, jvm = statistics.median(timing.cpu), statistics.median(timing.jvm)
        spark = reader != "one process"
        lines.append(
            f"{reader:<12} {view:<8} {report.rate(reader, view):>11,.0f}"
            f" {statistics.median(timing.seconds):>9.3f} {cpu:>7.2f} {cpu * 1e6 / rows:>10.2f}"
            f" {(f'{jvm * 1e6 / rows:.2f}' if spark else '-'):>10}"
            f" {(cpu - jvm) * 1e6 / rows:>13.2f}")
    lines.append(f"{rows:,} rows in every run, medians of {options.runs}; batch_size "
                 f"{options.batch_size or _source_batch_size()}; python"
                 f" {sys.version.split()[0]}, {os.cpu_count()} cores")
    query = statistics.median(report.query_seconds)
    spark_seconds = statistics.median(report.timings["wirecapture", "all"].seconds)
    net = rows / (spark_seconds - query) if spark_seconds > query else math.inf
    lines.append(f"spark's fixed cost per query (one file of {TINY_MESSAGES:,} messages):"
                 f" {query:.3f} s; wirecapture net of it: {net:,.0f} rows/s")
    lines.append("CPU: this process, and for Spark also the JVM and its Python workers"
                 " (/proc); on a busy machine the")
    lines.append("wall figures fall with the CPU share the readers get, the CPU figures hold")
    if options.quick:
        lines.append("--quick: a smoke run, too small for figures; run without it to compare")
    over_parquet = report.cpu_per_row("wirecapture") / report.cpu_per_row("parquet")
    speedup = report.rate("wirecapture") / report.rate("one process")
    spark = report.rate("wirecapture")
    lines += ingest_lines(report)
    record_over_parquet = (report.cpu_per_row("wirecapture", "record")
                           / report.cpu_per_row("parquet", "record"))
    record_speedup = report.rate("wirecapture", "record") / report.rate("one process", "record")
    lines += [
        "", "goals (all columns):",
        f"  wirecapture CPU per row: {over_parquet:.2f}x parquet's (goal at most"
        f" {PARQUET_GOAL}x)  {'ok' if over_parquet <= PARQUET_GOAL else 'MISSED'}",
        f"  wirecapture local[2]: {speedup:.2f}x one process (goal at least {SPEEDUP_GOAL}x)"
        f"  {'ok' if speedup >= SPEEDUP_GOAL else 'MISSED'}",
        f"  wirecapture local[2]: {spark:,.0f} rows/s (goal at least {RATE_GOAL:,})"
        f"  {'ok' if spark >= RATE_GOAL else 'MISSED'}",
        f"record columns: wirecapture CPU per row {record_over_parquet:.2f}x parquet's,"
        f" {record_speedup:.2f}x one process",
    ]
    return lines + _table_goals(report)


def _table_goals(report: Report) -> list[str]:
    speedup = report.rate("table") / report.rate("wirecapture")
    over_parquet = report.cpu_per_row("table") / report.cpu_per_row("parquet")
    record_speedup = report.rate("table", "record") / report.rate("wirecapture", "record")
    record_over_parquet = (report.cpu_per_row("table", "record")
                           / report.cpu_per_row("parquet", "record"))
    lines = [
        "goals of the ingested table (all columns):",
        f"  table: {speedup:.2f}x the wirecapture source's rows/s (goal at least"
        f" {TABLE_SPEEDUP_GOAL}x)  {'ok' if speedup >= TABLE_SPEEDUP_GOAL else 'MISSED'}",
        f"  table CPU per row: {over_parquet:.2f}x parquet's (goal at most"
        f" {TABLE_PARQUET_GOAL}x)  {'ok' if over_parquet <= TABLE_PARQUET_GOAL else 'MISSED'}",
        f"record columns: table {record_speedup:.2f}x the wirecapture source's rows/s, CPU per"
        f" row {record_over_parquet:.2f}x parquet's",
    ]
    if report.analyze_seconds:
        captures, table = report.analyze_seconds["capture files"], report.analyze_seconds["table"]
        lines.append(f"analyze: {captures:.1f} s over the capture files, {table:.1f} s over the"
                     f" table ({captures / table:.1f}x)")
    return lines


def ingest_lines(report: Report) -> list[str]:
    """The ingest table and its goal, as measured and net of each query's fixed cost."""
    rows = report.capture.rows

    def per_row(name: str) -> float:
        return statistics.median(report.ingest[name].cpu) * 1e6 / rows

    lines = ["", f"{'ingest':<20} {'rows/s':>11} {'median s':>9} {'CPU µs/row':>10}"
             f" {'JVM µs/row':>10} {'files':>6}"]
    for name, timing in report.ingest.items():
        seconds = statistics.median(timing.seconds)
        lines.append(f"{name:<20} {rows / seconds:>11,.0f} {seconds:>9.3f} {per_row(name):>10.2f}"
                     f" {statistics.median(timing.jvm) * 1e6 / rows:>10.2f}"
                     f" {report.ingest_files[name]:>6}")
    read = report.cpu_per_row("wirecapture")
    write = max(per_row("parquet write") - report.cpu_per_row("parquet"), 0.0)
    ingest = per_row("ingest")
    lines.append(f"parquet write: the write less the Parquet read ({write:.2f} µs/row)")
    lines.append(f"fixed CPU of a query over {report.fixed_rows:,} rows: ingest"
                 f" {report.fixed_cpu['ingest']:.2f} s, wirecapture read"
                 f" {report.fixed_cpu['wirecapture']:.2f} s")

    def net(per_row_cpu: float, reader: str) -> float:
        return (per_row_cpu * rows - report.fixed_cpu[reader] * 1e6) / (rows - report.fixed_rows)

    ratio = ingest / (read + write)
    net_ratio = net(ingest, "ingest") / (net(read, "wirecapture") + write)
    lines.append(f"  ingest CPU per row: {ratio:.2f}x the wirecapture read's plus the Parquet"
                 f" write's ({ingest:.2f} against {read:.2f} + {write:.2f} µs; goal at most"
                 f" {INGEST_GOAL}x)  {'ok' if ratio <= INGEST_GOAL else 'MISSED'}")
    lines.append(f"  net of each query's fixed CPU: {net_ratio:.2f}x ({net(ingest, 'ingest'):.2f}"
                 f" against {net(read, 'wirecapture'):.2f} + {write:.2f} µs)"
                 f"  {'ok' if net_ratio <= INGEST_GOAL else 'MISSED'}")
    return lines


# --- Where the time goes -------------------------------------------------------------------------


def _profile(report: Report, paths: list[str], batch_size: int, spark: Any, cap: Capture,
             options: argparse.Namespace, out: Callable[[str], None]) -> None:
    """cProfile of the one-process decode; py-spy over Spark's Python workers and a Flight
    Recorder profile of the JVM, both during `--runs` wirecapture reads of every column."""
    profiler = cProfile.Profile()
    profiler.runcall(decode_in_process, paths, batch_size)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(20)
    out("== one process, cProfile (all columns) ==")
    out(text.getvalue())
    jvm = _jvm_pid(spark)
    decode_in_spark(spark, cap.directory, options.batch_size)  # workers up, code warm
    workdir = Path(tempfile.mkdtemp(prefix="wireproto-bench-profile-"))
    try:
        recording = workdir / "jvm.jfr"
        jcmd = shutil.which("jcmd")
        if jcmd:
            subprocess.run([jcmd, str(jvm), "JFR.start", "name=bench", "settings=profile",
                            f"filename={recording}"], check=True, capture_output=True)
        samplers = _start_py_spy(jvm, workdir, out)
        for _ in range(options.runs):
            decode_in_spark(spark, cap.directory, options.batch_size)
        for sampler, _ in samplers:
            sampler.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
            sampler.wait(60)
        out("== spark's Python workers, py-spy (self samples, top 20) ==")
        stacks: Counter[str] = Counter()
        waiting = 0
        for _, output in samplers:
            if output.exists():
                for line in output.read_text().splitlines():
                    stack, _, count = line.rpartition(" ")
                    leaf = stack.split(";")[-1]
                    if "daemon.py" in leaf or leaf.startswith("read_int "):
                        waiting += int(count)  # the daemon, or a worker waiting for its task
                    else:
                        stacks[leaf] += int(count)
        _print_top(stacks, out)
        out(f"  ({waiting:,} samples of workers waiting for a task left out)")
        out("== the JVM, Java Flight Recorder (top frames of execution samples, top 20) ==")
        if not jcmd:
            out("(no jcmd: install a JDK to profile the JVM)")
            return
        subprocess.run([jcmd, str(jvm), "JFR.stop", "name=bench"], check=True,
                       capture_output=True)
        printed = subprocess.run(["jfr", "print", "--json", "--events", "jdk.ExecutionSample",
                                  str(recording)], check=True, capture_output=True, text=True)
        frames: Counter[str] = Counter()
        for event in json.loads(printed.stdout)["recording"]["events"]:
            top = (event["values"]["stackTrace"] or {}).get("frames") or []
            if top:
                method = top[0]["method"]
                frames[f"{method['type']['name']}.{method['name']}"] += 1
        _print_top(frames, out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _start_py_spy(jvm: int, workdir: Path, out: Callable[[str], None]
                  ) -> list[tuple[subprocess.Popen, Path]]:
    """py-spy on each Python process under the JVM (the daemon, with its workers)."""
    py_spy = shutil.which("py-spy") or shutil.which(
        "py-spy", path=str(Path(sys.executable).parent))
    if py_spy is None:
        out("(py-spy is not installed: pip install py-spy)")
        return []
    children, _ = harness.process_table()
    samplers = []
    for pid in children.get(jvm, ()):
        output = workdir / f"py-spy-{pid}.txt"
        samplers.append((subprocess.Popen(
            [py_spy, "record", "--pid", str(pid), "--subprocesses", "--rate", "250",
             "--format", "raw", "--output", str(output)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), output))
    time.sleep(1.0)  # py-spy takes a moment to attach
    return samplers


def _print_top(counts: Counter[str], out: Callable[[str], None]) -> None:
    total = sum(counts.values())
    if not total:
        out("(no samples)")
        return
    for name, count in counts.most_common(20):
        out(f"  {100 * count / total:5.1f}%  {name}")
    out(f"  ({total:,} samples)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, help="messages to generate (default 1,000,000,"
                        " or 20,000 with --quick)")
    parser.add_argument("--files", type=int, default=8, help="capture files (default 8)")
    parser.add_argument("--runs", type=int, help="timed runs of each reader after a warm-up"
                        " (default 5, 1 with --quick)")
    parser.add_argument("--batch-size", type=int, help="records per Arrow batch (default: the"
                        " data source's)")
    parser.add_argument("--quick", action="store_true", help="a small capture, one run: a smoke"
                        " run")
    parser.add_argument("--analyze", action="store_true", help="also time `wireproto analyze`"
                        " over the capture files and over the table, once each")
    parser.add_argument("--profile", action="store_true", help="where the time goes (one process,"
                        " Spark's Python workers, the JVM) instead of timing")
    parser.add_argument("--small", action="store_true", help="time `wireproto analyze` of a"
                        " capture of at most 10,000 rows instead (default 3 runs)")
    options = parser.parse_args(argv)
    if options.records is None:
        options.records = 20_000 if options.quick else 1_000_000
    if options.runs is None:
        options.runs = 1 if options.quick else 3 if options.small else 5
    for name in ("records", "files", "runs", "batch_size"):
        value = getattr(options, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    if options.small:
        import _analyze_small

        return harness.main("pipeline.py", lambda options: _analyze_small.run(
            options, generate, print), options, reactor=False)
    return harness.main("pipeline.py", run, options, reactor=False)


if __name__ == "__main__":
    raise SystemExit(main())
