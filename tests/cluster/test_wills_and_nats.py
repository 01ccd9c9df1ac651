"""Faults of the NATS servers the processes join (docs/cluster.md, "Wills", "Leases and
fencing"): a restart that lost its JetStream store, an outage while a connection closes, a
bucket without a leader, a network cut; with real `wireproto serve` processes joined to real
nats-servers."""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest_twisted

from tests.cluster.processes import (
    Observer,
    serve,
    stop,
    wills_stored,
)
from tests.support import eventually, sleep, wait_for


@pytest_twisted.ensureDeferred
async def test_a_quick_nats_restart_that_lost_its_store_publishes_no_will(tmp_path, nats):
    """The NATS server restarted within 2 s, but without its JetStream store (a fresh
    container, a store on tmpfs). The wills are written again on every reconnect, "the server
    may be another one, or have lost them" (docs/cluster.md, "Wills"), and an outage shorter
    than a lease publishes no will."""
    processes = [await serve(tmp_path, name, nats.url) for name in ("a", "b")]
    try:
        holder = await processes[0].client()
        holder.set_will("gone/a", b"bye a")
        watcher = await processes[1].client()
        got: list = []
        watcher.subscribe("gone/a", got.append)
        observer = await Observer(nats.url).start()
        await wills_stored(observer, 1)
        await observer.stop()
        await sleep(1.0)
        nats.stop(kill=True)
        shutil.rmtree(os.path.join(nats.directory, "jetstream"))
        nats.start()
        await sleep(15.0)  # a lease and more
        closed = holder.close_reason is not None
        fenced = [line for each in processes for line in each.lines("was fenced")]
        assert (got, closed, fenced) == ([], False, []), fenced
        observer = await Observer(nats.url).start()
        assert list(await observer.subjects("w.>")) != []  # written again
        await observer.stop()
        await wait_for(holder.disconnect())
        await eventually(lambda: len(got) == 1, timeout=10)
    finally:
        for each in processes:
            await stop(each)


@pytest_twisted.ensureDeferred
async def test_a_will_published_while_nats_is_away_is_not_published_again_later(tmp_path, nats):
    """Fixed: a connection with a will closes while NATS is away for 1.5 s. Its process
    publishes the will (its own subscribers get it) but cannot purge its key, and never does
    once NATS is back: the key stays in the bucket as long as the process lives, and the claim
    of its lease publishes the will again, however long after. Here the process is paused past
    its lease later on, and its subscriber, a connection without a will that fencing keeps,
    gets the same will a second time."""
    processes = [await serve(tmp_path, name, nats.url, heartbeat=0.5, lease=4.0)
                 for name in ("a", "b")]
    try:
        a = processes[0]
        watcher = await a.client()
        got: list = []
        watcher.subscribe("gone/x", got.append)
        holder = await a.client()
        holder.set_will("gone/x", b"bye x")
        observer = await Observer(nats.url).start()
        await wills_stored(observer, 1)
        await observer.stop()
        nats.stop(kill=True)
        await sleep(0.3)
        await wait_for(holder.disconnect())
        await eventually(lambda: len(got) == 1, timeout=5)
        await sleep(1.2)
        nats.start()
        await sleep(5.0)  # back on NATS, its lease renewed
        observer = await Observer(nats.url).start()
        stale = await observer.subjects("w.>")
        print(f"will keys left in the bucket: {stale}")
        os.kill(a.pid, signal.SIGSTOP)
        try:
            await sleep(7.0)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        await sleep(4.0)
        print(f"wills crossing NATS: {observer.wills()}")
        await observer.stop()
        assert (stale, [message.payload for message in got]) == ({}, [b"bye x"])
    finally:
        for each in processes:
            await stop(each)


@pytest_twisted.ensureDeferred
async def test_a_will_set_while_the_bucket_elects_a_leader_is_published_when_its_process_dies(
        tmp_path, nats_cluster):
    """Fixed: a will set in the seconds while the wills bucket has no leader (its leader's
    node just killed) fails ("no responders", logged as "could not keep the will"), and is
    never written again while the process stays on its NATS node: when the process is killed,
    10 s later with the bucket long back, none of those wills is ever published. The bucket has
    three replicas, and the process's own node lived on."""
    from tests.cluster.test_faults import lead_the_wills_from

    leader, *rest = nats_cluster
    processes = [await serve(tmp_path, name, node.url)
                 for name, node in zip(("a", "b"), rest, strict=True)]
    try:
        a, b = processes
        watcher = await b.client()
        got: list = []
        watcher.subscribe("gone/a", got.append)
        await lead_the_wills_from(leader)
        leader.stop(kill=True)
        holders = []
        for number in range(5):  # over the next 2.5 s
            holder = await a.client()
            holder.set_will("gone/a", b"%d" % number)
            holders.append(holder)
            await sleep(0.5)
        # Written again once the bucket has a leader again (seconds; more on a loaded machine).
        observer = await Observer(rest[0].url).start()
        deadline = time.monotonic() + 45
        stored: dict = {}
        while len(stored) < 5 and time.monotonic() < deadline:
            try:
                stored = await observer.subjects("w.>")
            except Exception:  # the bucket without a leader does not answer either
                pass
            await sleep(0.5)
        await observer.stop()
        os.kill(a.pid, signal.SIGKILL)
        killed = time.monotonic()
        await sleep(25.0)
        print(f"{len(stored)} of 5 wills in the bucket before the kill; "
              f"{len(got)} published within {time.monotonic() - killed:.0f} s")
        print("\n".join(a.lines("will")))
        assert sorted(message.payload for message in got) == [b"%d" % n for n in range(5)]
    finally:
        for each in processes:
            await stop(each)


@pytest_twisted.ensureDeferred
async def test_a_process_stopping_during_a_lease_scan_logs_no_warning(tmp_path, nats):
    """Fixed: a process that stops while its look for processes whose lease is over waits on
    NATS (here the server is paused, so that look is in flight when the process closes its
    connection on the way out) logged "looking for processes whose lease is over failed: the
    NATS connection closed": its own stop, not a failure. A Ctrl-C to `serve --workers`'s
    process group now and then caught a worker so, and put that line on the terminal."""
    served = await serve(tmp_path, "a", nats.url, heartbeat=0.5, lease=10.0)
    try:
        await sleep(1.0)  # a scan or two done: the next ones wait on the paused server
        os.kill(nats.process.pid, signal.SIGSTOP)
        await sleep(1.0)
        served.child.process.terminate()
        # Its stop waits on the paused server (a flush, the lease's release: 4 s), then closes.
        assert await served.child.exit_code(30) == 0
    finally:
        os.kill(nats.process.pid, signal.SIGCONT)
        await stop(served)
    assert served.lines("lease is over failed") == [], served.child.stderr
