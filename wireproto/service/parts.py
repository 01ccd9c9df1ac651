"""The parts of a running broker as child services that start in order and stop in reverse.

A broker's parts depend on one another: capture must be open before a connection is recorded,
the hub joined to its cluster before a listener takes a client, and on the way out the
connections must close (publishing their wills) before the cluster link goes, and the capture
last of all. Twisted's `MultiService` starts its children in order but stops them all at once,
and does not undo a start that failed half-way. `OrderedParts` does both: each child starts when
the one before it has, a child that cannot start stops those already started (a `Part` that
cannot start raises `StartFailed`), and each child stops only once the one after it has
stopped.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from twisted.application.service import IService, MultiService, Service
from twisted.internet import defer

__all__ = ["OrderedParts", "Part", "StartFailed", "describe_error"]


class StartFailed(Exception):
    """A part of the broker that its config asks for could not start (its capture, its last
    values file, its cluster link...): `what`, and why, in one line."""

    def __init__(self, what: str, error: BaseException | str) -> None:
        self.what = what
        self.error = error
        why = error if isinstance(error, str) else describe_error(error, what)
        super().__init__(f"{what}: {why}")


def describe_error(error: BaseException, what: str = "") -> str:
    """`error` in a few words: an OSError's reason, with the file it names unless `what` names
    it already; else the error's own text."""
    if isinstance(error, OSError) and error.strerror:
        name = os.fsdecode(error.filename) if error.filename is not None else ""
        return f"{name}: {error.strerror}" if name and name not in what else error.strerror
    return str(error) or type(error).__name__


class Part(Service):
    """One part of the broker, started by `start` and stopped by `stop` (which may return a
    Deferred). It starts in `privilegedStartService` when its parent has one (under twistd,
    before the listeners bind and privileges are dropped), else in `startService`."""

    def __init__(self, name: str, start: Callable[[], Any], stop: Callable[[], Any]) -> None:
        self.setName(name)
        # the same, as a str: Twisted's Service allows a service no name
        self.what = name
        self._start = start
        self._stop = stop
        self.started = False

    def privilegedStartService(self) -> None:
        self._begin()

    def startService(self) -> None:
        self._begin()
        super().startService()

    def _begin(self) -> None:
        if not self.started:
            try:
                self._start()
            except StartFailed:
                raise
            except Exception as error:
                raise StartFailed(self.what, error) from None
            self.started = True

    def stopService(self) -> defer.Deferred[None]:
        super().stopService()
        if not self.started:
            return defer.succeed(None)
        self.started = False
        return defer.maybeDeferred(self._stop)


class OrderedParts(MultiService):
    """A MultiService whose children start in order, all or none, and stop in reverse order,
    each after the next has stopped."""

    def privilegedStartService(self) -> None:
        self._in_order("privilegedStartService")

    def startService(self) -> None:
        Service.startService(self)
        self._in_order("startService")

    def _in_order(self, step: str) -> None:
        done: list[IService] = []
        for child in list(self):
            try:
                getattr(child, step)()
            except BaseException:
                # Undone without waiting: the error is what the caller hears of.
                for started in reversed(done):
                    if started.running or isinstance(started, Part) and started.started:
                        started.stopService()
                if step == "startService":
                    Service.stopService(self)
                raise
            done.append(child)

    @defer.inlineCallbacks
    def stopService(self) -> Any:
        Service.stopService(self)
        for child in reversed(list(self)):
            if child.running or isinstance(child, Part) and child.started:
                yield child.stopService()
