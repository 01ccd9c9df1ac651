"""A connection whose topics are mounted under a prefix: what it calls ``temp`` is the hub's
``PREFIX/temp``, both ways (docs/hub.md, "Mounted connections").

A fleet of boards runs one firmware, so each board names its topics alike; mounted at
``PREFIX/BOARD``, each board's topics are its own on the hub, as a Phyllo link's device topics
are under its prefix. A `MountedSession` is a `Session` that puts the prefix on every topic its
protocol hands it (subscribing, publishing, a will, asking what it may do) and takes it off every
message it sends: a hub topic outside its mount, or the prefix itself, is not its to see. Access
rules, limits, last values and wills all see the hub's topics.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

from wireproto.access import Action
from wireproto.hub.message import Encoder, HubMessage, new_message
from wireproto.hub.session import Session, SessionHub
from wireproto.topics import mount_error
from wireproto.transports.base import IMessageTransport

__all__ = ["MountedSession", "mounted_encoder", "Retopic"]

# What is mounted: topics. A call's or a served route's name is not one.
_TOPICAL = frozenset({Action.PUBLISH, Action.SUBSCRIBE})

# retopic(encoded, own_topic): a message already encoded in a protocol's own format (for the
# connections that are not mounted), said again under `own_topic`; None if it cannot be.
Retopic = Callable[[tuple[bytes, bool], str], "tuple[bytes, bool] | None"]


def topic_below(below: str, hub_topic: str) -> str | None:
    """`hub_topic` without `below` (a prefix and its ``/``), or None if it is not under it (the
    prefix itself included)."""
    if len(hub_topic) <= len(below) or not hub_topic.startswith(below):
        return None
    return hub_topic[len(below):]


def mounted_encoder(prefix: str, encode: Encoder) -> Encoder:
    """`encode` for a connection mounted at `prefix`: each message under its own topic, and
    None (not sent) for one outside the mount."""
    below = prefix + "/"

    def encode_mounted(message: HubMessage) -> tuple[bytes, bool] | None:
        topic = topic_below(below, message.topic)
        if topic is None:
            return None
        return encode(new_message(topic, message.payload, message.will, message.sender,
                                  message.protocol))

    return encode_mounted


class MountedSession(Session):
    """A session whose protocol's topics are the hub's under `mount`."""

    __slots__ = ("mount", "_below", "_retopic", "_own_format")

    def __init__(self, hub: SessionHub, transport: IMessageTransport, *, protocol: str,
                 wire_format: Hashable, encode: Encoder, mount: str,
                 retopic: Retopic | None = None) -> None:
        problem = mount_error(mount)
        if problem is not None:
            raise ValueError(f"cannot mount a connection at {mount!r}: {problem}")
        self.mount = mount
        self._below = mount + "/"
        # With `retopic`, a message its protocol's other connections got already encoded is
        # said again under its own topic (a SubbleSocket event keeps its GUID and format).
        self._retopic = retopic
        self._own_format = wire_format
        # Its own format: an encoding made for it names its own topics, no other session's.
        super().__init__(hub, transport, protocol=protocol, wire_format=("mount", mount,
                         wire_format), encode=mounted_encoder(mount, encode))

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]} at {self.mount}>"

    def hub_topic(self, topic: str) -> str:
        return self._below + topic

    def own_topic(self, hub_topic: str) -> str | None:
        return topic_below(self._below, hub_topic)

    def subscribed(self, topic: str) -> bool:
        return self._below + topic in self.topics

    def own_topics(self) -> Iterable[str]:
        start = len(self._below)
        return [topic[start:] for topic in self.topics]

    def subscribe(self, topic: str) -> bool:
        return super().subscribe(self._below + topic)

    def unsubscribe(self, topic: str) -> bool:
        return super().unsubscribe(self._below + topic)

    def subscribe_pattern(self, pattern: str) -> bool:
        return super().subscribe_pattern(self._below + pattern)

    def unsubscribe_pattern(self, pattern: str) -> bool:
        return super().unsubscribe_pattern(self._below + pattern)

    def room_for(self, topics: Iterable[str]) -> str | None:
        return super().room_for([self._below + topic for topic in topics])

    def may(self, action: Action, topic: str) -> bool:
        return super().may(action, self._below + topic if action in _TOPICAL else topic)

    def may_publish(self, topic: str) -> bool:
        return super().may_publish(self._below + topic)

    def check(self, action: Action, topic: str) -> None:
        super().check(action, self._below + topic if action in _TOPICAL else topic)

    def publish(self, topic: str, payload: bytes, encoded: tuple[bytes, bool] | None = None, *,
                encodings: dict[Hashable, tuple[bytes, bool]] | None = None) -> int:
        # What the protocol encoded names its own topic: every subscriber's is made afresh.
        return super().publish(self._below + topic, payload)

    def set_will(self, topic: str, payload: bytes) -> None:
        super().set_will(self._below + topic, payload)

    def new_frame_key(self, wire_format: Hashable) -> object:
        # Its own, not the hub's: one kept by the hub for each prefix would grow with every
        # board ever mounted (a fleet's boards come and go, each at a prefix of its own).
        return object()

    def set_wire_format(self, wire_format: Hashable, encode: Encoder) -> None:
        self._own_format = wire_format
        super().set_wire_format(("mount", self.mount, wire_format),
                                mounted_encoder(self.mount, encode))

    def _prepare(self, message: HubMessage, cache: dict) -> tuple[object, int] | None:
        retopic = self._retopic
        if retopic is not None and self.wire_format not in cache:
            encoded = cache.get(self._own_format)
            own = self.own_topic(message.topic)
            if encoded is not None and own is not None:
                cache[self.wire_format] = retopic(encoded, own)
        return super()._prepare(message, cache)
