"""Serial endpoint and the serial: endpoint string, on pty pairs standing in for serial ports."""

from __future__ import annotations

import os

import pytest
import pytest_twisted
from cobs import cobs
from twisted.internet import reactor
from twisted.internet.endpoints import clientFromString
from twisted.internet.error import ConnectionAborted
from twisted.internet.interfaces import IStreamClientEndpointStringParserWithReactor
from twisted.plugin import getPlugins

from tests.support import wait_for
from tests.transports.conftest import Echo, Recorder
from wireproto.transports import (
    SerialEndpoint,
    SerialOpenFailed,
    StreamOptions,
    connect,
    serial_endpoint_from_string,
    stream_client_factory,
)
from wireproto.transports.serial import SerialEndpointParser


def test_twisted_finds_the_serial_endpoint_plugin():
    parsers = getPlugins(IStreamClientEndpointStringParserWithReactor)
    assert any(isinstance(parser, SerialEndpointParser) for parser in parsers)


@pytest.mark.parametrize("parse", [clientFromString, serial_endpoint_from_string])
def test_serial_endpoint_strings(parse):
    plain = parse(reactor, "serial:/dev/ttyACM0:baudrate=9600")
    assert isinstance(plain, SerialEndpoint)
    assert plain.device == "/dev/ttyACM0"
    assert plain.settings == {
        "baudrate": 9600,
        "bytesize": 8,
        "parity": "N",
        "stopbits": 1,
        "xonxoff": False,
        "rtscts": False,
    }
    named = parse(
        reactor, "serial:device=/dev/ttyUSB1:parity=e:stopbits=1.5:bytesize=7:rtscts=yes"
    )
    assert named.device == "/dev/ttyUSB1"
    assert named.settings["baudrate"] == 115200
    assert (named.settings["parity"], named.settings["stopbits"]) == ("E", 1.5)
    assert named.settings["bytesize"] == 7 and named.settings["rtscts"] is True
    # A colon inside a device name is escaped, as in any Twisted endpoint string.
    assert parse(reactor, r"serial:/dev/serial/by-path/pci-0\:1").device == (
        "/dev/serial/by-path/pci-0:1"
    )


@pytest.mark.parametrize(
    "description, message",
    [
        ("serial:/dev/x:baudrate=fast", "baudrate must be a number, not 'fast'"),
        ("serial:/dev/x:speed=9600", "unknown serial endpoint option(s) speed"),
        ("serial:/dev/x:parity=Q", "parity must be one of"),
        ("serial:/dev/x:stopbits=3", "stopbits must be one of"),
        ("serial:/dev/x:rtscts=maybe", "rtscts must be yes or no"),
        ("serial:baudrate=9600", "needs a device"),
    ],
)
def test_bad_serial_endpoint_strings_say_what_is_wrong(description, message):
    for parse in (clientFromString, serial_endpoint_from_string):
        with pytest.raises(ValueError) as caught:
            parse(reactor, description)
        assert message in str(caught.value)


@pytest_twisted.ensureDeferred
async def test_a_port_that_cannot_be_opened_fails_with_its_name():
    device = "/dev/wireproto-no-such-port"
    with pytest.raises(SerialOpenFailed, match=f"{device}.*No such file"):
        await wait_for(SerialEndpoint(reactor, device).connect(stream_client_factory(Echo)))
    with pytest.raises(SerialOpenFailed, match=device):
        await wait_for(connect(reactor, f"serial:{device}", Echo))


@pytest_twisted.ensureDeferred
async def test_a_port_is_opened_by_one_endpoint_at_a_time(net, pty_pair):
    # Two readers of one serial port (two links matching one board, two brokers) would each
    # get part of its bytes: the second open fails, saying why, and succeeds once it is free.
    master, device = pty_pair
    first = await wait_for(connect(reactor, f"serial:{device}", net.factory(Recorder)))
    with pytest.raises(SerialOpenFailed, match=f"{device}.*(lock|in use)"):
        await wait_for(SerialEndpoint(reactor, device).connect(stream_client_factory(Echo)))
    first.transport.loseConnection()
    await wait_for(first.lost)
    again = await wait_for(connect(reactor, f"serial:{device}", net.factory(Recorder)))
    os.write(master, cobs.encode(b"mine") + b"\x00")
    assert await again.received(1) == [(b"mine", True)]
    again.transport.loseConnection()
    await wait_for(again.lost)


@pytest_twisted.ensureDeferred
async def test_bad_cobs_frame_from_the_line_closes_the_port(net, pty_pair):
    master, device = pty_pair
    port_end = await wait_for(connect(reactor, f"serial:{device}", net.factory(Recorder)))
    os.write(master, cobs.encode(b"ok") + b"\x00" + b"\x05ab\x00" + cobs.encode(b"no") + b"\x00")
    await wait_for(port_end.lost)
    assert port_end.messages == [(b"ok", True)]
    assert "COBS frame of 3 bytes does not decode" in str(port_end.reason.value)


@pytest_twisted.ensureDeferred
async def test_large_message_then_abort(net, null_modem):
    device_a, device_b = null_modem
    await wait_for(
        SerialEndpoint(reactor, device_b).connect(
            stream_client_factory(net.factory(Echo), StreamOptions(framing="cobs"))
        )
    )
    client = await wait_for(connect(reactor, f"serial:{device_a}", net.factory(Recorder)))
    big = os.urandom(200_000)
    client.transport.sendMessage(big)
    assert await client.received(1) == [(big, True)]
    client.transport.sendMessage(b"dropped")
    client.transport.abortConnection()
    await wait_for(client.lost)
    assert client.reason.check(ConnectionAborted)
