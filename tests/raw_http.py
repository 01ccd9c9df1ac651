"""A connection spoken to by hand: HTTP requests written byte for byte, their answers read whole,
and WebSocket frames after an upgrade, for tests where the exact bytes matter."""

from __future__ import annotations

import json
import os

from twisted.internet import defer
from twisted.internet.protocol import Protocol

from tests.support import eventually, wait_for

__all__ = ["Answer", "Raw"]


class Answer:
    """An HTTP answer, read whole from a connection the server closed."""

    def __init__(self, data: bytes) -> None:
        head, _, self.body = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        self.status = int(lines[0].split()[1]) if lines[0] else 0
        self.headers = [line.decode("latin-1") for line in lines[1:]]
        self.worker: int | None = None
        if "transfer-encoding: chunked" in (header.lower() for header in self.headers):
            body, self.body = self.body, b""
            while body:
                size, _, body = body.partition(b"\r\n")
                length = int(size, 16)
                self.body, body = self.body + body[:length], body[length + 2:]

    def json(self) -> object:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<Answer {self.status} {self.body[:200]!r} (worker {self.worker})>"


class Raw(Protocol):
    """One connection, spoken to by hand: HTTP, then WebSocket frames after an upgrade."""

    def __init__(self) -> None:
        self.data = b""
        self.ended: defer.Deferred[None] = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: object = None) -> None:
        self.ended.callback(None)

    def send(self, method: str, target: str, body: bytes = b"", *, headers: str = "",
             close: bool = True) -> None:
        head = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}"
        if close:
            head += "Connection: close\r\n"
        if body:
            head += f"Content-Type: text/plain;charset=UTF-8\r\nContent-Length: {len(body)}\r\n"
        self.transport.write(head.encode() + b"\r\n" + body)

    async def answer(self, timeout: float = 15) -> Answer:
        await wait_for(self.ended, timeout)
        return Answer(self.data)

    # -- WebSocket -------------------------------------------------------------------------------

    async def upgrade(self, sid: str) -> None:
        self.send("GET", f"/engine.io/?EIO=4&transport=websocket&sid={sid}", close=False,
                  headers="Upgrade: websocket\r\nConnection: Upgrade\r\n"
                          "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                          "Sec-WebSocket-Version: 13\r\n")
        await eventually(lambda: b"\r\n\r\n" in self.data, timeout=10)
        head, _, self.data = self.data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 "), head

    def send_text(self, text: str) -> None:
        payload, mask = text.encode(), os.urandom(4)
        assert len(payload) < 126
        self.transport.write(bytes([0x81, 0x80 | len(payload)]) + mask
                             + bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload)))

    def texts(self) -> list[str]:
        """The text frames the server sent so far."""
        found, at, data = [], 0, self.data
        while at + 2 <= len(data):
            opcode, length, at = data[at] & 0x0F, data[at + 1] & 0x7F, at + 2
            if length == 126:
                length, at = int.from_bytes(data[at:at + 2], "big"), at + 2
            if at + length > len(data):
                break
            if opcode == 1:
                found.append(data[at:at + length].decode())
            at += length
        return found

    async def received(self, count: int) -> list[str]:
        await eventually(lambda: len(self.texts()) >= count, timeout=10)
        return self.texts()
