"""The reconnect mechanism on real sockets: a listener on 127.0.0.1 that refuses (nothing
listens), accepts, or accepts and drops; the delays between attempts follow the policy, stop()
during a wait cancels it, a rotation goes over its list, and ReconnectingService keeps one
connection of a protocol factory open. (tests/transports/test_reconnect.py has the same
mechanism under a fake clock, every delay exact.)"""

from __future__ import annotations

import itertools

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.interfaces import IHalfCloseableProtocol, IListeningPort
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from zope.interface import implementer

from tests.support import eventually, free_port, sleep, wait_for
from wireproto.transports.reconnect import (
    ReconnectingService,
    Reconnector,
    ReconnectState,
    Rotation,
    backoff_per_round,
)

# Time a loaded machine may add to a delay (the reactor is late, never early).
SLACK = 0.25


class Policy:
    """A retry policy that records what it was asked and answers from its list of delays."""

    def __init__(self, *delays: float) -> None:
        self.delays = delays
        self.asked: list[int] = []

    def __call__(self, failed_attempts: int) -> float:
        self.asked.append(failed_attempts)
        return self.delays[min(len(self.asked) - 1, len(self.delays) - 1)]


class Listener:
    """A TCP listener on 127.0.0.1: it accepts connections, and drops the first `drop` of them
    as soon as they are made."""

    def __init__(self, drop: int = 0) -> None:
        self.drop = drop
        self.accepted: list[float] = []
        self.open: list[Protocol] = []
        self.closed: list[Protocol] = []
        self.port: IListeningPort | None = None

    async def listen(self, port: int = 0) -> int:
        listener = self

        class Accepted(Protocol):
            def connectionMade(self) -> None:
                listener.accepted.append(reactor.seconds())
                if len(listener.accepted) <= listener.drop:
                    self.transport.loseConnection()
                else:
                    listener.open.append(self)

            def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
                if self in listener.open:
                    listener.open.remove(self)
                    listener.closed.append(self)

        endpoint = TCP4ServerEndpoint(reactor, port, interface="127.0.0.1")
        self.port = await endpoint.listen(Factory.forProtocol(Accepted))
        return self.port.getHost().port

    async def close(self) -> None:
        for protocol in list(self.open):
            protocol.transport.abortConnection()
        if self.port is not None:
            await self.port.stopListening()
            self.port = None


@pytest.fixture
def listeners():
    made: list[Listener] = []
    yield made
    for listener in made:
        pytest_twisted.blockon(defer.ensureDeferred(listener.close()))


class Client:
    """The owner of a reconnector over TCP: each attempt is recorded (when, and to which port),
    and its protocol tells the reconnector when the connection is up and when it is lost."""

    def __init__(self) -> None:
        self.attempts: list[tuple[float, int]] = []
        self.connections: list[Protocol] = []
        self.reconnector: Reconnector | None = None

    def connect(self, port: int) -> defer.Deferred:
        self.attempts.append((reactor.seconds(), port))
        client = self

        class Connection(Protocol):
            def connectionMade(self) -> None:
                client.connections.append(self)
                client.reconnector.connected()

            def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
                client.reconnector.lost()

        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=2)
        return endpoint.connect(Factory.forProtocol(Connection))

    def gaps(self) -> list[float]:
        times = [when for when, _ in self.attempts]
        return [later - earlier for earlier, later in itertools.pairwise(times)]

    def ports(self) -> list[int]:
        return [port for _, port in self.attempts]


def one_port(client: Client, port: int, policy: Policy) -> Reconnector:
    reconnector: Reconnector = Reconnector(reactor, lambda: client.connect(port),
                                           retry_policy=policy, what="test")
    client.reconnector = reconnector
    return reconnector


def assert_gaps_follow(gaps: list[float], delays: list[float]) -> None:
    assert len(gaps) == len(delays)
    for gap, delay in zip(gaps, delays, strict=True):
        assert delay - 0.01 <= gap <= delay + SLACK, (gaps, delays)


@pytest_twisted.ensureDeferred
async def test_refused_attempts_are_retried_after_the_policys_delays():
    client = Client()
    # Not in order, so a reconnector that made up its own backoff would not pass.
    policy = Policy(0.3, 0.05, 0.2)
    reconnector = one_port(client, free_port(), policy)
    reconnector.start()
    try:
        await eventually(lambda: len(client.attempts) >= 4, timeout=5)
        assert policy.asked[:3] == [1, 2, 3]
        assert_gaps_follow(client.gaps()[:3], [0.3, 0.05, 0.2])
        assert reconnector.failed_attempts >= 3
        assert reconnector.state in (ReconnectState.CONNECTING, ReconnectState.WAITING)
    finally:
        reconnector.stop()


@pytest_twisted.ensureDeferred
async def test_a_dropped_connection_is_made_again_after_the_first_delay(listeners):
    listener = Listener(drop=2)
    listeners.append(listener)
    port = await listener.listen()
    client = Client()
    policy = Policy(0.2, 0.1)
    reconnector = one_port(client, port, policy)
    reconnector.start()
    try:
        await eventually(lambda: listener.open, timeout=5)
        # Each drop comes after a connection that was up: the count of failures starts over,
        # so the policy is asked about 0 failures each time.
        assert policy.asked == [0, 0]
        assert_gaps_follow(client.gaps(), [0.2, 0.1])
        assert len(listener.accepted) == 3
        assert reconnector.state is ReconnectState.CONNECTED
        assert reconnector.failed_attempts == 0
    finally:
        reconnector.stop()


@pytest_twisted.ensureDeferred
async def test_a_listener_that_comes_back_is_connected_and_kept(listeners):
    port = free_port()
    client = Client()
    policy = Policy(0.1)
    reconnector = one_port(client, port, policy)
    reconnector.start()
    try:
        await eventually(lambda: reconnector.failed_attempts >= 2, timeout=5)
        listener = Listener()
        listeners.append(listener)
        await listener.listen(port)
        await eventually(lambda: reconnector.state is ReconnectState.CONNECTED, timeout=5)
        assert reconnector.failed_attempts == 0
        attempts = len(client.attempts)
        await sleep(0.4)  # several of the policy's delays: connected, it tries no more
        assert len(client.attempts) == attempts
        assert len(listener.open) == 1
    finally:
        reconnector.stop()


@pytest_twisted.ensureDeferred
async def test_stop_during_a_wait_cancels_it():
    client = Client()
    reconnector = one_port(client, free_port(), Policy(0.4))
    reconnector.start()
    await eventually(lambda: reconnector.state is ReconnectState.WAITING, timeout=5)
    reconnector.stop()
    assert reconnector.state is ReconnectState.STOPPED
    await sleep(0.4 + SLACK)
    assert len(client.attempts) == 1
    reconnector.start()  # started again, it tries at once
    assert len(client.attempts) == 2
    reconnector.stop()


@pytest_twisted.ensureDeferred
async def test_a_wait_cancelled_by_stop_does_not_hurry_the_next_start():
    client = Client()
    reconnector = one_port(client, free_port(), Policy(0.4))
    reconnector.start()
    await eventually(lambda: reconnector.state is ReconnectState.WAITING, timeout=5)
    await sleep(0.2)
    reconnector.stop()
    reconnector.start()
    try:
        await eventually(lambda: len(client.attempts) >= 3, timeout=5)
        # Had the first wait run on, it would have made the third attempt 0.2 s after the
        # second, not the policy's 0.4 s.
        assert_gaps_follow(client.gaps()[1:2], [0.4])
    finally:
        reconnector.stop()


@pytest_twisted.ensureDeferred
async def test_a_rotation_goes_over_its_list_and_round_again(listeners):
    listener = Listener(drop=1)
    listeners.append(listener)
    listening = await listener.listen()
    refusing = [free_port(), free_port()]
    ports = [*refusing, listening]
    rotation = Rotation(list(ports))
    client = Client()
    reconnector: Reconnector[int] = Reconnector(
        reactor, client.connect, targets=rotation,
        retry_policy=backoff_per_round(rotation, 0.1, 1.0, jitter=lambda: 1.0), what="test",
    )
    client.reconnector = reconnector
    reconnector.start()
    try:
        await eventually(lambda: listener.open, timeout=5)
        # Round the list to the listener, dropped there, then round again from the start.
        assert client.ports() == ports + ports
        gaps = client.gaps()
        # The first time round without waiting; after the drop, round again without waiting.
        assert max(gaps) < SLACK
        assert reconnector.state is ReconnectState.CONNECTED
    finally:
        reconnector.stop()


@pytest_twisted.ensureDeferred
async def test_a_rotation_that_finds_no_one_waits_more_each_round():
    ports = [free_port(), free_port()]
    rotation = Rotation(list(ports))
    client = Client()
    reconnector: Reconnector[int] = Reconnector(
        reactor, client.connect, targets=rotation,
        retry_policy=backoff_per_round(rotation, 0.05, 0.4, jitter=lambda: 1.0), what="test",
    )
    client.reconnector = reconnector
    reconnector.start()
    try:
        await eventually(lambda: len(client.attempts) == 7, timeout=5)
        assert client.ports() == ports * 3 + ports[:1]
        # Round one free; then 0.05 * 2 ** round, each round's two attempts alike.
        assert_gaps_follow(client.gaps(), [0.0, 0.1, 0.1, 0.2, 0.2, 0.4])
    finally:
        reconnector.stop()


@pytest_twisted.ensureDeferred
async def test_a_rotation_takes_in_what_is_added_to_its_list(listeners):
    listener = Listener()
    listeners.append(listener)
    servers = [free_port()]
    rotation = Rotation(servers)
    client = Client()
    reconnector: Reconnector[int] = Reconnector(reactor, client.connect, targets=rotation,
                                                retry_policy=Policy(0.05))
    client.reconnector = reconnector
    reconnector.start()
    try:
        await eventually(lambda: len(client.attempts) >= 2, timeout=5)
        servers.append(await listener.listen())
        await eventually(lambda: listener.open, timeout=5)
        assert client.ports()[-1] == servers[1]
    finally:
        reconnector.stop()


def test_backoff_per_round():
    rotation = Rotation(["a", "b", "c"])
    longest = backoff_per_round(rotation, 0.1, 2.0, jitter=lambda: 1.0)
    shortest = backoff_per_round(rotation, 0.1, 2.0, jitter=lambda: 0.0)
    assert [longest(n) for n in range(3)] == [0.0, 0.0, 0.0]
    assert [longest(n) for n in (3, 5, 6, 9, 12, 15, 300)] == pytest.approx(
        [0.2, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
    assert shortest(3) == pytest.approx(0.1)
    rotation.targets.append("d")  # a fourth server: a round is four attempts
    assert longest(3) == 0.0
    assert longest(4) == pytest.approx(0.2)


def test_a_connect_function_that_raises_stops_the_reconnector():
    def bad_address() -> defer.Deferred:
        raise ValueError("no such address")

    reconnector: Reconnector = Reconnector(reactor, bad_address)
    with pytest.raises(ValueError):
        reconnector.start()
    assert reconnector.state is ReconnectState.STOPPED


# -- ReconnectingService --------------------------------------------------------------------------


@implementer(IHalfCloseableProtocol)
class Counted(Protocol):
    made: list[Counted] = []

    def connectionMade(self) -> None:
        type(self).made.append(self)

    def readConnectionLost(self) -> None:
        self.transport.loseConnection()

    def writeConnectionLost(self) -> None:
        pass


@pytest_twisted.ensureDeferred
async def test_the_service_keeps_a_connection_open_and_closes_it_when_stopped(listeners):
    listener = Listener(drop=1)
    listeners.append(listener)
    port = await listener.listen()
    Counted.made = []
    policy = Policy(0.1)
    service = ReconnectingService(
        reactor, TCP4ClientEndpoint(reactor, "127.0.0.1", port), Factory.forProtocol(Counted),
        retry_policy=policy,
    )
    service.startService()
    try:
        await eventually(lambda: listener.open, timeout=5)
        assert policy.asked == [0]  # the drop
        assert len(Counted.made) == 2
        # The connection is the protocol the factory built, interfaces and all.
        assert service.protocol is not None
        assert IHalfCloseableProtocol.providedBy(service.protocol)
        assert service.protocol.transport is Counted.made[1].transport
    finally:
        await wait_for(service.stopService())
    # Stopped: the connection is closed (the listener sees it), and nothing connects again.
    assert service.protocol is None
    await eventually(lambda: listener.closed, timeout=5)
    await sleep(0.1 + SLACK)
    assert len(listener.accepted) == 2
    assert service.reconnector.state is ReconnectState.STOPPED


@pytest_twisted.ensureDeferred
async def test_the_service_stopped_while_waiting_makes_no_more_attempts():
    port = free_port()
    attempts: list[float] = []

    class Recording(TCP4ClientEndpoint):
        def connect(self, factory):  # type: ignore[no-untyped-def]
            attempts.append(reactor.seconds())
            return super().connect(factory)

    service = ReconnectingService(reactor, Recording(reactor, "127.0.0.1", port),
                                  Factory.forProtocol(Counted), retry_policy=Policy(0.2))
    service.startService()
    await eventually(lambda: service.reconnector.state is ReconnectState.WAITING, timeout=5)
    await wait_for(service.stopService())
    await sleep(0.2 + SLACK)
    assert len(attempts) == 1
