"""What an attacker's connections cost the broker stays bounded after it leaves: a broker process
that held 8 addresses' worth of subscriptions reuses that memory for the next such crowd rather
than growing again. Real process, real sockets from 127.0.0.2-9, its RSS from /proc."""

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


def test_memory_an_attacking_crowd_took_is_reused_after_it_leaves():
    broker = Child(sys.executable, "-m", "wireproto", "serve",
                   "--listen", "websmq+length32@tcp:0:interface=127.0.0.1",
                   "--listen", "websmq+ws@tcp:0:interface=127.0.0.1")
    try:
        deadline = time.monotonic() + 30
        while not any("ready" in line for line in broker.stdout):
            assert time.monotonic() < deadline and broker.process.poll() is None, \
                broker.output()
            time.sleep(0.05)
        addresses = [line.rsplit(" ", 1)[1] for line in broker.stdout if " over " in line]
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
