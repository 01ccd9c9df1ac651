"""Packets ready for either carrier (polling or WebSocket), and what both carriers do with them."""

from __future__ import annotations

from autobahn.websocket.protocol import WebSocketProtocol

from wireproto.codecs.engineio import (
    Packet,
    PacketType,
    encode_payload,
    encode_text_packet,
)
from wireproto.codecs.serialization import utf8
from wireproto.errors import (
    CredentialEnded,
    FrameTooLarge,
    ProtocolError,
)
from wireproto.transports.base import (
    IMessageProtocol,
)
from wireproto.transports.engineio.options import (
    CLOSE_NORMAL,
    CLOSE_POLICY_VIOLATION,
    CLOSE_PROTOCOL_ERROR,
    CLOSE_TOO_BIG,
)

__all__ = [
    "Outgoing",
    "PING",
    "CLOSE",
    "NOOP",
    "PROBE_PONG",
    "prepare_outgoing",
    "deliver",
    "close_websocket",
    "close_code",
]

# -- packets ready to send ------------------------------------------------------------------------


class Outgoing:
    """A packet ready for either carrier: its WebSocket frame and, once asked, its polling form.

    This is what prepareMessage returns, so a hub encodes a publish once for every session,
    polling or WebSocket.
    """

    __slots__ = ("frame", "binary", "_segment")

    def __init__(self, frame: bytes, binary: bool, segment: str | None = None) -> None:
        self.frame = frame
        self.binary = binary
        self._segment = segment

    @property
    def size(self) -> int:
        return len(self.frame)

    def segment(self) -> str:
        """This packet in a polling payload."""
        if self._segment is None:
            packet = Packet(PacketType.MESSAGE, self.frame)
            self._segment = encode_payload([packet]) if self.binary else self.frame.decode()
        return self._segment


def control_packet(packet_type: PacketType, data: str = "") -> Outgoing:
    text = encode_text_packet(Packet(packet_type, data))
    return Outgoing(text.encode("utf-8"), False, text)


PING = control_packet(PacketType.PING)
CLOSE = control_packet(PacketType.CLOSE)
NOOP = control_packet(PacketType.NOOP)
PROBE_PONG = control_packet(PacketType.PONG, "probe")


def prepare_outgoing(data: bytes, binary: bool) -> Outgoing:
    if binary:
        return Outgoing(bytes(data), True)
    text = utf8(data, "Engine.IO text message")
    segment = encode_text_packet(Packet(PacketType.MESSAGE, text))  # refuses U+001E
    return Outgoing(b"4" + bytes(data), False, segment)


def deliver(protocol: IMessageProtocol, packet: Packet) -> None:
    data = packet.data
    if isinstance(data, bytes):
        protocol.messageReceived(data, True)
    else:
        protocol.messageReceived(data.encode("utf-8"), False)


def close_websocket(ws: WebSocketProtocol, code: int, reason: str | None) -> None:
    if ws.state != WebSocketProtocol.STATE_OPEN:
        if ws.state != WebSocketProtocol.STATE_CLOSING:
            ws.dropConnection(abort=True)
        return
    raw = reason.encode("utf-8") if reason else None
    # sendClose takes only 1000 and 3000-4999; 1002 and 1009 need the lower-level call.
    ws.sendCloseFrame(code=code, reasonUtf8=raw)


def close_code(error: BaseException | None) -> int:
    if isinstance(error, FrameTooLarge):
        return CLOSE_TOO_BIG
    if isinstance(error, CredentialEnded):
        return CLOSE_POLICY_VIOLATION
    if isinstance(error, ProtocolError):
        return CLOSE_PROTOCOL_ERROR
    return CLOSE_NORMAL
