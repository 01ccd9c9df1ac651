"""A fleet of boards from one table: ``each_board = true`` in a ``[[phyllo]]`` or ``[[attach]]``
table brings up one link per board its ``serial:vid=...`` endpoint matches (docs/phyllo.md,
"A fleet of boards").

A `Fleet` follows the service's port watcher (`Links.watcher()`: udev's events, or polling).
On each change of the ports it matches:

- each new board gets a link named ``NAME.BOARD``, BOARD being `board_name(port)`: its serial
  number, or its USB location when two matching boards share a serial number (cheap clones
  do), made safe. The link's endpoint is the table's, narrowed to that board, so it reopens
  with backoff as any link does and finds the board again if it comes back as another
  ``/dev/ttyACMn``. A Phyllo board's bridge mounts its topics at ``PREFIX/BOARD/`` and is in
  `Links.phyllo` under its link name; an ``[[attach]]`` board serves the table's protocol;
- each board gone is detached: its link stopped (no timer left), its bridge closed and
  removed, its presence ``$devices/NAME.BOARD`` offline (wireproto.service.presence);
- a board that comes back, by the same serial number, gets the same name.

At most `max_boards` boards have links; those past it are refused, each with one warning. A
board gone keeps its offline presence until `max_boards` boards have gone since; then the
oldest is forgotten (its topic cleared), so flapping or hostile devices cannot grow what the
broker holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from twisted.application.service import MultiService
from twisted.internet import defer
from twisted.logger import Logger

from wireproto.config import Attach, PhylloLink
from wireproto.devices.matching import MATCH_KEYS, PortMatch, board_name
from wireproto.devices.ports import PortInfo
from wireproto.phyllo.bridge import HubBridge
from wireproto.service.links import Links
from wireproto.transports.connect import split_endpoint
from wireproto.transports.reconnect import ReconnectingService

__all__ = ["Fleet", "board_endpoint", "fleet_names"]

log = Logger(namespace="wireproto.service")

# A serial number longer than this, or with characters that cannot be printed, is no name: the
# board is named and followed by its USB location instead.
_MAX_SERIAL = 64


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace(":", "\\:")


def _usable_serial(port: PortInfo) -> str | None:
    serial = port.serial_number
    if serial and len(serial) <= _MAX_SERIAL and serial.isprintable():
        return serial
    return None


def _serial_name(port: PortInfo) -> str | None:
    serial = _usable_serial(port)
    return None if serial is None else board_name(replace(port, serial_number=serial))


def _location_name(port: PortInfo) -> str | None:
    return board_name(replace(port, serial_number=None)) if port.location else None


def fleet_names(ports: list[PortInfo]) -> dict[str, tuple[PortInfo, bool]]:
    """Each port's board name, and whether it is named by its serial number: by its serial
    number when no other port's serial number or location makes the same name (``a:b`` and
    ``a_b`` do, once made safe), else by its location. A device's serial number is its own
    string: were the first to take a name kept, a board could take another's and leave it
    without a link. Ports with neither, and a second port with a name already taken, are left
    out."""
    serial_names = Counter(_serial_name(port) for port in ports)
    location_names = Counter(_location_name(port) for port in ports)
    names: dict[str, tuple[PortInfo, bool]] = {}
    for port in ports:
        name = _serial_name(port)
        by_serial = name is not None and serial_names[name] == 1 and (
            location_names[name] == (1 if _location_name(port) == name else 0))
        if not by_serial:
            name = _location_name(port)
        if name is not None:
            names.setdefault(name, (port, by_serial))
    return names


def board_endpoint(endpoint: str, port: PortInfo, by_serial: bool) -> str:
    """The fleet's ``serial:`` endpoint narrowed to `port` alone: by its serial number, or its
    location."""
    args, options = split_endpoint(endpoint)
    narrowed = dict(options)
    if by_serial:
        narrowed["serial_number"] = port.serial_number or ""
    else:
        narrowed["location"] = port.location or ""
    fields = [*args[:1], *(f"{key}={_escaped(value)}" for key, value in narrowed.items()
                           if key not in MATCH_KEYS)]
    fields += [f"{key}={_escaped(narrowed[key])}" for key in MATCH_KEYS if key in narrowed]
    return ":".join(fields)


@dataclass
class _Board:
    port: PortInfo
    service: ReconnectingService
    bridge: HubBridge | None


class Fleet(MultiService):
    """One fleet table's boards, each a link of its own while it is plugged in: `boards`, by
    link name. Started and stopped with the service's links."""

    def __init__(self, links: Links, table: PhylloLink | Attach,
                 retry_policy: Callable[[int], float]) -> None:
        super().__init__()
        self.links = links
        self.table = table
        self.fleet_name = table.name if isinstance(table, PhylloLink) else table.link_name
        self.retry_policy = retry_policy
        _, options = split_endpoint(table.endpoint)
        self.match = PortMatch.from_options(
            {key: value for key, value in options.items() if key in MATCH_KEYS})
        self.boards: dict[str, _Board] = {}
        # Boards present but without a link (past max_boards, or without a name of their own),
        # each warned of once: by link name, or by device.
        self.refused: set[str] = set()
        # Boards gone whose offline presence is kept, oldest first.
        self.gone: dict[str, None] = {}
        # The devices whose detached link is still closing: no new link opens one before.
        self.closing: dict[str, defer.Deferred[object]] = {}
        self._unsubscribe: Callable[[], None] | None = None

    def startService(self) -> None:
        super().startService()
        watcher = self.links.watcher()
        self._unsubscribe = watcher.subscribe(self.changed)
        watcher.start()
        self.changed(watcher.ports())

    def stopService(self) -> defer.Deferred[None]:
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        stopped = defer.maybeDeferred(super().stopService)
        for name in list(self.boards):
            self._detach(name)
        self.refused.clear()
        return stopped

    # -- the ports changed ------------------------------------------------------------------------

    def changed(self, ports: list[PortInfo]) -> None:
        if not self.running:
            return
        matching = self.match.select(ports)
        named = {f"{self.fleet_name}.{board}": found
                 for board, found in fleet_names(matching).items()}
        kept = {port for port, _ in named.values()}
        unnamed = [port for port in matching if port not in kept]
        for port in unnamed:
            self._refuse(port.device, port, "it has no name of its own: another board has its "
                         "name, or it has neither a serial number nor a USB location")
        for name in list(self.boards):
            if name not in named:
                self._detach(name)
        for name, (port, by_serial) in named.items():
            if name in self.boards:
                self.boards[name].port = port
            elif port.device in self.closing:
                continue  # attached once its old link has let go of the port
            elif len(self.boards) >= self.table.max_boards:
                self._refuse(name, port, f"it would be {name}, and max_boards is "
                             f"{self.table.max_boards}")
            elif name in self.links.phyllo:
                self._refuse(name, port, f"it would be {name}, another link's name")
            else:
                self._attach(name, port, by_serial)
        self.refused &= set(named) | {port.device for port in unnamed}

    def _closing(self, device: str, closed: defer.Deferred[object]) -> None:
        def let_go(result: object) -> None:
            if self.closing.get(device) is closed:
                del self.closing[device]
                if self.running:
                    self.changed(self.links.watcher().ports())

        self.closing[device] = closed
        closed.addBoth(let_go)

    def _refuse(self, key: str, port: PortInfo, why: str) -> None:
        """Warn once that the board on `port` gets no link (`key`: its link name, or its
        device when it has no name)."""
        if key in self.refused:
            return
        self.refused.add(key)
        log.warn("fleet {fleet}: no link for the board on {device} ({identity}): {why}",
                 event="fleet_board_refused", fleet=self.fleet_name, device=port.device,
                 identity=port.identity(), link=key if key != port.device else None, why=why)

    def _attach(self, name: str, port: PortInfo, by_serial: bool) -> None:
        board = name[len(self.fleet_name) + 1:]
        endpoint = board_endpoint(self.table.endpoint, port, by_serial)
        bridge: HubBridge | None = None
        if isinstance(self.table, PhylloLink):
            link = replace(self.table, name=name, endpoint=endpoint,
                           prefix=f"{self.table.prefix}/{board}", each_board=False)
            bridge, service = self.links.phyllo_service(link, self.retry_policy)
            self.links.phyllo[name] = bridge
        else:
            service = self.links.attach_service(
                replace(self.table, endpoint=endpoint, each_board=False,
                        prefix=self.table.board_prefix(board)), self.retry_policy,
                presence_name=name)
        self.boards[name] = _Board(port, service, bridge)
        self.refused.discard(name)
        self.gone.pop(name, None)
        log.info("fleet {fleet}: board {link} on {device} ({identity}) attached",
                 event="fleet_board_attached", fleet=self.fleet_name, link=name,
                 device=port.device, identity=port.identity())
        service.setServiceParent(self)

    def _detach(self, name: str) -> None:
        board = self.boards.pop(name)
        if board.service.parent is self:
            opened = board.service.protocol
            closed = self.removeService(board.service)
            if opened is not None:
                # At once, what is still unsent dropped: a board that reads nothing must not
                # keep its port, and a link renamed (a clone came) must not share it.
                opened.transport.abortConnection()
            if isinstance(closed, defer.Deferred) and not closed.called:
                self._closing(board.port.device, closed)
        if board.bridge is not None:
            board.bridge.close()
            if self.links.phyllo.get(name) is board.bridge:
                del self.links.phyllo[name]
        log.info("fleet {fleet}: board {link} detached", event="fleet_board_detached",
                 fleet=self.fleet_name, link=name)
        presence = self.links.presence
        if presence is None:
            return
        presence.offline(name, board.port)
        self.gone.pop(name, None)
        self.gone[name] = None  # the newest gone
        while len(self.gone) > self.table.max_boards:
            oldest = next(iter(self.gone))
            del self.gone[oldest]
            presence.forget(oldest)
