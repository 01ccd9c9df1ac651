"""The links a running broker opens itself: attached links (a protocol's client connection to a
peer that serves it, `--attach`) and Phyllo links (a device on a serial port or another carrier,
`--phyllo`), each reopened with a backoff whenever it fails to open or closes, so a device that
is unplugged is retried until it comes back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet import defer
from twisted.internet.interfaces import (
    IDelayedCall,
    IProtocol,
    IProtocolFactory,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto.authentication import Authentication
from wireproto.codecs.phyllo.frame import MAX_FRAME_PAYLOAD
from wireproto.config import Attach, Config, PhylloLink
from wireproto.config.endpoints import endpoint_type
from wireproto.devices.listing import PortListing
from wireproto.devices.matching import SeveralMatchingPorts
from wireproto.devices.ports import PortInfo, system_ports
from wireproto.devices.watch import PortWatcher, system_watcher
from wireproto.hub import Hub
from wireproto.phyllo.bridge import HubBridge
from wireproto.redaction import redact_text, redact_url
from wireproto.service.connections import Connections
from wireproto.service.listeners import stream_options
from wireproto.service.parts import StartFailed
from wireproto.service.presence import Presence, PresenceEndpoint, presence_wanted
from wireproto.topics import mount_error
from wireproto.transports.connect import client_endpoint, is_websocket_address, websocket_client
from wireproto.transports.reconnect import ReconnectingService
from wireproto.transports.stream import stream_client_factory

__all__ = ["Links", "CLUSTER_WAIT"]

# How long the links to devices wait for the cluster before they open anyway (seconds).
CLUSTER_WAIT = 10.0

log = Logger(namespace="wireproto.service")


@implementer(IStreamClientEndpoint)
class _LoggingClientEndpoint:
    """Logs why a link does not open: loudly the first time, quietly while it stays down, so an
    unplugged device does not flood the log; and when it opens, the board and the port it
    found, for a link that finds its board by identity."""

    def __init__(self, endpoint: IStreamClientEndpoint, link: Attach | PhylloLink) -> None:
        self.endpoint = endpoint
        self.link = link
        self._down: type[BaseException] | None = None
        """The kind of failure that keeps the link down, or None while it is open."""

    def __repr__(self) -> str:
        return self.shown  # as the reconnector's log lines name it

    @property
    def shown(self) -> str:
        """The link's address as the log shows it: a URL without its credentials."""
        return redact_url(self.link.endpoint)

    def board(self) -> str:
        """`` (/dev/ttyACM1, 2341:0043 serial 857)``: the port a ``serial:vid=...`` link
        opened and the board's identity, or "" for a link that names its device."""
        port = getattr(self.endpoint, "port", None)
        if not isinstance(port, PortInfo):
            return ""
        return f" ({port.device}, {port.identity()})"

    def connect(self, factory: IProtocolFactory) -> defer.Deferred[IProtocol]:
        def opened(protocol: IProtocol) -> IProtocol:
            self._down = None
            log.info("attached {what} on {endpoint}{board}", event="attached",
                     what=self.link.describe(), endpoint=self.shown, board=self.board())
            return protocol

        def failed(reason: Failure) -> Failure:
            fields = {"endpoint": self.shown, "what": self.link.describe(),
                      "error": redact_text(reason.getErrorMessage().rstrip("."))}
            # Loud the first time, and when the reason changes (no board, then two boards).
            kind = type(reason.value)
            if kind is self._down:
                log.info("cannot open {endpoint} for {what}: {error}; retrying",
                         event="link_open_failed", **fields)
            elif reason.check(SeveralMatchingPorts):  # a config that must choose a board
                log.error("cannot open {endpoint} for {what}: {error}; retrying",
                          event="link_open_failed", **fields)
            else:
                log.warn("cannot open {endpoint} for {what}: {error}; retrying",
                         event="link_open_failed", **fields)
            self._down = kind
            return reason

        return self.endpoint.connect(factory).addCallbacks(opened, failed)


class Links(MultiService):
    """The attached links and Phyllo links of one broker; `phyllo` is each Phyllo link's
    bridge to the hub, by its name. `ports` watches the serial ports (made when a link first
    needs it: `watcher()`); a ``serial:vid=...`` link lists them afresh each time it opens.
    Both list through one `listing`, off the reactor's thread, one listing at a time."""

    def __init__(self, config: Config, hub: Hub, reactor: IReactorTime,
                 connections: Connections, auth: Authentication | None,
                 ports: PortWatcher | None = None,
                 cluster_ready: Callable[[], defer.Deferred[object]] | None = None) -> None:
        super().__init__()
        self.setName("links")
        self.config = config
        self.hub = hub
        self.reactor = reactor
        self.connections = connections
        self.auth = auth
        self.phyllo: dict[str, HubBridge] = {}
        self.ports = ports
        self._listing: PortListing | None = None
        # Each serial link's presence, $devices/LINK (wireproto.service.presence).
        self.presence = Presence(hub, reactor, lambda: self.listing) if presence_wanted(
            config) else None
        # With a cluster, the links open once it is reachable, or after `cluster_wait` s: what
        # a device says as its port opens would otherwise reach this process's subscribers
        # alone (a worker started again opens its links before it has reached NATS).
        self.cluster_ready = cluster_ready
        self.cluster_wait = CLUSTER_WAIT
        self.opened = False
        self._waiting: IDelayedCall | None = None

    def startService(self) -> None:
        if self.cluster_ready is None:
            self.opened = True
            super().startService()
            return
        Service.startService(self)  # its links wait: `_open` starts them
        self._waiting = self.reactor.callLater(self.cluster_wait, self._open, False)
        ready = self.cluster_ready()
        ready.addCallback(lambda _: self._open(True))
        ready.addErrback(lambda failure: log.failure(
            "opening the links to devices failed", failure, event="links_open_failed"))

    def _open(self, reachable: bool) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None and waiting.active():
            waiting.cancel()
        if self.opened or not self.running:
            return
        self.opened = True
        if not reachable:
            log.warn("the cluster is not reachable after {wait:g} s; opening the links to "
                     "devices now: until it is, what they publish reaches this process alone",
                     event="links_opened_without_cluster", wait=self.cluster_wait)
        for service in self:
            if service.running:  # added while the links waited: started then
                continue
            try:
                service.startService()
            except Exception:  # the others open all the same
                log.failure("cannot open {link}", event="links_open_failed", link=service.name)

    @property
    def listing(self) -> PortListing:
        """What lists the serial ports, for the watcher and for each link that matches by
        identity: the watcher's, or the system's."""
        if self.ports is not None:
            return self.ports.listing
        if self._listing is None:
            self._listing = PortListing(self.reactor, system_ports)
        return self._listing

    def watcher(self) -> PortWatcher:
        """The port watcher, made (udev's or polling) the first time a link needs one."""
        if self.ports is None:
            self.ports = system_watcher(self.reactor, self.listing,
                                        self.config.devices.poll_interval)
        return self.ports

    def stopService(self) -> defer.Deferred[None]:
        waiting, self._waiting = self._waiting, None
        if waiting is not None and waiting.active():
            waiting.cancel()
        opened, self.opened = self.opened, False
        if opened:
            stopped = defer.maybeDeferred(super().stopService)
        else:  # its links never started, but those added while they waited
            stopped = defer.DeferredList([defer.maybeDeferred(service.stopService)
                                          for service in self if service.running])
            Service.stopService(self)

        def stop_watching(result: object) -> object:
            if self.ports is not None and self.ports.running:
                self.ports.stop()
            if self.ports is not None or self._listing is not None:
                self.listing.stop()  # a hung listing is not waited for
            return result

        return stopped.addBoth(stop_watching)

    def _endpoint(self, address: str, presence_name: str | None = None) -> IStreamClientEndpoint:
        endpoint = client_endpoint(self.reactor, address, ports=self.listing)
        if presence_name is None or self.presence is None:
            return endpoint
        return PresenceEndpoint(endpoint, self.presence, presence_name)

    def _replay(self, link: Attach | PhylloLink) -> IStreamClientEndpoint | None:
        """A ``replay:`` link's endpoint, playing its capture in the link's own stack or
        framing (None for any other address)."""
        if endpoint_type(link.endpoint) != "replay":
            return None
        from wireproto.capture.replay import ReplayError, attach_replay, phyllo_replay

        try:
            if isinstance(link, PhylloLink):
                return phyllo_replay(self.reactor, link.endpoint, stack=link.stack,
                                     **_phyllo_limits(link))
            return attach_replay(
                self.reactor, link.endpoint, protocol=link.protocol, framing=link.framing,
                max_message_size=stream_options(self.config, link.framing).max_message_size)
        except ReplayError as error:
            raise StartFailed(link.describe(), str(error)) from None

    def attach(self, link: Attach, retry_policy: Callable[[int], float]) -> None:
        """Keep a `link.protocol` client connection open to `link.endpoint`."""
        self.attach_service(link, retry_policy).setServiceParent(self)

    def attach_service(self, link: Attach, retry_policy: Callable[[int], float],
                       presence_name: str | None = None) -> ReconnectingService:
        """The service that keeps `link` open (its presence published as `presence_name`'s,
        if given), for its parent to start."""
        problem = mount_error(link.prefix) if link.prefix else None
        if problem is not None:  # an Attach made in code, not read from a config
            raise StartFailed(link.describe(), f"prefix {link.prefix!r}: {problem}")
        endpoint = _LoggingClientEndpoint(
            self._replay(link) or self._endpoint(link.endpoint, presence_name), link)
        factory = stream_client_factory(
            self.connections.factory(link.protocol, link=presence_name or link.link_name,
                                     mount=link.prefix or None),
            stream_options(self.config, link.framing),
            identify=None if self.auth is None else self.auth.identify_stream(
                link.principal, None, link.endpoint),
        )
        return ReconnectingService(self.reactor, endpoint, factory, retry_policy=retry_policy)

    def add_phyllo(self, link: PhylloLink, retry_policy: Callable[[int], float]) -> HubBridge:
        """Open the Phyllo device at `link.endpoint`, reopening it with `retry_policy` whenever
        it fails or closes, and bridge its topics to the hub under `link.prefix`."""
        bridge, service = self.phyllo_service(link, retry_policy)
        service.setServiceParent(self)
        self.phyllo[link.name] = bridge
        return bridge

    def phyllo_service(self, link: PhylloLink, retry_policy: Callable[[int], float]
                       ) -> tuple[HubBridge, ReconnectingService]:
        """`link`'s bridge and the service that keeps its device open, for its parent to
        start; a link on ``serial:`` has its presence published."""
        bridge = HubBridge(
            self.hub, link.name, prefix=link.prefix, stack=link.stack,
            send_format=link.send_format, queue_bytes=self.config.hub.queue_bytes,
            **_phyllo_limits(link),
            protocol_wrapper=self.connections.wrapper("phyllo", link=link.name,
                                                      stack=link.stack, prefix=link.prefix),
            principal=link.principal,
        )
        endpoint: Any
        if is_websocket_address(link.endpoint):
            endpoint, factory = websocket_client(
                self.reactor, link.endpoint, bridge.build_message_protocol, self.config.websocket
            )
        else:
            serial = endpoint_type(link.endpoint) == "serial"
            endpoint = self._replay(link) or self._endpoint(
                link.endpoint, link.name if serial else None)
            factory = Factory.forProtocol(bridge.build_protocol)
        service = ReconnectingService(
            self.reactor, _LoggingClientEndpoint(endpoint, link), factory,
            retry_policy=retry_policy,
        )
        return bridge, service


def _phyllo_limits(link: PhylloLink) -> dict[str, int]:
    """The chunk and frame limits of a Phyllo link's stack."""
    return {"max_chunk_length": link.max_chunk_length,
            "max_frame_payload": min(MAX_FRAME_PAYLOAD, link.max_chunk_length - 2)}
