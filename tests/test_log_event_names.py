"""Every log line of wireproto's own names its event: each log call in wireproto/ passes a stable
``event=`` name, and the names the code logs are those docs/observability.md's table lists, no
more and no fewer. Read from the source itself, so a new log call without a name fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "wireproto"
DOC = ROOT / "docs" / "observability.md"

LOG_METHODS = frozenset({"debug", "info", "warn", "error", "critical", "failure"})
# What a logger is called in wireproto: a module's `log`, a `logger` handed in, `self.log`,
# and `peerlog.warn(log, key, ...)`, which logs within the peers' budget.
LOGGERS = frozenset({"log", "logger", "_log", "peerlog"})
# Calls whose event name is a variable, and the names it can take there (each must be a string
# in wireproto/ too). peerlog.warn passes on its caller's name, checked at each caller.
DYNAMIC = {
    "wireproto/cluster/jetstream.py": {"cluster_no_jetstream", "cluster_jetstream_refused",
                                       "cluster_jetstream_timeout", "cluster_jetstream_failed"},
    "wireproto/hub/peers.py": {"credential_expired", "credential_withdrawn"},
    "wireproto/peerlog.py": set(),
}
SNAKE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


def _receiver(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_log_method(node: ast.expr, aliases: frozenset[str] = frozenset()) -> bool:
    """``log.warn``; a choice between such (``log.info if down else log.warn``); or a name
    bound to one of them (`aliases`)."""
    if isinstance(node, ast.Attribute):
        return node.attr in LOG_METHODS and _receiver(node.value) in LOGGERS
    if isinstance(node, ast.IfExp):
        return _is_log_method(node.body, aliases) or _is_log_method(node.orelse, aliases)
    return isinstance(node, ast.Name) and node.id in aliases


def _aliases(tree: ast.AST) -> frozenset[str]:
    """The names a module binds to a log method (``emit = log.info if ... else log.warn``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None and (
                _is_log_method(node.value)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
    return frozenset(names)


def log_calls() -> list[tuple[str, int, ast.Call]]:
    """(path, line, call) for every log call in wireproto/: a logger's method called, directly
    or through a name or a choice (``(log.debug if quiet else log.info)(...)``)."""
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), str(path))
        aliases = _aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _is_log_method(node.func, aliases):
                calls.append((name, node.lineno, node))
    return calls


def loose_log_methods() -> list[str]:
    """Where a logger's method is taken but not called here (passed as a callback, kept in an
    attribute): a call this walk could not see."""
    loose = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        seen: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                seen |= {id(n) for n in ast.walk(node.func)}
            elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None and (
                    _is_log_method(node.value)) and all(
                    isinstance(t, ast.Name) for t in (
                        node.targets if isinstance(node, ast.Assign) else [node.target])):
                seen |= {id(n) for n in ast.walk(node.value)}
        for node in ast.walk(tree):
            if _is_log_method(node) and isinstance(node, ast.Attribute) and id(node) not in seen:
                loose.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return loose


def _event(call: ast.Call) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == "event"), None)


def _strings(node: ast.AST) -> set[str]:
    return {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)
            and isinstance(c.value, str)}


def _constant_only(node: ast.expr) -> bool:
    """A name, or a choice between names (``"subscribe" if ... else "unsubscribe"``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.IfExp):
        return _constant_only(node.body) and _constant_only(node.orelse)
    return False


def documented() -> set[str]:
    """The names in the first column of docs/observability.md's "Log events" table."""
    text = DOC.read_text()
    section = text.split("\n## Log events\n", 1)[1].split("\n### ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `") and not line.startswith("| `event` | namespace |"):
            names |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def logged() -> set[str]:
    names: set[str] = set()
    for _, _, call in log_calls():
        event = _event(call)
        if event is not None and _constant_only(event):
            names |= _strings(event)
    for dynamic in DYNAMIC.values():
        names |= dynamic
    return names


def test_the_walk_finds_the_log_calls() -> None:
    calls = log_calls()
    assert len(calls) > 100
    files = {name for name, _, _ in calls}
    assert {"wireproto/hub/session.py", "wireproto/peerlog.py",
            "wireproto/protocols/nydus/server.py", "wireproto/phyllo/bridge.py"} <= files


def test_calls_through_a_name_or_a_choice_are_log_calls() -> None:
    tree = ast.parse("emit = log.info if down else log.warn\nemit('x')\n"
                     "(log.debug if quiet else log.info)('y', event='e')\nother('z')\n")
    aliases = _aliases(tree)
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and _is_log_method(node.func, aliases)]
    assert [ast.unparse(call) for call in calls] == [
        "emit('x')", "(log.debug if quiet else log.info)('y', event='e')"]


def test_every_logger_method_taken_is_called_where_the_walk_sees_it() -> None:
    assert not loose_log_methods()


def test_every_log_call_names_its_event() -> None:
    unnamed = [f"{name}:{line}: {ast.unparse(call)[:100]}" for name, line, call in log_calls()
               if _event(call) is None]
    assert not unnamed, f"{len(unnamed)} log calls without event=:\n" + "\n".join(unnamed)


def test_event_names_are_constants_or_known() -> None:
    for name, line, call in log_calls():
        event = _event(call)
        if event is not None and not _constant_only(event):
            assert name in DYNAMIC, f"{name}:{line}: event={ast.unparse(event)} is not a name"
    every_string: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        every_string |= _strings(ast.parse(path.read_text()))
    for names in DYNAMIC.values():
        assert names <= every_string, names - every_string


def test_the_names_are_snake_case() -> None:
    assert not {name for name in logged() if not SNAKE.fullmatch(name)}


def test_every_event_the_code_logs_is_in_the_table() -> None:
    missing = logged() - documented()
    assert not missing, f"not in docs/observability.md's table: {sorted(missing)}"


def test_every_event_in_the_table_is_logged() -> None:
    stale = documented() - logged()
    assert not stale, f"in docs/observability.md's table, but logged nowhere: {sorted(stale)}"
