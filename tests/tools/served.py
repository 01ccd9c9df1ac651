"""`wireproto serve` and the tools as real processes, for the tools' tests: a broker started with
its listeners (or a config file), read from its banner, and tools run against it."""

from __future__ import annotations

import re
import sys

from tests.test_cli import LISTENER_LINE, Child

READY = re.compile(r"^wireproto: ready; Ctrl-C stops$")


class Processes:
    """Every process a test starts, killed at its end."""

    def __init__(self) -> None:
        self.started: list[Child] = []
        # Each listener of the last broker started: (PROTOCOL over TRANSPORT, its address).
        self.listening: list[tuple[str, str]] = []

    def run(self, *args: str, stdin: str | None = None) -> Child:
        """``python -m wireproto ARGS`` (PYTHONPATH, inherited, names the wireproto tested)."""
        child = Child(sys.executable, "-m", "wireproto", *args, stdin=stdin)
        self.started.append(child)
        return child

    async def serve(self, *args: str) -> dict[str, str]:
        """Start ``wireproto serve ARGS``; once it is ready, its address for each listener,
        by ``PROTOCOL over TRANSPORT`` (``websmq over ws``; the first, if several)."""
        broker = self.run("serve", *args)
        await broker.line(READY, timeout=30)
        self.listening = [(f"{m.group(1)} over {m.group(2)}", m.group(3))
                          for m in map(LISTENER_LINE.match, broker.stdout) if m]
        addresses: dict[str, str] = {}
        for name, address in self.listening:
            addresses.setdefault(name, address)
        return addresses

    def kill(self) -> None:
        for child in self.started:
            child.kill()


async def one_line(tool: Child, code: int) -> str:
    """`tool` exits with `code` having printed one line on stderr and nothing on stdout; that
    line."""
    assert await tool.exit_code(timeout=30) == code, tool.output()
    assert tool.stdout == [] and len(tool.stderr) == 1, tool.output()
    return tool.stderr[0]
