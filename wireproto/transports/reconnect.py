"""Keep a client connected: connect, and after a failed attempt or a lost connection, wait a
backoff delay and connect again, until stopped.

`twisted.application.internet.ClientService` does this for byte protocols on one endpoint;
`Reconnector` does it for message protocols on any address `wireproto.transports.connect` takes
(a WebSocket URL or an endpoint string), and reports when each connection is up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.application.internet import backoffPolicy
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

__all__ = ["DEFAULT_RETRY", "Reconnector"]

log = Logger()

# Quick at first, then every 30 s at most, with jitter so a fleet does not reconnect in step.
DEFAULT_RETRY = backoffPolicy(initialDelay=0.5, maxDelay=30.0)


class Reconnector:
    """Connect through `connect()` (which returns a Deferred firing with a connected message
    protocol) again and again. `lost(protocol)` must be called when a connection closes."""

    def __init__(
        self,
        reactor: Any,
        connect: Callable[[], defer.Deferred],
        *,
        retry_policy: Callable[[int], float] = DEFAULT_RETRY,
        what: str = "connection",
    ) -> None:
        self.reactor = reactor
        self._connect = connect
        self.retry_policy = retry_policy
        self.what = what
        self.running = False
        self.failed_attempts = 0
        self._attempt: defer.Deferred | None = None
        self._retry: IDelayedCall | None = None

    def start(self) -> None:
        if not self.running:
            self.running = True
            self._try()

    def stop(self) -> None:
        """No more attempts; an attempt under way is cancelled."""
        self.running = False
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        if self._attempt is not None:
            self._attempt.cancel()

    def connected(self) -> None:
        """The attempt under way has connected. Call it from the protocol's connectionMade,
        which runs before the attempt's Deferred fires: from then on `stop` must not cancel the
        attempt (Twisted cannot stop connecting a connection already made)."""
        self._attempt = None
        self.failed_attempts = 0

    def lost(self) -> None:
        """The connection closed: try again after the first backoff delay."""
        self.failed_attempts = 0
        self._schedule()

    def _try(self) -> None:
        self._retry = None
        if not self.running:
            return
        attempt = self._attempt = self._connect()

        def connected(protocol: Any) -> Any:
            if self._attempt is attempt:
                self._attempt = None
                self.failed_attempts = 0
            return protocol

        def failed(reason: Failure) -> None:
            if self._attempt is attempt:
                self._attempt = None
            if not self.running:
                return
            self.failed_attempts += 1
            log.info(
                "{what}: attempt {n} failed ({error}); retrying",
                what=self.what, n=self.failed_attempts, error=reason.getErrorMessage(),
            )
            self._schedule()

        attempt.addCallbacks(connected, failed)

    def _schedule(self) -> None:
        if not self.running or self._retry is not None or self._attempt is not None:
            return
        delay = self.retry_policy(self.failed_attempts)
        self._retry = self.reactor.callLater(delay, self._try)
