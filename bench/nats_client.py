"""Which NATS client the cluster should use, measured on the publish path (docs/cluster.md).

One real nats-server, and a subscriber that counts what arrives. Each publisher runs in its own
process, publishes `--count` messages of `--size` bytes as fast as its event loop lets it, and
reports its wall time and CPU time per message:

- wireproto's Twisted NATS client (wireproto.cluster.client) under Twisted's default reactor,
  where the broker runs;
- nats-py under Twisted's asyncio reactor, the other way for a Twisted broker to speak NATS;
- wireproto's client under the asyncio reactor too, which separates the client's cost from the
  reactor's.

Every run must deliver every message to the subscriber, or the figures are not trusted.

    python bench/nats_client.py [--count 200000] [--size 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SUBJECT = "bench.publish"
BATCH = 1000
VARIANTS = {
    "wireproto client, default reactor": ("wireproto", "default"),
    "nats-py, asyncio reactor": ("nats-py", "asyncio"),
    "wireproto client, asyncio reactor": ("wireproto", "asyncio"),
}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_publish(client: str, reactor_name: str, url: str, count: int, size: int) -> dict:
    if reactor_name == "asyncio":
        from twisted.internet import asyncioreactor

        asyncioreactor.install()
    from twisted.internet import defer, reactor, task

    payload = b"x" * size
    result: dict = {}

    async def wireproto_publish() -> None:
        from wireproto.cluster.client import NatsClient, NatsOptions

        nats = NatsClient(reactor, NatsOptions(servers=(url,)))
        nats.start()
        await nats.when_ready()
        started, cpu = time.perf_counter(), _cpu()
        sent = 0
        while sent < count:
            for _ in range(min(BATCH, count - sent)):
                nats.publish(SUBJECT, payload)
            sent += BATCH
            await task.deferLater(reactor, 0, lambda: None)
        await nats.flush()
        result.update(seconds=time.perf_counter() - started, cpu=_cpu() - cpu,
                      dropped=nats.dropped)
        await nats.stop()

    async def natspy_publish() -> None:
        import asyncio

        import nats

        async def run() -> None:
            connection = await nats.connect(url)
            started, cpu = time.perf_counter(), _cpu()
            sent = 0
            while sent < count:
                for _ in range(min(BATCH, count - sent)):
                    await connection.publish(SUBJECT, payload)
                sent += BATCH
                await asyncio.sleep(0)
            await connection.flush()
            result.update(seconds=time.perf_counter() - started, cpu=_cpu() - cpu, dropped=0)
            await connection.close()

        await defer.Deferred.fromFuture(asyncio.ensure_future(run()))

    def main(_reactor: object) -> defer.Deferred:
        return defer.ensureDeferred(
            wireproto_publish() if client == "wireproto" else natspy_publish())

    try:
        task.react(main)
    except SystemExit as exit:
        if exit.code:
            raise
    return result


def child_count(url: str, count: int, idle: float) -> int:
    from twisted.internet import defer, reactor, task

    from wireproto.cluster.client import NatsClient, NatsOptions

    seen = [0]

    async def run(_reactor: object) -> None:
        nats = NatsClient(reactor, NatsOptions(servers=(url,)))
        nats.subscribe(SUBJECT, lambda *_: seen.__setitem__(0, seen[0] + 1))
        nats.start()
        await nats.when_ready()
        await nats.flush()
        print("ready", flush=True)
        last, quiet = -1, time.monotonic()
        while seen[0] < count:
            await task.deferLater(reactor, 0.05, lambda: None)
            if seen[0] != last:
                last, quiet = seen[0], time.monotonic()
            elif time.monotonic() - quiet > idle:
                break
        await nats.stop()

    try:
        task.react(lambda r: defer.ensureDeferred(run(r)))
    except SystemExit as exit:
        if exit.code:
            raise
    return seen[0]


def run_variant(name: str, url: str, options: argparse.Namespace) -> dict:
    client, reactor_name = VARIANTS[name]
    counter = subprocess.Popen(
        [sys.executable, __file__, "--child-count", "--url", url, "--count", str(options.count)],
        stdout=subprocess.PIPE, text=True)
    assert counter.stdout is not None
    if counter.stdout.readline().strip() != "ready":
        raise SystemExit("bench/nats_client: the counting subscriber did not start")
    publisher = subprocess.run(
        [sys.executable, __file__, "--child-publish", client, "--reactor", reactor_name,
         "--url", url, "--count", str(options.count), "--size", str(options.size)],
        capture_output=True, text=True, check=True)
    figures = json.loads(publisher.stdout.strip().splitlines()[-1])
    received = int(counter.communicate(timeout=60)[0].strip().splitlines()[-1])
    if received != options.count:
        raise SystemExit(f"bench/nats_client: {name}: {received} of {options.count} delivered")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url")
    parser.add_argument("--child-publish")
    parser.add_argument("--child-count", action="store_true")
    parser.add_argument("--reactor", default="default")
    options = parser.parse_args(argv)
    if options.child_publish:
        print(json.dumps(child_publish(options.child_publish, options.reactor, options.url,
                                       options.count, options.size)))
        return 0
    if options.child_count:
        print(child_count(options.url, options.count, idle=5.0), flush=True)
        return 0

    from wireproto.supervisor.natsserver import NatsServer

    server = NatsServer(directory=tempfile.mkdtemp(prefix="bench-nats-")).start()
    try:
        best: dict[str, dict] = {}
        for _ in range(options.rounds):
            for name in VARIANTS:
                figures = run_variant(name, server.url, options)
                if name not in best or figures["cpu"] < best[name]["cpu"]:
                    best[name] = figures
    finally:
        server.stop()
    print(f"bench/nats_client: {options.count} publishes of {options.size} bytes, "
          f"best of {options.rounds}")
    print(f"{'publisher':40} {'msg/s':>10} {'CPU us/msg':>11} {'vs first':>9}")
    first = None
    for name, figures in best.items():
        rate = options.count / figures["seconds"]
        cpu = figures["cpu"] / options.count * 1e6
        first = first or cpu
        print(f"{name:40} {rate:10.0f} {cpu:11.2f} {cpu / first:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
