"""Last values: what one subscribe costs the broker with 10 and with 100 000 kept topics, side by
side ([hub] retain, docs/hub.md "Last values").

Two brokers, one with each count of kept topics (`sensors/N/t`), each a WEBSMQ length32 stack on
its own hub, are fed the same subscribes through `dataReceived`, their subscriber on Twisted's
StringTransport, in one process:

    .venv/bin/python bench/last_values.py [--repeats N] [--subscribes N] [--quick]

Each row is one kind of subscribe, made and unmade (a subscribe, then an unsubscribe) in turns on
both brokers; each figure is the best of interleaved repeats, in µs per subscribe. A pattern's
last values are found through the kept topics' tree (wireproto.topics.TopicTree), so a pattern
whose first level is literal and names no kept topic costs the same however many are kept: the
goal (docs/performance.md) is that row within 2x. Every subscribe is checked to deliver the last
values it should, once, before any is timed.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from wireproto.codecs import websmq
from wireproto.hub import Hub, HubMessage
from wireproto.protocols.websmq.server import WebsmqServerProtocol
from wireproto.transports.stream import StreamOptions, stream_server_factory

if str(Path(__file__).resolve().parent) not in sys.path:  # for bench/'s shared harness
    sys.path.append(str(Path(__file__).resolve().parent))
import _harness as harness  # noqa: E402
from _harness import BenchError  # noqa: E402

KEPT = (10, 100_000)
GOAL = 2.0
# Each kind of subscribe, and the kept topics it finds (in both brokers alike).
ROWS: dict[str, tuple[str, list[str]]] = {
    "literal first level, no match": ("nothing/+/#", []),
    "exact topic": ("sensors/7/t", ["sensors/7/t"]),
    "pattern, one match": ("sensors/7/+", ["sensors/7/t"]),
    "wildcard first level, one match": ("+/7/t", ["sensors/7/t"]),
}
GOAL_ROW = "literal first level, no match"


def _framed(frame: bytes) -> bytes:
    return struct.pack(">I", len(frame)) + frame


class Broker:
    """A hub keeping `kept` last values, and one WEBSMQ subscriber connected to it."""

    def __init__(self, kept: int) -> None:
        self.hub = Hub(retain=["sensors/#"], max_retained=kept,
                       max_retained_bytes=64 * kept + 1024)
        for number in range(kept):
            self.hub.publish(HubMessage(f"sensors/{number}/t", b"%d" % number))
        if len(self.hub.retained) != kept:
            raise BenchError(f"{len(self.hub.retained)} last values kept, not {kept}")
        factory = stream_server_factory(
            lambda: WebsmqServerProtocol(self.hub, wildcards=True),
            StreamOptions("length32"))
        self.protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 0))
        self.output = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 1))
        self.protocol.makeConnection(self.output)

    def frames(self, topic: str) -> bytes:
        """A subscribe to `topic` and its unsubscribe, as the subscriber sends them."""
        raw = topic.encode("ascii")  # encode() would refuse a '#', as the client's own does
        return b"".join(_framed(websmq.encode_header(kind, len(raw)) + raw) for kind in (
            websmq.MessageType.SUBSCRIBE, websmq.MessageType.UNSUBSCRIBE))

    def check(self, topic: str, expected: list[str]) -> None:
        """One subscribe to `topic` delivers the last values of `expected`, and nothing else."""
        self.output.clear()
        self.protocol.dataReceived(self.frames(topic))
        data, found = self.output.value(), []
        while data:
            (length,), data = struct.unpack(">I", data[:4]), data[4:]
            message = websmq.decode(data[:length])
            data = data[length:]
            if isinstance(message, websmq.Publish):
                found.append(message.topic)
        if found != expected:
            raise BenchError(f"a subscribe to {topic!r} with {len(self.hub.retained)} kept got "
                             f"{found}, not {expected}")
        if self.hub.patterns() or self.hub.topics():
            raise BenchError(f"{topic!r} is still subscribed after its unsubscribe")
        self.output.clear()

    def seconds(self, batch: bytes, count: int) -> float:
        feed, output = self.protocol.dataReceived, self.output
        started = time.perf_counter()
        feed(batch)
        elapsed = time.perf_counter() - started
        output.clear()
        return elapsed / count


def run(options: argparse.Namespace, out: Any = print) -> dict[str, dict[int, float]]:
    """Best µs per subscribe, by row and by count of kept topics."""
    brokers = {kept: Broker(kept) for kept in KEPT}
    for topic, expected in ROWS.values():
        for broker in brokers.values():
            broker.check(topic, expected)
    best = {row: dict.fromkeys(KEPT, float("inf")) for row in ROWS}
    for _ in range(options.repeats):
        for row, (topic, _) in ROWS.items():
            for kept, broker in brokers.items():
                batch = broker.frames(topic) * options.subscribes
                best[row][kept] = min(best[row][kept],
                                      broker.seconds(batch, options.subscribes) * 1e6)
    out(f"{'subscribe (and unsubscribe)':<34} {'10 kept':>10} {'100 000 kept':>13}  ratio"
        "   (µs per subscribe)")
    for row, figures in best.items():
        small, large = figures[KEPT[0]], figures[KEPT[1]]
        out(f"{row:<34} {small:>10.2f} {large:>13.2f}  {large / small:5.2f}x")
    ratio = best[GOAL_ROW][KEPT[1]] / best[GOAL_ROW][KEPT[0]]
    out(f"goal: {GOAL_ROW}, 100 000 kept within {GOAL:.0f}x of 10: {ratio:.2f}x "
        f"({'met' if ratio <= GOAL else 'missed'})")
    return best


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats (default 20)")
    parser.add_argument("--subscribes", type=int, default=200,
                        help="subscribes per timed batch (default 200)")
    parser.add_argument("--quick", action="store_true", help="one small round (for the tests)")
    options = parser.parse_args(argv)
    if options.quick:
        options.repeats, options.subscribes = 1, 5
    return options


def main(argv: list[str] | None = None) -> int:
    return harness.main("last_values.py", run, parse_args(argv), reactor=False)


if __name__ == "__main__":
    sys.exit(main())
