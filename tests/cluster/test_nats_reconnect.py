"""How the NATS client reconnects, on the one reconnect mechanism (wireproto.transports.
reconnect): it goes round its servers to one that answers, a server that accepts but never
answers the CONNECT is a failed attempt that stop() cancels, and stop() ends a wait between
rounds. (Reconnecting to a restarted server, and to another node of a cluster, is in
test_nats_client.py.)"""

from __future__ import annotations

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.protocol import Factory, Protocol

from tests.support import eventually, free_port, sleep, wait_for
from wireproto.cluster.client import NatsClient, NatsOptions
from wireproto.transports.reconnect import ReconnectState


def dead_url() -> str:
    return f"nats://127.0.0.1:{free_port()}"


@pytest_twisted.ensureDeferred
async def test_the_client_goes_round_its_servers_to_one_that_answers(nats):
    servers = (dead_url(), dead_url(), nats.url)
    client = NatsClient(reactor, NatsOptions(servers=servers, reconnect_wait=5.0))
    client.start()
    try:
        # The first time round the list is without waiting, so the third server is reached
        # well before reconnect_wait.
        await wait_for(client.when_ready(), 2)
        assert client.connection is not None
        assert client.describe(client.connection.server) == nats.url
        assert client.last_error and "refused" in client.last_error.lower()
    finally:
        await wait_for(client.stop())
    assert client.stopped


@pytest_twisted.ensureDeferred
async def test_stop_cancels_the_wait_between_rounds():
    client = NatsClient(reactor, NatsOptions(servers=(dead_url(), dead_url()),
                                             reconnect_wait=0.5))
    client.start()
    reconnector = client._reconnector
    await eventually(lambda: reconnector.failed_attempts == 2
                     and reconnector.state is ReconnectState.WAITING, timeout=5)
    await wait_for(client.stop(), 1)
    assert reconnector.state is ReconnectState.STOPPED
    await sleep(1.2)  # longer than the longest wait the policy could give after a round
    assert reconnector.failed_attempts == 2


@pytest_twisted.ensureDeferred
async def test_a_server_that_never_answers_is_a_failed_attempt_that_stop_cancels():
    accepted: list[Protocol] = []
    lost: list[Protocol] = []

    class Silent(Protocol):
        def connectionMade(self) -> None:
            accepted.append(self)

        def connectionLost(self, reason=None) -> None:  # type: ignore[no-untyped-def]
            lost.append(self)

    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
        Factory.forProtocol(Silent))
    try:
        url = f"nats://127.0.0.1:{port.getHost().port}"
        client = NatsClient(reactor, NatsOptions(servers=(url,)))
        client.start()
        await eventually(lambda: accepted and client._pending is not None, timeout=5)
        # Connected over TCP, but no INFO came: neither connected nor counted as up.
        assert not client.connected
        assert client._reconnector.state is ReconnectState.CONNECTING
        await wait_for(client.stop(), 5)  # fires once the connection has closed
        await eventually(lambda: lost, timeout=5)
        assert client._reconnector.state is ReconnectState.STOPPED
        await sleep(0.5)
        assert len(accepted) == 1  # and nothing connects again
    finally:
        await port.stopListening()
