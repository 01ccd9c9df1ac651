"""How long the supervisor waits before it starts again a process that ended: a worker, or its
private nats-server."""

from __future__ import annotations

__all__ = ["QUICK_DEATH", "MAX_RESTART_PAUSE", "RestartPause"]

# A process that ends sooner than this after it was started counts towards a growing pause.
QUICK_DEATH = 5.0
MAX_RESTART_PAUSE = 30.0


class RestartPause:
    """The pause before each start again: 0.1 s after a process that had lived, then, while
    processes keep ending within `QUICK_DEATH` seconds of their start, 0.5 s doubling each
    time up to `MAX_RESTART_PAUSE`, so a process that cannot run is not started in a loop."""

    def __init__(self) -> None:
        self.quick_deaths = 0

    def after(self, lived: float) -> float:
        """The pause before starting again a process that ended after `lived` seconds."""
        self.quick_deaths = self.quick_deaths + 1 if lived < QUICK_DEATH else 0
        if not self.quick_deaths:
            return 0.1
        return min(0.5 * 2 ** (self.quick_deaths - 1), MAX_RESTART_PAUSE)
