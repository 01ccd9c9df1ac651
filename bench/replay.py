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
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet import reactor, threads
from twisted.internet.task import deferLater

from wireproto import capture
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


async def run(options: argparse.Namespace, out: Any = print) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as scratch:
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
    parser.add_argument("--quick", action="store_true", help="a short run (for the tests)")
    options = parser.parse_args(argv)
    if options.quick:
        options.seconds, options.rate = 0.5, 40
    return options


def main(argv: list[str] | None = None) -> int:
    return harness.main("replay.py", run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
