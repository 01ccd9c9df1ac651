"""Boards stood in for by pty pairs, for tests and benchmarks, with the USB identity real boards
report.

A `StandInBoard` is a pty pair: the broker opens its slave end (`device`) as a serial port, as
it would ``/dev/ttyACM0``; the test writes what the board sends to the master end and reads what
the host sent from it. Unplugging closes the master end, so the host's port fails as it does
when a USB board is pulled. `StandInPorts.ports` lists the boards plugged in, as
`system_ports` lists real ones; hand it to a watcher or an endpoint as their lister::

    boards = StandInPorts()
    uno = boards.plug(**COMMON_BOARDS["uno"], serial_number="85735313")
    watcher = PollingWatcher(reactor, boards.ports, interval=0.05)
"""

from __future__ import annotations

import os
import select
import threading
import time
import tty
from dataclasses import replace
from typing import TypedDict

from .ports import PortInfo

__all__ = ["COMMON_BOARDS", "BoardIdentity", "StandInBoard", "StandInPorts"]

# What common boards report over USB (pyserial's list_ports on Linux), without the serial
# number and location, which are each board's own. docs/phyllo.md lists the same.
class BoardIdentity(TypedDict):
    vid: int
    pid: int
    manufacturer: str | None
    product: str | None
    description: str | None


COMMON_BOARDS: dict[str, BoardIdentity] = {
    "uno": {"vid": 0x2341, "pid": 0x0043, "manufacturer": "Arduino (www.arduino.cc)",
            "product": None, "description": "ttyACM0"},
    "mega": {"vid": 0x2341, "pid": 0x0042, "manufacturer": "Arduino (www.arduino.cc)",
             "product": None, "description": "ttyACM0"},
    "leonardo": {"vid": 0x2341, "pid": 0x8036, "manufacturer": "Arduino LLC",
                 "product": "Arduino Leonardo", "description": "Arduino Leonardo"},
    "nano-ch340": {"vid": 0x1A86, "pid": 0x7523, "manufacturer": "1a86",
                   "product": "USB2.0-Serial", "description": "USB2.0-Serial"},
    "ftdi": {"vid": 0x0403, "pid": 0x6001, "manufacturer": "FTDI",
             "product": "FT232R USB UART", "description": "FT232R USB UART"},
    "cp210x": {"vid": 0x10C4, "pid": 0xEA60, "manufacturer": "Silicon Labs",
               "product": "CP2102 USB to UART Bridge Controller",
               "description": "CP2102 USB to UART Bridge Controller"},
    "pico": {"vid": 0x2E8A, "pid": 0x000A, "manufacturer": "Raspberry Pi", "product": "Pico",
             "description": "Pico"},
    "esp32-s3": {"vid": 0x303A, "pid": 0x1001, "manufacturer": "Espressif",
                 "product": "USB JTAG/serial debug unit",
                 "description": "USB JTAG/serial debug unit"},
}


class StandInBoard:
    """One board: a pty pair and the identity its port reports."""

    def __init__(self, info: PortInfo, master: int) -> None:
        self.info = info
        self.master = master
        self.plugged = True

    @property
    def device(self) -> str:
        return self.info.device

    def write(self, data: bytes) -> None:
        """Send `data` to the host, as the board's firmware would."""
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.master, view)
            except BlockingIOError:
                select.select([], [self.master], [], 1.0)
                continue
            view = view[written:]

    def read(self, timeout: float = 0.0) -> bytes:
        """What the host sent, waiting up to `timeout` seconds for the first byte."""
        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout
        while True:
            wait = max(0.0, deadline - time.monotonic()) if not chunks else 0.0
            ready, _, _ = select.select([self.master], [], [], wait)
            if not ready:
                return b"".join(chunks)
            try:
                data = os.read(self.master, 65536)
            except (BlockingIOError, OSError):
                return b"".join(chunks)
            if not data:
                return b"".join(chunks)
            chunks.append(data)

    def close(self) -> None:
        if self.plugged:
            self.plugged = False
            os.close(self.master)

    def __repr__(self) -> str:
        return f"<StandInBoard {self.device} {self.info.identity()}>"


class StandInPorts:
    """The boards plugged in; `ports` is their lister. Close it to unplug them all.

    A watcher lists in a thread of its own while a test plugs and pulls boards in the reactor's:
    each listing sees the boards before or after a change, never half of one (a board replugged
    is never seen twice, nor missing)."""

    def __init__(self) -> None:
        self.boards: list[StandInBoard] = []
        self._next_location = 1
        self._changing = threading.RLock()

    def plug(self, vid: int | None = None, pid: int | None = None, *,
             serial_number: str | None = None, location: str | None = None,
             manufacturer: str | None = None, product: str | None = None,
             description: str | None = None) -> StandInBoard:
        """A new board on a new pty; `location` defaults to a USB port of its own."""
        master, slave = os.openpty()
        tty.setraw(master)
        os.set_blocking(master, False)
        device = os.ttyname(slave)
        os.close(slave)  # the host opens it by name, as a serial port
        if location is None:
            location = f"1-{self._next_location}"
            self._next_location += 1
        board = StandInBoard(PortInfo(
            device=device, vid=vid, pid=pid, serial_number=serial_number,
            manufacturer=manufacturer, product=product, location=location,
            description=description,
        ), master)
        with self._changing:
            self.boards.append(board)
        return board

    def unplug(self, board: StandInBoard) -> None:
        """Pull the board: it leaves the list, and the host's open port fails."""
        with self._changing:
            if board in self.boards:
                self.boards.remove(board)
            board.close()

    def replug(self, board: StandInBoard) -> StandInBoard:
        """Pull the board and plug it back: same identity, another device name (the new pty
        is made while the old one still exists, so its number differs)."""
        fresh_master, slave = os.openpty()
        tty.setraw(fresh_master)
        os.set_blocking(fresh_master, False)
        device = os.ttyname(slave)
        os.close(slave)
        again = StandInBoard(replace(board.info, device=device), fresh_master)
        with self._changing:
            self.unplug(board)
            self.boards.append(again)
        return again

    def ports(self) -> list[PortInfo]:
        with self._changing:
            plugged = [board.info for board in self.boards]
        return sorted(plugged, key=lambda port: port.device)

    def close(self) -> None:
        for board in list(self.boards):
            self.unplug(board)
