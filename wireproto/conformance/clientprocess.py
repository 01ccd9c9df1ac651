"""The client under test as a process the kit starts and stops (``wireproto conform client
--run COMMAND``; docs/conformance.md, "Judging a client").

With ``--run``, each case gets a client of its own: the command is started before the case and
stopped after it (SIGTERM, then SIGKILL after a grace period, to its whole process group, so a
shell or npm that started the real client does not leave it behind). The command is split as a
shell would split it but run without one; ``{url}`` in it becomes the address the kit listens
on, which the client also finds in the environment as ``WIREPROTO_CONFORM_URL``. What the client
writes is kept, its last lines only, for the case's record.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
from collections import deque

from twisted.internet import defer, protocol
from twisted.internet.interfaces import IProcessTransport, IReactorProcess, IReactorTime
from twisted.python.failure import Failure

__all__ = ["ClientProcess", "split_command"]

# What is kept of the client's output (stdout and stderr together): its last bytes.
OUTPUT_KEPT = 8192
# How long a stopped client may take to end after SIGTERM before it is killed.
STOP_GRACE = 2.0


def split_command(command: str, url: str) -> list[str]:
    """`command` as its arguments, ``{url}`` replaced by `url`; ValueError for an empty or
    unbalanced command."""
    try:
        arguments = shlex.split(command)
    except ValueError as error:
        raise ValueError(f"--run: {error}") from None  # never the command: it may hold a secret
    if not arguments:
        raise ValueError("--run needs a command")
    if re.match(r"[A-Za-z_][A-Za-z0-9_]*=", arguments[0]):
        # Said without the value, which may be a secret.
        raise ValueError("--run: the command starts with an assignment (NAME=...), which only "
                         "a shell reads; put env before it: --run \"env NAME=... program\"")
    return [argument.replace("{url}", url) for argument in arguments]


class _Watch(protocol.ProcessProtocol):
    def __init__(self, owner: ClientProcess) -> None:
        self.owner = owner

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        self.owner._output(data)

    def processEnded(self, reason: Failure) -> None:
        self.owner._ended(reason)


class ClientProcess:
    """One start of the client's command: `start`, then `stop`; `status` is its exit status
    (a negative signal number when a signal ended it) once it has ended."""

    def __init__(self, reactor: IReactorTime, command: str, url: str,
                 env: dict[str, str] | None = None) -> None:
        self.reactor = reactor
        self.arguments = split_command(command, url)
        self.env = {**os.environ, **(env or {}), "WIREPROTO_CONFORM_URL": url}
        self.pid: int | None = None
        self.status: int | None = None
        self.stopping = False
        self.kept: deque[bytes] = deque()
        self._kept_size = 0
        self._ended_waiters: list[defer.Deferred[None]] = []
        self._transport: IProcessTransport | None = None
        self._group = False

    def start(self) -> None:
        """Start the command; ValueError when it cannot be started (not found, say)."""
        executable = shutil.which(self.arguments[0])
        if executable is None:
            raise ValueError(f"--run: {self.arguments[0]!r} is not a program found on PATH")
        arguments = [executable, *self.arguments[1:]]
        setsid = shutil.which("setsid")
        # A group of its own, so that stopping it reaches what it started (a shell's child).
        if setsid is not None:
            arguments = [setsid, *arguments]
        self._transport = IReactorProcess(self.reactor).spawnProcess(
            _Watch(self), arguments[0], arguments, env=self.env, usePTY=False,
            childFDs={0: "w", 1: "r", 2: "r"})
        self.pid = self._transport.pid
        self._transport.closeStdin()
        self._group = setsid is not None

    @property
    def running(self) -> bool:
        return self.pid is not None and self.status is None

    @property
    def crashed(self) -> bool:
        """Whether it ended with a failure status or by a signal the kit did not send: a
        driver may end with status 0 when its connection is lost (--run starts it again)."""
        return self.status is not None and self.status != 0 and not self.stopping

    def _output(self, data: bytes) -> None:
        self.kept.append(data)
        self._kept_size += len(data)
        # Whole chunks go while what follows them is enough; then the oldest is cut, so the
        # newest OUTPUT_KEPT bytes are all kept (a short last line after a long one too).
        while self._kept_size - len(self.kept[0]) >= OUTPUT_KEPT:
            self._kept_size -= len(self.kept.popleft())
        if self._kept_size > OUTPUT_KEPT:
            cut = self._kept_size - OUTPUT_KEPT
            self.kept[0] = self.kept[0][cut:]
            self._kept_size -= cut

    def output(self) -> str:
        """The last of what the client wrote, as text."""
        text = b"".join(self.kept)[-OUTPUT_KEPT:].decode("utf-8", "replace")
        return text.strip()

    def _ended(self, reason: Failure) -> None:
        value = reason.value
        signal_number = getattr(value, "signal", None)
        code = getattr(value, "exitCode", None)
        self.status = -signal_number if signal_number else (code or 0)
        waiters, self._ended_waiters = self._ended_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def described(self) -> str:
        """How it ended, in words."""
        if self.status is None:
            return "still running"
        if self.status < 0:
            try:
                name = signal.Signals(-self.status).name
            except ValueError:
                name = f"signal {-self.status}"
            return f"ended by {name}"
        return f"exited with status {self.status}"

    def _signal(self, number: int) -> None:
        # The group even after its first process ended: what it started may live on.
        if self.pid is None or not (self._group or self.running):
            return
        try:
            if self._group:
                os.killpg(self.pid, number)
            else:
                os.kill(self.pid, number)
        except (ProcessLookupError, PermissionError):
            # Stopped at once, it may not have made its group yet (setsid not yet run).
            if self._group and self.running:
                try:
                    os.kill(self.pid, number)
                except (ProcessLookupError, PermissionError):
                    pass

    async def ended(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the process to end; whether it has."""
        if not self.running:
            return True
        waiter: defer.Deferred[None] = defer.Deferred()
        self._ended_waiters.append(waiter)
        timer = self.reactor.callLater(
            timeout, lambda: None if waiter.called else waiter.callback(None))
        try:
            await waiter
        finally:
            if timer.active():
                timer.cancel()
            if waiter in self._ended_waiters:
                self._ended_waiters.remove(waiter)
        return not self.running

    async def stop(self) -> None:
        """SIGTERM to its group, then SIGKILL after STOP_GRACE; returns once it has ended."""
        self.stopping = True
        self._signal(signal.SIGTERM)
        if not await self.ended(STOP_GRACE):
            self._signal(signal.SIGKILL)
            await self.ended(STOP_GRACE)
        self._signal(signal.SIGKILL)  # anything of its group left
