"""How the ``wireproto`` program stops on Ctrl-C and SIGTERM, from the start of its `main` on
(`wireproto.cli`): quietly, with the status each command documents for a stop (docs/tools.md,
docs/running.md). Apart from the commands, so that the CLI module holds what each command does.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING, NoReturn, cast

if TYPE_CHECKING:
    from twisted.internet.base import ReactorBase

__all__ = ["Stopping", "stop_on_signals", "stop_requested"]


class Stopping:
    """Ctrl-C and SIGTERM, from the start of `main` on: the command ends at once with the
    status it documents for a stop, without a traceback (an import half done is no reason to
    print one). Once the reactor runs (these handlers put back in place of Twisted's own, which
    it installs as it starts), the first one stops it, so that the command's shutdown closes
    its connections cleanly; any other one meanwhile, or once the reactor has stopped, changes
    nothing (that shutdown is bounded). While a command that handles KeyboardInterrupt runs,
    both raise it. Once the command has its status, both are ignored: the process is only
    exiting, and Python's own exit would otherwise let them kill it."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.interrupt = False
        self.interrupted = False
        self.finished = False
        self.requested = False
        """A stop was asked for: set in the signal handler itself, before the reactor hears of
        it, so that what the reactor is about to do (announce a start) can be left undone."""
        self.install()

    def install(self) -> None:
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, self.handle)

    def keep_when_running(self) -> None:
        """Have these handlers, not Twisted's, in place once the reactor runs."""
        from twisted.internet import reactor

        reactor.callWhenRunning(self.install)

    def handle(self, number: int, frame: object) -> None:
        reactor = sys.modules.get("twisted.internet.reactor")
        if not self.finished and reactor is not None and (
                reactor.running or getattr(reactor, "_startedBefore", False)):
            # Running; or stopping, or stopped and its command ending with its own status.
            if not self.requested:
                self.requested = True
                reactor.callFromThread(_stop_reactor, reactor)
            return
        self.requested = True
        if self.interrupt:
            self.interrupted = True
            raise KeyboardInterrupt
        self.exit()

    def finish(self, status: int) -> None:
        self.status, self.interrupt, self.finished = status, False, True
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_IGN)

    def exit(self) -> NoReturn:
        """End the process now with the status, what is written flushed."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a write it interrupted: exiting anyway
                pass
        os._exit(self.status)


def _stop_reactor(reactor: object) -> None:
    from twisted.internet.error import ReactorNotRunning

    try:
        cast("ReactorBase", reactor).stop()
    except ReactorNotRunning:
        pass  # it was stopping already, on its own


_stopping: Stopping | None = None


def stop_on_signals(status: int) -> Stopping:
    """Ctrl-C and SIGTERM handled from now on, as `Stopping` says; `status` is the command's
    for a stop."""
    global _stopping
    _stopping = Stopping(status)
    return _stopping


def stop_requested() -> bool:
    """Whether Ctrl-C or SIGTERM has asked the command to stop."""
    return _stopping is not None and _stopping.requested
