"""`wireproto call`, `produce` and `events` as real subprocesses against a broker in this process:
answers, failures, timeouts, events through the hub, refused handshakes and bad addresses."""

from __future__ import annotations

import json
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest_twisted
from twisted.internet import defer, reactor

from tests.brokers import LOCAL, Broker
from tests.support import Inbox, eventually, wait_for
from tests.test_cli import Child
from wireproto.config import NydusSettings, SubbleSettings
from wireproto.protocols.nydus.server import InvokeError
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.service import WireprotoService

LISTENERS = (
    f"ubre+ws@tcp:0:{LOCAL}",
    f"ubre+lines@tcp:0:{LOCAL}",
    f"nydus+engineio@tcp:0:{LOCAL}",
    f"nydus+lines@tcp:0:{LOCAL}",
    f"subble+ws@tcp:0:{LOCAL}",
    f"subble+length32@tcp:0:{LOCAL}",
)
ONE_LINE_ERROR = re.compile(r"^wireproto (call|produce|events): \S.*$")


class Tool(Child):
    """``python -m wireproto ARGS...``, with `stdin` text (or nothing: /dev/null)."""

    def __init__(self, *args: str, stdin: str | None = None, hold_stdin: bool = False) -> None:
        super().__init__(sys.executable, "-m", "wireproto", *args, stdin=stdin,
                         hold_stdin=hold_stdin)

    async def result(self, timeout: float = 20) -> int:
        return await self.exit_code(timeout)

    def error_line(self) -> str:
        """Its one line on stderr, checked to be one line in the tools' form."""
        assert len(self.stderr) == 1, self.output()
        assert ONE_LINE_ERROR.match(self.stderr[0]), self.output()
        return self.stderr[0]


class Rig:
    """A broker with UBRE and nydus handlers, and the tools started against it."""

    def __init__(self) -> None:
        self.broker = Broker()
        self.tools: list[Tool] = []
        self.service: WireprotoService
        self.address: dict[tuple[str, str], str] = {}

    async def start(self, **config: Any) -> WireprotoService:
        service, bound = await self.broker.start(*LISTENERS, **config)
        self.service = service
        for entry in bound:
            self.address[entry.listener.protocol, entry.listener.transport] = entry.address
        ubre = service.server("ubre")
        ubre.handle("add", lambda body, peer: sum(body))
        ubre.handle("fail", lambda body, peer: _raise(ValueError("no such thing\nat all")))
        ubre.handle("never", lambda body, peer: defer.Deferred())
        nydus = service.server("nydus")
        nydus.register_route("/add", lambda invocation: sum(invocation.body))
        nydus.register_route("/echo", lambda invocation: {"body": invocation.body})
        nydus.register_route("/fail", lambda invocation: _raise(InvokeError(409, "Taken")))
        nydus.register_route("/never", lambda invocation: defer.Deferred())
        return service

    def run(self, *args: str, stdin: str | None = None, hold_stdin: bool = False) -> Tool:
        tool = Tool(*args, stdin=stdin, hold_stdin=hold_stdin)
        self.tools.append(tool)
        return tool

    async def subscribed(self, topic: str, protocol: str = "subble") -> None:
        await eventually(
            lambda: any(s.protocol == protocol for s in self.service.hub.subscribers(topic)),
            timeout=15,
        )

    async def close(self) -> None:
        for tool in self.tools:
            tool.kill()
        await self.broker.close()


def _raise(error: Exception) -> Any:
    raise error


@pytest_twisted.async_yield_fixture
async def rig() -> AsyncIterator[Rig]:
    running = Rig()
    try:
        yield running
    finally:
        await running.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- call -----------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_call_answers_over_ubre_and_nydus(rig: Rig) -> None:
    await rig.start()
    ubre_ws = rig.run("call", rig.address["ubre", "ws"], "add", "[1, 2, 3]")
    ubre_lines = rig.run("call", "-p", "ubre", rig.address["ubre", "lines"], "add", "[4,5]",
                         "--json")
    nydus_eio = rig.run("call", rig.address["nydus", "engineio"], "/add", stdin="[10, 20]\n")
    nydus_lines = rig.run("call", "-p", "nydus", rig.address["nydus", "lines"], "/echo", "hello")
    nydus_none = rig.run("call", rig.address["nydus", "engineio"], "/echo")

    assert await ubre_ws.result() == 0, ubre_ws.output()
    assert ubre_ws.stdout == ["6"]
    assert await ubre_lines.result() == 0, ubre_lines.output()
    [line] = ubre_lines.stdout
    answer = json.loads(line)
    assert answer["result"] == 9 and answer["ms"] >= 0 and set(answer) == {"result", "ms"}
    assert await nydus_eio.result() == 0, nydus_eio.output()
    assert nydus_eio.stdout == ["30"]
    assert await nydus_lines.result() == 0, nydus_lines.output()
    assert nydus_lines.stdout == ['{"body":"hello"}']  # a bare word is a string
    assert await nydus_none.result() == 0, nydus_none.output()
    assert nydus_none.stdout == ['{"body":null}']  # /dev/null on stdin: no data
    for tool in (ubre_ws, ubre_lines, nydus_eio, nydus_lines, nydus_none):
        assert tool.stderr == [], tool.output()


@pytest_twisted.ensureDeferred
async def test_call_failures_and_timeouts_are_one_line(rig: Rig) -> None:
    await rig.start()
    ubre_fail = rig.run("call", rig.address["ubre", "ws"], "fail", "--json")
    ubre_missing = rig.run("call", rig.address["ubre", "ws"], "nobody")
    nydus_fail = rig.run("call", rig.address["nydus", "engineio"], "/fail")
    ubre_never = rig.run("call", rig.address["ubre", "ws"], "never", "--timeout", "1")
    nydus_never = rig.run("call", "-p", "nydus", rig.address["nydus", "lines"], "/never",
                          "--timeout", "1")

    assert await ubre_fail.result() == 1, ubre_fail.output()
    assert ubre_fail.error_line() == (
        "wireproto call: fail failed: ValueError: no such thing at all"
    )
    [line] = ubre_fail.stdout
    assert json.loads(line)["error"]["message"] == "no such thing\nat all"
    assert await ubre_missing.result() == 1, ubre_missing.output()
    assert ubre_missing.error_line() == 'wireproto call: nobody failed: "NotFound"'
    assert await nydus_fail.result() == 1, nydus_fail.output()
    assert nydus_fail.error_line() == "wireproto call: /fail failed: 409 Taken"
    assert nydus_fail.stdout == []
    for never, name in ((ubre_never, "never"), (nydus_never, "/never")):
        assert await never.result() == 5, never.output()
        assert never.error_line() == f"wireproto call: {name}: no answer within 1 s"


@pytest_twisted.ensureDeferred
async def test_unreachable_and_bad_addresses(rig: Rig) -> None:
    port = closed_port()
    refused = rig.run("call", f"ws://127.0.0.1:{port}/ubre", "add", "[1]")
    refused_events = rig.run("events", f"tcp:127.0.0.1:{port}", "-t", "x")
    no_protocol = rig.run("call", f"tcp:127.0.0.1:{port}", "add")
    bad_endpoint = rig.run("call", "-p", "ubre", "nonsense:here", "add")
    bad_url = rig.run("produce", "ws://127.0.0.1:port/subble", "-t", "x", "-m", "1")
    wrong_protocol = rig.run("produce", f"ws://127.0.0.1:{port}/ubre", "-t", "x", "-m", "1")

    for tool in (refused, refused_events):
        assert await tool.result() == 3, tool.output()
        assert "refused" in tool.error_line()
    assert await no_protocol.result() == 2, no_protocol.output()
    assert "--protocol" in no_protocol.error_line()
    for tool in (bad_endpoint, bad_url, wrong_protocol):
        assert await tool.result() == 2, tool.output()
        tool.error_line()


# -- produce and events ---------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_produced_events_reach_events_and_other_protocols(rig: Rig) -> None:
    service = await rig.start()
    subble_tcp, subble_ws = rig.address["subble", "length32"], rig.address["subble", "ws"]
    listener = rig.run("events", subble_tcp, "-t", "temp", "-t", "notes", "-C", "4", "--json")
    plain = rig.run("events", subble_ws, "-t", "temp", "-C", "1")
    ubre = await wait_for(ubre_connect(reactor, rig.address["ubre", "ws"]))
    try:
        on_ubre = Inbox()
        ubre.subscribe("temp", on_ubre)
        await rig.subscribed("temp", "ubre")
        await rig.subscribed("notes")
        await eventually(lambda: len([
            s for s in service.hub.subscribers("temp") if s.protocol == "subble"
        ]) == 2, timeout=15)

        one = rig.run("produce", subble_ws, "-t", "temp", "-m", '{"c": 21.5}', "--json")
        assert await one.result() == 0, one.output()
        [echo] = map(json.loads, one.stdout)
        assert echo["type"] == "temp" and echo["data"] == {"c": 21.5}
        assert echo["format"] == "msgpack"
        lines = rig.run("produce", subble_tcp, "-t", "notes", "--format", "json",
                        "--client-id", "writer", stdin="first note\n[1, 2]\n")
        assert await lines.result() == 0, lines.output()
        assert lines.stdout == [] and lines.stderr == []
        await ubre.publish("notes", {"from": "ubre"})

        assert await listener.result() == 0, listener.output()
        events = [json.loads(line) for line in listener.stdout]
        assert [(e["type"], e["data"]) for e in events] == [
            ("temp", {"c": 21.5}), ("notes", "first note"), ("notes", [1, 2]),
            ("notes", {"from": "ubre"}),
        ]
        assert events[0]["id"] == echo["id"] and events[0]["source"] == echo["source"]
        assert events[1]["source"] == "writer" and events[1]["format"] == "json"
        assert events[3]["source"] == "ubre"
        assert await plain.result() == 0, plain.output()
        assert plain.stdout == ['temp {"c":21.5}']
        [message] = await on_ubre.wait()
        assert message.body == {"c": 21.5}
    finally:
        await wait_for(ubre.close())


@pytest_twisted.ensureDeferred
async def test_events_timeout_count_and_ctrl_c(rig: Rig) -> None:
    await rig.start()
    address = rig.address["subble", "length32"]
    short = rig.run("events", address, "-t", "quiet", "-C", "1", "--timeout", "1")
    listening = rig.run("events", address, "-t", "quiet", "--timeout", "1")
    forever = rig.run("events", address, "-t", "other")

    assert await short.result() == 5, short.output()
    assert short.error_line() == "wireproto events: 0 of 1 events within 1 s"
    assert await listening.result() == 0, listening.output()
    await rig.subscribed("other")
    forever.process.send_signal(signal.SIGINT)
    assert await forever.result() == 0, forever.output()
    assert forever.stderr == []
    await eventually(lambda: not rig.service.hub.subscribers("other"))


@pytest_twisted.ensureDeferred
async def test_refused_event_exits_1(rig: Rig) -> None:
    service = await rig.start()

    def refuse(client: Any, event_type: str, payload: bytes, format: Any) -> None:
        raise RuntimeError("not now")

    service.server("subble").on_event = refuse
    tool = rig.run("produce", rig.address["subble", "ws"], "-t", "door", "-m", "open")
    assert await tool.result() == 1, tool.output()
    assert tool.error_line().startswith(
        "wireproto produce: door: refused with 52, the host did not create the event"
    )


@pytest_twisted.ensureDeferred
async def test_refused_handshakes_exit_4(rig: Rig) -> None:
    await rig.start(subble=SubbleSettings(enforce_registry=True, allow_new_clients=False),
                    nydus=NydusSettings())
    address = rig.address["subble", "length32"]
    events = rig.run("events", address, "-t", "x", "--client-id", "stranger")
    produce = rig.run("produce", rig.address["subble", "ws"], "-t", "x", "-m", "1")
    assert await events.result() == 4, events.output()
    assert events.error_line().startswith(
        f"wireproto events: {address}: handshake refused with 12, the client ID is not in the "
        "host's registry"
    )
    assert await produce.result() == 4, produce.output()
    assert "handshake refused with 11, the host does not give new client IDs" in (
        produce.error_line()
    )


@pytest_twisted.ensureDeferred
async def test_ctrl_c_stops_every_tool_quietly_and_closes_its_connection(rig: Rig) -> None:
    # Ctrl-C gave 0 for some tools, 1 with no message for produce and 3 ("Connection lost")
    # for call: now 130 for a tool with work left, 0 for one that runs until stopped.
    await rig.start()
    hub = rig.service.hub
    ubre = rig.address["ubre", "lines"]
    subble = rig.address["subble", "length32"]
    calling = rig.run("call", "-p", "ubre", ubre, "never", "1")
    producing = rig.run("produce", subble, "-t", "reading", stdin="1\n", hold_stdin=True)
    publishing = rig.run("pub", "-p", "ubre", ubre, "-t", "news", stdin="first\n",
                         hold_stdin=True)
    listening = rig.run("events", subble, "-t", "reading")
    await eventually(lambda: len(hub.sessions) == 4, timeout=15)
    await rig.subscribed("reading")
    for tool in (calling, producing, publishing, listening):
        tool.process.send_signal(signal.SIGINT)
    for tool, status in ((calling, 130), (producing, 130), (publishing, 130), (listening, 0)):
        assert await tool.result() == status, tool.output()
        assert tool.stderr == [], tool.output()
    await eventually(lambda: not hub.sessions)
