"""Real `wireproto serve` processes joined to a NATS server of the test's, for the tests in
tests/cluster/test_takeover.py and others, and an observer that sees every message crossing NATS."""

from __future__ import annotations

import json
import re
import time

from twisted.internet import reactor

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
    await served.child.exit_code(30)


class Observer:
    """A plain NATS client that notes every message on the topic subjects, with its origin, and
    asks JetStream about the wills bucket."""

    def __init__(self, url: str) -> None:
        self.client = NatsClient(reactor, NatsOptions(servers=tuple(url.split(","))))
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
