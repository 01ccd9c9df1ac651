"""Which broker processes are alive, and what each one says about itself (docs/cluster.md,
"Leases and fencing").

Every process publishes a heartbeat on ``PREFIX.cluster.alive.ORIGIN`` every
`heartbeat_interval`, and hears everyone else's. A heartbeat carries the process's announcement
(the calls it serves: wireproto.cluster.calls) and, in its headers, the version of what it
speaks and the sequence of its lease key after its latest renewal (wireproto.cluster.lease).

A process heard for the first time is sent a heartbeat at once, so one that has just started
knows the others' announcements as soon as they know its own.

A process is judged by this one's own clock, never by the time it says: it is alive while it has
been heard within a lease, and its lease is over when its lease sequence has not changed for a
whole lease. Both are counted from the later of when it was heard (or its sequence changed) and
when this process last connected to NATS: while this process had no server it could not hear
anyone, so after every reconnect it waits a full lease again before it judges. A process that
stops cleanly says goodbye, and is forgotten at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import task
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from wireproto.cluster.client import NatsClient
from wireproto.cluster.lease import LEASE_VERSION, lease_clock
from wireproto.cluster.subjects import Subjects
from wireproto.codecs.nats import header_values, headers_block

__all__ = ["Roster", "Member"]

log = Logger(namespace="wireproto.cluster")

# The last heartbeat of a process that stops cleanly: forget it at once.
GOODBYE = headers_block({"Wp-Gone": "1"})
VERSION_HEADER = "Wp-Version"
LEASE_HEADER = "Wp-Lease"


class Member:
    """What this process knows of another: when it was last heard, its lease sequence and
    since when that sequence has been the same, and its announcement (by this one's clock)."""

    __slots__ = ("heard", "sequence", "since", "announced", "version")

    def __init__(self, now: float) -> None:
        self.heard = now
        self.sequence = 0
        self.since = now
        self.announced = b""
        self.version = LEASE_VERSION


class Roster:
    """The live processes of the cluster, by origin, and their latest announcements."""

    def __init__(self, client: NatsClient, clock: IReactorTime, subjects: Subjects, *,
                 origin: str, interval: float, lease: float,
                 now: Callable[[], float] = lease_clock) -> None:
        self.client = client
        self.clock = clock
        self.interval = interval
        self.lease = lease
        self.now = now
        # this process, as a subject token (changes when it is fenced)
        self.origin = origin
        self._subject = f"{subjects.cluster}alive."
        self.others: dict[str, Member] = {}
        # Processes known from the bucket or no longer heard, whose leases are still judged.
        self._observed: dict[str, Member] = {}
        self.announcement = b""
        # This process's lease sequence, as its heartbeats say it.
        self.lease_sequence = 0
        # When this process last connected to NATS (None: never yet).
        self.listening_since: float | None = None
        # Called with no argument after each heartbeat this process sends.
        self.on_tick: list[Callable[[], Any]] = []
        # Called with no argument when some process's announcement changes, or it is forgotten.
        self.on_change: list[Callable[[], Any]] = []
        # Called with a process's origin when it is forgotten: it said goodbye, or was silent
        # for a whole lease.
        self.on_gone: list[Callable[[str], object]] = []
        self._loop: task.LoopingCall | None = None
        self._sid: int | None = None

    @property
    def announced(self) -> dict[str, bytes]:
        """Each live process's announcement, by origin."""
        return {origin: member.announced for origin, member in self.others.items()}

    # -- running ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._sid = self.client.subscribe(self._subject + "*", self._heard)
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = self.clock
        self._loop.start(self.interval, now=False)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._sid is not None:
            self.client.unsubscribe(self._sid)
            self._sid = None

    def leave(self, origin: str | None = None) -> None:
        """Tell the others this process (or its former identity `origin`) is gone."""
        if self.client.connected:
            self.client.publish(self._subject + (origin or self.origin), b"",
                                headers=GOODBYE)

    def connected(self) -> None:
        """A NATS server is connected (again): judge no one before a full lease from now, and
        say at once that this process is here."""
        self.listening_since = self.now()
        self._beat()

    def announce(self, announcement: bytes) -> None:
        """What this process's heartbeats say from now on; sent at once."""
        if announcement != self.announcement:
            self.announcement = announcement
            self._beat()

    def renewed(self, sequence: int) -> None:
        """This process's lease was written at `sequence`: tell the others."""
        self.lease_sequence = sequence
        self._beat()

    # -- what is known ----------------------------------------------------------------------------

    def _counted_from(self, moment: float) -> float:
        since = self.listening_since
        return moment if since is None or moment > since else since

    def alive(self, origin: str) -> bool:
        member = self.others.get(origin)
        return member is not None and \
            self.now() - self._counted_from(member.heard) < self.lease

    def members(self) -> list[str]:
        """The other processes heard from within a lease, in the order of their names."""
        return sorted(origin for origin in self.others if self.alive(origin))

    def observe(self, origin: str, sequence: int) -> None:
        """The lease key of `origin` is at `sequence` now (read from the bucket)."""
        member = self.others.get(origin)
        if member is None:
            # Known from the bucket only: not heard, so not a member, but its lease is judged.
            member = self._observed.get(origin)
            if member is None:
                member = self._observed[origin] = Member(self.now())
                member.heard = float("-inf")
        if member.sequence != sequence:
            member.sequence = sequence
            member.since = self.now()

    def lease_over(self, origin: str) -> int | None:
        """The sequence at which `origin`'s lease key has stayed for a whole lease, by this
        process's clock (it may be claimed at that sequence), or None while it may still be
        renewed or it has never been seen."""
        if self.listening_since is None:
            return None
        member = self.others.get(origin) or self._observed.get(origin)
        if member is None:
            return None
        if self.now() - self._counted_from(member.since) < self.lease:
            return None
        return member.sequence

    def forget_lease(self, origin: str) -> None:
        """`origin`'s lease is taken over: stop judging it."""
        self._observed.pop(origin, None)

    def known(self, origin: str) -> bool:
        """Whether this process has heard of `origin`, or judges its lease."""
        return origin in self.others or origin in self._observed

    def judged(self) -> set[str]:
        """The processes no longer heard (or never) whose leases this process still judges."""
        return set(self._observed)

    def judge_only(self, origins: set[str]) -> None:
        """Stop judging the leases of processes no longer heard whose keys are all gone."""
        for origin in [origin for origin in self._observed if origin not in origins]:
            del self._observed[origin]

    # -- heartbeats -------------------------------------------------------------------------------

    def _beat(self) -> None:
        if self.client.connected:
            headers = headers_block({VERSION_HEADER: str(LEASE_VERSION),
                                     LEASE_HEADER: str(self.lease_sequence)})
            self.client.publish(self._subject + self.origin, self.announcement,
                                headers=headers)

    def _heard(self, subject: str, reply: Any, headers: Any, payload: bytes) -> None:
        origin = subject[len(self._subject):]
        if origin == self.origin:
            return
        values = header_values(headers) if headers is not None else {}
        if "Wp-Gone" in values:
            member = self.others.pop(origin, None)
            if member is not None:
                self._gone(origin, member)
            return
        now = self.now()
        member = self.others.get(origin)
        if member is None:
            member = self._observed.pop(origin, None) or Member(now)
            self.others[origin] = member
            # A process just heard: it learns what this one serves (its nydus routes) now,
            # not a heartbeat later, after it has begun to take clients.
            self._beat()
        member.heard = now
        sequence = values.get(LEASE_HEADER, "")
        if sequence.isdigit() and int(sequence) != member.sequence:
            member.sequence = int(sequence)
            member.since = now
        version = values.get(VERSION_HEADER, "")
        # Before versions were said, there was version 1.
        speaks = int(version) if version.isdigit() and len(version) < 6 else 1
        if speaks != member.version:
            if speaks > LEASE_VERSION:
                log.info("cluster: {origin} reads version {speaks} of what processes say to "
                         "each other, this one {mine}: both write version {mine}",
                         event="cluster_version", origin=origin, speaks=speaks,
                         mine=LEASE_VERSION)
            member.version = speaks
        if member.announced != payload:
            member.announced = payload
            self._changed()

    def _tick(self) -> None:
        for listener in tuple(self.on_tick):
            listener()
        self._beat()
        gone = [origin for origin in self.others if not self.alive(origin)]
        for origin in gone:
            member = self.others.pop(origin)
            # Its lease is still judged, from what was last known of it.
            self._observed[origin] = member
            self._gone(origin, member)

    def _gone(self, origin: str, member: Member) -> None:
        if member.announced:
            self._changed()
        for listener in tuple(self.on_gone):
            listener(origin)

    def _changed(self) -> None:
        for listener in tuple(self.on_change):
            listener()

