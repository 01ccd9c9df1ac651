"""Real `wireproto serve` processes joined to a NATS server of the test's, for the tests of
wills under faults (tests/cluster/test_takeover.py, test_wills_and_nats.py,
test_fenced_calls.py), and an observer that sees every message crossing NATS."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import time

from twisted.internet import reactor
from twisted.internet.protocol import ClientCreator, Factory, Protocol

from tests.brokers import LOCAL
from tests.cluster.test_workers import WIREPROTO
from tests.support import sleep, wait_for
from tests.test_cli import Child
from wireproto.cluster.client import NatsClient, NatsOptions
from wireproto.codecs import wpheader
from wireproto.protocols.websmq.client import connect

WILLS = "KV_wireproto_wills"

CONFIG = """
[cluster]
url = "{url}"
heartbeat_interval = {heartbeat}
lease = {lease}
{more}
[limits]
connections = 0
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "tcp:0:{local}"
"""


class Served:
    """One `wireproto serve` process of a cluster."""

    def __init__(self, child: Child, address: str) -> None:
        self.child = child
        self.address = address

    @property
    def pid(self) -> int:
        return self.child.process.pid

    async def client(self, **options):
        return await wait_for(connect(reactor, self.address, **options), 10)

    def lines(self, text: str) -> list[str]:
        return [line for line in self.child.stderr if text in line]


async def serve(tmp_path, name: str, url: str, *, heartbeat: float = 1.0, lease: float = 10.0,
                more: str = "") -> Served:
    config = tmp_path / f"{name}.toml"
    config.write_text(CONFIG.format(url=url, heartbeat=heartbeat, lease=lease, more=more,
                                    local=LOCAL))
    child = Child(WIREPROTO, "serve", "--config", str(config))
    try:
        await child.line(re.compile(r"wireproto: ready"), 60)
    except BaseException:
        child.kill()
        raise
    address = next(re.match(r"wireproto: \S+ over \S+ on (\S+)", line).group(1)
                   for line in child.stdout if " over " in line)
    return Served(child, address)


async def stop(served: Served) -> None:
    if served.child.process.poll() is None:
        served.child.process.terminate()
        served.child.process.send_signal(signal.SIGCONT)  # a paused one acts on it at once
    await served.child.exit_code(30)


class Observer:
    """A plain NATS client that notes every message on the topic subjects, with its origin, and
    asks JetStream about the wills bucket."""

    def __init__(self, url: str, seed_file: str | None = None) -> None:
        self.client = NatsClient(reactor, NatsOptions(servers=tuple(url.split(",")),
                                                      nkey_seed_file=seed_file))
        # (time, topic subject, origin or None, will, payload)
        self.seen: list[tuple[float, str, str | None, bool, bytes]] = []

    async def start(self, subject: str = "wireproto.topic.>") -> Observer:
        self.client.start()
        await wait_for(self.client.when_ready(), 10)
        self.client.subscribe(subject, self._got)
        await wait_for(self.client.flush())
        return self

    def _got(self, subject, reply, headers, payload) -> None:
        fields = wpheader.read(headers) if headers is not None else None
        origin, will = (fields[0], bool(fields[2])) if fields is not None else (None, False)
        self.seen.append((time.monotonic(), subject, origin, will, payload))

    def wills(self, prefix: str = "wireproto.topic.gone.") -> list[tuple[str, bytes]]:
        return [(subject, payload) for _, subject, _, will, payload in self.seen
                if will and subject.startswith(prefix)]

    async def subjects(self, pattern: str = ">") -> dict[str, int]:
        _, reply = await wait_for(self.client.request(
            f"$JS.API.STREAM.INFO.{WILLS}",
            json.dumps({"subjects_filter": f"$KV.wireproto_wills.{pattern}"}).encode(),
            timeout=5), 10)
        answer = json.loads(reply)
        return dict((answer.get("state") or {}).get("subjects") or {})

    async def stop(self) -> None:
        await wait_for(self.client.stop(), 10)


async def wills_stored(observer: Observer, count: int, timeout: float = 30) -> None:
    async def enough() -> bool:
        return len(await observer.subjects("w.>")) >= count

    deadline = time.monotonic() + timeout
    while not await enough():
        assert time.monotonic() < deadline, "the wills never reached the bucket"
        await sleep(0.2)


def duplicates(wills: list[tuple[str, bytes]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for subject, _ in wills:
        counts[subject] = counts.get(subject, 0) + 1
    return {subject: count for subject, count in counts.items() if count != 1}


def private_nats(supervisor: int) -> tuple[str, str]:
    """The URL of the private nats-server of the supervisor `supervisor`, and its workers' seed
    file (this test runs as the supervisor's user)."""
    directory = glob.glob(f"/tmp/wireproto-nats-{supervisor}-*")[0]
    ports = glob.glob(os.path.join(directory, "ports", "*.ports"))[0]
    with open(ports) as file:
        url = json.load(file)["nats"][0]
    return url, os.path.join(directory, "worker.nk")


class _Pipe(Protocol):
    def __init__(self, partition: Partition) -> None:
        self.partition = partition
        self.peer: _Pipe | None = None
        self.pending: list[bytes] = []

    def dataReceived(self, data: bytes) -> None:
        if self.partition.cut:
            return  # lost on the way
        if self.peer is None or self.peer.transport is None:
            self.pending.append(data)
        else:
            self.peer.transport.write(data)

    def connectionLost(self, reason=None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.abortConnection()


class _Upstream(_Pipe):
    def connectionMade(self) -> None:
        assert self.peer is not None
        for data in self.peer.pending:
            self.transport.write(data)
        self.peer.pending.clear()


class _Downstream(_Pipe):
    def connectionMade(self) -> None:
        self.partition.pipes.append(self)
        if self.partition.cut:
            return  # nothing answers: the connection hangs, as a SYN dropped would
        upstream = _Upstream(self.partition)
        upstream.peer, self.peer = self, upstream
        ClientCreator(reactor, lambda: upstream).connectTCP(*self.partition.upstream)


class Partition(Factory):
    """A TCP proxy in front of a NATS server that can cut the network: while `cut`, every byte
    either way is lost and new connections hang unanswered; `heal()` ends the connections that
    were cut (as their peers would find them dead) and lets new ones through."""

    def __init__(self, url: str) -> None:
        host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
        self.upstream = (host, int(port))
        self.cut = False
        self.pipes: list[_Pipe] = []
        self.port = reactor.listenTCP(0, self, interface="127.0.0.1")
        self.url = f"nats://127.0.0.1:{self.port.getHost().port}"

    def buildProtocol(self, addr) -> _Pipe:
        return _Downstream(self)

    def heal(self) -> None:
        self.cut = False
        for pipe in self.pipes:
            if pipe.transport is not None:
                pipe.transport.abortConnection()
        self.pipes.clear()

    async def close(self) -> None:
        self.heal()
        await self.port.stopListening()
