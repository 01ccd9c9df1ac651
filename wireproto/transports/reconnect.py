"""Keep a client connected: connect, and after a failed attempt or a lost connection, wait as a
retry policy says and connect again, until stopped.

Every client of the project that keeps a connection up does it through one `Reconnector`: the
UBRE, nydus and SubbleSocket clients (wireproto.protocols.client), ``wireproto sub
--reconnect``, the NATS client of a cluster, and, through `ReconnectingService`, the service's
attached links and Phyllo links. Each brings two things of its own:

- a retry policy, ``policy(failed_attempts) -> seconds`` as Twisted's `backoffPolicy` makes:
  `DEFAULT_RETRY` unless it says otherwise. It is asked with the number of attempts that failed
  in a row: 1 after the first failure, 0 after a connection that was up closes;
- what to connect to next: one address its connect function knows, or a `Rotation` over a list
  (the NATS servers of a cluster, with `backoff_per_round` as its policy).

The reconnector is a state machine (`ReconnectState`, changed only through `TRANSITIONS`):
connecting, connected, waiting to retry, stopped.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from enum import Enum
from typing import Any, Generic, TypeVar, cast, overload

from twisted.application.internet import backoffPolicy
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.interfaces import (
    IDelayedCall,
    IProtocol,
    IProtocolFactory,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.logger import Logger
from twisted.python.failure import Failure

__all__ = [
    "DEFAULT_RETRY",
    "RetryPolicy",
    "ReconnectState",
    "ReconnectEvent",
    "TRANSITIONS",
    "Reconnector",
    "Rotation",
    "backoff_per_round",
    "ReconnectingService",
]

log = Logger()

T = TypeVar("T")

RetryPolicy = Callable[[int], float]
"""``policy(failed_attempts) -> seconds`` to wait before the next attempt."""

# Quick at first, then every 30 s at most, with jitter so a fleet does not reconnect in step.
DEFAULT_RETRY: RetryPolicy = backoffPolicy(initialDelay=0.5, maxDelay=30.0)


class ReconnectState(Enum):
    STOPPED = "stopped"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    WAITING = "waiting to retry"


class ReconnectEvent(Enum):
    START = "start"
    CONNECTED = "connected"
    FAILED = "attempt failed"
    LOST = "connection lost"
    RETRY_DUE = "retry due"
    STOP = "stop"


_S, _E = ReconnectState, ReconnectEvent

# Every change of state. An event a state has no entry for changes nothing: a second start, a
# stop when stopped, a lost connection reported while waiting or while an attempt is under way
# (that attempt's failure is what counts), anything reported after stop.
TRANSITIONS: dict[tuple[ReconnectState, ReconnectEvent], ReconnectState] = {
    (_S.STOPPED, _E.START): _S.CONNECTING,
    (_S.CONNECTING, _E.CONNECTED): _S.CONNECTED,
    (_S.CONNECTING, _E.FAILED): _S.WAITING,
    (_S.CONNECTED, _E.LOST): _S.WAITING,
    (_S.WAITING, _E.RETRY_DUE): _S.CONNECTING,
    (_S.CONNECTING, _E.STOP): _S.STOPPED,
    (_S.CONNECTED, _E.STOP): _S.STOPPED,
    (_S.WAITING, _E.STOP): _S.STOPPED,
}


class Rotation(Generic[T]):
    """Targets tried in turn, round and round. `targets` is the list itself, not a copy: what
    is added to it later (the servers a NATS server names) joins the rotation."""

    def __init__(self, targets: list[T]) -> None:
        if not targets:
            raise ValueError("a rotation needs at least one target")
        self.targets = targets
        self._index = -1

    def next(self) -> T:
        self._index = (self._index + 1) % len(self.targets)
        return self.targets[self._index]

    def __len__(self) -> int:
        return len(self.targets)


def backoff_per_round(
    rotation: Rotation[Any], initial: float, maximum: float,
    jitter: Callable[[], float] = random.random,
) -> RetryPolicy:
    """A policy for a rotation: the first time round the list without waiting, then a wait
    that doubles with each round (`initial` times 2 after the first round), `maximum` at most,
    each shortened by up to half at random."""

    def policy(failed_attempts: int) -> float:
        targets = max(len(rotation), 1)
        if failed_attempts < targets:
            return 0.0
        rounds = min(failed_attempts // targets, 10)
        return min(initial * 2 ** rounds, maximum) * (0.5 + jitter() / 2)

    return policy


class Reconnector(Generic[T]):
    """Connect through `connect` (a Deferred that fires once the connection is ready to use,
    or fails) again and again, waiting `retry_policy(failed_attempts)` seconds between tries.

    Without `targets`, ``connect()`` knows where to connect; with a `Rotation`, each attempt is
    ``connect(targets.next())``. Whoever owns the connection calls `lost()` when it closes, and
    may call `connected()` as soon as it is up (before the attempt's Deferred fires). A connect
    function that raises (a bad address: trying again cannot help) stops the reconnector and
    the exception goes to the caller.
    """

    @overload
    def __init__(
        self: Reconnector[None], reactor: IReactorTime, connect: Callable[[], defer.Deferred],
        *, retry_policy: RetryPolicy = ..., what: str = ..., log_retries: bool = ...,
    ) -> None: ...

    @overload
    def __init__(
        self, reactor: IReactorTime, connect: Callable[[T], defer.Deferred], *,
        targets: Rotation[T], retry_policy: RetryPolicy = ..., what: str = ...,
        log_retries: bool = ...,
    ) -> None: ...

    def __init__(
        self,
        reactor: IReactorTime,
        connect: Callable[..., defer.Deferred],
        *,
        targets: Rotation[T] | None = None,
        retry_policy: RetryPolicy = DEFAULT_RETRY,
        what: str = "connection",
        log_retries: bool = True,
    ) -> None:
        self.reactor = reactor
        self._connect = connect
        self.targets = targets
        self.retry_policy = retry_policy
        self.what = what
        self.log_retries = log_retries
        self.state = ReconnectState.STOPPED
        # Attempts failed in a row, for the policy; retries made since the last connection,
        # for the log.
        self.failed_attempts = 0
        self.retries = 0
        self._attempt: defer.Deferred | None = None
        self._wait: IDelayedCall | None = None

    @property
    def running(self) -> bool:
        return self.state is not ReconnectState.STOPPED

    def _move(self, event: ReconnectEvent) -> bool:
        """Take `event`; False (and no change) if the state has no transition for it."""
        new = TRANSITIONS.get((self.state, event))
        if new is None:
            return False
        self.state = new
        return True

    # -- what the owner says ---------------------------------------------------------------------

    def start(self) -> None:
        if self._move(ReconnectEvent.START):
            self.retries = 0
            self._try()

    def stop(self) -> None:
        """No more attempts: a wait is cancelled, and so is an attempt under way."""
        if not self._move(ReconnectEvent.STOP):
            return
        wait, self._wait = self._wait, None
        if wait is not None and wait.active():
            wait.cancel()
        attempt, self._attempt = self._attempt, None
        if attempt is not None:
            attempt.cancel()

    def connected(self) -> None:
        """The attempt under way has connected. From then on `stop` must not cancel it
        (Twisted cannot stop connecting a connection already made), and `lost` may follow."""
        if self._move(ReconnectEvent.CONNECTED):
            self._attempt = None
            self.failed_attempts = 0
            self.retries = 0

    def lost(self) -> None:
        """The connection closed: connect again after `retry_policy(0)`."""
        if self._move(ReconnectEvent.LOST):
            self.failed_attempts = 0
            self._wait_to_retry("the connection closed")

    # -- attempts and waits ----------------------------------------------------------------------

    def _try(self) -> None:
        try:
            if self.targets is None:
                attempt = self._connect()
            else:
                attempt = self._connect(self.targets.next())
        except BaseException:
            self._move(ReconnectEvent.STOP)
            raise
        self._attempt = attempt
        attempt.addCallbacks(self._succeeded, self._failed,
                             callbackArgs=(attempt,), errbackArgs=(attempt,))

    def _succeeded(self, result: Any, attempt: defer.Deferred) -> Any:
        if attempt is self._attempt:
            self.connected()
        return result

    def _failed(self, reason: Failure, attempt: defer.Deferred) -> None:
        if attempt is not self._attempt:
            return  # cancelled by stop, or outlived by a connection reported up
        self._attempt = None
        if self._move(ReconnectEvent.FAILED):
            self.failed_attempts += 1
            self._wait_to_retry(reason.getErrorMessage())

    def _wait_to_retry(self, why: str) -> None:
        delay = self.retry_policy(self.failed_attempts)
        self.retries += 1
        if self.log_retries:
            log.info("Scheduling retry {retry} to connect {what} in {delay:.2f} seconds "
                     "({why})", event="reconnect_scheduled", retry=self.retries, what=self.what,
                     delay=delay, why=why.rstrip("."))
        self._wait = self.reactor.callLater(delay, self._retry_due)

    def _retry_due(self) -> None:
        self._wait = None
        if self._move(ReconnectEvent.RETRY_DUE):
            self._try()


# -- one endpoint and one protocol factory, as a service ------------------------------------------


class _ConnectionProxy:
    """A connection's protocol, which tells its `ReconnectingService` when it is made and when
    it is lost, and is otherwise the protocol itself: its attributes, and its interfaces (the
    class declares none, so zope.interface asks ``__getattr__`` for ``__providedBy__``)."""

    def __init__(self, protocol: IProtocol, service: ReconnectingService) -> None:
        self._protocol = protocol
        self._service = service

    def makeConnection(self, transport: Any) -> None:
        self.transport = transport
        self._service._made(self)
        self._protocol.makeConnection(transport)

    def connectionLost(self, reason: Failure) -> None:
        try:
            self._protocol.connectionLost(reason)
        finally:
            self._service._lost(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._protocol, name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._protocol!r}>"


class _ProxyingFactory:
    """`factory`, building `_ConnectionProxy` protocols."""

    def __init__(self, factory: IProtocolFactory, service: ReconnectingService) -> None:
        self._factory = factory
        self._service = service

    def buildProtocol(self, addr: Any) -> _ConnectionProxy | None:
        protocol = self._factory.buildProtocol(addr)
        return None if protocol is None else _ConnectionProxy(protocol, self._service)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._factory, name)


class ReconnectingService(Service):
    """Keeps one connection of `factory`'s protocol open to `endpoint` while the service runs,
    connecting again as `retry_policy` says whenever it fails or closes (as Twisted's
    ClientService does, on the project's one `Reconnector`). Stopping the service closes the
    connection; its Deferred fires once it has closed."""

    def __init__(
        self,
        reactor: IReactorTime,
        endpoint: IStreamClientEndpoint,
        factory: IProtocolFactory,
        *,
        retry_policy: RetryPolicy = DEFAULT_RETRY,
        what: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.factory = factory
        self.reconnector: Reconnector[None] = Reconnector(
            reactor, self._connect, retry_policy=retry_policy,
            what=repr(endpoint) if what is None else what,
        )
        self.protocol: _ConnectionProxy | None = None
        self._closed_waiters: list[defer.Deferred] = []

    def _connect(self) -> defer.Deferred:
        # The proxy declares no interface of its own: it has the factory's.
        factory = cast(IProtocolFactory, _ProxyingFactory(self.factory, self))
        return self.endpoint.connect(factory)

    def _made(self, protocol: _ConnectionProxy) -> None:
        self.protocol = protocol
        self.reconnector.connected()

    def _lost(self, protocol: _ConnectionProxy) -> None:
        if protocol is self.protocol:
            self.protocol = None
        self.reconnector.lost()
        waiters, self._closed_waiters = self._closed_waiters, []
        for d in waiters:
            d.callback(None)

    def startService(self) -> None:
        super().startService()
        self.reconnector.start()

    def stopService(self) -> defer.Deferred:
        super().stopService()
        self.reconnector.stop()
        if self.protocol is None:
            return defer.succeed(None)
        closed: defer.Deferred = defer.Deferred()
        self._closed_waiters.append(closed)
        self.protocol.transport.loseConnection()
        return closed

