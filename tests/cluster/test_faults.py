"""The cluster under faults, with real processes: `wireproto serve --workers 2` paused
(SIGSTOP) for less and for more than its lease, and a NATS outage shorter than a lease.

Each test checks the will invariant (docs/cluster.md, "Leases and fencing"): every will is
published exactly once, and a connection whose will was published is closed before its process
serves it again; and that what is delivered is never duplicated or reordered."""

from __future__ import annotations

import os
import signal
import time

import pytest_twisted

from tests.brokers import LOCAL
from tests.cluster.test_workers import start_supervised, stop_supervised
from tests.support import eventually, sleep, wait_for

# A short lease, so that a pause longer than it stays short: renewed every 0.5 s, over after 4.
SHORT_LEASE = """
[cluster]
heartbeat_interval = 0.5
lease = 4.0
{more}
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "tcp:0:{local}"
"""


async def supervised_with(tmp_path, more: str = ""):
    config = tmp_path / "wireproto.toml"
    config.write_text(SHORT_LEASE.format(more=more, local=LOCAL))
    return await start_supervised("--config", str(config))


class Watch:
    """A client that subscribes to `topics` and notes when each message came."""

    def __init__(self, client, topics) -> None:
        self.client = client
        self.received: list[tuple[float, str, bytes]] = []
        for topic in topics:
            client.subscribe(topic, self._got)

    def _got(self, message) -> None:
        self.received.append((time.monotonic(), message.topic, message.payload))

    def on(self, topic: str) -> list[bytes]:
        return [payload for _, got, payload in self.received if got == topic]


def in_order_once(payloads: list[bytes]) -> bool:
    numbers = [int(payload) for payload in payloads]
    return numbers == sorted(set(numbers))


@pytest_twisted.ensureDeferred
async def test_a_pause_shorter_than_the_lease_publishes_no_will(tmp_path):
    running = await supervised_with(tmp_path)
    try:
        paused, other = running.pids
        watch = Watch((await running.client_on(other))[0], ["gone/a", "chat"])
        holder, _ = await running.client_on(paused)
        holder.set_will("gone/a", b"bye a")
        await sleep(1.0)  # the will reaches the bucket
        os.kill(paused, signal.SIGSTOP)
        await sleep(1.5)
        os.kill(paused, signal.SIGCONT)
        await sleep(6.0)  # a whole lease and more after the pause
        assert watch.on("gone/a") == []
        # The connection was never closed, and it is served.
        holder.publish("chat", b"1")
        await eventually(lambda: watch.on("chat") == [b"1"], timeout=10)
        await wait_for(holder.disconnect())
        await eventually(lambda: watch.on("gone/a") == [b"bye a"], timeout=10)
        await sleep(6.0)
        assert watch.on("gone/a") == [b"bye a"]
        assert not any("cluster_fenced" in line or "was fenced" in line
                       for line in running.child.stderr), running.child.output()
        await wait_for(watch.client.disconnect())
    finally:
        await stop_supervised(running.child)


@pytest_twisted.ensureDeferred
async def test_a_pause_longer_than_the_lease_fences_the_process(tmp_path):
    running = await supervised_with(tmp_path)
    try:
        paused, other = running.pids
        watch = Watch((await running.client_on(other))[0], ["gone/a", "gone/b", "gone/c"])
        holders = []
        for name in ("a", "b"):
            holder, _ = await running.client_on(paused)
            holder.set_will(f"gone/{name}", b"bye " + name.encode())
            holders.append(holder)
        # Two subscribers on the paused worker: one with a will (it is closed), one without
        # (it stays, and is served).
        kept, _ = await running.client_on(paused)
        to_kept: list = []
        kept.subscribe("chat", to_kept.append)
        to_holder: list = []
        holders[0].subscribe("chat", to_holder.append)
        publisher, _ = await running.client_on(other)
        await sleep(1.0)
        publisher.publish("chat", b"0")
        await eventually(lambda: len(to_kept) == 1 and len(to_holder) == 1, timeout=10)

        os.kill(paused, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            # The other worker publishes both wills once the lease is over (4 s, one renewal
            # late at most, and its next look at the bucket).
            await eventually(lambda: len(watch.on("gone/a")) + len(watch.on("gone/b")) == 2,
                             timeout=15)
            taken = time.monotonic() - stopped
            assert 3.0 < taken < 12.0, taken
            # Published while the worker sleeps: every later message is after its will.
            for number in range(1, 6):
                publisher.publish("chat", b"%d" % number)
            await sleep(0.5)
        finally:
            os.kill(paused, signal.SIGCONT)
        for holder in holders:
            await wait_for(holder.when_closed(), 15)
        await eventually(lambda: len(to_kept) == 6, timeout=15)
        publisher.publish("chat", b"6")
        await eventually(lambda: len(to_kept) == 7, timeout=10)
        assert [message.payload for message in to_kept] == [b"%d" % n for n in range(7)]
        # The connection whose will was published heard nothing published after it.
        assert [message.payload for message in to_holder] == [b"0"]
        assert any("was fenced" in line for line in running.child.stderr), \
            running.child.output()

        # Its new identity: a later death of the same worker is seen, its new will published.
        late, _ = await running.client_on(paused)
        late.set_will("gone/c", b"bye c")
        await sleep(1.0)
        os.kill(paused, signal.SIGKILL)
        await eventually(lambda: watch.on("gone/c") == [b"bye c"], timeout=20)
        await sleep(5.0)  # a lease and more: nothing is published twice
        assert sorted(watch.on("gone/a") + watch.on("gone/b") + watch.on("gone/c")) == [
            b"bye a", b"bye b", b"bye c"]
        await wait_for(watch.client.disconnect())
        await wait_for(kept.disconnect())
        await wait_for(publisher.disconnect())
    finally:
        await stop_supervised(running.child)


@pytest_twisted.ensureDeferred
async def test_a_nats_outage_shorter_than_the_lease_fences_no_one(tmp_path, nats):
    """The default lease (10 s) outlives a NATS server away for 5 s: no will is published, no
    connection closed, and publishes cross again once it is back."""
    config = tmp_path / "wireproto.toml"
    config.write_text(f"""
[cluster]
url = "{nats.url}"
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "tcp:0:{LOCAL}"
""")
    running = await start_supervised("--config", str(config))
    try:
        first, second = running.pids
        # On each worker a connection with a will, and one that watches the other's.
        holders, watches = [], []
        for name, mine, others in (("a", first, second), ("b", second, first)):
            holder, _ = await running.client_on(mine)
            holder.set_will(f"gone/{name}", b"bye " + name.encode())
            holders.append(holder)
            watches.append(Watch((await running.client_on(others))[0],
                                 ["gone/a", "gone/b", "chat"]))
        holder, watch = holders[0], watches[0]
        await sleep(1.0)
        holder.publish("chat", b"0")
        await eventually(lambda: watch.on("chat") == [b"0"], timeout=10)

        nats.stop(kill=True)
        await sleep(5.0)
        nats.start()
        back = time.monotonic()
        number = 1
        # Publishes made before both workers are back on NATS are dropped (at most once):
        # publish until one crosses.
        while not watch.on("chat")[1:]:
            assert time.monotonic() - back < 15, "delivery did not resume"
            holder.publish("chat", b"%d" % number)
            number += 1
            await sleep(0.1)
        resumed = time.monotonic() - back
        for _ in range(20):
            holder.publish("chat", b"%d" % number)
            number += 1
        await eventually(lambda: watch.on("chat")[-1] == b"%d" % (number - 1), timeout=10)
        assert in_order_once(watch.on("chat"))
        assert resumed < 10, resumed
        await sleep(8.0)  # past the lease, counted from the outage
        for each in watches:
            assert each.on("gone/a") + each.on("gone/b") == []
        for each in holders:
            assert each.connected and each.close_reason is None
        assert not any("was fenced" in line for line in running.child.stderr)
        for each in holders:
            await wait_for(each.disconnect())
        for each in watches:
            await eventually(lambda each=each: sorted(each.on("gone/a") + each.on("gone/b"))
                             == [b"bye a", b"bye b"], timeout=10)
            await wait_for(each.client.disconnect())
    finally:
        await stop_supervised(running.child)
