"""`wireproto conform server`, `client` and `device` as real processes, with small catalogues of
the tests' own (tests/conformance/sample_kit.py, sample_client_kit.py, sample_device_kit.py) in
place of the protocols' kits: the lines it prints, its exit statuses (0, 1, 2, 3, 130), the
report it writes, and what it never shows (a credential, --run's command)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytest_twisted

from tests.conformance.sample_kit import POISON, ToyServer
from tests.support import eventually, free_port
from tests.test_cli import Child, children  # noqa: F401 - the fixture

# The command, its websmq kits and its phyllo kit replaced by the sample catalogues, and the nydus
# client kit by one that is not there.
RUN = ("import sys, wireproto.conformance.kits as kits; "
       "kits.KITS['websmq'] = 'tests.conformance.sample_kit'; "
       "kits.CLIENT_KITS['websmq'] = 'tests.conformance.sample_client_kit'; "
       "kits.CLIENT_KITS['nydus'] = 'tests.conformance.no_such_kit'; "
       "kits.DEVICE_KITS['phyllo'] = 'tests.conformance.sample_device_kit'; "
       "from wireproto.cli import main; sys.exit(main())")
ROOT = Path(__file__).resolve().parents[2]
QUICK = "websmq.sample.delivered,websmq.sample.echo-back"


def conform(children: list[Child], *args: str, mode: str = "server") -> Child:  # noqa: F811
    child = Child(sys.executable, "-c", RUN, "conform", mode, *args, cwd=ROOT)
    children.append(child)
    return child


async def websmq_broker(broker) -> str:
    port = free_port()
    await broker.start(f"websmq+ws@tcp:{port}:interface=127.0.0.1")
    return f"ws://127.0.0.1:{port}/websmq"


@pytest_twisted.ensureDeferred
async def test_a_run_prints_each_case_the_summary_and_writes_the_report(
        broker, children, tmp_path) -> None:  # noqa: F811
    address = await websmq_broker(broker)
    report = tmp_path / "new" / "report"  # made, with its parents
    tool = conform(children, address, "--report", str(report), "--cases",
                   "websmq.sample.delivered,websmq.sample.impossible,websmq.sample.poison")
    assert await tool.exit_code(timeout=60) == 1, tool.output()
    assert tool.stderr == []
    assert tool.stdout == [
        "pass        websmq.sample.delivered  A publish reaches a subscriber whole",
        "fail        websmq.sample.impossible  A subscriber receives a message nobody sent: "
        "expected a message nobody sent within 0.3 s, got nothing",
        "pass        websmq.sample.poison  A message of two unknown bytes closes that "
        "connection alone",
        f"websmq at {address}: 3 cases, 2 pass, 1 fail, 0 non-strict, 0 information; MUST "
        "failed: websmq.sample.impossible",
    ]
    written = json.loads((report / "report.json").read_text())
    assert written["schema"] == "wireproto-conformance-report"
    assert written["schema_version"] == 1 and written["status"] == 1
    assert written["target"] == address and written["mode"] == "server"
    assert written["summary"] == {"pass": 2, "fail": 1, "non-strict": 0, "information": 0}
    assert [case["id"] for case in written["cases"]] == [
        "websmq.sample.delivered", "websmq.sample.impossible", "websmq.sample.poison"]
    poison = written["cases"][2]
    assert poison["harmful"] is True and poison["group"] == "websmq.sample"
    sent = [e for e in poison["exchanges"] if e["direction"] == "sent"]
    assert sent[0]["hex"] == POISON.hex() and sent[0]["length"] == 2
    page = (report / "index.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and '<details id="websmq.sample.poison">' in page
    assert not re.search(r"<(script|link|img|iframe)\b|\bsrc=|\bhref=", page)


@pytest_twisted.ensureDeferred
async def test_no_must_failed_is_0_and_json_lines(broker, children) -> None:  # noqa: F811
    address = await websmq_broker(broker)
    tool = conform(children, address, "--cases", QUICK, "--json")
    assert await tool.exit_code(timeout=60) == 0, tool.output()
    lines = [json.loads(line) for line in tool.stdout]
    assert [(line.get("id"), line.get("outcome")) for line in lines[:2]] == [
        ("websmq.sample.delivered", "pass"), ("websmq.sample.echo-back", "pass")]
    assert lines[2]["status"] == 0 and lines[2]["summary"]["pass"] == 2


@pytest_twisted.ensureDeferred
async def test_a_dead_port_is_could_not_run(children, tmp_path) -> None:  # noqa: F811
    address = f"ws://127.0.0.1:{free_port()}/websmq"
    tool = conform(children, address, "--report", str(tmp_path))
    assert await tool.exit_code(timeout=60) == 3, tool.output()
    assert tool.stdout == []
    assert tool.stderr == ["wireproto conform: websmq server does not serve: could not connect: "
                           "Connection was refused by other side: 111: Connection refused."]
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["status"] == 3 and written["cases"] == []
    assert written["error"].startswith("websmq server does not serve")


@pytest_twisted.ensureDeferred
async def test_a_server_that_dies_fails_the_case_that_killed_it(children) -> None:  # noqa: F811
    server = ToyServer(dies=True)
    address = await server.start()
    try:
        tool = conform(children, address, "--cases",
                       "websmq.sample.delivered,websmq.sample.poison")
        assert await tool.exit_code(timeout=60) == 1, tool.output()
    finally:
        await server.stop()
    assert tool.stdout[1].startswith("fail        websmq.sample.poison")
    assert "the server stopped serving after this case" in tool.stdout[1]
    assert tool.stdout[-1].endswith("MUST failed: websmq.sample.poison")


@pytest_twisted.ensureDeferred
async def test_ctrl_c_is_130_with_the_report_so_far(broker, children, tmp_path) -> None:  # noqa: F811
    address = await websmq_broker(broker)
    tool = conform(children, address, "--report", str(tmp_path), "--timeout", "30", "--cases",
                   "websmq.sample.delivered,websmq.sample.stuck")
    await eventually(lambda: tool.stdout, timeout=30)
    tool.process.send_signal(signal.SIGINT)
    assert await tool.exit_code(timeout=30) == 130, tool.output()
    assert tool.stderr == []
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["status"] == 130
    assert [case["id"] for case in written["cases"]] == ["websmq.sample.delivered"]


@pytest_twisted.ensureDeferred
async def test_no_credential_reaches_the_output_or_the_report(
        children, tmp_path, monkeypatch) -> None:  # noqa: F811
    token = "tok-5ecret-value"
    hostile = (f"</pre></td></tr></table><script>alert(1)</script><img src=x> \x1b[2J"
               f"Bearer {token} header-v4lue")
    server = ToyServer(greeting=hostile.encode())
    address = await server.start()
    try:
        monkeypatch.setenv("WIREPROTO_TOKEN", token)  # inherited by the first run
        tool = conform(children, address + "?access_token=query-5ecret", "--report",
                       str(tmp_path), "-H", "X-Api: header-v4lue", "--cases",
                       "websmq.sample.hostile")
        assert await tool.exit_code(timeout=60) == 0, tool.output()
        monkeypatch.delenv("WIREPROTO_TOKEN")
        with_token = conform(children, address, "--token", token, "-H", "X-Api: header-v4lue",
                             "--cases", "websmq.sample.hostile")
        assert await with_token.exit_code(timeout=60) == 0, with_token.output()
    finally:
        await server.stop()
    said = "\n".join(tool.stdout + tool.stderr + with_token.stdout + with_token.stderr)
    written = (tmp_path / "report.json").read_text() + (tmp_path / "index.html").read_text()
    for secret in (token, "header-v4lue", "query-5ecret"):
        assert secret not in said and secret not in written, secret
    for secret in (token.encode().hex(), b"header-v4lue".hex()):
        assert secret not in written
    assert "\x1b" not in said  # a terminal's escape is shown, not sent
    assert "the server sent" in tool.stdout[0]
    page = (tmp_path / "index.html").read_text()
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.parametrize(("args", "line"), [
    (["--report", "{file}"], "wireproto conform: --report {file}: not a directory"),
    (["--max-message-size", "67108864"], "wireproto conform server: argument "
     "--max-message-size: the kit judges limits below 67108864 bytes (64 MiB), not 67108864 "
     "(see --help)"),
    (["--framing", "lines"], "wireproto conform: --framing is for a stream endpoint (tcp:, "
     "ssl:, unix:); a WebSocket frames its messages itself"),
    (["--report", "{file}/under"], "wireproto conform: --report {file}/under: Not a directory"),
    (["--cases", "websmq.nothing"],
     "wireproto conform: no websmq case is or starts with 'websmq.nothing' (--list shows them)"),
    (["--timeout", "0"], "wireproto conform server: argument --timeout: must be more than 0, and "
                         "finite, not 0 (see --help)"),
])
@pytest_twisted.ensureDeferred
async def test_bad_usage_is_2_and_one_line(children, tmp_path, args, line) -> None:  # noqa: F811
    file = tmp_path / "a-file"
    file.write_text("")
    words = [word.format(file=file) for word in args]
    tool = conform(children, f"ws://127.0.0.1:{free_port()}/websmq", *words)
    assert await tool.exit_code(timeout=60) == 2, tool.output()
    assert tool.stderr == [line.format(file=file)] and tool.stdout == []


@pytest_twisted.ensureDeferred
async def test_an_http_url_for_a_protocol_not_spoken_over_it_is_2(children) -> None:  # noqa: F811
    tool = conform(children, f"http://127.0.0.1:{free_port()}/engine.io/", "--protocol", "websmq")
    assert await tool.exit_code(timeout=60) == 2, tool.output()
    assert tool.stderr == ["wireproto conform: websmq is not spoken over http://: give its "
                           "ws:// URL or a client endpoint"]


@pytest.mark.parametrize(("directory", "why"), [
    ("/proc/self", "cannot write a file in it ("),  # a directory, not one for files
    ("/sys/conform-report", ""),  # cannot be made
])
@pytest_twisted.ensureDeferred
async def test_a_report_dir_that_cannot_be_written_is_2_before_any_case(
        children, directory, why) -> None:  # noqa: F811
    # The server does not exist: a run that started would be 3.
    tool = conform(children, f"ws://127.0.0.1:{free_port()}/websmq", "--report", directory)
    assert await tool.exit_code(timeout=60) == 2, tool.output()
    assert len(tool.stderr) == 1, tool.output()
    assert tool.stderr[0].startswith(f"wireproto conform: --report {directory}: {why}")


@pytest_twisted.ensureDeferred
async def test_list_needs_no_url(children) -> None:  # noqa: F811
    tool = conform(children, "--list", "--protocol", "websmq")
    assert await tool.exit_code(timeout=60) == 0, tool.output()
    assert tool.stdout[0].split() [:2] == ["websmq.sample.delivered", "MUST"]
    assert tool.stdout[0].endswith("A publish reaches a subscriber whole (Message format)")
    assert len(tool.stdout) == 8
    as_json = conform(children, "--list", "--protocol", "websmq", "--json")
    assert await as_json.exit_code(timeout=60) == 0, as_json.output()
    second = json.loads(as_json.stdout[1])
    assert second["id"] == "websmq.sample.echo-back" and second["level"] == "SHOULD"
    assert second["decision"] == "docs/websmq.md#what-we-decided"
    no_url = conform(children)
    assert await no_url.exit_code(timeout=60) == 2
    assert no_url.stderr == ["wireproto conform: give the server's URL (or --list)"]


@pytest_twisted.ensureDeferred
async def test_a_stream_endpoint_with_its_framing(broker, children) -> None:  # noqa: F811
    port = free_port()
    await broker.start(f"websmq+cobs@tcp:{port}:interface=127.0.0.1")
    address = f"tcp:127.0.0.1:{port}"
    tool = conform(children, address, "--protocol", "websmq", "--framing", "cobs", "--cases",
                   QUICK)
    assert await tool.exit_code(timeout=60) == 0, tool.output()
    assert tool.stdout[-1] == (f"websmq at {address}: 2 cases, 2 pass, 0 fail, 0 non-strict, "
                               "0 information; every MUST passed")
    unknown = conform(children, address, "--cases", QUICK)
    assert await unknown.exit_code(timeout=60) == 2
    assert unknown.stderr == [f"wireproto conform: cannot tell the protocol of '{address}': "
                              "give --protocol (ubre, websmq, subble, nydus)"]
    # Length32 (the default) against a cobs listener: nothing it understands comes back.
    wrong = conform(children, address, "--protocol", "websmq", "--cases", QUICK)
    assert await wrong.exit_code(timeout=60) == 3, wrong.output()


# -- conform client -------------------------------------------------------------------------------

CLIENT = f"{sys.executable} -m tests.conformance.sample_client"
WAITING = re.compile(r"waiting for a websmq client at (ws://127\.0\.0\.1:(\d+)/) \((.*)\)$")


def client(children: list[Child], *args: str) -> Child:  # noqa: F811
    return conform(children, "--protocol", "websmq", *args, mode="client")


@pytest_twisted.ensureDeferred
async def test_a_client_started_by_run_for_each_case(
        children, tmp_path, monkeypatch) -> None:  # noqa: F811
    report = tmp_path / "report"
    monkeypatch.setenv("WIREPROTO_TOKEN", "env-5ecret-token")
    tool = client(children, "--listen", "ws://127.0.0.1:0/", "--run",
                  f"{CLIENT} --forever --say-token --token run-5ecret-arg", "--report",
                  str(report), "--cases",
                  "websmq.client.sample.echo,websmq.client.sample.crash,"
                  "websmq.client.sample.impossible,websmq.client.sample.reconnects")
    assert await tool.exit_code(timeout=90) == 1, tool.output()
    assert tool.stderr == []
    waiting = WAITING.match(tool.stdout[0])
    assert waiting is not None and waiting.group(2) != "0", tool.stdout[0]
    assert waiting.group(3) == "started by the kit for each case"
    url = waiting.group(1)
    assert tool.stdout[1] == "pass        websmq.client.sample.echo  The client echoes a message"
    assert tool.stdout[2].startswith(
        "non-strict  websmq.client.sample.crash  The client survives a message it dislikes: ")
    assert "the client exited with status 3 during the case" in tool.stdout[2]
    assert tool.stdout[3].startswith("fail        websmq.client.sample.impossible")
    assert tool.stdout[4] == ("information websmq.client.sample.reconnects  The client connects "
                              "again when the server goes away: connected again")
    assert tool.stdout[5] == (f"websmq client at {url}: 4 cases, 1 pass, 1 fail, 1 non-strict, "
                              "1 information; MUST failed: websmq.client.sample.impossible")
    written = json.loads((report / "report.json").read_text())
    assert written["mode"] == "client" and written["target"] == url
    assert written["client_started_by_kit"] is True and written["status"] == 1
    crash = written["cases"][1]
    events = [e["text"] for e in crash["exchanges"] if e["direction"] == "event"]
    assert "the client wrote: my token is ***\noh no" in events, events
    page = (report / "index.html").read_text()
    assert "started by the kit for each case (--run)" in page
    for text in (written, page, tool.stdout):  # the command may hold a secret
        shown = json.dumps(text)
        assert "run-5ecret-arg" not in shown and "sample_client" not in shown
        assert "env-5ecret-token" not in shown


@pytest_twisted.ensureDeferred
async def test_a_client_started_by_hand_connects_again_after_each_case(
        children, tmp_path, monkeypatch) -> None:  # noqa: F811
    tool = client(children, "--listen", "ws://127.0.0.1:0/path", "--json", "--report",
                  str(tmp_path), "--cases", "websmq.client.sample.echo,"
                  "websmq.client.sample.reconnects")
    first = await tool.line(re.compile(r"\{.*\}$"), timeout=30)
    listening = json.loads(first.group())
    assert listening["protocol"] == "websmq" and listening["client_started_by_kit"] is False
    monkeypatch.setenv("WIREPROTO_CONFORM_URL", listening["listening"])
    by_hand = Child(sys.executable, "-m", "tests.conformance.sample_client", "--forever",
                    cwd=ROOT)
    children.append(by_hand)
    assert await tool.exit_code(timeout=90) == 0, tool.output()
    lines = [json.loads(line) for line in tool.stdout[1:]]
    assert [(line.get("id"), line.get("outcome")) for line in lines[:2]] == [
        ("websmq.client.sample.echo", "pass"), ("websmq.client.sample.reconnects",
                                                "information")]
    assert lines[2]["mode"] == "client" and lines[2]["status"] == 0
    assert listening["listening"].endswith("/path")
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["client_started_by_kit"] is False and written["mode"] == "client"


@pytest_twisted.ensureDeferred
async def test_no_client_connecting_is_could_not_run(children, tmp_path) -> None:  # noqa: F811
    tool = client(children, "--listen", "tcp:0:interface=127.0.0.1", "--framing", "cobs",
                  "--wait", "1", "--report", str(tmp_path))
    assert await tool.exit_code(timeout=60) == 3, tool.output()
    assert re.fullmatch(r"waiting for a websmq client at tcp:127\.0\.0\.1:\d+ \(to connect\)",
                        tool.stdout[0])
    assert tool.stderr == ["wireproto conform: websmq client could not be judged: expected "
                           "the client to connect within 1 s; no connection came"]
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["status"] == 3 and written["cases"] == [] and written["mode"] == "client"


@pytest_twisted.ensureDeferred
async def test_a_client_that_exits_at_once_is_could_not_run_with_its_output(
        children) -> None:  # noqa: F811
    started = time.monotonic()
    tool = client(children, "--listen", "ws://127.0.0.1:0/", "--wait", "40", "--run",
                  f"{sys.executable} -c \"print('no server for me'); raise SystemExit(4)\"")
    assert await tool.exit_code(timeout=60) == 3, tool.output()
    assert len(tool.stderr) == 1, tool.output()
    assert tool.stderr[0] == ("wireproto conform: websmq client could not be judged: expected "
                              "the client to connect, but the client exited with status 4; it "
                              "wrote: no server for me")
    assert time.monotonic() - started < 30  # said at once, not after --wait


@pytest.mark.parametrize(("args", "line"), [
    (["--listen", "ws://127.0.0.1:0/"], None),  # no --protocol: below
    (["--protocol", "websmq"], "wireproto conform: give the client's --protocol and where it "
     "connects, --listen ADDRESS (or --list)"),
    (["--protocol", "websmq", "--listen", "ws://127.0.0.1:0/", "--run", "no-such-program-x {url}"],
     "wireproto conform: --run: 'no-such-program-x' is not a program found on PATH (or is not "
     "executable)"),
    # An assignment a shell would read is refused without its value, which may be a secret.
    (["--protocol", "websmq", "--listen", "ws://127.0.0.1:0/", "--run",
      "API_TOKEN=hunter2secret node client.js {url}"],
     "wireproto conform: --run: the command starts with an assignment (NAME=...), which only a "
     "shell reads; put env before it: --run \"env NAME=... program\""),
    (["--protocol", "websmq", "--listen", "ws://127.0.0.1:0/", "--run", "echo 'unbalanced"],
     "wireproto conform: --run: No closing quotation"),
    (["--protocol", "websmq", "--listen", "ws://127.0.0.1:0/", "--framing", "cobs"],
     "wireproto conform: --framing is for a stream endpoint (tcp:, ssl:, unix:); a WebSocket "
     "frames its messages itself"),
    (["--protocol", "websmq", "--listen", "wss://127.0.0.1:0/"],
     "wireproto conform: listening on 'wss://127.0.0.1:0/' needs the kit's certificate and "
     "key (--cert, --key)"),
    (["--protocol", "websmq", "--listen", "ftp://127.0.0.1:0/"],
     "wireproto conform: cannot listen on 'ftp://127.0.0.1:0/': its scheme is not ws, wss, "
     "ws+unix, http or https"),
    (["--protocol", "websmq", "--listen", "http://127.0.0.1:0/"],
     "wireproto conform: the 'http://127.0.0.1:0/' address needs its kit's own listening "
     "factory (Engine.IO is nydus's)"),
    (["--protocol", "nydus", "--listen", "http://127.0.0.1:0/"],
     "wireproto conform: no client kit for nydus in this wireproto: No module named "
     "'tests.conformance.no_such_kit'"),
    (["--protocol", "websmq", "--listen", "ws://127.0.0.1:0/", "--cases", "websmq.client.x"],
     "wireproto conform: no websmq case is or starts with 'websmq.client.x' (--list shows "
     "them)"),
])
@pytest_twisted.ensureDeferred
async def test_client_mode_bad_usage_is_2_and_one_line(children, args, line) -> None:  # noqa: F811
    tool = conform(children, *args, mode="client")
    assert await tool.exit_code(timeout=60) == 2, tool.output()
    assert tool.stdout == []
    if line is None:
        assert tool.stderr[-1].endswith("give the client's --protocol and where it connects, "
                                        "--listen ADDRESS (or --list)"), tool.output()
    else:
        assert tool.stderr == [line]


@pytest_twisted.ensureDeferred
async def test_a_port_taken_is_2(children) -> None:  # noqa: F811
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        tool = client(children, "--listen", f"ws://127.0.0.1:{port}/")
        assert await tool.exit_code(timeout=60) == 2, tool.output()
    assert tool.stdout == [] and len(tool.stderr) == 1
    assert tool.stderr[0].startswith(
        f"wireproto conform: cannot listen on ws://127.0.0.1:{port}/: ")
    assert "Address already in use" in tool.stderr[0]


@pytest_twisted.ensureDeferred
async def test_ctrl_c_stops_the_client_it_started(children, tmp_path) -> None:  # noqa: F811
    pids = tmp_path / "pids"
    tool = client(children, "--listen", "ws://127.0.0.1:0/", "--timeout", "30", "--report",
                  str(tmp_path), "--run", f"{CLIENT} --pidfile {pids}", "--cases",
                  "websmq.client.sample.echo,websmq.client.sample.impossible")
    await eventually(lambda: len(tool.stdout) >= 2, timeout=60)
    # The second case waits 30 s for what the client never sends: its client is running.
    await eventually(lambda: pids.exists() and len(pids.read_text().split()) == 3, timeout=30)
    pid = int(pids.read_text().split()[-1])
    tool.process.send_signal(signal.SIGINT)
    assert await tool.exit_code(timeout=30) == 130, tool.output()
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["status"] == 130
    assert [case["id"] for case in written["cases"]] == ["websmq.client.sample.echo"]

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    await eventually(gone, timeout=10)


@pytest_twisted.ensureDeferred
async def test_client_list(children) -> None:  # noqa: F811
    tool = conform(children, "--list", "--protocol", "websmq", mode="client")
    assert await tool.exit_code(timeout=60) == 0, tool.output()
    assert [line.split()[0] for line in tool.stdout] == [
        "websmq.client.sample.echo", "websmq.client.sample.crash",
        "websmq.client.sample.impossible", "websmq.client.sample.reconnects"]
    every = conform(children, "--list", "--json", mode="client")  # the kits that are here
    assert await every.exit_code(timeout=60) == 0, every.output()
    ids = [json.loads(line)["id"] for line in every.stdout]
    assert "websmq.client.sample.echo" in ids and every.stderr == []
    assert not [i for i in ids if i.startswith("nydus.")]


# -- conform device -------------------------------------------------------------------------------


async def echo_device() -> tuple[str, object]:
    from twisted.internet import reactor
    from twisted.internet.endpoints import TCP4ServerEndpoint

    from tests.conformance.sample_device_kit import EchoDevice
    from wireproto.transports.stream import StreamOptions, stream_server_factory

    factory = stream_server_factory(EchoDevice, StreamOptions(framing="cobs"))
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
    return f"tcp:127.0.0.1:{port.getHost().port}", port


@pytest_twisted.ensureDeferred
async def test_a_device_is_judged_with_its_stack(children, tmp_path) -> None:  # noqa: F811
    address, port = await echo_device()
    try:
        tool = conform(children, address, "--stack", "reduced", "--report", str(tmp_path),
                       mode="device")
        assert await tool.exit_code(timeout=60) == 1, tool.output()
    finally:
        await port.stopListening()
    assert tool.stderr == []
    assert tool.stdout == [
        "pass        phyllo.sample.echo  The device echoes a frame",
        "fail        phyllo.sample.impossible  The device sends what nobody asked for: "
        "expected a frame nobody asked for within 0.3 s, got nothing",
        "information phyllo.sample.stack  The kit knows the device's stack: stack reduced, "
        "framing cobs",
        f"phyllo device at {address}: 3 cases, 1 pass, 1 fail, 0 non-strict, 1 information; MUST "
        "failed: phyllo.sample.impossible",
    ]
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["mode"] == "device" and written["target"] == address
    assert "client_started_by_kit" not in written


@pytest_twisted.ensureDeferred
async def test_a_silent_device_is_could_not_run_and_usage(children) -> None:  # noqa: F811
    silent = conform(children, f"tcp:127.0.0.1:{free_port()}", "--stack", "minimal",
                     mode="device")
    assert await silent.exit_code(timeout=60) == 3, silent.output()
    assert silent.stderr[0].startswith("wireproto conform: phyllo device does not serve: "
                                       "could not connect")
    no_stack = conform(children, f"tcp:127.0.0.1:{free_port()}", mode="device")
    assert await no_stack.exit_code(timeout=60) == 2
    assert no_stack.stderr == ["wireproto conform: give the device's ENDPOINT and its --stack "
                               "(minimal or reduced), or --list"]
    listed = conform(children, "--list", mode="device")
    assert await listed.exit_code(timeout=60) == 0, listed.output()
    assert [line.split()[0] for line in listed.stdout] == [
        "phyllo.sample.echo", "phyllo.sample.impossible", "phyllo.sample.stack"]


def test_the_nydus_client_kit_refuses_a_stream_endpoint() -> None:
    """Engine.IO clients reach an http:// URL; a tcp: endpoint is a usage error (it listened,
    and waited --wait for a client that could never come)."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from wireproto.cli import main; sys.exit(main())",
         "conform", "client", "--protocol", "nydus", "--listen", "tcp:0:interface=127.0.0.1",
         "--wait", "30"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "wireproto conform: the nydus client kit listens on an http:// (or ws://) URL, where "
        "its clients reach it; a stream endpoint carries none")


def test_what_a_run_command_gives_as_credentials_is_taken_out_of_what_a_client_writes() -> None:
    """The values of --run's options named as credentials are the scrubber's, as a client may
    print them back (they reached the report)."""
    from wireproto.conformance.command import command_secrets
    from wireproto.conformance.report import Scrubber

    arguments = ["client.js", "{url}", "--token", "tok-5ecret-1", "--api-key=key-5ecret-2",
                 "password=pw-5ecret-3", "--verbose", "--name", "visible-name"]
    found = command_secrets(arguments)
    assert found == ["tok-5ecret-1", "key-5ecret-2", "pw-5ecret-3"]
    said = Scrubber(found).text("usage: client.js --token tok-5ecret-1 --api-key=key-5ecret-2 "
                                "password=pw-5ecret-3 --name visible-name")
    assert "5ecret" not in said and "visible-name" in said
