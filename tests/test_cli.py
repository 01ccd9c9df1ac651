"""`wireproto serve` and `twistd wireproto` as real processes: the listener lines, a publish from
one client to another through them, clean stops on SIGINT/SIGTERM, and one-line errors."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor

from tests.support import eventually, on_the_default_ports, sleep, wait_for
from wireproto.cli import announce, main
from wireproto.codecs import websmq
from wireproto.protocols.websmq.client import WebsmqClientProtocol, connect

BIN = Path(sys.executable).parent
LISTENER_LINE = re.compile(r"^wireproto: (\S+) over (\S+) on (\S+)$")


class Child:
    """A subprocess whose stdout and stderr lines are read by threads, so waiting for a line
    never blocks the reactor and always has a timeout."""

    def __init__(self, *args: str, stdin: str | None = None, hold_stdin: bool = False,
                 cwd: str | Path | None = None) -> None:
        """Run `args` (in `cwd`, if given); `stdin` is written to its standard input, which is
        then closed (or, with `hold_stdin`, left open, as a terminal's is)."""
        self.process = subprocess.Popen(
            args, stdin=subprocess.PIPE if stdin is not None or hold_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
        )
        if stdin is not None:
            assert self.process.stdin is not None
            self.process.stdin.write(stdin)
            self.process.stdin.flush()
            if not hold_stdin:
                self.process.stdin.close()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in ((self.process.stdout, self.stdout),
                                  (self.process.stderr, self.stderr))
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    async def line(self, pattern: re.Pattern[str], timeout: float = 15) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            if self.ended() and not any(map(pattern.match, self.stdout)):
                raise AssertionError(
                    f"exited with {self.process.returncode} before printing {pattern.pattern!r}:"
                    f"\n{self.output()}"
                )
            return next(filter(None, map(pattern.match, self.stdout)), None)

        try:
            return await eventually(found, timeout=timeout)
        except TimeoutError:
            raise AssertionError(f"no {pattern.pattern!r} line:\n{self.output()}") from None

    def ended(self) -> bool:
        """Exited, and every line it printed has been read."""
        return self.process.poll() is not None and not any(
            reader.is_alive() for reader in self.readers
        )

    async def exit_code(self, timeout: float = 15) -> int:
        await eventually(self.ended, timeout=timeout)
        return self.process.returncode

    def output(self) -> str:
        return "stdout:\n" + "\n".join(self.stdout) + "\nstderr:\n" + "\n".join(self.stderr)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


@pytest_twisted.async_yield_fixture
async def children() -> AsyncIterator[list[Child]]:
    started: list[Child] = []
    try:
        yield started
    finally:
        for child in started:
            child.kill()


async def exchange(address: str) -> None:
    """A publish from one client reaches another subscribed client, through the broker."""
    subscriber: WebsmqClientProtocol = await wait_for(connect(reactor, address))
    publisher: WebsmqClientProtocol = await wait_for(connect(reactor, address))
    try:
        received: list[websmq.Publish] = []
        subscriber.subscribe("cli/test", received.append)

        # WEBSMQ has no acknowledgement: publish until the subscription has surely arrived.
        def delivered() -> bool:
            if not received:
                publisher.publish("cli/test", b"hello")
            return bool(received)

        await eventually(delivered, interval=0.05)
        assert received[0] == websmq.Publish("cli/test", b"hello")
    finally:
        for client in (subscriber, publisher):
            await wait_for(client.disconnect())


@pytest_twisted.ensureDeferred
async def test_serve_prints_its_address_relays_and_stops_on_sigint(children: list[Child]) -> None:
    child = Child(sys.executable, "-m", "wireproto", "serve",
                  "--listen", "websmq+length32@tcp:0:interface=127.0.0.1")
    children.append(child)
    listening = await child.line(LISTENER_LINE)
    assert listening.group(1, 2) == ("websmq", "length32")
    assert re.fullmatch(r"tcp:127\.0\.0\.1:\d+", listening.group(3))
    await child.line(re.compile(r"^wireproto: ready; Ctrl-C stops$"))
    assert child.stdout == [listening.group(0), "wireproto: ready; Ctrl-C stops"]

    await exchange(listening.group(3))

    child.process.send_signal(signal.SIGINT)
    assert await child.exit_code() == 0, child.output()
    assert child.stderr == []  # warnings and errors only, and there were none


@pytest_twisted.ensureDeferred
async def test_serve_waits_for_a_phyllo_device_and_bridges_it(
    children: list[Child], tmp_path: Path
) -> None:
    from tests.phyllo.test_bridge import PtyDevice, document

    device_path = tmp_path / "ttyACM0"
    child = Child(sys.executable, "-m", "wireproto", "serve", "-v",
                  "--listen", "websmq+ws@tcp:0:interface=127.0.0.1",
                  "--phyllo", f"dev1@serial:{device_path}")
    children.append(child)
    listening = await child.line(LISTENER_LINE)
    await child.line(re.compile(
        rf"^wireproto: phyllo link dev1 \(reduced stack, hub topics phyllo/dev1/...\) on "
        rf"serial:{re.escape(str(device_path))}$"
    ))
    # Not plugged in: the broker runs on, saying why and when it tries again.
    await eventually(lambda: any("cannot open serial:" in line for line in child.stderr))
    await eventually(lambda: any("Scheduling retry 2" in line for line in child.stderr),
                     timeout=10)
    subscriber: WebsmqClientProtocol = await wait_for(connect(reactor, listening.group(3)))
    try:
        received: list[websmq.Publish] = []
        subscriber.subscribe("phyllo/dev1/temp", received.append)
        device = PtyDevice(device_path)
        try:
            def delivered() -> bool:
                if not received:
                    device.send(document("temp", 22))
                return bool(received)

            await eventually(delivered, timeout=20, interval=0.2)
        finally:
            device.unplug()
        assert received[0] == websmq.Publish("phyllo/dev1/temp", b"22")
    finally:
        await wait_for(subscriber.disconnect())
    assert child.process.poll() is None
    child.process.send_signal(signal.SIGINT)
    assert await child.exit_code() == 0, child.output()


def _default_ports_free() -> None:
    """The test of `wireproto serve` with no arguments needs 8765-8769 on 127.0.0.1."""
    for port in range(8765, 8770):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as error:
                pytest.fail(f"port {port} on 127.0.0.1 is taken ({error.strerror}): the default "
                            "listeners need 8765-8769")


@on_the_default_ports
@pytest_twisted.ensureDeferred
async def test_serve_with_no_arguments_joins_every_protocol(children: list[Child]) -> None:
    """One message from each protocol's own client reaches the clients of all the others."""
    from wireproto.protocols.nydus import client as nydus_client
    from wireproto.protocols.subble import client as subble_client
    from wireproto.protocols.ubre import client as ubre_client

    _default_ports_free()
    child = Child(sys.executable, "-m", "wireproto", "serve")
    children.append(child)
    await child.line(re.compile(r"^wireproto: ready; Ctrl-C stops$"))
    listeners = [LISTENER_LINE.match(line) for line in child.stdout[:-2]]
    assert all(listeners) and len(listeners) == 8, child.output()
    assert child.stdout[-2] == ("wireproto: status page at http://127.0.0.1:8765/, metrics at "
                                "http://127.0.0.1:8765/metrics")

    got: dict[str, list[Any]] = {name: [] for name in ("websmq", "ubre", "nydus", "subble")}
    websmq_client = await wait_for(connect(reactor, "ws://127.0.0.1:8765/websmq"))
    synced: set[str] = set()
    websmq_client.subscribe("demo", lambda m: got["websmq"].append(m.payload))
    websmq_client.subscribe("sync", lambda m: synced.add("websmq"))
    ubre = await wait_for(ubre_client.connect(reactor, "ws://127.0.0.1:8765/ubre"))
    ubre.subscribe("demo", lambda m: got["ubre"].append(m.body))
    ubre.subscribe("sync", lambda m: synced.add("ubre"))
    nydus = await wait_for(nydus_client.connect(reactor, "http://127.0.0.1:8765/engine.io/"))
    nydus.register_route("/demo", lambda match, data: got["nydus"].append(data))
    await wait_for(nydus.invoke("/_hub/subscribe", "/demo"))
    subble = await wait_for(subble_client.connect(
        reactor, "ws://127.0.0.1:8765/subble", subscribe=["demo"], produce=["demo"],
    ))
    subble.listen("demo", lambda event: got["subble"].append(event.payload))
    try:
        # WEBSMQ and UBRE subscriptions have no acknowledgement: publish on "sync" until both
        # hear it, so their "demo" subscriptions, sent first, are in place.
        async def sync() -> bool:
            await wait_for(nydus.invoke("/_hub/publish", {"path": "/sync", "data": 0}))
            return synced == {"websmq", "ubre"}

        for _ in range(100):
            if await sync():
                break
            await sleep(0.05)
        assert synced == {"websmq", "ubre"}

        await websmq_client.publish("demo", b'{"from":"websmq"}')
        await ubre.publish("demo", {"from": "ubre"})
        await wait_for(nydus.invoke("/_hub/publish", {"path": "/demo", "data": {"from": "nydus"}}))
        await wait_for(subble.produce("demo", {"from": "subble"}, format="json"))
        await eventually(lambda: all(len(messages) >= 3 for messages in got.values()))
        await sleep(0.2)  # and nothing more: no client gets its own message back
        senders = ["websmq", "ubre", "nydus", "subble"]
        decoded = {
            "websmq": [json.loads(payload)["from"] for payload in got["websmq"]],
            "ubre": [body["from"] for body in got["ubre"]],
            "nydus": [data["from"] for data in got["nydus"]],
            "subble": [payload["from"] for payload in got["subble"]],
        }
        for name, senders_seen in decoded.items():
            assert sorted(senders_seen) == sorted(set(senders) - {name}), (name, decoded)
    finally:
        await wait_for(websmq_client.disconnect())
        for client in (ubre, nydus, subble):
            await wait_for(defer.maybeDeferred(client.close))
    child.process.send_signal(signal.SIGINT)
    assert await child.exit_code() == 0, child.output()


@pytest_twisted.ensureDeferred
async def test_serve_answers_ubre_typed_as_lines_like_nc(children: list[Child]) -> None:
    child = Child(sys.executable, "-m", "wireproto", "serve",
                  "--listen", "ubre+lines@tcp:0:interface=127.0.0.1")
    children.append(child)
    listening = await child.line(LISTENER_LINE)
    assert listening.group(1, 2) == ("ubre", "lines")
    port = int(listening.group(3).rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as nc:
        nc.sendall(b'{"subscribe":"news"}\n\n{"request":"add","id":1,"body":[1,2]}\n')
        received = b""
        while not received.endswith(b"\n") or b'"fail":1' not in received:
            chunk = nc.recv(4096)
            assert chunk, f"closed after {received!r}"
            received += chunk
    # The broker announces the topic its own subscriber started, then answers: no handlers.
    assert received == b'{"subscribe":"news"}\n{"fail":1,"body":"NotFound"}\n'
    child.process.send_signal(signal.SIGINT)
    assert await child.exit_code() == 0, child.output()


@pytest_twisted.ensureDeferred
async def test_a_bad_listen_is_one_line_and_status_2(children: list[Child]) -> None:
    child = Child(sys.executable, "-m", "wireproto", "serve", "--listen", "websmq+wss@tcp:1")
    children.append(child)
    assert await child.exit_code() == 2
    assert child.stderr == [
        "wireproto serve: --listen 'websmq+wss@tcp:1': unknown transport 'wss'; "
        "use ws, engineio, length32, lines or cobs"
    ]
    assert child.stdout == []


@pytest_twisted.ensureDeferred
async def test_a_port_in_use_is_one_line_and_status_1(children: list[Child]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        child = Child(sys.executable, "-m", "wireproto", "serve",
                      "--listen", f"websmq+length32@tcp:{port}:interface=127.0.0.1")
        children.append(child)
        assert await child.exit_code() == 1, child.output()
    assert len(child.stderr) == 1, child.output()
    assert child.stderr[0].startswith(
        f"wireproto: cannot listen for websmq over length32 on tcp:{port}:interface=127.0.0.1: "
    )
    assert child.stdout == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # argparse's own wording (and its quoting of choices) varies with the Python version.
        (["serve", "--overflow", "never"],
         "wireproto serve: argument --overflow: invalid choice: 'never' (choose from ..."),
        (["serve", "--queue-bytes", "lots"],
         "wireproto serve: argument --queue-bytes: invalid int value: 'lots' (see --help)"),
        (["serve", "--queue-bytes", "0"],
         "wireproto serve: --queue-bytes: must be a positive number of bytes, not 0"),
        (["serve", "--attach", "websmq+ws@tcp:h:1"],
         "wireproto serve: --attach 'websmq+ws@tcp:h:1': an attached link needs a framing, "
         "not ws; use length32 or cobs"),
        (["serve", "--config", "/nonexistent.toml"],
         "wireproto serve: /nonexistent.toml: cannot read the config file: "
         "No such file or directory"),
        (["launch"], "wireproto: argument COMMAND: invalid choice: 'launch' (choose from ..."),
        ([], "wireproto: the following arguments are required: COMMAND (see --help)"),
    ],
)
def test_option_errors_are_one_line_and_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        status = main(argv)
    except SystemExit as exit:
        status = exit.code
    assert status == 2
    out, err = capsys.readouterr()
    assert out == ""
    if message.endswith("..."):
        assert err.startswith(message[:-3]) and err.endswith(" (see --help)\n"), err
        assert err.count("\n") == 1
    else:
        assert err == message + "\n"


def test_a_bad_config_file_names_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "wireproto.toml"
    config.write_text('[hub]\noverflow = "drop-newest"\n')
    assert main(["serve", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f'wireproto serve: {config}: hub.overflow: unknown policy "drop-newest"; '
        "use drop-oldest or disconnect\n"
    )


def test_the_default_listeners_lines() -> None:
    """What `wireproto serve` prints with no options, once bound to 8765 to 8769."""
    from io import StringIO

    from twisted.internet.address import IPv4Address

    from wireproto.config import DEFAULT_LISTENERS
    from wireproto.service import BoundListener, format_address

    lines = [
        BoundListener(listener, format_address(listener, IPv4Address("TCP", "127.0.0.1", port)))
        .describe()
        for listener, port in zip(
            DEFAULT_LISTENERS, (8765, 8766, 8765, 8767, 8765, 8768, 8765, 8769), strict=True
        )
    ]
    out = StringIO()
    announce([*lines, "ready; Ctrl-C stops"], out)
    assert out.getvalue() == (
        "wireproto: websmq over ws on ws://127.0.0.1:8765/websmq\n"
        "wireproto: websmq over length32 on tcp:127.0.0.1:8766\n"
        "wireproto: ubre over ws on ws://127.0.0.1:8765/ubre\n"
        "wireproto: ubre over lines on tcp:127.0.0.1:8767\n"
        "wireproto: nydus over engineio on http://127.0.0.1:8765/engine.io/\n"
        "wireproto: nydus over lines on tcp:127.0.0.1:8768\n"
        "wireproto: subble over ws on ws://127.0.0.1:8765/subble\n"
        "wireproto: subble over length32 on tcp:127.0.0.1:8769\n"
        "wireproto: ready; Ctrl-C stops\n"
    )


def test_the_banner_names_the_status_page_and_metrics_of_the_first_http_port() -> None:
    from wireproto.admin.settings import AdminSettings
    from wireproto.cli import banner
    from wireproto.config import Config, MetricsSettings, parse_listen
    from wireproto.service import BoundListener

    stream = parse_listen("websmq+length32@tcp:8766")
    web = parse_listen("websmq+ws@tcp:8443")  # the addresses below decide
    bound = [BoundListener(stream, "tcp:127.0.0.1:8766"),
             BoundListener(web, "wss://127.0.0.1:8443/websmq"),
             BoundListener(web, "ws://127.0.0.1:8765/websmq")]
    config = Config(listeners=(stream, web))
    assert banner(config, bound)[3] == (
        "status page at https://127.0.0.1:8443/, metrics at https://127.0.0.1:8443/metrics")
    assert banner(config.replace(admin=AdminSettings(enabled=False),
                                 metrics=MetricsSettings(path="/m")), bound)[3] == (
        "metrics at https://127.0.0.1:8443/m")
    quiet = config.replace(admin=AdminSettings(enabled=False),
                           metrics=MetricsSettings(enabled=False))
    assert len(banner(quiet, bound)) == 3
    # Stream listeners, or HTTP only on a unix socket: no URL a browser can open.
    assert banner(config, bound[:1]) == ["websmq over length32 on tcp:127.0.0.1:8766"]
    assert len(banner(config, [BoundListener(web, "ws+unix:///run/w.sock:/websmq")])) == 1


def test_help_shows_the_listen_syntax(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["serve", "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert "--listen PROTOCOL+TRANSPORT[/PATH]@ENDPOINT" in out
    assert "--attach PROTOCOL[+FRAMING]@CLIENT_ENDPOINT" in out
    assert "websmq+ws@ssl:8443:privateKey=key.pem:certKey=cert.pem" in out
    assert "websmq+cobs@unix:/tmp/websmq.sock" in out


@pytest_twisted.ensureDeferred
async def test_twistd_runs_the_plugin_and_stops_on_sigterm(children: list[Child]) -> None:
    child = Child(str(BIN / "twistd"), "-n", "--pidfile=", "wireproto",
                  "--listen", "websmq+ws@tcp:0:interface=127.0.0.1")
    children.append(child)
    listening = await child.line(LISTENER_LINE)
    assert listening.group(1, 2) == ("websmq", "ws")
    assert re.fullmatch(r"ws://127\.0\.0\.1:\d+/websmq", listening.group(3))

    await exchange(listening.group(3))

    child.process.send_signal(signal.SIGTERM)
    # twistd ends by re-raising the signal it stopped on.
    assert await child.exit_code() in (0, -signal.SIGTERM), child.output()
    await child.line(re.compile(r".*Server Shut Down\.$"))


@pytest_twisted.ensureDeferred
async def test_twistd_lists_the_plugin_and_refuses_bad_options(children: list[Child]) -> None:
    listing = Child(str(BIN / "twistd"), "--help")
    bad = Child(str(BIN / "twistd"), "-n", "--pidfile=", "wireproto", "--listen", "websmq+x@tcp:0")
    children.extend([listing, bad])
    await listing.line(re.compile(r"^\s+wireproto\s+wireproto broker"))
    assert await listing.exit_code() == 0
    # One line and status 2, as `wireproto serve`: not twistd's usage block before the error.
    assert await bad.exit_code() == 2, bad.output()
    assert bad.stdout == []
    assert bad.stderr[0].startswith("twistd wireproto: --listen 'websmq+x@tcp:0': unknown "
                                    "transport 'x'; "), bad.output()
    assert bad.stderr[1:] == ["twistd wireproto: see twistd wireproto --help"]


@pytest_twisted.ensureDeferred
async def test_twistd_with_a_port_in_use_says_so_in_one_line(children: list[Child]) -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        child = Child(str(BIN / "twistd"), "-n", "--pidfile=", "wireproto",
                      "--listen", f"websmq+ws@tcp:{port}")
        children.append(child)
        assert await child.exit_code() == 1, child.output()
    finally:
        taken.close()
    output = child.output()
    assert "Traceback" not in output, output
    assert "Address already in use" in output


@pytest_twisted.ensureDeferred
async def test_serve_names_its_capture_in_the_banner(children: list[Child], tmp_path) -> None:
    child = Child(sys.executable, "-m", "wireproto", "serve", "--capture", str(tmp_path / "c"),
                  "--listen", "websmq+length32@tcp:0:interface=127.0.0.1")
    children.append(child)
    await child.line(re.compile(r"^wireproto: ready"))
    assert f"wireproto: capture: every message in and out to {tmp_path / 'c'}" in child.stdout
    child.process.send_signal(signal.SIGINT)
    assert await child.exit_code() == 0, child.output()


def test_check_config_says_what_a_file_serves_or_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.toml"
    good.write_text('listen = ["websmq+ws@tcp:8765", "ubre+lines@tcp:8767"]\n'
                    'phyllo = ["dev1@serial:/dev/ttyACM0"]\n')
    assert main(["check-config", str(good)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        f"wireproto: {good}: ok",
        "wireproto: listen: websmq over ws on tcp:8765:interface=127.0.0.1 at /websmq",
        "wireproto: listen: ubre over lines on tcp:8767:interface=127.0.0.1",
        "wireproto: phyllo: phyllo link dev1 (reduced stack, hub topics phyllo/dev1/...) on "
        "serial:/dev/ttyACM0",
    ]
    bad = tmp_path / "bad.toml"
    bad.write_text('[[listen]]\nprotocol = "websmq"\ntransport = "ws"\nendpoint = "tpc:8765"\n')
    assert main(["check-config", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"wireproto check-config: {bad}: listen[1].endpoint: bad server endpoint "
                   "'tpc:8765': Unknown endpoint type: 'tpc'\n")


def test_check_config_lists_every_problem_and_checks_ports_without_binding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It accepted tcp:70000 and stopped at the first problem of a file.
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'lsten = []\n'
        '[[listen]]\nprotocol = "websmq"\ntransport = "ws"\nendpoint = "tcp:70000"\n'
        '[[listen]]\nprotocol = "ubre"\ntransport = "lines"\n'
        'endpoint = "tcp:8767:interface=localhost"\n'
        '[hub]\nqueue = 1\nmax_subscriptions = 0\n'
    )
    assert main(["check-config", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert all(line.startswith(f"wireproto check-config: {bad}: ") for line in lines), err
    problems = [line.split(f"{bad}: ", 1)[1] for line in lines]
    assert [problem.split(":", 1)[0] for problem in problems] == [
        "lsten", "listen[1].endpoint", "listen[2].endpoint", "hub.queue",
        "hub.max_subscriptions"]
    assert "port '70000' is not 0 to 65535" in problems[1]
    assert "interface 'localhost' is not an IP address" in problems[2]


@pytest.mark.parametrize("level", ["warn", "info"])
@pytest_twisted.ensureDeferred
async def test_twistd_applies_the_log_level_of_the_config(
    children: list[Child], tmp_path: Path, level: str
) -> None:
    # [log] was not applied under twistd: wireproto's info lines were always logged.
    config = tmp_path / "wireproto.toml"
    config.write_text('listen = ["websmq+length32@tcp:0:interface=127.0.0.1"]\n'
                      f'[log]\nlevel = "{level}"\n')
    child = Child(str(BIN / "twistd"), "-n", "--pidfile=", "wireproto", "--config", str(config))
    children.append(child)
    await child.line(re.compile(r"^wireproto: ready$"))
    child.process.send_signal(signal.SIGTERM)
    await child.exit_code()
    await child.line(re.compile(r".*Server Shut Down\.$"))  # twistd's own lines, as before
    logged_info = any("[wireproto.service#info] listening:" in line for line in child.stdout)
    assert logged_info == (level == "info"), child.output()
