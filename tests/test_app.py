"""`wireproto serve --app MODULE:FUNCTION` and `twistd wireproto --app` in one process: the
application's function (examples/app.py, or one written here) registers a UBRE handler, a nydus
route, a SubbleSocket hook and a hub callback that real clients use; it runs before the broker
starts, is waited for when it returns a Deferred or blocks, runs once (not again on SIGHUP);
every way it can fail stops the start in one line, status 1; `check-config` imports it without
calling it. The same under `--workers` is tests/cluster/test_app_workers.py."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.support import eventually, sleep, wait_for
from tests.test_cli import BIN, Child
from tests.test_start_failures import one_line
from wireproto.protocols.nydus import client as nydus_client
from wireproto.protocols.rpc import RequestFailed
from wireproto.protocols.subble import client as subble_client
from wireproto.protocols.subble.client import EventRefused
from wireproto.protocols.ubre.client import connect as ubre_connect

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WIREPROTO = str(BIN / "wireproto")
TWISTD = str(BIN / "twistd")
LISTENERS = ("--listen", "ubre+ws@tcp:0:interface=127.0.0.1",
             "--listen", "nydus+engineio@tcp:0:interface=127.0.0.1",
             "--listen", "subble+ws@tcp:0:interface=127.0.0.1")
LISTENER_LINE = re.compile(r"wireproto: (\w+) over \S+ on (\S+)")

# An application of the tests' own, written into the directory the broker runs in. Each call of
# `setup` is written to calls.txt with its process id, so a test sees how often, and where, the
# function ran; `setups` answers how often it ran in the process answering.
APP = '''
import os
import sys
import time

from twisted.internet import reactor, task

HERE = os.path.dirname(os.path.abspath(__file__))
calls = 0


def setup(service):
    global calls
    calls += 1
    with open(os.path.join(HERE, "calls.txt"), "a") as file:
        file.write(f"{os.getpid()}\\n")
    ubre = service.server("ubre")
    ubre.handle("setups", lambda body, peer: calls)
    ubre.handle("node", lambda body, peer: service.node)


async def later(service):
    open(os.path.join(HERE, "waiting"), "w").close()
    await task.deferLater(reactor, 1.5)
    print("app: done", flush=True)
    setup(service)


def blocking(service):
    time.sleep(2)
    print("app: done", flush=True)
    setup(service)


NOT_CALLABLE = 3


def raises(service):
    raise RuntimeError("no database")


def raises_lines(service):
    raise RuntimeError("no database\\nat db.example.com\\n")


async def fails_later(service):
    await task.deferLater(reactor, 0.2)
    raise KeyError("x")


def yields(service):
    yield service


def returns_a_value(service):
    return 42


def exits(service):
    sys.exit(3)


def cancels(service):
    import asyncio
    raise asyncio.CancelledError("in setup")


def interrupts(service):
    raise KeyboardInterrupt
'''


def write_app(directory: Path) -> Path:
    (directory / "myapp.py").write_text(APP)
    return directory


def setup_calls(directory: Path) -> list[int]:
    """The process ids of each call of `setup`, in order."""
    path = directory / "calls.txt"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def addresses(child: Child) -> dict[str, str]:
    found = (LISTENER_LINE.match(line) for line in child.stdout)
    return {match.group(1): match.group(2) for match in found if match}


async def started(*args: str, cwd: Path, ready: str = r"wireproto: ready") -> Child:
    child = Child(*args, cwd=cwd)
    try:
        await child.line(re.compile(ready), 60)
    except BaseException:
        child.kill()
        raise
    return child


async def stopped(child: Child) -> int:
    if child.process.poll() is None:
        child.process.send_signal(signal.SIGTERM)
    return await child.exit_code(30)


async def ubre_request(address: str, name: str, body: object = None) -> object:
    client = await wait_for(ubre_connect(reactor, address), 10)
    try:
        return await wait_for(client.request(name, body, timeout=10), 15)
    finally:
        await wait_for(client.close(), 10)


async def nydus_invoke(address: str, path: str) -> object:
    client = await wait_for(nydus_client.connect(reactor, address.removesuffix("/engine.io/")),
                            10)
    try:
        return await wait_for(client.invoke(path, timeout=10), 15)
    finally:
        await wait_for(client.close(), 10)


async def check_the_example(served: dict[str, str]) -> set[str]:
    """Each thing examples/app.py registers, used by real clients: the nodes that answered."""
    answer = await ubre_request(served["ubre"], "add", [1, 2])
    assert isinstance(answer, dict) and answer["sum"] == 3
    nodes = {answer["node"]}
    answer = await nydus_invoke(served["nydus"], "/rooms/lobby/join")
    assert isinstance(answer, dict) and answer["joined"] == "lobby"
    nodes.add(answer["node"])
    alerts: list = []
    watcher = await wait_for(subble_client.connect(
        reactor, served["subble"], subscribe=["alerts"], on_event=alerts.append), 10)
    sensor = await wait_for(subble_client.connect(reactor, served["subble"],
                                                  produce=["readings"]), 10)
    try:
        # A cool reading makes no alert; a hot one makes exactly one (the hub callback).
        await wait_for(sensor.produce("readings", {"room": "hall", "celsius": 20}, timeout=10), 15)
        for _ in range(50):  # another worker's watcher hears of the topic through NATS
            await wait_for(sensor.produce("readings", {"room": "kitchen", "celsius": 35},
                                          timeout=10), 15)
            if await _within(lambda: alerts, 0.3):
                break
        await eventually(lambda: alerts, timeout=10)
        assert alerts[0].source == "app"
        assert alerts[0].payload == {"room": "kitchen", "celsius": 35}
        with pytest.raises(EventRefused) as refused:
            await wait_for(sensor.produce("readings", {"room": "hall", "celsius": "hot"},
                                          timeout=10), 15)
        assert refused.value.code == 52
        assert refused.value.message == ("event 'readings' was not created: celsius must be a "
                                         "number")
    finally:
        await wait_for(watcher.close(), 10)
        await wait_for(sensor.close(), 10)
    return nodes


async def _within(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        await sleep(0.02)
    return bool(check())


# -- it runs, and what it registers answers -----------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_serve_runs_the_example_from_the_directory_it_runs_in() -> None:
    # `app` is examples/app.py, found only because the broker runs in examples/: the
    # `wireproto` script's own directory is first on its path, not the current one.
    child = await started(WIREPROTO, "serve", "--app", "app:setup", *LISTENERS, cwd=EXAMPLES)
    try:
        nodes = await check_the_example(addresses(child))
        assert nodes == {f"{_hostname()}:{child.process.pid}"}
    finally:
        assert await stopped(child) == 0, child.output()
    assert "Traceback" not in child.output()


def _hostname() -> str:
    import socket

    return socket.gethostname()


@pytest_twisted.ensureDeferred
async def test_the_config_file_names_the_app_too(tmp_path: Path) -> None:
    write_app(tmp_path)
    config = tmp_path / "broker.toml"
    config.write_text('listen = ["ubre+ws@tcp:0:interface=127.0.0.1"]\n'
                      '[app]\nsetup = "myapp:setup"\n')
    child = await started(WIREPROTO, "serve", "--config", str(config), cwd=tmp_path)
    first = child.process.pid
    try:
        assert await ubre_request(addresses(child)["ubre"], "setups") == 1
    finally:
        assert await stopped(child) == 0, child.output()
    # --app replaces the file's; --app "" calls none.
    child = await started(WIREPROTO, "serve", "--config", str(config), "--app", "",
                          cwd=tmp_path)
    try:
        with pytest.raises(RequestFailed):
            await ubre_request(addresses(child)["ubre"], "setups")
    finally:
        assert await stopped(child) == 0, child.output()
    assert setup_calls(tmp_path) == [first]


@pytest.mark.parametrize("function", ["later", "blocking"])
@pytest_twisted.ensureDeferred
async def test_the_broker_starts_once_the_app_is_done(tmp_path: Path, function: str) -> None:
    # `later` returns a coroutine that waits 1.5 s for the reactor; `blocking` holds the
    # process for 2 s. Either way nothing listens before it is done, and the first client is
    # answered by its handler.
    write_app(tmp_path)
    began = time.monotonic()
    child = await started(WIREPROTO, "serve", "--app", f"myapp:{function}",
                          "--listen", "ubre+ws@tcp:0:interface=127.0.0.1", cwd=tmp_path)
    try:
        assert time.monotonic() - began >= 1.5
        assert child.stdout[0] == "app: done", child.output()
        assert child.stdout[-1] == "wireproto: ready; Ctrl-C stops"
        assert await ubre_request(addresses(child)["ubre"], "setups") == 1
    finally:
        assert await stopped(child) == 0, child.output()


@pytest_twisted.ensureDeferred
async def test_sighup_does_not_run_the_app_again(tmp_path: Path) -> None:
    write_app(tmp_path)
    child = await started(WIREPROTO, "serve", "--app", "myapp:setup",
                          "--listen", "ubre+ws@tcp:0:interface=127.0.0.1", cwd=tmp_path)
    try:
        address = addresses(child)["ubre"]
        child.process.send_signal(signal.SIGHUP)
        await eventually(lambda: any("reload: no [auth] table" in line
                                     for line in child.stderr), timeout=10)
        assert await ubre_request(address, "setups") == 1
        assert setup_calls(tmp_path) == [child.process.pid]
    finally:
        assert await stopped(child) == 0, child.output()


@pytest_twisted.ensureDeferred
async def test_ctrl_c_while_the_app_is_still_waiting_stops_cleanly(tmp_path: Path) -> None:
    write_app(tmp_path)
    child = Child(WIREPROTO, "serve", "--app", "myapp:later",
                  "--listen", "ubre+ws@tcp:0:interface=127.0.0.1", cwd=tmp_path)
    # The reactor runs and the app waits (a loaded machine may take seconds to get there).
    await eventually(lambda: (tmp_path / "waiting").exists(), timeout=30)
    child.process.send_signal(signal.SIGINT)
    assert await child.exit_code(30) == 0, child.output()
    assert "Traceback" not in child.output()
    assert not any("ready" in line for line in child.stdout)


# -- twistd ------------------------------------------------------------------------------------


@pytest.mark.parametrize("function", ["setup", "later"])
@pytest_twisted.ensureDeferred
async def test_twistd_runs_the_app(tmp_path: Path, function: str) -> None:
    # `later` is not done when twistd starts its services: the broker starts once it is.
    write_app(tmp_path)
    child = await started(TWISTD, "-n", "--pidfile=", "wireproto", "--app",
                          f"myapp:{function}", "--listen", "ubre+ws@tcp:0:interface=127.0.0.1",
                          cwd=tmp_path, ready=r"wireproto: ready")
    try:
        assert await ubre_request(addresses(child)["ubre"], "setups") == 1
        assert setup_calls(tmp_path) == [child.process.pid]
    finally:
        assert await stopped(child) in (0, -signal.SIGTERM), child.output()
    assert "Traceback" not in child.output()


@pytest_twisted.ensureDeferred
async def test_twistd_runs_the_example() -> None:
    child = await started(TWISTD, "-n", "--pidfile=", "wireproto", "--app", "app:setup",
                          *LISTENERS, cwd=EXAMPLES)
    try:
        await check_the_example(addresses(child))
    finally:
        assert await stopped(child) in (0, -signal.SIGTERM), child.output()


# -- every way it fails: one line, status 1 -----------------------------------------------------

FILES = {
    "broken_dependency.py": "import wireproto_no_such_dependency\n",
    "broken_syntax.py": "def setup(:\n",
    "raising_import.py": "raise RuntimeError('no config file')\n",
    "cancelled_import.py": "import asyncio\nraise asyncio.CancelledError('at import')\n",
}

FAILURES = [
    ("nosuch:setup", "no module named 'nosuch' in {cwd} or on the Python path"),
    ("nosuch.deeper:setup", "no module named 'nosuch.deeper' in {cwd} or on the Python path"),
    ("broken_dependency:setup", "importing broken_dependency failed: ModuleNotFoundError: No "
                                "module named 'wireproto_no_such_dependency'"),
    ("broken_syntax:setup", "importing broken_syntax failed: SyntaxError: invalid syntax "
                            "(broken_syntax.py, line 1)"),
    ("raising_import:setup", "importing raising_import failed: RuntimeError: no config file"),
    ("myapp:missing", "module myapp has no attribute 'missing'"),
    ("myapp:setup.missing", "myapp:setup has no attribute 'missing'"),
    ("myapp:NOT_CALLABLE", "NOT_CALLABLE is not callable: it is int 3"),
    ("myapp:raises", "raised RuntimeError: no database"),
    ("myapp:raises_lines", "raised RuntimeError: no database; at db.example.com"),
    ("myapp:fails_later", "raised KeyError: 'x'"),
    ("myapp:yields", "returned a generator: give it @inlineCallbacks, or make it async def"),
    ("myapp:returns_a_value", "returned int 42: give None, a Deferred or an awaitable"),
    ("myapp:exits", "raised SystemExit: 3"),
    # Not Exceptions: before, each one left the broker running, never ready, for ever.
    ("cancelled_import:setup", "importing cancelled_import failed: CancelledError: at import"),
    ("myapp:cancels", "raised CancelledError: in setup"),
    ("myapp:interrupts", "raised KeyboardInterrupt"),
]


def failing_apps(directory: Path) -> Path:
    write_app(directory)
    for name, text in FILES.items():
        (directory / name).write_text(text)
    return directory


def run(*args: str, cwd: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"{args} still running after {timeout} s: "
                             f"{(expired.stderr or b'')[-2000:]!r}") from None


@pytest.mark.parametrize(("spec", "why"), FAILURES, ids=[spec for spec, _ in FAILURES])
def test_an_app_that_fails_stops_the_start_in_one_line(tmp_path: Path, spec: str,
                                                       why: str) -> None:
    failing_apps(tmp_path)
    done = run(WIREPROTO, "serve", "--app", spec, "--listen", "ubre+ws@tcp:0", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert one_line(done) == f"wireproto: app {spec}: {why.format(cwd=tmp_path)}"


@pytest.mark.parametrize(("spec", "why"), [f for f in FAILURES if f[0] in (
    "nosuch:setup", "myapp:raises", "myapp:fails_later")], ids=["import", "raising",
                                                               "failing later"])
def test_twistd_with_an_app_that_fails_exits_1(tmp_path: Path, spec: str, why: str) -> None:
    failing_apps(tmp_path)
    done = run(TWISTD, "-n", "--pidfile=", "wireproto", "--app", spec, "--listen",
               "ubre+ws@tcp:0", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    assert "wireproto: ready" not in done.stdout
    line = f"wireproto: app {spec}: {why.format(cwd=tmp_path)}"
    if spec == "myapp:fails_later":
        # It fails once twistd runs: in twistd's log (stdout under -n), as a listener does.
        assert [found for found in output.splitlines() if found.endswith(line)], output
    else:
        assert done.stderr.splitlines() == [line], output


def test_verbose_logs_the_traceback_too(tmp_path: Path) -> None:
    failing_apps(tmp_path)
    done = run(WIREPROTO, "serve", "-v", "--app", "myapp:raises", "--listen", "ubre+ws@tcp:0",
               cwd=tmp_path)
    assert done.returncode == 1
    assert "wireproto: app myapp:raises: raised RuntimeError: no database" in \
        done.stderr.splitlines()
    assert 'in raises\n' in done.stderr and "RuntimeError: no database" in done.stderr


@pytest.mark.parametrize("spec", ["myapp", "myapp:", "my-app:setup", "myapp:setup:again"])
def test_an_app_that_is_not_module_colon_function_is_a_bad_option(tmp_path: Path,
                                                                   spec: str) -> None:
    done = run(WIREPROTO, "serve", "--app", spec, cwd=tmp_path)
    assert done.returncode == 2
    assert one_line(done) == (f"wireproto serve: --app {spec!r}: expected MODULE:FUNCTION, as "
                              f"myapp:setup or myapp.broker:setup, got \"{spec}\"")


# -- check-config -------------------------------------------------------------------------------


def test_check_config_imports_the_app_without_calling_it(tmp_path: Path) -> None:
    write_app(tmp_path)
    config = tmp_path / "broker.toml"
    config.write_text('listen = ["ubre+ws@tcp:0"]\n[app]\nsetup = "myapp:setup"\n')
    done = run(WIREPROTO, "check-config", str(config), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "wireproto: app: myapp:setup"
    assert setup_calls(tmp_path) == []  # imported, never called


@pytest.mark.parametrize(("spec", "why"), [f for f in FAILURES if f[0] in (
    "nosuch:setup", "broken_syntax:setup", "raising_import:setup", "cancelled_import:setup",
    "myapp:missing", "myapp:NOT_CALLABLE")])
def test_check_config_reports_an_app_it_cannot_load(tmp_path: Path, spec: str, why: str) -> None:
    failing_apps(tmp_path)
    config = tmp_path / "broker.toml"
    config.write_text(f'listen = ["ubre+ws@tcp:0"]\n[app]\nsetup = "{spec}"\n')
    done = run(WIREPROTO, "check-config", str(config), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"wireproto check-config: {config}: app.setup: {why.format(cwd=tmp_path)}"]


def test_check_config_reports_the_app_with_the_other_problems(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('listen = ["ubre+ws@tcp:0"]\n[auth]\npassword_file = "passwd"\n'
                      '[app]\nsetup = "nosuch:setup"\n')
    (tmp_path / "passwd").write_text("not a password line\n")
    (tmp_path / "passwd").chmod(0o600)
    done = run(WIREPROTO, "check-config", str(config), cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and "auth.password_file" in lines[0], lines
    assert lines[1] == (f"wireproto check-config: {config}: app.setup: no module named 'nosuch' "
                        f"in {tmp_path} or on the Python path")


def test_check_config_refuses_a_malformed_app(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('[app]\nsetup = "myapp"\n')
    done = run(sys.executable, "-m", "wireproto", "check-config", str(config), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (f"wireproto check-config: {config}: app.setup: expected "
                           "MODULE:FUNCTION, as myapp:setup or myapp.broker:setup, got "
                           "\"myapp\"\n")


# -- from a program that embeds the broker ------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_run_app_runs_the_configs_app_for_a_program_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wireproto.config import config_from_toml
    from wireproto.service import make_service
    from wireproto.service.app import AppFailed, run_app

    (tmp_path / "embedded_app.py").write_text(
        "async def setup(service):\n"
        "    service.server('ubre').handle('ping', lambda body, peer: 'pong')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # run_app puts the directory first
    monkeypatch.delitem(sys.modules, "embedded_app", raising=False)
    config = config_from_toml('listen = ["ubre+ws@tcp:0:interface=127.0.0.1"]\n'
                              '[app]\nsetup = "embedded_app:setup"\n')
    service = make_service(config, reactor)
    await wait_for(run_app(service), 10)  # before the service starts
    service.startService()
    try:
        bound = await wait_for(service.when_listening(), 10)
        assert await ubre_request(bound[0].address, "ping") == "pong"
    finally:
        await wait_for(service.stopService(), 10)
    with pytest.raises(AppFailed, match=r"^app embedded_app:nothing: module embedded_app has no "
                                        r"attribute 'nothing'$"):
        await run_app(service, "embedded_app:nothing")
    sys.modules.pop("embedded_app", None)
