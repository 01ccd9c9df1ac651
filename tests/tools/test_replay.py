"""``wireproto replay`` (issue 41, item 5): a real session captured by a broker with [capture] on
(WEBSMQ with binary payloads, UBRE, SubbleSocket and nydus clients publishing numbered
messages), replayed by the command into a fresh broker, where a real subscriber gets the same
(topic, payload) sequence a subscriber of the captured broker got; --speed changes the time
taken; Ctrl-C mid-replay; and the errors: no such file, not a capture, nothing to replay, an
unreachable address."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from tests.brokers import start_service
from tests.phyllo.test_bridge import Harness, PtyDevice, document
from tests.support import eventually, wait_for
from tests.tools.served import Processes, one_line
from wireproto import capture
from wireproto.codecs.phyllo import PubSubMessage, TypeCode, encode
from wireproto.config import CaptureSettings, Config, PhylloLink, parse_listen
from wireproto.protocols.nydus import client as nydus_client
from wireproto.protocols.subble import client as subble_client
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.websmq.client import connect as websmq_connect
from wireproto.service import WireprotoService
from wireproto.tools._common import ToolError
from wireproto.tools.replay import CapturedPublishes, Pace, capture_paths

LISTEN = ("websmq+ws@tcp:0:interface=127.0.0.1", "ubre+ws@tcp:0:interface=127.0.0.1",
          "subble+ws@tcp:0:interface=127.0.0.1", "nydus+engineio@tcp:0:interface=127.0.0.1")
TOPICS = ("replay/websmq", "replay/ubre", "replay/subble", "replay/nydus")


async def broker(directory: Path | None = None) -> tuple[WireprotoService, dict[str, str]]:
    """A broker on LISTEN (capturing into `directory`, if given): its ws:// URL by protocol."""
    settings = CaptureSettings(directory=str(directory), flush_interval=0.05) \
        if directory is not None else CaptureSettings()
    service, bound = await start_service(Config(
        listeners=tuple(parse_listen(spec) for spec in LISTEN), capture=settings))
    return service, {bound_listener.listener.protocol: bound_listener.address
                     for bound_listener in bound}


async def watch(url: str) -> tuple[object, list[tuple[str, bytes]]]:
    """A WEBSMQ subscriber to every topic of TOPICS at `url`, and what it receives, in order."""
    received: list[tuple[str, bytes]] = []
    client = await wait_for(websmq_connect(reactor, url))
    for topic in TOPICS:
        client.subscribe(topic, lambda message: received.append((message.topic,
                                                                  bytes(message.payload))))
    # WEBSMQ subscribes have no answer: publish on a topic of its own until one comes back.
    synced: list[bytes] = []
    client.subscribe("replay/sync", lambda message: synced.append(message.payload))
    syncing = await wait_for(websmq_connect(reactor, url))
    try:
        await eventually(lambda: synced or syncing.publish("replay/sync", b"x") and False,
                         interval=0.05)
    finally:
        await wait_for(syncing.disconnect())
    return client, received


async def capture_a_session(directory: Path, rounds: int) -> list[tuple[str, bytes]]:
    """`rounds` numbered publishes on each protocol into a capturing broker; what a WEBSMQ
    subscriber of that broker received."""
    service, urls = await broker(directory)
    watcher, received = await watch(urls["websmq"])
    websmq = await wait_for(websmq_connect(reactor, urls["websmq"]))
    ubre = await wait_for(ubre_connect(reactor, urls["ubre"]))
    subble = await wait_for(subble_client.connect(reactor, urls["subble"], produce=[TOPICS[2]]))
    nydus = await wait_for(nydus_client.connect(reactor, urls["nydus"].removesuffix("/engine.io/")))
    try:
        for number in range(rounds):
            # Binary payloads too: bytes that are not UTF-8 and a NUL.
            await websmq.publish(TOPICS[0], b"\xff\x00binary-%d" % number)
            await deferLater(reactor, 0.002)
            await wait_for(ubre.publish(TOPICS[1], {"n": number, "text": "caf\u00e9"}))
            await deferLater(reactor, 0.002)
            await wait_for(subble.produce(TOPICS[2], {"n": number}, timeout=10))
            await wait_for(nydus.invoke("/_hub/publish", {"path": "/" + TOPICS[3],
                                                          "data": [number, True]}, timeout=10))
        await eventually(lambda: len(received) == 4 * rounds, timeout=15)
    finally:
        for client in (websmq, watcher):
            await wait_for(client.disconnect())
        for other in (ubre, subble, nydus):
            await wait_for(other.close())
        await wait_for(service.stopService(), timeout=10)
    return list(received)


@pytest_twisted.ensureDeferred
async def test_a_replayed_session_reaches_a_subscriber_as_it_was_captured(
        tmp_path: Path, processes: Processes) -> None:
    expected = await capture_a_session(tmp_path / "capture", rounds=5)
    assert len(expected) == 20 and expected[0] == (TOPICS[0], b"\xff\x00binary-0")
    assert (TOPICS[1], b'{"n":0,"text":"caf\xc3\xa9"}') in expected
    assert (TOPICS[3], b"[0,true]") in expected

    for target in ("websmq", "ubre"):
        service, urls = await broker()
        watcher, received = await watch(urls["websmq"])
        try:
            replay = processes.run("replay", str(tmp_path / "capture"), "--to", urls[target],
                                   "--speed", "max", "--json")
            assert await replay.exit_code(timeout=30) == 0, replay.output()
            summary = json.loads(replay.stdout[-1])
            if target == "websmq":
                await eventually(lambda got=received: len(got) == 20, timeout=15)
                assert received == expected
                # And the watcher's syncs, which were real traffic too.
                assert summary["messages"] > 20 and summary["not_carried"] == 0
            else:
                # UBRE carries JSON values: the binary payloads are skipped, and counted.
                carried = [m for m in expected if m[0] != TOPICS[0]]
                await eventually(lambda got=received: len(got) == 15, timeout=15)
                assert received == carried
                assert summary["messages"] > 15 and summary["not_carried"] == 5
        finally:
            await wait_for(watcher.disconnect())
            await wait_for(service.stopService(), timeout=10)


@pytest_twisted.ensureDeferred
async def test_filters_keep_a_protocol_and_a_topic(tmp_path: Path, processes: Processes) -> None:
    expected = await capture_a_session(tmp_path, rounds=3)
    service, urls = await broker()
    watcher, received = await watch(urls["websmq"])
    try:
        replay = processes.run("replay", str(tmp_path), "--to", urls["websmq"], "--speed",
                               "max", "--from-protocol", "subble", "--from-protocol", "nydus",
                               "-t", "replay/nydus")
        assert await replay.exit_code(timeout=30) == 0, replay.output()
        assert replay.stdout == [] and len(replay.stderr) == 1
        assert replay.stderr[0].startswith("wireproto replay: 3 messages in ")
        await eventually(lambda: len(received) == 3, timeout=15)
        assert received == [m for m in expected if m[0] == TOPICS[3]]
    finally:
        await wait_for(watcher.disconnect())
        await wait_for(service.stopService(), timeout=10)


def write_capture(path: Path, gaps: list[float], topic: str = "paced/t") -> None:
    """A capture of one WEBSMQ client publishing on `topic`, a message after each gap."""
    from wireproto.codecs import websmq

    now = time.time_ns()
    with capture.CaptureWriter(path, max_file_bytes=capture.MIN_FILE_BYTES, fsync=False,
                               clock=lambda: now) as writer:
        writer.open_connection(1, "127.0.0.1:1", "websmq", "ws", timestamp_ns=now)
        for number, gap in enumerate(gaps):
            now += int(gap * 1e9)
            writer.message(1, "in", websmq.encode(websmq.Publish(topic, b"%d" % number)),
                           True, now)


@pytest_twisted.ensureDeferred
async def test_speed_changes_the_time_taken(tmp_path: Path, processes: Processes) -> None:
    write_capture(tmp_path, [0.0] + [0.1] * 20)  # 2 s recorded
    service, urls = await broker()
    try:
        took = {}
        for speed in ("1", "4", "max"):
            started = time.monotonic()
            replay = processes.run("replay", str(tmp_path), "--to", urls["websmq"],
                                   "--speed", speed, "--json")
            assert await replay.exit_code(timeout=30) == 0, replay.output()
            took[speed] = json.loads(replay.stdout[-1])["seconds"]
            assert json.loads(replay.stdout[-1])["recorded_seconds"] == pytest.approx(2.0)
            assert time.monotonic() - started >= took[speed]
        # Loosely: the exact pace is bench/replay.py's.
        assert 1.8 <= took["1"] <= 4.0
        assert 0.4 <= took["4"] <= 1.5
        assert took["max"] < 0.4
        # --max-gap cuts a quiet hour short: here 3 s to 0.2 s.
        write_capture(tmp_path / "quiet", [0.0, 0.1, 3.0, 0.1])
        replay = processes.run("replay", str(tmp_path / "quiet"), "--to", urls["websmq"],
                               "--max-gap", "0.2", "--json")
        assert await replay.exit_code(timeout=30) == 0, replay.output()
        summary = json.loads(replay.stdout[-1])
        assert summary["recorded_seconds"] == pytest.approx(0.4)
        assert 0.35 <= summary["seconds"] <= 1.5
    finally:
        await wait_for(service.stopService(), timeout=10)


@pytest_twisted.ensureDeferred
async def test_ctrl_c_mid_replay_exits_130_without_a_traceback(
        tmp_path: Path, processes: Processes) -> None:
    write_capture(tmp_path, [0.0] + [0.05] * 400)  # 20 s recorded
    service, urls = await broker()
    watcher, received = await watch(urls["websmq"])
    try:
        watcher.subscribe("paced/t", lambda message: received.append(
            (message.topic, bytes(message.payload))))
        await deferLater(reactor, 0.2)
        replay = processes.run("replay", str(tmp_path), "--to", urls["websmq"])
        await eventually(lambda: len(received) >= 5, timeout=15)
        replay.process.send_signal(signal.SIGINT)
        assert await replay.exit_code(timeout=15) == 130, replay.output()
        assert replay.stdout == [] and replay.stderr == []
        assert len(received) < 400
    finally:
        await wait_for(watcher.disconnect())
        await wait_for(service.stopService(), timeout=10)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest_twisted.ensureDeferred
async def test_errors_are_one_line_and_a_status(tmp_path: Path, processes: Processes) -> None:
    url = "ws://127.0.0.1:1/websmq"
    missing = processes.run("replay", str(tmp_path / "nothing.wpcap"), "--to", url)
    assert "nothing.wpcap: no such file or directory" in await one_line(missing, 2)

    other = tmp_path / "notes.wpcap"
    other.write_bytes(b"these are someone's notes\n")
    line = await one_line(processes.run("replay", str(other), "--to", url), 2)
    assert "not a capture file" in line and "notes.wpcap" in line

    empty = tmp_path / "empty"
    empty.mkdir()
    line = await one_line(processes.run("replay", str(empty), "--to", url), 2)
    assert line.startswith("wireproto replay: nothing to replay: no client publishes")

    # A capture of nothing but subscribes is nothing to replay too.
    from wireproto.codecs import websmq

    quiet = tmp_path / "quiet"
    with capture.CaptureWriter(quiet, fsync=False) as writer:
        writer.open_connection(1, "127.0.0.1:1", "websmq", "ws")
        writer.message(1, "in", websmq.encode(websmq.Subscribe("a/b")), True)
    line = await one_line(processes.run("replay", str(quiet), "--to", url), 2)
    assert "nothing to replay" in line and "2 records" in line

    paced = tmp_path / "paced"
    write_capture(paced, [0.0, 0.01])
    line = await one_line(processes.run(
        "replay", str(paced), "--to", f"ws://127.0.0.1:{free_port()}/websmq"), 3)
    assert line.startswith("wireproto replay: cannot reach ws://127.0.0.1:")

    line = await one_line(processes.run("replay", str(paced), "--to", url, "--speed", "0"), 2)
    assert "--speed" in line


# -- a Phyllo device's messages ------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_captured_devices_messages_are_what_its_bridge_published(tmp_path: Path) -> None:
    harness, device = Harness(), PtyDevice(tmp_path / "ttyUSB-dev1")
    try:
        await a_device_captured(harness, device, tmp_path)
    finally:
        await harness.close()
        if device.master is not None:
            device.unplug()


async def a_device_captured(harness: Harness, device: PtyDevice, tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    # A prefix of its own: the open record names it, and the replay puts the messages there.
    address = await harness.start(
        PhylloLink("dev1", device.endpoint, "reduced", "lab/dev1", "msgpack"),
        capture=CaptureSettings(directory=str(directory), flush_interval=0.05))
    bridge = harness.service.phyllo["dev1"]
    await eventually(lambda: bridge.top is not None)
    browser = await harness.browser(address)
    temps = await harness.subscribed(browser, "lab/dev1/temp")
    device.send(document("temp", {"celsius": 21.5}))
    device.send(document("temp", b"\x00\xff"))
    device.send(PubSubMessage(TypeCode.BYTES_BUFFER, b"temp", b"\x00raw"))
    await eventually(lambda: len(temps) == 3)
    await harness.close()

    replayed = list(CapturedPublishes(capture_paths([str(directory)])))
    assert [message.payload for message in replayed] == [bytes(m.payload) for m in temps]
    assert [message.payload for message in replayed] == [b'{"celsius":21.5}', b"\x00\xff",
                                                         b"\x00raw"]
    assert {message.protocol for message in replayed} == {"phyllo"}
    assert {message.topic for message in replayed} == {"lab/dev1/temp"}


def test_a_phyllo_link_s_messages_go_under_the_prefix_its_open_record_names(
        tmp_path: Path) -> None:
    message = encode(PubSubMessage(TypeCode.BYTES_BUFFER, b"temp", b"21.5"))
    with capture.CaptureWriter(tmp_path, fsync=False) as writer:
        for connection, info in ((1, {"link": "dev1", "stack": "reduced"}),
                                 (2, {"link": "dev2", "prefix": "lab/dev2/"}), (3, {}),
                                 # What no link's prefix can be: ignored.
                                 (4, {"prefix": "lab/#"}), (5, {"link": "x" * 1000})):
            writer.open_connection(connection, "/dev/ttyACM0", "phyllo", "stream", **info)
            writer.message(connection, "in", message, True)
            # Topics the bridge did not publish on: not UTF-8, a wildcard in them.
            for topic in (b"\xfftemp", b"a+b", b"t#"):
                writer.message(connection, "in", encode(PubSubMessage(
                    TypeCode.BYTES_BUFFER, topic, b"x")), True)
            writer.message(connection, "out", message, True)  # to the device: not replayed
        writer.close_connection(1)
    replayed = list(CapturedPublishes(capture_paths([str(tmp_path)])))
    assert [(m.topic, m.payload) for m in replayed] == [
        ("phyllo/dev1/temp", b"21.5"), ("lab/dev2/temp", b"21.5"), ("phyllo/temp", b"21.5"),
        ("phyllo/temp", b"21.5"), ("phyllo/temp", b"21.5")]


def test_a_mounted_connection_s_publishes_go_under_the_prefix_its_open_record_names(
        tmp_path: Path) -> None:
    from wireproto.codecs import websmq

    publish = websmq.encode_publish("temp", b"21.5")
    with capture.CaptureWriter(tmp_path, fsync=False) as writer:
        for connection, info in ((1, {"link": "meters.M1", "prefix": "meters/M1"}), (2, {}),
                                 # What no mount can be: ignored, the topic kept as it came.
                                 (3, {"prefix": "lab/#"}), (4, {"prefix": "$SYS"}),
                                 (5, {"prefix": ["a"]}), (6, {"prefix": "x" * 1000})):
            writer.open_connection(connection, "serial", "websmq", "stream", **info)
            writer.message(connection, "in", publish, True)
        writer.close_connection(1)
    replayed = list(CapturedPublishes(capture_paths([str(tmp_path)])))
    assert [m.topic for m in replayed] == ["meters/M1/temp"] + ["temp"] * 5


@pytest_twisted.ensureDeferred
async def test_a_torn_last_record_ends_its_file_and_a_file_just_begun_is_skipped(
        tmp_path: Path, processes: Processes) -> None:
    write_capture(tmp_path, [0.0] * 10)
    (written,) = capture.capture_files(tmp_path)
    written.write_bytes(written.read_bytes()[:-5])  # the last record torn
    (tmp_path / "wirecapture-29991231T235959-000009.wpcap").write_bytes(b"WPC")  # just begun
    service, urls = await broker()
    watcher, received = await watch(urls["websmq"])
    try:
        watcher.subscribe("paced/t", lambda message: received.append(
            (message.topic, bytes(message.payload))))
        await deferLater(reactor, 0.2)
        replay = processes.run("replay", str(tmp_path), "--to", urls["websmq"], "--speed", "max")
        assert await replay.exit_code(timeout=30) == 0, replay.output()
        await eventually(lambda: len(received) == 9, timeout=15)
        assert received == [("paced/t", b"%d" % number) for number in range(9)]
    finally:
        await wait_for(watcher.disconnect())
        await wait_for(service.stopService(), timeout=10)


@pytest_twisted.ensureDeferred
async def test_someone_elses_file_among_captures_and_a_corrupt_capture_are_errors(
        tmp_path: Path, processes: Processes) -> None:
    url = "ws://127.0.0.1:1/websmq"
    write_capture(tmp_path / "good", [0.0] * 50)
    (written,) = capture.capture_files(tmp_path / "good")
    named_like_one = tmp_path / "good" / "wirecapture-29991231T235959-000009.wpcap"
    named_like_one.write_bytes(b"#!/bin/sh\necho not a capture\n")
    line = await one_line(processes.run("replay", str(tmp_path / "good"), "--to", url), 2)
    assert "wirecapture-29991231T235959-000009.wpcap" in line and "not a capture file" in line

    # A flipped byte in a message in the middle: corrupt, not torn. The file ends there and the
    # replay goes on with the next (a subdirectory's), as the replay: endpoint does; the exit
    # is 1, naming the damage.
    data = bytearray(written.read_bytes())
    data[list(capture.iter_records(written))[20].offset + capture.HEADER_SIZE + 3] ^= 0xFF
    corrupt = tmp_path / "damaged" / written.name
    corrupt.parent.mkdir()
    corrupt.write_bytes(bytes(data))
    write_capture(tmp_path / "damaged" / "later", [0.0] * 3, topic="paced/later")
    service, urls = await broker()
    watcher, received = await watch(urls["websmq"])
    try:
        for topic in ("paced/t", "paced/later"):
            watcher.subscribe(topic, lambda message: received.append(
                (message.topic, bytes(message.payload))))
        await deferLater(reactor, 0.2)
        replay = processes.run("replay", str(corrupt.parent), "--to", urls["websmq"],
                               "--speed", "max")
        line = await one_line(replay, 1)
        assert f"{corrupt}: record at offset" in line and "corrupt, not torn" in line
        expected = [("paced/t", b"%d" % number) for number in range(19)] + [
            ("paced/later", b"%d" % number) for number in range(3)]
        await eventually(lambda: len(received) == len(expected), timeout=15)
        assert received == expected
    finally:
        await wait_for(watcher.disconnect())
        await wait_for(service.stopService(), timeout=10)


@pytest_twisted.ensureDeferred
async def test_a_fifo_or_a_device_given_as_a_capture_is_refused_at_once(
        tmp_path: Path, processes: Processes) -> None:
    # A FIFO's open blocks until a writer comes: the replay hung, silent, until Ctrl-C.
    fifo = tmp_path / "fifo.wpcap"
    os.mkfifo(fifo)
    started = time.monotonic()
    line = await one_line(processes.run("replay", str(fifo), "--to", "ws://127.0.0.1:1/websmq"),
                          2)
    assert "fifo.wpcap: not a regular file" in line and time.monotonic() - started < 20
    line = await one_line(processes.run("replay", "/dev/zero", "--to",
                                        "ws://127.0.0.1:1/websmq"), 2)
    assert "/dev/zero: not a regular file" in line


@contextlib.contextmanager
def another_user() -> Iterator[None]:
    """This process as another local user for a while (as root: nobody, 65534; else itself,
    whom a mode of 000 keeps out as well)."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(65534)
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def test_captures_another_user_may_not_read_are_one_line_errors_not_nothing() -> None:
    # Another user's capture directory listed as holding no capture files ("nothing to
    # replay"), its subdirectories skipped without a word, and a file of it that could not
    # be read ended the command with a traceback's last line and exit 1.
    top = Path(tempfile.mkdtemp(prefix="wireproto-replay-"))
    try:
        top.chmod(0o755)
        write_capture(top / "theirs", [0.0] * 3)
        (their_file,) = capture.capture_files(top / "theirs")
        write_capture(top / "mixed", [0.0] * 3)
        write_capture(top / "mixed" / "private", [0.0] * 3)
        (top / "mixed").chmod(0o755)
        for path in (*capture.capture_files(top / "mixed"), their_file):
            path.chmod(0o644)
        (top / "theirs").chmod(0)
        (top / "mixed" / "private").chmod(0)
        with another_user():
            for name, problem in ((top / "theirs", "theirs: Permission denied"),
                                  (their_file, "Permission denied"),
                                  (top / "mixed", "private: Permission denied")):
                with pytest.raises(ToolError) as refused:
                    capture_paths([str(name)])
                assert problem in str(refused.value) and refused.value.code == 2, name
    finally:
        for directory in (top / "theirs", top / "mixed" / "private"):
            directory.chmod(0o700)
        shutil.rmtree(top)


def test_the_pace_never_goes_back_starts_another_run_and_cuts_long_gaps() -> None:
    second = 1_000_000_000
    pace = Pace()
    # A batch stamped a little before the one ahead of it plays at once; a step back of more
    # than a second is another run (another broker's file), going on from where it stands.
    assert [pace.offset(at) for at in (10 * second, 11 * second, 11 * second - 5,
                                       12 * second, 2 * second, 3 * second)] == [
        0, second, second, 2 * second, 2 * second, 3 * second]
    cut = Pace(max_gap_ns=second // 2)
    assert [cut.offset(at) for at in (0, 3600 * second, 3600 * second + 10)] == [
        0, second // 2, second // 2 + 10]


@pytest_twisted.ensureDeferred
async def test_the_target_going_away_ends_the_replay_at_once_with_3(
        tmp_path: Path, processes: Processes) -> None:
    write_capture(tmp_path, [0.0] * 5 + [600.0])  # then ten minutes until the next message
    service, urls = await broker()
    watcher, received = await watch(urls["websmq"])
    try:
        watcher.subscribe("paced/t", lambda message: received.append(message.topic))
        await deferLater(reactor, 0.2)
        replay = processes.run("replay", str(tmp_path), "--to", urls["websmq"])
        await eventually(lambda: len(received) == 5, timeout=15)
        await wait_for(watcher.disconnect())
        await wait_for(service.stopService(), timeout=10)
        line = await one_line(replay, 3)  # not ten minutes later
        assert line.startswith("wireproto replay: "), line
        assert "closed" in line, line
    finally:
        if service.running:
            await wait_for(service.stopService(), timeout=10)


@pytest_twisted.ensureDeferred
async def test_a_ubre_binary_format_body_is_replayed_as_its_bytes(tmp_path: Path) -> None:
    service, urls = await broker(tmp_path)
    watcher, received = await watch(urls["websmq"])
    binary = await wait_for(ubre_connect(reactor, urls["ubre"], binary=True))
    try:
        for body in (b"\x00\xff\x01", b"", b'{"not": "parsed"}'):
            await wait_for(binary.publish(TOPICS[1], body))
        await eventually(lambda: len(received) == 3, timeout=15)
    finally:
        await wait_for(binary.close())
        await wait_for(watcher.disconnect())
        await wait_for(service.stopService(), timeout=10)
    replayed = [(m.topic, m.payload) for m in CapturedPublishes(capture_paths([str(tmp_path)]))
                if m.topic == TOPICS[1]]
    assert replayed == received == [(TOPICS[1], b"\x00\xff\x01"), (TOPICS[1], b""),
                                    (TOPICS[1], b'{"not": "parsed"}')]


@pytest_twisted.ensureDeferred
async def test_ctrl_c_while_a_long_capture_is_searched_stops_at_once(
        tmp_path: Path, processes: Processes) -> None:
    from wireproto.codecs import websmq

    subscribe = websmq.encode(websmq.Subscribe("a/b"))
    with capture.CaptureWriter(tmp_path, fsync=False) as writer:
        writer.open_connection(1, "127.0.0.1:1", "websmq", "ws")
        for _ in range(1_000_000):  # no publish: the whole capture is searched, for seconds
            writer.message(1, "in", subscribe, True)
    replay = processes.run("replay", str(tmp_path), "--to", "ws://127.0.0.1:1/websmq")
    await deferLater(reactor, 1.5)
    assert replay.process.poll() is None, replay.output()
    replay.process.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    assert await replay.exit_code(timeout=15) == 130, replay.output()
    assert time.monotonic() - signalled < 1.5
    assert replay.stdout == [] and replay.stderr == []


@pytest_twisted.ensureDeferred
async def test_a_replay_into_a_phyllo_device_sends_what_a_device_topic_can_carry(
        tmp_path: Path, processes: Processes) -> None:
    from wireproto.codecs import websmq

    now = time.time_ns()
    with capture.CaptureWriter(tmp_path / "capture", fsync=False) as writer:
        writer.open_connection(1, "127.0.0.1:1", "websmq", "ws", timestamp_ns=now)
        for number, topic in enumerate(("led", "a/topic/over/15/bytes", "led")):
            writer.message(1, "in", websmq.encode(websmq.Publish(topic, b'{"on":%d}' % number)),
                           True, now + number * 1000)
    device = PtyDevice(tmp_path / "ttyACM-replay")
    try:
        replay = processes.run("replay", str(tmp_path / "capture"), "--to", device.endpoint,
                               "--json")
        assert await replay.exit_code(timeout=30) == 0, replay.output()
        summary = json.loads(replay.stdout[-1])
        assert (summary["messages"], summary["not_carried"]) == (2, 1)
        await eventually(lambda: len(device.poll()) == 2, timeout=10)
        assert [(m.topic, msgpack.unpackb(m.payload[2:])) for m in device.received] == [
            (b"led", {"on": 0}), (b"led", {"on": 2})]
    finally:
        device.unplug()


@pytest_twisted.ensureDeferred
async def test_a_publish_the_broker_refused_on_a_pattern_is_not_replayed(
        tmp_path: Path, processes: Processes) -> None:
    from wireproto.codecs import ubre

    with capture.CaptureWriter(tmp_path, fsync=False) as writer:
        writer.open_connection(1, "127.0.0.1:1", "ubre", "ws")
        for number, topic in enumerate(("paced/+", "paced/t", "paced/#", "paced/t")):
            writer.message(1, "in", ubre.encode(ubre.Publish(topic, number)), False)
    service, urls = await broker()
    watcher, received = await watch(urls["websmq"])
    try:
        watcher.subscribe("paced/t", lambda message: received.append(
            (message.topic, bytes(message.payload))))
        await deferLater(reactor, 0.2)
        # The broker closed the connection of a publish on a pattern: replayed, it would end
        # the replay there.
        replay = processes.run("replay", str(tmp_path), "--to", urls["websmq"], "--json")
        assert await replay.exit_code(timeout=30) == 0, replay.output()
        summary = json.loads(replay.stdout[-1])
        assert (summary["messages"], summary["refused"]) == (2, 2)
        await eventually(lambda: len(received) == 2, timeout=15)
        assert received == [("paced/t", b"1"), ("paced/t", b"3")]
    finally:
        await wait_for(watcher.disconnect())
        await wait_for(service.stopService(), timeout=10)


def test_a_batch_that_does_not_split_is_counted_and_the_rest_replayed(tmp_path: Path) -> None:
    from wireproto.codecs import websmq

    publish = websmq.encode(websmq.Publish("a/b", b"1"))
    with capture.CaptureWriter(tmp_path, fsync=False) as writer:
        writer.open_connection(1, "127.0.0.1:1", "websmq", "ws")
        # A whole record (its CRC right) whose batch claims more than it holds.
        writer.message(1, "in", b"\x00\x00\x01\x00" + publish, True, batch=True)
        writer.message(1, "in", capture.encode_batch([publish, publish]), True, batch=True)
    reading = CapturedPublishes(capture_paths([str(tmp_path)]))
    assert [(m.topic, m.payload) for m in reading] == [("a/b", b"1"), ("a/b", b"1")]
    assert reading.undecodable == 1
