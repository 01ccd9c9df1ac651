"""Phyllo benchmark: messages per second through wireproto's stack and phyllo-python's, over a pty.

Every row moves the same message: a small msgpack document on a short topic, on the reduced
stack (CRC-checked), 33 bytes on the wire. The stack under test opens the pty slave as a serial
port; the other end, the pty master, is a plain process that only writes or reads bytes
(`line blast` and `line drain` below), so each row times one stack alone:

    wireproto receive            wireproto's DocumentLink(reduced_stack()) through the `serial:`
                                 endpoint, in this process; the master end writes N messages
                                 as fast as the pty takes them
    phyllo-python receive        phyllo-python 0.2.0 in its process (tests/phyllo/phyllo_python.py)
                                 through pyserial and its own PollingSerialAdapter, which reads
                                 one byte per call, as its serial examples do
    phyllo-python receive, bulk  the same stack handed whatever bytes are waiting, to show the
                                 stack's own cost apart from the byte-by-byte reads
    wireproto send               `send_value()` N times as fast as the carrier takes them;
    phyllo-python send           the master end reads until all N arrived, byte for byte
    ... @115200                  the master end writes at exactly 115200 baud 8N1 (11,520 bytes
                                 a second), as a device's UART would: "line" is the bytes per
                                 second delivered over 11,520, up to the last message decoded
    ..., by identity             wireproto's row with the pty found by its USB identity
                                 (`serial:vid=2341:pid=0043:serial_number=BENCH`) among this
                                 machine's ports (pyserial's list_ports) and a stand-in board's
                                 (wireproto.devices.standin), with a PollingWatcher listing
                                 them at its default interval (1 s) in this process all along,
                                 in a thread of its own as a broker does;
                                 "polled 20/s" lists them at the fastest interval it allows

    .venv/bin/python bench/phyllo.py [--messages N] [--line-messages N] [--rounds R] [--quick]

Rows are timed in turns over --rounds rounds, so a noisy spell hits every row alike; figures are
medians over rounds. A rate is messages over the time from the first byte written to the last
message decoded (receive), or from the first send to the last byte read (send); both ends stamp
`time.monotonic()`, one clock for every process. "CPU" is the stack's process CPU time
(`time.process_time()`) per message, from the first message to the last. Goals
(docs/performance.md): wireproto at least 5x phyllo-python's rate, receiving and sending, and at
least 95% of line rate. This is a benchmark, not a test: tests/test_bench.py only checks that
every row moves every message. phyllo-python's rows are skipped if it cannot be imported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import tty
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from twisted.internet import defer, error, protocol, reactor

from wireproto.devices import PollingWatcher, PortInfo, system_ports
from wireproto.devices.standin import COMMON_BOARDS, StandInPorts
from wireproto.devices.watch import MIN_INTERVAL
from wireproto.phyllo import DocumentLink, PubSubDocument, connect_stack, reduced_stack
from wireproto.transports import SerialEndpoint
from wireproto.transports.serial import serial_endpoint_from_string

if str(Path(__file__).resolve().parent) not in sys.path:  # for bench/'s shared harness
    sys.path.append(str(Path(__file__).resolve().parent))
import _harness as harness  # noqa: E402
from _harness import BenchError  # noqa: E402

BENCH = Path(__file__).resolve()
PEER = BENCH.parent.parent / "tests" / "phyllo" / "phyllo_python.py"
TOPIC = "temp"
VALUE = {"t": 21.5, "rh": 40}
LINE_RATE = 115200 // 10  # bytes a second: 8N1 is 10 bits a byte
SPEED_GOAL = 5.0  # wireproto's rate over phyllo-python's, at least
LINE_GOAL = 0.95  # of line rate, at least
BOARD = {**COMMON_BOARDS["uno"], "serial_number": "BENCH"}
MATCH = "serial:vid=2341:pid=0043:serial_number=BENCH"
DEFAULT_POLL = PollingWatcher(reactor).interval  # the watcher's own default


def wire_of(value: Any = VALUE) -> bytes:
    """One message on the wire, delimiters included, as wireproto's stack writes it."""
    from wireproto.codecs.phyllo.document import message_from_document
    from wireproto.codecs.phyllo.stack import REDUCED

    document = PubSubDocument.of(TOPIC, value)
    return REDUCED.encode(message_from_document(document.topic, document.document))


# --- the rows ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    name: str
    stack: str  # "wireproto" or "phyllo-python"
    direction: str  # "receive" or "send"
    paced: bool = False
    reads: str = "adapter"  # phyllo-python: through its adapter, or in bulk
    poll: float | None = None  # wireproto: found by identity, a watcher polling this often


ROWS = [
    Row("wireproto receive", "wireproto", "receive"),
    Row("phyllo-python receive", "phyllo-python", "receive"),
    Row("phyllo-python receive, bulk", "phyllo-python", "receive", reads="bulk"),
    Row("wireproto send", "wireproto", "send"),
    Row("phyllo-python send", "phyllo-python", "send"),
    Row("wireproto @115200", "wireproto", "receive", paced=True),
    Row("phyllo-python @115200", "phyllo-python", "receive", paced=True),
    Row("wireproto receive, by identity", "wireproto", "receive", poll=DEFAULT_POLL),
    Row("wireproto receive, by identity, polled 20/s", "wireproto", "receive",
        poll=MIN_INTERVAL),
    Row("wireproto send, by identity", "wireproto", "send", poll=DEFAULT_POLL),
    Row("wireproto @115200, by identity", "wireproto", "receive", paced=True,
        poll=DEFAULT_POLL),
]
SPEED_PAIRS = [  # (wireproto's row, phyllo-python's row)
    ("wireproto receive", "phyllo-python receive"),
    ("wireproto receive", "phyllo-python receive, bulk"),
    ("wireproto send", "phyllo-python send"),
    ("wireproto receive, by identity", "phyllo-python receive"),
    ("wireproto receive, by identity, polled 20/s", "phyllo-python receive"),
    ("wireproto send, by identity", "phyllo-python send"),
]


@dataclass
class Measurement:
    row: Row
    messages: int
    seconds: float
    cpu_seconds: float
    cpu_window: float
    """The wall time over which cpu_seconds was taken."""
    lists: list[float] = field(default_factory=list)
    """By identity: the seconds each listing of the ports took, while the row ran."""

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def cpu_us(self) -> float:
        return self.cpu_seconds / max(1, self.messages - 1) * 1e6

    def line(self, wire_length: int) -> float:
        """Bytes a second delivered, over line rate."""
        return self.rate * wire_length / LINE_RATE


# --- processes -----------------------------------------------------------------------------------


class Child(protocol.ProcessProtocol):
    """A process of the run: `ready` once it is set, then one JSON line of results."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.results: list[dict[str, Any]] = []
        self.output = bytearray()
        self.ready: defer.Deferred[None] = defer.Deferred()
        self.ended: defer.Deferred[None] = defer.Deferred()
        self.exit: BaseException | None = None
        self._partial = b""

    def outReceived(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            if line == b"ready":
                self.ready.callback(None)
            elif line.startswith(b"{"):
                self.results.append(json.loads(line))

    def errReceived(self, data: bytes) -> None:
        self.output = (self.output + data)[-4000:]

    def processEnded(self, reason: Any) -> None:
        self.exit = reason.value
        self.ended.callback(None)

    def failed(self, why: str) -> BenchError:
        said = self.output.decode(errors="replace").strip()[-2000:] or "(nothing on stderr)"
        return BenchError(f"{self.what}: {why}\n    {said}")

    async def result(self, timeout: float) -> dict[str, Any]:
        await within(self.ended, timeout, f"{self.what}: did not finish")
        if not isinstance(self.exit, error.ProcessDone) or not self.results:
            raise self.failed(f"ended with {self.exit}, results {self.results}")
        return self.results[-1]

    def stop(self) -> None:
        if not self.ended.called:
            try:
                self.transport.signalProcess("KILL")
            except error.ProcessExitedAlready:
                pass


def spawn(what: str, args: list[str], fds: tuple[int, ...] = ()) -> Child:
    child = Child(what)
    child_fds: dict[int, Any] = {0: "w", 1: "r", 2: "r"}
    child_fds.update({fd: fd for fd in fds})
    reactor.spawnProcess(child, sys.executable, [sys.executable, *args], env=dict(os.environ),
                         childFDs=child_fds)
    return child


async def within(d: defer.Deferred, seconds: float, what: str) -> Any:
    d.addTimeout(seconds, reactor)
    try:
        return await d
    except defer.TimeoutError:
        raise BenchError(f"{what} within {seconds:.0f} s") from None


@contextmanager
def pty_line() -> Iterator[tuple[int, str]]:
    """A raw pty pair: (master fd, slave device path)."""
    master, slave = os.openpty()
    try:
        tty.setraw(slave)
        yield master, os.ttyname(slave)
    finally:
        os.close(master)
        os.close(slave)


def line_end(mode: str, master: int, wire: bytes, count: int, rate: int | None = None) -> Child:
    args = [str(BENCH), "line", mode, "--fd", str(master), "--wire", wire.hex(),
            "--count", str(count)]
    if rate is not None:
        args += ["--rate", str(rate)]
    return spawn(f"line {mode}", args, fds=(master,))


def time_limit(count: int) -> float:
    return 60.0 + count / 200  # far beyond any stack's pace: only a stall reaches it


# --- measuring -----------------------------------------------------------------------------------


@contextmanager
def board_by_identity(interval: float) -> Iterator[tuple[int, SerialEndpoint, list[float]]]:
    """A stand-in board (a pty) found by its USB identity among this machine's ports and its
    own, with a watcher listing them every `interval` seconds: (the pty master, the endpoint
    that finds it, the seconds each listing took)."""
    boards = StandInPorts()
    lists: list[float] = []

    def lister() -> list[PortInfo]:
        started = time.perf_counter()
        ports = system_ports() + boards.ports()
        lists.append(time.perf_counter() - started)
        return ports

    try:
        board = boards.plug(**BOARD)
        watcher = PollingWatcher(reactor, lister, interval)
        watcher.start()
        try:
            # the endpoint lists through the watcher's listing, as a broker's links do
            endpoint = serial_endpoint_from_string(reactor, MATCH, lister=watcher.listing)
            yield board.master, endpoint, lists
        finally:
            watcher.stop()
    finally:
        boards.close()


async def measure(row: Row, count: int, wire: bytes) -> Measurement:
    if row.poll is not None:
        with board_by_identity(row.poll) as (master, endpoint, lists):
            measured = await _measure_wireproto(row, count, wire, master, endpoint)
            if not endpoint.port or endpoint.port.serial_number != "BENCH":
                raise BenchError(f"{row.name}: opened {endpoint.port}, not the stand-in board")
            measured.lists = list(lists)
            return measured
    with pty_line() as (master, device):
        if row.stack == "wireproto":
            return await _measure_wireproto(row, count, wire, master,
                                            SerialEndpoint(reactor, device))
        return await _measure_phyllo_python(row, count, wire, master, device)


async def _measure_wireproto(row: Row, count: int, wire: bytes, master: int,
                             endpoint: SerialEndpoint) -> Measurement:
    top = await within(connect_stack(endpoint, lambda: DocumentLink(reduced_stack())), 10,
                       "opening the pty")
    children: list[Child] = []
    try:
        if row.direction == "receive":
            done: defer.Deferred[None] = defer.Deferred()
            seen = {"count": 0, "bad": 0}
            stamps: dict[str, float] = {}
            topic = TOPIC.encode()

            def on_document(document: PubSubDocument) -> None:
                if document.topic == topic and document.value == VALUE:
                    seen["count"] += 1
                else:
                    seen["bad"] += 1
                if seen["count"] == 1:
                    stamps["first"], stamps["cpu_first"] = time.monotonic(), time.process_time()
                if seen["count"] == count:
                    stamps["last"], stamps["cpu_last"] = time.monotonic(), time.process_time()
                    done.callback(None)

            top.on_receive = on_document
            children.append(blaster := line_end("blast", master, wire, count,
                                                LINE_RATE if row.paced else None))
            await within(done, time_limit(count), f"{row.name}: {seen} of {count} messages")
            started = (await blaster.result(10))["start"]
            if seen["bad"] or _stack_errors(top):
                raise BenchError(f"{row.name}: {seen}, errors {_stack_errors(top)}")
            return Measurement(row, count, stamps["last"] - started,
                               stamps["cpu_last"] - stamps["cpu_first"],
                               stamps["last"] - stamps["first"])
        children.append(drainer := line_end("drain", master, wire, count))
        await within(drainer.ready, 10, "line drain: not ready")
        started, cpu_started = time.monotonic(), time.process_time()
        for _ in range(count):
            top.send_value(TOPIC, VALUE)
        result = await drainer.result(time_limit(count))
        cpu = time.process_time() - cpu_started
        return Measurement(row, count, result["last"] - started, cpu, time.monotonic() - started)
    finally:
        for child in children:
            child.stop()
        if top.lost_reason is None:
            lost = top.when_lost()
            top.lose_connection()
            await within(lost, 10, "closing the pty")


async def _measure_phyllo_python(row: Row, count: int, wire: bytes, master: int, device: str
                                 ) -> Measurement:
    body = msgpack.packb(VALUE, use_bin_type=True)
    args = [str(PEER), row.direction, device, "--stack", "reduced", "--count", str(count),
            "--topic", TOPIC, "--body", body.hex(), "--reads", row.reads,
            "--timeout", str(time_limit(count))]
    children: list[Child] = []
    try:
        if row.direction == "receive":
            children.append(peer := spawn(row.name, args))
            await within(peer.ready, 30, f"{row.name}: its port did not open")
            children.append(blaster := line_end("blast", master, wire, count,
                                                LINE_RATE if row.paced else None))
            result = await peer.result(time_limit(count))
            started = (await blaster.result(10))["start"]
            return Measurement(row, count, result["last"] - started, result["cpu"],
                               result["last"] - result["first"])
        children.append(drainer := line_end("drain", master, wire, count))
        await within(drainer.ready, 10, "line drain: not ready")
        children.append(peer := spawn(row.name, args))
        result = await peer.result(time_limit(count))
        drained = await drainer.result(time_limit(count))
        return Measurement(row, count, drained["last"] - result["first"], result["cpu"],
                           result["last"] - result["first"])
    finally:
        for child in children:
            child.stop()


def _stack_errors(top: Any) -> dict[str, int]:
    return {
        f"{name}.{key}": value
        for name, counters in top.stack_counters().items()
        for key, value in counters.as_dict().items()
        if value and key not in ("received", "sent")
    }


def phyllo_python_missing() -> str | None:
    """Why phyllo-python cannot run here, or None. Asked in a process of its own: in this one,
    `import phyllo` is this file."""
    try:
        said = subprocess.run([sys.executable, str(PEER), "check"], capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return f"{PEER} check did not answer"
    answer = said.stdout.strip() or said.stderr.strip()[-500:]
    return None if answer == "ok" else answer


# --- the run -------------------------------------------------------------------------------------


@dataclass
class Report:
    measurements: list[Measurement]
    wire_length: int
    skipped: dict[str, str]
    lines: list[str] = field(default_factory=list)

    def of(self, name: str) -> list[Measurement]:
        return [m for m in self.measurements if m.row.name == name]


async def run(options: argparse.Namespace, out: Callable[[str], None] = print) -> Report:
    wire = wire_of()
    rows = [row for row in ROWS if not options.rows or row.name in options.rows]
    skipped: dict[str, str] = {}
    missing = phyllo_python_missing()
    if missing is not None:
        for row in rows:
            if row.stack == "phyllo-python":
                skipped[row.name] = missing
        rows = [row for row in rows if row.name not in skipped]
        out(f"skipping phyllo-python's rows: {missing}")
    report = Report([], len(wire), skipped)
    for round_number in range(options.rounds):
        turn = rows[round_number % len(rows):] + rows[: round_number % len(rows)]
        for row in turn:
            count = options.line_messages if row.paced else options.messages
            report.measurements.append(await measure(row, count, wire))
        out(f"round {round_number + 1} of {options.rounds} done")
    for line in table(report, rows, options):
        out(line)
    return report


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(report: Report, rows: list[Row], options: argparse.Namespace) -> list[str]:
    header = f"{'row':<44} {'messages/s':>11} {'CPU us/msg':>11} {'CPU load':>9} {'line':>8}"
    lines = ["", header, "-" * len(header)]
    for row in rows:
        runs = report.of(row.name)
        if not runs:
            continue
        rate = _median([m.rate for m in runs])
        cpu = _median([m.cpu_us for m in runs])
        load = _median([m.cpu_seconds / m.cpu_window for m in runs if m.cpu_window > 0])
        line = f"{_median([m.line(report.wire_length) for m in runs]):.2%}" if row.paced else ""
        lines.append(f"{row.name:<44} {rate:>11,.0f} {cpu:>11.1f} {load:>9.0%} {line:>8}")
    lines.append("")
    lines.append(f"{options.messages} messages ({options.line_messages} at 115200 baud) of"
                 f" {report.wire_length} bytes a measurement, reduced stack; medians of"
                 f" {options.rounds} interleaved rounds; python {sys.version.split()[0]},"
                 f" {os.cpu_count()} cores")
    lines.append(f"line: bytes a second delivered over {LINE_RATE:,} (115200 baud 8N1); at most"
                 f" {LINE_RATE / report.wire_length:,.0f} messages/s fit the line")
    lists = [seconds for m in report.measurements for seconds in m.lists]
    if any(m.row.poll is not None for m in report.measurements):
        lines.append(f"by identity: {MATCH} among this machine's ports and a stand-in's; the"
                     f" watcher listed them {len(lists)} times while those rows ran, a median"
                     f" {_median(lists) * 1e3:.2f} ms (longest {max(lists, default=0) * 1e3:.2f}"
                     " ms) each")
    if options.quick:
        lines.append("--quick: a smoke run, too short for its figures to mean much; run without it"
                     " to compare")
    lines.extend(goal_lines(report))
    for name, why in report.skipped.items():
        lines.append(f"skipped {name}: {why}")
    report.lines = lines
    return lines


def goal_lines(report: Report) -> list[str]:
    lines = ["", "goals:"]
    for ours, theirs in SPEED_PAIRS:
        pairs = list(zip(report.of(ours), report.of(theirs), strict=False))
        if not pairs:
            continue
        ratio = _median([a.rate / b.rate for a, b in pairs])
        verdict = "ok" if ratio >= SPEED_GOAL else "MISSED"
        lines.append(f"  {ours}: {ratio:.1f}x {theirs} (goal at least {SPEED_GOAL:g}x)  {verdict}")
    for row in ROWS:
        runs = report.of(row.name)
        if row.paced and runs:
            share = _median([m.line(report.wire_length) for m in runs])
            verdict = "ok" if share >= LINE_GOAL else "MISSED"
            lines.append(f"  {row.name}: {share:.2%} of line rate (goal at least"
                         f" {LINE_GOAL:.0%})  {verdict}")
    return lines if len(lines) > 2 else []


# --- the line's other end: a process that only writes or reads bytes -----------------------------


def run_line(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/phyllo.py line")
    parser.add_argument("mode", choices=("blast", "drain"))
    parser.add_argument("--fd", type=int, required=True, help="the pty master")
    parser.add_argument("--wire", required=True, help="one message on the wire, in hex")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--rate", type=int, help="blast: bytes a second (default: flat out)")
    parser.add_argument("--timeout", type=float, default=600.0)
    options = parser.parse_args(argv)
    os.set_blocking(options.fd, True)
    expected = bytes.fromhex(options.wire) * options.count
    deadline = time.monotonic() + options.timeout
    if options.mode == "blast":
        view = memoryview(expected)
        start = time.monotonic()
        if options.rate is None:
            while view and time.monotonic() < deadline:
                view = view[os.write(options.fd, view):]
        else:
            sent = 0
            while sent < len(expected) and time.monotonic() < deadline:
                due = min(len(expected), int((time.monotonic() - start) * options.rate))
                while sent < due:
                    sent += os.write(options.fd, view[sent:due])
                time.sleep(0.0005)
        print(json.dumps({"start": start, "end": time.monotonic()}), flush=True)
        return 0
    print("ready", flush=True)
    received = bytearray()
    last = None
    while len(received) < len(expected) and time.monotonic() < deadline:
        received += os.read(options.fd, 65536)
        last = time.monotonic()
    if received != expected:
        print(f"drained {len(received)} bytes, not the {len(expected)} expected"
              if len(received) != len(expected) else "the bytes differ", file=sys.stderr)
        return 1
    print(json.dumps({"last": last}), flush=True)
    return 0


def row_names(text: str) -> list[str]:
    """``--rows``' names: split on commas, except those inside a row's name (``phyllo-python
    receive, bulk``), the longest name first. A piece that is no name is kept to be refused."""
    known = {row.name for row in ROWS}
    pieces = text.split(",")
    names = []
    start = 0
    while start < len(pieces):
        for end in range(len(pieces), start, -1):
            candidate = ",".join(pieces[start:end]).strip()
            if candidate in known:
                break
        else:
            end, candidate = start + 1, pieces[start].strip()
        names.append(candidate)
        start = end
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int,
                        help="messages a measurement (default 20000, or 300 with --quick)")
    parser.add_argument("--line-messages", type=int, help="messages a measurement at 115200 baud"
                        " (default 1400, about 4 s; or 100 with --quick)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5, 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="one short round: a smoke run")
    parser.add_argument("--rows", type=row_names,
                        help="only these rows, comma-separated, e.g. 'wireproto receive'")
    options = parser.parse_args(argv)
    if options.messages is None:
        options.messages = 300 if options.quick else 20000
    if options.line_messages is None:
        options.line_messages = 100 if options.quick else 1400
    if options.rounds is None:
        options.rounds = 1 if options.quick else 5
    names = {row.name for row in ROWS}
    for name in options.rows or ():
        if name not in names:
            parser.error(f"unknown row {name!r}: choose from {', '.join(sorted(names))}")
    return options


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["line"]:
        return run_line(argv[1:])
    return harness.main("phyllo.py", run, parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
