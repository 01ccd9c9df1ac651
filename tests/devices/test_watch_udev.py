"""The udev watcher's reading of udev's events, where pyudev and udev cannot run (a container):
a datagram socket pair stands in for the netlink socket, read by the real reactor."""

from __future__ import annotations

import errno
import os
import socket

import pytest_twisted
from twisted.internet import reactor

from tests.support import eventually
from wireproto.devices import UdevWatcher
from wireproto.devices.standin import COMMON_BOARDS, StandInPorts


class SocketMonitor:
    """What the watcher uses of pyudev's Monitor (`fileno`, `poll(timeout=0)`): each datagram
    sent on `kernel` is an event; ``overflow`` fails the read as a netlink socket whose buffer
    filled does (pyudev raises the ENOBUFS libudev gives)."""

    def __init__(self) -> None:
        self.kernel, self._ours = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._ours.setblocking(False)

    def fileno(self) -> int:
        return self._ours.fileno()

    def poll(self, timeout: float | None = None) -> bytes | None:
        try:
            event = self._ours.recv(4096)
        except BlockingIOError:
            return None
        if event == b"overflow":
            raise OSError(errno.ENOBUFS, os.strerror(errno.ENOBUFS))
        return event

    def close(self) -> None:
        self.kernel.close()
        self._ours.close()


@pytest_twisted.ensureDeferred
async def test_lost_udev_events_have_the_ports_listed_again_and_events_still_read():
    boards = StandInPorts()
    watcher = UdevWatcher(reactor, boards.ports, settle=0.01, safety_interval=3600)
    monitor = SocketMonitor()
    changes: list[int] = []
    watcher.subscribe(lambda ports: changes.append(len(ports)))
    watcher._ports = []
    watcher._monitor = monitor  # as start() sets pyudev's
    reactor.addReader(watcher)
    try:
        boards.plug(**COMMON_BOARDS["pico"], serial_number="A")
        monitor.kernel.send(b"add")
        await eventually(lambda: changes == [1])
        boards.plug(**COMMON_BOARDS["pico"], serial_number="B")
        monitor.kernel.send(b"overflow")  # the "add" of B was lost with others
        await eventually(lambda: changes == [1, 2], timeout=2)
        boards.plug(**COMMON_BOARDS["pico"], serial_number="C")
        monitor.kernel.send(b"add")  # and the watcher still reads udev's events
        await eventually(lambda: changes == [1, 2, 3], timeout=2)
    finally:
        watcher.stop()
        boards.close()
        monitor.close()
