"""How the connections of `wireproto serve --workers N` reach the workers: the supervisor accepts
on every listening socket and hands each connection, in turn, to a worker that is ready and
running, over a unix socket pair of that worker's (SCM_RIGHTS). docs/cluster.md, "How
connections reach the workers", says why this way.

The channel carries records of three bytes. The supervisor sends ``C`` and the listener's index
(two bytes, big-endian) with the connection's descriptor attached, or ``T`` (and two zero
bytes), a tick, every `TICK` seconds. The worker answers each ``C`` with one byte, ``+``, as soon
as it has made the connection its own, before it reads a byte of it. The supervisor keeps its
own descriptor of every connection until then:

- a worker that dies, or closes its channel as it stops, loses nothing: what it had not taken is
  handed to another worker, untouched (what it had taken ends with it, as its other connections
  do);
- a worker that is stopped (SIGSTOP, seen in /proc) or has left a connection untaken for
  `UNRESPONSIVE` seconds (a worker stuck in a loop) is handed no more until it answers, so only
  what it had been handed before waits for it;
- while no worker can take one, the supervisor stops accepting and new connections wait in the
  kernel's queue.

A worker that hears nothing from its supervisor for `SILENCE` seconds (the supervisor is paused,
or its channel broke) accepts from the listening sockets itself, as every worker shares them,
until it hears from it again.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections import deque
from collections.abc import Sequence
from typing import cast

from twisted.internet import task
from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IFileDescriptorReceiver,
    IReadDescriptor,
    ISystemHandle,
    IUNIXTransport,
)
from twisted.internet.posixbase import PosixReactorBase
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto.service import AdoptedEndpoint

__all__ = ["Handoff", "Receiver", "SILENCE", "TICK", "UNRESPONSIVE"]

log = Logger(namespace="wireproto.cluster")

RECORD = struct.Struct("!cH")
TAKEN = b"+"
# Seconds between the supervisor's ticks to each worker.
TICK = 0.2
# A worker that has heard nothing from its supervisor this long accepts by itself.
SILENCE = 0.6
# Seconds between a worker's looks at how long it has heard nothing.
WATCH = 0.1
# A worker that has left a connection untaken this long is handed no more until it takes it.
UNRESPONSIVE = 0.5
# At most this many connections handed to one worker and not yet taken.
MAX_UNTAKEN = 64
# Connections accepted per wake-up of a listening socket, before others get their turn.
ACCEPTS_PER_READ = 64
# After a failed accept (no descriptor or memory left): a pause before trying again.
ACCEPT_PAUSE = 0.1
# What accept() says of a connection its peer gave up (or a firewall refused) before it was
# accepted: the next one is accepted at once.
GONE_BEFORE_ACCEPTED = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR})

# (the connection, the index of its listener, when it was handed out)
Held = tuple[socket.socket, int, float]


def _stopped(pid: int | None) -> bool:
    """Whether the process `pid` is stopped (SIGSTOP, a debugger), as Linux's /proc says."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            state = file.read().rsplit(b")", 1)[1].split(None, 1)[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")


class _Channel(Protocol):
    """The supervisor's end of one worker's channel."""

    def __init__(self, handoff: Handoff, index: int) -> None:
        self.handoff = handoff
        self.index = index
        self.pid: int | None = None
        self.ready = False
        self.open = True
        self.untaken: deque[Held] = deque()
        # Said once while it is handed nothing for not taking what it was handed, and while
        # it is stopped.
        self.lagging = False
        self.stopped = False

    def can_take(self, now: float) -> bool:
        if not (self.ready and self.open) or len(self.untaken) >= MAX_UNTAKEN:
            return False
        if self.untaken and now - self.untaken[0][2] >= UNRESPONSIVE:
            if not self.lagging:
                self.lagging = True
                log.warn("worker {index} (pid {pid}) has not taken a connection handed to it "
                         "{seconds:.1f} s ago; new connections go to the other workers",
                         event="worker_lagging", index=self.index, pid=self.pid,
                         seconds=now - self.untaken[0][2])
            return False
        stopped = _stopped(self.pid)
        if stopped != self.stopped:
            self.stopped = stopped
            if stopped:
                log.warn("worker {index} (pid {pid}) is stopped; new connections go to the "
                         "other workers", event="worker_stopped", index=self.index,
                         pid=self.pid)
        return not stopped

    def hand(self, held: Held) -> None:
        connection, group, _ = held
        transport = cast(IUNIXTransport, self.transport)
        transport.sendFileDescriptor(connection.fileno())
        transport.write(RECORD.pack(b"C", group))
        self.untaken.append((connection, group, self.handoff.reactor.seconds()))

    def tick(self) -> None:
        if self.open and self.transport is not None:
            self.transport.write(RECORD.pack(b"T", 0))

    def dataReceived(self, data: bytes) -> None:
        for _ in range(data.count(TAKEN)):
            if self.untaken:
                self.untaken.popleft()[0].close()
        if self.lagging and not self.untaken:
            self.lagging = False
            log.info("worker {index} (pid {pid}) takes connections again",
                     event="worker_lagging_over", index=self.index, pid=self.pid)
        self.handoff.dispatch()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.open = False
        self.ready = False
        self.handoff.lost(self)


@implementer(IReadDescriptor)
class _Acceptor:
    """Accepts on one of the supervisor's listening sockets, for as long as a worker can take."""

    def __init__(self, handoff: Handoff, group: int, listening: socket.socket) -> None:
        self.handoff = handoff
        self.group = group
        self.socket = listening

    def fileno(self) -> int:
        return self.socket.fileno()

    def logPrefix(self) -> str:
        return "handoff"

    def doRead(self) -> None:
        handoff = self.handoff
        for _ in range(ACCEPTS_PER_READ):
            if handoff.choose() is None:
                handoff.pause_accepting()
                return
            try:
                connection, _ = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in GONE_BEFORE_ACCEPTED:
                    continue
                # Out of descriptors or memory, say: a pause rather than a loop.
                handoff.pause_accepting(ACCEPT_PAUSE, error)
                return
            handoff.failing = False
            connection.setblocking(False)
            handoff.waiting.append((connection, self.group, 0.0))
            handoff.dispatch()

    def connectionLost(self, reason: Failure) -> None:
        pass


class Handoff:
    """The supervisor's side: accepts on `listening` (one socket per listener group, in the
    workers' order) and hands each connection to a worker."""

    def __init__(self, reactor: PosixReactorBase, listening: Sequence[socket.socket]) -> None:
        self.reactor = reactor
        self.acceptors = [_Acceptor(self, group, sock) for group, sock in enumerate(listening)]
        self.channels: dict[int, _Channel] = {}
        # Accepted, or taken back from a worker that went, and not handed out yet.
        self.waiting: deque[Held] = deque()
        self.accepting = False
        self.running = False
        # Accepting has failed since the last connection accepted: said once.
        self.failing = False
        # For each listener, the worker it handed its last connection to.
        self._last = [-1] * len(self.acceptors)
        self._resume: IDelayedCall | None = None
        self._ticks = task.LoopingCall(self._tick)
        self._ticks.clock = reactor

    # -- the supervisor's calls -------------------------------------------------------------------

    def start(self) -> None:
        self.running = True
        self._ticks.start(TICK, now=False)

    def open_channel(self, index: int) -> int:
        """A new channel for the worker `index` (started again, or for the first time): the
        descriptor of the worker's end, to pass to it and then close with `started`."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        channel = _Channel(self, index)
        self.channels[index] = channel
        self.reactor.adoptStreamConnection(ours.fileno(), socket.AF_UNIX,
                                           _OneProtocol(channel))
        ours.close()  # the reactor keeps its own
        return theirs.detach()

    def started(self, index: int, pid: int, worker_end: int) -> None:
        self.channels[index].pid = pid
        os.close(worker_end)

    def ready(self, index: int) -> None:
        """The worker `index` listens and is linked: it takes connections from now on."""
        channel = self.channels.get(index)
        if channel is not None and channel.open:
            channel.ready = True
            self.dispatch()

    def stop(self) -> None:
        """Accept no more; close what is accepted and not taken by a worker."""
        self.running = False
        if self._ticks.running:
            self._ticks.stop()
        self.pause_accepting()
        if self._resume is not None and self._resume.active():
            self._resume.cancel()
        for channel in self.channels.values():
            while channel.untaken:
                channel.untaken.popleft()[0].close()
        while self.waiting:
            self.waiting.popleft()[0].close()

    # -- handing out ------------------------------------------------------------------------------

    def choose(self, group: int | None = None) -> _Channel | None:
        """The worker whose turn it is on the listener `group` (the one after the worker its
        last connection went to) and that can take a connection now; None: any that can."""
        order = sorted(self.channels)
        if group is not None:
            last = self._last[group]
            order = [index for index in order if index > last] + \
                [index for index in order if index <= last]
        now = self.reactor.seconds()
        for index in order:
            channel = self.channels[index]
            if channel.can_take(now):
                return channel
        return None

    def dispatch(self) -> None:
        """Hand out what waits, then accept again if a worker can take."""
        if not self.running:
            return
        while self.waiting:
            held = self.waiting[0]
            channel = self.choose(held[1])
            if channel is None:
                self.pause_accepting()
                return
            self.waiting.popleft()
            self._last[held[1]] = channel.index
            channel.hand(held)
        if not self.accepting and (self._resume is None or not self._resume.active()) \
                and self.choose() is not None:
            self.accepting = True
            for acceptor in self.acceptors:
                self.reactor.addReader(acceptor)

    def pause_accepting(self, pause: float = 0.0, error: OSError | None = None) -> None:
        if self.accepting:
            self.accepting = False
            for acceptor in self.acceptors:
                self.reactor.removeReader(acceptor)
        if pause and self.running:
            if not self.failing:
                self.failing = True
                log.error("cannot accept a connection: {error}; trying again every {pause} s",
                          event="accept_failed", error=error, pause=pause)
            self._resume = self.reactor.callLater(pause, self.dispatch)

    def lost(self, channel: _Channel) -> None:
        """`channel`'s worker died or stopped: what it had not taken is handed to another."""
        if self.channels.get(channel.index) is channel:
            del self.channels[channel.index]
        taken_back = list(channel.untaken)
        channel.untaken.clear()
        if not self.running:
            for held in taken_back:
                held[0].close()
            return
        self.waiting.extendleft(reversed(taken_back))
        self.dispatch()

    def _tick(self) -> None:
        for channel in self.channels.values():
            channel.tick()
        self.dispatch()  # a worker continued after a SIGSTOP can take again


class _OneProtocol(Factory):
    def __init__(self, channel: _Channel) -> None:
        self.channel = channel

    def buildProtocol(self, addr: IAddress | None) -> _Channel:
        return self.channel


@implementer(IFileDescriptorReceiver)
class Receiver(Protocol):
    """A worker's side: serves each connection its supervisor hands it on the listening
    endpoint it came from (one of `endpoints`, the worker's adopted endpoints), and accepts by
    itself while it hears nothing from the supervisor."""

    def __init__(self, reactor: PosixReactorBase, endpoints: Sequence[AdoptedEndpoint]) -> None:
        self.reactor = reactor
        self.endpoints = list(endpoints)
        self.descriptors: deque[int] = deque()
        self._buffer = b""
        self.heard = reactor.seconds()
        self.alone = False
        self.closing = False
        # Connections taken that the supervisor has not been told of yet.
        self._unsent = 0
        self._watch = task.LoopingCall(self._check)
        self._watch.clock = reactor

    @classmethod
    def attach(cls, reactor: PosixReactorBase, fileno: int, endpoints: Sequence[AdoptedEndpoint]
               ) -> Receiver:
        """The receiver on the channel end `fileno`; its endpoints accept nothing themselves
        until it hears nothing."""
        for endpoint in endpoints:
            endpoint.accept(False)
        receiver = cls(reactor, endpoints)
        os.set_blocking(fileno, False)
        reactor.adoptStreamConnection(fileno, socket.AF_UNIX, _Receiving(receiver))
        os.close(fileno)
        receiver._watch.start(WATCH, now=False)
        return receiver

    def close(self) -> None:
        """The worker stops: its supervisor hands it nothing more (what it had handed and is
        not taken goes to another worker)."""
        self.closing = True
        if self._watch.running:
            self._watch.stop()
        if self.transport is not None:
            self.transport.loseConnection()

    def fileDescriptorReceived(self, descriptor: int) -> None:
        self.descriptors.append(descriptor)

    def dataReceived(self, data: bytes) -> None:
        self.heard = self.reactor.seconds()
        if self.alone:
            self._alone(False)
        buffer = self._buffer + data
        end = len(buffer) - len(buffer) % RECORD.size
        taken = 0
        for offset in range(0, end, RECORD.size):
            kind, group = RECORD.unpack_from(buffer, offset)
            if kind == b"C":
                # Said taken even without its descriptor (which cannot happen), so that the
                # supervisor closes it rather than hand out the next one in its place.
                taken += 1
                if self.descriptors:
                    self._serve(self.descriptors.popleft(), group)
                else:
                    log.error("the supervisor handed a connection without its descriptor",
                              event="handoff_failed")
        self._buffer = buffer[end:]
        if taken and not self.closing:
            self._unsent += taken
        self._say_taken()

    def _say_taken(self) -> None:
        """Tell the supervisor now, not at the reactor's next turn: before this worker reads a
        byte of what it took. So if it dies, the supervisor either knows it took a connection
        (which then ends with it) or hands that connection on untouched."""
        if not self._unsent or self.transport is None:
            return
        try:
            handle = cast(socket.socket, cast(ISystemHandle, self.transport).getHandle())
            sent = handle.send(TAKEN * self._unsent)
        except BlockingIOError:
            sent = 0  # the supervisor is not reading: said at the next tick
        except OSError:
            return  # the channel is gone: so is the supervisor's copy of each connection
        self._unsent -= sent

    def _serve(self, descriptor: int, group: int) -> None:
        try:
            if self.closing:
                return  # not taken: the supervisor hands it to another worker
            self.endpoints[group].adopt_connection(descriptor)
        except Exception:
            log.failure("cannot serve a connection handed by the supervisor",
                        event="handoff_failed")
        finally:
            os.close(descriptor)

    def _check(self) -> None:
        self._say_taken()
        if not self.alone and self.reactor.seconds() - self.heard >= SILENCE:
            self._alone(True)

    def _alone(self, alone: bool) -> None:
        self.alone = alone
        for endpoint in self.endpoints:
            endpoint.accept(alone)
        if alone:
            log.warn("no word from the supervisor for {silence} s: this worker accepts "
                     "connections itself until it hears from it", event="supervisor_silent",
                     silence=SILENCE)
        else:
            log.info("the supervisor hands out connections again", event="supervisor_back")

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        for descriptor in self.descriptors:
            os.close(descriptor)
        self.descriptors.clear()
        if not self.closing:
            self.closing = True
            if self._watch.running:
                self._watch.stop()
            self._alone(True)  # no supervisor to hand out: accept alone


class _Receiving(Factory):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def buildProtocol(self, addr: IAddress | None) -> Receiver:
        return self.receiver
