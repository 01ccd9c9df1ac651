"""Password logins under guessing, sans-IO: failures remembered by address and by user from one
address, and a fair queue for the slow checks.

A wrong password is remembered against its client's address (an IPv6 client by its /64, which
one host usually holds whole) and against the user it named from that address. Past its budget
a key waits before its next try, the delay doubling with each further failure up to a cap;
until it passes, a try is refused at once, without the scrypt check, so guessing costs the
broker nothing. A key is forgotten after a quiet period. Nothing is kept per user alone: no one
can lock a user out for everyone, only for the addresses they guess from. A right password
clears its user's record at that address, never the address's own (a guesser with one account of
its own must not refill its budget by logging in). Both tables are bounded; when one is full
the key whose last failure is oldest goes.

`FairQueue` holds the checks waiting for a thread, one queue per address served in turn, with a
few per address and a bound in all: a flood from some addresses makes a login from another wait
for one check of each, never behind all of theirs. When the queue is full, the newcomer takes
the newest place of the address holding the most, if that address holds more than the newcomer
would.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = [
    "REMEMBERED_FAILURES",
    "FailureRecord",
    "FailureTable",
    "FairQueue",
    "LoginThrottle",
    "QueueFull",
]

# Keys each failure table remembers at most (addresses; users at an address).
REMEMBERED_FAILURES = 10_000


class FailureRecord:
    """One key's failures in a row, when the last was, and until when it must wait."""

    __slots__ = ("failures", "last", "until")

    def __init__(self, now: float) -> None:
        self.failures = 0
        self.last = now
        self.until = now


Key = TypeVar("Key", bound=Hashable)
T = TypeVar("T")


class FailureTable(Generic[Key]):
    """Failed logins by key: past `budget` failures (0: no limit) a key waits `delay` seconds
    before its next try, twice that after its next failure, and so on up to `max_delay`; a key
    quiet for `forget_after` seconds (and no longer waiting) is forgotten."""

    def __init__(self, budget: int, delay: float, max_delay: float, forget_after: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 remembered: int = REMEMBERED_FAILURES) -> None:
        self.budget = budget
        self.delay = delay
        self.max_delay = max_delay
        self.forget_after = forget_after
        self.clock = clock
        self.remembered = remembered
        # Oldest last failure first.
        self._records: OrderedDict[Key, FailureRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def _forgotten(self, record: FailureRecord, now: float) -> bool:
        return now >= record.until and now - record.last >= self.forget_after

    def wait(self, key: Key) -> float:
        """Seconds before `key` may try again; 0.0 if it may now."""
        record = self._records.get(key)
        if record is None:
            return 0.0
        now = self.clock()
        if self._forgotten(record, now):
            del self._records[key]
            return 0.0
        return max(0.0, record.until - now)

    def failed(self, key: Key) -> None:
        if not self.budget:
            return
        now = self.clock()
        records = self._records
        record = records.get(key)
        if record is None or self._forgotten(record, now):
            record = FailureRecord(now)
        records[key] = record
        records.move_to_end(key)
        record.failures += 1
        record.last = now
        over = record.failures - self.budget
        if over >= 0:
            record.until = now + min(self.delay * 2.0 ** min(over, 64), self.max_delay)
        self._prune(now)

    def forget(self, key: Key) -> None:
        self._records.pop(key, None)

    def _prune(self, now: float) -> None:
        records = self._records
        while records:
            oldest = next(iter(records.values()))
            if len(records) <= self.remembered and not self._forgotten(oldest, now):
                return
            records.popitem(last=False)


class LoginThrottle:
    """Failed logins by address (as `wireproto.peerlog.address_key` counts one) and by user
    from one address; `refusal` says whether a login may be checked now, and counts the ones
    that may not."""

    def __init__(self, *, per_address: int, per_user: int, delay: float, max_delay: float,
                 forget_after: float, clock: Callable[[], float] = time.monotonic,
                 remembered: int = REMEMBERED_FAILURES) -> None:
        self.addresses: FailureTable[str] = FailureTable(
            per_address, delay, max_delay, forget_after, clock=clock, remembered=remembered)
        self.users: FailureTable[tuple[str, bytes]] = FailureTable(
            per_user, delay, max_delay, forget_after, clock=clock, remembered=remembered)
        # A user name becomes a short keyed digest: any name a client sends costs the same
        # few bytes, and no one can choose names that collide.
        self._key = secrets.token_bytes(16)
        # Logins refused unchecked, by "address" and "user", for /metrics.
        self.throttled: dict[str, int] = {"address": 0, "user": 0}

    def _user(self, network: str, user: str) -> tuple[str, bytes]:
        digest = hashlib.blake2b(user.encode("utf-8", "surrogatepass"), key=self._key,
                                 digest_size=16).digest()
        return network, digest

    def refusal(self, network: str, user: str) -> str | None:
        """None if `user` may try a password from `network` now, else which budget is spent,
        "address" or "user" (counted)."""
        if self.addresses.wait(network):
            by = "address"
        elif self.users.wait(self._user(network, user)):
            by = "user"
        else:
            return None
        self.throttled[by] += 1
        return by

    def failed(self, network: str, user: str) -> None:
        self.addresses.failed(network)
        self.users.failed(self._user(network, user))

    def succeeded(self, network: str, user: str) -> None:
        self.users.forget(self._user(network, user))


class QueueFull(Exception):
    """No room for one more: the message says whose limit was reached."""



class FairQueue(Generic[Key, T]):
    """Items waiting for a few workers, one queue per key, served a key at a time in turn. A
    key holds at most `per_key` items, waiting or being worked on, and all keys `in_all`."""

    def __init__(self, per_key: int, in_all: int) -> None:
        self.per_key = per_key
        self.in_all = in_all
        # Each key with items waiting, the next to be served first.
        self._waiting: OrderedDict[Key, deque[T]] = OrderedDict()
        # Items each key holds, waiting or taken and not yet `done`.
        self._held: Counter[Key] = Counter()
        self.held = 0

    def __len__(self) -> int:
        """Items waiting."""
        return sum(len(queue) for queue in self._waiting.values())

    def push(self, key: Key, item: T) -> list[T]:
        """Queue `item` for `key`; the items shed to make room for it (they will not be served),
        or QueueFull if there is none."""
        held = self._held[key]
        if held >= self.per_key:
            raise QueueFull(f"{held} password checks from this address are already waiting")
        shed = []
        if self.held >= self.in_all:
            shed.append(self._shed_for(held + 1))
        self._waiting.setdefault(key, deque()).append(item)
        self._held[key] += 1
        self.held += 1
        return shed

    def _shed_for(self, newcomer_holds: int) -> T:
        """The newest waiting item of the key holding the most, if it holds more than
        `newcomer_holds`."""
        held = self._held
        fullest = max(self._waiting, key=held.__getitem__, default=None)
        if fullest is None or held[fullest] <= newcomer_holds:
            raise QueueFull(f"{self.held} password checks are already waiting")
        queue = self._waiting[fullest]
        item = queue.pop()
        if not queue:
            del self._waiting[fullest]
        self._release(fullest)
        return item

    def pop(self) -> tuple[Key, T] | None:
        """The next key in turn and its oldest item, or None if nothing waits; the key holds the
        item until `done`."""
        if not self._waiting:
            return None
        key, queue = next(iter(self._waiting.items()))
        item = queue.popleft()
        if queue:
            self._waiting.move_to_end(key)
        else:
            del self._waiting[key]
        return key, item

    def done(self, key: Key) -> None:
        """An item `pop` gave for `key` is finished with."""
        self._release(key)

    def _release(self, key: Key) -> None:
        self.held -= 1
        self._held[key] -= 1
        if not self._held[key]:
            del self._held[key]
