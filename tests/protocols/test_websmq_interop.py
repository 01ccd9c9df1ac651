"""The WEBSMQ broker with a peer that shares none of its code: a Node.js client on the `ws`
package (tests/interop/websmq_ws_client.js), written from the spec alone."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import protocol, reactor

from tests.protocols.test_websmq_broker import Broker, closed, subscribed
from tests.support import Inbox, eventually, need_interop_peer, wait_for
from wireproto.codecs.websmq import LastWill, Publish
from wireproto.hub import Hub
from wireproto.protocols.websmq.client import connect

INTEROP = Path(__file__).resolve().parents[1] / "interop"
CLIENT = INTEROP / "websmq_ws_client.js"



class NodeClient(protocol.ProcessProtocol):
    """The Node client as a child process: commands in on stdin, JSON events out on stdout."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self._partial = b""
        self.ended = False

    def outReceived(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        self.events.extend(json.loads(line) for line in lines if line)

    def processEnded(self, reason) -> None:
        self.ended = True

    def command(self, line: str) -> None:
        self.transport.write(line.encode() + b"\n")

    def frames(self) -> list[tuple[str, str, str]]:
        return [(e["type"], e["topic"], e["payload"]) for e in self.events if e["event"] == "frame"]

    def closes(self) -> list[dict]:
        return [e for e in self.events if e["event"] == "close"]

    def kill(self) -> None:
        if not self.ended:
            os.kill(self.transport.pid, signal.SIGKILL)


async def start_node(url: str) -> NodeClient:
    executable = need_interop_peer(INTEROP / "node_modules" / "ws", "the Node.js WEBSMQ client")
    node = NodeClient()
    reactor.spawnProcess(node, executable, ["node", str(CLIENT), url], env=os.environ)
    await eventually(lambda: any(e["event"] == "open" for e in node.events), timeout=10)
    return node


@pytest_twisted.async_yield_fixture
async def broker():
    running = await Broker(Hub()).start()
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_node_ws_client_and_python_tcp_client_exchange_and_see_the_will(broker):
    node = await start_node(broker.ws_url)
    tcp = await wait_for(connect(reactor, broker.tcp))
    try:
        before = len(broker.hub.subscribers("browser/in"))
        node.command("sub browser/in")
        await eventually(lambda: len(broker.hub.subscribers("browser/in")) > before)
        inbox = Inbox()
        await subscribed(broker.hub, tcp, "sensors/temp", inbox)
        await subscribed(broker.hub, tcp, "clients/node", inbox)

        await tcp.publish("browser/in", "21.5 °C".encode())
        node.command("pub sensors/temp 19.0")
        await eventually(lambda: node.frames())
        assert node.frames() == [("publish", "browser/in", "21.5 °C")]
        assert await inbox.wait(1) == [Publish("sensors/temp", b"19.0")]
        assert all(e["binary"] for e in node.events if e["event"] == "frame")

        node.command("will clients/node gone")
        await eventually(lambda: any(s.will for s in broker.hub.sessions))
        node.kill()  # no close frame, no FIN from a clean close: the process is simply gone
        assert (await inbox.wait(2))[1] == LastWill("clients/node", b"gone")
    finally:
        node.kill()
        await closed(tcp)


@pytest.mark.parametrize(
    ("command", "reason_part"),
    [("raw 40", "1 byte"), ("raw 4003612062", "topic"), ("text hello", "text frame")],
)
@pytest_twisted.ensureDeferred
async def test_node_client_sending_a_bad_frame_gets_1002_and_others_carry_on(
    broker, command, reason_part
):
    bad = await start_node(broker.ws_url)
    good = await start_node(broker.ws_url)
    try:
        bad.command(command)
        await eventually(bad.closes)
        (close,) = bad.closes()
        assert close["code"] == 1002 and reason_part in close["reason"]
        good.command("sub still/here")
        await eventually(lambda: broker.hub.subscribers("still/here"))
        tcp = await wait_for(connect(reactor, broker.tcp))
        await tcp.publish("still/here", b"yes")
        await eventually(good.frames)
        assert good.frames() == [("publish", "still/here", "yes")]
        await closed(tcp)
    finally:
        bad.kill()
        good.kill()
