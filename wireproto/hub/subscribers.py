"""Who the hub delivers to: the `Subscriber` interface and its fast path (`FrameSubscriber`), host
code's `LocalSubscriber`, and the `TopicObserver` told of topics coming and going."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Protocol

from twisted.logger import Logger

from wireproto.hub.message import HubMessage
from wireproto.topics import is_pattern

__all__ = [
    "TopicObserver",
    "Subscriber",
    "FrameSubscriber",
    "LocalSubscriber",
]

log = Logger(namespace="wireproto.hub")

class TopicObserver(Protocol):
    """Told when an exact topic gains its first subscriber and loses its last one (and, with
    a `grants_changed(previous)` method, when a new policy changed the sessions' grants)."""

    def topic_started(self, topic: str) -> None: ...

    def topic_ended(self, topic: str) -> None: ...


class Subscriber(Hashable, Protocol):
    """What the hub delivers to, and keys its subscriptions by: a connection's `Session`, or host
    code's `LocalSubscriber`.

    `deliver(message, cache)` is the general path; `cache` holds the encodings and prepared
    frames made so far for this publish, for other subscribers to share. A subscriber whose
    `writes_now` is true at that moment is a `FrameSubscriber` and takes the fast path instead.
    """

    writes_now: bool

    def deliver(self, message: HubMessage, cache: dict) -> None: ...


class FrameSubscriber(Subscriber, Protocol):
    """A subscriber that takes prepared frames (`Session`). While `writes_now` is true, the
    publish loop finds the frame for its `frame_key` in the cache (or has `frame_from_cache`
    frame the encoding there), counts it in `sent` and `sent_bytes`, and calls `write_frame`,
    without building a `HubMessage`."""

    frame_key: object
    sent: int
    sent_bytes: int

    def frame_from_cache(self, cache: dict) -> tuple[Any, int] | None: ...

    def write_frame(self, frame: Any) -> None: ...



class Subscriptions(Protocol):
    """Where a `LocalSubscriber` is subscribed (the hub)."""

    def unsubscribe(self, subscriber: Subscriber, topic: str) -> bool: ...

    def unsubscribe_pattern(self, subscriber: Subscriber, pattern: str) -> None: ...


class LocalSubscriber:
    """A subscription held by host code rather than by a connection."""

    writes_now = False  # host callbacks always go through deliver

    def __init__(self, hub: Subscriptions, topic: str,
                 callback: Callable[[HubMessage], object]) -> None:
        self.hub = hub
        self.topic = topic
        self.callback = callback

    def deliver(self, message: HubMessage, cache: dict) -> None:
        try:
            self.callback(message)
        except Exception:
            log.failure("hub subscriber for {topic!r} raised", event="callback_failed",
                        topic=self.topic)

    def cancel(self) -> None:
        if is_pattern(self.topic):
            self.hub.unsubscribe_pattern(self, self.topic)
        else:
            self.hub.unsubscribe(self, self.topic)
