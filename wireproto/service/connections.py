"""The connections of a running broker: the server role of each protocol, the protocol made
for each connection (counted against its principal's limits, captured when capture is on), and
closing every one of them on the way out."""

from __future__ import annotations

import functools
import sqlite3
import weakref
from collections.abc import Callable
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime

from wireproto.capture.wrapper import BrokerCapture, CapturingProtocol
from wireproto.config import Config, Listener
from wireproto.hub import Hub
from wireproto.limits import LimitingProtocol
from wireproto.metrics import ServiceMetrics
from wireproto.protocols import protocol as server_protocol
from wireproto.service.parts import StartFailed
from wireproto.transports.base import IMessageProtocol, MessageProtocol, go_away
from wireproto.transports.http import GuardedSite

__all__ = ["Connections"]

ProtocolWrapper = Callable[[IMessageProtocol], IMessageProtocol]


class Connections(Service):
    """Makes each connection's protocol, and closes the connections still open when it stops.

    `http_sites` are the HTTP sites of the listeners (wireproto.service.listeners adds them):
    what a connection's end wrote to HTTP goes out before they close their connections."""

    def __init__(self, config: Config, hub: Hub, reactor: IReactorTime,
                 capture: BrokerCapture | None) -> None:
        self.setName("connections")
        self.config = config
        self.hub = hub
        self.reactor = reactor
        self.capture = capture
        # Times the requests each protocol server answers, when there are metrics.
        self.metrics: ServiceMetrics | None = None
        self.http_sites: list[GuardedSite] = []
        # Every connection's protocol, weakly: what is still open when the broker stops.
        self.open: weakref.WeakSet[MessageProtocol] = weakref.WeakSet()
        self._servers: dict[str, Callable[[], MessageProtocol]] = {}

    def server(self, protocol: str) -> Callable[[], MessageProtocol]:
        """The server role of `protocol` on the hub, made once and shared by all its listeners:
        for UBRE, the `UbreServer` to register handlers and hooks on."""
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

    def wrapper(self, protocol: str, **described: object) -> ProtocolWrapper | None:
        """What wraps each connection's protocol of `protocol`: capture, when it is on.
        `described` goes into each connection's open record too (a Phyllo link's name and
        stack, by which a replay finds it: wireproto.capture.replay)."""
        capture = self.capture
        if capture is None:
            return None
        listener = {**self.captured_listener(protocol), **described}
        return lambda wrapped: CapturingProtocol(wrapped, capture, protocol, listener)

    def captured_listener(self, protocol: str) -> dict[str, object]:
        """What the open record of each connection of `protocol` says of how it is served,
        for a reader of the capture: for WEBSMQ, whether it takes wildcard subscriptions
        ([websmq] wildcards), so that a pattern subscription reads as one, not as a malformed
        topic."""
        if protocol == "websmq":
            return {"wildcards": bool(getattr(self.config.tables.get("websmq"), "wildcards",
                                              False))}
        return {}

    def factory(self, protocol: str, listener: Listener | None = None, *,
                link: str | None = None, mount: str | None = None,
                ) -> Callable[[], IMessageProtocol]:
        """Each connection's protocol of `protocol`, with what `listener` tells it: counted
        against its principal's [limits] outermost, then captured when capture is on. An
        attached `link` names its connections in the capture; with `mount`, their topics are
        the hub's under it (wireproto.hub.mount)."""
        make = self.server(protocol)
        options = {} if listener is None else listener.connection_options()
        if mount is not None:
            options["mount"] = mount
        if options:
            make = functools.partial(make, **options)
        connections = self.open
        described = {key: value for key, value in (("link", link), ("prefix", mount))
                     if value is not None}
        capture = self.wrapper(protocol, **described)
        limits, reactor = self.hub.limits, self.reactor
        last_values, examined = self.hub.retained, self.hub.retained_examined_per_second

        def build() -> IMessageProtocol:
            made = make()
            connections.add(made)
            inner = made if capture is None else capture(made)
            return LimitingProtocol(inner, limits, protocol, reactor, last_values=last_values,
                                    examined_per_second=examined)

        return build

    @defer.inlineCallbacks
    def stopService(self) -> Any:
        """The protocol servers stop following the hub, and every connection closes."""
        super().stopService()
        for server in self._servers.values():
            close = getattr(server, "close", None)
            if close is not None:
                close()  # e.g. a UbreServer stops following the hub's topics
        self._servers.clear()
        yield self.close_all()

    @defer.inlineCallbacks
    def close_all(self, timeout: float | None = None) -> Any:
        """Close every open connection cleanly; abort those still open after `timeout` s."""
        if timeout is None:
            timeout = self.config.websocket.close_handshake_timeout + 1.0
        reactor: Any = self.reactor
        for protocol in list(self.open):
            if protocol.connected and protocol.transport is not None:
                go_away(protocol.transport)
        deadline = reactor.seconds() + timeout
        while reactor.seconds() < deadline:
            if not any(protocol.connected for protocol in self.open):
                break
            yield task.deferLater(reactor, 0.02, lambda: None)
        # What the connections' ends wrote to HTTP (a held poll answered with the close
        # packet) goes out before the HTTP connections close.
        while reactor.seconds() < deadline:
            if not sum(site.close_http_connections() for site in self.http_sites):
                return
            yield task.deferLater(reactor, 0.02, lambda: None)
        for protocol in list(self.open):
            if protocol.connected and protocol.transport is not None:
                protocol.transport.abortConnection()
