"""The pub/sub benchmark delivers every message through every broker, and notices when not.

No timing assertions: speed is bench/pubsub.py's business. This runs it in a tiny mode.
"""

import importlib.util
import os
import sys
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
