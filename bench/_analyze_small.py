"""`bench/pipeline.py --small`: `wireproto analyze` of a small capture, timed from the command's
start to its exit, and where that time goes.

The capture is the benchmark's own traffic (bench/pipeline.py's `generate`), one file of at most
SMALL_ROWS rows. Each timed run starts `python -m wireproto analyze CAPTURE --out DIR` as a user
would (Spark's default master, which is local[*]) and waits for it to exit; its CPU is the
process tree's (the command, the JVM, Spark's Python workers), sampled from /proc. One more run
writes Spark's event log (a spark-defaults.conf in a SPARK_CONF_DIR of its own) to tell where
the time went: starting Python and the JVM, each SQL query Spark ran (its jobs, and the time
before it, on the driver: planning, and the Python workers that look up, create and plan the
data source), and the end (the report, stopping Spark). Goal: at most SMALL_GOAL_SECONDS.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _harness import BenchError, process_table

SMALL_ROWS = 10_000  # the capture's rows, at most
SMALL_MESSAGES = 8_000  # asked of the generator: with its last batches, opens and closes, 9,520
SMALL_GOAL_SECONDS = 30.0


@dataclass
class Process:
    """One process of the command's tree, as /proc showed it."""

    kind: str  # "command", "jvm", or a Python worker's module
    first_seen: float  # seconds after the command started
    cpu: float = 0.0  # the last utime+stime seen, with its reaped children's


@dataclass
class Run:
    seconds: float
    started: float  # time.time() when the command started
    processes: dict[int, Process] = field(default_factory=dict)

    @property
    def cpu(self) -> float:
        return sum(process.cpu for process in self.processes.values())

    def cpu_of(self, kind: Callable[[str], bool]) -> float:
        return sum(process.cpu for process in self.processes.values() if kind(process.kind))


def _kind(pid: int) -> str:
    """What a process of the tree is: "jvm", a Python worker's module, or "other" (the shell
    scripts that launch the JVM or a Python, and the like)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            words = [word.decode(errors="replace") for word in file.read().split(b"\0") if word]
    except OSError:
        return "other"
    if words and words[0].endswith("java"):
        return "jvm"
    if "pyspark.daemon" in words:  # the daemon and the workers it forks name their module
        return words[-1] if words[-1] != "pyspark.daemon" else "pyspark.worker"
    return "other"


def _tree(root: int) -> dict[int, float]:
    """utime+stime (with reaped children's) of `root` and its descendants."""
    children, times = process_table()
    found, stack = {}, [root]
    while stack:
        pid = stack.pop()
        if pid in times:
            found[pid] = times[pid]
        stack.extend(children.get(pid, ()))
    return found


def run_command(captures: Path, out: Path, env: dict[str, str], timeout: float = 600
                ) -> Run:
    """`wireproto analyze CAPTURES --out OUT`, from its start to its exit; its process tree
    sampled every 0.1 s."""
    shutil.rmtree(out, ignore_errors=True)
    started_at, started = time.time(), time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "wireproto", "analyze", str(captures),
                              "--out", str(out)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    processes: dict[int, Process] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = time.perf_counter() - started
            for pid, cpu in _tree(child.pid).items():
                seen = processes.get(pid)
                if seen is None:
                    seen = processes[pid] = Process("other", now)
                if seen.kind == "other":  # spark-class, a shell script, becomes the JVM
                    seen.kind = "command" if pid == child.pid else _kind(pid)
                seen.cpu = max(seen.cpu, cpu)
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        raise BenchError(f"wireproto analyze ran past {timeout:.0f} s") from None
    finally:
        done.set()
        sampler.join()
    seconds = time.perf_counter() - started
    if child.returncode != 0:
        raise BenchError(f"wireproto analyze exited {child.returncode}: {stderr.strip()[-500:]}")
    if "rows over" not in stdout:
        raise BenchError(f"wireproto analyze printed no summary: {stdout[-500:]}")
    return Run(seconds, started_at, processes)


def _event_log_env(env: dict[str, str], directory: Path) -> dict[str, str]:
    """`env` with a SPARK_CONF_DIR whose spark-defaults.conf writes an event log (plain JSON
    lines) to `directory`/events."""
    conf, events = directory / "conf", directory / "events"
    conf.mkdir()
    events.mkdir()
    (conf / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir {events.as_uri()}\n"
        "spark.eventLog.compress false\nspark.eventLog.rolling.enabled false\n")
    return {**env, "SPARK_CONF_DIR": str(conf)}


def read_event_log(events: Path) -> dict[str, Any]:
    """From Spark's event log: when the application started (ms since the epoch), and each SQL
    query (start, end, description) with the wall time of its jobs."""
    (path,) = [path for path in events.iterdir() if path.is_file()]
    application = 0
    queries: dict[int, dict[str, Any]] = {}
    jobs: dict[int, list[Any]] = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        name = event["Event"]
        if name == "SparkListenerApplicationStart":
            application = event["Timestamp"]
        elif name.endswith("SQLExecutionStart"):
            queries[event["executionId"]] = {"start": event["time"], "end": None,
                                             "what": event["description"], "jobs": 0,
                                             "job_ms": 0}
        elif name.endswith("SQLExecutionEnd"):
            queries[event["executionId"]]["end"] = event["time"]
        elif name == "SparkListenerJobStart":
            query = event.get("Properties", {}).get("spark.sql.execution.id")
            jobs[event["Job ID"]] = [event["Submission Time"], query]
        elif name == "SparkListenerJobEnd":
            submitted, query = jobs[event["Job ID"]]
            if query is not None and int(query) in queries:
                queries[int(query)]["jobs"] += 1
                queries[int(query)]["job_ms"] += event["Completion Time"] - submitted
    return {"application": application,
            "queries": [queries[number] for number in sorted(queries)]}


def _what(description: str) -> str:
    """A query's description, short: `parquet` for a write, the analyze.py line of a collect."""
    head = description.split(" at ", 1)
    where = head[1].rsplit("/", 1)[-1] if len(head) > 1 else ""
    return f"{head[0]} {where}".strip() if "analyze.py" in where else head[0]


def breakdown(run: Run, log: dict[str, Any]) -> list[str]:
    """Where one run's time went, from its event log and its processes."""
    started_ms = run.started * 1000
    jvm = min((p.first_seen for p in run.processes.values() if p.kind == "jvm"), default=0.0)
    application = (log["application"] - started_ms) / 1000
    queries = log["queries"]
    lines = [f"  {'':>6}  {'s':>6}  {'':<44}", f"  {0:6.2f}  {jvm:6.2f}  Python starts, imports "
             "wireproto, checks the capture, launches the JVM",
             f"  {jvm:6.2f}  {application - jvm:6.2f}  the JVM starts, up to the SparkContext"]
    before = application
    for number, query in enumerate(queries):
        start, end = (query["start"] - started_ms) / 1000, (query["end"] - started_ms) / 1000
        if start - before >= 0.05:
            lines.append(f"  {before:6.2f}  {start - before:6.2f}  on the driver before query "
                         f"{number}" + (" (the data source looked up, created, its read "
                                        "planned)" if number == 0 else ""))
        lines.append(f"  {start:6.2f}  {end - start:6.2f}  query {number}: {_what(query['what'])}"
                     f", {query['jobs']} job{'s' if query['jobs'] != 1 else ''} "
                     f"{query['job_ms'] / 1000:.2f} s")
        before = end
    lines.append(f"  {before:6.2f}  {run.seconds - before:6.2f}  the report, Spark stopped, "
                 "the command exits")
    lines.append(f"  {run.seconds:6.2f}          exit; CPU {run.cpu:.1f} s: the command "
                 f"{run.cpu_of(lambda kind: kind == 'command'):.1f}, the JVM "
                 f"{run.cpu_of(lambda kind: kind == 'jvm'):.1f}, Python workers "
                 f"{run.cpu_of(lambda kind: kind not in ('command', 'jvm', 'other')):.1f}, "
                 f"other {run.cpu_of(lambda kind: kind == 'other'):.1f}")
    workers: dict[str, list[Process]] = {}
    for process in run.processes.values():
        if process.kind not in ("command", "jvm", "other"):
            workers.setdefault(process.kind, []).append(process)
    for kind, group in sorted(workers.items(), key=lambda item: item[1][0].first_seen):
        lines.append(f"    Python {kind}: {len(group)} process{'es' if len(group) > 1 else ''},"
                     f" first at {group[0].first_seen:.1f} s, CPU "
                     f"{sum(p.cpu for p in group):.1f} s")
    return lines


def run(options: Any, generate: Callable[..., Any], out: Callable[[str], None]) -> list[str]:
    """Time `options.runs` runs of `wireproto analyze` on a small capture (after a warm-up
    run), then one with Spark's event log; the report's lines."""
    directory = Path(tempfile.mkdtemp(prefix="wireproto-bench-small-"))
    try:
        cap = generate(directory / "capture", SMALL_MESSAGES, 1)
        if cap.rows > SMALL_ROWS:
            raise BenchError(f"the small capture has {cap.rows:,} rows, more than "
                             f"{SMALL_ROWS:,}")
        out(f"small capture: {cap.rows:,} rows ({cap.messages:,} messages) in {cap.records:,} "
            f"records, 1 file, {cap.bytes / 1000:.1f} kB")
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
        runs = []
        for number in range(options.runs + 1):  # the first warms the disk cache
            result = run_command(cap.directory, directory / "out", env)
            if number:
                runs.append(result)
            out(f"  run {number}{' (warm-up)' if not number else ''}: {result.seconds:.1f} s, "
                f"CPU {result.cpu:.1f} s")
        logged_env = _event_log_env(env, directory)
        logged = run_command(cap.directory, directory / "out", logged_env)
        log = read_event_log(directory / "events")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    seconds = statistics.median(run.seconds for run in runs)
    cpu = statistics.median(run.cpu for run in runs)
    load = os.getloadavg()[0]
    lines = ["", f"wireproto analyze of {cap.rows:,} rows, from the command's start to its exit:"
             f" median {seconds:.1f} s of {len(runs)} (from {min(r.seconds for r in runs):.1f}"
             f" to {max(r.seconds for r in runs):.1f}), CPU {cpu:.1f} s; load average "
             f"{load:.1f} on {os.cpu_count()} cores",
             f"goal: at most {SMALL_GOAL_SECONDS:.0f} s  "
             f"{'ok' if seconds <= SMALL_GOAL_SECONDS else 'MISSED'}",
             f"where the time goes (one more run, with Spark's event log: {logged.seconds:.1f} s)"
             ":"]
    lines += breakdown(logged, log)
    for line in lines:
        out(line)
    return lines
