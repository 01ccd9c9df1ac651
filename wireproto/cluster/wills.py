"""Wills that outlive their process (docs/cluster.md, "Wills").

Each broker process keeps the wills of its connections in a JetStream key-value bucket, one key
per connection (``w.ORIGIN.SESSION``), and says it is alive with its heartbeat
(wireproto.cluster.roster). Every process lists the bucket's keys after each heartbeat; the wills
of an origin that no one has heard from for `dead_after` seconds are published by the
one process that wins its claim (a ``c.ORIGIN`` key written only if it does not exist yet), then
purged. A connection that closes while its process lives publishes its will itself, and its key
is purged, so a will goes out once either way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgpack
from twisted.internet import defer
from twisted.logger import Logger

from wireproto.cluster.client import NatsClient
from wireproto.cluster.jetstream import Bucket
from wireproto.cluster.roster import Roster
from wireproto.cluster.subjects import Subjects, safe_token
from wireproto.codecs.nats import headers_block
from wireproto.hub.message import HubMessage

__all__ = ["WillKeeper"]

log = Logger(namespace="wireproto.cluster")

CLAIM_ONCE = headers_block({"Nats-Expected-Last-Subject-Sequence": "0"})


class WillKeeper:
    """The wills of one process's connections in the cluster's bucket, and the wills of dead
    processes published."""

    def __init__(self, client: NatsClient, roster: Roster, subjects: Subjects, *, origin: str,
                 publish: Callable[[HubMessage], object], replicas: int = 0) -> None:
        self.client = client
        self.roster = roster
        self.bucket = safe_token(subjects.prefix) + "_wills"
        self.stream = f"KV_{self.bucket}"
        # this process, as a subject token
        self.origin = origin
        # publishes a dead process's will in this one
        self.publish = publish
        # The bucket, made and kept with its replicas (wireproto.cluster.jetstream).
        self.store = Bucket(client, self.stream, {
            "subjects": [f"$KV.{self.bucket}.>"], "max_msgs_per_subject": 1, "discard": "new",
            "allow_direct": True, "storage": "file",
        }, replicas=replicas, what="the wills bucket",
            lacking="wills die with their process")
        self.published = 0
        self._scanning = False

    @property
    def available(self) -> bool:
        return self.store.available

    def key(self, session: int) -> str:
        return f"$KV.{self.bucket}.w.{self.origin}.{session}"

    # -- running ----------------------------------------------------------------------------------

    def start(self) -> None:
        self.roster.on_tick.append(self._tick)

    def stop(self) -> None:
        if self._tick in self.roster.on_tick:
            self.roster.on_tick.remove(self._tick)
        self.store.stop()

    def connected(self) -> defer.Deferred[bool]:
        """Make the bucket (if no one has yet) once a server is connected: fires True once it
        is there (JetStream errors are retried meanwhile), False if the connection went first."""
        return self.store.ensure()

    # -- this process's wills ---------------------------------------------------------------------

    def keep(self, session: int, will: HubMessage) -> None:
        value = msgpack.packb([will.topic, will.payload, will.protocol])
        self.client.publish(self.key(session), value)

    def drop(self, session: int) -> None:
        """Forget a will its connection published itself. The key is purged, leaving no
        marker behind, so the bucket holds only the wills of open connections."""
        if not self.client.connected:
            return
        d = self.client.request(
            f"$JS.API.STREAM.PURGE.{self.stream}",
            json.dumps({"filter": self.key(session)}).encode(), timeout=5)
        d.addErrback(lambda failure: log.warn(
            "cluster: could not forget the will of session {session}: {why}",
            event="cluster_wills_failed", session=session, why=failure.getErrorMessage()))

    # -- other processes --------------------------------------------------------------------------

    def _tick(self) -> None:
        if self.available and self.client.connected and not self._scanning:
            self._scanning = True
            d = self._scan()
            d.addErrback(lambda failure: log.warn(
                "cluster: looking for dead processes' wills failed: {why}",
                event="cluster_wills_failed", why=failure.getErrorMessage()))
            d.addBoth(lambda _: setattr(self, "_scanning", False))

    @defer.inlineCallbacks
    def _scan(self) -> Any:
        if not self.roster.listened_long_enough():
            return  # not listening long enough to know who is alive
        _, reply = yield self.client.request(
            f"$JS.API.STREAM.INFO.{self.stream}",
            json.dumps({"subjects_filter": f"$KV.{self.bucket}.w.>"}).encode(), timeout=5)
        subjects = (json.loads(reply).get("state") or {}).get("subjects") or {}
        prefix = f"$KV.{self.bucket}.w."
        origins: dict[str, list[str]] = {}
        for subject in subjects:
            origin = subject[len(prefix):].split(".", 1)[0]
            origins.setdefault(origin, []).append(subject)
        for origin, keys in origins.items():
            if origin == self.origin or self.roster.alive(origin):
                continue
            yield self._take_over(origin, keys)

    @defer.inlineCallbacks
    def _take_over(self, origin: str, keys: list[str]) -> Any:
        _, reply = yield self.client.request(
            f"$KV.{self.bucket}.c.{origin}", self.origin.encode(), timeout=5,
            headers=CLAIM_ONCE)
        if json.loads(reply).get("error"):
            return  # another process claimed it
        published = 0
        for key in keys:
            try:
                headers, value = yield self.client.request(
                    f"$JS.API.DIRECT.GET.{self.stream}",
                    json.dumps({"last_by_subj": key}).encode(), timeout=5)
            except Exception:
                continue
            if not value:
                continue  # purged meanwhile: its connection closed cleanly
            try:
                topic, payload, protocol = msgpack.unpackb(value)
            except (ValueError, TypeError, msgpack.UnpackException):
                continue
            self.publish(HubMessage(topic, payload, will=True, protocol=protocol))
            published += 1
        self.published += published
        yield self.client.request(
            f"$JS.API.STREAM.PURGE.{self.stream}",
            json.dumps({"filter": f"$KV.{self.bucket}.w.{origin}.>"}).encode(), timeout=5)
        log.info("cluster: {origin} is gone; published its {count} wills",
                 event="cluster_wills_taken_over", origin=origin, count=published)
