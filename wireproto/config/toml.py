"""Config files: TOML read into a `Config` and written back.

A file has ``[[listen]]``, ``[[attach]]`` and ``[[phyllo]]`` tables (or lists of the option
strings), and one table per settings class (`wireproto.config.tables`): ``[hub]``,
``[websocket]``, ``[http]``, ``[stream]``, one per protocol (``[websmq]``...), ``[engineio]``,
``[log]``, ``[metrics]`` and ``[capture]``. How each key is read comes from its class's
declaration (`wireproto.settings`). TOML has no null: leave an optional key out.

Every problem is a `ConfigError` naming the file, the key and what is wrong; a file with several
problems has them all.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

from wireproto.access import AccessRule, Action
from wireproto.codecs.phyllo.chunks import MAX_CHUNK_LENGTH
from wireproto.config.endpoints import default_reactor
from wireproto.config.forms import (
    HTTP_TRANSPORTS,
    Invalid,
    Located,
    check_attach,
    check_listener,
    check_phyllo,
    check_phyllo_links,
    check_shared_endpoints,
    parse_attach,
    parse_listen,
    parse_phyllo,
)
from wireproto.config.model import (
    DEFAULT_MAX_BOARDS,
    Attach,
    Config,
    ConfigError,
    Listener,
    PhylloLink,
)
from wireproto.config.tables import config_tables
from wireproto.errors import InvalidTopic
from wireproto.settings import (
    boolean,
    integer,
    one_of,
    shown,
    string,
    strings,
    table_readers,
    toml_value,
)

__all__ = [
    "config_from_toml",
    "load_config",
    "config_to_toml",
    "check_something_to_do",
    "check_metrics_path",
    "unknown_key",
]

LISTEN_KEYS = ("protocol", "transport", "endpoint", "path", "identity", "principal", "allow",
               "announce")
ATTACH_KEYS = ("protocol", "endpoint", "framing", "principal", "name", "each_board",
               "max_boards", "prefix")
PHYLLO_KEYS = ("name", "endpoint", "stack", "prefix", "send_format", "max_chunk_length",
               "principal", "each_board", "max_boards")
ACL_KEYS = ("principal", "role", *(action.value for action in Action))


def unknown_key(key: str, known: Iterable[str]) -> str:
    known = list(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.7) or [
        name for name in known if name.startswith(key)
    ]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key; use {one_of(known)}{hint}"



def _read_table(where: str, name: str, table: Any, kind: type) -> Any:
    readers = table_readers(kind)
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: {name}: expected a table ([{name}]), got {shown(table)}")
    values = {}
    problems = []
    for key, value in table.items():
        reader = readers.get(key)
        if reader is None:
            problems.append(f"{where}: {name}.{key}: {unknown_key(key, readers)}")
            continue
        try:
            values[key] = reader(value)
        except ValueError as error:
            problems.append(f"{where}: {name}.{key}: {error}")
    if problems:
        raise ConfigError(*problems)
    try:
        return kind(**values)
    except ValueError as error:  # checks across keys, made by the options class itself
        raise ConfigError(f"{where}: {name}: {error}") from None


def _read_entries(where: str, name: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ConfigError(
            f"{where}: {name}: expected [[{name}]] tables or a list of strings, got {shown(value)}"
        )
    return value


def _read_listener(where: str, label: str, entry: Any, reactor: Any) -> Listener:
    if isinstance(entry, str):
        try:
            return parse_listen(entry, reactor=reactor)
        except ConfigError as error:
            raise ConfigError(f"{where}: {label}: {str(error).removeprefix('--listen ')}") from None
    allow = entry.get("allow", ()) if isinstance(entry, dict) else ()
    values = _string_fields(where, label, entry, LISTEN_KEYS, required=("protocol", "transport",
                                                                          "endpoint"),
                            other_types=("allow",))
    try:
        return check_listener(
            values["protocol"], values["transport"], values["endpoint"], values.get("path"),
            reactor, values.get("identity"), values.get("principal"), allow,
            values.get("announce"),
        )
    except Invalid as problem:
        raise ConfigError(f"{where}: {label}.{problem.key}: {problem.message}") from None


def _read_attach(where: str, label: str, entry: Any, reactor: Any) -> Attach:
    if isinstance(entry, str):
        try:
            return parse_attach(entry, reactor=reactor)
        except ConfigError as error:
            raise ConfigError(f"{where}: {label}: {str(error).removeprefix('--attach ')}") from None
    entry, each_board, max_boards = _fleet_fields(where, label, entry)
    values = _string_fields(where, label, entry, ATTACH_KEYS, required=("protocol", "endpoint"))
    try:
        return check_attach(
            values["protocol"], values["endpoint"], values.get("framing"), reactor,
            values.get("principal"), values.get("name"), each_board, max_boards,
            values.get("prefix"),
        )
    except Invalid as problem:
        raise ConfigError(f"{where}: {label}.{problem.key}: {problem.message}") from None


def _read_phyllo(where: str, label: str, entry: Any, reactor: Any) -> PhylloLink:
    if isinstance(entry, str):
        try:
            return parse_phyllo(entry, reactor=reactor)
        except ConfigError as error:
            raise ConfigError(f"{where}: {label}: {str(error).removeprefix('--phyllo ')}") from None
    if isinstance(entry, dict) and "max_chunk_length" in entry:
        entry = dict(entry)
        try:
            max_chunk_length = integer(entry.pop("max_chunk_length"))
        except ValueError as error:
            raise ConfigError(f"{where}: {label}.max_chunk_length: {error}") from None
    else:
        max_chunk_length = MAX_CHUNK_LENGTH
    entry, each_board, max_boards = _fleet_fields(where, label, entry)
    values = _string_fields(where, label, entry, PHYLLO_KEYS, required=("name", "endpoint"))
    try:
        return check_phyllo(
            values["name"], values["endpoint"], values.get("stack"), values.get("prefix"),
            values.get("send_format"), reactor, max_chunk_length, values.get("principal"),
            each_board, max_boards,
        )
    except Invalid as problem:
        raise ConfigError(f"{where}: {label}.{problem.key}: {problem.message}") from None


def _fleet_fields(where: str, label: str, entry: object) -> tuple[object, bool, int]:
    """`entry` without its ``each_board`` and ``max_boards`` keys, and their values."""
    if not isinstance(entry, dict) or not {"each_board", "max_boards"} & set(entry):
        return entry, False, DEFAULT_MAX_BOARDS
    entry = dict(entry)
    each_board, max_boards = False, DEFAULT_MAX_BOARDS
    try:
        if "each_board" in entry:
            each_board = boolean(entry.pop("each_board"))
    except ValueError as error:
        raise ConfigError(f"{where}: {label}.each_board: {error}") from None
    try:
        if "max_boards" in entry:
            max_boards = integer(entry.pop("max_boards"))
    except ValueError as error:
        raise ConfigError(f"{where}: {label}.max_boards: {error}") from None
    return entry, each_board, max_boards


def check_fleet_names(config: Config, where: str) -> None:
    """Each fleet's boards are links NAME.BOARD with presence topics $devices/NAME.BOARD:
    an [[attach]] fleet's name is no other link's, nor the start of one."""
    names = [(f"phyllo[{number}]", link.name, link.each_board)
             for number, link in enumerate(config.phyllo, 1)]
    for number, attach in enumerate(config.attach, 1):
        if not attach.each_board:
            continue
        label, name = f"attach[{number}]", attach.link_name
        for other_label, other, other_fleet in names:
            if other == name or other.startswith(f"{name}.") or (
                    other_fleet and name.startswith(f"{other}.")):
                raise ConfigError(f"{where}: {label}.name: {name!r} would name links as "
                                  f"{other_label}'s {other!r} does; give it another name")
        names.append((label, name, True))


def check_mounts(config: Config, where: str) -> None:
    """An [[attach]] link's topics are under its prefix on the hub (a fleet's boards under its
    prefix, or name): as a Phyllo link's prefix, none may equal or lie under another's, an
    [[attach]]'s or a [[phyllo]]'s, or two links would share topics."""
    mounts = [(f"phyllo[{number}]", link.prefix) for number, link in enumerate(config.phyllo, 1)]
    for number, attach in enumerate(config.attach, 1):
        label = f"attach[{number}]"
        prefix = attach.fleet_prefix if attach.each_board else attach.prefix
        if not prefix:
            continue
        # The shortest hub topic under it: PREFIX/t, or PREFIX/BOARD/t with a one-letter BOARD.
        shortest = len(prefix) + (4 if attach.each_board else 2)
        if shortest > config.hub.max_topic_length:
            raise ConfigError(f"{where}: {label}.prefix: {prefix[:40]!r}... leaves no room for "
                              f"a topic under [hub] max_topic_length "
                              f"({config.hub.max_topic_length}): shorten it")
        for other_label, other in mounts:
            if f"{prefix}/".startswith(f"{other}/") or f"{other}/".startswith(f"{prefix}/"):
                raise ConfigError(f"{where}: {label}.prefix: its topics would be under "
                                  f"{prefix!r}, which overlaps {other_label}'s {other!r}; "
                                  "give it another prefix")
        mounts.append((label, prefix))


def _read_rule(where: str, label: str, entry: Any, reactor: Any) -> AccessRule:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: {label}: expected a table ([[acl]]), got {shown(entry)}")
    values: dict[str, Any] = {}
    for key, value in entry.items():
        if key not in ACL_KEYS:
            raise ConfigError(f"{where}: {label}.{key}: {unknown_key(key, ACL_KEYS)}")
        try:
            values[key] = string(value) if key in ("principal", "role") else strings(value)
        except ValueError as error:
            raise ConfigError(f"{where}: {label}.{key}: {error}") from None
    try:
        rule = AccessRule(**values)
    except (ValueError, InvalidTopic) as error:
        raise ConfigError(f"{where}: {label}: {error}") from None
    if not any(rule.patterns(action) for action in Action):
        raise ConfigError(f"{where}: {label}: grants nothing; give it publish, subscribe, call "
                          "or serve patterns")
    return rule


def _string_fields(
    where: str, label: str, entry: Any, keys: Sequence[str], required: Sequence[str],
    other_types: Sequence[str] = (),
) -> dict[str, str]:
    """`entry`'s keys, each a string but those in `other_types` (which the caller checks)."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: {label}: expected a table or a string, got {shown(entry)}")
    for key, value in entry.items():
        if key not in keys:
            raise ConfigError(f"{where}: {label}.{key}: {unknown_key(key, keys)}")
        if not isinstance(value, str) and key not in other_types:
            raise ConfigError(f"{where}: {label}.{key}: expected a string, got {shown(value)}")
    for key in required:
        if key not in entry:
            raise ConfigError(f"{where}: {label}: missing key {key!r}")
    return entry


def _read_list(
    source: str, name: str, value: Any, read: Callable[[str, str, Any, Any], Any],
    check: Callable[[Sequence[Any], Sequence[str]], None] | None, reactor: Any,
) -> tuple[Any, ...]:
    """The ``[[name]]`` tables (or option strings), each read by `read`, then `check`ed
    together; errors name the file and the entry, counted from 1 as a reader counts them."""
    entries = _read_entries(source, name, value)
    labels = [f"{name}[{number}]" for number in range(1, len(entries) + 1)]
    items = []
    problems: list[str] = []
    for label, entry in zip(labels, entries, strict=True):
        try:
            items.append(read(source, label, entry, reactor))
        except ConfigError as error:
            problems.extend(error.problems)
    if problems:
        raise ConfigError(*problems)
    if check is not None:
        try:
            check(items, labels)
        except Located as problem:
            raise ConfigError(
                f"{source}: {labels[problem.index]}.{problem.key}: {problem.message}"
            ) from None
    return tuple(items)


def config_from_toml(text: str, *, source: str = "<toml>", reactor: Any = None) -> Config:
    """A `Config` from TOML text; `source` names it in error messages."""
    reactor = default_reactor(reactor)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML: {error}") from None
    # Every problem in the file is reported, not only the first.
    tables = config_tables()
    top_keys = ("listen", "attach", "phyllo", "acl", *tables)
    problems = [f"{source}: {key}: {unknown_key(key, top_keys)}"
                for key in document if key not in top_keys]
    sections: dict[str, Any] = {}

    def read(field_name: str, reading: Callable[[], Any]) -> None:
        try:
            sections[field_name] = reading()
        except ConfigError as error:
            problems.extend(error.problems)

    if "listen" in document:
        read("listeners", lambda: _read_list(source, "listen", document["listen"],
                                             _read_listener, check_shared_endpoints, reactor))
    if "attach" in document:
        read("attach", lambda: _read_list(source, "attach", document["attach"], _read_attach,
                                          None, reactor))
    if "phyllo" in document:
        read("phyllo", lambda: _read_list(source, "phyllo", document["phyllo"], _read_phyllo,
                                          check_phyllo_links, reactor))
    if "acl" in document:
        read("acl", lambda: _read_list(source, "acl", document["acl"], _read_rule, None,
                                       reactor))
    for name, kind in tables.items():
        if name in document:
            read(name, partial(_read_table, source, name, document[name], kind))
    if "auth" in sections:
        sections["auth"] = replace(sections["auth"], enabled=True)  # [auth] turns it on
    if problems:
        raise ConfigError(*problems)
    config = Config().replace(**sections)
    check_fleet_names(config, source)
    check_mounts(config, source)
    check_auth(config, source)
    check_something_to_do(config, source)
    return config


def load_config(path: str | Path, *, reactor: Any = None) -> Config:
    """Read a TOML config file; every error names the file, the key and what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the config file: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text: {error.reason}") from None
    return config_from_toml(text, source=str(path), reactor=reactor)


def check_something_to_do(config: Config, where: str) -> None:
    if not config.listeners and not config.attach and not config.phyllo:
        raise ConfigError(f"{where}: no listeners and nothing attached: nothing to serve")
    check_metrics_path(config, where)


def check_auth(config: Config, where: str) -> None:
    """[[acl]] rules without [auth] would be silently ignored; a rule for a role needs a
    credential that carries roles."""
    if config.acl and not config.auth.enabled:
        raise ConfigError(f"{where}: acl: [[acl]] rules take effect with an [auth] table; add "
                          "[auth] (an empty one will do)")
    for number, listener in enumerate(config.listeners, 1):
        if listener.allow and not config.auth.enabled:
            raise ConfigError(f"{where}: listen[{number}].allow: takes effect with an [auth] "
                              "table; add [auth]")
    if not config.auth.takes_tokens:
        for number, rule in enumerate(config.acl, 1):
            if rule.role is not None:
                raise ConfigError(
                    f"{where}: acl[{number}].role: can never match: roles come only in JWT "
                    "claims, and [auth] takes no tokens (jwt_algorithms)"
                )


def check_metrics_path(config: Config, where: str) -> None:
    """The metrics path is served on every HTTP listener's port: no listener may sit there."""
    if not config.metrics.enabled:
        return
    metrics = config.metrics.path.rstrip("/") or "/"
    for number, listener in enumerate(config.listeners, 1):
        if listener.transport not in HTTP_TRANSPORTS or listener.path is None:
            path = None
        else:
            path = listener.path.rstrip("/") or "/"
        if path is not None and (path == metrics or path.startswith(metrics.rstrip("/") + "/")):
            raise ConfigError(
                f"{where}: listen[{number}].path: {listener.path} is where [metrics] path "
                f"{config.metrics.path} is served; move one of them"
            )


def _link_keys(values: dict[str, object]) -> dict[str, object]:
    """A link's keys as a file writes them: a fleet's two keys only for a fleet."""
    if not values.get("each_board"):
        values.pop("each_board", None)
        values.pop("max_boards", None)
    return values


def config_to_toml(config: Config) -> str:
    """`config` as TOML that `config_from_toml` reads back to an equal `Config`."""
    lines: list[str] = []

    def table(header: str, values: dict[str, Any]) -> None:
        lines.append(header)
        lines.extend(
            f"{key} = {toml_value(value)}" for key, value in values.items() if value is not None
        )
        lines.append("")

    for listener in config.listeners:
        table("[[listen]]", {key: value for key, value in asdict(listener).items()
                             if key != "allow" or value})
    if not config.listeners:
        lines.extend(["listen = []", ""])
    for link in config.attach:
        table("[[attach]]", _link_keys(asdict(link)))
    for phyllo in config.phyllo:
        table("[[phyllo]]", _link_keys(asdict(phyllo)))
    for rule in config.acl:
        table("[[acl]]", {key: value for key, value in asdict(rule).items() if value})
    for name, settings in config.tables.items():
        if name == "auth" and not settings.enabled:
            continue  # no [auth]: no authentication
        table(f"[{name}]", {key: getattr(settings, key) for key in table_readers(type(settings))})
    return "\n".join(lines)
