"""A broker that cannot start what its config asks for exits non-zero with one line, under
`wireproto serve`, `--workers` and `twistd wireproto` alike, and `wireproto check-config` finds
what it can of it first: capture, [log] file and [hub] retain_file directories that cannot be
made or written. Real processes, bounded in time: before this, such a broker printed a
traceback, never printed `ready`, and ran on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import _need_nats_server
from tests.test_cli import BIN

LISTEN = "websmq+length32@tcp:0:interface=127.0.0.1"


def run(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """`args` to its end; one that runs on past `timeout` fails the test."""
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as expired:
        stderr = (expired.stderr or b"")[-2000:]
        raise AssertionError(f"{args} still running after {timeout} s:\n{stderr!r}") from None


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "wireproto", "serve", *args)


def twistd(*args: str) -> subprocess.CompletedProcess[str]:
    return run(str(BIN / "twistd"), "-n", "--pidfile=", "wireproto", *args)


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "wireproto", "check-config", str(path))


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a process that could not start printed, with no traceback and no ready."""
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    assert "ready" not in done.stdout, output
    lines = done.stderr.splitlines()
    assert len(lines) == 1, output
    return lines[0]


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    """A regular file, where a directory is wanted below it."""
    path = tmp_path / "hostname"
    path.write_text("not a directory\n")
    return path


# -- what check-config finds -------------------------------------------------------------------


def test_check_config_finds_directories_that_cannot_be_made(tmp_path: Path, a_file: Path) -> None:
    config = tmp_path / "w.toml"
    config.write_text(
        f'listen = ["{LISTEN}"]\n'
        f'[hub]\nretain = ["#"]\nretain_file = "{a_file}/last/values.sqlite"\n'
        f'[log]\nfile = "{a_file}/log/broker.log"\n'
        f'[capture]\ndirectory = "{a_file}/cap"\n'
    )
    done = check_config(config)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"wireproto check-config: {config}: hub.retain_file: cannot create {a_file}/last: "
        f"{a_file} is not a directory",
        f"wireproto check-config: {config}: log.file: cannot create {a_file}/log: "
        f"{a_file} is not a directory",
        f"wireproto check-config: {config}: capture.directory: cannot create {a_file}/cap: "
        f"{a_file} is not a directory",
    ]


def test_check_config_finds_what_cannot_be_written(tmp_path: Path, a_file: Path) -> None:
    # /sys takes no new directories, even from root: the check tries, rather than trusting
    # the mode bits, which root passes.
    config = tmp_path / "w.toml"
    config.write_text(f'listen = ["{LISTEN}"]\n[log]\nfile = "{tmp_path}"\n'
                      '[capture]\ndirectory = "/sys/wireproto-capture"\n')
    done = check_config(config)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"wireproto check-config: {config}: log.file: {tmp_path} is a directory",
        f"wireproto check-config: {config}: capture.directory: cannot create "
        "/sys/wireproto-capture in /sys: Operation not permitted",
    ]
    config.write_text(f'listen = ["{LISTEN}"]\n[capture]\ndirectory = "{a_file}"\n')
    done = check_config(config)
    assert done.stderr == (f"wireproto check-config: {config}: capture.directory: {a_file} is "
                           "not a directory\n")


def test_check_config_accepts_directories_it_can_make_and_makes_none(tmp_path: Path) -> None:
    config = tmp_path / "w.toml"
    config.write_text(
        f'listen = ["{LISTEN}"]\n'
        f'[hub]\nretain = ["#"]\nretain_file = "{tmp_path}/state/values.sqlite"\n'
        f'[log]\nfile = "{tmp_path}/log/broker.log"\n'
        f'[capture]\ndirectory = "{tmp_path}/a/b/capture"\n'
    )
    done = check_config(config)
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["w.toml"]


# -- serve, --workers and twistd refuse to start ------------------------------------------------


def test_serve_with_a_capture_directory_it_cannot_make_exits_in_one_line(a_file: Path) -> None:
    done = serve("--capture", f"{a_file}/cap", "--listen", LISTEN)
    assert done.returncode == 2
    assert one_line(done) == (f"wireproto serve: --capture: cannot create {a_file}/cap: "
                              f"{a_file} is not a directory")


def test_workers_with_a_capture_directory_they_cannot_make_exit_in_one_line(a_file: Path) -> None:
    done = serve("--workers", "2", "--capture", f"{a_file}/cap", "--listen", LISTEN)
    assert done.returncode == 2
    assert one_line(done) == (f"wireproto serve: --capture: cannot create {a_file}/cap: "
                              f"{a_file} is not a directory")


def test_twistd_with_a_capture_directory_it_cannot_make_exits_non_zero(a_file: Path) -> None:
    done = twistd("--capture", f"{a_file}/cap", "--listen", LISTEN)
    assert done.returncode == 2
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    assert done.stderr.splitlines()[0] == (f"twistd wireproto: --capture: cannot create "
                                           f"{a_file}/cap: {a_file} is not a directory")


# -- what only starting finds ------------------------------------------------------------------


@pytest.fixture
def bad_last_values(tmp_path: Path) -> tuple[Path, str]:
    """A config whose [hub] retain_file can be written, but is no sqlite database: only opening
    it finds that. Returns the config file and the line naming the problem."""
    values = tmp_path / "values.sqlite"
    values.write_bytes(b"not a database, but long enough for sqlite to look at it" * 20)
    config = tmp_path / "w.toml"
    config.write_text(f'listen = ["{LISTEN}"]\n[hub]\nretain = ["#"]\n'
                      f'retain_file = "{values}"\n')
    return config, f"[hub] retain_file {values}: file is not a database"


def test_serve_that_cannot_start_a_part_exits_1_in_one_line(
    bad_last_values: tuple[Path, str]
) -> None:
    config, problem = bad_last_values
    assert check_config(config).returncode == 0
    done = serve("--config", str(config))
    assert done.returncode == 1
    assert one_line(done) == f"wireproto: {problem}"


def test_twistd_that_cannot_start_a_part_exits_1_in_one_line(
    bad_last_values: tuple[Path, str]
) -> None:
    config, problem = bad_last_values
    done = twistd("--config", str(config))
    assert done.returncode == 1
    assert one_line(done) == f"wireproto: {problem}"


def test_workers_that_cannot_start_a_part_exit_1_in_one_line(
    bad_last_values: tuple[Path, str]
) -> None:
    _need_nats_server()
    config, problem = bad_last_values
    done = serve("--workers", "2", "--config", str(config))
    assert done.returncode == 1
    assert one_line(done) in (f"wireproto: worker {index}: {problem}" for index in (0, 1))


def test_twistd_workers_that_cannot_start_a_part_exit_1(
    bad_last_values: tuple[Path, str]
) -> None:
    _need_nats_server()
    config, problem = bad_last_values
    done = twistd("--workers", "2", "--config", str(config))
    assert done.returncode == 1
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    assert any(f"wireproto: worker {index}: {problem}" in output for index in (0, 1)), output
    assert "ready" not in done.stdout


def test_twistd_workers_on_a_port_in_use_exit_1_in_one_line() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = twistd("--workers", "2", "--listen", f"websmq+length32@tcp:{port}")
    assert done.returncode == 1
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    failed = [line for line in output.splitlines() if "cannot listen" in line]
    assert len(failed) == 1 and failed[0].endswith(
        f"wireproto: cannot listen for websmq over length32 on tcp:{port}:interface=127.0.0.1: "
        f"Couldn't listen on 127.0.0.1:{port}: [Errno 98] Address already in use."), output
