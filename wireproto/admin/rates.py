"""Publishes per second on each topic, from the hub's counts (`Hub.count_topics`), sampled every
few seconds while the service runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet import task

if TYPE_CHECKING:
    from wireproto.hub import Hub

__all__ = ["TopicRates"]


class TopicRates:
    """Each counted topic's publishes per second over the last sampling period."""

    def __init__(self, hub: Hub, reactor: Any, *, period: float = 2.0) -> None:
        self.hub = hub
        self.reactor = reactor
        self.period = period
        self._last: dict[str, int] = {}
        self._last_time: float | None = None
        self._rates: dict[str, float] = {}
        self._sampling: task.LoopingCall | None = None

    def start(self) -> None:
        if self._sampling is None:
            self._sampling = task.LoopingCall(self.sample)
            self._sampling.clock = self.reactor
            self._sampling.start(self.period, now=True)

    def stop(self) -> None:
        if self._sampling is not None:
            self._sampling.stop()
            self._sampling = None

    def sample(self) -> None:
        """Take the rates since the last sample, and forget the topics that went quiet and
        have no subscribers, so their places can count other topics."""
        counts = self.hub.topic_counts
        if counts is None:
            return
        now = self.reactor.seconds()
        last, since = self._last, self._last_time
        rates: dict[str, float] = {}
        if since is not None and now > since:
            elapsed = now - since
            for topic, count in counts.items():
                rates[topic] = round((count - last.get(topic, 0)) / elapsed, 3)
        subscribed = self.hub.subscriber_counts()
        for topic, rate in rates.items():
            if not rate and topic not in subscribed:
                del counts[topic]
        self._rates = {topic: rate for topic, rate in rates.items() if topic in counts}
        self._last = dict(counts)
        self._last_time = now

    def rates(self) -> dict[str, float]:
        return dict(self._rates)
