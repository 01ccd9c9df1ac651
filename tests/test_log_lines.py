"""What `wireproto serve` writes to its log, read back line by line from real runs: JSON Lines with
stable keys, no Twisted chatter at any level, HTTP requests and subscriptions at debug only; and
`wireproto.logs`' JSON form of the events Twisted itself emits (failures, old-style errors)."""

from __future__ import annotations

import gc
import json
import math
import re
import signal
import socket
import sys
import urllib.request
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.protocol import Factory
from twisted.internet.threads import deferToThread
from twisted.logger import Logger, globalLogPublisher

from tests.support import eventually, free_port, wait_for
from tests.test_cli import Child, children
from wireproto.logs import is_chatter, json_line
from wireproto.protocols.websmq.client import WebsmqClientProtocol, connect

__all__ = ["children"]  # the fixture, from tests.test_cli

# A length32 frame holding a WEBSMQ LastWill whose topic length runs past its end.
BROKEN = (2).to_bytes(4, "big") + b"\xff\xff"
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
LEVELS = {"debug", "info", "warn", "error", "critical"}
CONFIG = """
[log]
level = "{level}"
format = "{format}"
file = "{file}"
[websmq]
wildcards = true
[[listen]]
protocol = "websmq"
transport = "ws"
endpoint = "tcp:{http}:interface=127.0.0.1"
[[listen]]
protocol = "nydus"
transport = "engineio"
endpoint = "tcp:{http}:interface=127.0.0.1"
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "tcp:{stream}:interface=127.0.0.1"
"""


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as answer:
        answer.read()
        return int(answer.status)


async def run_and_stop(children: list[Child], tmp_path: Path, *, level: str, format: str,
                       verbose: bool = False) -> str:
    """Run `wireproto serve` with [log] `level` and `format` into a file, have a client
    subscribe and unsubscribe, ask for pages over HTTP, send a broken frame, stop it with
    SIGINT, and return what it logged."""
    log_file = tmp_path / f"{format}-{level}.log"
    config = tmp_path / f"{format}-{level}.toml"
    http, stream = free_port(), free_port()
    config.write_text(CONFIG.format(level=level, format=format, file=log_file, http=http,
                                    stream=stream))
    child = Child(sys.executable, "-m", "wireproto", "serve", *(["-v"] if verbose else []),
                  "--config", str(config))
    children.append(child)
    await child.line(re.compile(r"^wireproto: ready; Ctrl-C stops$"), 30)

    client: WebsmqClientProtocol = await wait_for(
        connect(reactor, f"ws://127.0.0.1:{http}/websmq", wildcards=True))
    publisher: WebsmqClientProtocol = await wait_for(
        connect(reactor, f"tcp:host=127.0.0.1:port={stream}"))
    received: list = []
    client.subscribe("rooms/kitchen", received.append)
    client.subscribe("sensors/+", received.append)

    def delivered() -> bool:  # WEBSMQ has no acknowledgement: publish until it arrives
        if len(received) < 2:
            publisher.publish("rooms/kitchen", b"hello")
            publisher.publish("sensors/a", b"21.5")
        return len({message.topic for message in received}) == 2

    try:
        await eventually(delivered, interval=0.05, timeout=15)
    except TimeoutError:
        raise AssertionError(f"{received}\n{log_file.read_text()}") from None
    client.unsubscribe("rooms/kitchen")
    client.unsubscribe("sensors/+")
    for path in ("/metrics", "/api/status", "/engine.io/?EIO=4&transport=polling&t=1"):
        assert await deferToThread(_get, f"http://127.0.0.1:{http}{path}") == 200
    raw = socket.create_connection(("127.0.0.1", stream), timeout=5)
    raw.sendall(BROKEN)
    await deferToThread(raw.recv, 10)  # closed by the broker
    raw.close()
    marker = "protocol_error" if format == "json" else "closing the connection from"
    await eventually(lambda: marker in log_file.read_text(), timeout=10)
    for each in (client, publisher):
        await wait_for(each.disconnect())
    child.process.send_signal(signal.SIGINT)
    assert await child.exit_code(30) == 0, child.output()
    assert child.stderr == [], child.output()
    return log_file.read_text()


@pytest_twisted.ensureDeferred
async def test_json_at_debug_is_one_object_per_line_with_stable_keys(
    children: list[Child], tmp_path: Path  # noqa: F811
) -> None:
    logged = await run_and_stop(children, tmp_path, level="debug", format="json")
    assert "\x1e" not in logged
    records = [json.loads(line) for line in logged.splitlines()]  # every line, or it fails
    for record in records:
        assert list(record)[:5] == ["time", "level", "namespace", "event", "message"], record
        assert TIME.fullmatch(record["time"]) and record["level"] in LEVELS, record
        assert isinstance(record["message"], str) and record["message"], record
        assert not [key for key in record if key.startswith("log_")], record
        assert "Starting factory" not in record["message"], record
        namespace = record["namespace"]
        assert namespace.startswith("wireproto."), record  # nothing of Twisted's own

    def named(name: str) -> list[dict]:
        return [record for record in records if record["event"] == name]

    subscribes, unsubscribes = named("subscribe"), named("unsubscribe")
    assert [(r["topic"], r["pattern"]) for r in subscribes] == [
        ("rooms/kitchen", False), ("sensors/+", True)]
    assert [(r["topic"], r["pattern"]) for r in unsubscribes] == [
        ("rooms/kitchen", False), ("sensors/+", True)]
    (connect,) = [r for r in named("connect") if r["transport"] == "ws"]
    for record in subscribes + unsubscribes:
        assert record["level"] == "debug" and record["namespace"] == "wireproto.hub"
        assert (record["protocol"], record["transport"], record["peer"], record["session"]) \
            == ("websmq", "ws", connect["peer"], connect["session"])
        assert "principal" in record and record["principal"] is None  # anonymous
    targets = {r["target"]: r for r in named("http_request")}
    assert set(targets) >= {"/metrics", "/api/status", "/engine.io/?EIO=4&transport=polling&t=1"}
    metrics = targets["/metrics"]
    assert (metrics["level"], metrics["method"], metrics["status"]) == ("debug", "GET", 200)
    assert metrics["bytes"] > 0 and re.fullmatch(r"127\.0\.0\.1:\d+", metrics["peer"])
    (error,) = named("protocol_error")
    assert error["level"] == "warn" and error["transport"] == "length32" and error["error"]
    assert len(named("listening")) == 3
    disconnects = named("disconnect")
    # the WebSocket, the publisher, the bad peer and the Engine.IO session
    assert len(disconnects) == len(named("connect")) == 4
    assert all(isinstance(r["duration"], float) for r in disconnects)


@pytest.mark.parametrize("level", ["debug", "info"])
@pytest_twisted.ensureDeferred
async def test_text_shows_no_twisted_chatter_and_requests_only_at_debug(
    children: list[Child], tmp_path: Path, level: str  # noqa: F811
) -> None:
    # At info through -v, as an operator asks for it.
    logged = await run_and_stop(children, tmp_path, level="debug" if level == "debug" else "warn",
                                format="text", verbose=level == "info")
    lines = logged.splitlines()
    assert lines and all(re.match(r"\S+ \[wireproto\.[\w.]+#(\w+)\] ", line) for line in lines), \
        logged
    shown = {re.match(r"\S+ \[[\w.]+#(\w+)\]", line).group(1) for line in lines}
    for chatter in ("Starting factory", "Stopping factory", "Main loop terminated", " 0x",
                    "starting on", "Port Closed", "[-]", "[twisted", "[autobahn", "shutting down"):
        assert chatter not in logged, chatter
    assert "websmq session 1 opened by" in logged and "closing the connection from" in logged
    requests = [line for line in lines if "[wireproto.transports.http#debug] HTTP GET " in line]
    subscriptions = [line for line in lines if "subscribed " in line]
    if level == "debug":
        assert {line.split(" HTTP GET ")[1].split(" from ")[0] for line in requests} >= {
            "/metrics", "/api/status", "/engine.io/?EIO=4&transport=polling&t=1"}
        assert len(subscriptions) == 4 and "debug" in shown
    else:
        assert requests == [] and subscriptions == [] and "debug" not in shown
        assert "info" in shown


def _captured(emit: object) -> list[dict]:
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        emit()  # type: ignore[operator]
    finally:
        globalLogPublisher.removeObserver(events.append)
    return events


def test_twisteds_own_errors_stay_as_an_error_and_a_traceback_and_its_chatter_goes() -> None:
    def unhandled() -> None:
        failing = defer.fail(ZeroDivisionError("division by zero"))
        del failing
        gc.collect()

    # Twisted says it in two events: what happened, then the failure.
    said, error = _captured(unhandled)
    assert not is_chatter(said) and not is_chatter(error)  # critical, in twisted.internet.defer
    records = [json.loads(json_line(event)) for event in (said, error)]
    assert [(r["level"], r["namespace"], r["event"]) for r in records] == [
        ("critical", "twisted.internet.defer", None)] * 2
    assert records[0]["message"] == "Unhandled error in Deferred:"
    record = records[1]
    assert record["error"] == record["message"] == "ZeroDivisionError: division by zero"
    assert "Traceback" in record["traceback"] and "ZeroDivisionError" in record["traceback"]
    assert not [key for key in records[0] | record if key.startswith("log_")]
    assert "isError" not in records[0]

    factory = Factory()
    started = _captured(factory.doStart) + _captured(factory.doStop)
    assert [e["log_format"] for e in started] == ["Starting factory {factory!r}",
                                                  "Stopping factory {factory!r}"]
    assert all(is_chatter(e) for e in started)


def test_old_style_errors_and_messages() -> None:
    from twisted.python import log as legacy

    def old_style() -> None:
        legacy.msg("a message of an old-style caller")
        try:
            1 / 0  # noqa: B018
        except ZeroDivisionError:
            legacy.err(None, "while counting")

    message, error = _captured(old_style)
    assert is_chatter(message) and not is_chatter(error)
    record = json.loads(json_line(error))
    assert (record["level"], record["message"]) == ("critical", "while counting")
    assert record["error"].startswith("ZeroDivisionError")
    assert not {"isError", "system", "why", "failure", "format"} & set(record), record


def test_any_value_becomes_json_and_a_field_never_takes_a_fixed_key() -> None:
    events = _captured(lambda: Logger(namespace="wireproto.test").info(
        "{what}", event="odd", what=b"\xff", nan=math.nan, pair=(1, "a"), nested={1: {2}},
        thing=object(), message="mine", time=3, when=1.5, big=2**70))
    record = json.loads(json_line(events[0]))
    assert record["event"] == "odd" and record["message"] == "b'\\xff'"
    assert (record["what"], record["nan"], record["pair"], record["nested"]) == (
        "b'\\xff'", "nan", [1, "a"], {"1": [2]})
    assert record["thing"].startswith("<object object at")
    assert (record["field_message"], record["field_time"], record["level"]) == (
        "mine", 3, "info")
    assert (record["when"], record["big"]) == (1.5, 2**70)
    assert json_line(events[0]).count("\n") == 1
