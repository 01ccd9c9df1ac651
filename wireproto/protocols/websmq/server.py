"""WEBSMQ over any message transport: the broker (server role).

Implements WEBSMQ as docs/websmq.md describes it ("What we decided"):

- a publish goes to every other subscriber of its topic, never back to its sender;
- a client's last will is published, with the LastWill (11) header, whenever it disconnects,
  cleanly or not;
- the broker sends only Publish and LastWill frames, never Subscribe or Unsubscribe;
- topics are validated, and a malformed frame closes only the connection that sent it, with a
  reason the peer can read.

WEBSMQ topics are hub topics as they are, so `sensors/temp` here is `sensors/temp` for every other
protocol on the hub. MQTT-style wildcard subscriptions (`+`, a last `#`) are an opt-in extension:
see docs/websmq.md."""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from twisted.python.failure import Failure

from wireproto.codecs import websmq
from wireproto.codecs.websmq import LastWill, Publish, Subscribe, Unsubscribe
from wireproto.errors import BadEncoding, Forbidden, InvalidTopic, NotThisProtocol, ProtocolError
from wireproto.hub import Hub, HubMessage, Session, log_protocol_error
from wireproto.protocols.websmq.patterns import pattern_subscription
from wireproto.topics import is_pattern
from wireproto.transports.base import IMessageTransport, MessageProtocol

__all__ = [
    "serve",
    "WebsmqSettings",
    "WIRE_FORMAT",
    "encode_for_websmq",
    "WebsmqServerProtocol",
    "server_factory",
]

WIRE_FORMAT = "websmq"

@dataclass(frozen=True)
class WebsmqSettings:
    """The [websmq] table: how the broker serves WEBSMQ."""

    # MQTT-style `+` and `#` subscriptions: an extension to the spec, so off unless asked for.
    wildcards: bool = False


def encode_for_websmq(message: HubMessage) -> tuple[bytes, bool] | None:
    """A hub message as a WEBSMQ frame, or None if its topic cannot be a WEBSMQ topic."""
    try:
        if message.will:
            return websmq.encode(LastWill(message.topic, message.payload)), True
        return websmq.encode_publish(message.topic, message.payload), True
    except ProtocolError:
        return None


# Topics decode has accepted, by their raw bytes, so a Publish on a known topic skips decoding.
# Bounded in count and, by keeping only short topics, in bytes (at most 4096 x 2 x 256): a peer
# sending endless new topics only empties it now and then.
_known_topics: dict[bytes, str] = {}
_KNOWN_TOPICS_LIMIT = 4096
_KNOWN_TOPIC_BYTES = 256


def _remember_topic(frame: bytes, topic: str) -> None:
    raw = frame[websmq.HEADER_SIZE : websmq.HEADER_SIZE + (frame[0] << 8 | frame[1])]
    if len(raw) > _KNOWN_TOPIC_BYTES:
        return
    if len(_known_topics) >= _KNOWN_TOPICS_LIMIT:
        _known_topics.clear()
    _known_topics[raw] = topic


class WebsmqServerProtocol(MessageProtocol):
    """The broker's side of one WEBSMQ connection."""

    transport: IMessageTransport  # given before any other call (makeConnection)
    # None until connectionMade, so for a connection lost before it was made
    session: Session | None = None

    def __init__(self, hub: Hub, *, wildcards: bool = False, mount: str | None = None) -> None:
        self.hub = hub
        self.wildcards = wildcards
        # Where this connection's topics are on the hub (None: as they are): wireproto.hub.mount.
        self.mount = mount
        self._failed = False

    def connectionMade(self) -> None:
        self.session = self.hub.attach(
            self.transport, protocol="websmq", wire_format=WIRE_FORMAT, encode=encode_for_websmq,
            mount=self.mount,
        )

    def messageReceived(self, data: bytes, binary: bool) -> None:
        session = self.session
        if session is None:  # not connected
            return
        # The common case first: a Publish on a topic this broker has already validated.
        if binary and len(data) >= 2 and data[0] < 0x40 and not self._failed:
            end = 2 + (data[0] << 8 | data[1])
            topic = _known_topics.get(data[2:end])
            if topic is not None and end <= len(data):
                try:
                    session.publish(topic, data[end:], (data, True))
                except ProtocolError as error:
                    self._answer_error(error)
                return
        if self._failed:
            return
        if not binary:
            self._refuse(NotThisProtocol(
                "websmq", BadEncoding("WEBSMQ frames are binary: a text frame is not WEBSMQ")))
            return
        try:
            message = websmq.decode(data)
        except InvalidTopic as error:
            wildcard = pattern_subscription(data) if self.wildcards else None
            if wildcard is None:
                self._refuse(error)
                return
            self._wildcard(session, *wildcard)
            return
        except ProtocolError as error:
            self._refuse(NotThisProtocol("websmq", error))
            return
        kind = type(message)
        try:
            if kind is Publish:
                _remember_topic(data, message.topic)
                session.publish(message.topic, message.payload, encoded=(data, True))
            elif self.wildcards and kind is not LastWill and is_pattern(message.topic):
                self._wildcard(session, kind, message.topic)
            elif kind is Subscribe:
                session.subscribe(message.topic)
            elif kind is Unsubscribe:
                session.unsubscribe(message.topic)
            else:
                session.set_will(message.topic, message.payload)
        except ProtocolError as error:
            self._answer_error(error)

    def _wildcard(self, session: Session, kind: type, pattern: str) -> None:
        try:
            if kind is Subscribe:
                session.subscribe_pattern(pattern)
            else:
                session.unsubscribe_pattern(pattern)
        except ProtocolError as error:
            self._answer_error(error)

    def _answer_error(self, error: ProtocolError) -> None:
        """WEBSMQ has no error message: a forbidden publish, subscribe or will is not done (the
        hub counted it, and closes the connection of a repeat offender); anything else
        closes the connection."""
        if not isinstance(error, Forbidden):
            self._refuse(error)

    def _refuse(self, error: ProtocolError) -> None:
        """Close this one connection, telling the peer why; the rest of the broker carries on."""
        self._failed = True
        logged = error.error if isinstance(error, NotThisProtocol) else error
        log_protocol_error("websmq", self.transport, logged, self.session)
        self.transport.loseConnection(error)

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        if self.session is not None:
            self.session.close(reason)


def server_factory(hub: Hub, *, wildcards: bool = False) -> Callable[..., WebsmqServerProtocol]:
    """The protocol factory the transport adapters take: called with no argument, or with a
    connection's `mount`."""
    return lambda mount=None: WebsmqServerProtocol(hub, wildcards=wildcards, mount=mount)


def serve(hub: Hub, settings: WebsmqSettings) -> Callable[..., WebsmqServerProtocol]:
    """The broker's factory for WEBSMQ connections, as its [websmq] table says."""
    return server_factory(hub, wildcards=settings.wildcards)
