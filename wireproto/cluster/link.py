"""One broker process's link to the others, through NATS (docs/cluster.md).

The hub sends the link every publish made in this process (`forward`); the link publishes it on
the topic's subject. The link subscribes on NATS to exactly the topics and patterns this
process's hub has subscribers for, and publishes what arrives into the hub with itself as the
sender, so it is never sent back out. NATS does not send a client its own messages (``echo``
is off), so a publish reaches this process's subscribers once, through the hub.

Each message carries a ``Wp`` header: the publishing process (its `origin`, fresh each time a
process starts), a sequence number, whether it is a will, and the protocol it came in on. One
process may hold two NATS subscriptions that both match a subject (``a/b`` and ``a/+``); NATS
then sends it the message twice, in order, and the sequence number drops the second copy. A
message without the header (a plain publish from a NATS client that is not a broker) has no
sequence number: it is taken only through the oldest of this process's subscriptions that
match its subject, so each of its copies but one is dropped.

A message published with an encoding in one of the hub's portable formats (a SubbleSocket event,
whose bytes hold its id, source and time) carries it too: the header names each such format,
its length and whether it is binary (``subble:57:b``), and the encodings come first in the
payload, before the message's own payload.
"""

from __future__ import annotations

import os
import secrets
import socket
from functools import partial
from typing import Any

import msgpack
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from wireproto import peerlog
from wireproto.cluster.calls import RemoteCalls
from wireproto.cluster.client import NatsClient, NatsOptions
from wireproto.cluster.lastvalues import SharedLastValues
from wireproto.cluster.lease import Lease
from wireproto.cluster.roster import Roster
from wireproto.cluster.settings import ClusterSettings
from wireproto.cluster.subjects import SubjectError, Subjects, safe_token
from wireproto.cluster.wills import WillKeeper
from wireproto.codecs import wpheader
from wireproto.errors import InvalidTopic, ProtocolError
from wireproto.hub import Hub, HubMessage
from wireproto.hub.federation import (
    Answerer,
    Encodings,
    FederationStats,
    Reply,
    ServedElsewhere,
)
from wireproto.protocols.calls import Answer, Call, CallNotFound
from wireproto.topics import refuse_pattern

__all__ = ["ClusterLink", "nats_options"]

log = Logger(namespace="wireproto.cluster")

# The most origins whose last sequence number is remembered (processes seen publishing).
MAX_ORIGINS = 10_000


def _read_secret(path: str) -> str | None:
    if not path:
        return None
    with open(path, encoding="utf-8") as file:
        return file.read().strip()


def nats_options(settings: ClusterSettings, name: str) -> NatsOptions:
    """The NATS client's options from the [cluster] table; OSError if a file is unreadable."""
    return NatsOptions(
        servers=settings.servers(), name=name, user=settings.user or None,
        password=_read_secret(settings.password_file), token=_read_secret(settings.token_file),
        nkey_seed_file=settings.nkey_seed_file or None,
        creds_file=settings.creds_file or None, cafile=settings.cafile or None,
        certfile=settings.certfile or None, keyfile=settings.keyfile or None,
        # A server that stops answering (a paused or partitioned node) is left, for another
        # of the cluster's, well within a lease: two PINGs unanswered, a tenth of it apart.
        ping_interval=min(max(settings.lease / 10, 0.5), 10.0), max_pings_out=2,
    )


class _Interest:
    """One NATS subscription of the link, held while any of the hub's topics and patterns need
    its subject; its messages come to the link with itself."""

    __slots__ = ("subject", "tokens", "sid", "needed")

    def __init__(self, link: ClusterLink, subject: str) -> None:
        self.subject = subject
        self.tokens = subject.split(".")
        self.needed = 1
        # The link's own method with this subscription bound first: no call in between.
        self.sid = link.client.subscribe(subject, partial(link._received, self))

    def matches(self, tokens: list[str]) -> bool:
        """Whether this (wildcard) subscription's subject matches a subject of `tokens`."""
        mine = self.tokens
        for index, token in enumerate(mine):
            if token == ">":
                return len(tokens) > index
            if index >= len(tokens) or (token != "*" and token != tokens[index]):
                return False
        return len(tokens) == len(mine)


class ClusterLink:
    """The hub's link to the other broker processes of its cluster: the hub's `Federation`,
    and the `ProcessGroup` the admin API and the metrics see (wireproto.hub.federation)."""

    joined = True  # publishes made here go to the other processes

    def __init__(self, hub: Hub, settings: ClusterSettings, reactor: IReactorTime) -> None:
        self.hub = hub
        self.settings = settings
        self.reactor = reactor
        self.subjects = Subjects(settings.subject_prefix)
        self.node = settings.node or f"{socket.gethostname()}:{os.getpid()}"
        self.client = NatsClient(reactor, nats_options(settings, name=f"wireproto {self.node}"))
        # subject -> its subscription; those with wildcards are in _wildcards too
        self._interest: dict[str, _Interest] = {}
        self._wildcards: dict[str, _Interest] = {}
        self._last_seen: dict[str, int] = {}
        self._topic_of: dict[str, str] = {}
        self.origin, self.origin_token = self._new_origin()
        self._headers = wpheader.HeaderWriter(self.origin)
        self._sequence = 0
        self.forwarded = self.received = self.duplicates = self.refused = 0
        self.running = False
        self.roster = Roster(self.client, reactor, self.subjects, origin=self.origin_token,
                             interval=settings.heartbeat_interval, lease=settings.lease)
        self.wills = WillKeeper(self.client, self.roster, self.subjects,
                                origin=self.origin_token, node=self.node, lease=settings.lease,
                                publish=hub.publish, replicas=settings.replicas)
        # The wills held here, by session (the keeper's own dict: checked on the publish path).
        self._held = self.wills.held
        self.lease = self._new_lease()
        self.fenced = 0
        self._fencing = False
        self.calls = RemoteCalls(self.client, self.subjects, self.roster, origin=self.origin,
                                 timeout=settings.call_timeout,
                                 max_answering=settings.max_remote_calls,
                                 servers=lambda: hub.call_servers)
        self.last_values = SharedLastValues(self.client, self.subjects, hub.retained,
                                            replicas=settings.replicas)
        self.client.on_ready = self._connected
        # What this process answers the others' questions with (the admin API's, the
        # metrics'), by question, and the subscriptions that hear them.
        self._answerers: dict[str, Answerer] = {}
        self._question_sids: dict[str, int] = {}

    # -- identity and lease -----------------------------------------------------------------------

    def _new_origin(self) -> tuple[str, str]:
        """A fresh name for this process among the others (no spaces: it is a field of the Wp
        header), and the same as one subject token and key name."""
        origin = "".join("_" if c.isspace() else c for c in self.node) + \
            "/" + secrets.token_hex(4)
        return origin, safe_token(origin)

    def _new_lease(self) -> Lease:
        lease = Lease(self.client, bucket=self.wills.bucket, stream=self.wills.stream,
                      holder=self.origin_token, node=self.node, duration=self.settings.lease)
        lease.on_renewed = self.roster.renewed
        lease.on_lost = self._lease_refused
        return lease

    def _lease_refused(self, why: str) -> None:
        self._fence(why)

    def _guard(self) -> None:
        """Fence this process if its lease may be over (it must not serve the connections whose
        wills another process may have published)."""
        lease = self.lease
        if lease.expired() and lease.in_force:
            self._fence(lease.lost or "its lease ran out by its own clock, "
                        f"{self.settings.lease:g} s after its last renewal reached NATS")

    def _fence(self, why: str) -> None:
        """Give up this identity: close the connections whose wills were kept under it (the
        claim of the identity publishes them), and go on as a new process."""
        if self._fencing:
            return
        self._fencing = True
        try:
            former = self.origin_token
            abandoned = self.wills.abandon(self.lease.sequence)
            self.lease.on_lost = self.lease.on_renewed = None
            self.origin, self.origin_token = self._new_origin()
            self._headers = wpheader.HeaderWriter(self.origin)
            self._sequence = 0
            self.roster.origin = self.origin_token
            self.roster.lease_sequence = 0
            self.calls.origin = self.origin
            self.wills.took_identity(self.origin_token)
            self.lease = self._new_lease()
            if self.wills.available:
                self.lease.start()
            self.fenced += 1
            self.roster.leave(former)
            closed = self.hub.end_sessions(
                abandoned, "this broker process lost its place in the cluster; its will is "
                "published by the process that took its place over")
            log.warn("cluster: this process was fenced ({why}): it closed the {count} "
                     "connections whose wills were kept as {former}, and goes on as {origin}",
                     event="cluster_fenced", why=why, count=closed, former=former,
                     origin=self.origin_token)
            self.lease.renew()
        finally:
            self._fencing = False

    def _tick(self) -> None:
        # Without a will held there is nothing to fence by the clock alone: a renewal that
        # lands late goes on, one refused fences (and a will set meanwhile is checked then).
        if self._held:
            self._guard()
        # Renewed whether or not the bucket has been seen on this connection yet: after a move
        # to another NATS node, the renewal itself is the quickest way back.
        self.lease.renew()

    # -- running ----------------------------------------------------------------------------------

    def start(self) -> None:
        if self.running:
            return
        self.running = True
        warning = self.settings.open_membership_warning()
        if warning is not None:
            log.warn("{warning}", event="cluster_open_membership", warning=warning)
        hub = self.hub
        hub.join(self)
        hub.add_topic_observer(self)
        for topic in hub.topics():
            self.topic_started(topic)
        for pattern in hub.patterns():
            self.pattern_started(pattern)
        self.roster.on_tick.append(self._tick)
        self.roster.start()
        for question in self._answerers:
            self._hear(question)
        self.wills.start()
        self.calls.refresh()
        if self.calls.recorder is not None:
            self.calls.recorder.start()
        self.client.start()

    def _connected(self) -> None:
        self.roster.connected()
        d = self.wills.connected()
        d.addCallback(self._bucket_ready)
        self.last_values.connected()

    def _bucket_ready(self, _: object) -> None:
        if self.wills.available:
            self.lease.start()
            self.lease.renew()

    def calls_changed(self) -> None:
        """What this process's servers answer changed (the hub calls this)."""
        if self.running:
            self.calls.refresh()

    def when_ready(self) -> defer.Deferred:
        return self.client.when_ready()

    @defer.inlineCallbacks
    def stop(self) -> Any:
        """Send what waits (the wills of connections closed on the way out), then close."""
        if not self.running:
            return
        self.running = False
        if self.client.connected:
            try:
                yield self.client.flush().addTimeout(2.0, self.reactor)
            except Exception:  # a server gone or slow: nothing more to do on the way out
                pass
        yield self.lease.release()
        self.roster.leave()
        self.calls.stop()
        if self.calls.recorder is not None:
            self.calls.recorder.stop()
        for sid in self._question_sids.values():
            self.client.unsubscribe(sid)
        self._question_sids.clear()
        self.wills.stop()
        self.last_values.stop()
        if self._tick in self.roster.on_tick:
            self.roster.on_tick.remove(self._tick)
        self.roster.stop()
        self.hub.remove_topic_observer(self)
        self.hub.leave(self)
        yield self.client.stop()

    # -- what the hub tells and asks of the others -------------------------------------------

    def keep_last_value(self, topic: str, payload: bytes, protocol: str,
                        encodings: Encodings) -> None:
        self.last_values.put(topic, payload, protocol, encodings)

    def hold_will(self, session: int, will: HubMessage) -> None:
        self._guard()
        self.wills.keep(session, will)

    def release_will(self, session: int) -> bool:
        self._guard()
        return self.wills.drop(session)

    def call(self, call: Call) -> defer.Deferred[Answer]:
        if not self.running:  # stopping: no other process is asked any more
            return defer.fail(CallNotFound("this process is leaving its cluster"))
        return self.calls.call(call)

    def served_elsewhere(self, protocol: str) -> ServedElsewhere:
        if not self.running:
            return ServedElsewhere(self.calls.version, [])
        return ServedElsewhere(self.calls.version, self.calls.elsewhere(protocol))

    def processes(self) -> int:
        # Without NATS a publish is dropped on its way to the others (client.dropped).
        if not (self.running and self.client.connected):
            return 1
        return len(self.roster.members()) + 1

    # -- questions every process answers (the admin API's, the metrics') ------------------------

    def answer_others(self, question: str, answerer: Answerer) -> None:
        self._answerers[question] = answerer
        if self.running and question not in self._question_sids:
            self._hear(question)

    def _hear(self, question: str) -> None:
        answerer = self._answerers[question]

        def asked(subject: str, reply: str | None, headers: Any, payload: bytes) -> None:
            if reply is None:
                return
            try:
                request = msgpack.unpackb(payload)
                if not isinstance(request, list):
                    return
                answer = answerer(request)
            except (ValueError, TypeError, IndexError, msgpack.UnpackException):
                return
            if answer is not None:
                self.client.publish(reply, msgpack.packb([self.origin, self.node, answer]))

        self._question_sids[question] = self.client.subscribe(
            self.subjects.cluster + question, asked)

    def ask_others(self, question: str, request: list[Any], own: Any,
                   timeout: float = 1.0) -> defer.Deferred[list[Reply]]:
        mine = [Reply(self.origin, self.node, own)]
        others = len(self.roster.members())
        if not others or not self.client.connected:
            return defer.succeed(mine)

        def unpacked(replies: list[bytes]) -> list[Reply]:
            parts = list(mine)
            for reply in replies:
                try:
                    origin, node, answer = msgpack.unpackb(reply)
                except (ValueError, TypeError, msgpack.UnpackException):
                    continue
                parts.append(Reply(str(origin), str(node), answer))
            return parts

        d = self.client.gather(self.subjects.cluster + question, msgpack.packb(request),
                               expected=others, timeout=timeout)
        return d.addCallbacks(unpacked, lambda _: mine)

    def stats(self) -> FederationStats:
        client, calls = self.client, self.calls
        return FederationStats(
            connected=client.connected, processes=len(self.roster.members()) + 1,
            forwarded=self.forwarded, received=self.received, duplicates=self.duplicates,
            refused=self.refused + self.last_values.on_patterns + self.wills.refused,
            dropped=client.dropped, reconnects=client.reconnects,
            calls_made=calls.made, calls_answered=calls.answered, calls_refused=calls.refused,
            wills_published=self.wills.published, fenced=self.fenced)

    # -- interest ---------------------------------------------------------------------------------

    def topic_started(self, topic: str) -> None:
        self._want((self.subjects.topic(topic),))

    def topic_ended(self, topic: str) -> None:
        self._unwant((self.subjects.topic(topic),))

    def pattern_started(self, pattern: str) -> None:
        self._want(self.subjects.pattern(pattern))

    def pattern_ended(self, pattern: str) -> None:
        self._unwant(self.subjects.pattern(pattern))

    def _want(self, subjects: tuple[str, ...]) -> None:
        for subject in subjects:
            held = self._interest.get(subject)
            if held is not None:
                held.needed += 1
                continue
            held = self._interest[subject] = _Interest(self, subject)
            if "*" in held.tokens or ">" in held.tokens:
                self._wildcards[subject] = held

    def _unwant(self, subjects: tuple[str, ...]) -> None:
        for subject in subjects:
            held = self._interest.get(subject)
            if held is None:
                continue
            held.needed -= 1
            if not held.needed:
                del self._interest[subject]
                self._wildcards.pop(subject, None)
                self.client.unsubscribe(held.sid)

    def _first_interest(self, subject: str) -> _Interest | None:
        """The oldest of the subscriptions that match `subject`: NATS sends a message once
        through each, so the one copy that arrives through this one is the one to take."""
        first = self._interest.get(subject)
        if self._wildcards:
            tokens = subject.split(".")
            for held in self._wildcards.values():
                if (first is None or held.sid < first.sid) and held.matches(tokens):
                    first = held
        return first

    def interest(self) -> list[str]:
        """The subjects this process subscribes to on NATS."""
        return list(self._interest)

    # -- messages ---------------------------------------------------------------------------------

    def forward(self, topic: str, payload: bytes, will: bool, protocol: str,
                encodings: Encodings | None = None) -> bool:
        """Publish a message made in this process to the others (the hub calls this), with its
        encodings in the hub's portable formats."""
        if self._held and self.lease.expired():
            self._guard()
            return False  # made before this process knew it was fenced: it goes nowhere
        self._sequence += 1
        portable = self.hub.portable_formats
        carried = {str(wire_format): encodings[wire_format] for wire_format in portable
                   if wire_format in encodings} if encodings and portable else None
        if carried:
            headers = self._headers.write(self._sequence, will, protocol, carried)
            payload = wpheader.carry(carried, payload)
        else:
            headers = self._headers.write(self._sequence, will, protocol)
        if self.client.publish(self.subjects.topic(topic), payload, headers=headers):
            self.forwarded += 1
        return True

    def _received(self, through: _Interest, subject: str, reply: str | None,
                  headers: bytes | None, payload: bytes) -> None:
        if self._held and self.lease.expired():
            self._guard()
        encodings: dict = {}
        try:
            fields = None if headers is None else wpheader.read(headers)
            if fields is not None and fields[4]:  # it carries encodings
                encodings, payload = wpheader.split(fields[4], payload)
        except ProtocolError as error:
            self._refuse(subject, f"a malformed Wp header: {error}")
            return
        if fields is None:
            if through is not self._first_interest(subject):
                self.duplicates += 1
                return
            will, protocol = False, ""
        else:
            origin, sequence, will, protocol, _ = fields
            last = self._last_seen.get(origin)
            if last is not None and sequence <= last:
                self.duplicates += 1
                return
            if last is None and len(self._last_seen) >= MAX_ORIGINS:
                self._last_seen.clear()
            self._last_seen[origin] = sequence
        topic = self._topic_of.get(subject)
        if topic is None:
            try:
                topic = self.subjects.topic_of(subject)
                refuse_pattern(topic)  # a plain NATS client's: a member's was refused at home
            except (SubjectError, InvalidTopic) as error:
                self._refuse(subject, str(error))
                return
            if len(self._topic_of) >= 4096:
                self._topic_of.clear()
            self._topic_of[subject] = topic
        self.received += 1
        self.hub.fan_out(topic, payload, will, self, protocol, encodings, None)

    def _refuse(self, subject: str, why: str) -> None:
        self.refused += 1
        peerlog.warn(log, "nats", "cluster: ignored a message on {subject!r}: {why}",
                     event="cluster_refused", subject=subject, why=why)

    def __repr__(self) -> str:
        return f"<ClusterLink {self.origin} {self.client!r}>"
