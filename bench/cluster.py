"""Cluster benchmark: one broker process against `--workers 2`, and what crossing NATS costs, in
one run (docs/cluster.md, docs/performance.md).

1. **Deliveries per second.** `wireproto serve` on one process, then `wireproto serve --workers
   2` (its private nats-server included), each on a WEBSMQ length32 listener. `--publishers`
   publishers and `--subscribers` subscribers connect to the one port, and the supervisor hands
   them to the workers in turn (how many each served is printed); each publisher sends 64-byte
   payloads to the one topic, never more than `--window` messages ahead of the slowest
   subscriber. Every delivery is checked byte by byte. The broker's CPU per delivery counts its
   workers and their nats-server. Then the same load on two processes (bench/_cluster_node.py)
   on a nats-server, each given half the clients (``2 processes, even``): two processes with
   no supervisor between them and their clients, so what crossing NATS costs shows on its own.
2. **Delivery latency.** Two broker processes (bench/_cluster_node.py) on one nats-server. A
   subscriber on the first; a publisher on the first (same process) or on the second (across
   NATS) publishes one message at a time and waits for it: p50 and p99 of the round.
3. **RPC.** A UBRE handler ``echo`` on the first process. A client on the first asks it directly;
   a client on the second is answered across NATS: p50 and p99 of one request at a time.

The measurements take turns (same, cross, same, cross...) so a noisy spell hits both alike.
The run ends with the three goals (`GOALS`), each met or missed, side by side:

- `--workers 2` delivers at least 1.4 times one process's deliveries per second on this 2-core
  machine (the workers, their nats-server and the load generator share the two cores);
- its broker CPU per delivery is at most 1.15 times one process's;
- a publish across NATS takes at most 1.5 times the same-process p50.

    .venv/bin/python bench/cluster.py [--messages N] [--rounds R] [--quick]

This is a benchmark, not a test: tests/test_bench_cluster.py only checks that it delivers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.protocols.basic import Int32StringReceiver, LineOnlyReceiver

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import _harness as harness  # noqa: E402
import pubsub  # noqa: E402
from _harness import BenchError  # noqa: E402

from wireproto.codecs import websmq  # noqa: E402
from wireproto.supervisor.natsserver import NatsServer  # noqa: E402

# name: (what is measured, the goal, whether higher is better)
GOALS = {
    "throughput": ("--workers 2 / 1 process, deliveries per second", 1.4, True),
    "cpu": ("--workers 2 / 1 process, broker CPU per delivery", 1.15, False),
    "latency": ("publish p50, across NATS / same process", 1.5, False),
}
READY = re.compile(r"wireproto: ready")


# -- 1. deliveries per second -------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                text = file.read()
        except OSError:
            continue
        parent = int(text[text.rindex(b")") + 2:].split()[1])
        children.setdefault(parent, []).append(int(entry))
    return children


def tree_cpu(pid: int) -> float:
    """CPU seconds of `pid` and every process below it (workers, their nats-server)."""
    children = _children()
    total, waiting = 0.0, [pid]
    while waiting:
        current = waiting.pop()
        try:
            total += pubsub.cpu_seconds(current)
        except OSError:
            continue
        waiting.extend(children.get(current, ()))
    return total


def spread(pid: int, port: int, local_ports: list[int]) -> list[int]:
    """How many of the connections from `local_ports` to `port` each broker process of `pid`'s
    tree serves, most first (by the inodes of their server ends, from /proc). A process with
    children is the supervisor, which may hold a connection for a moment as it hands it out."""
    wanted = set(local_ports)
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as file:
            for line in file.readlines()[1:]:
                fields = line.split()
                if (int(fields[1].rsplit(":", 1)[1], 16) == port
                        and int(fields[2].rsplit(":", 1)[1], 16) in wanted):
                    inodes.add(f"socket:[{fields[9]}]")
    children, counts, waiting = _children(), [], [pid]
    while waiting:
        current = waiting.pop()
        if current in children:
            waiting.extend(children[current])
            continue
        try:
            links = [os.readlink(f"/proc/{current}/fd/{fd}")
                     for fd in os.listdir(f"/proc/{current}/fd")]
        except OSError:
            continue
        if held := sum(link in inodes for link in links):
            counts.append(held)
    return sorted(counts, reverse=True)


def start_serve(name: str, extra: list[str]) -> pubsub.RunningBroker:
    port = pubsub._free_port()
    command = [sys.executable, "-m", "wireproto", "serve", *extra,
               "--listen", f"websmq+length32@tcp:{port}:interface=127.0.0.1"]
    return pubsub.start_broker(name, command, lambda _: pubsub.Length32Websmq(), ready=READY,
                               address=f"tcp:127.0.0.1:{port}", timeout=60)


SYSTEMS = {"1 process": [], "--workers 2": ["--workers", "2"]}
# Two broker processes on one nats-server, each given half the clients: `--workers 2` as it is
# with its connections spread evenly, which shows what crossing NATS costs on its own.
EVEN = "2 processes, even"


async def _connect(host: str, port: int, client: Any, what: str) -> Any:
    endpoint = TCP4ClientEndpoint(reactor, host, port, timeout=5)
    return await pubsub._within(connectProtocol(endpoint, client), 5, what)


@dataclass
class Target:
    """What the load generator measures: `addresses` its clients are dealt round in turn (one
    shared port, or one per process), and `pids`, whose process trees' CPU is the broker's."""

    name: str
    addresses: list[tuple[str, int]]
    pids: list[int]


async def measure_throughput(broker: Target, publishers: int, subscribers: int,
                             messages: int, window: int
                             ) -> tuple[float, float, float, list[int]]:
    """Deliveries per second, the broker's CPU µs per delivery (its workers and nats-server
    included), the load generator's (this process's), and how many subscribers each broker
    process served."""
    dialect = pubsub.Length32Websmq()
    clients: list[pubsub.BenchClient] = []

    async def connect(client_id: str, index: int) -> pubsub.BenchClient:
        client = pubsub.BenchClient(dialect, client_id)
        host, port = broker.addresses[index % len(broker.addresses)]
        await _connect(host, port, client, f"connecting to {broker.name}")
        clients.append(client)
        await pubsub._within(client.greeted, 5, f"{broker.name} greeting {client_id}")
        return client

    def broker_cpu() -> float:
        return sum(tree_cpu(pid) for pid in broker.pids)

    try:
        senders = [await connect(f"pub-{i}", i) for i in range(publishers)]
        subs = [await connect(f"sub-{i}", i) for i in range(subscribers)]
        for sub in subs:
            sub.transport.write(dialect.subscribe())
        await pubsub._warm_up(senders[0], subs, dialect, timeout=30)
        ports = [sub.transport.getHost().port for sub in subs]
        # Each broker process with its port; a nats-server among the pids serves no client.
        pairs = zip(broker.pids, broker.addresses, strict=False)
        served = sorted((count for pid, (_, port) in pairs
                         for count in spread(pid, port, ports)), reverse=True)
        total = messages * publishers
        frame = dialect.publish(pubsub.PAYLOAD)
        done: defer.Deferred = defer.Deferred()
        sent = [0] * publishers

        def refill() -> None:
            if done.called:
                return
            error = pubsub._first_error(clients)
            if error:
                done.errback(BenchError(error))
                return
            slowest = min(s.counter.delivered for s in subs)
            if slowest >= total:
                done.callback(None)
                return
            room = window - (sum(sent) - slowest)
            if room < max(publishers, window // 4) and sum(sent) + room < total:
                return
            for index, sender in enumerate(senders):
                share = min(room // publishers or 1, messages - sent[index])
                if share > 0:
                    sender.transport.write(frame * share)
                    sent[index] += share

        for client in clients:
            client.on_progress = refill
        cpu_before, started = broker_cpu(), time.perf_counter()
        own_before = time.process_time()
        refill()
        await pubsub._within(done, 120, f"{broker.name}: {total} publishes")
        elapsed = time.perf_counter() - started
        cpu = broker_cpu() - cpu_before
        own = time.process_time() - own_before
        for sub in subs:
            if sub.counter.error or sub.counter.delivered != total:
                raise BenchError(f"{broker.name}, {sub.client_id}: "
                                 f"{sub.counter.error or 'wrong count'}: "
                                 f"{sub.counter.delivered} of {total}")
        deliveries = total * subscribers
        return (deliveries / elapsed, cpu / deliveries * 1e6, own / deliveries * 1e6,
                served)
    finally:
        for client in clients:
            client.close()
        await pubsub._within(defer.DeferredList([c.lost for c in clients]), 5, "closing")


async def measure_even(load: tuple[int, int, int, int]
                       ) -> tuple[float, float, float, list[int]]:
    """`measure_throughput` of two processes (bench/_cluster_node.py) on a nats-server of their
    own, the clients dealt to each in turn; the broker's CPU is theirs and the nats-server's."""
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as folder:
        nats = NatsServer(directory=folder).start()
        nodes: list[Node] = []
        try:
            nodes = [Node(nats.url, "first", echo=False), Node(nats.url, "second", echo=False)]
            assert nats.process is not None
            return await measure_throughput(
                Target(EVEN, [node.addresses["websmq"] for node in nodes],
                       [node.process.pid for node in nodes] + [nats.process.pid]), *load)
        finally:
            for node in nodes:
                node.stop()
            nats.stop()


# -- 2 and 3. latency across NATS ---------------------------------------------------------------


class Pinger(Int32StringReceiver):
    """A WEBSMQ client over length32 that counts what it receives."""

    def __init__(self) -> None:
        self.waiting: defer.Deferred | None = None

    def stringReceived(self, frame: bytes) -> None:
        waiting, self.waiting = self.waiting, None
        if waiting is not None:
            waiting.callback(frame)


class Caller(LineOnlyReceiver):
    """A UBRE client over lines: one request at a time."""

    delimiter = b"\n"

    def __init__(self) -> None:
        self.waiting: defer.Deferred | None = None

    def lineReceived(self, line: bytes) -> None:
        message = json.loads(line)
        if "success" in message or "fail" in message:
            waiting, self.waiting = self.waiting, None
            if waiting is not None:
                waiting.callback(message)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


class Node:
    def __init__(self, url: str, name: str, echo: bool) -> None:
        command = [sys.executable, str(BENCH / "_cluster_node.py"), url, name]
        if echo:
            command.append("--echo")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                                        stdin=subprocess.DEVNULL)
        self.addresses: dict[str, tuple[str, int]] = {}
        for line in self.process.stdout:
            if line.startswith("listening: "):
                _, protocol, _, address = line.split()
                _, host, port = address.rsplit(":", 2)
                self.addresses[protocol] = (host, int(port))
            elif line.strip() == "ready":
                return
        raise BenchError(f"broker process {name} ended before it was ready")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def delivery_latency(subscriber_at: tuple, publisher_at: tuple, count: int) -> list[float]:
    subscriber = await _connect(*subscriber_at, Pinger(), "subscriber")
    publisher = await _connect(*publisher_at, Pinger(), "publisher")
    try:
        topic = "bench/latency"
        subscriber.sendString(websmq.encode(websmq.Subscribe(topic)))
        for _ in range(500):  # until the subscription is live here and on NATS
            subscriber.waiting = defer.Deferred()
            publisher.sendString(websmq.encode_publish(topic, b"probe"))
            try:
                await pubsub._within(subscriber.waiting, 0.05, "probe")
                break
            except BenchError:
                continue
        else:
            raise BenchError("the latency subscription never became live")
        await pubsub._sleep(0.2)  # late probes arrive and are dropped
        subscriber.waiting = None
        times = []
        for index in range(count):
            subscriber.waiting = defer.Deferred()
            started = time.perf_counter()
            publisher.sendString(websmq.encode_publish(topic, b"%d" % index))
            frame = await pubsub._within(subscriber.waiting, 5, "a latency probe")
            times.append(time.perf_counter() - started)
            if websmq.decode(frame).payload != b"%d" % index:
                raise BenchError(f"latency probe {index} came back as {frame!r}")
        return times
    finally:
        subscriber.transport.loseConnection()
        publisher.transport.loseConnection()


async def rpc_latency(at: tuple, count: int) -> list[float]:
    caller = await _connect(*at, Caller(), "UBRE client")
    try:
        times = []
        for index in range(count):
            caller.waiting = defer.Deferred()
            started = time.perf_counter()
            caller.sendLine(json.dumps({"request": "echo", "id": index, "body": index}).encode())
            reply = await pubsub._within(caller.waiting, 5, "an echo")
            times.append(time.perf_counter() - started)
            if reply.get("success") != index or reply.get("body") != index:
                raise BenchError(f"echo {index} answered {reply!r}")
        return times
    finally:
        caller.transport.loseConnection()


# -- the run ----------------------------------------------------------------------------------


async def run(options: argparse.Namespace, out: Any = print) -> dict:
    results: dict[str, Any] = {"throughput": {}, "latency": {}}
    names = [*SYSTEMS, EVEN]
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    generator: dict[str, list[float]] = {name: [] for name in names}
    served: dict[str, list[list[int]]] = {name: [] for name in names}
    load = (options.publishers, options.subscribers, options.messages, options.window)
    for _ in range(options.rounds):
        for name, extra in SYSTEMS.items():
            broker = start_serve(name, extra)
            try:
                measured = await measure_throughput(
                    Target(name, [(broker.host, broker.port)], [broker.pid]), *load)
            finally:
                broker.stop()
            for into, value in zip((rates, cpu, generator, served), measured, strict=True):
                into[name].append(value)
        measured = await measure_even(load)
        for into, value in zip((rates, cpu, generator, served), measured, strict=True):
            into[EVEN].append(value)
    results["cpu"] = {}
    out(f"{'deliveries':<30} {'per second':>12} {'broker CPU µs':>14} {'load CPU µs':>12}")
    for name in names:
        median = statistics.median(rates[name])
        results["throughput"][name] = median
        results["cpu"][name] = statistics.median(cpu[name])
        out(f"{name:<30} {median:>12,.0f} {results['cpu'][name]:>14.2f} "
            f"{statistics.median(generator[name]):>12.2f}")
    results["spread"] = served["--workers 2"]
    out("subscribers per worker, each round: " + ", ".join(
        "/".join(map(str, counts)) for counts in served["--workers 2"]))
    ratio = results["throughput"]["--workers 2"] / results["throughput"]["1 process"]
    results["ratio"] = ratio
    out(f"--workers 2 / 1 process: {ratio:.2f}x")
    even = results["throughput"][EVEN] / results["throughput"]["1 process"]
    out(f"{EVEN} / 1 process: {even:.2f}x, broker CPU per delivery "
        f"{ratio_of(results['cpu'][EVEN], results['cpu']['1 process']):.2f}x")

    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as folder:
        nats = NatsServer(directory=folder).start()
        nodes = []
        try:
            nodes = [Node(nats.url, "first", echo=True), Node(nats.url, "second", echo=False)]
            first, second = nodes
            samples: dict[str, list[float]] = {key: [] for key in (
                "publish, same process", "publish, across NATS", "RPC, same process",
                "RPC, across NATS")}
            for _ in range(options.rounds):
                count = options.latency_count
                samples["publish, same process"] += await delivery_latency(
                    first.addresses["websmq"], first.addresses["websmq"], count)
                samples["publish, across NATS"] += await delivery_latency(
                    first.addresses["websmq"], second.addresses["websmq"], count)
                samples["RPC, same process"] += await rpc_latency(first.addresses["ubre"], count)
                samples["RPC, across NATS"] += await rpc_latency(second.addresses["ubre"], count)
        finally:
            for node in nodes:
                node.stop()
            nats.stop()
    out(f"{'latency':<30} {'p50 µs':>12} {'p99 µs':>14}")
    for name, values in samples.items():
        p50, p99 = percentile(values, 0.5) * 1e6, percentile(values, 0.99) * 1e6
        results["latency"][name] = (p50, p99)
        out(f"{name:<30} {p50:>12,.0f} {p99:>14,.0f}")
    results["goals"] = goals(results)
    out(f"{'goal':<50} {'measured':>9} {'goal':>8}")
    for key, (what, goal, higher) in GOALS.items():
        measured, met = results["goals"][key]
        bound = ">=" if higher else "<="
        out(f"{what:<50} {measured:>8.2f}x {bound:>3} {goal:.2f}x  {'met' if met else 'MISSED'}")
    return results


def ratio_of(value: float, to: float) -> float:
    """`value / to`; infinite, a miss, for a run too short for /proc's ticks to count its CPU."""
    return value / to if to > 0 else float("inf")


def goals(results: dict) -> dict[str, tuple[float, bool]]:
    """Each goal's measured ratio, and whether it is met."""
    latency = results["latency"]
    measured = {
        "throughput": results["ratio"],
        "cpu": ratio_of(results["cpu"]["--workers 2"], results["cpu"]["1 process"]),
        "latency": ratio_of(latency["publish, across NATS"][0],
                            latency["publish, same process"][0]),
    }
    return {key: (value, value >= GOALS[key][1] if GOALS[key][2] else value <= GOALS[key][1])
            for key, value in measured.items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000,
                        help="messages per publisher per round (default 20000)")
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--subscribers", type=int, default=20)
    parser.add_argument("--window", type=int, default=2000,
                        help="publishes in flight ahead of the slowest subscriber")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-count", type=int, default=2000,
                        help="round trips per latency measurement")
    parser.add_argument("--quick", action="store_true", help="one small round (for the tests)")
    options = parser.parse_args(argv)
    if options.quick:
        options.messages, options.rounds, options.latency_count = 500, 1, 50
        options.publishers, options.subscribers, options.window = 2, 4, 200
    return options


def main(argv: list[str] | None = None) -> int:
    return harness.main("cluster.py", run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
