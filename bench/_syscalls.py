"""Counting a broker's system calls over a measured window, for bench/pubsub.py --syscalls.

`perf stat` counts the kernel's syscall tracepoints on every thread of the process, cheaply, and
is switched on and off through a control FIFO, so the count covers the measured window alone. It
needs perf and tracepoints readable by this user (root, or kernel.perf_event_paranoid <= -1).
Without them `strace -c -f` counts instead: it stops the broker on every call, so the CPU figures
of such a run are not comparable with any other run's.

A count is a dict: "total", "sends" (send*, write*), "recvs" (recv*, read*), "waits"
(epoll_wait, epoll_pwait, poll, select), "ctls" (epoll_ctl); writes and reads to files count as
sends and recvs.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

KINDS = {
    "sends": ("sendto", "sendmsg", "sendmmsg", "write", "writev"),
    "recvs": ("recvfrom", "recvmsg", "recvmmsg", "read", "readv"),
    "waits": ("epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select",
              "pselect6"),
    # Twisted asks epoll to watch a socket for writability while its buffer waits, and stops.
    "ctls": ("epoll_ctl",),
}
TOTAL = "raw_syscalls:sys_enter"


class SyscallsUnavailable(Exception):
    """Neither perf nor strace can count this process's system calls."""


def _kind_of(call: str) -> str | None:
    return next((kind for kind, calls in KINDS.items() if call in calls), None)


class PerfCounter:
    """perf stat attached to `pid`, its events off until `enable()`."""

    method = "perf stat (syscall tracepoints)"

    def __init__(self, pid: int, timeout: float = 10.0) -> None:
        perf = shutil.which("perf")
        if perf is None:
            raise SyscallsUnavailable("perf is not installed")
        self.timeout = timeout
        self.folder = tempfile.TemporaryDirectory(prefix="bench-perf-")
        folder = Path(self.folder.name)
        control, ack, self.output = folder / "control", folder / "ack", folder / "counts"
        os.mkfifo(control)
        os.mkfifo(ack)
        # Read-write opens of a FIFO never block, whether or not perf has opened it yet.
        self.control = os.open(control, os.O_RDWR)
        self.ack = os.open(ack, os.O_RDWR)
        events = [TOTAL] + [f"syscalls:sys_enter_{call}" for calls in KINDS.values()
                            for call in calls]
        self.process = subprocess.Popen(
            [perf, "stat", "-x", ",", "-D", "-1", "--control", f"fifo:{control},{ack}",
             "-e", ",".join(events), "-p", str(pid), "-o", str(self.output)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def _command(self, word: str) -> None:
        os.write(self.control, word.encode() + b"\n")
        ready, _, _ = select.select([self.ack], [], [], self.timeout)
        if not ready:
            self.close()
            raise SyscallsUnavailable(f"perf did not acknowledge {word!r}: {self._said()}")
        os.read(self.ack, 64)

    def _said(self) -> str:
        if self.process.poll() is None:
            return "(still running)"
        return self.process.stderr.read().decode(errors="replace").strip()[-300:]

    def enable(self) -> None:
        self._command("enable")

    def disable(self) -> dict[str, int]:
        self._command("disable")
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(self.timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise SyscallsUnavailable("perf did not stop") from None
        counts = dict.fromkeys(("total", *KINDS), 0)
        for line in self.output.read_text().splitlines():
            fields = line.split(",")
            if len(fields) < 3 or not fields[0].isdigit():
                continue  # a comment, or "<not counted>"
            event = fields[2]
            kind = "total" if event == TOTAL else _kind_of(event.rpartition("sys_enter_")[2])
            if kind is not None:
                counts[kind] += int(fields[0])
        self.close()
        return counts

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for fd in (self.control, self.ack):
            try:
                os.close(fd)
            except OSError:
                pass
        self.folder.cleanup()


class StraceCounter:
    """strace -c -f attached to `pid` from `enable()` to `disable()` (slows the broker)."""

    method = "strace -c -f (stops the broker on every call: CPU figures not comparable)"

    def __init__(self, pid: int, timeout: float = 10.0) -> None:
        self.strace = shutil.which("strace")
        if self.strace is None:
            raise SyscallsUnavailable("neither perf nor strace can count system calls")
        self.pid, self.timeout = pid, timeout
        self.folder = tempfile.TemporaryDirectory(prefix="bench-strace-")
        self.output = Path(self.folder.name) / "counts"
        self.process: subprocess.Popen | None = None

    def enable(self) -> None:
        self.process = subprocess.Popen(
            [self.strace, "-c", "-f", "-p", str(self.pid), "-o", str(self.output)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # strace says "Process N attached" on stderr once it holds the process.
        deadline = time.monotonic() + self.timeout
        said = b""
        while b"attached" not in said and time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stderr], [], [], 0.1)
            if ready:
                chunk = os.read(self.process.stderr.fileno(), 4096)
                if not chunk:
                    break
                said += chunk
        if b"attached" not in said:
            self.close()
            raise SyscallsUnavailable(f"strace could not attach: {said.decode()[-300:]}")

    def disable(self) -> dict[str, int]:
        assert self.process is not None, "enable() first"
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(self.timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise SyscallsUnavailable("strace did not stop") from None
        counts = dict.fromkeys(("total", *KINDS), 0)
        # "% time  seconds  usecs/call  calls  errors syscall", errors possibly blank
        row = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")
        for line in self.output.read_text().splitlines():
            match = row.match(line)
            if match and match.group(2) != "total":
                calls, call = int(match.group(1)), match.group(2)
                counts["total"] += calls
                kind = _kind_of(call)
                if kind is not None:
                    counts[kind] += calls
        self.close()
        return counts

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.folder.cleanup()


def choose_method(wanted: str = "auto") -> str:
    """"perf" where perf counts syscall tracepoints for this user, else "strace" if installed;
    `wanted` "perf" or "strace" takes that one or none."""
    perf = shutil.which("perf")
    if perf is not None and wanted in ("auto", "perf"):
        probe = subprocess.run([perf, "stat", "-e", TOTAL, "--", "true"], capture_output=True,
                               timeout=30, check=False)
        if probe.returncode == 0:
            return "perf"
    if shutil.which("strace") is not None and wanted in ("auto", "strace"):
        return "strace"
    raise SyscallsUnavailable({"auto": "neither perf (with syscall tracepoints) nor strace",
                               "perf": "perf (with syscall tracepoints)",
                               "strace": "strace"}[wanted] + " cannot count system calls here")


def counter(pid: int, method: str) -> PerfCounter | StraceCounter:
    """A counter of `pid`'s system calls, off until its `enable()`."""
    return PerfCounter(pid) if method == "perf" else StraceCounter(pid)
