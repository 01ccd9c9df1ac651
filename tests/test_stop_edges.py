"""Stopping at the edges, each as a user or an operator meets it, with real processes, signals and
a real broker (`wireproto serve` in its own process): a reader that goes away (``| head -1``)
or a full disk under a tool's stdout; two Ctrl-C a few milliseconds apart; Ctrl-C and SIGTERM
to the whole process group of ``serve --workers 2`` while it starts; Ctrl-C while an
application's function blocks the start; Ctrl-D at passwd's prompt; a --timeout that is no
duration; sub --reconnect when the first connection fails.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pipeline.conftest import need_spark
from tests.pipeline.test_analyze import small_capture
from tests.support import free_port, starts_its_own_spark
from tests.test_stopping import catches_sigterm

WIREPROTO = [sys.executable, "-m", "wireproto"]
LIMIT = 60.0  # seconds for anything to happen, on a busy 2-core CI machine


def eventually(check, timeout: float = LIMIT, interval: float = 0.02):  # noqa: ANN001, ANN201
    """`check()`'s first true value, tried until `timeout`."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < end, f"not within {timeout} s: {check}"
        time.sleep(interval)


def wireproto(*args: str, **options) -> subprocess.Popen:  # noqa: ANN003
    options.setdefault("stdin", subprocess.DEVNULL)
    options.setdefault("stdout", subprocess.PIPE)
    options.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([*WIREPROTO, *args], **options)


def finished(process: subprocess.Popen, timeout: float = LIMIT) -> tuple[int, str, str]:
    """`process`'s status and output once it has ended (killed, and the test failed, if it
    has not within `timeout`)."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"still running after {timeout} s; stdout {out!r}, stderr {err!r}")
    return process.returncode, (out or b"").decode(errors="replace"), \
        (err or b"").decode(errors="replace")


@pytest.fixture(scope="module")
def broker() -> Iterator[dict[str, str]]:
    """A `wireproto serve` process with WEBSMQ, UBRE and SubbleSocket over WebSocket: each
    protocol's address."""
    process = wireproto("serve", "--listen", "websmq+ws@tcp:0", "--listen", "ubre+ws@tcp:0",
                        "--listen", "subble+ws@tcp:0")
    addresses = {}
    assert process.stdout is not None
    for line in process.stdout:
        found = re.match(rb"wireproto: (\w+) over ws on (\S+)", line)
        if found:
            addresses[found[1].decode()] = found[2].decode()
        if b"ready" in line:
            break
    try:
        assert set(addresses) == {"websmq", "ubre", "subble"}, addresses
        yield addresses
    finally:
        process.terminate()
        process.wait(timeout=LIMIT)


@pytest.fixture(scope="module")
def silent() -> Iterator[int]:
    """A port whose server accepts and never answers (a hung peer)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept())
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def publish(address: str, topic: str, count: int) -> None:
    lines = "".join(f"m{n}\n" for n in range(count)).encode()
    subprocess.run([*WIREPROTO, "pub", address, "-t", topic], input=lines, check=True,
                   capture_output=True, timeout=LIMIT)


def first_line(process: subprocess.Popen, feed) -> bytes:  # noqa: ANN001
    """The first line `process` writes to its stdout, calling `feed()` until it comes."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    got = b""
    end = time.monotonic() + LIMIT
    while b"\n" not in got:
        assert time.monotonic() < end and process.poll() is None, (process.poll(), got)
        feed()
        if select.select([fd], [], [], 0.5)[0]:
            got += os.read(fd, 4096)
    return got


# -- stdout gone ------------------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("tool", ["sub", "events"])
def test_a_tool_whose_reader_has_gone_ends_at_once_and_quietly(broker: dict[str, str],
                                                              tool: str) -> None:
    # Before, `sub ... | head -1` printed a BrokenPipeError traceback for each message after
    # head had gone, and never ended.
    if tool == "sub":
        process = wireproto("sub", broker["websmq"], "-t", "pipe")

        def feed() -> None:
            publish(broker["websmq"], "pipe", 1)
    else:
        process = wireproto("events", broker["subble"], "-t", "pipe")

        def feed() -> None:
            subprocess.run([*WIREPROTO, "produce", broker["subble"], "-t", "pipe", "-m", "1"],
                           capture_output=True, timeout=LIMIT)
    first_line(process, feed)
    assert process.stdout is not None
    process.stdout.close()  # the reader goes, as head does after its line
    for _ in range(3):
        if process.poll() is None:
            feed()
    status, _, err = finished(process)
    assert (status, err) == (141, ""), (status, err)


@pytest.mark.timeout(120)
def test_call_to_a_closed_pipe_ends_quietly_with_141(broker: dict[str, str]) -> None:
    # Before: "wireproto call: BrokenPipeError: [Errno 32] Broken pipe", status 1.
    read, write = os.pipe()
    os.close(read)
    try:
        process = wireproto("call", broker["ubre"], "nosuch", "1", "--json", stdout=write)
    finally:
        os.close(write)
    status, _, err = finished(process)
    assert (status, err) == (141, "")


@pytest.mark.parametrize("args", [("--version",), ("--help",), ("pub", "--help")])
def test_the_version_and_the_help_to_a_full_disk_say_so(args: tuple[str, ...]) -> None:
    # argparse dropped the OSError: they said nothing and exited 0.
    with open("/dev/full", "w") as full:
        status, _, err = finished(wireproto(*args, stdout=full))
    assert (status, err) == (1, "wireproto: cannot write the output: No space left on device\n")


@pytest.mark.timeout(120)
def test_a_broker_whose_banner_cannot_be_written_goes_on_serving() -> None:
    # A broker's banner is said for whoever started it: with its reader gone before it was
    # written, the broker serves on (as mosquitto, which ignores SIGPIPE), and stops cleanly.
    # Before, it ended with 141 as it started.
    port = free_port()
    read, write = os.pipe()
    os.close(read)
    try:
        process = wireproto("serve", "--listen", f"websmq+ws@tcp:{port}", stdout=write)
    finally:
        os.close(write)
    try:
        eventually(lambda: process.poll() is not None or _serves(port))
        assert process.poll() is None, finished(process)
        publish(f"ws://127.0.0.1:{port}/websmq", "still", 1)
    finally:
        process.send_signal(signal.SIGINT)
    status, _, err = finished(process)
    assert (status, err) == (0, "")


def _serves(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.mark.timeout(120)
def test_a_tool_on_a_full_disk_says_so_in_one_line_and_ends(broker: dict[str, str]) -> None:
    # Before: an OSError traceback, then it hung.
    with open("/dev/full", "wb") as full:
        process = wireproto("sub", broker["websmq"], "-t", "full", "-C", "2", stdout=full)

        def feed() -> None:
            publish(broker["websmq"], "full", 1)

        end = time.monotonic() + LIMIT
        while process.poll() is None and time.monotonic() < end:
            feed()
            time.sleep(0.2)
    status, _, err = finished(process)
    assert status == 1
    assert err == "wireproto sub: cannot write the output: No space left on device\n"


# -- two signals ------------------------------------------------------------------------------


@pytest.mark.timeout(600)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM],
                         ids=lambda number: signal.Signals(number).name)
def test_a_second_signal_while_stopping_changes_nothing(broker: dict[str, str], silent: int,
                                                       signum: int) -> None:
    # Before, a second signal 0-10 ms after the first gave a ReactorNotRunning traceback, or
    # ended the process by the signal (-2, -15) where 0 or 130 is documented.
    cases = {
        "sub": (["sub", broker["websmq"], "-t", "x"], 0),
        "events": (["events", broker["subble"], "-t", "x"], 0),
        "pub": (["pub", broker["websmq"], "-t", "x"], 130),
        "call": (["call", f"tcp:127.0.0.1:{silent}", "-p", "ubre", "add", "[1]"], 130),
        "serve": (["serve", "--listen", "websmq+ws@tcp:0"], 0),
    }
    for gap in (0.0, 0.002, 0.005, 0.01):
        runs = {name: wireproto(*args, stdin=subprocess.PIPE) for name, (args, _) in
                cases.items()}
        try:
            for process in runs.values():
                eventually(lambda process=process: catches_sigterm(process.pid))
            time.sleep(1.5)  # connected, or listening
            for process in runs.values():
                process.send_signal(signum)
            time.sleep(gap)
            for process in runs.values():
                process.send_signal(signum)
            for name, process in runs.items():
                status, _, err = finished(process)
                assert (status, err) == (cases[name][1], ""), (name, gap, status, err)
        finally:
            for process in runs.values():
                if process.poll() is None:
                    process.kill()
                    process.wait()


# -- serve --workers: the group's signal ------------------------------------------------------


@pytest.mark.timeout(600)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM],
                         ids=lambda number: signal.Signals(number).name)
def test_the_process_group_of_serve_workers_stops_quietly_while_it_starts(signum: int) -> None:
    # A terminal's Ctrl-C and systemd's stop signal the supervisor and its workers at once (the
    # private nats-server has a session of its own, and is stopped after the workers). Before,
    # a worker printed a KeyboardInterrupt traceback (SIGINT while it imported), or the start
    # failed: "worker 0: ended before it was ready", status 1; and now and then, a worker
    # stopping while it looked for leases that are over warned that the NATS connection closed.
    from wireproto.supervisor.natsserver import NatsServerMissing, nats_server_binary

    try:
        nats_server_binary()
    except NatsServerMissing:
        pytest.skip("no nats-server")
    for moment in (0.6, 1.0, 1.5, "ready", "ready+0.5", "ready+1.0"):
        process = wireproto("serve", "--workers", "2", "--listen", "websmq+ws@tcp:0",
                            start_new_session=True)
        try:
            if str(moment).startswith("ready"):
                assert process.stdout is not None
                for line in process.stdout:
                    if b"ready" in line:
                        break
                # The supervisor and its two workers: the private nats-server is not there.
                assert len(_in_group(process.pid)) == 3, _in_group(process.pid)
                time.sleep(float(str(moment).partition("+")[2] or 0))
            else:
                eventually(lambda process=process: catches_sigterm(process.pid))
                time.sleep(float(moment))
            os.killpg(process.pid, signum)
            status, _, err = finished(process)
            assert (status, err) == (0, ""), (moment, status, err)
            eventually(lambda process=process: not _in_group(process.pid), timeout=30)
        finally:
            if _in_group(process.pid):
                os.killpg(process.pid, signal.SIGKILL)


def _in_group(group: int) -> list[str]:
    found = subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True)
    return found.stdout.split()


# -- an application's function that blocks --------------------------------------------------


@pytest.mark.timeout(120)
def test_serve_stopped_while_its_application_sets_up_never_says_ready(tmp_path: Path) -> None:
    # Before, Ctrl-C while the function blocked still printed the listener lines and
    # "ready; Ctrl-C stops" once it returned.
    (tmp_path / "slowsetup.py").write_text(
        "import pathlib, time\n\n\ndef setup(broker):\n"
        f"    pathlib.Path({str(tmp_path / 'began')!r}).touch()\n    time.sleep(3)\n")
    process = wireproto("serve", "--app", "slowsetup:setup", "--listen", "websmq+ws@tcp:0",
                        cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                            [str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    eventually(lambda: (tmp_path / "began").exists())
    process.send_signal(signal.SIGINT)
    status, out, err = finished(process)
    assert (status, out, err) == (0, "", "")


# -- passwd: Ctrl-D ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_ctrl_d_at_the_password_prompt_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    # Before: an EOFError traceback from getpass, status 1.
    path = tmp_path / "passwords"
    pid, terminal = pty.fork()
    if pid == 0:  # the child: wireproto passwd on a terminal
        os.execv(sys.executable, [*WIREPROTO, "passwd", str(path), "alice"])
    seen = b""
    end = time.monotonic() + LIMIT
    while b"Password:" not in seen and time.monotonic() < end:
        if select.select([terminal], [], [], 0.2)[0]:
            seen += os.read(terminal, 4096)
    os.write(terminal, b"\x04")  # Ctrl-D
    while time.monotonic() < end:
        if select.select([terminal], [], [], 0.2)[0]:
            try:
                chunk = os.read(terminal, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    _, status = os.waitpid(pid, 0)
    os.close(terminal)
    text = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 1, text
    after = [line for line in text.split("Password:", 1)[1].splitlines() if line.strip()]
    assert after == ["wireproto passwd: no password given; nothing changed"], text
    assert not path.exists()


# -- --timeout --------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tool", ["pub", "sub", "call", "produce", "events"])
def test_every_tool_refuses_a_timeout_that_is_no_duration(tool: str) -> None:
    # Before, pub and sub took them: "AssertionError: -1.0 is not greater than or equal to 0
    # seconds" (exit 1), a DNS error for 0 (exit 3), "within -0 s" (exit 5); inf was taken by
    # every tool.
    args = {"pub": ["ws://127.0.0.1:1/websmq", "-t", "x", "-m", "1"],
            "sub": ["ws://127.0.0.1:1/websmq", "-t", "x"],
            "call": ["ws://127.0.0.1:1/ubre", "add", "1"],
            "produce": ["ws://127.0.0.1:1/subble", "-t", "x", "-m", "1"],
            "events": ["ws://127.0.0.1:1/subble", "-t", "x"]}[tool]
    for value in ("-1", "0", "-0", "nan", "inf", "soon"):
        status, out, err = finished(wireproto(tool, *args, f"--timeout={value}"))
        assert status == 2, (value, err)
        assert re.fullmatch(rf"wireproto {tool}: argument --timeout: .*{value}.*\n", err), err


# -- sub --reconnect --------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_sub_reconnect_still_ends_when_its_first_connection_fails() -> None:
    # As mosquitto_sub: a broker that is not there at the start is an error (exit 3) even with
    # --reconnect, which applies once connected (docs/tools.md).
    status, _, err = finished(wireproto("sub", "ws://127.0.0.1:1/websmq", "-t", "x",
                                        "--reconnect"))
    assert status == 3
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err


# -- analyze while Spark runs -----------------------------------------------------------------


@starts_its_own_spark
@pytest.mark.timeout(900)
def test_analyze_stopped_while_spark_runs_prints_no_traceback(tmp_path: Path) -> None:
    # Before: status 130, but "ERROR:root:KeyboardInterrupt while sending command." and py4j's
    # and pyspark's tracebacks on stderr, from a KeyboardInterrupt raised inside a py4j call.
    need_spark()
    small_capture(tmp_path / "capture")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    for moment, signum in ((0.0, signal.SIGTERM), (2.0, signal.SIGINT), (4.0, signal.SIGTERM),
                           (6.0, signal.SIGINT), (9.0, signal.SIGTERM)):
        out = tmp_path / f"out-{moment}"
        process = wireproto("analyze", str(tmp_path / "capture"), "--out", str(out),
                            "--master", "local[1]", env=env, start_new_session=True)
        try:
            # From the moment the JVM runs.
            eventually(lambda process=process: "java" in _commands_in_session(process.pid)
                       or process.poll() is not None)
            time.sleep(moment)
            sent = process.poll() is None
            process.send_signal(signum)
            status, _, err = finished(process, timeout=120)
            if not sent:
                continue
            assert status in (130, 0), (moment, status, err)  # 0: it was done already
            assert all(line.startswith("wireproto analyze: ") for line in err.splitlines()), \
                (moment, err)
            if status == 130:
                assert not out.exists() or not any(out.iterdir())
            eventually(lambda process=process: not _commands_in_session(process.pid),
                       timeout=60)
        finally:
            if _commands_in_session(process.pid):
                subprocess.run(["pkill", "-KILL", "-s", str(process.pid)])


def _commands_in_session(session: int) -> list[str]:
    found = subprocess.run(["pgrep", "-s", str(session), "-l"], capture_output=True, text=True)
    return [line.split(None, 1)[1] for line in found.stdout.splitlines()]
