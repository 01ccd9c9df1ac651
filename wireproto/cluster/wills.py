"""Wills that outlive their process (docs/cluster.md, "Wills", and "Leases and fencing").

Each broker process keeps the wills of its connections in a JetStream key-value bucket, one key
per connection (``w.ORIGIN.SESSION``), beside its lease (``l.ORIGIN``, wireproto.cluster.lease).
A connection that closes while its process lives publishes its will itself, and its key is
purged.

Every process lists the bucket's lease keys every heartbeat (and its will keys every half
lease, for wills left without a lease). A process whose lease key has stayed at one sequence
for a whole lease, by this process's clock (wireproto.cluster.roster), is over: this process
claims its lease key by writing it on the condition that it is still at that sequence. The one
claim that wins publishes each of its wills, then purges that will's key (so a claimer that dies
halfway leaves only the wills it has not published for the next claim), then removes the lease
key. A claim that loses learns the key's new sequence: a renewal, or another claim.

A process that finds its own lease lost is fenced (wireproto.cluster.link): the wills it held
under that identity are `abandon`ed, and the connections they belong to are closed without
publishing them, since the claim publishes them; it claims its former identity at once itself,
so they go out without waiting for anyone's clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgpack
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto import peerlog
from wireproto.cluster.client import NatsClient
from wireproto.cluster.connection import NatsUnavailable
from wireproto.cluster.jetstream import Bucket
from wireproto.cluster.lease import (
    WRONG_LAST_SEQUENCE,
    JetStreamRefused,
    last_message,
    lease_record,
    write_if_at,
)
from wireproto.cluster.roster import Roster
from wireproto.cluster.subjects import Subjects, safe_token
from wireproto.errors import InvalidTopic
from wireproto.hub.message import HubMessage

__all__ = ["WillKeeper", "HeldWill"]

log = Logger(namespace="wireproto.cluster")

TIMEOUT = 5.0


class HeldWill:
    """A will this process keeps in the bucket for one of its connections: under which of its
    identities, and whether the bucket has it (True), has not (False), or may (None: written,
    not yet acknowledged)."""

    __slots__ = ("origin", "will", "stored", "retry", "landing")

    def __init__(self, origin: str, will: HubMessage) -> None:
        self.origin = origin
        self.will = will
        self.stored: bool | None = False
        # To be written again: the last try failed, or found no bucket.
        self.retry = False
        self.landing: defer.Deferred | None = None


class WillKeeper:
    """The wills of one process's connections in the cluster's bucket, and the wills of
    processes whose leases are over published."""

    def __init__(self, client: NatsClient, roster: Roster, subjects: Subjects, *, origin: str,
                 node: str, lease: float, publish: Callable[[HubMessage], object],
                 replicas: int = 0) -> None:
        self.client = client
        self.roster = roster
        self.bucket = safe_token(subjects.prefix) + "_wills"
        self.stream = f"KV_{self.bucket}"
        # this process, as a subject token (changes when it is fenced)
        self.origin = origin
        self.node = node
        self.lease = lease
        # publishes a dead process's will in this one
        self.publish = publish
        # The bucket, made and kept with its replicas (wireproto.cluster.jetstream).
        self.store = Bucket(client, self.stream, {
            "subjects": [f"$KV.{self.bucket}.>"], "max_msgs_per_subject": 1, "discard": "new",
            "allow_direct": True, "storage": "file",
        }, replicas=replicas, what="the wills bucket",
            lacking="wills die with their process")
        self.published = 0
        # Wills taken over that the hub refused (on a pattern, kept by an older version).
        self.refused = 0
        # session -> its will
        self.held: dict[int, HeldWill] = {}
        # This process's former identities, given up when it was fenced, and the sequence their
        # lease keys were at: claimed at once.
        self.abandoned: dict[str, int] = {}
        # Keys of wills published here whose purge has not been done yet.
        self._unforgotten: set[str] = set()
        self._scanning = False
        self._ticks = 0
        self._stopped = False

    @property
    def available(self) -> bool:
        return self.store.available

    def key(self, session: int, origin: str | None = None) -> str:
        return f"$KV.{self.bucket}.w.{origin or self.origin}.{session}"

    # -- running ----------------------------------------------------------------------------------

    def start(self) -> None:
        self.roster.on_tick.append(self._tick)

    def stop(self) -> None:
        self._stopped = True
        if self._tick in self.roster.on_tick:
            self.roster.on_tick.remove(self._tick)
        self.store.stop()

    def connected(self) -> defer.Deferred[bool]:
        """Make the bucket (if no one has yet) once a server is connected, then write every
        will held here again (the server may be a new one, or have lost them). Fires True once
        the bucket is there (JetStream errors are retried meanwhile), False if the connection
        went first."""
        return self.store.ensure().addCallback(self._bucket_there)

    def _bucket_there(self, there: bool) -> bool:
        if there:
            for session, held in self.held.items():
                if held.origin == self.origin:
                    self._store(session, held)
            for key in list(self._unforgotten):
                self._forget(key)
        return there

    # -- this process's wills ---------------------------------------------------------------------

    def keep(self, session: int, will: HubMessage) -> None:
        held = self.held[session] = HeldWill(self.origin, will)
        self._store(session, held)

    def _store(self, session: int, held: HeldWill) -> None:
        # A will written again after a failure is not logged again each time it fails.
        again = held.retry
        held.retry = False
        if not (self.available and self.client.connected):
            # Written once the bucket is there again (every heartbeat tries).
            held.stored = False
            held.retry = True
            return
        will = held.will
        held.stored = None
        d = self.client.request(self.key(session, held.origin),
                                msgpack.packb([will.topic, will.payload, will.protocol]),
                                timeout=TIMEOUT)

        def landed(reply: tuple[bytes | None, bytes]) -> None:
            error = json.loads(reply[1]).get("error")
            if error:
                held.stored = False
                held.retry = True
                log.warn("cluster: the bucket refused the will of session {session}: {why}; "
                         "trying again", event="cluster_wills_failed", session=session,
                         why=error.get("description"))
            else:
                held.stored = True

        def lost(failure: Failure) -> None:
            # It may have landed (a timeout) or not (no responders while the bucket elects a
            # leader): unknown, and written again at the next heartbeat, which costs nothing
            # if it had.
            held.retry = True
            if not again:
                log.warn("cluster: could not keep the will of session {session}: {why}; "
                         "trying again at each heartbeat", event="cluster_wills_failed",
                         session=session, why=failure.getErrorMessage())

        held.landing = d.addCallbacks(landed, lost)

    def drop(self, session: int) -> bool:
        """Session `session` is closing: whether this process is to publish its will. Not when
        it was kept under an identity this process gave up, since whoever claims that identity
        publishes it; else its key is purged, leaving no marker behind (once NATS is there, if
        it is not now: the will is published here, and must not be again by a claim)."""
        held = self.held.pop(session, None)
        if held is None:
            return True
        if held.origin != self.origin:
            return False
        # Purged whatever is known of it: an earlier will of the same connection may be there.
        key = self.key(session)
        if held.landing is not None and not held.landing.called:
            held.landing.addBoth(lambda _: self._forget(key))
        else:
            self._forget(key)
        return True

    def _forget(self, key: str) -> None:
        self._unforgotten.add(key)
        if not (self.available and self.client.connected):
            return  # purged at the next heartbeat with the bucket there
        d = self._purge(key)

        def purged(_: object) -> None:
            self._unforgotten.discard(key)

        d.addCallbacks(purged, lambda failure: log.warn(
            "cluster: could not forget the will {key}: {why}; trying again",
            event="cluster_wills_failed", key=key, why=failure.getErrorMessage()))

    def _catch_up(self) -> None:
        """Write the wills, and purge the keys, that could not be written or purged before."""
        for session, held in list(self.held.items()):
            if held.retry and held.origin == self.origin and \
                    (held.landing is None or held.landing.called):
                self._store(session, held)
        for key in list(self._unforgotten):
            self._forget(key)

    def abandon(self, sequence: int) -> list[int]:
        """This process gives up its identity, whose lease key was last at `sequence`: the
        sessions whose wills the bucket has or may have under it, which the claim of that
        identity will publish. The caller gives this keeper its new identity next."""
        self.abandoned[self.origin] = sequence
        return [session for session, held in self.held.items()
                if held.origin == self.origin and held.stored is not False]

    def took_identity(self, origin: str) -> None:
        """This process is `origin` from now on: the wills never stored under its former
        identity are kept under this one."""
        self.origin = origin
        for session, held in list(self.held.items()):
            if held.origin != origin and held.stored is False:
                self.keep(session, held.will)

    # -- other processes --------------------------------------------------------------------------

    def _tick(self) -> None:
        if self.available and self.client.connected:
            self._catch_up()
        if self.available and self.client.connected and not self._scanning:
            self._scanning = True
            self._ticks += 1
            every = max(1, round(self.lease / 2 / max(self.roster.interval, 0.01)))
            d = self._scan(orphans=self._ticks % every == 1 or every == 1)
            d.addErrback(self._scan_failed)
            d.addBoth(lambda _: setattr(self, "_scanning", False))

    def _scan_failed(self, failure: Failure) -> None:
        # A scan cut short by this process's stop, or by the connection's loss (which the
        # client reports once, and reconnects from), is no failure of its own.
        if self._stopped or (failure.check(NatsUnavailable) and not self.client.connected):
            return
        log.warn("cluster: looking for processes whose lease is over failed: {why}",
                 event="cluster_wills_failed", why=failure.getErrorMessage())

    def _subjects(self, pattern: str) -> defer.Deferred[list[str]]:
        d: defer.Deferred[tuple[bytes | None, bytes]] = self.client.request(
            f"$JS.API.STREAM.INFO.{self.stream}",
            json.dumps({"subjects_filter": f"$KV.{self.bucket}.{pattern}"}).encode(),
            timeout=TIMEOUT)
        return d.addCallback(
            lambda reply: list((json.loads(reply[1]).get("state") or {}).get("subjects") or {}))

    @defer.inlineCallbacks
    def _scan(self, *, orphans: bool) -> Any:
        leases = yield self._subjects("l.>")
        start = len(f"$KV.{self.bucket}.l.")
        origins = {subject[start:] for subject in leases}
        if orphans:
            wills = yield self._subjects("w.>")
            start = len(f"$KV.{self.bucket}.w.")
            origins.update(subject[start:].split(".", 1)[0] for subject in wills)
        else:
            origins.update(self.roster.judged())
        origins.discard(self.origin)
        origins.update(self.abandoned)
        self.roster.judge_only(origins)
        for origin in sorted(origins):
            if origin in self.abandoned:
                yield self._claim(origin, self.abandoned[origin])
                continue
            sequence = self.roster.lease_over(origin)
            if sequence is not None:
                yield self._claim(origin, sequence)
            elif not self.roster.known(origin):
                # Never heard: its lease is judged from now, at the sequence it has.
                found, _ = yield last_message(self.client, self.stream, self._lease_key(origin),
                                              timeout=TIMEOUT)
                self.roster.observe(origin, found)

    def _lease_key(self, origin: str) -> str:
        return f"$KV.{self.bucket}.l.{origin}"

    @defer.inlineCallbacks
    def _claim(self, origin: str, sequence: int) -> Any:
        record = lease_record(self.origin, self.node, self.lease, takes=origin)
        # A claim is kept from when it was sent, as a lease is: another process counts from
        # when it saw it, which is later.
        renewed = self.roster.now()
        try:
            claim = yield write_if_at(self.client, self._lease_key(origin), record, sequence,
                                      timeout=TIMEOUT)
        except JetStreamRefused as refused:
            if refused.code != WRONG_LAST_SEQUENCE:
                raise
            # Renewed, or claimed by another process: judged again from its new sequence.
            self.abandoned.pop(origin, None)
            found, _ = yield last_message(self.client, self.stream, self._lease_key(origin),
                                          timeout=TIMEOUT)
            self.roster.observe(origin, found)
            return
        # One of this process's former identities: the wills it published itself while NATS
        # was away are not published again.
        own = self.abandoned.pop(origin, None) is not None
        self.roster.forget_lease(origin)
        keys = yield self._subjects(f"w.{origin}.>")
        published = 0
        for key in keys:
            at, value = yield last_message(self.client, self.stream, key, timeout=TIMEOUT)
            try:
                topic, payload, protocol = msgpack.unpackb(value) if value else (None,) * 3
            except (ValueError, TypeError, msgpack.UnpackException):
                topic = None
            # Renewed once a heartbeat has passed, and again until a renewal is answered
            # within half a lease of being sent (so this process was not paused while it
            # waited for the answer, which another claim may have come before).
            due = self.roster.interval
            while self.roster.now() - renewed >= due:
                due = self.lease / 2
                sent = self.roster.now()
                # A long takeover keeps its claim, as a lease is kept, and checks it holds just
                # before a will goes out (this process may have been paused meanwhile): no
                # other process can claim it again, and publish the same wills, while it does.
                try:
                    claim = yield write_if_at(self.client, self._lease_key(origin), record,
                                              claim, timeout=TIMEOUT)
                except JetStreamRefused as refused:
                    if refused.code != WRONG_LAST_SEQUENCE:
                        raise
                    log.warn("cluster: another process took over the wills of {origin} from "
                             "this one, after {count} of them", event="cluster_wills_taken_over",
                             origin=origin, count=published)
                    self.published += published
                    return
                renewed = sent
            if own and key in self._unforgotten:
                topic = None
            if isinstance(topic, str) and isinstance(payload, bytes):
                # Each will is taken by an empty value written on the condition that the key is
                # still at the will: of two claims that both read it (one paused while another
                # claimed again), one alone writes it, and one alone publishes the will.
                try:
                    yield write_if_at(self.client, key, b"", at, timeout=TIMEOUT)
                except JetStreamRefused as refused:
                    if refused.code != WRONG_LAST_SEQUENCE:
                        raise
                    topic = None
            if isinstance(topic, str) and isinstance(payload, bytes):
                try:
                    self.publish(HubMessage(topic, payload, will=True,
                                            protocol=str(protocol or "")))
                    published += 1
                except InvalidTopic as error:
                    # Kept by an older version (a will on tt/#, say): the hub refuses it, and
                    # the origin's other wills still go out.
                    self.refused += 1
                    peerlog.warn(log, "nats", "cluster: ignored a will on {subject!r}: {why}",
                                 event="cluster_refused", subject=key, why=str(error))
            yield self._purge(key)
            self._unforgotten.discard(key)
        self.published += published
        yield self._purge(self._lease_key(origin))
        log.info("cluster: the lease of {origin} is over; published its {count} wills",
                 event="cluster_wills_taken_over", origin=origin, count=published)

    def _purge(self, subject: str) -> defer.Deferred:
        return self.client.request(f"$JS.API.STREAM.PURGE.{self.stream}",
                                   json.dumps({"filter": subject}).encode(), timeout=TIMEOUT)
