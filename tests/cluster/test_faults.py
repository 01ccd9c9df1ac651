"""The cluster under faults, with real processes: `wireproto serve --workers 2` paused
(SIGSTOP) for less and for more than its lease, and a NATS outage shorter than a lease.

Each test checks the will invariant (docs/cluster.md, "Leases and fencing"): every will is
published exactly once, and a connection whose will was published is closed before its process
serves it again; and that what is delivered is never duplicated or reordered."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.brokers import LOCAL
from tests.cluster.test_workers import start_supervised, stop_supervised
from tests.support import eventually, sleep, wait_for
from wireproto.cluster.client import NatsClient, NatsOptions

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
            print(f"paused past its lease: wills published {taken:.1f} s after SIGSTOP")
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
        print(f"NATS away 5 s: delivery crossed again {resumed:.1f} s after it was back")
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


THREE_NODES = """
[cluster]
url = "{url}"
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "tcp:0:{local}"
"""


async def crossing(running, nats_cluster, tmp_path):
    """On each worker a connection with a will, a watcher on the other, and a publisher whose
    messages cross from the first worker to the second."""
    first, second = running.pids
    holders, watches = [], []
    for name, mine, others in (("a", first, second), ("b", second, first)):
        holder, _ = await running.client_on(mine)
        holder.set_will(f"gone/{name}", b"bye " + name.encode())
        holders.append(holder)
        watches.append(Watch((await running.client_on(others))[0],
                             ["gone/a", "gone/b", "chat"]))
    await sleep(1.0)
    return holders, watches


async def lead_the_wills_from(node) -> None:
    """Have `node` lead the wills bucket's stream (each step down elects another leader)."""
    client = NatsClient(reactor, NatsOptions(servers=(node.url,)))
    client.start()
    try:
        await wait_for(client.when_ready())
        for _ in range(20):
            _, reply = await wait_for(client.request(
                f"$JS.API.STREAM.INFO.{WILLS}", b"", timeout=5))
            leader = (json.loads(reply).get("cluster") or {}).get("leader")
            if leader == node.server_name:
                await sleep(3.0)  # every process renews its lease with the new leader
                return
            await wait_for(client.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{WILLS}", b"",
                                          timeout=5))
            await sleep(0.5)
        raise AssertionError(f"{node.server_name} never led {WILLS} (last: {leader})")
    finally:
        await wait_for(client.stop())


WILLS = "KV_wireproto_wills"


async def delivery_stops_for(holder, watch, fault, *, bound: float) -> float:
    """Publish a numbered message every 20 ms from `holder` while `fault()` happens; how long
    `watch` received none, once delivery has come back (at most `bound` seconds), and how many
    of the messages it missed."""
    sent: list[float] = []
    started = time.monotonic()
    fault()
    while time.monotonic() - started < bound + 3:
        holder.publish("chat", b"%d" % len(sent))
        sent.append(time.monotonic())
        await sleep(0.02)
    number = len(sent)
    await eventually(lambda: watch.on("chat") and watch.on("chat")[-1] == b"%d" % (number - 1),
                     timeout=15)
    # From the last message delivered before a gap to the first after, as they were sent (and
    # from the fault to the first delivered).
    got = [int(payload) for payload in watch.on("chat")]
    gap = max([sent[got[0]] - started, *(sent[later] - sent[earlier]
                                         for earlier, later in zip(got, got[1:], strict=False))])
    assert in_order_once(watch.on("chat"))
    print(f"{number - len(watch.on('chat'))} of {number} messages missed")
    return gap


@pytest.mark.parametrize("fault", ["kill", "stop"])
@pytest_twisted.ensureDeferred
async def test_a_nats_node_killed_or_paused_keeps_the_will_invariant(tmp_path, nats_cluster,
                                                                     fault):
    """The workers are connected to the first node of a three-node NATS cluster, which leads
    the wills bucket too; it is killed (SIGKILL) or paused (SIGSTOP). They move to another node,
    and delivery comes back. A worker that could not renew its lease within it (a paused node is
    noticed only when its PINGs go unanswered, and the bucket elects a new leader) is fenced: then
    its connection with a will is closed and that will published once; else neither. A worker
    killed afterwards still has its wills published, by the two nodes left."""
    doomed = nats_cluster[0]
    config = tmp_path / "wireproto.toml"
    config.write_text(THREE_NODES.format(url=doomed.url, local=LOCAL))
    running = await start_supervised("--config", str(config))
    try:
        holders, watches = await crossing(running, nats_cluster, tmp_path)
        publisher, _ = await running.client_on(running.pids[0])
        await lead_the_wills_from(doomed)
        signal_number = signal.SIGKILL if fault == "kill" else signal.SIGSTOP
        gap = await delivery_stops_for(
            publisher, watches[0], lambda: os.kill(doomed.process.pid, signal_number),
            bound=10)
        print(f"NATS node {fault}: delivery stopped for {gap:.1f} s")
        assert gap < 10, gap
        await sleep(6.0)  # past the lease, counted from the fault
        # Holder a's will is watched on the second worker, holder b's on the first. A will of a
        # connection closed is published by the claim of its former lease, once JetStream has
        # a leader for the bucket again.
        for holder, watch, topic in ((holders[0], watches[0], "gone/a"),
                                     (holders[1], watches[1], "gone/b")):
            if holder.close_reason is not None:
                await eventually(lambda watch=watch, topic=topic: watch.on(topic), timeout=30)
        await sleep(2.0)
        for holder, watch, topic in ((holders[0], watches[0], "gone/a"),
                                     (holders[1], watches[1], "gone/b")):
            closed = holder.close_reason is not None
            assert watch.on(topic) == ([b"bye " + topic[-1:].encode()] if closed else []), \
                (topic, closed)
        print(f"NATS node {fault}: {sum(h.close_reason is not None for h in holders)} of 2 "
              "connections with a will closed by fencing")
        # The first worker killed: its will is published by the second, where its watcher is.
        os.kill(running.pids[0], signal.SIGKILL)
        killed = time.monotonic()
        await eventually(lambda: watches[0].on("gone/a") == [b"bye a"], timeout=25)
        print(f"worker killed: its will published after {time.monotonic() - killed:.1f} s")
        if holders[1].close_reason is None:
            await wait_for(holders[1].disconnect())
        await eventually(lambda: watches[0].on("gone/b") == [b"bye b"], timeout=10)
        await sleep(2.0)
        assert watches[0].on("gone/a") + watches[0].on("gone/b") == [b"bye a", b"bye b"]
    except BaseException:
        print(running.child.output())
        raise
    finally:
        if fault == "stop" and doomed.process is not None:
            os.kill(doomed.process.pid, signal.SIGCONT)
        await stop_supervised(running.child)


@pytest_twisted.ensureDeferred
async def test_a_pause_near_the_bound_of_the_default_lease_publishes_nothing(tmp_path):
    """With the defaults a pause of up to 8.8 s changes nothing (docs/cluster.md, "Leases and
    fencing": the lease, less a heartbeat since the last renewal and a fiftieth): 7.5 s here,
    the rest for a loaded machine. With a tenth kept off the lease, 8 s was the most."""
    config = tmp_path / "wireproto.toml"
    config.write_text(f"""
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "tcp:0:{LOCAL}"
""")
    running = await start_supervised("--config", str(config))
    try:
        paused, other = running.pids
        watch = Watch((await running.client_on(other))[0], ["gone/a", "chat"])
        holder, _ = await running.client_on(paused)
        holder.set_will("gone/a", b"bye a")
        await sleep(2.0)  # the will reaches the bucket, the lease is renewed
        os.kill(paused, signal.SIGSTOP)
        try:
            await sleep(7.5)
        finally:
            os.kill(paused, signal.SIGCONT)
        await sleep(4.0)
        fenced = [line for line in running.child.stderr if "was fenced" in line]
        assert (watch.on("gone/a"), holder.close_reason, fenced) == ([], None, []), \
            running.child.output()
        holder.publish("chat", b"1")
        await eventually(lambda: watch.on("chat") == [b"1"], timeout=10)
        await wait_for(holder.disconnect())
        await eventually(lambda: watch.on("gone/a") == [b"bye a"], timeout=10)
        await wait_for(watch.client.disconnect())
    finally:
        await stop_supervised(running.child)
