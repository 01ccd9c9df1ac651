"""The broker processes that share one's listeners: the workers of one supervisor
(wireproto.supervisor). Each one also listens on a private unix socket of its own, in a
directory that only their user may enter (0700), where the others pass it the Engine.IO requests
for its sessions (wireproto.transports.engineio.handover): a request is served by the process
that holds its session, whichever one the kernel gave its connection to."""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from twisted.internet import defer
from twisted.internet.endpoints import UNIXClientEndpoint, UNIXServerEndpoint
from twisted.internet.interfaces import (
    IListeningPort,
    IProtocolFactory,
    IReactorUNIX,
    IStreamServerEndpoint,
)
from twisted.web.http import Request
from twisted.web.resource import IResource
from zope.interface import implementer

from wireproto.config import Config
from wireproto.transports.engineio.handover import SessionOwners
from wireproto.transports.http import GuardedSite
from wireproto.transports.websocket_http import websocket_site

__all__ = ["Siblings", "PrivateEndpoint", "private_site"]

# How long a sibling's socket may take to accept: at once, unless it is stopped or stuck.
CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class Siblings:
    """This process's index among the processes that share its listeners, and each one's
    private socket, by index."""

    index: int
    sockets: tuple[str, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.index < len(self.sockets):
            raise ValueError(f"process {self.index} is not one of {len(self.sockets)}")

    @property
    def socket(self) -> str:
        """This process's private socket."""
        return self.sockets[self.index]

    def owners(self, reactor: IReactorUNIX, listener: int, counts: Counter[str]) -> SessionOwners:
        """For the Engine.IO listener `listener` (its index in the config): whose session a
        sid is, and how to pass a request to it. `counts` counts the requests passed."""
        return SessionOwners(
            mark=str(self.index),
            owners={str(index): UNIXClientEndpoint(reactor, path, timeout=CONNECT_TIMEOUT)
                    for index, path in enumerate(self.sockets) if index != self.index},
            prefix=b"/%d" % listener, counts=counts,
        )


def passed_path(listener: int, path: str) -> str:
    """Where the private site serves the Engine.IO listener `listener` at `path`."""
    return f"/{listener}{path}"


@implementer(IStreamServerEndpoint)
class PrivateEndpoint:
    """Listens on this process's private socket, first removing the one a process of the same
    index left when it died (its directory is this user's alone)."""

    def __init__(self, reactor: IReactorUNIX, path: str) -> None:
        self.reactor = reactor
        self.path = path

    def listen(self, factory: IProtocolFactory) -> defer.Deferred[IListeningPort]:
        def remove_stale() -> None:
            try:
                if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                    os.unlink(self.path)
            except FileNotFoundError:
                pass

        return defer.execute(remove_stale).addCallback(
            lambda _: UNIXServerEndpoint(self.reactor, self.path, mode=0o600).listen(factory))


class _PrivateSite(GuardedSite):
    def log(self, request: Request) -> None:
        """Nothing: the process that accepted the request logs it."""


def private_site(routes: Mapping[str, IResource], config: Config) -> GuardedSite:
    """The site of the private socket: every request on it comes from a sibling, which gave
    it its own limits where it landed, so they are not counted by the address they come from
    (one for all) here; the others hold."""
    limits = replace(config.http, max_pending_per_address=config.http.max_pending)
    idle_timeout = config.websocket.open_handshake_timeout
    root = websocket_site(routes, idle_timeout=idle_timeout, limits=limits).resource
    return _PrivateSite(root, limits, idle_timeout=idle_timeout)
