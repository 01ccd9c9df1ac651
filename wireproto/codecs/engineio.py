"""Engine.IO protocol 4 packets and HTTP long-polling payloads, sans-IO.

Implements the Engine.IO 4 wire format as engine.io-parser 5 writes and reads it, described in
docs/nydus.md, "Engine.IO 4" (a capture between the real engine.io 6 server and client).
Not python-engineio: its Packet JSON-decodes message data and it pulls in simple-websocket, while
this codec is 60 lines.

A packet is a type digit and its data:

    0 open (data: the handshake JSON)   1 close   2 ping   3 pong
    4 message                           5 upgrade 6 noop

Over WebSocket one frame is one packet: a text frame is the digit and the text ("4hello", "2",
"3probe"), and a binary frame is a binary message packet, its bytes as they are. A polling body
(payload) joins packets with the record separator U+001E; a binary message there is "b" and its
bytes in base64. A text packet cannot hold U+001E, which would split it in a payload.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

from wireproto.codecs.serialization import json_dumps, json_loads, unchecked_constructor, utf8
from wireproto.errors import BadJSON, InvalidField, TruncatedFrame, UnknownType

__all__ = [
    "PROTOCOL_VERSION",
    "SEPARATOR",
    "PacketType",
    "Packet",
    "Handshake",
    "encode_packet",
    "encode_text_packet",
    "decode_packet",
    "encode_payload",
    "decode_payload",
    "encode_handshake",
    "decode_handshake",
    "encode",
    "decode",
]

PROTOCOL_VERSION = 4
SEPARATOR = "\x1e"


class PacketType(IntEnum):
    OPEN = 0
    CLOSE = 1
    PING = 2
    PONG = 3
    MESSAGE = 4
    UPGRADE = 5
    NOOP = 6


_TYPE_OF_DIGIT = {str(int(t)): t for t in PacketType}


@dataclass(frozen=True, slots=True)
class Packet:
    """One Engine.IO packet. `data` is str for every text packet ("" for none) and bytes for a
    binary message packet."""

    type: PacketType
    data: str | bytes = ""

    @property
    def binary(self) -> bool:
        return isinstance(self.data, bytes)


def _type_name(packet_type: int) -> str:
    try:
        return PacketType(packet_type).name
    except ValueError:
        return f"type {packet_type!r}"


def _text(packet: Packet) -> str:
    if not isinstance(packet.data, str):
        raise InvalidField(
            f"Engine.IO {_type_name(packet.type)} packet cannot carry "
            f"{type(packet.data).__name__}: only a message packet carries bytes"
        )
    if SEPARATOR in packet.data:
        raise InvalidField(
            "Engine.IO text packet contains U+001E, the polling payload separator; "
            "send such data as a binary message"
        )
    return str(int(packet.type)) + packet.data


def _is_binary_message(packet: Packet) -> bool:
    return isinstance(packet.data, bytes) and packet.type == PacketType.MESSAGE


_DIGIT_OF_TYPE = {t: str(int(t)) for t in PacketType}
_build_packet = unchecked_constructor(Packet)  # Packet checks nothing, so nothing is skipped


def encode_packet(packet: Packet) -> str | bytes:
    """One WebSocket frame: str for a text frame, bytes for a binary one."""
    data = packet.data
    if type(data) is str and SEPARATOR not in data:
        digit = _DIGIT_OF_TYPE.get(packet.type)
        if digit is not None:
            return digit + data
    return data if _is_binary_message(packet) else _text(packet)


def encode_text_packet(packet: Packet) -> str:
    """A text packet's frame, which is also its segment of a polling payload; InvalidField if
    its data is bytes or holds U+001E."""
    return _text(packet)


def decode_packet(frame: str | bytes) -> Packet:
    """One WebSocket frame: str from a text frame, bytes from a binary one (a binary message)."""
    if isinstance(frame, (bytes, bytearray, memoryview)):
        return _build_packet(PacketType.MESSAGE, bytes(frame))
    if not frame:
        raise TruncatedFrame("Engine.IO packet is empty: it needs a type digit 0-6")
    first = frame[0]
    if first == "b":
        try:
            return _build_packet(PacketType.MESSAGE, base64.b64decode(frame[1:], validate=True))
        except ValueError as e:  # binascii.Error, or non-ASCII text in a str
            raise InvalidField(f"Engine.IO binary packet is not valid base64: {e}") from None
    packet_type = _TYPE_OF_DIGIT.get(first)
    if packet_type is None:
        raise UnknownType(f"Engine.IO packet type {first!r} is not one of 0-6 (or b for base64)")
    return _build_packet(packet_type, frame[1:])


# Every wireproto codec has encode and decode: here, one packet as one WebSocket frame.
encode = encode_packet
decode = decode_packet


def encode_payload(packets: Iterable[Packet]) -> str:
    """A polling body: the packets joined by U+001E, binary ones as "b" + base64."""
    return SEPARATOR.join(
        "b" + base64.b64encode(p.data).decode("ascii")
        if isinstance(p.data, bytes) and p.type == PacketType.MESSAGE else _text(p)
        for p in packets
    )


def decode_payload(body: str | bytes) -> list[Packet]:
    """The packets of a polling body (UTF-8 text if given as bytes)."""
    if not isinstance(body, str):
        body = utf8(body, "Engine.IO polling payload")
    packets = []
    for index, text in enumerate(body.split(SEPARATOR)):
        try:
            packets.append(decode_packet(text))
        except (TruncatedFrame, UnknownType, InvalidField) as e:
            raise type(e)(f"{e} (packet {index + 1} of the polling payload)") from None
    return packets


@dataclass(frozen=True, slots=True)
class Handshake:
    """The data of the open packet. Times are in milliseconds, as on the wire."""

    sid: str
    upgrades: tuple[str, ...]
    ping_interval: int
    ping_timeout: int
    max_payload: int


def encode_handshake(handshake: Handshake) -> str:
    """The open packet's JSON, in engine.io's key order."""
    return json_dumps({
        "sid": handshake.sid,
        "upgrades": list(handshake.upgrades),
        "pingInterval": handshake.ping_interval,
        "pingTimeout": handshake.ping_timeout,
        "maxPayload": handshake.max_payload,
    })


def decode_handshake(text: str) -> Handshake:
    value = json_loads(text, "Engine.IO open packet")
    if not isinstance(value, dict):
        raise BadJSON(f"Engine.IO open packet is a JSON {type(value).__name__}, not an object")
    sid, upgrades = value.get("sid"), value.get("upgrades", [])
    if not isinstance(sid, str) or not sid:
        raise InvalidField("Engine.IO open packet has no sid string")
    if not isinstance(upgrades, list) or not all(isinstance(u, str) for u in upgrades):
        raise InvalidField("Engine.IO open packet: upgrades is not a list of strings")
    numbers = []
    for key in ("pingInterval", "pingTimeout", "maxPayload"):
        number = value.get(key)
        if type(number) is not int or number <= 0:
            raise InvalidField(f"Engine.IO open packet: {key} is not a positive integer")
        numbers.append(number)
    return Handshake(sid, tuple(upgrades), *numbers)
