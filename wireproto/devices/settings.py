"""The [devices] table: how the broker watches for serial boards plugged in and pulled out
(docs/configuration.md)."""

from __future__ import annotations

from dataclasses import dataclass

from wireproto.settings import positive_number, setting

from .watch import MIN_INTERVAL

__all__ = ["DeviceSettings"]


def poll_interval(value: object) -> float:
    seconds = positive_number(value)
    if seconds < MIN_INTERVAL:
        raise ValueError(f"the ports are listed at most every {MIN_INTERVAL} s, not {seconds}")
    return seconds


@dataclass(frozen=True)
class DeviceSettings:
    """The [devices] table. Where udev runs, its events say when boards come and go; where it
    does not (a container), the serial ports are listed every `poll_interval` seconds."""

    poll_interval: float = setting(1.0, read=poll_interval)

    def __post_init__(self) -> None:
        poll_interval(self.poll_interval)
