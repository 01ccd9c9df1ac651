"""The broker's figures over the last ten minutes, one point a second, for the status page's
charts (``GET /api/history``): kept by the API from its start, never more than `KEPT` points
however long the broker runs, and summed over the processes of a cluster.

A point is a whole second of the reactor's clock (Unix time) and the messages published,
delivered and dropped in the second before it, with the connections open at its end. The
samples are taken on the whole seconds; a sample that comes late (a busy reactor) gives each
second it missed a point, the counts shared among them, so there is a point every second.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple, TypeGuard

if TYPE_CHECKING:
    from twisted.internet.interfaces import IDelayedCall, IReactorTime

    from wireproto.hub import Hub

__all__ = ["History", "KEPT", "INTERVAL", "history_answer", "merge_rows"]

INTERVAL = 1
# Ten minutes of points.
KEPT = 600


class Point(NamedTuple):
    """One second: its time, the counts in it (per second) and the connections at its end."""

    time: int
    published: float
    delivered: float
    dropped: float
    connections: int


class History:
    """The last `KEPT` seconds of a hub's figures, sampled on each whole second."""

    def __init__(self, hub: Hub, reactor: IReactorTime) -> None:
        self.hub = hub
        self.reactor = reactor
        self._points: deque[Point] = deque(maxlen=KEPT)
        # The last sample: its second and the hub's totals then.
        self._last: tuple[int, tuple[int, int, int]] | None = None
        self._call: IDelayedCall | None = None

    def start(self) -> None:
        if self._call is None:
            self._last = None  # a start after a stop counts nothing from before it
            self._tick()

    def stop(self) -> None:
        if self._call is not None:
            if self._call.active():
                self._call.cancel()
            self._call = None

    def _tick(self) -> None:
        now = self.reactor.seconds()
        second = math.floor(now)
        self.sample(second)
        self._call = self.reactor.callLater(second + 1 - now, self._tick)

    def sample(self, second: int) -> None:
        """Take the hub's figures at the start of `second`: a point for each second since the
        last sample."""
        stats = self.hub.stats
        totals = (stats.published, stats.delivered, stats.dropped_messages)
        last = self._last
        if last is None:
            self._last = (second, totals)  # what the next sample counts from
            return
        last_second, last_totals = last
        if second == last_second:
            return  # woken a hair early: the next sample counts this one's messages
        self._last = (second, totals)
        if second < last_second:  # the clock was set back: what was kept is in its future
            self._points.clear()
            return
        span = second - last_second
        published, delivered, dropped = (_per_second(new - old, span)
                                         for new, old in zip(totals, last_totals, strict=True))
        connections = len(self.hub.sessions)
        for time in range(max(last_second + 1, second - KEPT + 1), second + 1):
            self._points.append(Point(time, published, delivered, dropped, connections))

    def rows(self) -> list[list[float]]:
        """The points of the last `KEPT` seconds, oldest first, each as a list (how another
        process of a cluster is sent them)."""
        oldest = math.floor(self.reactor.seconds()) - KEPT
        return [list(point) for point in self._points if point.time > oldest]


def _per_second(count: int, span: int) -> float:
    count = max(count, 0)  # totals only grow; never show a negative rate
    return count if span == 1 else round(count / span, 1)


def merge_rows(parts: Iterable[object]) -> list[list[float]]:
    """Several processes' rows as one: their figures summed per second; a second a process has
    no point for counts nothing from it. A row that is not a point is left out.

    >>> merge_rows([[[10, 1, 2, 0, 3], [11, 4, 4, 0, 3]], [[11, 1, 1, 1, 2], [12, 5, 5, 0, 2]]])
    [[10, 1, 2, 0, 3], [11, 5, 5, 1, 5], [12, 5, 5, 0, 2]]
    """
    summed: dict[int, list[float]] = {}
    for rows in parts:
        if not isinstance(rows, list):
            continue
        for row in rows:
            if not _is_row(row):
                continue
            kept = summed.get(int(row[0]))
            if kept is None:
                summed[int(row[0])] = list(row)
            else:
                for index in range(1, len(row)):
                    kept[index] += row[index]
    return [summed[time] for time in sorted(summed)[-KEPT:]]


def _is_row(row: object) -> TypeGuard[list[float]]:
    return (isinstance(row, list) and len(row) == len(Point._fields)
            and all(isinstance(value, int | float) and not isinstance(value, bool)
                    and math.isfinite(value) for value in row)
            and isinstance(row[0], int))


def history_answer(rows: list[list[float]], nodes: list[str]) -> dict[str, object]:
    """``GET /api/history``'s answer: the interval, the processes whose points it sums (in a
    cluster, those that answered in time) and each point as an object.

    >>> history_answer([[10, 1, 2, 0, 3]], ["a"])["points"]
    [{'time': 10, 'published': 1, 'delivered': 2, 'dropped': 0, 'connections': 3}]
    """
    return {"interval": INTERVAL, "nodes": nodes,
            "points": [dict(zip(Point._fields, row, strict=True)) for row in rows]}
