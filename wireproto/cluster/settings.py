"""The [cluster] table (docs/cluster.md)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from wireproto.settings import integer, setting, string

__all__ = ["ClusterSettings", "MAX_WORKERS"]


def _subject_prefix(value: object) -> str:
    prefix = string(value)
    from wireproto.cluster.subjects import Subjects

    Subjects(prefix)  # a ValueError says what is wrong with it
    return prefix


MAX_WORKERS = 256  # worker processes of one `wireproto serve` (docs/configuration.md)


def _workers(value: object) -> int:
    workers = integer(value)
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"must be 1 to {MAX_WORKERS} processes, not {workers}")
    return workers


def _replicas(value: object) -> int:
    from wireproto.cluster.jetstream import MAX_REPLICAS

    replicas = integer(value)
    if not 0 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"must be 0 (as many as the NATS cluster can place: 3, or 1) to "
                         f"{MAX_REPLICAS}, not {replicas}")
    return replicas


@dataclass(frozen=True)
class ClusterSettings:
    """The [cluster] table: the NATS servers that join this broker's processes (`url`, one or
    more ``nats://`` or ``tls://`` URLs separated by commas; "" without `workers`: no cluster),
    how to authenticate to them, and how many worker processes `wireproto serve` runs."""

    url: str = ""
    workers: int = setting(1, read=_workers)
    subject_prefix: str = setting("wireproto", read=_subject_prefix)
    # This process's name among the brokers ("": host name and process id).
    node: str = ""
    user: str = ""
    password_file: str = ""
    token_file: str = ""
    nkey_seed_file: str = ""
    creds_file: str = ""
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    # Each process renews its lease and says it is alive this often. A process whose lease has
    # not been renewed for `lease` seconds is over: another publishes its connections' wills,
    # and it closes them itself before it serves them again (docs/cluster.md, "Leases and
    # fencing").
    heartbeat_interval: float = 1.0
    lease: float = 10.0
    # A call that another process answers fails after this many seconds without an answer.
    call_timeout: float = 30.0
    # Calls from other processes this one works on at once; past it, they are refused as busy.
    max_remote_calls: int = 1000
    # Replicas of the JetStream buckets of wills and last values; 0: 3 where the NATS cluster
    # can place them, else 1 (wireproto.cluster.jetstream).
    replicas: int = setting(0, read=_replicas)

    def __post_init__(self) -> None:
        if self.lease < 3 * self.heartbeat_interval:
            raise ValueError(
                f"lease ({self.lease:g} s) must be at least three heartbeat_intervals "
                f"({3 * self.heartbeat_interval:g} s): a process renews its lease every "
                "heartbeat_interval, and must be able to miss one or two")

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    def servers(self) -> tuple[str, ...]:
        return tuple(url.strip() for url in self.url.split(",") if url.strip())

    def open_membership_warning(self) -> str | None:
        """What to warn of when `url` names NATS servers off this host and nothing here
        authenticates to them: whoever can publish on that NATS account is a member of the
        cluster (docs/cluster.md, "Who is a member")."""
        if any((self.user, self.password_file, self.token_file, self.nkey_seed_file,
                self.creds_file, self.certfile)):
            return None
        remote = []
        for url in self.servers():
            parts = urlsplit(url if "://" in url else f"nats://{url}")
            if parts.username or parts.password:
                return None
            if not _is_loopback(parts.hostname or ""):
                remote.append(parts.hostname or url)
        if not remote:
            return None
        return (f"[cluster] url names {', '.join(remote)}, not this host, with no credentials: "
                "anyone who can publish there can act as a member of this cluster; give the "
                "cluster a NATS account of its own (docs/cluster.md, \"Who is a member\")")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
