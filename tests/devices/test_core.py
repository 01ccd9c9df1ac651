"""The devices core: identity matching, its errors, board names, the watcher's change events,
and a ``serial:vid=...`` endpoint opening the pty that stands in for the board."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import protocol, reactor
from twisted.internet.task import Clock

from tests.support import eventually
from wireproto.devices import (
    NoMatchingPort,
    PollingWatcher,
    PortInfo,
    PortMatch,
    SeveralMatchingPorts,
    board_name,
    resolve,
)
from wireproto.devices.standin import COMMON_BOARDS, StandInPorts
from wireproto.transports.connect import client_endpoint


@pytest.fixture
def boards():
    standins = StandInPorts()
    yield standins
    standins.close()


def test_a_match_needs_every_field_it_names():
    uno = PortInfo("/dev/ttyACM0", vid=0x2341, pid=0x0043, serial_number="857",
                   location="1-1.2:1.0", manufacturer="Arduino (www.arduino.cc)")
    assert PortMatch.from_options({"vid": "2341", "pid": "0x0043"}).matches(uno)
    assert PortMatch.from_options({"location": "1-1.2"}).matches(uno)
    assert not PortMatch.from_options({"location": "1-1"}).matches(uno)
    assert PortMatch.from_options({"manufacturer": "ARDUINO (www.arduino.cc)"}).matches(uno)
    assert not PortMatch.from_options({"vid": "2341", "serial_number": "85"}).matches(uno)


@pytest.mark.parametrize("options, problem", [
    ({}, "at least one of"),
    ({"vid": "23411"}, "USB id in hex"),
    ({"pid": "zz"}, "USB id in hex"),
    ({"serial": "1"}, "'serial' is not an identity field"),
    ({"product": ""}, "product is empty"),
])
def test_a_bad_match_is_refused_with_its_reason(options, problem):
    with pytest.raises(ValueError, match=problem):
        PortMatch.from_options(options)


def test_resolving_names_what_was_asked_and_what_was_found():
    ports = [PortInfo("/dev/ttyACM0", vid=0x2341, pid=0x43, serial_number="a"),
             PortInfo("/dev/ttyACM1", vid=0x2341, pid=0x43, serial_number="b"),
             PortInfo("/dev/ttyS0")]
    with pytest.raises(SeveralMatchingPorts) as several:
        resolve(PortMatch(vid=0x2341), ports)
    assert "2 serial ports have vid=2341" in str(several.value)
    assert "/dev/ttyACM0 (2341:0043 serial a" in str(several.value)
    with pytest.raises(NoMatchingPort) as none:
        resolve(PortMatch(vid=0x1A86, pid=0x7523), ports)
    assert "no serial port has vid=1a86:pid=7523" in str(none.value)
    assert "/dev/ttyS0 (no USB identity)" in str(none.value)
    assert resolve(PortMatch(serial_number="b"), ports).device == "/dev/ttyACM1"


def test_a_board_is_named_by_its_serial_number_else_its_location():
    assert board_name(PortInfo("/dev/ttyACM0", serial_number="E661 4C/31:B")) == "E661_4C_31_B"
    assert board_name(PortInfo("/dev/ttyUSB0", location="1-1.2:1.0")) == "1-1.2_1.0"
    assert board_name(PortInfo("/dev/ttyUSB3")) == "ttyUSB3"


def test_the_watcher_tells_its_subscribers_of_each_change_only(boards):
    clock = Clock()
    watcher = PollingWatcher(clock, boards.ports, interval=0.1)
    seen: list[list[str]] = []
    watcher.subscribe(lambda ports: seen.append([port.device for port in ports]))
    watcher.start()
    uno = boards.plug(**COMMON_BOARDS["uno"], serial_number="1")
    clock.advance(0.1)
    clock.advance(0.1)  # nothing changed: nothing told
    boards.unplug(uno)
    clock.advance(0.1)
    watcher.stop()
    assert seen == [[uno.device], []]
    assert watcher.checks >= 4


@pytest_twisted.ensureDeferred
async def test_an_endpoint_by_identity_opens_the_board_each_time_where_it_is_now(boards):
    first = boards.plug(**COMMON_BOARDS["pico"], serial_number="E661")
    boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    endpoint = client_endpoint(reactor, "serial:vid=2e8a:pid=000a", ports=boards.ports)
    received = []

    class Collect(protocol.Protocol):
        def dataReceived(self, data):
            received.append(data)

    opened = await endpoint.connect(protocol.Factory.forProtocol(Collect))
    assert endpoint.port.device == first.device
    first.write(b"one")
    await eventually(lambda: b"".join(received) == b"one")
    opened.transport.loseConnection()
    again = boards.replug(first)
    assert again.device != first.device
    opened = await endpoint.connect(protocol.Factory.forProtocol(Collect))
    assert endpoint.port.device == again.device
    again.write(b"two")
    await eventually(lambda: b"".join(received) == b"onetwo")
    opened.transport.loseConnection()
    boards.unplug(again)
    with pytest.raises(NoMatchingPort):
        await endpoint.connect(protocol.Factory.forProtocol(Collect))
