"""Capture files (wireproto.capture): the format, both writers and the reader, on real files; the
torn tail after a real kill -9 of a writing subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wireproto import capture
from wireproto.capture import (
    FLAG_BINARY,
    PROTOCOLS,
    TRANSPORTS,
    CaptureWriter,
    CorruptCapture,
    IncompleteCapture,
    Kind,
    NotACapture,
    ThreadedCaptureWriter,
    capture_files,
    iter_records,
    read_batch,
    read_header,
    scan_offsets,
)

T0 = 1_700_000_000_123_456_789


class Clock:
    """A clock that moves 1 ms per reading."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        self.now += 1_000_000
        return self.now


def until(check, timeout: float = 20.0):
    """Poll `check()` until it is truthy (a ceiling against hangs, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.01)
    raise AssertionError(f"condition not met within {timeout} s")


def all_records(directory: Path) -> list[capture.Record]:
    return [record for path in capture_files(directory) for record in iter_records(path)]


def messages(records: list[capture.Record]) -> list[bytes]:
    return [record.data for record in records if record.kind in (Kind.IN, Kind.OUT)]


# -- the format -----------------------------------------------------------------------------------


def test_record_header_is_32_bytes_with_crc_over_the_rest() -> None:
    raw = capture.encode_record(Kind.OUT, 2**64 - 1, b"abc", timestamp_ns=-5, protocol=5,
                                transport=7, flags=FLAG_BINARY)
    assert len(raw) == 32 + 3
    length, crc, ts, conn, kind, proto, trans, flags, reserved = struct.unpack_from(
        "<IIqQBBBBI", raw)
    assert (length, ts, conn, kind, proto, trans, flags, reserved) == (
        3, -5, 2**64 - 1, 2, 5, 7, 1, 0)
    assert crc == zlib.crc32(raw[8:])


@given(
    kind=st.sampled_from(list(Kind)),
    connection=st.integers(0, 2**64 - 1),
    timestamp=st.integers(-(2**63), 2**63 - 1),
    protocol=st.integers(0, 255),
    transport=st.integers(0, 255),
    flags=st.integers(0, 255),
    data=st.binary(max_size=300),
)
def test_encode_decode_record_round_trip(kind, connection, timestamp, protocol, transport, flags,
                                         data) -> None:
    raw = b"junk" + capture.encode_record(kind, connection, data, timestamp_ns=timestamp,
                                          protocol=protocol, transport=transport, flags=flags)
    record, end = capture.decode_record(raw, 4)
    assert end == len(raw)
    assert record == capture.Record(4, timestamp, connection, kind, protocol, transport, flags,
                                    data)
    with pytest.raises(IncompleteCapture):
        capture.decode_record(raw[:-1], 4)
    damaged = bytearray(raw)
    damaged[-1 if data else 12] ^= 0x40
    with pytest.raises(CorruptCapture):
        capture.decode_record(bytes(damaged), 4)


def test_field_out_of_range_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="out of range"):
        capture.encode_record(Kind.IN, -1, b"", timestamp_ns=0)
    with pytest.raises(ValueError, match="out of range"):
        capture.encode_record(Kind.IN, 1, b"", timestamp_ns=0, protocol=256)


def test_every_kind_round_trips_through_a_file(tmp_path: Path) -> None:
    with CaptureWriter(tmp_path, clock=Clock()) as writer:
        writer.open_connection(7, "127.0.0.1:5000", "websmq", "ws", path="/websmq")
        writer.message(7, "in", b"\x00\x04demohello", True)
        writer.message(7, Kind.OUT, "h\u00e9llo", False, timestamp_ns=42)
        writer.close_connection(7, "peer went away")
        writer.open_connection(2**63 + 1, "/dev/ttyACM0", "phyllo", "stream")
        writer.message(2**63 + 1, "out", b"", True)
        writer.close_connection(2**63 + 1)
        writer.open_connection(9, "10.0.0.1:1", "mqtt", "carrier-pigeon")
        writer.message(9, "in", b"x", True)
        writer.message(404, "in", b"y", False)
    records = all_records(tmp_path)
    assert [(r.kind, r.connection) for r in records] == [
        (Kind.OPEN, 7), (Kind.IN, 7), (Kind.OUT, 7), (Kind.CLOSE, 7),
        (Kind.OPEN, 2**63 + 1), (Kind.OUT, 2**63 + 1), (Kind.CLOSE, 2**63 + 1),
        (Kind.OPEN, 9), (Kind.IN, 9), (Kind.IN, 404),
    ]
    opened, received, sent, closed, *_ = records
    assert opened.info() == {"peer": "127.0.0.1:5000", "protocol": "websmq", "transport": "ws",
                             "path": "/websmq"}
    assert (opened.protocol_name, opened.transport_name) == ("websmq", "ws")
    assert (received.data, received.binary, received.protocol, received.transport) == (
        b"\x00\x04demohello", True, PROTOCOLS["websmq"], TRANSPORTS["ws"])
    assert (sent.data, sent.binary, sent.timestamp_ns) == ("h\u00e9llo".encode(), False, 42)
    assert closed.info() == {"reason": "peer went away"}
    assert records[6].info() == {}
    assert (records[4].protocol_name, records[4].transport_name) == ("phyllo", "stream")
    # unknown names: code 0, the names kept in the open record
    assert (records[7].protocol, records[7].transport) == (0, 0)
    assert records[7].info()["transport"] == "carrier-pigeon"
    assert (records[9].protocol, records[9].binary) == (0, False)
    # the clock stamps what has no timestamp, in order
    stamps = [r.timestamp_ns for r in records if r is not sent]
    assert stamps == sorted(stamps) and stamps[0] > T0
    with pytest.raises(TypeError):
        received.info()
    with pytest.raises(ValueError, match="direction"):
        CaptureWriter(tmp_path / "x").message(1, "sideways", b"", True)


def test_a_batch_record_holds_several_messages(tmp_path: Path) -> None:
    messages = [b"", b"one", bytes(range(256)) * 3, b"\x00\x00\x00\x05"]
    data = capture.encode_batch(messages)
    assert data[:7] == b"\x00\x00\x00\x00\x00\x00\x00" and data[7] == 3
    with CaptureWriter(tmp_path) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "length32")
        writer.message(1, "out", data, True, batch=True)
        writer.message(1, "in", b"single", False)
    opened, batch, single = all_records(tmp_path)
    assert batch.flags == capture.FLAG_BINARY | capture.FLAG_BATCH
    assert batch.messages() == messages
    assert (single.messages(), single.flags) == ([b"single"], 0)
    assert capture.record_messages(capture.FLAG_BATCH, b"") == []
    with pytest.raises(capture.CorruptCapture, match="4-byte length"):
        capture.record_messages(capture.FLAG_BATCH, data + b"\x00")
    with pytest.raises(capture.CorruptCapture, match="9 bytes announced"):
        capture.record_messages(capture.FLAG_BATCH, b"\x00\x00\x00\x09abc")


def test_the_threaded_writer_takes_batch_records_together(tmp_path: Path) -> None:
    with capture.ThreadedCaptureWriter(tmp_path) as writer:
        writer.open_connection(3, "127.0.0.1:5000", "ubre", "ws")
        writer.batches([
            (3, Kind.IN, capture.encode_batch([b'{"request":"a","id":1}']), False, T0 + 1),
            (3, Kind.OUT, capture.encode_batch([b"\x01", b"\x02"]), True, T0 + 2),
        ])
    _, received, sent = all_records(tmp_path)
    assert (received.kind, received.timestamp_ns, received.binary, received.messages()) == (
        Kind.IN, T0 + 1, False, [b'{"request":"a","id":1}'])
    assert (sent.kind, sent.timestamp_ns, sent.binary, sent.messages()) == (
        Kind.OUT, T0 + 2, True, [b"\x01", b"\x02"])
    assert sent.flags & capture.FLAG_BATCH and sent.protocol_name == "ubre"


def test_batch_records_given_together_rotate_like_any_other(tmp_path: Path) -> None:
    messages = [bytes([n]) * 1000 for n in range(12)]
    with CaptureWriter(tmp_path, max_file_bytes=4096, clock=Clock()) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "length32")
        writer.batches([])
        writer.batches([(1, Kind.OUT, capture.encode_batch([message]), True, T0 + n)
                        for n, message in enumerate(messages[:2])])  # fits the first file
        writer.batches([(1, Kind.OUT, capture.encode_batch([message]), True, T0 + n)
                        for n, message in enumerate(messages[2:], 2)])  # rotates twice or more
    files = capture.capture_files(tmp_path)
    assert len(files) >= 3
    records = all_records(tmp_path)
    sent = [record for record in records if record.kind == Kind.OUT]
    assert [data for record in sent for data in record.messages()] == messages
    assert [record.timestamp_ns for record in sent] == [T0 + n for n in range(12)]
    assert writer.counters.records == len(records)
    for path in files:  # each file stands alone: it starts with the connection's open record
        assert next(capture.iter_records(path)).kind == Kind.OPEN
        assert os.path.getsize(path) <= 4096


def test_file_header_is_self_describing_json(tmp_path: Path) -> None:
    with CaptureWriter(tmp_path, clock=Clock()) as writer:
        writer.open_connection(1, "127.0.0.1:1", "ubre", "lines")
        writer.message(1, "in", b'{"request":"add","id":1,"body":[1,2]}\n', False)
    [path] = capture_files(tmp_path)
    raw = path.read_bytes()
    assert raw[:8] == b"WPCAP\x01\x00\x00"
    (length,) = struct.unpack_from("<I", raw, 8)
    info = json.loads(raw[12:12 + length].decode("utf-8"))
    assert info["format"] == "wirecapture" and info["version"] == 1
    assert info["sequence"] == 1 and info["created_ns"] > T0
    assert info["writer"].startswith("wireproto ") and info["host"]
    assert info["fields"] == list(capture.RECORD_FIELDS)
    assert info["protocols"]["ubre"] == 2 and info["transports"]["lines"] == 4
    assert info["kinds"] == {"open": 0, "in": 1, "out": 2, "close": 3}
    assert read_header(path).info == info and read_header(path).data_offset == 12 + length
    # the header alone is enough to decode the records
    fmt = info["record_header"]
    offset, fields = 12 + length, []
    while offset < len(raw):
        values = dict(zip(info["fields"], struct.unpack_from(fmt, raw, offset), strict=True))
        fields.append(values)
        offset += struct.calcsize(fmt) + values["length"]
    assert offset == len(raw)
    assert [f["kind"] for f in fields] == [info["kinds"]["open"], info["kinds"]["in"]]
    assert fields[1]["protocol"] == info["protocols"]["ubre"]


def test_a_file_that_is_not_a_capture(tmp_path: Path) -> None:
    other = tmp_path / "other.wpcap"
    other.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(NotACapture, match="other.wpcap"):
        read_header(other)
    with pytest.raises(NotACapture):
        list(iter_records(other))
    newer = tmp_path / "newer.wpcap"
    newer.write_bytes(b"WPCAP\x02\x00\x00\x02\x00\x00\x00{}")
    with pytest.raises(NotACapture, match="version 2"):
        read_header(newer)


def test_a_file_shorter_than_its_header_has_no_records_yet(tmp_path: Path) -> None:
    with CaptureWriter(tmp_path) as writer:
        writer.open_connection(1, "p", "ubre", "ws")
    [path] = capture_files(tmp_path)
    header_end = read_header(path).data_offset
    raw = path.read_bytes()
    for cut in (0, 3, 11, 12, header_end - 1):
        path.write_bytes(raw[:cut])
        assert list(iter_records(path)) == []
        assert scan_offsets(path) == capture.Scan([], 0, "partial")
        assert len(read_batch(path)) == 0
        with pytest.raises(IncompleteCapture):
            read_header(path)
    path.write_bytes(raw[:header_end])
    assert scan_offsets(path) == capture.Scan([], header_end, "end")


# -- writing, rotation ----------------------------------------------------------------------------


def test_rotation_by_size_repeats_the_open_connections(tmp_path: Path) -> None:
    limit = 4096
    sent: list[bytes] = []
    open_now: dict[int, bytes] = {}
    writer = CaptureWriter(tmp_path, max_file_bytes=limit, clock=Clock(), buffer_bytes=1000)
    with writer:
        for conn in (1, 2):
            writer.open_connection(conn, f"127.0.0.1:{conn}", "websmq", "length32")
        for i in range(300):
            if i == 150:
                writer.close_connection(2, "bye")
            if i == 200:
                writer.open_connection(3, "127.0.0.1:3", "nydus", "engineio")
            conn = 3 if i >= 200 and i % 2 else 1
            data = b"%05d" % i + bytes(i % 97)
            writer.message(conn, "in" if i % 3 else "out", data, True)
            sent.append(data)
    counters = writer.counters
    files = capture_files(tmp_path)
    assert len(files) > 5
    assert counters.files == len(files)
    assert counters.bytes == sum(path.stat().st_size for path in files)
    assert counters.dropped_batches == counters.dropped_records == 0
    records_per_file = [list(iter_records(path)) for path in files]
    assert counters.records == sum(map(len, records_per_file))
    # whole messages, in order, none lost or repeated
    assert [data for records in records_per_file for data in messages(records)] == sent
    for number, (path, records) in enumerate(zip(files, records_per_file, strict=True), 1):
        assert path.stat().st_size <= limit
        assert read_header(path).info["sequence"] == number
        assert path.name.startswith("wirecapture-2023") and path.name.endswith(
            f"-{number:06d}.wpcap")
        # the file stands alone: it opens every connection it mentions before using it
        leading = []
        for record in records:
            if record.kind != Kind.OPEN or record.connection in leading:
                break
            leading.append(record.connection)
        if number > 1:
            assert leading == sorted(open_now), path.name
        assert scan_offsets(path).stop == "end"
        for record in records:
            if record.kind == Kind.OPEN:
                open_now[record.connection] = record.data
            elif record.kind == Kind.CLOSE:
                open_now.pop(record.connection)
            else:
                assert record.connection in open_now
    # a repeated open is the same record, byte for byte
    opens_of_1 = {(r.timestamp_ns, r.data) for rs in records_per_file for r in rs
                  if r.kind == Kind.OPEN and r.connection == 1}
    assert len(opens_of_1) == 1


def test_a_new_writer_continues_the_sequence(tmp_path: Path) -> None:
    for _ in range(2):
        with CaptureWriter(tmp_path, clock=lambda: T0) as writer:
            writer.open_connection(1, "p", "ubre", "ws")
    files = capture_files(tmp_path)
    assert [read_header(path).info["sequence"] for path in files] == [1, 2]


def test_nothing_is_written_before_a_flush(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path)
    writer.open_connection(1, "p", "ubre", "ws")
    writer.message(1, "in", b"x" * 100, True)
    assert capture_files(tmp_path) == []
    writer.flush()
    assert len(messages(all_records(tmp_path))) == 1
    writer.close()
    with pytest.raises(RuntimeError, match="closed"):
        writer.message(1, "in", b"x", True)


@pytest.mark.parametrize("size", [4095, 2**30 + 1])
def test_file_size_limit_is_checked(tmp_path: Path, size: int) -> None:
    with pytest.raises(ValueError, match="max_file_bytes"):
        CaptureWriter(tmp_path, max_file_bytes=size)


# -- reading: torn tails and corruption -----------------------------------------------------------


@pytest.fixture
def good_file(tmp_path: Path) -> tuple[Path, list[int]]:
    with CaptureWriter(tmp_path / "w", clock=Clock()) as writer:
        writer.open_connection(1, "127.0.0.1:9", "subble", "ws")
        for i in range(5):
            writer.message(1, "in", b"message %d" % i, True)
        writer.message(1, "out", b"the last record, 40 bytes of data here!!", True)
    [path] = capture_files(tmp_path / "w")
    return path, scan_offsets(path).starts


def test_truncated_at_every_byte_of_the_last_record(tmp_path: Path, good_file) -> None:
    path, starts = good_file
    raw = path.read_bytes()
    assert len(starts) == 7 and len(raw) - starts[-1] == 72
    cut_file = tmp_path / "cut.wpcap"
    for cut in range(starts[-1], len(raw)):
        cut_file.write_bytes(raw[:cut])
        records = list(iter_records(cut_file))
        assert [r.offset for r in records] == starts[:-1], cut
        assert records[-1].data == b"message 4"
        scan = scan_offsets(cut_file)
        assert scan == capture.Scan(starts[:-1], starts[-1], "end" if cut == starts[-1]
                                    else "partial"), cut
        batch = read_batch(cut_file)
        assert batch.offset == starts[:-1] and batch.end == starts[-1]
    # the same through `available`, on the whole file: a size seen while it was being written
    for cut in range(starts[-1], len(raw)):
        assert scan_offsets(path, available=cut).end == starts[-1]
    assert scan_offsets(path).stop == "end"


def test_crc_mismatch_at_the_tail_is_a_torn_record(tmp_path: Path, good_file) -> None:
    path, starts = good_file
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    torn = tmp_path / "torn.wpcap"
    torn.write_bytes(raw)
    assert [r.offset for r in iter_records(torn)] == starts[:-1]
    assert scan_offsets(torn).stop == "partial"
    # a tail of zeros, as a file system may leave after a power loss
    zeros = tmp_path / "zeros.wpcap"
    zeros.write_bytes(path.read_bytes() + bytes(4096))
    assert [r.offset for r in iter_records(zeros)] == starts
    assert scan_offsets(zeros) == capture.Scan(starts, path.stat().st_size, "partial")


@pytest.mark.parametrize("where", ["data", "timestamp"])
def test_crc_mismatch_in_the_middle_is_corruption(tmp_path: Path, good_file, where) -> None:
    path, starts = good_file
    raw = bytearray(path.read_bytes())
    raw[starts[3] + (40 if where == "data" else 10)] ^= 0x80
    bad = tmp_path / "bad.wpcap"
    bad.write_bytes(raw)
    for read in (lambda: list(iter_records(bad)), lambda: scan_offsets(bad),
                 lambda: read_batch(bad)):
        with pytest.raises(CorruptCapture, match=f"bad.wpcap: record at offset {starts[3]}"
                           ) as caught:
            read()
        assert (caught.value.offset, caught.value.path) == (starts[3], str(bad))


def test_scan_and_batch_from_an_offset_with_a_limit(good_file) -> None:
    path, starts = good_file
    assert scan_offsets(path, limit=2) == capture.Scan(starts[:2], starts[2], "limit")
    assert scan_offsets(path, start=starts[2], limit=3) == capture.Scan(
        starts[2:5], starts[5], "limit")
    assert scan_offsets(path, start=starts[5]) == capture.Scan(
        starts[5:], path.stat().st_size, "end")
    records = list(iter_records(path))
    batch = read_batch(path, starts[1], 4)
    assert len(batch) == 4 and batch.stop == "limit" and batch.end == starts[5]
    expected = records[1:5]
    assert batch.offset == [r.offset for r in expected]
    assert batch.data == [r.data for r in expected]
    assert batch.timestamp_ns == [r.timestamp_ns for r in expected]
    assert batch.connection == [1] * 4 and batch.kind == [1] * 4
    assert batch.protocol == [PROTOCOLS["subble"]] * 4 and batch.transport == [1] * 4
    assert batch.flags == [FLAG_BINARY] * 4
    assert len(batch.headers) == 4 * 32
    assert [r.offset for r in iter_records(path, start=starts[4])] == starts[4:]
    with pytest.raises(ValueError, match="outside the records"):
        scan_offsets(path, start=3)
    empty = read_batch(path, path.stat().st_size)
    assert (len(empty), empty.end, empty.stop, empty.headers) == (0, path.stat().st_size, "end",
                                                                  b"")


# -- kill -9 while writing ------------------------------------------------------------------------

WRITER_SCRIPT = textwrap.dedent("""
    import sys
    from wireproto.capture import CaptureWriter

    writer = CaptureWriter(sys.argv[1], max_file_bytes=1 << 20, buffer_bytes=1 << 30)
    writer.open_connection(1, "127.0.0.1:1", "websmq", "ws")
    writer.open_connection(2, "127.0.0.1:2", "ubre", "lines")
    i = 0
    while True:
        writer.message(1 + i % 2, "in", i.to_bytes(8, "little") + bytes(i % 1500), True)
        i += 1
        if i % 400 == 0:
            writer.flush()
            if i == 400:
                print("ready", flush=True)
""")


def test_kill_9_leaves_every_whole_record_readable(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER_SCRIPT)
    out = tmp_path / "captures"
    child = subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        until(lambda: sum(p.stat().st_size for p in out.iterdir()) > 4 << 20)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    files = capture_files(out)
    assert len(files) >= 4
    indices = []
    for number, path in enumerate(files):
        records = list(iter_records(path))
        assert {r.connection for r in records[:2] if r.kind == Kind.OPEN} == {1, 2}
        for data in messages(records):
            indices.append(int.from_bytes(data[:8], "little"))
            assert len(data) == 8 + indices[-1] % 1500
        scan = scan_offsets(path)
        if number < len(files) - 1:
            assert scan.stop == "end" and scan.end == path.stat().st_size
        else:  # the file being written: whole records, then maybe a torn one
            assert scan.stop in ("end", "partial")
            assert path.stat().st_size - scan.end < 32 + 8 + 1500 or scan.stop == "end"
    assert indices == list(range(len(indices)))
    assert len(indices) > 2000


# -- the threaded writer --------------------------------------------------------------------------


def test_threaded_writer_keeps_order_and_counts(tmp_path: Path) -> None:
    writer = ThreadedCaptureWriter(tmp_path, max_file_bytes=64 << 10, flush_bytes=700,
                                   flush_interval=60)
    sent = []
    writer.open_connection(1, "127.0.0.1:1", "websmq", "ws")
    for i in range(3000):
        data = b"%06d" % i + bytes(i % 50)
        writer.message(1, "out" if i % 2 else "in", data, bool(i % 3))
        sent.append(data)
    writer.close_connection(1, "done")
    writer.close()
    assert writer.error is None
    records = all_records(tmp_path)
    assert messages(records) == sent
    assert records[-1].kind == Kind.CLOSE
    files = capture_files(tmp_path)
    counters = writer.counters
    assert len(files) > 1
    assert (counters.files, counters.records, counters.bytes) == (
        len(files), len(records), sum(p.stat().st_size for p in files))
    assert (counters.dropped_batches, counters.dropped_records) == (0, 0)
    with pytest.raises(RuntimeError, match="closed"):
        writer.message(1, "in", b"late", True)


def test_threaded_writer_writes_nothing_until_close(tmp_path: Path) -> None:
    writer = ThreadedCaptureWriter(tmp_path, flush_bytes=1 << 20, flush_interval=3600)
    writer.open_connection(1, "p", "nydus", "engineio")
    for i in range(5):
        writer.message(1, "in", b"m%d" % i, False)
    assert capture_files(tmp_path) == []
    writer.close()
    assert messages(all_records(tmp_path)) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert writer.counters.records == 6


def test_threaded_writer_flushes_on_its_interval(tmp_path: Path) -> None:
    writer = ThreadedCaptureWriter(tmp_path, flush_bytes=1 << 20, flush_interval=0.02)
    try:
        writer.open_connection(1, "p", "ubre", "ws")
        writer.message(1, "in", b"soon", True)
        until(lambda: capture_files(tmp_path) and messages(all_records(tmp_path)) == [b"soon"])
        writer.message(1, "in", b"later", True)
        until(lambda: messages(all_records(tmp_path)) == [b"soon", b"later"])
    finally:
        writer.close()


def test_threaded_writer_drops_whole_batches_when_its_queue_is_full(tmp_path: Path) -> None:
    entered, gate = threading.Event(), threading.Event()

    def slow_first_write() -> None:
        if not entered.is_set():
            entered.set()
            assert gate.wait(30)

    writer = ThreadedCaptureWriter(tmp_path, flush_bytes=3000, queue_bytes=1,
                                   flush_interval=3600, _before_write=slow_first_write)
    try:
        writer.open_connection(1, "127.0.0.1:1", "websmq", "ws")
        writer.flush()
        assert entered.wait(30)
        for i in range(10):  # each fills a batch; the queue holds the one being written
            writer.message(1, "in", b"%d" % i + bytes(5000), True)
        writer.message(1, "in", b"kept", True)  # stays buffered until close
        counters = writer.counters
        # the first dropped batch held 1 record; the next 9 each started a file: open + message
        assert (counters.dropped_batches, counters.dropped_records) == (10, 19)
        assert counters.records == 0
    finally:
        gate.set()
        writer.close()
    assert writer.error is None
    first, second = files = capture_files(tmp_path)
    assert [read_header(path).info["sequence"] for path in files] == [1, 11]
    assert read_header(second).info["dropped_batches"] == 10
    assert read_header(second).info["dropped_records"] == 19
    assert [r.kind for r in iter_records(first)] == [Kind.OPEN]
    # after the drop the next file stands alone: the open again, then what was kept
    opened, kept = iter_records(second)
    assert (opened.kind, opened.connection, kept.data) == (Kind.OPEN, 1, b"kept")
    assert writer.counters.records == 3


def test_threaded_writer_counts_a_failed_write_and_carries_on(tmp_path: Path) -> None:
    out = tmp_path / "out"
    failures = []

    def remove_directory_once() -> None:
        if not failures:
            failures.append(1)
            shutil.rmtree(out)

    writer = ThreadedCaptureWriter(out, flush_bytes=1, flush_interval=3600,
                                   _before_write=remove_directory_once)
    writer.open_connection(1, "p", "ubre", "ws")  # its file cannot be created
    until(lambda: writer.counters.dropped_batches == 1)
    out.mkdir()
    writer.message(1, "in", b"after", True)
    writer.close()
    assert isinstance(writer.error, FileNotFoundError)
    [path] = capture_files(out)
    assert [(r.kind, r.data[:5]) for r in iter_records(path)] == [
        (Kind.OPEN, b'{"pee'), (Kind.IN, b"after")]
    assert read_header(path).info["dropped_records"] == 1
    assert os.path.basename(path).endswith("-000002.wpcap")
