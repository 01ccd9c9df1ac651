"""The ``replay:`` endpoint: a live session captured from a board standing in on a pty, then
played back through the same link code to a real subscriber over a real protocol."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import protocol, reactor
from twisted.internet.endpoints import clientFromString
from twisted.logger import globalLogPublisher

from tests.support import eventually, sleep, wait_for
from wireproto import capture
from wireproto.capture.replay import FramedEncoding, PhylloEncoding, ReplayEndpoint, phyllo_replay
from wireproto.codecs import websmq
from wireproto.codecs.phyllo import PubSubMessage, TypeCode, decode, encode, encode_frame
from wireproto.codecs.phyllo.document import Format, Schema, message_from_document, serialize
from wireproto.codecs.phyllo.stack import (
    DATAGRAM_LAYER,
    MINIMAL,
    REDUCED,
    VALIDATED_DATAGRAM_LAYER,
    StackDecoder,
)
from wireproto.config import (
    CaptureSettings,
    Config,
    ConfigError,
    parse_attach,
    parse_listen,
    parse_phyllo,
)
from wireproto.devices import PollingWatcher
from wireproto.devices.standin import COMMON_BOARDS, StandInPorts
from wireproto.errors import ProtocolError
from wireproto.hub import Session
from wireproto.protocols.websmq.client import connect
from wireproto.service import make_service

FAST_RETRY = {"retry_policy": lambda attempt: 0.05}
GAP = 0.05  # between the board's messages in the captured session
h = bytes.fromhex


def numbered(seq: int) -> PubSubMessage:
    """The board's messages: on even numbers a msgpack document, on odd a byte buffer."""
    if seq % 2:
        return PubSubMessage(TypeCode.BYTES_BUFFER, b"n", str(seq).encode())
    return message_from_document(
        "doc", serialize({"seq": seq, "raw": [1.5, None]}, Format.MSGPACK, Schema.SCHEMALESS))


def bad_crc(message: PubSubMessage) -> bytes:
    """`message` on the reduced stack with its validated datagram's CRC wrong."""
    data = bytes([message.payload_type, len(message.topic)]) + message.topic + message.payload
    validated = bytearray(VALIDATED_DATAGRAM_LAYER.pack(0x60, data))
    validated[0] ^= 0xFF
    return b"\0" + encode_frame(DATAGRAM_LAYER.pack(0x22, bytes(validated))) + b"\0"


class Broker:
    """A broker with a WEBSMQ WebSocket listener, its links added while it runs, and real
    WEBSMQ subscribers; everything stopped at the end."""

    def __init__(self) -> None:
        self.service: Any = None
        self.clients: list[Any] = []

    async def start(self, ports: PollingWatcher | None = None, **config: Any) -> None:
        settings = Config(listeners=(parse_listen("websmq+ws@tcp:0:interface=127.0.0.1"),),
                          **config)
        self.service = make_service(settings, reactor, ports=ports, **FAST_RETRY)
        self.service.startService()
        (bound,) = await wait_for(self.service.when_listening())
        self.address = bound.address

    async def subscriber(self, *topics: str, times: list[float] | None = None
                         ) -> list[tuple[str, bytes]]:
        """What a subscriber to `topics` gets; `times`, when each came."""
        client = await wait_for(connect(reactor, self.address))
        self.clients.append(client)
        inbox: list[tuple[str, bytes]] = []

        def received(message: Any) -> None:
            inbox.append((message.topic, message.payload))
            if times is not None:
                times.append(time.monotonic())

        for topic in topics:
            await client.subscribe(topic, received)
            await eventually(lambda topic=topic: any(
                isinstance(s, Session) for s in self.service.hub.subscribers(topic)))
        return inbox

    async def stop(self) -> None:
        for client in self.clients:
            await wait_for(client.disconnect(), timeout=10)
        self.clients = []
        if self.service is not None and self.service.running:
            await wait_for(self.service.stopService(), timeout=10)


@pytest_twisted.async_yield_fixture
async def broker():
    running = Broker()
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
def boards():
    standins = StandInPorts()
    yield standins
    standins.close()


@dataclass
class Session_:
    directory: Path
    live: list[tuple[str, bytes]]  # what a subscriber got from the board, topic under the link


COUNT = 10


async def capture_session(boards: StandInPorts, directory: Path,
                          replug_at: int | None = None) -> Session_:
    """A live session: the board (on a pty, found by its USB identity) sends COUNT numbered
    messages GAP apart, with a frame whose CRC is wrong among them, to a broker capturing
    everything; with `replug_at`, the board is unplugged and plugged back before that one."""
    board = boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    live = Broker()
    await live.start(phyllo=(parse_phyllo("dev1@serial:vid=2341:pid=0043"),),
                     capture=CaptureSettings(directory=str(directory), flush_interval=0.05),
                     ports=PollingWatcher(reactor, boards.ports, interval=0.05))
    try:
        bridge = live.service.phyllo["dev1"]
        await eventually(lambda: bridge.top is not None)
        inbox = await live.subscriber("phyllo/dev1/n", "phyllo/dev1/doc")
        for seq in range(COUNT):
            if seq == replug_at:
                await eventually(lambda seq=seq: len(inbox) == seq)
                board = boards.replug(board)
                await eventually(lambda: bridge.stats.connections == 2 and bridge.connected)
            board.write(REDUCED.encode(numbered(seq)))
            if seq == 4:
                board.write(bad_crc(PubSubMessage(TypeCode.BYTES_BUFFER, b"n", b"bad")))
            await sleep(GAP)
        await eventually(lambda: len(inbox) == COUNT)
        assert bridge.counters()["crc_errors"] == 1  # the bad frame: dropped, not captured
    finally:
        await live.stop()
    return Session_(directory, [(topic.removeprefix("phyllo/dev1/"), payload)
                                for topic, payload in inbox])


def in_records(directory: Path, **info: str) -> tuple[list[capture.Record], dict[str, Any]]:
    """The in records of the one connection whose open record says `info`, and that record."""
    records = [record for path in capture.capture_files(directory)
               for record in capture.iter_records(path)]
    (opened,) = [record for record in records if record.kind == capture.Kind.OPEN
                 and info.items() <= record.info().items()]
    return ([record for record in records if record.connection == opened.connection
             and record.kind == capture.Kind.IN], {**opened.info(), "id": opened.connection})


async def replayed(broker: Broker, spec: str, count: int) -> tuple[list[tuple[str, bytes]],
                                                                   list[float]]:
    """Start `spec` as a Phyllo link named `replayed`, and what a subscriber gets from it,
    with when each arrived."""
    if broker.service is None:
        await broker.start()
    times: list[float] = []
    inbox = await broker.subscriber("phyllo/replayed/n", "phyllo/replayed/doc", times=times)
    broker.service.add_phyllo(parse_phyllo(spec), FAST_RETRY["retry_policy"])
    await eventually(lambda: len(inbox) >= count, timeout=10)
    return [(topic.removeprefix("phyllo/replayed/"), payload) for topic, payload in inbox], times


@pytest_twisted.ensureDeferred
async def test_a_captured_link_replays_its_messages_to_a_subscriber(boards, broker, tmp_path):
    session = await capture_session(boards, tmp_path / "capture")
    records, opened = in_records(session.directory, protocol="phyllo")
    assert (opened["link"], opened["stack"]) == ("dev1", "reduced")  # what link= finds
    captured = [decode(message) for record in records for message in record.messages()]
    assert captured == [numbered(seq) for seq in range(COUNT)]  # the bad frame is not there

    got, times = await replayed(
        broker, f"replayed@replay:path={session.directory}:link=dev1", COUNT)
    await sleep(0.2)
    assert got == session.live  # topic and payload, in order, nothing more
    assert GAP * (COUNT - 1) * 0.7 < times[-1] - times[0] < GAP * (COUNT - 1) * 3
    bridge = broker.service.phyllo["replayed"]
    assert bridge.connected and bridge.stats.connections == 1  # at the end: open and quiet


@pytest_twisted.ensureDeferred
async def test_speed_ten_plays_ten_times_faster_and_loop_plays_again(boards, broker, tmp_path):
    session = await capture_session(boards, tmp_path / "capture")
    got, times = await replayed(
        broker, f"replayed+minimal@replay:path={session.directory}:link=dev1:speed=10:loop=yes",
        3 * COUNT)
    assert got[:3 * COUNT] == session.live * 3
    one_pass = GAP * (COUNT - 1) / 10
    assert times[COUNT - 1] - times[0] < one_pass * 4 + 0.1


@pytest_twisted.ensureDeferred
async def test_stopping_mid_replay_leaves_no_timer(boards, broker, tmp_path):
    session = await capture_session(boards, tmp_path / "capture")
    await broker.start()
    inbox = await broker.subscriber("phyllo/replayed/n", "phyllo/replayed/doc")
    broker.service.add_phyllo(
        parse_phyllo(f"replayed@replay:path={session.directory}:link=dev1:speed=0.1"),
        FAST_RETRY["retry_policy"])
    await eventually(lambda: inbox)
    endpoint = broker.service.links.services[-1].endpoint.endpoint
    assert isinstance(endpoint, ReplayEndpoint) and endpoint._timer is not None
    await broker.stop()
    assert len(inbox) < COUNT
    assert endpoint.carrier is None and endpoint._timer is None and endpoint._records is None
    mine = [call for call in reactor.getDelayedCalls()
            if getattr(call.func, "__self__", None) is endpoint
            or type(getattr(call.func, "__self__", None)).__name__ == "ReplayTransport"]
    assert mine == []


@pytest_twisted.ensureDeferred
async def test_a_torn_capture_replays_what_is_whole_through_the_plugin(boards, tmp_path):
    session = await capture_session(boards, tmp_path / "capture")
    records, opened = in_records(session.directory, protocol="phyllo")
    torn = tmp_path / "torn.wpcap"
    (path,) = capture.capture_files(session.directory)
    cut = records[-1].offset + 40  # inside the last in record
    torn.write_bytes(path.read_bytes()[:cut])
    received = bytearray()

    class Collect(protocol.Protocol):
        def dataReceived(self, data: bytes) -> None:
            received.extend(data)

    endpoint = clientFromString(reactor, f"replay:path={torn}:connection={opened['id']}"
                                ":speed=max")
    opened_protocol = await wait_for(endpoint.connect(protocol.Factory.forProtocol(Collect)))
    stats = await wait_for(endpoint.when_finished())
    decoder = StackDecoder(REDUCED)  # the captured stack, by default
    played = [message for message in decoder.feed(bytes(received))]
    expected = [decode(m) for record in records[:-1] for m in record.messages()]
    assert played == expected and stats["messages"] == len(expected)
    opened_protocol.transport.write(b"to the board")  # discarded, counted
    assert endpoint.stats.writes_discarded == 1
    opened_protocol.transport.loseConnection()


def test_bad_replay_endpoints_are_one_line_config_errors(tmp_path):
    not_a_capture = tmp_path / "notes.txt"
    not_a_capture.write_text("hello\n")
    fifo = tmp_path / "fifo.wpcap"
    os.mkfifo(fifo)
    for spec, problem in [
        (f"x@replay:path={tmp_path}/missing:link=dev1", "missing: no such file or directory"),
        (f"x@replay:path={not_a_capture}:link=dev1", "not a capture file"),
        (f"x@replay:path={tmp_path}:link=dev1", "holds no capture files"),
        (f"x@replay:path={not_a_capture}:link=dev1:speed=0", "speed='0'"),
        (f"x@replay:path={not_a_capture}:link=dev1:speed=fast", "or max"),
        (f"x@replay:path={not_a_capture}:link=dev1:pace=2", "unknown replay: option(s) pace"),
        (f"x@replay:path={not_a_capture}", "needs connection=ID or link=NAME"),
        # there, but no file to read: not "no such file"
        (f"x@replay:path={fifo}:link=dev1", "fifo.wpcap: not a regular file"),
        ("x@replay:path=/dev/zero:link=dev1", "/dev/zero: not a regular file"),
        (f"x@replay:path={not_a_capture}:link=dev1:speed=nan", "speed='nan'"),
        (f"x@replay:path={not_a_capture}:link=dev1:speed=-1", "speed='-1'"),
        (f"x@replay:path={not_a_capture}:link=dev1:speed=1e308", "speed='1e308'"),
    ]:
        with pytest.raises(ConfigError) as error:
            parse_phyllo(spec)
        assert problem in str(error.value) and "\n" not in str(error.value)


def test_a_capture_this_user_may_not_read_is_a_one_line_config_error(tmp_path):
    # Another user's capture directory, or a file in it: a PermissionError, not a config
    # error, came out of reading the config.
    top = Path(tempfile.mkdtemp(prefix="wireproto-replay-"))
    try:
        top.chmod(0o755)
        written_capture(top / "theirs", 0)
        (their_file,) = capture.capture_files(top / "theirs")
        (top / "theirs").chmod(0)
        user = (65534, 65534) if os.geteuid() == 0 else None  # root: as nobody
        if user is not None:
            os.setegid(user[1])
            os.seteuid(user[0])
        try:
            for path in (top / "theirs", their_file):
                with pytest.raises(ConfigError) as error:
                    parse_phyllo(f"x@replay:path={path}:link=dev1")
                assert "Permission denied" in str(error.value), path
        finally:
            if user is not None:
                os.seteuid(0)
                os.setegid(0)
    finally:
        (top / "theirs").chmod(0o700)
        shutil.rmtree(top)


@pytest_twisted.ensureDeferred
async def test_no_such_link_names_what_the_capture_has(boards, tmp_path):
    session = await capture_session(boards, tmp_path / "capture")
    _, opened = in_records(session.directory, protocol="phyllo")
    with pytest.raises(ConfigError) as error:
        parse_phyllo(f"x@replay:path={session.directory}:link=dev9")
    assert "has no Phyllo link dev9: it has Phyllo links dev1; connections" in str(error.value)
    assert str(opened["id"]) in str(error.value)
    with pytest.raises(ConfigError, match="stack=minimal, but the link's stack is reduced"):
        parse_phyllo(f"x@replay:path={session.directory}:link=dev1:stack=minimal")
    with pytest.raises(ConfigError, match="spoke phyllo; this link serves websmq"):
        parse_attach(f"websmq+cobs@replay:path={session.directory}:connection={opened['id']}")
    assert phyllo_replay(reactor, f"replay:path={session.directory}:link=dev1",
                         stack="reduced").prepare().link == "dev1"


@pytest_twisted.ensureDeferred
async def test_an_attached_link_replays_the_publishes_it_captured(boards, broker, tmp_path):
    directory = tmp_path / "capture"
    board = boards.plug(**COMMON_BOARDS["pico"], serial_number="E661")
    live = Broker()
    await live.start(attach=(parse_attach(f"websmq+cobs@serial:{board.device}"),),
                     capture=CaptureSettings(directory=str(directory), flush_interval=0.05))
    try:
        inbox = await live.subscriber("sensors/t")
        await eventually(lambda: live.service.hub.subscribers("sensors/t"))
        # What the board writes before the link opens its port is flushed away: wait for it.
        await eventually(lambda: all(link.protocol is not None for link in live.service.links))
        from cobs import cobs

        for seq in range(5):
            board.write(cobs.encode(websmq.encode_publish("sensors/t", b"%d" % seq)) + b"\0")
            await sleep(GAP)
        await eventually(lambda: len(inbox) == 5)
    finally:
        await live.stop()
    _, opened = in_records(directory, protocol="websmq", transport="cobs")

    await broker.start()
    replay_inbox = await broker.subscriber("sensors/t")
    broker.service.add_attach(
        parse_attach(f"websmq+cobs@replay:path={directory}:connection={opened['id']}"),
        FAST_RETRY["retry_policy"])
    await eventually(lambda: len(replay_inbox) == 5)
    assert replay_inbox == inbox == [("sensors/t", b"%d" % seq) for seq in range(5)]
    assert os.path.exists(directory)


@pytest_twisted.ensureDeferred
async def test_a_link_reopened_in_the_capture_replays_all_its_connections_in_order(
        boards, broker, tmp_path):
    session = await capture_session(boards, tmp_path / "capture", replug_at=6)
    opens = [record for path in capture.capture_files(session.directory)
             for record in capture.iter_records(path) if record.kind == capture.Kind.OPEN
             and record.info().get("link") == "dev1"]
    assert len(opens) == 2
    got, _ = await replayed(
        broker, f"replayed@replay:path={session.directory}:link=dev1:speed=max", COUNT)
    await sleep(0.1)
    assert got == session.live
    assert broker.service.phyllo["replayed"].stats.connections == 1  # one carrier for both


@pytest_twisted.ensureDeferred
async def test_a_damaged_record_ends_the_file_there_and_says_so(boards, tmp_path):
    session = await capture_session(boards, tmp_path / "capture")
    records, opened = in_records(session.directory, protocol="phyllo")
    (path,) = capture.capture_files(session.directory)
    data = bytearray(path.read_bytes())
    data[records[3].offset + 40] ^= 0xFF  # the fourth in record's data: its CRC fails
    damaged = tmp_path / "damaged.wpcap"
    damaged.write_bytes(bytes(data))
    endpoint = clientFromString(reactor, f"replay:path={damaged}:link=dev1:speed=max")
    received = bytearray()

    class Collect(protocol.Protocol):
        def dataReceived(self, data: bytes) -> None:
            received.extend(data)

    logged: list[dict] = []
    globalLogPublisher.addObserver(logged.append)
    try:
        await wait_for(endpoint.connect(protocol.Factory.forProtocol(Collect)))
        stats = await wait_for(endpoint.when_finished())
    finally:
        globalLogPublisher.removeObserver(logged.append)
    assert StackDecoder(REDUCED).feed(bytes(received)) == [numbered(seq) for seq in range(3)]
    assert stats["messages"] == 3
    (stopped,) = [event for event in logged if event.get("event") == "replay_file_stopped"]
    assert "CRC mismatch" in stopped["problem"]
    endpoint.carrier.loseConnection()


@pytest_twisted.ensureDeferred
async def test_a_capture_replaced_under_a_looped_replay_ends_it_with_a_warning(tmp_path):
    # The file replaced by one that is not a capture between two passes: the reader's error
    # escaped the replay's timer (a traceback in the log) and the replay stopped in silence,
    # neither playing nor ended.
    written_capture(tmp_path, 0)
    (path,) = capture.capture_files(tmp_path)
    endpoint = clientFromString(reactor, f"replay:path={tmp_path}:link=dev1:speed=max:loop=yes")
    logged: list[dict] = []
    globalLogPublisher.addObserver(logged.append)
    try:
        connected = await wait_for(endpoint.connect(protocol.Factory.forProtocol(
            protocol.Protocol)))
        await eventually(lambda: endpoint.stats.passes >= 2)
        path.unlink()
        path.write_bytes(b"#!/bin/sh\necho not a capture\n")
        stats = await wait_for(endpoint.when_finished())
    finally:
        globalLogPublisher.removeObserver(logged.append)
    assert stats["messages"] % 3 == 0 and endpoint._timer is None
    (stopped,) = [event for event in logged if event.get("event") == "replay_file_stopped"]
    assert "not a capture file" in stopped["problem"]
    assert not [event for event in logged if event.get("log_failure") is not None]
    connected.transport.loseConnection()


def test_serve_refuses_a_replay_of_nothing_in_one_line(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "wireproto", "serve", "--listen", "websmq+ws@tcp:0",
         "--phyllo", f"x@replay:path={tmp_path}/none.wpcap:link=dev1"],
        cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"wireproto serve: --phyllo 'x@replay:path={tmp_path}/none.wpcap:link=dev1': bad client "
        f"endpoint 'replay:path={tmp_path}/none.wpcap:link=dev1': {tmp_path}/none.wpcap: no "
        "such file or directory"]


def written_capture(directory: Path, others: int) -> None:
    """A capture written directly: `others` records of a chatty websmq connection, then three
    messages of Phyllo link dev1 (connection 7), 10 ms apart."""
    with capture.CaptureWriter(directory) as writer:
        writer.open_connection(3, "127.0.0.1:1", "websmq", "ws", timestamp_ns=1)
        writer.open_connection(7, "serial:/dev/ttyACM0", "phyllo", "stream", timestamp_ns=1,
                               link="dev1", stack="minimal")
        for index in range(others):
            writer.message(3, "in", b"x", True, timestamp_ns=2 + index)
        for seq in range(3):
            writer.message(7, "in", encode(numbered(seq)), True,
                           timestamp_ns=10**9 + seq * 10**7)


def test_a_reader_pauses_after_many_records_it_does_not_want(tmp_path):
    from wireproto.capture.walk import PASS_BEFORE_PAUSE, RecordCursor

    written_capture(tmp_path, 2 * PASS_BEFORE_PAUSE)
    cursor = RecordCursor(capture.capture_files(tmp_path))
    seen = list(cursor.records(lambda kind, connection: connection == 7))
    assert seen.count(None) == 2
    assert [decode(record.data) for record in seen if record is not None
            and record.kind == capture.Kind.IN] == [numbered(seq) for seq in range(3)]


@pytest_twisted.ensureDeferred
async def test_a_replay_captured_into_the_directory_it_plays_is_not_played_again(tmp_path):
    # A broker capturing into the directory its replay: link plays captured the replay as
    # another connection of the link, and the next run played that too: each run more, with
    # loop=yes without end.
    written_capture(tmp_path, 0)  # link dev1, minimal stack: three messages
    settings = CaptureSettings(directory=str(tmp_path), flush_interval=0.05)
    for run in range(3):
        broker = Broker()
        try:
            await broker.start(capture=settings)
            inbox = await broker.subscriber("phyllo/dev1/n", "phyllo/dev1/doc")
            broker.service.add_phyllo(parse_phyllo(
                f"dev1+minimal@replay:path={tmp_path}/:link=dev1:speed=max"),
                FAST_RETRY["retry_policy"])
            await eventually(lambda inbox=inbox: len(inbox) >= 3)
            await sleep(0.2)
            assert len(inbox) == 3, f"run {run}"
        finally:
            await broker.stop()
    assert len(capture.capture_files(tmp_path)) == 4  # each run captured its replay


@pytest_twisted.ensureDeferred
async def test_a_looped_capture_without_a_pace_of_its_own_is_not_a_flood(tmp_path):
    # One record (a capture cut short, or records all stamped alike) looped at speed=10 played
    # as fast as the reactor turned: 15,000 messages a second, a core busy, at "the pace".
    with capture.CaptureWriter(tmp_path) as writer:
        writer.open_connection(7, "serial:/dev/ttyACM0", "phyllo", "stream", timestamp_ns=1,
                               link="dev1", stack="minimal")
        writer.message(7, "in", encode(numbered(1)), True, timestamp_ns=5)
    endpoint = clientFromString(reactor, f"replay:path={tmp_path}:link=dev1:speed=10:loop=yes")
    received = bytearray()

    class Collect(protocol.Protocol):
        def dataReceived(self, data: bytes) -> None:
            received.extend(data)

    connected = await wait_for(endpoint.connect(protocol.Factory.forProtocol(Collect)))
    await sleep(0.55)  # a pass each tenth of a second (one second over speed 10)
    connected.transport.loseConnection()
    assert 3 <= endpoint.stats.messages <= 8, endpoint.stats
    assert StackDecoder(MINIMAL).feed(bytes(received)) == [numbered(1)] * endpoint.stats.messages


def test_a_reader_pauses_after_opening_a_few_files(tmp_path):
    # A directory of thousands of small files (a broker rotating often): a replay opened 512
    # of them (a burst of records) in one reactor turn, the broker's reactor held a second.
    from wireproto.capture.walk import FILES_BEFORE_PAUSE, RecordCursor

    written_capture(tmp_path, 0)
    (first,) = capture.capture_files(tmp_path)
    for number in range(2, 4 * FILES_BEFORE_PAUSE + 2):
        shutil.copy(first, tmp_path / f"wirecapture-20260101T000000-{number:06d}.wpcap")
    cursor = RecordCursor(capture.capture_files(tmp_path))
    files_between_pauses, files = [], set()
    for record in cursor.records(lambda kind, connection: connection == 7):
        if record is None:
            files_between_pauses.append(len(files))
            files.clear()
        else:
            files.add(cursor.index)
    assert files_between_pauses and max(files_between_pauses) <= FILES_BEFORE_PAUSE
    assert sum(files_between_pauses) + len(files) == 4 * FILES_BEFORE_PAUSE + 1


@pytest_twisted.ensureDeferred
async def test_a_replay_without_a_link_plays_the_captured_stack(tmp_path):
    written_capture(tmp_path, 10)
    received = bytearray()

    class Collect(protocol.Protocol):
        def dataReceived(self, data: bytes) -> None:
            received.extend(data)

    endpoint = clientFromString(reactor, f"replay:path={tmp_path}:link=dev1:loop=no")
    started = time.monotonic()
    await wait_for(endpoint.connect(protocol.Factory.forProtocol(Collect)))
    await wait_for(endpoint.when_finished())
    assert 0.015 < time.monotonic() - started < 1.0  # two gaps of 10 ms
    assert StackDecoder(MINIMAL).feed(bytes(received)) == [numbered(seq) for seq in range(3)]
    endpoint.carrier.loseConnection()
    # Opened again after its end (a reconnector would): open and quiet, never from the start.
    again = await wait_for(endpoint.connect(protocol.Factory.forProtocol(Collect)))
    await sleep(0.05)
    assert len(StackDecoder(MINIMAL).feed(bytes(received))) == 3
    assert endpoint.stats.connections == 2 and again.transport.connected
    again.transport.loseConnection()


def test_a_message_over_the_links_chunk_limit_is_not_encoded():
    small = PhylloEncoding("reduced", max_chunk_length=24, max_frame_payload=22)
    assert small.encode(encode(numbered(1)))  # a short one fits
    with pytest.raises(ProtocolError):
        small.encode(encode(numbered(0)))  # the document does not
    with pytest.raises(ProtocolError):
        FramedEncoding("cobs", max_message_size=4).encode(b"12345")


@pytest_twisted.ensureDeferred
async def test_the_docs_sample_capture_replays_both_its_connections():
    sample = Path(__file__).parents[2] / "examples" / "captures" / "dev1.wpcap"
    received = bytearray()

    class Collect(protocol.Protocol):
        def dataReceived(self, data: bytes) -> None:
            received.extend(data)

    endpoint = clientFromString(reactor, f"replay:path={sample}:link=dev1:speed=max")
    await wait_for(endpoint.connect(protocol.Factory.forProtocol(Collect)))
    await wait_for(endpoint.when_finished())
    temps = [message.topic for message in StackDecoder(REDUCED).feed(bytes(received))]
    assert temps == [b"temp"] * 20
    endpoint.carrier.loseConnection()


@pytest_twisted.ensureDeferred
async def test_a_carrier_closed_mid_replay_and_opened_again_goes_on_where_it_was(tmp_path):
    written_capture(tmp_path, 0)
    received = bytearray()

    class Collect(protocol.Protocol):
        def dataReceived(self, data: bytes) -> None:
            received.extend(data)

    endpoint = clientFromString(reactor, f"replay:path={tmp_path}:connection=7:speed=0.2")
    first = await wait_for(endpoint.connect(protocol.Factory.forProtocol(Collect)))
    await eventually(lambda: received)
    first.transport.loseConnection()  # 50 ms before the second message
    await sleep(0.1)
    assert len(StackDecoder(MINIMAL).feed(bytes(received))) == 1
    again = await wait_for(endpoint.connect(protocol.Factory.forProtocol(Collect)))
    await wait_for(endpoint.when_finished())
    assert StackDecoder(MINIMAL).feed(bytes(received)) == [numbered(seq) for seq in range(3)]
    again.transport.loseConnection()


def test_an_open_record_too_long_to_be_one_is_skipped_not_parsed(tmp_path):
    from wireproto.capture.walk import MAX_INFO_BYTES, RecordCursor

    with capture.CaptureWriter(tmp_path) as writer:
        writer.open_connection(7, "x", "phyllo", "stream", timestamp_ns=1, link="dev1",
                               padding="x" * MAX_INFO_BYTES)
        writer.message(7, "in", encode(numbered(1)), True, timestamp_ns=2)
    cursor = RecordCursor(capture.capture_files(tmp_path))
    assert [record.kind for record in cursor.records(lambda kind, connection: True)
            if record is not None] == [capture.Kind.IN]
    assert cursor.skipped == 1
    with pytest.raises(ConfigError, match="has no Phyllo link dev1"):
        parse_phyllo(f"x@replay:path={tmp_path}:link=dev1")


def test_a_looped_capture_of_a_moment_plays_a_pass_a_second_not_in_a_spin(tmp_path):
    from twisted.internet.task import Clock

    with capture.CaptureWriter(str(tmp_path)) as writer:
        writer.open_connection(7, "serial:/dev/ttyACM0", "phyllo", "stream", timestamp_ns=0,
                               link="dev1", stack="reduced")
        writer.message(7, "in", encode(PubSubMessage(0x10, b"temp", b"20")), True,
                       timestamp_ns=5 * 10**9)
    clock = Clock()
    delivered: list[float] = []

    class Board(protocol.Protocol):
        def dataReceived(self, data: bytes) -> None:
            delivered.append(clock.seconds())
            if len(delivered) > 50:  # the Clock would run the spin for ever
                raise AssertionError(f"{len(delivered)} passes by {clock.seconds()} s")

    endpoint = clientFromString(clock, f"replay:path={tmp_path}:link=dev1:loop=yes")
    endpoint.connect(protocol.Factory.forProtocol(Board))
    clock.advance(0)
    for _ in range(10):
        clock.advance(0.5)
    assert delivered == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert endpoint.stats.passes == 6  # each pass played has ended
