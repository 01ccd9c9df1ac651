"""How connections reach the workers of a real `wireproto serve --workers 2`: the supervisor
hands them out in turn (wireproto.supervisor.handoff), so a burst is split evenly, and no
connection waits for a worker that was killed, is starting again or is paused, nor for a paused
supervisor. Every kind of listener works so, with its peer's own address and its limits."""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, error, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol

from tests.access.test_peer_identity import PKI, pki, tls_connect  # noqa: F401
from tests.admin.http import base_of, http
from tests.brokers import LOCAL
from tests.cluster.test_workers import (
    Supervised,
    socket_owner,
    start_supervised,
    stop_supervised,
    workers_of,
)
from tests.support import eventually, sleep, wait_for
from wireproto.protocols.websmq.client import connect

# Each connection of the load is answered within this, from its connect to its first byte.
WITHIN = 1.0
UPGRADE = (b"GET /websmq HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\n\r\n")


class Probe(Protocol):
    """A WebSocket client of the `/websmq` path that asks for its handshake once connected:
    `answered` fires with the seconds from `started` (before it connected) to the first byte
    the broker sends back, its 101 answer; or fails if the connection closes before."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.started = time.monotonic()
        self.answered: defer.Deferred[float] = defer.Deferred()
        self.local_port = 0

    def connectionMade(self) -> None:
        self.local_port = self.transport.getHost().port
        self.transport.write(UPGRADE)

    def dataReceived(self, data: bytes) -> None:
        if not self.answered.called:
            if data.startswith(b"HTTP/1.1 101 "):
                self.answered.callback(time.monotonic() - self.started)
            else:
                self.answered.errback(AssertionError(data))

    def connectionLost(self, reason: Any = None) -> None:
        if not self.answered.called:
            self.answered.errback(ConnectionError("closed before it was answered"))


class Load:
    """A new Probe every `interval` seconds, each left open, until `stop()`."""

    def __init__(self, port: int, interval: float = 0.03) -> None:
        self.port = port
        self.interval = interval
        self.probes: list[Probe] = []
        self.running = True
        self.done = defer.ensureDeferred(self._run())

    async def _run(self) -> None:
        while self.running:
            probe = Probe(len(self.probes))
            self.probes.append(probe)
            connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", self.port, timeout=10),
                            probe).addErrback(probe.answered.errback)
            await sleep(self.interval)

    async def stop(self) -> dict[Probe, float | BaseException]:
        """Each probe's time to its answer, or why it had none (within 10 s)."""
        self.running = False
        await self.done
        results = await defer.DeferredList(
            [probe.answered.addTimeout(10, reactor) for probe in self.probes],
            consumeErrors=True)
        return {probe: answer if ok else answer.value
                for probe, (ok, answer) in zip(self.probes, results, strict=True)}

    def close(self) -> None:
        for probe in self.probes:
            if probe.transport is not None:
                probe.transport.loseConnection()


def tcp_port(supervised: Supervised) -> int:
    return int(supervised.tcp.rsplit(":", 1)[1])


def ws_port(supervised: Supervised) -> int:
    ws = next(address for address in supervised.addresses if address.startswith("ws://"))
    return int(ws.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as file:
        return file.read().rsplit(b")", 1)[1].split()[0] == b"T"


@pytest_twisted.async_yield_fixture
async def supervised() -> AsyncIterator[Supervised]:
    running = await start_supervised("--verbose", "--listen", f"websmq+length32@tcp:0:{LOCAL}",
                                     "--listen", f"websmq+ws@tcp:0:{LOCAL}")
    try:
        yield running
    finally:
        for pid in [running.child.process.pid, *workers_of(running.child.process.pid)]:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        await stop_supervised(running.child)


async def sessions_by_worker(supervised: Supervised, count: int) -> dict[str, set[str]]:
    """The peers of the `count` length32 connections, by the worker (its node name in the
    admin API) that holds each."""
    base = base_of(next(a for a in supervised.addresses if a.startswith("ws://")))

    async def listed() -> list[dict[str, Any]]:
        answer = await http(base, "/api/sessions?q=length32&limit=1000")
        assert answer.status == 200, answer.body  # only a local peer may ask
        return [s for s in answer.json["items"] if s["transport"] == "length32"]

    deadline = time.monotonic() + 20
    while len(sessions := await listed()) < count:
        assert time.monotonic() < deadline, sessions
        await sleep(0.2)
    by_worker: dict[str, set[str]] = {}
    for session in sessions:
        by_worker.setdefault(session["node"], set()).add(session["peer"])
    return by_worker


@pytest_twisted.ensureDeferred
async def test_a_burst_of_connections_is_split_evenly_between_the_workers(supervised):
    clients = await wait_for(defer.gatherResults(
        [connect(reactor, supervised.tcp) for _ in range(40)]), 20)
    try:
        by_worker = await sessions_by_worker(supervised, 40)
        print("a burst of 40:", {node: len(peers) for node, peers in by_worker.items()})
        # Each worker names itself, and each connection's peer is its client's own address.
        assert sorted(len(peers) for peers in by_worker.values()) == [20, 20] or any(
            "worker_lagging" in line or "has not taken" in line
            for line in supervised.child.stderr), by_worker
        assert all("/worker" in node for node in by_worker), by_worker
        assert set().union(*by_worker.values()) == {
            f"127.0.0.1:{client.transport.getHost().port}" for client in clients}
        # And the kernel agrees on which worker process holds each.
        owners = Counter([await eventually(lambda client=client: socket_owner(
            client.transport.getHost().port, tcp_port(supervised), supervised.pids), 10)
            for client in clients])
        assert sorted(owners.values()) == sorted(len(p) for p in by_worker.values()), owners
    finally:
        for client in clients:
            await wait_for(client.disconnect())


def _ready_again(supervised: Supervised, index: int, old: int) -> int | None:
    for line in supervised.child.stderr:
        found = re.search(rf"worker {index} \(pid (\d+)\) ready", line)
        if found and int(found.group(1)) != old:
            return int(found.group(1))
    return None


@pytest_twisted.ensureDeferred
async def test_while_a_worker_is_killed_and_started_again_each_connection_is_answered_within_1s(
    supervised,
):
    first, second = supervised.pids
    port = ws_port(supervised)
    load = Load(port)
    try:
        await sleep(1.0)
        killed_at = time.monotonic()
        os.kill(first, signal.SIGKILL)
        restarted = await eventually(lambda: _ready_again(supervised, 0, first), 60, 0.1)
        ready_at = time.monotonic()
        await sleep(1.5)
        outcomes = await load.stop()
        after = {p: o for p, o in outcomes.items() if p.started > killed_at}
        before = {p: o for p, o in outcomes.items() if p.started <= killed_at}
        late = {p.number: o for p, o in after.items() if not isinstance(o, float) or o > WITHIN}
        assert not late, (late, len(after))
        # One made before the kill was answered, or closed with its worker: none hangs.
        assert all(isinstance(o, (float, ConnectionError)) for o in before.values()), before
        owners = Counter(socket_owner(p.local_port, port, [restarted, second])
                         for p in after if p.started > ready_at and p.transport is not None)
        assert owners[restarted] > 0 and owners[second] > 0, owners
        print(f"{len(after)} connections made after the kill, slowest answered in "
              f"{max(after.values()):.3f} s; restarted after {ready_at - killed_at:.1f} s; "
              f"since then {dict(owners)}")
    finally:
        load.close()


@pytest_twisted.ensureDeferred
async def test_a_paused_worker_is_handed_no_connection_until_it_runs_again(supervised):
    first, second = supervised.pids
    port = ws_port(supervised)
    load = Load(port)
    try:
        await sleep(0.5)
        os.kill(first, signal.SIGSTOP)
        await eventually(lambda: stopped(first), 5)
        paused_at = time.monotonic()
        await sleep(2.0)  # well within the lease: the worker is not fenced
        resumed_at = time.monotonic()
        os.kill(first, signal.SIGCONT)
        await sleep(1.5)
        outcomes = await load.stop()
        during = [p for p in outcomes if paused_at < p.started < resumed_at]
        late = {p.number: outcomes[p] for p in during
                if not isinstance(outcomes[p], float) or outcomes[p] > WITHIN}
        assert not late, late
        # One made just before the SIGCONT may be accepted after it, when the worker runs
        # again and may rightly be handed it: the supervisor looks when it hands out.
        handed_while_paused = [p for p in during if p.started < resumed_at - 0.3]
        assert handed_while_paused
        assert {socket_owner(p.local_port, port, [first, second])
                for p in handed_while_paused} == {second}
        # What it had been handed before it stopped waited for it, and was then answered.
        assert all(isinstance(outcome, float) for outcome in outcomes.values())
        after = [p for p in outcomes if p.started > resumed_at + 0.5]
        assert first in {socket_owner(p.local_port, port, [first, second]) for p in after}
        assert any(f"worker 0 (pid {first}) is stopped" in line
                   for line in supervised.child.stderr)
        print(f"{len(during)} connections made during the pause, slowest answered in "
              f"{max(outcomes[p] for p in during):.3f} s")
    finally:
        os.kill(first, signal.SIGCONT)
        load.close()


@pytest_twisted.ensureDeferred
async def test_while_the_supervisor_is_paused_the_workers_accept_by_themselves(supervised):
    supervisor = supervised.child.process.pid
    load = Load(ws_port(supervised), interval=0.05)
    try:
        await sleep(0.5)
        os.kill(supervisor, signal.SIGSTOP)
        paused_at = time.monotonic()
        await sleep(3.0)
        resumed_at = time.monotonic()
        os.kill(supervisor, signal.SIGCONT)
        await sleep(1.0)
        outcomes = await load.stop()
        during = {p: o for p, o in outcomes.items() if paused_at < p.started < resumed_at}
        assert all(isinstance(o, float) for o in outcomes.values()), outcomes
        # A worker waits SILENCE (0.6 s) for a word, and looks every 0.1 s.
        assert max(during.values()) < 1.5, sorted(during.values())
        await eventually(lambda: sum("hands out connections again" in line
                                     for line in supervised.child.stderr) == 2, 10)
        assert sum("no word from the supervisor" in line
                   for line in supervised.child.stderr) == 2
        print(f"{len(during)} connections made while the supervisor was paused, slowest "
              f"answered in {max(during.values()):.3f} s")
    finally:
        os.kill(supervisor, signal.SIGCONT)
        load.close()


KINDS = """
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "tcp:0:interface=127.0.0.1"
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}"
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "{mtls}:interface=127.0.0.1"
[[listen]]
protocol = "websmq"
transport = "cobs"
endpoint = "unix:{path}"
[[listen]]
protocol = "websmq"
transport = "ws"
endpoint = "tcp:0:interface=127.0.0.1"
[[listen]]
protocol = "nydus"
transport = "engineio"
endpoint = "tcp:0:interface=127.0.0.1"
"""


# Twisted's ssl: endpoint parser still hands pyOpenSSL objects to pyOpenSSL; not ours to fix.
@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_every_kind_of_listener_reaches_both_workers(
    tmp_path, tls_files, pki: PKI,  # noqa: F811
):
    config = tmp_path / "wireproto.toml"
    socket_path = tmp_path / "websmq.sock"
    config.write_text(KINDS.format(key=tls_files.key, cert=tls_files.cert, path=socket_path,
                                   mtls=pki.endpoint()))
    supervised = await start_supervised("--config", str(config))
    try:
        tcp, ssl_address, mtls_address, unix, ws, engineio = supervised.addresses
        assert base_of(ws) == base_of(engineio)  # one port, one socket
        mtls_port = int(mtls_address.rsplit(":", 1)[1])
        ssl_host, ssl_port = ssl_address.split(":")[1:]
        # Two of each in a row: the second goes to the other worker.
        clients = []
        for _ in range(2):
            clients.append(await wait_for(connect(reactor, tcp)))
            clients.append(await wait_for(connect(
                reactor, f"ssl:host={ssl_host}:port={ssl_port}:hostname=localhost"
                         f":caCertsDir={tls_files.cert.parent}")))
            clients.append(await wait_for(connect(reactor, f"unix:path={socket_path}",
                                                  framing="cobs")))
            clients.append(await wait_for(connect(reactor, ws)))
        devices = [await tls_connect(pki, mtls_port, "device-1") for _ in range(2)]
        received: list = []
        await wait_for(clients[0].subscribe("kinds", received.append))
        await sleep(0.5)  # the subscription reaches NATS
        for client in clients[1:]:
            client.publish("kinds", b"from %d" % clients.index(client))
        for device in devices:
            device.wrapped.publish("kinds", b"mtls")
        await eventually(lambda: len(received) == len(clients) - 1 + len(devices), 15)
        # Each kind reached both workers: the admin API says which holds each connection.
        base = base_of(ws)
        expected = len(clients) + len(devices)
        deadline = time.monotonic() + 20
        while len(sessions := (await http(base, "/api/sessions")).json["items"]) < expected:
            assert time.monotonic() < deadline, sessions  # until both workers answer
            await sleep(0.2)
        kinds = {(s["transport"], s["node"]) for s in sessions}
        nodes = {s["node"] for s in sessions}
        assert len(nodes) == 2, sessions
        for transport in ("length32", "cobs", "ws"):
            assert {node for kind, node in kinds if kind == transport} == nodes, sessions
        # An untrusted certificate is refused in the handshake, by whichever worker takes it.
        for _ in range(2):
            refused = await tls_connect(pki, mtls_port, "untrusted")
            await eventually(lambda refused=refused: not refused.transport.connected, 10)
        # Engine.IO on the WebSocket's port: a polling handshake is answered.
        opened = await http(base, "/engine.io/?EIO=4&transport=polling")
        assert opened.status == 200 and opened.body.startswith(b"0{"), opened
        for client in clients:
            await wait_for(client.disconnect())
        for device in devices:
            device.loseConnection()
    finally:
        await stop_supervised(supervised.child)


LIMITED = """
[limits]
connections = 2
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "tcp:0:interface=127.0.0.1"
"""


@pytest_twisted.ensureDeferred
async def test_the_connection_limit_counts_each_peer_by_its_own_address(tmp_path):
    config = tmp_path / "wireproto.toml"
    config.write_text(LIMITED)
    supervised = await start_supervised("--config", str(config))
    try:
        clients, ports = [], []
        for _ in range(6):
            # Its port read at once: a refused one may be closed before the sixth connects.
            clients.append(await wait_for(connect(reactor, supervised.tcp)))
            ports.append(clients[-1].transport.getHost().port)
        # In turn, 2 for each worker are let in; the 5th and 6th are one too many for theirs.
        for client in clients[4:]:
            await wait_for(client.when_closed(), 10)
        assert all(client.transport.connected for client in clients[:4])
        refused = await eventually(lambda: [
            line for line in supervised.child.stderr if "refused a connection" in line], 10)
        await eventually(lambda: len([
            line for line in supervised.child.stderr if "refused a connection" in line]) == 2, 10)
        refused = [line for line in supervised.child.stderr if "refused a connection" in line]
        assert sorted(int(re.search(r"from 127\.0\.0\.1:(\d+)", line).group(1))
                      for line in refused) == sorted(ports[4:]), refused
        for client in clients[:4]:
            await wait_for(client.disconnect())
    finally:
        await stop_supervised(supervised.child)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return file.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


@pytest_twisted.ensureDeferred
async def test_a_supervisor_killed_outright_takes_its_workers_and_their_connections():
    supervised = await start_supervised("--listen", f"websmq+length32@tcp:0:{LOCAL}")
    try:
        client = await wait_for(connect(reactor, supervised.tcp))
        killed_at = time.monotonic()
        supervised.child.process.kill()
        await wait_for(client.when_closed(), 20)
        await eventually(lambda: not any(map(alive, supervised.pids)), 20)
        print(f"the workers were gone {time.monotonic() - killed_at:.2f} s after the kill")
        with pytest.raises(error.ConnectionRefusedError):
            await wait_for(connect(reactor, supervised.tcp))
    finally:
        supervised.child.process.kill()
        for pid in supervised.pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
