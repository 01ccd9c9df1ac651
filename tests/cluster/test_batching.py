"""What a process sends to NATS in one reactor turn goes out as one write at the turn's end
(wireproto.cluster.connection): against a real nats-server, and real `wireproto serve`
processes, the batch keeps each publisher's order, a batch larger than one write arrives whole,
a batch cut by the loss of the connection is never sent twice nor on the next connection, and a
message over the server's max_payload is refused alone."""

from __future__ import annotations

import os
import signal

import pytest_twisted
from twisted.internet import reactor

from tests.cluster.processes import Observer, Partition, _Downstream, serve, stop
from tests.support import eventually, sleep, wait_for
from wireproto.cluster.client import NatsClient, NatsOptions
from wireproto.cluster.connection import BATCH_LIMIT
from wireproto.supervisor.natsserver import NatsServer


async def nats_client(url: str) -> NatsClient:
    client = NatsClient(reactor, NatsOptions(servers=(url,), reconnect_wait=0.05,
                                             max_reconnect_wait=0.2))
    client.start()
    return await wait_for(client.when_ready(), 10)


class Received:
    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def __call__(self, subject, reply, headers, payload) -> None:
        self.payloads.append(payload)


async def subscribed(url: str, subject: str) -> tuple[NatsClient, Received]:
    client = await nats_client(url)
    received = Received()
    client.subscribe(subject, received)
    await wait_for(client.flush())
    return client, received


def numbers(payloads: list[bytes]) -> list[int]:
    return [int(payload.split(b":")[0]) for payload in payloads]


class _Recording(_Downstream):
    def dataReceived(self, data: bytes) -> None:
        self.partition.recorded += data  # type: ignore[attr-defined]
        super().dataReceived(data)


class Recorder(Partition):
    """A proxy in front of a NATS server that keeps every byte its clients send."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.recorded = bytearray()

    def buildProtocol(self, addr) -> _Downstream:
        return _Recording(self)

    def commands(self) -> list[bytes]:
        """The client's commands, each by its first word, PUBs and HPUBs with their payload's
        number (``HPUB 7``)."""
        found, data = [], bytes(self.recorded)
        position = 0
        while position < len(data):
            end = data.index(b"\r\n", position)
            line = data[position:end].split()
            position = end + 2
            if line[0] in (b"PUB", b"HPUB"):
                size, headers = int(line[-1]), int(line[-2]) if line[0] == b"HPUB" else 0
                payload = data[position + headers:position + size]
                position += size + 2
                found.append(line[0] + b" " + payload.split(b":")[0])
            else:
                found.append(line[0])
        return found


@pytest_twisted.ensureDeferred
async def test_a_turns_publishes_cross_to_the_other_process_in_each_publishers_order(
        tmp_path, nats):
    first = await serve(tmp_path, "first", nats.url)
    second = await serve(tmp_path, "second", nats.url)
    observer = await Observer(nats.url).start()
    try:
        subscriber = await second.client()
        got: dict[str, list[int]] = {"a": [], "b": [], "c": []}
        probes: list[bytes] = []

        def received(message) -> None:
            if message.payload[1:2] == b"-":
                probes.append(message.payload)
            else:
                got[message.payload[:1].decode()].append(int(message.payload[1:]))

        subscriber.subscribe("batch", received)
        publishers = [await first.client() for _ in range(3)]
        # The subscription reaches the first process through NATS: probe until it crosses.
        probe = await first.client()
        for _ in range(100):
            probe.publish("batch", b"a-1")
            await sleep(0.05)
            if probes:
                break
        # 3 publishers x 400, interleaved, written in one turn of this test: the first
        # process reads them in a few turns and forwards each turn's as one batch.
        for index in range(400):
            for name, publisher in zip("abc", publishers, strict=True):
                publisher.publish("batch", b"%s%d" % (name.encode(), index))
        await eventually(lambda: all(len(values) == 400 for values in got.values()), 30)
        for name, values in got.items():
            assert values == list(range(400)), name
        # On NATS too (a plain subscriber there), in each publisher's order, from one origin.
        def crossed() -> list[tuple[str | None, bytes]]:
            return [(origin, payload) for _, subject, origin, _, payload in observer.seen
                    if subject.endswith(".batch") and payload[1:2] != b"-"]

        await eventually(lambda: len(crossed()) >= 1200, 10)
        assert len({origin for origin, _ in crossed()}) == 1
        for name in "abc":
            assert [int(payload[1:]) for _, payload in crossed()
                    if payload[:1] == name.encode()] == list(range(400)), name
    finally:
        await observer.stop()
        await stop(first)
        await stop(second)


@pytest_twisted.ensureDeferred
async def test_what_a_turn_sends_reaches_the_server_in_the_order_it_was_sent(nats):
    recorder = Recorder(nats.url)
    publisher = await nats_client(recorder.url)
    try:
        await wait_for(publisher.flush())
        del recorder.recorded[:]
        # One turn: publishes, a subscription, more publishes, a flush, the last publish.
        for index in range(3):
            publisher.publish("order", b"%d:" % index)
        sid = publisher.subscribe("order.reply", lambda *_: None)
        publisher.publish("order", b"3:", headers=b"NATS/1.0\r\nA: b\r\n\r\n")
        flushed = publisher.flush()
        publisher.unsubscribe(sid)
        publisher.publish("order", b"4:")
        await wait_for(flushed)
        await eventually(lambda: recorder.commands()[-1:] == [b"PUB 4"], 5)
        assert recorder.commands() == [b"PUB 0", b"PUB 1", b"PUB 2", b"SUB", b"HPUB 3",
                                       b"PING", b"UNSUB", b"PUB 4"]
    finally:
        await wait_for(publisher.stop())
        await recorder.close()


@pytest_twisted.ensureDeferred
async def test_a_batch_larger_than_one_write_arrives_whole_and_in_order(nats):
    subscriber, received = await subscribed(nats.url, "big")
    publisher = await nats_client(nats.url)
    try:
        payload = b"x" * 1000
        count = 4 * BATCH_LIMIT // len(payload)  # four writes and more, all in one turn
        for index in range(count):
            assert publisher.publish("big", b"%d:" % index + payload)
        # The PING goes behind every PUB of the turn: once answered, the server has routed them
        # all, and the subscriber's own PING comes back behind them.
        await wait_for(publisher.flush())
        await wait_for(subscriber.flush())
        assert numbers(received.payloads) == list(range(count))
        assert publisher.dropped == 0 and publisher.reconnects == 0
    finally:
        await wait_for(publisher.stop())
        await wait_for(subscriber.stop())


@pytest_twisted.ensureDeferred
async def test_stop_sends_what_the_last_turn_collected(nats):
    subscriber, received = await subscribed(nats.url, "last")
    publisher = await nats_client(nats.url)
    try:
        for index in range(50):
            publisher.publish("last", b"%d:" % index)
        await wait_for(publisher.stop())  # in the same turn as the publishes
        await eventually(lambda: len(received.payloads) >= 50, 10)
        assert numbers(received.payloads) == list(range(50))
    finally:
        await wait_for(subscriber.stop())


@pytest_twisted.ensureDeferred
async def test_a_batch_cut_by_a_lost_connection_is_never_sent_twice_nor_out_of_order(nats):
    """The publisher reaches NATS through a proxy that cuts the network, then ends the
    connection; later the publisher aborts its connection itself, in the turn it publishes in.
    What was collected or written meanwhile is lost, as bytes written to a socket that dies
    are; everything before and after arrives, in order, once."""
    partition = Partition(nats.url)
    subscriber, received = await subscribed(nats.url, "cut")
    publisher = await nats_client(partition.url)
    sent = 0

    def publish_turn(count: int = 20) -> range:
        nonlocal sent
        for _ in range(count):
            publisher.publish("cut", b"%d:" % sent)
            sent += 1
        return range(sent - count, sent)

    async def arrived(expected: range) -> None:
        await wait_for(publisher.flush())
        await eventually(lambda: expected[-1] in numbers(received.payloads), 10)

    try:
        expected = list(publish_turn())
        await sleep(0)
        expected += publish_turn()
        await arrived(range(expected[-1] + 1))
        # The network is cut: what is sent goes nowhere, until the proxy ends the connection.
        partition.cut = True
        for _ in range(3):
            publish_turn()
            await sleep(0)
        publish_turn()
        partition.heal()
        await eventually(lambda: publisher.reconnects == 1, 15)
        expected += publish_turn()
        await arrived(range(expected[-1], expected[-1] + 1))
        # Aborted by this side (as after unanswered PINGs) with a turn's batch collected: it
        # is dropped with the connection, never written to the next one.
        publisher.connection.wire.abortConnection()
        publish_turn()
        await eventually(lambda: publisher.reconnects == 2, 15)
        expected += publish_turn()
        await arrived(range(expected[-1], expected[-1] + 1))
        await sleep(0.2)  # anything sent twice or late would be here by now
        assert numbers(received.payloads) == expected
    finally:
        await wait_for(publisher.stop())
        await wait_for(subscriber.stop())
        await partition.close()


@pytest_twisted.ensureDeferred
async def test_batches_to_a_paused_server_stay_within_the_bound_and_arrive_once_it_reads(nats):
    """While the server is paused (SIGSTOP), a turn's batches fill the socket, then the
    transport, then `max_pending_bytes`: past that, publishes are refused and counted, however
    the turn's batches are cut. Every publish taken arrives, in order, once the server reads."""
    subscriber, received = await subscribed(nats.url, "paused")
    publisher = await nats_client(nats.url)
    limit = publisher.options.max_pending_bytes
    payload = b"x" * 1000
    taken: list[int] = []
    os.kill(nats.process.pid, signal.SIGSTOP)
    try:
        sent = 0
        while publisher.dropped < 100:
            assert sent < 100_000, "nothing was ever refused"
            for _ in range(1000):  # 1 MB in one turn
                if publisher.publish("paused", b"%d:" % sent + payload):
                    taken.append(sent)
                sent += 1
            connection = publisher.connection
            assert connection is not None
            assert (connection.backlog or 0) <= limit
            await sleep(0)  # the turn ends: its batch is written
        assert taken == list(range(len(taken)))  # refused only once full, never in between
        # Taken: what the kernel's socket buffers hold (32 MiB at most here), then the bound.
        assert len(taken) * len(payload) < limit + (40 << 20)
    finally:
        os.kill(nats.process.pid, signal.SIGCONT)
    try:
        await eventually(lambda: len(received.payloads) >= len(taken), 30)
        await wait_for(publisher.flush())
        await wait_for(subscriber.flush())
        assert numbers(received.payloads) == taken
        assert publisher.reconnects == 0
    finally:
        await wait_for(publisher.stop())
        await wait_for(subscriber.stop())


@pytest_twisted.ensureDeferred
async def test_a_message_over_max_payload_is_refused_alone_and_its_batch_goes_on(tmp_path):
    server = NatsServer(directory=str(tmp_path / "nats"), extra_config="max_payload: 4096")
    server.start()
    try:
        subscriber, received = await subscribed(server.url, "sized")
        publisher = await nats_client(server.url)
        assert publisher.max_payload == 4096
        results = [publisher.publish("sized", b"0:"),
                   publisher.publish("sized", b"1:" + b"x" * 5000),
                   publisher.publish("sized", b"2:")]
        assert results == [True, False, True]
        assert publisher.too_large == 1 and publisher.dropped == 1
        await wait_for(publisher.flush())
        await wait_for(subscriber.flush())
        assert numbers(received.payloads) == [0, 2]
        assert publisher.connected and publisher.reconnects == 0
        await wait_for(publisher.stop())
        await wait_for(subscriber.stop())
    finally:
        server.stop()


@pytest_twisted.ensureDeferred
async def test_what_one_read_brings_from_nats_costs_each_local_connection_one_write(
        nats, fast_path):
    """The messages of one read from NATS are handled as one read of the fast path
    (wireproto.speedups): each connection they are written to gets them as one write, in
    order."""
    from wireproto import speedups

    publisher = await nats_client(nats.url)
    subscriber = await nats_client(nats.url)
    try:
        writes: list[bytes] = []
        outbox = speedups.Outbox(writes.append)
        subscriber.subscribe("fan", lambda subject, reply, headers, payload:
                             outbox.write(payload + b";"))
        await wait_for(subscriber.flush())
        sent = [b"%d" % number for number in range(200)]
        for payload in sent:  # one turn: one write to the server
            publisher.publish("fan", payload)
        await eventually(lambda: b"".join(writes).count(b";") == len(sent), 10)
        assert b"".join(writes) == b"".join(payload + b";" for payload in sent)
        # Without the batch, one write per message.
        assert len(writes) < len(sent) / 4, len(writes)
    finally:
        await wait_for(publisher.stop())
        await wait_for(subscriber.stop())
