"""What every long-lived client shares (UBRE's, nydus's): it outlives its connections, connects
(and, with `reconnect`, reconnects with backoff), tells hooks, and closes.

A subclass says how to open one connection (`_connect_once`, a Deferred that fails if the attempt
does) and what to do when one comes up or goes down (`_on_connected`, `_on_disconnected`). Its
protocol calls `_connected(self)` once it is ready and `_disconnected(self, reason)` when it
closes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.protocols.rpc import ConnectionClosed
from wireproto.transports.base import IMessageTransport
from wireproto.transports.reconnect import DEFAULT_RETRY, Reconnector

__all__ = ["ClientBase", "Connection"]

log = Logger()


class Connection(Protocol):
    """What a client needs of its connection's protocol."""

    transport: IMessageTransport


Connected = TypeVar("Connected", bound=Connection)


class ClientBase(Generic[Connected]):
    """A client, connected or (with `reconnect`) reconnecting, through a `Connected` protocol.
    `what` names it in logs."""

    what = "client"

    def __init__(
        self,
        reactor: Any,
        address: str,
        *,
        reconnect: bool = False,
        retry_policy: Callable[[int], float] = DEFAULT_RETRY,
    ) -> None:
        self.reactor = reactor
        self.address = address
        self.protocol: Connected | None = None
        self.closing = False
        self._attempt: defer.Deferred | None = None
        self._connect_waiters: list[defer.Deferred] = []
        self._close_waiters: list[defer.Deferred] = []
        self._reconnector = (
            Reconnector(reactor, self._connect_once, retry_policy=retry_policy,
                        what=f"{self.what} to {address}")
            if reconnect else None
        )

    # -- hooks: replace them ---------------------------------------------------------------------

    def on_connect(self) -> None:
        """A connection is up (the first, or a reconnection)."""

    def on_disconnect(self, reason: Failure) -> None:
        """The connection closed; what it carried and was not answered has failed."""

    def _hook(self, name: str, *args: Any) -> None:
        try:
            getattr(self, name)(*args)
        except Exception:
            log.failure("{what}: the {hook} hook raised", event="hook_failed", what=self.what,
                        hook=name)

    # -- what a subclass says --------------------------------------------------------------------

    def _connect_once(self) -> defer.Deferred:
        """One attempt to connect."""
        raise NotImplementedError

    def _on_connected(self, protocol: Connected) -> None:
        """A connection is up, before the hook and the waiters hear of it."""

    def _on_disconnected(self, reason: Failure, final: bool) -> None:
        """The connection closed; `final` when no other will follow (not reconnecting)."""

    # -- connecting ------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self.protocol is not None

    def connect(self) -> defer.Deferred:
        """Connect; the Deferred fires with this client once connected. With `reconnect` it keeps
        trying until it is (or until `close`)."""
        if self.protocol is not None:
            return defer.succeed(self)
        d: defer.Deferred = defer.Deferred()
        self._connect_waiters.append(d)
        if len(self._connect_waiters) == 1:
            self.closing = False
            if self._reconnector is not None:
                self._reconnector.start()
            else:
                # A bad address raises at once: that fails the waiters too, none is left behind.
                self._attempt = defer.maybeDeferred(self._connect_once)
                self._attempt.addErrback(self._connect_failed)
        return d

    def _connect_failed(self, reason: Failure) -> None:
        self._attempt = None
        waiters, self._connect_waiters = self._connect_waiters, []
        for d in waiters:
            d.errback(reason)

    def _connected(self, protocol: Connected) -> None:
        self.protocol = protocol
        self._attempt = None
        if self._reconnector is not None:
            # Connected: close() from here on must not cancel the attempt that made it.
            self._reconnector.connected()
        self._on_connected(protocol)
        self._hook("on_connect")
        waiters, self._connect_waiters = self._connect_waiters, []
        for d in waiters:
            d.callback(self)

    def _disconnected(self, protocol: Connected, reason: Failure) -> None:
        if self.protocol is protocol:
            self.protocol = None
        reconnector = None if self.closing else self._reconnector
        final = reconnector is None
        self._on_disconnected(reason, final)
        self._hook("on_disconnect", reason)
        if reconnector is not None:
            reconnector.lost()
            return
        waiters, self._close_waiters = self._close_waiters, []
        for d in waiters:
            d.callback(None)

    def close(self) -> defer.Deferred:
        """Stop reconnecting and close the connection; fires once it is closed. Whatever waits
        fails with ConnectionClosed."""
        self.closing = True
        attempt = self._attempt
        # Waiters first: cancelling the attempt below would fail them with CancelledError.
        self._connect_failed(Failure(ConnectionClosed(f"the {self.what} was closed")))
        if self._reconnector is not None:
            self._reconnector.stop()
        if attempt is not None:
            attempt.cancel()
        if self.protocol is None:
            self._on_disconnected(Failure(ConnectionClosed(f"the {self.what} was closed")), True)
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        self._close_waiters.append(d)
        self.protocol.transport.loseConnection()
        return d
