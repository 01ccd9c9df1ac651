"""The hub bridge: a Phyllo link mounted at a prefix, end to end through a real broker.

The device is played on a pty master (behind a symlink, as udev's /dev/serial/by-id names are),
on a TCP server (as ser2net or an ESP32 on Wi-Fi) and on a WebSocket server. Browsers are real
WEBSMQ WebSocket clients.
"""

from __future__ import annotations

import json
import os
import tty
from pathlib import Path
from typing import Any

import msgpack
import pytest
import pytest_twisted
from twisted.internet import protocol, reactor
from twisted.logger import globalLogPublisher

from tests.support import eventually, sleep, wait_for
from wireproto import capture
from wireproto.codecs.phyllo import PubSubMessage, TypeCode, decode
from wireproto.codecs.phyllo.document import (
    Document,
    Format,
    Schema,
    document_from_message,
    message_from_document,
    serialize,
)
from wireproto.codecs.phyllo.stack import MINIMAL, REDUCED, Stack, StackDecoder
from wireproto.config import (
    CaptureSettings,
    Config,
    HubSettings,
    PhylloLink,
    parse_listen,
    parse_phyllo,
)
from wireproto.hub import Hub, HubMessage, Session
from wireproto.phyllo.bridge import HubBridge, device_message, hub_payload
from wireproto.protocols.websmq.client import connect
from wireproto.service import make_service
from wireproto.transports.base import MessageProtocol
from wireproto.transports.websocket_http import websocket_resource, websocket_site

FAST_RETRY = {"retry_policy": lambda attempt: 0.05}


def document(topic: str, value: Any, format: int = Format.MSGPACK) -> PubSubMessage:
    return message_from_document(topic, serialize(value, format, Schema.SCHEMALESS))


class PtyDevice:
    """A device on a pty, reached through a symlink that outlives it: unplug() closes the pty
    and removes the link, plug() makes a new pty behind the same name."""

    def __init__(self, link: Path, stack: Stack = REDUCED) -> None:
        self.link = link
        self.stack = stack
        self.master: int | None = None
        self.slave: int | None = None
        self.decoder = StackDecoder(stack)
        self.received: list[PubSubMessage] = []
        self.plug()

    @property
    def endpoint(self) -> str:
        return f"serial:{self.link}:baudrate=115200"

    def plug(self) -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        os.set_blocking(self.master, False)
        self.decoder = StackDecoder(self.stack)
        self.link.symlink_to(os.ttyname(self.slave))

    def unplug(self) -> None:
        self.link.unlink()
        for fd in (self.master, self.slave):
            if fd is not None:
                os.close(fd)
        self.master = self.slave = None

    def write(self, data: bytes) -> None:
        assert self.master is not None
        os.write(self.master, data)

    def send(self, message: PubSubMessage) -> None:
        self.write(self.stack.encode(message))

    def poll(self) -> list[PubSubMessage]:
        assert self.master is not None
        try:
            while data := os.read(self.master, 65536):
                self.received += self.decoder.feed(data)
        except BlockingIOError:
            pass
        return self.received


@pytest.fixture
def device(tmp_path: Path):
    pty_device = PtyDevice(tmp_path / "ttyUSB-dev1")
    yield pty_device
    if pty_device.master is not None:
        pty_device.unplug()


class Harness:
    """A broker with a WEBSMQ WebSocket listener and Phyllo links; stops everything at the end."""

    def __init__(self) -> None:
        self.service: Any = None
        self.clients: list[Any] = []

    async def start(self, *links: PhylloLink, **config: Any) -> str:
        settings = Config(
            listeners=(parse_listen("websmq+ws@tcp:0:interface=127.0.0.1"),), phyllo=links,
            **config,
        )
        self.service = make_service(settings, reactor, **FAST_RETRY)
        self.service.startService()
        (bound,) = await wait_for(self.service.when_listening())
        return bound.address

    async def browser(self, address: str) -> Any:
        client = await wait_for(connect(reactor, address))
        self.clients.append(client)
        return client

    async def subscribed(self, client: Any, topic: str) -> list[Any]:
        inbox: list[Any] = []
        await client.subscribe(topic, inbox.append)
        hub = self.service.hub
        # The bridge's own PREFIX/# subscription matches too: wait for the browser's session.
        await eventually(lambda: any(isinstance(s, Session) for s in hub.subscribers(topic)))
        return inbox

    async def close(self) -> None:
        for client in self.clients:
            await wait_for(client.disconnect(), timeout=10)
        if self.service is not None and self.service.running:
            await wait_for(self.service.stopService(), timeout=10)


@pytest_twisted.async_yield_fixture
async def harness():
    running = Harness()
    try:
        yield running
    finally:
        await running.close()


# -- payload and topic mapping ------------------------------------------------------------------


@pytest.mark.parametrize(("message", "payload"), [
    (document("t", {"c": 21.5}), b'{"c":21.5}'),
    (document("t", [1, "two", None]), b'[1,"two",null]'),
    (document("t", "text"), b'"text"'),
    (document("t", {"c": 21.5}, Format.JSON), b'{"c":21.5}'),
    (document("t", b"\x00\xff"), b"\x00\xff"),  # a bytes value is those bytes
    # JSON cannot say bytes inside a map: the msgpack body travels.
    (document("t", {"raw": b"\x01"}), msgpack.packb({"raw": b"\x01"})),
    (message_from_document("t", Document(Format.CBOR, Schema.SCHEMALESS, b"\xa1\x61a\x01")),
     b"\xa1\x61a\x01"),
    (PubSubMessage(TypeCode.BYTES_BUFFER, b"t", b"\x00raw"), b"\x00raw"),
])
def test_device_payloads_become_hub_payloads(message: PubSubMessage, payload: bytes) -> None:
    assert hub_payload(message) == payload


@pytest.mark.parametrize(("payload", "value"), [
    (b'{"on":true}', {"on": True}),
    (b"42", 42),
    (b"blink", "blink"),  # UTF-8 that is not JSON: a string
    (b"\xff\x00", b"\xff\x00"),  # not UTF-8: bin
    (b"", None),
])
def test_hub_payloads_become_msgpack_documents(payload: bytes, value: Any) -> None:
    message = device_message(b"led", payload, "msgpack")
    assert message is not None and message.topic == b"led"
    assert message.payload_type == TypeCode.DOCUMENT
    sent = document_from_message(message)
    assert sent.format == Format.MSGPACK
    assert msgpack.unpackb(sent.body) == value


def test_hub_payloads_in_the_json_and_bytes_send_formats() -> None:
    as_json = device_message(b"led", b'{"on": true}', "json")
    assert as_json is not None
    assert document_from_message(as_json) == Document(Format.JSON, Schema.SCHEMALESS,
                                                      b'{"on":true}')
    assert device_message(b"led", b"\xff", "json") is None  # JSON cannot carry non-UTF-8
    assert device_message(b"led", b"\xff", "bytes") == PubSubMessage(
        TypeCode.BYTES_BUFFER, b"led", b"\xff"
    )


def test_a_bridge_refuses_bad_settings() -> None:
    hub = Hub()
    with pytest.raises(ValueError, match="prefix 'phyllo/#'"):
        HubBridge(hub, "dev1", prefix="phyllo/#")
    with pytest.raises(ValueError, match="send_format"):
        HubBridge(hub, "dev1", send_format="cbor")
    with pytest.raises(ValueError, match="standard stack"):
        HubBridge(hub, "dev1", stack="standard")


def test_phyllo_links_in_config() -> None:
    link = parse_phyllo("dev1@serial:/dev/ttyACM0")
    assert link == PhylloLink("dev1", "serial:/dev/ttyACM0", "reduced", "phyllo/dev1", "msgpack",
                              255)
    assert parse_phyllo("esp+minimal@ws://127.0.0.1:9/phyllo").stack == "minimal"
    from wireproto.config import ConfigError, config_from_toml, config_to_toml

    config = config_from_toml(
        '[[phyllo]]\nname = "dev1"\nendpoint = "tcp:127.0.0.1:2000"\nprefix = "lab/dev1"\n'
        'send_format = "json"\n'
        '[[phyllo]]\nname = "dev2"\nendpoint = "serial:/dev/ttyUSB0"\nstack = "minimal"\n'
        'max_chunk_length = 80\n',
        source="lab.toml",
    )
    assert [
        (link.name, link.prefix, link.stack, link.send_format, link.max_chunk_length)
        for link in config.phyllo
    ] == [
        ("dev1", "lab/dev1", "reduced", "json", 255),
        ("dev2", "phyllo/dev2", "minimal", "msgpack", 80),
    ]
    assert config_from_toml(config_to_toml(config)) == config
    for text, error in [
        ('[[phyllo]]\nname = "a/b"\nendpoint = "tcp:h:1"\n', r"lab.toml: phyllo\[1\]\.name: "),
        ('[[phyllo]]\nname = "a"\nendpoint = "tpc:h:1"\n',
         r"phyllo\[1\]\.endpoint: bad client endpoint 'tpc:h:1': Unknown endpoint type"),
        ('[[phyllo]]\nname = "a"\nendpoint = "tcp:h:1"\nstack = "standard"\n',
         r"phyllo\[1\]\.stack: unknown Phyllo stack 'standard'"),
        ('[[phyllo]]\nname = "a"\nendpoint = "tcp:h:1"\nmax_chunk_length = 8\n',
         r"phyllo\[1\]\.max_chunk_length: must be 16 to 255 bytes, not 8"),
        ('[[phyllo]]\nname = "a"\nendpoint = "tcp:h:1"\nmax_chunk_length = "80"\n',
         r"phyllo\[1\]\.max_chunk_length: expected an integer"),
        ('[[phyllo]]\nname = "a"\nendpoint = "tcp:h:1"\nspeed = "1"\n',
         r"phyllo\[1\]\.speed: unknown key"),
        ('[[phyllo]]\nname = "a"\nendpoint = "tcp:h:1"\n'
         '[[phyllo]]\nname = "a"\nendpoint = "tcp:h:2"\n', r"phyllo\[2\]\.name: 'a' is already"),
        ('[[phyllo]]\nname = "a"\nendpoint = "tcp:h:1"\n'
         '[[phyllo]]\nname = "b"\nendpoint = "tcp:h:2"\nprefix = "phyllo/a/b"\n',
         r"phyllo\[2\]\.prefix: prefix 'phyllo/a/b' overlaps phyllo\[1\]'s 'phyllo/a'"),
    ]:
        with pytest.raises(ConfigError, match=error):
            config_from_toml(text, source="lab.toml")


# -- end to end over a pty --------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_device_document_reaches_a_websmq_browser_and_back(harness, device) -> None:
    address = await harness.start(parse_phyllo(f"dev1@{device.endpoint}"))
    bridge = harness.service.phyllo["dev1"]
    await eventually(lambda: bridge.top is not None)
    browser = await harness.browser(address)
    temps = await harness.subscribed(browser, "phyllo/dev1/temp")

    device.send(document("temp", {"celsius": 21.5}))
    await eventually(lambda: temps)
    assert temps[0].topic == "phyllo/dev1/temp"
    assert json.loads(temps[0].payload) == {"celsius": 21.5}

    await browser.publish("phyllo/dev1/led", b'{"on":true}')
    (sent,) = await eventually(device.poll)
    assert sent == document("led", {"on": True})
    # The reduced stack's bytes, as NOTES.md lays them out, with a CRC the device checked.
    assert sent.topic == b"led" and msgpack.unpackb(document_from_message(sent).body) == {
        "on": True
    }
    counters = bridge.counters()
    assert counters["to_hub"] == 1 and counters["to_device"] == 1
    assert counters["crc_errors"] == counters["framing_errors"] == 0


@pytest_twisted.ensureDeferred
async def test_a_captured_link_records_its_messages_both_ways(harness, device, tmp_path) -> None:
    directory = tmp_path / "capture"
    address = await harness.start(
        parse_phyllo(f"dev1@{device.endpoint}"),
        capture=CaptureSettings(directory=str(directory), flush_interval=0.05))
    bridge = harness.service.phyllo["dev1"]
    await eventually(lambda: bridge.top is not None)
    browser = await harness.browser(address)
    temps = await harness.subscribed(browser, "phyllo/dev1/temp")
    for reading in (21.5, 22.0, 22.5):
        device.send(document("temp", {"celsius": reading}))
    await eventually(lambda: len(temps) == 3)
    await browser.publish("phyllo/dev1/led", b'{"on":true}')
    await eventually(device.poll)
    await harness.close()

    records = [record for path in capture.capture_files(directory)
               for record in capture.iter_records(path) if record.protocol_name == "phyllo"]
    opened, *messages, closed = records
    assert (opened.kind, closed.kind) == (capture.Kind.OPEN, capture.Kind.CLOSE)
    assert opened.info()["protocol"] == "phyllo" and opened.transport_name == "stream"
    assert {record.connection for record in records} == {opened.connection}
    received = [decode(data) for record in messages if record.kind == capture.Kind.IN
                for data in record.messages()]
    sent = [decode(data) for record in messages if record.kind == capture.Kind.OUT
            for data in record.messages()]
    assert received == [document("temp", {"celsius": reading}) for reading in (21.5, 22.0, 22.5)]
    assert sent == [document("led", {"on": True})]


@pytest_twisted.ensureDeferred
async def test_a_captured_link_records_what_was_sent_not_what_its_frames_refused(
    harness, device, tmp_path
) -> None:
    """The link is captured through the same wrapper as every connection; a message the stack
    refuses (too large for a frame) never went out, so it is not in the capture."""
    directory = tmp_path / "capture"
    address = await harness.start(
        parse_phyllo(f"dev1@{device.endpoint}"),
        capture=CaptureSettings(directory=str(directory), flush_interval=0.05))
    bridge = harness.service.phyllo["dev1"]
    await eventually(lambda: bridge.top is not None)
    browser = await harness.browser(address)
    await browser.publish("phyllo/dev1/blob", b'"' + b"x" * 400 + b'"')  # over 253 bytes
    await browser.publish("phyllo/dev1/led", b"1")
    (sent,) = await eventually(device.poll)
    assert bridge.stats.unsendable == 1
    await harness.close()

    records = [record for path in capture.capture_files(directory)
               for record in capture.iter_records(path) if record.protocol_name == "phyllo"]
    out = [decode(data) for record in records if record.kind == capture.Kind.OUT
           for data in record.messages()]
    assert out == [sent] == [document("led", 1)]


@pytest_twisted.ensureDeferred
async def test_the_firmware_peer_and_a_websmq_browser_through_the_broker(harness, device):
    """The same, with the device played by the firmware process written from the byte formats."""
    from tests.phyllo.test_firmware import as_value, spawn

    address = await harness.start(parse_phyllo(f"dev1@{device.endpoint}"))
    bridge = harness.service.phyllo["dev1"]
    await eventually(lambda: bridge.top is not None)
    firmware = await spawn(device.master, "reduced")
    try:
        browser = await harness.browser(address)
        temps = await harness.subscribed(browser, "phyllo/dev1/temp")
        firmware.command("document", topic="temp", value={"celsius": 21.5})
        await eventually(lambda: temps)
        assert json.loads(temps[0].payload) == {"celsius": 21.5}

        await browser.publish("phyllo/dev1/led", b"true")
        event = await firmware.next("message")
        assert bytes.fromhex(event["topic"]) == b"led" and as_value(event) is True
    finally:
        await firmware.stop()


@pytest_twisted.ensureDeferred
async def test_the_bridge_never_echoes_and_maps_only_its_prefix(harness, device) -> None:
    address = await harness.start(
        PhylloLink("dev1", device.endpoint, "minimal", "lab/dev1", "bytes")
    )
    device.stack = MINIMAL
    device.decoder = StackDecoder(MINIMAL)
    bridge = harness.service.phyllo["dev1"]
    await eventually(lambda: bridge.top is not None)
    browser = await harness.browser(address)
    everything = await harness.subscribed(browser, "lab/dev1/echo")
    await browser.publish("lab/dev1/echo", b"from browser")
    await browser.publish("lab/dev2/echo", b"not ours")
    await browser.publish("lab/dev1", b"the prefix itself")
    (sent,) = await eventually(device.poll)
    assert sent == PubSubMessage(TypeCode.BYTES_BUFFER, b"echo", b"from browser")

    # The device answers on the same topic: the browser gets it, the device does not.
    device.send(PubSubMessage(TypeCode.BYTES_BUFFER, b"echo", b"from device"))
    await eventually(lambda: everything)
    assert [message.payload for message in everything] == [b"from device"]
    device.send(PubSubMessage(TypeCode.BYTES_BUFFER, b"bad+topic", b"x"))
    device.send(PubSubMessage(TypeCode.BYTES_BUFFER, b"\xff\xfe", b"x"))
    await eventually(lambda: bridge.counters()["unmapped"] == 3)
    await sleep(0.1)
    assert device.poll() == [sent]


@pytest_twisted.ensureDeferred
async def test_line_noise_is_counted_and_the_link_carries_on(harness, device) -> None:
    address = await harness.start(parse_phyllo(f"dev1@{device.endpoint}"))
    bridge = harness.service.phyllo["dev1"]
    await eventually(lambda: bridge.top is not None)
    browser = await harness.browser(address)
    temps = await harness.subscribed(browser, "phyllo/dev1/temp")

    good = REDUCED.encode(document("temp", 20))
    corrupt = bytearray(good)
    corrupt[8] ^= 0x40  # inside the CRC-covered part
    device.write(bytes(corrupt))
    device.write(b"\x00\x03garbage\x00")  # bad COBS
    device.write(b"\x00" + b"\x01" * 300 + b"\x00")  # an over-long chunk
    device.write(good)
    await eventually(lambda: temps)
    assert [json.loads(message.payload) for message in temps] == [20]
    counters = bridge.counters()
    assert counters["crc_errors"] == 1
    assert counters["framing_errors"] == 2
    assert counters["to_hub"] == 1


@pytest_twisted.ensureDeferred
async def test_a_device_that_disappears_is_reopened_with_backoff(harness, device) -> None:
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        address = await harness.start(parse_phyllo(f"dev1@{device.endpoint}"))
        bridge = harness.service.phyllo["dev1"]
        await eventually(lambda: bridge.top is not None)
        browser = await harness.browser(address)
        temps = await harness.subscribed(browser, "phyllo/dev1/temp")
        device.send(document("temp", 1))
        await eventually(lambda: len(temps) == 1)

        device.unplug()  # as when the USB cable is pulled: the port closes, the node goes away
        await eventually(lambda: bridge.top is None)
        await browser.publish("phyllo/dev1/led", b"1")  # nobody there: counted, not queued
        await eventually(lambda: bridge.stats.offline == 1)
        def failures() -> list[dict]:
            return [e for e in events if "cannot open" in e.get("log_format", "")]

        await eventually(lambda: len(failures()) >= 2, timeout=10)
        assert failures()[0]["endpoint"] == device.endpoint
        assert failures()[0]["log_level"].name == "warn"  # loud once, then quiet while away
        assert failures()[1]["log_level"].name == "info"
        retries = [e for e in events if "Scheduling retry" in e.get("log_format", "")]
        assert len(retries) >= 2

        device.plug()
        await eventually(lambda: bridge.top is not None, timeout=10)
        device.send(document("temp", 2))
        await eventually(lambda: len(temps) == 2)
        assert [json.loads(message.payload) for message in temps] == [1, 2]
        await browser.publish("phyllo/dev1/led", b"2")
        (sent,) = await eventually(device.poll)
        assert sent == document("led", 2)
        assert bridge.stats.connections == 2
        assert harness.service.running
    finally:
        globalLogPublisher.removeObserver(events.append)


@pytest_twisted.ensureDeferred
async def test_a_full_line_keeps_the_newest_messages(harness, device) -> None:
    await harness.start(
        parse_phyllo(f"dev1@{device.endpoint}"), hub=HubSettings(queue_bytes=100),
    )
    bridge = harness.service.phyllo["dev1"]
    await eventually(lambda: bridge.top is not None)
    bridge.pauseProducing()  # as the serial port does when its buffer is full
    for number in range(20):
        payload = json.dumps({"n": number, "pad": "x" * 20}).encode()
        harness.service.hub.publish(HubMessage("phyllo/dev1/n", payload))
    assert bridge.stats.dropped > 0
    assert device.poll() == []
    bridge.resumeProducing()
    await eventually(lambda: len(device.poll()) == 20 - bridge.stats.dropped)
    values = [msgpack.unpackb(document_from_message(m).body)["n"] for m in device.poll()]
    assert values == list(range(bridge.stats.dropped, 20))


# -- other carriers -----------------------------------------------------------------------------


class StreamDevice(protocol.Protocol):
    """A device behind a TCP port (ser2net, an ESP32): reduced-stack bytes on a stream."""

    def connectionMade(self) -> None:
        self.factory.devices.append(self)
        self.decoder = StackDecoder(REDUCED)
        self.received: list[PubSubMessage] = []

    def dataReceived(self, data: bytes) -> None:
        self.received += self.decoder.feed(data)


class WebSocketDevice(MessageProtocol):
    """A device serving WebSocket: one binary message is one chunk."""

    devices: list[WebSocketDevice] = []

    def connectionMade(self) -> None:
        self.received: list[PubSubMessage] = []
        WebSocketDevice.devices.append(self)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        assert binary
        self.received.append(MINIMAL.decode(data))

    def send(self, message: PubSubMessage) -> None:
        self.transport.sendMessage(MINIMAL.encode(message)[1:-1], True)


@pytest_twisted.ensureDeferred
async def test_a_device_on_tcp_is_bridged_and_reopened(harness) -> None:
    factory = protocol.ServerFactory.forProtocol(StreamDevice)
    factory.devices = []
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    try:
        address = await harness.start(
            parse_phyllo(f"esp32@tcp:127.0.0.1:{port.getHost().port}")
        )
        (device,) = await eventually(lambda: factory.devices)
        browser = await harness.browser(address)
        temps = await harness.subscribed(browser, "phyllo/esp32/temp")
        device.transport.write(REDUCED.encode(document("temp", 7)))
        await eventually(lambda: temps)
        assert json.loads(temps[0].payload) == 7
        await browser.publish("phyllo/esp32/led", b"true")
        await eventually(lambda: device.received)
        assert device.received == [document("led", True)]

        device.transport.loseConnection()
        again = (await eventually(lambda: factory.devices[1:]))[0]
        again.transport.write(REDUCED.encode(document("temp", 8)))
        await eventually(lambda: len(temps) == 2)
        assert json.loads(temps[1].payload) == 8
    finally:
        await wait_for(port.stopListening())


@pytest_twisted.ensureDeferred
async def test_a_device_on_websocket_binary_is_bridged(harness) -> None:
    WebSocketDevice.devices = []
    site = websocket_site({"/phyllo": websocket_resource(WebSocketDevice)})
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    try:
        url = f"ws://127.0.0.1:{port.getHost().port}/phyllo"
        address = await harness.start(parse_phyllo(f"esp32+minimal@{url}"))
        (device,) = await eventually(lambda: WebSocketDevice.devices)
        bridge = harness.service.phyllo["esp32"]
        await eventually(lambda: bridge.top is not None)
        browser = await harness.browser(address)
        temps = await harness.subscribed(browser, "phyllo/esp32/temp")
        device.send(document("temp", {"c": 3}))
        await eventually(lambda: temps)
        assert json.loads(temps[0].payload) == {"c": 3}
        await browser.publish("phyllo/esp32/led", b"false")
        await eventually(lambda: device.received)
        assert device.received == [document("led", False)]
        device.transport.sendMessage(b"text is not a chunk", False)
        await eventually(lambda: bridge.counters()["framing_errors"] == 1)
    finally:
        for device in WebSocketDevice.devices:
            device.transport.loseConnection()
        await wait_for(port.stopListening())


@pytest_twisted.ensureDeferred
async def test_what_a_frame_cannot_hold_is_counted_not_sent(harness, device) -> None:
    address = await harness.start(parse_phyllo(f"dev1@{device.endpoint}"))
    bridge = harness.service.phyllo["dev1"]
    await eventually(lambda: bridge.top is not None)
    browser = await harness.browser(address)
    await browser.publish("phyllo/dev1/blob", b'"' + b"x" * 400 + b'"')  # over 253 bytes
    await browser.publish("phyllo/dev1/sixteen-bytes-xx", b"1")  # over 15 topic bytes
    await browser.publish("phyllo/dev1/led", b"1")
    (sent,) = await eventually(device.poll)
    assert sent == document("led", 1)
    assert bridge.stats.unsendable == 1 and bridge.stats.unmapped == 1
    assert bridge.stats.to_device == 1


@pytest_twisted.ensureDeferred
async def test_what_the_send_format_cannot_carry_is_counted_and_logged_not_sent(
    harness, device
) -> None:
    warnings: list[dict] = []

    def observe(event: dict) -> None:
        if "cannot be sent as" in event.get("log_format", ""):
            warnings.append(event)

    globalLogPublisher.addObserver(observe)
    try:
        address = await harness.start(PhylloLink("dev1", device.endpoint, "reduced",
                                                  "phyllo/dev1", "json"))
        bridge = harness.service.phyllo["dev1"]
        await eventually(lambda: bridge.top is not None)
        browser = await harness.browser(address)
        await browser.publish("phyllo/dev1/raw", b"\xff\xfe")  # not UTF-8: JSON cannot carry it
        await browser.publish("phyllo/dev1/led", b"1")
        (sent,) = await eventually(device.poll)
    finally:
        globalLogPublisher.removeObserver(observe)
    assert sent == document("led", 1, Format.JSON)
    assert bridge.stats.unsendable == 1 and bridge.stats.to_device == 1
    assert [event["send_format"] for event in warnings] == ["json"]


@pytest_twisted.ensureDeferred
async def test_a_small_boards_chunk_limit_holds_for_what_the_hub_sends(harness, device) -> None:
    link = PhylloLink("uno", device.endpoint, "reduced", "phyllo/uno", "bytes", 40)
    address = await harness.start(link)
    bridge = harness.service.phyllo["uno"]
    await eventually(lambda: bridge.top is not None)
    browser = await harness.browser(address)
    await browser.publish("phyllo/uno/big", b"x" * 40)  # 40 + headers: over a 40-byte chunk
    await browser.publish("phyllo/uno/small", b"x" * 20)
    (sent,) = await eventually(device.poll)
    assert sent == PubSubMessage(TypeCode.BYTES_BUFFER, b"small", b"x" * 20)
    assert bridge.stats.unsendable == 1
    # What the device sends over the limit is dropped as line noise.
    device.write(REDUCED.encode(PubSubMessage(TypeCode.BYTES_BUFFER, b"big", b"y" * 60)))
    await eventually(lambda: bridge.counters()["framing_errors"] == 1)
