"""Serial ports as the system lists them, with their USB identity.

`PortInfo` is what pyserial's ``list_ports`` knows of a port, plus the stable name udev gives it
under ``/dev/serial/by-id``. `system_ports()` lists the ports of this machine; everything else
in the package takes a *lister* (any ``() -> list[PortInfo]``), so tests and benchmarks stand
pty pairs in for boards (`wireproto.devices.standin`) and go through the same code.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BY_ID", "PortInfo", "PortLister", "system_ports"]

BY_ID = "/dev/serial/by-id"
# Characters of a serial number or location `PortInfo.identity` shows; USB strings hold 126.
SHOWN_LENGTH = 80


@dataclass(frozen=True)
class PortInfo:
    """One serial port. Fields a port does not report (a built-in UART has no USB identity, a
    cheap clone no serial number) are None."""

    device: str
    """The device node: ``/dev/ttyACM0``. It changes when the board is plugged in again."""
    by_id: str | None = None
    """udev's stable name under /dev/serial/by-id, when udev made one."""
    vid: int | None = None
    pid: int | None = None
    serial_number: str | None = None
    manufacturer: str | None = None
    product: str | None = None
    location: str | None = None
    """Where the board is plugged: ``1-1.2`` (bus 1, port 1, then port 2 of a hub), with the
    USB interface after a colon (``1-1.2:1.0``) on boards with several."""
    description: str | None = None

    @property
    def usb(self) -> bool:
        return self.vid is not None

    def as_json(self) -> dict[str, str | None]:
        """The port as `wireproto devices --json` lists it: VID and PID as four hex digits."""
        return {
            "device": self.device,
            "by_id": self.by_id,
            "vid": None if self.vid is None else f"{self.vid:04x}",
            "pid": None if self.pid is None else f"{self.pid:04x}",
            "serial_number": self.serial_number,
            "manufacturer": self.manufacturer,
            "product": self.product,
            "location": self.location,
            "description": self.description,
        }

    def identity(self) -> str:
        """``2341:0043 serial 85735313 at 1-1.2``: what a log line, an error and a terminal say
        of the board. Its serial number is the device's own string: shown with what cannot be
        printed escaped, and cut, so it cannot drive a terminal or make a line of any length."""
        parts = []
        if self.vid is not None:
            parts.append(f"{self.vid:04x}:{self.pid or 0:04x}")
        if self.serial_number:
            parts.append(f"serial {_shown(self.serial_number)}")
        if self.location:
            parts.append(f"at {_shown(self.location)}")
        return " ".join(parts) or "no USB identity"


def _shown(value: str) -> str:
    text = "".join(char if char.isprintable() else ascii(char)[1:-1] for char in value)
    return text if len(text) <= SHOWN_LENGTH else text[:SHOWN_LENGTH - 3] + "..."


PortLister = Callable[[], list[PortInfo]]
"""What lists the ports: `system_ports`, or a stand-in's."""


def _by_id_names(directory: str = BY_ID) -> dict[str, str]:
    """Device node -> its /dev/serial/by-id link (the first, by name, if several)."""
    names: dict[str, str] = {}
    try:
        entries = sorted(os.listdir(directory))
    except OSError:  # no udev, or no serial device plugged in
        return names
    for entry in entries:
        link = os.path.join(directory, entry)
        names.setdefault(os.path.realpath(link), link)
    return names


def _text(value: object) -> str | None:
    """pyserial's strings, with "n/a" and empty ones as None."""
    if value is None:
        return None
    text = str(value)
    return None if text in ("", "n/a") else text


def system_ports() -> list[PortInfo]:
    """The serial ports of this machine, sorted by device, as pyserial's list_ports sees them."""
    from serial.tools import list_ports

    by_id = _by_id_names()
    ports = []
    for info in list_ports.comports():
        ports.append(PortInfo(
            device=info.device,
            by_id=by_id.get(os.path.realpath(info.device)),
            vid=info.vid,
            pid=info.pid,
            serial_number=_text(info.serial_number),
            manufacturer=_text(info.manufacturer),
            product=_text(info.product),
            location=_text(info.location),
            description=_text(info.description),
        ))
    return sorted(ports, key=lambda port: port.device)
