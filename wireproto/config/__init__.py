"""The run configuration of a wireproto broker: listeners, attached links, Phyllo devices, and
one table of settings per part of the broker.

One `Config` comes from command-line options, from a TOML file, or both (the command line wins),
and `wireproto.service.make_service` builds the running service from it. docs/running.md and
docs/configuration.md describe the syntax. The package has one module per job:

- `model`: the values (`Config`, `Listener`, `Attach`, `PhylloLink`, `ConfigError`);
- `tables`: which settings class each table is (declared by the code it configures; those of
  `[log]`, `[secrets]` and `[app]` here);
- `forms`: the ``--listen``/``--attach``/``--phyllo`` forms and the checks they pass;
- `endpoints`: endpoint strings, their loopback default and their checks;
- `toml`: reading and writing config files;
- `options`: the options of ``wireproto serve`` and ``twistd wireproto``, declared once;
- `files`: the files a config names, checked before the broker starts ([secrets]).

The names below load their module when first used, so importing this package is cheap. The
tables' classes are here too, for convenience; each lives with the code it configures.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "ConfigError": "model",
    "Config": "model",
    "Listener": "model",
    "Attach": "model",
    "PhylloLink": "model",
    "LogSettings": "tables",
    "DEFAULT_LISTENERS": "model",
    "config_tables": "tables",
    "TRANSPORTS": "forms",
    "HTTP_TRANSPORTS": "forms",
    "parse_listen": "forms",
    "parse_attach": "forms",
    "parse_phyllo": "forms",
    "endpoint_type": "endpoints",
    "is_ephemeral": "endpoints",
    "with_default_interface": "endpoints",
    "load_config": "toml",
    "config_from_toml": "toml",
    "config_to_toml": "toml",
    "build_config": "options",
    "config_from_options": "options",
    "SERVE_OPTIONS": "options",
    # The tables' classes, declared by the code each configures.
    "HubSettings": "wireproto.hub",
    "WebSocketOptions": "wireproto.transports.websocket",
    "HTTPLimits": "wireproto.transports.http",
    "StreamOptions": "wireproto.transports.stream",
    "EngineIOOptions": "wireproto.transports.engineio.options",
    "WebsmqSettings": "wireproto.protocols.websmq.server",
    "UbreSettings": "wireproto.protocols.ubre.server",
    "NydusSettings": "wireproto.protocols.nydus.server",
    "SubbleSettings": "wireproto.protocols.subble.server",
    "MetricsSettings": "wireproto.metrics.settings",
    "CaptureSettings": "wireproto.capture.writer",
    "AuthSettings": "wireproto.authentication",
    "LimitSettings": "wireproto.access.quotas",
    "AdminSettings": "wireproto.admin.settings",
    "DeviceSettings": "wireproto.devices.settings",
    "SecretsSettings": "tables",
    "AppSettings": "tables",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'wireproto.config' has no attribute {name!r}")
    if "." not in module:
        module = f"wireproto.config.{module}"
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
