"""What the parts that watch a running broker may read of it: `BrokerView`.

The admin console (wireproto.admin) and the metrics (wireproto.metrics) are built by the service
(wireproto.service) and read it while it runs; they know it only as a `BrokerView`, so they
never import the service, and the service is free to change how it is built.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from twisted.internet.interfaces import IReactorTime

    from wireproto.authentication import Authentication
    from wireproto.capture.wrapper import BrokerCapture
    from wireproto.config.model import Config, Listener
    from wireproto.hub import Hub, Session
    from wireproto.hub.federation import ProcessGroup
    from wireproto.phyllo.bridge import HubBridge
    from wireproto.transports.http import GuardedSite

__all__ = ["BoundListener", "BrokerView"]


@dataclass(frozen=True)
class BoundListener:
    """A listener and the real address it is bound to, in a form a client can connect to:
    ``ws://127.0.0.1:8765/websmq``, ``wss://...``, ``tcp:127.0.0.1:8766``, ``ssl:HOST:PORT``,
    ``unix:/path``."""

    listener: Listener
    address: str

    def describe(self) -> str:
        return f"{self.listener.describe()} on {self.address}"


class BrokerView(Protocol):
    """A running broker, as the parts that watch it see it."""

    @property
    def config(self) -> Config:
        """What it was started with."""

    @property
    def hub(self) -> Hub: ...

    @property
    def reactor(self) -> IReactorTime: ...

    @property
    def auth(self) -> Authentication | None:
        """Authentication, with an [auth] table; None without."""

    @property
    def capture(self) -> BrokerCapture | None:
        """Capture, with a [capture] table; None without."""

    @property
    def cluster(self) -> ProcessGroup | None:
        """The other broker processes, when this one is of a cluster; None when alone."""

    @property
    def phyllo(self) -> dict[str, HubBridge]:
        """The bridge of each Phyllo link, by its name."""

    @property
    def http_sites(self) -> list[GuardedSite]:
        """The HTTP sites of its listeners, for their refusals."""

    @property
    def engineio_handovers(self) -> Counter[str] | None:
        """Engine.IO requests passed to the worker that holds their session, and taken from
        the others, by outcome; None when it is no worker of a supervisor."""

    @property
    def bound(self) -> Sequence[BoundListener]:
        """The listeners bound so far, with their addresses."""

    @property
    def node(self) -> str:
        """This process's name: its cluster name, or its host name and process id."""

    def served_protocols(self) -> list[str]:
        """The protocols it serves, each once, in config order."""

    def close_session(self, session: Session, reason: str) -> None:
        """Close one connection cleanly; its will is published."""
