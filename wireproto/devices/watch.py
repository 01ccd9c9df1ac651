"""Knowing when boards come and go: one small interface, two ways to learn it.

A `PortWatcher` holds the latest list of ports from its lister and tells its subscribers when
that list changes. The lister runs off the reactor's thread, one listing at a time, bounded by
a timeout (`wireproto.devices.listing`). `check()` lists again; what calls it is the watcher's
own:

- `UdevWatcher` wakes on udev's events for the ``tty`` subsystem (pyudev's monitor, read by the
  reactor), lists once the burst of events has settled (udev makes the /dev/serial/by-id links
  just after the device appears), and lists every `safety_interval` seconds too, since a
  netlink socket can drop events when its buffer fills;
- `PollingWatcher` lists every `interval` seconds (1 by default, never more often than
  `MIN_INTERVAL`, nor sooner after a listing than it took): where udev is not running (a
  container, another OS).

`system_watcher()` picks one. Tests hand either watcher a stand-in's lister
(`wireproto.devices.standin`), so plugging a pty-backed board goes through the real watcher.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from twisted.internet import defer, task
from twisted.internet.interfaces import (
    IDelayedCall,
    IReactorFDSet,
    IReactorTime,
    IReadDescriptor,
)
from twisted.logger import Logger
from twisted.python import failure
from zope.interface import implementer

from .listing import PortListing
from .ports import PortInfo, PortLister, system_ports

if TYPE_CHECKING:
    import pyudev

__all__ = [
    "MIN_INTERVAL",
    "PollingWatcher",
    "PortListener",
    "PortWatcher",
    "UdevWatcher",
    "system_watcher",
    "udev_running",
]

log = Logger(namespace="wireproto.devices")

MIN_INTERVAL = 0.05
PortListener = Callable[[list[PortInfo]], object]


class PortWatcher:
    """The ports `lister` lists, watched: `ports` is the latest list, and each subscriber is
    called with the new list whenever it changes. Started and stopped by its owner.

    The listings run off the reactor's thread (`PortListing`); `lister` may be one already
    shared with the endpoints that match boards, and every listing it makes, for whoever asked,
    updates `ports`."""

    kind = "manual"

    def __init__(self, reactor: IReactorTime,
                 lister: PortLister | PortListing = system_ports) -> None:
        self.reactor = reactor
        self.listing = lister if isinstance(lister, PortListing) else PortListing(
            reactor, lister)
        self.lister = self.listing.lister
        self._ports: list[PortInfo] | None = None
        self._listeners: list[PortListener] = []
        self.changes = 0
        self.running = False
        self.listing.observe(self._listed)

    @property
    def checks(self) -> int:
        """How many times the ports were listed: what the watcher costs."""
        return self.listing.listings

    def ports(self) -> list[PortInfo]:
        """The ports as last listed: none until a first listing has returned."""
        return list(self._ports or [])

    def subscribe(self, listener: PortListener) -> Callable[[], None]:
        """Call `listener(ports)` on every change from now on; returns what unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def _listed(self, ports: list[PortInfo]) -> None:
        if ports == (self._ports or []):
            self._ports = ports
            return
        self._ports = ports
        self.changes += 1
        for listener in list(self._listeners):
            try:
                listener(list(ports))
            except Exception:
                log.failure("a port listener failed", event="port_listener_failed")

    def check(self) -> defer.Deferred[bool]:
        """List the ports again, off the reactor's thread; tell the subscribers if they
        changed. Fires with True if they did, False if not or if they could not be listed
        (the listing says why, once)."""
        before = self.changes
        return self.listing.fresh().addCallbacks(
            lambda ports: self.changes != before, lambda reason: False)

    def start(self) -> None:
        self.running = True
        if self._ports is None:
            self.check()

    def stop(self) -> None:
        self.running = False


class PollingWatcher(PortWatcher):
    """Lists the ports every `interval` seconds after the last listing returned, or after as
    long as that listing took if that is longer: the ports are never listed more than half of
    the time, however slow a listing is."""

    kind = "polling"

    def __init__(self, reactor: IReactorTime, lister: PortLister | PortListing = system_ports,
                 interval: float = 1.0) -> None:
        super().__init__(reactor, lister)
        if not interval >= MIN_INTERVAL:
            raise ValueError(f"a port poll interval is at least {MIN_INTERVAL} s, not {interval}")
        self.interval = interval
        self._next: IDelayedCall | None = None
        self._round = 0  # a poll of an earlier start() schedules no other
        self._slow = False

    def start(self) -> None:
        if self.running:
            return
        self.running = True
        self._round += 1
        self._poll(self._round)

    def _poll(self, round_: int) -> None:
        self._next = None
        self.check().addBoth(lambda _: self._schedule(round_))

    def _schedule(self, round_: int) -> None:
        if not self.running or round_ != self._round:
            return
        took = self.listing.duration
        if took > self.interval and not self._slow:  # said once
            self._slow = True
            log.warn("listing the serial ports took {took:.3f} s, longer than the poll "
                     "interval of {interval} s: they are listed as often as that allows",
                     event="ports_poll_slowed", took=took, interval=self.interval)
        self._next = self.reactor.callLater(max(self.interval, took), self._poll, round_)

    def stop(self) -> None:
        super().stop()
        pending, self._next = self._next, None
        if pending is not None and pending.active():
            pending.cancel()


def udev_running() -> bool:
    """Whether udev runs here and pyudev can reach it (its control socket is where udevd makes
    it; inside most containers it is not, and no event would ever come)."""
    if not os.path.exists("/run/udev/control"):
        return False
    try:
        import pyudev

        # A netlink socket too: a sandbox may refuse it (EPERM), and polling then does.
        pyudev.Monitor.from_netlink(pyudev.Context())
    except Exception:  # no pyudev, no libudev to load, or no netlink socket
        return False
    return True


@implementer(IReadDescriptor)
class UdevWatcher(PortWatcher):
    """Lists the ports when udev says a ``tty`` device was added or removed."""

    kind = "udev"

    def __init__(self, reactor: IReactorTime, lister: PortLister | PortListing = system_ports,
                 settle: float = 0.3,
                 safety_interval: float = 30.0) -> None:
        super().__init__(reactor, lister)
        self.settle = settle
        self.safety_interval = safety_interval
        self._monitor: pyudev.Monitor | None = None
        self._pending: IDelayedCall | None = None
        self._safety: task.LoopingCall | None = None

    def start(self) -> None:
        if self._monitor is not None:
            return
        import pyudev

        super().start()
        monitor = pyudev.Monitor.from_netlink(pyudev.Context())
        monitor.filter_by("tty")
        monitor.start()
        self._monitor = monitor
        IReactorFDSet(self.reactor).addReader(self)
        self._safety = task.LoopingCall(self.check)
        self._safety.clock = self.reactor
        self._safety.start(self.safety_interval, now=False)

    def stop(self) -> None:
        super().stop()
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            IReactorFDSet(self.reactor).removeReader(self)
        if self._pending is not None and self._pending.active():
            self._pending.cancel()
        self._pending = None
        safety, self._safety = self._safety, None
        if safety is not None and safety.running:
            safety.stop()

    # -- IReadDescriptor ----------------------------------------------------------------------

    def fileno(self) -> int:
        return -1 if self._monitor is None else int(self._monitor.fileno())

    def doRead(self) -> None:
        monitor = self._monitor
        if monitor is None:
            return
        try:
            while monitor.poll(timeout=0) is not None:
                pass  # what changed is read from the ports list; the events only say when
        except OSError as error:
            if error.errno != errno.ENOBUFS:
                raise  # the monitor is broken: connectionLost says so
            # The kernel dropped events, its socket's buffer full (a burst of devices): which
            # ones does not matter, the ports are listed again all the same.
            log.info("udev events were lost: the serial ports are listed again",
                     event="udev_events_lost")
        if self._pending is None or not self._pending.active():
            self._pending = self.reactor.callLater(self.settle, self._settled)

    def _settled(self) -> None:
        self._pending = None
        self.check()

    def connectionLost(self, reason: failure.Failure) -> None:
        """The reactor stopped reading udev's events (reading them failed)."""
        if self._monitor is not None:
            log.failure("udev's events can no longer be read: the serial ports are listed "
                        "every {interval} s only", reason, event="udev_watch_failed",
                        interval=self.safety_interval)
        self._monitor = None

    def logPrefix(self) -> str:
        return "udev"


def system_watcher(reactor: IReactorTime, lister: PortLister | PortListing = system_ports,
                   interval: float = 1.0) -> PortWatcher:
    """udev's events where udev runs, else polling every `interval` seconds."""
    if udev_running():
        return UdevWatcher(reactor, lister)
    return PollingWatcher(reactor, lister, interval)
