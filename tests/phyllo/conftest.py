"""A pty pair as a serial line for Phyllo stacks: the stack opens the slave through the real
``serial:`` endpoint, and the test plays the device on the master, byte by byte."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from typing import TypeVar

import pytest_twisted
from twisted.internet import reactor

from tests.support import eventually, wait_for
from wireproto.phyllo import LayerBase, connect_stack
from wireproto.transports import SerialEndpoint

TopT = TypeVar("TopT", bound=LayerBase)

# The four wire examples of NOTES.md "Phyllo", topic `echo`, delimiters included.
h = bytes.fromhex
MESSAGE_MINIMAL_WIRE = h("00 0e 0b 60 10 04 65 63 68 6f 68 65 6c 6c 6f 00")
MESSAGE_REDUCED_WIRE = h("00 13 10 22 3d bc 87 2b 60 10 04 65 63 68 6f 68 65 6c 6c 6f 00")
DOCUMENT_MINIMAL_WIRE = h("00 0a 0e 60 40 04 65 63 68 6f 11 07 a5 68 65 6c 6c 6f 00")
DOCUMENT_REDUCED_WIRE = h(
    "00 0f 13 22 b4 dc 85 41 60 40 04 65 63 68 6f 11 07 a5 68 65 6c 6c 6f 00"
)


class PtyLine:
    """The device's end of the line (the pty master), and the stacks opened on the host's end."""

    def __init__(self, master: int, device: str) -> None:
        self.master = master
        self.device = device
        self.stacks: list[LayerBase] = []
        self._read = bytearray()
        flags = fcntl.fcntl(master, fcntl.F_GETFL)
        fcntl.fcntl(master, fcntl.F_SETFL, flags | os.O_NONBLOCK)

    async def open(self, build: Callable[[], TopT]) -> TopT:
        """Connect a new `build()` stack to the line through the serial endpoint."""
        top = await wait_for(connect_stack(SerialEndpoint(reactor, self.device), build))
        self.stacks.append(top)
        return top

    def write(self, data: bytes) -> None:
        """Bytes from the device to the stack."""
        view = memoryview(data)
        while view:
            view = view[os.write(self.master, view) :]

    def _pull(self, count: int) -> bool:
        try:
            while len(self._read) < count:
                chunk = os.read(self.master, 65536)
                if not chunk:
                    break
                self._read += chunk
        except BlockingIOError:
            pass
        return len(self._read) >= count

    async def read(self, count: int, timeout: float = 5.0) -> bytes:
        """The next `count` bytes the stack wrote to the line."""
        await eventually(lambda: self._pull(count), timeout=timeout)
        data = bytes(self._read[:count])
        del self._read[:count]
        return data

    async def close(self) -> None:
        for top in self.stacks:
            if top.lost_reason is None:
                lost = top.when_lost()
                top.lose_connection()
                await wait_for(lost)


@pytest_twisted.async_yield_fixture
async def line(pty_pair):
    master, device = pty_pair
    pty_line = PtyLine(master, device)
    try:
        yield pty_line
    finally:
        await pty_line.close()


async def received(layer: LayerBase, count: int, timeout: float = 5.0) -> list:
    """The next `count` units of a top layer, in order, through its Deferred API."""
    units = []
    for _ in range(count):
        units.append(await wait_for(layer.next_receive(), timeout))  # type: ignore[attr-defined]
    return units


__all__ = [
    "DOCUMENT_MINIMAL_WIRE",
    "DOCUMENT_REDUCED_WIRE",
    "MESSAGE_MINIMAL_WIRE",
    "MESSAGE_REDUCED_WIRE",
    "PtyLine",
    "received",
]
