"""`wireproto serve --workers N`: one set of listeners shared by N broker processes.

The supervisor binds every listener's endpoint itself (so port 0 and unix sockets work, and a
worker that restarts finds the same sockets), starts a private nats-server when the config names
no `[cluster] url`, and runs each worker as ``python -m wireproto.supervisor.worker`` with the
listening sockets as inherited file descriptors. The supervisor accepts each new connection and
hands it to one of the workers in turn (wireproto.supervisor.handoff); their hubs share one topic
space through NATS (wireproto.cluster.link).

The private nats-server admits only the workers: each start makes a fresh NKey, tells the
server its public key (in a config file only this user reads) and leaves its seed in a file
beside it, in a directory only this user may enter; a worker is told the file's path. So
another local user cannot join the cluster, and no key is ever on a command line. A private
nats-server that ends or stops answering is started again where it was
(wireproto.supervisor.privatenats), and the workers reconnect to it.

Each worker also listens on a private unix socket, in a directory of the supervisor's own (0700,
removed when it stops), where the other workers pass it the Engine.IO requests for the sessions
it holds (wireproto.service.siblings): each worker is told every worker's socket in its spec.

A worker that dies is started again, after a pause that grows while workers keep dying. SIGHUP
is passed to every worker (each rereads its access rules); stopping the supervisor stops the
workers first (their connections' wills go out through NATS), then the private nats-server,
which is not started again from the moment the supervisor begins to stop.

A supervisor that cannot start what its config asks for (bind a listener, start its
nats-server, or have each worker start its broker) does not run on half started: `when_ready`
fails with the reason, which its caller reports in one line before stopping. Once every worker
has been ready, a worker that fails is started again, as one that dies.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer, protocol
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto import __version__
from wireproto.config import Config
from wireproto.service import (
    BoundListener,
    ListenFailed,
    StartFailed,
    endpoint_groups,
    format_address,
)
from wireproto.supervisor.handoff import Handoff
from wireproto.supervisor.privatenats import PrivateNats, remove_abandoned_directories
from wireproto.supervisor.restarts import RestartPause
from wireproto.supervisor.worker import WORKER_ENVIRONMENT, WORKER_FAILED
from wireproto.transports.identity import server_endpoint

__all__ = ["WORKER_ENVIRONMENT", "WORKER_FAILED", "Supervisor", "remove_abandoned_directories"]

log = Logger(namespace="wireproto.cluster")

STOP_TIMEOUT = 15.0
# A worker's pipes normally close as it exits; one that a process it forked still holds open
# is taken for closed this long after the worker exited.
PIPES_GRACE = 1.0
# A worker not ready this long after it was started is logged, and again after each doubling.
NOT_READY_NOTICE = 10.0
# The supervisor's directory, with each worker's private socket.
WORKERS_PREFIX = "wireproto-workers-"


class _Worker(protocol.ProcessProtocol):
    def __init__(self, supervisor: Supervisor, index: int) -> None:
        self.supervisor = supervisor
        self.index = index
        # Its process's id, kept after it ended, to say which process it was.
        self.pid: int | None = None
        self.ready = False
        self.started = supervisor.reactor.seconds()
        self.ended: defer.Deferred = defer.Deferred()
        self._lines = b""
        self._pipes_grace: IDelayedCall | None = None

    def outReceived(self, data: bytes) -> None:
        self._lines += data
        while b"\n" in self._lines:
            line, self._lines = self._lines.split(b"\n", 1)
            text = line.decode("utf-8", "replace").strip()
            if text == "ready" and not self.ready:
                self.ready = True
                self.supervisor._worker_ready(self)
            elif text.startswith(WORKER_FAILED):
                self.supervisor._worker_failed(self, text.removeprefix(WORKER_FAILED))

    def processExited(self, reason: Failure) -> None:
        # What it had been handed and not taken goes to another worker now. Its last report may
        # still be in its pipe, read before processEnded; but a process the worker forked (an
        # app's) may hold that pipe open for ever.
        self.supervisor._worker_exited(self)
        self._pipes_grace = self.supervisor.reactor.callLater(PIPES_GRACE, self._held, reason)

    def _held(self, reason: Failure) -> None:
        """The worker exited, and its pipes are still open: not read any more."""
        if self.transport is not None:
            self.transport.loseConnection()
        self._end(reason)

    def processEnded(self, reason: Failure) -> None:
        self._end(reason)

    def _end(self, reason: Failure) -> None:
        if self.ended.called:
            return
        if self._pipes_grace is not None and self._pipes_grace.active():
            self._pipes_grace.cancel()
        self.ended.callback(None)
        self.supervisor._worker_ended(self, reason)


class Supervisor(Service):
    """Runs `config.cluster.workers` broker processes on `config`'s listeners. `options` are
    the ``wireproto serve`` options each worker builds its config from (as
    `config_from_options` takes them), so a worker reads the same file on SIGHUP."""

    def __init__(self, config: Config, options: Mapping[str, Any], reactor: Any) -> None:
        self.config = config
        self.options = dict(options)
        self.reactor = reactor
        self.count = config.cluster.workers
        self.workers: dict[int, _Worker] = {}
        self.bound: list[BoundListener] = []
        # The private nats-server, when the config names no [cluster] url.
        self.nats: PrivateNats | None = None
        self.cluster_url = config.cluster.url
        # The file of the NKey seed the workers sign with, for the private nats-server.
        self.nkey_seed_file: str | None = None
        self.restarts = 0
        # The supervisor's own directory (0700), where each worker has its private socket.
        self.private_directory: str | None = None
        self._ports: list[Any] = []
        # Accepts on the listening sockets and hands each connection to a worker.
        self.handoff: Handoff | None = None
        self._restart_pause = RestartPause()
        self._ready_waiters: list[defer.Deferred[list[BoundListener]]] = []
        self._stopping = False
        # Every worker has been ready at once: from then on a worker that fails is restarted.
        self._was_ready = False
        # Why the supervisor could not start, once it could not.
        self.failure: Exception | None = None

    # -- starting ---------------------------------------------------------------------------------

    def privilegedStartService(self) -> None:
        try:
            self._bind()
        except Exception as error:
            self._fail(error)
        super().privilegedStartService()

    def startService(self) -> None:
        """Bind, start the private nats-server, spawn the workers; what fails goes to
        `when_ready`, never raised."""
        super().startService()
        if self.failure is not None:
            return
        try:
            self._bind()
            remove_abandoned_directories(prefix=WORKERS_PREFIX)
            # mkdtemp's directory is this user's alone (0700).
            self.private_directory = tempfile.mkdtemp(prefix=f"{WORKERS_PREFIX}{os.getpid()}-")
        except Exception as error:
            self._fail(error)
            return
        if self.cluster_url:
            self._spawn_all()
            return
        self.nats = PrivateNats(self.reactor)
        self.nats.start().addCallbacks(self._private_nats_started, self._private_nats_failed)

    def _private_nats_started(self, url: str) -> None:
        if self._stopping or self.nats is None:
            return
        self.cluster_url = url
        self.nkey_seed_file = self.nats.seed_file
        log.info("started a private nats-server on {url}", event="cluster_private_nats", url=url)
        self._spawn_all()

    def _private_nats_failed(self, reason: Failure) -> None:
        self._fail(reason.value if isinstance(reason.value, Exception) else
                   RuntimeError(reason.getErrorMessage()))

    def _spawn_all(self) -> None:
        for index in range(self.count):
            if self.failure is None:
                self._spawn(index)

    def _fail(self, error: Exception) -> None:
        """The supervisor cannot start: `when_ready` fails with `error`, and no worker is
        started again."""
        if self.failure is not None:
            return
        self.failure = error
        waiters, self._ready_waiters = self._ready_waiters, []
        for waiter in waiters:
            waiter.errback(error)

    def _bind(self) -> None:
        """Listen on every endpoint; the connections are accepted by `handoff`."""
        if self._ports:
            return
        for group in endpoint_groups(self.config.listeners):
            first = group[0][1]
            d = server_endpoint(self.reactor, first.endpoint).listen(Factory())
            failures: list[Failure] = []
            ports: list[Any] = []
            d.addCallbacks(ports.append, failures.append)
            if failures:
                for port in self._ports:
                    port.stopListening()
                self._ports.clear()
                raise ListenFailed(tuple(listener for _, listener in group), failures[0])
            port = ports[0]
            port.stopReading()
            os.set_inheritable(port.fileno(), True)
            self._ports.append(port)
            for _, listener in group:
                self.bound.append(BoundListener(listener, format_address(listener,
                                                                         port.getHost())))
        self.handoff = Handoff(self.reactor, [port.socket for port in self._ports])
        self.handoff.start()

    def _spawn(self, index: int) -> None:
        fds = [port.fileno() for port in self._ports]
        assert self.handoff is not None
        channel = self.handoff.open_channel(index)
        spec = {
            "index": index,
            "options": self.options,
            "sockets": fds,
            "cluster_url": self.cluster_url,
            "nkey_seed_file": self.nkey_seed_file,
            "supervisor": os.getpid(),
            "supervisor_version": __version__,  # its build_info, which the workers serve
            "private_sockets": self._private_sockets(),
            "handoff": channel,
        }
        environment = {**os.environ, WORKER_ENVIRONMENT: json.dumps(spec)}
        child_fds: dict[int, Any] = {0: 0, 1: "r", 2: 2}
        child_fds.update({fd: fd for fd in [*fds, channel]})
        worker = _Worker(self, index)
        try:
            process = self.reactor.spawnProcess(
                worker, sys.executable, [sys.executable, "-m", "wireproto.supervisor.worker"],
                env=environment, childFDs=child_fds)
        except Exception as error:  # no process left to this user, no descriptor, no memory
            os.close(channel)
            self.handoff.ended(index)
            self._cannot_spawn(index, error)
            return
        self.workers[index] = worker
        worker.pid = process.pid
        self.handoff.started(index, process.pid, channel)
        self.reactor.callLater(NOT_READY_NOTICE, self._not_ready_yet, worker, NOT_READY_NOTICE)

    def _cannot_spawn(self, index: int, error: Exception) -> None:
        """No process could be made for the worker `index`: at the start, the supervisor cannot
        start; later, it tries again as for a worker that died."""
        why = f"could not be started: {error}"
        if not self._was_ready:
            self._fail(StartFailed(f"worker {index}", why))
            return
        pause = self._restart_pause.after(0.0)
        log.error("worker {index} {why}; trying again in {pause:.1f} s", event="worker_failed",
                  index=index, why=why, pause=pause)
        self.reactor.callLater(pause, self._spawn_again, index)

    def _spawn_again(self, index: int) -> None:
        if not self._stopping and self.failure is None and index not in self.workers:
            self._spawn(index)

    def _not_ready_yet(self, worker: _Worker, after: float) -> None:
        """Say so while `worker` is still starting (its app's function, say, has not returned):
        nothing times it out."""
        if worker.ready or worker.ended.called or self._stopping or self.failure is not None:
            return
        log.warn("worker {index} (pid {pid}) is not ready after {after:.0f} s",
                 event="worker_not_ready", index=worker.index, pid=worker.pid, after=after)
        self.reactor.callLater(after, self._not_ready_yet, worker, after * 2)

    def _private_sockets(self) -> list[str]:
        """Each worker's private socket, by index, where the others pass it the Engine.IO
        requests for its sessions (wireproto.service.siblings)."""
        assert self.private_directory is not None
        return [os.path.join(self.private_directory, f"{index}.sock")
                for index in range(self.count)]

    def when_ready(self) -> defer.Deferred[list[BoundListener]]:
        """Fires once every worker is listening and linked to the others; fails with what
        stopped the supervisor from starting (a `ListenFailed`, a `StartFailed`...)."""
        if self.failure is not None:
            return defer.fail(self.failure)
        d: defer.Deferred[list[BoundListener]] = defer.Deferred()
        self._ready_waiters.append(d)
        self._fire_ready()
        return d

    def _worker_ready(self, worker: _Worker) -> None:
        log.info("worker {index} (pid {pid}) ready", event="worker_ready", index=worker.index,
                 pid=worker.pid)
        if self.handoff is not None and self.workers.get(worker.index) is worker:
            self.handoff.ready(worker.index)
        self._fire_ready()

    def _worker_failed(self, worker: _Worker, why: str) -> None:
        """`worker` could not start its broker: at the start, the supervisor cannot start
        either; later, the worker is started again as one that dies."""
        if not self._was_ready:
            self._fail(StartFailed(f"worker {worker.index}", why))
        else:
            log.error("worker {index} (pid {pid}) could not start: {why}",
                      event="worker_failed", index=worker.index, pid=worker.pid, why=why)

    def _fire_ready(self) -> None:
        if self.failure is not None:
            return
        if len(self.workers) == self.count and all(w.ready for w in self.workers.values()):
            self._was_ready = True
            waiters, self._ready_waiters = self._ready_waiters, []
            for d in waiters:
                d.callback(self.bound)

    def _worker_exited(self, worker: _Worker) -> None:
        if self.handoff is not None and self.workers.get(worker.index) is worker:
            self.handoff.ended(worker.index)

    def _worker_ended(self, worker: _Worker, reason: Failure) -> None:
        if self.workers.get(worker.index) is worker:
            del self.workers[worker.index]
            if self.handoff is not None:
                self.handoff.ended(worker.index)
        if self._stopping or self.failure is not None:
            return
        if not self._was_ready:
            # At the start, a worker that ends before it is ready (its app stopped its reactor,
            # say) fails the start, as one that says why.
            self._fail(StartFailed(f"worker {worker.index}",
                                   f"ended before it was ready ({reason.getErrorMessage()})"))
            return
        pause = self._restart_pause.after(self.reactor.seconds() - worker.started)
        log.warn("worker {index} (pid {pid}) ended ({why}); starting it again in {pause:.1f} s",
                 event="worker_died", index=worker.index, pid=worker.pid,
                 why=reason.getErrorMessage(), pause=pause)
        self.restarts += 1

        self.reactor.callLater(pause, self._spawn_again, worker.index)

    # -- running ----------------------------------------------------------------------------------

    def signal_workers(self, number: int) -> None:
        for worker in self.workers.values():
            if worker.transport is not None and worker.transport.pid:
                try:
                    worker.transport.signalProcess(number)
                except OSError:
                    pass

    def worker_pids(self) -> list[int]:
        return [worker.transport.pid for _, worker in sorted(self.workers.items())
                if worker.transport is not None and worker.transport.pid]

    # -- stopping ---------------------------------------------------------------------------------

    @defer.inlineCallbacks
    def stopService(self) -> Any:
        self._stopping = True
        super().stopService()
        if self.nats is not None:
            # Not started again from now on; stopped once the workers are gone.
            self.nats.stop_watching()
        if self.handoff is not None:
            self.handoff.stop()
        ended = [worker.ended for worker in self.workers.values()]
        self.signal_workers(signal.SIGTERM)
        if ended:
            waiting = defer.DeferredList(ended)
            timer = self.reactor.callLater(STOP_TIMEOUT, self.signal_workers, signal.SIGKILL)
            yield waiting
            if timer.active():
                timer.cancel()
        for port in self._ports:
            yield port.stopListening()
        self._ports.clear()
        if self.private_directory is not None:
            shutil.rmtree(self.private_directory, ignore_errors=True)
        if self.nats is not None:
            self.nats.stop()
