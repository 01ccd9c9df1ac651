"""What a peer sends cannot forge, hide or flood `wireproto serve`'s log, nor put a secret in it:
a real broker at debug writing text to a file, fed control characters in a client ID and in a
WebSocket handshake, a thousand bad handshakes, and secrets in query strings, Referers and a
Phyllo link's URL; then every line of the file read back."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import sys
from pathlib import Path

import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.support import eventually, free_port
from tests.test_cli import Child, children  # noqa: F401

STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} \[")
CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e]")
FORGED_ID = "c\r2026-01-01T00:00:00+0000 [wireproto.hub#info] all fine\x1b[8mhidden\nFAKE\u202e"
SECRETS = ("MPW", "MSEC", "ROOTTOK", "REFPW", "REFSECRET", "PHYLLOPW", "APIKEY9", "SIGSEC")
CONFIG = """
[log]
level = "debug"
format = "{format}"
file = "{file}"
[[listen]]
protocol = "subble"
transport = "ws"
endpoint = "tcp:{port}:interface=127.0.0.1"
[[listen]]
protocol = "websmq"
transport = "ws"
endpoint = "tcp:{port}:interface=127.0.0.1"
"""


def _handshakes(port: int, extension: bytes, count: int) -> None:
    """`count` WebSocket handshakes that Autobahn refuses for their `extension` offer."""
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(b"GET /websmq HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n"
                        b"Connection: Upgrade\r\nSec-WebSocket-Key: "
                        + base64.b64encode(os.urandom(16)) + b"\r\nSec-WebSocket-Version: 13\r\n"
                        b"Sec-WebSocket-Extensions: " + extension + b"\r\n\r\n")
            raw.recv(100)


def _get(port: int, target: str, *headers: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall("\r\n".join([f"GET {target} HTTP/1.1", "Host: a", "Connection: close",
                                 *headers, "", ""]).encode("latin-1"))
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
        return answer


async def _run(started: list[Child], tmp_path: Path, format: str) -> tuple[str, list[str]]:
    """A broker writing `format` at debug: fed everything above, stopped; its log and banner."""
    log_file = tmp_path / f"{format}.log"
    config = tmp_path / f"{format}.toml"
    port = free_port()
    config.write_text(CONFIG.format(format=format, file=log_file, port=port))
    phyllo = f"dev@ws://127.0.0.1:{free_port()}/phyllo?password=PHYLLOPW&api_key=APIKEY9"
    broker = Child(sys.executable, "-m", "wireproto", "serve", "--config", str(config),
                   "--phyllo", phyllo)
    started.append(broker)
    await broker.line(re.compile(r"^wireproto: ready; Ctrl-C stops$"), 30)

    events = Child(sys.executable, "-m", "wireproto", "events", f"ws://127.0.0.1:{port}/subble",
                   "-t", "x", "--client-id", FORGED_ID, "--timeout", "1")
    started.append(events)
    assert await events.exit_code(30) in (0, 5), events.output()
    await deferToThread(_handshakes, port, b"permessage-deflate; x\x1b[31m=1", 1)
    await deferToThread(_handshakes, port, b"permessage-deflate; client_max_window_bits=1", 1000)
    for target, headers in (
        ("/metrics?password=MPW&secret=MSEC", ()),
        ("/?token=ROOTTOK", ("Referer: http://u:REFSECRET@h/?password=REFPW",)),
        ("/api/status?X-Amz-Signature=SIGSEC", ()),
    ):
        assert (await deferToThread(_get, port, target, *headers)).startswith(b"HTTP/1.1 ")
    await eventually(lambda: "X-Amz-Signature" in log_file.read_text(), timeout=10)
    broker.process.send_signal(signal.SIGINT)
    assert await broker.exit_code(30) == 0, broker.output()
    return log_file.read_text(encoding="utf-8"), broker.stdout


@pytest_twisted.ensureDeferred
async def test_a_peer_cannot_forge_hide_or_flood_text_lines_nor_log_a_secret(
    children: list[Child], tmp_path: Path  # noqa: F811
) -> None:
    logged, banner = await _run(children, tmp_path, "text")
    lines = logged.split("\n")
    assert lines[-1] == ""
    for line in lines[:-1]:  # each line a line of its own, or a traceback's, begun with a tab
        assert STAMP.match(line) or line.startswith("\t"), repr(line)
        assert not CONTROLS.search(line), repr(line)
    # The client ID is there, every control character of it an escape.
    assert any("c\\r2026-01-01T00:00:00+0000 [wireproto.hub#info] all fine\\x1b[8mhidden"
               "\\nFAKE\\u202e" in line for line in lines), logged
    # Autobahn's warnings about handshakes: a few, with the peer, the peer's bytes escaped.
    dropped = [line for line in lines if "WebSocket from 127.0.0.1:" in line]
    assert 1 <= len(dropped) <= 5, dropped
    assert any("x\\x1b[31m" in line for line in dropped), dropped
    assert not [secret for secret in SECRETS if secret in logged + "".join(banner)]
    assert "/metrics?password=***&secret=***" in logged
    assert "/phyllo?password=***&api_key=***" in "".join(banner)


@pytest_twisted.ensureDeferred
async def test_json_lines_name_autobahns_warnings_and_bound_them(
    children: list[Child], tmp_path: Path  # noqa: F811
) -> None:
    logged, _ = await _run(children, tmp_path, "json")
    records = [json.loads(line) for line in logged.splitlines()]
    dropped = [record for record in records if record["event"] == "websocket_error"]
    assert 1 <= len(dropped) <= 5, dropped
    assert all(record["peer"].startswith("127.0.0.1:") for record in dropped)
    assert any("x\x1b[31m" in record["error"] for record in dropped)
    assert not [record for record in records if record["event"] is None
                and record["namespace"].startswith("autobahn")], records
    assert any(record.get("client") == FORGED_ID for record in records)
    assert not [secret for secret in SECRETS if secret in logged]
