"""The WEBSMQ client role, over any message transport (see docs/websmq.md)."""


from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.codecs import websmq
from wireproto.codecs.websmq import LastWill, Publish, Subscribe, Unsubscribe
from wireproto.errors import BadEncoding, ProtocolError, UnexpectedMessage
from wireproto.protocols.websmq.patterns import validate_websmq_pattern
from wireproto.topics import is_pattern, pattern_matches
from wireproto.transports.base import IMessageTransport, MessageProtocol
from wireproto.transports.connect import connect as connect_messages

__all__ = [
    "Callback",
    "WebsmqClientProtocol",
    "connect",
]

log = Logger()

Callback = Callable[[Publish | LastWill], object]

class WebsmqClientProtocol(MessageProtocol):
    """A WEBSMQ client. WEBSMQ has no acknowledgements, so the Deferreds that `subscribe`,
    `publish` and the rest return fire once the frame is handed to the transport; `disconnect`'s
    fires when the connection is closed."""

    transport: IMessageTransport  # given on connecting, before any use

    def __init__(self, *, wildcards: bool = False) -> None:
        self.wildcards = wildcards
        self.on_message: Callback | None = None
        self._callbacks: dict[str, list[Callback]] = {}
        self._close_waiters: list[defer.Deferred[BaseException]] = []
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

    def disconnect(self) -> defer.Deferred[BaseException]:
        """Close the connection; fires with the reason (an exception) when it is closed."""
        if self.connected:
            self.transport.loseConnection()
        return self.when_closed()

    def when_closed(self) -> defer.Deferred[BaseException]:
        """Fires, never fails, once the connection is gone, with why: `ConnectionDone` for a
        clean close, another exception otherwise."""
        if self.close_reason is not None:
            return defer.succeed(self.close_reason.value)
        d: defer.Deferred[BaseException] = defer.Deferred()
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
            log.warn("websmq client: closing: {error}", event="client_protocol_error",
                     protocol="websmq", error=error)
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
            log.failure("websmq client: callback for {topic!r} raised", event="callback_failed",
                        protocol="websmq", topic=message.topic)

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
