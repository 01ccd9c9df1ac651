"""The [metrics] table (docs/configuration.md)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MetricsSettings"]


@dataclass(frozen=True)
class MetricsSettings:
    """The [metrics] table: Prometheus metrics, served on every HTTP listener's port at `path`."""

    enabled: bool = True
    path: str = "/metrics"

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"path {self.path!r} must start with '/'")
