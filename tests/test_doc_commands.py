"""Every shell command in docs/*.md and README.md runs as written, where a test machine can run it.

The commands are the lines of ```sh fences (but comments) and the ``$ `` lines of any fence.
They run with bash, in a directory of their own that sees the checkout's .venv, docs, examples
and tests (so files they write stay out of the checkout), with the venv's programs first on
PATH (as after ``source .venv/bin/activate``), against `twistd -ny examples/wireproto.tac`:
the broker on its built-in defaults, with the handlers docs/tools.md calls.

A command must exit 0; one that runs until stopped (`serve`, `sub` or `events` without -C,
`twistd -n`) must still be running, without an error, after a few seconds; one whose page
shows an error line (``wireproto TOOL: ...``) must fail with exactly those lines on stderr.
What cannot run here is named in CANNOT_RUN with the reason: `make` targets (the README's
commands, which CI itself runs), hardware (serial devices, udev, sudo).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support import on_the_default_ports
from tests.test_docs import PAGES, fenced_blocks

# The docs' broker and their `wireproto serve` commands hold the default ports.
pytestmark = on_the_default_ports

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CANNOT_RUN = {
    r"^make\b": "a make target: the README's set-up, which CI runs as `make test`",
    r"/dev/(tty|serial|dev1)|\bsudo\b|\budevadm\b|\bdmesg\b": "needs a board on a serial port",
    r"\bnc\b": "an interactive session with nc (netcat), typed by hand",
    r"tail -f readings\.txt": "reads a file that grows on the user's machine",
    r"interface=0\.0\.0\.0": "listens on every interface",
}
RUNS_UNTIL_STOPPED = re.compile(
    r"\bwireproto serve\b|\btwistd -n\b|\bwireproto (sub|events)\b(?!.*\s-C\s)"
)
DEFAULT_PORTS = (8765, 8766, 8767, 8768, 8769)


ERROR_LINE = re.compile(r"^wireproto [\w-]+: ")


def shell_commands() -> list[tuple[str, str, list[str]]]:
    """(where, command, the output the page shows after it) for every shell example."""
    found: list[tuple[str, str, list[str]]] = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for opening, closing, info in fenced_blocks(lines):
            body = lines[opening + 1:closing]
            shell = info.lower() in ("sh", "bash", "shell", "console")
            has_prompts = any(line.startswith("$ ") for line in body)
            number = opening + 1
            pending = ""
            for offset, line in enumerate(body, start=opening + 2):
                if has_prompts:
                    if not line.startswith("$ "):
                        if found and found[-1][0] == f"{page.name}:{number}":
                            found[-1][2].append(line)  # the output shown after a command
                        continue
                    line = line[2:]
                elif not shell or not line.strip() or line.lstrip().startswith("#"):
                    continue
                if not pending:
                    number = offset
                if line.endswith("\\"):
                    pending += line[:-1] + " "
                    continue
                command = re.sub(r"\s+#\s.*$", "", pending + line).strip()
                pending = ""
                if command and command[0] != "{":  # a line typed into a session
                    found.append((f"{page.name}:{number}", command, []))
    return found


COMMANDS = shell_commands()


def reason_not_run(command: str) -> str | None:
    return next((why for pattern, why in CANNOT_RUN.items() if re.search(pattern, command)),
                None)


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def broker():
    busy = [port for port in DEFAULT_PORTS if port_open(port)]
    if busy:
        pytest.fail(f"the docs' commands need the default ports; in use: {busy}")
    # Its log goes to a file: a pipe nobody reads fills up after 64 kB of log lines (a
    # conformance run writes that much), and the broker then blocks on its next line.
    log = tempfile.TemporaryFile(mode="w+")
    child = subprocess.Popen(
        [BIN / "twistd", "-n", "--pidfile=", "-y", "examples/wireproto.tac"], cwd=ROOT,
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while not all(map(port_open, DEFAULT_PORTS)):
        if child.poll() is not None or time.monotonic() >= deadline:
            log.seek(0)
            pytest.fail(f"the docs' broker did not listen: {log.read()}")
        time.sleep(0.1)
    yield child
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=30)
    log.close()


def test_every_page_with_commands_is_found() -> None:
    where = {place.split(":")[0] for place, _, _ in COMMANDS}
    assert {"quickstart.md", "tools.md", "configuration.md", "running.md"} <= where


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the commands run: the checkout's directories, seen through links."""
    directory = tmp_path_factory.mktemp("docs-commands")
    for name in (".venv", "docs", "examples", "tests", "wireproto"):
        if (ROOT / name).exists():
            (directory / name).symlink_to(ROOT / name)
    return directory


def run(cwd: Path, where: str, command: str, shown: list[str]) -> None:
    """Run `command` as the page shows it: an error line shown is the error expected."""
    why = reason_not_run(command)
    if why is not None:
        pytest.skip(why)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    errors = [line for line in shown if ERROR_LINE.match(line)]
    if RUNS_UNTIL_STOPPED.search(command) and not errors:
        child = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            time.sleep(3)
            running = child.poll() is None
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
            out, err = child.communicate(timeout=20)
        assert running or child.returncode == 0, f"{where}: {command}\n{out}\n{err}"
        assert "Traceback" not in err, err
        return
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    if errors:
        assert done.returncode != 0, f"{where}: {command} should fail as the page shows"
        assert done.stderr.splitlines() == errors, f"{where}: {command}\n{done.stderr}"
        return
    assert done.returncode == 0, f"{where}: {command}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr


SERVERS = [entry for entry in COMMANDS if re.search(r"\bserve\b|\btwistd\b", entry[1])]
CLIENTS = [entry for entry in COMMANDS if entry not in SERVERS]


@pytest.mark.parametrize(("where", "command", "shown"), SERVERS,
                         ids=[where for where, _, _ in SERVERS])
def test_a_server_command_runs_as_written(workdir: Path, where: str, command: str,
                                          shown: list[str]) -> None:
    # Before the broker fixture starts: a server on the defaults needs their ports.
    run(workdir, where, command, shown)


@pytest.mark.parametrize(("where", "command", "shown"), CLIENTS,
                         ids=[where for where, _, _ in CLIENTS])
def test_a_client_command_runs_as_written(broker, workdir: Path, where: str, command: str,
                                          shown: list[str]) -> None:
    run(workdir, where, command, shown)


def test_the_tac_file_in_embedding_md_is_the_one_the_commands_run() -> None:
    page = (ROOT / "docs" / "embedding.md").read_text(encoding="utf-8")
    tac = (ROOT / "examples" / "wireproto.tac").read_text(encoding="utf-8")
    assert f"```text\n{tac}```" in page
