"""Structured log events: connect, disconnect, will, protocol errors and Phyllo links, captured from
the global log publisher around a real broker, and read back from `wireproto serve`'s JSON log."""

from __future__ import annotations

import re
import socket
import struct
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import protocol, reactor
from twisted.logger import LogLevel, eventsFromJSONLogFile, formatEvent, globalLogPublisher

from tests.support import eventually, wait_for
from tests.test_cli import LISTENER_LINE, Child, children
from tests.test_service import Broker
from wireproto.config import parse_phyllo
from wireproto.protocols.nydus_client import connect as nydus_connect

__all__ = ["children"]  # the fixture, from tests.test_cli

LOCAL = "interface=127.0.0.1"
# A length32 frame holding a WEBSMQ LastWill whose topic length runs past its end.
BROKEN = struct.pack(">I", 2) + b"\xff\xff"
EVENTS = ("connect", "disconnect", "will", "protocol_error", "link_up", "link_down")


@pytest_twisted.async_yield_fixture
async def broker() -> AsyncIterator[Broker]:
    running = Broker()
    try:
        yield running
    finally:
        await running.close()


@contextmanager
def logged() -> Iterator[list[dict]]:
    """The log events emitted inside the block."""
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        yield events
    finally:
        globalLogPublisher.removeObserver(events.append)


def named(events: list[dict], name: str, **fields: Any) -> list[dict]:
    """The events whose `event` field is `name` and whose fields include `fields`."""
    return [
        event for event in events
        if event.get("event") == name and all(event.get(k) == v for k, v in fields.items())
    ]


def local_peer(client: Any) -> str:
    """How the broker names `client`'s end of the connection."""
    host = client.transport.getHost()
    return f"{host.host}:{host.port}"


@pytest_twisted.ensureDeferred
async def test_a_connections_life_is_logged_once_with_stable_fields(broker: Broker) -> None:
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}")
    address = bound[0].address
    with logged() as events:
        watcher = await broker.client(address)
        leaver = await broker.client(address)
        leaver_peer = local_peer(leaver)
        inbox: list = []
        watcher.subscribe("gone", inbox.append)
        await leaver.set_will("gone", b"bye")
        await eventually(lambda: service.hub.subscribers("gone") and len(
            [s for s in service.hub.sessions if s.will]))
        for number in range(20):  # nothing is logged per message
            leaver.publish("chatter", b"%d" % number)
        await eventually(lambda: service.hub.stats.published == 20)
        await wait_for(leaver.disconnect())
        await eventually(lambda: inbox)

    assert len(named(events, "connect", protocol="websmq")) == 2
    assert re.fullmatch(r"127\.0\.0\.1:\d+", leaver_peer)
    (connect,) = named(events, "connect", peer=leaver_peer)
    assert connect["transport"] == "ws"
    assert connect["log_level"] is LogLevel.info
    assert connect["log_namespace"] == "wireproto.hub"
    assert formatEvent(connect) == f"websmq session {connect['session']} opened by " \
                                   f"{leaver_peer} over ws"

    (disconnect,) = named(events, "disconnect")
    assert disconnect["session"] == connect["session"]
    assert disconnect["peer"] == leaver_peer and disconnect["protocol"] == "websmq"
    assert disconnect["log_level"] is LogLevel.info
    assert (disconnect["received"], disconnect["sent"], disconnect["dropped_messages"]) == (
        20, 0, 0)
    assert disconnect["reason"]  # why it closed, as text
    assert disconnect["duration"] >= 0

    (will,) = named(events, "will")
    assert (will["topic"], will["protocol"], will["delivered"]) == ("gone", "websmq", 1)
    assert will["session"] == connect["session"]
    hub_events = [e for e in events if e.get("log_namespace") == "wireproto.hub"]
    assert [e["event"] for e in hub_events] == ["connect", "connect", "disconnect", "will"]


@pytest_twisted.ensureDeferred
async def test_a_protocol_error_is_a_warning_naming_the_peer(broker: Broker) -> None:
    service, bound = await broker.start(f"websmq+length32@tcp:0:{LOCAL}")
    port = int(bound[0].address.rsplit(":", 1)[1])
    with logged() as events:
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            peer = f"127.0.0.1:{raw.getsockname()[1]}"
            await eventually(lambda: named(events, "connect", peer=peer))
            raw.sendall(BROKEN)
            await eventually(lambda: named(events, "disconnect", peer=peer))
        finally:
            raw.close()

    (error,) = named(events, "protocol_error")
    assert error["log_level"] is LogLevel.warn
    assert (error["protocol"], error["transport"], error["peer"]) == ("websmq", "length32", peer)
    assert error["error"] and isinstance(error["error"], str)
    (connect,) = named(events, "connect", peer=peer)
    assert error["session"] == connect["session"]


@pytest_twisted.ensureDeferred
async def test_a_nydus_connection_names_its_client_id(broker: Broker) -> None:
    service, bound = await broker.start(f"nydus+lines@tcp:0:{LOCAL}")
    with logged() as events:
        client = await wait_for(nydus_connect(reactor, bound[0].address))
        (client_id,) = service.server("nydus").clients
        await wait_for(client.close())
        await eventually(lambda: named(events, "disconnect"))
    (connect,) = named(events, "connect")
    assert (connect["protocol"], connect["transport"], connect["client"]) == (
        "nydus", "lines", client_id)
    assert client_id in formatEvent(connect)
    assert named(events, "disconnect")[0]["client"] == client_id


class Device(protocol.Protocol):
    def connectionMade(self) -> None:
        self.factory.devices.append(self)


@pytest_twisted.ensureDeferred
async def test_phyllo_links_log_up_and_down(broker: Broker) -> None:
    factory = protocol.ServerFactory.forProtocol(Device)
    factory.devices = []
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    with logged() as events:
        try:
            service, _ = await broker.start(
                f"websmq+ws@tcp:0:{LOCAL}",
                phyllo=(parse_phyllo(f"esp32@tcp:127.0.0.1:{port.getHost().port}"),),
            )
            await eventually(lambda: named(events, "link_up"))
        finally:
            await wait_for(port.stopListening())
        factory.devices[0].transport.loseConnection()
        await eventually(lambda: named(events, "link_down"))
    (up,) = named(events, "link_up")
    assert (up["link"], up["protocol"], up["stack"], up["log_level"]) == (
        "esp32", "phyllo", "reduced", LogLevel.info)
    (down,) = named(events, "link_down")
    assert (down["link"], down["to_hub"], down["crc_errors"]) == ("esp32", 0, 0)
    assert down["reason"]


@pytest_twisted.ensureDeferred
async def test_serve_writes_the_events_as_json_lines(
    children: list[Child], tmp_path: Path
) -> None:
    log_file = tmp_path / "wireproto.log"
    config = tmp_path / "wireproto.toml"
    config.write_text(
        f'[log]\nformat = "json"\nlevel = "info"\nfile = "{log_file}"\n\n'
        '[[listen]]\nprotocol = "websmq"\ntransport = "length32"\n'
        f'endpoint = "tcp:0:{LOCAL}"\n'
    )
    child = Child(sys.executable, "-m", "wireproto", "serve", "--config", str(config))
    children.append(child)
    listening = await child.line(LISTENER_LINE)
    port = int(listening.group(3).rsplit(":", 1)[1])

    good = socket.create_connection(("127.0.0.1", port), timeout=5)
    bad = socket.create_connection(("127.0.0.1", port), timeout=5)
    peers = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in (good, bad)]
    bad.sendall(BROKEN)
    assert bad.recv(1) == b""  # the broker closed it
    bad.close()
    good.close()

    def read() -> list[dict]:
        if not log_file.exists():
            return []
        with log_file.open() as stream:
            return list(eventsFromJSONLogFile(stream))

    await eventually(lambda: len(named(read(), "disconnect")) == 2, timeout=15)
    text = log_file.read_text()
    records = [record for record in text.split("\x1e") if record.strip()]
    assert all(record.endswith("\n") for record in records)  # one JSON object per line
    events = read()
    assert len(events) == len(records)
    assert {e["peer"] for e in named(events, "connect")} == set(peers)
    (error,) = named(events, "protocol_error")
    assert (error["peer"], error["protocol"], error["transport"]) == (
        peers[1], "websmq", "length32")
    assert error["log_level"] is LogLevel.warn
    assert all(e["log_namespace"] == "wireproto.hub" for e in events if e.get("event") in EVENTS)
    assert formatEvent(named(events, "connect", peer=peers[0])[0]).startswith("websmq session ")
