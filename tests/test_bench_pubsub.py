"""The pub/sub benchmark delivers every message through every broker, and notices when not.

No timing assertions: speed is bench/pubsub.py's business. This runs it in a tiny mode.
"""

import importlib.util
import os
import re
import sys
import threading
from pathlib import Path

import pytest
import pytest_twisted

from tests.support import wait_for

BENCH = Path(__file__).resolve().parent.parent / "bench" / "pubsub.py"
spec = importlib.util.spec_from_file_location("bench_pubsub", BENCH)
pubsub = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = pubsub  # dataclasses look their module up there
spec.loader.exec_module(pubsub)


@pytest_twisted.ensureDeferred
async def test_every_system_delivers_every_message():
    lines: list[str] = []
    options = pubsub.parse_args(["--messages", "200", "--quick"])
    report = await wait_for(pubsub.run(options, out=lines.append), timeout=60)

    measured = {m.system for m in report.measurements}
    expected = {s.name for s in pubsub.SYSTEMS}
    if pubsub._find_mosquitto() is None:
        if os.environ.get("CI"):  # make test installs it
            pytest.fail("mosquitto is not installed: apt-get install mosquitto", pytrace=False)
        assert "not installed" in report.skipped.pop("mosquitto tcp")
        expected.discard("mosquitto tcp")
    assert report.skipped == {}, "\n".join(lines)
    assert measured == expected
    for m in report.measurements:
        # run() raised BenchError had any subscriber missed, doubled or changed a delivery
        assert m.deliveries == 200 * m.subscribers
        assert m.seconds > 0 and m.cpu_seconds >= 0
    assert {(m.system, m.subscribers) for m in report.measurements} == {
        (name, n) for name in expected for n in (1, 10)
    }
    table = "\n".join(report.lines)
    assert "wireproto tcp" in table and "goals:" in table


def _dialects():
    return [
        pubsub.Length32Websmq(),
        pubsub.WebSocketWebsmq("ws://127.0.0.1:1/websmq"),
        pubsub.Mqtt311(),
        pubsub.NatsText(),
    ]


@pytest.mark.parametrize("dialect", _dialects(), ids=lambda d: type(d).__name__)
def test_dialect_reads_back_what_a_broker_sends(dialect):
    stream = bytearray(dialect.delivery(pubsub.PROBE) + dialect.delivery(pubsub.PAYLOAD))
    first, end = dialect.next_delivery(stream, 0)
    assert first == pubsub.PROBE
    assert dialect.next_delivery(stream[:-1], end) is None  # the second is not whole yet
    second, end = dialect.next_delivery(stream, end)
    assert (second, end) == (pubsub.PAYLOAD, len(stream))


def test_counter_catches_a_changed_missing_or_extra_delivery():
    delivery = pubsub.Length32Websmq().delivery(pubsub.PAYLOAD)

    exact = pubsub.DeliveryCounter(delivery)
    stream = delivery * 300
    for start in range(0, len(stream), 1000):  # in pieces that split deliveries
        exact.feed(stream[start : start + 1000])
    assert (exact.delivered, exact.error) == (300, None)

    changed = pubsub.DeliveryCounter(delivery)
    corrupt = bytearray(stream)
    corrupt[len(delivery) * 7 + 10] ^= 0x01
    changed.feed(bytes(corrupt))
    assert changed.error == "delivery 7 is not the publish that was sent"

    short = pubsub.DeliveryCounter(delivery)
    short.feed(stream[:-1])
    assert short.delivered == 299

    extra = pubsub.DeliveryCounter(delivery)
    extra.feed(stream + delivery)
    assert extra.delivered == 301


def test_nats_pings_between_deliveries_are_answered_and_not_counted_whatever_the_reads():
    dialect = pubsub.NatsText()
    delivery = dialect.delivery(pubsub.PAYLOAD)
    stream = delivery * 3 + b"PING\r\n" + delivery * 2 + b"PING\r\n" + b"PING\r\n" + delivery
    for piece_size in (1, 2, 3, 5, 7, 64, len(stream)):  # reads that cut pings and deliveries
        answers: list[bytes] = []
        counter = pubsub.DeliveryCounter(delivery, dialect, answers.append)
        for start in range(0, len(stream), piece_size):
            counter.feed(stream[start : start + piece_size])
        assert (counter.delivered, counter.error) == (6, None), piece_size
        assert answers == [b"PONG\r\n"] * 3
        assert counter.received == 6 * len(delivery)


def test_nats_counter_still_catches_what_is_not_a_ping():
    dialect = pubsub.NatsText()
    delivery = dialect.delivery(pubsub.PAYLOAD)

    other = pubsub.DeliveryCounter(delivery, dialect)
    other.feed(delivery * 2 + dialect.delivery(pubsub.PROBE) + delivery)
    assert other.error == "delivery 2 is not the publish that was sent"

    refused = pubsub.DeliveryCounter(delivery, dialect)
    refused.feed(delivery + b"-ERR 'Slow Consumer Detected'\r\n")
    assert refused.error == "after 1 deliveries: nats-server said -ERR 'Slow Consumer Detected'"

    mid_delivery = pubsub.DeliveryCounter(delivery, dialect)
    mid_delivery.feed(delivery[:10] + b"PING\r\n" + delivery[10:])
    assert mid_delivery.error == "delivery 0 is not the publish that was sent"

    garbage = pubsub.DeliveryCounter(delivery, dialect)
    garbage.feed(b"x" * 5000)  # no line end in sight: not held forever
    assert garbage.error.startswith("after 0 deliveries: no NATS control line")


def test_nats_greeting_needs_info_first_and_ends_at_the_pong():
    dialect = pubsub.NatsText()
    assert dialect.greeted(bytearray(b'INFO {"server_id":"x"}\r\n')) is None
    answer = bytearray(b'INFO {"server_id":"x"}\r\nPING\r\nPONG\r\nMSG')
    assert dialect.greeted(answer) == len(answer) - 3
    with pytest.raises(pubsub.BenchError, match="INFO first"):
        dialect.greeted(bytearray(b"PONG\r\n"))
    with pytest.raises(pubsub.BenchError, match="Authorization Violation"):
        dialect.greeted(bytearray(b"INFO {}\r\n-ERR 'Authorization Violation'\r\n"))


async def _through_nats(settings, run):
    """`run(broker, publisher, subscribers)` against a real nats-server configured with
    `settings`, its connections closed afterwards."""
    broker = pubsub.start_nats_server("nats-server tcp", settings)
    clients = []
    try:
        publisher, *subscribers = await wait_for(
            pubsub.connect_clients(broker, 2, clients), timeout=20)
        return await run(broker, publisher, subscribers)
    finally:
        for client in clients:
            client.close()
        await wait_for(pubsub.defer.DeferredList([c.lost for c in clients]), timeout=10)
        broker.stop()


@pytest_twisted.ensureDeferred
async def test_nats_server_delivers_and_its_pings_mid_run_are_answered():
    # Pings every 50 ms, and cut off after two unanswered: a run of a second or more, one
    # message in flight at a time, lives only if the subscribers answer the pings that arrive
    # between deliveries.
    async def run(broker, publisher, subscribers):
        measurement = await wait_for(pubsub.measured_window(
            broker, publisher, subscribers, messages=10000, window=1), timeout=60)
        return measurement, [s.counter.answered for s in subscribers]

    measurement, answered = await _through_nats(
        'ping_interval: "50ms"\nping_max: 2', run)
    assert measurement.deliveries == 2 * 10000
    assert all(count > 0 for count in answered), answered


@pytest_twisted.ensureDeferred
async def test_a_slow_consumer_cut_off_by_nats_server_fails_the_run():
    # One subscriber stops reading and 200,000 messages go at once; nats-server, holding at most
    # 64 KiB for a client, cuts it off and drops its deliveries once the kernel's buffers are full.
    async def run(broker, publisher, subscribers):
        subscribers[0].transport.pauseProducing()
        with pytest.raises(pubsub.BenchError) as caught:
            await wait_for(pubsub.measured_window(
                broker, publisher, subscribers, messages=200_000, window=200_000), timeout=60)
        return str(caught.value)

    reason = await _through_nats("max_pending: 65536\nmax_payload: 1024", run)
    # the one that stopped reading at least (the other may fall behind too, at this rate)
    assert re.search(r"cut off [12] slow consumer\(s\) during the measurement", reason), reason


@pytest.mark.parametrize("method", ["perf", "strace"])
@pytest_twisted.ensureDeferred
async def test_system_calls_are_counted_per_measurement_for_every_kind_of_broker(method):
    try:
        pubsub._syscalls.choose_method(method)
    except pubsub._syscalls.SyscallsUnavailable as e:
        pytest.skip(str(e))
    lines: list[str] = []
    options = pubsub.parse_args(["--messages", "500", "--quick", f"--syscalls={method}",
                                 "--systems", "wireproto tcp,nats-server tcp"])
    report = await wait_for(pubsub.run(options, out=lines.append), timeout=120)
    assert report.syscalls == method
    for m in report.measurements:
        # deliveries were read, written to sockets and waited for
        assert m.syscalls["total"] >= sum(m.syscalls[kind] for kind in pubsub._syscalls.KINDS)
        assert m.syscalls["recvs"] >= 1 and m.syscalls["waits"] >= 1, m
        assert m.syscalls["sends"] >= m.subscribers, m
    table = "\n".join(report.lines)
    assert "system calls per delivery" in table and "nats-server tcp" in table
    assert ("not comparable" in table) == (method == "strace")


def test_a_long_packet_that_is_not_a_delivery_is_not_held_forever():
    delivery = pubsub.Length32Websmq().delivery(pubsub.PAYLOAD)
    counter = pubsub.DeliveryCounter(delivery, pubsub.Length32Websmq())
    counter.feed(delivery + b"\x7f\xff\xff\xff")  # a 2 GiB frame announced
    assert (counter.error, counter.held) == (None, b"\x7f\xff\xff\xff")
    for _ in range(3):
        counter.feed(b"\x00" * 60000)
    assert counter.error.startswith("after 1 deliveries: ")
    assert counter.held == b""


def test_cpu_is_counted_per_thread_to_the_nanosecond_unless_a_thread_ended():
    before = pubsub.CpuSnapshot(seconds=1.0, threads={10: 100, 11: 50})
    grown = pubsub.CpuSnapshot(seconds=1.5, threads={10: 300, 11: 50, 12: 10})
    assert pubsub.cpu_spent(before, grown) == 210 / 1e9  # a new thread's time all counts
    ended = pubsub.CpuSnapshot(seconds=1.25, threads={10: 300})
    assert pubsub.cpu_spent(before, ended) == 0.25  # thread 11's last run is only in the ticks

    here = pubsub.cpu_snapshot(os.getpid())
    assert threading.get_native_id() in here.threads and here.threads[threading.get_native_id()] > 0


def test_a_broker_that_cannot_start_is_skipped_with_its_reason():
    command = [sys.executable, "-c",
               "import sys; print('cannot listen: port taken', flush=True); sys.exit(3)"]
    with pytest.raises(pubsub.BrokerUnavailable) as caught:
        pubsub.start_broker("broken", command, lambda _: pubsub.Length32Websmq(), timeout=10)
    assert caught.value.reason == "exited 3: cannot listen: port taken"


def test_in_process_fanout_delivers_every_batch_through_both_brokers():
    path = BENCH.with_name("_pubsub_inprocess.py")
    spec = importlib.util.spec_from_file_location("bench_pubsub_inprocess", path)
    inprocess = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inprocess)

    best = inprocess.measure(subscribers=3, repeats=1, batches=1)  # runs Fanout.check first
    assert set(best) == {"bare forwarder", "wireproto"}
    assert all(0 < value < float("inf") for value in best.values())

    fanout = inprocess.Fanout(inprocess.wireproto_factory(), 2)
    fanout.outputs[1].clear = lambda: None  # this subscriber will seem to get each batch twice
    fanout.check()
    with pytest.raises(AssertionError, match="a subscriber got"):
        fanout.check()
