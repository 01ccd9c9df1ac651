"""WEBSMQ over any message transport: the broker (server role) and the client role.

Implements shared/specs/websmq.md as settled by NOTES.md, section "WEBSMQ":

- a publish goes to every other subscriber of its topic, never back to its sender;
- a client's last will is published, with the LastWill (11) header, whenever it disconnects,
  cleanly or not;
- the broker sends only Publish and LastWill frames, never Subscribe or Unsubscribe;
- topics are validated, and a malformed frame closes only the connection that sent it, with a
  reason the peer can read.

WEBSMQ topics are hub topics as they are, so `sensors/temp` here is `sensors/temp` for every other
protocol on the hub. MQTT-style wildcard subscriptions (`+`, a last `#`) are an opt-in extension:
see docs/websmq.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.codecs import websmq
from wireproto.codecs.websmq import LastWill, Publish, Subscribe, Unsubscribe
from wireproto.errors import BadEncoding, InvalidTopic, ProtocolError, UnexpectedMessage
from wireproto.hub import Hub, HubMessage, Session, log_protocol_error
from wireproto.topics import is_pattern, pattern_matches, validate_pattern
from wireproto.transports.base import MessageProtocol
from wireproto.transports.connect import connect as connect_messages

__all__ = [
    "WIRE_FORMAT",
    "WebsmqServerProtocol",
    "WebsmqClientProtocol",
    "server_factory",
    "connect",
]

log = Logger()

WIRE_FORMAT = "websmq"

Callback = Callable[[Publish | LastWill], object]


def encode_for_websmq(message: HubMessage) -> tuple[bytes, bool] | None:
    """A hub message as a WEBSMQ frame, or None if its topic cannot be a WEBSMQ topic."""
    try:
        if message.will:
            return websmq.encode(LastWill(message.topic, message.payload)), True
        return websmq.encode_publish(message.topic, message.payload), True
    except ProtocolError:
        return None


def validate_websmq_pattern(pattern: str) -> None:
    """A wildcard pattern whose wildcards are whole levels and whose other levels are valid
    WEBSMQ topic text."""
    validate_pattern(pattern)
    websmq.validate_topic(pattern.replace("#", "x").replace("+", "x"))


def _wildcard_topic(data: bytes) -> tuple[type, str] | None:
    """A Subscribe or Unsubscribe frame whose topic is a valid pattern, else None."""
    try:
        message_type, length = websmq.decode_header(data)
        if message_type not in (websmq.MessageType.SUBSCRIBE, websmq.MessageType.UNSUBSCRIBE):
            return None
        pattern = data[websmq.HEADER_SIZE : websmq.HEADER_SIZE + length].decode("ascii")
        if len(pattern) != length or not is_pattern(pattern):
            return None
        validate_websmq_pattern(pattern)
    except (ProtocolError, UnicodeDecodeError):
        return None
    kind = Subscribe if message_type == websmq.MessageType.SUBSCRIBE else Unsubscribe
    return kind, pattern


# Topics decode has accepted, by their raw bytes, so a Publish on a known topic skips decoding.
# Bounded: a peer sending endless new topics only empties it now and then.
_known_topics: dict[bytes, str] = {}
_KNOWN_TOPICS_LIMIT = 4096


def _remember_topic(frame: bytes, topic: str) -> None:
    if len(_known_topics) >= _KNOWN_TOPICS_LIMIT:
        _known_topics.clear()
    _known_topics[frame[websmq.HEADER_SIZE : websmq.HEADER_SIZE + len(topic)]] = topic


class WebsmqServerProtocol(MessageProtocol):
    """The broker's side of one WEBSMQ connection."""

    session: Session | None = None

    def __init__(self, hub: Hub, *, wildcards: bool = False) -> None:
        self.hub = hub
        self.wildcards = wildcards
        self._failed = False

    def connectionMade(self) -> None:
        self.session = self.hub.attach(
            self.transport, protocol="websmq", wire_format=WIRE_FORMAT, encode=encode_for_websmq
        )

    def messageReceived(self, data: bytes, binary: bool) -> None:
        # The common case first: a Publish on a topic this broker has already validated.
        if binary and len(data) >= 2 and data[0] < 0x40 and not self._failed:
            end = 2 + (data[0] << 8 | data[1])
            topic = _known_topics.get(data[2:end])
            if topic is not None and end <= len(data):
                self.session.publish(topic, data[end:], (data, True))
                return
        if self._failed:
            return
        if not binary:
            self._refuse(BadEncoding("WEBSMQ frames are binary: a text frame is not WEBSMQ"))
            return
        try:
            message = websmq.decode(data)
        except InvalidTopic as error:
            wildcard = _wildcard_topic(data) if self.wildcards else None
            if wildcard is None:
                self._refuse(error)
                return
            self._wildcard(*wildcard)
            return
        except ProtocolError as error:
            self._refuse(error)
            return
        session = self.session
        kind = type(message)
        try:
            if kind is Publish:
                _remember_topic(data, message.topic)
                session.publish(message.topic, message.payload, encoded=(data, True))
            elif self.wildcards and kind is not LastWill and is_pattern(message.topic):
                self._wildcard(kind, message.topic)
            elif kind is Subscribe:
                session.subscribe(message.topic)
            elif kind is Unsubscribe:
                session.unsubscribe(message.topic)
            else:
                session.set_will(message.topic, message.payload)
        except ProtocolError as error:
            self._refuse(error)

    def _wildcard(self, kind: type, pattern: str) -> None:
        try:
            if kind is Subscribe:
                self.session.subscribe_pattern(pattern)
            else:
                self.session.unsubscribe_pattern(pattern)
        except ProtocolError as error:
            self._refuse(error)

    def _refuse(self, error: ProtocolError) -> None:
        """Close this one connection, telling the peer why; the rest of the broker carries on."""
        self._failed = True
        log_protocol_error("websmq", self.transport, error, self.session)
        self.transport.loseConnection(error)

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        if self.session is not None:
            self.session.close(reason)


def server_factory(hub: Hub, *, wildcards: bool = False) -> Callable[[], WebsmqServerProtocol]:
    """The zero-argument protocol factory the transport adapters take."""
    return lambda: WebsmqServerProtocol(hub, wildcards=wildcards)


class WebsmqClientProtocol(MessageProtocol):
    """A WEBSMQ client. WEBSMQ has no acknowledgements, so the Deferreds that `subscribe`,
    `publish` and the rest return fire once the frame is handed to the transport; `disconnect`'s
    fires when the connection is closed."""

    def __init__(self, *, wildcards: bool = False) -> None:
        self.wildcards = wildcards
        self.on_message: Callback | None = None
        self._callbacks: dict[str, list[Callback]] = {}
        self._close_waiters: list[defer.Deferred] = []
        self.close_reason: Failure | None = None

    # -- API ------------------------------------------------------------------------------------

    def subscribe(self, topic: str, callback: Callback | None = None) -> defer.Deferred:
        """Receive what is published on `topic` (a pattern, with wildcards on): each message goes
        to `callback`, or to `on_message` if none is given."""
        self._check_topic(topic)
        callbacks = self._callbacks.get(topic)
        if callbacks is None:
            callbacks = self._callbacks[topic] = []
            self._send_subscription(websmq.MessageType.SUBSCRIBE, topic)
        if callback is not None:
            callbacks.append(callback)
        return defer.succeed(None)

    def unsubscribe(self, topic: str) -> defer.Deferred:
        self._check_topic(topic)
        if self._callbacks.pop(topic, None) is not None:
            self._send_subscription(websmq.MessageType.UNSUBSCRIBE, topic)
        return defer.succeed(None)

    def publish(self, topic: str, payload: bytes) -> defer.Deferred:
        self._send(Publish(topic, payload))
        return defer.succeed(None)

    def set_will(self, topic: str, payload: bytes) -> defer.Deferred:
        """Have the broker publish `payload` on `topic` when this client disconnects."""
        self._send(LastWill(topic, payload))
        return defer.succeed(None)

    def disconnect(self) -> defer.Deferred:
        """Close the connection; fires with the reason (an exception) when it is closed."""
        if self.connected:
            self.transport.loseConnection()
        return self.when_closed()

    def when_closed(self) -> defer.Deferred:
        """Fires, never fails, once the connection is gone, with why: `ConnectionDone` for a
        clean close, another exception otherwise."""
        if self.close_reason is not None:
            return defer.succeed(self.close_reason.value)
        d = defer.Deferred()
        self._close_waiters.append(d)
        return d

    # -- plumbing -------------------------------------------------------------------------------

    def _check_topic(self, topic: str) -> None:
        if self.wildcards and isinstance(topic, str) and is_pattern(topic):
            validate_websmq_pattern(topic)
        else:
            websmq.validate_topic(topic)

    def _send_subscription(self, message_type: websmq.MessageType, topic: str) -> None:
        """A Subscribe or Unsubscribe frame for a checked topic (encode would refuse a '#')."""
        self._send_frame(websmq.encode_header(message_type, len(topic)) + topic.encode("ascii"))

    def _send(self, message: Publish | LastWill) -> None:
        self._send_frame(websmq.encode(message))

    def _send_frame(self, frame: bytes) -> None:
        if not self.connected:
            raise ConnectionError("WEBSMQ client is not connected")
        self.transport.sendMessage(frame, True)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        try:
            if not binary:
                raise BadEncoding("WEBSMQ frames are binary: the broker sent a text frame")
            message = websmq.decode(data)
            if isinstance(message, Subscribe | Unsubscribe):
                raise UnexpectedMessage(
                    f"a WEBSMQ broker never sends {type(message).__name__} frames"
                )
        except ProtocolError as error:
            log.warn("websmq client: closing: {error}", error=error)
            self.transport.loseConnection(error)
            return
        callbacks = list(self._callbacks.get(message.topic, ()))
        if self.wildcards:
            for topic, more in self._callbacks.items():
                if is_pattern(topic) and pattern_matches(topic, message.topic):
                    callbacks.extend(more)
        if not callbacks and self.on_message is not None:
            callbacks.append(self.on_message)
        for callback in callbacks:
            self._call(callback, message)

    @staticmethod
    def _call(callback: Callback, message: Publish | LastWill) -> None:
        try:
            callback(message)
        except Exception:
            log.failure("websmq client: callback for {topic!r} raised", topic=message.topic)

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        self.close_reason = reason
        waiters, self._close_waiters = self._close_waiters, []
        for d in waiters:
            d.callback(reason.value)


def connect(
    reactor: IReactorTime,
    address: str,
    *,
    wildcards: bool = False,
    **options: Any,
) -> defer.Deferred[WebsmqClientProtocol]:
    """Connect a WEBSMQ client to `address`: a `ws://`/`wss://` URL or a client endpoint string
    (`tcp:host=...:port=...`, `unix:path=...`, `serial:/dev/ttyACM0`). The Deferred fires with
    the connected client. `options` go to `wireproto.transports.connect` (framing, WebSocket
    options, TLS)."""
    return connect_messages(
        reactor, address, lambda: WebsmqClientProtocol(wildcards=wildcards), **options
    )
