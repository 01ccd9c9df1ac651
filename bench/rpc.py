"""RPC benchmark: the UBRE request-to-reply round trip over TCP beside a bare echo, in one run.

One request in flight at a time, so each figure is a latency. Each row is a client in this
process and a server in a process of its own (bench/_rpc_servers.py), on 127.0.0.1:

    bare echo                     Int32StringReceiver echo server and client: the floor
    ubre binary (raw client)      wireproto's UBRE server, binary R requests over length32 to
                                  its default handler (an echo); the client writes pre-encoded
                                  frames and compares the s replies byte for byte, as the echo
                                  client does, so the client costs the same as the floor's
    ubre binary (UbreClient)      the same server, asked through wireproto's UbreClient
    ubre json lines (UbreClient)  UbreClient in JSON over lines, to the handler named "echo"

The bare echo gets the very bytes of the binary requests, so both of the first two rows move the
same bytes each way; the JSON row carries the same body as text.

    .venv/bin/python bench/rpc.py [--requests N] [--warmup N] [--payload-size BYTES]
    .venv/bin/python bench/rpc.py --rows "bare echo,ubre binary (raw client)" --profile DIR

Every row first sends --warmup requests that are not timed, then the rows are timed in turns
(A B C D, B C D A, ...) over --rounds rounds, so a noisy spell hits every row alike; each row's
figures are over all its timed round trips. "server CPU" is the server process's utime+stime
from /proc per round trip. The goals (docs/performance.md) are on p50s against the bare echo's:
the raw-client UBRE row (the server role) at most 1.5x, the UbreClient rows (the client role too)
at most 1.25x in binary and 1.35x in JSON over lines. This is a benchmark, not a test:
tests/test_bench_rpc.py only checks that every row really does its round trips.

`--placement` says where the processes run. By default (same-core) this process and the servers
are pinned to one CPU, so a round trip is the CPU work of both ends and the kernel, one after the
other. Left to the kernel (any), a round trip lands on one core or spans two at random, and a
cross-core wake-up on this kind of virtual machine costs more than the whole Python path, so the
figures jump by 2x between runs; `split` pins client and servers to two different CPUs.

`--profile DIR` runs the UBRE server under cProfile (DIR/ubre-server.prof) and prints where its
time goes, with --placement split unless told otherwise; cProfile slows it several times over,
so compare no figures of such a run.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import pstats
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twisted.internet import defer, reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.protocols.basic import Int32StringReceiver
from twisted.python.failure import Failure

from wireproto.codecs import ubre
from wireproto.protocols.ubre.client import UbreClient

if str(Path(__file__).resolve().parent) not in sys.path:  # for bench/'s shared harness
    sys.path.append(str(Path(__file__).resolve().parent))
import _harness as harness  # noqa: E402
from _harness import BenchError  # noqa: E402

BENCH = Path(__file__).resolve().parent
SERVERS = BENCH / "_rpc_servers.py"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PLACEMENTS = ("same-core", "split", "any")
# (row, baseline, at most this p50 ratio): the server role, then the client role in each format.
GOALS = [
    ("ubre binary (raw client)", "bare echo", 1.5),
    ("ubre binary (UbreClient)", "bare echo", 1.25),
    ("ubre json lines (UbreClient)", "bare echo", 1.35),
]
# Printable ASCII with no character that JSON escapes, so a body is the same size in both formats.
BODY_ALPHABET = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"


def body_of(size: int) -> bytes:
    return (BODY_ALPHABET * (size // len(BODY_ALPHABET) + 1))[:size]


def _framed(message: bytes) -> bytes:
    return len(message).to_bytes(4, "big") + message


# --- The servers ---------------------------------------------------------------------------------

ADDRESS_LINE = re.compile(r"^\S+: (?P<what>.+) on tcp:(?P<host>[\d.]+):(?P<port>\d+)\s*$")


@dataclass
class RunningServer:
    kind: str
    process: subprocess.Popen
    # what it serves ("ubre over length32") -> (host, port)
    addresses: dict[str, tuple[str, int]]
    output: collections.deque

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # under --profile, the server writes its stats first
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_server(kind: str, profile: Path | None = None, timeout: float = 15.0) -> RunningServer:
    """Start bench/_rpc_servers.py KIND and wait for its "ready" line; its output is drained for
    as long as it runs, so it can never block on a full pipe."""
    command = [sys.executable, str(SERVERS), kind]
    if profile is not None:
        command += ["--profile", str(profile)]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, cwd=BENCH.parent)
    output: collections.deque = collections.deque(maxlen=30)
    addresses: dict[str, tuple[str, int]] = {}
    ready, said_ready = threading.Event(), []

    def drain() -> None:
        for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            output.append(line)
            match = ADDRESS_LINE.match(line)
            if match:
                addresses[match["what"]] = (match["host"], int(match["port"]))
            elif line == f"{kind}: ready":
                said_ready.append(line)
                ready.set()
        ready.set()  # its output ended: it exited

    threading.Thread(target=drain, name=f"{kind} server output", daemon=True).start()
    ready.wait(timeout)
    if not said_ready:
        try:
            process.wait(1)  # its output ended: let it finish exiting
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        said = "\n    ".join(output) or "(nothing)"
        raise BenchError(f"the {kind} server did not start ({' '.join(command)}):\n    {said}")
    return RunningServer(kind, process, addresses, output)


# --- The clients ---------------------------------------------------------------------------------


async def _until_done(done: defer.Deferred, progress: Callable[[], int], what: str,
                      stall: float = 5.0) -> None:
    """Wait for `done`, failing if `progress()` stands still for `stall` seconds."""
    last = [-1]

    def check() -> None:
        now = progress()
        if now == last[0] and not done.called:
            done.errback(BenchError(f"{what}: stalled after {now} round trips"))
        last[0] = now

    watchdog = task.LoopingCall(check)
    watchdog.start(stall, now=False)
    try:
        await done
    finally:
        watchdog.stop()


class RawClient(Int32StringReceiver):
    """Writes pre-framed requests one at a time; each reply must equal the one expected."""

    MAX_LENGTH = 1 << 30

    def __init__(self, name: str) -> None:
        self.name = name
        self.done: defer.Deferred | None = None
        self.lost: defer.Deferred[None] = defer.Deferred()
        self.closing = False

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)  # the client must not wait on Nagle

    def run(self, frames: list[bytes], replies: list[bytes], samples: list[float]
            ) -> defer.Deferred:
        self.frames, self.replies, self.samples = frames, replies, samples
        self.index = 0
        self.done = defer.Deferred()
        self._send()
        return self.done

    def _send(self) -> None:
        self.started = time.perf_counter()
        self.transport.write(self.frames[self.index])

    def stringReceived(self, data: bytes) -> None:
        replied = time.perf_counter()
        done = self.done
        if done is None or done.called:
            self._fail(f"{self.name}: a reply nobody asked for: {data[:40]!r}")
            return
        index = self.index
        if data != self.replies[index]:
            self._fail(f"{self.name}: reply {index} is {data[:40]!r},"
                       f" expected {self.replies[index][:40]!r}")
            return
        self.samples.append(replied - self.started)
        self.index = index + 1
        if self.index == len(self.frames):
            done.callback(None)
        else:
            self._send()

    def _fail(self, reason: str) -> None:
        if self.done is not None and not self.done.called:
            self.done.errback(BenchError(reason))
        self.transport.abortConnection()

    def connectionLost(self, reason: Failure = None) -> None:
        if not self.closing:
            self._fail(f"{self.name}: the server closed the connection")
        self.lost.callback(None)


class RawCaller:
    """A row driven by RawClient: `reply_for(request_message)` is what the server must answer."""

    def __init__(self, name: str, address: tuple[str, int], body: bytes,
                 reply_for: Callable[[str, bytes], bytes]) -> None:
        self.name = name
        self.address = address
        self.body = body
        self.reply_for = reply_for
        self.next_id = 1

    async def open(self) -> None:
        self.client = RawClient(self.name)
        endpoint = TCP4ClientEndpoint(reactor, *self.address, timeout=5)
        await _within(connectProtocol(endpoint, self.client), 5, f"{self.name}: connecting")

    def request_size(self) -> int:
        return len(ubre.encode(ubre.Request("1", self.body), binary=True))

    async def run(self, count: int, samples: list[float]) -> None:
        # Encoded before the clock starts: only the round trips are timed.
        frames, replies = [], []
        for request_id in map(str, range(self.next_id, self.next_id + count)):
            message = ubre.encode(ubre.Request(request_id, self.body), binary=True)
            frames.append(_framed(message))
            replies.append(self.reply_for(request_id, message))
        self.next_id += count
        before = len(samples)
        done = self.client.run(frames, replies, samples)
        await _until_done(done, lambda: len(samples) - before, self.name)

    async def close(self) -> None:
        self.client.closing = True
        self.client.transport.loseConnection()
        await _within(self.client.lost, 5, f"{self.name}: closing")


def _echoed(request_id: str, message: bytes) -> bytes:
    return message


def _ubre_success(body: bytes) -> Callable[[str, bytes], bytes]:
    return lambda request_id, _: ubre.encode(ubre.Success(request_id, body), binary=True)


class UbreCaller:
    """A row driven by wireproto's UbreClient: binary requests to the default handler, or JSON
    requests to the handler named "echo"."""

    def __init__(self, name: str, address: tuple[str, int], body: bytes, binary: bool) -> None:
        self.name = name
        self.address = address
        self.binary = binary
        self.body: bytes | str = body if binary else body.decode("ascii")
        self.handler = None if binary else "echo"

    async def open(self) -> None:
        host, port = self.address
        self.client = await _within(
            UbreClient(reactor, f"tcp:{host}:{port}", binary=self.binary).connect(), 5,
            f"{self.name}: connecting")
        self.client.protocol.transport.transport.setTcpNoDelay(True)

    def request_size(self) -> int:
        request = ubre.Request(1, self.body, name=self.handler)
        return len(ubre.encode(request, binary=self.binary))

    async def run(self, count: int, samples: list[float]) -> None:
        client, name, body, handler = self.client, self.name, self.body, self.handler
        done: defer.Deferred[None] = defer.Deferred()
        before = len(samples)
        left = [count]

        def send() -> None:
            started = time.perf_counter()
            client.request(handler, body).addCallbacks(replied, failed, callbackArgs=(started,))

        def replied(reply: Any, started: float) -> None:
            now = time.perf_counter()
            if done.called:
                return
            if reply != body:
                done.errback(BenchError(f"{name}: reply {reply!r:.60}, expected {body!r:.60}"))
                return
            samples.append(now - started)
            left[0] -= 1
            if left[0]:
                send()
            else:
                done.callback(None)

        def failed(failure: Failure) -> None:
            if not done.called:
                done.errback(BenchError(f"{name}: request failed: {failure.getErrorMessage()}"))

        send()
        await _until_done(done, lambda: len(samples) - before, name)

    async def close(self) -> None:
        await _within(self.client.close(), 5, f"{self.name}: closing")


async def _within(d: Any, seconds: float, what: str) -> Any:
    d = defer.ensureDeferred(d) if not isinstance(d, defer.Deferred) else d
    d.addTimeout(seconds, reactor)
    try:
        return await d
    except defer.TimeoutError:
        raise BenchError(f"{what}: nothing within {seconds} s") from None


@dataclass
class Row:
    """One thing to time: which server and listener it talks to, and how its client is made."""

    name: str
    server: str
    listener: str
    caller: Callable[[str, tuple[str, int], bytes], Any]


ROWS = [
    Row("bare echo", "echo", "echo over length32",
        lambda name, address, body: RawCaller(name, address, body, _echoed)),
    Row("ubre binary (raw client)", "ubre", "ubre over length32",
        lambda name, address, body: RawCaller(name, address, body, _ubre_success(body))),
    Row("ubre binary (UbreClient)", "ubre", "ubre over length32",
        lambda name, address, body: UbreCaller(name, address, body, binary=True)),
    Row("ubre json lines (UbreClient)", "ubre", "ubre over lines",
        lambda name, address, body: UbreCaller(name, address, body, binary=False)),
]
ROWS_BY_NAME = {row.name: row for row in ROWS}


# --- The run -------------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    request_size: int
    samples: list[float] = field(default_factory=list)  # seconds per timed round trip
    seconds: float = 0.0  # wall time of the timed batches
    server_cpu: float = 0.0  # the server process's CPU seconds over the timed batches

    def percentile(self, share: float) -> float:
        """Nearest-rank percentile, in seconds."""
        ordered = sorted(self.samples)
        return ordered[max(0, math.ceil(share * len(ordered)) - 1)]

    @property
    def p50(self) -> float:
        return self.percentile(0.50)

    @property
    def p99(self) -> float:
        return self.percentile(0.99)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def rate(self) -> float:
        return len(self.samples) / self.seconds

    @property
    def server_cpu_us(self) -> float:
        return self.server_cpu * 1e6 / len(self.samples)


@dataclass
class Report:
    results: dict[str, Result]
    lines: list[str] = field(default_factory=list)
    profile: list[str] = field(default_factory=list)


def _batches(total: int, rounds: int) -> list[int]:
    size, extra = divmod(total, rounds)
    return [size + (1 if r < extra else 0) for r in range(rounds)]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (fields 14 and 15 of /proc/<pid>/stat), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        text = stat.read()
    fields = text[text.rindex(b")") + 2 :].split()  # field 3 onwards: the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def placement_cpus(placement: str) -> tuple[set[int], set[int]] | None:
    """(client CPUs, server CPUs) for --placement, from the CPUs this process may use."""
    if placement == "any":
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if placement == "same-core":
        return {cpus[0]}, {cpus[0]}
    if len(cpus) < 2:
        raise BenchError("--placement split needs two CPUs; this process may use one")
    return {cpus[0]}, {cpus[1]}


async def run(options: argparse.Namespace, out: Callable[[str], None] = print) -> Report:
    """Start the servers, warm every row up, time the rows in turns, print the table."""
    rows = [row for row in ROWS if not options.rows or row.name in options.rows]
    body = body_of(options.payload_size)
    profile_path = None
    if options.profile is not None:
        options.profile.mkdir(parents=True, exist_ok=True)
        profile_path = options.profile / "ubre-server.prof"
    placement = placement_cpus(options.placement)
    own_cpus = os.sched_getaffinity(0)
    servers: dict[str, RunningServer] = {}
    callers: dict[str, Any] = {}
    report = Report({})
    try:
        if placement is not None:
            os.sched_setaffinity(0, placement[0])
        for kind in dict.fromkeys(row.server for row in rows):
            server = servers[kind] = start_server(kind, profile_path if kind == "ubre" else None)
            if placement is not None:
                os.sched_setaffinity(server.process.pid, placement[1])
        for row in rows:
            address = servers[row.server].addresses[row.listener]
            caller = callers[row.name] = row.caller(row.name, address, body)
            await caller.open()
            report.results[row.name] = Result(row.name, caller.request_size())
            if options.warmup:
                await caller.run(options.warmup, [])
        names = list(callers)
        for round_index, count in enumerate(_batches(options.requests, options.rounds)):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                result = report.results[name]
                pid = servers[ROWS_BY_NAME[name].server].process.pid
                cpu_before, started = cpu_seconds(pid), time.perf_counter()
                await callers[name].run(count, result.samples)
                result.seconds += time.perf_counter() - started
                result.server_cpu += cpu_seconds(pid) - cpu_before
    finally:
        for caller in callers.values():
            try:
                await caller.close()
            except BenchError as e:
                out(f"while closing: {e}")
        for server in servers.values():
            server.stop()
        os.sched_setaffinity(0, own_cpus)
    for result in report.results.values():
        if len(result.samples) != options.requests:
            raise BenchError(f"{result.name}: {len(result.samples)} round trips timed"
                             f" of {options.requests}")
    report.lines = table(report, options)
    if profile_path is not None and profile_path.exists():
        report.profile = profile_summary(profile_path)
    for line in report.lines + report.profile:
        out(line)
    return report


def table(report: Report, options: argparse.Namespace) -> list[str]:
    baseline = report.results.get("bare echo")
    header = (f"{'row':<28} {'request B':>9} {'p50 us':>8} {'p99 us':>8} {'mean us':>8}"
              f" {'requests/s':>11} {'server CPU us':>13}  p50 vs bare echo")
    lines = ["", header, "-" * len(header)]
    for result in report.results.values():
        ratio = f"{result.p50 / baseline.p50:.2f}x" if baseline else ""
        lines.append(f"{result.name:<28} {result.request_size:>9} {result.p50 * 1e6:>8.1f}"
                     f" {result.p99 * 1e6:>8.1f} {result.mean * 1e6:>8.1f}"
                     f" {result.rate:>11,.0f} {result.server_cpu_us:>13.1f}  {ratio}")
    lines.append("")
    lines.append(f"{options.requests} timed round trips per row, one in flight, in"
                 f" {options.rounds} interleaved rounds, after {options.warmup} warm-up;"
                 f" {options.payload_size}-byte body; placement {options.placement}")
    lines.append(f"request B: one request's bytes, before framing; server CPU: its utime+stime"
                 f" per round trip; python {sys.version.split()[0]}, {os.cpu_count()} cores")
    goal_lines = []
    for row, base, goal in GOALS:
        if row in report.results and base in report.results:
            ratio = report.results[row].p50 / report.results[base].p50
            verdict = "ok" if ratio <= goal else "MISSED"
            goal_lines.append(f"  {row}: p50 {ratio:.2f}x {base} (goal at most {goal}x)"
                              f"  {verdict}")
    if goal_lines:
        lines += ["", "goals:", *goal_lines]
    if options.profile is not None:
        lines.append("--profile: the UBRE server ran under cProfile; compare no figures")
    return lines


EPOLL_WAIT = "<method 'poll' of 'select.epoll' objects>"


def profile_summary(path: Path, top: int = 15) -> list[str]:
    """The UBRE server's functions by own time, as shares of its busy time: the time it spent
    waiting in epoll for the next request is left out, also from its callers' cumulative time."""
    stats = pstats.Stats(str(path))
    waits = [key for key in stats.stats if key[2] == EPOLL_WAIT]
    idle = sum(stats.stats[key][2] for key in waits)
    waiting_callers, todo = set(), list(waits)
    while todo:  # every function with epoll's wait somewhere under it
        for caller in stats.stats[todo.pop()][4]:
            if caller not in waiting_callers:
                waiting_callers.add(caller)
                todo.append(caller)
    busy = (stats.total_tt - idle) or 1.0
    entries = sorted(((key, value) for key, value in stats.stats.items() if key not in waits),
                     key=lambda item: item[1][2], reverse=True)
    lines = ["", f"profile of the UBRE server ({path}): {busy:.2f} s busy, {idle:.2f} s idle"
                 " in epoll (left out)", f"  {'own%':>5} {'cum%':>6} {'calls':>9}  function"]
    for key, (_, calls, own, cumulative, _) in entries[:top]:
        filename, line, function = key
        if key in waiting_callers:
            cumulative -= idle
        where = f"{Path(filename).name}:{line}" if line else filename
        lines.append(f"  {100 * own / busy:5.1f} {100 * cumulative / busy:6.1f}"
                     f" {calls:>9}  {function} ({where})")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000,
                        help="timed round trips per row (default 20000)")
    parser.add_argument("--warmup", type=int, default=1000,
                        help="untimed round trips per row before timing (default 1000)")
    parser.add_argument("--payload-size", type=int, default=64,
                        help="bytes of body in each request and reply (default 64)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved rounds the timed round trips are split into (default 5)")
    parser.add_argument("--placement", choices=PLACEMENTS,
                        help="same-core (the default): this process and the servers on one CPU;"
                        " split (the default with --profile): on two; any: wherever the kernel"
                        " puts them")
    parser.add_argument("--rows", type=lambda s: [n.strip() for n in s.split(",")],
                        help="only these rows, comma-separated, e.g. 'bare echo'")
    parser.add_argument("--profile", metavar="DIR", type=Path,
                        help="run the UBRE server under cProfile into DIR/ubre-server.prof and"
                        " print where its time goes (slows it: compare no figures then)")
    options = parser.parse_args(argv)
    if options.placement is None:
        # cProfile times wall clock: sharing one CPU, the server would be charged for the
        # client's turns, in whatever call (its socket send) it was preempted.
        options.placement = "split" if options.profile else "same-core"
    if options.requests < 1 or options.warmup < 0 or options.payload_size < 1:
        parser.error("--requests and --payload-size must be at least 1, --warmup at least 0")
    options.rounds = max(1, min(options.rounds, options.requests))
    known = {row.name for row in ROWS}
    for name in options.rows or ():
        if name not in known:
            parser.error(f"unknown row {name!r}: choose from {', '.join(sorted(known))}")
    return options


def main(argv: list[str] | None = None) -> int:
    return harness.main("rpc.py", run, parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
