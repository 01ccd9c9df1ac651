"""UBRE over any message transport: the broker (server role), and what both roles share.

Implements shared/specs/ubre.md as settled by NOTES.md, section "UBRE". ubre.js, the reference,
is peer to peer; wireproto's server is a broker on the hub:

- a publish reaches every other subscriber of that exact topic, whatever protocol it came in on;
- requests are answered by handlers registered by name (ubre.js's `{"request": name, "id": id}`),
  or by one default handler for the spec's `{"request": id}` form and for binary requests;
- UBRE is symmetric, so the server can send requests to a client, and a client answers them with
  handlers of its own (see `wireproto.protocols.ubre_client`);
- like a ubre.js peer, the server tells each client which topics it wants, with a subscribe
  message per hub topic that has subscribers, because ubre.js publishes only on topics its peer
  has subscribed to.

JSON comes in WebSocket text frames or lines; the binary format in binary frames or a framing that
marks message ends (length32, cobs). Each reply goes in the format of its request. A connection
gets publishes in the format of its latest subscribe. docs/ubre.md says how bodies map to hub
payloads and back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.codecs import ubre
from wireproto.codecs._common import json_loads, json_utf8
from wireproto.codecs.ubre import NO_BODY, Fail, Publish, Request, Subscribe, Success, Unsubscribe
from wireproto.errors import FrameTooLarge, InvalidField, InvalidTopic, ProtocolError
from wireproto.hub import Hub, HubMessage, Session, log_protocol_error
from wireproto.payloads import json_from_payload, payload_from_value
from wireproto.rpc import (
    DEFAULT_REQUEST_TIMEOUT,
    ConnectionClosed,
    PendingRequests,
    RequestFailed,
    error_body,
    run_handler,
)
from wireproto.transports.base import MessageProtocol

__all__ = [
    "JSON_FORMAT",
    "JSON_TEXT_FORMAT",
    "BINARY_FORMAT",
    "DEFAULT_MAX_TOPIC_LENGTH",
    "DEFAULT_MAX_PENDING_REQUESTS",
    "NOT_FOUND",
    "TOO_MANY_REQUESTS",
    "Handler",
    "HandlerRegistry",
    "UbrePeer",
    "UbreServer",
    "UbreServerProtocol",
    "server_factory",
    "payload_from_body",
]

log = Logger()

# Hub wire formats. JSON_FORMAT sends a payload JSON cannot carry as a binary-format message;
# JSON_TEXT_FORMAT (the lines framing) cannot, and skips it.
JSON_FORMAT = "ubre-json"
JSON_TEXT_FORMAT = "ubre-json-text"
BINARY_FORMAT = "ubre-binary"

DEFAULT_MAX_TOPIC_LENGTH = 1024
DEFAULT_MAX_PENDING_REQUESTS = 1000
NOT_FOUND = "NotFound"  # ubre.js's fail body for a request no handler takes
TOO_MANY_REQUESTS = "TooManyRequests"

# handler(body, peer) -> reply body, a Deferred of one, or a coroutine; raise to fail.
Handler = Callable[[Any, Any], Any]


# -- bodies and hub payloads ----------------------------------------------------------------------


def payload_from_body(body: Any) -> bytes:
    """A UBRE body as a hub payload: no body as b"", otherwise as `payload_from_value` says."""
    return b"" if body is NO_BODY else payload_from_value(body)


def _json_value_of_payload(payload: bytes) -> Any:
    """Bytes for a JSON body, read as a hub payload is (see json_from_payload)."""
    body_text = json_from_payload(payload)
    if body_text is None:
        raise InvalidField(
            "bytes that are not UTF-8 cannot be a UBRE JSON body; send the binary format"
        )
    return json_loads(body_text, "body") if body_text else NO_BODY


def _json_publish(topic: str, body_text: bytes) -> bytes:
    head = b'{"publish":' + json_utf8(topic)
    return head + b',"body":' + body_text + b"}" if body_text else head + b"}"


def _encode_binary(message: HubMessage) -> tuple[bytes, bool] | None:
    try:
        return ubre.encode(Publish(message.topic, message.payload or NO_BODY), binary=True), True
    except ProtocolError:
        return None


def _encode_json_text(message: HubMessage) -> tuple[bytes, bool] | None:
    try:
        body_text = json_from_payload(message.payload)
        return None if body_text is None else (_json_publish(message.topic, body_text), False)
    except ProtocolError:
        return None


def _encode_json(message: HubMessage) -> tuple[bytes, bool] | None:
    return _encode_json_text(message) or _encode_binary(message)


_ENCODERS = {
    JSON_FORMAT: _encode_json,
    JSON_TEXT_FORMAT: _encode_json_text,
    BINARY_FORMAT: _encode_binary,
}


def _incoming_body(body: Any, binary_format: bool) -> Any:
    """What a handler or callback gets for a body: b"" or None when there is none."""
    if body is NO_BODY:
        return b"" if binary_format else None
    return body


def _outgoing_body(value: Any, binary_format: bool) -> Any:
    """A handler's result (or a request's body) as a message body for the format. None is no
    body; the binary format takes bytes, str as UTF-8, anything else as JSON text."""
    if value is None or value is NO_BODY:
        return NO_BODY
    if not binary_format:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return _json_value_of_payload(bytes(value))
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value) or NO_BODY
    if isinstance(value, str):
        return value.encode() or NO_BODY
    return json_utf8(value)


class HandlerRegistry:
    """Request handlers by name, and the default handler for requests that name none; what a
    UbreServer and a UbreClient both answer requests with."""

    handlers: dict[str, Handler]
    default_handler: Handler | None
    # observe(seconds, succeeded) per request answered by a handler; set by wireproto.metrics.
    observe_request: Callable[[float, bool], Any] | None = None

    def handle(
        self, name: str | Mapping[str, Handler], handler: Handler | None = None
    ) -> Any:
        """Answer requests named `name` with `handler`; or many at once from a mapping; or, with
        no handler, a decorator: ``@server.handle("add")``."""
        if isinstance(name, Mapping):
            self.handlers.update(name)
            return None
        if handler is None:
            def register(fn: Handler) -> Handler:
                self.handlers[name] = fn
                return fn

            return register
        self.handlers[name] = handler
        return handler


# -- what client and server share -----------------------------------------------------------------


class UbrePeer(MessageProtocol):
    """One UBRE connection, either role: decoding, answering requests through handlers, sending
    requests and matching their replies. Subclasses say what subscribe, unsubscribe and publish
    mean for them."""

    # True on a text-only transport (the lines framing), which carries JSON alone.
    text_only = False
    # Format of this connection's latest subscribe: its publishes go that way.
    binary_format = False
    _failed = False

    def __init__(self, owner: Any) -> None:
        """`owner` (a UbreServer or a UbreClient) holds the handlers and the settings."""
        self.owner = owner
        self.handlers = owner.handlers
        self.debug = owner.debug
        self.max_pending_requests = owner.max_pending_requests
        self.request_timeout = owner.request_timeout
        self.pending = PendingRequests(owner.reactor)

    @property
    def default_handler(self) -> Handler | None:
        return self.owner.default_handler

    def makeConnection(self, transport: Any) -> None:
        self._answering = 0
        self.text_only = transport.textOnly
        super().makeConnection(transport)

    # -- sending --------------------------------------------------------------------------------

    def _write(self, data: bytes, binary: bool) -> None:
        self.transport.sendMessage(data, binary)

    def _check_size(self, data: bytes) -> None:
        """Refuse what the peer would refuse: a message over this connection's size limit."""
        limit = self.transport.maxMessageSize
        if len(data) > limit:
            raise FrameTooLarge(
                f"UBRE message of {len(data)} bytes is over this connection's limit of {limit} "
                f"bytes (max_message_size)"
            )

    def request(
        self,
        name: str | None,
        body: Any = NO_BODY,
        *,
        timeout: float | None | object = ...,
        binary: bool | None = None,
    ) -> defer.Deferred:
        """Ask the peer: `name` picks its handler (ubre.js's form), None sends the spec's form
        (the id alone), the only one the binary format has. The Deferred fires with the success
        body, or fails with RequestFailed (carrying the fail body), RequestTimeout or
        ConnectionClosed. `timeout` is in seconds, None for none."""
        binary_format = self.binary_format if binary is None else binary
        if binary_format and name is not None:
            raise ValueError(
                "a binary-format UBRE request carries only an id, so it cannot name a handler; "
                "pass name=None, or binary=False"
            )
        if self.text_only and binary_format:
            raise ValueError("the lines framing carries UBRE JSON only")
        if not self.connected:
            return defer.fail(ConnectionClosed("the UBRE connection is closed"))
        if timeout is ...:
            timeout = self.request_timeout
        request_id = self.pending.next_id()
        try:
            data = ubre.encode(
                Request(request_id, _outgoing_body(body, binary_format), name=name),
                binary=binary_format,
            )
            self._check_size(data)
        except ProtocolError as error:
            return defer.fail(error)
        d = self.pending.add(request_id, timeout=timeout, what=name if name else request_id)
        self._write(data, binary_format)
        return d

    # -- receiving ------------------------------------------------------------------------------

    def messageReceived(self, data: bytes, binary: bool) -> None:
        if self._failed:
            return
        if not binary and not data.strip():
            return  # an empty line (someone pressing Enter in nc), or an empty text frame
        try:
            message = ubre.decode(data) if binary else ubre.decode_json(data)
            binary_format = not ubre.is_json(data)
            kind = type(message)
            if kind is Publish:
                self.publishReceived(message, data, binary_format)
            elif kind is Request:
                self._answer(message, binary_format)
            elif kind is Success:
                self.pending.resolve(message.id, _incoming_body(message.body, binary_format))
            elif kind is Fail:
                self.pending.reject(message.id, _incoming_body(message.body, binary_format))
            elif kind is Subscribe:
                self.subscribeReceived(message, binary_format)
            else:
                self.unsubscribeReceived(message, binary_format)
        except ProtocolError as error:
            self._refuse(error)

    def publishReceived(self, message: Publish, data: bytes, binary_format: bool) -> None:
        raise NotImplementedError

    def subscribeReceived(self, message: Subscribe, binary_format: bool) -> None:
        raise NotImplementedError

    def unsubscribeReceived(self, message: Unsubscribe, binary_format: bool) -> None:
        raise NotImplementedError

    def handlerArgument(self) -> Any:
        """What a handler gets as its second argument: the peer that asked."""
        return self

    def _answer(self, message: Request, binary_format: bool) -> None:
        if self._answering >= self.max_pending_requests:
            self._reply(Fail, message.id, TOO_MANY_REQUESTS, binary_format)
            return
        handler = (
            self.handlers.get(message.name) if message.name is not None else self.default_handler
        )
        if handler is None:
            self._reply(Fail, message.id, NOT_FOUND, binary_format)
            return
        working = run_handler(
            handler,
            (_incoming_body(message.body, binary_format), self.handlerArgument()),
            lambda value: self._reply(Success, message.id, value, binary_format),
            lambda failure: self._handler_failed(message, failure, binary_format),
            self.owner.observe_request,
        )
        if working is not None:
            self._answering += 1
            working.addBoth(self._answered)

    def _answered(self, result: Any) -> None:
        self._answering -= 1
        if isinstance(result, Failure):
            log.failure("ubre: sending a reply failed", result)

    def _handler_failed(self, message: Request, failure: Failure, binary_format: bool) -> None:
        error = failure.value
        if isinstance(error, RequestFailed):
            body = error.body
        else:
            log.failure(
                "ubre: handler for request {what!r} raised", failure,
                what=message.name if message.name is not None else message.id,
            )
            body = error_body(error, debug=self.debug)
        self._reply(Fail, message.id, body, binary_format)

    def _reply(self, kind: type, request_id: Any, result: Any, binary_format: bool) -> None:
        if not self.connected or self._failed:
            return  # the requester is gone; so is its reply
        try:
            data = ubre.encode(
                kind(request_id, _outgoing_body(result, binary_format)), binary=binary_format
            )
            self._check_size(data)
        except (ProtocolError, TypeError, ValueError) as error:
            log.warn("ubre: cannot send the reply to {id!r}: {error}", id=request_id, error=error)
            body = _outgoing_body(error_body(error, debug=self.debug), binary_format)
            data = ubre.encode(Fail(request_id, body), binary=binary_format)
        self._write(data, binary_format)

    def _refuse(self, error: ProtocolError) -> None:
        """Close this one connection, telling the peer why."""
        self._failed = True
        self._log_refusal(error)
        self.transport.loseConnection(error)

    def _log_refusal(self, error: ProtocolError) -> None:
        log.warn("ubre: closing {peer}: {error}", peer=self.transport.getPeer(), error=error)

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        self.pending.fail_all(
            ConnectionClosed(f"the UBRE connection closed: {reason.getErrorMessage()}")
        )


# -- the server role ------------------------------------------------------------------------------


class UbreServerProtocol(UbrePeer):
    """The broker's side of one UBRE connection; the `peer` that handlers and hooks get."""

    session: Session | None = None

    def __init__(self, server: UbreServer) -> None:
        super().__init__(server)
        self.server = server

    def connectionMade(self) -> None:
        wire_format = JSON_TEXT_FORMAT if self.text_only else JSON_FORMAT
        self.session = self.server.hub.attach(
            self.transport, protocol="ubre", wire_format=wire_format,
            encode=_ENCODERS[wire_format],
        )
        self.server.peers[self] = None
        if self.server.announce_topics:
            for topic in self.server.hub.topics():
                self.announce(Subscribe, topic)
        self.server._hook("on_connect", self)

    def _write(self, data: bytes, binary: bool) -> None:
        # Through the session's queue, in order with publishes, bounded like them.
        self.session.send(data, binary)

    def _log_refusal(self, error: ProtocolError) -> None:
        log_protocol_error("ubre", self.transport, error, self.session)

    # -- what a client asks of the broker --------------------------------------------------------

    def _check_topic(self, topic: str) -> None:
        limit = self.server.max_topic_length
        if len(topic) > limit:
            raise InvalidTopic(
                f"UBRE topic of {len(topic)} characters: this server takes at most {limit}"
            )

    def publishReceived(self, message: Publish, data: bytes, binary_format: bool) -> None:
        self._check_topic(message.topic)
        if binary_format:
            payload = message.body if message.body is not NO_BODY else b""
            encodings = {BINARY_FORMAT: (data, True)}
        else:
            payload = payload_from_body(message.body)
            json_form = _json_publish(message.topic, payload)
            encodings = {JSON_FORMAT: (json_form, False), JSON_TEXT_FORMAT: (json_form, False)}
        self.session.publish(message.topic, payload, encodings=encodings)

    def subscribeReceived(self, message: Subscribe, binary_format: bool) -> None:
        self._check_topic(message.topic)
        self._follow_format(binary_format)
        self.session.subscribe(message.topic)
        self.server._hook(
            "on_subscribe", message.topic, _incoming_body(message.body, binary_format), self
        )

    def unsubscribeReceived(self, message: Unsubscribe, binary_format: bool) -> None:
        if self.session.unsubscribe(message.topic):
            self.server._hook(
                "on_unsubscribe", message.topic, _incoming_body(message.body, binary_format), self
            )

    def _follow_format(self, binary_format: bool) -> None:
        if binary_format == self.binary_format:
            return
        self.binary_format = binary_format
        wire_format = BINARY_FORMAT if binary_format else JSON_FORMAT
        self.session.set_wire_format(wire_format, _ENCODERS[wire_format])

    # -- what the server sends this one client ---------------------------------------------------

    def publish(self, topic: str, body: Any = NO_BODY) -> bool:
        """Send a publish to this client alone, if it subscribes to `topic` (as ubre.js's
        `ubre(target).publish`); False if it does not. Good for a topic's current value in an
        `on_subscribe` hook."""
        if self.session is None or topic not in self.session.topics:
            return False
        payload = payload_from_body(body)
        message = HubMessage(topic, payload, protocol="ubre")
        encoded = _ENCODERS[self.session.wire_format](message)
        if encoded is None:
            return False
        self.session.send(*encoded)
        return True

    def announce(self, kind: type, topic: str) -> None:
        """Tell this client the server now wants (Subscribe) or no longer wants (Unsubscribe)
        `topic`, so a ubre.js client publishes on it."""
        try:
            self._write(ubre.encode(kind(topic), binary=self.binary_format), self.binary_format)
        except ProtocolError:
            pass  # a hub topic this format cannot name (longer than 65535 bytes)

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
        self.handlers: dict[str, Handler] = {}
        self.default_handler: Handler | None = None
        self.peers: dict[UbreServerProtocol, None] = {}
        hub.add_topic_observer(self)

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
            log.failure("ubre: the {hook} hook raised", hook=name)

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
                peer.announce(Subscribe, topic)

    def topic_ended(self, topic: str) -> None:
        self._hook("on_topic_end", topic)
        if self.announce_topics:
            for peer in tuple(self.peers):
                peer.announce(Unsubscribe, topic)

    # -- connections -----------------------------------------------------------------------------

    def __call__(self) -> UbreServerProtocol:
        """A new connection's protocol: the server is the factory the transports take."""
        return UbreServerProtocol(self)

    def close(self) -> None:
        """Stop following the hub's topics (connections are closed by their listeners)."""
        self.hub.remove_topic_observer(self)


def server_factory(hub: Hub, **options: Any) -> UbreServer:
    """The UBRE server for `hub`; it is also the zero-argument protocol factory the transport
    adapters take. `options` are UbreServer's."""
    return UbreServer(hub, **options)

