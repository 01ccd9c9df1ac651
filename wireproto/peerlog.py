"""Warnings about what peers do, at a bounded rate.

A peer that sends bad frames, or a serial line with noise on it, must not be able to fill the
log: `warn` logs at most `PER_KEY` lines for one key (a peer's address, a Phyllo link) and
`IN_ALL` lines in all in each `PERIOD` seconds. The lines it holds back are counted (on
/metrics as ``wireproto_log_lines_suppressed_total``) and summed up in one line when the period
ends.
"""

from __future__ import annotations

import functools
import ipaddress
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

if TYPE_CHECKING:
    from twisted.internet.interfaces import IDelayedCall

__all__ = ["LogBudget", "warn", "describe_address", "address_key", "count_ipv6_by", "BUDGET"]

PERIOD = 60.0
PER_KEY = 5
IN_ALL = 100


def describe_address(address: Any) -> str:
    """A peer address as log text: ``127.0.0.1:5000``, ``[::1]:5000``, ``unix:/path``,
    ``serial:/dev/ttyUSB0``."""
    host, port = getattr(address, "host", None), getattr(address, "port", None)
    if isinstance(host, str) and isinstance(port, int):
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if getattr(address, "type", None) == "SERIAL":
        return f"serial:{address.device}"
    if hasattr(address, "name"):  # UNIXAddress; a client's end has no name
        name = address.name
        return f"unix:{name.decode() if isinstance(name, bytes) else name or ''}"
    return str(address)


# An IPv6 host is counted by its network of this many leading bits: one host is usually
# handed a whole /64, and could otherwise take a fresh address for every connection.
DEFAULT_IPV6_PREFIX = 64
_ipv6_prefix = DEFAULT_IPV6_PREFIX


def count_ipv6_by(prefix: int) -> None:
    """Count IPv6 peers by their /`prefix` network from now on, in this process ([limits]
    ipv6_prefix; 128 counts each address on its own)."""
    global _ipv6_prefix
    if not 1 <= prefix <= 128:
        raise ValueError(f"an IPv6 prefix length is 1 to 128, not {prefix}")
    _ipv6_prefix = prefix
    _host_key.cache_clear()


@functools.lru_cache(maxsize=4096)
def _host_key(host: str) -> str:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if ip.version == 4:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    if _ipv6_prefix == 128:
        return str(ip)
    return str(ipaddress.ip_network(f"{ip}/{_ipv6_prefix}", strict=False))


def address_key(address: Any) -> str:
    """What one peer is, for every per-address budget: its host, whichever port (an IPv4
    address as itself, an IPv4-mapped IPv6 address as its IPv4 one, and an IPv6 one by its
    network, a /64 unless `count_ipv6_by` says otherwise)."""
    host = getattr(address, "host", None)
    return _host_key(host) if isinstance(host, str) else describe_address(address)


class LogBudget:
    """Lines allowed per key and in all in each period; the rest counted and summed up."""

    def __init__(
        self, *, period: float = PERIOD, per_key: int = PER_KEY, in_all: int = IN_ALL,
        clock: Callable[[], float] = time.monotonic, logger: Logger | None = None,
    ) -> None:
        self.period = period
        self.per_key = per_key
        self.in_all = in_all
        self.clock = clock
        self.log = logger or Logger(namespace="wireproto.peerlog")
        # Lines held back since the process started, for /metrics.
        self.suppressed_total = 0
        self._window_start = clock()
        self._by_key: dict[str, int] = {}
        self._logged = 0
        self._suppressed = 0
        self._summary_call: IDelayedCall | None = None

    def admit(self, key: str) -> bool:
        """Whether a line about `key` may be logged now; if not, it is counted."""
        now = self.clock()
        if now - self._window_start >= self.period:
            self.flush()
        count = self._by_key.get(key, 0)
        if count < self.per_key and self._logged < self.in_all:
            # A key is kept only when its line is logged: at most `in_all` keys a period.
            self._by_key[key] = count + 1
            self._logged += 1
            return True
        self._suppressed += 1
        self.suppressed_total += 1
        self._schedule_summary()
        return False

    def flush(self) -> None:
        """End the period: sum up what was held back, and start a new one."""
        if self._summary_call is not None and self._summary_call.active():
            self._summary_call.cancel()
        self._summary_call = None
        if self._suppressed:
            self.log.warn(
                "{count} more warnings about peers in the last {period:g} s were not logged "
                "(at most {per_key} per peer and {in_all} in all are)",
                count=self._suppressed, period=self.period, per_key=self.per_key,
                in_all=self.in_all, event="log_suppressed",
            )
        self._window_start = self.clock()
        self._by_key.clear()
        self._logged = self._suppressed = 0

    def reset(self) -> None:
        """Start a new period without a summary (tests start each with a full budget)."""
        self._suppressed = 0
        self.flush()

    def _schedule_summary(self) -> None:
        if self._summary_call is None:
            from twisted.internet import reactor

            left = max(0.0, self.period - (self.clock() - self._window_start))
            self._summary_call = reactor.callLater(left, self.flush)


BUDGET = LogBudget()


def warn(logger: Logger, key: str, format: str, *, event: str, **fields: Any) -> None:
    """`logger.warn(format, event=event, **fields)` if `key` (a peer, a link) is within the
    budget."""
    if BUDGET.admit(key):
        logger.warn(format, event=event, **fields)
