"""Which broker processes are alive, and what each one says about itself (docs/cluster.md).

Every process publishes a heartbeat on ``PREFIX.cluster.alive.ORIGIN`` every
`heartbeat_interval`, and hears everyone else's. A heartbeat carries the process's announcement:
the calls it serves (wireproto.cluster.calls), so that a process that joins learns them within
one interval. A process not heard from for `dead_after` seconds is forgotten, and its
announcement with it; one that stops cleanly says goodbye, and is forgotten at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import task
from twisted.internet.interfaces import IReactorTime

from wireproto.cluster.client import NatsClient
from wireproto.cluster.subjects import Subjects
from wireproto.codecs.nats import headers_block

__all__ = ["Roster"]

# The last heartbeat of a process that stops cleanly: forget it at once.
GOODBYE = headers_block({"Wp-Gone": "1"})


class Roster:
    """The live processes of the cluster, by origin, and their latest announcements."""

    def __init__(self, client: NatsClient, clock: IReactorTime, subjects: Subjects, *,
                 origin: str, interval: float, dead_after: float) -> None:
        self.client = client
        self.clock = clock
        self.interval = interval
        self.dead_after = dead_after
        # this process, as a subject token
        self.origin = origin
        self._subject = f"{subjects.cluster}alive."
        # origin -> when it was last heard (this process's clock), and what it announced
        self.heard: dict[str, float] = {}
        self.announced: dict[str, bytes] = {}
        self.announcement = b""
        # Processes that said goodbye and are not yet dead_after silent.
        self.left: set[str] = set()
        # When this process started hearing heartbeats: only after dead_after does silence mean
        # a process is gone.
        self.listening_since: float | None = None
        # Called with no argument after each heartbeat this process sends.
        self.on_tick: list[Callable[[], Any]] = []
        # Called with no argument when some process's announcement changes, or it is forgotten.
        self.on_change: list[Callable[[], Any]] = []
        # Called with the origin of each process forgotten: at its goodbye, or its silence.
        self.on_gone: list[Callable[[str], object]] = []
        self._loop: task.LoopingCall | None = None
        self._sid: int | None = None

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

    def leave(self) -> None:
        """Tell the others this process is stopping."""
        if self.client.connected:
            self.client.publish(self._subject + self.origin, b"", headers=GOODBYE)

    def connected(self) -> None:
        """Say at once that this process is here, with what it announces."""
        if self.listening_since is None:
            self.listening_since = self.clock.seconds()
        self._beat()

    def announce(self, announcement: bytes) -> None:
        """What this process's heartbeats say from now on; sent at once."""
        if announcement != self.announcement:
            self.announcement = announcement
            self._beat()

    # -- what is known ----------------------------------------------------------------------------

    def alive(self, origin: str) -> bool:
        heard = self.heard.get(origin)
        return heard is not None and self.clock.seconds() - heard < self.dead_after

    def members(self) -> list[str]:
        """The other processes heard from within dead_after that have not said goodbye, in
        the order of their names."""
        return sorted(origin for origin in self.heard
                      if self.alive(origin) and origin not in self.left)

    def listened_long_enough(self) -> bool:
        """Whether silence now means a process is gone (this one has listened for dead_after)."""
        since = self.listening_since
        return since is not None and self.clock.seconds() - since >= self.dead_after

    # -- heartbeats -------------------------------------------------------------------------------

    def _beat(self) -> None:
        if self.client.connected:
            self.client.publish(self._subject + self.origin, self.announcement)

    def _heard(self, subject: str, reply: Any, headers: Any, payload: bytes) -> None:
        origin = subject[len(self._subject):]
        if origin == self.origin:
            return
        if headers is not None and b"Wp-Gone" in headers:
            # What it served is gone now; its wills wait for dead_after all the same, as the
            # last ones its connections published themselves may still be on their way out.
            if origin not in self.left:
                self.left.add(origin)
                self._gone(origin)
            if self.announced.pop(origin, b""):
                self._changed()
            return
        self.left.discard(origin)
        self.heard[origin] = self.clock.seconds()
        if self.announced.get(origin) != payload:
            self.announced[origin] = payload
            self._changed()

    def _tick(self) -> None:
        self._beat()
        now = self.clock.seconds()
        gone = [origin for origin, heard in self.heard.items() if now - heard >= self.dead_after]
        for origin in gone:
            del self.heard[origin]
            if origin not in self.left:
                self._gone(origin)
            self.left.discard(origin)
            if self.announced.pop(origin, b""):
                self._changed()
        for listener in tuple(self.on_tick):
            listener()

    def _gone(self, origin: str) -> None:
        for listener in tuple(self.on_gone):
            listener(origin)

    def _changed(self) -> None:
        for listener in tuple(self.on_change):
            listener()
