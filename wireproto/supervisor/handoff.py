"""How the connections of `wireproto serve --workers N` reach the workers: the supervisor accepts
on every listening socket and hands each connection, in turn, to a worker that is ready and
running, over a unix socket pair of that worker's (SCM_RIGHTS). docs/cluster.md, "How
connections reach the workers", says why this way.

The channel is a SOCK_SEQPACKET socket pair, so each message arrives whole, with the descriptor
sent with it, in one system call. The supervisor sends ``C`` and the listener's index (two bytes,
big-endian) with the connection's descriptor attached, or ``T`` and two zero bytes, a tick,
every `TICK` seconds. The worker answers with a ``+`` for each connection as soon as it has
made it its own, before it reads a byte of it. The supervisor keeps its own descriptor of every
connection until it has read that (when it next chooses a worker, at its tick, or when it waits
for one; never on a wake-up of its own, which would double what a connection costs it):

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

from twisted.internet import task
from twisted.internet.interfaces import IDelayedCall, IReadDescriptor
from twisted.internet.posixbase import PosixReactorBase
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

# (the connection's descriptor, the index of its listener, when it was handed out)
Held = tuple[int, int, float]


def _stopped(pid: int | None) -> bool:
    """Whether the process `pid` is stopped (SIGSTOP, a debugger), as Linux's /proc says."""
    if pid is None:
        return False
    try:
        descriptor = os.open(f"/proc/{pid}/stat", os.O_RDONLY)  # 3 system calls, not 10
        try:
            state = os.read(descriptor, 512).rsplit(b")", 1)[1].split(None, 1)[0]
        finally:
            os.close(descriptor)
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")


@implementer(IReadDescriptor)
class _Channel:
    """The supervisor's end of one worker's channel."""

    def __init__(self, handoff: Handoff, index: int, end: socket.socket) -> None:
        self.handoff = handoff
        self.index = index
        self.socket = end
        self.pid: int | None = None
        self.ready = False
        self.open = True
        self.untaken: deque[Held] = deque()
        # Said once while it is handed nothing for not taking what it was handed, and while
        # it is stopped.
        self.lagging = False
        self.stopped = False
        # Its channel had no room for the last connection handed.
        self.full = False
        # Read as soon as something arrives (while the supervisor waits for a worker that can
        # take), rather than when it is needed.
        self.watched = False

    def can_take(self, now: float, look: bool = True) -> bool:
        """Whether it can be handed a connection now; only with `look` is /proc asked
        whether it is stopped (for the one about to be handed one)."""
        self.read_answers()
        if not (self.ready and self.open) or self.full or len(self.untaken) >= MAX_UNTAKEN:
            return False
        if self.untaken and now - self.untaken[0][2] >= UNRESPONSIVE:
            if not self.lagging:
                self.lagging = True
                log.warn("worker {index} (pid {pid}) has not taken a connection handed to it "
                         "{seconds:.1f} s ago; new connections go to the other workers",
                         event="worker_lagging", index=self.index, pid=self.pid,
                         seconds=now - self.untaken[0][2])
            return False
        if not look:
            return True
        stopped = _stopped(self.pid)
        if stopped != self.stopped:
            self.stopped = stopped
            if stopped:
                log.warn("worker {index} (pid {pid}) is stopped; new connections go to the "
                         "other workers", event="worker_stopped", index=self.index,
                         pid=self.pid)
        return not stopped

    def hand(self, held: Held) -> bool:
        """Send it the connection `held`: False if its channel has no room or is gone."""
        connection, group, _ = held
        try:
            socket.send_fds(self.socket, [RECORD.pack(b"C", group)], [connection])
        except BlockingIOError:
            self.full = True  # its worker reads nothing: until a tick or an answer gets in
            return False
        except OSError:
            self.close()
            return False
        self.untaken.append((connection, group, self.handoff.reactor.seconds()))
        return True

    def tick(self) -> None:
        if not self.open:
            return
        try:
            self.socket.send(RECORD.pack(b"T", 0))
            self.full = False
        except BlockingIOError:
            pass  # a worker stopped for long: its channel is full of ticks already
        except OSError:
            self.close()

    def fileno(self) -> int:
        return self.socket.fileno()

    def logPrefix(self) -> str:
        return f"worker {self.index} channel"

    def watch(self, watched: bool) -> None:
        if self.open and watched != self.watched:
            self.watched = watched
            if watched:
                self.handoff.reactor.addReader(self)
            else:
                self.handoff.reactor.removeReader(self)

    def doRead(self) -> None:
        self.read_answers()
        self.handoff.dispatch()

    def read_answers(self) -> None:
        """Take in what the worker said it took, and whether it has gone: read when a
        connection is to be handed out, at each tick, when its process ends and while the
        supervisor waits for room, so that each connection costs the supervisor one wake-up,
        not two."""
        if not self.open:
            return
        taken, gone = 0, False
        while True:
            try:
                data = self.socket.recv(4096)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                gone = True
                break
            taken += data.count(TAKEN)
        if taken:
            self.full = False
        # What it took is its own, even if it has gone since: only the rest is handed again.
        for _ in range(min(taken, len(self.untaken))):
            os.close(self.untaken.popleft()[0])
        if gone:
            self.close()
            return
        if self.lagging and not self.untaken:
            self.lagging = False
            log.info("worker {index} (pid {pid}) takes connections again",
                     event="worker_lagging_over", index=self.index, pid=self.pid)

    def close(self) -> None:
        """Its worker has gone (or closed its end as it stops)."""
        if self.open:
            self.watch(False)
            self.open = False
            self.ready = False
            self.socket.close()
            self.handoff.lost(self)

    def connectionLost(self, reason: Failure) -> None:
        pass


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
                accepted, _ = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in GONE_BEFORE_ACCEPTED:
                    continue
                # Out of descriptors or memory, say: a pause rather than a loop.
                handoff.pause_accepting(ACCEPT_PAUSE, error)
                return
            handoff.failing = False
            # Its bare descriptor (close-on-exec): the worker makes it non-blocking.
            handoff.waiting.append((accepted.detach(), self.group, 0.0))
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
        self._dispatching = False
        self._ticks = task.LoopingCall(self._tick)
        self._ticks.clock = reactor

    # -- the supervisor's calls -------------------------------------------------------------------

    def start(self) -> None:
        self.running = True
        self._ticks.start(TICK, now=False)

    def open_channel(self, index: int) -> int:
        """A new channel for the worker `index` (started again, or for the first time): the
        descriptor of the worker's end, to pass to it and then close with `started`."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        channel = _Channel(self, index, ours)
        self.channels[index] = channel
        channel.watch(not self.accepting)
        return theirs.detach()

    def started(self, index: int, pid: int, worker_end: int) -> None:
        self.channels[index].pid = pid
        os.close(worker_end)

    def ended(self, index: int) -> None:
        """The process of the worker `index` ended: what it had not taken goes to another."""
        channel = self.channels.get(index)
        if channel is not None:
            channel.read_answers()  # what it took before it ended, then its end closed
            channel.close()

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
                os.close(channel.untaken.popleft()[0])
        while self.waiting:
            os.close(self.waiting.popleft()[0])

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
            channel = self.channels.get(index)  # it may have gone as it was read
            if channel is not None and channel.can_take(now, look=group is not None):
                return channel
        return None

    def dispatch(self) -> None:
        """Hand out what waits, then accept again if a worker can take."""
        if not self.running or self._dispatching:
            return  # (a worker found gone while choosing gives back what it had: see below)
        self._dispatching = True
        try:
            self._hand_out()
        finally:
            self._dispatching = False

    def _hand_out(self) -> None:
        while self.waiting:
            held = self.waiting[0]
            channel = self.choose(held[1])
            if self.waiting[0] is not held:
                continue  # a worker found gone gave back what it had not taken: first in line
            if channel is None:
                self.pause_accepting()
                return
            if channel.hand(held):
                self.waiting.popleft()
                self._last[held[1]] = channel.index
        if not self.accepting and (self._resume is None or not self._resume.active()) \
                and self.choose() is not None:
            self.accepting = True
            for acceptor in self.acceptors:
                self.reactor.addReader(acceptor)
            for channel in self.channels.values():
                channel.watch(False)

    def pause_accepting(self, pause: float = 0.0, error: OSError | None = None) -> None:
        if self.accepting:
            self.accepting = False
            for acceptor in self.acceptors:
                self.reactor.removeReader(acceptor)
            # A worker's answer, or its end, is what can let the supervisor accept again.
            for channel in self.channels.values():
                channel.watch(True)
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
                os.close(held[0])
            return
        self.waiting.extendleft(reversed(taken_back))
        self.dispatch()

    def _tick(self) -> None:
        for channel in list(self.channels.values()):
            channel.read_answers()
            channel.tick()
        self.dispatch()  # a worker continued after a SIGSTOP can take again


@implementer(IReadDescriptor)
class Receiver:
    """A worker's side: serves each connection its supervisor hands it on the listening
    endpoint it came from (one of `endpoints`, the worker's adopted endpoints), and accepts by
    itself while it hears nothing from the supervisor."""

    def __init__(self, reactor: PosixReactorBase, end: socket.socket,
                 endpoints: Sequence[AdoptedEndpoint]) -> None:
        self.reactor = reactor
        self.socket = end
        self.endpoints = list(endpoints)
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
        """The receiver on the channel end `fileno` (which it owns from now on); its endpoints
        accept nothing themselves until it hears nothing."""
        for endpoint in endpoints:
            endpoint.accept(False)
        end = socket.socket(fileno=fileno)
        end.set_inheritable(False)
        end.setblocking(False)
        receiver = cls(reactor, end, endpoints)
        reactor.addReader(receiver)
        receiver._watch.start(WATCH, now=False)
        return receiver

    def fileno(self) -> int:
        return self.socket.fileno()

    def logPrefix(self) -> str:
        return "handoff"

    def close(self) -> None:
        """The worker stops: its supervisor hands it nothing more (what it had handed and is
        not taken goes to another worker)."""
        if not self.closing:
            self.closing = True
            if self._watch.running:
                self._watch.stop()
            self.reactor.removeReader(self)
            self.socket.close()

    def doRead(self) -> None:
        taken, heard = 0, False
        while not self.closing:
            try:
                data, descriptors, _, _ = socket.recv_fds(self.socket, RECORD.size, 4)
            except BlockingIOError:
                break
            except OSError:
                data, descriptors = b"", []
            if not data:
                self._lost()
                return
            heard = True
            kind, group = RECORD.unpack(data) if len(data) == RECORD.size else (b"", 0)
            if kind == b"C" and descriptors:
                self._serve(descriptors[0], group)
                taken += 1
            for extra in descriptors[1:] if kind == b"C" else descriptors:
                os.close(extra)
        if heard:
            self.heard = self.reactor.seconds()
            if self.alone:
                self._alone(False)
        self._unsent += taken
        self._say_taken()

    def _say_taken(self) -> None:
        """Tell the supervisor now, not at the reactor's next turn: before this worker reads a
        byte of what it took. So if it dies, the supervisor either knows it took a connection
        (which then ends with it) or hands that connection on untouched."""
        if not self._unsent or self.closing:
            return
        try:
            self.socket.send(TAKEN * self._unsent)
        except BlockingIOError:
            return  # the supervisor is not reading: said at the next look
        except OSError:
            return  # the channel is gone: so is the supervisor's copy of each connection
        self._unsent = 0

    def _serve(self, descriptor: int, group: int) -> None:
        try:
            self.endpoints[group].adopt_connection(descriptor)
        except Exception as error:
            # One its peer reset while it waited to be accepted has no address left: dropped
            # without a word, as a process that accepts itself never sees it.
            if not (isinstance(error, OSError) and error.errno == errno.ENOTCONN):
                log.failure("cannot serve a connection handed by the supervisor",
                            event="handoff_failed")
        finally:
            os.close(descriptor)

    def _check(self) -> None:
        self._say_taken()
        if not self.alone and self.reactor.seconds() - self.heard >= SILENCE:
            # What the supervisor sent is read first: a worker continued after a SIGSTOP runs
            # its timed calls before it reads, and would take the ticks queued meanwhile for
            # a supervisor's silence (and accept by itself).
            self.doRead()
            if not self.closing and self.reactor.seconds() - self.heard >= SILENCE:
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

    def _lost(self) -> None:
        """The supervisor's end is closed: with no supervisor to hand out, accept alone."""
        self.close()
        self._alone(True)

    def connectionLost(self, reason: Failure) -> None:
        pass
