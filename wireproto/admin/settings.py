"""The [admin] table (docs/browser.md)."""

from __future__ import annotations

from dataclasses import dataclass

from wireproto.access import AccessRule
from wireproto.settings import positive_integer, seconds_or_never, setting, strings

__all__ = ["AdminSettings"]


@dataclass(frozen=True)
class AdminSettings:
    """The [admin] table: the status page at ``/``, the browser clients at ``/js/`` and the admin
    API at ``/api/`` on every HTTP listener's port, and the ``$SYS`` topics.

    With [auth], only the principals `allow` names (``"alice"``, ``"role:admin"``) use the API;
    without it, only clients on the broker's own machine do."""

    enabled: bool = True
    allow: tuple[str, ...] = setting(("role:admin",), read=strings)
    # The broker's own figures on $SYS topics every this many seconds (0: never).
    sys_interval: float = setting(0.0, read=seconds_or_never)
    # Taps (live views of a topic pattern) open at once, over every HTTP port.
    max_taps: int = setting(16, read=positive_integer)
    # Topics whose publishes are counted for their rates; others are counted together.
    max_counted_topics: int = setting(1000, read=positive_integer)

    def sys_rules(self) -> tuple[AccessRule, ...]:
        """Access rules that let the principals `allow` names read the $SYS topics (which no
        rule granting a wildcard first level covers)."""
        return tuple(
            AccessRule(role=entry[5:], subscribe=("$SYS/#",)) if entry.startswith("role:")
            else AccessRule(principal=entry, subscribe=("$SYS/#",))
            for entry in self.allow
        )
