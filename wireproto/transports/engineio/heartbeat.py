"""The server's pings of one Engine.IO session (engine.io's heartbeat)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IDelayedCall

__all__ = ["Heartbeat"]


class Heartbeat:
    """A ping every `interval` seconds, each to be answered by a pong within `timeout`, or
    `timed_out()` is called. A client that sends other packets while its pong is due (a busy
    one, its pong queued behind them) gets one more `timeout`, as engine.io gives it."""

    def __init__(self, reactor: Any, interval: float, timeout: float,
                 send_ping: Callable[[], None], timed_out: Callable[[], None]) -> None:
        self.reactor = reactor
        self.interval = interval
        self.timeout = timeout
        self.send_ping = send_ping
        self.timed_out = timed_out
        self._next_ping: IDelayedCall | None = None
        self._pong_due: IDelayedCall | None = None
        self._extended = False

    def start(self) -> None:
        self._next_ping = self.reactor.callLater(self.interval, self._ping)

    def stop(self) -> None:
        for call in (self._next_ping, self._pong_due):
            if call is not None and call.active():
                call.cancel()
        self._next_ping = self._pong_due = None

    def packet_received(self, is_pong: bool) -> None:
        """A packet came from the client: a pong settles the ping; another packet, while a pong
        is due, extends its deadline once."""
        due = self._pong_due
        if due is None:
            return
        if is_pong:
            due.cancel()
            self._pong_due = None
            self.start()
        elif not self._extended:
            self._extended = True
            due.reset(self.timeout)

    def _ping(self) -> None:
        self._next_ping = None
        self._extended = False
        self._pong_due = self.reactor.callLater(self.timeout, self._no_pong)
        self.send_ping()

    def _no_pong(self) -> None:
        self._pong_due = None
        self.timed_out()
