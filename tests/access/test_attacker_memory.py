"""What an attacker's connections cost the broker stays bounded: a broker process that held 8
addresses' worth of subscriptions reuses that memory for the next such crowd rather than growing
again, and one connection publishing on endless long topics pins nothing. Real process, real
sockets (from 127.0.0.2-9), its RSS from /proc."""

from __future__ import annotations

import re
import socket
import struct
import sys
import time
import urllib.request

from tests.test_cli import Child
from wireproto.codecs import websmq

ADDRESSES = [f"127.0.0.{host}" for host in range(2, 10)]
CONNECTIONS = 40  # per address
TOPICS = 60  # per connection, of 1000 bytes: just under max_subscription_bytes (64 KiB)


def rss_mib(pid: int) -> float:
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024


def topics_gauge(base: str) -> int:
    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    return int(float(re.search(r"^wireproto_hub_topics (\S+)", text, re.M).group(1)))


def settle(base: str, timeout: float = 60) -> int:
    """The hub's topic count once it stops changing."""
    deadline, last = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        now = topics_gauge(base)
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    raise AssertionError("the broker's topics did not settle")


def crowd(port: int, round_: int) -> list[socket.socket]:
    sockets = []
    for address in ADDRESSES:
        for number in range(CONNECTIONS):
            connection = socket.create_connection(("127.0.0.1", port), timeout=10,
                                                  source_address=(address, 0))
            frames = (websmq.encode(websmq.Subscribe(
                f"{round_}/{address}/{number}/{topic}/".ljust(1000, "x")))
                for topic in range(TOPICS))
            connection.sendall(b"".join(struct.pack(">I", len(f)) + f for f in frames))
            sockets.append(connection)
    return sockets


def start_broker(*arguments: str) -> tuple[Child, list[str]]:
    broker = Child(sys.executable, "-m", "wireproto", "serve", *arguments)
    deadline = time.monotonic() + 30
    while not any("ready" in line for line in broker.stdout):
        if time.monotonic() > deadline or broker.process.poll() is not None:
            broker.kill()
            raise AssertionError(broker.output())
        time.sleep(0.05)
    return broker, [line.rsplit(" ", 1)[1] for line in broker.stdout if " over " in line]


def test_memory_an_attacking_crowd_took_is_reused_after_it_leaves():
    broker, addresses = start_broker("--listen", "websmq+length32@tcp:0:interface=127.0.0.1",
                                     "--listen", "websmq+ws@tcp:0:interface=127.0.0.1")
    try:
        port = int(next(a for a in addresses if a.startswith("tcp:")).rsplit(":", 1)[1])
        base = "http://" + next(a for a in addresses if a.startswith("ws:")).split("/")[2]
        start = rss_mib(broker.process.pid)
        peaks, after = [], []
        for round_ in range(2):
            sockets = crowd(port, round_)
            assert settle(base) == len(ADDRESSES) * CONNECTIONS * TOPICS
            peaks.append(rss_mib(broker.process.pid))
            for connection in sockets:
                connection.close()
            assert settle(base) == 0
            after.append(rss_mib(broker.process.pid))
        took = peaks[0] - start
        assert took > 15, (start, peaks)  # the crowd did cost something
        # The second crowd fits in what the first left behind.
        assert peaks[1] <= peaks[0] + 0.1 * took, (start, peaks, after)
        assert after[1] <= peaks[0] + 0.1 * took, (start, peaks, after)
    finally:
        broker.kill()


def framed(*messages: websmq.Message) -> bytes:
    return b"".join(struct.pack(">I", len(data)) + data for data in map(websmq.encode, messages))


def test_one_connection_publishing_on_endless_long_topics_pins_nothing(tmp_path):
    """With access rules, each connection remembers its publish decisions: 1,024 publishes on
    distinct 16 KB topics pinned 18 MB. A topic longer than max_topic_length now closes the
    connection, and what is remembered is bounded in characters."""
    config = tmp_path / "broker.toml"
    config.write_text(
        '[auth]\n[[listen]]\nprotocol = "websmq"\ntransport = "length32"\n'
        'endpoint = "tcp:0:interface=127.0.0.1"\nprincipal = "device"\n'
        '[[acl]]\nprincipal = "device"\npublish = ["#"]\nsubscribe = ["sync"]\n')
    broker, addresses = start_broker("--config", str(config))
    port = int(addresses[0].rsplit(":", 1)[1])
    listener = socket.create_connection(("127.0.0.1", port), timeout=10)
    publisher = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        listener.sendall(framed(websmq.Subscribe("sync")))
        rounds = iter(range(1000))

        def synced() -> None:
            """Once the broker has handled everything `publisher` sent before."""
            marker = b"%d" % next(rounds)
            time.sleep(0.2)  # the subscribe first
            publisher.sendall(framed(websmq.Publish("sync", marker)))
            expected, got = framed(websmq.Publish("sync", marker)), b""
            while not got.endswith(expected):
                got += listener.recv(65536)

        synced()
        before = rss_mib(broker.process.pid)
        long_topics = (websmq.Publish(f"{n}/".ljust(16_000, "x"), b"v") for n in range(1024))
        too_long = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            too_long.sendall(framed(*long_topics))
        except OSError:
            pass  # closed while it was still sending
        too_long.settimeout(10)
        assert too_long.recv(65536) == b""  # closed by the broker
        too_long.close()
        for start in range(0, 4096, 512):
            publisher.sendall(framed(*(websmq.Publish(f"{n}/".ljust(1000, "y"), b"v")
                                       for n in range(start, start + 512))))
        synced()
        grew = rss_mib(broker.process.pid) - before
        assert grew < 4, f"{grew:.1f} MiB"
    finally:
        listener.close()
        publisher.close()
        broker.kill()


def test_what_one_connection_can_cost_at_the_defaults(tmp_path):
    """docs/security.md, "What one connection can cost": 16 connections each take everything
    the defaults let one hold at rest (1,000 subscriptions on 64 KB of topics, a will of
    almost 1 MiB, publish decisions on 200 topics of 1,000 characters, a send queue it does not
    read filled past 1 MiB), and the broker grows by at most 3.5 MiB for each (measured: 2.5)."""
    config = tmp_path / "broker.toml"
    config.write_text(
        '[auth]\n[[listen]]\nprotocol = "websmq"\ntransport = "length32"\n'
        'endpoint = "tcp:0:interface=127.0.0.1"\nprincipal = "device"\n'
        '[[acl]]\nprincipal = "device"\npublish = ["#"]\nsubscribe = ["#"]\n'
        # One principal's limits for all its connections together are not what is measured.
        '[limits]\nsubscriptions = 0\nmax_share = 1.0\n')
    broker, addresses = start_broker("--config", str(config))
    port = int(addresses[0].rsplit(":", 1)[1])
    connections: list[socket.socket] = []
    try:
        time.sleep(0.5)
        before = rss_mib(broker.process.pid)
        for number in range(16):
            connection = socket.create_connection(("127.0.0.1", port), timeout=10)
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            topics = [f"{number}/{n:03d}/".ljust(64, "s") for n in range(1000)]
            connection.sendall(framed(
                *(websmq.Subscribe(topic) for topic in topics),
                websmq.LastWill(f"{number}/will", b"w" * (1_048_576 - 64)),
                *(websmq.Publish(f"{number}/{n}/".ljust(1000, "p"), b"") for n in range(200)),
            ))
            connections.append(connection)
        # Every connection reads nothing: its send queue fills, past the kernel's buffers,
        # with messages of its own (one message queued for many costs its bytes once).
        publisher = socket.create_connection(("127.0.0.1", port), timeout=10)
        for _ in range(96):
            publisher.sendall(framed(*(websmq.Publish(f"{number}/000/".ljust(64, "s"),
                                                      b"f" * 65_536) for number in range(16))))
        time.sleep(3)
        grew = rss_mib(broker.process.pid) - before
        print(f"one connection: {grew / len(connections):.2f} MiB")
        assert grew / len(connections) < 3.5, f"{grew:.1f} MiB for {len(connections)}"
        publisher.close()
    finally:
        for connection in connections:
            connection.close()
        broker.kill()
