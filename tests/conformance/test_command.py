"""`wireproto conform server` as a real process, with the kit's own small catalogue (tests/
conformance/sample_kit.py) in place of websmq's: the lines it prints, its exit statuses (0, 1, 2,
3, 130), the report it writes, and what it never shows (a credential)."""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

import pytest
import pytest_twisted

from tests.conformance.sample_kit import POISON, ToyServer
from tests.support import eventually, free_port
from tests.test_cli import Child, children  # noqa: F401 - the fixture

# The command, its websmq kit replaced by the sample catalogue.
RUN = ("import sys, wireproto.conformance.kits as kits; "
       "kits.KITS['websmq'] = 'tests.conformance.sample_kit'; "
       "from wireproto.cli import main; sys.exit(main())")
ROOT = Path(__file__).resolve().parents[2]
QUICK = "websmq.sample.delivered,websmq.sample.echo-back"


def conform(children: list[Child], *args: str) -> Child:  # noqa: F811
    child = Child(sys.executable, "-c", RUN, "conform", "server", *args, cwd=ROOT)
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
