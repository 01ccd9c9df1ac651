"""wireproto's NATS client against a real nats-server: publish and subscribe, queue groups,
requests with no responders and timeouts, reconnection, credentials and TLS."""

from __future__ import annotations

import os

import nkeys
import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.support import eventually, failure_of, sleep, wait_for
from wireproto.cluster.client import NatsClient, NatsOptions, NoResponders
from wireproto.codecs.nats import headers_block
from wireproto.protocols.rpc import RequestTimeout
from wireproto.supervisor.natsserver import NatsServer

# -- against a real server ---------------------------------------------------------------------


class Clients:
    def __init__(self) -> None:
        self.made: list[NatsClient] = []

    async def connect(self, server: NatsServer | str, **options) -> NatsClient:
        url = server if isinstance(server, str) else server.url
        client = NatsClient(reactor, NatsOptions(servers=(url,), **options))
        self.made.append(client)
        client.start()
        return await wait_for(client.when_ready(), 10)


@pytest_twisted.async_yield_fixture
async def clients():
    made = Clients()
    try:
        yield made
    finally:
        for client in made.made:
            await wait_for(client.stop())


class Received:
    def __init__(self) -> None:
        self.messages: list[tuple] = []

    def __call__(self, subject, reply, headers, payload) -> None:
        self.messages.append((subject, reply, headers, payload))

    async def wait(self, count: int, timeout: float = 5.0) -> list[tuple]:
        await eventually(lambda: len(self.messages) >= count, timeout)
        return self.messages


@pytest_twisted.ensureDeferred
async def test_publish_reaches_subscribers_with_wildcards_and_headers(nats, clients):
    publisher, subscriber = await clients.connect(nats), await clients.connect(nats)
    exact, wild = Received(), Received()
    subscriber.subscribe("a.b", exact)
    subscriber.subscribe("a.>", wild)
    await wait_for(subscriber.flush())
    big = os.urandom(200_000)
    assert publisher.publish("a.b", b"one\r\ntwo")
    assert publisher.publish("a.b.c", big, headers=headers_block({"Wp": "x 1"}))
    assert await exact.wait(1) == [("a.b", None, None, b"one\r\ntwo")]
    await wild.wait(2)
    assert wild.messages[1] == ("a.b.c", None, b"NATS/1.0\r\nWp: x 1\r\n\r\n", big)


@pytest_twisted.ensureDeferred
async def test_a_client_never_gets_its_own_publish(nats, clients):
    client = await clients.connect(nats)
    received = Received()
    client.subscribe("echo", received)
    await wait_for(client.flush())
    client.publish("echo", b"x")
    await wait_for(client.flush())
    await sleep(0.1)
    assert received.messages == []


@pytest_twisted.ensureDeferred
async def test_a_queue_group_gets_each_message_once(nats, clients):
    publisher = await clients.connect(nats)
    members = [await clients.connect(nats) for _ in range(2)]
    inboxes = [Received(), Received()]
    for member, inbox in zip(members, inboxes, strict=True):
        member.subscribe("work", inbox, queue="workers")
        await wait_for(member.flush())
    for index in range(50):
        publisher.publish("work", b"%d" % index)
    await eventually(lambda: sum(len(inbox.messages) for inbox in inboxes) == 50)
    got = sorted(int(m[3]) for inbox in inboxes for m in inbox.messages)
    assert got == list(range(50))


@pytest_twisted.ensureDeferred
async def test_requests_replies_no_responders_and_timeouts(nats, clients):
    caller, responder = await clients.connect(nats), await clients.connect(nats)

    def answer(subject, reply, headers, payload):
        responder.publish(reply, payload.upper())

    responder.subscribe("upper", answer)
    responder.subscribe("silent", lambda *_: None)
    await wait_for(responder.flush())
    assert await wait_for(caller.request("upper", b"abc", timeout=5)) == (None, b"ABC")
    assert isinstance(await failure_of(caller.request("nobody", b"", timeout=5)), NoResponders)
    assert isinstance(await failure_of(caller.request("silent", b"", timeout=0.2)),
                      RequestTimeout)


@pytest_twisted.ensureDeferred
async def test_a_restarted_server_gets_every_subscription_again(nats, clients):
    publisher = await clients.connect(nats, reconnect_wait=0.05)
    subscriber = await clients.connect(nats, reconnect_wait=0.05)
    received = Received()
    subscriber.subscribe("s.>", received)
    await wait_for(subscriber.flush())
    publisher.publish("s.1", b"before")
    await received.wait(1)
    nats.stop()
    await eventually(lambda: not publisher.connected and not subscriber.connected)
    dropped = publisher.dropped
    assert not publisher.publish("s.2", b"during")
    assert publisher.dropped == dropped + 1
    nats.start()
    await eventually(lambda: publisher.connected and subscriber.connected, timeout=10)
    await wait_for(subscriber.flush())
    publisher.publish("s.3", b"after")
    await received.wait(2)
    await sleep(0.1)
    assert [m[3] for m in received.messages] == [b"before", b"after"]
    assert subscriber.reconnects == 1


@pytest_twisted.ensureDeferred
async def test_a_client_learns_the_cluster_and_moves_to_another_node(nats_cluster, clients):
    first, second, third = nats_cluster
    subscriber = await clients.connect(first, reconnect_wait=0.05)
    publisher = await clients.connect(third)
    await eventually(lambda: len(subscriber.servers) == 3, timeout=10)
    received = Received()
    subscriber.subscribe("c", received)
    await wait_for(subscriber.flush())
    await eventually(lambda: publisher.publish("c", b"1") and received.messages, timeout=10)
    first.stop(kill=True)
    await eventually(lambda: subscriber.connected and subscriber.reconnects == 1, timeout=10)
    await wait_for(subscriber.flush())
    count = len(received.messages)
    await eventually(lambda: publisher.publish("c", b"2") and len(received.messages) > count,
                     timeout=10)


@pytest.fixture
def nats_with_passwords(tmp_path):
    from tests.cluster.conftest import _need_nats_server

    _need_nats_server()
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    (tmp_path / "seed").write_bytes(seed)
    server = NatsServer(directory=str(tmp_path / "nats"), extra_config=(
        'authorization { users = [ {user: "broker", password: "s3cret"}, '
        f'{{nkey: "{public}"}} ] }}'
    )).start()
    try:
        yield server, str(tmp_path / "seed")
    finally:
        server.stop()


@pytest_twisted.ensureDeferred
async def test_user_password_and_nkey_credentials(nats_with_passwords, clients):
    server, seed_file = nats_with_passwords
    await clients.connect(server, user="broker", password="s3cret")
    host = server.url.split("://")[1]
    await clients.connect(f"nats://broker:s3cret@{host}")
    await clients.connect(server, nkey_seed_file=seed_file)
    refused = NatsClient(reactor, NatsOptions(servers=(server.url,), user="broker",
                                              password="wrong"))
    clients.made.append(refused)
    refused.start()
    await eventually(lambda: refused.last_error and "Authorization" in refused.last_error)
    assert not refused.connected


@pytest.fixture
def nats_with_token(tmp_path):
    from tests.cluster.conftest import _need_nats_server

    _need_nats_server()
    server = NatsServer(directory=str(tmp_path / "nats"),
                        extra_config='authorization { token: "t0ken" }').start()
    try:
        yield server
    finally:
        server.stop()


@pytest_twisted.ensureDeferred
async def test_a_token(nats_with_token, clients):
    await clients.connect(nats_with_token, token="t0ken")


@pytest.fixture
def nats_with_tls(tmp_path, tls_files):
    from tests.cluster.conftest import _need_nats_server

    _need_nats_server()
    server = NatsServer(directory=str(tmp_path / "nats"), extra_config=(
        f'tls {{ cert_file: "{tls_files.cert}", key_file: "{tls_files.key}" }}'
    )).start()
    try:
        yield server
    finally:
        server.stop()


@pytest_twisted.ensureDeferred
async def test_tls_with_a_ca_file(nats_with_tls, tls_files, clients):
    url = nats_with_tls.url.replace("nats://", "tls://").replace("127.0.0.1", "localhost")
    publisher = await clients.connect(url, cafile=str(tls_files.cert))
    subscriber = await clients.connect(url, cafile=str(tls_files.cert))
    received = Received()
    subscriber.subscribe("t", received)
    await wait_for(subscriber.flush())
    publisher.publish("t", b"secret")
    assert (await received.wait(1))[0][3] == b"secret"
