"""The running broker as a Twisted service, built from a `wireproto.config.Config`.

`make_service` gives a `WireprotoService` (a `MultiService`) holding one `Hub` and:

- one `StreamServerEndpointService` per distinct listening endpoint. WebSocket listeners on the
  same endpoint share one twisted.web `Site`, each protocol at its own path; a framed-stream
  listener has its endpoint to itself;
- one `ReconnectingService` per attached link, which reopens the link with a backoff whenever it
  fails to open or closes;
- one `ReconnectingService` and one `HubBridge` per Phyllo link (`service.phyllo[name]`),
  reopened the same way: a USB device that is unplugged is retried until it comes back;
- unless ``[metrics] enabled = false``, `service.metrics` (wireproto.metrics), served at
  ``[metrics] path`` on every HTTP listener's port;
- with ``[capture] directory`` set, `service.capture` (wireproto.capture.wrapper): every
  message in and out of every listener's and attached link's connection goes to capture files.

The same service runs under `wireproto serve`, under `twistd wireproto`, or inside another Twisted
application (``make_service(config).setServiceParent(application)``). `when_listening` reports the
real address of each listener once it is bound, so port 0 is usable.
"""

from __future__ import annotations

import functools
import os
import socket
import sqlite3
import weakref
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import MultiService
from twisted.internet import defer, task
from twisted.internet.address import UNIXAddress
from twisted.internet.interfaces import IListeningPort, IStreamClientEndpoint, IStreamServerEndpoint
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto import peerlog
from wireproto.access import AccessRule, Principal
from wireproto.access.quotas import PrincipalLimits
from wireproto.admin import AdminConsole
from wireproto.authentication import Authentication
from wireproto.broker import BoundListener
from wireproto.capture.wrapper import BrokerCapture, CapturingProtocol
from wireproto.cluster.callcapture import CallCapture
from wireproto.cluster.link import ClusterLink
from wireproto.codecs.phyllo.frame import MAX_FRAME_PAYLOAD
from wireproto.config import (
    HTTP_TRANSPORTS,
    Attach,
    Config,
    ConfigError,
    Listener,
    PhylloLink,
    endpoint_type,
)
from wireproto.hub import Hub
from wireproto.limits import LimitingProtocol
from wireproto.metrics import ServiceMetrics
from wireproto.phyllo.bridge import HubBridge
from wireproto.protocols import protocol as server_protocol
from wireproto.redaction import redact_url
from wireproto.transports.base import IMessageProtocol, go_away
from wireproto.transports.connect import client_endpoint, is_websocket_address, websocket_client
from wireproto.transports.identity import server_endpoint
from wireproto.transports.reconnect import DEFAULT_RETRY, ReconnectingService
from wireproto.transports.stream import StreamOptions, stream_client_factory, stream_server_factory
from wireproto.transports.websocket import websocket_resource, websocket_site

__all__ = [
    "AdoptedEndpoint",
    "BoundListener",
    "endpoint_groups",
    "format_address",
    "ListenFailed",
    "StartFailed",
    "describe_error",
    "WireprotoService",
    "make_service",
    "reload_on_sighup",
]

log = Logger()


class ListenFailed(Exception):
    """A listener could not bind its endpoint (a port in use, a missing permission...)."""

    def __init__(self, listeners: tuple[Listener, ...], reason: Failure) -> None:
        self.listeners = listeners
        self.reason = reason
        what = " and ".join(listener.describe() for listener in listeners)
        super().__init__(
            f"cannot listen for {what} on {listeners[0].endpoint}: "
            f"{reason.getErrorMessage()}"
        )


class StartFailed(Exception):
    """A part of the broker that its config asks for could not start (its capture, its last
    values file, its cluster link...): `what`, and why, in one line."""

    def __init__(self, what: str, error: BaseException | str) -> None:
        self.what = what
        self.error = error
        why = error if isinstance(error, str) else describe_error(error, what)
        super().__init__(f"{what}: {why}")


def describe_error(error: BaseException, what: str = "") -> str:
    """`error` in a few words: an OSError's reason, with the file it names unless `what` names
    it already; else the error's own text."""
    if isinstance(error, OSError) and error.strerror:
        name = os.fsdecode(error.filename) if error.filename is not None else ""
        return f"{name}: {error.strerror}" if name and name not in what else error.strerror
    return str(error) or type(error).__name__


def format_address(listener: Listener, host: Any) -> str:
    """`host` (a listening port's getHost()) as a connectable address for `listener`."""
    scheme = {"ws": "ws", "engineio": "http"}.get(listener.transport)
    if isinstance(host, UNIXAddress):
        name = host.name.decode() if isinstance(host.name, bytes) else host.name
        return f"{scheme}+unix://{name}:{listener.path}" if scheme else f"unix:{name}"
    hostname = f"[{host.host}]" if ":" in host.host else host.host
    secure = endpoint_type(listener.endpoint) == "ssl"
    if scheme:
        return f"{scheme}{'s' if secure else ''}://{hostname}:{host.port}{listener.path}"
    return f"{'ssl' if secure else 'tcp'}:{hostname}:{host.port}"


def endpoint_groups(listeners: tuple[Listener, ...]) -> list[tuple[tuple[int, Listener], ...]]:
    """The listeners by the endpoint they listen on, as (index, listener), in order: ws and
    engineio listeners on one endpoint share it; a stream listener has its own (tcp:0 twice is
    two ports)."""
    groups: dict[Any, list[tuple[int, Listener]]] = {}
    for index, listener in enumerate(listeners):
        shared = listener.transport in HTTP_TRANSPORTS
        key = listener.endpoint if shared else (listener.endpoint, index)
        groups.setdefault(key, []).append((index, listener))
    return [tuple(group) for group in groups.values()]


@implementer(IStreamServerEndpoint)
class AdoptedEndpoint:
    """Listens on a socket another process bound (a worker's supervisor), with what
    `endpoint` (the one it stands for) adds: TLS for ``ssl:`` and ``mtls:``."""

    def __init__(self, reactor: Any, fileno: int, endpoint: Any) -> None:
        self.reactor = reactor
        self.fileno = fileno
        self.endpoint = endpoint

    def listen(self, factory: Any) -> defer.Deferred:
        context = getattr(self.endpoint, "_sslContextFactory", None)
        if context is not None:
            from twisted.protocols.tls import TLSMemoryBIOFactory

            factory = TLSMemoryBIOFactory(context, False, factory)
        with socket.socket(fileno=os.dup(self.fileno)) as probe:
            family = probe.family
        return defer.execute(self.reactor.adoptStreamPort, self.fileno, family, factory)


@implementer(IStreamServerEndpoint)
class _ReportingEndpoint:
    """Tells the service when its endpoint is bound, or why it is not."""

    def __init__(
        self,
        endpoint: IStreamServerEndpoint,
        bound: Callable[[IListeningPort], None],
        failed: Callable[[Failure], None],
    ) -> None:
        self.endpoint = endpoint
        self._bound = bound
        self._failed = failed

    def listen(self, factory: Any) -> defer.Deferred:
        def bound(port: IListeningPort) -> IListeningPort:
            self._bound(port)
            return port

        def failed(reason: Failure) -> None:
            # Reported (and logged) by the service, in one line rather than a traceback.
            self._failed(reason)

        return self.endpoint.listen(factory).addCallbacks(bound, failed)


@implementer(IStreamClientEndpoint)
class _LoggingClientEndpoint:
    """Logs why an attached link does not open: loudly the first time, quietly while it stays
    down, so an unplugged device does not flood the log."""

    def __init__(self, endpoint: IStreamClientEndpoint, link: Attach | PhylloLink) -> None:
        self.endpoint = endpoint
        self.link = link
        self._down = False

    def __repr__(self) -> str:
        return self.shown  # as the reconnector's log lines name it

    @property
    def shown(self) -> str:
        """The link's address as the log shows it: a URL without its credentials."""
        return redact_url(self.link.endpoint)

    def connect(self, factory: Any) -> defer.Deferred:
        def opened(protocol: Any) -> Any:
            self._down = False
            log.info("attached {what} on {endpoint}", what=self.link.describe(),
                     endpoint=self.shown)
            return protocol

        def failed(reason: Failure) -> Failure:
            emit = log.info if self._down else log.warn
            emit("cannot open {endpoint} for {what}: {error}; retrying",
                 endpoint=self.shown, what=self.link.describe(),
                 error=reason.getErrorMessage().rstrip("."))
            self._down = True
            return reason

        return self.endpoint.connect(factory).addCallbacks(opened, failed)


class WireprotoService(MultiService):
    """Every listener and attached link of one broker, around one hub."""

    def __init__(self, config: Config, hub: Hub, reactor: Any,
                 listening_sockets: list[int] | None = None) -> None:
        super().__init__()
        self.config = config
        self.hub = hub
        self.reactor = reactor
        # A worker's listening sockets, bound by its supervisor: one per endpoint_groups entry.
        self.listening_sockets = listening_sockets
        # The service logs a listener that cannot bind; a caller that reports it itself (the CLI)
        # turns this off.
        self.log_listen_errors = True
        self.bound: list[BoundListener] = []
        self.listen_errors: list[ListenFailed] = []
        # Each endpoint's listeners, as (index in config.listeners, listener).
        self._groups: list[tuple[tuple[int, Listener], ...]] = []
        self._reported = 0
        self._waiters: list[defer.Deferred] = []
        self._bound_order: dict[int, int] = {}
        self._connections: weakref.WeakSet[IMessageProtocol] = weakref.WeakSet()
        self._servers: dict[str, Callable[[], IMessageProtocol]] = {}
        self.phyllo: dict[str, HubBridge] = {}
        # The twisted.web Site of each HTTP port, for their refusal counts on /metrics.
        self.http_sites: list[Any] = []
        settings = config.capture
        cluster_settings = config.cluster
        try:
            self.capture = self._capture(settings, cluster_settings)
        except ValueError as error:  # an upload target pyarrow cannot reach, or no pyarrow
            raise ConfigError(f"capture: {error}") from None
        # With [auth]: the credentials and rules; the hub checks its policy.
        self.auth = None
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
        hub.limits = PrincipalLimits(config.limits)
        peerlog.count_ipv6_by(config.limits.ipv6_prefix)
        # With [cluster] url: the other broker processes, through NATS.
        self.cluster: ClusterLink | None = None
        if config.cluster.enabled:
            try:
                self.cluster = ClusterLink(hub, config.cluster, reactor)
            except (OSError, ValueError) as error:  # a credentials file, a server URL
                raise ConfigError(f"cluster: {error}") from None
        self.metrics = ServiceMetrics(self) if config.metrics.enabled else None
        # Writes the last values to [hub] retain_file every second, when there is one.
        self._flushing: task.LoopingCall | None = None
        if self.cluster is not None and self.capture is not None:
            # The calls between processes go to the capture too, so a fleet's can be paired.
            self.cluster.calls.recorder = CallCapture(self.capture, config.cluster.url)
        # The status page, the browser clients, the admin API and the $SYS topics.
        self.admin = AdminConsole(self, config.admin, reactor) if config.admin.enabled else None

    def _capture(self, settings: Any, cluster: Any) -> BrokerCapture | None:
        if not settings.directory:
            return None
        return BrokerCapture(
            settings.directory, max_file_bytes=settings.max_file_bytes,
            flush_interval=settings.flush_interval, file_mode=settings.file_mode,
            reactor=self.reactor, broker=settings.node or cluster.node or None,
            cluster=cluster.subject_prefix if cluster.enabled else None,
            upload=settings.upload, upload_options=settings.upload_options(),
        )

    # The log observer for the application this service joins, if it has none (the twistd
    # plugin sets it: twistd's own observer, filtered by [log] level).
    parent_log_observer: Any = None

    def setServiceParent(self, parent: Any) -> Any:
        result = super().setServiceParent(parent)
        observer = self.parent_log_observer
        if observer is not None and hasattr(parent, "setComponent"):
            from twisted.logger import ILogObserver

            if parent.getComponent(ILogObserver, None) is None:
                parent.setComponent(ILogObserver, observer)
        return result

    @property
    def cluster_node(self) -> str | None:
        """This process's name among the cluster's, or None without a cluster."""
        return None if self.cluster is None else self.cluster.node

    @property
    def node(self) -> str:
        """This process's name: its cluster name, or its host name and process id."""
        return self.cluster_node or f"{socket.gethostname()}:{os.getpid()}"

    def served_protocols(self) -> list[str]:
        """The protocols of the listeners and attached links, each once, in config order."""
        found = [listener.protocol for listener in self.config.listeners]
        found += [link.protocol for link in self.config.attach]
        return list(dict.fromkeys(found))

    def close_session(self, session: Any, reason: str) -> None:
        """Close one connection cleanly (an admin asked); its will is published."""
        log.info("closing {protocol} session {session} from {peer}: {reason}",
                 event="session_closed_by_admin", protocol=session.protocol,
                 session=session.id, peer=session.peer, reason=reason)
        go_away(session.transport)

    # -- building -------------------------------------------------------------------------------

    def server(self, protocol: str) -> Callable[[], IMessageProtocol]:
        """The server role of `protocol` on this service's hub, made once and shared by all its
        listeners: for UBRE, the `UbreServer` to register handlers and hooks on."""
        made = self._servers.get(protocol)
        if made is None:
            try:
                made = server_protocol(protocol).make_server(
                    self.hub, self.config.tables.get(protocol))
            except (OSError, sqlite3.Error) as error:  # e.g. [subble] registry's file
                raise StartFailed(f"[{protocol}]", error) from None
            self._servers[protocol] = made
            if self.metrics is not None:
                self.metrics.instrument(protocol, made)
        return made

    def _connection_wrapper(
        self, protocol: str
    ) -> Callable[[IMessageProtocol], IMessageProtocol] | None:
        """What wraps each connection's protocol of `protocol`: capture, when it is on."""
        capture = self.capture
        if capture is None:
            return None
        return lambda wrapped: CapturingProtocol(wrapped, capture, protocol)

    def _protocol_factory(
        self, protocol: str, listener: Listener | None = None
    ) -> Callable[[], IMessageProtocol]:
        """Each connection's protocol of `protocol`, with what `listener` tells it: counted
        against its principal's [limits] outermost, then captured when capture is on."""
        make = self.server(protocol)
        options = {} if listener is None else listener.connection_options()
        if options:
            make = functools.partial(make, **options)
        connections = self._connections
        capture = self._connection_wrapper(protocol)
        limits, reactor = self.hub.limits, self.reactor
        last_values, examined = self.hub.retained, self.hub.retained_examined_per_second

        def build() -> IMessageProtocol:
            made = make()
            # Remembered (weakly) so stopService can close what is still open.
            connections.add(made)
            inner = made if capture is None else capture(made)
            return LimitingProtocol(inner, limits, protocol, reactor, last_values=last_values,
                                    examined_per_second=examined)

        return build

    def add_listeners(self, listeners: tuple[Listener, ...]) -> None:
        """One endpoint service per distinct endpoint; ws and engineio listeners on it share a
        twisted.web Site, each at its path."""
        for group in endpoint_groups(listeners):
            first = group[0][1]
            endpoint = server_endpoint(self.reactor, first.endpoint)
            # An mtls: endpoint's CAs, which a reload rereads.
            authorities = getattr(endpoint, "authorities", None)
            if self.auth is not None:
                self.auth.watch_authorities(authorities)
            if first.transport in HTTP_TRANSPORTS:
                routes = {
                    listener.path or server_protocol(listener.protocol).default_path:
                        self._http_resource(listener, authorities)
                    for _, listener in group
                }
                if self.metrics is not None:
                    path = self.config.metrics.path
                    if path in routes:
                        raise ValueError(f"[metrics] path {path!r} is also a listener's path")
                    routes[path] = self.metrics.resource()
                if self.admin is not None:
                    for path, resource in self.admin.routes(routes).items():
                        if path in routes:
                            raise ValueError(f"{path} is the admin page's ([admin]) and also "
                                             "a listener's path")
                        routes[path] = resource
                factory = websocket_site(
                    routes, idle_timeout=self.config.websocket.open_handshake_timeout,
                    limits=self.config.http,
                )
                self.http_sites.append(factory)
            else:
                factory = stream_server_factory(
                    self._protocol_factory(first.protocol, first),
                    self._stream_options(first.transport),
                    identify=self._stream_identity(first.principal, first.identity,
                                                   first.endpoint, first.allow, authorities),
                )
            self._add_endpoint(tuple(group), endpoint, factory)

    def _http_resource(self, listener: Listener, authorities: Any = None) -> Any:
        factory = self._protocol_factory(listener.protocol, listener)
        identify = None if self.auth is None else self.auth.identify_http(
            listener.principal, listener.identity, listener.endpoint, listener.allow,
            authorities,
        )
        if listener.transport == "ws":
            return websocket_resource(factory, self.config.websocket, identify=identify)
        from wireproto.transports.engineio import engineio_resource

        websocket = self.config.websocket
        options = replace(self.config.engineio, allowed_origins=websocket.allowed_origins,
                          websocket=websocket)
        return engineio_resource(factory, options, reactor=self.reactor, identify=identify)

    def _stream_identity(self, principal: str | None, identity: str | None, endpoint: str,
                         allow: tuple[str, ...] = (), authorities: Any = None,
                         ) -> Callable[[Any], Principal | None] | None:
        return None if self.auth is None else self.auth.identify_stream(
            principal, identity, endpoint, allow, authorities)

    def _stream_options(self, framing: str) -> StreamOptions:
        return replace(self.config.stream, framing=framing)

    def _add_endpoint(
        self, group: tuple[tuple[int, Listener], ...], endpoint: IStreamServerEndpoint,
        factory: Any,
    ) -> None:
        if self.listening_sockets is not None:
            # A worker process: the supervisor has bound this endpoint already.
            endpoint = AdoptedEndpoint(
                self.reactor, self.listening_sockets[len(self._groups)], endpoint)
        self._groups.append(group)
        reporting = _ReportingEndpoint(
            endpoint,
            lambda port: self._listening(group, port),
            lambda reason: self._listen_failed(group, reason),
        )
        StreamServerEndpointService(reporting, factory).setServiceParent(self)

    def add_attach(self, link: Attach, retry_policy: Callable[[int], float]) -> None:
        endpoint = _LoggingClientEndpoint(client_endpoint(self.reactor, link.endpoint), link)
        factory = stream_client_factory(
            self._protocol_factory(link.protocol), self._stream_options(link.framing),
            identify=self._stream_identity(link.principal, None, link.endpoint),
        )
        ReconnectingService(
            self.reactor, endpoint, factory, retry_policy=retry_policy
        ).setServiceParent(self)

    def add_phyllo(self, link: PhylloLink, retry_policy: Callable[[int], float]) -> HubBridge:
        """Open the Phyllo device at `link.endpoint`, reopening it with `retry_policy` whenever
        it fails or closes, and bridge its topics to the hub under `link.prefix`."""
        bridge = HubBridge(
            self.hub, link.name, prefix=link.prefix, stack=link.stack,
            send_format=link.send_format, queue_bytes=self.config.hub.queue_bytes,
            max_chunk_length=link.max_chunk_length,
            max_frame_payload=min(MAX_FRAME_PAYLOAD, link.max_chunk_length - 2),
            protocol_wrapper=self._connection_wrapper("phyllo"),
            principal=link.principal,
        )
        endpoint: Any
        if is_websocket_address(link.endpoint):
            endpoint, factory = websocket_client(
                self.reactor, link.endpoint, bridge.build_message_protocol, self.config.websocket
            )
        else:
            endpoint = client_endpoint(self.reactor, link.endpoint)
            factory = Factory.forProtocol(bridge.build_protocol)
        ReconnectingService(
            self.reactor, _LoggingClientEndpoint(endpoint, link), factory,
            retry_policy=retry_policy,
        ).setServiceParent(self)
        self.phyllo[link.name] = bridge
        return bridge

    # -- reloading --------------------------------------------------------------------------------

    def reload_auth(self, rules: tuple[AccessRule, ...] | None = None) -> bool:
        """Reread the [auth] key and password files and take `rules` (the same rules if None),
        as SIGHUP does: every connection whose credential the new files withdraw is closed,
        and every subscription the new rules forbid is ended. False, with the old files and
        rules kept and the reason logged, if a file is bad."""
        auth = self.auth
        if auth is None:
            log.warn("reload: no [auth] table, so nothing to reload")
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

    # -- reporting bound listeners --------------------------------------------------------------

    def _listening(self, group: tuple[tuple[int, Listener], ...], port: IListeningPort) -> None:
        host = port.getHost()
        for index, listener in group:
            bound = BoundListener(listener, format_address(listener, host))
            self._bound_order[id(bound)] = index
            self.bound.append(bound)
            log.info("listening: {what}", what=bound.describe())
        self._reported += 1
        self._fire_waiters()

    def _listen_failed(self, group: tuple[tuple[int, Listener], ...], reason: Failure) -> None:
        error = ListenFailed(tuple(listener for _, listener in group), reason)
        self.listen_errors.append(error)
        if self.log_listen_errors and not reason.check(defer.CancelledError):
            log.error("{error}", error=error)
        self._reported += 1
        self._fire_waiters()

    def _fire_waiters(self) -> None:
        if self._reported < len(self._groups):
            return
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            self._fire(waiter)

    def _fire(self, waiter: defer.Deferred) -> None:
        if self.listen_errors:
            waiter.errback(self.listen_errors[0])
        else:
            order = self._bound_order
            waiter.callback(sorted(self.bound, key=lambda bound: order[id(bound)]))

    def when_listening(self) -> defer.Deferred[list[BoundListener]]:
        """Fires, once every listener has tried to bind, with the `BoundListener`s in config
        order; or fails with the first `ListenFailed`."""
        waiter: defer.Deferred[list[BoundListener]] = defer.Deferred()
        if self._reported >= len(self._groups):
            self._fire(waiter)
        else:
            self._waiters.append(waiter)
        return waiter

    # -- starting and stopping ------------------------------------------------------------------

    def privilegedStartService(self) -> None:
        # Under twistd, listening happens here, before privileges are dropped; a port that cannot
        # be bound, or a part that cannot start, stops twistd at once, as twistd's own strports
        # listeners do: in one logged line and status 1, without a traceback.
        try:
            self._start_parts()
        except StartFailed as failed:
            log.error("wireproto: {error}", event="start_failed", error=str(failed))
            raise SystemExit(1) from None
        super().privilegedStartService()
        if self.listen_errors:
            # Logged in one line already.
            raise SystemExit(1)

    def startService(self) -> None:
        """Start every part, then listen; StartFailed, with what started stopped again, if a
        part cannot start."""
        self._start_parts()
        super().startService()

    def _start_parts(self) -> None:
        # Before any connection: the writer makes the directory and its thread, and the hub
        # is joined to the cluster's other processes.
        parts: list[tuple[str, Any, Callable[[], Any]]] = []
        if self.capture is not None:
            parts.append((f"capture {self.capture.directory}", self.capture.start,
                          lambda: self.capture.close(self.reactor)))
        if self.cluster is not None:
            parts.append(("cluster", self.cluster.start, self.cluster.stop))
        if self.admin is not None:
            parts.append(("admin", self.admin.start, self.admin.stop))
        started: list[Callable[[], Any]] = []
        for what, start, stop in parts:
            try:
                start()
            except Exception as error:
                for undo in reversed(started):
                    undo()
                raise StartFailed(what, error) from None
            started.append(stop)
        retained = self.hub.retained
        if retained is not None and retained.persistent and self._flushing is None:
            self._flushing = task.LoopingCall(retained.flush)
            self._flushing.clock = self.reactor
            self._flushing.start(1.0, now=False)

    @defer.inlineCallbacks
    def stopService(self) -> Any:
        """Stop listening and the attached links, close every connection still open, then
        write out the capture."""
        yield super().stopService()
        if self.admin is not None:
            self.admin.stop()
        for server in self._servers.values():
            close = getattr(server, "close", None)
            if close is not None:
                close()  # e.g. a UbreServer stops following the hub's topics
        self._servers.clear()
        self._reported = 0
        self.bound.clear()
        self._bound_order.clear()
        self.listen_errors.clear()
        yield self.close_connections()
        if self.cluster is not None:
            # After the connections: their wills reach the other processes.
            yield self.cluster.stop()
        if self._flushing is not None:
            self._flushing.stop()
            self._flushing = None
            self.hub.retained.flush()  # the wills just published included
        if self.capture is not None:
            yield self.capture.close(self.reactor)

    @defer.inlineCallbacks
    def close_connections(self, timeout: float | None = None) -> Any:
        """Close every open connection cleanly; abort those still open after `timeout` s."""
        if timeout is None:
            timeout = self.config.websocket.close_handshake_timeout + 1.0
        for protocol in list(self._connections):
            if protocol.connected and protocol.transport is not None:
                go_away(protocol.transport)
        deadline = self.reactor.seconds() + timeout
        while self.reactor.seconds() < deadline:
            if not any(protocol.connected for protocol in self._connections):
                break
            yield task.deferLater(self.reactor, 0.02, lambda: None)
        # What the connections' ends wrote to HTTP (a held poll answered with the close
        # packet) goes out before the HTTP connections close.
        while self.reactor.seconds() < deadline:
            if not sum(site.close_http_connections() for site in self.http_sites):
                return
            yield task.deferLater(self.reactor, 0.02, lambda: None)
        for protocol in list(self._connections):
            if protocol.connected and protocol.transport is not None:
                protocol.transport.abortConnection()


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
) -> WireprotoService:
    """The broker `config` describes, ready to start (or to add to an application).

    `service.hub` is its hub; `service.when_listening()` gives the bound addresses.
    `retry_policy(attempt) -> seconds` paces the reopening of attached links.
    `listening_sockets` are the file descriptors a worker process listens on, bound by its
    supervisor (wireproto.supervisor), one per `endpoint_groups(config.listeners)` entry.
    A part that cannot be made (a last-values file that is no database...) is StartFailed.
    """
    if reactor is None:
        from twisted.internet import reactor
    hub = _hub(config)
    service = WireprotoService(config, hub, reactor, listening_sockets)
    service.add_listeners(config.listeners)
    for link in config.attach:
        service.add_attach(link, retry_policy)
    for phyllo in config.phyllo:
        service.add_phyllo(phyllo, retry_policy)
    return service
