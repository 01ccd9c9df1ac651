"""The NATS client protocol, sans-IO (https://docs.nats.io/reference/reference-protocols/
nats-protocol): what a server sends, read as typed events, and what a client sends, written.

Each operation is a control line ended by CRLF; MSG and HMSG are followed by their payload and
a CRLF. A server sends:

    INFO {json}                                       Info(properties)
    MSG <subject> <sid> [reply] <size>                Msg(subject, sid, reply, None, payload)
    HMSG <subject> <sid> [reply] <header size> <size> Msg(subject, sid, reply, headers, payload)
    PING, PONG, +OK                                   Ping(), Pong(), Ok()
    -ERR 'text'                                       Err(text)

and a client CONNECT {json}, PUB, HPUB, SUB, UNSUB, PING and PONG (`Connect`, `Pub`, `Sub`,
`Unsub`, `Ping`, `Pong`).

NATS is a byte stream: a read may end inside an operation or hold many. `Decoder` is fed the
bytes as they arrive and returns the events complete so far, keeping the rest; `decode(data)`
reads a whole buffer, which must end where an operation does. `encode(operation)` writes any
operation, a client's or a server's (so `decode(encode(event)) == [event]` for a server's); the
client's publish path uses `encode_pub`, which is `encode(Pub(...))` without building the Pub.

A message's headers are kept as the raw block, ``NATS/1.0[ status]\\r\\n`` then ``Name: value``
lines then a blank line, since a reader often wants one line of it and no more;
`headers_block` writes one, `header_values` and `header_status` (or `Msg.values` and
`Msg.status`) read one.

On bad input the decoder raises only `wireproto.errors.ProtocolError` subclasses, and past its
limits (`max_control_line`, `max_payload`) `FrameTooLarge`: the connection is then unusable.
`encode` refuses what would break the stream's framing (a subject with a space or a control
character, a negative sid) with ProtocolError subclasses too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from wireproto.codecs.serialization import binary, json_loads
from wireproto.errors import (
    BadEncoding,
    BadJSON,
    BadLength,
    FrameTooLarge,
    InvalidField,
    InvalidTopic,
    ProtocolError,
    TruncatedFrame,
    UnknownType,
)

__all__ = [
    "DEFAULT_MAX_CONTROL_LINE",
    "DEFAULT_MAX_PAYLOAD",
    "HEADER_LINE",
    "Info",
    "Msg",
    "Ping",
    "Pong",
    "Ok",
    "Err",
    "ServerEvent",
    "Connect",
    "Pub",
    "Sub",
    "Unsub",
    "Operation",
    "Decoder",
    "decode",
    "encode",
    "encode_pub",
    "PING_COMMAND",
    "PONG_COMMAND",
    "headers_block",
    "header_status",
    "header_values",
]

# nats-server's own default for the control lines it reads, which bounds the ones it sends.
DEFAULT_MAX_CONTROL_LINE = 4096
# The most a nats-server's max_payload may be set to (its default is 1 MiB).
DEFAULT_MAX_PAYLOAD = 64 << 20
HEADER_LINE = b"NATS/1.0"
PING_COMMAND = b"PING\r\n"
PONG_COMMAND = b"PONG\r\n"
OK_COMMAND = b"+OK\r\n"


# -- events and commands ------------------------------------------------------------------------
# The dataclasses do not validate: the decoder has checked what it builds, and encode checks
# what it is given.


@dataclass(frozen=True, slots=True)
class Info:
    """The server's INFO: its id, version, max_payload, nonce, connect_urls..."""

    properties: dict[str, Any]


class Msg(NamedTuple):
    """A message delivered to the client's subscription `sid` (MSG, or HMSG with `headers`).

    A named tuple, where the other events are frozen dataclasses: one is made for every message
    the cluster receives, and a tuple is made in a fraction of the time."""

    subject: str
    sid: int
    reply: str | None
    headers: bytes | None
    payload: bytes

    @property
    def status(self) -> int | None:
        """The status code of the header block (503: no responders), if any."""
        return None if self.headers is None else header_status(self.headers)

    def values(self) -> dict[str, str]:
        """The header block's names and values ({} without headers)."""
        return {} if self.headers is None else header_values(self.headers)


@dataclass(frozen=True, slots=True)
class Ping:
    """PING: the other side must answer PONG."""


@dataclass(frozen=True, slots=True)
class Pong:
    """PONG: the answer to a PING; everything written before the PING has been read."""


@dataclass(frozen=True, slots=True)
class Ok:
    """+OK: the server took a command (only in verbose mode)."""


@dataclass(frozen=True, slots=True)
class Err:
    """-ERR: the server refuses something; most errors close the connection."""

    text: str


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT: the client's options (verbose, headers, echo, name, credentials...)."""

    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Pub:
    """PUB, or HPUB with a header block from `headers_block`."""

    subject: str
    payload: bytes
    reply: str | None = None
    headers: bytes | None = None


@dataclass(frozen=True, slots=True)
class Sub:
    """SUB: deliver what is published on `subject` (wildcards allowed) as subscription `sid`;
    with `queue`, to one member of that queue group."""

    subject: str
    sid: int
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class Unsub:
    """UNSUB: end subscription `sid`."""

    sid: int


ServerEvent = Info | Msg | Ping | Pong | Ok | Err
Operation = ServerEvent | Connect | Pub | Sub | Unsub

_PING, _PONG, _OK = Ping(), Pong(), Ok()
# The message lines a decoder remembers having read, and reads again by a look-up.
_LINES_KEPT = 256
_new_tuple = tuple.__new__


# -- reading what a server sends ----------------------------------------------------------------


def _excerpt(line: bytes) -> str:
    return repr(line[:64]) + ("..." if len(line) > 64 else "")


class Decoder:
    """The server's side of one NATS connection, decoded incrementally: `feed` the bytes as
    they arrive, get the events complete so far, in order.

    A control line longer than `max_control_line`, or a message longer than `max_payload`
    (headers and payload), raises FrameTooLarge however the bytes are cut into reads.
    """

    __slots__ = ("max_control_line", "max_payload", "_buffer", "_waiting", "_lines")

    def __init__(self, max_control_line: int = DEFAULT_MAX_CONTROL_LINE,
                 max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.max_control_line = max_control_line
        self.max_payload = max_payload
        self._buffer = b""
        # A MSG or HMSG line read, its payload not yet: (subject, sid, reply, header size, size)
        self._waiting: tuple[str, int, str | None, int, int] | None = None
        # MSG and HMSG lines without a reply subject, as read before (at most _LINES_KEPT).
        self._lines: dict[bytes, tuple[str, int, str | None, int, int]] = {}

    @property
    def pending(self) -> int:
        """Bytes fed that are not yet part of an event."""
        return len(self._buffer)

    @property
    def inside_message(self) -> bool:
        """Whether the bytes fed end inside a message's payload."""
        return self._waiting is not None

    def feed(self, data: bytes) -> list[ServerEvent]:
        buffer = self._buffer + data if self._buffer else data
        events: list[ServerEvent] = []
        append = events.append
        position, end = 0, len(buffer)
        waiting = self._waiting
        max_line, max_payload = self.max_control_line, self.max_payload
        lines = self._lines
        while position < end:
            if waiting is None:
                line_end = buffer.find(b"\r\n", position)
                if line_end < 0:
                    # One byte more than the limit may be the line's CR.
                    if end - position > max_line + 1:
                        raise self._too_long(buffer[position:end], ended=False)
                    break
                if line_end - position > max_line:
                    raise self._too_long(buffer[position:line_end], ended=True)
                line = buffer[position:line_end]
                position = line_end + 2
                # A subscription's messages of one size have the same line: read it once.
                waiting = lines.get(line)
                if waiting is None:
                    # The message lines, written out: they are most of what a server sends.
                    parts = line.split()
                    count = len(parts)
                    operation = parts[0] if count else line
                    if operation != b"HMSG" and operation != b"MSG":
                        append(self._other(line))
                        continue
                    try:
                        if operation == b"HMSG":
                            if count != 5 and count != 6:
                                raise ValueError
                            header_size, size = int(parts[-2]), int(parts[-1])
                            reply = parts[3].decode() if count == 6 else None
                        else:
                            if count != 4 and count != 5:
                                raise ValueError
                            header_size, size = 0, int(parts[-1])
                            reply = parts[3].decode() if count == 5 else None
                        sid = int(parts[2])
                        subject = parts[1].decode()
                    except ValueError:  # UnicodeDecodeError is one too
                        raise self._bad_message_line(line) from None
                    if sid < 0 or not 0 <= header_size <= size <= max_payload:
                        raise self._bad_message_line(line)
                    waiting = subject, sid, reply, header_size, size
                    if reply is None:  # a reply subject is seldom seen twice
                        if len(lines) >= _LINES_KEPT:
                            lines.clear()
                        lines[line] = waiting
            subject, sid, reply, header_size, size = waiting
            stop = position + size
            if stop + 2 > end:
                break
            if buffer[stop] != 13 or buffer[stop + 1] != 10:  # CR LF
                raise self._not_ended(subject, size, buffer, stop)
            if header_size:
                append(_new_tuple(Msg, (subject, sid, reply,
                                        buffer[position:position + header_size],
                                        buffer[position + header_size:stop])))
            else:
                append(_new_tuple(Msg, (subject, sid, reply, None, buffer[position:stop])))
            position = stop + 2
            waiting = None
        self._waiting = waiting
        self._buffer = buffer[position:] if position < end else b""
        return events

    @staticmethod
    def _not_ended(subject: str, size: int, buffer: bytes, stop: int) -> InvalidField:
        return InvalidField(
            f"NATS message on {subject!r}: its {size}-byte payload is not followed by "
            f"CRLF but by {buffer[stop:stop + 2]!r}; the sizes in its MSG line are wrong",
            offset=stop)

    def _too_long(self, line: bytes, *, ended: bool) -> FrameTooLarge:
        so_far = "" if ended else " and not ended yet"
        return FrameTooLarge(
            f"NATS control line of {len(line)} bytes{so_far} is longer than the decoder's "
            f"max_control_line of {self.max_control_line}: {_excerpt(line)}")

    def _bad_message_line(self, line: bytes) -> ProtocolError:
        """What is wrong with a MSG or HMSG line that `feed` could not read."""
        parts = line.split()
        if parts[0] != b"MSG" and parts[0] != b"HMSG":
            return self._unknown(line)
        operation = parts[0].decode()
        if operation == "MSG":
            fields, counts = "subject sid [reply] size", (4, 5)
        else:
            fields, counts = "subject sid [reply] header-size size", (5, 6)
        if len(parts) not in counts:
            return InvalidField(f"NATS {operation} line of {len(parts) - 1} fields, not "
                                f"{fields}: {_excerpt(line)}")
        try:
            numbers = [int(part) for part in parts[-2 if operation == "HMSG" else -1:]]
            numbers.append(int(parts[2]))
        except ValueError:
            return InvalidField(f"NATS {operation} line whose sid or sizes are not decimal "
                                f"integers: {_excerpt(line)}")
        if min(numbers) < 0 or (operation == "HMSG" and numbers[0] > numbers[1]):
            return BadLength(f"NATS {operation} line with a negative sid or size, or a header "
                             f"size over the whole size: {_excerpt(line)}")
        size = numbers[-2]
        if size > self.max_payload:
            return FrameTooLarge(
                f"NATS message of {size} bytes is over the decoder's max_payload of "
                f"{self.max_payload} ({_excerpt(line)}); a server sends none over the "
                "max_payload of its INFO, which the decoder's may be raised to")
        return BadEncoding(f"NATS subject or reply subject that is not UTF-8: {_excerpt(line)}")

    def _other(self, line: bytes) -> ServerEvent:
        if line == b"PING":
            return _PING
        if line == b"PONG":
            return _PONG
        if line == b"+OK":
            return _OK
        if line[:5] == b"INFO ":
            info = json_loads(line[5:], "NATS INFO")
            if type(info) is not dict:
                raise BadJSON(f"NATS INFO that is not a JSON object: {_excerpt(line)}")
            return Info(info)
        if line[:4] == b"-ERR":
            return Err(line[4:].strip().strip(b"'").decode("utf-8", "replace"))
        raise self._unknown(line)

    @staticmethod
    def _unknown(line: bytes) -> UnknownType:
        return UnknownType(f"NATS operation {_excerpt(line)} is none a server sends (INFO, "
                           "MSG, HMSG, PING, PONG, +OK, -ERR)")


def decode(data: bytes) -> list[ServerEvent]:
    """The events of a whole buffer of a server's bytes, which must end where an operation
    does (TruncatedFrame otherwise)."""
    decoder = Decoder()
    events = decoder.feed(data if type(data) is bytes else binary(data, "NATS bytes"))
    if decoder._buffer:
        where = "inside a message's payload" if decoder.inside_message else \
            "inside a control line (no CRLF)"
        raise TruncatedFrame(f"NATS bytes end {where}: {decoder.pending} bytes after the last "
                             "whole operation", offset=len(data) - decoder.pending)
    return events


# -- writing ------------------------------------------------------------------------------------

# Subjects already checked, as the bytes written: the publish path checks each subject once.
_checked: dict[str, bytes] = {}
_CHECKED_SIZE = 4096


def _field(text: str, what: str) -> bytes:
    """A subject, reply subject or queue group as a control line's field."""
    if type(text) is not str:
        raise InvalidField(f"NATS {what} must be str, not {type(text).__name__}")
    if not text or not text.isprintable() or " " in text:
        raise InvalidTopic(f"NATS {what} {text[:64]!r} is empty or holds a space or a control "
                           "character, which would end it early")
    return text.encode()


def _subject(subject: str) -> bytes:
    field = _checked.get(subject)
    if field is None:
        field = _field(subject, "subject")
        if len(_checked) >= _CHECKED_SIZE:
            _checked.clear()
        _checked[subject] = field
    return field


def _sid(sid: int) -> bytes:
    if type(sid) is not int or sid < 0:
        raise InvalidField(f"NATS sid must be a non-negative int, not {sid!r}")
    return b"%d" % sid


def encode_pub(subject: str, payload: bytes, reply: str | None = None,
               headers: bytes | None = None) -> bytes:
    """PUB, or HPUB when `headers` (a block from `headers_block`) is given."""
    field = _checked.get(subject)
    if field is None:
        field = _subject(subject)
    if reply is not None:
        field = field + b" " + _field(reply, "reply subject")
    if headers is None:
        return b"PUB %s %d\r\n%s\r\n" % (field, len(payload), payload)
    size = len(headers)
    return b"HPUB %s %d %d\r\n%s%s\r\n" % (field, size, size + len(payload), headers, payload)


def _block(headers: bytes, what: str) -> bytes:
    if headers[:8] != HEADER_LINE or headers[-4:] != b"\r\n\r\n":
        raise InvalidField(f"NATS {what} headers must be a block from headers_block "
                           f"(NATS/1.0 ... CRLF CRLF), not {_excerpt(headers)}")
    return headers


def _json(value: dict[str, Any], what: str) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as error:
        raise InvalidField(f"NATS {what} cannot be written as JSON: {error}") from None


def _encode_msg(msg: Msg) -> bytes:
    head = _subject(msg.subject) + b" " + _sid(msg.sid)
    if msg.reply is not None:
        head += b" " + _field(msg.reply, "reply subject")
    payload, headers = msg.payload, msg.headers
    if headers is None:
        return b"".join((b"MSG ", head, b" %d\r\n" % len(payload), payload, b"\r\n"))
    size = len(_block(headers, "MSG"))
    return b"".join((b"HMSG ", head, b" %d %d\r\n" % (size, size + len(payload)),
                     headers, payload, b"\r\n"))


def _encode_err(err: Err) -> bytes:
    text = err.text
    if not text.isprintable() or text != text.strip().strip("'"):
        raise InvalidField(f"NATS -ERR text {text[:64]!r} holds a control character, or spaces "
                           "or quotes at its ends, which would not be read back")
    return b"-ERR '" + text.encode() + b"'\r\n"


def _encode_sub(sub: Sub) -> bytes:
    queue = b"" if sub.queue is None else _field(sub.queue, "queue group") + b" "
    return b"SUB %s %s%s\r\n" % (_field(sub.subject, "subject"), queue, _sid(sub.sid))


_ENCODERS: dict[type, Any] = {
    Pub: lambda pub: encode_pub(pub.subject, pub.payload, pub.reply,
                                None if pub.headers is None else _block(pub.headers, "HPUB")),
    Sub: _encode_sub,
    Unsub: lambda unsub: b"UNSUB %s\r\n" % _sid(unsub.sid),
    Ping: lambda _: PING_COMMAND,
    Pong: lambda _: PONG_COMMAND,
    Connect: lambda connect: b"CONNECT " + _json(connect.options, "CONNECT") + b"\r\n",
    Msg: _encode_msg,
    Info: lambda info: b"INFO " + _json(info.properties, "INFO") + b"\r\n",
    Ok: lambda _: OK_COMMAND,
    Err: _encode_err,
}


def encode(operation: Operation) -> bytes:
    """The bytes of one operation, a client's or a server's."""
    try:
        encoder = _ENCODERS[type(operation)]
    except KeyError:
        raise TypeError(f"not a NATS operation: {operation!r}") from None
    return encoder(operation)


# -- headers ------------------------------------------------------------------------------------


def headers_block(values: Mapping[str, str], status: int | None = None,
                  description: str = "") -> bytes:
    """A header block: ``NATS/1.0`` (with a status, ``NATS/1.0 503`` and its description if
    any), then ``Name: value`` lines, then a blank line."""
    first = HEADER_LINE
    if status is not None:
        if type(status) is not int or not 100 <= status <= 999:
            raise InvalidField(f"NATS header status must be an int of three digits, not "
                               f"{status!r}")
        if not description.isprintable():
            raise InvalidField(f"NATS header status description {description[:64]!r} holds a "
                               "control character, which would end its line")
        first = b"%s %d%s" % (first, status, (" " + description).encode() if description
                              else b"")
    lines = [first]
    for name, value in values.items():
        if not name or ":" in name or not name.isprintable() or " " in name:
            raise InvalidField(f"NATS header name {name!r} is empty or holds a colon, a space "
                               "or a control character")
        if not value.isprintable():
            raise InvalidField(f"NATS header {name} value {value[:64]!r} holds a control "
                               "character, which would end its line")
        lines.append(f"{name}: {value}".encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


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
