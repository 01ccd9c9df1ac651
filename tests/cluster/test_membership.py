"""The private nats-server of `wireproto serve --workers N` admits the workers only: another
local user (a real second uid), or any process without the supervisor's fresh NKey, is refused;
the key is on no command line and in no environment; and the server's directory goes when the
supervisor stops."""

from __future__ import annotations

import encodings.idna  # noqa: F401 - imported before a child drops to a user who cannot
import json
import os
import pwd
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted

from tests.brokers import LOCAL
from tests.cluster.test_workers import start_supervised, stop_supervised


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, waiting = [], [pid]
    while waiting:
        for child in children.get(waiting.pop(), ()):
            found.append(child)
            waiting.append(child)
    return found


def command_line(pid: int) -> list[str]:
    """Its arguments; one empty one for a process that ended since it was listed."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError):
        return [""]


def private_nats(supervisor: int) -> tuple[int, Path]:
    """The private nats-server's pid and directory."""
    for pid in descendants(supervisor):
        arguments = command_line(pid)
        if arguments and arguments[0].endswith("nats-server"):
            return pid, Path(arguments[arguments.index("-c") + 1]).parent
    raise AssertionError("the supervisor runs no nats-server")


def nats_port(directory: Path) -> int:
    (ports,) = (directory / "ports").glob("*.ports")
    return int(json.loads(ports.read_text())["nats"][0].rsplit(":", 1)[1])


def hello(port: int, *, second_user: bool) -> str:
    """What a NATS server on `port` answers the first PING of a client without credentials,
    from a forked process that is `nobody` if `second_user` (the interpreter's own path may be
    closed to other users, so the child runs no program)."""
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:
        answer = b"?"
        try:
            os.close(reading)
            if second_user:
                nobody = pwd.getpwnam("nobody")
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
                reader = connection.makefile("rb")
                reader.readline()  # INFO
                connection.sendall(
                    b'CONNECT {"verbose":false,"pedantic":false,"protocol":1}\r\nPING\r\n')
                answer = reader.readline()
        except BaseException as error:  # said to the parent, which fails the test with it
            answer = repr(error).encode()
        finally:
            os.write(writing, answer)
            os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as answer:
        said = answer.read()
    os.waitpid(child, 0)
    return said.decode().strip()


@pytest_twisted.ensureDeferred
async def test_the_private_nats_server_admits_only_the_workers():
    running = await start_supervised("--listen", f"websmq+length32@tcp:0:{LOCAL}")
    supervisor = running.child.process.pid
    try:
        _, directory = private_nats(supervisor)
        port = nats_port(directory)
        # The workers are in: they said ready only once linked through it.
        assert hello(port, second_user=False) == "-ERR 'Authorization Violation'"
        if os.getuid() == 0:
            assert hello(port, second_user=True) == "-ERR 'Authorization Violation'"
            # Nor can another user read what the workers sign with, or the server's data.
            assert oct(directory.stat().st_mode & 0o777) == "0o700"
        seeds = [path.read_bytes().strip() for path in directory.glob("*.nk")]
        assert len(seeds) == 1 and seeds[0].startswith(b"SU")
        for path in directory.glob("*"):
            if path.is_file():
                assert path.stat().st_mode & 0o077 == 0, path
        # On no command line and in no environment of any process.
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            for view in ("cmdline", "environ"):
                try:
                    assert seeds[0] not in Path(f"/proc/{entry}/{view}").read_bytes(), entry
                except (FileNotFoundError, ProcessLookupError, PermissionError):
                    continue
    finally:
        await stop_supervised(running.child)
    assert not directory.exists()


def test_a_supervisor_killed_outright_leaves_a_directory_the_next_one_removes(tmp_path):
    """Only a directory of this user's whose supervisor is gone; never a live one's."""
    from wireproto.supervisor.workers import remove_abandoned_directories

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    abandoned = tmp_path / f"wireproto-nats-{int(gone.stdout)}-x1"
    live = tmp_path / f"wireproto-nats-{os.getpid()}-x2"
    other = tmp_path / "wireproto-nats-elsewhere"
    for directory in (abandoned, live, other):
        (directory / "jetstream").mkdir(parents=True)
    remove_abandoned_directories(str(tmp_path))
    assert not abandoned.exists() and live.exists() and other.exists()


@pytest.mark.parametrize("url, warned", [
    ("nats://10.0.0.5:4222", True),
    ("nats://127.0.0.1:4222,nats://nats.example:4222", True),
    ("nats://user:secret@10.0.0.5:4222", False),
    ("nats://127.0.0.1:4222", False),
    ("nats://localhost:4222,nats://[::1]:4222", False),
])
def test_an_external_nats_without_credentials_off_this_host_is_warned_of(url, warned):
    from wireproto.cluster.settings import ClusterSettings

    warning = ClusterSettings(url=url).open_membership_warning()
    assert (warning is not None) == warned
    if warned:
        assert re.search(r"no credentials", warning) and "secret" not in warning
    assert ClusterSettings(url=url, token_file="/x").open_membership_warning() is None


def test_check_config_warns_of_an_open_external_nats(tmp_path, capsys):
    from wireproto.cli import main

    config = tmp_path / "cluster.toml"
    config.write_text('[cluster]\nurl = "nats://192.0.2.1:4222"\n')
    assert main(["check-config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "wireproto: warning: [cluster] url names 192.0.2.1, not this host, with no " \
           "credentials" in out
    config.write_text('[cluster]\nurl = "nats://192.0.2.1:4222"\nuser = "broker"\n')
    assert main(["check-config", str(config)]) == 0
    assert "warning" not in capsys.readouterr().out


@pytest_twisted.ensureDeferred
async def test_a_broker_joining_an_open_external_nats_logs_a_warning():
    from twisted.internet import reactor
    from twisted.logger import formatEvent

    from tests.test_log_events import logged
    from wireproto.cluster.link import ClusterLink
    from wireproto.cluster.settings import ClusterSettings
    from wireproto.hub import Hub

    with logged() as events:
        link = ClusterLink(Hub(), ClusterSettings(url="nats://192.0.2.1:4222"), reactor)
        link.start()
        await link.stop()
    warnings = [formatEvent(event) for event in events
                if event.get("event") == "cluster_open_membership"]
    assert len(warnings) == 1 and "192.0.2.1" in warnings[0]
