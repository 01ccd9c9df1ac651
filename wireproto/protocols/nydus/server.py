"""nydus over any message transport: the server role, on the hub.

The server side of nydus as docs/nydus.md describes it, behaving as nydus 5.3.2 (npm) does:

- each connection gets WELCOME (``0|3``) at once;
- only INVOKE from a client is acted on; a client's WELCOME, RESULT, ERROR or PUBLISH is ignored;
- a message that does not parse (nydus-protocol's PARSER_ERROR, here any `ProtocolError` from the
  codec, such as ``1$id~/%ZZ|1``) closes that one connection, where the real server crashes;
- an INVOKE goes to the first route (wireproto.routes, ruta3's patterns) its path matches: no
  route is ERROR ``{"message":"Not Found","status":404}``; a handler's `InvokeError` is ERROR
  ``{"message","status"[,"body"]}`` in that key order; any other exception is status 500,
  "Internal Server Error", with the exception's message and stack only in debug mode (nydus's
  development mode); a handler that returns None answers ``2$id|``, RESULT with no data;
- `subscribe_client`, `unsubscribe_client`, `unsubscribe_all` and `publish` work as nydus's do.

**Hub routes** (`hub_routes=True`, on in `wireproto serve`), for nydus clients of a plain broker:
``/_hub/subscribe`` and ``/_hub/unsubscribe`` take a path, ``/_hub/publish`` ``{"path", "data"}``
and answers ``{"delivered": N, "processes": P}`` (docs/nydus.md); bad data is ERROR 400.

Any message transport carries it: Engine.IO 4, WebSocket text frames, or ``lines`` on a stream.
**Paths and hub topics** and **None and no data** are in docs/nydus.md: a path ``/chat/room`` is
the hub topic ``chat/room``; what code returns is no data when it is None, as undefined in
JavaScript, and a value passed in is JSON null when it is None (no data: `NO_DATA`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from inspect import iscoroutine
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.access import Action
from wireproto.codecs import nydus
from wireproto.codecs.nydus import NO_DATA, Error, Invoke, Publish, Result
from wireproto.errors import Forbidden, FrameTooLarge, LimitExceeded, NotThisProtocol, ProtocolError
from wireproto.hub import Hub, HubMessage, Session, log_protocol_error
from wireproto.payloads import payload_from_value
from wireproto.protocols import calls
from wireproto.protocols.calls import Answer, Call, CallName, RemoteCaller
from wireproto.protocols.nydus.elsewhere import RoutesElsewhere
from wireproto.protocols.nydus.invocation import (
    FORBIDDEN,
    NOT_FOUND,
    TOO_MANY_REQUESTS,
    InvokeError,
    answer_by,
    error_data,
    needs_connection,
    path_data,
    unanswered_data,
)
from wireproto.protocols.nydus.paths import (
    call_name,
    encode_for_nydus,
    nanoid,
    path_of_topic,
    publish_head,
    topic_of_path,
)
from wireproto.protocols.nydus.routes import Match, RouteTable, route_key
from wireproto.protocols.rpc import RequestFailed, run_handler
from wireproto.transports.base import IMessageTransport, MessageProtocol

__all__ = [
    "serve",
    "NydusSettings",
    "WIRE_FORMAT",
    "DEFAULT_MAX_PENDING_INVOKES",
    "NOT_FOUND",
    "TOO_MANY_REQUESTS",
    "NydusServer",
    "NydusServerProtocol",
    "server_factory",
]

log = Logger()

WIRE_FORMAT = "nydus"
DEFAULT_MAX_PENDING_INVOKES = 1000
HUB_ROUTES = "/_hub"


@dataclass(frozen=True)
class NydusSettings:
    """The [nydus] table: how the broker serves nydus."""

    # Failed handlers' messages and stacks go to the client (nydus's development mode).
    debug: bool = False
    # Invokes from one connection that its handlers may work on at once; more get 429.
    max_pending_invokes: int = DEFAULT_MAX_PENDING_INVOKES
    # /_hub/subscribe, /_hub/unsubscribe and /_hub/publish, for clients of a plain broker.
    hub_routes: bool = True


@dataclass(frozen=True)
class Invocation:
    """One INVOKE, as its handler gets it (nydus's handler data).

    `path` is the path the client invoked, decoded; `route` the pattern that matched it (what
    nydus calls `path`); `params` and `splats` its captures (wireproto.routes); `body` the
    INVOKE's data, None when it had none. `client` is the connection, to subscribe or to reply
    to later (a RemoteCaller for an INVOKE made on another process); `server` the NydusServer.
    """

    server: NydusServer
    client: NydusServerProtocol | RemoteCaller
    path: str
    route: str
    params: dict[str, str | None] = field(default_factory=dict)
    splats: list[str | None] = field(default_factory=list)
    body: Any = None
    id: str = ""


# handler(invocation) -> result, a Deferred of one, or a coroutine. Raise InvokeError to fail.
Handler = Callable[[Invocation], Any]


# -- one connection ------------------------------------------------------------------------------


class NydusServerProtocol(MessageProtocol):
    """The server's side of one nydus connection: the `client` that handlers and hooks get.

    `id` is a nanoid, the key in `NydusServer.clients`. `subscriptions` is the set of paths this
    client is subscribed to.
    """

    transport: IMessageTransport  # given before any other call (makeConnection)
    session: Session | None = None  # its place in the hub, from connectionMade on
    _failed = False

    def __init__(self, server: NydusServer, mount: str | None = None) -> None:
        self.server = server
        # Where this connection's topics are on the hub (None: as they are): wireproto.hub.mount.
        self.mount = mount
        self.id = nanoid()
        self._answering = 0

    def __repr__(self) -> str:
        return f"<NydusServerProtocol {self.id}>"

    @property
    def subscriptions(self) -> frozenset[str]:
        if self.session is None:
            return frozenset()
        return frozenset(path_of_topic(topic) for topic in self.session.own_topics())

    def close(self) -> None:
        """Close this connection."""
        if self.connected:
            self.transport.loseConnection()

    # -- connection events ---------------------------------------------------------------------

    def connectionMade(self) -> None:
        server = self.server
        session = self.session = server.hub.attach(
            self.transport, protocol="nydus", wire_format=WIRE_FORMAT, encode=encode_for_nydus,
            client=self.id, mount=self.mount,
        )
        server.clients[self.id] = self
        server._sessions[session] = self
        session.send(b"0|3", False)
        server._hook("on_connect", self)

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        server = self.server
        server.clients.pop(self.id, None)
        if self.session is not None:
            server._sessions.pop(self.session, None)
            self.session.close(reason)
            server._hook("on_disconnect", self, reason)

    # -- receiving -----------------------------------------------------------------------------

    def messageReceived(self, data: bytes, binary: bool) -> None:
        if self._failed:
            return
        if not data and self.transport.textOnly:
            return  # an empty line (Enter pressed in nc) is no message on the lines framing
        try:
            message = nydus.decode(data)
        except ProtocolError as error:
            self._parser_error(data, error)
            return
        if type(message) is Invoke:
            self._invoke(message)
        # Like nydus, ignore what only a server may send.

    def _parser_error(self, raw: bytes, error: ProtocolError) -> None:
        self._failed = True
        log_protocol_error("nydus", self.transport, error, self.session)
        self.server._hook("on_parser_error", self, raw)
        self.transport.loseConnection(NotThisProtocol("nydus", error))

    def _over_limit(self, error: LimitExceeded) -> None:
        """Past a per-connection limit of the hub's: closed, as in every protocol."""
        self._failed = True
        log_protocol_error("nydus", self.transport, error, self.session)
        self.transport.loseConnection(error)

    def _invoke(self, message: Invoke) -> None:
        server = self.server
        if self._answering >= server.max_pending_invokes:
            self._reply(Error, message.id, TOO_MANY_REQUESTS)
            return
        session = self.session
        assert session is not None  # messages come after connectionMade
        match = server.routes.match(message.path)
        if match is None:
            remote = server.remote_route(message.path)
            if remote is None:
                self._reply(Error, message.id, NOT_FOUND)
            elif self._may_call(session, message):
                self._invoke_elsewhere(session, message, remote)
            return
        if match.action not in server.hub_route_handlers and not self._may_call(session, message):
            return
        invocation = Invocation(
            server, self, message.path, match.route, match.params, match.splats,
            None if message.data is NO_DATA else message.data, message.id,
        )
        working = run_handler(
            match.action, (invocation,),
            lambda value: self._reply(Result, message.id, value),
            lambda failure: self._handler_failed(invocation, failure),
            server.observe_request,
        )
        if working is not None:
            self._answering += 1
            working.addBoth(self._answered)

    def _may_call(self, session: Session, message: Invoke) -> bool:
        """Whether this client may INVOKE its path; if not, 403, and closed past a limit."""
        try:
            session.check(Action.CALL, call_name(message.path))
        except Forbidden:
            self._reply(Error, message.id, FORBIDDEN)
            return False
        except LimitExceeded as error:
            self._reply(Error, message.id, FORBIDDEN)
            self._over_limit(error)
            return False
        return True

    def _answered(self, result: Any) -> None:
        self._answering -= 1
        if isinstance(result, Failure):
            log.failure("nydus: sending a reply failed", result, event="reply_failed",
                        protocol="nydus")

    def _invoke_elsewhere(self, session: Session, message: Invoke, route: str) -> None:
        """Ask the broker process that serves `route`."""
        call = Call("nydus", route, calls.to_call(message.data, NO_DATA), session.caller(),
                    path=message.path, id=message.id)
        self._answering += 1
        d = self.server.hub.federation.call(call)
        d.addCallbacks(self._remote_answered, self._remote_failed,
                       callbackArgs=(message.id,), errbackArgs=(message.id,))
        d.addBoth(self._answered)

    def _remote_answered(self, answer: Answer, invoke_id: str) -> None:
        self._reply(Result if answer.succeeded else Error, invoke_id,
                    calls.from_call(answer.body, NO_DATA))

    def _remote_failed(self, failure: Failure, invoke_id: str) -> None:
        self._reply(Error, invoke_id, unanswered_data(failure.value))

    def _handler_failed(self, invocation: Invocation, failure: Failure) -> None:
        error = failure.value
        if not isinstance(error, (InvokeError, RequestFailed)):
            log.failure("nydus: handler for {path!r} ({route!r}) raised", failure,
                        event="handler_failed", protocol="nydus", path=invocation.path,
                        route=invocation.route)
        self._reply(Error, invocation.id, error_data(error, self.server.debug))
        limit = error if isinstance(error, LimitExceeded) else error.__cause__
        if isinstance(limit, LimitExceeded):
            # The ERROR says why; then the connection closes.
            self._over_limit(limit)

    # -- sending -------------------------------------------------------------------------------

    def _reply(self, kind: type, invoke_id: str, data: Any) -> None:
        session = self.session
        if not self.connected or self._failed or session is None:
            return  # the client is gone, and so is its reply
        if kind is Result and data is None:
            data = NO_DATA  # a handler that returns nothing: RESULT with no data, `2$id|`
        try:
            encoded = self._encode(kind(invoke_id, data))
        except (ProtocolError, TypeError, ValueError) as error:
            log.warn("nydus: cannot send the reply to {id!r}: {error}", event="reply_not_sent",
                     protocol="nydus", id=invoke_id, error=error)
            try:
                encoded = self._encode(Error(invoke_id, error_data(error, self.server.debug)))
            except (ProtocolError, TypeError, ValueError):
                # Even the error is too big for this connection: say only that it failed.
                encoded = self._encode(Error(invoke_id, error_data(error, False)))
        session.send(encoded, False)

    def _encode(self, message: nydus.Message) -> bytes:
        data = nydus.encode(message).encode("utf-8")
        limit = self.transport.maxMessageSize
        if len(data) > limit:
            raise FrameTooLarge(
                f"nydus message of {len(data)} bytes is over this connection's limit of {limit} "
                "bytes"
            )
        return data

    def send_publish(self, path: str, data: Any = NO_DATA) -> bool:
        """Send a PUBLISH to this client alone, subscribed or not; False if it is gone."""
        if not self.connected or self._failed or self.session is None:
            return False
        self.session.send(self._encode(Publish(path, data)), False)
        return True


# -- the server ------------------------------------------------------------------------------------


class NydusServer:
    """The nydus server role on a hub: routes, subscriptions, hooks, and the factory of
    connections (call it for a new connection's protocol).

    Register handlers with `register_route`; a handler is called as ``handler(invocation)``
    (see `Invocation`) and may return a value, a Deferred, or be a coroutine function. Hooks are
    plain methods to replace: ``server.on_connect = lambda client: ...``.
    """

    # observe(seconds, succeeded) per invoke answered by a handler; set by wireproto.metrics.
    observe_request: Callable[[float, bool], Any] | None = None

    def __init__(
        self,
        hub: Hub,
        *,
        debug: bool = False,
        max_pending_invokes: int = DEFAULT_MAX_PENDING_INVOKES,
        hub_routes: bool = False,
        reactor: Any = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor
        self.hub = hub
        self.debug = debug
        self.max_pending_invokes = max_pending_invokes
        self.reactor = reactor
        self.routes = RouteTable()
        self.clients: dict[str, NydusServerProtocol] = {}
        self._sessions: dict[Session, NydusServerProtocol] = {}
        # The hub routes are subscribe and publish, checked as such rather than as calls.
        self.hub_route_handlers: tuple[Handler, ...] = ()
        if hub_routes:
            self.hub_route_handlers = (
                self._route_subscribe, self._route_unsubscribe, self._route_publish,
            )
            self.register_route(f"{HUB_ROUTES}/subscribe", self._route_subscribe)
            self.register_route(f"{HUB_ROUTES}/unsubscribe", self._route_unsubscribe)
            self.register_route(f"{HUB_ROUTES}/publish", self._route_publish)
        # The routes other broker processes serve, matched when none here does.
        self.elsewhere = RoutesElsewhere(hub)
        hub.add_call_server("nydus", self)

    # -- hooks: replace them ---------------------------------------------------------------------

    def on_connect(self, client: NydusServerProtocol) -> None:
        """A client connected (its WELCOME is on its way)."""

    def on_disconnect(self, client: NydusServerProtocol, reason: Failure) -> None:
        """A client's connection closed; its subscriptions are gone."""

    def on_parser_error(self, client: NydusServerProtocol, raw: bytes) -> None:
        """`raw`, a message from `client`, did not parse; the connection is being closed."""

    def _hook(self, name: str, *args: Any) -> None:
        try:
            getattr(self, name)(*args)
        except Exception:
            log.failure("nydus: the {hook} hook raised", event="hook_failed", protocol="nydus",
                        hook=name)

    # -- routes ----------------------------------------------------------------------------------

    def register_route(self, pattern: str, handler: Handler | None = None) -> Any:
        """Answer INVOKEs whose path matches `pattern` (wireproto.routes) with `handler`; the
        first route registered that matches wins. Without a handler, a decorator:
        ``@server.register_route("/rooms/:room/join")``."""
        if handler is None:
            def register(fn: Handler) -> Handler:
                self.routes.add(pattern, fn)
                self.hub.calls_changed()
                return fn

            return register
        self.routes.add(pattern, handler)
        self.hub.calls_changed()
        return handler

    # -- routes on other broker processes ---------------------------------------------------------

    def served_calls(self) -> list[CallName]:
        """This process's routes, but the hub routes (every process has them), by their keys
        (`route_key`)."""
        return [route_key(route) for route in self.routes.routes
                if route.action not in self.hub_route_handlers]

    def call(self, path: str, data: Any, caller: RemoteCaller) -> defer.Deferred[Answer]:
        """INVOKE `path` with `data` (None: no data) as `caller` (the admin page), answered by
        a route here or on another broker process; its Answer's body is an ERROR's data when
        not, NO_BODY for none."""
        body = calls.to_call(NO_DATA if data is None else data, NO_DATA)
        match = self.routes.match(path)
        if match is not None:
            # A hub route too: every process's own, so no other lists it.
            key = route_key(self.routes.routes[match.index])
            return self._run(match, Call("nydus", key, body, caller, path=path, id="admin"))
        remote = self.remote_route(path)
        if remote is None:
            return defer.succeed(Answer(False, NOT_FOUND))
        d = self.hub.federation.call(
            Call("nydus", remote, body, caller, path=path, id="admin"))

        def unanswered(failure: Failure) -> Answer:
            return Answer(False, unanswered_data(failure.value))

        return d.addErrback(unanswered)

    def callable_names(self) -> list[str]:
        """The routes' patterns, here (``/_hub/publish`` included) and on other processes; not
        ``/_hub/subscribe`` nor ``/_hub/unsubscribe``, which subscribe the calling connection."""
        subscribing = (self._route_subscribe, self._route_unsubscribe)
        patterns = {route.pattern for route in self.routes.routes
                    if route.action not in subscribing}
        patterns.update(self.elsewhere.patterns())
        return sorted(patterns)

    def remote_route(self, path: str) -> str | None:
        """The key of the route of another broker process that matches `path`, or None."""
        return self.elsewhere.match(path)

    def answer(self, call: Call) -> defer.Deferred[Answer]:
        """Answer an INVOKE made elsewhere: the route's handler gets an Invocation whose
        `client` is the call's `RemoteCaller`."""
        path = call.path or ""
        match = None
        for index, route in enumerate(self.routes.routes):
            if route.action not in self.hub_route_handlers and route_key(route) == call.name:
                match = self.routes.match_route(index, path)
                break
        if match is None:
            return defer.succeed(Answer(False, NOT_FOUND))
        return self._run(match, call)

    def _run(self, match: Match, call: Call) -> defer.Deferred[Answer]:
        """The Answer of `match`'s handler to `call`, made from outside a connection."""
        invocation = Invocation(
            self, call.caller, match.path, match.route, match.params, match.splats,
            None if call.body is calls.NO_BODY else call.body, call.id or "",
        )

        def unexpected(failure: Failure) -> None:
            log.failure("nydus: handler for {path!r} ({route!r}) raised", failure,
                        event="handler_failed", protocol="nydus", path=match.path,
                        route=match.route)

        return answer_by(match.action, invocation, debug=self.debug,
                         observe=self.observe_request, unexpected=unexpected)

    # -- the hub routes ------------------------------------------------------------------------

    def _route_subscribe(self, invocation: Invocation) -> None:
        needs_connection(invocation.client, invocation.route)
        try:
            self.subscribe_client(invocation.client, path_data(invocation.body))
        except LimitExceeded as error:
            raise InvokeError(400, str(error)) from error  # and the connection closes
        except Forbidden:
            raise InvokeError(403, "Forbidden") from None
        except (ValueError, ProtocolError) as error:
            raise InvokeError(400, str(error)) from None

    def _route_unsubscribe(self, invocation: Invocation) -> None:
        needs_connection(invocation.client, invocation.route)
        self.unsubscribe_client(invocation.client, path_data(invocation.body))

    def _route_publish(self, invocation: Invocation) -> dict[str, int]:
        body = invocation.body
        if not isinstance(body, dict) or set(body) - {"path", "data"} or "path" not in body:
            raise InvokeError(400, 'expected {"path": "/topic", "data": ...}')
        path = path_data(body["path"])
        sender = invocation.client if isinstance(invocation.client, NydusServerProtocol) else None
        try:
            if sender is None and topic_of_path(path).startswith("$"):
                # Called from outside any connection (the admin page): published by the
                # broker, as the admin API publishes, and so never on its own $ topics.
                raise InvokeError(403, "Forbidden")
            self.publish(path, body.get("data", NO_DATA), sender=sender)
        except LimitExceeded as error:
            raise InvokeError(400, str(error)) from error
        except Forbidden:
            raise InvokeError(403, "Forbidden") from None
        except (ValueError, ProtocolError) as error:
            raise InvokeError(400, str(error)) from None
        session, topic = sender and sender.session, topic_of_path(path)
        return {"delivered": self.hub.reached(session.hub_topic(topic) if session else topic,
                                              session),
                "processes": self.hub.federation.processes()}

    # -- subscriptions ---------------------------------------------------------------------------

    def subscribe_client(self, client: NydusServerProtocol | RemoteCaller, path: str,
                         initial_data: Any = NO_DATA) -> bool:
        """Subscribe `client` to `path` (its hub topic, see the module docstring). If it was not
        subscribed already, `initial_data` goes to it alone as a PUBLISH: at once, or, for a
        Deferred or a coroutine, when that gives a value other than None, if the client is still
        subscribed then. False if it was already subscribed or is disconnected.

        Raises ValueError for a path without a leading ``/``, InvalidTopic for one nydus cannot
        carry, InvalidField for plain initial data that is not JSON, and LimitExceeded past the
        hub's subscriptions limit.
        """
        if isinstance(client, RemoteCaller):
            _discard(initial_data)
            raise TypeError(
                f"{client!r} is connected to another broker process; it can subscribe itself "
                "(with /_hub/subscribe), but cannot be subscribed from here"
            )
        try:
            topic = topic_of_path(path)
            publish_head(path)
        except ValueError:
            _discard(initial_data)
            raise
        session = client.session
        if not client.connected or session is None or session.closed:
            _discard(initial_data)
            return False
        if session.subscribed(topic):
            _discard(initial_data)
            return False
        pending = isinstance(initial_data, defer.Deferred) or iscoroutine(initial_data)
        first = None
        if initial_data is not NO_DATA and not pending:
            first = client._encode(Publish(path, initial_data))
        try:
            session.subscribe(topic)
        except Exception:
            _discard(initial_data)
            raise
        if first is not None:
            session.send(first, False)
        elif pending:
            d = defer.ensureDeferred(initial_data)
            d.addCallback(self._send_initial_data, client, path)
            d.addErrback(
                lambda failure: log.failure(
                    "nydus: initial data for {path!r} failed", failure,
                    event="initial_data_failed", protocol="nydus", path=path,
                )
            )
        return True

    def _send_initial_data(self, data: Any, client: NydusServerProtocol, path: str) -> None:
        if data is None or data is NO_DATA or path not in client.subscriptions:
            return
        try:
            client.send_publish(path, data)
        except (ProtocolError, TypeError, ValueError) as error:
            log.warn("nydus: cannot send initial data for {path!r} to {client}: {error}",
                     event="initial_data_not_sent", protocol="nydus", path=path,
                     client=client.id, error=error)

    def unsubscribe_client(self, client: NydusServerProtocol | RemoteCaller, path: str) -> bool:
        """Unsubscribe `client` from `path`; False if it was not subscribed here."""
        topic = topic_of_path(path)
        if isinstance(client, RemoteCaller) or client.session is None:
            return False
        return client.session.unsubscribe(topic)

    def unsubscribe_all(self, path: str) -> bool:
        """Unsubscribe every client of this server from `path` (the hub's, unlike a client's
        own); False if none was subscribed. Other protocols' subscribers keep theirs."""
        topic = topic_of_path(path)
        found = False
        for session in [s for s in self.hub.subscribers(topic) if s in self._sessions]:
            # A mounted client's own name for the topic (wireproto.hub.mount).
            own = session.own_topic(topic)
            if own is not None and session.unsubscribe(own):
                found = True
        return found

    def publish(self, path: str, data: Any = NO_DATA, *,
                sender: NydusServerProtocol | RemoteCaller | None = None) -> int:
        """Publish `data` on `path` (`sender`'s own, under its mount if it has one) to every
        subscriber of its hub topic, on every protocol, but `sender`. Returns how many got it.
        Raises InvalidField for data that is not JSON (bytes go into the hub as they are),
        ValueError or InvalidTopic for a path without a topic, Forbidden if `sender` may not
        publish there, LimitExceeded past [hub] max_topic_length, TypeError for a sender on
        another process (it can publish itself, with /_hub/publish)."""
        if isinstance(sender, RemoteCaller):
            raise TypeError(f"{sender!r} is connected to another broker process")
        topic, head = topic_of_path(path), publish_head(path)
        session = sender.session if sender is not None else None
        hub_topic = topic if session is None else session.hub_topic(topic)
        if session is not None:
            session.received += 1  # as Session.publish counts another protocol's
            session.check_topic_length(hub_topic)
            session.check(Action.PUBLISH, topic)
        payload = b"" if data is NO_DATA else payload_from_value(data)
        cache = {}  # the frame as it goes out names the path: for subscribers naming it alike
        if hub_topic == topic and not isinstance(data, (bytes, bytearray, memoryview)):
            cache[WIRE_FORMAT] = (head + payload, False)
        return self.hub.publish(HubMessage(hub_topic, payload, sender=session, protocol="nydus"),
                                cache)

    # -- connections -----------------------------------------------------------------------------

    def __call__(self, mount: str | None = None) -> NydusServerProtocol:
        """A new connection's protocol (topics under `mount`, if given): the server is a factory."""
        return NydusServerProtocol(self, mount)

    def close(self) -> None:
        """Close every connection (as nydus's close does); listeners are stopped by their owner."""
        for client in tuple(self.clients.values()):
            client.close()


def _discard(initial_data: Any) -> None:
    """A coroutine that will never be awaited is closed, so Python does not warn about it."""
    if iscoroutine(initial_data):
        initial_data.close()


def server_factory(hub: Hub, **options: Any) -> NydusServer:
    """The nydus server for `hub`; it is also the zero-argument protocol factory the transport
    adapters take. `options` are NydusServer's."""
    return NydusServer(hub, **options)


def serve(hub: Hub, settings: NydusSettings) -> NydusServer:
    """The broker's nydus server, as its [nydus] table says."""
    return NydusServer(hub, **asdict(settings))
