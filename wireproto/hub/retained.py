"""Last values: the latest message on each topic that a `[hub] retain` pattern matches, for
subscribers that come later (docs/hub.md, "Last values").

As MQTT's retained messages: a new subscriber of a topic, or of a pattern that matches it, gets
its last value at once, in its own protocol's form; a publish with an empty payload clears it.
What is kept is bounded, in topics and in bytes. Past either bound a new value is refused and the
topic's old one is dropped too, so no subscriber gets a value older than the last publish.

A pattern's values are found through a tree of the kept topics (`wireproto.topics.TopicTree`),
walking only the branches the pattern can match, and given oldest kept first. The nodes each walk
examines are counted (`examined`), for the bound on what one connection's subscribes may cost
([hub] retained_examined_per_second, enforced by wireproto.limits).

With a `path`, last values are kept in a sqlite file too, and read back when the broker starts
again. Changes are written by `flush` (the service calls it every second and when it stops), a
topic's latest state once, so a busy topic costs one row write a second, not one per publish.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
from collections.abc import Iterable

import msgpack
from twisted.logger import Logger

from wireproto.hub.message import DEFAULT_MAX_RETAINED, DEFAULT_MAX_RETAINED_BYTES, HubMessage
from wireproto.topics import PatternTree, TopicTree, is_pattern, validate_pattern

__all__ = ["LastValues"]

log = Logger(namespace="wireproto.hub")

_DECISIONS = 4096


class LastValues:
    """The kept messages by topic, with what they cost: `bytes` (topic, payload and carried
    encodings), `refused` (values not kept for the bounds), `cleared` (empty publishes) and
    `examined` (the nodes of the kept topics' tree that patterns' walks visited)."""

    def __init__(self, patterns: Iterable[str], *, max_topics: int = DEFAULT_MAX_RETAINED,
                 max_bytes: int = DEFAULT_MAX_RETAINED_BYTES,
                 path: str | os.PathLike | None = None, mode: int = 0o600) -> None:
        self.patterns = tuple(patterns)
        self._tree: PatternTree[str] = PatternTree()
        for pattern in self.patterns:
            validate_pattern(pattern)
            self._tree.add(pattern, pattern)
        self.max_topics = max_topics
        self.max_bytes = max_bytes
        # topic -> (message, encodings in portable formats, its size, when it was kept), oldest
        # kept first
        self._values: dict[str, tuple[HubMessage, dict, int, int]] = {}
        self._kept_order = itertools.count()
        # The same topics by level, for the patterns' walks.
        self._topics = TopicTree()
        self._wanted: dict[str, bool] = {}
        self.bytes = 0
        self.refused = 0
        self.cleared = 0
        self.examined = 0
        # Topics changed since the last flush, when values are kept in a file.
        self._dirty: set[str] = set()
        self._db: sqlite3.Connection | None = None
        if path is not None:
            self._open(path, mode)

    def add_pattern(self, pattern: str) -> None:
        """Keep the last values of the topics `pattern` matches too, from now on, within the
        same bounds."""
        if pattern in self.patterns:
            return
        validate_pattern(pattern)
        self._tree.add(pattern, pattern)
        self.patterns += (pattern,)
        self._wanted.clear()

    def _open(self, path: str | os.PathLike, mode: int) -> None:
        # Its directory, made if missing, is its owner's alone, as the file is.
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
        # sqlite gives its -wal and -shm files the database file's permissions.
        os.close(os.open(os.fspath(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode))
        os.chmod(path, mode)
        db = sqlite3.connect(os.fspath(path), isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE IF NOT EXISTS last_values (topic TEXT PRIMARY KEY, "
                   "payload BLOB NOT NULL, protocol TEXT NOT NULL, encodings BLOB NOT NULL) "
                   "WITHOUT ROWID")
        forget = set()
        on_patterns = 0
        for topic, payload, protocol, packed in db.execute(
                "SELECT topic, payload, protocol, encodings FROM last_values").fetchall():
            try:
                encodings = {name: (bytes(data), bool(binary))
                             for name, data, binary in msgpack.unpackb(packed)}
            except (ValueError, TypeError, msgpack.UnpackException):
                encodings = {}
            # A version that let a publish on a pattern through may have kept its value.
            on_patterns += is_pattern(topic)
            if self.wants(topic):
                self.keep(HubMessage(topic, bytes(payload), protocol=protocol), encodings)
            if topic not in self._values:  # no pattern keeps it now, or past the bounds
                forget.add(topic)
        if on_patterns:
            log.warn("{count} last values on patterns (such as tt/+ or tt/#, where nothing is "
                     "published) in {path} ignored, and removed from it", count=on_patterns,
                     path=os.fspath(path), event="retained_ignored")
        self._dirty = forget
        self._db = db

    @property
    def persistent(self) -> bool:
        """Whether last values are kept in a file too."""
        return self._db is not None

    def flush(self) -> int:
        """Write what changed since the last flush to the file; returns how many topics."""
        db, dirty = self._db, self._dirty
        if db is None or not dirty:
            return 0
        self._dirty = set()
        db.execute("BEGIN")
        for topic in dirty:
            kept = self._values.get(topic)
            if kept is None:
                db.execute("DELETE FROM last_values WHERE topic = ?", (topic,))
            else:
                message, encodings, _, _ = kept
                packed = msgpack.packb([[name, data, binary]
                                        for name, (data, binary) in encodings.items()])
                db.execute("INSERT OR REPLACE INTO last_values VALUES (?, ?, ?, ?)",
                           (topic, message.payload, message.protocol, packed))
        db.execute("COMMIT")
        return len(dirty)

    def close(self) -> None:
        if self._db is not None:
            self.flush()
            self._db.close()
            self._db = None

    def __len__(self) -> int:
        return len(self._values)

    def wants(self, topic: str) -> bool:
        """Whether `topic`'s last value is kept: never a pattern's, where nothing is
        published (`is_pattern`)."""
        wanted = self._wanted.get(topic)
        if wanted is None:
            found: dict[str, None] = {}
            if not is_pattern(topic):
                self._tree.match(topic, found)
            wanted = bool(found)
            if len(self._wanted) >= _DECISIONS:
                self._wanted.clear()
            self._wanted[topic] = wanted
        return wanted

    def keep(self, message: HubMessage, encodings: dict) -> None:
        """`message` is its topic's last value now (an empty payload clears it)."""
        topic = message.topic
        if self._db is not None:
            self._dirty.add(topic)
        old = self._values.pop(topic, None)
        if old is not None:
            self.bytes -= old[2]
        if not message.payload:
            if old is not None:
                self.cleared += 1
                self._topics.discard(topic)
            return
        size = len(topic.encode("utf-8", "surrogatepass")) + len(message.payload) + sum(
            len(data) for data, _ in encodings.values())
        if len(self._values) >= self.max_topics or self.bytes + size > self.max_bytes:
            self.refused += 1
            if old is not None:
                self._topics.discard(topic)
            return
        self._values[topic] = (message, encodings, size, next(self._kept_order))
        self.bytes += size
        if old is None:
            self._topics.add(topic)

    def get(self, topic: str) -> tuple[HubMessage, dict] | None:
        kept = self._values.get(topic)
        return None if kept is None else kept[:2]

    def matching(self, pattern: str) -> list[tuple[HubMessage, dict]]:
        """The kept values whose topics `pattern` matches, oldest kept first."""
        topics, examined = self._topics.match(pattern)
        self.examined += examined
        values = self._values
        kept = sorted((values[topic] for topic in topics), key=lambda value: value[3])
        return [(message, encodings) for message, encodings, _, _ in kept]

    def topics(self) -> list[str]:
        return list(self._values)

    def values(self) -> dict[str, bytes]:
        """Each kept topic's payload."""
        return {topic: kept[0].payload for topic, kept in self._values.items()}
