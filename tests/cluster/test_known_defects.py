"""Known defects of the cluster under faults, each found by an outside tester and not fixed yet
(docs/cluster.md, "Leases and fencing": "What is not covered"). Each test is expected to fail,
strictly: once a fix makes it pass, the mark goes and the test stays."""

from __future__ import annotations

import os
import signal

import pytest
import pytest_twisted

from tests.brokers import LOCAL
from tests.cluster.processes import (
    Observer,
    Partition,
    duplicates,
    private_nats,
    serve,
    stop,
    wills_stored,
)
from tests.cluster.test_membership import command_line, descendants
from tests.cluster.test_workers import start_supervised, stop_supervised
from tests.support import sleep, wait_for

NOT_FIXED = pytest.mark.xfail(strict=True, reason="a known defect, not fixed yet")


def nats_server_of(supervisor: int) -> int | None:
    """The pid of the supervisor's nats-server, if it has one now."""
    return next((pid for pid in descendants(supervisor)
                 if command_line(pid)[0].endswith("nats-server")), None)


@NOT_FIXED
@pytest_twisted.ensureDeferred
async def test_the_private_nats_server_killed_brings_back_no_will(tmp_path):
    """Not fixed: the private nats-server killed (SIGKILL, as its supervisor kills a hung one) and
    started again with its data rebuilds the wills bucket with keys that were purged before:
    the will of a connection closed cleanly, already published, comes back (with the first
    value it was ever given, a will it had replaced), and is published again when its worker
    dies. The supervisor's restart is promised to keep the wills, not to revive them."""
    running = await start_supervised("--listen", f"websmq+length32@tcp:0:{LOCAL}")
    supervisor = running.child.process.pid
    try:
        doomed, other = running.pids
        url, seed = private_nats(supervisor)
        observer = await Observer(url, seed).start()
        kept, _ = await running.client_on(doomed)
        kept.set_will("gone/kept-first", b"bye")
        kept.set_will("gone/kept", b"bye")
        closing, _ = await running.client_on(doomed)
        closing.set_will("gone/closing-first", b"bye")
        closing.set_will("gone/closing", b"bye")
        await wills_stored(observer, 2)
        await sleep(0.5)
        await wait_for(closing.disconnect())
        while len(await observer.subjects("w.>")) != 1:
            await sleep(0.1)
        await observer.stop()
        server = nats_server_of(supervisor)
        assert server is not None
        os.kill(server, signal.SIGKILL)
        while nats_server_of(supervisor) in (server, None):
            await sleep(0.1)
        await sleep(3.0)  # the workers are back on it
        observer = await Observer(url, seed).start()
        keys = await observer.subjects("w.>")
        print(f"will keys after the restart: {keys}")
        os.kill(doomed, signal.SIGKILL)
        await sleep(18.0)  # its lease, and the other worker's claim
        published = sorted(subject for subject, _ in observer.wills())
        print(f"published after the kill: {published}")
        await observer.stop()
        assert (len(keys), published) == (1, ["wireproto.topic.gone.kept"])
    finally:
        await stop_supervised(running.child)


@NOT_FIXED
@pytest_twisted.ensureDeferred
async def test_a_process_cut_off_from_nats_keeps_the_will_invariant(tmp_path, nats):
    """Not fixed: one process cut off from NATS for 15 s by the network (every byte lost, nothing
    refused); the other process stays. A connection whose will was in the bucket is closed and
    its will published once (that holds). But a will set in the instant the network was cut
    (its write lost on the way; the process learns 2 s later, logging "could not keep the will
    ... the NATS connection closed") is taken at the fencing for one the bucket may have: its
    connection is closed ("closed the 2 connections whose wills were kept"), and its will is
    never published, by anyone. A will that never reached the bucket is promised to keep its
    connection open, under the new identity."""
    partition = Partition(nats.url)
    a = await serve(tmp_path, "a", partition.url)
    b = await serve(tmp_path, "b", nats.url)
    try:
        watcher = await b.client()
        got: list = []
        watcher.subscribe("gone/stored", got.append)
        watcher.subscribe("gone/late", got.append)
        stored = await a.client()
        stored.set_will("gone/stored", b"bye")
        observer = await Observer(nats.url).start()
        await wills_stored(observer, 1)
        await sleep(1.0)
        late = await a.client()
        partition.cut = True
        late.set_will("gone/late", b"bye")
        await sleep(15.0)
        partition.heal()
        await sleep(15.0)
        topics = sorted(message.topic for message in got)
        print(f"wills: {topics}; closed: stored {stored.close_reason is not None}, "
              f"late {late.close_reason is not None}")
        print("\n".join(a.lines("cluster")))
        assert stored.close_reason is not None and topics.count("gone/stored") == 1
        assert topics.count("gone/late") == (1 if late.close_reason is not None else 0)
        assert duplicates(observer.wills()) == {}
        await observer.stop()
    finally:
        await stop(a)
        await stop(b)
        await partition.close()
