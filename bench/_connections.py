"""A load maker: many real connections to one broker, subscribed to many topics, with a steady
trickle of publishes, for the status page's benchmark (bench/statuspage.py) and its test at scale
(tests/browser/test_status_page_at_scale.py).

    python bench/_connections.py [--connections N] [--topics M] [--rate R] [--deadline S]
                                 PROTOCOL@ADDRESS ...

Each PROTOCOL@ADDRESS is a listener of the broker: `websmq@ws://127.0.0.1:PORT/websmq`,
`websmq@tcp:127.0.0.1:PORT` (length32), `ubre@ws://127.0.0.1:PORT/ubre` or
`ubre@tcp:127.0.0.1:PORT` (lines). Connection i goes to the (i mod count)th address, so every
protocol gets its share of every kind of subscription. What each connection subscribes to is
fixed by its number (`layout`):

- the exact topic `topic(i mod M)`: `sensors/NNNN` for the first half of the topics,
  `plant/D/NNNN` (D its last digit) for the rest, so each topic has N/M exact subscribers;
- every `--pattern-every`th (default 50th) WEBSMQ connection (UBRE has no wildcards) also one
  of `PATTERNS` in turn;
- the first `--marked` connections also `MARKED` (a topic no other subscribes to), so that a
  filter on its last level matches exactly those connections.

Connection 0 publishes `--rate` messages a second, cycling over the M topics, so that rates and
charts have something to show. The broker's WEBSMQ listeners must take wildcards
(`[websmq] wildcards = true`), and its `[limits]` must allow N connections from one address:
`BROKER_CONFIG` is such a broker's config file, and `targets` reads the addresses to give here
from what `wireproto serve` prints.

When every connection is open and has sent its subscribes, one line goes to stdout:
``ready {JSON}`` (the counts by protocol and subscription). It stops, closing its connections,
when its stdin closes, on SIGTERM or SIGINT, or at `--deadline` seconds (exit status 3: whoever
started it forgot it). A connection the broker closes is said on stderr; when every one is gone
it exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet import defer, reactor, stdio, task
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wireproto.protocols.ubre.client import UbreClient  # noqa: E402
from wireproto.protocols.websmq.client import WebsmqClientProtocol  # noqa: E402
from wireproto.protocols.websmq.client import connect as websmq_connect  # noqa: E402

# A broker for this load: every connection from 127.0.0.1, WEBSMQ patterns, four kinds.
BROKER_CONFIG = """
[limits]
connections = 0
subscriptions = 0

[websmq]
wildcards = true

[[listen]]
protocol = "websmq"
transport = "ws"
endpoint = "tcp:0:interface=127.0.0.1"

[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "tcp:0:interface=127.0.0.1"

# Each UBRE client hears only of its own topics, not of the 1,000 others' (docs/ubre.md).
[[listen]]
protocol = "ubre"
transport = "ws"
endpoint = "tcp:0:interface=127.0.0.1"
announce = "own"

[[listen]]
protocol = "ubre"
transport = "lines"
endpoint = "tcp:0:interface=127.0.0.1"
announce = "own"
"""
LISTENING = re.compile(r"^wireproto: (?P<protocol>websmq|ubre) over \w+ on (?P<address>\S+)$")
PATTERNS = ("sensors/+", "plant/#", "#")
MARKED = "marked/needle"
# Connections being opened at once: the broker refuses more than 32 unfinished WebSocket
# handshakes from one address ([http] max_pending_per_address).
OPENING_AT_ONCE = 16
# Open files this process keeps besides its connections (stdio, the reactor's, Python's).
SPARE_FILES = 64


def topic(number: int, topics: int) -> str:
    """The `number`th of `topics` topics."""
    if number < topics // 2:
        return f"sensors/{number:04d}"
    return f"plant/{number % 10}/{number:04d}"


@dataclass(frozen=True)
class Target:
    protocol: str  # "websmq" or "ubre"
    address: str

    @classmethod
    def parse(cls, text: str) -> Target:
        protocol, at, address = text.partition("@")
        if not at or protocol not in ("websmq", "ubre") or not address:
            raise argparse.ArgumentTypeError(
                f"{text!r}: write websmq@ADDRESS or ubre@ADDRESS (a ws:// URL or tcp:HOST:PORT)")
        return cls(protocol, address)

    @property
    def kind(self) -> str:
        framing = "lines" if self.protocol == "ubre" else "length32"
        return f"{self.protocol}+{'ws' if self.address.startswith('ws') else framing}"


def targets(lines: list[str]) -> list[str]:
    """PROTOCOL@ADDRESS of each WEBSMQ and UBRE listener `wireproto serve` said it listens on."""
    return [f"{found['protocol']}@{found['address']}" for found in map(LISTENING.match, lines)
            if found]


def layout(number: int, targets: list[Target], options: argparse.Namespace) -> list[str]:
    """What connection `number` subscribes to."""
    subscribed = [topic(number % options.topics, options.topics)]
    websmq = [index for index, target in enumerate(targets) if target.protocol == "websmq"]
    place = number % len(targets)
    if place in websmq:
        # The WEBSMQ connections are counted apart, so that the patterns fall on each of
        # their addresses alike, whatever the number of addresses.
        counted = number // len(targets) * len(websmq) + websmq.index(place)
        every = options.pattern_every
        if counted % every == every - 1:
            subscribed.append(PATTERNS[(counted // every) % len(PATTERNS)])
    if number < options.marked:
        subscribed.append(MARKED)
    return subscribed


def raise_open_files(needed: int) -> int:
    """Raise this process's soft limit of open files to `needed`, within its hard limit; the
    limit now. A child started afterwards (a broker) inherits it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


class Load:
    """The connections, the publisher and the ways it stops."""

    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.targets: list[Target] = options.targets
        self.connections: list[Any] = []  # WebsmqClientProtocol or UbreClient
        self.received = 0
        self.lost = 0
        self.stopping = False
        self.status = 0
        self.publisher: task.LoopingCall | None = None

    async def open(self, number: int) -> None:
        target = self.targets[number % len(self.targets)]
        subscribed = layout(number, self.targets, self.options)
        if target.protocol == "websmq":
            client: Any = await websmq_connect(reactor, target.address, wildcards=True)
            client.on_message = self._received
            for name in subscribed:
                client.subscribe(name)
            client.when_closed().addCallback(self._closed, number)
        else:
            client = UbreClient(reactor, target.address)
            client.on_disconnect = lambda reason: self._closed(reason.value, number)
            await client.connect()
            for name in subscribed:
                client.subscribe(name, self._received)
        self.connections.append(client)

    def _received(self, message: Any) -> None:
        self.received += 1

    def _closed(self, reason: BaseException, number: int) -> None:
        if self.stopping:
            return
        self.lost += 1
        print(f"connection {number} closed: {reason}", file=sys.stderr, flush=True)
        if self.lost == self.options.connections:
            self.stop(1)

    async def run(self) -> dict[str, Any]:
        targets = self.targets
        gate = defer.DeferredSemaphore(OPENING_AT_ONCE)
        opening = [gate.run(lambda n=n: defer.ensureDeferred(self.open(n)))
                   for n in range(self.options.connections)]
        await defer.gatherResults(opening, consumeErrors=True)
        by_kind = Counter(targets[n % len(targets)].kind for n in range(self.options.connections))
        patterns = Counter(name for n in range(self.options.connections)
                           for name in layout(n, targets, self.options)
                           if name in PATTERNS)
        return {"connections": self.options.connections, "topics": self.options.topics,
                "by_kind": dict(by_kind), "patterns": dict(patterns),
                "marked": min(self.options.marked, self.options.connections),
                "marked_topic": MARKED, "pattern_every": self.options.pattern_every,
                "rate": self.options.rate}

    def start_publishing(self) -> None:
        if self.options.rate <= 0 or not self.connections:
            return
        publisher, count = self.connections[0], iter(range(1 << 62))

        def publish() -> None:
            sent = next(count)
            name = topic(sent % self.options.topics, self.options.topics)
            payload = b'{"n": %d, "t": %.3f}' % (sent, time.time())
            if isinstance(publisher, WebsmqClientProtocol):
                if publisher.connected:
                    publisher.publish(name, payload)
            elif publisher.connected:
                publisher.publish(name, json.loads(payload))

        self.publisher = task.LoopingCall(publish)
        self.publisher.start(1 / self.options.rate, now=False)

    def stop(self, status: int = 0) -> None:
        if self.stopping:
            return
        self.stopping, self.status = True, status
        if self.publisher is not None and self.publisher.running:
            self.publisher.stop()
        for client in self.connections:
            if isinstance(client, WebsmqClientProtocol):
                if client.connected:
                    client.transport.loseConnection()
            else:
                client.close()
        # The closes go out in the next turns; then the reactor stops whatever is left.
        reactor.callLater(0.5, reactor.stop)


class StdinWatch(Protocol):
    """Stops the load when its stdin closes: whoever started it has gone or is done."""

    def __init__(self, load: Load) -> None:
        self.load = load

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.load.stop(0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="+", type=Target.parse, metavar="PROTOCOL@ADDRESS")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--marked", type=int, default=7,
                        help=f"connections that also subscribe to {MARKED} (default 7)")
    parser.add_argument("--pattern-every", type=int, default=50,
                        help="one WEBSMQ connection in this many subscribes to a pattern too")
    parser.add_argument("--rate", type=float, default=20.0,
                        help="publishes a second from connection 0 (default 20; 0: none)")
    parser.add_argument("--deadline", type=float, default=600.0,
                        help="seconds after which it stops, whatever happens (default 600)")
    options = parser.parse_args(argv)
    if options.connections < 1 or options.topics < 2 or options.pattern_every < 1:
        parser.error("at least 1 connection, 2 topics and --pattern-every 1")
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    limit = raise_open_files(options.connections + SPARE_FILES)
    if limit != resource.RLIM_INFINITY and limit < options.connections + SPARE_FILES:
        print(f"at most {limit} open files here: too few for {options.connections} connections",
              file=sys.stderr)
        return 2
    load = Load(options)
    stdio.StandardIO(StdinWatch(load))
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: reactor.callFromThread(load.stop, 0))
    reactor.callLater(options.deadline, lambda: (
        print(f"deadline of {options.deadline:g} s passed: stopping", file=sys.stderr,
              flush=True), load.stop(3)))

    def started(summary: dict[str, Any]) -> None:
        if load.stopping:
            return
        load.start_publishing()
        print("ready " + json.dumps(summary, sort_keys=True), flush=True)

    def failed(failure: Failure) -> None:
        if not load.stopping:
            error = failure.value
            if isinstance(error, defer.FirstError):
                error = error.subFailure.value
            print(f"could not open the connections: {error!r}", file=sys.stderr, flush=True)
            load.stop(1)

    began = time.monotonic()
    d = defer.ensureDeferred(load.run())
    d.addCallback(lambda summary: {**summary,
                                   "seconds": round(time.monotonic() - began, 2)})
    d.addCallbacks(started, failed)
    reactor.run(installSignalHandlers=False)
    return load.status


if __name__ == "__main__":
    sys.exit(main())
