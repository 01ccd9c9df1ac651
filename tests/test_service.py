"""The broker service on real sockets: listeners from a config, WEBSMQ clients over each transport,
shared WebSocket sites, TLS through endpoint strings, bind errors and attached links (a TCP peer
and a serial line on a pty)."""

from __future__ import annotations

import os
import socket
import struct
import tty
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from cobs import cobs
from twisted.internet import error, protocol, reactor
from twisted.internet.ssl import Certificate, optionsForClientTLS

from tests.brokers import LOCAL, Broker
from tests.support import eventually, failure_of, sleep, wait_for
from wireproto.access.quotas import LimitSettings
from wireproto.codecs import subble, websmq
from wireproto.config import (
    Attach,
    Config,
    StreamOptions,
    WebsmqSettings,
    config_from_toml,
    parse_listen,
)
from wireproto.protocols.nydus.client import connect as nydus_connect
from wireproto.protocols.nydus.server import InvokeError
from wireproto.protocols.rpc import RequestFailed
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.websmq.client import WebsmqClientProtocol, connect
from wireproto.service import ListenFailed, WireprotoService, make_service
from wireproto.transports import HandshakeFailed
from wireproto.transports.serial import serial_endpoint_from_string


async def closed(client: WebsmqClientProtocol) -> BaseException:
    """Wait until `client`'s connection is gone; why it closed."""
    return await wait_for(client.when_closed(), timeout=10)


async def subscribe(service: WireprotoService, client: WebsmqClientProtocol, topic: str) -> list:
    """Subscribe `client` to `topic` and wait until the hub has it (WEBSMQ has no ack)."""
    received: list = []
    client.subscribe(topic, received.append)
    await eventually(lambda: service.hub.subscribers(topic))
    return received


@pytest_twisted.ensureDeferred
async def test_ws_and_length32_clients_share_one_hub(broker: Broker) -> None:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", f"websmq+length32@tcp:0:{LOCAL}"
    )
    ws_address, tcp_address = (entry.address for entry in bound)
    assert ws_address.startswith("ws://127.0.0.1:") and ws_address.endswith("/websmq")
    assert tcp_address.startswith("tcp:127.0.0.1:")
    assert [entry.describe().split(" on ")[0] for entry in bound] == [
        "websmq over ws", "websmq over length32"]

    browser = await broker.client(ws_address)
    device = await broker.client(tcp_address)
    at_browser = await subscribe(service, browser, "sensors/temp")
    at_device = await subscribe(service, device, "lights/set")

    device.publish("sensors/temp", b"21.5")
    browser.publish("lights/set", b"on")
    await eventually(lambda: at_browser and at_device)
    assert at_browser == [websmq.Publish("sensors/temp", b"21.5")]
    assert at_device == [websmq.Publish("lights/set", b"on")]


@pytest_twisted.ensureDeferred
async def test_ws_listeners_on_one_endpoint_share_one_port(broker: Broker) -> None:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", f"websmq+ws/mq/v1@tcp:0:{LOCAL}"
    )
    default, versioned = (entry.address for entry in bound)
    port = default.split(":")[2].split("/")[0]
    assert default == f"ws://127.0.0.1:{port}/websmq"
    assert versioned == f"ws://127.0.0.1:{port}/mq/v1"

    first = await broker.client(default)
    second = await broker.client(versioned)
    received = await subscribe(service, first, "news")
    second.publish("news", b"one site, two paths")
    await eventually(lambda: received)
    assert received == [websmq.Publish("news", b"one site, two paths")]

    with pytest.raises(HandshakeFailed):
        await wait_for(connect(reactor, f"ws://127.0.0.1:{port}/elsewhere"))


# Twisted's ssl: endpoint parser still hands pyOpenSSL objects to pyOpenSSL; not ours to fix.
@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_tls_through_the_endpoint_string(broker: Broker, tls_files: Any) -> None:
    key, cert = tls_files.key, tls_files.cert
    tls = f"ssl:0:{LOCAL}:privateKey={key}:certKey={cert}"
    service, bound = await broker.start(f"websmq+ws@{tls}", f"websmq+length32@{tls}")
    wss_address, ssl_address = (entry.address for entry in bound)
    assert wss_address.startswith("wss://127.0.0.1:")
    assert ssl_address.startswith("ssl:127.0.0.1:")
    trusted = optionsForClientTLS("localhost", trustRoot=Certificate.loadPEM(cert.read_bytes()))

    browser = await broker.client(wss_address, context_factory=trusted)
    host, port = ssl_address.split(":")[1:]
    device = await broker.client(
        f"ssl:host={host}:port={port}:hostname=localhost:caCertsDir={cert.parent}"
    )
    received = await subscribe(service, browser, "secure")
    device.publish("secure", b"over TLS")
    await eventually(lambda: received)
    assert received == [websmq.Publish("secure", b"over TLS")]


@pytest_twisted.ensureDeferred
async def test_unix_socket_with_cobs(broker: Broker, tmp_path: Path) -> None:
    path = tmp_path / "websmq.sock"
    service, bound = await broker.start(
        f"websmq+cobs@unix:{path}", f"websmq+ws@tcp:0:{LOCAL}", f"websmq+ws@unix:{path}.ws"
    )
    assert bound[0].address == f"unix:{path}"
    assert bound[2].address == f"ws+unix://{path}.ws:/websmq"

    local = await broker.client(bound[0].address, framing="cobs")
    browser = await broker.client(bound[1].address)
    received = await subscribe(service, local, "from/browser")
    browser.publish("from/browser", b"\x00 survives COBS")
    await eventually(lambda: received)
    assert received == [websmq.Publish("from/browser", b"\x00 survives COBS")]


@pytest_twisted.ensureDeferred
async def test_a_port_in_use_is_reported_and_the_rest_is_closed(broker: Broker) -> None:
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        service = make_service(Config(listeners=(
            parse_listen(f"websmq+ws@tcp:0:{LOCAL}"),
            parse_listen(f"websmq+length32@tcp:{port}:{LOCAL}"),
        )), reactor)
        broker.services.append(service)
        service.log_listen_errors = False
        service.startService()
        with pytest.raises(ListenFailed) as failed:
            await wait_for(service.when_listening())
        assert str(failed.value).startswith(
            f"cannot listen for websmq over length32 on tcp:{port}:{LOCAL}: "
        )
        assert "in use" in str(failed.value)
        (ws_bound,) = service.bound
        await wait_for(service.stopService())
        with pytest.raises(error.ConnectionRefusedError):
            await wait_for(connect(reactor, ws_bound.address))
    finally:
        taken.close()


@pytest_twisted.ensureDeferred
async def test_stopping_closes_open_connections(broker: Broker) -> None:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", f"websmq+length32@tcp:0:{LOCAL}"
    )
    clients = [await broker.client(entry.address) for entry in bound]
    await eventually(lambda: len(service.hub.sessions) == 2)
    await wait_for(service.stopService(), timeout=10)
    for client in clients:
        await closed(client)
    assert not service.hub.sessions


@pytest_twisted.ensureDeferred
async def test_config_settings_reach_the_hub_and_protocols(broker: Broker) -> None:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}",
        hub=replace(Config().hub, queue_bytes=4096, overflow="disconnect", max_subscriptions=2),
        websmq=WebsmqSettings(wildcards=True),
    )
    assert (service.hub.queue_bytes, service.hub.overflow) == (4096, "disconnect")
    subscriber = await broker.client(bound[0].address, wildcards=True)
    publisher = await broker.client(bound[0].address)
    received = await subscribe(service, subscriber, "sensors/#")
    publisher.publish("sensors/kitchen/temp", b"19")
    await eventually(lambda: received)
    assert received == [websmq.Publish("sensors/kitchen/temp", b"19")]

    # max_subscriptions=2: the third closes that connection, telling it why (close code 1002).
    subscriber.subscribe("a")
    subscriber.subscribe("b")
    reason = await closed(subscriber)
    assert "1002" in str(reason)
    assert "more than 2 subscriptions" in str(reason)
    assert publisher.connected


@pytest_twisted.ensureDeferred
async def test_ubre_settings_from_the_config_file_reach_the_ubre_server(broker: Broker) -> None:
    settings = config_from_toml(
        "[ubre]\nmax_topic_length = 8\nannounce_topics = false\ndebug = true\n"
        "request_timeout = 2.5\nmax_pending_requests = 7\n",
        reactor=reactor,
    ).ubre
    service, bound = await broker.start(f"ubre+lines@tcp:0:{LOCAL}", ubre=settings)
    server = service.server("ubre")
    assert (server.max_topic_length, server.announce_topics, server.debug) == (8, False, True)
    assert (server.request_timeout, server.max_pending_requests) == (2.5, 7)
    client = await wait_for(ubre_connect(reactor, bound[0].address))
    lost: list[Any] = []
    client.on_disconnect = lost.append
    try:
        client.subscribe("12345678")
        with pytest.raises(RequestFailed):  # NotFound: and the subscribe was read before it
            await wait_for(client.request("x", timeout=5))
        assert service.hub.subscribers("12345678") and not lost
        client.subscribe("123456789")  # one character over max_topic_length
        await eventually(lambda: lost)
        assert not service.hub.subscribers("12345678")
    finally:
        await wait_for(client.close())


@pytest_twisted.ensureDeferred
async def test_nydus_over_engineio_raw_websocket_and_lines_shares_one_server(
    broker: Broker,
) -> None:
    settings = config_from_toml(
        "[nydus]\ndebug = true\n[engineio]\nping_interval = 3\nping_timeout = 2\n",
        reactor=reactor,
    )
    service, bound = await broker.start(
        f"nydus+engineio@tcp:0:{LOCAL}", f"nydus+ws@tcp:0:{LOCAL}", f"nydus+lines@tcp:0:{LOCAL}",
        nydus=settings.nydus, engineio=settings.engineio,
    )
    engineio_url, ws_url, lines_address = (listener.address for listener in bound)
    assert engineio_url.startswith("http://127.0.0.1:") and engineio_url.endswith("/engine.io/")
    assert ws_url == engineio_url.replace("http://", "ws://").replace("/engine.io/", "/nydus")
    server = service.server("nydus")
    assert server is service.server("nydus") and server.debug

    def where(call: Any) -> Any:
        return call.client.transport.kind

    server.register_route("/where", where)
    server.register_route("/crash", lambda call: 1 / 0)
    clients = [
        await wait_for(nydus_connect(reactor, engineio_url)),
        await wait_for(nydus_connect(reactor, ws_url, engineio=False)),
        await wait_for(nydus_connect(reactor, lines_address)),
    ]
    try:
        assert [await wait_for(c.invoke("/where")) for c in clients] == ["engineio", "ws", "tcp"]
        handshake = clients[0].protocol.transport.handshake
        assert (handshake.ping_interval, handshake.ping_timeout) == (3000, 2000)
        crash = await failure_of(clients[2].invoke("/crash"))
        assert isinstance(crash, InvokeError) and crash.status == 500
        assert "division by zero" in crash.message  # debug = true: the real message
    finally:
        for client in clients:
            await wait_for(client.close())


@pytest_twisted.ensureDeferred
async def test_subble_settings_reach_the_host_and_its_registry_file(
    broker: Broker, tmp_path: Path
) -> None:
    registry = tmp_path / "subble.sqlite"
    settings = config_from_toml(
        f'[subble]\nregistry = "{registry}"\nallow_new_clients = false\n', reactor=reactor
    ).subble
    service, bound = await broker.start(f"subble+length32@tcp:0:{LOCAL}", subble=settings)
    host = service.server("subble")
    assert not host.allow_new_clients
    host.registry.add("known")
    port = int(bound[0].address.rsplit(":", 1)[1])

    def handshake(client_id: str) -> subble.HandshakeResponse:
        request = subble.HandshakeRequest(client_id=client_id)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as peer:
            frame = subble.encode(request)
            peer.sendall(struct.pack(">I", len(frame)) + frame)
            (length,) = struct.unpack(">I", _read_exactly(peer, 4))
            return subble.decode(_read_exactly(peer, length), sender="server")

    assert (await _in_thread(handshake, "known")).code == subble.MessageCode.OK
    refused = await _in_thread(handshake, "")
    assert refused.code == subble.MessageCode.NEW_CLIENTS_NOT_ALLOWED
    await wait_for(service.stopService(), timeout=10)
    assert registry.exists()  # the IDs outlive the service
    settings = replace(settings, enforce_registry=True)
    service, bound = await broker.start(f"subble+length32@tcp:0:{LOCAL}", subble=settings)
    assert "known" in service.server("subble").registry


def _read_exactly(peer: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = peer.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    return data


async def _in_thread(function: Any, *args: Any) -> Any:
    from twisted.internet import threads

    return await wait_for(threads.deferToThread(function, *args), timeout=10)


@pytest_twisted.ensureDeferred
async def test_stream_limits_come_from_the_config(broker: Broker) -> None:
    service, bound = await broker.start(
        f"websmq+length32@tcp:0:{LOCAL}",
        stream=StreamOptions(max_message_size=64, max_connections=2),
    )
    first = await broker.client(bound[0].address)
    second = await broker.client(bound[0].address)
    await eventually(lambda: len(service.hub.sessions) == 2)
    third = await broker.client(bound[0].address)
    await closed(third)  # refused: over max_connections

    received = await subscribe(service, first, "small")
    second.publish("small", b"x" * 100)  # over max_message_size: only `second` is closed
    await closed(second)
    assert received == [] and first.connected


@pytest_twisted.ensureDeferred
async def test_websocket_limits_come_from_the_config(broker: Broker) -> None:
    from wireproto.transports import WebSocketOptions

    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", websocket=WebSocketOptions(max_message_size=64)
    )
    client = await broker.client(bound[0].address)
    client.publish("big", b"x" * 100)
    reason = await closed(client)
    assert "1009" in str(reason)


class Device(protocol.Protocol):
    """A peer at the far end of an attached TCP link, speaking length32-framed WEBSMQ by hand."""

    def connectionMade(self) -> None:
        self.factory.devices.append(self)
        self.buffer = b""

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data

    def frames(self) -> list[websmq.Message]:
        frames, data = [], self.buffer
        while len(data) >= 4:
            (size,) = struct.unpack(">I", data[:4])
            frames.append(websmq.decode(data[4 : 4 + size]))
            data = data[4 + size :]
        return frames

    def send(self, message: websmq.Message) -> None:
        frame = websmq.encode(message)
        self.transport.write(struct.pack(">I", len(frame)) + frame)


@pytest_twisted.ensureDeferred
async def test_attach_serves_a_tcp_peer_and_reopens_the_link(broker: Broker) -> None:
    factory = protocol.ServerFactory.forProtocol(Device)
    factory.devices = []
    device_port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    try:
        link = Attach("websmq", f"tcp:127.0.0.1:{device_port.getHost().port}", "length32")
        service, bound = await broker.start(
            f"websmq+ws@tcp:0:{LOCAL}", attach=(link,), retry_policy=lambda attempt: 0.05
        )
        (device,) = await eventually(lambda: factory.devices)
        browser = await broker.client(bound[0].address)
        at_browser = await subscribe(service, browser, "device/out")

        device.send(websmq.Subscribe("device/in"))
        await eventually(lambda: service.hub.subscribers("device/in"))
        browser.publish("device/in", b"blink")
        device.send(websmq.Publish("device/out", b"button"))
        await eventually(lambda: device.frames() and at_browser)
        assert device.frames() == [websmq.Publish("device/in", b"blink")]
        assert at_browser == [websmq.Publish("device/out", b"button")]

        # The device goes away; the broker opens the link again by itself.
        device.transport.loseConnection()
        await eventually(lambda: len(factory.devices) == 2)
        again = factory.devices[1]
        again.send(websmq.Publish("device/out", b"back"))
        await eventually(lambda: len(at_browser) == 2)
        assert at_browser[1] == websmq.Publish("device/out", b"back")
    finally:
        await wait_for(device_port.stopListening())


def read_available(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return b""


@pytest_twisted.ensureDeferred
async def test_attach_serves_a_device_on_a_serial_line(broker: Broker) -> None:
    # A pty stands in for the serial port: the broker opens the slave, the test is the device.
    master, slave = os.openpty()
    try:
        tty.setraw(slave)
        os.set_blocking(master, False)
        device_path = os.ttyname(slave)
        from wireproto.config import parse_attach

        link = parse_attach(f"websmq@serial:{device_path}:baudrate=115200")
        assert link.framing == "cobs"
        serial_endpoint_from_string(reactor, link.endpoint)  # the form the service opens
        service, bound = await broker.start(f"websmq+length32@tcp:0:{LOCAL}", attach=(link,))
        await eventually(lambda: len(service.hub.sessions) == 1)
        client = await broker.client(bound[0].address)
        at_client = await subscribe(service, client, "mcu/out")

        subscribe_frame = websmq.encode(websmq.Subscribe("mcu/in"))
        os.write(master, cobs.encode(subscribe_frame) + b"\x00")
        await eventually(lambda: service.hub.subscribers("mcu/in"))
        client.publish("mcu/in", b"\x00\x01led")
        received = bytearray()
        await eventually(lambda: received.extend(read_available(master)) or b"\x00" in received)
        frame = bytes(received).split(b"\x00")[0]
        assert websmq.decode(cobs.decode(frame)) == websmq.Publish("mcu/in", b"\x00\x01led")

        publish_frame = websmq.encode(websmq.Publish("mcu/out", b"pressed"))
        os.write(master, cobs.encode(publish_frame) + b"\x00")
        await eventually(lambda: at_client)
        assert at_client == [websmq.Publish("mcu/out", b"pressed")]
        await broker.close()
        await sleep(0)
    finally:
        os.close(master)
        os.close(slave)


@pytest_twisted.ensureDeferred
async def test_http_limits_from_the_config_file_reach_every_http_port(broker: Broker) -> None:
    settings = config_from_toml("[http]\nmax_pending_per_address = 2\n", reactor=reactor).http
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}", http=settings)
    port = int(bound[0].address.rsplit(":", 1)[1].split("/")[0])
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    refused = socket.create_connection(("127.0.0.1", port))
    try:
        refused.settimeout(0.01)
        answer = b""
        for _ in range(300):
            try:
                answer = refused.recv(100)
                break
            except TimeoutError:
                await sleep(0.01)
        assert answer.startswith(b"HTTP/1.1 503 ")
    finally:
        for sock in (*silent, refused):
            sock.close()


def _keepalive_of(sock: socket.socket) -> tuple[int, int, int, int]:
    return (
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
    )


@pytest_twisted.ensureDeferred
async def test_stream_connections_have_tcp_keepalive_by_default(
    broker: Broker, tls_files: Any
) -> None:
    # A peer gone without a FIN or RST was never noticed on stream listeners.
    from wireproto.transports.stream import _tcp_socket

    tls = f"ssl:0:{LOCAL}:privateKey={tls_files.key}:certKey={tls_files.cert}"
    service, bound = await broker.start(f"websmq+length32@tcp:0:{LOCAL}", f"websmq+cobs@{tls}")
    plain = await broker.client(bound[0].address)
    host, port = bound[1].address.split(":")[1:]
    await broker.client(
        f"ssl:host={host}:port={port}:hostname=localhost:caCertsDir={tls_files.cert.parent}",
        framing="cobs",
    )
    await eventually(lambda: len(service.hub.sessions) == 2)
    for session in service.hub.sessions:
        sock = _tcp_socket(session.transport.transport)
        assert sock is not None
        assert _keepalive_of(sock) == (1, 30, 10, 3)
    assert _tcp_socket(plain.transport.transport) is not None  # clients too
    assert _keepalive_of(_tcp_socket(plain.transport.transport))[0] == 1


@pytest_twisted.ensureDeferred
async def test_keepalive_timing_comes_from_the_config_and_can_be_turned_off(
    broker: Broker,
) -> None:
    from wireproto.transports.stream import _tcp_socket

    settings = config_from_toml(
        "[stream]\nkeepalive_idle = 5\nkeepalive_interval = 2\nkeepalive_count = 4\n",
        reactor=reactor).stream
    off = config_from_toml("[stream]\nkeepalive_idle = 0\n", reactor=reactor).stream
    for limits, expected in ((settings, (1, 5, 2, 4)), (off, 0)):
        service, bound = await broker.start(f"websmq+length32@tcp:0:{LOCAL}", stream=limits)
        await broker.client(bound[0].address)
        (session,) = await eventually(lambda service=service: list(service.hub.sessions))
        got = _keepalive_of(_tcp_socket(session.transport.transport))
        assert (got if expected else got[0]) == expected


@pytest_twisted.ensureDeferred
async def test_a_websocket_peer_that_vanishes_is_dropped_and_its_will_published(
    broker: Broker,
) -> None:
    # Default liveness: every WebSocket is pinged (25 s, 20 s); here faster, same mechanism
    # (Autobahn batches its ping timers by the second: under 1 s they are not kept).
    assert Config().websocket.auto_ping_interval == 25.0
    assert Config().websocket.auto_ping_timeout == 20.0
    fast = replace(Config().websocket, auto_ping_interval=1.0, auto_ping_timeout=1.0)
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}", websocket=fast)
    watcher = await broker.client(bound[0].address)
    vanishing = await broker.client(bound[0].address)
    received = await subscribe(service, watcher, "clients/gone")
    await vanishing.set_will("clients/gone", b"offline")
    await eventually(lambda: any(s.will for s in service.hub.sessions))
    # It stops reading (and so answering pings), as a peer behind a dead link does.
    vanishing.transport.transport.pauseProducing()
    await eventually(lambda: received, timeout=8)
    assert received == [websmq.LastWill("clients/gone", b"offline")]
    assert watcher.connected  # it answers its pings
    vanishing.transport.transport.abortConnection()


def _hub_holds_nothing(hub: Any) -> bool:
    root = hub._patterns.root
    return (not hub.sessions and not hub._exact and hub._patterns.count == 0
            and not (root.children or root.subscribers or root.rest)
            and hub.subscription_bytes == 0)


@pytest_twisted.ensureDeferred
async def test_closed_connections_leave_nothing_in_the_hub(broker: Broker) -> None:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", f"websmq+length32@tcp:0:{LOCAL}",
        websmq=WebsmqSettings(wildcards=True),
    )
    hub = service.hub
    clients = [await broker.client(bound[index % 2].address, wildcards=True)
               for index in range(10)]
    for number, client in enumerate(clients):
        for topic in range(30):
            client.subscribe(f"room/{topic}/c{number}", lambda message: None)
        client.subscribe(f"room/+/c{number}/#", lambda message: None)
        client.subscribe("room/#", lambda message: None)
    await eventually(lambda: hub._patterns.count == 20 and len(hub._exact) == 300)
    assert hub.subscription_bytes == sum(session.subscription_bytes for session in hub.sessions)
    for client in clients[:5]:
        await wait_for(client.disconnect())
    for client in clients[5:]:
        client.transport.abortConnection()
    broker.clients.clear()
    await eventually(lambda: _hub_holds_nothing(hub))


@pytest_twisted.ensureDeferred
async def test_what_one_connection_can_make_the_hub_hold_is_bounded(broker: Broker) -> None:
    # 60 connections x 1000 subscriptions to 16,383-byte topics took the broker to 1.19 GB.
    hub_settings = config_from_toml(
        "[hub]\nmax_topic_length = 100\nmax_subscription_bytes = 1000\n"
        "max_total_subscription_bytes = 1500\n", reactor=reactor).hub
    # Over WebSocket, so the close frame carries the reason. Every client is on one address,
    # which may take the whole budget here (tests/access/test_limits.py shares it).
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}", hub=hub_settings,
                                        limits=LimitSettings(max_share=1.0))
    hub = service.hub
    address = bound[0].address

    long_topic = await broker.client(address)
    long_topic.subscribe("t" * 101, lambda message: None)
    assert "topic of 101 characters" in str(await closed(long_topic))

    greedy = await broker.client(address)
    for number in range(11):  # 11 topics of 99 bytes: past 1000 on one connection
        greedy.subscribe(f"{number:02d}" + "g" * 97, lambda message: None)
    assert "more than 1000 topic bytes on one connection" in str(await closed(greedy))
    await eventually(lambda: hub.subscription_bytes == 0)

    first, second = await broker.client(address), await broker.client(address)
    for number in range(9):
        first.subscribe(f"{number:02d}" + "a" * 98, lambda message: None)
    await eventually(lambda: hub.subscription_bytes == 900)
    for number in range(7):
        second.subscribe(f"{number:02d}" + "b" * 98, lambda message: None)
    assert "1500 bytes of subscribed topics in all" in str(await closed(second))
    assert first.connected and hub.subscription_bytes == 900

    will = await broker.client(address)
    will.set_will("w" * 101, b"x")
    assert "topic of 101 characters" in str(await closed(will))


@pytest_twisted.ensureDeferred
async def test_an_idle_timeout_closes_a_silent_stream_and_spares_a_talking_one(
    broker: Broker, tmp_path: Path
) -> None:
    settings = config_from_toml("[stream]\nidle_timeout = 0.4\n", reactor=reactor).stream
    capture = config_from_toml(f'[capture]\ndirectory = "{tmp_path}"\n', reactor=reactor).capture
    # With capture on too: its reader wraps the same read path.
    service, bound = await broker.start(f"websmq+length32@tcp:0:{LOCAL}", stream=settings,
                                        capture=capture)
    silent = await broker.client(bound[0].address)
    talking = await broker.client(bound[0].address)
    received = await subscribe(service, talking, "keep")
    for _ in range(8):  # 1.6 s: four idle timeouts
        talking.publish("keep", b"alive")
        await sleep(0.2)
    assert talking.connected and received == []  # its own publishes do not come back
    assert not silent.connected
    assert isinstance(await closed(silent), error.ConnectionDone)
    assert Config().stream.idle_timeout == 0.0  # off by default


def test_a_part_that_cannot_start_is_start_failed_and_nothing_listens(tmp_path: Path) -> None:
    """startService says which part could not start, and why, in one line; nothing is left
    started or listening. (The front ends print it: tests/test_start_failures.py.)"""
    from wireproto.capture.writer import CaptureSettings
    from wireproto.service import StartFailed

    a_file = tmp_path / "hostname"
    a_file.write_text("not a directory\n")
    config = Config(listeners=(parse_listen(f"websmq+length32@tcp:0:{LOCAL}", reactor=reactor),),
                    capture=CaptureSettings(directory=str(a_file / "cap")))
    service = make_service(config, reactor)
    with pytest.raises(StartFailed) as failed:
        service.startService()
    assert str(failed.value) == f"capture {a_file / 'cap'}: Not a directory"
    assert not service.running
    assert service.capture.writer is None
    assert service.bound == [] and service.listen_errors == []


def test_a_ws_listener_made_in_code_without_a_path_for_a_pathless_protocol_is_refused() -> None:
    """A listener built in code skips the config's checks: with no path of its own and a protocol
    with no default one, making the service says so (it failed on None deep in the site's
    routes)."""
    from wireproto.config import Listener
    from wireproto.protocols import ProtocolDescriptor, register_protocol, unregister_protocol

    register_protocol(ProtocolDescriptor(
        name="pathless", capture_code=254, server=lambda hub, settings: lambda: None,
        transports=frozenset({"ws"}),
    ))
    try:
        config = Config(listeners=(Listener("pathless", "ws", f"tcp:0:{LOCAL}"),))
        with pytest.raises(ValueError, match="pathless over ws on .* has no path, and "
                                             "pathless no default path: give one"):
            make_service(config, reactor)
    finally:
        unregister_protocol("pathless")


@pytest_twisted.ensureDeferred
async def test_a_bad_frame_over_tls_closes_the_connection(broker: Broker, tls_files: Any) -> None:
    """TLS does not close while a producer is registered, and each session is its transport's
    producer: a connection the broker gave up on over ssl: stayed open and held its slot."""
    import ssl
    import threading

    tls = f"ssl:0:{LOCAL}:privateKey={tls_files.key}:certKey={tls_files.cert}"
    service, bound = await broker.start(f"websmq+length32@{tls}")
    host, port = bound[0].address.split(":")[1:]
    context = ssl.create_default_context(cafile=str(tls_files.cert))
    outcome: list = []

    def peer() -> None:
        with socket.create_connection((host, int(port)), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as conn:
            conn.sendall(struct.pack(">I", 3) + b"\xf0\x00\x00")  # no such WEBSMQ type
            try:
                outcome.append(conn.recv(1024))
            except (OSError, ssl.SSLError) as error:
                outcome.append(error)

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    await eventually(lambda: outcome, timeout=8)
    assert outcome == [b""] or isinstance(outcome[0], ssl.SSLError | ConnectionError), outcome
    await eventually(lambda: not service.hub.sessions)


@pytest_twisted.ensureDeferred
async def test_a_bad_frame_over_wss_closes_the_connection(broker: Broker, tls_files: Any) -> None:
    """The same over a WebSocket on TLS, from a peer that never answers the close frame: the
    broker drops it once its close handshake times out."""
    import base64
    import ssl
    import threading

    tls = f"ssl:0:{LOCAL}:privateKey={tls_files.key}:certKey={tls_files.cert}"
    settings = config_from_toml("[websocket]\nclose_handshake_timeout = 1.0\n",
                                reactor=reactor).websocket
    service, bound = await broker.start(f"websmq+ws@{tls}", websocket=settings)
    port = int(bound[0].address.split(":")[2].split("/")[0])
    context = ssl.create_default_context(cafile=str(tls_files.cert))
    outcome: list = []

    def peer() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=15) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as conn:
            key = base64.b64encode(os.urandom(16)).decode()
            conn.sendall((f"GET /websmq HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
                          f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                          "Sec-WebSocket-Version: 13\r\n\r\n").encode())
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(4096)
            payload, mask = b"\xf0\x00\x00", b"\x01\x02\x03\x04"
            conn.sendall(bytes([0x82, 0x80 | len(payload)]) + mask
                         + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
            try:
                while conn.recv(4096):  # the close frame, then nothing more ever
                    pass
                outcome.append("closed")
            except (OSError, ssl.SSLError) as error:
                outcome.append(error)

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    await eventually(lambda: outcome, timeout=10)
    assert outcome == ["closed"] or isinstance(outcome[0], ssl.SSLError | ConnectionError), outcome
    await eventually(lambda: not service.hub.sessions)
