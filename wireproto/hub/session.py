"""One connection's place in the hub (`Session`): its subscriptions, its will, its send queue and
its counters, its credential's expiry, and the log lines about its peer."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto.access import ANONYMOUS, Action, Grants, Principal
from wireproto.errors import CredentialEnded, Forbidden, LimitExceeded
from wireproto.hub.message import Encoder, HubMessage, Overflow, SessionStats
from wireproto.hub.peers import (
    is_reserved,
    log_credential_ended,
    log_revoked,
    log_subscription,
    log_too_large,
    log_will,
    publish_allowed,
    transport_name,
)
from wireproto.peerlog import address_key, describe_address
from wireproto.protocols.calls import RemoteCaller
from wireproto.topics import refuse_pattern, validate_pattern
from wireproto.transports.base import IMessageTransport

if TYPE_CHECKING:
    from wireproto.access import Policy
    from wireproto.access.quotas import PrincipalLimits
    from wireproto.hub.federation import Federation
    from wireproto.hub.message import HubStats
    from wireproto.hub.retained import LastValues
    from wireproto.hub.subscribers import Subscriber

__all__ = ["Session", "SessionHub"]

log = Logger(namespace="wireproto.hub")

class SessionHub(Protocol):
    """What a session may ask of its hub (wireproto.hub.Hub is one)."""

    queue_bytes: int
    overflow: Overflow
    max_topic_length: int
    max_subscriptions: int
    max_subscription_bytes: int
    max_total_subscription_bytes: int
    subscription_bytes: int
    max_denials: int
    expiry_leeway: float
    policy: Policy
    limits: PrincipalLimits
    retained: LastValues | None
    federation: Federation
    stats: HubStats
    closed_stats: dict[str, SessionStats]

    @property
    def clock(self) -> IReactorTime: ...

    def prepared_key(self, wire_format: Hashable, prepare_key: Hashable) -> object: ...

    def new_session_id(self) -> int: ...

    def subscribe(self, subscriber: Subscriber, topic: str) -> bool: ...

    def unsubscribe(self, subscriber: Subscriber, topic: str) -> bool: ...

    def subscribe_pattern(self, subscriber: Subscriber, pattern: str) -> None: ...

    def unsubscribe_pattern(self, subscriber: Subscriber, pattern: str) -> None: ...

    def send_last_values(self, session: Session, subscribed: str, pattern: bool) -> None: ...

    def note_denial(self, protocol: str, action: str, topic: str, principal: str | None,
                    peer_key: str, **fields: Any) -> None: ...

    def fan_out(self, topic: str, payload: bytes, will: bool, sender: object, protocol: str,
                cache: dict, message: HubMessage | None) -> int: ...

    def publish(self, message: HubMessage, cache: dict | None = None) -> int: ...

    def detach(self, session: Session) -> None: ...


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
        "dropped_bytes", "overflow_disconnects", "too_large", "max_frame", "id", "peer",
        "transport_name", "client",
        "opened", "opened_at", "principal", "grants", "publish_decisions", "denials", "usage",
        "expiry",
        "__weakref__",
    )

    def __init__(
        self,
        hub: SessionHub,
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
        # The largest message the transport takes: frames are prepared per limit too, and
        # one over it is not sent.
        self.max_frame: int | None = getattr(transport, "maxMessageSize", None)
        self.frame_key = self.new_frame_key(wire_format)
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
        self.too_large = 0
        self.id = hub.new_session_id()
        self.peer = describe_address(transport.getPeer())
        self.transport_name = transport_name(transport)
        self.client: str | None = None
        self.opened = time.monotonic()
        self.opened_at = round(time.time(), 3)  # Unix seconds: every process of a host agrees
        # Who the transport says the peer is; what it may do (None: everything).
        self.principal: Principal = getattr(transport, "principal", None) or ANONYMOUS
        self.grants: Grants | None = None
        # The grants' publish decisions so far, which a publish looks up first.
        self.publish_decisions: dict[str, bool] | None = None
        self.denials = 0
        # What this session counts against its principal's [limits].
        limits = hub.limits
        self.usage = limits.acquire(limits.key(self.principal, address_key(transport.getPeer())))
        # The close waiting for the principal's credential to expire, if it can.
        self.expiry: IDelayedCall | None = None
        transport.registerProducer(self, True)

    def __repr__(self) -> str:
        return f"<Session {self.protocol} {self.transport.kind} {self.transport.getPeer()}>"

    @property
    def stats(self) -> SessionStats:
        """This session's counters, as of now."""
        return SessionStats(
            self.received, self.sent, self.sent_bytes, self.dropped_messages,
            self.dropped_bytes, self.overflow_disconnects, self.too_large,
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
        totals.too_large += self.too_large

    # -- what the protocol asks of the hub ------------------------------------------------------
    # Topics here are the protocol's own. They are the hub's too, but for a connection whose
    # topics are mounted under a prefix (wireproto.hub.mount), which overrides what takes one;
    # so where these methods call each other they call Session's own, on the hub's topics.

    def hub_topic(self, topic: str) -> str:
        """The hub's name for this connection's `topic`."""
        return topic

    def own_topic(self, hub_topic: str) -> str | None:
        """This connection's name for the hub's `hub_topic`; None if it has none."""
        return hub_topic

    def subscribed(self, topic: str) -> bool:
        """Whether this connection subscribes to its exact `topic`."""
        return topic in self.topics

    def own_topics(self) -> Iterable[str]:
        """The exact topics this connection subscribes to, in its own names."""
        return self.topics

    def subscribe(self, topic: str) -> bool:
        """Subscribe to one exact topic. False if this session already was. LimitExceeded past
        the hub's limits on subscriptions (count, topic length, bytes)."""
        if topic in self.topics:
            return False
        if self.grants is not None:
            Session.check(self, Action.SUBSCRIBE, topic)
        self._hold(topic)
        self.topics.add(topic)
        subscribed = self.hub.subscribe(self, topic)
        log_subscription(self, True, topic, False)
        if self.hub.retained is not None:
            self.hub.send_last_values(self, topic, pattern=False)
        return subscribed

    def room_for(self, topics: Iterable[str]) -> str | None:
        """Why this session could not subscribe to every one of `topics` (exact topics or
        patterns) more, by the limits `subscribe` checks; None if it could. Changes nothing: a
        protocol that must answer before it subscribes (a SubbleSocket handshake) asks first."""
        new = [topic for topic in dict.fromkeys(topics)
               if topic not in self.topics and topic not in self.patterns]
        problem, size = self._connection_room(new)
        if problem is not None:
            return problem
        hub = self.hub
        return hub.limits.room_for_subscriptions(
            self.usage, len(new), size, hub.subscription_bytes, hub.max_total_subscription_bytes)

    def unsubscribe(self, topic: str) -> bool:
        if topic not in self.topics:
            return False
        self.topics.discard(topic)
        self._release(topic)
        log_subscription(self, False, topic, False)
        return self.hub.unsubscribe(self, topic)

    def subscribe_pattern(self, pattern: str) -> bool:
        if pattern in self.patterns:
            return False
        validate_pattern(pattern)
        if self.grants is not None:
            Session.check(self, Action.SUBSCRIBE, pattern)
        self._hold(pattern)
        self.hub.subscribe_pattern(self, pattern)
        self.patterns.add(pattern)
        log_subscription(self, True, pattern, True)
        if self.hub.retained is not None:
            self.hub.send_last_values(self, pattern, pattern=True)
        return True

    def unsubscribe_pattern(self, pattern: str) -> bool:
        if pattern not in self.patterns:
            return False
        self.patterns.discard(pattern)
        self._release(pattern)
        log_subscription(self, False, pattern, True)
        self.hub.unsubscribe_pattern(self, pattern)
        return True

    # -- access ---------------------------------------------------------------------------------

    def identify(self, principal: Principal) -> None:
        """Act as `principal` (with this session's client id) under the hub's policy."""
        if principal.client_id is None and self.client is not None:
            principal = replace(principal, client_id=self.client)
        self.principal = principal
        grants = self.hub.policy.grants(principal)
        if grants.allows_everything:
            self.grants = self.publish_decisions = None
        else:
            self.grants = grants
            self.publish_decisions = grants.decisions(Action.PUBLISH)

    def end_forbidden_subscriptions(self) -> int:
        """Unsubscribe from every topic and pattern the grants no longer allow (after a
        reload); returns how many."""
        if self.grants is None:
            return 0
        ended = 0
        for topic in tuple(self.topics):
            if not self.grants.allows(Action.SUBSCRIBE, topic):
                Session.unsubscribe(self, topic)
                ended += 1
                log_revoked(self, topic)
        for pattern in tuple(self.patterns):
            if not self.grants.allows(Action.SUBSCRIBE, pattern):
                Session.unsubscribe_pattern(self, pattern)
                ended += 1
                log_revoked(self, pattern)
        return ended

    # -- the credential's end ------------------------------------------------------------------

    def watch_expiry(self) -> None:
        """Close this connection when the credential that proved its principal expires, plus
        the hub's `expiry_leeway` (or the leeway its own check allowed, if longer)."""
        credential = self.principal.credential
        if credential is None or credential.expires is None or self.closed:
            return
        deadline = credential.expires + max(self.hub.expiry_leeway, credential.leeway)
        self._expire_at(deadline)

    def _expire_at(self, deadline: float) -> None:
        clock = self.hub.clock
        self.expiry = clock.callLater(max(0.0, deadline - clock.seconds()), self._expired,
                                      deadline)

    def _expired(self, deadline: float) -> None:
        self.expiry = None
        if self.hub.clock.seconds() < deadline:  # the clock was set back since
            self._expire_at(deadline)
            return
        self.end(CredentialEnded("credential expired"), "credential_expired")

    def end(self, error: CredentialEnded, event: str, why: str | None = None) -> None:
        """Close this connection because its credential ended: the session leaves the hub now
        (its will is published), and the transport tells the peer `error` in its carrier's
        words (a WebSocket closes with 1008). Logged as `event`, with `why` if given, never
        with the credential."""
        if self.closed:
            return
        log_credential_ended(self, event, why)
        self.close(str(error))
        self.transport.loseConnection(error)

    def _stop_expiry(self) -> None:
        expiry, self.expiry = self.expiry, None
        if expiry is not None and expiry.active():
            expiry.cancel()

    def may(self, action: Action, topic: str) -> bool:
        """Whether this session's principal may `action` on `topic`; asks, counts nothing."""
        return self.grants is None or self.grants.allows(action, topic)

    def may_publish(self, topic: str) -> bool:
        """Whether a publish from this session on `topic` would be let through; asks, counts
        nothing."""
        return publish_allowed(self.grants, topic)

    def check(self, action: Action, topic: str) -> None:
        """Forbidden, counted and logged, unless this session's principal may `action` on
        `topic`; LimitExceeded instead once it has been refused more than the hub's
        `max_denials` times, so the protocol closes the connection."""
        grants = self.grants
        if grants is None:
            if action is Action.PUBLISH and topic[:1] == "$":
                self.refuse_reserved(topic)
            return
        if not grants.allows(action, topic):
            self._deny(action, topic)

    def _deny(self, action: Action, topic: str) -> None:
        self.denials += 1
        hub = self.hub
        name = self.principal.name
        hub.note_denial(
            self.protocol, action.value, topic, name, address_key(self.transport.getPeer()),
            transport=self.transport_name, peer=self.peer, session=self.id, client=self.client,
        )
        if hub.max_denials and self.denials > hub.max_denials:
            raise LimitExceeded(
                f"{self.denials} refused requests on one connection; closing it "
                "([auth] close_after_denials)"
            )
        raise Forbidden(action.value, topic, name)

    def refuse_reserved(self, topic: str) -> None:
        """Forbidden, counted and logged, for a publish on the broker's own ``$SYS`` and
        ``$devices`` topics when no rules say who may (without rules, only the broker
        publishes there)."""
        if is_reserved(topic):
            self._deny(Action.PUBLISH, topic)

    def check_topic_length(self, topic: str) -> None:
        """LimitExceeded for a hub topic longer than [hub] max_topic_length."""
        problem = self._topic_length_problem(topic)
        if problem is not None:
            raise LimitExceeded(problem)

    def _topic_length_problem(self, topic: str) -> str | None:
        if len(topic) > self.hub.max_topic_length:
            return (f"topic of {len(topic)} characters: this broker takes at most "
                    f"{self.hub.max_topic_length} ([hub] max_topic_length)")
        return None

    def _connection_room(self, new: list[str]) -> tuple[str | None, int]:
        """Why this connection could not take the `new` subscriptions by its own limits (count,
        topic length, topic bytes), or None; and their topic bytes."""
        hub = self.hub
        if len(self.topics) + len(self.patterns) + len(new) > hub.max_subscriptions:
            return f"more than {hub.max_subscriptions} subscriptions on one connection", 0
        size = 0
        for topic in new:
            problem = self._topic_length_problem(topic)
            if problem is not None:
                return problem, 0
            size += len(topic.encode("utf-8", "surrogatepass"))
        if self.subscription_bytes + size > hub.max_subscription_bytes:
            return (f"subscriptions of more than {hub.max_subscription_bytes} topic bytes on "
                    "one connection ([hub] max_subscription_bytes)"), size
        return None, size

    def _hold(self, topic: str) -> None:
        """Count one more subscription against the limits, or raise LimitExceeded."""
        problem, size = self._connection_room([topic])
        if problem is not None:
            raise LimitExceeded(problem)
        hub = self.hub
        limits = hub.limits
        problem = limits.take_subscription_bytes(
            self.usage, size, hub.subscription_bytes, hub.max_total_subscription_bytes,
            self.protocol)
        if problem is not None:
            raise LimitExceeded(problem)
        problem = limits.hold_subscription(self.usage, self.protocol)
        if problem is not None:
            limits.release_subscription_bytes(self.usage, size)
            raise LimitExceeded(problem)
        self.subscription_bytes += size
        hub.subscription_bytes += size

    def _release(self, topic: str) -> None:
        size = len(topic.encode("utf-8", "surrogatepass"))
        self.subscription_bytes -= size
        self.hub.subscription_bytes -= size
        self.hub.limits.release_subscription(self.usage)
        self.hub.limits.release_subscription_bytes(self.usage, size)

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
        `encodings` holds it in several formats, as `{wire_format: (data, binary)}`.
        Forbidden if this session's principal may not publish on `topic`."""
        self.received += 1
        decided = self.publish_decisions
        if decided is not None:
            if not decided.get(topic):  # a topic remembered as allowed was checked before
                self.check_topic_length(topic)
                Session.check(self, Action.PUBLISH, topic)
        else:
            if len(topic) > self.hub.max_topic_length:
                self.check_topic_length(topic)
            if topic[:1] == "$":
                self.refuse_reserved(topic)
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
        self.frame_key = self.new_frame_key(wire_format)

    def new_frame_key(self, wire_format: Hashable) -> object:
        """The fan-out cache key of this session's frames in `wire_format`: the hub's, shared by
        every session whose transports prepare frames alike."""
        return self.hub.prepared_key(wire_format, (self.transport.prepareKey, self.max_frame))

    def send(self, data: bytes, binary: bool) -> None:
        """Send one message of this connection's own (an announcement, not a publish) through
        the send queue, behind whatever already waits there."""
        if not self.closed:
            self._send_prepared((self.transport.prepareMessage(data, binary), len(data)))

    def caller(self) -> RemoteCaller:
        """This connection as the caller of a call that another broker process answers."""
        return RemoteCaller(self.protocol, self.peer, self.id, self.client, self.principal, "")

    def set_will(self, topic: str, payload: bytes) -> None:
        self.check_topic_length(topic)
        refuse_pattern(topic)  # published by the hub at the close, which would refuse it then
        Session.check(self, Action.PUBLISH, topic)
        self.will = HubMessage(topic, payload, will=True, protocol=self.protocol)
        self.hub.federation.hold_will(self.id, self.will)

    def close(self, reason: Failure | str | None = None) -> None:
        """Leave the hub: drop every subscription and the queue, then publish the will.
        `reason`, a Failure or text, says why in the log."""
        if self.closed:
            return
        self.closed = True
        self._stop_expiry()
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
        self.usage.subscriptions -= len(self.topics) + len(self.patterns)
        self.hub.limits.release_subscription_bytes(self.usage, self.subscription_bytes)
        self.hub.limits.release(self.usage)
        self.topics.clear()
        self.patterns.clear()
        self.hub.subscription_bytes -= self.subscription_bytes
        self.subscription_bytes = 0
        self._queue.clear()
        self.queued_bytes = 0
        self.hub.detach(self)
        will, self.will = self.will, None
        if will is not None and not hub.federation.release_will(self.id):
            will = None  # another broker process publishes it: it took this one's place over
        if will is not None and self.grants is not None and not self.grants.allows(
            Action.PUBLISH, will.topic
        ):
            log_will(self, will.topic, None)
            will = None
        if will is not None:
            log_will(self, will.topic, self.hub.publish(will))

    # -- delivery -------------------------------------------------------------------------------

    def deliver(self, message: HubMessage, cache: dict) -> None:
        """Send a published message, encoding and framing it only if no one did yet."""
        key = self.frame_key
        prepared = cache.get(key)
        if prepared is None:
            if key not in cache:
                prepared = self._prepare(message, cache)
            if prepared is None:
                if key in cache:  # None there: larger than this transport takes
                    self.too_large += 1
                    log_too_large(self, message.topic, len(cache[self.wire_format][0]))
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
        key = self.frame_key
        if key in cache:  # refused: too large for transports of this key
            return None
        data, binary = encoded
        limit = self.max_frame
        if limit is not None and len(data) > limit:
            # Framed for no one: what cannot be sent is not built. `deliver` counts it.
            cache[key] = None
            return None
        prepared = cache[key] = (self.transport.prepareMessage(data, binary), len(data))
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
