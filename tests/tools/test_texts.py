"""What the tools say, as real processes against a real `wireproto serve`, where they used to
say too little or the wrong thing: a path that names no protocol, a unix socket's address as the
banner prints it, an Engine.IO Origin refusal, a page that is no WebSocket endpoint, `wss://` to
a plain port, bytes that are not UTF-8, options argparse or mosquitto would misread, a publish
the rules deny (docs/tools.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import pytest_twisted

from tests.access.conftest import AuthFiles
from tests.support import eventually, sleep
from tests.tools.served import Processes, one_line
from tests.tools.test_refusals import ON_ONE_PORT, auth_broker, listen

ROOT = Path(__file__).resolve().parents[2]


@pytest_twisted.ensureDeferred
async def test_a_path_that_names_no_protocol_is_asked_of_the_broker(
    processes: Processes,
) -> None:
    served = await processes.serve(*listen(*ON_ONE_PORT, "websmq+ws/mq/v1@tcp:0"))
    websmq, ubre, nydus = served["websmq over ws"], served["ubre over ws"], served[
        "nydus over engineio"]
    port = urlsplit(websmq).netloc
    custom = next(address for _, address in processes.listening if address.endswith("/mq/v1"))
    cases = [
        # docs/tools.md's examples, without --protocol.
        (("pub", f"ws://{port}/mq", "-t", "x", "-m", "hi"), 4,
         f"wireproto pub: ws://{port}/mq: 404 Not Found: nothing is served at /mq; pub speaks "
         f"websmq at {websmq}, ubre at {ubre}, websmq at {custom}"),
        (("sub", f"ws://{port}/mq", "-t", "x"), 4,
         f"wireproto sub: ws://{port}/mq: 404 Not Found: nothing is served at /mq; sub speaks "
         f"websmq at {websmq}, ubre at {ubre}, websmq at {custom}"),
        # An http:// address is Engine.IO, whatever its path.
        (("call", f"http://{port}/ubre", "/x", "{}"), 4,
         f"wireproto call: http://{port}/ubre serves ubre, not nydus: for nydus use {nydus}"),
        (("pub", nydus, "-t", "x", "-m", "hi"), 2,
         f"wireproto pub: {nydus} serves nydus, which pub does not speak (websmq, ubre, "
         "phyllo)"),
    ]
    for args, code, line in cases:
        assert await one_line(processes.run(*args), code) == line, args
    # A path of the broker's own choosing: it says what it serves there.
    follower = processes.run("sub", custom, "-t", "x", "-C", "1", "--timeout", "30")
    for _ in range(100):  # until the subscription is in
        published = processes.run("pub", custom, "-t", "x", "-m", "on /mq/v1")
        assert await published.exit_code(timeout=30) == 0, published.output()
        if follower.process.poll() is not None:
            break
        await sleep(0.2)
    assert await follower.exit_code(timeout=30) == 0, follower.output()
    assert follower.stdout[0] == "x on /mq/v1"


@pytest_twisted.ensureDeferred
async def test_a_unix_socket_address_as_the_banner_prints_it_works_with_every_tool(
    processes: Processes, tmp_path: Path,
) -> None:
    socket = tmp_path / "wp.sock"
    served = await processes.serve(*listen(*(
        spec.replace("tcp:0", f"unix:{socket}") for spec in ON_ONE_PORT)))
    websmq, ubre = served["websmq over ws"], served["ubre over ws"]
    subble, nydus = served["subble over ws"], served["nydus over engineio"]
    assert websmq == f"ws+unix://{socket}:/websmq"
    assert nydus == f"http+unix://{socket}:/engine.io/"

    follower = processes.run("sub", ubre, "-t", "x", "-C", "1", "--timeout", "30")
    for _ in range(100):  # until the subscription is in
        published = processes.run("pub", websmq, "-t", "x", "-m", "21.5")
        assert await published.exit_code(timeout=30) == 0, published.output()
        if follower.process.poll() is not None:
            break
        await sleep(0.2)
    assert await follower.exit_code(timeout=30) == 0, follower.output()
    assert follower.stdout == ["x 21.5"]
    # The broker answers: no handler there, which only a connected call hears.
    assert await one_line(processes.run("call", ubre, "nothing", "1"), 1) == (
        'wireproto call: nothing failed: "NotFound"')
    assert await one_line(processes.run("call", nydus, "/nothing", "1"), 1) == (
        "wireproto call: /nothing failed: 404 Not Found")
    produced = processes.run("produce", subble, "-t", "door", "-m", "open")
    assert await produced.exit_code(timeout=30) == 0, produced.output()
    # And a wrong path says where to go, in the same form.
    assert await one_line(processes.run("pub", f"ws+unix://{socket}:/mq", "-p", "websmq",
                                        "-t", "x", "-m", "hi"), 4) == (
        f"wireproto pub: ws+unix://{socket}:/mq: 404 Not Found: nothing is served at /mq; "
        f"for websmq use {websmq}")


@pytest_twisted.ensureDeferred
async def test_an_engineio_origin_refusal_is_named_as_one(
    processes: Processes, tmp_path: Path,
) -> None:
    config = tmp_path / "origins.toml"
    config.write_text('[[listen]]\nprotocol = "nydus"\ntransport = "engineio"\n'
                      'endpoint = "tcp:0"\n'
                      '[websocket]\nallowed_origins = ["https://app.example:443"]\n')
    nydus = (await processes.serve("--config", str(config)))["nydus over engineio"]
    tool = processes.run("call", nydus, "/x", "1", "-H", "Origin: https://evil.example")
    assert await one_line(tool, 4) == (
        f"wireproto call: {nydus}: 403 Forbidden: the broker does not take this Origin header "
        "(its [websocket] allowed_origins)")


@pytest_twisted.ensureDeferred
async def test_what_is_no_websocket_endpoint_is_said_so(
    processes: Processes, monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = await processes.serve(*listen(*ON_ONE_PORT))
    port = urlsplit(served["websmq over ws"]).netloc
    websmq = served["websmq over ws"]
    cases = [
        (("call", f"http://{port}/metrics", "-p", "nydus", "/x"), 4,
         f"wireproto call: http://{port}/metrics: 200 OK, not a WebSocket handshake: is it the "
         "status page or /metrics? wireproto serve's banner names each protocol's address"),
        (("pub", f"ws://{port}/é", "-p", "websmq", "-t", "x", "-m", "hi"), 4,
         f"wireproto pub: ws://{port}/é: 404 Not Found: nothing is served at /é; for websmq "
         f"use {websmq}"),
        (("pub", f"wss://{port}/websmq", "-t", "x", "-m", "hi"), 4,
         f"wireproto pub: wss://{port}/websmq: no TLS handshake: is it a port without TLS? "
         "(ws:// and http:// for a plain port; wireproto serve's banner names each address)"),
        # -m's bytes as given: not UTF-8, so no JSON value for UBRE.
        (("pub", served["ubre over ws"], "-t", "x", "-m", os.fsdecode(b"\xff")), 2,
         "wireproto pub: a payload that is not UTF-8 cannot be a JSON value"),
        (("pub", "unix:/nonexistent/wp.sock", "-p", "websmq", "-t", "x", "-m", "hi"), 3,
         "wireproto pub: cannot reach unix:/nonexistent/wp.sock: No such file or directory"),
        (("call", "unix:/nonexistent/wp.sock", "-p", "ubre", "x"), 3,
         "wireproto call: cannot connect to unix:/nonexistent/wp.sock: No such file or "
         "directory"),
    ]
    for args, code, line in cases:
        started = time.monotonic()
        assert await one_line(processes.run(*args), code) == line, args
        assert time.monotonic() - started < 8, args  # the TLS one no longer waits 10 s
    monkeypatch.setenv("WIREPROTO_USER", "bob")
    monkeypatch.delenv("WIREPROTO_PASSWORD", raising=False)
    assert await one_line(processes.run("pub", websmq, "-t", "x", "-m", "hi"), 2) == (
        "wireproto pub: $WIREPROTO_USER needs a password: --password or $WIREPROTO_PASSWORD")


@pytest_twisted.ensureDeferred
async def test_options_argparse_or_mosquitto_would_misread(processes: Processes) -> None:
    address = "ws://127.0.0.1:1/websmq"
    # -vh and -hv are short options run together: help, never the host "v" (pub has no -v,
    # and it is help there too).
    for tool, extra in (("sub", ()), ("pub", ("-m", "hi"))):
        for cluster in ("-vh", "-hv"):
            helped = processes.run(tool, address, "-t", "x", *extra, cluster)
            assert await helped.exit_code(timeout=30) == 0, helped.output()
            assert helped.stdout[0].startswith(f"usage: wireproto {tool}"), helped.output()
            assert "ws://v:" not in helped.output()
    cases = [
        (("pub", address, "-t", "x", "-m", "hi", "--bogus"),
         "wireproto pub: unrecognized arguments: --bogus (see --help)"),
        (("pub", address, "-t", "x", "-m", "hi", "-vx"),
         "wireproto pub: unrecognized arguments: -vx (see --help)"),
        (("serve", "--bogus"), "wireproto serve: unrecognized arguments: --bogus (see --help)"),
        (("serve", "--workers", "99999"),
         "wireproto serve: --workers: must be 1 to 256 processes, not 99999"),
    ]
    for args, line in cases:
        assert await one_line(processes.run(*args), 2) == line, args


@pytest_twisted.ensureDeferred
async def test_workers_have_a_documented_bound_in_the_config_file(
    processes: Processes, tmp_path: Path,
) -> None:
    config = tmp_path / "many.toml"
    config.write_text("[cluster]\nworkers = 99999\n")
    assert await one_line(processes.run("check-config", str(config)), 2) == (
        f"wireproto check-config: {config}: cluster.workers: must be 1 to 256 processes, "
        "not 99999")
    assert "1 to 256" in (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")


@pytest_twisted.ensureDeferred
async def test_a_publish_the_rules_deny_is_written_and_the_docs_say_what_0_means(
    processes: Processes, auth_files: AuthFiles, tmp_path: Path,
) -> None:
    served = await auth_broker(processes, auth_files, tmp_path)
    broker = processes.started[0]
    # alice has no rule: her publish is dropped, and no protocol pub speaks answers a publish.
    for address in (served["websmq over ws"], served["ubre over ws"]):
        seen = len(broker.stderr)
        published = processes.run("pub", address, "-t", "x", "-m", "1",
                                  "--token", auth_files.token("alice"))
        assert await published.exit_code(timeout=30) == 0, published.output()

        def denied(since: int = seen) -> bool:
            return any("'alice' may not publish 'x'" in line for line in broker.stderr[since:])

        await eventually(denied, timeout=15)
    tools = (ROOT / "docs" / "tools.md").read_text(encoding="utf-8")
    said = " ".join(tools.split())
    assert ("`pub`'s 0 means every message was written to the broker and the connection closed "
            "cleanly; it cannot mean the broker took them") in said
    assert "`denied` warning" in said and 'wireproto_denied_total{action="publish"}' in said
