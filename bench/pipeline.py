"""Pipeline benchmark: capture decoding rows per second, one Python process against Spark local[2].

Both read the same generated capture, one row per message, every column produced:

    one process     capture.read_batch + rows.decode_batch over every file in turn: the very
                    decode the wirecapture data source runs, in this process
    spark local[2]  spark.read.format("wirecapture").load(DIR), a count and a sum of a hash of
                    every column, so Spark cannot prune any of the decoding away

    .venv/bin/python bench/pipeline.py [--records N] [--files N] [--runs N] [--quick]
    .venv/bin/python bench/pipeline.py --profile    # cProfile of the one-process decode

The capture (written once to a temporary directory, removed after) looks like a broker's output:
WEBSMQ publishes coming in over length32 in batch records of 2 to 8 and fanned out to length32
subscribers in batch records of 10 to 100 and to WebSocket subscribers one message per record;
UBRE JSON requests and successes over WebSocket, UBRE JSON publishes fanned out over lines in
batch records; nydus invokes and results; SubbleSocket produce events and their events; one
event in 500 is a pair of malformed frames. Every message is encoded once for real (unique
payloads and ids), so only fan-out repeats bytes, as it does in a broker. The row count of both
readers is checked against the count generated. A warm-up run comes first; the figures are
medians of --runs runs. Spark's fixed cost per query is measured too, on a tiny capture.
Goals (docs/performance.md): local[2] at least 1.7x one process, and at least 1.5M rows/s.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import os
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wireproto import capture
from wireproto.codecs import nydus, subble, ubre, websmq
from wireproto.pipeline.rows import ARROW_SCHEMA, decode_batch

if str(Path(__file__).resolve().parent) not in sys.path:  # for bench/'s shared harness
    sys.path.append(str(Path(__file__).resolve().parent))
import _harness as harness  # noqa: E402
from _harness import BenchError  # noqa: E402

DEFAULT_BATCH_SIZE = None  # the data source's own default
SPEEDUP_GOAL = 1.7
RATE_GOAL = 1_500_000
TINY_MESSAGES = 2000
COLUMNS = ", ".join(ARROW_SCHEMA.names)


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


def generate(directory: Path, messages: int, files: int, seed: int = 9) -> Capture:
    """Write at least `messages` messages to about `files` capture files in `directory`."""
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
    return _write(directory, gen, files)


def _write(directory: Path, gen: _Generator, files: int) -> Capture:
    max_file_bytes = max(capture.MIN_FILE_BYTES, -(-gen.bytes // files) + 65536)
    clock = iter(range(1_700_000_000_000_000_000, 1_900_000_000_000_000_000, 20_000))
    rows = 0
    open_now = 0
    with capture.CaptureWriter(directory, max_file_bytes=max_file_bytes,
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


def decode_in_process(paths: list[str], batch_size: int) -> int:
    """Rows decoded by one process, the data source's way: batches of `batch_size` records."""
    rows = 0
    for path in paths:
        start = None
        while True:
            batch = capture.read_batch(path, start_offset=start, max_records=batch_size)
            if len(batch):
                rows += decode_batch(path, batch).num_rows
            if batch.stop != "limit":
                break
            start = batch.end
    return rows


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


def decode_in_spark(spark: Any, directory: Path, batch_size: int | None) -> int:
    """Rows Spark decoded: a count, and a sum of a hash of every column so none is pruned."""
    reader = spark.read.format("wirecapture")
    if batch_size is not None:
        reader = reader.option("batch_size", str(batch_size))
    frame = reader.load(str(directory))
    rows, _ = frame.selectExpr(f"hash({COLUMNS}) as h").selectExpr(
        "count(*)", "sum(cast(h as long))").first()
    return int(rows)


# --- CPU time -----------------------------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> float:
    """utime+stime of process `root` and its descendants (the JVM and its Python workers), with
    their reaped children's, from /proc."""
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
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += times.get(pid, 0.0)
        stack.extend(children.get(pid, ()))
    return total


def _jvm_pid(spark: Any) -> int:
    return spark.sparkContext._gateway.proc.pid


# --- The run -------------------------------------------------------------------------------------


@dataclass
class Report:
    capture: Capture | None = None
    seconds: dict[str, list[float]] = field(default_factory=dict)
    query_seconds: list[float] = field(default_factory=list)  # a Spark query over a tiny capture
    cpu: dict[str, list[float]] = field(default_factory=dict)  # CPU seconds of each timed run
    lines: list[str] = field(default_factory=list)

    def rate(self, name: str) -> float:
        return self.capture.rows / statistics.median(self.seconds[name])


def _timed(name: str, expected: int, read: Callable[[], int], runs: int,
           cpu_clock: Callable[[], float] = time.process_time,
           cpu: list[float] | None = None) -> list[float]:
    """Wall seconds of `runs` reads after a warm-up; their CPU seconds go to `cpu`."""
    seconds = []
    for run_number in range(runs + 1):  # the first is the warm-up
        cpu_start, start = cpu_clock(), time.perf_counter()
        rows = read()
        seconds.append(time.perf_counter() - start)
        if cpu is not None and run_number:
            cpu.append(cpu_clock() - cpu_start)
        if rows != expected:
            raise BenchError(f"{name}: {rows:,} rows read, {expected:,} written")
    return seconds[1:]


def run(options: argparse.Namespace, out: Callable[[str], None] = print) -> Report:
    report = Report()
    directory = Path(tempfile.mkdtemp(prefix="wireproto-bench-pipeline-"))
    try:
        started = time.perf_counter()
        cap = report.capture = generate(directory, options.records, options.files)
        out(f"capture: {cap.rows:,} rows ({cap.messages:,} messages) in {cap.records:,} records,"
            f" {cap.files} files, {cap.bytes / (1 << 20):.1f} MiB, written in"
            f" {time.perf_counter() - started:.1f} s")
        mix = sorted(cap.mix.items())
        out("mix (rows): " + ", ".join(f"{key} {count:,}" for key, count in mix))
        paths = [os.fspath(path.resolve()) for path in capture.capture_files(directory)]
        in_process_batch = options.batch_size or _source_batch_size()
        if options.profile:
            _profile(paths, in_process_batch, out)
            return report
        report.seconds["one process"] = _timed(
            "one process", cap.rows, lambda: decode_in_process(paths, in_process_batch),
            options.runs, cpu=report.cpu.setdefault("one process", []))
        spark, created = spark_session()
        try:
            jvm = _jvm_pid(spark)

            def spark_cpu() -> float:
                return tree_cpu_seconds(jvm) + time.process_time()

            report.seconds["spark local[2]"] = _timed(
                "spark local[2]", cap.rows,
                lambda: decode_in_spark(spark, directory, options.batch_size), options.runs,
                cpu_clock=spark_cpu, cpu=report.cpu.setdefault("spark local[2]", []))
            # The fixed cost of a query: planning, and the Python workers that plan the read.
            tiny = generate(directory / "tiny", TINY_MESSAGES, 1)
            report.query_seconds = _timed(
                "spark local[2], tiny capture", tiny.rows,
                lambda: decode_in_spark(spark, tiny.directory, options.batch_size), options.runs)
        finally:
            if created:
                spark.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    report.lines = table(report, options)
    for line in report.lines:
        out(line)
    return report


def _source_batch_size() -> int:
    from wireproto.pipeline.datasource import DEFAULT_BATCH_SIZE as size

    return size


def table(report: Report, options: argparse.Namespace) -> list[str]:
    lines = ["", f"{'reader':<16} {'rows/s':>12} {'median s':>10} {'CPU s':>8} {'CPU µs/row':>10}"
             f" {'runs':>5}"]
    for name, seconds in report.seconds.items():
        cpu = statistics.median(report.cpu[name])
        lines.append(f"{name:<16} {report.rate(name):>12,.0f} {statistics.median(seconds):>10.3f}"
                     f" {cpu:>8.2f} {cpu * 1e6 / report.capture.rows:>10.2f} {len(seconds):>5}")
    lines.append(f"{report.capture.rows:,} rows in every run; batch_size "
                 f"{options.batch_size or _source_batch_size()}; python {sys.version.split()[0]},"
                 f" {os.cpu_count()} cores")
    query = statistics.median(report.query_seconds)
    spark_seconds = statistics.median(report.seconds["spark local[2]"])
    net = report.capture.rows / (spark_seconds - query) if spark_seconds > query else math.inf
    lines.append(f"spark's fixed cost per query (one file of {TINY_MESSAGES:,} messages):"
                 f" {query:.3f} s; spark local[2] net of it: {net:,.0f} rows/s")
    lines.append("CPU: this process, and for Spark also the JVM and its Python workers"
                 " (/proc); on a busy machine the")
    lines.append("wall figures fall with the CPU share the readers get, the CPU figures hold")
    if options.quick:
        lines.append("--quick: a smoke run, too small for figures; run without it to compare")
    one, spark = report.rate("one process"), report.rate("spark local[2]")
    speedup = spark / one
    lines += [
        "", "goals:",
        f"  spark local[2]: {speedup:.2f}x one process (goal at least {SPEEDUP_GOAL}x)"
        f"  {'ok' if speedup >= SPEEDUP_GOAL else 'MISSED'}",
        f"  spark local[2]: {spark:,.0f} rows/s (goal at least {RATE_GOAL:,})"
        f"  {'ok' if spark >= RATE_GOAL else 'MISSED'}",
    ]
    return lines


def _profile(paths: list[str], batch_size: int, out: Callable[[str], None]) -> None:
    profiler = cProfile.Profile()
    profiler.runcall(decode_in_process, paths, batch_size)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    out(text.getvalue())


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
    parser.add_argument("--profile", action="store_true", help="cProfile the one-process decode"
                        " instead of timing")
    options = parser.parse_args(argv)
    if options.records is None:
        options.records = 20_000 if options.quick else 1_000_000
    if options.runs is None:
        options.runs = 1 if options.quick else 5
    for name in ("records", "files", "runs", "batch_size"):
        value = getattr(options, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    return options


def main(argv: list[str] | None = None) -> int:
    return harness.main("pipeline.py", run, parse_args(argv), reactor=False)


if __name__ == "__main__":
    raise SystemExit(main())
