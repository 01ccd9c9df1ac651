"""`wireproto serve --workers 2`: two real broker processes on the same listeners, their
private nats-server started by the supervisor, every publish delivered exactly once to
subscribers spread over both workers; a worker killed outright is started again."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator

import pytest_twisted
from twisted.internet import reactor

from tests.brokers import LOCAL
from tests.cluster.conftest import _need_nats_server
from tests.support import eventually, sleep, wait_for
from tests.test_cli import Child
from tests.test_metrics import http_base, scrape
from wireproto.protocols.websmq.client import connect

WIREPROTO = os.path.join(os.path.dirname(sys.executable), "wireproto")


def socket_owner(local_port: int, server_port: int, pids: list[int]) -> int | None:
    """Which of `pids` holds the server end of the TCP connection from `local_port`."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as file:
            for line in file.readlines()[1:]:
                fields = line.split()
                local, remote, inode = fields[1], fields[2], fields[9]
                if (int(local.rsplit(":", 1)[1], 16) == server_port
                        and int(remote.rsplit(":", 1)[1], 16) == local_port):
                    inodes.add(f"socket:[{inode}]")
    owners = holding(inodes, pids)
    return owners[0] if owners else None


def holding(targets: set[str], pids: list[int]) -> list[int]:
    """Which of `pids` have one of `targets` (what /proc/PID/fd links name) open."""
    found = []
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        for descriptor in descriptors:
            try:
                if os.readlink(f"/proc/{pid}/fd/{descriptor}") in targets:
                    found.append(pid)
                    break
            except OSError:
                continue
    return found


class Supervised:
    def __init__(self, child: Child, addresses: list[str], pids: list[int]) -> None:
        self.child = child
        self.addresses = addresses
        self.pids = pids

    @property
    def tcp(self) -> str:
        return next(address for address in self.addresses if address.startswith("tcp:"))

    async def client_on(self, pid: int | None = None, *, tries: int = 60, within: float = 0):
        """A WEBSMQ client over TCP, on the worker `pid` (any, if None), with its worker: tried
        `tries` times, and on for `within` seconds (a worker just started accepts only once
        it is ready; until then the other takes every connection)."""
        port = int(self.tcp.rsplit(":", 1)[1])
        deadline = time.monotonic() + within
        attempt = 0
        while attempt < tries or time.monotonic() < deadline:
            attempt += 1
            client = await wait_for(connect(reactor, self.tcp))
            local = client.transport.getHost().port
            # Generous: on a busy machine a worker that was just started (or starved of CPU)
            # may take seconds to accept.
            owner = await eventually(lambda local=local: socket_owner(
                local, port, [*self.pids, *workers_of(self.child.process.pid)]), timeout=20)
            if pid is None or owner == pid:
                return client, owner
            await wait_for(client.disconnect())
        raise AssertionError(f"no connection landed on worker {pid} in {attempt} tries")


async def start_supervised(*arguments: str) -> Supervised:
    """`wireproto serve --workers 2` with `arguments`, once both workers are ready."""
    _need_nats_server()
    child = Child(WIREPROTO, "serve", "--workers", "2", *arguments)
    try:
        ready = await child.line(re.compile(r"wireproto: 2 workers, pids (\d+) (\d+)"), 60)
        await child.line(re.compile(r"wireproto: ready"))
        # Listeners only: an attached link's line ("... attached to serial:...") is no address.
        listening = (re.match(r"wireproto: \S+ over \S+ on (\S+)", line)
                     for line in child.stdout)
        addresses = [match.group(1) for match in listening if match]
    except BaseException:  # a broker left running would hold its ports and devices for ever
        await stop_supervised(child)
        raise
    return Supervised(child, addresses, [int(ready.group(1)), int(ready.group(2))])


async def stop_supervised(child: Child) -> None:
    if child.process.poll() is None:
        child.process.send_signal(signal.SIGTERM)
    assert await child.exit_code(30) == 0, child.output()


@pytest_twisted.async_yield_fixture
async def supervised(tmp_path) -> AsyncIterator[Supervised]:
    running = await start_supervised("--listen", f"websmq+length32@tcp:0:{LOCAL}",
                                     "--listen", f"websmq+ws@tcp:0:{LOCAL}")
    try:
        yield running
    finally:
        await stop_supervised(running.child)


@pytest_twisted.ensureDeferred
async def test_every_publish_reaches_subscribers_on_both_workers_exactly_once(supervised):
    first, second = supervised.pids
    subscribers = []
    for pid in (first, second, first, second):
        client, _ = await supervised.client_on(pid)
        received: list = []
        client.subscribe("spread", received.append)
        subscribers.append((client, received))
    publishers = [(await supervised.client_on(pid))[0] for pid in (first, second)]
    await sleep(0.5)  # the subscriptions reach each worker's hub, and its interest NATS
    for index in range(100):
        for number, publisher in enumerate(publishers):
            publisher.publish("spread", b"%d:%d" % (number, index))
    for _, received in subscribers:
        await eventually(lambda received=received: len(received) >= 200, timeout=15)
    await sleep(0.5)
    for _, received in subscribers:
        payloads = [message.payload for message in received]
        assert len(payloads) == 200
        for number in (0, 1):
            assert [p for p in payloads if p.startswith(b"%d:" % number)] == [
                b"%d:%d" % (number, index) for index in range(100)]
    for client, _ in subscribers:
        await wait_for(client.disconnect())
    for publisher in publishers:
        await wait_for(publisher.disconnect())


@pytest_twisted.ensureDeferred
async def test_a_killed_worker_is_started_again_and_the_other_serves_meanwhile(supervised):
    first, second = supervised.pids
    doomed, _ = await supervised.client_on(first)
    os.kill(first, signal.SIGKILL)
    await wait_for(doomed.when_closed(), 10)
    # A new connection never waits for the dead worker: the other takes it, or the first's
    # successor if it is back already.
    client, owner = await supervised.client_on()
    assert owner != first
    await wait_for(client.disconnect())
    # The supervisor says which process it was, as the worker's own lines do.
    await eventually(lambda: any(f"worker 0 (pid {first}) ended" in line
                                 for line in supervised.child.stderr), timeout=10)
    supervisor = supervised.child.process.pid
    restarted = await eventually(
        lambda: [pid for pid in workers_of(supervisor) if pid not in (first, second)], 15)
    supervised.pids = [restarted[0], second]
    # It links to NATS before it accepts.
    client, owner = await supervised.client_on(restarted[0], within=30)
    await wait_for(client.disconnect())


def workers_of(supervisor: int) -> list[int]:
    """The supervisor's worker processes (its children running the worker module)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                command = file.read()
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if parent == supervisor and b"wireproto.supervisor.worker" in command:
            found.append(int(entry))
    return found


@pytest_twisted.ensureDeferred
async def test_the_wills_of_a_killed_worker_are_published_by_the_other(supervised):
    first, second = supervised.pids
    listener, _ = await supervised.client_on(second)
    wills: list = []
    listener.subscribe("gone/a", wills.append)
    listener.subscribe("gone/b", wills.append)
    doomed = []
    for name in (b"a", b"b"):
        client, _ = await supervised.client_on(first)
        client.set_will("gone/" + name.decode(), b"bye " + name)
        doomed.append(client)
    await sleep(1.0)  # the wills reach the bucket
    os.kill(first, signal.SIGKILL)
    # Its lease (10 s) runs out, then the other worker's next look at the bucket claims it.
    await eventually(lambda: len(wills) == 2, timeout=25)
    assert sorted((message.topic, message.payload) for message in wills) == [
        ("gone/a", b"bye a"), ("gone/b", b"bye b")]
    await sleep(4.0)  # the claim's keys are purged: nothing is published twice
    assert len(wills) == 2
    await wait_for(listener.disconnect())


@pytest_twisted.ensureDeferred
async def test_a_clean_close_publishes_its_will_once_across_workers(supervised):
    first, second = supervised.pids
    listener, _ = await supervised.client_on(second)
    wills: list = []
    listener.subscribe("left", wills.append)
    leaving, _ = await supervised.client_on(first)
    leaving.set_will("left", b"bye")
    await sleep(0.5)
    await wait_for(leaving.disconnect())
    await eventually(lambda: wills, timeout=10)
    os.kill(first, signal.SIGKILL)  # its bucket entry is gone: the will is not sent again
    await sleep(5.0)
    assert [message.payload for message in wills] == [b"bye"]
    await wait_for(listener.disconnect())


@pytest_twisted.ensureDeferred
async def test_twistd_runs_workers_too_and_stops_them_all(tmp_path):
    _need_nats_server()
    twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
    child = Child(twistd, "-n", "--pidfile=", "wireproto", "--workers", "2",
                  "--listen", f"websmq+length32@tcp:0:{LOCAL}")
    try:
        ready = await child.line(re.compile(r"wireproto: 2 workers, pids (\d+) (\d+)"), 60)
        address = (await child.line(re.compile(r"wireproto: \S+ over \S+ on (\S+)"))).group(1)
        supervised = Supervised(child, [address], [int(ready.group(1)), int(ready.group(2))])
        subscriber, _ = await supervised.client_on(supervised.pids[0])
        received: list = []
        subscriber.subscribe("t", received.append)
        publisher, _ = await supervised.client_on(supervised.pids[1])
        await sleep(0.5)
        publisher.publish("t", b"across")
        await eventually(lambda: received, timeout=10)
        assert [message.payload for message in received] == [b"across"]
        await wait_for(subscriber.disconnect())
        await wait_for(publisher.disconnect())
    finally:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
        assert await child.exit_code(30) in (0, -signal.SIGTERM), child.output()
    assert workers_of(child.process.pid) == []


RULES = """
[auth]
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "tcp:0:interface=127.0.0.1"
principal = "alice"
[[listen]]
protocol = "websmq"
transport = "ws"
endpoint = "tcp:0:interface=127.0.0.1"
principal = "alice"
[[acl]]
principal = "alice"
publish = ["a/#", "b/#"]
subscribe = ["a/#"{more}]
"""


@pytest_twisted.ensureDeferred
async def test_sighup_reloads_the_rules_of_every_worker(tmp_path):
    config = tmp_path / "wireproto.toml"
    config.write_text(RULES.format(more=""))
    supervised = await start_supervised("--verbose", "--config", str(config))
    try:
        first, second = supervised.pids
        clients = []
        for pid in (first, second):
            client, _ = await supervised.client_on(pid)
            received: list = []
            client.subscribe("b/x", received.append)  # refused: alice may not, yet
            client.subscribe("a/x", received.append)
            clients.append((client, received))
        publisher, _ = await supervised.client_on(second)
        await sleep(0.5)
        publisher.publish("b/x", b"refused")
        publisher.publish("a/x", b"allowed")
        for _, received in clients:
            await eventually(lambda received=received: received, timeout=10)

        config.write_text(RULES.format(more=', "b/#"'))
        supervised.child.process.send_signal(signal.SIGHUP)
        await eventually(lambda: sum("reload: " in line for line in supervised.child.output()
                                     .splitlines()) == 2, timeout=15)
        # Each worker's text log line says which worker it is, after the time.
        reloads = sorted(line for line in supervised.child.stderr if "reload: " in line)
        whose = sorted(re.match(r"\S+ \[worker (\d) pid (\d+)\] \[wireproto\.service#info\] "
                                r"reload: ", line).groups() for line in reloads)
        assert whose == [("0", str(first)), ("1", str(second))], reloads
        for client, received in clients:
            client.subscribe("b/y", received.append)
        await sleep(0.5)
        publisher.publish("b/y", b"now allowed")
        for _, received in clients:
            await eventually(lambda received=received: len(received) == 2, timeout=10)
            assert [m.payload for m in received] == [b"allowed", b"now allowed"]

        http = next(address for address in supervised.addresses if address.startswith("ws"))
        page = await scrape(http_base(http))
        assert page.value("wireproto_denied_total", worker="total", protocol="websmq",
                          action="subscribe") == 2
        workers = {labels["worker"] for labels in page.labels("wireproto_denied")}
        assert len(workers) == 3 and "total" in workers
        for client, _ in clients:
            await wait_for(client.disconnect())
        await wait_for(publisher.disconnect())
    finally:
        await stop_supervised(supervised.child)


LOGGED = """
[log]
level = "debug"
format = "json"
file = "{file}"
[[listen]]
protocol = "websmq"
transport = "ws"
endpoint = "tcp:0:interface=127.0.0.1"
"""


@pytest_twisted.ensureDeferred
async def test_two_workers_scraped_and_their_json_log_lines_say_which_is_which(tmp_path):
    log_file = tmp_path / "wireproto.log"
    config = tmp_path / "wireproto.toml"
    config.write_text(LOGGED.format(file=log_file))
    supervised = await start_supervised("--config", str(config))
    try:
        first, second = supervised.pids
        http = http_base(next(a for a in supervised.addresses if a.startswith("ws")))
        deadline = time.monotonic() + 30
        while True:  # until each worker hears the other, and answers the scrape
            page = await scrape(http)
            workers = {labels["worker"] for labels in page.labels("wireproto_cluster_processes")}
            if len(workers) == 3 and all(
                    page.value("wireproto_cluster_processes", worker=worker) == 2
                    for worker in workers - {"total"}):
                break
            assert time.monotonic() < deadline, page.text
            await sleep(0.2)
        assert page.value("wireproto_cluster_processes", worker="total") == 2
        assert page.value("wireproto_cluster_connected", worker="total") == 1
        assert page.value("wireproto_cluster_reconnects_total", worker="total") == 0
    finally:
        await stop_supervised(supervised.child)
    # JSON Lines: every line one object, none with twisted.logger's own fields.
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert all(list(event)[:5] == ["time", "level", "namespace", "event", "message"]
               and not any(key.startswith("log_") for key in event) for event in events)
    # The supervisor's lines have neither field; every worker's line has both.
    stamped = [event for event in events if "worker" in event]
    assert {(event["worker"], event["pid"]) for event in stamped} == {(0, first), (1, second)}
    # At debug, the scrapes, each answered by a worker, which says which.
    scraped = [event for event in events if event["event"] == "http_request"]
    assert scraped and all(event["target"] == "/metrics" and event["worker"] in (0, 1)
                           for event in scraped)
    connected = [event for event in events if event.get("event") == "cluster_connected"]
    # One is the supervisor's own connection, by which it watches its nats-server.
    assert sorted((event.get("worker"), event.get("pid")) for event in connected
                  if "worker" in event) == [(0, first), (1, second)]
    assert len(connected) == 3
