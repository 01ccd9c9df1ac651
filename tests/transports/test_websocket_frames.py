"""Whole WebSocket frames read and written beside Autobahn (websocket_frames.py, and the fast
path's `ws_deliver`): the same bytes as Autobahn's framing, and every other frame still
Autobahn's, on real sockets, on both fast paths."""

from __future__ import annotations

import os
import struct

import pytest
import pytest_twisted
from autobahn.websocket.protocol import PreparedMessage

from tests.support import eventually, wait_for
from tests.transports.conftest import Echo, Recorder
from tests.transports.test_websocket import client, serve, upgrade_request
from wireproto import speedups
from wireproto.transports.websocket_frames import frame

pytestmark = pytest.mark.usefixtures("fast_path")

MASK = b"\x37\xfa\x21\x3d"


class Open:
    open = True


def whole_frame(data: bytes, start: int, masked: bool, limit: int,
                check_utf8: bool) -> tuple[bytes, bool, int] | None:
    """The frame at `data[start:]` as the fast path reads it: (payload, binary, end), or None
    when it leaves the frame to Autobahn."""
    delivered: list[tuple[bytes, bool]] = []

    def deliver(payload: bytes, binary: bool) -> None:
        delivered.append((payload, binary))
        gate.open = False  # one frame

    gate = Open()
    end = speedups.ws_deliver(data, start, masked, limit, check_utf8, deliver, gate)
    return (*delivered[0], end) if delivered else None


def client_frame(opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0,
                 mask: bytes | None = MASK) -> bytes:
    """A frame built by hand, byte by byte, as RFC 6455 section 5.2 draws it."""
    first = (0x80 if fin else 0) | rsv << 4 | opcode
    mask_bit = 0x80 if mask is not None else 0
    size = len(payload)
    if size < 126:
        head = bytes([first, mask_bit | size])
    elif size < 65536:
        head = bytes([first, mask_bit | 126]) + struct.pack("!H", size)
    else:
        head = bytes([first, mask_bit | 127]) + struct.pack("!Q", size)
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


@pytest.mark.parametrize("size", [0, 1, 125, 126, 1023, 1024, 4097, 65535, 65536])
@pytest.mark.parametrize("binary", [True, False])
def test_a_server_frame_is_the_frame_autobahn_prepares(size, binary):
    payload = bytes(i % 251 for i in range(size)) if binary else b"a" * size
    assert frame(payload, binary, masked=False) == PreparedMessage(
        payload, binary, False, True).payloadHybi
    assert frame(payload, binary, masked=False) == client_frame(
        2 if binary else 1, payload, mask=None)


@pytest.mark.parametrize("size", [0, 3, 125, 126, 1023, 1024, 5000])
def test_a_client_frame_is_masked_and_reads_back(size):
    payload = os.urandom(size)
    masked = frame(payload, True, masked=True)
    mask = masked[2:6] if size < 126 else masked[4:8]
    assert masked == client_frame(2, payload, mask=mask)
    assert whole_frame(masked, 0, True, 0, True) == (payload, True, len(masked))


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 1023, 1024, 1025, 9999])
def test_unmask_is_xor_with_the_repeating_mask(size):
    payload = os.urandom(size)
    expected = bytes(b ^ MASK[i % 4] for i, b in enumerate(payload))
    assert speedups.ws_unmask(payload, MASK) == expected


def test_whole_frames_are_read_one_after_another():
    data = client_frame(2, b"\x00\x01") + client_frame(1, "é".encode()) + client_frame(2, b"")
    first = whole_frame(data, 0, True, 0, True)
    second = whole_frame(data, first[2], True, 0, True)
    third = whole_frame(data, second[2], True, 0, True)
    assert [first[:2], second[:2], third[:2]] == [
        (b"\x00\x01", True), ("é".encode(), False), (b"", True)]
    assert third[2] == len(data)


@pytest.mark.parametrize("data, why", [
    (client_frame(9, b"ping"), "a ping is Autobahn's"),
    (client_frame(8, b"\x03\xe8"), "a close is Autobahn's"),
    (client_frame(2, b"part", fin=False), "the first fragment of a message"),
    (client_frame(0, b"rest"), "a continuation"),
    (client_frame(2, b"x", rsv=4), "a compressed message"),
    (client_frame(2, b"x", mask=None), "an unmasked frame from a client"),
    (client_frame(2, b"x" * 70000), "a 64-bit length"),
    (bytes([0x82, 0x80 | 126, 0, 5]) + MASK + b"abcde", "a length not in its shortest form"),
    (client_frame(2, b"x" * 101), "a frame over the limit of 100"),
    (client_frame(2, b"x" * 10)[:-1], "a frame not all here yet"),
    (client_frame(2, b"x" * 200)[:3], "a header not all here yet"),
    (client_frame(1, b"\xed\xa0\x80"), "text that is not UTF-8 (a surrogate)"),
    (b"\x82", "one byte"),
])
def test_every_other_frame_is_left_to_autobahn(data, why):
    assert whole_frame(data, 0, True, 100, True) is None, why


def test_text_goes_unchecked_only_when_autobahn_would_not_check_it():
    bad = client_frame(1, b"\xff")
    assert whole_frame(bad, 0, True, 0, False) == (b"\xff", False, len(bad))


async def handshake(net, port: int):
    raw = await net.raw_connect(port)
    raw.transport.write(upgrade_request("/ws"))
    await eventually(lambda: b"\r\n\r\n" in raw.received)
    raw.received = raw.received.split(b"\r\n\r\n", 1)[1]
    return raw


@pytest_twisted.ensureDeferred
async def test_control_frames_and_fragments_between_whole_frames_keep_their_order(net):
    port = await serve(net, Recorder)
    raw = await handshake(net, port)
    raw.transport.write(
        client_frame(2, b"A") + client_frame(9, b"are you there")
        + client_frame(1, b"B") + client_frame(2, b"C1", fin=False) + client_frame(9, b"")
        + client_frame(0, b"C2") + client_frame(2, b"D")
    )
    (server,) = net.protocols
    assert await server.received(4) == [(b"A", True), (b"B", False), (b"C1C2", True), (b"D", True)]
    # Autobahn answered both pings, in order, between the messages it did not see.
    await eventually(lambda: raw.received.count(b"\x8a") >= 2)
    assert raw.received.startswith(bytes([0x8A, 13]) + b"are you there" + bytes([0x8A, 0]))
    # A frame cut across two reads is Autobahn's, then whole frames are read directly again.
    split = client_frame(2, b"E" * 300)
    raw.transport.write(split[:10])
    raw.transport.write(split[10:] + client_frame(2, b"F"))
    assert (await server.received(6))[4:] == [(b"E" * 300, True), (b"F", True)]


@pytest_twisted.ensureDeferred
async def test_bad_utf8_after_good_messages_closes_with_1007(net):
    port = await serve(net, Recorder)
    raw = await handshake(net, port)
    raw.transport.write(client_frame(1, b"fine") + client_frame(1, b"\xc3\x28")
                        + client_frame(1, b"never read"))
    (server,) = net.protocols
    await wait_for(server.lost)
    assert server.messages == [(b"fine", False)]
    assert "1007" in str(server.reason.value)
    await wait_for(raw.closed)
    assert raw.received[0] == 0x88 and raw.received[2:4] == b"\x03\xef"  # a close, code 1007


@pytest_twisted.ensureDeferred
async def test_a_message_after_the_peer_closes_is_not_delivered(net):
    port = await serve(net, Recorder)
    raw = await handshake(net, port)
    raw.transport.write(client_frame(2, b"before") + client_frame(8, b"\x03\xe8")
                        + client_frame(2, b"after"))
    (server,) = net.protocols
    await wait_for(server.lost)
    assert server.messages == [(b"before", True)]
    await wait_for(raw.closed)
    assert raw.received.startswith(b"\x88\x02\x03\xe8")  # Autobahn echoed the close


@pytest_twisted.ensureDeferred
async def test_wireproto_client_and_server_talk_in_whole_frames_both_ways(net):
    port = await serve(net, Echo)
    peer = await client(net, port)
    sent = [(os.urandom(n), True) for n in (0, 1, 125, 126, 1024, 65535)]
    sent.append((("ü" * 700).encode(), False))
    for data, binary in sent:
        peer.transport.sendMessage(data, binary)
    assert await peer.received(len(sent)) == sent


@pytest_twisted.ensureDeferred
async def test_deflate_connections_still_compress_what_they_send(net):
    port = await serve(net, Echo, per_message_deflate=True)
    peer = await client(net, port, per_message_deflate=True)
    assert peer.transport._perMessageCompress is not None
    peer.transport.sendMessage(b"z" * 5000, True)
    assert await peer.received(1) == [(b"z" * 5000, True)]
    (server,) = [p for p in net.protocols if type(p) is Echo]
    stats = server.transport.trafficStats
    assert stats.outgoingOctetsWireLevel < 1000  # the echo went out compressed


@pytest_twisted.ensureDeferred
async def test_connections_read_and_write_whole_frames_directly_unless_autobahn_must_see_them(net):
    port = await serve(net, Echo)
    peer = await client(net, port)
    peer.transport.sendMessage(b"x")
    await peer.received(1)
    (server,) = [p for p in net.protocols if type(p) is Echo]
    assert server.transport._direct_frames and peer.transport._direct_frames
    # Autobahn counts only the frames it handled itself: none, in either direction.
    assert server.transport.trafficStats.incomingWebSocketMessages == 0
    logged = await client(net, port)
    logged.transport.logFrames = True
    logged.transport.start_direct_frames()
    assert not logged.transport._direct_frames
