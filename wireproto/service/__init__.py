"""The running broker as a Twisted service, built from a `wireproto.config.Config`.

`make_service` gives a `WireprotoService` around one `Hub`. It assembles the broker's parts as
its child services, which start in this order and stop in the reverse one
(wireproto.service.parts):

- with ``[capture] directory`` set, `service.capture` (wireproto.capture.wrapper): every message
  in and out of every listener's and link's connection goes to capture files;
- with a ``[hub] retain_file``, the last values written to it every second;
- with ``[cluster] url``, `service.cluster` (wireproto.cluster): the hub joined to the other
  broker processes through NATS;
- `service.connections` (wireproto.service.connections): the server role of each protocol and
  each connection's protocol, all of them closed on the way out, their wills published before
  the cluster link goes;
- with ``[admin]``, the status page, its API and the ``$SYS`` topics (wireproto.admin);
- `service.listeners` (wireproto.service.listeners): one endpoint service per distinct
  listening endpoint, WebSocket listeners on one endpoint sharing a twisted.web `Site`, each
  protocol at its own path, with ``[metrics]`` (wireproto.metrics) and the admin page on every
  HTTP port;
- `service.links` (wireproto.service.links): each attached link and each Phyllo link
  (`service.phyllo[name]` is its bridge), reopened with a backoff whenever it closes; a table
  with ``each_board`` is a fleet (wireproto.service.fleet), one link per board plugged in,
  and each serial link's presence is ``$devices/LINK`` (wireproto.service.presence).

The same service runs under `wireproto serve`, under `twistd wireproto`, or inside another Twisted
application (``make_service(config).setServiceParent(application)``). `when_listening` reports the
real address of each listener once it is bound, so port 0 is usable.
"""

from __future__ import annotations

import os
import socket
import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from wireproto import peerlog, speedups
from wireproto.access import AccessRule
from wireproto.access.quotas import PrincipalLimits
from wireproto.admin import AdminConsole
from wireproto.authentication import Authentication
from wireproto.broker import BoundListener
from wireproto.capture.wrapper import BrokerCapture
from wireproto.cluster.callcapture import CallCapture
from wireproto.cluster.link import ClusterLink
from wireproto.cluster.settings import ClusterSettings
from wireproto.config import (
    Attach,
    CaptureSettings,
    Config,
    ConfigError,
    Listener,
    PhylloLink,
)
from wireproto.devices.watch import PortWatcher
from wireproto.hub import Hub, Session
from wireproto.metrics import ServiceMetrics
from wireproto.phyllo.bridge import HubBridge
from wireproto.service.connections import Connections
from wireproto.service.fleet import Fleet
from wireproto.service.links import Links
from wireproto.service.listeners import (
    AdoptedEndpoint,
    Listeners,
    ListenFailed,
    endpoint_groups,
    format_address,
)
from wireproto.service.parts import OrderedParts, Part, StartFailed, describe_error
from wireproto.service.presence import PRESENCE_PATTERN, presence_wanted
from wireproto.service.siblings import Siblings
from wireproto.transports.base import MessageProtocol, go_away
from wireproto.transports.http import GuardedSite
from wireproto.transports.reconnect import DEFAULT_RETRY

__all__ = [
    "AdoptedEndpoint",
    "BoundListener",
    "endpoint_groups",
    "format_address",
    "ListenFailed",
    "Siblings",
    "StartFailed",
    "describe_error",
    "WireprotoService",
    "make_service",
    "reload_on_sighup",
]

log = Logger(namespace="wireproto.service")


class WireprotoService(OrderedParts):
    """Every part of one broker, around one hub."""

    def __init__(self, config: Config, hub: Hub, reactor: Any,
                 listening_sockets: list[int] | None = None,
                 siblings: Siblings | None = None,
                 supervisor: tuple[int, str, str] | None = None,
                 ports: PortWatcher | None = None) -> None:
        super().__init__()
        self.config = config
        self.hub = hub
        self.reactor = reactor
        if presence_wanted(config):
            # Kept before the parts that read the hub's last values are made.
            hub.keep_last_values(PRESENCE_PATTERN)
        try:
            self.capture = _capture(config.capture, config.cluster, reactor)
        except ValueError as error:  # an upload target pyarrow cannot reach, or no pyarrow
            raise ConfigError(f"capture: {error}") from None
        # With [auth]: the credentials and rules; the hub checks its policy.
        self.auth: Authentication | None = None
        # The admins may read the $SYS topics, whatever the [[acl]] rules say.
        self._admin_rules = config.admin.sys_rules() if config.admin.enabled else ()
        if config.auth.enabled:
            try:
                self.auth = Authentication(config.auth, config.acl + self._admin_rules, reactor)
            except ValueError as error:  # an [auth] file that cannot be read or used
                raise ConfigError(f"auth: {error}") from None
            hub.policy = self.auth.policy
            hub.max_denials = config.auth.close_after_denials
            hub.expiry_leeway = config.auth.expiry_leeway
        hub.clock = reactor
        if speedups.compiled_problem and os.environ.get("WIREPROTO_PURE_PYTHON") != "1":
            log.warn("the fast path runs in plain Python, slower: the compiled one is {problem}",
                     event="fast_path_pure", problem=speedups.compiled_problem)
        hub.limits = PrincipalLimits(config.limits)
        peerlog.count_ipv6_by(config.limits.ipv6_prefix)
        # With [cluster] url: the other broker processes, through NATS.
        self.cluster: ClusterLink | None = None
        if config.cluster.enabled:
            try:
                self.cluster = ClusterLink(hub, config.cluster, reactor)
            except (OSError, ValueError) as error:  # a credentials file, a server URL
                raise ConfigError(f"cluster: {error}") from None
            if self.capture is not None:
                # The calls between processes go to the capture too, so a fleet's can be paired.
                self.cluster.calls.recorder = CallCapture(self.capture, config.cluster.url)
        self.connections = Connections(config, hub, reactor, self.capture)
        # Engine.IO requests passed to the worker that holds their session, and taken from the
        # others, by outcome; None when it is no worker of a supervisor.
        self.engineio_handovers: Counter[str] | None = None if siblings is None else Counter()
        self.links = Links(config, hub, reactor, self.connections, self.auth, ports,
                           None if self.cluster is None else self.cluster.when_ready)
        # Read at once: the registry asks its collectors what they show.
        self.metrics = ServiceMetrics(self, supervisor) if config.metrics.enabled else None
        self.connections.metrics = self.metrics
        # The status page, the browser clients, the admin API and the $SYS topics.
        self.admin = AdminConsole(self, config.admin, reactor) if config.admin.enabled else None
        self.listeners = Listeners(config, reactor, self.connections, auth=self.auth,
                                   metrics=self.metrics, admin=self.admin,
                                   listening_sockets=listening_sockets, siblings=siblings,
                                   handovers=self.engineio_handovers)
        self._add_parts()

    def _add_parts(self) -> None:
        """The parts as child services, in the order they start (and the reverse of the one
        they stop in)."""
        capture, reactor = self.capture, self.reactor
        if capture is not None:
            Part(f"capture {capture.directory}", capture.start,
                 lambda: capture.close(reactor)).setServiceParent(self)
        retained = self.hub.retained
        if retained is not None and retained.persistent:
            flushing = task.LoopingCall(retained.flush)
            flushing.clock = reactor

            def stop_flushing() -> None:
                flushing.stop()
                retained.flush()  # the wills just published included

            Part("[hub] retain_file", lambda: flushing.start(1.0, now=False),
                 stop_flushing).setServiceParent(self)
        if self.cluster is not None:
            Part("cluster", self.cluster.start, self.cluster.stop).setServiceParent(self)
        self.connections.setServiceParent(self)
        if self.admin is not None:
            Part("admin", self.admin.start, self.admin.stop).setServiceParent(self)
        self.listeners.setServiceParent(self)
        self.links.setServiceParent(self)

    # The log observer for the application this service joins, if it has none (the twistd
    # plugin sets it: twistd's own observer, filtered by [log] level).
    parent_log_observer: Any = None

    def setServiceParent(self, parent: Any) -> Any:
        result = super().setServiceParent(parent)
        self.give_log_observer(parent)
        return result

    def give_log_observer(self, application: object) -> None:
        """`parent_log_observer` as `application`'s, if it takes one and has none."""
        from twisted.python.components import Componentized

        observer = self.parent_log_observer
        if observer is not None and isinstance(application, Componentized):
            from twisted.logger import ILogObserver

            if application.getComponent(ILogObserver, None) is None:
                application.setComponent(ILogObserver, observer)

    # -- what its parts hold ----------------------------------------------------------------------

    @property
    def cluster_node(self) -> str | None:
        """This process's name among the cluster's, or None without a cluster."""
        return None if self.cluster is None else self.cluster.node

    @property
    def node(self) -> str:
        """This process's name: its cluster name, or its host name and process id."""
        return self.cluster_node or f"{socket.gethostname()}:{os.getpid()}"

    @property
    def phyllo(self) -> dict[str, HubBridge]:
        """Each Phyllo link's bridge to the hub, by its name."""
        return self.links.phyllo

    @property
    def http_sites(self) -> list[GuardedSite]:
        """The HTTP sites of its listeners, for their refusals."""
        return self.connections.http_sites

    @property
    def bound(self) -> list[BoundListener]:
        """The listeners bound so far, with their addresses."""
        return self.listeners.bound

    @property
    def listen_errors(self) -> list[ListenFailed]:
        return self.listeners.errors

    @property
    def log_listen_errors(self) -> bool:
        """Whether a listener that cannot bind is logged (the CLI reports it itself)."""
        return self.listeners.log_errors

    @log_listen_errors.setter
    def log_listen_errors(self, logged: bool) -> None:
        self.listeners.log_errors = logged

    def served_protocols(self) -> list[str]:
        """The protocols of the listeners and attached links, each once, in config order."""
        found = [listener.protocol for listener in self.config.listeners]
        found += [link.protocol for link in self.config.attach]
        return list(dict.fromkeys(found))

    def server(self, protocol: str) -> Callable[[], MessageProtocol]:
        """The server role of `protocol` on this service's hub, made once and shared by all its
        listeners: for UBRE, the `UbreServer` to register handlers and hooks on."""
        return self.connections.server(protocol)

    def when_listening(self) -> defer.Deferred[list[BoundListener]]:
        """Fires, once every listener has tried to bind, with the `BoundListener`s in config
        order; or fails with the first `ListenFailed`."""
        return self.listeners.when_listening()

    # -- building ---------------------------------------------------------------------------------

    def add_listeners(self, listeners: tuple[Listener, ...]) -> None:
        self.listeners.add(listeners)

    def add_attach(self, link: Attach, retry_policy: Callable[[int], float]) -> None:
        self.links.attach(link, retry_policy)

    def add_phyllo(self, link: PhylloLink, retry_policy: Callable[[int], float]) -> HubBridge:
        return self.links.add_phyllo(link, retry_policy)

    def add_fleet(self, table: PhylloLink | Attach, retry_policy: Callable[[int], float]
                  ) -> Fleet:
        """One link per board `table` (``each_board = true``) matches, as they come and go."""
        fleet = Fleet(self.links, table, retry_policy)
        fleet.setServiceParent(self.links)
        return fleet

    # -- what an operator does to it ------------------------------------------------------------

    def close_session(self, session: Session, reason: str) -> None:
        """Close one connection cleanly (an admin asked); its will is published."""
        log.info("closing {protocol} session {session} from {peer}: {reason}",
                 event="session_closed_by_admin", protocol=session.protocol,
                 session=session.id, peer=session.peer, reason=reason)
        go_away(session.transport)

    def close_connections(self, timeout: float | None = None) -> defer.Deferred[None]:
        """Close every open connection cleanly; abort those still open after `timeout` s."""
        return self.connections.close_all(timeout)

    def reload_auth(self, rules: tuple[AccessRule, ...] | None = None) -> bool:
        """Reread the [auth] key and password files and take `rules` (the same rules if None),
        as SIGHUP does: every connection whose credential the new files withdraw is closed,
        and every subscription the new rules forbid is ended. False, with the old files and
        rules kept and the reason logged, if a file is bad."""
        auth = self.auth
        if auth is None:
            log.warn("reload: no [auth] table, so nothing to reload", event="auth_reload_skipped")
            return False
        old_rules = auth.rules
        if rules is not None:
            auth.rules = rules + self._admin_rules
        if not auth.reload():
            auth.rules = old_rules
            return False
        closed = self.hub.end_withdrawn(auth.withdrawn)
        ended = self.hub.set_policy(auth.policy)
        log.info("reload: {rules} access rules; {ended} subscriptions ended; {closed} "
                 "connections closed, their credentials withdrawn", event="auth_reloaded",
                 rules=len(auth.rules) - len(self._admin_rules), ended=ended, closed=closed)
        return True

    # -- starting ---------------------------------------------------------------------------------

    def privilegedStartService(self) -> None:
        # Under twistd, listening happens here, before privileges are dropped; a port that cannot
        # be bound, or a part that cannot start, stops twistd at once, as twistd's own strports
        # listeners do: in one logged line and status 1, without a traceback.
        try:
            super().privilegedStartService()
        except StartFailed as failed:
            log.error("wireproto: {error}", event="start_failed", error=str(failed))
            raise SystemExit(1) from None
        if self.listen_errors:
            # Logged in one line already.
            raise SystemExit(1)


def _capture(settings: CaptureSettings, cluster: ClusterSettings,
             reactor: IReactorTime) -> BrokerCapture | None:
    if not settings.directory:
        return None
    return BrokerCapture(
        settings.directory, max_file_bytes=settings.max_file_bytes,
        flush_interval=settings.flush_interval, file_mode=settings.file_mode,
        reactor=reactor, broker=settings.node or cluster.node or None,
        cluster=cluster.subject_prefix if cluster.enabled else None,
        upload=settings.upload, upload_options=settings.upload_options(),
    )


def reload_on_sighup(
    service: WireprotoService, reread_rules: Callable[[], tuple[AccessRule, ...]],
    reactor: Any,
) -> None:
    """On SIGHUP, take the rules `reread_rules()` gives (it reads the config file again) and
    reread the [auth] files, as mosquitto does; a file that cannot be read or used (a
    ConfigError) changes nothing and is logged. For `wireproto serve` and twistd; a host
    application calls `service.reload_auth` itself, on its own signal."""
    import signal

    def reload() -> None:
        try:
            rules = reread_rules()
        except ConfigError as error:
            log.error("reload failed, keeping the old rules: {error}", event="auth_reload_failed",
                      error=str(error))
            return
        service.reload_auth(rules)

    signal.signal(signal.SIGHUP, lambda number, frame: reactor.callFromThread(reload))


def _hub(config: Config) -> Hub:
    """The hub; with a [hub] retain_file, its last values read back from it, or StartFailed."""
    retain_file = config.hub.retain_file if config.hub.retain else ""
    try:
        return Hub(**asdict(config.hub))
    except (OSError, sqlite3.Error) as error:
        if not retain_file:
            raise
        raise StartFailed(f"[hub] retain_file {retain_file}", error) from None


def make_service(
    config: Config,
    reactor: Any = None,
    *,
    retry_policy: Callable[[int], float] = DEFAULT_RETRY,
    listening_sockets: list[int] | None = None,
    siblings: Siblings | None = None,
    supervisor: tuple[int, str, str] | None = None,
    ports: PortWatcher | None = None,
) -> WireprotoService:
    """The broker `config` describes, ready to start (or to add to an application).

    `service.hub` is its hub; `service.when_listening()` gives the bound addresses.
    `retry_policy(attempt) -> seconds` paces the reopening of attached links.
    `listening_sockets` are the file descriptors a worker process listens on, bound by its
    supervisor (wireproto.supervisor), one per `endpoint_groups(config.listeners)` entry;
    `siblings` are the supervisor's other workers, which serve the Engine.IO sessions they hold
    (wireproto.service.siblings); `supervisor`, (pid, name, version), is a worker's
    supervisor, whose process metrics and build info its scrapes show too.
    A part that cannot be made (a last-values file that is no database...) is StartFailed.
    """
    if reactor is None:
        from twisted.internet import reactor
    hub = _hub(config)
    service = WireprotoService(config, hub, reactor, listening_sockets, siblings, supervisor,
                               ports)
    service.add_listeners(config.listeners)
    for link in config.attach:
        if link.each_board:
            service.add_fleet(link, retry_policy)
        else:
            service.add_attach(link, retry_policy)
    for phyllo in config.phyllo:
        if phyllo.each_board:
            service.add_fleet(phyllo, retry_policy)
        else:
            service.add_phyllo(phyllo, retry_policy)
    return service
