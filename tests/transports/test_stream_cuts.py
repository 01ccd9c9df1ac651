"""The lines and COBS cuts of the framed stream adapter, on both fast paths (wireproto.speedups):
messages cut anywhere come out whole, the b"\\r" of a CRLF line dropped; hostile input (no
delimiter for megabytes, a frame over the limit, a COBS frame that does not decode) closes the
connection with the same error on both paths, after delivering what came before it and nothing
after, and never buffers more than the limit; a read's messages cost each connection they are
written to one write."""

from __future__ import annotations

import pytest
from cobs import cobs
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.testing import StringTransport

from wireproto import speedups
from wireproto.speedups import _pure
from wireproto.transports.stream import CobsMessageTransport, LinesMessageTransport

pytestmark = pytest.mark.usefixtures("fast_path")


class Messages:
    def __init__(self) -> None:
        self.received: list[tuple[bytes, bool]] = []

    def messageReceived(self, data: bytes, binary: bool) -> None:
        self.received.append((data, binary))


def adapter(framing: type, max_message_size: int = 64):
    transport = framing(max_message_size)
    transport.transport = StringTransport()
    transport.wrapped = Messages()
    return transport


def feed(transport, stream: bytes, cuts: list[int]) -> None:
    points = sorted({cut % (len(stream) + 1) for cut in cuts} | {0, len(stream)})
    for start, end in zip(points, points[1:], strict=False):
        transport.dataReceived(stream[start:end])


def closed_because(transport) -> str:
    assert transport.paused and transport.transport.disconnecting
    return str(transport._error)


lines_text = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=8)


@given(messages=lines_text, crlf=st.booleans(),
       cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10))
def test_lines_cut_anywhere_come_out_whole_without_their_cr(messages, crlf, cuts):
    ending = b"\r\n" if crlf else b"\n"
    transport = adapter(LinesMessageTransport)
    feed(transport, b"".join(m + ending for m in messages), cuts)
    expected = [m[:-1] if not crlf and m.endswith(b"\r") else m for m in messages]
    assert transport.wrapped.received == [(m, False) for m in expected]
    assert not transport.paused


@given(messages=st.lists(st.binary(max_size=600), max_size=6),
       cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=10))
def test_cobs_frames_cut_anywhere_come_out_whole(messages, cuts):
    transport = adapter(CobsMessageTransport, max_message_size=600)
    feed(transport, b"\x00".join(cobs.encode(m) for m in messages) + b"\x00\x00", cuts)
    assert transport.wrapped.received == [(m, True) for m in messages]
    assert not transport.paused


@given(frame=st.binary(min_size=1, max_size=300).map(lambda b: b.replace(b"\x00", b"\x01")))
def test_any_cobs_frame_is_decoded_or_refused_as_the_cobs_package_does(frame):
    try:
        expected = [(cobs.decode(frame), True)]
    except cobs.DecodeError:
        expected = []
    transport = adapter(CobsMessageTransport, max_message_size=1000)
    transport.dataReceived(frame + b"\x00")
    assert transport.wrapped.received == expected
    if not expected:
        assert closed_because(transport) == (
            f"COBS frame of {len(frame)} bytes does not decode: "
            "not enough input bytes for length code")


def test_a_line_over_the_limit_stops_delivery_after_the_lines_before_it():
    transport = adapter(LinesMessageTransport, max_message_size=8)
    transport.dataReceived(b"one\r\n" + b"x" * 8 + b"\r\n" + b"y" * 9 + b"\r\nafter\n")
    assert transport.wrapped.received == [(b"one", False), (b"x" * 8, False)]
    assert closed_because(transport) == (
        "line of 9 bytes or more is over the limit of 8 bytes (StreamOptions.max_message_size)")
    transport.dataReceived(b"later\n")
    assert len(transport.wrapped.received) == 2


@pytest.mark.parametrize("framing", [LinesMessageTransport, CobsMessageTransport])
def test_megabytes_without_a_delimiter_close_the_connection_once_past_the_limit(framing):
    limit = 1 << 20
    transport = adapter(framing, max_message_size=limit)
    ok = b"ok\n" if framing is LinesMessageTransport else cobs.encode(b"ok") + b"\x00"
    transport.dataReceived(ok)
    chunk = b"z" * 65536
    reads = 0
    while not transport.paused and reads < 64:  # 4 MiB, were it all read
        transport.dataReceived(chunk)
        reads += 1
        assert len(transport._buffer) <= limit + 2 + len(chunk)
    assert transport.paused and reads <= limit // len(chunk) + 2
    assert "or more is over the limit of 1048576 bytes" in closed_because(transport)
    assert transport._buffer == b""
    assert len(transport.wrapped.received) == 1


def test_a_cobs_frame_or_message_over_the_limit_stops_delivery_after_the_frames_before_it():
    transport = adapter(CobsMessageTransport, max_message_size=300)
    good = cobs.encode(b"a" * 300) + b"\x00"
    # 302 bytes, as long as a legal frame may be, decoding to one byte too many.
    transport.dataReceived(good + cobs.encode(b"\x00" * 301) + b"\x00" + good)
    assert transport.wrapped.received == [(b"a" * 300, True)]
    assert closed_because(transport) == (
        "COBS frame of 301 bytes or more is over the limit of 300 bytes "
        "(StreamOptions.max_message_size)")
    # A frame too long to decode to a legal message is refused before decoding.
    transport = adapter(CobsMessageTransport, max_message_size=300)
    transport.dataReceived(good + b"\x01" * 303 + b"\x00")
    assert closed_because(transport).startswith("COBS frame of 303 bytes or more")


def test_an_undecodable_cobs_frame_stops_delivery_after_the_frames_before_it():
    transport = adapter(CobsMessageTransport)
    transport.dataReceived(cobs.encode(b"fine") + b"\x00\x05ab\x00" + cobs.encode(b"x") + b"\x00")
    assert transport.wrapped.received == [(b"fine", True)]
    assert closed_because(transport) == (
        "COBS frame of 3 bytes does not decode: not enough input bytes for length code")


@pytest.mark.parametrize("framing", [LinesMessageTransport, CobsMessageTransport])
def test_a_message_that_closes_the_connection_is_the_last_delivered(framing):
    transport = adapter(framing)

    class Closing(Messages):
        def messageReceived(self, data: bytes, binary: bool) -> None:
            super().messageReceived(data, binary)
            transport.loseConnection()

    transport.wrapped = Closing()
    encode = (lambda m: m + b"\n") if framing is LinesMessageTransport else (
        lambda m: cobs.encode(m) + b"\x00")
    transport.dataReceived(encode(b"first") + encode(b"second") + b"\x01" * 5000)
    assert [data for data, _ in transport.wrapped.received] == [b"first"]
    assert transport.transport.disconnecting and transport._error is None


@pytest.mark.parametrize("framing", [LinesMessageTransport, CobsMessageTransport])
def test_what_a_read_publishes_costs_each_connection_one_write(framing):
    transport = adapter(framing)
    writes: list[bytes] = []
    outbox = speedups.Outbox(writes.append)

    class Forward(Messages):
        def messageReceived(self, data: bytes, binary: bool) -> None:
            outbox.write(data + b";")

    transport.wrapped = Forward()
    encode = (lambda m: m + b"\r\n") if framing is LinesMessageTransport else (
        lambda m: cobs.encode(m) + b"\x00")
    transport.dataReceived(b"".join(encode(b"%d" % n) for n in range(50)))
    assert writes == [b"".join(b"%d;" % n for n in range(50))]


@given(stream=st.binary(max_size=300), limit=st.integers(min_value=1, max_value=40),
       pause_after=st.integers(min_value=0, max_value=10))
def test_the_cuts_of_both_paths_agree_on_any_input(stream, limit, pause_after):
    if not speedups.compiled_available():
        pytest.skip("the compiled fast path is not built (make speedups)")
    compiled = speedups.IMPLEMENTATIONS["compiled"]
    for name, args in (("lines_deliver", (limit,)), ("cobs_deliver", (limit + 2, limit))):
        results = []
        for twin in (_pure, compiled):
            class Reader:
                paused = False
                got: list[tuple[bytes, bool]] = []

            reader = Reader()
            reader.got = []

            def deliver(message: bytes, binary: bool, reader=reader) -> None:
                reader.got.append((message, binary))
                reader.paused = len(reader.got) > pause_after

            results.append((getattr(twin, name)(stream, *args, deliver, reader), reader.got))
        assert results[0] == results[1], name
