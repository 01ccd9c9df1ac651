"""UBRE over any message transport: the broker (server role).

Implements UBRE as docs/ubre.md describes it. ubre.js, the reference, is peer to peer; wireproto's
server is a broker on the hub:

- a publish reaches every other subscriber of that exact topic, whatever protocol it came in on;
- requests are answered by handlers registered by name (ubre.js's `{"request": name, "id": id}`),
  or by one default handler for the spec's `{"request": id}` form and for binary requests;
- UBRE is symmetric, so the server can send requests to a client, and a client answers them with
  handlers of its own (see `wireproto.protocols.ubre_client`);
- like a ubre.js peer, the server tells each client which topics it wants, with a subscribe
  message per hub topic that has subscribers, because ubre.js publishes only on topics its peer
  has subscribed to; but only topics that client may publish on (its access rules; never the
  broker's own $SYS topics), and on a listener with ``announce = "own"`` only the topics it
  subscribes to itself, so that no client learns what others subscribe to.

JSON comes in WebSocket text frames or lines; the binary format in binary frames or a framing that
marks message ends (length32, cobs). Each reply goes in the format of its request. A connection
gets publishes in the format of its latest subscribe. docs/ubre.md says how bodies map to hub
payloads and back."""


from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.access import Action, Grants
from wireproto.codecs import ubre
from wireproto.codecs.ubre import NO_BODY, Fail, Publish, Request, Subscribe, Success, Unsubscribe
from wireproto.errors import InvalidTopic, NotThisProtocol, ProtocolError
from wireproto.hub import Hub, HubMessage, Session, log_protocol_error, publish_allowed
from wireproto.protocols import calls
from wireproto.protocols.calls import Answer, Call, CallName, RemoteCaller
from wireproto.protocols.rpc import (
    DEFAULT_REQUEST_TIMEOUT,
    RequestFailed,
    error_body,
    run_handler,
)
from wireproto.protocols.ubre.peer import (
    BINARY_FORMAT,
    DEFAULT_MAX_PENDING_REQUESTS,
    DEFAULT_MAX_TOPIC_LENGTH,
    HUB_ENCODERS,
    JSON_FORMAT,
    JSON_TEXT_FORMAT,
    NOT_FOUND,
    TOO_MANY_REQUESTS,
    Handler,
    HandlerRegistry,
    UbrePeer,
    incoming_body,
    json_publish,
    outgoing_body,
    payload_from_body,
)

__all__ = [
    "ANNOUNCE_MODES",
    "serve",
    "UbreSettings",
    "UbreServerProtocol",
    "UbreServer",
    "server_factory",
]

log = Logger()

# The fail bodies of a request that another broker process was to answer (docs/cluster.md).
TIMEOUT = "Timeout"  # it did not answer within [cluster] call_timeout
UNAVAILABLE = "Unavailable"  # NATS is out of reach, or that process could not answer
UNANSWERED: dict[type[BaseException], str] = {
    calls.CallNotFound: NOT_FOUND, calls.CallTooManyRequests: TOO_MANY_REQUESTS,
    calls.CallTimeout: TIMEOUT,
}


def unanswered_body(error: BaseException) -> str:
    """The Fail body of a request no process answered, because of `error`."""
    return calls.unanswered(error, UNANSWERED, UNAVAILABLE)


# What a connection is told of the hub's topics (a listener's `announce`; docs/ubre.md).
ANNOUNCE_SUBSCRIBED = "subscribed"  # every topic with a subscriber, that it may publish on
ANNOUNCE_OWN = "own"  # only the topics it subscribes to itself, that it may publish on
ANNOUNCE_MODES = (ANNOUNCE_SUBSCRIBED, ANNOUNCE_OWN)

# -- the server role ------------------------------------------------------------------------------


@dataclass(frozen=True)
class UbreSettings:
    """The [ubre] table: how the broker serves UBRE."""

    # Tell each client which topics have subscribers: ubre.js publishes only on those.
    announce_topics: bool = True
    max_topic_length: int = DEFAULT_MAX_TOPIC_LENGTH
    # Requests from one connection that its handlers may work on at once.
    max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS
    # For requests the server sends to a client.
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    # Failed handlers' stacks go to the client: for development only.
    debug: bool = False


class UbreServerProtocol(UbrePeer):
    """The broker's side of one UBRE connection; the `peer` that handlers and hooks get."""

    # Its place in the hub, from connectionMade on: every message, hook and announcement comes
    # after (the methods they call narrow it so).
    session: Session | None = None
    serves = "ubre"

    def __init__(self, server: UbreServer, announce: str = ANNOUNCE_SUBSCRIBED,
                 mount: str | None = None) -> None:
        super().__init__(server)
        self.server = server
        # Where this connection's topics are on the hub (None: as they are): wireproto.hub.mount.
        self.mount = mount
        self.wire_format: Hashable = JSON_FORMAT
        if announce not in ANNOUNCE_MODES:
            raise ValueError(f"announce {announce!r}: use {' or '.join(ANNOUNCE_MODES)}")
        self.announces_own = announce == ANNOUNCE_OWN
        # With announce "own": the topics announced to this client, some of its own
        # subscriptions (so at most the hub's max_subscriptions).
        self.announced: set[str] = set()

    def connectionMade(self) -> None:
        wire_format = self.wire_format = JSON_TEXT_FORMAT if self.text_only else JSON_FORMAT
        self.session = self.server.hub.attach(
            self.transport, protocol="ubre", wire_format=wire_format,
            encode=HUB_ENCODERS[wire_format], mount=self.mount,
        )
        self.server.peers[self] = None
        if self.server.announce_topics and not self.announces_own:
            for topic in self.server.hub.topics():
                own = self.announced_name(topic)
                if own is not None:
                    self.announce(Subscribe, own)
        self.server._hook("on_connect", self)

    def _write(self, data: bytes, binary: bool) -> None:
        # Through the session's queue, in order with publishes, bounded like them.
        session = self.session
        assert session is not None
        session.send(data, binary)

    def _log_refusal(self, error: ProtocolError) -> None:
        logged = error.error if isinstance(error, NotThisProtocol) else error
        log_protocol_error("ubre", self.transport, logged, self.session)

    # -- what a client asks of the broker --------------------------------------------------------

    def checkCall(self, name: str) -> None:
        session = self.session
        assert session is not None
        session.check(Action.CALL, name)

    def _check_topic(self, topic: str) -> None:
        limit = self.server.max_topic_length
        if len(topic) > limit:
            raise InvalidTopic(
                f"UBRE topic of {len(topic)} characters: this server takes at most {limit}"
            )

    def publishReceived(self, message: Publish, data: bytes, binary_format: bool) -> None:
        session = self.session
        assert session is not None
        self._check_topic(message.topic)
        encodings: dict[Hashable, tuple[bytes, bool]]
        if binary_format:
            payload = message.body if message.body is not NO_BODY else b""
            encodings = {BINARY_FORMAT: (data, True)}
        else:
            payload = payload_from_body(message.body)
            json_form = json_publish(message.topic, payload)
            encodings = {JSON_FORMAT: (json_form, False), JSON_TEXT_FORMAT: (json_form, False)}
        session.publish(message.topic, payload, encodings=encodings)

    def subscribeReceived(self, message: Subscribe, binary_format: bool) -> None:
        session = self.session
        assert session is not None
        self._check_topic(message.topic)
        self._follow_format(binary_format)
        session.subscribe(message.topic)
        if self.announces_own and self.server.announce_topics and (
            message.topic not in self.announced and session.may_publish(message.topic)
        ):
            self.announced.add(message.topic)
            self.announce(Subscribe, message.topic)
        self.server._hook(
            "on_subscribe", message.topic, incoming_body(message.body, binary_format), self
        )

    def unsubscribeReceived(self, message: Unsubscribe, binary_format: bool) -> None:
        session = self.session
        assert session is not None
        if session.unsubscribe(message.topic):
            if message.topic in self.announced:
                self.announced.discard(message.topic)
                self.announce(Unsubscribe, message.topic)
            self.server._hook(
                "on_unsubscribe", message.topic, incoming_body(message.body, binary_format), self
            )

    def _unhandled(self, message: Request, binary_format: bool) -> None:
        """A request no handler here takes: another broker process may serve its name."""
        session = self.session
        assert session is not None
        call = Call("ubre", message.name, calls.to_call(message.body, NO_BODY), session.caller(),
                    binary=binary_format)
        self._answering += 1
        d = self.server.hub.federation.call(call)
        d.addCallbacks(self._remote_answered, self._remote_failed,
                       callbackArgs=(message, binary_format),
                       errbackArgs=(message, binary_format))
        d.addBoth(self._answered)

    def _remote_answered(self, answer: Answer, message: Request, binary_format: bool) -> None:
        self._reply(Success if answer.succeeded else Fail, message.id,
                    calls.from_call(answer.body, NO_BODY), binary_format)

    def _remote_failed(self, failure: Failure, message: Request, binary_format: bool) -> None:
        self._reply(Fail, message.id, unanswered_body(failure.value), binary_format)

    def _follow_format(self, binary_format: bool) -> None:
        if binary_format == self.binary_format:
            return
        self.binary_format = binary_format
        wire_format = self.wire_format = BINARY_FORMAT if binary_format else JSON_FORMAT
        session = self.session
        assert session is not None
        session.set_wire_format(wire_format, HUB_ENCODERS[wire_format])

    # -- what the server sends this one client ---------------------------------------------------

    def publish(self, topic: str, body: Any = NO_BODY) -> bool:
        """Send a publish to this client alone, if it subscribes to `topic` (as ubre.js's
        `ubre(target).publish`); False if it does not. Good for a topic's current value in an
        `on_subscribe` hook."""
        session = self.session
        if session is None or not session.subscribed(topic):
            return False
        payload = payload_from_body(body)
        message = HubMessage(topic, payload, protocol="ubre")
        encoded = HUB_ENCODERS[self.wire_format](message)
        if encoded is None:
            return False
        session.send(*encoded)
        return True

    def announce(self, kind: type, topic: str) -> None:
        """Tell this client the server now wants (Subscribe) or no longer wants (Unsubscribe)
        `topic`, so a ubre.js client publishes on it."""
        try:
            self._write(ubre.encode(kind(topic), binary=self.binary_format), self.binary_format)
        except ProtocolError:
            pass  # a hub topic this format cannot name (longer than 65535 bytes)

    def announced_name(self, topic: str) -> str | None:
        """The name under which this client is told when the hub's `topic` gains its first
        subscriber or loses its last one (None: it is not): a topic it may publish on, unless
        it is told of its own topics only, and, for a mounted client, one under its mount."""
        session = self.session
        assert session is not None
        if self.announces_own:
            return None
        own = session.own_topic(topic)
        return own if own is not None and session.may_publish(own) else None

    def _announce_own_topics_again(self) -> None:
        """With announce "own", after the rules changed: announce each topic this client
        subscribes to and now may publish on, and withdraw those it no longer does or may."""
        session = self.session
        assert session is not None
        wanted = {topic for topic in session.own_topics() if session.may_publish(topic)}
        for topic in self.announced - wanted:
            self.announce(Unsubscribe, topic)
        for topic in wanted - self.announced:
            self.announce(Subscribe, topic)
        self.announced = wanted

    def grants_changed(self, previous: Grants | None, topics: list[str]) -> None:
        """After a new policy: announce the hub's `topics` this client may now publish on and
        could not before (under `previous`), and withdraw those it no longer may."""
        if self.announces_own:
            self._announce_own_topics_again()
            return
        session = self.session
        assert session is not None
        current = session.grants
        if current is None or previous is None:
            if current is previous:
                return
        elif current.same_as(previous, Action.PUBLISH):
            return
        for topic in topics:
            own = session.own_topic(topic)
            if own is None:
                continue
            now = session.may_publish(own)
            if now != publish_allowed(previous, topic):
                self.announce(Subscribe if now else Unsubscribe, own)

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        self.server.peers.pop(self, None)
        if self.session is not None:
            self.session.close(reason)
            self.server._hook("on_disconnect", self, reason)


class UbreServer(HandlerRegistry):
    """The UBRE server role on a hub: request handlers, hooks, and a factory of connections.

    Handlers are called as ``handler(body, peer)`` and may return a value, a Deferred, or be
    coroutine functions. Hooks are plain attributes, in ubre.js's manner::

        server.on_subscribe = lambda topic, body, peer: ...
    """

    def __init__(
        self,
        hub: Hub,
        *,
        announce_topics: bool = True,
        max_topic_length: int = DEFAULT_MAX_TOPIC_LENGTH,
        max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS,
        request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
        debug: bool = False,
        reactor: Any = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor
        self.hub = hub
        self.reactor = reactor
        self.announce_topics = announce_topics
        self.max_topic_length = max_topic_length
        self.max_pending_requests = max_pending_requests
        self.request_timeout = request_timeout
        self.debug = debug
        self.handlers: dict[str, Handler] = _Handlers(hub.calls_changed)
        self._default_handler: Handler | None = None
        self.peers: dict[UbreServerProtocol, None] = {}
        hub.add_topic_observer(self)
        hub.add_call_server("ubre", self)

    @property
    def default_handler(self) -> Handler | None:
        """The handler of requests that name none (the spec's form, and every binary one)."""
        return self._default_handler

    @default_handler.setter
    def default_handler(self, handler: Handler | None) -> None:
        self._default_handler = handler
        self.hub.calls_changed()

    # -- hooks: replace them ---------------------------------------------------------------------

    def on_connect(self, peer: UbreServerProtocol) -> None:
        """A client connected."""

    def on_disconnect(self, peer: UbreServerProtocol, reason: Failure) -> None:
        """A client's connection closed."""

    def on_subscribe(self, topic: str, body: Any, peer: UbreServerProtocol) -> None:
        """A client subscribed to `topic`, with the subscribe's body (None, or b"" in binary,
        when it has none)."""

    def on_unsubscribe(self, topic: str, body: Any, peer: UbreServerProtocol) -> None:
        """A client unsubscribed from `topic`."""

    def on_topic_start(self, topic: str) -> None:
        """`topic` gained its first subscriber on the hub, from any protocol."""

    def on_topic_end(self, topic: str) -> None:
        """`topic` lost its last subscriber on the hub."""

    def _hook(self, name: str, *args: Any) -> None:
        try:
            getattr(self, name)(*args)
        except Exception:
            log.failure("ubre: the {hook} hook raised", event="hook_failed", protocol="ubre",
                        hook=name)

    # -- publishing ------------------------------------------------------------------------------

    def publish(self, topic: str, body: Any = NO_BODY) -> int:
        """Publish from the host to every subscriber of `topic`, on every protocol. Bytes go as
        they are, anything else as JSON text. Returns how many got it."""
        return self.hub.publish(HubMessage(topic, payload_from_body(body), protocol="ubre"))

    # -- the hub's topic observer ----------------------------------------------------------------

    def topic_started(self, topic: str) -> None:
        self._hook("on_topic_start", topic)
        if self.announce_topics:
            for peer in tuple(self.peers):
                own = peer.announced_name(topic)
                if own is not None:
                    peer.announce(Subscribe, own)

    def topic_ended(self, topic: str) -> None:
        self._hook("on_topic_end", topic)
        if self.announce_topics:
            for peer in tuple(self.peers):
                own = peer.announced_name(topic)
                if own is not None:
                    peer.announce(Unsubscribe, own)

    def grants_changed(self, previous: dict[Session, Grants | None]) -> None:
        """The rules changed: each client is told of the topics it may now publish on, and
        no longer of those it may not."""
        if not self.announce_topics:
            return
        topics = self.hub.topics()
        for peer in tuple(self.peers):
            if peer.session in previous:
                peer.grants_changed(previous[peer.session], topics)

    # -- calls made outside any connection (the admin API) ---------------------------------------

    def call(self, name: str, body: Any, caller: RemoteCaller) -> defer.Deferred[Answer]:
        """Make the request `name` with `body` as `caller` (the admin page), answered by a
        handler here or on another broker process; its Answer's body is a Fail's when not."""
        if name in self.handlers or self._default_handler is not None:
            return self.answer(Call("ubre", name if name in self.handlers else None, body,
                                    caller))
        d = self.hub.federation.call(Call("ubre", name, body, caller))

        def unanswered(failure: Failure) -> Answer:
            return Answer(False, unanswered_body(failure.value))

        return d.addErrback(unanswered)

    def callable_names(self) -> list[str]:
        """The request names answered here or by another process (a default handler, which
        answers any, has none to list)."""
        names = set(self.handlers)
        names.update(name for name in self.hub.federation.served_elsewhere("ubre").names
                     if isinstance(name, str))
        return sorted(names)

    # -- calls from other broker processes -------------------------------------------------------

    def served_calls(self) -> list[CallName]:
        names: list[CallName] = list(self.handlers)
        if self._default_handler is not None:
            names.append(None)
        return names

    def answer(self, call: Call) -> defer.Deferred[Answer]:
        """Answer a request made elsewhere: its handler gets the call's `RemoteCaller`."""
        binary_format = call.binary
        body = incoming_body(calls.from_call(call.body, NO_BODY), binary_format)
        name = call.name
        handler = self.handlers.get(name) if name is not None else self._default_handler
        if handler is None:  # removed since this process said it serves the name
            return defer.succeed(Answer(False, NOT_FOUND))
        answered: defer.Deferred[Answer] = defer.Deferred()

        def succeeded(value: Any) -> None:
            try:
                answer = Answer.sendable(
                    True, calls.to_call(outgoing_body(value, binary_format), NO_BODY))
            except (ProtocolError, TypeError, ValueError) as error:
                failed(Failure(error))
                return
            answered.callback(answer)

        def failed(failure: Failure) -> None:
            error = failure.value
            if isinstance(error, RequestFailed):
                body = error.body
            else:
                log.failure("ubre: handler for request {what!r} raised", failure,
                            event="handler_failed", protocol="ubre",
                            what=name if name is not None else "(default)")
                body = error_body(error, debug=self.debug)
            answered.callback(Answer(False, calls.to_call(outgoing_body(body, binary_format),
                                                          NO_BODY)))

        run_handler(handler, (body, call.caller), succeeded, failed, self.observe_request)
        return answered

    # -- connections -----------------------------------------------------------------------------

    def __call__(self, announce: str = ANNOUNCE_SUBSCRIBED,
                 mount: str | None = None) -> UbreServerProtocol:
        """A new connection's protocol: the server is the factory the transports take.
        `announce` is the listener's: which topics the connection is told of; `mount`, where
        its topics are on the hub."""
        return UbreServerProtocol(self, announce, mount)

    def close(self) -> None:
        """Stop following the hub's topics (connections are closed by their listeners)."""
        self.hub.remove_topic_observer(self)
        self.hub.remove_call_server("ubre", self)


class _Handlers(dict):
    """Handlers by name, telling the hub when they change, so the cluster serves their names."""

    def __init__(self, changed: Callable[[], object]) -> None:
        super().__init__()
        self._changed = changed

    def __setitem__(self, name: str, handler: Handler) -> None:
        super().__setitem__(name, handler)
        self._changed()

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self._changed()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._changed()

    def pop(self, *args: Any) -> Any:
        result = super().pop(*args)
        self._changed()
        return result

    def clear(self) -> None:
        super().clear()
        self._changed()


def server_factory(hub: Hub, **options: Any) -> UbreServer:
    """The UBRE server for `hub`; it is also the zero-argument protocol factory the transport
    adapters take. `options` are UbreServer's."""
    return UbreServer(hub, **options)


def serve(hub: Hub, settings: UbreSettings) -> UbreServer:
    """The broker's UBRE server, as its [ubre] table says."""
    return UbreServer(hub, **asdict(settings))
