"""`wireproto` imports only what the command it runs needs (no timing here: bench/cli.py times it).

Each case runs the real command (as ``python -m wireproto`` does) and reads which modules it
imported: ``--version`` and ``--help`` import neither Twisted nor Autobahn, a command's ``--help``
imports no other command's module, and ``pub`` to a broker imports no server part.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import threads

from tests.brokers import start_service
from tests.support import wait_for
from wireproto.cli import COMMANDS, build_parser
from wireproto.config import Config, parse_listen

COMMAND_MODULES = {entry.module for entry in COMMANDS.values() if entry.module}
SERVER_SIDE = ("twisted.web", "wireproto.service", "wireproto.hub", "wireproto.config",
               "wireproto.transports.websocket_http", "wireproto.transports.engineio",
               "wireproto.transports.stream")


# `python -m wireproto ARGS`, which then writes the names of the modules it imported to a file.
RUN = """
import atexit, runpy, sys
where = sys.argv.pop(1)
atexit.register(lambda: open(where, "w").write("\\n".join(sorted(sys.modules))))
runpy.run_module("wireproto", run_name="__main__", alter_sys=True)
"""


def imported(tmp_path: Path, *args: str) -> set[str]:
    """The modules `wireproto ARGS` imports; it must exit 0 with nothing on stderr."""
    where = tmp_path / "modules.txt"
    done = subprocess.run([sys.executable, "-c", RUN, str(where), *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr, done.stdout + done.stderr
    return set(where.read_text().split())


def under(modules: set[str], *packages: str) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["serve", "--help"],
                                  ["check-config", "--help"], ["passwd", "--help"]])
def test_version_and_help_import_neither_twisted_nor_autobahn(args: list[str],
                                                             tmp_path: Path) -> None:
    modules = imported(tmp_path, *args)
    assert under(modules, "twisted", "autobahn") == []
    if args[0].startswith("-"):
        assert under(modules, "wireproto") == sorted(
            ["wireproto", "wireproto.cli", "wireproto.output", "wireproto.program",
             "wireproto.redaction", "wireproto.stopping"])


# ingest runs Spark as analyze does, with analyze's plumbing (its checks, signals, quiet JVM).
SHARED = {"ingest": ["wireproto.pipeline.command"]}


@pytest.mark.parametrize("command", ["pub", "sub", "call", "produce", "events", "passwd",
                                     "analyze", "ingest"])
def test_a_commands_help_imports_its_module_alone(command: str, tmp_path: Path) -> None:
    modules = imported(tmp_path, command, "--help")
    own = COMMANDS[command].module
    assert own in modules
    assert sorted(COMMAND_MODULES & modules) == sorted([own, *SHARED.get(command, [])])
    assert under(modules, "autobahn", *SERVER_SIDE) == []
    # Nor the spark extra's packages: a help without them, and no wait for them.
    assert under(modules, "pyspark", "pyarrow", "numpy") == []


def test_the_table_says_what_each_module_registers() -> None:
    # --help lists the commands from the table, without their modules: it must agree with
    # what each module registers.
    full = build_parser()
    commands = next(action for action in full._actions
                    if isinstance(action, argparse._SubParsersAction))
    listed = {action.dest: action.help for action in commands._choices_actions}
    assert listed == {name: entry.help for name, entry in COMMANDS.items()}
    assert build_parser("").format_help() == full.format_help()


@pytest_twisted.ensureDeferred
async def test_pub_imports_no_server_part_and_no_native_websocket_code(tmp_path: Path) -> None:
    config = Config(listeners=(parse_listen("websmq+ws@tcp:0:interface=127.0.0.1"),))
    service, bound = await start_service(config)
    try:
        modules = await wait_for(threads.deferToThread(
            imported, tmp_path, "pub", bound[0].address, "-t", "x", "-m", "hi"), timeout=60)
    finally:
        await wait_for(service.stopService(), timeout=10)
    assert "autobahn.twisted.websocket" in modules  # it did connect over WebSocket
    assert under(modules, *SERVER_SIDE, "autobahn.nvx", "wireproto.protocols.websmq.server") == []
    assert sorted(COMMAND_MODULES & modules) == ["wireproto.tools.pubsub"]
