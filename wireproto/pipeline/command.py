"""``wireproto analyze``: the command around the Spark jobs.

What the user sees is the command's own: its inputs checked before Spark starts (a file that is
not a capture, or a directory without captures, is one line and status 2, in well under a
second), a progress line while the jobs run, the summary when they are done, and one line when
they fail. The JVM's own output (log4j, its warnings, Spark's console progress bar) goes to a
log file, named in the error line when there is one. Ctrl-C or SIGTERM cancels the running
Spark jobs, stops Spark and exits 130 quietly. ``--out`` must be new or empty unless
``--overwrite``; a run that fails or is stopped leaves it as it was
(`wireproto.pipeline.outdir`).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO, Any, TypeVar

from wireproto.capture import CaptureError, IncompleteCapture, capture_files, read_header
from wireproto.output import write_output
from wireproto.pipeline import outdir
from wireproto.pipeline.outdir import is_remote
from wireproto.program import PROG

__all__ = ["register", "main", "run", "check_captures", "Progress", "INTERRUPTED",
           "spark_missing"]

INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C


def spark_missing() -> str:
    """What to install for `analyze`: the spark extra's requirements, as the installed package's
    metadata lists them (wireproto is not on a package index, so ``wireproto[spark]`` is not
    there to install), and the command for a source checkout."""
    import importlib.metadata
    import shlex

    try:
        requirements = importlib.metadata.requires("wireproto") or []
    except importlib.metadata.PackageNotFoundError:
        requirements = []
    spark = [requirement.partition(";")[0].strip() for requirement in requirements
             if requirement.partition(";")[2].replace("'", '"').strip() == 'extra == "spark"']
    checkout = "in wireproto's source directory, pip install -e '.[spark]'"
    if not spark:
        return f"install the spark extra: {checkout}"
    return (f"install the spark extra: pip install {' '.join(map(shlex.quote, spark))} "
            f"(or, {checkout})")


class UsageError(Exception):
    """Bad input, found before Spark starts: exit status 2."""


def check_captures(path: str, *, incomplete_ok: bool = False,
                   options: dict[str, str] | None = None) -> list[int]:
    """The sizes of the capture files at `path` (a file, or a directory of them, local or in
    storage), each with a readable header. UsageError, naming the file and the cause, for
    anything else."""
    if is_remote(path):
        return _check_remote(path, options or {}, incomplete_ok)
    return [file.stat().st_size for file in _check_local(path, incomplete_ok)]


def _check_remote(path: str, options: dict[str, str], incomplete_ok: bool) -> list[int]:
    from wireproto.capture.format import decode_file_header
    from wireproto.capture.storage import open_store

    try:
        store = open_store(path, options)
        files = store.capture_files()
        for name, _ in files:
            with store.filesystem.open_input_file(name) as file:
                try:
                    decode_file_header(file.read_at(min(file.size(), 1 << 20), 0))
                except CaptureError as error:
                    raise UsageError(f"{store.uri(name)}: {error}") from None
    except (OSError, ValueError) as error:
        raise UsageError(str(error).strip().splitlines()[0]) from None
    if not files and not incomplete_ok:
        raise UsageError(f"no capture files in {path!r} (files named wirecapture-*.wpcap)")
    return [size for _, size in files]


def _check_local(path: str, incomplete_ok: bool) -> list[Path]:
    target = Path(path)
    if target.is_file():
        files = [target]
    elif target.is_dir():
        files = capture_files(target, recursive=True)
    else:
        raise UsageError(f"no capture directory or file {path!r}")
    for file in files:
        try:
            read_header(file)
        except IncompleteCapture as error:
            if not incomplete_ok:
                raise UsageError(str(error)) from None
        except (CaptureError, OSError) as error:
            raise UsageError(str(error)) from None
    if not files and not incomplete_ok:
        raise UsageError(f"no capture files in {path!r} (files named wirecapture-*.wpcap)")
    return files


def check_table(location: str, options: dict[str, str] | None = None) -> list[int]:
    """The sizes of the data files of the table `wireproto ingest` wrote at `location`;
    UsageError when it is not one."""
    import pyarrow.fs as pafs

    from wireproto.capture.storage import open_store
    from wireproto.pipeline.table import readable_version

    try:
        readable_version(location, options)
        store = open_store(location, options)
        found = store.filesystem.get_file_info(pafs.FileSelector(store.root, recursive=True))
    except (OSError, ValueError) as error:
        raise UsageError(f"--table {str(error).strip().splitlines()[0]}") from None
    # Spark leaves out what starts with _ or . (the sink's log, the checkpoint).
    return [info.size for info in found if info.type == pafs.FileType.File
            and info.path.endswith(".parquet")
            and not any(part.startswith(("_", ".")) for part in
                        info.path[len(store.root):].split("/"))]


# -- Spark, quietly --------------------------------------------------------------------------------


def quiet_spark(master: str | None, log_path: Path, input_bytes: int | None = None) -> Any:
    """A SparkSession whose JVM writes its output to `log_path`, with no console progress bar;
    `input_bytes`, what it will read, sets how its JVM compiles (`spark.prepare_jvm`)."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    from wireproto.pipeline.spark import prepare_jvm, spark_session

    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    if SparkContext._gateway is None:
        prepare_jvm(input_bytes)
        log = open(log_path, "ab")  # noqa: SIM115 - the JVM keeps it for its lifetime
        SparkContext._ensure_initialized(
            gateway=launch_gateway(popen_kwargs={"stdout": log, "stderr": log}))
    spark = spark_session(master, extra={"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class Progress:
    """A line on `stream` while Spark works: tasks of the running stages done, and for the first
    job (decoding the capture files: a task a file, or a part of a large one) the bytes done,
    the rate and the time left. On a terminal the line is redrawn every `interval` seconds;
    otherwise a line is written every `quiet_interval` seconds."""

    def __init__(self, spark: Any, sizes: list[int], stream: IO[str], *,
                 interval: float = 0.5, quiet_interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic,
                 noun: str = "capture file", told: bool = False) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        # With `told` (the tasks run on this machine), a directory where the read tasks say
        # how many bytes they have read (the data source's progress option); otherwise the
        # bytes read are taken as the share of tasks done.
        self.reports = tempfile.mkdtemp(prefix="wireproto-analyze-progress-") if told else None
        self.files = len(sizes)
        self.noun = noun  # what the sizes are of
        self.total_bytes = sum(sizes)
        self.stream = stream
        self.tty = stream.isatty()
        self.interval = interval if self.tty else quiet_interval
        self.clock = clock
        self.started = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="analyze-progress", daemon=True)
        self._drawn = False

    def start(self) -> Progress:
        self._thread.start()
        return self

    def told(self, options: dict[str, str]) -> dict[str, str]:
        """The data source's `options`, with the progress option when the tasks can tell."""
        return options if self.reports is None else {**options, "progress": self.reports}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.reports is not None:
            shutil.rmtree(self.reports, ignore_errors=True)
        if self._drawn and self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def line(self, done: int, total: int, reading: bool = False,
             read_bytes: int | None = None) -> str:
        """The progress text for `done` of `total` tasks of the running stages; `reading`
        while they are the first job's, which decodes the capture files (a task a file, or a
        part of a large one), of which `read_bytes` are read (None: unknown, taken as the
        tasks' share)."""
        elapsed = max(self.clock() - self.started, 1e-9)
        if total and reading:
            if read_bytes is None or not self.total_bytes:
                share = done / total
            else:
                share = min(read_bytes, self.total_bytes) / self.total_bytes
            done_bytes = self.total_bytes * share
            rate = done_bytes / elapsed
            files = f"{self.files} {self.noun}{'s' if self.files != 1 else ''}"
            text = (f"analyze: reading {files}, {done}/{total} tasks, {_size(done_bytes)} of "
                    f"{_size(self.total_bytes)}, {_size(rate)}/s")
            if 0 < share < 1:
                text += f", about {_duration(elapsed * (1 - share) / share)} left"
            return text
        return f"analyze: writing tables and the report, {done}/{total} tasks, " \
               f"{_duration(elapsed)} so far"

    def _run(self) -> None:
        from wireproto.pipeline.datasource import bytes_read

        reading_stage: int | None = None
        while not self._stop.wait(self.interval):
            try:
                done = total = 0
                stages = sorted(self.tracker.getActiveStageIds())
                if stages and reading_stage is None:
                    reading_stage = stages[0]  # the first job's: decoding the files
                for stage in stages:
                    info = self.tracker.getStageInfo(stage)
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
            except Exception:  # the JVM is going away: nothing more to show
                return
            if not total:
                continue
            reading = stages == [reading_stage]
            read_bytes = bytes_read(self.reports) if reading and self.reports else None
            text = self.line(done, total, reading=reading, read_bytes=read_bytes or None)
            self.stream.write(f"\r\033[Kwireproto {text}" if self.tty else f"wireproto {text}\n")
            self.stream.flush()
            self._drawn = True


def _size(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min {seconds % 60:02d} s"


SPARK_STOP_TIMEOUT = 30.0  # seconds for the SparkSession to stop before the process ends anyway


class SparkStop:
    """Ctrl-C and SIGTERM while `wireproto analyze` has Spark, never raised into py4j (which
    would log and print tracebacks of the calls it interrupted). While the JVM and the session
    start, the process ends at once with INTERRUPTED: nothing is written yet, and the JVM,
    whose stdin is a pipe from this process, ends with it. Once Spark runs, `stopping` is set
    and `on_stop` called in a thread (never in the handler, which runs between the main
    thread's calls into the JVM). Once Spark stops, another one changes nothing."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.on_stop: Callable[[], None] | None = None
        self.spark_stopping = False

    def handle(self, number: int, frame: FrameType | None) -> None:
        if self.on_stop is None and not self.spark_stopping:
            _end_now(INTERRUPTED)
        if not self.stopping.is_set():
            self.stopping.set()
            if self.on_stop is not None and not self.spark_stopping:
                threading.Thread(target=self.on_stop, daemon=True).start()


@contextmanager
def spark_signals() -> Iterator[SparkStop]:
    """Ctrl-C and SIGTERM handled by a SparkStop while inside."""
    stop = SparkStop()
    previous = {number: signal.signal(number, stop.handle)
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


Started = TypeVar("Started")


def _started_elsewhere(start: Callable[[], Started]) -> Started:
    """`start()`'s result, called in another thread: there pyspark installs no SIGINT handler
    of its own (one that raises KeyboardInterrupt into whatever py4j call runs), and this
    thread stays free for the signals."""
    result: list[Started] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(start())
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            failure.append(error)

    starter = threading.Thread(target=run, name="analyze-spark-start", daemon=True)
    starter.start()
    starter.join()
    if failure:
        raise failure[0]
    return result[0]


def _end_now(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - ending anyway
            pass
    os._exit(status)


def stop_spark(spark: Any, status: int) -> int:
    """Stop `spark` within SPARK_STOP_TIMEOUT; if it takes longer, the process ends with
    `status` (the JVM with it). Quietly: what py4j would log of it is not the user's."""
    logging.getLogger("py4j").setLevel(logging.CRITICAL + 1)
    stopper = threading.Thread(target=_quietly, args=(spark.stop,), daemon=True)
    stopper.start()
    stopper.join(SPARK_STOP_TIMEOUT)
    if stopper.is_alive():
        _end_now(status)
    return status


class SparkHalt:
    """A batch run's `SparkStop.on_stop`: the running jobs are cancelled and the session
    stopped, so that no job starts after. Cancelling alone is not enough: a Ctrl-C that came
    while the driver planned a query, or between two jobs, cancelled nothing, and every job
    after it ran to the end (75 s from Ctrl-C to the exit, on a busy machine). `done` is set
    once Spark has stopped: its tasks write nothing more."""

    def __init__(self, cancel: Callable[[], object], stop: Callable[[], object]) -> None:
        self.cancel = cancel  # the SparkContext's cancelAllJobs
        self.stop = stop  # the SparkSession's stop
        self.done = threading.Event()

    def __call__(self) -> None:
        logging.getLogger("py4j").setLevel(logging.CRITICAL + 1)
        try:
            _quietly(self.cancel)
            _quietly(self.stop)
        finally:
            self.done.set()


def _quietly(call: Callable[[], object]) -> None:
    try:
        call()
    except Exception:  # noqa: BLE001, S110 - a JVM already gone: stopped all the same
        pass


def storage_options(pairs: list[str] | None) -> dict[str, str]:
    """``--storage-option KEY=VALUE`` pairs (wireproto.capture.storage's options)."""
    from wireproto.capture.storage import STORAGE_OPTIONS

    options: dict[str, str] = {}
    for pair in pairs or ():
        key, equals, value = pair.partition("=")
        if not equals or key not in STORAGE_OPTIONS:
            raise UsageError(f"--storage-option {pair!r}: use KEY=VALUE, KEY one of "
                             f"{', '.join(STORAGE_OPTIONS)}")
        options[key] = value
    return options


# -- the command -----------------------------------------------------------------------------------


def run(args: argparse.Namespace, announce: Callable[[list[str]], None],
        error: Callable[[str], None]) -> int:
    """``wireproto analyze``: 0 when done, 1 when Spark fails, 2 for bad usage, 130 when
    stopped. `announce` prints the summary lines, `error` one line on stderr."""
    import importlib.util

    try:
        if importlib.util.find_spec("pyspark") is None:
            raise UsageError(spark_missing())
        if not args.follow and (args.available_now or args.checkpoint):
            raise UsageError("--checkpoint and --available-now go with --follow")
        if (args.captures is None) == (args.table is None):
            raise UsageError("give CAPTURES (capture files) or --table TABLE, one of them")
        if args.table is not None and args.follow:
            raise UsageError("--follow reads capture files as they grow, not a --table")
        if args.follow and args.overwrite:
            raise UsageError("--overwrite goes with a batch run: --follow keeps its "
                             "checkpoint in --out")
        if not is_remote(args.out) and os.path.exists(args.out) and \
                not os.path.isdir(args.out):
            raise UsageError(f"--out {args.out!r} is not a directory")
        if args.follow and is_remote(args.out) and not args.checkpoint:
            raise UsageError("--follow with --out in storage needs a local --checkpoint")
        options = storage_options(args.storage_option)
        refused = None if args.follow else outdir.check_out(args.out, options,
                                                           overwrite=args.overwrite)
        if refused is not None:
            raise UsageError(refused)
        sizes = check_table(args.table, options) if args.table is not None else \
            check_captures(args.captures, incomplete_ok=args.follow, options=options)
        if args.follow:
            from wireproto.pipeline.follow import parse_hub

            try:
                parse_hub(args.hub)
            except ValueError as problem:
                raise UsageError(f"--hub: {problem}") from None
    except UsageError as problem:
        error(str(problem))
        return 2

    log_path = Path(tempfile.gettempdir()) / f"wireproto-analyze-{os.getpid()}.log"
    with spark_signals() as stop:
        # A batch run knows what it will read; --follow runs for as long as it is left to.
        spark = _started_elsewhere(lambda: quiet_spark(
            args.master, log_path, None if args.follow else sum(sizes)))
        status = INTERRUPTED
        try:
            if args.follow:
                stop.on_stop = lambda: None
                status = _follow(spark, args, announce, stop.stopping)
            else:
                halt = SparkHalt(spark.sparkContext.cancelAllJobs, spark.stop)
                stop.on_stop = halt
                status = _batch(spark, args, sizes, announce, error, log_path, stop.stopping,
                                halt.done)
        finally:
            stop.spark_stopping = True
            stop_spark(spark, status)
    return status


def _batch(spark: Any, args: argparse.Namespace, sizes: list[int],
           announce: Callable[[list[str]], None], error: Callable[[str], None],
           log_path: Path, stopping: threading.Event, halted: threading.Event) -> int:
    from wireproto.pipeline.analyze import analyze

    # Read tasks on this machine say how far they have read (the data source's `progress`);
    # a table's files are read by Spark itself.
    told = args.table is None and (spark.sparkContext.master or "").startswith("local")
    progress = Progress(spark, sizes, sys.stderr, told=told,
                        noun="capture file" if args.table is None else "table file").start()
    options = storage_options(args.storage_option)
    try:
        # Written into a staging directory, put in --out once done: a failed or stopped run
        # leaves it as it was (wireproto.pipeline.outdir).
        with outdir.staging(args.out) as staged, _until_spark_stops(stopping, halted):
            summary = analyze(spark, args.captures, staged, table=args.table,
                              options=progress.told(options))
            if stopping.is_set():
                raise KeyboardInterrupt
            summary = outdir.publish(summary, staged, args.out, options)
    except BaseException as failure:
        progress.stop()
        if stopping.is_set() or isinstance(failure, KeyboardInterrupt):
            return INTERRUPTED
        if not isinstance(failure, Exception):
            raise
        text = str(failure).strip()
        first = text.splitlines()[0] if text else ""
        error(f"{type(failure).__name__}: {first} (Spark's log: {log_path})")
        return 1
    progress.stop()
    announce(summary.lines())
    return 0


@contextmanager
def _until_spark_stops(stopping: threading.Event, halted: threading.Event) -> Iterator[None]:
    """A failure of the block while stopping (Spark's jobs cancelled under it) leaves it only
    once Spark has stopped: its tasks write no more in what the block wrote."""
    try:
        yield
    except BaseException:
        if stopping.is_set():
            halted.wait(SPARK_STOP_TIMEOUT)
        raise


def _follow(spark: Any, args: argparse.Namespace, announce: Callable[[list[str]], None],
            stopping: threading.Event) -> int:
    from wireproto.pipeline.follow import start_follow

    checkpoint = args.checkpoint or os.path.join(args.out, "checkpoint")
    query = start_follow(spark, args.captures, hub=args.hub, checkpoint=checkpoint,
                         available_now=args.available_now,
                         options=storage_options(args.storage_option))
    announce([f"following {args.captures}; publishing to {args.hub}; Ctrl-C stops"])
    while not stopping.is_set():
        if query.awaitTermination(0.5):
            return 0
    query.stop()
    return 0


# -- registration with the `wireproto` command, and spark-submit ----------------------------------


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``analyze`` to the ``wireproto`` parser (as the tools add theirs)."""
    parser = commands.add_parser(
        "analyze",
        help="analyze capture files on Spark",
        description="Read capture files, or a table wireproto ingest wrote (--table), with "
                    "Spark and write Parquet tables (messages, topic rates, RPC latency, "
                    "malformed clients, windowed readings) and a report (report.md and PNG "
                    "plots) under --out. Needs the spark extra and Java 17.",
    )
    add_arguments(parser)
    parser.set_defaults(run=run_command)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("captures", metavar="CAPTURES", nargs="?",
                        help="a capture directory or file (or --table)")
    parser.add_argument("--table", metavar="TABLE",
                        help="instead of CAPTURES: the table wireproto ingest wrote, read "
                             "without decoding anything again")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="where the tables, the report and the checkpoint go: new or "
                             "empty, but for --overwrite and --follow")
    parser.add_argument("--overwrite", action="store_true",
                        help="let --out hold something already: what analyze writes (its "
                             "tables, report.md and plots) replaces the same names, and "
                             "nothing else there is touched")
    parser.add_argument("--master", metavar="URL",
                        help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--follow", action="store_true",
                        help="run the streaming query and publish each finished window to the "
                             "hub, until Ctrl-C")
    parser.add_argument("--hub", default="tcp:127.0.0.1:8766", metavar="ENDPOINT",
                        help="with --follow: the broker's WEBSMQ length32 listener to "
                             "publish to: tcp:HOST:PORT, ssl:HOST:PORT[:hostname=NAME]"
                             "[:caCertsDir=DIR] or unix:PATH (default tcp:127.0.0.1:8766)")
    parser.add_argument("--checkpoint", metavar="DIR",
                        help="with --follow: the streaming checkpoint (default OUT/checkpoint)")
    parser.add_argument("--available-now", action="store_true",
                        help="with --follow: process what is there now, then stop")
    parser.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                        help="for CAPTURES, TABLE or --out in object storage: s3.endpoint, "
                             "s3.region, s3.access_key, s3.secret_key, s3.session_token, "
                             "s3.anonymous (repeat it)")


def run_command(args: argparse.Namespace) -> int:
    """Run `args` (parsed by `register`'s parser), writing to stdout and stderr."""
    def announce(lines: list[str]) -> None:
        write_output("".join(f"{PROG}: {line}\n" for line in lines))

    def error(message: str) -> None:
        print(f"{PROG} analyze: {message}", file=sys.stderr, flush=True)

    return run(args, announce, error)


def main(argv: list[str] | None = None) -> int:
    """``command.py CAPTURES --out DIR ...`` under spark-submit: ``wireproto analyze``."""
    parser = argparse.ArgumentParser(prog=f"{PROG} analyze")
    add_arguments(parser)
    return run_command(parser.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
