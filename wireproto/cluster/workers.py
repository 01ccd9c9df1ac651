"""`wireproto serve --workers N`: one set of listeners shared by N broker processes.

The supervisor binds every listener's endpoint itself (so port 0 and unix sockets work, and a
worker that restarts finds the same address), starts a private nats-server when the config names
no `[cluster] url`, and runs each worker as ``python -m wireproto.cluster.worker`` with its
listening sockets as inherited file descriptors. Their hubs share one topic space through NATS
(wireproto.cluster.link).

A TCP (or TLS) listener gets one socket per worker, all bound to its address with
``SO_REUSEPORT``, so the kernel spreads new connections evenly over the workers. (One socket
shared by all would not: every worker is woken for each connection, and the same one tends to
win.) When a worker dies its sockets are closed, so new connections go to the others until it is
back with new ones. Each such socket is bound by the supervisor (which may hold the privileges
a low port needs) and listened on by its worker once it runs, so no connection waits in the
backlog of a worker that is still starting. A unix socket is shared by all workers, as the
kernel does not spread those.

A worker that dies is started again, after a pause that grows while workers keep dying. SIGHUP
is passed to every worker (each rereads its access rules); stopping the supervisor stops the
workers first (their connections' wills go out through NATS), then the private nats-server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer, protocol
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.cluster.server import NatsServer
from wireproto.config import Config
from wireproto.service import BoundListener, ListenFailed, endpoint_groups, format_address
from wireproto.transports.identity import server_endpoint

__all__ = ["WORKER_ENVIRONMENT", "Supervisor"]

log = Logger(namespace="wireproto.cluster")

# What a worker is told by its supervisor: a JSON object in this environment variable.
WORKER_ENVIRONMENT = "WIREPROTO_WORKER"
# A worker that dies sooner than this after starting counts towards a growing restart pause.
QUICK_DEATH = 5.0
MAX_RESTART_PAUSE = 30.0
STOP_TIMEOUT = 15.0


class _Worker(protocol.ProcessProtocol):
    def __init__(self, supervisor: Supervisor, index: int) -> None:
        self.supervisor = supervisor
        self.index = index
        self.ready = False
        self.started = supervisor.reactor.seconds()
        self.ended: defer.Deferred = defer.Deferred()
        self._lines = b""

    def outReceived(self, data: bytes) -> None:
        self._lines += data
        while b"\n" in self._lines:
            line, self._lines = self._lines.split(b"\n", 1)
            if line.strip() == b"ready" and not self.ready:
                self.ready = True
                self.supervisor._worker_ready(self)

    def processEnded(self, reason: Failure) -> None:
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
        self.nats: NatsServer | None = None
        self.cluster_url = config.cluster.url
        self.restarts = 0
        self._ports: list[Any] = []
        # Per endpoint group: None for a port shared by every worker, or the address the
        # workers' own SO_REUSEPORT sockets bind to, as (family, address).
        self._spread: list[tuple[int, Any] | None] = []
        # worker index -> its own sockets, by endpoint group (None where the port is shared)
        self._worker_sockets: dict[int, list[socket.socket | None]] = {}
        self._quick_deaths = 0
        self._ready_waiters: list[defer.Deferred] = []
        self._stopping = False

    # -- starting ---------------------------------------------------------------------------------

    def privilegedStartService(self) -> None:
        self._bind()
        super().privilegedStartService()

    def startService(self) -> None:
        self._bind()
        super().startService()
        if not self.cluster_url:
            directory = tempfile.mkdtemp(prefix="wireproto-nats-")
            self.nats = NatsServer(directory=directory,
                                   extra_config="max_payload: 8MB").start()
            self.cluster_url = self.nats.url
            log.info("started a private nats-server on {url}", event="cluster_private_nats",
                     url=self.cluster_url)
        for index in range(self.count):
            self._spawn(index)

    def _bind(self) -> None:
        """Listen on every endpoint, without accepting: the workers accept."""
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
            family = port.socket.family
            spread = None
            if family in (socket.AF_INET, socket.AF_INET6) and hasattr(socket, "SO_REUSEPORT"):
                spread = (family, port.socket.getsockname())
            self._spread.append(spread)
            for _, listener in group:
                self.bound.append(BoundListener(listener, format_address(listener,
                                                                         port.getHost())))
        # The TCP ports only found the address (port 0 becomes a number): free it for the
        # workers' sockets.
        for port, spread in zip(self._ports, self._spread, strict=True):
            if spread is not None:
                port.socket.close()
        # Made now, while the supervisor may still hold privileges for a port below 1024.
        for index in range(self.count):
            self._make_sockets(index)

    def _sockets_of(self, index: int) -> list[int]:
        """The listening descriptors of worker `index`: its own SO_REUSEPORT sockets (made
        again for a worker started again) and the shared ports."""
        own = self._worker_sockets.get(index) or self._make_sockets(index)
        return [port.fileno() if listening is None else listening.fileno()
                for port, listening in zip(self._ports, own, strict=True)]

    def _make_sockets(self, index: int) -> list[socket.socket | None]:
        own: list[socket.socket | None] = []
        self._worker_sockets[index] = own
        for spread in self._spread:
            if spread is None:
                own.append(None)
                continue
            family, address = spread
            listening = socket.socket(family, socket.SOCK_STREAM)
            try:
                listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    listening.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                listening.bind(address)  # the worker listens, once it is there to accept
            except OSError:
                listening.close()
                self._release(index)
                raise
            listening.setblocking(False)  # a worker's Twisted port accepts until EAGAIN
            listening.set_inheritable(True)
            own.append(listening)
        return own

    def _release(self, index: int) -> None:
        """Close worker `index`'s own sockets: the kernel stops giving them connections."""
        for listening in self._worker_sockets.pop(index, ()):
            if listening is not None:
                listening.close()

    def _spawn(self, index: int) -> None:
        try:
            fds = self._sockets_of(index)
        except OSError as error:
            log.error("cannot listen again for worker {index}: {error}; it stays down",
                      event="worker_listen_failed", index=index, error=str(error))
            return
        spec = {
            "index": index,
            "options": self.options,
            "sockets": fds,
            "cluster_url": self.cluster_url,
            "supervisor": os.getpid(),
        }
        environment = {**os.environ, WORKER_ENVIRONMENT: json.dumps(spec)}
        child_fds: dict[int, Any] = {0: 0, 1: "r", 2: 2}
        child_fds.update({fd: fd for fd in fds})
        worker = _Worker(self, index)
        self.workers[index] = worker
        self.reactor.spawnProcess(
            worker, sys.executable, [sys.executable, "-m", "wireproto.cluster.worker"],
            env=environment, childFDs=child_fds)
        # The worker has its copies; the supervisor's would keep a dead worker's share of new
        # connections waiting, so it keeps only those it must pass again (the shared ports).
        self._release(index)

    def when_ready(self) -> defer.Deferred:
        """Fires once every worker is listening and linked to the others."""
        d: defer.Deferred = defer.Deferred()
        self._ready_waiters.append(d)
        self._fire_ready()
        return d

    def _worker_ready(self, worker: _Worker) -> None:
        log.info("worker {index} (pid {pid}) ready", event="worker_ready", index=worker.index,
                 pid=worker.transport.pid if worker.transport else None)
        self._fire_ready()

    def _fire_ready(self) -> None:
        if len(self.workers) == self.count and all(w.ready for w in self.workers.values()):
            waiters, self._ready_waiters = self._ready_waiters, []
            for d in waiters:
                d.callback(self.bound)

    def _worker_ended(self, worker: _Worker, reason: Failure) -> None:
        if self.workers.get(worker.index) is worker:
            del self.workers[worker.index]
        if self._stopping:
            return
        lived = self.reactor.seconds() - worker.started
        self._quick_deaths = self._quick_deaths + 1 if lived < QUICK_DEATH else 0
        pause = min(0.5 * 2 ** max(self._quick_deaths - 1, 0), MAX_RESTART_PAUSE) \
            if self._quick_deaths else 0.1
        log.warn("worker {index} ended ({why}); starting it again in {pause:.1f} s",
                 event="worker_died", index=worker.index, why=reason.getErrorMessage(),
                 pause=pause)
        self.restarts += 1

        def again() -> None:
            if not self._stopping and worker.index not in self.workers:
                self._spawn(worker.index)

        self.reactor.callLater(pause, again)

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
        ended = [worker.ended for worker in self.workers.values()]
        self.signal_workers(signal.SIGTERM)
        if ended:
            waiting = defer.DeferredList(ended)
            timer = self.reactor.callLater(STOP_TIMEOUT, self.signal_workers, signal.SIGKILL)
            yield waiting
            if timer.active():
                timer.cancel()
        for port, spread in zip(self._ports, self._spread, strict=True):
            if spread is None:
                yield port.stopListening()
        for index in list(self._worker_sockets):
            self._release(index)
        self._ports.clear()
        self._spread.clear()
        if self.nats is not None:
            self.nats.stop()
            self.nats = None
