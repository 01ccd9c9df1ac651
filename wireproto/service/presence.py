"""Which serial devices are present: one kept topic per link, ``$devices/LINK``
(docs/hub.md, "Devices' presence").

Every Phyllo link whose endpoint is ``serial:``, and every board of a fleet
(wireproto.service.fleet), has its presence published by the broker when its port opens and
when it closes or the board goes, as compact JSON::

    {"link": "sensors.E6614C311B4B7E2A", "online": true, "port": "/dev/ttyACM0",
     "identity": {"by_id": ..., "vid": "2e8a", "pid": "000a", "serial_number": ...},
     "since": 1764240000.5}

Offline, ``online`` is false and ``port`` null; the identity last seen is kept. A link that
names its device (``serial:/dev/ttyACM0``) is said online once the ports are listed (off the
reactor's thread), with the identity found there, or none if they cannot be. The hub keeps
each topic's last value whatever ``[hub] retain`` says (`Hub.keep_last_values`, within its
bounds on last values), so a subscriber that comes later, of any protocol, gets the state at
once. Only the broker publishes there unless access rules say otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypedDict, cast

from twisted.internet import defer
from twisted.internet.interfaces import (
    IAddress,
    IProtocol,
    IProtocolFactory,
    IReactorTime,
    IStreamClientEndpoint,
    ITransport,
)
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto.codecs.serialization import json_utf8
from wireproto.config import Attach, Config, PhylloLink
from wireproto.config.endpoints import endpoint_type
from wireproto.config.forms import PRESENCE_PREFIX
from wireproto.devices.listing import PortListing
from wireproto.devices.ports import PortInfo
from wireproto.hub import Hub, HubMessage

__all__ = ["PRESENCE_PATTERN", "Presence", "PresenceEndpoint", "presence_wanted"]

PRESENCE_PATTERN = f"{PRESENCE_PREFIX}/#"


def presence_wanted(config: Config) -> bool:
    """Whether a link of `config` has its presence published: a Phyllo link on ``serial:``,
    or a fleet of boards."""
    links: list[Attach | PhylloLink] = [*config.phyllo, *config.attach]
    return any(link.each_board or isinstance(link, PhylloLink)
               and endpoint_type(link.endpoint) == "serial" for link in links)


class PresencePayload(TypedDict):
    """What ``$devices/LINK`` says, as JSON."""

    link: str
    online: bool
    port: str | None
    identity: dict[str, str | None]
    since: float


def _identity(port: PortInfo | None) -> dict[str, str | None]:
    known = PortInfo("") if port is None else port
    identity = known.as_json()
    del identity["device"]
    return identity


def port_of(device: str, ports: list[PortInfo]) -> PortInfo | None:
    """The port of `ports` that `device` is (a path may be a /dev/serial/by-id link)."""
    real = os.path.realpath(device)
    for port in ports:
        if device in (port.device, port.by_id) or port.device == real:
            return port
    return None


class Presence:
    """The presence topics of one broker's serial links: `state` is each link's last
    payload. `listing()` is what lists the ports, for a link that names its device."""

    def __init__(self, hub: Hub, clock: IReactorTime,
                 listing: Callable[[], PortListing]) -> None:
        self.hub = hub
        self.clock = clock
        self._listing = listing
        self.state: dict[str, PresencePayload] = {}
        # Each link whose port opened and is being looked up in a listing: what says so.
        self._looking: dict[str, object] = {}

    def topic(self, link: str) -> str:
        return f"{PRESENCE_PREFIX}/{link}"

    def online(self, link: str, device: str, port: PortInfo | None) -> None:
        """`link`'s port `device` is open now; `port` is what matched it, if known (else the
        ports are listed to find it, and the link is said online then)."""
        if port is not None:
            self._online(link, device, port)
            return
        looking = self._looking[link] = object()

        def found(ports: list[PortInfo] | None) -> None:
            if self._looking.get(link) is looking:  # not closed since
                del self._looking[link]
                self._online(link, device, None if ports is None else port_of(device, ports))

        self._listing().fresh().addErrback(lambda _: None).addCallback(found)

    def _online(self, link: str, device: str, port: PortInfo | None) -> None:
        self._publish(link, {"link": link, "online": True, "port": device,
                             "identity": _identity(port), "since": self.clock.seconds()})

    def offline(self, link: str, identity: PortInfo | None = None) -> None:
        """`link`'s port closed, or its board went (said once: a second time changes
        nothing)."""
        self._looking.pop(link, None)
        last = self.state.get(link)
        if last is not None and not last["online"]:
            return
        kept = last["identity"] if last is not None else _identity(identity)
        self._publish(link, {"link": link, "online": False, "port": None, "identity": kept,
                             "since": self.clock.seconds()})

    def forget(self, link: str) -> None:
        """Clear `link`'s kept presence (an empty publish, as clears any last value)."""
        self._looking.pop(link, None)
        if self.state.pop(link, None) is not None:
            self.hub.publish(HubMessage(self.topic(link), b"", protocol="sys"))

    def _publish(self, link: str, payload: PresencePayload) -> None:
        self.state[link] = payload
        self.hub.publish(HubMessage(self.topic(link), json_utf8(payload), protocol="sys"))


class _Watched:
    """A connection's protocol that says when its port opens and closes, and is otherwise the
    protocol itself (its attributes and interfaces, as `ReconnectingService`'s proxy is)."""

    def __init__(self, protocol: IProtocol, endpoint: PresenceEndpoint, device: str) -> None:
        self._protocol = protocol
        self._endpoint = endpoint
        self._device = device

    def makeConnection(self, transport: ITransport) -> None:
        self.transport = transport
        self._endpoint.opened(self._device)
        self._protocol.makeConnection(transport)

    def connectionLost(self, reason: Failure) -> None:
        try:
            self._protocol.connectionLost(reason)
        finally:
            self._endpoint.closed()

    def __getattr__(self, name: str) -> object:
        return getattr(self._protocol, name)


class _WatchingFactory:
    def __init__(self, factory: IProtocolFactory, endpoint: PresenceEndpoint) -> None:
        self._factory = factory
        self._endpoint = endpoint

    def buildProtocol(self, addr: IAddress) -> _Watched | None:
        protocol = self._factory.buildProtocol(addr)
        device = str(getattr(addr, "device", addr))
        return None if protocol is None else _Watched(protocol, self._endpoint, device)

    def __getattr__(self, name: str) -> object:
        return getattr(self._factory, name)


@implementer(IStreamClientEndpoint)
class PresenceEndpoint:
    """A serial link's endpoint whose opens and closes `presence` publishes as `link`'s."""

    def __init__(self, endpoint: IStreamClientEndpoint, presence: Presence, link: str) -> None:
        self.endpoint = endpoint
        self.presence = presence
        self.link = link

    def __repr__(self) -> str:
        return repr(self.endpoint)

    @property
    def port(self) -> PortInfo | None:
        """The port the wrapped ``serial:vid=...`` endpoint last found, as it says."""
        port = getattr(self.endpoint, "port", None)
        return port if isinstance(port, PortInfo) else None

    def opened(self, device: str) -> None:
        self.presence.online(self.link, device, self.port)

    def closed(self) -> None:
        self.presence.offline(self.link)

    def connect(self, factory: IProtocolFactory) -> defer.Deferred[IProtocol]:
        # It has the factory's interfaces, as `_Watched` has the protocol's.
        return self.endpoint.connect(cast(IProtocolFactory, _WatchingFactory(factory, self)))
