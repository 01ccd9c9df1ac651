"""The tables of a config file, each declared once by the code it configures.

A table's class is a frozen dataclass whose fields are its keys (`wireproto.settings` says how
each is read); each protocol's own table comes from its descriptor (`wireproto.protocols`), so
a protocol registered later has its table too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from wireproto.settings import boolean, choice, setting, shown

__all__ = ["config_tables", "AppSettings", "LogSettings", "SecretsSettings", "app_setup",
           "LOG_LEVELS", "LOG_FORMATS"]

LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_FORMATS = ("text", "json")


@dataclass(frozen=True)
class LogSettings:
    """The [log] table: what the broker logs, and where: `file` "" is stderr. Declared here:
    the front ends (`wireproto serve`, the twistd plugin) set logging up from it."""

    level: str = setting("warn", read=choice(LOG_LEVELS))
    format: str = setting("text", read=choice(LOG_FORMATS))
    file: str = ""


@dataclass(frozen=True)
class SecretsSettings:
    """The [secrets] table: how the key and password files the config names are treated
    (`wireproto.config.files` checks them). Declared here: the config itself is what it
    configures."""

    # Take a secret file that its group or others may open (a key shared with a group on
    # purpose); off, such a file stops the broker before it starts.
    allow_loose_permissions: bool = setting(False, read=boolean)


# MODULE:FUNCTION, each a dotted name, as uvicorn's `module:app` (wireproto.service.app).
_APP_SETUP = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*:[^\W\d]\w*(\.[^\W\d]\w*)*")


def app_setup(value: object) -> str:
    """`[app] setup` and ``--app``: ``MODULE:FUNCTION`` (dotted names), or "" for none."""
    if not isinstance(value, str) or value and _APP_SETUP.fullmatch(value) is None:
        raise ValueError(f"expected MODULE:FUNCTION, as myapp:setup or myapp.broker:setup, "
                         f"got {shown(value)}")
    return value


@dataclass(frozen=True)
class AppSettings:
    """The [app] table: the application's function that `wireproto serve` and `twistd
    wireproto` call with the broker in each of its processes (wireproto.service.app).
    Declared here: the front ends run it."""

    setup: str = setting("", read=app_setup)




def config_tables() -> dict[str, type]:
    """Every table by name, in the order a config file shows them."""
    from wireproto.access.quotas import LimitSettings
    from wireproto.admin.settings import AdminSettings
    from wireproto.authentication import AuthSettings
    from wireproto.capture.writer import CaptureSettings
    from wireproto.cluster.settings import ClusterSettings
    from wireproto.devices.settings import DeviceSettings
    from wireproto.hub import HubSettings
    from wireproto.metrics.settings import MetricsSettings
    from wireproto.protocols import PROTOCOLS
    from wireproto.transports.engineio.options import EngineIOOptions
    from wireproto.transports.http import HTTPLimits
    from wireproto.transports.stream import StreamOptions
    from wireproto.transports.websocket import WebSocketOptions

    tables: dict[str, Any] = {
        "hub": HubSettings,
        "websocket": WebSocketOptions,
        "http": HTTPLimits,
        "stream": StreamOptions,
    }
    for name, descriptor in PROTOCOLS.items():
        kind = descriptor.settings_class()
        if kind is not None:
            tables[name] = kind
    tables.update(engineio=EngineIOOptions, log=LogSettings, metrics=MetricsSettings,
                  capture=CaptureSettings, auth=AuthSettings, limits=LimitSettings,
                  cluster=ClusterSettings, admin=AdminSettings, devices=DeviceSettings,
                  secrets=SecretsSettings, app=AppSettings)
    return tables
