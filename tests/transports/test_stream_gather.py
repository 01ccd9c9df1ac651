"""A large frame that comes in small reads (a slow link, or a peer that drips it to make the
broker copy it once per read) is kept as its pieces and joined once it can be whole, in every
framing and on both fast paths: the frames come out whole and in order, one over the limit
still closes the connection with the error it gets in one read, and the pieces are kept rather
than joined again at each read."""

from __future__ import annotations

import struct

import pytest
from cobs import cobs
from twisted.internet.testing import StringTransport

from wireproto.transports.stream import (
    GATHER_FROM,
    CobsMessageTransport,
    Length32MessageTransport,
    LinesMessageTransport,
)

pytestmark = pytest.mark.usefixtures("fast_path")

LIMIT = 400_000
BIG = bytes(b for b in range(1, 256) if b != 10) * 1200  # 304,800 bytes, no \n and no \0
SMALL = b"small"


class Messages:
    def __init__(self) -> None:
        self.received: list[bytes] = []

    def messageReceived(self, data: bytes, binary: bool) -> None:
        self.received.append(data)


def adapter(framing: type, limit: int = LIMIT):
    transport = framing(limit)
    transport.transport = StringTransport()
    transport.wrapped = Messages()
    return transport


FRAMINGS = {
    "length32": (Length32MessageTransport,
                 lambda message: struct.pack(">I", len(message)) + message),
    "lines": (LinesMessageTransport, lambda message: message.replace(b"\n", b"") + b"\n"),
    "cobs": (CobsMessageTransport, lambda message: cobs.encode(message) + b"\x00"),
}


def pieces(stream: bytes, size: int) -> list[bytes]:
    return [stream[at:at + size] for at in range(0, len(stream), size)]


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("size", [1000, 4093, GATHER_FROM - 1, GATHER_FROM, GATHER_FROM + 1])
def test_a_large_frame_in_small_reads_comes_out_whole_between_small_ones(framing, size):
    kind, frame = FRAMINGS[framing]
    transport = adapter(kind)
    messages = [SMALL, BIG, SMALL + b"2", BIG[::-1], SMALL + b"3"]
    for piece in pieces(b"".join(map(frame, messages)), size):
        transport.dataReceived(piece)
    assert transport.wrapped.received == messages
    assert not transport.paused


@pytest.mark.parametrize("framing", FRAMINGS)
def test_the_pieces_of_a_large_frame_are_kept_not_joined_at_each_read(framing):
    kind, frame = FRAMINGS[framing]
    transport = adapter(kind)
    stream = frame(BIG)
    for piece in pieces(stream[:200_000], 1000):
        transport.dataReceived(piece)
    assert transport._buffer == b""
    assert len(transport._pieces) > 100  # one piece per read past the first 64 KiB
    for piece in pieces(stream[200_000:], 1000):
        transport.dataReceived(piece)
    assert transport.wrapped.received == [BIG]
    assert transport._pieces is None and transport._buffer == b""


def error_after(framing: str, stream: bytes, size: int) -> tuple[list[bytes], str]:
    kind, _ = FRAMINGS[framing]
    transport = adapter(kind, limit=200_000)
    for piece in pieces(stream, size):
        transport.dataReceived(piece)
    assert transport.paused and transport.transport.disconnecting
    return transport.wrapped.received, str(transport._error)


@pytest.mark.parametrize("framing", ["lines", "cobs"])
def test_an_endless_frame_gathered_is_refused_as_in_one_read(framing):
    """No delimiter for 304,800 bytes against a limit of 200,000: refused once past it, with
    what came before it delivered, the same in small reads as in one."""
    _, frame = FRAMINGS[framing]
    stream = frame(SMALL) + BIG
    whole = error_after(framing, stream, len(stream))
    assert error_after(framing, stream, 1000)[0] == whole[0] == [SMALL]
    assert "over the limit" in whole[1]


def test_a_length32_frame_over_the_limit_is_refused_at_its_header_in_small_reads_too():
    _, frame = FRAMINGS["length32"]
    stream = frame(SMALL) + frame(BIG)
    assert error_after("length32", stream, 1000) == error_after("length32", stream, len(stream))
