"""The listeners of a running broker: one endpoint service per distinct endpoint, WebSocket and
Engine.IO listeners on one endpoint sharing a twisted.web site, and the real address of each
once it is bound (`when_listening`), so port 0 is usable."""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import MultiService
from twisted.internet import defer
from twisted.internet.address import UNIXAddress
from twisted.internet.interfaces import (
    IListeningPort,
    IProtocolFactory,
    IReactorTime,
    IReactorUNIX,
    IStreamServerEndpoint,
)
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import IResource
from zope.interface import implementer

from wireproto.admin import AdminConsole
from wireproto.authentication import Authentication
from wireproto.broker import BoundListener
from wireproto.config import HTTP_TRANSPORTS, Config, Listener, endpoint_type
from wireproto.metrics import ServiceMetrics
from wireproto.protocols import protocol as server_protocol
from wireproto.service.connections import Connections
from wireproto.service.siblings import PrivateEndpoint, Siblings, passed_path, private_site
from wireproto.transports.http import GuardedSite
from wireproto.transports.identity import ClientAuthorities, server_endpoint
from wireproto.transports.stream import StreamOptions, stream_server_factory
from wireproto.transports.websocket_http import websocket_resource, websocket_site

__all__ = [
    "AdoptedEndpoint",
    "ListenFailed",
    "Listeners",
    "endpoint_groups",
    "format_address",
    "stream_options",
]

log = Logger(namespace="wireproto.service")

# Each endpoint's listeners, as (index in config.listeners, listener).
Group = tuple[tuple[int, Listener], ...]


class ListenFailed(Exception):
    """A listener could not bind its endpoint (a port in use, a missing permission...)."""

    def __init__(self, listeners: tuple[Listener, ...], reason: Failure) -> None:
        self.listeners = listeners
        self.reason = reason
        if not listeners:
            super().__init__(f"cannot listen on this worker's private socket: "
                             f"{reason.getErrorMessage()}")
            return
        what = " and ".join(listener.describe() for listener in listeners)
        super().__init__(
            f"cannot listen for {what} on {listeners[0].endpoint}: "
            f"{reason.getErrorMessage()}"
        )


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


def _http_path(listener: Listener) -> str:
    # A ws or engineio listener made in code, not parsed from a config, may leave its path to
    # its protocol's default; a protocol may have none.
    path = listener.path or server_protocol(listener.protocol).default_path
    if path is None:
        raise ValueError(f"{listener.describe()} on {listener.endpoint} has no path, and "
                         f"{listener.protocol} no default path: give one")
    return path


def endpoint_groups(listeners: tuple[Listener, ...]) -> list[Group]:
    """The listeners by the endpoint they listen on, as (index, listener), in order: ws and
    engineio listeners on one endpoint share it; a stream listener has its own (tcp:0 twice is
    two ports)."""
    groups: dict[Any, list[tuple[int, Listener]]] = {}
    for index, listener in enumerate(listeners):
        shared = listener.transport in HTTP_TRANSPORTS
        key = listener.endpoint if shared else (listener.endpoint, index)
        groups.setdefault(key, []).append((index, listener))
    return [tuple(group) for group in groups.values()]


def stream_options(config: Config, framing: str) -> StreamOptions:
    """The [stream] table's options, with `framing`."""
    return replace(config.stream, framing=framing)


@implementer(IStreamServerEndpoint)
class AdoptedEndpoint:
    """Listens on a socket another process bound (a worker's supervisor), with what
    `endpoint` (the one it stands for) adds: TLS for ``ssl:`` and ``mtls:``.

    It accepts from the socket while `accepting`; otherwise its connections are handed to it
    already accepted (`adopt_connection`), and it listens only to say where it is bound."""

    def __init__(self, reactor: Any, fileno: int, endpoint: Any) -> None:
        self.reactor = reactor
        self.fileno = fileno
        self.endpoint = endpoint
        self.accepting = True
        # Once listening: its port, and the factory its connections are built with (TLS's
        # around the listener's own, for ssl: and mtls:).
        self.port: IListeningPort | None = None
        self.factory: IProtocolFactory | None = None
        self._family = socket.AF_INET

    def listen(self, factory: IProtocolFactory) -> defer.Deferred[IListeningPort]:
        context = getattr(self.endpoint, "_sslContextFactory", None)
        if context is not None:
            from twisted.protocols.tls import TLSMemoryBIOFactory

            factory = TLSMemoryBIOFactory(context, False, factory)
        with socket.socket(fileno=os.dup(self.fileno)) as probe:
            self._family = probe.family
        d = defer.execute(self.reactor.adoptStreamPort, self.fileno, self._family, factory)

        def listening(port: IListeningPort) -> IListeningPort:
            self.port, self.factory = port, factory
            if not self.accepting:
                cast(Any, port).stopReading()  # before the reactor can run: it accepts none
            return port

        return d.addCallback(listening)

    def accept(self, accepting: bool) -> None:
        """Accept from the socket (True), or take only the connections handed to it."""
        self.accepting = accepting
        port = cast(Any, self.port)
        if port is not None and port.connected:
            if accepting:
                port.startReading()
            else:
                port.stopReading()

    def adopt_connection(self, fileno: int) -> None:
        """Serve the connection accepted on this endpoint's socket by another process, whose
        descriptor is `fileno` (this process still closes its own)."""
        if self.factory is None or self.port is None or not cast(Any, self.port).connected:
            raise RuntimeError("not listening")
        os.set_blocking(fileno, False)
        self.reactor.adoptStreamConnection(fileno, self._family, self.factory)


@implementer(IStreamServerEndpoint)
class _ReportingEndpoint:
    """Tells the listeners when its endpoint is bound, or why it is not."""

    def __init__(
        self,
        endpoint: IStreamServerEndpoint,
        bound: Callable[[IListeningPort], None],
        failed: Callable[[Failure], None],
    ) -> None:
        self.endpoint = endpoint
        self._bound = bound
        self._failed = failed

    def listen(self, factory: IProtocolFactory) -> defer.Deferred[IListeningPort]:
        def bound(port: IListeningPort) -> IListeningPort | None:
            self._bound(port)
            return port

        def failed(reason: Failure) -> None:
            # Reported (and logged) by the listeners, in one line rather than a traceback.
            self._failed(reason)

        # On failure it fires with None rather than the port: the endpoint service it is given
        # to takes that as no port to stop.
        return cast(defer.Deferred[IListeningPort],
                    self.endpoint.listen(factory).addCallbacks(bound, failed))


class Listeners(MultiService):
    """Every listener of one broker, and where each is bound."""

    def __init__(self, config: Config, reactor: IReactorTime, connections: Connections, *,
                 auth: Authentication | None, metrics: ServiceMetrics | None,
                 admin: AdminConsole | None, listening_sockets: list[int] | None,
                 siblings: Siblings | None = None,
                 handovers: Counter[str] | None = None) -> None:
        super().__init__()
        self.setName("listeners")
        self.config = config
        self.reactor = reactor
        self.connections = connections
        self.auth = auth
        self.metrics = metrics
        self.admin = admin
        # A worker's listening sockets, bound by its supervisor: one per endpoint_groups entry.
        self.listening_sockets = listening_sockets
        # The other workers of its supervisor, which pass it the Engine.IO requests for its
        # sessions on its private socket (wireproto.service.siblings), and it them theirs.
        self.siblings = siblings
        self._passed_routes: dict[str, IResource] = {}
        self._private_added = False
        # Engine.IO requests passed to other workers, taken from them...: SessionOwners.counts.
        self.engineio_handovers: Counter[str] = Counter() if handovers is None else handovers
        # A listener that cannot bind is logged, unless its caller reports it itself (the CLI).
        self.log_errors = True
        self.bound: list[BoundListener] = []
        self.errors: list[ListenFailed] = []
        self._groups: list[Group] = []
        self._reported = 0
        self._waiters: list[defer.Deferred[list[BoundListener]]] = []
        self._bound_order: dict[int, int] = {}
        # A worker's adopted endpoints, in the order of its listening sockets.
        self.adopted: list[AdoptedEndpoint] = []

    def add(self, listeners: tuple[Listener, ...]) -> None:
        """One endpoint service per distinct endpoint; ws and engineio listeners on it share a
        twisted.web Site, each at its path."""
        for group in endpoint_groups(listeners):
            first = group[0][1]
            endpoint = server_endpoint(self.reactor, first.endpoint)
            # An mtls: endpoint's CAs, which a reload rereads.
            authorities = getattr(endpoint, "authorities", None)
            if self.auth is not None:
                self.auth.watch_authorities(authorities)
            factory: IProtocolFactory
            if first.transport in HTTP_TRANSPORTS:
                factory = self._site(group, authorities)
            else:
                factory = stream_server_factory(
                    self.connections.factory(first.protocol, first),
                    stream_options(self.config, first.transport),
                    identify=None if self.auth is None else self.auth.identify_stream(
                        first.principal, first.identity, first.endpoint, first.allow,
                        authorities),
                )
            self._add_endpoint(group, endpoint, factory)
        if self._passed_routes and not self._private_added:
            self._add_private()

    def _site(self, group: Group, authorities: ClientAuthorities | None) -> GuardedSite:
        routes: dict[str, IResource] = {
            _http_path(listener): self._http_resource(listener, authorities, index)
            for index, listener in group
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
        site = websocket_site(
            routes, idle_timeout=self.config.websocket.open_handshake_timeout,
            limits=self.config.http,
            served=", ".join(f"{_http_path(listener)} {listener.protocol}"
                             for _, listener in group),
        )
        self.connections.http_sites.append(site)
        return site

    def _http_resource(self, listener: Listener,
                       authorities: ClientAuthorities | None = None, index: int = 0) -> IResource:
        factory = self.connections.factory(listener.protocol, listener)
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
        siblings = self.siblings
        owners = None if siblings is None else siblings.owners(
            cast(IReactorUNIX, self.reactor), index, self.engineio_handovers)
        resource = engineio_resource(factory, options, reactor=self.reactor, identify=identify,
                                     owners=owners)
        if siblings is not None:
            self._passed_routes[passed_path(index, _http_path(listener))] = (
                resource.for_passed_requests())
        return resource

    def _add_private(self) -> None:
        """Listen on this worker's private socket, for the Engine.IO requests that the other
        workers pass it (wireproto.service.siblings). Not a listener of the config: it is
        reported only if it cannot listen."""
        assert self.siblings is not None
        self._private_added = True
        site = private_site(self._passed_routes, self.config)
        self.connections.http_sites.append(site)
        group: Group = ()
        self._groups.append(group)
        reporting = _ReportingEndpoint(
            PrivateEndpoint(cast(IReactorUNIX, self.reactor), self.siblings.socket),
            lambda port: self._listening(group, port),
            lambda reason: self._listen_failed(group, reason),
        )
        StreamServerEndpointService(reporting, site).setServiceParent(self)

    def _add_endpoint(self, group: Group, endpoint: IStreamServerEndpoint,
                      factory: IProtocolFactory) -> None:
        if self.listening_sockets is not None:
            # A worker process: the supervisor has bound this endpoint already.
            endpoint = AdoptedEndpoint(
                self.reactor, self.listening_sockets[len(self.adopted)], endpoint)
            self.adopted.append(endpoint)
        self._groups.append(group)
        reporting = _ReportingEndpoint(
            endpoint,
            lambda port: self._listening(group, port),
            lambda reason: self._listen_failed(group, reason),
        )
        StreamServerEndpointService(reporting, factory).setServiceParent(self)

    # -- reporting bound listeners --------------------------------------------------------------

    def _listening(self, group: Group, port: IListeningPort) -> None:
        host = port.getHost()
        for index, listener in group:
            bound = BoundListener(listener, format_address(listener, host))
            self._bound_order[id(bound)] = index
            self.bound.append(bound)
            log.info("listening: {what}", event="listening", what=bound.describe())
        self._reported += 1
        self._fire_waiters()

    def _listen_failed(self, group: Group, reason: Failure) -> None:
        error = ListenFailed(tuple(listener for _, listener in group), reason)
        self.errors.append(error)
        if self.log_errors and not reason.check(defer.CancelledError):
            log.error("{error}", event="listen_failed", error=error)
        self._reported += 1
        self._fire_waiters()

    def _fire_waiters(self) -> None:
        if self._reported < len(self._groups):
            return
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            self._fire(waiter)

    def _fire(self, waiter: defer.Deferred[list[BoundListener]]) -> None:
        if self.errors:
            waiter.errback(self.errors[0])
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

    def stopService(self) -> Any:
        d = super().stopService()
        self._reported = 0
        self.bound.clear()
        self._bound_order.clear()
        self.errors.clear()
        return d
