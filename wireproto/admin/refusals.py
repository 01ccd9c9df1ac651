"""Refused logins to the admin API in the log, without flooding it.

A request without credentials is how the status page asks whether it must show its login form,
and a form left open waits that way: it is said at debug only. Refused credentials (a wrong
password, a bad token, an address throttled for them) are a warning, but at most one line per
peer (`peerlog.address_key`) a minute: the first refusal is logged, and those that follow within
the minute are counted and said in one line when it ends, which is then that peer's line for
the next minute. Past `MAX_PEERS` peers at once, the others share one count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from twisted.logger import Logger

from wireproto.logs import debugging
from wireproto.peerlog import IN_ALL, address_key, describe_address
from wireproto.transports.http import HTTPRefusal

if TYPE_CHECKING:
    from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime

__all__ = ["RefusedLogins", "PERIOD", "MAX_PEERS"]

log = Logger(namespace="wireproto.admin")

PERIOD = 60.0
# Peers followed at once, as many as the peers' log budget allows lines a period.
MAX_PEERS = IN_ALL
OTHERS = "other addresses"


@dataclass
class _Held:
    """A peer's refusals not logged in its current minute, and the last one's reason."""

    call: IDelayedCall
    count: int = 0
    reason: str = ""
    why: str = ""


class RefusedLogins:
    """Logs each refused admin login as the module says."""

    def __init__(self, reactor: IReactorTime, *, period: float | None = None,
                 max_peers: int = MAX_PEERS) -> None:
        self.reactor = reactor
        self.period = PERIOD if period is None else period
        self.max_peers = max_peers
        self._held: dict[str, _Held] = {}

    def refused(self, peer: IAddress, refusal: HTTPRefusal) -> None:
        if refusal.reason == "missing":
            if debugging():
                log.debug("auth: {peer} asked the admin API without credentials ({status})",
                          event="auth_failed", peer=describe_address(peer),
                          status=refusal.status, reason=refusal.reason)
            return
        shown = describe_address(peer)
        key = address_key(peer)
        if key not in self._held and len(self._held) >= self.max_peers:
            key = OTHERS
        held = self._held.get(key)
        if held is not None:
            held.count += 1
            held.reason, held.why = refusal.reason, str(refusal)
            return
        log.warn("auth: refused {peer} ({status}): {why}", event="auth_failed", peer=shown,
                 status=refusal.status, reason=refusal.reason, why=str(refusal))
        self._hold(key)

    def _hold(self, key: str) -> None:
        self._held[key] = _Held(self.reactor.callLater(self.period, self._minute_over, key))

    def _minute_over(self, key: str) -> None:
        held = self._held.pop(key)
        if held.count:
            self._say(key, held)
            self._hold(key)  # that line is the peer's for the next minute

    def _say(self, key: str, held: _Held) -> None:
        log.warn("auth: {count} more refused admin logins from {peer} in the last {period:g} s "
                 "were not logged (the last: {why})", event="auth_failed_not_logged",
                 peer=key, count=held.count, period=self.period, reason=held.reason,
                 why=held.why)

    def stop(self) -> None:
        """Say what is held, and follow no one any longer."""
        held, self._held = self._held, {}
        for key, one in held.items():
            if one.call.active():
                one.call.cancel()
            if one.count:
                self._say(key, one)
