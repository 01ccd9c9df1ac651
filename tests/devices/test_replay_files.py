"""Both replays read a capture alike (`wireproto.capture.walk`): the ``replay:`` endpoint and
``wireproto replay`` find the same files of a nested capture directory in the same order, play
the same records of files damaged, torn, cut, replaced or turned into a FIFO under them, and a
directory of thousands of files is searched without holding the reactor."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, protocol, reactor
from twisted.internet.task import Clock, deferLater
from twisted.logger import globalLogPublisher

from tests.support import wait_for
from wireproto import capture
from wireproto.capture.replay import FramedEncoding, ReplayEndpoint, replay_endpoint
from wireproto.capture.replay_source import parse_replay
from wireproto.capture.walk import (
    HEADERS_BEFORE_PAUSE,
    CaptureRefused,
    RecordCursor,
    capture_at,
    to_the_end,
)
from wireproto.codecs import websmq
from wireproto.codecs.phyllo import MINIMAL, PubSubMessage, StackDecoder, TypeCode, encode
from wireproto.tools._common import ToolError
from wireproto.tools.replay import CapturedPublishes, capture_paths

SECOND = 10**9
BIG = 16 << 10  # a payload larger than a buffered reader's buffer: each read reaches the file


def publishes(directory: Path, numbers: range, *, size: int = 8) -> Path:
    """A capture file in `directory` of connection 1 (WEBSMQ) publishing b"N..." (`size`
    bytes) on t/a for each N of `numbers`, N seconds in."""
    with capture.CaptureWriter(directory, fsync=False, clock=lambda: SECOND) as writer:
        writer.open_connection(1, "127.0.0.1:1", "websmq", "length32", timestamp_ns=SECOND)
        for number in numbers:
            writer.message(1, "in", websmq.encode(websmq.Publish("t/a", payload(number, size))),
                           True, timestamp_ns=(number + 1) * SECOND)
    (path,) = capture.capture_files(directory)
    return path


def payload(number: int, size: int = 8) -> bytes:
    return b"%d" % number + b"." * (size - len(b"%d" % number))


def in_offsets(path: Path) -> list[int]:
    return [record.offset for record in capture.iter_records(path)
            if record.kind == capture.Kind.IN]


def test_both_replays_find_the_files_of_a_nested_capture_in_one_order(tmp_path):
    # A fleet's capture root: the brokers' directories under it. The endpoint read only the
    # root's own files ("holds no capture files"); the command read every directory.
    for where, numbers in (("", range(0, 2)), ("board-b", range(4, 6)),
                           ("board-a", range(2, 4)), ("board-a/old", range(6, 8))):
        publishes(tmp_path / where, numbers)
    (tmp_path / "board-a" / "notes.txt").write_text("not named as a capture: left out\n")
    os.mkfifo(tmp_path / "board-b" / "fifo")
    found = to_the_end(capture_at(str(tmp_path)))
    assert [file.parent.relative_to(tmp_path).as_posix() for file in found] == [
        ".", "board-a", "board-a/old", "board-b"]
    assert capture_paths([str(tmp_path)]) == found
    endpoint = replay_endpoint(reactor, f"replay:path={tmp_path}:connection=1")
    endpoint.prepare()
    assert endpoint._cursor is not None and endpoint._cursor.paths == found


@pytest_twisted.ensureDeferred
async def test_the_endpoint_plays_a_link_in_a_subdirectory_as_the_command_does(tmp_path):
    readings = [PubSubMessage(TypeCode.BYTES_BUFFER, b"n", b"%d" % seq) for seq in range(3)]
    with capture.CaptureWriter(tmp_path / "board-a", fsync=False) as writer:
        writer.open_connection(7, "serial:/dev/ttyACM0", "phyllo", "stream", timestamp_ns=1,
                               link="dev1", stack="minimal")
        for seq, reading in enumerate(readings):
            writer.message(7, "in", encode(reading), True, timestamp_ns=2 + seq)
    publishes(tmp_path / "board-b", range(2))
    received = bytearray()

    class Collect(protocol.Protocol):
        def dataReceived(self, data: bytes) -> None:
            received.extend(data)

    endpoint = replay_endpoint(reactor, f"replay:path={tmp_path}:link=dev1:speed=max")
    await wait_for(endpoint.connect(protocol.Factory.forProtocol(Collect)))
    await wait_for(endpoint.when_finished())
    endpoint.carrier.loseConnection()
    assert StackDecoder(MINIMAL).feed(bytes(received)) == readings
    command = [(m.topic, m.payload) for m in CapturedPublishes(capture_paths([str(tmp_path)]))
               if m.protocol == "phyllo"]
    assert command == [(f"phyllo/dev1/{r.topic.decode()}", r.payload) for r in readings]


# -- files that end early, alike in both ---------------------------------------------------------


def damage(first: Path, second: Path) -> None:
    """The third message's data flipped: a CRC that fails with records after it."""
    data = bytearray(first.read_bytes())
    data[in_offsets(first)[2] + capture.HEADER_SIZE + 3] ^= 0xFF
    first.write_bytes(bytes(data))


def tear(first: Path, second: Path) -> None:
    """The last record cut short: a writer stopped mid-write."""
    first.write_bytes(first.read_bytes()[:-5])


def cut_under(first: Path, second: Path) -> None:
    """Cut inside the fourth message while the first file is being read."""
    os.truncate(first, in_offsets(first)[3] + capture.HEADER_SIZE + 100)


def not_a_capture_under(first: Path, second: Path) -> None:
    second.unlink()
    second.write_bytes(b"#!/bin/sh\necho not a capture\n")


def a_fifo_under(first: Path, second: Path) -> None:
    second.unlink()
    os.mkfifo(second)  # its open would wait for a writer, for ever


SCENARIOS: dict[str, tuple[Callable[[Path, Path], None], bool, list[int], str | None]] = {
    # what is done, whether before the replays start (else after the second message), the
    # first file's messages played, and the stop said (None: the file's end, silently)
    "damaged": (damage, True, [0, 1], "record at offset {2}: CRC mismatch"),
    "torn": (tear, True, [0, 1, 2, 3], "a torn record at offset {4}"),
    "cut under": (cut_under, False, [0, 1, 2], "cut to"),
    "not a capture under": (not_a_capture_under, False, [0, 1, 2, 3, 4], "not a capture file"),
    "a fifo under": (a_fifo_under, False, [0, 1, 2, 3, 4], "not a regular file any more"),
}


def two_files(top: Path) -> tuple[Path, Path]:
    return publishes(top, range(5), size=BIG), publishes(top / "later", range(5, 8), size=BIG)


def by_the_command(top: Path, change: Callable[[], None], before: bool
                   ) -> tuple[list[bytes], list[str], str | None]:
    """The payloads the command replays, the stops it said, its error."""
    reading = CapturedPublishes(capture_paths([str(top)]))
    if before:
        change()
    played: list[bytes] = []
    error = None
    try:
        for message in reading.with_turns():
            if message is not None:
                played.append(message.payload)
                if len(played) == 2 and not before:
                    change()
    except ToolError as refused:
        error = str(refused)
    return played, [str(stop) for stop in reading.stops], error


def collecting(top: Path) -> tuple[Clock, ReplayEndpoint, bytearray, protocol.Factory]:
    """An endpoint replaying connection 1 of `top` at speed 1 on a Clock, what it plays, and a
    factory of protocols that collect it there."""
    clock = Clock()
    endpoint = ReplayEndpoint(clock, parse_replay(f"replay:path={top}:connection=1"),
                              FramedEncoding("length32"))
    received = bytearray()

    class Collect(protocol.Protocol):
        def dataReceived(self, data: bytes) -> None:
            received.extend(data)

    return clock, endpoint, received, protocol.Factory.forProtocol(Collect)


def by_the_endpoint(top: Path, change: Callable[[], None], before: bool
                    ) -> tuple[list[bytes], list[str]]:
    """The payloads the endpoint plays (at speed 1 on a Clock, a message a second), and the
    stops it logged."""
    clock, endpoint, received, collect = collecting(top)
    logged: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(logged.append)
    try:
        connecting = endpoint.connect(collect)
        if before:
            change()
        for _ in range(1000):  # the search, a breath a turn
            clock.advance(0)
            if connecting.called:
                break
        for _ in range(20):
            if len(frames(received)) == 2 and not before:
                change()
                before = True
            clock.advance(1)
        assert endpoint.finished
    finally:
        globalLogPublisher.removeObserver(logged.append)
    endpoint.carrier.loseConnection()
    stops = [event["problem"] for event in logged if event.get("event") == "replay_file_stopped"]
    return [websmq.decode(frame).payload for frame in frames(received)], stops


def frames(stream: bytes | bytearray) -> list[bytes]:
    found, offset = [], 0
    while offset + 4 <= len(stream):
        length = int.from_bytes(stream[offset:offset + 4], "big")
        found.append(bytes(stream[offset + 4:offset + 4 + length]))
        offset += 4 + length
    return found


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_files_ending_early_are_played_alike_by_both(tmp_path, scenario):
    change, before, played_first, said = SCENARIOS[scenario]
    results = []
    for user in ("command", "endpoint"):
        top = tmp_path / user
        first, second = two_files(top)
        offsets = in_offsets(first)
        run = by_the_command if user == "command" else by_the_endpoint
        results.append(run(top, lambda first=first, second=second: change(first, second),
                           before))
    (command, command_stops, error), (endpoint, endpoint_stops) = results
    later = [] if scenario.endswith("under") and scenario != "cut under" else [5, 6, 7]
    assert command == endpoint == [payload(n, BIG) for n in played_first + later]
    assert [stop.replace(str(tmp_path / "command"), "") for stop in command_stops] == [
        stop.replace(str(tmp_path / "endpoint"), "") for stop in endpoint_stops]
    if said is None:
        assert command_stops == []
    else:
        (stop,) = command_stops
        assert said.format(*offsets) in stop
    if scenario == "torn" or said is None:
        assert error is None  # the end of what a writer wrote: no error
    else:
        assert error is not None and error.startswith(command_stops[0])


# -- a directory of thousands of files ------------------------------------------------------------


def many_files(top: Path, count: int) -> None:
    """`count` small capture files; link dev1 only in the last."""
    publishes(top / "seed", range(3))
    (seed,) = capture.capture_files(top / "seed")
    with capture.CaptureWriter(top / "last", fsync=False) as writer:
        writer.open_connection(7, "serial:/dev/ttyACM0", "phyllo", "stream", timestamp_ns=1,
                               link="dev1", stack="minimal")
        writer.message(7, "in", encode(PubSubMessage(TypeCode.BYTES_BUFFER, b"n", b"1")), True,
                       timestamp_ns=2)
    (last,) = capture.capture_files(top / "last")
    (top / "all").mkdir()
    for number in range(1, count):
        shutil.copy(seed, top / "all" / f"wirecapture-20260101T000000-{number:06d}.wpcap")
    shutil.copy(last, top / "all" / f"wirecapture-20260101T000000-{count:06d}.wpcap")


def test_the_files_are_found_a_bounded_number_of_headers_a_breath(tmp_path):
    many_files(tmp_path, 200)
    steps = capture_at(str(tmp_path / "all"))
    breaths = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            found = done.value
            break
        breaths += 1
    assert len(found) == 200 and breaths >= 200 // HEADERS_BEFORE_PAUSE
    cursor = RecordCursor(found)
    assert sum(1 for record in cursor.records(lambda kind, connection: False)
               if record is None) >= 200 // 16 - 1


class Echo(protocol.Protocol):
    def dataReceived(self, data: bytes) -> None:
        self.transport.write(data)


class Pinger(protocol.Protocol):
    """Sends a byte each time the last one comes back: counts the round trips."""

    trips = 0

    def connectionMade(self) -> None:
        self.transport.write(b"x")

    def dataReceived(self, data: bytes) -> None:
        self.trips += 1
        self.transport.write(b"x")


@pytest_twisted.ensureDeferred
async def test_a_link_opening_on_thousands_of_files_lets_a_socket_be_served(tmp_path):
    # A replay: link's first connect read every header of the directory and searched it for
    # the link at once, on the reactor: 5,000 files held it about half a second, every other
    # connection of the broker waiting.
    from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint

    many_files(tmp_path, 5000)
    server = await wait_for(TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
        protocol.Factory.forProtocol(Echo)))
    try:
        pinger = await wait_for(TCP4ClientEndpoint(
            reactor, "127.0.0.1", server.getHost().port).connect(
                protocol.Factory.forProtocol(Pinger)))
        endpoint = replay_endpoint(reactor, f"replay:path={tmp_path / 'all'}:link=dev1")
        before = pinger.trips
        connecting = endpoint.connect(protocol.Factory.forProtocol(protocol.Protocol))
        assert not connecting.called
        await wait_for(connecting, timeout=60)
        assert pinger.trips - before >= 10  # served while the replay opened
        await wait_for(endpoint.when_finished(), timeout=60)
        assert endpoint.stats.messages == 1
        endpoint.carrier.loseConnection()
        pinger.transport.loseConnection()
    finally:
        await wait_for(server.stopListening())


@pytest_twisted.ensureDeferred
async def test_stopping_a_link_while_it_opens_stops_the_search(tmp_path):
    many_files(tmp_path, 300)
    endpoint = replay_endpoint(reactor, f"replay:path={tmp_path / 'all'}:link=dev1")
    connecting = endpoint.connect(protocol.Factory.forProtocol(protocol.Protocol))
    again = endpoint.connect(protocol.Factory.forProtocol(protocol.Protocol))
    with pytest.raises(Exception, match="is opening on another carrier"):
        await wait_for(again)
    connecting.cancel()
    with pytest.raises(defer.CancelledError):
        await wait_for(connecting)
    assert endpoint.selection is None and endpoint._opening is None
    mine = [call for call in reactor.getDelayedCalls()
            if getattr(call.func, "__qualname__", "").startswith("in_turns")]
    assert mine == []
    # Opened again later, it searches afresh and plays.
    await wait_for(endpoint.connect(protocol.Factory.forProtocol(protocol.Protocol)), 60)
    assert endpoint.selection is not None and endpoint.selection.link == "dev1"
    endpoint.carrier.loseConnection()


def test_a_directory_refused_is_refused_alike(tmp_path):
    publishes(tmp_path, range(2))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "wirecapture-29991231T235959-000009.wpcap").write_bytes(b"not one\n")
    with pytest.raises(CaptureRefused, match="000009.wpcap: not a capture file"):
        to_the_end(capture_at(str(tmp_path)))
    with pytest.raises(ToolError, match="000009.wpcap: not a capture file"):
        capture_paths([str(tmp_path)])
    with pytest.raises(Exception, match="000009.wpcap: not a capture file"):
        replay_endpoint(reactor, f"replay:path={tmp_path}:connection=1").prepare()
    # A file a writer has just begun (its header not whole yet) is left out by both.
    (tmp_path / "sub" / "wirecapture-29991231T235959-000009.wpcap").write_bytes(b"WPC")
    assert len(capture_paths([str(tmp_path)])) == 1
    assert replay_endpoint(reactor, f"replay:path={tmp_path}:connection=1").prepare()


@pytest.mark.parametrize("change", ["replaced", "cut"])
def test_a_file_changed_while_the_carrier_was_closed_ends_there_on_reopening(tmp_path, change):
    # The carrier closed mid-file (an attached protocol closes it on bad input) and opened
    # again goes on at the offset it had: in another file put in that one's place, or past the
    # end of one cut short, it read whatever lay there as records.
    first, _ = two_files(tmp_path)
    clock, endpoint, received, collect = collecting(tmp_path)
    logged: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(logged.append)
    try:
        endpoint.prepare()
        connected = endpoint.connect(collect)
        clock.advance(0)
        clock.advance(1)
        assert len(frames(received)) == 2
        connected.result.transport.loseConnection()
        clock.advance(0)
        if change == "replaced":
            first.unlink()
            publishes(tmp_path / "elsewhere", range(100, 105), size=BIG).rename(first)
        else:
            os.truncate(first, in_offsets(first)[1])
        endpoint.connect(collect)
        for _ in range(10):
            clock.advance(1)
        assert endpoint.finished
    finally:
        globalLogPublisher.removeObserver(logged.append)
    endpoint.carrier.loseConnection()
    played = [websmq.decode(frame).payload for frame in frames(received)]
    assert played == [payload(n, BIG) for n in (0, 1, 2, 5, 6, 7)]  # the third was read ahead
    (stopped,) = [event["problem"] for event in logged
                  if event.get("event") == "replay_file_stopped"]
    assert ("replaced since the replay began" if change == "replaced" else "cut to") in stopped


@pytest_twisted.ensureDeferred
async def test_a_broker_stopped_while_its_replay_link_opens_leaves_nothing_running(tmp_path):
    from wireproto.config import Config, parse_listen, parse_phyllo
    from wireproto.service import make_service

    many_files(tmp_path, 2000)
    service = make_service(Config(
        listeners=(parse_listen("websmq+ws@tcp:0:interface=127.0.0.1"),),
        phyllo=(parse_phyllo(f"dev1+minimal@replay:path={tmp_path / 'all'}:link=dev1"),)),
        reactor, retry_policy=lambda attempt: 0.05)
    service.startService()
    try:
        await wait_for(service.when_listening())
        opening = [call for call in reactor.getDelayedCalls()
                   if getattr(call.func, "__qualname__", "").startswith("in_turns")]
        assert opening, "the link's replay is searching its capture"
    finally:
        await wait_for(service.stopService(), timeout=10)
    await wait_for(deferLater(reactor, 0.05))
    assert [call for call in reactor.getDelayedCalls()
            if getattr(call.func, "__qualname__", "").startswith("in_turns")] == []


def test_a_file_gone_between_the_listing_and_its_header_is_left_out(tmp_path):
    # A capture directory whose shipper uploads and removes closed files: one removed while
    # the headers were being read refused the whole replay ("No such file or directory").
    many_files(tmp_path, HEADERS_BEFORE_PAUSE + 8)
    steps = capture_at(str(tmp_path / "all"))
    next(steps)  # listed, and a breath in the headers
    gone = tmp_path / "all" / f"wirecapture-20260101T000000-{HEADERS_BEFORE_PAUSE + 4:06d}.wpcap"
    gone.unlink()
    found = to_the_end(steps)
    assert len(found) == HEADERS_BEFORE_PAUSE + 7 and gone not in found


def test_a_directory_gone_while_the_capture_is_listed_is_left_out(tmp_path):
    from wireproto.capture.walk import NAMES_BEFORE_PAUSE

    kept = publishes(tmp_path, range(2))
    for name in ("d1", "d2"):
        (tmp_path / name).mkdir()
        for number in range(NAMES_BEFORE_PAUSE + 10):
            (tmp_path / name / f"notes-{number}").touch()
    steps = capture_at(str(tmp_path))
    next(steps)  # inside d1 or d2, the other listed and waiting
    for name in ("d1", "d2"):
        shutil.rmtree(tmp_path / name)
    assert to_the_end(steps) == [kept]
