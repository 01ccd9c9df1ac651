"""The client under test as a process the kit starts and stops (--run;
wireproto.conformance.clientprocess), with real processes: {url} and $WIREPROTO_CONFORM_URL, a
command not found, how it ended in words, its output kept bounded however much it writes, and a
client that ignores SIGTERM and leaves a child behind stopped whole, group and all."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.support import eventually
from wireproto.conformance.clientprocess import OUTPUT_KEPT, ClientProcess, split_command

URL = "ws://127.0.0.1:9/x"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not alive: its parent (the kit, or init) has not reaped it yet.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def pids(tmp_path):
    """A file the test's shells write their process ids to; whatever is left of them when the
    test ends, failed or not, is killed (they ignore SIGTERM)."""
    path = tmp_path / "pids"
    yield path
    for pid in path.read_text().split() if path.exists() else []:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


async def gone(pid: int, process: ClientProcess) -> None:
    """Wait for `pid` to end; if it does not, say what it is doing."""
    try:
        await eventually(lambda: not alive(pid), timeout=10)
    except TimeoutError:
        with open(f"/proc/{pid}/stat") as stat:
            raise AssertionError(f"{pid} lives on: {stat.read()}; the client "
                                 f"{process.described()}, wrote {process.output()!r}") from None


async def finished(process: ClientProcess, timeout: float = 20) -> None:
    assert await process.ended(timeout), process.output()


def test_the_command_is_split_as_a_shell_would_with_the_url() -> None:
    assert split_command("node 'my client.js' --url={url} {url}x", URL) == [
        "node", "my client.js", f"--url={URL}", f"{URL}x"]
    with pytest.raises(ValueError, match="--run needs a command"):
        split_command("   ", URL)
    with pytest.raises(ValueError, match="No closing quotation"):
        split_command("node 'unbalanced", URL)


def test_a_command_not_found_says_so() -> None:
    process = ClientProcess(reactor, "no-such-client-program {url}", URL)
    with pytest.raises(ValueError, match="'no-such-client-program' is not a program found on "
                                         "PATH"):
        process.start()
    assert not process.running and process.status is None


@pytest_twisted.ensureDeferred
async def test_the_url_reaches_the_arguments_and_the_environment() -> None:
    process = ClientProcess(reactor, f"{sys.executable} -c \"import os, sys; print(sys.argv[1]);"
                            " print(os.environ['WIREPROTO_CONFORM_URL']); sys.exit(4)\" {url}",
                            URL)
    process.start()
    await finished(process)
    assert process.output() == f"{URL}\n{URL}"
    assert process.status == 4 and process.described() == "exited with status 4"


@pytest_twisted.ensureDeferred
async def test_its_output_is_kept_bounded() -> None:
    process = ClientProcess(reactor, f"{sys.executable} -c \"import sys; "
                            "sys.stdout.write('x' * 20_000_000 + 'LAST')\"", URL)
    process.start()
    await finished(process, 60)
    assert process.output().endswith("xxxLAST")
    assert len(process.output()) == OUTPUT_KEPT
    assert process._kept_size == OUTPUT_KEPT


@pytest_twisted.ensureDeferred
async def test_a_client_ignoring_sigterm_and_its_child_are_stopped(pids) -> None:
    # A shell that ignores SIGTERM, as does the child it leaves running.
    process = ClientProcess(reactor, f"sh -c 'trap \"\" TERM; sleep 300 & echo $! > {pids}; "
                            "echo $$ >> {pids}; wait'".replace("{pids}", str(pids)), URL)
    process.start()
    await eventually(lambda: pids.exists() and len(pids.read_text().split()) == 2, timeout=20)
    child, shell = map(int, pids.read_text().split())
    assert alive(child) and alive(shell) and process.running
    began = time.monotonic()
    await process.stop()
    assert time.monotonic() - began < 10
    assert not process.running and process.described() == "ended by SIGKILL"
    await gone(child, process)


@pytest_twisted.ensureDeferred
async def test_a_child_left_behind_by_a_client_that_exited_is_stopped(pids) -> None:
    process = ClientProcess(reactor, f"sh -c '(trap \"\" TERM; exec sleep 300) & echo $! > "
                            f"{pids}; exit 0'", URL)
    process.start()
    await eventually(lambda: pids.exists() and pids.read_text().strip(), timeout=20)
    child = int(pids.read_text())
    await eventually(lambda: alive(child), timeout=10)
    await process.stop()
    await gone(child, process)
    assert not process.running


@pytest_twisted.ensureDeferred
async def test_a_client_that_ends_on_sigterm_is_stopped_at_once() -> None:
    process = ClientProcess(reactor, "sleep 300", URL)
    process.start()
    began = time.monotonic()
    await process.stop()
    assert time.monotonic() - began < 1.5
    assert process.described() == "ended by SIGTERM"
