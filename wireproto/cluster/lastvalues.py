"""Last values shared by every process of a cluster (docs/cluster.md, "Last values").

The process where a publish is made writes its topic's last value to a JetStream key-value
bucket, one key per topic (``v.`` and the topic in unpadded base64url, so any topic is one
token); an empty publish writes a purge marker, as a KV purge does. Every process follows the
bucket with an ephemeral push consumer that first sends the last value of every key, then each
new one, and keeps them in its own hub's `LastValues`. So a subscriber on any process gets a
topic's last value at once, even if its process had no subscriber when it was published. On
each new connection to NATS the consumer is made again, and the values read again; so it is
when the consumer goes silent (its heartbeats stop: it was lost with its NATS node). How the
bucket is made, with its replicas, and JetStream's errors retried: wireproto.cluster.jetstream.

The bucket holds at most [hub] max_retained topics (the oldest go first); each process's own
bounds still apply to what it keeps.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

import msgpack
from twisted.internet import defer, task
from twisted.logger import Logger

from wireproto import peerlog
from wireproto.cluster.client import NatsClient
from wireproto.cluster.jetstream import Bucket, Retrying, jetstream_api
from wireproto.cluster.subjects import Subjects, safe_token
from wireproto.codecs.nats import header_values, headers_block
from wireproto.hub.message import new_message
from wireproto.hub.retained import LastValues
from wireproto.topics import is_pattern

__all__ = ["SharedLastValues", "key_of_topic"]

log = Logger(namespace="wireproto.cluster")

PURGE = headers_block({"KV-Operation": "PURGE", "Nats-Rollup": "sub"})

# The consumer's heartbeat while it has nothing to send, and how long a silence means it is gone.
HEARTBEAT = 2.0
SILENT_AFTER = 3 * HEARTBEAT


def key_of_topic(topic: str) -> str:
    """A topic as a bucket key: one subject token, whatever the topic holds.

    >>> key_of_topic("sensors/temp")
    'v.c2Vuc29ycy90ZW1w'
    """
    encoded = base64.urlsafe_b64encode(topic.encode("utf-8", "surrogatepass"))
    return "v." + encoded.rstrip(b"=").decode("ascii")


def topic_of_key(key: str) -> str:
    encoded = key[2:]
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode(
        "utf-8", "surrogatepass")


class SharedLastValues:
    """One process's side of the cluster's last values."""

    def __init__(self, client: NatsClient, subjects: Subjects,
                 retained: LastValues | None, *, replicas: int = 0) -> None:
        self.client = client
        # the hub's last values, which this process's share of the cluster's are kept in
        self.retained = retained
        self.bucket = safe_token(subjects.prefix) + "_retained"
        self.stream = f"KV_{self.bucket}"
        # The bucket, made and kept with its replicas (wireproto.cluster.jetstream); none
        # without [hub] retain.
        self.store: Bucket | None = None
        if retained is not None:
            self.store = Bucket(client, self.stream, {
                "subjects": [f"$KV.{self.bucket}.>"], "max_msgs_per_subject": 1,
                "max_msgs": retained.max_topics, "max_bytes": 2 * retained.max_bytes,
                "discard": "old", "allow_direct": True, "allow_rollup_hdrs": True,
                "deny_delete": True, "storage": "file",
            }, replicas=replicas, what="the last-values bucket",
                lacking="each process keeps the last values of the publishes it sees")
        self.following = Retrying(client, f"the last-values consumer ({self.stream})")
        self.written = self.read = self.refused = 0
        # Of those refused, the values on patterns (counted in the cluster's refused too).
        self.on_patterns = 0
        # Times the consumer went silent and was made again.
        self.refollowed = 0
        self._sid: int | None = None
        self._inbox: str | None = None
        self._heard = False
        self._watch: Any = None
        # Keys of values on patterns logged already: the consumer sends them again each time
        # it is made, and each is logged once.
        self._ignored: set[str] = set()
        # The latest value of each topic published while the bucket could not be written
        # (before this process reached the cluster, or while NATS was away), written once it
        # can be: at most [hub] max_retained topics, the oldest dropped first.
        self._unshared: dict[str, tuple[bytes, str, dict]] = {}

    @property
    def available(self) -> bool:
        """The bucket is there to write to, on the NATS connection there is now."""
        return self.store is not None and self.store.available

    def subject(self, topic: str) -> str:
        return f"$KV.{self.bucket}.{key_of_topic(topic)}"

    # -- running ----------------------------------------------------------------------------------

    @defer.inlineCallbacks
    def connected(self) -> Any:
        """Make the bucket (if no one has yet), then follow it; JetStream errors are retried
        for as long as this connection lasts."""
        if self.store is None:
            return
        self.following.stop()
        if (yield self.store.ensure()):
            self._share_what_waited()
            self.following.run(self._follow)

    @defer.inlineCallbacks
    def _follow(self) -> Any:
        """An ephemeral push consumer: every key's last value, then each new one. It sends a
        heartbeat when it has nothing to send, so a consumer lost with its NATS node (it has
        one replica) is noticed and made again."""
        self._unfollow()
        self._inbox = f"_INBOX.{secrets.token_hex(8)}"
        self._sid = self.client.subscribe(self._inbox, self._received)
        config = {
            "deliver_subject": self._inbox, "deliver_policy": "last_per_subject",
            "ack_policy": "none", "filter_subject": f"$KV.{self.bucket}.>",
            "mem_storage": True, "num_replicas": 1, "inactive_threshold": 10_000_000_000,
            "idle_heartbeat": int(HEARTBEAT * 1e9),
        }
        yield jetstream_api(self.client, f"CONSUMER.CREATE.{self.stream}",
                            {"stream_name": self.stream, "config": config})
        self._heard = True
        self._watch = task.LoopingCall(self._check, self.client.connection)
        self._watch.clock = self.client.reactor
        self._watch.start(SILENT_AFTER, now=False)

    def _check(self, connection: object) -> None:
        """Every SILENT_AFTER seconds: the consumer said something, or it is made again."""
        if self.client.connection is not connection:
            self._stop_watching()  # the next connection follows the bucket afresh
        elif not self._heard:
            self.refollowed += 1
            log.warn("cluster: the last-values consumer ({stream}) sent nothing for {seconds:g} "
                     "s, not even a heartbeat; following the bucket again",
                     event="cluster_jetstream_consumer_lost", stream=self.stream,
                     seconds=SILENT_AFTER)
            self.following.run(self._follow)
        self._heard = False

    def _stop_watching(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None and watch.running:
            watch.stop()

    def _unfollow(self) -> None:
        self._stop_watching()
        if self._sid is not None:
            self.client.unsubscribe(self._sid)
            self._sid = None

    def stop(self) -> None:
        self.following.stop()
        if self.store is not None:
            self.store.stop()
        self._unfollow()

    # -- writing ----------------------------------------------------------------------------------

    def put(self, topic: str, payload: bytes, protocol: str, encodings: dict) -> None:
        """`payload` is `topic`'s last value now (empty: it has none), as published here."""
        if not self.available:
            if self.retained is not None:
                self._unshared.pop(topic, None)
                if len(self._unshared) >= self.retained.max_topics:
                    self._unshared.pop(next(iter(self._unshared)))
                self._unshared[topic] = (payload, protocol, encodings)
            return
        if not payload:
            self.client.publish(self.subject(topic), b"", headers=PURGE)
        else:
            carried = [[str(wire_format), data, binary]
                       for wire_format, (data, binary) in encodings.items()]
            self.client.publish(self.subject(topic),
                                msgpack.packb([topic, payload, protocol, carried]))
        self.written += 1

    def _share_what_waited(self) -> None:
        waited, self._unshared = self._unshared, {}
        for topic, (payload, protocol, encodings) in waited.items():
            self.put(topic, payload, protocol, encodings)

    # -- reading ----------------------------------------------------------------------------------

    def _received(self, subject: str, reply: str | None, headers: bytes | None,
                  payload: bytes) -> None:
        self._heard = True
        retained = self.retained
        if retained is None:
            return
        if headers is not None and not payload:
            status = headers.split(b"\r\n", 1)[0]
            if status.startswith(b"NATS/1.0 1"):
                return  # a heartbeat or flow control, not a value
            if header_values(headers).get("KV-Operation") in ("PURGE", "DEL"):
                try:
                    topic = topic_of_key(subject[len(self.bucket) + 5:])
                except (ValueError, UnicodeDecodeError):
                    self.refused += 1
                    return
                retained.keep(new_message(topic, b"", False, None, ""), {})
                return
        try:
            topic, value, protocol, carried = msgpack.unpackb(payload)
            encodings = {str(name): (bytes(data), bool(binary))
                         for name, data, binary in carried}
        except (ValueError, TypeError, msgpack.UnpackException):
            self.refused += 1
            return
        if not isinstance(topic, str) or not isinstance(value, bytes) or not value:
            self.refused += 1
            return
        if subject != self.subject(topic):
            self.refused += 1
            return
        if is_pattern(topic):  # a NATS client's that is no broker, or an older version's
            self.refused += 1
            self.on_patterns += 1
            if subject not in self._ignored and len(self._ignored) < 4096:
                self._ignored.add(subject)
                peerlog.warn(log, "nats", "cluster: ignored a last value on {subject!r}: {why}",
                             event="cluster_refused", subject=subject,
                             why=f"{topic[:100]!r} is a pattern, where nothing is published")
            return
        if not retained.wants(topic):
            self.refused += 1
            return
        self.read += 1
        retained.keep(new_message(topic, value, False, None, str(protocol or "")), encodings)
