"""Listing the serial ports off the reactor's thread.

pyserial's ``list_ports`` reads sysfs: a few milliseconds on a host, more with many ports or a
slow sysfs, and forever when a read hangs. Run on the reactor, it would hold up every
connection of the broker meanwhile. A `PortListing` runs its lister in a thread, one listing at
a time, and hands only the result to the reactor:

- `fresh()` is a Deferred for a listing that starts at or after the call: the one it starts,
  or, while one runs, the next, which every caller asking meanwhile shares (one listing in
  flight at most, one waiting);
- each listing that returns goes to every observer (the port watcher), whoever asked for it;
- a lister that raises fails that listing's callers (`PortsNotListed`, saying why); one that
  has not returned after `timeout` seconds fails them too, and is left to its thread, a daemon
  thread that stopping the broker does not wait for. The next listing runs in a new thread;
  while `MAX_HUNG` listings are left so, none starts and callers fail at once, until one of
  them returns. Either is logged once, until a listing works again.

A reactor that cannot be handed results from threads (a test's `task.Clock`) has its lister
run inline, at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from twisted.internet import defer
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IDelayedCall, IReactorThreads, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from .ports import PortInfo, PortLister, system_ports

__all__ = ["DEFAULT_TIMEOUT", "MAX_HUNG", "PortListing", "PortsNotListed"]

log = Logger(namespace="wireproto.devices")

DEFAULT_TIMEOUT = 10.0
"""Seconds a listing may take before its callers are told it failed."""
MAX_HUNG = 2
"""Listings left in their threads past the timeout, at most: a sysfs read that never returns
costs two threads, not one per poll."""

PortsObserver = Callable[[list[PortInfo]], object]


class PortsNotListed(ConnectError):
    """The serial ports could not be listed"""


@dataclass(eq=False)
class _Listing:
    callers: list[defer.Deferred[list[PortInfo]]]
    timer: IDelayedCall | None = None
    left: bool = False
    """Timed out or stopped: its thread's result, when it comes, is dropped."""
    started: float = field(default_factory=time.monotonic)


class PortListing:
    """`lister`'s listings, run one at a time off `reactor`'s thread (see the module)."""

    def __init__(self, reactor: IReactorTime, lister: PortLister = system_ports,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        if not timeout > 0:
            raise ValueError(f"a port listing's timeout is a positive number, not {timeout}")
        self.reactor = reactor
        self.lister = lister
        self.timeout = timeout
        self.threaded = IReactorThreads.providedBy(reactor)
        self.listings = 0
        """Listings started: what listing costs."""
        self.duration = 0.0
        """Seconds the last listing that returned took."""
        self.hung = 0
        """Listings left to their threads that have not returned yet."""
        self._running: _Listing | None = None
        self._waiting: list[defer.Deferred[list[PortInfo]]] = []
        self._observers: list[PortsObserver] = []
        self._failing = False

    @property
    def in_flight(self) -> bool:
        return self._running is not None

    def observe(self, observer: PortsObserver) -> Callable[[], None]:
        """Call `observer(ports)` with every listing that works; returns what stops that."""
        self._observers.append(observer)

        def forget() -> None:
            if observer in self._observers:
                self._observers.remove(observer)

        return forget

    def fresh(self) -> defer.Deferred[list[PortInfo]]:
        """The ports as a listing started now, or after the one running, finds them."""
        asked: defer.Deferred[list[PortInfo]] = defer.Deferred(self._cancelled)
        self._waiting.append(asked)
        if self._running is None:
            self._start()
        return asked

    def stop(self) -> None:
        """Fail the callers waiting and drop the listing running (its thread is not waited
        for): the broker is stopping."""
        running, self._running = self._running, None
        if running is not None:
            self._leave(running)
            _fail(running.callers, PortsNotListed(string="the serial ports' listing stopped"))
        waiting, self._waiting = self._waiting, []
        _fail(waiting, PortsNotListed(string="the serial ports' listing stopped"))

    # -- one listing ------------------------------------------------------------------------

    def _cancelled(self, asked: defer.Deferred[list[PortInfo]]) -> None:
        if asked in self._waiting:
            self._waiting.remove(asked)
        elif self._running is not None and asked in self._running.callers:
            self._running.callers.remove(asked)

    def _start(self) -> None:
        callers, self._waiting = self._waiting, []
        if self.hung >= MAX_HUNG:
            _fail(callers, PortsNotListed(
                string=f"{self.hung} listings of the serial ports have not returned"))
            return
        listing = _Listing(callers)
        self._running = listing
        self.listings += 1
        if not self.threaded:
            self._returned(listing, *self._list())
            return
        listing.timer = self.reactor.callLater(self.timeout, self._timed_out, listing)
        threading.Thread(target=self._in_thread, args=(listing,), daemon=True,
                         name="wireproto-port-listing").start()

    def _list(self) -> tuple[list[PortInfo] | None, BaseException | None]:
        try:
            return self.lister(), None
        except Exception as error:  # a lister reads /sys and /dev: said to its callers
            return None, error

    def _in_thread(self, listing: _Listing) -> None:
        try:
            ports, error = self._list()
        except BaseException as exc:  # SystemExit: told to the callers, not left to the timeout
            ports, error = None, exc
        try:
            IReactorThreads(self.reactor).callFromThread(self._returned, listing, ports, error)
        except RuntimeError:  # the interpreter is shutting down
            pass

    def _returned(self, listing: _Listing, ports: list[PortInfo] | None,
                  error: BaseException | None) -> None:
        if listing.left:
            self.hung -= 1
            if self._running is None and self._waiting:
                self._start()
            return
        if listing.timer is not None and listing.timer.active():
            listing.timer.cancel()
        self._running = None
        self.duration = time.monotonic() - listing.started
        if ports is None:
            if not self._failing:
                log.failure("cannot list serial ports; the last ports listed are kept",
                            Failure(error), event="ports_list_failed")
            self._failing = True
            _fail(listing.callers, PortsNotListed(string=f"cannot list serial ports: {error}"))
        else:
            self._worked()
            for asked in listing.callers:
                if not asked.called:
                    asked.callback(list(ports))
            for observer in list(self._observers):
                try:
                    observer(list(ports))
                except Exception:
                    log.failure("a port listener failed", event="port_listener_failed")
        if self._waiting:
            self._start()

    def _worked(self) -> None:
        if self._failing:
            log.info("the serial ports are listed again", event="ports_listed_again")
        self._failing = False

    def _timed_out(self, listing: _Listing) -> None:
        listing.timer = None
        self._running = None
        self._leave(listing)
        if not self._failing:
            log.error("listing the serial ports has not returned after {timeout} s: the last "
                      "ports listed are kept, and the next listing runs in a new thread",
                      event="ports_list_hung", timeout=self.timeout)
        self._failing = True
        _fail(listing.callers, PortsNotListed(
            string=f"listing the serial ports has not returned after {self.timeout:g} s"))
        if self._waiting:
            self._start()

    def _leave(self, listing: _Listing) -> None:
        listing.left = True
        self.hung += 1
        if listing.timer is not None and listing.timer.active():
            listing.timer.cancel()
        listing.timer = None


def _fail(callers: list[defer.Deferred[list[PortInfo]]], error: Exception) -> None:
    for asked in callers:
        if not asked.called:
            asked.errback(Failure(error))
