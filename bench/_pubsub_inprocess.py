"""The broker's own Python per delivery, without sockets: wireproto's length32 WEBSMQ stack beside
the bare forwarder of bench/_pubsub_brokers.py, in one process, for working on the hub.

bench/pubsub.py measures whole brokers over real sockets, and on a shared machine its ratios move
by a third between runs. Here both brokers get the same batches of 256 publishes through
`dataReceived`, their subscribers sit on Twisted's StringTransport, and each figure is the best of
interleaved repeats, so a change to the hub shows in one short run:

    .venv/bin/python bench/_pubsub_inprocess.py [--repeats N]

The ratios are larger than over sockets, where both pay the same for Twisted's socket writes.
"""

from __future__ import annotations

import argparse
import importlib.util
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from wireproto.codecs import websmq
from wireproto.hub import Hub
from wireproto.protocols.websmq.server import WebsmqServerProtocol
from wireproto.transports.stream import StreamOptions, stream_server_factory


def _sibling(name: str) -> Any:
    """A module beside this one, by path: bench/ is no package, and its codecs.py must never
    shadow the standard library's through sys.path."""
    spec = importlib.util.spec_from_file_location(f"bench{name}", Path(__file__).with_name(
        f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


forwarder_factory = _sibling("_pubsub_brokers").forwarder_factory

TOPIC = "bench/pubsub"
PAYLOAD = bytes(range(32, 96))
BATCH = 256  # as many as bench/pubsub.py keeps in flight


def _framed(frame: bytes) -> bytes:
    return struct.pack(">I", len(frame)) + frame


def wireproto_factory() -> Any:
    hub = Hub()
    return stream_server_factory(lambda: WebsmqServerProtocol(hub), StreamOptions("length32"))


BROKERS: dict[str, Callable[[], Any]] = {
    "bare forwarder": forwarder_factory,
    "wireproto": wireproto_factory,
}


class Fanout:
    """One publisher and `subscribers` subscribers, connected to a fresh broker factory."""

    def __init__(self, factory: Any, subscribers: int) -> None:
        self.publisher, _ = self._connect(factory)
        self.outputs = []
        for _ in range(subscribers):
            protocol, transport = self._connect(factory)
            protocol.dataReceived(_framed(websmq.encode(websmq.Subscribe(TOPIC))))
            self.outputs.append(transport)
        self.batch = _framed(websmq.encode_publish(TOPIC, PAYLOAD)) * BATCH

    @staticmethod
    def _connect(factory: Any) -> tuple[Any, StringTransport]:
        protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 0))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 1))
        protocol.makeConnection(transport)
        return protocol, transport

    def check(self) -> None:
        """Every subscriber got the batch, byte for byte."""
        self.publisher.dataReceived(self.batch)
        for output in self.outputs:
            if output.value() != self.batch:
                raise AssertionError(f"a subscriber got {len(output.value())} bytes, not the"
                                     f" {len(self.batch)} of the batch")
            output.clear()

    def seconds(self, batches: int) -> float:
        publish, outputs = self.publisher.dataReceived, self.outputs
        started = time.perf_counter()
        for _ in range(batches):
            publish(self.batch)
            for output in outputs:
                output.clear()
        return time.perf_counter() - started


def measure(subscribers: int, repeats: int, batches: int = 20) -> dict[str, float]:
    """Best microseconds per delivery of each broker, timed in turns."""
    fanouts = {name: Fanout(make(), subscribers) for name, make in BROKERS.items()}
    for fanout in fanouts.values():
        fanout.check()
    best = dict.fromkeys(fanouts, float("inf"))
    for _ in range(repeats):
        for name, fanout in fanouts.items():
            seconds = fanout.seconds(batches)
            best[name] = min(best[name], seconds * 1e6 / (batches * BATCH * subscribers))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed repeats (default 30)")
    args = parser.parse_args(argv)
    print(f"{'subs':>4} {'bare forwarder':>15} {'wireproto':>10}  ratio   (us per delivery)")
    for subscribers in (1, 10):
        best = measure(subscribers, args.repeats)
        print(f"{subscribers:>4} {best['bare forwarder']:>15.3f} {best['wireproto']:>10.3f}"
              f"  {best['wireproto'] / best['bare forwarder']:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
