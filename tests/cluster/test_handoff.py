"""The handoff of `--workers` (wireproto.supervisor.handoff) in one process, on real sockets: a
supervisor's `Handoff` on a listening socket and workers' `Receiver`s, each serving on an
`AdoptedEndpoint` of that socket, as a worker process does. The real processes are in
test_even_load.py."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import LogLevel

from tests.support import eventually, sleep, wait_for
from tests.test_log_events import logged
from wireproto.service import AdoptedEndpoint
from wireproto.supervisor import handoff
from wireproto.supervisor.handoff import RECORD, Handoff, Receiver


class Answering(Protocol):
    """A worker's server: answers what it reads with its worker's name before it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def dataReceived(self, data: bytes) -> None:
        self.transport.write(self.name.encode() + b":" + data)


class Asking(Protocol):
    """A client: sends `question` once connected; `answer` fires with the first reply, or fails
    if the connection closes before."""

    def __init__(self, question: bytes = b"hello") -> None:
        self.question = question
        self.answer: defer.Deferred[bytes] = defer.Deferred()

    def connectionMade(self) -> None:
        if self.question:
            self.transport.write(self.question)

    def dataReceived(self, data: bytes) -> None:
        if not self.answer.called:
            self.answer.callback(data)

    def connectionLost(self, reason=None) -> None:
        if not self.answer.called:
            self.answer.errback(ConnectionError("closed unanswered"))


class Setup:
    """A listening socket, the supervisor's handoff on it, and the workers added."""

    def __init__(self) -> None:
        self.listening = socket.socket()
        self.listening.bind(("127.0.0.1", 0))
        self.listening.listen(64)
        self.listening.setblocking(False)
        self.port = self.listening.getsockname()[1]
        self.handoff = Handoff(reactor, [self.listening])
        self.handoff.start()
        self.receivers: list[Receiver] = []
        self.endpoints: list[AdoptedEndpoint] = []
        self.clients: list[Asking] = []

    async def worker(self, index: int) -> Receiver:
        """A worker `index` as a worker process runs one: it listens on the shared socket
        without accepting, and serves what its channel hands it."""
        endpoint = AdoptedEndpoint(reactor, self.listening.fileno(), None)
        channel = self.handoff.open_channel(index)
        receiver = Receiver.attach(reactor, os.dup(channel), [endpoint])
        self.handoff.started(index, os.getpid(), channel)
        await endpoint.listen(Factory.forProtocol(lambda: Answering(f"w{index}")))
        self.receivers.append(receiver)
        self.endpoints.append(endpoint)
        return receiver

    async def ask(self, question: bytes = b"hello") -> Asking:
        client = Asking(question)
        self.clients.append(client)
        await wait_for(connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", self.port),
                                       client))
        return client

    def close(self) -> None:
        for client in self.clients:
            client.answer.addErrback(lambda _: None)  # those left unanswered, closed now
            if client.transport is not None:
                client.transport.loseConnection()
        self.handoff.stop()
        for receiver in self.receivers:
            receiver.close()
        for endpoint in self.endpoints:
            if endpoint.port is not None:
                endpoint.port.stopListening()
        for channel in list(self.handoff.channels.values()):
            channel.close()
        self.listening.close()


@pytest.fixture
def setup() -> Iterator[Setup]:
    made = Setup()
    try:
        yield made
    finally:
        made.close()


def who(answer: bytes) -> str:
    return answer.split(b":", 1)[0].decode()


@pytest_twisted.ensureDeferred
async def test_connections_go_to_the_ready_workers_in_turn(setup: Setup) -> None:
    await setup.worker(0)
    await setup.worker(1)
    setup.handoff.ready(0)
    first = [who(await wait_for((await setup.ask()).answer)) for _ in range(3)]
    assert first == ["w0", "w0", "w0"]  # worker 1 is not ready: it gets none
    setup.handoff.ready(1)
    clients = [await setup.ask(b"%d" % number) for number in range(10)]
    answers = [await wait_for(client.answer) for client in clients]
    assert sorted(who(answer) for answer in answers) == ["w0"] * 5 + ["w1"] * 5
    assert all(answer.endswith(b":%d" % number) for number, answer in enumerate(answers))
    # In turn: never the same worker twice in a row.
    names = [who(answer) for answer in answers]
    assert all(a != b for a, b in zip(names, names[1:], strict=False)), names


@pytest_twisted.ensureDeferred
async def test_a_burst_is_split_evenly(setup: Setup) -> None:
    for index in range(2):
        await setup.worker(index)
        setup.handoff.ready(index)
    clients = await wait_for(defer.gatherResults([defer.ensureDeferred(setup.ask())
                                                 for _ in range(40)]), 10)
    answers = [who(await wait_for(client.answer)) for client in clients]
    assert answers.count("w0") == answers.count("w1") == 20


@pytest_twisted.ensureDeferred
async def test_what_a_dead_worker_had_not_taken_goes_to_another_intact(setup: Setup) -> None:
    await setup.worker(0)
    setup.handoff.ready(0)
    # A worker that never reads its channel, then dies: the connection handed to it waits,
    # then is handed to worker 0 with every byte its client sent.
    silent = setup.handoff.open_channel(1)
    setup.handoff.started(1, os.getpid(), os.dup(silent))
    setup.handoff.ready(1)
    clients = [await setup.ask(b"%d" % number) for number in range(4)]
    await eventually(lambda: len(setup.handoff.channels[1].untaken) == 2)
    os.close(silent)
    answers = sorted([await wait_for(client.answer) for client in clients])
    assert answers == [b"w0:0", b"w0:1", b"w0:2", b"w0:3"]
    assert 1 not in setup.handoff.channels


@pytest_twisted.ensureDeferred
async def test_what_a_worker_took_before_it_went_is_not_handed_again(setup: Setup) -> None:
    await setup.worker(0)
    setup.handoff.ready(0)
    end = setup.handoff.open_channel(1)
    setup.handoff.started(1, os.getpid(), os.dup(end))
    setup.handoff.ready(1)
    first = await setup.ask(b"0")
    assert who(await wait_for(first.answer)) == "w0"
    second = await setup.ask(b"1")  # worker 1's turn
    await eventually(lambda: setup.handoff.channels[1].untaken)
    with socket.socket(fileno=end) as worker_end:
        # Worker 1 takes it, says so and goes, all before the supervisor reads its channel.
        _, (taken,), _, _ = socket.recv_fds(worker_end, 16, 1)
        worker_end.send(handoff.TAKEN)
    await eventually(lambda: 1 not in setup.handoff.channels)
    await sleep(0.3)
    assert not second.answer.called  # not handed to worker 0 as well
    with socket.socket(fileno=taken) as connection:
        assert connection.recv(16) == b"1"  # every byte its client sent is still there
        connection.send(b"worker 1 had it")
    assert await wait_for(second.answer) == b"worker 1 had it"


@pytest_twisted.ensureDeferred
async def test_connections_their_peers_reset_before_a_worker_took_them_are_dropped_quietly(
    setup: Setup,
) -> None:
    await setup.worker(0)
    for _ in range(20):  # queued while no worker can take, then reset by their peers
        peer = socket.create_connection(("127.0.0.1", setup.port))
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()
    with logged() as events:
        setup.handoff.ready(0)
        await eventually(lambda: not setup.handoff.channels[0].untaken and
                         not setup.handoff.waiting)
        assert who(await wait_for((await setup.ask()).answer)) == "w0"
    assert [event for event in events if event["log_level"] >= LogLevel.warn] == []


@pytest_twisted.ensureDeferred
async def test_a_worker_that_takes_nothing_for_a_while_is_handed_no_more(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handoff, "UNRESPONSIVE", 0.3)
    await setup.worker(0)
    setup.handoff.ready(0)
    stuck = setup.handoff.open_channel(1)
    setup.handoff.started(1, os.getpid(), os.dup(stuck))
    setup.handoff.ready(1)
    first = [await setup.ask() for _ in range(2)]  # one each
    await sleep(0.4)
    later = [await setup.ask() for _ in range(6)]
    assert [who(await wait_for(client.answer)) for client in later] == ["w0"] * 6
    assert len(setup.handoff.channels[1].untaken) == 1
    # It takes again once it says it took what it was handed (and serves it: here nobody).
    with socket.socket(fileno=stuck) as end:
        end.send(handoff.TAKEN)
        await eventually(lambda: not setup.handoff.channels[1].untaken)
        assert setup.handoff.choose() is not None
    assert who(await wait_for(first[0].answer)) == "w0"


@pytest_twisted.ensureDeferred
async def test_with_no_worker_to_take_nothing_is_accepted_until_one_can(setup: Setup) -> None:
    await setup.worker(0)
    client = await setup.ask()  # connected: the kernel's queue holds it
    await sleep(0.3)
    assert not client.answer.called
    assert not setup.handoff.accepting and not setup.handoff.waiting
    setup.handoff.ready(0)
    assert await wait_for(client.answer) == b"w0:hello"


@pytest_twisted.ensureDeferred
async def test_a_worker_accepts_by_itself_while_its_supervisor_is_silent(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handoff, "SILENCE", 0.3)
    endpoint = AdoptedEndpoint(reactor, setup.listening.fileno(), None)
    supervisor, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with supervisor:
        Receiver.attach(reactor, worker_end.detach(), [endpoint])
        await endpoint.listen(Factory.forProtocol(lambda: Answering("alone")))
        setup.endpoints.append(endpoint)
        # No worker is ready at the supervisor, and this one hears nothing from it.
        assert await wait_for((await setup.ask()).answer, 5) == b"alone:hello"
        assert endpoint.accepting
        supervisor.send(RECORD.pack(b"T", 0))
        await eventually(lambda: not endpoint.accepting)
        client = await setup.ask()
        await sleep(0.2)
        assert not client.answer.called  # the supervisor hands it out again (nobody, here)


@pytest_twisted.ensureDeferred
async def test_a_worker_continued_after_a_pause_reads_its_supervisors_ticks_before_judging(
    setup: Setup,
) -> None:
    # A worker stopped (SIGSTOP) for longer than SILENCE, whose supervisor ticked meanwhile: on
    # SIGCONT its reactor may run the silence check before it reads the channel. Before, it then
    # accepted by itself, beside the supervisor that hands out (a full run caught a connection
    # made during the pause landing on the paused worker).
    endpoint = AdoptedEndpoint(reactor, setup.listening.fileno(), None)
    supervisor, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with supervisor:
        receiver = Receiver.attach(reactor, worker_end.detach(), [endpoint])
        setup.receivers.append(receiver)
        await endpoint.listen(Factory.forProtocol(lambda: Answering("paused")))
        setup.endpoints.append(endpoint)
        reactor.removeReader(receiver)  # as if stopped: nothing is read...
        supervisor.send(RECORD.pack(b"T", 0))  # ...while the supervisor ticks
        receiver.heard -= 2 * handoff.SILENCE
        receiver._check()  # continued: the timed check comes first
        assert not receiver.alone
        assert not endpoint.accepting
        reactor.addReader(receiver)
