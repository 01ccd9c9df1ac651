"""No credential reaches the log: `wireproto serve` at debug with [auth] and a JSON log file, on
real sockets, sent tokens and passwords every way a client may, then the file read back (and its
mode)."""

from __future__ import annotations

import json
import re
import shlex
import stat
import sys
from pathlib import Path

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory

from tests.access.conftest import AuthFiles, _Collector, basic
from tests.support import eventually, free_port, wait_for
from tests.test_cli import Child, children  # noqa: F401

PHYLLO_PASSWORD = "phyllo-link-password"


async def request(port: int, method: str, target: str, *, body: bytes = b"",
                  headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One request, byte for byte, on its own connection: the answer's status and body."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close",
             f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    client = await wait_for(endpoint.connect(Factory.forProtocol(_Collector)))
    client.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    await eventually(lambda: client.closed)
    head, _, answer = client.received.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), answer


@pytest_twisted.ensureDeferred
async def test_no_token_or_password_reaches_the_log_file_which_only_its_owner_reads(
    children: list[Child], auth_files: AuthFiles, tmp_path: Path  # noqa: F811
) -> None:
    log_file = tmp_path / "wireproto.log"
    token = auth_files.token("alice")
    expired = auth_files.token("alice", lifetime=-60)
    port = free_port()
    # Phyllo devices behind brokers: their URLs carry a password and a token. One is not
    # there; the other is this broker, which refuses the expired token.
    absent = (f"ws://carol:{PHYLLO_PASSWORD}@127.0.0.1:{free_port()}/phyllo"
              f"?access_token={token}")
    refusing = f"ws://carol:{PHYLLO_PASSWORD}@127.0.0.1:{port}/websmq?access_token={expired}"
    config = tmp_path / "wireproto.toml"
    config.write_text(
        '[[listen]]\nprotocol = "nydus"\ntransport = "engineio"\n'
        f'endpoint = "tcp:{port}:interface=127.0.0.1"\n\n'
        '[[listen]]\nprotocol = "websmq"\ntransport = "ws"\n'
        f'endpoint = "tcp:{port}:interface=127.0.0.1"\n\n'
        f'[[phyllo]]\nname = "dev1"\nendpoint = "{absent}"\n\n'
        f'[[phyllo]]\nname = "dev2"\nendpoint = "{refusing}"\n\n'
        + auth_files.auth_table()
        + '\n[[acl]]\nprincipal = "alice"\ncall = ["#"]\n\n'
        f'[log]\nfile = "{log_file}"\nlevel = "debug"\nformat = "json"\n'
    )
    command = [sys.executable, "-m", "wireproto", "serve", "--config", str(config)]
    child = Child("sh", "-c", "umask 022 && exec " + shlex.join(command))
    children.append(child)
    await child.line(re.compile(r"^wireproto: ready; Ctrl-C stops$"))

    # engine.io-client sends its query, access_token included, with every request.
    query = f"EIO=4&transport=polling&access_token={token}"
    status, opened = await request(port, "GET", f"/engine.io/?{query}&t=1")
    assert status == 200, opened
    sid = json.loads(opened[1:])["sid"]
    status, _ = await request(port, "POST", f"/engine.io/?{query}&t=2&sid={sid}", body=b"1")
    assert status == 200
    status, _ = await request(port, "GET", f"/engine.io/?{query}&t=3&sid=unknown")
    assert status == 400
    # Another query parameter on an authenticated path, and a refused handshake.
    await request(port, "GET", "/engine.io/?EIO=4&transport=polling&password=hunter2")
    status, _ = await request(port, "GET", f"/engine.io/?EIO=3&{query[6:]}", headers={
        "Referer": f"http://app.example/?access_token={token}#access_token={token}"})
    assert status == 400
    await request(port, "GET", "/engine.io/?EIO=4&transport=polling",
                  headers={"Authorization": basic("carol", "carol's password")})
    # An absolute request target with a user and password in it, and one without its scheme.
    await request(port, "GET", f"http://carol:hunter3@127.0.0.1:{port}/metrics")
    await request(port, "GET", f"//carol:hunter4@127.0.0.1:{port}/websmq")
    # A path twisted.web unquotes to /engine.io/ before it serves it.
    await request(port, "GET", f"/%65ngine.io/?EIO=4&transport=polling&t=4&sid={sid}")

    await eventually(lambda: "cannot open" in log_file.read_text()
                     and log_file.read_text().count("ngine.io/") >= 7, timeout=10)
    logged = log_file.read_text()
    requests = [record for record in map(json.loads, logged.splitlines())
                if record["event"] == "http_request"]
    targets = {record["target"] for record in requests}
    assert "/engine.io/?EIO=***&transport=***&access_token=***&t=***&sid=***" in targets
    assert [record["referer"] for record in requests if record["referer"]] == [
        "http://app.example/?access_token=***#access_token=***"]
    for secret in (token, expired, sid, "hunter2", "hunter3", "hunter4", "carol's password",
                   PHYLLO_PASSWORD):
        assert secret not in logged, secret
    assert "ws://***@127.0.0.1:" in logged and "http://***@127.0.0.1:" in logged
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    # The listener lines on stdout name the device's URL without its secrets too.
    shown = "\n".join(child.stdout)
    assert "phyllo link dev2" in shown and PHYLLO_PASSWORD not in shown and token not in shown


def test_the_redaction_examples_say_what_they_show() -> None:
    import doctest

    from wireproto import redaction

    results = doctest.testmod(redaction)
    assert results.attempted > 0 and results.failed == 0
