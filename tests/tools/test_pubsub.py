"""`wireproto pub` and `wireproto sub` as real processes, against a real broker started here (and
a Phyllo device played on a pty): messages across WEBSMQ and UBRE through the hub, stdin lines,
--json, -C, --timeout, Ctrl-C, wildcards, and one-line errors with their exit codes."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.brokers import start_service
from tests.phyllo.test_bridge import PtyDevice, document
from tests.support import eventually, sleep, wait_for
from tests.test_cli import Child
from wireproto.codecs.phyllo import PubSubMessage, TypeCode
from wireproto.codecs.phyllo.document import deserialize, document_from_message
from wireproto.codecs.phyllo.stack import MINIMAL
from wireproto.config import Config, WebsmqSettings, parse_listen
from wireproto.hub import Session
from wireproto.service import make_service

LOCAL = "interface=127.0.0.1"


class Tool(Child):
    """``python -m wireproto ARGS`` with `stdin` written to it and closed."""

    def __init__(self, *args: str, stdin: str | None = None) -> None:
        super().__init__(sys.executable, "-m", "wireproto", *args, stdin=stdin)


class Broker:
    """A broker on port 0 (WEBSMQ and UBRE over ws, length32 and lines) and the tools run
    against it; everything is stopped at the end of the test."""

    def __init__(self) -> None:
        self.service: Any = None
        self.tools: list[Tool] = []

    async def start(self, wildcards: bool = False, tls: Any = None) -> dict[str, str]:
        specs = {
            "websmq": f"websmq+ws@tcp:0:{LOCAL}",
            "ubre": f"ubre+ws@tcp:0:{LOCAL}",
            "websmq_tcp": f"websmq+length32@tcp:0:{LOCAL}",
            "ubre_tcp": f"ubre+lines@tcp:0:{LOCAL}",
        }
        if tls is not None:
            secure = f"ssl:0:{LOCAL}:privateKey={tls.key}:certKey={tls.cert}"
            specs["websmq_wss"] = f"websmq+ws@{secure}"
            specs["ubre_ssl"] = f"ubre+lines@{secure}"
        config = Config(listeners=tuple(parse_listen(spec) for spec in specs.values()),
                        websmq=WebsmqSettings(wildcards=wildcards))
        self.service, bound = await start_service(config)
        return {name: entry.address for name, entry in zip(specs, bound, strict=True)}

    def run(self, *args: str, stdin: str | None = None) -> Tool:
        tool = Tool(*args, stdin=stdin)
        self.tools.append(tool)
        return tool

    async def subscribed(self, topic: str, count: int = 1) -> None:
        """Wait until `count` connections subscribe to `topic` (WEBSMQ has no ack)."""
        hub = self.service.hub
        await eventually(
            lambda: sum(isinstance(s, Session) for s in hub.subscribers(topic)) >= count,
            timeout=10,
        )

    async def close(self) -> None:
        for tool in self.tools:
            tool.kill()
        if self.service is not None and self.service.running:
            await wait_for(self.service.stopService(), timeout=10)


@pytest_twisted.async_yield_fixture
async def broker() -> AsyncIterator[Broker]:
    running = Broker()
    try:
        yield running
    finally:
        await running.close()


async def finished(tool: Tool, code: int = 0) -> list[str]:
    """Wait for `tool` to exit with `code`; its stdout lines."""
    assert await tool.exit_code() == code, tool.output()
    return tool.stdout


async def one_error(tool: Tool, code: int, start: str = "wireproto ") -> str:
    """`tool` exits with `code` after one line on stderr (no traceback) that starts with
    `start`, and prints nothing on stdout."""
    await finished(tool, code)
    assert len(tool.stderr) == 1 and tool.stdout == [], tool.output()
    assert tool.stderr[0].startswith(start), tool.output()
    return tool.stderr[0]


# -- across protocols, through the hub ------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_pub_on_either_protocol_reaches_sub_on_both(broker: Broker) -> None:
    address = await broker.start()
    on_websmq = broker.run("sub", address["websmq"], "-t", "cli/temp", "-C", "2")
    on_ubre = broker.run("sub", address["ubre"], "-t", "cli/temp", "-C", "2", "--json")
    await broker.subscribed("cli/temp", 2)

    assert await finished(broker.run("pub", address["websmq"], "-t", "cli/temp", "-m", "21.5")) \
        == []
    assert await finished(broker.run("pub", address["ubre"], "-t", "cli/temp", "-m", "hello")) \
        == []

    # A UBRE string travels through the hub as its JSON text, which WEBSMQ shows as it is.
    assert await finished(on_websmq) == ["cli/temp 21.5", 'cli/temp "hello"']
    assert [json.loads(line) for line in await finished(on_ubre)] == [
        {"topic": "cli/temp", "payload": "21.5", "protocol": "ubre", "value": 21.5},
        {"topic": "cli/temp", "payload": "hello", "protocol": "ubre", "value": "hello"},
    ]
    assert on_websmq.stderr == on_ubre.stderr == []


@pytest_twisted.ensureDeferred
async def test_each_stdin_line_is_a_message(broker: Broker) -> None:
    address = await broker.start()
    on_ubre = broker.run("sub", address["ubre_tcp"], "-p", "ubre", "-t", "lines", "-C", "3",
                         "--json")
    on_websmq = broker.run("sub", address["websmq_tcp"], "-p", "websmq", "-t", "lines", "-C", "3")
    await broker.subscribed("lines", 2)

    # Over length32-framed TCP; as mosquitto_pub -l, a blank line is not sent.
    publisher = broker.run("pub", address["websmq_tcp"], "-p", "websmq", "-t", "lines",
                           stdin='one\n\n{"a": [1, 2]}\r\n3')
    assert await finished(publisher) == []
    assert publisher.stderr == []

    assert await finished(on_websmq) == ["lines one", 'lines {"a": [1, 2]}', "lines 3"]
    assert [json.loads(line) for line in await finished(on_ubre)] == [
        {"topic": "lines", "payload": "one", "protocol": "ubre", "value": "one"},
        {"topic": "lines", "payload": '{"a":[1,2]}', "protocol": "ubre", "value": {"a": [1, 2]}},
        {"topic": "lines", "payload": "3", "protocol": "ubre", "value": 3},
    ]


@pytest_twisted.ensureDeferred
async def test_ubre_lines_go_out_as_json_values(broker: Broker) -> None:
    address = await broker.start()
    on_websmq = broker.run("sub", address["websmq"], "-t", "values", "-C", "3", "--json")
    await broker.subscribed("values")
    publisher = broker.run("pub", address["ubre_tcp"], "-p", "ubre", "-t", "values",
                           stdin='{ "c" : 21.5 }\n[1, "two"]\nplain text\n')
    assert await finished(publisher) == []
    assert [json.loads(line) for line in await finished(on_websmq)] == [
        {"topic": "values", "payload": '{"c":21.5}', "protocol": "websmq"},
        {"topic": "values", "payload": '[1,"two"]', "protocol": "websmq"},
        {"topic": "values", "payload": '"plain text"', "protocol": "websmq"},
    ]


# -- ending: -C, --timeout, Ctrl-C ---------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_sub_times_out_with_5_and_stops_on_ctrl_c_with_0(broker: Broker) -> None:
    address = await broker.start()
    waiting = broker.run("sub", address["websmq"], "-t", "quiet", "-C", "1", "--timeout", "1")
    listening = broker.run("sub", address["websmq"], "-t", "quiet", "--timeout", "1")
    following = broker.run("sub", address["ubre"], "-t", "quiet")
    assert await one_error(waiting, 5) == "wireproto sub: timed out: 0 of 1 messages within 1 s"
    # Without -C, --timeout is a window to listen in: nothing more was asked for.
    assert await finished(listening) == []
    assert listening.stderr == []

    await broker.subscribed("quiet")
    await sleep(1.5)  # without --timeout, no limit once connected
    assert following.process.poll() is None, following.output()
    following.process.send_signal(signal.SIGINT)
    assert await finished(following) == []
    assert following.stderr == []
    # It closed its connection on the way out.
    await eventually(lambda: not broker.service.hub.subscribers("quiet"))


@pytest_twisted.ensureDeferred
async def test_websmq_wildcards_need_the_brokers_wildcards(broker: Broker) -> None:
    address = await broker.start(wildcards=True)
    follower = broker.run("sub", address["websmq"], "-t", "rooms/+/temp", "-t", "alarms/#",
                          "-C", "2")
    await eventually(lambda: broker.service.hub.subscribers("alarms/fire"), timeout=10)
    for topic, payload in (("rooms/hall/temp", "19"), ("rooms/hall/hum", "40"),
                           ("alarms/fire", "now")):
        assert await finished(broker.run("pub", address["websmq"], "-t", topic, "-m",
                                         payload)) == []
    assert await finished(follower) == ["rooms/hall/temp 19", "alarms/fire now"]

    plain = Broker()
    try:
        address = await plain.start(wildcards=False)
        refused = plain.run("sub", address["websmq"], "-t", "alarms/#")
        line = await one_error(refused, 3, "wireproto sub: the connection closed: ")
        assert line.endswith("(WEBSMQ wildcards need the broker's --wildcards)")
    finally:
        await plain.close()


# -- Phyllo over a pty ---------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_phyllo_pub_writes_documents_and_byte_buffers(broker: Broker, tmp_path: Path) -> None:
    device = PtyDevice(tmp_path / "ttyACM0")
    try:
        address = f"serial:{device.link}"
        assert await finished(broker.run("pub", address, "-t", "led", "-m", '{"on": true}')) == []
        assert await finished(broker.run("pub", address, "-t", "led", "-m", "raw",
                                          "--bytes")) == []
        await eventually(lambda: len(device.poll()) >= 2)
        led, raw = device.received
        assert deserialize(document_from_message(led)) == {"on": True}
        assert raw == PubSubMessage(TypeCode.BYTES_BUFFER, b"led", b"raw")
    finally:
        device.unplug()

    minimal = PtyDevice(tmp_path / "ttyUSB0", MINIMAL)
    try:
        tool = broker.run("pub", f"serial:{minimal.link}", "--stack", "minimal", "-t", "t",
                          stdin="hello\n")
        assert await finished(tool) == []
        await eventually(minimal.poll)
        assert [deserialize(document_from_message(m)) for m in minimal.received] == ["hello"]
    finally:
        minimal.unplug()


@pytest_twisted.ensureDeferred
async def test_phyllo_sub_prints_what_the_device_sends(broker: Broker, tmp_path: Path) -> None:
    device = PtyDevice(tmp_path / "ttyACM0")
    try:
        follower = broker.run("sub", f"serial:{device.link}", "-t", "temp", "-t", "raw",
                              "-C", "2", "--json")

        async def device_sends_until_it_exits() -> None:
            # The host may open the line after a round was written: send each round again.
            while follower.process.poll() is None:
                device.send(document("temp", {"c": 21.5}))
                device.send(PubSubMessage(TypeCode.BYTES_BUFFER, b"other", b"not wanted"))
                device.send(PubSubMessage(TypeCode.BYTES_BUFFER, b"raw", b"\x00\xff"))
                await sleep(0.2)

        await wait_for(device_sends_until_it_exits(), timeout=15)
        received = sorted(map(json.loads, await finished(follower)), key=lambda r: r["topic"])
    finally:
        device.unplug()
    assert received == [
        {"topic": "raw", "payload_base64": "AP8=", "protocol": "phyllo"},
        {"topic": "temp", "payload": '{"c":21.5}', "protocol": "phyllo", "value": {"c": 21.5}},
    ]


# -- errors: one line, an exit code ----------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_errors_are_one_line_with_their_exit_code(broker: Broker, tmp_path: Path) -> None:
    address = await broker.start()
    port = address["websmq"].split(":")[2].split("/")[0]
    await broker.service.stopService()  # its ports are closed: refused from here on
    tools = [
        (broker.run("pub", f"ws://127.0.0.1:{port}/websmq", "-t", "t", "-m", "x"), 3,
         f"wireproto pub: cannot reach ws://127.0.0.1:{port}/websmq: "),
        (broker.run("sub", f"tcp:127.0.0.1:{port}", "-p", "ubre", "-t", "t"), 3,
         f"wireproto sub: cannot reach tcp:127.0.0.1:{port}: "),
        (broker.run("sub", f"serial:{tmp_path}/ttyNone", "-t", "t"), 3, "wireproto sub: "),
        (broker.run("pub", "ws://127.0.0.1:99999/websmq", "-t", "t", "-m", "x"), 2,
         "wireproto pub: cannot connect to 'ws://127.0.0.1:99999/websmq': "),
        (broker.run("sub", "tcp:127.0.0.1:8767", "-t", "t"), 2,
         "wireproto sub: cannot tell the protocol of 'tcp:127.0.0.1:8767': give --protocol"),
        (broker.run("pub", f"serial:{tmp_path}/ttyNone", "-t", "a-topic-over-15-bytes",
                    "-m", "x"), 2, "wireproto pub: Phyllo topic 'a-topic-over-15-bytes': "),
    ]
    for tool, code, start in tools:
        await one_error(tool, code, start)
    assert "ttyNone" in tools[2][0].stderr[0]


@pytest_twisted.ensureDeferred
async def test_a_path_the_broker_does_not_serve_is_refused_with_4(broker: Broker) -> None:
    address = await broker.start()
    unknown = address["websmq"].replace("/websmq", "/nothere")
    await one_error(broker.run("pub", unknown, "-p", "websmq", "-t", "t", "-m", "x"), 4,
                    "wireproto pub: ")
    await one_error(broker.run("sub", unknown, "-p", "ubre", "-t", "t"), 4, "wireproto sub: ")


@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_tls_is_verified_and_takes_cafile_or_insecure(broker: Broker, tls_files) -> None:
    address = await broker.start(tls=tls_files)
    wss = address["websmq_wss"].replace("127.0.0.1", "localhost")
    ssl = address["ubre_ssl"]  # ssl:127.0.0.1:PORT
    host, port = ssl.split(":")[1:]
    ubre_ssl = f"ssl:host={host}:port={port}"
    untrusted = broker.run("pub", wss, "-t", "t", "-m", "x")
    assert "certificate verify failed" in await one_error(untrusted, 4)
    untrusted_stream = broker.run("call", "-p", "ubre", ubre_ssl, "nothing", "1")
    await finished(untrusted_stream, 3)

    following = broker.run("sub", wss, "-t", "secure", "-C", "2", "--cafile",
                           str(tls_files.cert), "-H", "X-Token: abc")
    await broker.subscribed("secure")
    sent = broker.run("pub", "-p", "ubre", ubre_ssl, "-t", "secure", "-m", "one", "--cafile",
                      str(tls_files.cert))
    assert await finished(sent) == []
    insecure = broker.run("pub", wss, "-t", "secure", "-m", "two", "--insecure")
    assert await finished(insecure) == []
    assert await finished(following) == ['secure "one"', "secure two"]  # UBRE sends JSON
    bad = broker.run("pub", wss, "-t", "t", "-m", "x", "-H", "no colon")
    assert "write it as NAME:VALUE" in await one_error(bad, 2)


@pytest_twisted.ensureDeferred
async def test_whole_messages_from_a_file_stdin_or_nothing(broker: Broker, tmp_path) -> None:
    # mosquitto_pub's -f, -s, -n and -l.
    address = await broker.start()
    following = broker.run("sub", address["websmq"], "-t", "t", "-C", "4", "--payload-only")
    await broker.subscribed("t")
    document = tmp_path / "doc.txt"
    document.write_bytes(b"line one\nline two\n")
    for args, stdin in ((["-f", str(document)], None), (["-s"], "a\nb\n"), (["-n"], None),
                        (["-l"], "last\n")):
        assert await finished(broker.run("pub", address["websmq"], "-t", "t", *args,
                                         stdin=stdin)) == []
    # Payloads only, each as it came, one per line.
    assert await finished(following) == ["line one", "line two", "", "a", "b", "", "", "last"]
    both = broker.run("pub", address["websmq"], "-t", "t", "-m", "x", "-n")
    assert "not allowed with argument" in await one_error(both, 2)


def test_version_says_which_wireproto(capsys) -> None:
    from wireproto import __version__
    from wireproto.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"wireproto {__version__}\n"


@pytest_twisted.ensureDeferred
async def test_sub_reconnects_when_asked_to(broker: Broker) -> None:
    address = await broker.start()
    url = address["websmq"]
    staying = broker.run("sub", url, "-t", "t", "-C", "2", "--reconnect")
    await broker.subscribed("t")
    assert await finished(broker.run("pub", url, "-t", "t", "-m", "before")) == []
    await eventually(lambda: staying.stdout == ["t before"])
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    await wait_for(broker.service.stopService(), timeout=10)
    # The same broker again on the same port, a moment later.
    config = Config(listeners=(parse_listen(f"websmq+ws@tcp:{port}:{LOCAL}"),))
    broker.service = make_service(config, reactor)
    broker.service.startService()
    await wait_for(broker.service.when_listening())
    await broker.subscribed("t")
    assert await finished(broker.run("pub", url, "-t", "t", "-m", "after")) == []
    assert await finished(staying) == ["t before", "t after"]
    assert any("connecting again" in line for line in staying.stderr), staying.output()


@pytest_twisted.ensureDeferred
async def test_phyllo_over_websocket(broker: Broker) -> None:
    # The tools refused ws:// for Phyllo, which the broker's --phyllo links take.
    from tests.phyllo.test_bridge import WebSocketDevice
    from wireproto.transports import websocket_resource, websocket_site

    WebSocketDevice.devices = []
    site = websocket_site({"/phyllo": websocket_resource(WebSocketDevice)})
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    try:
        url = f"ws://127.0.0.1:{port.getHost().port}/phyllo"
        following = broker.run("sub", "-p", "phyllo", "--stack", "minimal", url, "-t", "temp",
                               "-C", "1")
        (device,) = await eventually(lambda: WebSocketDevice.devices, timeout=10)
        # Its subscription is its own: send until it has printed one (it exits after -C 1).
        await eventually(lambda: device.send(document("temp", {"c": 21.5})) or following.ended(),
                         timeout=10, interval=0.05)
        assert await finished(following) == ['temp {"c":21.5}']
        sent = broker.run("pub", "-p", "phyllo", "--stack", "minimal", url, "-t", "led",
                          "-m", "true")
        assert await finished(sent) == []
        await eventually(lambda: len(WebSocketDevice.devices) == 2 and
                         WebSocketDevice.devices[1].received)
        assert WebSocketDevice.devices[1].received == [document("led", True)]
    finally:
        await wait_for(port.stopListening())


def test_sub_reconnects_1_s_after_a_loss_then_2_4_up_to_30_s_apart() -> None:
    from wireproto.tools.pubsub import SUB_RETRY

    # Asked with the attempts failed in a row: none right after the connection closed.
    assert [SUB_RETRY(failed) for failed in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]
