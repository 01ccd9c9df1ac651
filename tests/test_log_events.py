"""Structured log events: connect, disconnect, will, protocol errors and Phyllo links, captured from
the global log publisher around a real broker, and read back from `wireproto serve`'s JSON log."""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest_twisted
from twisted.logger import LogLevel, formatEvent, globalLogPublisher

from tests.brokers import Broker
from tests.support import eventually, wait_for
from tests.test_cli import children
from tests.test_metrics import http_base, scrape

__all__ = ["children"]  # the fixture, from tests.test_cli

LOCAL = "interface=127.0.0.1"
# A length32 frame holding a WEBSMQ LastWill whose topic length runs past its end.
BROKEN = struct.pack(">I", 2) + b"\xff\xff"
EVENTS = ("connect", "disconnect", "will", "protocol_error", "link_up", "link_down")


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
    assert [e["event"] for e in hub_events if e["log_level"] is not LogLevel.debug] == [
        "connect", "connect", "disconnect", "will"]
    # The subscription, at debug (shown: nothing here has said debug is off).
    (subscribe,) = named(events, "subscribe")
    assert subscribe["log_level"] is LogLevel.debug and subscribe["topic"] == "gone"
    (watcher_connect,) = [e for e in named(events, "connect") if e["peer"] != leaver_peer]
    assert (subscribe["session"], subscribe["peer"], subscribe["pattern"]) == (
        watcher_connect["session"], watcher_connect["peer"], False)


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
    # Logged once: the transport does not log what the protocol already has.
    warnings = [e for e in events if e["log_level"] is LogLevel.warn]
    assert warnings == [error]
    assert "IPv4Address" not in formatEvent(error)


@pytest_twisted.ensureDeferred
async def test_bad_frames_are_logged_at_a_bounded_rate_and_the_rest_counted(broker) -> None:
    from wireproto.peerlog import BUDGET, PER_KEY

    service, bound = await broker.start(f"websmq+length32@tcp:0:{LOCAL}",
                                        f"websmq+ws@tcp:0:{LOCAL}")
    port = int(bound[0].address.rsplit(":", 1)[1])
    with logged() as events:
        sockets = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(40)]
        try:
            for raw in sockets:
                raw.sendall(BROKEN)
            await eventually(lambda: len(named(events, "disconnect")) == 40)
        finally:
            for raw in sockets:
                raw.close()
        warnings = [e for e in events if e["log_level"] is LogLevel.warn]
        assert len(warnings) == PER_KEY
        assert BUDGET.suppressed_total >= 40 - PER_KEY
        BUDGET.flush()  # the end of the period
    (summary,) = named(events, "log_suppressed")
    assert summary["count"] == 40 - PER_KEY
    metrics = await scrape(http_base(bound[1].address))
    assert metrics.value("wireproto_log_lines_suppressed_total") == BUDGET.suppressed_total

