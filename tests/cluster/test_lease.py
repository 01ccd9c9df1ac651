"""Leases and fencing on a real nats-server (docs/cluster.md, "Leases and fencing"): a renewal
and a claim are conditional writes of one key, so exactly one wins; a process counts its lease by
its own clock; a process whose lease was claimed closes the connections whose wills it kept,
leaves their wills to the claim, and goes on under a new identity."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.cluster.test_link import cluster_broker
from tests.support import eventually, sleep, wait_for
from wireproto.cluster.client import NatsClient, NatsOptions
from wireproto.cluster.lease import (
    WRONG_LAST_SEQUENCE,
    JetStreamRefused,
    Lease,
    lease_record,
    write_if_at,
)

BUCKET = "test_wills"
STREAM = f"KV_{BUCKET}"


async def bucket_client(nats) -> NatsClient:
    client = NatsClient(reactor, NatsOptions(servers=(nats.url,)))
    client.start()
    await wait_for(client.when_ready())
    config = {"name": STREAM, "subjects": [f"$KV.{BUCKET}.>"], "max_msgs_per_subject": 1,
              "allow_direct": True, "storage": "memory"}
    _, reply = await wait_for(client.request(f"$JS.API.STREAM.CREATE.{STREAM}",
                                             json.dumps(config).encode(), timeout=5))
    assert "error" not in json.loads(reply), reply
    return client


@pytest_twisted.ensureDeferred
async def test_of_two_writes_at_one_sequence_exactly_one_wins(nats):
    client = await bucket_client(nats)
    try:
        key = f"$KV.{BUCKET}.l.p1"
        first = await wait_for(write_if_at(client, key, b"born", 0, timeout=5))
        results = await wait_for(_both(
            write_if_at(client, key, b"renewal", first, timeout=5),
            write_if_at(client, key, b"claim", first, timeout=5)))
        won = [result for result in results if isinstance(result, int)]
        lost = [result for result in results if isinstance(result, JetStreamRefused)]
        assert len(won) == 1 and len(lost) == 1
        assert lost[0].code == WRONG_LAST_SEQUENCE
    finally:
        await wait_for(client.stop())


def _both(*deferreds):
    from twisted.internet import defer

    return defer.gatherResults([d.addErrback(lambda failure: failure.value)
                                for d in deferreds])


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest_twisted.ensureDeferred
async def test_a_lease_is_over_by_its_own_clock_before_anyone_else_can_judge_it(nats):
    client = await bucket_client(nats)
    clock = FakeClock()
    try:
        lease = Lease(client, bucket=BUCKET, stream=STREAM, holder="p1", node="n",
                      duration=10.0, now=clock)
        assert not lease.expired()  # not in force before the bucket is there
        lease.start()
        lease.renew()
        await eventually(lambda: lease.sequence > 0)
        # Counted from when the renewal was sent, less a fiftieth: at 9.8 s it is over here,
        # while another process counts 10 s from when it saw it.
        clock.now += 9.7
        assert not lease.expired()
        clock.now += 0.2
        assert lease.expired()
        # A renewal that lands extends it from when it was sent.
        lease.renew()
        sequence = lease.sequence
        await eventually(lambda: lease.sequence > sequence)
        assert not lease.expired()
    finally:
        await wait_for(client.stop())


@pytest_twisted.ensureDeferred
async def test_a_renewal_refused_because_the_lease_was_claimed_loses_it(nats):
    client = await bucket_client(nats)
    try:
        lease = Lease(client, bucket=BUCKET, stream=STREAM, holder="p1", node="n",
                      duration=10.0)
        lost: list[str] = []
        lease.on_lost = lost.append
        lease.start()
        lease.renew()
        await eventually(lambda: lease.sequence > 0)
        await wait_for(write_if_at(client, lease.subject,
                                   lease_record("p2", "m", 10.0, takes="p1"),
                                   lease.sequence, timeout=5))
        lease.renew()
        await eventually(lambda: lost)
        assert lost == ["another process took its lease over"] and lease.expired()
    finally:
        await wait_for(client.stop())


@pytest_twisted.ensureDeferred
async def test_a_renewal_whose_acknowledgement_was_lost_keeps_the_lease(nats):
    client = await bucket_client(nats)
    try:
        lease = Lease(client, bucket=BUCKET, stream=STREAM, holder="p1", node="n",
                      duration=10.0)
        lost: list[str] = []
        lease.on_lost = lost.append
        lease.start()
        lease.renew()
        await eventually(lambda: lease.sequence > 0)
        # Its own record written once more, as a renewal whose answer never came would be.
        newer = await wait_for(write_if_at(client, lease.subject, lease.record, lease.sequence,
                                           timeout=5))
        lease.renew()
        await eventually(lambda: lease.sequence == newer)
        lease.renew()
        await eventually(lambda: lease.sequence > newer)
        assert lost == [] and not lease.expired()
    finally:
        await wait_for(client.stop())


@pytest.mark.parametrize("how", ["claimed", "own clock"])
@pytest_twisted.ensureDeferred
async def test_a_fenced_process_closes_the_connections_whose_wills_it_kept(broker, nats, how):
    fenced, at_fenced = await cluster_broker(broker, nats)
    other, at_other = await cluster_broker(broker, nats)
    watcher = await broker.client(at_other["websmq+ws"])
    wills: list = []
    watcher.subscribe("gone/a", wills.append)
    watcher.subscribe("gone/b", wills.append)
    holder = await broker.client(at_fenced["websmq+ws"])
    holder.set_will("gone/a", b"bye a")
    plain = await broker.client(at_fenced["websmq+ws"])
    await eventually(lambda: all(held.stored for held in fenced.cluster.wills.held.values())
                     and len(fenced.cluster.wills.held) == 1)
    await eventually(lambda: fenced.cluster.lease.sequence > 0)
    link = fenced.cluster
    former = link.origin_token
    if how == "claimed":
        # The other process claims the lease at the sequence it is at.
        link.lease.on_renewed = None
        await wait_for(other.cluster.wills._claim(former, link.lease.sequence))
    else:
        # Its clock says its lease may be over (as after a long pause).
        link.lease.valid_until = 0
    await wait_for(holder.when_closed(), 10)
    await eventually(lambda: len(wills) == 1)
    assert [message.payload for message in wills] == [b"bye a"]
    assert link.origin_token != former and link.stats().fenced == 1
    # The connection without a will is still served.
    received: list = []
    plain.subscribe("chat", received.append)
    await sleep(0.3)
    publisher = await broker.client(at_other["websmq+ws"])
    publisher.publish("chat", b"hi")
    await eventually(lambda: received)
    # A will set after the fencing is kept under the new identity, and published once.
    plain.set_will("gone/b", b"bye b")
    await eventually(lambda: link.wills.held and all(
        held.stored and held.origin == link.origin_token for held in link.wills.held.values()))
    await wait_for(plain.disconnect())
    await eventually(lambda: len(wills) == 2)
    await sleep(1.5)  # a lease and more
    assert sorted(message.payload for message in wills) == [b"bye a", b"bye b"]


@pytest_twisted.ensureDeferred
async def test_a_process_holding_no_will_is_not_fenced_by_its_clock_alone(broker, nats):
    """Late renewals (a loaded machine) put nothing at risk while no will is held: the process
    goes on under its identity, and its calls' callers do not see it go; once it holds a will,
    the same clock fences it."""
    process, at_process = await cluster_broker(broker, nats)
    link = process.cluster
    await eventually(lambda: link.lease.sequence > 0)
    former = link.origin_token
    link.lease.valid_until = 0  # its renewals came late
    await sleep(1.0)  # five heartbeats
    assert link.stats().fenced == 0 and link.origin_token == former
    assert not link.lease.expired()  # a renewal landed, and the lease runs from it again
    link.lease.valid_until = 0
    holder = await broker.client(at_process["websmq+ws"])
    holder.set_will("gone/a", b"bye a")
    await eventually(lambda: link.stats().fenced == 1)
    assert link.origin_token != former
