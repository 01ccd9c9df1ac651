"""Capture over a length32 stream records what the connection wrote, as it wrote it: frames a
read's handling gathers in the outbox are recorded when they are written, not when they are
handed over, so a frame the connection never sends (aborted while it waited) is not in the
capture, and one it sends is, once, in order. Run on both fast paths."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.testing import StringTransport

from tests.transports.conftest import Recorder
from wireproto import capture, speedups
from wireproto.capture.wrapper import BrokerCapture, CapturingProtocol
from wireproto.transports import StreamOptions, stream_server_factory

pytestmark = pytest.mark.usefixtures("fast_path")


def frame(message: bytes) -> bytes:
    return struct.pack(">I", len(message)) + message


class Connection:
    """A capturing length32 connection over an in-memory byte transport."""

    def __init__(self, recording: BrokerCapture, protocol: Recorder | None = None) -> None:
        self.protocol = protocol or Recorder()
        factory = stream_server_factory(
            lambda: CapturingProtocol(self.protocol, recording, "websmq"), StreamOptions())
        self.adapter = factory.buildProtocol(None)
        self.bytes = StringTransport()
        self.adapter.makeConnection(self.bytes)

    def send(self, message: bytes) -> None:
        self.protocol.transport.sendMessage(message)

    def send_prepared(self, message: bytes) -> None:
        transport = self.protocol.transport
        transport.sendPrepared(transport.prepareMessage(message))


def recorded(recording: BrokerCapture, directory: Path) -> list[tuple[str, list[bytes]]]:
    recording.record_batches()
    assert recording.writer is not None
    recording.writer.close()
    recording.writer = None
    return [(record.kind.name, record.messages())
            for path in capture.capture_files(directory) for record in capture.iter_records(path)
            if record.kind in (capture.Kind.IN, capture.Kind.OUT)]


@pytest.fixture
def recording(tmp_path: Path):
    started = BrokerCapture(tmp_path)
    started.start()
    yield started
    if started.writer is not None:
        started.writer.close()


def test_frames_written_at_the_end_of_a_read_are_recorded_once_in_order(recording, tmp_path):
    connection = Connection(recording)
    speedups.batch_begin()
    try:
        connection.send(b"one")
        connection.send_prepared(b"two")
        connection.send(b"three")
        assert connection.bytes.value() == b""  # waiting in the outbox
    finally:
        speedups.batch_end()
    connection.send(b"four")  # outside a read: written at once
    sent = b"".join(frame(m) for m in (b"one", b"two", b"three", b"four"))
    assert connection.bytes.value() == sent
    assert recorded(recording, tmp_path) == [("OUT", [b"one", b"two", b"three", b"four"])]


def test_frames_aborted_while_they_wait_are_neither_sent_nor_recorded(recording, tmp_path):
    connection = Connection(recording)
    connection.send(b"before")
    speedups.batch_begin()
    try:
        connection.send_prepared(b"lost")
        connection.send(b"lost too")
        connection.adapter.abortConnection()
    finally:
        speedups.batch_end()
    assert connection.bytes.value() == frame(b"before")
    assert recorded(recording, tmp_path) == [("OUT", [b"before"])]


def test_frames_waiting_when_the_connection_closes_cleanly_are_sent_and_recorded(
        recording, tmp_path):
    connection = Connection(recording)
    speedups.batch_begin()
    try:
        connection.send_prepared(b"last words")
        connection.protocol.transport.loseConnection()
    finally:
        speedups.batch_end()
    assert connection.bytes.value() == frame(b"last words")
    assert recorded(recording, tmp_path) == [("OUT", [b"last words"])]


def test_what_a_read_brings_in_and_what_it_sends_are_recorded_in_order(recording, tmp_path):
    class Answer(Recorder):
        def messageReceived(self, data: bytes, binary: bool) -> None:
            super().messageReceived(data, binary)
            self.transport.sendMessage(b"re: " + data)

    connection = Connection(recording, Answer())
    connection.adapter.dataReceived(frame(b"a") + frame(b"b"))
    assert connection.bytes.value() == frame(b"re: a") + frame(b"re: b")
    assert recorded(recording, tmp_path) == [("IN", [b"a", b"b"]), ("OUT", [b"re: a", b"re: b"])]


@given(data=st.binary(max_size=3000), covered=st.binary(min_size=28, max_size=28))
def test_the_records_crc_is_zlibs_crc32(data, covered):
    """Records are stamped with anycrc's CRC-32 and checked by readers with zlib's."""
    from wireproto.capture.log import _crc32

    assert _crc32(data, _crc32(covered)) == zlib.crc32(data, zlib.crc32(covered))
