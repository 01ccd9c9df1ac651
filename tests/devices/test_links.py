"""Single links that find their board by identity, through a running broker: pty stand-ins
carry the USB identity a real board reports, the broker lists them through a real
PollingWatcher's lister, and real clients (WEBSMQ over WebSocket, UBRE over lines, on
127.0.0.1) are at the other end. A board that matches is bridged both ways; none, or two, is
a clear log line naming what was asked and found, retried until a board settles it; a board
plugged back in as another device is found there, and what it says after arrives."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted
from cobs import cobs
from twisted.internet import reactor, task
from twisted.logger import formatEvent as format_event
from twisted.logger import globalLogPublisher

from tests.support import eventually, wait_for
from wireproto.codecs import websmq
from wireproto.codecs.phyllo.document import Format, Schema, message_from_document, serialize
from wireproto.codecs.phyllo.stack import REDUCED, StackDecoder
from wireproto.config import Config, parse_attach, parse_listen, parse_phyllo
from wireproto.devices import PollingWatcher
from wireproto.devices.standin import COMMON_BOARDS, StandInBoard, StandInPorts
from wireproto.hub import Session
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.websmq.client import connect as websmq_connect
from wireproto.service import WireprotoService, make_service

UNO = "vid=2341:pid=0043"


def reading(topic: str, value: Any) -> bytes:
    """One Phyllo document on the wire (reduced stack), as a board writes it."""
    return REDUCED.encode(message_from_document(
        topic, serialize(value, Format.MSGPACK, Schema.SCHEMALESS)))


class Broker:
    """A broker whose links list the stand-ins' ports, and the log lines it wrote."""

    def __init__(self, boards: StandInPorts) -> None:
        self.boards = boards
        self.service: WireprotoService | None = None
        self.events: list[dict[str, Any]] = []
        self.closers: list[Any] = []

    async def start(self, *listen: str, **tables: Any) -> list[str]:
        config = Config(listeners=tuple(parse_listen(spec) for spec in listen), **tables)
        self.service = make_service(
            config, reactor, retry_policy=lambda attempt: 0.05,
            ports=PollingWatcher(reactor, self.boards.ports, interval=0.05))
        self.service.startService()
        bound = await wait_for(self.service.when_listening())
        return [entry.address for entry in bound]

    def said(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]

    def lines(self, event: str) -> list[str]:
        return [format_event(e) or "" for e in self.said(event)]

    async def attached_on(self, board: StandInBoard) -> str:
        """The log line saying a link opened `board`, once it is written."""
        await eventually(lambda: any(f"({board.device}, " in line
                                     for line in self.lines("attached")), timeout=10)
        return next(line for line in self.lines("attached") if f"({board.device}, " in line)

    async def hub_subscribed(self, topic: str) -> None:
        assert self.service is not None
        hub = self.service.hub
        await eventually(lambda: any(isinstance(s, Session) for s in hub.subscribers(topic)))


@pytest.fixture
def boards():
    standins = StandInPorts()
    yield standins
    standins.close()


@pytest_twisted.async_yield_fixture
async def broker(boards) -> AsyncIterator[Broker]:
    running = Broker(boards)
    globalLogPublisher.addObserver(running.events.append)
    try:
        yield running
    finally:
        globalLogPublisher.removeObserver(running.events.append)
        for close in running.closers:
            await wait_for(close(), timeout=10)
        if running.service is not None and running.service.running:
            await wait_for(running.service.stopService(), timeout=10)


async def websmq_browser(broker: Broker, address: str, topic: str) -> tuple[Any, list[Any]]:
    client = await wait_for(websmq_connect(reactor, address))
    broker.closers.append(client.disconnect)
    inbox: list[Any] = []
    await client.subscribe(topic, inbox.append)
    await broker.hub_subscribed(topic)
    return client, inbox


def device_messages(board: StandInBoard, decoder: StackDecoder) -> list[Any]:
    return list(decoder.feed(board.read(0.0)))


@pytest_twisted.ensureDeferred
async def test_a_phyllo_link_by_identity_bridges_its_board_both_ways(broker, boards):
    boards.plug(**COMMON_BOARDS["ftdi"], serial_number="A10K")  # another kind: not chosen
    uno = boards.plug(**COMMON_BOARDS["uno"], serial_number="857", location="1-1.2:1.0")
    (address,) = await broker.start("websmq+ws@tcp:0:interface=127.0.0.1",
                                    phyllo=(parse_phyllo(f"dev1@serial:{UNO}"),))
    line = await broker.attached_on(uno)
    assert line == (f"attached phyllo link dev1 (reduced stack, hub topics phyllo/dev1/...) on "
                    f"serial:{UNO} ({uno.device}, 2341:0043 serial 857 at 1-1.2:1.0)")
    browser, temps = await websmq_browser(broker, address, "phyllo/dev1/temp")
    uno.write(reading("temp", {"celsius": 21.5}))
    await eventually(lambda: temps)
    assert json.loads(temps[0].payload) == {"celsius": 21.5}

    await browser.publish("phyllo/dev1/led", b'{"on":true}')
    decoder = StackDecoder(REDUCED)
    (sent,) = await eventually(lambda: device_messages(uno, decoder))
    assert sent == message_from_document(
        "led", serialize({"on": True}, Format.MSGPACK, Schema.SCHEMALESS))


@pytest_twisted.ensureDeferred
async def test_an_attached_link_by_identity_serves_its_board(broker, boards):
    pico = boards.plug(**COMMON_BOARDS["pico"], serial_number="E6614C311B4B7E2A")
    (address,) = await broker.start("websmq+ws@tcp:0:interface=127.0.0.1",
                                    attach=(parse_attach("websmq@serial:vid=2e8a:pid=000a"),))
    line = await broker.attached_on(pico)
    assert line.endswith(f"on serial:vid=2e8a:pid=000a ({pico.device}, 2e8a:000a serial "
                         "E6614C311B4B7E2A at 1-1)")
    browser, pressed = await websmq_browser(broker, address, "mcu/out")
    pico.write(cobs.encode(websmq.encode(websmq.Subscribe("mcu/in"))) + b"\x00")
    assert broker.service is not None
    await eventually(lambda: broker.service.hub.subscribers("mcu/in"))
    await browser.publish("mcu/in", b"led on")
    received = bytearray()
    await eventually(lambda: received.extend(pico.read(0.0)) or b"\x00" in received)
    frame = bytes(received).split(b"\x00")[0]
    assert websmq.decode(cobs.decode(frame)) == websmq.Publish("mcu/in", b"led on")
    pico.write(cobs.encode(websmq.encode(websmq.Publish("mcu/out", b"pressed"))) + b"\x00")
    await eventually(lambda: pressed)
    assert pressed[0].payload == b"pressed"


@pytest_twisted.ensureDeferred
async def test_no_board_is_a_warning_naming_what_was_asked_and_found_until_one_is_plugged(
        broker, boards):
    other = boards.plug(**COMMON_BOARDS["nano-ch340"], location="1-4")
    (address,) = await broker.start("websmq+ws@tcp:0:interface=127.0.0.1",
                                    phyllo=(parse_phyllo(f"dev1@serial:{UNO}:baudrate=115200"),))
    await eventually(lambda: len(broker.said("link_open_failed")) >= 3, timeout=10)
    first, again = broker.said("link_open_failed")[:2]
    assert first["log_level"].name == "warn" and again["log_level"].name == "info"
    assert (f"no serial port has {UNO}: found {other.device} (1a86:7523 at 1-4)"
            in format_event(first))
    assert format_event(first).startswith(
        f"cannot open serial:{UNO}:baudrate=115200 for phyllo link dev1")

    uno = boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    await broker.attached_on(uno)
    _, temps = await websmq_browser(broker, address, "phyllo/dev1/temp")
    uno.write(reading("temp", 1))
    await eventually(lambda: temps)
    assert [json.loads(message.payload) for message in temps] == [1]


@pytest_twisted.ensureDeferred
async def test_two_matching_boards_are_an_error_naming_both_and_a_serial_number_narrows(
        broker, boards):
    first = boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    second = boards.plug(**COMMON_BOARDS["uno"], serial_number="858")
    (address,) = await broker.start(
        "websmq+ws@tcp:0:interface=127.0.0.1",
        phyllo=(parse_phyllo(f"any@serial:{UNO}"),
                parse_phyllo(f"chosen@serial:{UNO}:serial_number=858")))
    line = await broker.attached_on(second)
    assert "phyllo link chosen" in line and "serial 858" in line
    await eventually(lambda: broker.said("link_open_failed"))
    (failed, *_) = broker.said("link_open_failed")
    assert failed["log_level"].name == "error"
    said = format_event(failed) or ""
    assert said.startswith(f"cannot open serial:{UNO} for phyllo link any")
    assert f"2 serial ports have {UNO}: found {first.device} (2341:0043 serial 857" in said
    assert f"; {second.device} (2341:0043 serial 858" in said
    assert "add serial_number= or location= to choose one" in said
    _, temps = await websmq_browser(broker, address, "phyllo/chosen/temp")
    second.write(reading("temp", 858))
    await eventually(lambda: temps)
    assert [json.loads(message.payload) for message in temps] == [858]

    # One board unplugged: the ambiguous link now finds the one left, which the other link
    # holds; a port is opened by one link at a time, so it says so and keeps trying.
    boards.unplug(first)
    await eventually(lambda: any(f"{second.device} is in use" in (format_event(event) or "")
                                 for event in broker.said("link_open_failed")), timeout=10)
    assert "phyllo link any" not in " ".join(broker.lines("attached"))
    second.write(reading("temp", 859))
    await eventually(lambda: len(temps) == 2)
    assert [json.loads(message.payload) for message in temps] == [858, 859]


@pytest_twisted.ensureDeferred
async def test_a_board_plugged_back_as_another_device_is_reopened_while_messages_flow(
        broker, boards):
    uno = boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    (address,) = await broker.start("ubre+lines@tcp:0:interface=127.0.0.1",
                                    phyllo=(parse_phyllo(f"dev1@serial:{UNO}"),))
    await broker.attached_on(uno)
    client = await wait_for(ubre_connect(reactor, address))
    broker.closers.append(client.close)
    counts: list[int] = []
    client.subscribe("phyllo/dev1/count", lambda message: counts.append(message.body))
    await broker.hub_subscribed("phyllo/dev1/count")

    board = {"now": uno}
    sent: list[int] = []

    def tick() -> None:  # the board's firmware: a count every 5 ms, to whichever port it is on
        if board["now"].plugged:
            board["now"].write(reading("count", len(sent)))
            sent.append(len(sent))

    firmware = task.LoopingCall(tick)
    firmware.start(0.005)
    try:
        await eventually(lambda: len(counts) >= 20, timeout=10)
        again = boards.replug(uno)
        board["now"] = again
        assert again.device != uno.device
        line = await broker.attached_on(again)
        assert line.endswith(f"on serial:{UNO} ({again.device}, 2341:0043 serial 857 at 1-1)")
        after = len(sent)  # written once the link is open on the new device
        await eventually(lambda: counts and counts[-1] >= after + 20, timeout=10)
    finally:
        firmware.stop()
    # Before the replug nothing was lost, and after it nothing either: in order, each once.
    assert counts == sorted(set(counts))
    assert set(range(counts[0], 20)) <= set(counts)
    assert set(range(after, counts[-1] + 1)) <= set(counts)


@pytest_twisted.ensureDeferred
async def test_a_link_is_loud_again_when_why_it_cannot_open_changes(broker, boards):
    await broker.start("websmq+ws@tcp:0:interface=127.0.0.1",
                       phyllo=(parse_phyllo(f"dev1@serial:{UNO}"),))
    await eventually(lambda: len(broker.said("link_open_failed")) >= 2, timeout=10)
    boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    boards.plug(**COMMON_BOARDS["uno"], serial_number="858")
    await eventually(lambda: any(e["log_level"].name == "error"
                                 for e in broker.said("link_open_failed")), timeout=10)
    levels = [e["log_level"].name for e in broker.said("link_open_failed")]
    # warn once for no board, quiet while none, then an error once for two, quiet again
    assert levels[0] == "warn" and levels.count("warn") == 1 and levels.count("error") == 1
    assert set(levels[1:levels.index("error")]) <= {"info"}
    assert "no serial port has vid=2341:pid=0043: no serial port is present" in (
        format_event(broker.said("link_open_failed")[0]) or "")


@pytest_twisted.ensureDeferred
async def test_ports_that_cannot_be_listed_keep_the_link_retrying(broker, boards):
    # pyserial reads each port's USB strings from /sys; a device whose strings it cannot read
    # (or a /sys that vanished) must cost one failed open, not the link
    uno = boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    broken = {"now": True}

    def lister() -> list:
        if broken["now"]:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return boards.ports()

    config = Config(listeners=(parse_listen("websmq+ws@tcp:0:interface=127.0.0.1"),),
                    phyllo=(parse_phyllo(f"dev1@serial:{UNO}"),))
    broker.service = make_service(config, reactor, retry_policy=lambda attempt: 0.05,
                                  ports=PollingWatcher(reactor, lister, interval=0.05))
    broker.service.startService()
    await wait_for(broker.service.when_listening())
    await eventually(lambda: len(broker.said("link_open_failed")) >= 2, timeout=10)
    assert "cannot list serial ports" in (format_event(broker.said("link_open_failed")[0]) or "")
    broken["now"] = False
    await broker.attached_on(uno)
