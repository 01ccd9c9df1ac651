"""Command-line clients in the spirit of mosquitto_pub and mosquitto_sub: ``wireproto pub``,
``sub``, ``call``, ``produce`` and ``events``.

Each tool module has ``register(commands)``, which adds its subcommand to the ``wireproto``
parser with ``set_defaults(run=...)``; ``run(args) -> int`` is the exit status. `_common` holds
what they share: the exit codes, reading an address, payloads from stdin, output, and one-line
errors.
"""

from __future__ import annotations

import argparse
import importlib

__all__ = ["TOOL_MODULES", "register_all"]

TOOL_MODULES = ("wireproto.tools.pubsub", "wireproto.tools.rpc")


def register_all(commands: argparse._SubParsersAction) -> None:
    for name in TOOL_MODULES:
        importlib.import_module(name).register(commands)
