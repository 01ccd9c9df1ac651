"""``wireproto ingest CAPTURES --table TABLE``: the command around `start_ingest`.

As `wireproto analyze` does: its inputs checked before Spark starts (status 2, one line), the
JVM's output in a log file, a progress line on stderr, a summary on stdout, one line when Spark
fails (status 1). With ``--once`` it reads what is there and stops; Ctrl-C or SIGTERM stops it
with 130, and the batch it cut short runs again at the next start. Without ``--once`` it
follows the captures until Ctrl-C or SIGTERM, its normal end: 0.

The table's lock (`ingest.lock_table`) is taken before Spark starts and handed to the JVM as
well, so that a second ingest of the table is refused at once, and one whose process was killed
holds the table until its JVM is gone too.

A table in object storage is written through a local staging copy (`tablestore.TableMirror`),
uploaded after each micro-batch: an upload that fails is a warning, and the next batch's upload
sends what it left; one that fails at the end is an error (status 1).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from wireproto.output import write_output
from wireproto.pipeline.command import (
    INTERRUPTED,
    UsageError,
    _duration,
    _size,
    _started_elsewhere,
    check_captures,
    quiet_spark,
    spark_missing,
    spark_signals,
    stop_spark,
    storage_options,
)
from wireproto.program import PROG

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from wireproto.pipeline.tablestore import TableMirror

__all__ = ["register", "run", "main", "IngestProgress", "failure_line"]


class IngestProgress:
    """A line on `stream` while the query runs: the rows and micro-batches done so far, and
    the running batch's tasks. With `once`, also the bytes of the captures left to read when it
    started, done, the rate and the time left. On a terminal the line is redrawn every
    `interval` seconds, otherwise a line is written every `quiet_interval` seconds."""

    def __init__(self, spark: SparkSession, query: StreamingQuery, stream: IO[str], *,
                 pending_bytes: int,
                 once: bool, interval: float = 0.5, quiet_interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.query = query
        self.stream = stream
        self.pending_bytes = pending_bytes
        self.once = once
        self.tty = stream.isatty()
        self.interval = interval if self.tty else quiet_interval
        self.clock = clock
        self.started = clock()
        self.batches: dict[int, int] = {}  # batch id -> rows read, of batches with rows
        self.read_bytes = 0  # by those batches
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest-progress", daemon=True)
        self._drawn = False

    @property
    def rows(self) -> int:
        return sum(self.batches.values())

    def start(self) -> IngestProgress:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        try:
            self.update()
        except Exception:  # noqa: BLE001, S110 - the JVM is gone: what was seen stands
            pass
        if self._drawn and self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def update(self) -> None:
        """Take in the query's finished micro-batches."""
        for progress in self.query.recentProgress:
            if progress.numInputRows and progress.batchId not in self.batches:
                self.batches[progress.batchId] = progress.numInputRows
                self.read_bytes += sum(_bytes_between(source.startOffset, source.endOffset)
                                       for source in progress.sources)

    def line(self, done: int, total: int, read_share: float = 0.0) -> str:
        """The progress text, with `done` of `total` tasks of the running batch's stages, and
        `read_share` of its reading stage done (0 to 1)."""
        elapsed = max(self.clock() - self.started, 1e-9)
        batches = len(self.batches)
        text = (f"ingest: {self.rows:,} rows in {batches} batch{'es' if batches != 1 else ''}"
                f", {_duration(elapsed)} so far")
        if total:
            text += f"; a batch at {done}/{total} tasks"
        if self.once and self.pending_bytes:
            left = max(self.pending_bytes - self.read_bytes, 0)
            read = min(self.read_bytes + left * read_share, self.pending_bytes)
            rate = read / elapsed
            text += f", {_size(read)} of {_size(self.pending_bytes)} read, {_size(rate)}/s"
            if rate > 0 and read < self.pending_bytes:
                text += f", about {_duration((self.pending_bytes - read) / rate)} left"
        return text

    def _run(self) -> None:
        reading: int | None = None  # the running batch's first stage: reading the captures
        finished = -1
        while not self._stop.wait(self.interval):
            try:
                self.update()
                last = self.query.lastProgress
                if last is not None and last.batchId != finished:
                    finished, reading = last.batchId, None
                stages = sorted(self.tracker.getActiveStageIds())
                if stages and reading is None:
                    reading = stages[0]
                done = total = 0
                for stage in stages:
                    info = self.tracker.getStageInfo(stage)
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
                read_share = 0.0
                if reading is not None:
                    info = self.tracker.getStageInfo(reading)
                    if stages and stages[-1] > reading:
                        read_share = 1.0  # on to writing the files
                    elif info is not None and info.numTasks:
                        read_share = info.numCompletedTasks / info.numTasks
            except Exception:  # the JVM is going away: nothing more to show
                return
            text = self.line(done, total, read_share)
            self.stream.write(f"\r\033[Kwireproto {text}" if self.tty else f"wireproto {text}\n")
            self.stream.flush()
            self._drawn = True


def _bytes_between(start: object, end: object) -> int:
    """Capture bytes a micro-batch read: its end offsets past its start, each as a progress
    report gives them (JSON text of {file: offset}, or null)."""
    def offsets(text: object) -> dict[str, int]:
        try:
            value = json.loads(text) if isinstance(text, str) else text
        except ValueError:
            return {}
        return {str(path): offset for path, offset in value.items()
                if isinstance(offset, int)} if isinstance(value, dict) else {}

    begun = offsets(start)
    return sum(max(offset - begun.get(path, 0), 0) for path, offset in offsets(end).items())


def committed_offsets(checkpoint: str) -> dict[str, int]:
    """What the ingest's local `checkpoint` says it has read of each capture file (offsets of
    the last committed batch), or nothing when it has no committed batch."""
    def batches(name: str) -> list[int]:
        try:
            return sorted(int(entry) for entry in os.listdir(os.path.join(checkpoint, name))
                          if entry.isdigit())
        except OSError:
            return []

    committed = batches("commits")
    if not committed:
        return {}
    try:
        with open(os.path.join(checkpoint, "offsets", str(committed[-1])),
                  encoding="utf-8") as file:
            offsets = json.loads(file.read().splitlines()[2])
    except (OSError, ValueError, IndexError):
        return {}
    return {str(path): int(offset) for path, offset in offsets.items()} \
        if isinstance(offsets, dict) else {}


# The last line of a Python traceback: the exception and its message, named as Python names
# its kinds (`ValueError: ...`) or by its module, whatever its name (`wireproto.capture.format.
# CorruptCapture: ...`).
_RAISED = re.compile(r"^(?:(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)"
                     r"|(?:[A-Za-z_][\w]*\.)+[A-Z]\w*): \S")


def failure_line(failure: BaseException) -> str:
    """A failed query's cause, in one line: the last exception of a Python worker's traceback
    in it, else the first line of its message and of its root cause's, without Spark's
    wrapping."""
    causes: list[BaseException] = []
    cause = getattr(failure, "_cause", None)  # pyspark's captured Java causes
    while isinstance(cause, BaseException) and len(causes) < 20:
        causes.append(cause)
        cause = getattr(cause, "_cause", None)
    for text in (str(failure), *map(str, causes)):
        # The first exception of a chain: what went wrong, not what failed while handling it
        # (pyspark's streaming source runner adds an UnboundLocalError of its own).
        text = text.split("During handling of the above exception", 1)[0]
        raised = [line.strip() for line in text.splitlines() if _RAISED.match(line.strip())]
        if "Traceback (most recent call last)" in text and raised:
            return _plain(raised[-1])
    line = _plain(str(failure)) or type(failure).__name__
    if causes:
        root = _plain(str(causes[-1])).split("Exception: ", 1)
        root_line = f"{root[0].rsplit('.', 1)[-1]}Exception: {root[1]}" if len(root) == 2 \
            else root[0]
        if root_line and root_line not in line:
            line = f"{line.rstrip('.')}: {root_line}"
    return line


def _plain(text: str) -> str:
    """The first line of an error's text, without Spark's query prefix and SQLSTATE."""
    text = text.strip()
    marker = "terminated with exception: "
    if marker in text:
        text = text.split(marker, 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return re.sub(r"(\s*SQLSTATE: \w+)+\s*$", "", lines[0]) if lines else ""


# -- the command -----------------------------------------------------------------------------------


def default_staging(table: str) -> str:
    """The staging copy of the table `table` in object storage unless told: one directory per
    table under ``$XDG_CACHE_HOME/wireproto/staging/`` (``~/.cache``), in directories only
    this user reaches. (A name of its own in the shared temporary directory would let another
    local user make it first, and read or change what ingest writes there.)"""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = os.path.join(base, "wireproto")
    for directory in (base, root, os.path.join(root, "staging")):
        os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(root, 0o700)
    digest = hashlib.sha256(table.rstrip("/").encode()).hexdigest()[:16]
    return os.path.join(root, "staging", digest)


def _checked(args: argparse.Namespace
             ) -> tuple[dict[str, str], list[int], str, TableMirror | None, int]:
    """The storage options, the capture sizes, the table directory Spark writes, the mirror of
    a remote table (or None) and the table's lock (a file descriptor; -1 for hdfs://), all
    checked and taken before Spark starts."""
    import importlib.util

    if importlib.util.find_spec("pyspark") is None:
        raise UsageError(spark_missing())
    # Only now: they need the spark extra's pyarrow.
    from wireproto.pipeline.ingest import TableBusy, lock_table, prepare_table
    from wireproto.pipeline.table import check_remote_table, is_spark_path
    from wireproto.pipeline.tablestore import TableMirror, duration_seconds

    if args.once and args.trigger is not None:
        raise UsageError("--trigger goes without --once")
    if args.trigger is not None and not args.trigger > 0:
        raise UsageError(f"--trigger {args.trigger:g}: give a number of seconds above 0")
    if args.retention is not None:
        try:
            duration_seconds(args.retention)
        except ValueError as problem:
            raise UsageError(f"--retention: {problem}") from None
    options = storage_options(args.storage_option)
    sizes = check_captures(args.captures, incomplete_ok=True, options=options)
    if args.checkpoint and not is_spark_path(args.checkpoint):
        raise UsageError(f"--checkpoint {args.checkpoint!r}: give a local or hdfs:// path")
    if is_spark_path(args.table):
        if args.staging:
            raise UsageError("--staging goes with a TABLE in object storage (s3://, gs://)")
        if args.table.startswith("hdfs://"):
            return options, sizes, args.table, None, -1  # prepared once Spark runs
        mirror, table_dir, lock_file = None, args.table, None
    else:
        if args.checkpoint:
            raise UsageError("--checkpoint goes with a local or hdfs:// TABLE (a table in "
                             "object storage keeps its checkpoint with it)")
        table_dir = (args.staging or default_staging(args.table)).rstrip("/")
        lock_file = f"{table_dir}.lock"  # beside the staging copy, which restore fills
        # tablestore: the local copy Spark writes, restored from the remote table before the
        # query starts and synced to it after each micro-batch and at the end.
        mirror = TableMirror(table_dir, args.table, options)
    try:
        if mirror is not None:
            check_remote_table(args.table, options)
            os.makedirs(os.path.dirname(os.path.abspath(table_dir)), exist_ok=True)
        else:
            prepare_table(table_dir)
        fd = lock_table(table_dir, lock_file=lock_file)
        if mirror is not None:
            mirror.restore()
            prepare_table(table_dir)
    except TableBusy as busy:
        raise UsageError(str(busy)) from None
    except (ValueError, OSError) as problem:
        raise UsageError(str(problem).strip().splitlines()[0]) from None
    return options, sizes, table_dir, mirror, fd


def _spark_holding(fd: int, master: str | None, log_path: Path) -> SparkSession:
    """`quiet_spark`, its JVM given the table's lock `fd` too: the lock lasts until it ends."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    if fd >= 0 and SparkContext._gateway is None:
        log = open(log_path, "ab")  # noqa: SIM115 - the JVM keeps it for its lifetime
        SparkContext._ensure_initialized(gateway=launch_gateway(
            popen_kwargs={"stdout": log, "stderr": log, "pass_fds": (fd,)}))
    spark: SparkSession = quiet_spark(master, log_path)
    # A JVM that dies is said in one line, not in a traceback of pyspark's accumulator server.
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda request, address: None
    return spark


def run(args: argparse.Namespace, announce: Callable[[list[str]], None],
        error: Callable[[str], None]) -> int:
    """``wireproto ingest``: 0 when done (or, following, stopped), 1 when Spark fails, 2 for
    bad usage, 130 when ``--once`` is stopped."""
    try:
        options, sizes, table_dir, mirror, fd = _checked(args)
    except UsageError as problem:
        error(str(problem))
        return 2

    log_path = Path(tempfile.gettempdir()) / f"wireproto-ingest-{os.getpid()}.log"
    with spark_signals() as stop:
        spark = _started_elsewhere(lambda: _spark_holding(fd, args.master, log_path))
        status = INTERRUPTED
        try:
            stop.on_stop = lambda: None  # the loop below stops the query
            status = _ingest(spark, args, table_dir, options, sum(sizes), mirror, announce,
                             error, log_path, stop.stopping)
        finally:
            stop.spark_stopping = True
            stop_spark(spark, status)
    return status


def _ingest(spark: SparkSession, args: argparse.Namespace, table_dir: str, options: dict[str, str],
            total_bytes: int, mirror: TableMirror | None, announce: Callable[[list[str]], None],
            error: Callable[[str], None], log_path: Path, stopping: threading.Event) -> int:
    from wireproto.pipeline.ingest import DEFAULT_TRIGGER_SECONDS, start_ingest
    from wireproto.pipeline.table import CHECKPOINT

    checkpoint = args.checkpoint or f"{table_dir.rstrip('/')}/{CHECKPOINT}"
    pending = total_bytes
    if "://" not in checkpoint:
        pending -= sum(committed_offsets(checkpoint).values())
    trigger = args.trigger or DEFAULT_TRIGGER_SECONDS
    try:
        query = start_ingest(spark, args.captures, table_dir, checkpoint=checkpoint,
                             once=args.once, trigger_seconds=trigger, options=options,
                             retention=args.retention)
    except Exception as failure:  # noqa: BLE001 - one line, whatever it is
        error(f"{failure_line(failure)} (Spark's log: {log_path})")
        return 1
    if not args.once:
        announce([f"ingesting {args.captures} into {args.table} every {trigger:g} s; "
                  "Ctrl-C stops"])
    progress = IngestProgress(spark, query, sys.stderr, pending_bytes=max(pending, 0),
                              once=args.once).start()
    after_batch = _after_batch(args, table_dir, mirror, options)

    def warn(problem: OSError) -> None:
        error(f"warning: {_upkeep(args, mirror)}: {_os_line(problem)}; tried again after the "
              "next micro-batch")

    try:
        failed = _until_ended(query, after_batch, stopping, warn)
    except Exception as gone:  # noqa: BLE001 - the JVM went away
        failed = gone
    finally:
        progress.stop()
    if after_batch is not None:
        try:
            after_batch()  # once the query has ended
        except OSError as problem:
            where = f"; the next ingest from {table_dir} does it" if mirror is not None else ""
            error(f"{_upkeep(args, mirror)}: {_os_line(problem)}{where}")
            return 1
    if stopping.is_set():
        return INTERRUPTED if args.once else 0
    if failed is not None:
        line = failure_line(failed)
        if isinstance(failed, OSError) or type(failed).__module__.startswith("py4j"):
            line = f"Spark's JVM is gone ({line})"
        error(f"{line} (Spark's log: {log_path})")
        return 1
    batches = len(progress.batches)
    announce([f"ingested {progress.rows:,} rows in {batches} batch"
              f"{'es' if batches != 1 else ''} into {args.table}"])
    return 0


def _after_batch(args: argparse.Namespace, table_dir: str, mirror: TableMirror | None,
                 options: dict[str, str]) -> Callable[[], None] | None:
    """What follows each finished micro-batch and the query's end, or None: a table in object
    storage is synced (tablestore.TableMirror), and with ``--retention`` the files out of the
    table's log for the grace period are deleted (never on hdfs://, which pyarrow does not
    reach here)."""
    from wireproto.pipeline.ingest import TIDY_GRACE_SECONDS, is_local
    from wireproto.pipeline.tablestore import remove_expired

    tidy = args.retention is not None and (mirror is not None or is_local(table_dir))
    if mirror is None and not tidy:
        return None

    def upkeep() -> None:
        if mirror is not None:
            mirror.sync()
        if tidy:
            remove_expired(args.table if mirror is not None else table_dir.removeprefix("file://"),
                           grace_seconds=TIDY_GRACE_SECONDS, options=options)

    return upkeep


def _upkeep(args: argparse.Namespace, mirror: TableMirror | None) -> str:
    return f"could not upload to {args.table}" if mirror is not None \
        else f"could not tidy {args.table}"


def _os_line(problem: OSError) -> str:
    """An I/O error in one line (pyarrow's name the operation, the key and the cause)."""
    lines = str(problem).strip().splitlines()
    return lines[0] if lines else type(problem).__name__


def _until_ended(query: StreamingQuery, after_batch: Callable[[], None] | None,
                 stopping: threading.Event, warn: Callable[[OSError], None]
                 ) -> BaseException | None:
    """Wait for `query` to end, or stop it once `stopping` is set, calling `after_batch` after
    each finished micro-batch; an OSError from it is a warning, and the next batch tries again
    (a sync and a tidy are idempotent). The query's failure, or None."""
    done = -1
    while not stopping.is_set():
        try:
            if query.awaitTermination(1):
                break
        except Exception:  # noqa: BLE001, S110 - it failed: query.exception() says how
            break
        last = query.lastProgress
        if after_batch is not None and last is not None and last.batchId != done:
            done = last.batchId
            try:
                after_batch()
            except OSError as problem:
                warn(problem)
    if stopping.is_set():
        query.stop()
    return query.exception()


# -- registration with the `wireproto` command, and spark-submit ----------------------------------


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``ingest`` to the ``wireproto`` parser."""
    parser = commands.add_parser(
        "ingest",
        help="ingest capture files into a Parquet table on Spark",
        description="Decode capture files once, with Spark, into a Parquet table partitioned "
                    "by date, broker and protocol (docs/pipeline.md), each message exactly "
                    "once: a rerun reads only what is new. Follows the captures until Ctrl-C, "
                    "or with --once reads what is there and stops. Needs the spark extra and "
                    "Java 17.",
    )
    add_arguments(parser)
    parser.set_defaults(run=run_command)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("captures", metavar="CAPTURES", help="a capture directory or file")
    parser.add_argument("--table", required=True, metavar="TABLE",
                        help="the table: a local path, hdfs://, s3:// or gs://")
    parser.add_argument("--once", action="store_true",
                        help="read what is there now, then stop")
    parser.add_argument("--trigger", type=float, metavar="SECONDS",
                        help="without --once: seconds between micro-batches (default 60); "
                             "each writes a file per table partition it touches")
    parser.add_argument("--checkpoint", metavar="DIR",
                        help="the streaming checkpoint (default TABLE/_checkpoint); it goes "
                             "with the table")
    parser.add_argument("--master", metavar="URL",
                        help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--staging", metavar="DIR",
                        help="for a TABLE in object storage: the local copy Spark writes "
                             "(default: one under ~/.cache/wireproto/staging, named for TABLE)")
    parser.add_argument("--retention", metavar="DURATION",
                        help="drop rows ingested longer ago than this (30d, 12h, 90m): the "
                             "sink's log leaves their files out, and they are deleted an hour "
                             "later")
    parser.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                        help="for CAPTURES or TABLE in object storage: s3.endpoint, s3.region, "
                             "s3.access_key, s3.secret_key, s3.session_token, s3.anonymous "
                             "(repeat it)")


def run_command(args: argparse.Namespace) -> int:
    """Run `args` (parsed by `register`'s parser), writing to stdout and stderr."""
    def announce(lines: list[str]) -> None:
        write_output("".join(f"{PROG}: {line}\n" for line in lines))

    def error(message: str) -> None:
        print(f"{PROG} ingest: {message}", file=sys.stderr, flush=True)

    return run(args, announce, error)


def main(argv: list[str] | None = None) -> int:
    """``ingest_command.py CAPTURES --table TABLE ...`` under spark-submit."""
    parser = argparse.ArgumentParser(prog=f"{PROG} ingest")
    add_arguments(parser)
    return run_command(parser.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
