"""SIGTERM closes every connection cleanly, as docs/running.md promises: a held Engine.IO poll is
answered with the close packet (the real engine.io-client sees "transport close", not a
transport error), a WebSocket gets a closing handshake with 1001 (going away), and a stream
client gets everything sent before a clean FIN."""

from __future__ import annotations

import os
import re
import signal
import sys

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.error import ConnectionDone

from tests.support import eventually, need_interop_peer, wait_for
from tests.test_cli import LISTENER_LINE, Child, children
from tests.transports.test_engineio import INTEROP, NodeClient
from wireproto.protocols.websmq.client import connect

__all__ = ["children"]  # the fixture, from tests.test_cli

LOCAL = "interface=127.0.0.1"


async def start_broker(children: list[Child], *listen: str) -> tuple[Child, dict[str, str]]:
    args = [arg for spec in listen for arg in ("--listen", spec)]
    child = Child(sys.executable, "-m", "wireproto", "serve", *args)
    children.append(child)
    await child.line(re.compile(r"^wireproto: ready"))
    addresses = {}
    for line in child.stdout:
        match = LISTENER_LINE.match(line)
        if match:
            addresses[f"{match.group(1)}+{match.group(2)}"] = match.group(3)
    return child, addresses


def poll_sent_after_first_message(node: NodeClient) -> int | None:
    """The local port of the first long-poll GET written out after the first message."""
    kinds = [event["event"] for event in node.events]
    if "message" not in kinds:
        return None
    after = node.events[kinds.index("message"):]
    return next((event["port"] for event in after if event["event"] == "poll sent"), None)


def unread_bytes(server_port: int, client_port: int) -> int | None:
    """What the server's end of the TCP connection from `client_port` (on 127.0.0.1) holds
    that the server has not read; None while there is no such connection."""
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if (int(local.rsplit(":", 1)[1], 16) == server_port
                    and int(remote.rsplit(":", 1)[1], 16) == client_port):
                return int(fields[4].split(":")[1], 16)
    return None


@pytest_twisted.ensureDeferred
async def test_sigterm_answers_a_held_engineio_poll_with_the_close_packet(
    children: list[Child],
) -> None:
    executable = need_interop_peer(INTEROP / "node_modules" / "engine.io-client",
                                   "the real engine.io-client")
    child, addresses = await start_broker(children, f"nydus+engineio@tcp:0:{LOCAL}")
    node = NodeClient()
    base = addresses["nydus+engineio"].rsplit("/engine.io/", 1)[0]
    reactor.spawnProcess(node, executable,
                         ["node", str(INTEROP / "engineio_client.js"), base, "polling"],
                         env=os.environ)
    try:
        await eventually(lambda: node.of("message"), timeout=10)  # nydus's welcome: polling
        # The poll the close packet answers: sent after the welcome, and read by the broker
        # (SIGTERM first stops listening: a poll still on its way would be refused).
        port = await eventually(lambda: poll_sent_after_first_message(node), timeout=10)
        broker_port = int(base.rsplit(":", 1)[1])
        await eventually(lambda: unread_bytes(broker_port, port) == 0, timeout=10)
        child.process.send_signal(signal.SIGTERM)
        assert await child.exit_code() == 0, child.output()
        await eventually(lambda: node.of("close"), timeout=10)
        assert node.of("close")[0]["reason"] == "transport close", node.events
        assert not node.of("error"), node.events
        assert child.stderr == [], child.output()
    finally:
        node.kill()


@pytest_twisted.ensureDeferred
async def test_sigterm_closes_websockets_with_1001_and_streams_cleanly(
    children: list[Child],
) -> None:
    child, addresses = await start_broker(
        children, f"websmq+ws@tcp:0:{LOCAL}", f"websmq+length32@tcp:0:{LOCAL}",
    )
    websocket = await wait_for(connect(reactor, addresses["websmq+ws"]))
    stream = await wait_for(connect(reactor, addresses["websmq+length32"]))
    # The stream is connected once the kernel has queued it for the broker, which may not have
    # taken it yet: one SIGTERM stops listening, and the kernel resets what is still queued.
    # The broker has the stream once it delivers to it.
    heard: list = []
    stream.subscribe("ready", heard.append)

    def delivered() -> bool:
        websocket.publish("ready", b"")
        return bool(heard)

    await eventually(delivered, timeout=10, interval=0.05)
    child.process.send_signal(signal.SIGTERM)
    assert await child.exit_code() == 0, child.output()
    assert isinstance(await wait_for(websocket.when_closed()), ConnectionDone)
    assert websocket.transport.closeCode == 1001
    assert isinstance(await wait_for(stream.when_closed()), ConnectionDone)
    assert child.stderr == [], child.output()
