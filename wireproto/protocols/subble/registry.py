"""The SubbleSocket host's client registry (IDs it knows, kept in sqlite or memory) and the
address checks it makes before a handshake (see docs/subblesocket.md)."""


from __future__ import annotations

import os
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from typing import Any

from wireproto.errors import (
    LimitExceeded,
)

__all__ = [
    "DEFAULT_MAX_REGISTRY_IDS",
    "DEFAULT_MAX_IDS_PER_OWNER",
    "DEFAULT_REGISTRY_TTL",
    "DEFAULT_NEW_IDS_PER_MINUTE",
    "Network",
    "ClientRegistry",
]


DEFAULT_MAX_REGISTRY_IDS = 1_000_000
# Client IDs one principal may own.
DEFAULT_MAX_IDS_PER_OWNER = 10_000
# IDs a host learned on its own (registry not enforced) are forgotten after 30 days unseen.
DEFAULT_REGISTRY_TTL = 30 * 24 * 3600.0
# New client IDs one address may have the registry take, per minute.
DEFAULT_NEW_IDS_PER_MINUTE = 60


Network = IPv4Network | IPv6Network


# -- the client registry --------------------------------------------------------------------------


class ClientRegistry:
    """The client IDs this host knows: in memory (`path` None) or in a sqlite file, so that
    clients come back after a restart. At most `max_ids` IDs; past that, IDs not seen for `ttl`
    seconds are forgotten, and then the unowned ID seen longest ago; only with `ttl` None (the
    registry holds the IDs handed out, and none is forgotten) or when every ID is owned do `add`
    and `new_id` raise LimitExceeded.

    Each ID keeps when it was last seen (`add` and `seen`), in whole seconds of `clock`.
    `expire()` forgets those older than `ttl`; `SubbleHost` calls it every `ttl / 10` seconds
    (at most hourly). The sqlite file, new or not, is made readable by its owner only (`mode`).

    An ID may have an owner, the named principal that first used it (`add(id, owner)`): it
    stays that principal's until the ID expires. An owner has at most `max_ids_per_owner` IDs;
    past that, giving it another raises LimitExceeded. Ownership lives in the ID's own entry,
    so `max_ids` bounds it too; in memory each owner's name is kept once.

    sqlite runs on the reactor thread. That is acceptable for a file on a local disk: a lookup is
    one indexed read, and a write one tiny row in WAL mode without an fsync per commit (a power
    cut may lose the last IDs written; a crash of the process does not). Do not put the file on a
    network filesystem.
    """

    def __init__(
        self, path: str | os.PathLike | None = None, *, max_ids: int = DEFAULT_MAX_REGISTRY_IDS,
        ttl: float | None = DEFAULT_REGISTRY_TTL, mode: int = 0o600,
        clock: Callable[[], float] = time.time,
        max_ids_per_owner: int = DEFAULT_MAX_IDS_PER_OWNER,
    ) -> None:
        self.path = path
        self.max_ids = max_ids
        self.max_ids_per_owner = max_ids_per_owner
        self.ttl = ttl
        self.clock = clock
        self._ids: dict[str, int] = {}
        # In memory: each owned ID's owner, and how many IDs each owner has.
        self._owners: dict[str, str] = {}
        self._owned: dict[str, int] = {}
        self._db: sqlite3.Connection | None = None
        self._count = 0
        # IDs forgotten early to make room in a full registry.
        self.forgotten = 0
        if path is not None:
            # sqlite gives its -wal and -shm files the database file's permissions.
            os.close(os.open(os.fspath(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode))
            os.chmod(path, mode)
            # Autocommit: each add is its own tiny transaction.
            db = sqlite3.connect(os.fspath(path), isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS clients (id TEXT PRIMARY KEY) WITHOUT ROWID")
            columns = {row[1] for row in db.execute("PRAGMA table_info(clients)")}
            if "last_seen" not in columns:  # a registry from before IDs expired
                db.execute("ALTER TABLE clients ADD COLUMN last_seen INTEGER NOT NULL DEFAULT 0")
                db.execute("UPDATE clients SET last_seen = ?", (self._now(),))
            if "owner" not in columns:  # a registry from before IDs had owners
                db.execute("ALTER TABLE clients ADD COLUMN owner TEXT")
            db.execute("CREATE INDEX IF NOT EXISTS clients_by_owner ON clients (owner)")
            db.execute("CREATE INDEX IF NOT EXISTS clients_by_last_seen ON clients (last_seen)")
            (self._count,) = db.execute("SELECT count(*) FROM clients").fetchone()
            self._db = db

    def _now(self) -> int:
        return int(self.clock())

    def __contains__(self, client_id: str) -> bool:
        if self._db is None:
            if self.path is not None:
                raise ValueError("the client registry is closed")
            return client_id in self._ids
        row = self._db.execute("SELECT 1 FROM clients WHERE id = ?", (client_id,)).fetchone()
        return row is not None

    def __len__(self) -> int:
        return self._count if self.path is not None else len(self._ids)

    def add(self, client_id: str, owner: str | None = None) -> str | None:
        """Remember `client_id`, seen now (a known one is only marked seen), and give it to
        `owner` if it has no owner yet. Returns its owner (None: it has none), which is not
        `owner` if another had it first."""
        if client_id in self:
            self.seen(client_id)
        else:
            if owner is not None:
                self.check_room(owner)  # before the ID is kept: no orphan when it is refused
            if len(self) >= self.max_ids:
                self.expire()
            if len(self) >= self.max_ids and self.ttl is not None:
                # IDs the host learned on its own: the least recently seen one without an
                # owner is forgotten early, so clients that fill the registry with new IDs
                # keep no newcomer out (a forgotten ID that comes back is learned again).
                self._forget_least_recently_seen()
            if len(self) >= self.max_ids:
                raise LimitExceeded(
                    f"the client registry is full: it holds at most {self.max_ids} client IDs"
                )
            if self._db is not None:
                inserted = self._db.execute(
                    "INSERT OR IGNORE INTO clients (id, last_seen) VALUES (?, ?)",
                    (client_id, self._now()),
                ).rowcount
                self._count += inserted
            else:
                self._ids[client_id] = self._now()
        if owner is None:
            return self.owner(client_id)
        return self._claim(client_id, owner)

    def owner(self, client_id: str) -> str | None:
        """The principal that owns `client_id`, or None."""
        if self._db is None:
            return self._owners.get(client_id)
        row = self._db.execute("SELECT owner FROM clients WHERE id = ?", (client_id,)).fetchone()
        return None if row is None else row[0]

    def owned_by(self, owner: str) -> int:
        """How many client IDs `owner` owns."""
        if self._db is None:
            return self._owned.get(owner, 0)
        (count,) = self._db.execute(
            "SELECT count(*) FROM clients WHERE owner = ?", (owner,)
        ).fetchone()
        return int(count)

    def check_room(self, owner: str) -> int:
        """How many IDs `owner` owns; LimitExceeded if it may own no more."""
        owned = self.owned_by(owner)
        if owned >= self.max_ids_per_owner:
            raise LimitExceeded(
                f"{owner} owns {owned} client IDs, the most one principal may; connect with one "
                "of them"
            )
        return owned

    def _claim(self, client_id: str, owner: str) -> str:
        """Give the known `client_id` to `owner` unless another has it; its owner after."""
        current = self.owner(client_id)
        if current is not None:
            return current
        owned = self.check_room(owner)
        if self._db is not None:
            # Only if no one did meanwhile: broker processes may share the file.
            self._db.execute("UPDATE clients SET owner = ? WHERE id = ? AND owner IS NULL",
                             (owner, client_id))
            return self.owner(client_id) or owner
        owner = sys.intern(owner)  # one copy of a name, however many IDs it owns
        self._owners[client_id] = owner
        self._owned[owner] = owned + 1
        return owner

    def seen(self, client_id: str) -> None:
        """Mark a known `client_id` as seen now, so it does not expire."""
        if self._db is not None:
            self._db.execute("UPDATE clients SET last_seen = ? WHERE id = ?",
                             (self._now(), client_id))
        elif client_id in self._ids:
            # Moved to the end: the in-memory IDs stay in the order they were last seen.
            del self._ids[client_id]
            self._ids[client_id] = self._now()

    def _forget_least_recently_seen(self) -> None:
        """Forget the unowned ID seen longest ago, if there is one; counted in `forgotten`."""
        if self._db is not None:
            gone = self._db.execute(
                "DELETE FROM clients WHERE id = (SELECT id FROM clients WHERE owner IS NULL "
                "ORDER BY last_seen LIMIT 1)").rowcount
            self._count -= gone
        else:
            oldest = next((client_id for client_id in self._ids
                           if client_id not in self._owners), None)
            gone = 0 if oldest is None else 1
            if oldest is not None:
                del self._ids[oldest]
        self.forgotten += gone

    def expire(self) -> int:
        """Forget the IDs not seen for `ttl` seconds; how many were forgotten."""
        if self.ttl is None:
            return 0
        cutoff = self._now() - self.ttl
        if self._db is not None:
            gone = self._db.execute("DELETE FROM clients WHERE last_seen < ?", (cutoff,)).rowcount
            self._count -= gone
            return gone
        old = [client_id for client_id, seen in self._ids.items() if seen < cutoff]
        for client_id in old:
            del self._ids[client_id]
            owner = self._owners.pop(client_id, None)
            if owner is not None:
                left = self._owned[owner] - 1
                if left:
                    self._owned[owner] = left
                else:
                    del self._owned[owner]
        return len(old)

    def new_id(self, owner: str | None = None) -> str:
        """A new unique ID (uuid4 text), added to the registry as `owner`'s, if given."""
        if owner is not None:
            self.check_room(owner)
        while True:
            client_id = str(uuid.uuid4())
            if client_id not in self:
                self.add(client_id, owner)
                return client_id

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


class NewIdBudget:
    """How many client IDs one address may add to the registry: `per_minute`, in a token
    bucket that holds a minute's worth."""

    # Addresses remembered at once; a full bucket is forgotten first.
    MAX_ADDRESSES = 100_000

    def __init__(self, per_minute: int, clock: Callable[[], float]) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, address: str) -> bool:
        now = self.clock()
        rate = self.per_minute / 60.0
        tokens, then = self._buckets.get(address, (float(self.per_minute), now))
        tokens = min(float(self.per_minute), tokens + (now - then) * rate)
        if tokens < 1.0:
            self._buckets[address] = (tokens, now)
            return False
        self._buckets[address] = (tokens - 1.0, now)
        if len(self._buckets) > self.MAX_ADDRESSES:
            self._forget_full(now, rate)
        return True

    def _forget_full(self, now: float, rate: float) -> None:
        full = [address for address, (tokens, then) in self._buckets.items()
                if tokens + (now - then) * rate >= self.per_minute]
        for address in full:
            del self._buckets[address]
        while len(self._buckets) > self.MAX_ADDRESSES:  # still too many: forget the oldest
            del self._buckets[next(iter(self._buckets))]


# -- addresses ------------------------------------------------------------------------------------


def parse_networks(cidrs: Iterable[str], what: str) -> tuple[Network, ...]:
    if isinstance(cidrs, str):
        raise ValueError(f"{what} is a list of CIDR networks, such as ['10.0.0.0/8'], not a str")
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ip_network(cidr, strict=False))
        except ValueError as e:
            raise ValueError(f"{what}: {cidr!r} is not an IP network ({e})") from None
    return tuple(networks)


def peer_ip(address: Any) -> IPv4Address | IPv6Address | None:
    """The IP address of a peer, or None when it has none (a unix socket, a serial port)."""
    host = getattr(address, "host", None)
    if not isinstance(host, str):
        return None
    try:
        ip = ip_address(host.split("%", 1)[0])  # without an IPv6 scope ("fe80::1%eth0")
    except ValueError:
        return None
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip
