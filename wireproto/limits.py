"""A principal's connection and rate limits, kept at the message-transport boundary, whatever the
protocol (wireproto.access.quotas says what they are).

The service wraps each connection's protocol in a `LimitingProtocol`. A connection past its
principal's `[limits] connections` is closed with LimitExceeded before its protocol sees it, so
it costs no session. With a rate configured, every message received is charged to the
principal's buckets; one that leaves them in debt is still handled, and the connection stops
reading until the debt is paid, so the peer is slowed by TCP and nothing it sent is lost. What
the transport had already read when it paused (one read's worth) waits here, and is handled, in
order and charged in turn, once the debt is paid.

The same pause bounds what a principal's pattern subscribes (an anonymous address's), on all
its connections together, may make the hub examine among its last values ([hub]
retained_examined_per_second): each message is charged, in a bucket of the principal's, with
the kept values the hub examined while handling it (`LastValues.examined`), so a principal or
address that subscribes too much, however many connections it opens, slows only itself.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto import peerlog
from wireproto.access import ANONYMOUS
from wireproto.access.quotas import PrincipalLimits, PrincipalUsage, TokenBucket
from wireproto.errors import LimitExceeded
from wireproto.peerlog import address_key, describe_address
from wireproto.transports.base import IMessageProtocol, IMessageTransport

if TYPE_CHECKING:
    from twisted.internet.interfaces import IDelayedCall

    from wireproto.hub.retained import LastValues

__all__ = ["LimitingProtocol"]

log = Logger(namespace="wireproto.limits")


@implementer(IMessageProtocol)
class LimitingProtocol:
    """Counts the connection against its principal's limits around the protocol `wrapped`, and
    against `examined_per_second` kept values of `last_values` examined for its principal (0:
    no limit)."""

    def __init__(self, wrapped: IMessageProtocol, limits: PrincipalLimits, protocol: str,
                 reactor: Any, *, last_values: LastValues | None = None,
                 examined_per_second: int = 0) -> None:
        self.wrapped = wrapped
        self.limits = limits
        self.protocol = protocol
        self.reactor = reactor
        # The hub's last values, when what they examine for this connection is bounded.
        self.last_values = last_values if examined_per_second else None
        self.examined_per_second = examined_per_second
        self.transport: IMessageTransport | None = None
        self.usage: PrincipalUsage | None = None
        self.admitted = False
        self._resume: IDelayedCall | None = None
        # Messages received while reading is paused, if it is.
        self._held: deque[tuple[bytes, bool]] | None = None

    def makeConnection(self, transport: IMessageTransport) -> None:
        self.transport = transport
        limits = self.limits
        peer = transport.getPeer()
        principal = getattr(transport, "principal", None) or ANONYMOUS
        usage = self.usage = limits.acquire(limits.key(principal, address_key(peer)))
        problem = limits.open_connection(usage, self.protocol)
        if problem is not None:
            peerlog.warn(log, address_key(peer),
                         "{protocol}: refused a connection from {peer}: {problem}",
                         event="limited", limit="connections", protocol=self.protocol,
                         peer=describe_address(peer), principal=principal.name,
                         problem=problem)
            transport.loseConnection(LimitExceeded(problem))
            return
        self.admitted = True
        self.wrapped.makeConnection(transport)
        if not limits.metered and self.last_values is None:
            # Deliveries skip this wrapper (a wrapper inside may have just done the same).
            self.messageReceived = self.wrapped.messageReceived  # type: ignore[method-assign]

    def connectionMade(self) -> None:
        """Never called: makeConnection hands the connection on."""

    def messageReceived(self, data: bytes, binary: bool) -> None:
        held = self._held
        if held is None:
            if self.admitted:
                last_values = self.last_values
                if last_values is None:
                    self.wrapped.messageReceived(data, binary)
                    # None once handling the message closed the connection: nothing to charge
                    usage = self.usage
                    wait = 0.0 if usage is None else self.limits.charge(usage, len(data))
                else:
                    # What the hub examined while handling this message is this connection's.
                    examined = last_values.examined
                    self.wrapped.messageReceived(data, binary)
                    wait = 0.0
                    usage = self.usage
                    if self.limits.metered and usage is not None:
                        wait = self.limits.charge(usage, len(data))
                    examined = last_values.examined - examined
                    if examined:
                        wait = max(wait, self._charge_examined(examined))
                if wait and self.admitted:
                    self._pause(wait)
        elif self.admitted:
            # Read before the transport paused (one read's worth at most): handled in order
            # once the debt is paid.
            held.append((data, binary))

    def _pause(self, wait: float) -> None:
        """Stop reading for `wait` seconds, until the buckets are out of debt."""
        self.limits.count(self.protocol, self._limit_in_debt())
        self._held = deque()
        if self.transport is not None:  # admitted, so given
            self.transport.pauseProducing()
        self._resume = self.reactor.callLater(wait, self._debt_paid)

    def _charge_examined(self, examined: int) -> float:
        """Take `examined` from the principal's bucket; the seconds this connection must now
        wait."""
        now = self.limits.clock()
        usage = self.usage
        assert usage is not None
        bucket = usage.examined
        if bucket is None:
            rate = self.examined_per_second
            bucket = usage.examined = TokenBucket(rate, rate, now)
        return bucket.take(examined, now)

    def _limit_in_debt(self) -> str:
        usage = self.usage
        assert usage is not None
        for limit, bucket in (("messages", usage.messages), ("bytes", usage.bytes)):
            if bucket is not None and bucket.tokens < 0:
                return limit
        return "retained_examined"

    def _debt_paid(self) -> None:
        self._resume = None
        held, self._held = self._held, None
        while held and self.admitted:
            self.messageReceived(*held.popleft())
            if self._held is not None:  # in debt again: the rest waits, in order
                self._held = held
                return
        if self.admitted and self.transport is not None:
            self.transport.resumeProducing()

    def connectionLost(self, reason: Failure) -> None:
        self._held = None
        resume, self._resume = self._resume, None
        if resume is not None and resume.active():
            resume.cancel()
        usage, self.usage = self.usage, None
        if self.admitted:
            self.admitted = False
            if usage is not None:  # admitted, so acquired
                self.limits.close_connection(usage)
            self.wrapped.connectionLost(reason)
        if usage is not None:
            self.limits.release(usage)
