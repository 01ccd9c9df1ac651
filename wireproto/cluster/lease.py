"""This process's lease: what makes it a live member of its cluster (docs/cluster.md, "Leases
and fencing").

A broker process holds a lease while it keeps rewriting one key of the wills bucket,
``l.ORIGIN``, every heartbeat_interval, each write on the condition that the key is still at the
sequence its previous write left (JetStream's ``Nats-Expected-Last-Subject-Sequence``). Another
process that has seen the same sequence for a whole lease claims the key on the same condition
(wireproto.cluster.wills); exactly one of the two writes can win. So a lease is over for
everyone at once: a claim that wins means no renewal can, and a renewal that wins means the
claim fails.

The holder also judges by its own clock, so that it gives its lease up before anyone can have
claimed it: it counts the lease from when it *sent* its last acknowledged renewal, while the
others count from when they saw that renewal, which is later, and it keeps a margin for clocks
that run at slightly different rates. The clock is `lease_clock`: it counts a suspended machine's
time too, which the monotonic clock does not.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Callable

import msgpack
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.cluster.client import NatsClient
from wireproto.codecs.nats import headers_block

__all__ = [
    "LEASE_VERSION",
    "WRONG_LAST_SEQUENCE",
    "JetStreamRefused",
    "Lease",
    "lease_clock",
    "lease_record",
    "read_record",
    "write_if_at",
]

log = Logger(namespace="wireproto.cluster")

# The version of the lease record (and of the heartbeat headers that carry its sequence).
LEASE_VERSION = 1
# JetStream's error code for a conditional write whose subject is not at the sequence expected.
WRONG_LAST_SEQUENCE = 10071
# JetStream's error code for a subject with no message.
NO_MESSAGE = 10037


def lease_clock() -> float:
    """Seconds from an arbitrary start that never go back, and that go on while the machine is
    suspended (CLOCK_BOOTTIME on Linux; the monotonic clock elsewhere)."""
    return time.clock_gettime(BOOTTIME) if BOOTTIME is not None else time.monotonic()


BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)


class JetStreamRefused(Exception):
    """JetStream refused a write: its error code and description."""

    def __init__(self, code: int, description: str) -> None:
        super().__init__(f"{description} (JetStream error {code})")
        self.code = code
        self.description = description


def lease_record(holder: str, node: str, duration: float, *, takes: str | None = None) -> bytes:
    """What a lease key holds: its version, who holds it, and, for a claim, whose lease the
    holder took over."""
    record: dict[str, object] = {"v": LEASE_VERSION, "holder": holder, "node": node,
                              "lease": duration}
    if takes is not None:
        record["takes"] = takes
    return msgpack.packb(record)


def read_record(value: bytes) -> dict[str, object] | None:
    """A lease key's record, or None if it is not one this version reads."""
    try:
        record = msgpack.unpackb(value)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("v"), int):
        return None
    return record


def write_if_at(client: NatsClient, subject: str, value: bytes, sequence: int, *,
                timeout: float) -> defer.Deferred[int]:
    """Write `value` on `subject` of a JetStream stream if the subject's last message is at
    `sequence` (0: it has none); fires with the new sequence, or fails with JetStreamRefused (a
    `WRONG_LAST_SEQUENCE` code when it is not), or the request's own errors."""
    d: defer.Deferred[tuple[bytes | None, bytes]] = client.request(
        subject, value, timeout=timeout,
        headers=headers_block({"Nats-Expected-Last-Subject-Sequence": str(sequence)}))
    return d.addCallback(_acknowledged)


def _acknowledged(reply: tuple[bytes | None, bytes]) -> int:
    answer = json.loads(reply[1])
    error = answer.get("error")
    if error:
        raise JetStreamRefused(int(error.get("err_code") or 0), str(error.get("description")))
    return int(answer["seq"])


def last_message(client: NatsClient, stream: str, subject: str, *,
                 timeout: float) -> defer.Deferred[tuple[int, bytes]]:
    """The last message on `subject` of `stream` as ``(sequence, value)``, or ``(0, b"")`` when
    the subject has none. Read through the stream's leader, never a replica that may lag (or be
    paused, and never answer)."""
    d: defer.Deferred[tuple[bytes | None, bytes]] = client.request(
        f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps({"last_by_subj": subject}).encode(),
        timeout=timeout)
    return d.addCallback(_found)


def _found(reply: tuple[bytes | None, bytes]) -> tuple[int, bytes]:
    answer = json.loads(reply[1])
    error = answer.get("error")
    if error:
        if error.get("err_code") == NO_MESSAGE:
            return 0, b""
        raise JetStreamRefused(int(error.get("err_code") or 0), str(error.get("description")))
    message = answer.get("message") or {}
    return int(message.get("seq") or 0), base64.b64decode(message.get("data") or "")


def bucket_epoch(client: NatsClient, stream: str, bucket: str, *,
                 timeout: float) -> defer.Deferred[bytes]:
    """The bucket's epoch: a random value written once, by whoever first finds the bucket
    without one. A bucket whose store was lost (a NATS server started again without its
    JetStream data) has a new epoch, which tells a lease key gone with the store from one that a
    claim removed."""
    subject = f"$KV.{bucket}.e"

    def written(result: tuple[int, bytes]) -> defer.Deferred[bytes] | bytes:
        sequence, value = result
        if sequence:
            return value
        fresh = secrets.token_hex(8).encode()
        d = write_if_at(client, subject, fresh, 0, timeout=timeout)
        # Another process wrote one first: that one is the epoch.
        return d.addCallbacks(lambda _: fresh, lambda _: last_message(
            client, stream, subject, timeout=timeout).addCallback(lambda found: found[1]))

    return last_message(client, stream, subject, timeout=timeout).addCallback(written)


class Lease:
    """This process's lease under one identity (`holder`, its origin as a subject token).

    `renew()` is called every heartbeat interval; `expired()` says whether this process must
    take its lease as lost (it was refused, or by its own clock it may have run out), and
    `on_lost(why)` is called once when a renewal is refused."""

    def __init__(self, client: NatsClient, *, bucket: str, stream: str, holder: str, node: str,
                 duration: float, now: Callable[[], float] = lease_clock) -> None:
        self.client = client
        self.stream = stream
        self.subject = f"$KV.{bucket}.l.{holder}"
        self.holder = holder
        self.duration = duration
        # Kept off the end of the lease: for clocks that run at slightly different rates (a
        # few parts in a million, on machines whose clocks are kept), and for the moments
        # between a look at the clock and what is done on it.
        self.margin = max(0.02 * duration, 0.05)
        self.now = now
        self.bucket = bucket
        self.record = lease_record(holder, node, duration)
        # The key's sequence after this process's last acknowledged write (0: none yet), and
        # the epoch of the bucket it was written in.
        self.sequence = 0
        self.epoch: bytes | None = None
        # In force once the bucket is there: before, no one can claim it.
        self.in_force = False
        self.valid_until = float("inf")
        self.lost: str | None = None
        self.on_lost: Callable[[str], object] | None = None
        self.on_renewed: Callable[[int], object] | None = None
        self._renewing = False
        self.failures = 0

    def start(self) -> None:
        """The bucket is there: the lease is in force, and runs from now (no one can have
        judged this identity before it could be written)."""
        if not self.in_force:
            self.in_force = True
            self.valid_until = self.now() + self.duration - self.margin

    def expired(self) -> bool:
        return self.lost is not None or self.now() >= self.valid_until

    def renew(self) -> None:
        """Write the lease again, if no write is on its way already."""
        if self._renewing or self.lost is not None or not self.in_force \
                or not self.client.connected:
            return
        self._renewing = True
        sent = self.now()
        if self.epoch is None:
            d = bucket_epoch(self.client, self.stream, self.bucket, timeout=self._timeout)
            written = d.addCallback(self._write_in, sent)
        else:
            written = self._write_in(self.epoch, sent)
        written.addErrback(self._refused)
        written.addBoth(self._done)

    @property
    def _timeout(self) -> float:
        return max(self.duration / 4, 0.5)

    def _write_in(self, epoch: bytes, sent: float) -> defer.Deferred[None]:
        self.epoch = epoch
        d = write_if_at(self.client, self.subject, self.record, self.sequence,
                        timeout=self._timeout)
        return d.addCallback(self._renewed, sent)

    def _done(self, _: object) -> None:
        self._renewing = False

    def _renewed(self, sequence: int, sent: float) -> None:
        self.sequence = sequence
        self.failures = 0
        if self.lost is None:
            self.valid_until = max(self.valid_until, sent + self.duration - self.margin)
            if self.on_renewed is not None:
                self.on_renewed(sequence)

    def _refused(self, failure: Failure) -> defer.Deferred[None] | None:
        error = failure.value
        if isinstance(error, JetStreamRefused) and error.code == WRONG_LAST_SEQUENCE:
            # Maybe a write of ours whose acknowledgement was lost: the key is still ours then.
            d = last_message(self.client, self.stream, self.subject, timeout=self._timeout)
            # If it cannot be read, it is asked again at the next renewal.
            return d.addCallbacks(self._judge_refusal, lambda _: None)
        if self.lost is not None or not self.in_force:
            return None  # released as this process stops (its connection closing): no news
        self.failures += 1
        if self.failures in (1, 10) or self.failures % 100 == 0:
            log.warn("cluster: could not renew this process's lease ({why}); it is valid "
                     "for {left:.1f} s more", event="cluster_lease_unrenewed",
                     why=failure.getErrorMessage(), left=max(self.valid_until - self.now(), 0))
        return None

    def _judge_refusal(self, found: tuple[int, bytes]) -> defer.Deferred[None] | None:
        sequence, value = found
        if not sequence:
            # Gone: removed by a claim that is over, or with the bucket's whole store.
            d = bucket_epoch(self.client, self.stream, self.bucket, timeout=self._timeout)
            return d.addCallbacks(self._judge_gone, lambda _: None)
        record = read_record(value)
        if record is not None and record.get("holder") == self.holder and "takes" not in record:
            self.sequence = sequence
            return None
        self._lose("another process took its lease over")
        return None

    def _judge_gone(self, epoch: bytes) -> None:
        if epoch == self.epoch:
            self._lose("its lease was taken over and removed")
            return
        # A new bucket: nothing of this process's was there to claim. Its lease is written
        # afresh (and its wills are, as on every reconnect).
        log.info("cluster: the wills bucket is new (its store was lost); this process's lease "
                 "is written again", event="cluster_bucket_new")
        self.epoch = epoch
        self.sequence = 0

    def _lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            if self.on_lost is not None:
                self.on_lost(why)

    def release(self) -> defer.Deferred[None]:
        """Remove the lease key as this process stops: its connections have published their
        own wills, and the others need not wait for the lease to run out."""
        self.in_force = False  # not renewed any more
        if self.lost is not None or not self.sequence or not self.client.connected:
            return defer.succeed(None)
        self.lost = "released"
        d = self.client.request(f"$JS.API.STREAM.PURGE.{self.stream}",
                                json.dumps({"filter": self.subject}).encode(), timeout=2)
        # Not removed: the others claim it when it runs out.
        return d.addCallbacks(lambda _: None, lambda _: None)
