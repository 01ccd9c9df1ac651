"""The NATS client protocol, sans-IO: the server's operations parsed from bytes, and the
client's written as bytes (https://docs.nats.io/reference/reference-protocols/nats-protocol).

The server speaks `INFO {json}`, `MSG subject sid [reply] size`, `HMSG subject sid [reply]
header-size total-size` (each followed by its payload), `PING`, `PONG`, `+OK` and `-ERR 'text'`,
one per CRLF-ended line. `NatsParser.feed` turns bytes into events:

- ``(MSG, subject, sid, reply, headers, payload)``, `reply` and `headers` None when absent;
- ``(INFO, dict)``, ``(PING,)``, ``(PONG,)``, ``(OK,)``, ``(ERR, text)``.

Headers are kept as the raw block (``NATS/1.0 ...\\r\\n...\\r\\n\\r\\n``); `header_status` and
`header_values` read it.
"""

from __future__ import annotations

import json
from typing import Any

from wireproto.errors import ProtocolError

__all__ = [
    "MSG", "INFO", "PING", "PONG", "OK", "ERR",
    "NatsProtocolError",
    "NatsParser",
    "connect_command",
    "pub_command",
    "sub_command",
    "unsub_command",
    "headers_block",
    "header_status",
    "header_values",
    "PING_COMMAND",
    "PONG_COMMAND",
]

MSG, INFO, PING, PONG, OK, ERR = "MSG", "INFO", "PING", "PONG", "+OK", "-ERR"
PING_COMMAND = b"PING\r\n"
PONG_COMMAND = b"PONG\r\n"
DEFAULT_MAX_CONTROL_LINE = 4096
HEADER_LINE = b"NATS/1.0"


class NatsProtocolError(ProtocolError):
    """The NATS server sent something that is not the NATS protocol."""


class NatsParser:
    """The server's side of a NATS connection, parsed incrementally."""

    def __init__(self, max_control_line: int = DEFAULT_MAX_CONTROL_LINE) -> None:
        self.max_control_line = max_control_line
        self._buffer = b""
        # A MSG or HMSG line read, its payload not yet: (subject, sid, reply, header_size, size)
        self._waiting: tuple[str, int, str | None, int, int] | None = None

    def feed(self, data: bytes) -> list[tuple]:
        buffer = self._buffer + data if self._buffer else data
        events: list[tuple] = []
        append = events.append
        position, end = 0, len(buffer)
        waiting = self._waiting
        while position < end:
            if waiting is not None:
                subject, sid, reply, header_size, size = waiting
                stop = position + size
                if stop + 2 > end:
                    break
                if header_size:
                    headers = buffer[position:position + header_size]
                    payload = buffer[position + header_size:stop]
                else:
                    headers, payload = None, buffer[position:stop]
                append((MSG, subject, sid, reply, headers, payload))
                position = stop + 2
                waiting = None
                continue
            line_end = buffer.find(b"\r\n", position)
            if line_end < 0:
                if end - position > self.max_control_line:
                    raise NatsProtocolError("a NATS control line longer than "
                                            f"{self.max_control_line} bytes")
                break
            line = buffer[position:line_end]
            position = line_end + 2
            if line[:4] == b"MSG ":
                waiting = self._message_line(line, headers=False)
            elif line[:5] == b"HMSG ":
                waiting = self._message_line(line, headers=True)
            elif line == b"PING":
                append((PING,))
            elif line == b"PONG":
                append((PONG,))
            elif line == b"+OK":
                append((OK,))
            elif line[:5] == b"INFO ":
                try:
                    info = json.loads(line[5:])
                except ValueError as error:
                    raise NatsProtocolError(f"INFO that is not JSON: {error}") from None
                if not isinstance(info, dict):
                    raise NatsProtocolError("INFO that is not a JSON object")
                append((INFO, info))
            elif line[:4] == b"-ERR":
                append((ERR, line[4:].strip().strip(b"'").decode("utf-8", "replace")))
            else:
                raise NatsProtocolError(f"unknown NATS operation {line[:32]!r}")
        self._waiting = waiting
        self._buffer = buffer[position:] if position < end else b""
        return events

    @staticmethod
    def _message_line(line: bytes, *, headers: bool) -> tuple[str, int, str | None, int, int]:
        parts = line.split()
        try:
            if headers:
                if len(parts) == 5:
                    _, subject, sid, header_size, size = parts
                    reply = None
                else:
                    _, subject, sid, reply_bytes, header_size, size = parts
                    reply = reply_bytes.decode()
                sizes = int(header_size), int(size)
            else:
                if len(parts) == 4:
                    _, subject, sid, size = parts
                    reply = None
                else:
                    _, subject, sid, reply_bytes, size = parts
                    reply = reply_bytes.decode()
                sizes = 0, int(size)
            sid_number = int(sid)
        except ValueError:
            raise NatsProtocolError(f"malformed {line[:64]!r}") from None
        if not 0 <= sizes[0] <= sizes[1]:
            raise NatsProtocolError(f"malformed sizes in {line[:64]!r}")
        return subject.decode(), sid_number, reply, sizes[0], sizes[1]


def connect_command(options: dict[str, Any]) -> bytes:
    return b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + b"\r\n"


def pub_command(subject: str, payload: bytes, reply: str | None = None,
                headers: bytes | None = None) -> bytes:
    """PUB, or HPUB when `headers` (a block from `headers_block`) is given."""
    head = f"{subject} {reply} " if reply else f"{subject} "
    if headers is None:
        return b"".join((b"PUB ", head.encode(), b"%d\r\n" % len(payload), payload, b"\r\n"))
    return b"".join((
        b"HPUB ", head.encode(), b"%d %d\r\n" % (len(headers), len(headers) + len(payload)),
        headers, payload, b"\r\n",
    ))


def sub_command(subject: str, sid: int, queue: str | None = None) -> bytes:
    return (f"SUB {subject} {queue} {sid}\r\n" if queue else f"SUB {subject} {sid}\r\n").encode()


def unsub_command(sid: int) -> bytes:
    return b"UNSUB %d\r\n" % sid


def headers_block(values: dict[str, str]) -> bytes:
    """A header block: ``NATS/1.0``, then ``Name: value`` lines, then a blank line."""
    lines = [HEADER_LINE]
    for name, value in values.items():
        lines.append(f"{name}: {value}".encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


# The header by which a wireproto process refuses a call from another ("busy", "failed").
STATUS_HEADER = "Wp-Status"


def header_status(headers: bytes) -> int | None:
    """The status code on a header block's first line (503: no responders), if any."""
    first = headers.split(b"\r\n", 1)[0]
    parts = first.split(None, 2)
    if len(parts) >= 2 and parts[1].isdigit():
        return int(parts[1])
    return None


def header_values(headers: bytes) -> dict[str, str]:
    """A header block's names and values (the last of a repeated name)."""
    values: dict[str, str] = {}
    for line in headers.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon:
            values[name.decode("utf-8", "replace").strip()] = \
                value.decode("utf-8", "replace").strip()
    return values
