"""What one principal may make the broker hold and carry, sans-IO: its connections, its
subscriptions, and the messages and bytes per second it sends (token buckets).

A principal's connections share one budget, whichever listener and protocol they came in on.
Anonymous connections have no name to share, so each address is counted on its own instead: one
host without credentials cannot take every connection slot. `PrincipalLimits` keeps the usage of
every principal with a connection open, and of a bounded number that recently closed their last
one, so reconnecting does not refill a bucket in debt.

A bucket lets a message through even when it has too few tokens, and says how long its sender
must wait before the debt is paid: the connection stops reading for that long (TCP then holds the
peer back), so nothing already sent is lost. Refused connections and subscriptions, and each
pause, are counted by protocol and limit.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wireproto.access.policy import Principal
from wireproto.settings import integer, setting, shown

__all__ = [
    "LIMITS",
    "LimitSettings",
    "PrincipalLimits",
    "PrincipalUsage",
    "TokenBucket",
    "UsageKey",
]

# The names each refusal and pause is counted under.
LIMITS = ("connections", "subscriptions", "messages", "bytes", "shared_budget",
          "retained_examined")

# Whose budget a connection spends: ("principal", its name), or ("address", its address key).
UsageKey = tuple[str, str]

# Principals without a connection whose usage is kept (their buckets may be in debt).
REMEMBERED_IDLE = 10_000


def _count_or_off(value: Any) -> int:
    if integer(value) < 0:
        raise ValueError(f"expected a count (0: no limit), got {value}")
    return value


def _share(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"expected a share above 0 and at most 1 (0.25: a quarter), got "
                         f"{shown(value)}")
    return float(value)


def _ipv6_prefix(value: Any) -> int:
    if integer(value) < 1 or value > 128:
        raise ValueError(f"expected an IPv6 prefix length from 1 to 128, got {value}")
    return value


def _rate_or_off(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"expected a rate per second (0: no limit), got {shown(value)}")
    return float(value)


@dataclass(frozen=True)
class LimitSettings:
    """The [limits] table: what each principal may hold and send, across all its connections
    (anonymous ones: each address). 0 turns a limit off; a burst of 0 is one second's worth."""

    connections: int = setting(1000, read=_count_or_off)
    subscriptions: int = setting(10_000, read=_count_or_off)
    messages_per_second: float = setting(0.0, read=_rate_or_off)
    message_burst: int = setting(0, read=_count_or_off)
    bytes_per_second: float = setting(0.0, read=_rate_or_off)
    byte_burst: int = setting(0, read=_count_or_off)
    # The most of a budget the whole broker shares (subscribed topic bytes, pending HTTP
    # requests) that one principal or address may take.
    max_share: float = setting(0.25, read=_share)
    # IPv6 peers are counted by their network of this many bits (128: each address).
    ipv6_prefix: int = setting(64, read=_ipv6_prefix)

    @property
    def metered(self) -> bool:
        """Whether messages are counted against a rate at all."""
        return bool(self.messages_per_second or self.bytes_per_second)


class TokenBucket:
    """`rate` tokens a second, up to `capacity`; `tokens` below 0 is a debt. Taken from by
    `PrincipalLimits.charge`, which writes `take` out for speed, and by `take`."""

    __slots__ = ("rate", "capacity", "tokens", "stamp")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.stamp = now

    def take(self, amount: float, now: float) -> float:
        """Take `amount` tokens, going into debt if need be; the seconds until the debt is
        paid (0.0 when there is none)."""
        tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate) - amount
        self.tokens = tokens
        self.stamp = now
        return -tokens / self.rate if tokens < 0 else 0.0


class PrincipalUsage:
    """One principal's (or anonymous address's) connections, subscriptions and buckets."""

    __slots__ = ("key", "holders", "connections", "subscriptions", "subscription_bytes",
                 "messages", "bytes", "examined")

    def __init__(self, key: UsageKey, messages: TokenBucket | None,
                 bytes_: TokenBucket | None) -> None:
        self.key = key
        self.holders = 0
        self.connections = 0
        self.subscriptions = 0
        # Its share of the broker's subscribed topic bytes (Hub.subscription_bytes).
        self.subscription_bytes = 0
        # The kept values its pattern subscribes examine (wireproto.limits), made when needed.
        self.examined: TokenBucket | None = None
        self.messages = messages
        self.bytes = bytes_

    def __repr__(self) -> str:
        return (f"<PrincipalUsage {self.key!r} {self.connections} connections, "
                f"{self.subscriptions} subscriptions>")


def describe_key(key: UsageKey) -> str:
    kind, value = key
    return repr(value) if kind == "principal" else f"anonymous clients from {value}"


class PrincipalLimits:
    """Every principal's usage against one `LimitSettings`. Whoever counts something against a
    principal holds its usage (`acquire`, then `release`)."""

    def __init__(self, settings: LimitSettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 remember_idle: int = REMEMBERED_IDLE) -> None:
        self.settings = settings or LimitSettings()
        self.clock = clock
        self.remember_idle = remember_idle
        self._usage: dict[UsageKey, PrincipalUsage] = {}
        self._idle: OrderedDict[UsageKey, None] = OrderedDict()
        # Refusals and pauses by (protocol, limit), for /metrics.
        self.exceeded: dict[tuple[str, str], int] = {}
        # Usages holding any subscribed topic bytes.
        self.subscription_holders = 0

    @property
    def metered(self) -> bool:
        return self.settings.metered

    @staticmethod
    def key(principal: Principal, peer_key: str) -> UsageKey:
        """Whose budget a connection spends: its principal's, or, anonymous, its address's."""
        if principal.name is not None:
            return ("principal", principal.name)
        return ("address", peer_key)

    def usage(self, key: UsageKey) -> PrincipalUsage | None:
        return self._usage.get(key)

    def __len__(self) -> int:
        return len(self._usage)

    def acquire(self, key: UsageKey) -> PrincipalUsage:
        usage = self._usage.get(key)
        if usage is None:
            settings, now = self.settings, self.clock()
            messages = bytes_ = None
            if settings.messages_per_second:
                messages = TokenBucket(settings.messages_per_second,
                                       settings.message_burst or settings.messages_per_second,
                                       now)
            if settings.bytes_per_second:
                bytes_ = TokenBucket(settings.bytes_per_second,
                                     settings.byte_burst or settings.bytes_per_second, now)
            usage = self._usage[key] = PrincipalUsage(key, messages, bytes_)
        elif not usage.holders:
            self._idle.pop(key, None)
        usage.holders += 1
        return usage

    def release(self, usage: PrincipalUsage) -> None:
        usage.holders -= 1
        if usage.holders:
            return
        if usage.messages is None and usage.bytes is None and usage.examined is None:
            del self._usage[usage.key]
            return
        idle = self._idle
        idle[usage.key] = None
        while len(idle) > self.remember_idle:
            forgotten, _ = idle.popitem(last=False)
            del self._usage[forgotten]

    def count(self, protocol: str, limit: str) -> None:
        key = (protocol, limit)
        self.exceeded[key] = self.exceeded.get(key, 0) + 1

    # -- what each limit allows -----------------------------------------------------------------

    def open_connection(self, usage: PrincipalUsage, protocol: str) -> str | None:
        """Count one more connection, or say why not (counted)."""
        limit = self.settings.connections
        if limit and usage.connections >= limit:
            self.count(protocol, "connections")
            return (f"{describe_key(usage.key)}: already {usage.connections} connections "
                    "([limits] connections)")
        usage.connections += 1
        return None

    def close_connection(self, usage: PrincipalUsage) -> None:
        usage.connections -= 1

    def hold_subscription(self, usage: PrincipalUsage, protocol: str) -> str | None:
        """Count one more subscription, or say why not (counted)."""
        problem = self._subscriptions_problem(usage, 1)
        if problem is not None:
            self.count(protocol, "subscriptions")
            return problem
        usage.subscriptions += 1
        return None

    def _subscriptions_problem(self, usage: PrincipalUsage, more: int) -> str | None:
        limit = self.settings.subscriptions
        if limit and usage.subscriptions + more > limit:
            return (f"{describe_key(usage.key)}: already {usage.subscriptions} subscriptions "
                    "([limits] subscriptions)")
        return None

    def room_for_subscriptions(self, usage: PrincipalUsage, count: int, size: int, total: int,
                               budget: int) -> str | None:
        """Why `usage` could not take `count` more subscriptions of `size` topic bytes (of the
        broker's `budget`, `total` taken), as `hold_subscription` and
        `take_subscription_bytes` would say; None if it could. Changes and counts nothing."""
        return (self._subscriptions_problem(usage, count)
                or self._subscription_bytes_problem(usage, size, total, budget))

    def release_subscription(self, usage: PrincipalUsage) -> None:
        usage.subscriptions -= 1

    def take_subscription_bytes(self, usage: PrincipalUsage, size: int, total: int,
                                budget: int, protocol: str) -> str | None:
        """Count `size` more bytes of subscribed topics against `usage`'s share of the
        broker's `budget`, of which `total` is taken, or say why not (counted).

        No one may hold more than `max_share` of it. A full budget still takes a subscribe
        from whoever holds less than an equal share of it (the budget over the number of
        those holding any), so a few addresses that filled it cannot shut everyone else out;
        the broker then holds at most twice the budget."""
        problem = self._subscription_bytes_problem(usage, size, total, budget)
        if problem is not None:
            self.count(protocol, "shared_budget")
            return problem
        held = usage.subscription_bytes
        if not held and size:
            self.subscription_holders += 1
        usage.subscription_bytes = held + size
        return None

    def _subscription_bytes_problem(self, usage: PrincipalUsage, size: int, total: int,
                                    budget: int) -> str | None:
        held = usage.subscription_bytes
        share = self.settings.max_share
        if total + size > budget:
            holders = self.subscription_holders + (0 if held else 1)
            if held + size > budget / holders:
                return (f"the broker holds {budget} bytes of subscribed topics in all, and "
                        f"{describe_key(usage.key)} an equal share of them or more "
                        "([hub] max_total_subscription_bytes)")
        if held + size > share * budget:
            return (f"{describe_key(usage.key)}: {held} bytes of subscribed topics already, "
                    f"and no one may hold more than {share:.0%} of the broker's {budget} "
                    "([limits] max_share)")
        return None

    def release_subscription_bytes(self, usage: PrincipalUsage, size: int) -> None:
        held = usage.subscription_bytes = usage.subscription_bytes - size
        if not held and size:
            self.subscription_holders -= 1

    def charge(self, usage: PrincipalUsage, size: int) -> float:
        """Take one message of `size` bytes from the buckets, which always take (a bucket may go
        into debt); the seconds its sender must now wait (0.0 when it need not). Each bucket's
        refill is written out rather than a method call: this runs for every message."""
        now = self.clock()
        wait = 0.0
        bucket = usage.messages
        if bucket is not None:
            tokens = bucket.tokens + (now - bucket.stamp) * bucket.rate
            if tokens > bucket.capacity:
                tokens = bucket.capacity
            bucket.tokens = tokens = tokens - 1
            bucket.stamp = now
            if tokens < 0:
                wait = -tokens / bucket.rate
        bucket = usage.bytes
        if bucket is not None:
            tokens = bucket.tokens + (now - bucket.stamp) * bucket.rate
            if tokens > bucket.capacity:
                tokens = bucket.capacity
            bucket.tokens = tokens = tokens - size
            bucket.stamp = now
            if tokens < 0 and -tokens / bucket.rate > wait:
                wait = -tokens / bucket.rate
        return wait
