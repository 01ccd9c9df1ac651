"""The hub: the one place where topics live, shared by every protocol and every connection.

A server protocol attaches each connection to the hub as a `Session`, giving it a way to encode
a `HubMessage` into its own wire format. Publishing fans a message out to every subscriber of
its topic except the sender, encoding once per wire format and framing once per kind of
transport (a WebSocket prepared message, a length-prefixed frame), however many subscribers
share them.

Topics are plain strings. A subscription matches a topic exactly, or, when a protocol opts in, by
an MQTT-style pattern over `/`-separated levels (see `wireproto.topics`): `+` matches one level,
and `#` as the last level matches its parent and everything below it.

Each session has a send queue bounded in bytes. While the socket underneath keeps up, messages go
straight to it. When it fills, Twisted pauses the session (it is registered as the transport's
producer) and messages wait in the queue. If the queue would pass its limit, the overflow policy
decides: `drop-oldest` discards the oldest queued messages, `disconnect` aborts the connection.
Both are counted.

A session may leave a will: a message published, marked as a will, when the session closes for any
reason.

The hub logs each connection's life as structured events (namespace ``wireproto.hub``, a stable
`event` field): ``connect``, ``disconnect`` (with the reason and the session's counts), ``will``
and ``protocol_error``. It keeps each protocol's counts after its sessions close
(`Hub.protocol_stats`), for wireproto.metrics.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

from wireproto import peerlog
from wireproto.codecs.serialization import unchecked_constructor
from wireproto.errors import LimitExceeded
from wireproto.peerlog import address_key, describe_address
from wireproto.topics import PatternTree, is_pattern, validate_pattern
from wireproto.transports.base import IMessageTransport

__all__ = [
    "DEFAULT_QUEUE_BYTES",
    "DEFAULT_MAX_SUBSCRIPTIONS",
    "Overflow",
    "HubMessage",
    "HubStats",
    "SessionStats",
    "Hub",
    "Session",
    "LocalSubscriber",
    "Subscriber",
    "FrameSubscriber",
    "TopicObserver",
    "describe_address",
    "transport_name",
    "log_protocol_error",
]

log = Logger(namespace="wireproto.hub")

DEFAULT_QUEUE_BYTES = 1 << 20
DEFAULT_MAX_SUBSCRIPTIONS = 1000
# What subscriptions may make the hub hold: the topic (or pattern) of one, in characters; their
# topics' UTF-8 bytes for one connection, and for all connections together.
DEFAULT_MAX_TOPIC_LENGTH = 1024
DEFAULT_MAX_SUBSCRIPTION_BYTES = 65_536
DEFAULT_MAX_TOTAL_SUBSCRIPTION_BYTES = 64 << 20


class Overflow(StrEnum):
    """What a session does when its send queue would pass its byte limit."""

    DROP_OLDEST = "drop-oldest"
    DISCONNECT = "disconnect"


@dataclass(frozen=True, slots=True, eq=False)
class HubMessage:
    """A message on its way through the hub.

    `sender` is the subscriber that published it (it never gets its own message back), and
    `protocol` names the spec it came in on. `will` marks a last will.
    """

    topic: str
    payload: bytes
    will: bool = False
    sender: Any = None
    protocol: str = ""


# Every field, in order, without the frozen dataclass __init__: the publish path builds one per
# message.
_new_message = unchecked_constructor(HubMessage)


@dataclass
class HubStats:
    published: int = 0
    delivered: int = 0
    wills_published: int = 0
    dropped_messages: int = 0
    dropped_bytes: int = 0
    overflow_disconnects: int = 0


@dataclass
class SessionStats:
    received: int = 0
    sent: int = 0
    sent_bytes: int = 0
    dropped_messages: int = 0
    dropped_bytes: int = 0
    overflow_disconnects: int = 0


def transport_name(transport: IMessageTransport) -> str:
    """The transport as a listener names it: ``ws``, ``engineio``, or a stream's framing."""
    return getattr(transport, "framing", "") or transport.kind


def log_protocol_error(
    protocol: str, transport: IMessageTransport, error: Exception,
    session: Session | None = None,
) -> None:
    """Log the event for a connection closed because its peer broke `protocol` (within the
    peers' log budget, wireproto.peerlog)."""
    peer = transport.getPeer()
    peerlog.warn(
        log, address_key(peer),
        "{protocol}: closing the connection from {peer} over {transport}: {error}",
        event="protocol_error", protocol=protocol, transport=transport_name(transport),
        peer=describe_address(peer), error=str(error),
        session=None if session is None else session.id,
        client=None if session is None else session.client,
    )


# encode(message) -> (data, binary), or None when the message cannot be said in this format.
Encoder = Callable[[HubMessage], "tuple[bytes, bool] | None"]


class TopicObserver(Protocol):
    """Told when an exact topic gains its first subscriber and loses its last one."""

    def topic_started(self, topic: str) -> None: ...

    def topic_ended(self, topic: str) -> None: ...


class Subscriber(Protocol):
    """What the hub delivers to: a connection's `Session`, or host code's `LocalSubscriber`.

    `deliver(message, cache)` is the general path; `cache` holds the encodings and prepared
    frames made so far for this publish, for other subscribers to share. A subscriber whose
    `writes_now` is true at that moment is a `FrameSubscriber` and takes the fast path instead.
    """

    writes_now: bool

    def deliver(self, message: HubMessage, cache: dict) -> None: ...


class FrameSubscriber(Subscriber, Protocol):
    """A subscriber that takes prepared frames (`Session`). While `writes_now` is true, the
    publish loop finds the frame for its `frame_key` in the cache (or has `frame_from_cache`
    frame the encoding there), counts it in `sent` and `sent_bytes`, and calls `write_frame`,
    without building a `HubMessage`."""

    frame_key: object
    sent: int
    sent_bytes: int

    def frame_from_cache(self, cache: dict) -> tuple[Any, int] | None: ...

    def write_frame(self, frame: Any) -> None: ...


class Hub:
    """Subscriptions, fan-out, wills and send-queue policy for every protocol."""

    def __init__(
        self,
        *,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
        overflow: Overflow | str = Overflow.DROP_OLDEST,
        max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
        max_topic_length: int = DEFAULT_MAX_TOPIC_LENGTH,
        max_subscription_bytes: int = DEFAULT_MAX_SUBSCRIPTION_BYTES,
        max_total_subscription_bytes: int = DEFAULT_MAX_TOTAL_SUBSCRIPTION_BYTES,
    ) -> None:
        if queue_bytes <= 0:
            raise ValueError("queue_bytes must be positive")
        self.queue_bytes = queue_bytes
        self.overflow = Overflow(overflow)
        self.max_subscriptions = max_subscriptions
        self.max_topic_length = max_topic_length
        self.max_subscription_bytes = max_subscription_bytes
        self.max_total_subscription_bytes = max_total_subscription_bytes
        # The UTF-8 bytes of every connection's subscribed topics and patterns.
        self.subscription_bytes = 0
        self.stats = HubStats()
        self.sessions: dict[Session, None] = {}
        # Connections ever attached, by (protocol, transport); counts of closed sessions, by
        # protocol: neither is lost when a connection goes.
        self.accepted: dict[tuple[str, str], int] = {}
        self.closed_stats: dict[str, SessionStats] = {}
        self._session_ids = itertools.count(1)
        self._exact: dict[str, dict[Subscriber, None]] = {}
        self._patterns = PatternTree()
        # (wire format, prepare key) -> a plain object, a cheaper fan-out cache key than the tuple
        self._prepared_keys: dict[tuple, object] = {}
        self._topic_observers: list[TopicObserver] = []

    def prepared_key(self, wire_format: Hashable, prepare_key: Hashable) -> object:
        """The fan-out cache key of frames in `wire_format` prepared for transports of
        `prepare_key`: one plain object per pair, cheaper to hash than the pair."""
        return self._prepared_keys.setdefault((wire_format, prepare_key), object())

    def new_session_id(self) -> int:
        return next(self._session_ids)

    # -- connections ----------------------------------------------------------------------------

    def attach(
        self,
        transport: IMessageTransport,
        *,
        protocol: str,
        wire_format: Hashable,
        encode: Encoder,
        client: str | None = None,
    ) -> Session:
        """Give a new connection its session. `wire_format` names what `encode` produces, so
        sessions that share it share one encoding per published message. `client` is the
        protocol's own name for the peer (a nydus id, a SubbleSocket client ID), for the log."""
        session = Session(
            self, transport, protocol=protocol, wire_format=wire_format, encode=encode
        )
        session.client = client
        self.sessions[session] = None
        key = (protocol, session.transport_name)
        self.accepted[key] = self.accepted.get(key, 0) + 1
        log.info(
            "{protocol} session {session} opened by {peer} over {transport}"
            + (" as client {client}" if client is not None else ""),
            event="connect", protocol=protocol, transport=session.transport_name,
            peer=session.peer, session=session.id, client=client,
        )
        return session

    def protocol_stats(self) -> dict[str, SessionStats]:
        """Each protocol's session counters, those of closed sessions included; `dropped_*` and
        `overflow_disconnects` add up to the hub's own."""
        totals = {protocol: replace(stats) for protocol, stats in self.closed_stats.items()}
        for session in self.sessions:
            stats = totals.get(session.protocol)
            if stats is None:
                stats = totals[session.protocol] = SessionStats()
            session.add_stats_to(stats)
        return totals

    # -- subscriptions --------------------------------------------------------------------------

    def subscribe(self, subscriber: Subscriber, topic: str) -> bool:
        """Subscribe to one exact topic. False if it was already subscribed."""
        subscribers = self._exact.get(topic)
        if subscribers is None:
            self._exact[topic] = {subscriber: None}
            if self._topic_observers:
                self._tell_observers("topic_started", topic)
            return True
        if subscriber in subscribers:
            return False
        subscribers[subscriber] = None
        return True

    def unsubscribe(self, subscriber: Subscriber, topic: str) -> bool:
        subscribers = self._exact.get(topic)
        if subscribers is None or subscriber not in subscribers:
            return False
        del subscribers[subscriber]
        if not subscribers:
            del self._exact[topic]
            if self._topic_observers:
                self._tell_observers("topic_ended", topic)
        return True

    def add_topic_observer(self, observer: TopicObserver) -> None:
        """Have `observer.topic_started(topic)` called when an exact topic gains its first
        subscriber, and `observer.topic_ended(topic)` when it loses its last one."""
        self._topic_observers.append(observer)

    def remove_topic_observer(self, observer: TopicObserver) -> None:
        self._topic_observers.remove(observer)

    def _tell_observers(self, event: str, topic: str) -> None:
        for observer in tuple(self._topic_observers):
            try:
                getattr(observer, event)(topic)
            except Exception:
                log.failure("hub topic observer {observer!r} raised", observer=observer)

    def subscribe_pattern(self, subscriber: Subscriber, pattern: str) -> None:
        validate_pattern(pattern)
        self._patterns.add(pattern, subscriber)

    def unsubscribe_pattern(self, subscriber: Subscriber, pattern: str) -> None:
        self._patterns.remove(pattern, subscriber)

    def subscribe_callback(
        self, topic: str, callback: Callable[[HubMessage], object]
    ) -> LocalSubscriber:
        """Host code's own subscription: `callback(message)` for each message on `topic`, or on
        every topic a pattern matches when `topic` contains `+` or a last `#`."""
        subscriber = LocalSubscriber(self, topic, callback)
        if is_pattern(topic):
            self.subscribe_pattern(subscriber, topic)
        else:
            self.subscribe(subscriber, topic)
        return subscriber

    def subscribers(self, topic: str) -> Iterable[Subscriber]:
        """Everyone a message on `topic` would reach, each once."""
        exact = self._exact.get(topic)
        if not self._patterns.count:
            return tuple(exact) if exact else ()
        found: dict[Subscriber, None] = dict(exact) if exact else {}
        self._patterns.match(topic, found)
        return tuple(found)

    def topics(self) -> list[str]:
        return list(self._exact)

    # -- publishing -----------------------------------------------------------------------------

    def publish(self, message: HubMessage, cache: dict | None = None) -> int:
        """Deliver `message` to every matching subscriber but its sender; return how many.

        `cache` may hold encodings the publisher already has, keyed by wire format, as
        `{wire_format: (data, binary)}`, so a frame can be forwarded as it came.
        """
        return self.fan_out(
            message.topic, message.payload, message.will, message.sender, message.protocol,
            {} if cache is None else cache, message,
        )

    def fan_out(
        self, topic: str, payload: bytes, will: bool, sender: Any, protocol: str, cache: dict,
        message: HubMessage | None,
    ) -> int:
        """The publish loop, for `publish` and for `Session.publish` (which has no HubMessage).
        `message` is built only if some subscriber needs it (to encode it in another format, or
        a host callback), so forwarding a frame as it came builds none."""
        stats = self.stats
        stats.published += 1
        if will:
            stats.wills_published += 1
        if self._patterns.count:
            targets: Iterable[Any] = self.subscribers(topic)  # FrameSubscribers when writes_now
        else:
            exact = self._exact.get(topic)
            if not exact:
                return 0
            targets = tuple(exact)
        delivered = 0
        for subscriber in targets:
            if subscriber is sender:
                continue
            delivered += 1
            # Session.deliver inlined for its common case, the broker's hottest loop: the frame
            # is already prepared and the session's transport takes writes now.
            if subscriber.writes_now:
                prepared = cache.get(subscriber.frame_key) or subscriber.frame_from_cache(cache)
                if prepared is not None:
                    subscriber.sent += 1
                    subscriber.sent_bytes += prepared[1]
                    subscriber.write_frame(prepared[0])
                    continue
            if message is None:
                message = _new_message(topic, payload, will, sender, protocol)
            subscriber.deliver(message, cache)
        stats.delivered += delivered
        return delivered

    def detach(self, session: Session) -> None:
        """Forget a closed session (Session.close calls this)."""
        self.sessions.pop(session, None)


class LocalSubscriber:
    """A subscription held by host code rather than by a connection."""

    writes_now = False  # host callbacks always go through deliver

    def __init__(self, hub: Hub, topic: str, callback: Callable[[HubMessage], object]) -> None:
        self.hub = hub
        self.topic = topic
        self.callback = callback

    def deliver(self, message: HubMessage, cache: dict) -> None:
        try:
            self.callback(message)
        except Exception:
            log.failure("hub subscriber for {topic!r} raised", topic=self.topic)

    def cancel(self) -> None:
        if is_pattern(self.topic):
            self.hub.unsubscribe_pattern(self, self.topic)
        else:
            self.hub.unsubscribe(self, self.topic)


@implementer(IPushProducer)
class Session:
    """One connection's place in the hub: its subscriptions, its will and its send queue.

    The session registers itself as its transport's streaming producer, so Twisted pauses it when
    the socket's buffer is full and resumes it when the buffer drains.
    """

    __slots__ = (
        "hub", "transport", "protocol", "wire_format", "_encode", "frame_key", "write_frame",
        "topics", "patterns", "subscription_bytes", "will", "queue_limit", "overflow", "_queue",
        "queued_bytes",
        "_paused", "writes_now", "closed", "received", "sent", "sent_bytes", "dropped_messages",
        "dropped_bytes", "overflow_disconnects", "id", "peer", "transport_name", "client",
        "opened", "__weakref__",
    )

    def __init__(
        self,
        hub: Hub,
        transport: IMessageTransport,
        *,
        protocol: str,
        wire_format: Hashable,
        encode: Encoder,
    ) -> None:
        self.hub = hub
        self.transport = transport
        self.protocol = protocol
        self.wire_format = wire_format
        self._encode = encode
        self.frame_key = hub.prepared_key(wire_format, transport.prepareKey)
        self.write_frame = transport.sendPrepared
        self.topics: set[str] = set()
        self.patterns: set[str] = set()
        # The UTF-8 bytes of this session's subscribed topics and patterns.
        self.subscription_bytes = 0
        self.will: HubMessage | None = None
        self.queue_limit = hub.queue_bytes
        self.overflow = hub.overflow
        self._queue: deque[tuple[Any, int]] = deque()
        self.queued_bytes = 0
        self._paused = False
        # True while nothing waits and the transport takes writes: deliver writes at once.
        self.writes_now = True
        self.closed = False
        self.received = self.sent = self.sent_bytes = 0
        self.dropped_messages = self.dropped_bytes = self.overflow_disconnects = 0
        self.id = hub.new_session_id()
        self.peer = describe_address(transport.getPeer())
        self.transport_name = transport_name(transport)
        self.client: str | None = None
        self.opened = time.monotonic()
        transport.registerProducer(self, True)

    def __repr__(self) -> str:
        return f"<Session {self.protocol} {self.transport.kind} {self.transport.getPeer()}>"

    @property
    def stats(self) -> SessionStats:
        """This session's counters, as of now."""
        return SessionStats(
            self.received, self.sent, self.sent_bytes, self.dropped_messages,
            self.dropped_bytes, self.overflow_disconnects,
        )

    @property
    def queued_messages(self) -> int:
        """Messages waiting in the send queue."""
        return len(self._queue)

    def add_stats_to(self, totals: SessionStats) -> None:
        totals.received += self.received
        totals.sent += self.sent
        totals.sent_bytes += self.sent_bytes
        totals.dropped_messages += self.dropped_messages
        totals.dropped_bytes += self.dropped_bytes
        totals.overflow_disconnects += self.overflow_disconnects

    # -- what the protocol asks of the hub ------------------------------------------------------

    def subscribe(self, topic: str) -> bool:
        """Subscribe to one exact topic. False if this session already was. LimitExceeded past
        the hub's limits on subscriptions (count, topic length, bytes)."""
        if topic in self.topics:
            return False
        self._hold(topic)
        self.topics.add(topic)
        return self.hub.subscribe(self, topic)

    def unsubscribe(self, topic: str) -> bool:
        if topic not in self.topics:
            return False
        self.topics.discard(topic)
        self._release(topic)
        return self.hub.unsubscribe(self, topic)

    def subscribe_pattern(self, pattern: str) -> bool:
        if pattern in self.patterns:
            return False
        validate_pattern(pattern)
        self._hold(pattern)
        self.hub.subscribe_pattern(self, pattern)
        self.patterns.add(pattern)
        return True

    def unsubscribe_pattern(self, pattern: str) -> bool:
        if pattern not in self.patterns:
            return False
        self.patterns.discard(pattern)
        self._release(pattern)
        self.hub.unsubscribe_pattern(self, pattern)
        return True

    def _check_topic_length(self, topic: str) -> None:
        if len(topic) > self.hub.max_topic_length:
            raise LimitExceeded(
                f"topic of {len(topic)} characters: this broker takes at most "
                f"{self.hub.max_topic_length} ([hub] max_topic_length)"
            )

    def _hold(self, topic: str) -> None:
        """Count one more subscription against the limits, or raise LimitExceeded."""
        hub = self.hub
        if len(self.topics) + len(self.patterns) >= hub.max_subscriptions:
            raise LimitExceeded(
                f"more than {hub.max_subscriptions} subscriptions on one connection"
            )
        self._check_topic_length(topic)
        size = len(topic.encode("utf-8", "surrogatepass"))
        if self.subscription_bytes + size > hub.max_subscription_bytes:
            raise LimitExceeded(
                f"subscriptions of more than {hub.max_subscription_bytes} topic bytes on one "
                "connection ([hub] max_subscription_bytes)"
            )
        if hub.subscription_bytes + size > hub.max_total_subscription_bytes:
            raise LimitExceeded(
                f"the broker holds {hub.max_total_subscription_bytes} bytes of subscribed "
                "topics in all ([hub] max_total_subscription_bytes)"
            )
        self.subscription_bytes += size
        hub.subscription_bytes += size

    def _release(self, topic: str) -> None:
        size = len(topic.encode("utf-8", "surrogatepass"))
        self.subscription_bytes -= size
        self.hub.subscription_bytes -= size

    def publish(
        self,
        topic: str,
        payload: bytes,
        encoded: tuple[bytes, bool] | None = None,
        *,
        encodings: dict[Hashable, tuple[bytes, bool]] | None = None,
    ) -> int:
        """Publish from this connection: everyone subscribed but this session gets it.
        `encoded` is the message already in this session's wire format, forwarded as it is;
        `encodings` holds it in several formats, as `{wire_format: (data, binary)}`."""
        self.received += 1
        if encodings is not None:
            cache = dict(encodings)
        else:
            cache = {} if encoded is None else {self.wire_format: encoded}
        return self.hub.fan_out(topic, payload, False, self, self.protocol, cache, None)

    def set_wire_format(self, wire_format: Hashable, encode: Encoder) -> None:
        """Receive publishes in another format from now on (a UBRE connection follows the format
        of its latest subscribe)."""
        self.wire_format = wire_format
        self._encode = encode
        self.frame_key = self.hub.prepared_key(wire_format, self.transport.prepareKey)

    def send(self, data: bytes, binary: bool) -> None:
        """Send one message of this connection's own (an announcement, not a publish) through
        the send queue, behind whatever already waits there."""
        if not self.closed:
            self._send_prepared((self.transport.prepareMessage(data, binary), len(data)))

    def set_will(self, topic: str, payload: bytes) -> None:
        self._check_topic_length(topic)
        self.will = HubMessage(topic, payload, will=True, protocol=self.protocol)

    def close(self, reason: Any = None) -> None:
        """Leave the hub: drop every subscription and the queue, then publish the will.
        `reason`, a Failure or text, says why in the log."""
        if self.closed:
            return
        self.closed = True
        hub = self.hub
        totals = hub.closed_stats.get(self.protocol)
        if totals is None:
            totals = hub.closed_stats[self.protocol] = SessionStats()
        self.add_stats_to(totals)
        if reason is None:
            reason = "closed"
        elif not isinstance(reason, str):
            reason = reason.getErrorMessage().rstrip(".")
        log.info(
            "{protocol} session {session} from {peer} closed: {reason} ({received} in, {sent} "
            "out, {dropped_messages} dropped)",
            event="disconnect", protocol=self.protocol, transport=self.transport_name,
            peer=self.peer, session=self.id, client=self.client, reason=reason,
            received=self.received, sent=self.sent, sent_bytes=self.sent_bytes,
            dropped_messages=self.dropped_messages, dropped_bytes=self.dropped_bytes,
            duration=round(time.monotonic() - self.opened, 3),
        )
        self.writes_now = False
        for topic in self.topics:
            self.hub.unsubscribe(self, topic)
        for pattern in self.patterns:
            self.hub.unsubscribe_pattern(self, pattern)
        self.topics.clear()
        self.patterns.clear()
        self.hub.subscription_bytes -= self.subscription_bytes
        self.subscription_bytes = 0
        self._queue.clear()
        self.queued_bytes = 0
        self.hub.detach(self)
        will, self.will = self.will, None
        if will is not None:
            delivered = self.hub.publish(will)
            log.info(
                "{protocol} session {session} from {peer}: will published on {topic!r} to "
                "{delivered} subscribers",
                event="will", protocol=self.protocol, peer=self.peer, session=self.id,
                client=self.client, topic=will.topic, delivered=delivered,
            )

    # -- delivery -------------------------------------------------------------------------------

    def deliver(self, message: HubMessage, cache: dict) -> None:
        """Send a published message, encoding and framing it only if no one did yet."""
        prepared = cache.get(self.frame_key)
        if prepared is None:
            prepared = self._prepare(message, cache)
            if prepared is None:
                return
        self._send_prepared(prepared)

    def _prepare(self, message: HubMessage, cache: dict) -> tuple[Any, int] | None:
        if self.wire_format not in cache:
            # None, cached too, means the message cannot be said in this format.
            cache[self.wire_format] = self._encode(message)
        return self.frame_from_cache(cache)

    def frame_from_cache(self, cache: dict) -> tuple[Any, int] | None:
        """Frame the encoding already in `cache` for this transport, if there is one."""
        encoded = cache.get(self.wire_format)
        if encoded is None:
            return None
        data, binary = encoded
        prepared = cache[self.frame_key] = (self.transport.prepareMessage(data, binary),
                                                len(data))
        return prepared

    def _send_prepared(self, prepared: tuple[Any, int]) -> None:
        """Write now if nothing waits and the transport takes writes, else queue."""
        if self.writes_now:
            self.sent += 1
            self.sent_bytes += prepared[1]
            self.write_frame(prepared[0])
            return
        if self.closed:
            return
        self._queue.append(prepared)
        self.writes_now = False
        self.queued_bytes += prepared[1]
        if self.queued_bytes > self.queue_limit:
            self._overflowed()

    def _overflowed(self) -> None:
        hub_stats = self.hub.stats
        if self.overflow is Overflow.DISCONNECT:
            self.overflow_disconnects += 1
            hub_stats.overflow_disconnects += 1
            log.warn(
                "{protocol} session {session} from {peer}: send queue passed {limit} bytes; "
                "disconnecting (policy 'disconnect')",
                event="overflow_disconnect", protocol=self.protocol, peer=self.peer,
                session=self.id, limit=self.queue_limit,
            )
            self._queue.clear()
            self.queued_bytes = 0
            self.transport.abortConnection()
            self.close(f"send queue passed {self.queue_limit} bytes")
            return
        while self.queued_bytes > self.queue_limit and self._queue:
            _, size = self._queue.popleft()
            self.queued_bytes -= size
            self.dropped_messages += 1
            self.dropped_bytes += size
            hub_stats.dropped_messages += 1
            hub_stats.dropped_bytes += size

    # -- IPushProducer: called by the transport underneath ---------------------------------------

    def pauseProducing(self) -> None:
        self._paused = True
        self.writes_now = False

    def resumeProducing(self) -> None:
        self._paused = False
        queue = self._queue
        while queue and not self._paused and not self.closed:
            prepared, size = queue.popleft()
            self.queued_bytes -= size
            self.sent += 1
            self.sent_bytes += size
            self.write_frame(prepared)
        self.writes_now = not (self._paused or self._queue or self.closed)

    def stopProducing(self) -> None:
        self._queue.clear()
        self.queued_bytes = 0
