"""The nydus client role: invoke with timeouts, routes for publishes, and optional reconnection.

Implements the client side of nydus as docs/nydus.md describes it, and behaves as the reference
client, nydus-client 5.3.1 (npm), does, except where said:

- the connection is up once the server's WELCOME has come: `connect` fires then. A WELCOME for
  another protocol version closes the connection with `IncompatibleVersion`, and, unlike
  nydus-client, does not reconnect (trying again cannot help);
- `invoke(path, data)` sends an INVOKE with a nanoid id. Its Deferred fires with the RESULT's
  data, None when the RESULT has no data (``2$id|``) as when it is null; it fails with
  `InvokeError` for an ERROR whose data has a number `status` and a non-empty string `message`
  (its `body` is the data's body, None if it has none), with `wireproto.rpc.RequestFailed`
  carrying the data for any other ERROR, with `RequestTimeout` after `timeout` seconds, and with
  `ConnectionClosed` when the connection goes first (nydus-client forgets those invokes; here they
  fail) or when the client is not connected;
- a PUBLISH goes to the first route (wireproto.routes, ruta3's patterns) its path matches, called
  as ``handler(match, data)``: `match` is a `wireproto.routes.Match` (route, params, splats,
  path) and `data` the PUBLISH's data (None for none). Nothing matches: the `on_unhandled` hook;
- with ``reconnect=True`` it reconnects with backoff (`wireproto.transports.reconnect`), as
  nydus-client does. Invokes are not queued while disconnected: they fail at once.

Addresses:

- ``http://``, ``https://``, ``ws://``, ``wss://`` URLs: Engine.IO 4 over WebSocket, what the
  real nydus server speaks (`wireproto.transports.engineio`; http is ws, https is wss, and a URL
  without a path gets ``/engine.io/``); `engineio_options` (an EngineIOOptions) and
  `context_factory` (TLS options for wss) go to it;
- with ``engineio=False``, a ``ws://``/``wss://`` URL: raw WebSocket, one nydus message per text
  frame (wireproto's extension);
- a client endpoint string (``tcp:host=...:port=...``, ``unix:path=...``): one nydus message
  per line (the ``lines`` framing, wireproto's extension).

    client = await connect(reactor, "http://127.0.0.1:8080")
    client.register_route("/chat/:room", lambda match, data: print(match.params["room"], data))
    answer = await client.invoke("/rooms/lobby/join", {"name": "ada"}, timeout=5)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.codecs import nydus
from wireproto.codecs.nydus import NO_DATA, Error, Invoke, Publish, Result, Welcome
from wireproto.errors import FrameTooLarge, InvalidField, ProtocolError
from wireproto.protocols.client import ClientBase
from wireproto.protocols.nydus.routes import Match, RouteTable
from wireproto.protocols.nydus.server import InvokeError, nanoid
from wireproto.protocols.rpc import (
    DEFAULT_REQUEST_TIMEOUT,
    ConnectionClosed,
    PendingRequests,
    RequestFailed,
    RequestTimeout,
)
from wireproto.transports.base import IMessageTransport, MessageProtocol
from wireproto.transports.connect import connect as connect_messages
from wireproto.transports.connect import is_websocket_address
from wireproto.transports.reconnect import DEFAULT_RETRY

__all__ = [
    "DEFAULT_WELCOME_TIMEOUT",
    "IncompatibleVersion",
    "InvokeError",
    "RequestFailed",
    "RequestTimeout",
    "ConnectionClosed",
    "PublishHandler",
    "NydusClient",
    "NydusClientProtocol",
    "connect",
]

log = Logger()

DEFAULT_WELCOME_TIMEOUT = 10.0
_URL_SCHEMES = ("http://", "https://", "ws://", "wss://", "http+unix://", "ws+unix://")

# handler(match, data): match.route, match.params, match.splats, match.path
PublishHandler = Callable[[Match, Any], object]


def _websocket_url(url: str) -> str:
    """An Engine.IO server's URL as its WebSocket URL: http becomes ws, https wss."""
    scheme, rest = url.split("://", 1)
    return {"http": "ws", "https": "wss", "http+unix": "ws+unix"}.get(
        scheme.lower(), scheme) + "://" + rest


class IncompatibleVersion(InvalidField):
    """The server's WELCOME is for another nydus protocol version."""


def _invoke_error(failure: Failure) -> Any:
    """An ERROR in nydus's convention (a status and a message) as an InvokeError."""
    if failure.check(RequestFailed):
        data = failure.value.body
        if isinstance(data, dict):
            status, message = data.get("status"), data.get("message")
            if (
                isinstance(status, int) and not isinstance(status, bool) and status
                and isinstance(message, str) and message
            ):
                raise InvokeError(status, message, data.get("body"))
    return failure


class NydusClientProtocol(MessageProtocol):
    """One connection of a `NydusClient`. `welcomed` fires with it once WELCOME has come."""

    # Given on connecting; every use but cancelling `welcomed` comes after (that one checks).
    transport: IMessageTransport
    _failed = False
    _is_welcomed = False
    _welcome_timer: IDelayedCall | None = None

    def __init__(self, client: NydusClient) -> None:
        self.client = client
        self.pending = PendingRequests(client.reactor)
        self.welcomed: defer.Deferred[NydusClientProtocol] = defer.Deferred(self._cancelWelcome)

    def _cancelWelcome(self, _: defer.Deferred) -> None:
        if self.transport is not None:
            self.transport.abortConnection()

    def connectionMade(self) -> None:
        timeout = self.client.welcome_timeout
        if timeout is not None:
            self._welcome_timer = self.client.reactor.callLater(timeout, self._noWelcome, timeout)

    def _noWelcome(self, timeout: float) -> None:
        self._welcome_timer = None
        if not self.welcomed.called:
            self.welcomed.errback(TimeoutError(f"no nydus WELCOME within {timeout:g} s"))
        self.transport.abortConnection()

    # -- sending -------------------------------------------------------------------------------

    def invoke(self, path: str, data: Any, timeout: float | None) -> defer.Deferred:
        if not self.connected or self._failed:
            return defer.fail(ConnectionClosed("the nydus connection is closed"))
        invoke_id = nanoid()
        try:
            encoded = nydus.encode(Invoke(invoke_id, path, data)).encode("utf-8")
            limit = self.transport.maxMessageSize
            if len(encoded) > limit:
                raise FrameTooLarge(
                    f"nydus INVOKE of {len(encoded)} bytes is over this connection's limit of "
                    f"{limit} bytes"
                )
        except ProtocolError as error:
            return defer.fail(error)
        d = self.pending.add(invoke_id, timeout=timeout, what=path)
        self.transport.sendMessage(encoded, False)
        d.addErrback(_invoke_error)
        return d

    # -- receiving -----------------------------------------------------------------------------

    def messageReceived(self, data: bytes, binary: bool) -> None:
        if self._failed:
            return
        if not data and self.transport.textOnly:
            return
        try:
            message = nydus.decode(data)
        except ProtocolError as error:
            if isinstance(error, InvalidField) and bytes(data[:2]) == b"0|":
                error = IncompatibleVersion(
                    f"{error.message}: the server speaks another nydus protocol version"
                )
            self._refuse(error)
            return
        if isinstance(message, Publish):
            self.client._published(message)
        elif isinstance(message, Result):
            self._answer(message.id, message.data, self.pending.resolve)
        elif isinstance(message, Error):
            self._answer(message.id, message.data, self.pending.reject)
        elif isinstance(message, Welcome):
            self._welcome()
        # An INVOKE is for servers; like nydus-client, ignore it.

    def _answer(self, invoke_id: str, data: Any, settle: Callable[[Any, Any], bool]) -> None:
        if not settle(invoke_id, None if data is NO_DATA else data):
            log.warn("nydus client: a reply to unknown invoke id {id!r}", event="unknown_reply",
                     protocol="nydus", id=invoke_id)

    def _welcome(self) -> None:
        if self._is_welcomed:
            return
        self._is_welcomed = True
        self._stopWelcomeTimer()
        self.client._connected(self)
        if not self.welcomed.called:
            self.welcomed.callback(self)

    def _refuse(self, error: ProtocolError) -> None:
        """Close this connection (nydus-client closes on a PARSER_ERROR too)."""
        self._failed = True
        log.warn("nydus client: closing: {error}", event="client_protocol_error", protocol="nydus",
                 error=error)
        if not self.welcomed.called:
            self.welcomed.errback(error)
        self.transport.loseConnection(error)

    def _stopWelcomeTimer(self) -> None:
        if self._welcome_timer is not None and self._welcome_timer.active():
            self._welcome_timer.cancel()
        self._welcome_timer = None

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        self._stopWelcomeTimer()
        if self._is_welcomed:
            # The client first, so code that a failing invoke resumes sees it disconnected.
            self.client._disconnected(self, reason)
        elif not self.welcomed.called:
            self.welcomed.errback(ConnectionClosed(
                f"the nydus connection closed before the server's WELCOME: "
                f"{reason.getErrorMessage()}"
            ))
        self.pending.fail_all(
            ConnectionClosed(f"the nydus connection closed: {reason.getErrorMessage()}")
        )


class NydusClient(ClientBase[NydusClientProtocol]):
    """A nydus client, connected or (with `reconnect`) reconnecting. See the module docstring
    for addresses and behaviour.

    `connect_options` go to `wireproto.transports.connect` for raw WebSocket and stream
    addresses (`websocket`, `stream`, `framing`, `context_factory`); stream addresses default to
    the ``lines`` framing. `engineio_options` go to the Engine.IO transport.
    """

    what = "nydus client"

    def __init__(
        self,
        reactor: Any,
        address: str,
        *,
        engineio: bool | None = None,
        reconnect: bool = False,
        retry_policy: Callable[[int], float] = DEFAULT_RETRY,
        welcome_timeout: float | None = DEFAULT_WELCOME_TIMEOUT,
        engineio_options: Any = None,
        **connect_options: Any,
    ) -> None:
        is_url = address.lower().startswith(_URL_SCHEMES)
        if engineio is None:
            engineio = is_url
        if engineio:
            if not is_url:
                raise ValueError(
                    f"nydus over Engine.IO needs an http://, https://, ws:// or wss:// URL, not "
                    f"{address!r}; for the lines framing pass an endpoint string without "
                    "engineio=True"
                )
            unknown = set(connect_options) - {"context_factory", "cafile", "insecure", "headers",
                                             "certfile", "keyfile"}
            if unknown:
                raise ValueError(
                    f"{', '.join(sorted(unknown))}: options for raw WebSocket and stream "
                    "addresses; Engine.IO takes engineio_options (and context_factory)"
                )
        else:
            if is_url and not is_websocket_address(address):
                raise ValueError(
                    f"{address!r}: raw WebSocket (engineio=False) needs a ws:// or wss:// URL"
                )
            if engineio_options is not None:
                raise ValueError("engineio_options apply only to Engine.IO (engineio=True)")
            if not is_url and "framing" not in connect_options and "stream" not in connect_options:
                connect_options["framing"] = "lines"
        super().__init__(reactor, address, reconnect=reconnect, retry_policy=retry_policy)
        self.engineio = engineio
        self.engineio_options = engineio_options
        self.connect_options = connect_options
        self.welcome_timeout = welcome_timeout
        self.routes = RouteTable()

    # -- hooks: replace them ---------------------------------------------------------------------

    def on_unhandled(self, path: str, data: Any) -> None:
        """A PUBLISH matched no route (nydus-client's 'unhandled' event)."""

    # -- connecting ------------------------------------------------------------------------------

    def _open(self) -> defer.Deferred:
        factory = lambda: NydusClientProtocol(self)  # noqa: E731
        if not self.engineio:
            return connect_messages(self.reactor, self.address, factory, **self.connect_options)
        from wireproto.transports import engineio_client_connect

        options = dict(self.connect_options)
        if self.engineio_options is not None:
            options["options"] = self.engineio_options
        return engineio_client_connect(
            self.reactor, _websocket_url(self.address), factory, **options
        )

    def _connect_once(self) -> defer.Deferred:
        d = defer.maybeDeferred(self._open)
        d.addCallback(lambda protocol: protocol.welcomed)
        d.addErrback(self._attempt_failed)
        return d

    def _attempt_failed(self, reason: Failure) -> Failure:
        if reason.check(IncompatibleVersion):
            # Fatal: another attempt would meet the same server.
            self.closing = True
            if self._reconnector is not None:
                self._reconnector.stop()
            self._connect_failed(reason)
        return reason

    # -- invoking --------------------------------------------------------------------------------

    def invoke(
        self, path: str, data: Any = NO_DATA, timeout: float | None = DEFAULT_REQUEST_TIMEOUT
    ) -> defer.Deferred:
        """INVOKE `path` with `data` (NO_DATA: none; None is JSON null). Fires with the RESULT's
        data, None if it has none; fails with InvokeError, RequestFailed, RequestTimeout (after
        `timeout` seconds, None for never), ConnectionClosed, or a ProtocolError for a path or
        data nydus cannot carry."""
        if self.protocol is None:
            return defer.fail(ConnectionClosed("the nydus client is not connected"))
        return self.protocol.invoke(path, data, timeout)

    # -- publishes -------------------------------------------------------------------------------

    def register_route(self, pattern: str, handler: PublishHandler | None = None) -> Any:
        """Call ``handler(match, data)`` for each PUBLISH whose path matches `pattern`; the first
        route registered that matches wins. Without a handler, a decorator."""
        if handler is None:
            def register(fn: PublishHandler) -> PublishHandler:
                self.routes.add(pattern, fn)
                return fn

            return register
        self.routes.add(pattern, handler)
        return handler

    def _published(self, message: Publish) -> None:
        data = None if message.data is NO_DATA else message.data
        match = self.routes.match(message.path)
        if match is None:
            self._hook("on_unhandled", message.path, data)
            return
        try:
            match.action(match, data)
        except Exception:
            log.failure("nydus client: the route {route!r} raised for {path!r}",
                        event="handler_failed", protocol="nydus", route=match.route,
                        path=message.path)


def connect(reactor: Any, address: str, **options: Any) -> defer.Deferred[NydusClient]:
    """Connect a `NydusClient` to `address`; fires with the client once the server has WELCOMEd
    it. `options` are NydusClient's."""
    return NydusClient(reactor, address, **options).connect()
