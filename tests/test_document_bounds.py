"""What one decoded document may cost (wireproto.codecs.serialization's bounds), and frames
that come out larger than a connection takes: on a real broker, over real sockets."""

from __future__ import annotations

import time

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.brokers import LOCAL
from tests.support import eventually, wait_for
from wireproto.codecs import websmq
from wireproto.config import config_from_toml
from wireproto.protocols.subble.client import EventFailed
from wireproto.protocols.subble.client import connect as subble_connect


async def addresses_of(broker, *listeners, **tables):
    service, bound = await broker.start(*listeners, **tables)
    return service, {entry.listener.protocol + "+" + entry.listener.transport: entry.address
                     for entry in bound}


@pytest.mark.alone
@pytest_twisted.ensureDeferred
async def test_a_document_of_many_values_is_refused_at_once_and_others_are_not_kept_waiting(
        broker):
    """900,000 one-byte values in 900 KB of msgpack took the broker a quarter of a second each
    (decoded, then written out as JSON); other clients waited for it."""
    service, at = await addresses_of(broker, f"subble+length32@tcp:0:{LOCAL}",
                                     f"websmq+length32@tcp:0:{LOCAL}")
    attacker = await wait_for(subble_connect(reactor, at["subble+length32"], produce=["big"]))
    canary, listener = (await broker.client(at["websmq+length32"]),
                        await broker.client(at["websmq+length32"]))
    echoes: list = []
    listener.subscribe("canary", echoes.append)
    await eventually(lambda: service.hub.subscribers("canary"))
    refusals = [attacker.produce("big", [list(range(100))] * 9000) for _ in range(5)]
    slowest = 0.0
    for number in range(20):
        sent = time.monotonic()
        canary.publish("canary", b"%d" % number)
        await eventually(lambda number=number: len(echoes) > number)
        slowest = max(slowest, time.monotonic() - sent)
    for refusal in refusals:
        with pytest.raises(EventFailed, match="more than 10000 values in one document"):
            await wait_for(refusal)
    # Loose for a busy machine; it took over 2 s before the bound.
    assert slowest < 1.0
    await wait_for(attacker.close())


@pytest_twisted.ensureDeferred
async def test_a_message_larger_in_a_subscribers_format_than_it_takes_is_not_sent_to_it(broker):
    """9,000 small integers are 9 KB of msgpack but 35 KB of JSON: a WEBSMQ subscriber on a
    connection that takes 16 KiB is not sent them, counted, and gets what follows."""
    tables = config_from_toml("[websocket]\nmax_message_size = 16384\n", reactor=reactor)
    service, at = await addresses_of(broker, f"subble+length32@tcp:0:{LOCAL}",
                                     f"websmq+ws@tcp:0:{LOCAL}", websocket=tables.websocket)
    subscriber = await broker.client(at["websmq+ws"])
    received: list = []
    subscriber.subscribe("readings", received.append)
    await eventually(lambda: service.hub.subscribers("readings"))
    producer = await wait_for(subble_connect(reactor, at["subble+length32"],
                                             produce=["readings"]))
    await wait_for(producer.produce("readings", list(range(100)) * 90))
    await wait_for(producer.produce("readings", [1, 2, 3]))
    await eventually(lambda: received)
    assert received == [websmq.Publish("readings", b"[1,2,3]")]
    assert subscriber.connected
    (session,) = [s for s in service.hub.sessions if s.protocol == "websmq"]
    assert session.too_large == 1
    await wait_for(producer.close())
