"""Capture turned on in a real broker (issue 9, item 1): WEBSMQ over ws and length32 and a UBRE
request, each message found in the capture files with its connection, peer and raw bytes; the
`[capture]` table and `wireproto serve --capture DIR`; and nothing wrapped when capture is off."""

from __future__ import annotations

import re
import signal
import stat
import struct
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import clientFromString, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.internet.task import deferLater

from tests.brokers import LOCAL, start_service
from tests.support import eventually, wait_for
from tests.test_cli import Child
from wireproto import capture
from wireproto.capture.wrapper import CapturingProtocol, CapturingTransport
from wireproto.codecs import ubre, websmq
from wireproto.config import (
    CaptureSettings,
    Config,
    ConfigError,
    UbreSettings,
    build_config,
    config_from_toml,
    parse_listen,
)
from wireproto.hub import describe_address
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.websmq.client import connect as websmq_connect
from wireproto.service import WireprotoService

# Capture records every message in and out, in order, on either fast path.
pytestmark = pytest.mark.usefixtures("fast_path")

TOPIC = "room/temp"
COUNT = 7


def records_in(directory: Path) -> list[capture.Record]:
    files = capture.capture_files(directory)
    assert files, f"no capture files in {directory}"
    return [record for path in files for record in capture.iter_records(path)]


def by_connection(records: list[capture.Record]) -> dict[int, list[capture.Record]]:
    connections: dict[int, list[capture.Record]] = {}
    for record in records:
        connections.setdefault(record.connection, []).append(record)
    return connections


async def start(config: Config) -> tuple[WireprotoService, list[str]]:
    service, bound = await start_service(config)
    return service, [entry.address for entry in bound]


async def drive_capturing_broker(directory: Path, topic: str, payloads: list[bytes],
                                 additions: list[tuple[int, int]]) -> dict[str, str]:
    """A broker capturing into `directory` with WEBSMQ over ws and length32 and UBRE over ws:
    a ws subscriber of `topic`, a length32 publisher of `payloads` on it, and a UBRE client
    asking "add" for each of `additions`; then everything stops. Returns each client's
    address as the broker saw it."""
    config = Config(
        listeners=tuple(parse_listen(spec) for spec in (
            f"websmq+ws@tcp:0:{LOCAL}", f"websmq+length32@tcp:0:{LOCAL}", f"ubre+ws@tcp:0:{LOCAL}",
        )),
        ubre=UbreSettings(announce_topics=False),  # no announcements: exact counts
        capture=CaptureSettings(directory=str(directory), flush_interval=0.05),
    )
    service, (ws, tcp, ubre_url) = await start(config)
    clients: list[Any] = []
    try:
        service.server("ubre").handle("add", lambda body, peer: body["a"] + body["b"])
        subscriber = await wait_for(websmq_connect(reactor, ws))
        clients.append(subscriber)
        publisher = await wait_for(websmq_connect(reactor, tcp))
        clients.append(publisher)
        rpc = await wait_for(ubre_connect(reactor, ubre_url))
        peers = {
            "subscriber": describe_address(subscriber.transport.getHost()),
            "publisher": describe_address(publisher.transport.getHost()),
            "rpc": describe_address(rpc.protocol.transport.getHost()),
        }
        inbox: list[websmq.Publish] = []
        subscriber.subscribe(topic, inbox.append)
        await eventually(lambda: service.hub.subscribers(topic))
        for payload in payloads:
            publisher.publish(topic, payload)
        await eventually(lambda: len(inbox) == len(payloads))
        for a, b in additions:
            assert await wait_for(rpc.request("add", {"a": a, "b": b})) == a + b

        # While it runs, every connection's protocol sits on a capturing transport.
        assert all(isinstance(protocol.transport, CapturingTransport)
                   for protocol in service.connections.open)
        await wait_for(rpc.close())
    finally:
        for client in clients:
            await wait_for(client.disconnect())
        await wait_for(service.stopService(), timeout=10)
    return peers


@pytest_twisted.ensureDeferred
async def test_every_message_of_a_broker_is_in_its_capture(tmp_path: Path) -> None:
    directory = tmp_path / "captures" / "broker"  # made by the service
    peers = await drive_capturing_broker(
        directory, TOPIC, [b"reading %d" % number for number in range(COUNT)], [(2, 3)])

    connections = by_connection(records_in(directory))
    assert len(connections) == 3
    opened = {}
    for conn_id, records in connections.items():
        kinds = [record.kind for record in records]
        assert kinds[0] == capture.Kind.OPEN and kinds[-1] == capture.Kind.CLOSE, kinds
        assert kinds.count(capture.Kind.OPEN) == kinds.count(capture.Kind.CLOSE) == 1
        info = records[0].info()
        opened[(info["protocol"], info["transport"])] = (conn_id, info["peer"], records)
        assert {(record.protocol_name, record.transport_name) for record in records} == {
            (info["protocol"], info["transport"])}
        assert "reason" in records[-1].info()

    assert set(opened) == {("websmq", "ws"), ("websmq", "length32"), ("ubre", "ws")}
    assert opened[("websmq", "ws")][1] == peers["subscriber"]
    assert opened[("websmq", "length32")][1] == peers["publisher"]
    assert opened[("ubre", "ws")][1] == peers["rpc"]
    assert all(peer.startswith("127.0.0.1:") for _, peer, _ in opened.values())

    def messages(key: tuple[str, str], kind: capture.Kind) -> list[bytes]:
        # Messages are recorded in batches: once per reactor turn, a record per direction.
        return [message for record in opened[key][2] if record.kind == kind
                for message in record.messages()]

    batches = [record for _, _, records in opened.values() for record in records
               if record.kind in (capture.Kind.IN, capture.Kind.OUT)]
    assert all(record.flags & capture.FLAG_BATCH for record in batches)
    counts = {key: Counter({kind.name: len(messages(key, kind)) for kind in capture.Kind})
              for key in opened}
    assert counts[("websmq", "ws")] == {"OPEN": 1, "IN": 1, "OUT": COUNT, "CLOSE": 1}
    assert counts[("websmq", "length32")] == {"OPEN": 1, "IN": COUNT, "OUT": 0, "CLOSE": 1}
    assert counts[("ubre", "ws")] == {"OPEN": 1, "IN": 1, "OUT": 1, "CLOSE": 1}

    expected = [websmq.Publish(TOPIC, b"reading %d" % number) for number in range(COUNT)]
    published = messages(("websmq", "length32"), capture.Kind.IN)
    assert [websmq.decode(data) for data in published] == expected
    assert all(record.binary for record in batches if record.transport_name == "length32")
    delivered = messages(("websmq", "ws"), capture.Kind.OUT)  # fan-out: prepared frames
    assert [websmq.decode(data) for data in delivered] == expected
    (subscribe,) = messages(("websmq", "ws"), capture.Kind.IN)
    assert websmq.decode(subscribe) == websmq.Subscribe(TOPIC)

    (request_record,) = messages(("ubre", "ws"), capture.Kind.IN)
    (reply_record,) = messages(("ubre", "ws"), capture.Kind.OUT)
    request, reply = ubre.decode(request_record), ubre.decode(reply_record)
    assert isinstance(request, ubre.Request) and request.name == "add"
    assert isinstance(reply, ubre.Success) and reply.body == 5
    assert reply.id == request.id


@pytest_twisted.ensureDeferred
async def test_a_length32_stream_is_recorded_in_whole_frames_as_read(tmp_path: Path) -> None:
    """Frames split across reads, several frames in one read, then an oversized frame: every
    frame delivered is recorded once, whole, and nothing after the bad frame."""
    directory = tmp_path / "capture"
    config = Config(
        listeners=(parse_listen(f"websmq+length32@tcp:0:{LOCAL}"),),
        capture=CaptureSettings(directory=str(directory), flush_interval=0.05),
    )
    service, (address,) = await start(config)
    frames = [struct.pack(">I", len(body)) + body for body in (
        websmq.encode(websmq.Publish(TOPIC, b"%d" % number)) for number in range(5))]
    try:
        client = await wait_for(connectProtocol(clientFromString(reactor, address), Protocol()))
        client.transport.write(frames[0][:3])  # a frame split across reads
        await eventually(lambda: len(service.connections.open))
        await deferLater(reactor, 0.05)
        client.transport.write(frames[0][3:] + frames[1] + frames[2][:-1])
        await deferLater(reactor, 0.05)
        client.transport.write(frames[2][-1:] + frames[3] + struct.pack(">I", 1 << 30) + frames[4])
        lost = Deferred()
        client.connectionLost = lambda reason: lost.callback(None)
        await wait_for(lost)
    finally:
        await wait_for(service.stopService(), timeout=10)

    (records,) = by_connection(records_in(directory)).values()
    received = [record for record in records if record.kind == capture.Kind.IN]
    assert b"".join(record.data for record in received) == b"".join(frames[:4])
    assert [websmq.decode(data) for record in received for data in record.messages()] == [
        websmq.Publish(TOPIC, b"%d" % number) for number in range(4)]
    assert "over the limit" in records[-1].info()["reason"]


@pytest_twisted.ensureDeferred
async def test_without_capture_nothing_is_wrapped_or_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = Config(listeners=(parse_listen(f"websmq+length32@tcp:0:{LOCAL}"),))
    assert config.capture.directory == ""
    service, (tcp,) = await start(config)
    try:
        assert service.capture is None
        client = await wait_for(websmq_connect(reactor, tcp))
        inbox: list[Any] = []
        client.subscribe(TOPIC, inbox.append)
        await eventually(lambda: service.hub.subscribers(TOPIC))
        (protocol,) = list(service.connections.open)
        assert not isinstance(protocol, CapturingProtocol)
        assert not isinstance(protocol.transport, CapturingTransport)
        await wait_for(client.disconnect())
    finally:
        await wait_for(service.stopService(), timeout=10)
    assert list(tmp_path.rglob("*")) == []


def test_the_capture_table_and_the_option() -> None:
    config = config_from_toml(
        '[capture]\ndirectory = "/var/lib/wireproto/capture"\nmax_file_bytes = 67108864\n'
        "flush_interval = 2\n", reactor=reactor,
    )
    assert config.capture == CaptureSettings("/var/lib/wireproto/capture", 64 << 20, 2.0)
    assert Config().capture == CaptureSettings("", 128 << 20, 0.5, 0o600)
    for text, message in [
        ("[capture]\nmax_file_bytes = 1048576",
         "capture.max_file_bytes: must be 67108864 to 268435456 bytes (64 to 256 MiB), "
         "not 1048576"),
        ("[capture]\ndirectory = 1", "capture.directory: expected a string, got 1"),
        ("[capture]\nflush_interval = 0", "capture.flush_interval: must be positive, not 0"),
        ("[capture]\ndir = 'x'", "capture.dir: unknown key; use directory, max_file_bytes, "
                                 "flush_interval, file_mode, node, upload, "
                                 "upload_endpoint or upload_region (did you mean "
                                 "'directory'?)"),
    ]:
        with pytest.raises(ConfigError, match=f"^<toml>: {re.escape(message)}$"):
            config_from_toml(f"[[listen]]\nprotocol='websmq'\ntransport='ws'\n"
                             f"endpoint='tcp:0'\n{text}\n", reactor=reactor)
    assert build_config(capture="caps", reactor=reactor).capture.directory == "caps"
    with pytest.raises(ConfigError, match="^--capture: "):
        build_config(capture="", reactor=reactor)


READY = re.compile(r"^wireproto: ready; Ctrl-C stops$")
LISTENER = re.compile(r"^wireproto: websmq over length32 on (\S+)$")


@pytest_twisted.ensureDeferred
async def test_serve_capture_writes_the_records(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    child = Child(sys.executable, "-m", "wireproto", "serve", "--listen",
                  f"websmq+length32@tcp:0:{LOCAL}", "--capture", str(directory))
    try:
        await child.line(READY)
        address = (await child.line(LISTENER))[1]
        subscriber = await wait_for(websmq_connect(reactor, address))
        publisher = await wait_for(websmq_connect(reactor, address))
        inbox: list[websmq.Publish] = []
        subscriber.subscribe(TOPIC, inbox.append)
        # WEBSMQ has no ack: publish until one arrives, so the subscription is in place.
        await eventually(lambda: (publisher.publish(TOPIC, b"first"), inbox)[1])
        for number in range(3):
            publisher.publish(TOPIC, b"%d" % number)
        await eventually(lambda: inbox[-1:] == [websmq.Publish(TOPIC, b"2")])
        await wait_for(subscriber.disconnect())
        await wait_for(publisher.disconnect())
        child.process.send_signal(signal.SIGINT)
        assert await child.exit_code() == 0, child.output()
    finally:
        child.kill()

    connections = by_connection(records_in(directory))
    assert len(connections) == 2
    tails = {}
    for records in connections.values():
        assert records[0].kind == capture.Kind.OPEN and records[-1].kind == capture.Kind.CLOSE
        assert records[0].info()["transport"] == "length32"
        ins = [websmq.decode(data) for r in records if r.kind == capture.Kind.IN
               for data in r.messages()]
        outs = [websmq.decode(data) for r in records if r.kind == capture.Kind.OUT
                for data in r.messages()]
        tails["subscriber" if outs else "publisher"] = (ins, outs)
    assert tails["subscriber"][0] == [websmq.Subscribe(TOPIC)]
    assert tails["subscriber"][1] == inbox
    numbered = [websmq.Publish(TOPIC, b"%d" % number) for number in range(3)]
    assert tails["publisher"][0][-3:] == numbered
    assert tails["publisher"][1] == []


def test_capture_files_and_their_directory_are_the_owners_alone(tmp_path: Path) -> None:
    # Captured payloads were readable by every local user (0644).
    from wireproto.capture.wrapper import BrokerCapture

    directory = tmp_path / "made" / "here"
    for mode in (None, 0o640):
        options = {} if mode is None else {"file_mode": mode}
        broker = BrokerCapture(directory / oct(mode or 0), reactor=reactor, **options)
        broker.start()
        broker.writer.open_connection(1, "127.0.0.1:1", "websmq", "ws")
        broker.writer.close()
        (path,) = (directory / oct(mode or 0)).iterdir()
        assert stat.S_IMODE(path.stat().st_mode) == (mode or 0o600)
    assert stat.S_IMODE((directory / "0o0").stat().st_mode) == 0o700


@pytest_twisted.ensureDeferred
async def test_a_message_the_transport_refuses_is_not_captured(tmp_path: Path) -> None:
    from wireproto.errors import FrameTooLarge
    from wireproto.transports.websocket import WebSocketOptions

    config = Config(
        listeners=(parse_listen(f"websmq+ws@tcp:0:{LOCAL}"),),
        websocket=WebSocketOptions(max_message_size=100),
        capture=CaptureSettings(directory=str(tmp_path), flush_interval=0.05),
    )
    service, (address,) = await start(config)
    try:
        client = await wait_for(websmq_connect(reactor, address))
        await eventually(lambda: service.connections.open)
        (protocol,) = list(service.connections.open)
        with pytest.raises(FrameTooLarge):
            protocol.transport.sendMessage(websmq.encode_publish("t", b"x" * 200), True)
        fits = websmq.encode_publish("t", b"ok")
        protocol.transport.sendMessage(fits, True)
        await wait_for(client.disconnect())
    finally:
        await wait_for(service.stopService(), timeout=10)
    sent = [data for record in records_in(tmp_path) if record.kind == capture.Kind.OUT
            for data in record.messages()]
    assert sent == [fits]


@pytest_twisted.ensureDeferred
async def test_captures_name_their_broker_and_connection_ids_differ_across_a_fleet(
    tmp_path: Path,
) -> None:
    from wireproto.pipeline.rows import broker_of

    first_ids = []
    for name in ("edge-1", "edge-2"):
        config = Config(
            listeners=(parse_listen(f"websmq+length32@tcp:0:{LOCAL}"),),
            capture=CaptureSettings(directory=str(tmp_path / name), flush_interval=0.05,
                                    node=name),
        )
        service, (tcp,) = await start(config)
        try:
            client = await wait_for(websmq_connect(reactor, tcp))
            await wait_for(client.disconnect())
        finally:
            await wait_for(service.stopService(), timeout=10)
        (path,) = capture.capture_files(tmp_path / name)
        header = capture.read_header(path)
        assert header.info["broker"] == name and header.info["cluster"] is None
        assert broker_of(header) == name
        (opened, *_) = capture.iter_records(path)
        first_ids.append(opened.connection)
    assert first_ids[0] >> 32 != first_ids[1] >> 32  # each run its own high bits
    assert all(0 < connection < 1 << 63 for connection in first_ids)  # a signed long column
