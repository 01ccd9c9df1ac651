"""One echo protocol behaves the same over every adapter: ws, wss, tcp (each framing), unix, ssl,
and serial over a pty null modem."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.error import ConnectionDone
from twisted.internet.ssl import Certificate, optionsForClientTLS
from zope.interface.verify import verifyObject

from tests.support import wait_for
from tests.transports.conftest import Echo, Net, Recorder, TLSFiles
from wireproto.transports import (
    IMessageTransport,
    SerialAddress,
    SerialEndpoint,
    StreamOptions,
    connect,
    stream_client_factory,
    stream_server_factory,
    websocket_resource,
    websocket_site,
)

# Twisted's ssl: endpoint strings still hand pyOpenSSL objects to pyOpenSSL; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")

BINARY = [b"hello", b"", b"\x00\xff\x00" * 5, bytes(range(256)) * 300]
TEXT = [b"hello", b"", "gr\u00fc\u00dfe \u2603".encode(), b"x" * 70_000]


async def exchange(client: Recorder, messages: list[bytes], binary: bool) -> None:
    for message in messages:
        client.transport.sendMessage(message, binary)
    await client.received(len(messages))
    assert client.messages == [(message, binary) for message in messages]


def server_side(net: Net) -> Echo:
    (server,) = [p for p in net.protocols if type(p) is Echo]
    return server


async def start(net: Net, carrier: str, tmp_path: Any, tls: TLSFiles) -> Recorder:
    """Listen with an Echo server on `carrier` and connect a Recorder client to it."""
    client_factory = net.factory(Recorder)
    if carrier in ("ws", "wss"):
        site = websocket_site({"/echo": websocket_resource(net.factory(Echo))})
        if carrier == "ws":
            port = await net.listen_tcp(site)
            return await wait_for(connect(reactor, f"ws://127.0.0.1:{port}/echo", client_factory))
        description = f"ssl:0:interface=127.0.0.1:privateKey={tls.key}:certKey={tls.cert}"
        port = (await net.listen(site, description)).getHost().port
        trusted = optionsForClientTLS("localhost", trustRoot=Certificate.loadPEM(tls.cert_pem))
        return await wait_for(
            connect(
                reactor,
                f"wss://127.0.0.1:{port}/echo",
                client_factory,
                context_factory=trusted,
            )
        )
    kind, framing = carrier.split("-")
    server_factory = stream_server_factory(net.factory(Echo), StreamOptions(framing=framing))
    if kind == "tcp":
        port = await net.listen_tcp(server_factory)
        address = f"tcp:host=127.0.0.1:port={port}"
    elif kind == "unix":
        path = tmp_path / "echo.sock"
        await net.listen(server_factory, f"unix:{path}")
        address = f"unix:path={path}"
    else:
        description = f"ssl:0:interface=127.0.0.1:privateKey={tls.key}:certKey={tls.cert}"
        port = (await net.listen(server_factory, description)).getHost().port
        address = f"ssl:host=127.0.0.1:port={port}:caCertsDir={tls.ca_dir}:hostname=localhost"
    return await wait_for(connect(reactor, address, client_factory, framing=framing))


CARRIERS = [
    "ws",
    "wss",
    "tcp-length32",
    "tcp-lines",
    "tcp-cobs",
    "unix-length32",
    "unix-cobs",
    "ssl-length32",
]


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest_twisted.ensureDeferred
async def test_echo_round_trip_and_clean_close(net, tmp_path, tls_files, carrier):
    client = await start(net, carrier, tmp_path, tls_files)
    lines = carrier.endswith("lines")
    if not lines:
        await exchange(client, BINARY, binary=True)
        client.messages.clear()
    # Text is text on every carrier; only WebSocket and the lines framing mark it as such.
    await exchange(client, TEXT, binary=not (lines or carrier.startswith("ws")))

    server = server_side(net)
    verifyObject(IMessageTransport, server.transport)
    verifyObject(IMessageTransport, client.transport)
    expected_kind = {"ws": "ws", "wss": "ws"}.get(carrier, carrier.split("-")[0])
    assert server.transport.kind == client.transport.kind == expected_kind
    if not carrier.startswith("unix"):
        assert server.transport.getPeer() == client.transport.getHost()
        assert client.transport.getPeer() == server.transport.getHost()

    client.transport.loseConnection()
    await wait_for(server.lost)
    await wait_for(client.lost)
    assert server.reason.check(ConnectionDone), server.reason
    assert client.reason.check(ConnectionDone), client.reason


@pytest_twisted.ensureDeferred
async def test_echo_over_serial_null_modem(net, null_modem):
    device_a, device_b = null_modem
    # The echo end is built directly on the endpoint; the client end goes through connect(),
    # whose serial: default is the cobs framing.
    echo_end = await wait_for(
        SerialEndpoint(reactor, device_b).connect(
            stream_client_factory(net.factory(Echo), StreamOptions(framing="cobs"))
        )
    )
    client = await wait_for(
        connect(reactor, f"serial:{device_a}:baudrate=115200", net.factory(Recorder))
    )
    await exchange(client, BINARY, binary=True)

    verifyObject(IMessageTransport, client.transport)
    assert client.transport.prepareKey == echo_end.prepareKey == ("stream", "cobs")
    assert client.transport.kind == echo_end.wrapped.transport.kind == "serial"
    assert client.transport.getPeer() == SerialAddress(device_a)
    assert echo_end.getHost() == SerialAddress(device_b)
