"""The command line's start: how long a short command takes, wall clock, beside the interpreter
alone and mosquitto's client, in one run.

    python -c pass                      the interpreter starting and exiting, nothing imported
    wireproto --version                 the command's own start
    wireproto pub                       one message to a local `wireproto serve` (WEBSMQ over
                                        WebSocket): start, connect, handshake, publish, close
    mosquitto_pub                       one message to a local mosquitto (MQTT over TCP), when
                                        mosquitto and its clients are installed (make mosquitto)

    .venv/bin/python bench/cli.py [--rounds N] [--quick]

Each command is run once untimed (so Python has written its bytecode caches, as an installed
package has them), then --rounds times in turns (A B C D A B C D ...), so a busy spell on a shared
machine hits each alike; each figure is the median of its rounds, wall clock from the start of
the process to its exit. Every run must exit 0. The goals (docs/performance.md): `wireproto
--version` within 2.5x `python -c pass`, and `wireproto pub` to a local broker in at most
0.35 s, on the project's machine, idle (the load average is printed first).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:  # for bench/'s shared harness
    sys.path.append(str(Path(__file__).resolve().parent))
import _harness as harness  # noqa: E402
from _harness import BenchError  # noqa: E402

VERSION_GOAL = 2.5  # times `python -c pass`
PUB_GOAL = 0.35  # seconds
WS_LINE = re.compile(r"^wireproto: websmq over ws on (?P<address>ws://\S+)$")
RUN_TIMEOUT = 30.0


def child_environment() -> dict[str, str]:
    """This environment, with bytecode caches written and read as an installed package's."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def wireproto_command() -> list[str]:
    """The `wireproto` script beside this Python (as a user runs it), else ``python -m``."""
    script = Path(sys.executable).parent / "wireproto"
    return [str(script)] if script.exists() else [sys.executable, "-m", "wireproto"]


@contextmanager
def wireproto_broker() -> Iterator[str]:
    """A `wireproto serve` with WEBSMQ over WebSocket on a free port; its ws:// address."""
    process = subprocess.Popen(
        [*wireproto_command(), "serve", "--listen", "websmq+ws@tcp:0:interface=127.0.0.1"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=child_environment())
    try:
        found: list[str] = []
        said: list[str] = []

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                said.append(line.rstrip())
                match = WS_LINE.match(line.rstrip())
                if match:
                    found.append(match["address"])

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 30
        while not found and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if not found:
            raise BenchError("wireproto serve did not listen: " + " | ".join(said[-5:]))
        yield found[0]
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def find(command: str) -> str | None:
    # Debian installs mosquitto in /usr/sbin, which a non-root PATH often lacks.
    return shutil.which(command) or shutil.which(command, path="/usr/sbin:/usr/local/sbin")


@contextmanager
def mosquitto_broker() -> Iterator[int]:
    """A mosquitto on a free port of 127.0.0.1; its port."""
    executable = find("mosquitto")
    if executable is None:
        raise BenchError("mosquitto is missing")
    with tempfile.TemporaryDirectory(prefix="bench-cli-mosquitto-") as folder:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        config = Path(folder) / "mosquitto.conf"
        config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                          "persistence false\nlog_dest stderr\n")
        os.chmod(folder, 0o755)  # mosquitto drops root for its own user, after reading this
        process = subprocess.Popen([executable, "-c", str(config)], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 15
            while True:
                with socket.socket() as client:
                    if client.connect_ex(("127.0.0.1", port)) == 0:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise BenchError(f"mosquitto did not listen on {port}")
                time.sleep(0.01)
            yield port
        finally:
            process.terminate()
            process.wait(10)


def timed(command: list[str]) -> float:
    """Seconds from starting `command` to its exit; BenchError unless it exits 0 quietly."""
    started = time.perf_counter()
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=RUN_TIMEOUT, env=child_environment())
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or done.stderr:
        raise BenchError(f"{' '.join(command)} exited {done.returncode}: "
                         f"{done.stderr.decode(errors='replace').strip()[-500:]}")
    return elapsed


def rows(stack: ExitStack, out: Callable[[str], Any]) -> dict[str, list[str]]:
    """Each row's command, its brokers started in `stack`."""
    wireproto = wireproto_command()
    found = {"python -c pass": [sys.executable, "-c", "pass"],
             "wireproto --version": [*wireproto, "--version"]}
    address = stack.enter_context(wireproto_broker())
    found["wireproto pub"] = [*wireproto, "pub", address, "-t", "bench/cli", "-m", "hi"]
    client = find("mosquitto_pub")
    if client is None or find("mosquitto") is None:
        out("mosquitto_pub: not measured, mosquitto or its clients are missing (make mosquitto)")
    else:
        port = stack.enter_context(mosquitto_broker())
        found["mosquitto_pub"] = [client, "-h", "127.0.0.1", "-p", str(port), "-t", "bench/cli",
                                  "-m", "hi"]
    return found


def run(options: argparse.Namespace, out: Callable[[str], Any] = print) -> dict[str, float]:
    """The median seconds of each row."""
    load = os.getloadavg()
    out(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; "
        f"{options.rounds} rounds")
    with ExitStack() as stack:
        commands = rows(stack, out)
        for command in commands.values():
            timed(command)  # bytecode caches written, the page cache warm
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(options.rounds):
            for name, command in commands.items():
                samples[name].append(timed(command))
    medians = {name: statistics.median(times) for name, times in samples.items()}
    base = medians["python -c pass"]
    out(f"{'command':<22} {'median':>8} {'min':>8} {'max':>8}  vs python -c pass   (seconds)")
    for name, times in samples.items():
        out(f"{name:<22} {medians[name]:>8.3f} {min(times):>8.3f} {max(times):>8.3f}  "
            f"{medians[name] / base:6.1f}x")
    version = medians["wireproto --version"] / base
    out(f"goal: wireproto --version within {VERSION_GOAL}x python -c pass: {version:.2f}x "
        f"({'met' if version <= VERSION_GOAL else 'missed'})")
    pub = medians["wireproto pub"]
    out(f"goal: wireproto pub to a local broker at most {PUB_GOAL} s: {pub:.3f} s "
        f"({'met' if pub <= PUB_GOAL else 'missed'})")
    return medians


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20,
                        help="timed runs of each command (default 20)")
    parser.add_argument("--quick", action="store_true", help="two rounds (for the tests)")
    options = parser.parse_args(argv)
    if options.rounds < 1:
        parser.error("--rounds must be at least 1")
    if options.quick:
        options.rounds = 2
    return options


def main(argv: list[str] | None = None) -> int:
    return harness.main("cli.py", run, parse_args(argv), reactor=False)


if __name__ == "__main__":
    sys.exit(main())
