"""Replaying captures: the pace achieved against the recorded one, at speed 1, for both kinds of
replay side by side (docs/performance.md, "Replaying captures"):

- the command: ``wireproto replay CAPTURE --to ws://.../websmq`` (a process) publishes what a
  captured client published into a broker;
- the endpoint: a broker's ``[[attach]]`` link to ``replay:path=CAPTURE:connection=ID`` plays
  what that connection received into the broker, as its peer would have sent it.

    .venv/bin/python bench/replay.py [--seconds S] [--rate N] [--quick]

Each workload is a capture written here, of one WEBSMQ client publishing numbered messages on
one topic: "steady" (evenly spaced), "bursty" (a burst every 100 ms) and "jittery" (random gaps
of the same mean). A WEBSMQ subscriber of the broker notes when each message arrives; the
achieved span is from the first arrival to the last, the recorded span from the first record to
the last. "pace" is recorded / achieved (1.00 is exact, under 1 is slower); "late p50" and
"late p99" are how far behind its recorded offset the median and the 99th percentile message
arrived, offsets counted from the arrival the earliest message allows. Every
message must arrive, once, in order, or the run fails. The goal: pace within 10% at speed 1.

Then a ``replay:`` link opens on a directory of many small capture files (5,000; --files), its
link in the last: how long until it is connected, and the longest the reactor went without
turning meanwhile (a LoopingCall every millisecond notes each turn). The goal: no stall over
50 ms.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet import protocol, reactor, threads
from twisted.internet.task import LoopingCall, deferLater

from wireproto import capture
from wireproto.capture.replay import replay_endpoint
from wireproto.codecs import websmq
from wireproto.config import Attach, Config, parse_listen
from wireproto.protocols.websmq.client import connect as websmq_connect
from wireproto.service import make_service

if str(Path(__file__).resolve().parent) not in sys.path:  # for bench/'s shared harness
    sys.path.append(str(Path(__file__).resolve().parent))
import _harness as harness  # noqa: E402
from _harness import BenchError  # noqa: E402

TOPIC = "bench/replay"
GOAL = 0.10
STALL_GOAL = 0.050
WORKLOADS = ("steady", "bursty", "jittery")
KINDS = ("command", "endpoint")
CONNECTION = 1


@dataclass
class Row:
    workload: str
    kind: str
    messages: int = 0
    recorded: float = 0.0
    achieved: float = 0.0
    late_p50: float = 0.0
    late_p99: float = 0.0

    @property
    def pace(self) -> float:
        return self.recorded / self.achieved if self.achieved else 0.0


def gaps(workload: str, seconds: float, rate: int, seed: int = 41) -> list[float]:
    """The gaps between messages (the first 0) of `workload`: `rate` a second for `seconds`."""
    count = max(2, int(seconds * rate))
    mean = 1.0 / rate
    if workload == "steady":
        return [0.0] + [mean] * (count - 1)
    if workload == "bursty":
        burst = max(1, rate // 10)  # one burst each 100 ms
        return [0.0] + [0.1 if index % burst == 0 else 0.0 for index in range(1, count)]
    chance = random.Random(seed)
    return [0.0] + [chance.expovariate(rate) for _ in range(count - 1)]


def write_capture(directory: Path, spacing: list[float]) -> list[int]:
    """A capture of one WEBSMQ client publishing a message after each gap; the records'
    times."""
    now = time.time_ns()
    times = []
    with capture.CaptureWriter(directory, fsync=False, clock=lambda: now) as writer:
        writer.open_connection(CONNECTION, "127.0.0.1:1", "websmq", "length32", timestamp_ns=now)
        for number, gap in enumerate(spacing):
            now += int(gap * 1e9)
            times.append(now)
            writer.message(CONNECTION, "in", websmq.encode(websmq.Publish(TOPIC, b"%d" % number)),
                           True, now)
    return times


async def broker(attach: tuple[Attach, ...] = ()) -> tuple[Any, str]:
    service = make_service(Config(listeners=(parse_listen("websmq+ws@tcp:0:interface=127.0.0.1"),),
                                  attach=attach), reactor)
    service.startService()
    (bound,) = await service.when_listening()
    return service, bound.address


async def subscriber(address: str) -> tuple[Any, list[tuple[float, bytes]]]:
    arrivals: list[tuple[float, bytes]] = []
    client = await websmq_connect(reactor, address)
    client.subscribe(TOPIC, lambda message: arrivals.append((time.monotonic(),
                                                             bytes(message.payload))))
    syncing = await websmq_connect(reactor, address)
    while not arrivals:  # a WEBSMQ subscribe has no answer: publish until one comes back
        syncing.publish(TOPIC, b"sync")
        await deferLater(reactor, 0.05)
    await deferLater(reactor, 0.1)
    await syncing.disconnect()
    arrivals.clear()
    return client, arrivals


async def wait_for_all(arrivals: list[tuple[float, bytes]], count: int, limit: float) -> None:
    deadline = time.monotonic() + limit
    while len(arrivals) < count and time.monotonic() < deadline:
        await deferLater(reactor, 0.02)


def judge(row: Row, arrivals: list[tuple[float, bytes]], times: list[int]) -> Row:
    payloads = [payload for _, payload in arrivals]
    expected = [b"%d" % number for number in range(len(times))]
    if payloads != expected:
        raise BenchError(f"{row.workload} by the {row.kind}: {len(payloads)} messages arrived, "
                         f"not the {len(expected)} recorded, in order")
    row.messages = len(payloads)
    row.recorded = (times[-1] - times[0]) / 1e9
    row.achieved = arrivals[-1][0] - arrivals[0][0]
    behind = [(at - arrivals[0][0]) - (recorded - times[0]) / 1e9
              for (at, _), recorded in zip(arrivals, times, strict=True)]
    # From the schedule the earliest message set: a first message that came late is not
    # every other message early.
    lateness = sorted(late - min(behind) for late in behind)
    row.late_p50 = lateness[len(lateness) // 2]
    row.late_p99 = lateness[min(len(lateness) - 1, int(len(lateness) * 0.99))]
    return row


async def by_command(row: Row, directory: Path, times: list[int], limit: float) -> Row:
    service, address = await broker()
    client, arrivals = await subscriber(address)
    try:
        replay = threads.deferToThread(
            subprocess.run, [sys.executable, "-m", "wireproto", "replay", str(directory),
                             "--to", address, "--json"],
            capture_output=True, text=True, timeout=limit)
        done = await replay
        if done.returncode != 0:
            raise BenchError(f"wireproto replay exited {done.returncode}: {done.stderr.strip()}")
        if json.loads(done.stdout.splitlines()[-1])["messages"] != len(times):
            raise BenchError(f"wireproto replay said: {done.stdout.strip()}")
        await wait_for_all(arrivals, len(times), 10)
        return judge(row, arrivals, times)
    finally:
        await client.disconnect()
        await service.stopService()


async def by_endpoint(row: Row, directory: Path, times: list[int], limit: float) -> Row:
    path = capture.capture_files(directory)[0]
    link = Attach("websmq", f"replay:path={path}:connection={CONNECTION}", "length32")
    # The link starts playing as the broker starts: subscribe on a broker without it first,
    # then add it.
    service, address = await broker()
    client, arrivals = await subscriber(address)
    try:
        service.add_attach(link, lambda attempt: 3600.0)
        await wait_for_all(arrivals, len(times), limit)
        return judge(row, arrivals, times)
    finally:
        await client.disconnect()
        await service.stopService()


def many_files(directory: Path, count: int) -> None:
    """`count` small capture files in `directory`: connection 1 of link dev1 only in the last."""
    with capture.CaptureWriter(directory / "seed", fsync=False) as writer:
        writer.open_connection(2, "127.0.0.1:1", "websmq", "length32", timestamp_ns=1)
        for number in range(5):
            writer.message(2, "in", websmq.encode(websmq.Publish(TOPIC, b"%d" % number)), True,
                           timestamp_ns=2 + number)
    with capture.CaptureWriter(directory / "last", fsync=False) as writer:
        writer.open_connection(CONNECTION, "serial:/dev/ttyACM0", "phyllo", "stream",
                               timestamp_ns=1, link="dev1", stack="minimal")
    (seed,), (last,) = (capture.capture_files(directory / name) for name in ("seed", "last"))
    (directory / "all").mkdir()
    for number in range(1, count + 1):
        shutil.copy(seed if number < count else last,
                    directory / "all" / f"wirecapture-20260101T000000-{number:06d}.wpcap")


async def opening(directory: Path, count: int) -> tuple[float, float]:
    """Seconds until a replay: link on `count` files is connected, and the longest the reactor
    went without a turn meanwhile."""
    many_files(directory, count)
    turns: list[float] = []
    ticking = LoopingCall(lambda: turns.append(time.perf_counter()))
    ticking.start(0.001)
    endpoint = replay_endpoint(reactor, f"replay:path={directory / 'all'}:link=dev1")
    began = time.perf_counter()
    try:
        await endpoint.connect(protocol.Factory.forProtocol(protocol.Protocol))
        connected = time.perf_counter() - began
        await deferLater(reactor, 0.01)
    finally:
        ticking.stop()
    if endpoint.carrier is not None:
        endpoint.carrier.loseConnection()
    marks = [began] + [turn for turn in turns if turn >= began]
    gaps = [later - earlier for earlier, later in zip(marks, marks[1:], strict=False)]
    return connected, max(gaps)


async def run(options: argparse.Namespace, out: Any = print) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as scratch:
        connected, stall = await opening(Path(scratch) / "opening", options.files)
        out(f"a replay: link opening on {options.files} capture files: connected in "
            f"{connected * 1000:.0f} ms, the longest reactor stall {stall * 1000:.1f} ms (goal: "
            f"at most {STALL_GOAL * 1000:.0f} ms: {'met' if stall <= STALL_GOAL else 'missed'})")
        for workload in WORKLOADS:
            directory = Path(scratch) / workload
            times = write_capture(directory, gaps(workload, options.seconds, options.rate))
            for kind in KINDS:
                measure = by_command if kind == "command" else by_endpoint
                rows.append(await measure(Row(workload, kind), directory, times,
                                          options.seconds * 3 + 60))
    out(f"{'workload':<9} {'replay':<9} {'messages':>8} {'recorded s':>10} {'achieved s':>10} "
        f"{'pace':>6} {'late p50 ms':>11} {'late p99 ms':>11}")
    for row in rows:
        out(f"{row.workload:<9} {row.kind:<9} {row.messages:>8} {row.recorded:>10.3f} "
            f"{row.achieved:>10.3f} {row.pace:>6.3f} {row.late_p50 * 1000:>11.1f} "
            f"{row.late_p99 * 1000:>11.1f}")
    worst = max(rows, key=lambda row: abs(row.pace - 1))
    out(f"goal: pace within {GOAL:.0%} at speed 1: worst {worst.workload} by the {worst.kind} "
        f"{worst.pace:.3f} ({'met' if abs(worst.pace - 1) <= GOAL else 'missed'})")
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="the recorded span of each workload (default 10)")
    parser.add_argument("--rate", type=int, default=500,
                        help="messages a second, on average (default 500)")
    parser.add_argument("--files", type=int, default=5000,
                        help="capture files a replay: link opens on (default 5000)")
    parser.add_argument("--quick", action="store_true", help="a short run (for the tests)")
    options = parser.parse_args(argv)
    if options.quick:
        options.seconds, options.rate, options.files = 0.5, 40, 200
    return options


def main(argv: list[str] | None = None) -> int:
    return harness.main("replay.py", run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
