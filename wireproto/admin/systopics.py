"""The broker's own figures on ``$SYS`` topics, published every [admin] sys_interval seconds, as
mosquitto does: plain numbers as text, so any client of any protocol can read them.

A single broker publishes under ``$SYS/broker/``; a process of a cluster under
``$SYS/broker/NODE/``, so the processes' figures stay apart.
"""

from __future__ import annotations

import time

from twisted.internet import task
from twisted.internet.interfaces import IReactorTime

from wireproto.broker import BrokerView
from wireproto.hub import HubMessage

__all__ = ["SysTopics", "sys_prefix"]


def sys_prefix(node: str | None) -> str:
    """The $SYS topics' prefix: ``$SYS/broker``, or ``$SYS/broker/NODE`` in a cluster."""
    if node is None:
        return "$SYS/broker"
    return "$SYS/broker/" + "".join("_" if c in "/+#" or c.isspace() else c for c in node)


class SysTopics:
    """Publishes the broker's figures on its hub every `interval` seconds."""

    def __init__(self, service: BrokerView, interval: float, node: str | None,
                 reactor: IReactorTime) -> None:
        self.service = service
        self.hub = service.hub
        self.interval = interval
        self.prefix = sys_prefix(node)
        self.reactor = reactor
        self.started = time.monotonic()
        self._publishing: task.LoopingCall | None = None

    def start(self) -> None:
        if self._publishing is None:
            self._publishing = task.LoopingCall(self.publish)
            self._publishing.clock = self.reactor
            self._publishing.start(self.interval, now=True)

    def stop(self) -> None:
        if self._publishing is not None:
            self._publishing.stop()
            self._publishing = None

    def figures(self) -> dict[str, int | float | str]:
        """Each figure by its topic below the prefix."""
        hub = self.hub
        stats = hub.stats
        sessions = list(hub.sessions)
        figures: dict[str, int | float | str] = {
            "version": _version(),
            "uptime": int(time.monotonic() - self.started),
            "clients/connected": len(sessions),
            "messages/published": stats.published,
            "messages/delivered": stats.delivered,
            "messages/dropped": stats.dropped_messages,
            "subscriptions/count": sum(len(s.topics) + len(s.patterns) for s in sessions),
            "retained/count": 0 if hub.retained is None else len(hub.retained),
            "wills/published": stats.wills_published,
        }
        by_protocol: dict[str, int] = {}
        for session in sessions:
            by_protocol[session.protocol] = by_protocol.get(session.protocol, 0) + 1
        for protocol in self.service.served_protocols():
            figures[f"protocols/{protocol}/connected"] = by_protocol.get(protocol, 0)
        return figures

    def publish(self) -> None:
        hub = self.hub
        for name, value in self.figures().items():
            hub.publish(HubMessage(f"{self.prefix}/{name}", str(value).encode(), protocol="sys"))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("wireproto")
    except PackageNotFoundError:
        return "unknown"


