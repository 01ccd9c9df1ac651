"""Finding a board by what it is: ``serial:vid=2341:pid=0043`` rather than ``/dev/ttyACM0``.

A `PortMatch` holds the identity fields asked for; `resolve` finds the one port that has them
all, or raises an error naming what was asked and what was found. A link resolves each time it
opens, so a board that comes back as another ``/dev/ttyACMn`` is found again. The errors are
`ConnectError`s: a board not plugged in yet is retried like any link that cannot open.

Matching rules (docs/phyllo.md, "Boards by identity"):

- ``vid`` and ``pid`` are hexadecimal, with or without ``0x`` (``2341``, ``0x2341``);
- ``serial_number`` is compared exactly; ``manufacturer`` and ``product`` ignoring case;
- ``location`` is a USB port path (``1-1.2``); it also matches that board's interfaces
  (``1-1.2:1.0``), as pyserial names the port of a board with several.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from twisted.internet.error import ConnectError

from .ports import PortInfo

__all__ = [
    "MATCH_KEYS",
    "NoMatchingPort",
    "PortMatch",
    "SeveralMatchingPorts",
    "board_name",
    "resolve",
]

MATCH_KEYS = ("vid", "pid", "serial_number", "location", "manufacturer", "product")
_HEX16 = re.compile(r"(0[xX])?[0-9a-fA-F]{1,4}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class NoMatchingPort(ConnectError):
    """No serial port has the identity asked for"""


class SeveralMatchingPorts(ConnectError):
    """More than one serial port has the identity asked for"""


def _hex16(key: str, value: str) -> int:
    if not _HEX16.fullmatch(value):
        raise ValueError(f"serial {key} is a USB id in hex, such as 2341 or 0x2341, not {value!r}")
    return int(value, 16)


@dataclass(frozen=True)
class PortMatch:
    """The identity fields a port must all have; None where any value will do."""

    vid: int | None = None
    pid: int | None = None
    serial_number: str | None = None
    location: str | None = None
    manufacturer: str | None = None
    product: str | None = None

    def __post_init__(self) -> None:
        if all(getattr(self, field.name) is None for field in fields(self)):
            raise ValueError(f"a port match needs at least one of {', '.join(MATCH_KEYS)}")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> PortMatch:
        """From an endpoint string's ``key=value`` fields (the keys in MATCH_KEYS only)."""
        unknown = sorted(set(options) - set(MATCH_KEYS))
        if unknown:
            raise ValueError(
                f"{unknown[0]!r} is not an identity field: use {', '.join(MATCH_KEYS)}")
        for key, value in options.items():
            if key not in ("vid", "pid") and not value:
                raise ValueError(f"serial {key} is empty")
        vid, pid = options.get("vid"), options.get("pid")
        return cls(
            vid=None if vid is None else _hex16("vid", vid),
            pid=None if pid is None else _hex16("pid", pid),
            serial_number=options.get("serial_number"),
            location=options.get("location"),
            manufacturer=options.get("manufacturer"),
            product=options.get("product"),
        )

    def matches(self, port: PortInfo) -> bool:
        if self.vid is not None and port.vid != self.vid:
            return False
        if self.pid is not None and port.pid != self.pid:
            return False
        if self.serial_number is not None and port.serial_number != self.serial_number:
            return False
        if self.location is not None and not (
            port.location == self.location
            or (port.location or "").startswith(self.location + ":")
        ):
            return False
        for name in ("manufacturer", "product"):
            wanted = getattr(self, name)
            if wanted is not None and (getattr(port, name) or "").casefold() != wanted.casefold():
                return False
        return True

    def select(self, ports: list[PortInfo]) -> list[PortInfo]:
        return [port for port in ports if self.matches(port)]

    def describe(self) -> str:
        """``vid=2341:pid=0043``: the fields asked for, as the endpoint string writes them."""
        parts = []
        for name in MATCH_KEYS:
            value = getattr(self, name)
            if value is None:
                continue
            parts.append(f"{name}={value:04x}" if name in ("vid", "pid") else f"{name}={value}")
        return ":".join(parts)

    def narrowed_to(self, port: PortInfo) -> PortMatch:
        """This match, narrowed to `port` alone: by its serial number, else its location (the
        one board of a fleet that a link follows)."""
        if port.serial_number:
            return replace(self, serial_number=port.serial_number)
        if port.location:
            return replace(self, location=port.location)
        raise ValueError(f"{port.device} has neither a serial number nor a USB location")


def _found(ports: list[PortInfo]) -> str:
    if not ports:
        return "no serial port is present"
    shown = "; ".join(f"{port.device} ({port.identity()})" for port in ports[:8])
    more = f"; and {len(ports) - 8} more" if len(ports) > 8 else ""
    return f"found {shown}{more}"


def resolve(match: PortMatch, ports: list[PortInfo]) -> PortInfo:
    """The one port of `ports` that `match` matches."""
    chosen = match.select(ports)
    if len(chosen) == 1:
        return chosen[0]
    if not chosen:
        raise NoMatchingPort(string=f"no serial port has {match.describe()}: {_found(ports)}")
    raise SeveralMatchingPorts(
        string=f"{len(chosen)} serial ports have {match.describe()}: {_found(chosen)}; add "
        "serial_number= or location= to choose one")


def board_name(port: PortInfo) -> str:
    """A name for the board on `port`, usable in a link name and a topic: its serial number,
    else its USB location, else its device's name, with any character other than letters,
    digits, ``-``, ``_`` and ``.`` made ``_``."""
    name = port.serial_number or port.location or port.device.rsplit("/", 1)[-1]
    return _UNSAFE.sub("_", name).strip(".") or "_"
