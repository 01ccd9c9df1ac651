"""A Node.js script as a real peer in a test: commands in on stdin, JSON events out on stdout."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from twisted.internet import defer, error, protocol, reactor

from tests.support import eventually, wait_for

__all__ = ["NodePeer", "NodePeers"]


class NodePeer(protocol.ProcessProtocol):
    """A Node script as a child process: one command per line in, one JSON event per line out."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.stderr = b""
        self._partial = b""
        self.ended: defer.Deferred[None] = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        self.events.extend(json.loads(line) for line in lines if line)

    def errReceived(self, data: bytes) -> None:
        self.stderr += data

    def processEnded(self, reason: Any) -> None:
        self.ended.callback(None)

    def command(self, line: str) -> None:
        self.transport.write(line.encode() + b"\n")

    def of(self, kind: str, **fields: Any) -> list[dict[str, Any]]:
        """The events of one kind, with these field values."""
        return [
            event for event in self.events
            if event["event"] == kind and all(event.get(k) == v for k, v in fields.items())
        ]

    async def wait(self, kind: str, count: int = 1, **fields: Any) -> list[dict[str, Any]]:
        """Wait until `count` such events came, and return all of them."""
        try:
            await eventually(lambda: len(self.of(kind, **fields)) >= count)
        except TimeoutError as exc:
            raise AssertionError(
                f"no {count} {kind!r} event(s) {fields}: events {self.events}, "
                f"stderr {self.stderr.decode(errors='replace')}"
            ) from exc
        return self.of(kind, **fields)

    def bodies(self, kind: str, **fields: Any) -> list[Any]:
        return [event.get("body") for event in self.of(kind, **fields)]

    async def stop(self) -> None:
        if not self.ended.called:
            try:
                self.transport.signalProcess("KILL")
            except error.ProcessExitedAlready:
                pass
            await wait_for(self.ended)


class NodePeers:
    """The Node scripts one test starts; `stop()` kills every one, however the test ended."""

    def __init__(self, executable: str) -> None:
        self.executable = executable
        self.started: list[NodePeer] = []

    async def start(self, script: Path, *args: str, ready: str) -> NodePeer:
        """Run `script` and wait for its first `ready` event."""
        node = NodePeer()
        self.started.append(node)
        reactor.spawnProcess(node, self.executable, ["node", str(script), *args], env=os.environ)
        await node.wait(ready)
        return node

    async def stop(self) -> None:
        for node in self.started:
            await node.stop()
