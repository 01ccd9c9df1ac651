"""The server side of WebSocket on twisted.web: `websocket_resource`, a resource that serves a
message protocol at one path, and `websocket_site`, a Site that mounts several of them on one
port. Apart from `wireproto.transports.websocket` so that a client imports none of twisted.web.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.web.resource import IResource

from wireproto.transports.base import IMessageProtocol
from wireproto.transports.http import (
    GuardedSite,
    HTTPLimits,
    Identify,
    ServedDirectory,
    admit,
    text_answer,
)
from wireproto.transports.websocket import WebSocketOptions, websocket_server_factory

if TYPE_CHECKING:
    from wireproto.access import Principal

__all__ = [
    "websocket_resource",
    "websocket_site",
    "MessageWebSocketResource",
    "OneConnectionFactory",
]

_DEFAULT_OPTIONS = WebSocketOptions()  # frozen: one shared default is safe


class OneConnectionFactory:
    """The factory WebSocketResource builds one request's protocol with: `make()`, given what
    belongs to that connection when it is made, under the shared `factory` (its settings, its
    count of connections), so that nothing of one connection is left on the shared factory."""

    def __init__(
        self, factory: WebSocketServerFactory, make: Callable[[], WebSocketServerProtocol]
    ) -> None:
        self.factory = factory
        self.make = make

    def buildProtocol(self, addr: Any) -> WebSocketServerProtocol:
        # What twisted's Factory.buildProtocol does, with the protocol already made.
        protocol = self.make()
        protocol.factory = self.factory
        return protocol


class MessageWebSocketResource(WebSocketResource):
    """WebSocketResource that hands the connection's producer slot over to the adapter.

    twisted.web's HTTPChannel registers itself as its connection's producer and never lets go,
    since the request Autobahn takes over never finishes. Left there, it would make the
    adapter's registerProducer raise and would take the transport's pause/resume calls.
    """

    def __init__(self, factory: Any, identify: Identify | None = None) -> None:
        super().__init__(factory)
        self.identify = identify

    @property
    def checks_credentials(self) -> bool:
        """Whether its handshakes carry credentials (the access log shows no query value)."""
        return self.identify is not None

    def render(self, request: Any) -> Any:
        if (request.getHeader(b"upgrade") or b"").lower() != b"websocket":
            # A plain HTTP request (a browser, a probe): answered here, with nothing logged;
            # Autobahn would log a warning for each.
            body = b"426 Upgrade Required: this path speaks WebSocket\n"
            request.setResponseCode(426, b"Upgrade Required")
            request.setHeader(b"upgrade", b"websocket")
            request.setHeader(b"connection", b"Upgrade")
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            request.setHeader(b"content-length", b"%d" % len(body))
            return body
        if b"EIO" in request.args and request.channel.site.served:  # Engine.IO's, on a broker
            return text_answer(request, 400, b"Bad Request", "this path is no Engine.IO's")
        if self.identify is not None:
            return admit(request, self.identify, lambda principal: self.upgrade(request,
                                                                                principal))
        return self.upgrade(request, None)

    def upgrade(self, request: Any, principal: Principal | None) -> Any:
        """Hand the connection to Autobahn, its adapter acting as `principal`."""

        def adapter() -> WebSocketServerProtocol:
            protocol = self._factory.protocol()
            protocol.principal = principal
            return protocol

        return self.hand_over(request, adapter)

    def hand_over(self, request: Any, make: Callable[[], WebSocketServerProtocol]) -> Any:
        """Hand the connection to Autobahn, with the protocol `make()` returns for it, which
        holds whatever belongs to this one connection."""
        transport = request.channel.transport
        if transport is not None:
            transport.unregisterProducer()
        result = WebSocketResource(OneConnectionFactory(self._factory, make)).render(request)
        if transport is not None and request.channel.transport is not None:
            # Not taken over (Autobahn answered with an HTTP error): give it back to HTTP.
            transport.registerProducer(request.channel, True)
        return result


def websocket_resource(
    protocol_factory: Callable[[], IMessageProtocol],
    options: WebSocketOptions = _DEFAULT_OPTIONS,
    *,
    url: str | None = None,
    identify: Identify | None = None,
) -> IResource:
    """A twisted.web resource that serves `protocol_factory()` protocols over WebSocket.

    Beyond `options.max_connections` open WebSockets, the opening handshake gets HTTP 503.
    With `identify`, each handshake's principal comes from it first (wireproto.authentication),
    and a refused one gets its HTTP status without any WebSocket being made.
    """
    return MessageWebSocketResource(
        websocket_server_factory(protocol_factory, options, url=url), identify
    )


def websocket_site(
    routes: Mapping[str, IResource],
    *,
    idle_timeout: float = 10.0,
    limits: HTTPLimits | None = None,
    served: str = "",
) -> GuardedSite:
    """One twisted.web Site serving each resource at its path ("/", "/websmq", "/a/b/c").

    Any other path gets 404, so several protocols can share one port; `served` (``/websmq
    websmq, /ubre ubre``) is what the 404 says the port serves. The Site is a
    `wireproto.transports.http.GuardedSite`: request bodies, the time a request may take to
    arrive and the requests still arriving are bounded by `limits`; a connection silent for
    `idle_timeout` seconds between requests is dropped (twisted.web's own default is 12 hours).
    An open WebSocket is not affected by either.
    """
    root = ServedDirectory(served)
    leaves: dict[tuple[bytes, ...], IResource] = {}
    for path, resource in routes.items():
        if not path.startswith("/"):
            raise ValueError(f"route {path!r} must start with '/'")
        segments = tuple(s.encode("utf-8") for s in path.strip("/").split("/") if s)
        if segments in leaves:
            raise ValueError(f"two routes for the same path {path!r}")
        for other in leaves:
            shorter, longer = sorted((segments, other), key=len)
            # "/" is the root's child b"", so it sits beside the other routes, not above them.
            if shorter and longer[: len(shorter)] == shorter:
                raise ValueError(
                    f"route {path!r} and route '/{b'/'.join(other).decode()}' overlap: "
                    "a WebSocket path cannot have routes below it"
                )
        leaves[segments] = resource
        if not segments:
            # twisted.web asks the root for the child b"" when the request is for "/".
            root.putChild(b"", resource)
            continue
        parent = root
        for segment in segments[:-1]:
            child = parent.children.get(segment)
            if child is None:
                child = ServedDirectory(served)
                parent.putChild(segment, child)
            parent = child
        parent.putChild(segments[-1], resource)
    return GuardedSite(root, limits or HTTPLimits(), idle_timeout=idle_timeout, served=served)
