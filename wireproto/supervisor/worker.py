"""One worker process of `wireproto serve --workers N` (wireproto.supervisor.workers): the broker
on the listening sockets its supervisor passed, serving the connections its supervisor hands it
(wireproto.supervisor.handoff), joined to the other workers through NATS. It
writes ``ready`` to its stdout (a pipe to the supervisor) once it listens and is linked, or
``failed: WHY`` if it cannot start, and then exits 1: the supervisor says why, in one line.
Anything else written to its stdout (an application's prints) goes to its stderr.

Its supervisor decides when it stops, with SIGTERM: from its first line on, a worker ignores
SIGINT (a terminal's Ctrl-C signals the whole process group, the supervisor included), and a
SIGTERM before its reactor runs ends it at once, quietly."""

from __future__ import annotations

import os
import signal

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda number, frame: os._exit(0))

import io  # noqa: E402 - after the signals, which may come while it imports
import json  # noqa: E402
import sys  # noqa: E402
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from wireproto.config import Config

__all__ = ["WORKER_ENVIRONMENT", "WORKER_FAILED", "main"]

# What a worker is told by its supervisor: a JSON object in this environment variable.
WORKER_ENVIRONMENT = "WIREPROTO_WORKER"
# What a worker writes to its stdout, a pipe to the supervisor: "ready", or this and why not.
WORKER_FAILED = "failed: "


def main() -> int:
    from twisted.internet import defer, reactor
    from twisted.internet.base import ReactorBase
    from twisted.internet.interfaces import IReactorFromThreads
    from twisted.python.failure import Failure

    from wireproto.config import config_from_options
    from wireproto.program import start_logging
    from wireproto.service import Siblings, describe_error, make_service, reload_on_sighup
    from wireproto.service.app import run_app
    from wireproto.service.presence import PRESENCE_PATTERN, presence_wanted
    from wireproto.supervisor.natsserver import die_with_parent

    spec = json.loads(os.environ[WORKER_ENVIRONMENT])
    die_with_parent()
    if os.getppid() != spec["supervisor"]:
        return 1  # the supervisor died before the line above
    index = spec["index"]
    options = spec["options"]
    exit_code = 0
    # The pipe to the supervisor on a descriptor of its own, and stdout sent to stderr: what the
    # application (--app) prints shows, and never passes for "ready" or "failed: ".
    report = os.fdopen(os.dup(1), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(2, 1)
    # A line a write, as stderr: the workers share it, and a pipe takes a write of a line whole,
    # so two workers' lines never run together.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)

    def cannot_start(error: BaseException) -> None:
        """Tell the supervisor why, in one line; this process then exits 1."""
        nonlocal exit_code
        why = "; ".join(describe_error(error).splitlines())  # a ConfigError's problems too
        report.write(f"{WORKER_FAILED}{why}\n")
        report.flush()
        exit_code = 1

    def worker_config() -> Config:
        config = config_from_options(options, reactor=reactor)
        cluster = config.cluster
        node = f"{cluster.node or os.uname().nodename}/worker{index}"
        cluster = replace(cluster, url=spec["cluster_url"], workers=1, node=node)
        if spec.get("nkey_seed_file"):
            # The supervisor's private nats-server: its key, and no other credentials.
            cluster = replace(cluster, user="", password_file="", token_file="", creds_file="",
                              nkey_seed_file=spec["nkey_seed_file"])
        if index != 0:
            # A device is opened by one process: two reading one serial port would each get
            # part of its bytes. Worker 0 holds every link (started again, it opens them again);
            # the others keep the links' presence, which the cluster shares with them.
            hub = config.hub
            if presence_wanted(config):
                hub = replace(hub, retain=(*hub.retain, PRESENCE_PATTERN))
            return config.replace(cluster=cluster, hub=hub, attach=(), phyllo=())
        return config.replace(cluster=cluster)

    def supervisor_name(config: Config) -> str:
        """HOST/supervisor beside HOST/worker0, ..., in the metrics."""
        return config.cluster.node.rpartition("/")[0] + "/supervisor"

    try:
        config = worker_config()
        start_logging(config.log, bool(options.get("verbose")), worker=index)
        # The other workers: each serves the Engine.IO sessions it holds (its private socket).
        private_sockets = spec.get("private_sockets")
        siblings = Siblings(index, tuple(private_sockets)) if private_sockets else None
        service = make_service(config, reactor, listening_sockets=spec["sockets"],
                               siblings=siblings,
                               supervisor=(spec["supervisor"], supervisor_name(config),
                                           spec.get("supervisor_version", "")))
        if spec.get("handoff") is not None:
            from twisted.internet.posixbase import PosixReactorBase

            from wireproto.supervisor.handoff import Receiver

            receiver = Receiver.attach(cast(PosixReactorBase, reactor), spec["handoff"],
                                       service.listeners.adopted)
            # First thing as it stops: its supervisor hands its connections to the others.
            reactor.addSystemEventTrigger("before", "shutdown", receiver.close)
    except Exception as error:  # the config, its log file, a part that cannot be made
        cannot_start(error)
        return exit_code

    def start() -> None:
        # The application's function first, as under `wireproto serve`: its handlers are in
        # place before this worker accepts or announces its calls. A worker started again runs
        # it again.
        in_app.append(True)
        try:
            setting_up = run_app(service)
        finally:
            in_app.clear()
        setting_up.addCallbacks(start_service, app_failed)

    def app_failed(reason: Failure) -> None:
        if not stopping:
            cannot_start(reason.value)
            stop()

    def start_service(_: None) -> None:
        if stopping:
            return
        try:
            service.startService()
        except Exception as error:
            cannot_start(error)
            stop()
            return
        assert service.cluster is not None
        ready = defer.gatherResults([service.when_listening(), service.cluster.when_ready()],
                                    consumeErrors=True)

        def announce(_: Any) -> None:
            report.write("ready\n")
            report.flush()

        def failed(reason: Failure) -> None:
            cannot_start(reason.value.subFailure.value)
            stop()

        ready.addCallbacks(announce, failed)

    reload_on_sighup(service, lambda: worker_config().acl, reactor)
    reactor.callWhenRunning(start)
    reactor.addSystemEventTrigger(
        "before", "shutdown", lambda: service.stopService() if service.running else None)
    stopping: list[int] = []
    # While the app's function runs (its own code, which may block), the reactor cannot stop.
    in_app: list[bool] = []

    def stop(number: int = 0) -> None:
        # A start that failed, the supervisor's SIGTERM and the parent-death signal (SIGTERM
        # too) may all come: the first one stops the worker.
        if not stopping:
            stopping.append(number)
            reactor.stop()

    def stop_once(number: int, frame: Any) -> None:
        if in_app:
            # Nothing is accepted or linked yet: exit now, or a function that blocks would keep
            # this worker (and the sockets it holds) after its supervisor has gone.
            os._exit(1)
        IReactorFromThreads(reactor).callFromThread(stop, number)

    signal.signal(signal.SIGTERM, stop_once)
    # Every Twisted reactor is a ReactorBase, whose run() can leave the signals to this process.
    cast(ReactorBase, reactor).run(installSignalHandlers=False)
    # Stopped: another SIGTERM changes nothing (Python's exit would let it kill the process).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
