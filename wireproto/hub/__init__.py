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

A session lasts no longer than the credential that proved its principal: it is closed when that
expires (`Session.watch_expiry`, [auth] `expiry_leeway` later), and when a reload withdraws it
(`Hub.end_withdrawn`), its transport telling the peer why (a WebSocket closes with 1008).

The hub logs each connection's life as structured events (namespace ``wireproto.hub``, a stable
`event` field): ``connect``, ``disconnect`` (with the reason and the session's counts), ``will``,
``protocol_error``, ``credential_expired`` and ``credential_withdrawn``. It keeps each protocol's
counts after its sessions close (`Hub.protocol_stats`), for wireproto.metrics.


The package: `message` (what travels and what is counted), `subscribers` (who is delivered
to), `session` (one connection's place), and `Hub` itself here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Hashable, Iterable
from dataclasses import replace
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from wireproto import peerlog, speedups
from wireproto.access import Grants, Policy, Principal
from wireproto.access.quotas import PrincipalLimits
from wireproto.codecs.serialization import (
    DEFAULT_MAX_DOCUMENT_DEPTH,
    DEFAULT_MAX_DOCUMENT_ELEMENTS,
    bound_documents,
)
from wireproto.errors import CredentialEnded
from wireproto.hub.federation import ALONE, Federation
from wireproto.hub.message import (
    DEFAULT_MAX_RETAINED,
    DEFAULT_MAX_RETAINED_BYTES,
    DEFAULT_MAX_SUBSCRIPTION_BYTES,
    DEFAULT_MAX_SUBSCRIPTIONS,
    DEFAULT_MAX_TOPIC_LENGTH,
    DEFAULT_MAX_TOTAL_SUBSCRIPTION_BYTES,
    DEFAULT_QUEUE_BYTES,
    DEFAULT_RETAINED_EXAMINED_PER_SECOND,
    Encoder,
    HubMessage,
    HubSettings,
    HubStats,
    Overflow,
    SessionStats,
    new_message,
)
from wireproto.hub.mount import MountedSession, Retopic
from wireproto.hub.peers import log_protocol_error, publish_allowed, transport_name
from wireproto.hub.retained import LastValues
from wireproto.hub.session import Session
from wireproto.hub.subscribers import (
    FrameSubscriber,
    LocalSubscriber,
    Subscriber,
    TopicObserver,
)
from wireproto.peerlog import describe_address
from wireproto.protocols.calls import CallServer
from wireproto.topics import PatternTree, is_pattern, refuse_pattern, validate_pattern
from wireproto.transports.base import IMessageTransport, go_away

__all__ = [
    "DEFAULT_QUEUE_BYTES",
    "DEFAULT_MAX_SUBSCRIPTIONS",
    "DEFAULT_MAX_TOPIC_LENGTH",
    "DEFAULT_MAX_SUBSCRIPTION_BYTES",
    "DEFAULT_MAX_TOTAL_SUBSCRIPTION_BYTES",
    "Overflow",
    "HubMessage",
    "HubSettings",
    "HubStats",
    "SessionStats",
    "Encoder",
    "Federation",
    "Hub",
    "Session",
    "MountedSession",
    "LocalSubscriber",
    "Subscriber",
    "FrameSubscriber",
    "TopicObserver",
    "describe_address",
    "transport_name",
    "log_protocol_error",
    "publish_allowed",
]

log = Logger(namespace="wireproto.hub")


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
        retain: Iterable[str] = (),
        max_retained: int = DEFAULT_MAX_RETAINED,
        max_retained_bytes: int = DEFAULT_MAX_RETAINED_BYTES,
        retained_examined_per_second: int = DEFAULT_RETAINED_EXAMINED_PER_SECOND,
        retain_file: str = "",
        max_document_elements: int = DEFAULT_MAX_DOCUMENT_ELEMENTS,
        max_document_depth: int = DEFAULT_MAX_DOCUMENT_DEPTH,
    ) -> None:
        if queue_bytes <= 0:
            raise ValueError("queue_bytes must be positive")
        # What a decoded document may hold is the process's: every codec reads documents.
        bound_documents(max_document_elements, max_document_depth)
        self.queue_bytes = queue_bytes
        self.overflow = Overflow(overflow)
        self.max_subscriptions = max_subscriptions
        self.max_topic_length = max_topic_length
        self.max_subscription_bytes = max_subscription_bytes
        self.max_total_subscription_bytes = max_total_subscription_bytes
        # The UTF-8 bytes of every connection's subscribed topics and patterns.
        self.subscription_bytes = 0
        # The last value of each topic a retain pattern matches (None: none are kept).
        retain = tuple(retain)
        self._retained_bounds = (max_retained, max_retained_bytes)
        self.retained: LastValues | None = LastValues(
            retain, max_topics=max_retained, max_bytes=max_retained_bytes,
            path=retain_file or None) if retain else None
        # Nodes of the kept topics' tree one principal's pattern subscribes (an anonymous
        # address's) may examine a second (0: no limit); wireproto.limits pauses the reading
        # of its connection in debt.
        self.retained_examined_per_second = retained_examined_per_second
        self.stats = HubStats()
        self.sessions: dict[Session, None] = {}
        # Connections ever attached, by (protocol, transport); counts of closed sessions, by
        # protocol: neither is lost when a connection goes.
        self.accepted: dict[tuple[str, str], int] = {}
        self.closed_stats: dict[str, SessionStats] = {}
        self._session_ids = itertools.count(1)
        self._exact: dict[str, dict[Subscriber, None]] = {}
        self._patterns: PatternTree[Subscriber] = PatternTree()
        # (wire format, prepare key) -> a plain object, a cheaper fan-out cache key than the tuple
        self._prepared_keys: dict[tuple, object] = {}
        self._topic_observers: list[TopicObserver] = []
        # Who may do what (wireproto.access); open unless the broker has an [auth] table.
        self.policy = Policy.open()
        # Refusals one connection may earn before it is closed (0: never closed for them).
        self.max_denials = 0
        # How long past its credential's expiry a connection is closed ([auth] expiry_leeway),
        # and the clock that closes it (the reactor, unless set).
        self.expiry_leeway = 0.0
        self._clock: IReactorTime | None = None
        # Refusals by (protocol, action).
        self.denied: dict[tuple[str, str], int] = {}
        # What each principal holds and sends, against the [limits] table.
        self.limits = PrincipalLimits()
        # Each pattern's count of subscribers, for the observers told when one starts or ends.
        self._pattern_counts: dict[str, int] = {}
        # The subscriptions held by subscribers that are no session (a tap, a bridge), by
        # subscriber: few, so the sessions among a topic's subscribers are counted by them.
        self._hosts: dict[Subscriber, int] = {}
        # The other broker processes this hub is joined to (wireproto.hub.federation): it is
        # told of every publish made here, and publishes what the others send as their sender.
        self.federation: Federation = ALONE
        # The protocol servers that answer calls (a UBRE handler, a nydus route), by protocol:
        # a federation serves their names to the other processes.
        self.call_servers: dict[str, CallServer] = {}
        # Wire formats whose encoding of a message says more than its topic and payload (a
        # SubbleSocket event's id, source and time): a publish made with one crosses to the
        # other processes with it, so their subscribers get the same bytes.
        self.portable_formats: set[Hashable] = set()
        # Publishes by topic, for their rates (wireproto.admin), once `count_topics` is called:
        # at most `max_counted_topics` topics; the publishes on others are counted together.
        self.topic_counts: dict[str, int] | None = None
        self.max_counted_topics = 0
        self.uncounted_publishes = 0

    @property
    def clock(self) -> IReactorTime:
        """The reactor the sessions' credential expiries are timed by."""
        if self._clock is None:
            from twisted.internet import reactor

            self._clock = reactor
        return self._clock

    @clock.setter
    def clock(self, clock: IReactorTime) -> None:
        self._clock = clock

    def count_topics(self, max_topics: int) -> None:
        """Count the publishes on each topic from now on, for at most `max_topics` topics."""
        if self.topic_counts is None:
            self.topic_counts = {}
        self.max_counted_topics = max_topics

    def keep_last_values(self, pattern: str) -> LastValues:
        """Keep the last value of every topic `pattern` matches, whatever `retain` says (the
        broker's own, such as the devices' presence), within the [hub] bounds on last values.
        Called before the parts that read `retained` are made."""
        if self.retained is None:
            max_topics, max_bytes = self._retained_bounds
            self.retained = LastValues((pattern,), max_topics=max_topics, max_bytes=max_bytes)
        else:
            self.retained.add_pattern(pattern)
        return self.retained

    def send_last_values(self, session: Session, subscribed: str, pattern: bool) -> None:
        """Send a new subscription's last values to its session: the topic's, or every kept
        topic's that the pattern matches."""
        retained = self.retained
        if retained is None:
            return
        if pattern:
            found = retained.matching(subscribed)
        else:
            kept = retained.get(subscribed)
            found = [] if kept is None else [kept]
        for message, encodings in found:
            session.deliver(message, dict(encodings))

    def join(self, federation: Federation) -> None:
        """Join this hub to other broker processes through `federation`."""
        self.federation = federation

    def leave(self, federation: Federation) -> None:
        """Stop telling `federation` anything, if this hub is joined through it."""
        if self.federation is federation:
            self.federation = ALONE

    def add_call_server(self, protocol: str, server: CallServer) -> None:
        """Make `server`'s calls reachable from the other broker processes, when there are
        any."""
        self.call_servers[protocol] = server
        self.calls_changed()

    def remove_call_server(self, protocol: str, server: CallServer) -> None:
        if self.call_servers.get(protocol) is server:
            del self.call_servers[protocol]
            self.calls_changed()

    def calls_changed(self) -> None:
        """A call server's names changed (a handler or route added)."""
        self.federation.calls_changed()

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
        mount: str | None = None,
        retopic: Retopic | None = None,
    ) -> Session:
        """Give a new connection its session. `wire_format` names what `encode` produces, so
        sessions that share it share one encoding per published message. `client` is the
        protocol's own name for the peer (a nydus id, a SubbleSocket client ID), for the log.
        With `mount`, the connection's topics are the hub's under it (`MountedSession`), and
        `retopic` says a message encoded for the others under the connection's own topic."""
        session = Session(
            self, transport, protocol=protocol, wire_format=wire_format, encode=encode
        ) if mount is None else MountedSession(
            self, transport, protocol=protocol, wire_format=wire_format, encode=encode,
            mount=mount, retopic=retopic)
        session.client = client
        session.identify(session.principal)
        self.sessions[session] = None
        session.watch_expiry()
        key = (protocol, session.transport_name)
        self.accepted[key] = self.accepted.get(key, 0) + 1
        log.info(
            "{protocol} session {session} opened by {peer} over {transport}"
            + (" as client {client}" if client is not None else ""),
            event="connect", protocol=protocol, transport=session.transport_name,
            peer=session.peer, session=session.id, client=client,
            principal=session.principal.name,
        )
        return session

    def note_denial(self, protocol: str, action: str, topic: str, principal: str | None,
                    peer_key: str, **fields: Any) -> None:
        """Count a refusal by protocol and action, and log it as a `denied` event within the
        peers' log budget (wireproto.peerlog)."""
        key = (protocol, action)
        self.denied[key] = self.denied.get(key, 0) + 1
        peerlog.warn(
            log, peer_key, "{protocol}: {who} may not {action} {topic!r}", event="denied",
            protocol=protocol, principal=principal, action=action, topic=topic,
            who="anonymous" if principal is None else repr(principal), **fields,
        )

    def set_policy(self, policy: Policy) -> int:
        """Check every connection against `policy` from now on (a reload): each session's
        grants are made again, and every subscription the new rules forbid is ended. Returns
        how many were ended."""
        self.policy = policy
        ended = 0
        previous: dict[Session, Grants | None] = {}
        for session in tuple(self.sessions):
            previous[session] = session.grants
            session.identify(session.principal)
            ended += session.end_forbidden_subscriptions()
        self._tell_observers("grants_changed", previous)
        return ended

    def end_withdrawn(self, withdrawn: Callable[[Principal], str | None]) -> int:
        """Close every connection whose credential `withdrawn(principal)` says no longer holds
        (a reload), telling each peer why; returns how many."""
        ended = 0
        for session in tuple(self.sessions):
            if session.principal.credential is None or session.closed:
                continue
            why = withdrawn(session.principal)
            if why is not None:
                session.end(CredentialEnded(f"credential withdrawn: {why}"),
                            "credential_withdrawn", why)
                ended += 1
        return ended

    def end_sessions(self, ids: Collection[int], reason: str) -> int:
        """Close the sessions whose ids are in `ids` as this side going away (a WebSocket
        closes with 1001), with `reason` in the log; returns how many."""
        wanted = set(ids)
        ended = 0
        for session in tuple(self.sessions):
            if session.id in wanted and not session.closed:
                session.close(reason)
                go_away(session.transport)
                ended += 1
        return ended

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
            self._count_host(subscriber, 1)
            if self._topic_observers:
                self._tell_observers("topic_started", topic)
            return True
        if subscriber in subscribers:
            return False
        subscribers[subscriber] = None
        self._count_host(subscriber, 1)
        return True

    def unsubscribe(self, subscriber: Subscriber, topic: str) -> bool:
        subscribers = self._exact.get(topic)
        if subscribers is None or subscriber not in subscribers:
            return False
        del subscribers[subscriber]
        self._count_host(subscriber, -1)
        if not subscribers:
            del self._exact[topic]
            if self._topic_observers:
                self._tell_observers("topic_ended", topic)
        return True

    def add_topic_observer(self, observer: TopicObserver) -> None:
        """Have `observer.topic_started(topic)` called when an exact topic gains its first
        subscriber, and `observer.topic_ended(topic)` when it loses its last one; and, if it
        has them, `pattern_started(pattern)` and `pattern_ended(pattern)` likewise, and
        `grants_changed(previous)` after a new policy, with each session's grants before it."""
        self._topic_observers.append(observer)

    def remove_topic_observer(self, observer: TopicObserver) -> None:
        self._topic_observers.remove(observer)

    def _tell_observers(self, event: str, what: Any) -> None:
        """Call `event(what)` on each topic observer that has it."""
        for observer in tuple(self._topic_observers):
            told = getattr(observer, event, None)
            if told is None:
                continue
            try:
                told(what)
            except Exception:
                log.failure("hub topic observer {observer!r} raised", event="callback_failed",
                            observer=observer)

    def subscribe_pattern(self, subscriber: Subscriber, pattern: str) -> None:
        validate_pattern(pattern)
        self._patterns.add(pattern, subscriber)
        self._count_host(subscriber, 1)
        counts = self._pattern_counts
        counts[pattern] = counts.get(pattern, 0) + 1
        if counts[pattern] == 1 and self._topic_observers:
            self._tell_observers("pattern_started", pattern)

    def unsubscribe_pattern(self, subscriber: Subscriber, pattern: str) -> None:
        self._patterns.remove(pattern, subscriber)
        self._count_host(subscriber, -1)
        counts = self._pattern_counts
        counts[pattern] -= 1
        if not counts[pattern]:
            del counts[pattern]
            if self._topic_observers:
                self._tell_observers("pattern_ended", pattern)

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

    def reached(self, topic: str, sender: object = None) -> int:
        """The connections here that a publish on `topic` from `sender` goes to: what a
        publish's answer counts (POST /api/publish, nydus's /_hub/publish). Host code's
        subscribers (a tap, a Phyllo bridge) are none, though `publish` counts them."""
        return sum(1 for subscriber in self.subscribers(topic)
                   if subscriber is not sender and isinstance(subscriber, Session))

    def topics(self) -> list[str]:
        return list(self._exact)

    def patterns(self) -> list[str]:
        """Every pattern someone subscribes to."""
        return list(self._pattern_counts)

    def _count_host(self, subscriber: Subscriber, change: int) -> None:
        if isinstance(subscriber, Session):
            return
        held = self._hosts.get(subscriber, 0) + change
        if held > 0:
            self._hosts[subscriber] = held
        else:
            self._hosts.pop(subscriber, None)

    def sessions_reached(self, topics: Iterable[str]) -> dict[str, int]:
        """How many sessions a message on each of `topics` reaches (its sender aside): exact
        subscribers and those whose patterns match it, each once, by the publish path's
        matching. Host code's subscribers (a tap, a bridge) are no sessions and not counted."""
        reached: dict[str, int] = {}
        # Topics matched by the same patterns share their sessions: counted once for all.
        by_patterns: dict[tuple[int, ...], int] = {}
        for topic in topics:
            groups = self._patterns.groups(topic) if self._patterns.count else []
            key = tuple(map(id, groups))
            count = by_patterns.get(key)
            if count is None:
                count = by_patterns[key] = self._sessions_in(groups)
            exact = self._exact.get(topic)
            if exact and groups:
                count += sum(1 for subscriber in exact if isinstance(subscriber, Session)
                             and not any(subscriber in group for group in groups))
            elif exact:
                count += self._sessions_in([exact])
            reached[topic] = count
        return reached

    def _sessions_in(self, groups: list[dict[Subscriber, None]]) -> int:
        """The sessions in any of `groups`, each once: the largest is counted by its length,
        only the others are walked, for the sessions the largest does not hold."""
        if not groups:
            return 0
        largest = max(groups, key=len)
        count = len(largest) - sum(1 for host in self._hosts if host in largest)
        if len(groups) > 1:
            others: set[Subscriber] = set()
            for group in groups:
                if group is not largest:
                    others.update(subscriber for subscriber in group
                                  if subscriber not in largest)
            count += sum(1 for subscriber in others if isinstance(subscriber, Session))
        return count

    def pattern_sessions(self, pattern: str) -> int:
        """How many sessions subscribe to `pattern` itself."""
        holders = self._patterns.holders(pattern)
        return len(holders) - sum(1 for host in self._hosts if host in holders)

    def subscriber_counts(self) -> dict[str, int]:
        """Each exact topic's subscribers, and each pattern's, by topic or pattern."""
        counts = {topic: len(subscribers) for topic, subscribers in self._exact.items()}
        counts.update(self._pattern_counts)
        return counts

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
        self, topic: str, payload: bytes, will: bool, sender: object, protocol: str, cache: dict,
        message: HubMessage | None,
    ) -> int:
        """The publish loop, for `publish` and for `Session.publish` (which has no HubMessage).
        `sender` (a subscriber, the federation, or None) is known by its identity alone.
        `message` is built only if some subscriber needs it (to encode it in another format, or
        a host callback), so forwarding a frame as it came builds none. InvalidTopic for a
        publish made here on a pattern (`refuse_pattern`), whatever its protocol."""
        stats = self.stats
        federation = self.federation
        if sender is not federation:
            if "+" in topic or "#" in topic:  # two substring tests: most topics have neither
                refuse_pattern(topic)
            stats.published += 1
            if will:
                stats.wills_published += 1
            if federation.joined and not federation.forward(topic, payload, will, protocol,
                                                            cache):
                return 0
        counts = self.topic_counts
        if counts is not None:
            counted = counts.get(topic)
            if counted is not None:
                counts[topic] = counted + 1
            elif len(counts) < self.max_counted_topics:
                counts[topic] = 1
            else:
                self.uncounted_publishes += 1
        retained = self.retained
        if retained is not None and retained.wants(topic):
            # Kept without its sender (a subscriber gets its own last value too) and as a plain
            # message: a will kept is a topic's last value, not a will once more.
            portable = {wire_format: cache[wire_format]
                        for wire_format in self.portable_formats if wire_format in cache}
            retained.keep(new_message(topic, payload, False, None, protocol), portable)
            if sender is not federation:
                federation.keep_last_value(topic, payload, protocol, portable)
        if self._patterns.count:
            targets: Iterable[Any] = self.subscribers(topic)  # FrameSubscribers when writes_now
        else:
            exact = self._exact.get(topic)
            if not exact:
                return 0
            targets = tuple(exact)
        # The broker's hottest loop, compiled where it can be: each subscriber whose transport
        # takes writes now gets the prepared frame; the rest need the message itself.
        delivered, rest = speedups.deliver_frames(targets, sender, cache)
        if rest is not None:
            if message is None:
                message = new_message(topic, payload, will, sender, protocol)
            for subscriber in rest:
                subscriber.deliver(message, cache)
        stats.delivered += delivered
        return delivered

    def detach(self, session: Session) -> None:
        """Forget a closed session (Session.close calls this)."""
        self.sessions.pop(session, None)
