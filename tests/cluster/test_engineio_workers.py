"""Engine.IO under `wireproto serve --workers 2`: a request for a session another worker holds is
passed to that worker (wireproto.transports.engineio.handover) and served, whichever worker the
kernel gave its connection to. Raw HTTP on a fresh TCP connection per request, each pinned to the
worker wanted (found in /proc), proves that GETs, POSTs and the WebSocket upgrade that land on the
other worker are served; the real nydus-client, polling, upgrading and on WebSocket alone, works
across both workers; and what a worker killed outright, a forged sid, another local user and a
silent client do is bounded."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from twisted.internet import reactor
from twisted.internet.endpoints import (
    TCP4ClientEndpoint,
    UNIXClientEndpoint,
    connectProtocol,
    wrapClientTLS,
)
from twisted.internet.ssl import Certificate, optionsForClientTLS

from tests.cluster.test_workers import (
    Supervised,
    socket_owner,
    start_supervised,
    stop_supervised,
    workers_of,
)
from tests.node_peer import NodePeers
from tests.raw_http import Answer, Raw
from tests.support import eventually, need_interop_peer, wait_for
from tests.transports.conftest import TLSFiles
from tests.transports.conftest import tls_files as tls_files  # a fixture

INTEROP = Path(__file__).resolve().parents[1] / "interop"
NYDUS_CLIENT = INTEROP / "nydus_client.mjs"

CONFIG = """
{more}
[limits]
connections = 0
[engineio]
ping_interval = {ping_interval}
ping_timeout = {ping_timeout}
[[listen]]
protocol = "nydus"
transport = "engineio"
endpoint = "{endpoint}"
"""
HANDSHAKE = "/engine.io/?EIO=4&transport=polling"
UNKNOWN_SID = {"code": 1, "message": "Session ID unknown"}


class Broker:
    """`wireproto serve --workers 2` serving nydus over Engine.IO, and raw HTTP to it."""

    def __init__(self, supervised: Supervised, tls: TLSFiles | None = None) -> None:
        self.supervised = supervised
        self.child = supervised.child
        self.url = supervised.addresses[0].removesuffix("/engine.io/")
        self.port = int(self.url.rsplit(":", 1)[1])
        self.tls = tls
        # The workers by index (their sids' marks), as they started.
        self.pids = list(supervised.pids)
        # The worker that holds each session made.
        self.owners: dict[str, int] = {}

    def workers(self) -> list[int]:
        return [*self.pids, *workers_of(self.child.process.pid)]

    async def connect(self, worker: int | None = None,
                      timeout: float = 30) -> tuple[Raw, int]:
        """A TCP connection, with the pid of the worker that accepted it: `worker` (an index),
        or any worker if None. A worker just started again accepts only once it is ready."""
        deadline = time.monotonic() + timeout
        while True:
            raw = Raw()
            endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port)
            if self.tls is not None:
                endpoint = wrapClientTLS(optionsForClientTLS(
                    "localhost", trustRoot=Certificate.loadPEM(self.tls.cert_pem)), endpoint)
            await wait_for(connectProtocol(endpoint, raw))
            local = raw.transport.getHost().port
            pid = await eventually(
                lambda local=local: socket_owner(local, self.port, self.workers()), timeout=20)
            if worker is None or pid == self.pids[worker]:
                return raw, pid
            raw.transport.loseConnection()
            await wait_for(raw.ended)
            assert time.monotonic() < deadline, f"no connection landed on worker {worker}"

    async def request(self, method: str, target: str, body: bytes = b"", *,
                      worker: int | None = None, headers: str = "") -> Answer:
        """One request on a fresh connection (on `worker`, if given), and its answer."""
        raw, pid = await self.connect(worker)
        raw.send(method, target, body, headers=headers)
        answer = await raw.answer()
        answer.worker = self.pids.index(pid) if pid in self.pids else None
        return answer

    async def handshake(self, worker: int | None = None) -> str:
        """A new session, held by the worker that accepted its handshake (`owners`)."""
        answer = await self.request("GET", HANDSHAKE, worker=worker)
        assert answer.status == 200, answer
        sid = json.loads(answer.body[1:])["sid"]
        assert answer.worker is not None
        self.owners[sid] = answer.worker
        return sid

    async def metrics(self, timeout: float = 20) -> dict[tuple[str, str], float]:
        """Every worker's handover counts, by (worker, outcome), and the totals: scraped again
        until both workers answered in time (a busy one may not, within its second)."""
        deadline = time.monotonic() + timeout
        while True:
            counts = {(sample.labels["worker"], sample.labels["outcome"]): sample.value
                      for sample in (await self.scrape())["wireproto_engineio_handovers"]
                      if sample.name.endswith("_total")}
            if all((self.node(worker), "passed") in counts for worker in (0, 1)):
                return counts
            assert time.monotonic() < deadline, f"not every worker in {counts}"

    async def scrape(self) -> dict[str, list[Sample]]:
        """Every worker's metrics, by family."""
        answer = await self.request("GET", "/metrics")
        assert answer.status == 200, answer
        return {family.name: family.samples
                for family in text_string_to_metric_families(answer.body.decode())}

    def node(self, worker: int) -> str:
        """The worker's name in the metrics' labels."""
        return f"{os.uname().nodename}/worker{worker}"

    async def sessions_on(self, worker: int, timeout: float = 20) -> float:
        """The Engine.IO sessions the worker holds (scraped again until it answers in time)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [sample.value for sample in (await self.scrape())["wireproto_connections"]
                     if sample.labels.get("worker") == self.node(worker)
                     and sample.labels["transport"] == "engineio"]
            if found:
                return sum(found)
            assert time.monotonic() < deadline, f"worker {worker} never answered a scrape"

    async def taken(self, worker: int) -> float:
        """The requests the other worker passed to `worker`."""
        return (await self.metrics()).get((self.node(worker), "taken"), 0)

    def restarted(self, worker: int) -> bool:
        """Whether the supervisor started `worker` again (it was killed); its pid is noted."""
        running = workers_of(self.child.process.pid)
        new = [pid for pid in running if pid not in self.pids]
        if len(running) == 2 and new:
            self.pids[worker] = new[0]
            return True
        return False


def other(worker: int) -> int:
    return 1 - worker


def invoke(number: int) -> bytes:
    """An Engine.IO message with a nydus INVOKE of the hub's publish route."""
    return b'41$a%d~/_hub/publish|{"path":"/x","data":%d}' % (number, number)


def result(number: int) -> bytes:
    return b'42$a%d|{"delivered":0,"processes":N}' % number


def answered(body: bytes | str) -> bytes:
    """An answer with the processes its publish went to as N, as the roster knows them (a
    worker killed counts until its lease is over, beside the one started in its place)."""
    raw = body.encode() if isinstance(body, str) else body
    return re.sub(rb'"processes":[1-9]}', b'"processes":N}', raw)


async def start(tmp_path: Path, ping_interval: float = 25, ping_timeout: float = 20,
                tls: TLSFiles | None = None, more: str = "") -> Broker:
    endpoint = "tcp:0:interface=127.0.0.1"
    if tls is not None:
        endpoint = f"ssl:0:interface=127.0.0.1:privateKey={tls.key}:certKey={tls.cert}"
    config = tmp_path / "workers.toml"
    config.write_text(CONFIG.format(ping_interval=ping_interval, ping_timeout=ping_timeout,
                                    endpoint=endpoint, more=more))
    return Broker(await start_supervised("--config", str(config)), tls)


@pytest_twisted.async_yield_fixture
async def broker(tmp_path) -> AsyncIterator[Broker]:
    running = await start(tmp_path)
    try:
        yield running
    finally:
        await stop_supervised(running.child)


async def sessions_of_both(broker: Broker) -> dict[int, str]:
    """A session held by each worker (its first GET done: it has its WELCOME)."""
    held: dict[int, str] = {}
    for worker in (0, 1):
        sid = await broker.handshake(worker)
        answer = await broker.request("GET", f"{HANDSHAKE}&sid={sid}", worker=worker)
        assert (answer.status, answer.body) == (200, b"40|3"), answer
        held[worker] = sid
    return held


# -- polling and the upgrade, across the workers --------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_polls_and_posts_that_land_on_the_other_worker_are_served_by_the_owner(broker):
    crossed = {0: 0, 1: 0}
    for worker, sid in (await sessions_of_both(broker)).items():
        poll = f"{HANDSHAKE}&sid={sid}"
        for number, (post_on, get_on) in enumerate(
                ((other(worker), worker), (worker, other(worker)),
                 (other(worker), other(worker)))):
            posted = await broker.request("POST", poll, invoke(number), worker=post_on)
            assert (posted.status, posted.body) == (200, b"ok"), posted
            got = await broker.request("GET", poll, worker=get_on)
            assert (got.status, answered(got.body)) == (200, result(number)), got
            for landed in (post_on, get_on):
                crossed[landed] += landed != worker
    # Each sid says which worker holds its session: its mark, then engine.io's 20 characters.
    for sid, worker in broker.owners.items():
        assert re.fullmatch(rf"{worker}\.[A-Za-z0-9_-]{{20}}", sid)
    # Each request that landed on the other worker was passed once, and taken once.
    counts = await broker.metrics()
    for worker in (0, 1):
        node = broker.node(worker)
        assert counts[node, "passed"] == crossed[worker]
        assert counts[node, "taken"] == crossed[other(worker)]
        assert counts[node, "lost"] == counts[node, "unreachable"] == 0


async def until_unknown(broker: Broker, sid: str, timeout: float = 10) -> float:
    """Wait until requests for `sid` get engine.io's unknown sid; how long that took."""
    started = time.monotonic()
    while True:
        answer = await broker.request("GET", f"{HANDSHAKE}&sid={sid}")
        if answer.status == 400 and answer.json() == UNKNOWN_SID:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"{sid} still known: {answer}"


@pytest_twisted.ensureDeferred
async def test_an_upgrade_that_lands_on_the_other_worker_is_joined_to_the_owner(broker):
    for worker, sid in (await sessions_of_both(broker)).items():
        assert broker.owners[sid] == worker
        raw, _ = await broker.connect(other(worker))
        await raw.upgrade(sid)
        raw.send_text("2probe")
        assert await raw.received(1) == ["3probe"]
        raw.send_text("5")
        raw.send_text(invoke(7).decode())
        assert answered((await raw.received(2))[1]) == result(7)
        # Polling is over for the session: a GET is a bad request now, wherever it lands.
        answer = await broker.request("GET", f"{HANDSHAKE}&sid={sid}", worker=other(worker))
        assert (answer.status, answer.json()) == (400, {"code": 3, "message": "Bad request"})
        raw.transport.loseConnection()
        await wait_for(raw.ended)
        # The owner's WebSocket ended with the client's connection: the session is over.
        await until_unknown(broker, sid)


@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_over_tls_requests_are_passed_and_upgrades_joined_behind_the_worker_that_accepted(
        tmp_path, tls_files):
    running = await start(tmp_path, tls=tls_files)
    try:
        assert running.url.startswith("https://")
        for worker, sid in (await sessions_of_both(running)).items():
            await polls_and_posts(running, sid, range(3))
            raw, _ = await running.connect(other(worker))
            await raw.upgrade(sid)
            raw.send_text("2probe")
            assert await raw.received(1) == ["3probe"]
            raw.send_text("5")
            raw.send_text(invoke(9).decode())
            assert answered((await raw.received(2))[1]) == result(9)
            raw.transport.loseConnection()
            await wait_for(raw.ended)
        counts = await running.metrics()
        assert counts["total", "passed"] >= 2  # the upgrades at least
        assert counts["total", "lost"] == counts["total", "unreachable"] == 0
    finally:
        await stop_supervised(running.child)


# -- workers killed outright ----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_the_owner_killed_during_a_long_poll_it_was_passed_ends_the_clients_connection(
        broker):
    held = await sessions_of_both(broker)
    worker, sid = 0, held[0]
    raw, _ = await broker.connect(other(worker))
    taken = await broker.taken(worker)
    raw.send("GET", f"{HANDSHAKE}&sid={sid}")
    await until(lambda: broker.taken(worker), taken + 1)
    os.kill(broker.pids[worker], signal.SIGKILL)
    await wait_for(raw.ended, 10)  # the connection ended, not a timer (45 s)
    assert raw.data == b""  # no answer: the session is gone with its worker
    # Its sid is unknown at once, whichever worker is asked.
    answer = await broker.request("GET", f"{HANDSHAKE}&sid={sid}", worker=other(worker))
    assert (answer.status, answer.json()) == (400, UNKNOWN_SID)
    # A new session works meanwhile, held by the worker left...
    await polls_and_posts(broker, await broker.handshake())
    # ...and once the killed one is started again, across both.
    await eventually(lambda: broker.restarted(worker), timeout=30)
    for sid in (await sessions_of_both(broker)).values():
        await polls_and_posts(broker, sid)


@pytest_twisted.ensureDeferred
async def test_killing_the_worker_that_joined_an_upgrade_ends_the_owners_session(broker):
    held = await sessions_of_both(broker)
    worker, sid = 1, held[1]
    raw, _ = await broker.connect(other(worker))
    await raw.upgrade(sid)
    raw.send_text("2probe")
    assert await raw.received(1) == ["3probe"]
    raw.send_text("5")
    raw.send_text(invoke(3).decode())
    await raw.received(2)
    assert await broker.sessions_on(worker) == 1
    os.kill(broker.pids[other(worker)], signal.SIGKILL)
    await wait_for(raw.ended, 5)
    # The owner saw its end of the joined connection close: its session is over long before
    # its heartbeat (25 s) would have noticed.
    assert await until_unknown(broker, sid) < 10
    assert await broker.sessions_on(worker) == 0


@pytest_twisted.ensureDeferred
async def test_a_client_that_leaves_its_passed_long_poll_ends_the_session_at_the_owner(broker):
    held = await sessions_of_both(broker)
    for worker, sid in held.items():
        raw, _ = await broker.connect(other(worker))
        taken = await broker.taken(worker)
        raw.send("GET", f"{HANDSHAKE}&sid={sid}")
        await until(lambda worker=worker: broker.taken(worker), taken + 1)
        raw.transport.abortConnection()
        # As if it had left a poll held at the owner itself: engine.io closes the session.
        assert await until_unknown(broker, sid) < 10


# -- helpers of the tests above and below ---------------------------------------------------------


async def until(measure, wanted: float, timeout: float = 10) -> None:
    """Wait until the coroutine function `measure` gives at least `wanted`."""
    deadline = time.monotonic() + timeout
    while (found := await measure()) < wanted:
        assert time.monotonic() < deadline, f"{found} < {wanted}"


async def polls_and_posts(broker: Broker, sid: str, numbers: range = range(2)) -> None:
    """An INVOKE posted and its RESULT polled for, each on a connection of its own."""
    poll = f"{HANDSHAKE}&sid={sid}"
    for number in numbers:
        posted = await broker.request("POST", poll, invoke(number))
        assert (posted.status, posted.body) == (200, b"ok"), posted
        got = await broker.request("GET", poll)
        assert got.status == 200 and answered(got.body).endswith(result(number)), got


# -- the real nydus-client ----------------------------------------------------------------------


@pytest.fixture
def node_executable() -> str:
    return need_interop_peer(INTEROP / "node_modules" / "nydus-client", "nydus-client")


@pytest_twisted.ensureDeferred
async def test_nydus_clients_polling_upgrading_and_on_websocket_work_across_both_workers(
        broker, node_executable):
    # nydus-client under Node opens a connection for each polling request, so about half of
    # them land on the worker that does not hold the session, and so may the upgrade.
    peers = NodePeers(node_executable)
    try:
        clients = {mode: [await peers.start(NYDUS_CLIENT, broker.url, mode, ready="connect")
                          for _ in range(4)]
                   for mode in ("default", "polling", "websocket")}
        everyone = [client for group in clients.values() for client in group]
        for client in everyone:
            client.command('invoke 1 /_hub/subscribe "/news/t"')
        for client in everyone:
            await client.wait("result", id="1")
        for client in clients["default"]:
            await client.wait("upgrade", transport="websocket")
        publishers = [group[0] for group in clients.values()]

        def heard_from_every_other_publisher(client) -> bool:
            heard = {event["data"]["from"] for event in client.of("publish")}
            return heard >= {index for index, publisher in enumerate(publishers)
                             if publisher is not client}

        # Published again until every subscription reached NATS (they take a moment).
        deadline = time.monotonic() + 30
        round_number = 0
        while not all(map(heard_from_every_other_publisher, everyone)):
            assert time.monotonic() < deadline, [client.events for client in everyone]
            round_number += 1
            for index, publisher in enumerate(publishers):
                data = json.dumps({"path": "/news/t", "data": {"from": index}})
                publisher.command(f"invoke p{round_number} /_hub/publish {data}")
            await eventually(lambda name=f"p{round_number}": all(
                publisher.of("result", id=name) for publisher in publishers), timeout=10)
        assert all(not client.of("error") and not client.of("disconnect")
                   for client in everyone), [client.events for client in everyone]
        # Both workers hold sessions, and requests crossed from one to the other.
        assert await broker.sessions_on(0) > 0 and await broker.sessions_on(1) > 0
        counts = await broker.metrics()
        total = "total"
        assert counts[total, "passed"] > 0
        assert counts[total, "lost"] == counts[total, "unreachable"] == 0
        for client in everyone:
            client.command("close")
        for client in everyone:
            await client.wait("disconnect")
    finally:
        await peers.stop()


# -- what is refused, and who may not --------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_forged_sids_and_hostile_requests_get_engineios_answers_at_once(broker):
    held = await sessions_of_both(broker)
    for sid in ("7.AAAAAAAAAAAAAAAAAAAA", "2.x", "-1.x", "01.x", "1", ".x", "0.", "1." + "A" * 4000,
                "%31.x", "%ff.x", "0.%00", held[0] + "x", "1.." + held[1]):
        for method, body in (("GET", b""), ("POST", b"4x")):
            started = time.monotonic()
            answer = await broker.request(method, f"{HANDSHAKE}&sid={sid}", body)
            assert (answer.status, answer.json()) == (400, UNKNOWN_SID), (sid, answer)
            assert time.monotonic() - started < 5
    counts = await broker.metrics()
    for worker, sid in held.items():
        poll = f"{HANDSHAKE}&sid={sid}"
        # Another method: refused by the owner, which the request reached.
        answer = await broker.request("PUT", poll, b"41", worker=other(worker))
        assert (answer.status, answer.json()) == (400, {"code": 3, "message": "Bad request"})
        # A body over max_payload is refused where it landed, before it is read.
        raw, _ = await broker.connect(other(worker))
        raw.send("POST", poll, headers="Content-Length: 2000000\r\n")
        assert (await raw.answer()).status == 413
        # A chunked body is passed whole.
        raw, _ = await broker.connect(other(worker))
        payload = invoke(5)
        raw.send("POST", poll, headers="Transfer-Encoding: chunked\r\n")
        raw.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload))
        answer = await raw.answer()
        assert (answer.status, answer.body) == (200, b"ok"), answer
        answer = await broker.request("GET", poll, worker=other(worker))
        assert (answer.status, answered(answer.body)) == (200, result(5)), answer
        # An upgrade the owner refuses is answered, not joined.
        raw, _ = await broker.connect(other(worker))
        raw.send("GET", f"/engine.io/?EIO=4&transport=websocket&sid={worker}.forged",
                 headers="Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                         "Sec-WebSocket-Version: 13\r\n")
        answer = await raw.answer()
        assert (answer.status, answer.json()) == (400, UNKNOWN_SID), answer
    after = await broker.metrics()
    assert after["total", "lost"] == after["total", "unreachable"] == 0
    assert after["total", "passed"] == after["total", "taken"] == counts["total", "passed"] + 8

    # On the private sockets, straight: a handshake is refused (a session's addresses come from
    # the connection that made it), and a sid of the other worker is not passed on.
    for worker, path in enumerate(private_sockets(broker)):
        for target, refusal in ((HANDSHAKE, {"code": 3, "message": "Bad request"}),
                                (f"{HANDSHAKE}&sid={held[other(worker)]}", UNKNOWN_SID)):
            raw = Raw()
            await wait_for(connectProtocol(UNIXClientEndpoint(reactor, path), raw))
            raw.send("GET", f"/0{target}")
            answer = await raw.answer()
            assert (answer.status, answer.json()) == (400, refusal), answer
    final = await broker.metrics()
    assert final["total", "passed"] == after["total", "passed"]


def private_sockets(broker: Broker) -> list[str]:
    (directory,) = glob.glob(f"/tmp/wireproto-workers-{broker.child.process.pid}-*")
    return [os.path.join(directory, f"{worker}.sock") for worker in (0, 1)]


# Alone: another test's supervisor, starting meanwhile, would rightly remove the directory that
# this one's supervisor, killed outright, leaves.
@pytest.mark.alone
@pytest_twisted.ensureDeferred
async def test_with_a_nats_server_of_the_configs_the_workers_still_pass_requests(tmp_path, nats):
    more = f'[cluster]\nurl = "{nats.url}"\n'
    running = await start(tmp_path, more=more)
    try:
        supervisor = running.child.process.pid
        assert not glob.glob(f"/tmp/wireproto-nats-{supervisor}-*")  # no private nats-server
        directory = os.path.dirname(private_sockets(running)[0])
        for worker, sid in (await sessions_of_both(running)).items():
            answer = await running.request("POST", f"{HANDSHAKE}&sid={sid}", invoke(1),
                                           worker=other(worker))
            assert (answer.status, answer.body) == (200, b"ok"), answer
            answer = await running.request("GET", f"{HANDSHAKE}&sid={sid}",
                                           worker=other(worker))
            assert (answer.status, answered(answer.body)) == (200, result(1)), answer
        # Killed outright, the supervisor leaves its directory (its workers die with it)...
        running.child.process.kill()
        await running.child.exit_code(15)
        await eventually(lambda: not workers_of(supervisor), timeout=15)
        assert os.path.isdir(directory)
    finally:
        if running.child.process.poll() is None:
            await stop_supervised(running.child)
    # ...and the next supervisor of this user removes it.
    again = await start(tmp_path, more=more)
    try:
        assert not os.path.exists(directory)
    finally:
        await stop_supervised(again.child)


@pytest_twisted.ensureDeferred
async def test_another_local_user_cannot_reach_the_private_sockets(tmp_path):
    runuser = shutil.which("runuser")
    if os.geteuid() != 0 or runuser is None or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root, runuser and /usr/bin/python3, to connect as another user")
    running = await start(tmp_path)
    try:
        sockets = private_sockets(running)
        directory = os.path.dirname(sockets[0])
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        for path in sockets:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            tried = subprocess.run(
                [runuser, "-u", "nobody", "--", "/usr/bin/python3", "-c",
                 "import socket, sys\n"
                 "try:\n"
                 "    socket.socket(socket.AF_UNIX).connect(sys.argv[1])\n"
                 "except PermissionError:\n"
                 "    print('refused')\n"
                 "else:\n"
                 "    print('connected')\n", path],
                capture_output=True, text=True, timeout=30)
            assert tried.stdout.strip() == "refused", tried
    finally:
        await stop_supervised(running.child)
    # The supervisor removed its directory when it stopped.
    assert not os.path.exists(directory)


# -- silent clients -----------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_silent_clients_of_passed_sessions_are_dropped_by_the_owners_heartbeat(tmp_path):
    running = await start(tmp_path, ping_interval=2, ping_timeout=2)
    try:
        for worker in (0, 1):
            # Joined to the owner after an upgrade, then silent: the owner's pings go
            # unanswered, and it closes the WebSocket, which closes the joined connection.
            sid = await running.handshake(worker)
            raw, _ = await running.connect(other(worker))
            await raw.upgrade(sid)
            raw.send_text("2probe")
            assert await raw.received(1) == ["3probe"]
            raw.send_text("5")
            silent = time.monotonic()
            await wait_for(raw.ended, 20)
            assert "2" in raw.texts()
            assert time.monotonic() - silent < 15
            # A poll passed to the owner is answered by its next ping; unanswered, the
            # session ends.
            sid = await running.handshake(worker)
            poll = f"{HANDSHAKE}&sid={sid}"
            answer = await running.request("GET", poll, worker=other(worker))
            assert answer.body == b"40|3"
            answer = await running.request("GET", poll, worker=other(worker))
            assert (answer.status, answer.body) == (200, b"2"), answer
            await until_unknown(running, sid, timeout=15)
    finally:
        await stop_supervised(running.child)


@pytest_twisted.ensureDeferred
async def test_an_owner_paused_with_a_passed_poll_costs_the_client_its_connection(tmp_path):
    # A deadline of ping_interval + ping_timeout: 4 s here.
    running = await start(tmp_path, ping_interval=2, ping_timeout=2)
    try:
        worker = 0
        sid = await running.handshake(worker)
        raw, _ = await running.connect(other(worker))
        os.kill(running.pids[worker], signal.SIGSTOP)
        try:
            paused = time.monotonic()
            raw.send("GET", f"{HANDSHAKE}&sid={sid}")
            await wait_for(raw.ended, 20)
            assert 3.5 < time.monotonic() - paused < 15
            assert raw.data == b""
        finally:
            os.kill(running.pids[worker], signal.SIGCONT)
        counts = await running.metrics()
        assert counts[running.node(other(worker)), "lost"] == 1
        # Running again, the owner serves the sessions it holds, wherever their requests land.
        await polls_and_posts(running, await running.handshake(worker))
    finally:
        await stop_supervised(running.child)
