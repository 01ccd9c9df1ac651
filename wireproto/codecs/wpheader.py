"""The ``Wp`` header by which one broker process of a cluster tells the others where a message
comes from (docs/cluster.md), sans-IO.

A message a process forwards on NATS carries a header block (wireproto.codecs.nats) with the
line::

    Wp: ORIGIN SEQUENCE WILL PROTOCOL [NAME:LENGTH:KIND ...]

- ORIGIN, the publishing process: fresh each time a process starts, without spaces;
- SEQUENCE, that process's count of the messages it forwarded, a decimal integer;
- WILL, ``w`` for a will and ``-`` for any other message;
- PROTOCOL, the protocol the message came in on, ``-`` for none;
- then one field for each encoding of the message that it carries in one of the hub's portable
  formats: the format's name, the encoding's length in bytes, and ``b`` (binary) or ``t``
  (text). The encodings come first in the NATS payload, in the order the header names them,
  and the message's own payload after them.

`encode(header)` writes a header block and `decode(block)` reads one back; a block without the
line (a plain publish from a NATS client that is not a broker) decodes to None. `read(block)` is
`decode` without the dataclass, for the receiving process. `carry` puts the
encodings before the payload and `split` takes them off again. `HeaderWriter` writes one
origin's blocks on the publish path, where what depends only on (will, protocol) is made once.

A process that refuses another's call says why in the ``Wp-Status`` header (`STATUS_HEADER`).

On bad input `decode` and `split` raise only `wireproto.errors.ProtocolError` subclasses;
`encode` refuses, with them too, a field that could not be read back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from wireproto.codecs.serialization import binary, unchecked_constructor
from wireproto.errors import BadEncoding, BadLength, InvalidField, TruncatedFrame

__all__ = [
    "STATUS_HEADER",
    "VERSION",
    "UnknownVersion",
    "Carried",
    "WpHeader",
    "HeaderWriter",
    "encode",
    "decode",
    "read",
    "carry",
    "split",
]

# The header by which a wireproto process refuses a call from another ("busy", "failed").
STATUS_HEADER = "Wp-Status"
# The version of the line this module reads and writes. Its name says it: a later version
# of the line will be ``Wp2:``, ``Wp3:``..., written only once every process of the cluster
# says in its heartbeat that it reads it (docs/cluster.md, "Versions and rolling upgrades").
VERSION = 1
_NEWER = re.compile(rb"\r\nWp(?:[2-9]|[1-9][0-9]+): [^\r]*")


class UnknownVersion(InvalidField):
    """A ``Wp`` header of a later version than this process reads."""


_BLOCK_START = b"NATS/1.0\r\nWp: "
_LINE = b"\r\nWp: "
_BLOCK_END = b"\r\n\r\n"
_KINDS = {b"b": True, b"t": False}


@dataclass(frozen=True, slots=True)
class Carried:
    """One encoding a message carries: its portable format's name, its length in bytes, and
    whether it is binary."""

    name: str
    length: int
    binary: bool


@dataclass(frozen=True, slots=True)
class WpHeader:
    """Where a forwarded message comes from: the process (`origin`) and its `sequence` number
    there, whether it is a will, the protocol it came in on ("" for none), and the encodings it
    carries ahead of its payload."""

    origin: str
    sequence: int
    will: bool = False
    protocol: str = ""
    carried: tuple[Carried, ...] = ()


_header = unchecked_constructor(WpHeader)
_carried = unchecked_constructor(Carried)


# -- writing --------------------------------------------------------------------------------------


def _token(text: str, what: str) -> bytes:
    """A field of the line: text without spaces or control characters."""
    if type(text) is not str:
        raise InvalidField(f"Wp header {what} must be str, not {type(text).__name__}")
    if not text or not text.isprintable() or " " in text:
        raise InvalidField(f"Wp header {what} {text[:64]!r} is empty or holds a space or a "
                           "control character")
    return text.encode()


def _tail(will: bool, protocol: str) -> bytes:
    if protocol == "-":
        raise InvalidField("Wp header protocol '-' would be read back as no protocol")
    return (b"w " if will else b"- ") + (_token(protocol, "protocol") if protocol else b"-")


def _carried_field(name: str, length: int, is_binary: bool) -> bytes:
    if ":" in name:
        raise InvalidField(f"Wp header encoding name {name[:64]!r} holds a colon")
    if type(length) is not int or length < 0:
        raise InvalidField(f"Wp header encoding {name} length must be a non-negative int, not "
                           f"{length!r}")
    return b" %s:%d:%s" % (_token(name, "encoding name"), length, b"b" if is_binary else b"t")


def encode(header: WpHeader) -> bytes:
    """The header block of `header`, ``NATS/1.0`` and its Wp line."""
    sequence = header.sequence
    if type(sequence) is not int or sequence < 0:
        raise InvalidField(f"Wp header sequence must be a non-negative int, not {sequence!r}")
    return b"".join((
        _BLOCK_START, _token(header.origin, "origin"), b" %d " % sequence,
        _tail(header.will, header.protocol),
        *(_carried_field(carried.name, carried.length, carried.binary)
          for carried in header.carried),
        _BLOCK_END,
    ))


class HeaderWriter:
    """The header blocks of the messages one process forwards (its `origin`): a block costs one
    formatting of three parts, since the part after the sequence number is made once for each
    (will, protocol), and the field of each encoding's name once."""

    __slots__ = ("origin", "_start", "_ends", "_names")

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self._start = _BLOCK_START + _token(origin, "origin") + b" "
        self._ends: dict[tuple[bool, str], bytes] = {}
        self._names: dict[str, bytes] = {}

    def write(self, sequence: int, will: bool, protocol: str,
              encodings: Mapping[str, tuple[bytes, bool]] | None = None) -> bytes:
        """The block of message `sequence`; with the `encodings` it carries (name: (data,
        binary)), which `carry` puts before its payload in the same order."""
        end = self._ends.get((will, protocol))
        if end is None:
            end = self._ends[(will, protocol)] = b" " + _tail(will, protocol) + _BLOCK_END
        if encodings:
            end = end[:-4] + self._carried(encodings) + _BLOCK_END
        return b"%s%d%s" % (self._start, sequence, end)

    def _carried(self, encodings: Mapping[str, tuple[bytes, bool]]) -> bytes:
        fields = []
        for name, (data, is_binary) in encodings.items():
            start = self._names.get(name)
            if start is None:
                start = self._names[name] = _carried_field(name, 0, False)[:-3]
            fields.append(start + b"%d:%s" % (len(data), b"b" if is_binary else b"t"))
        return b"".join(fields)


def carry(encodings: Mapping[str, tuple[bytes, bool]], payload: bytes) -> bytes:
    """The NATS payload of a message with `encodings` (name: (data, binary)): the encodings
    first, in order, then the message's payload."""
    return b"".join([data for data, _ in encodings.values()] + [payload])


# -- reading --------------------------------------------------------------------------------------


def _excerpt(line: bytes) -> str:
    return repr(line[:64]) + ("..." if len(line) > 64 else "")


def _number(field: bytes) -> bool:
    """Whether a field is a decimal integer that fits 63 bits, as every count here does."""
    return field.isdigit() and len(field) <= 19


def _read_carried(field: bytes) -> Carried:
    name, colon, rest = field.partition(b":")
    length, colon2, kind = rest.partition(b":")
    if not (colon and colon2 and name and _number(length) and kind in _KINDS):
        raise InvalidField(f"Wp header encoding {_excerpt(field)} is not NAME:LENGTH:b or "
                           "NAME:LENGTH:t (LENGTH of at most 19 digits)")
    return _carried(name.decode(), int(length), _KINDS[kind])


# What is around the sequence number, as read before, by (origin, what follows the number): a
# receiving process sees the same few again and again. Bounded, and emptied when full.
_known: dict[tuple[bytes, bytes], tuple[str, bool, str, tuple[Carried, ...]]] = {}
_CACHE_SIZE = 1024
# The longest origin and rest of a line kept (a few times what a process writes).
_KEPT_SIZE = 512


def _read_tail(tail: bytes, line: bytes) -> tuple[bool, str, tuple[Carried, ...]]:
    fields = tail.split(b" ")
    will, protocol = fields[0], fields[1] if len(fields) > 1 else b""
    if (will != b"-" and will != b"w") or not protocol:
        raise InvalidField(f"Wp header whose will flag is neither w nor -, or with no "
                           f"protocol: {_excerpt(line)}")
    try:
        return (will == b"w", "" if protocol == b"-" else protocol.decode(),
                tuple(map(_read_carried, fields[2:])))
    except UnicodeDecodeError:
        raise BadEncoding(f"Wp header whose protocol or an encoding's name is not UTF-8: "
                          f"{_excerpt(line)}") from None


def _read_origin(origin: bytes, line: bytes) -> str:
    try:
        return origin.decode()
    except UnicodeDecodeError:
        raise BadEncoding(f"Wp header whose origin is not UTF-8: {_excerpt(line)}") from None


def read(block: bytes) -> tuple[str, int, bool, str, tuple[Carried, ...]] | None:
    """`decode`'s fields without the WpHeader: (origin, sequence, will, protocol, carried), or
    None. The receiving process's path, where building a dataclass for each message would cost
    more than reading it."""
    at = block.find(_LINE)
    if at < 0:
        newer = _NEWER.search(block)
        if newer is not None:
            # A later version's header: never taken for a plain publish, which it is not.
            raise UnknownVersion(f"Wp header of a later version than {VERSION}: "
                                 f"{_excerpt(newer.group(0)[2:])}")
        return None
    start = at + 6
    stop = block.find(b"\r\n", start)
    if stop < 0:
        raise TruncatedFrame(f"Wp header line not ended by CRLF: {_excerpt(block[start:])}",
                             offset=len(block))
    fields = block[start:stop].split(b" ", 2)
    if len(fields) == 3:
        origin, sequence, tail = fields
        # One process's messages differ in their sequence number alone: what is around it
        # is read once.
        known = _known.get((origin, tail))
        if known is not None and sequence.isdigit() and len(sequence) <= 19:
            return known[0], int(sequence), known[1], known[2], known[3]
    return _read_line(block[start:stop], start)


def _read_line(line: bytes, start: int) -> tuple[str, int, bool, str, tuple[Carried, ...]]:
    fields = line.split(b" ", 2)
    if len(fields) != 3 or not fields[0] or not fields[1].isdigit() or len(fields[1]) > 19:
        raise InvalidField(f"Wp header that is not ORIGIN SEQUENCE WILL PROTOCOL [NAME:LENGTH:"
                           f"KIND ...], its sequence a decimal integer of at most 19 digits: "
                           f"{_excerpt(line)}", offset=start)
    origin, sequence, tail = fields
    will, protocol, carried = _read_tail(tail, line)
    name = _read_origin(origin, line)
    if len(origin) + len(tail) <= _KEPT_SIZE:  # a line as long as NATS takes is not kept
        if len(_known) >= _CACHE_SIZE:
            _known.clear()
        _known[(origin, tail)] = (name, will, protocol, carried)
    return name, int(sequence), will, protocol, carried


def decode(block: bytes) -> WpHeader | None:
    """The Wp header in a NATS header block; None if the block has none."""
    fields = read(block if type(block) is bytes else binary(block, "NATS header block"))
    return None if fields is None else _header(*fields)


def split(carried: tuple[Carried, ...],
          payload: bytes) -> tuple[dict[str, tuple[bytes, bool]], bytes]:
    """The encodings a message carries (name: (data, binary)) and its own payload, taken from
    its NATS payload as its header's `carried` describes them."""
    encodings: dict[str, tuple[bytes, bool]] = {}
    start = 0
    for one in carried:
        end = start + one.length
        if end > len(payload):
            raise BadLength(f"Wp header's encodings come to more than the {len(payload)} bytes "
                            f"of the payload (at {one.name}, {end} bytes)", offset=start)
        encodings[one.name] = (payload[start:end], one.binary)
        start = end
    return encodings, payload[start:] if start else payload
