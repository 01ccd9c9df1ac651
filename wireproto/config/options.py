"""The options of ``wireproto serve`` and ``twistd wireproto``, declared once, and the config they
make: `SERVE_OPTIONS` is the table both front ends build their parsers from, and `build_config`
joins a config file (or the defaults) with the options given.

Importing this module imports nothing else of wireproto, so the twistd plugin can build its
``--help`` from the table without loading the broker.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wireproto.config.model import Config

__all__ = [
    "ServeOption",
    "SERVE_OPTIONS",
    "add_serve_options",
    "twistd_option_lists",
    "config_from_options",
    "build_config",
]


@dataclass(frozen=True)
class ServeOption:
    """One option of `wireproto serve` and `twistd wireproto`."""

    name: str  # the long option, without dashes
    help: str
    metavar: str | None = None
    short: str | None = None  # a one-letter alias
    repeat: bool = False  # may be given many times: a list
    flag: bool = False  # takes no value
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


SERVE_OPTIONS = (
    ServeOption("listen", "serve a protocol on an endpoint (see below)", "SPEC", repeat=True),
    ServeOption("attach", "serve a protocol on a client endpoint, e.g. a serial port", "SPEC",
                repeat=True),
    ServeOption("phyllo", "bridge a Phyllo device (serial, TCP, ws://) to the hub", "SPEC",
                repeat=True),
    ServeOption("config", "TOML config file; options given here override it", "FILE", "c"),
    ServeOption("queue-bytes", "per-connection send queue limit in bytes (default 1048576)", "N",
                type=int),
    ServeOption("overflow", "when a send queue is full: drop its oldest messages (default) or "
                "disconnect that client", choices=("drop-oldest", "disconnect")),
    ServeOption("wildcards", "let WEBSMQ clients subscribe to MQTT-style patterns (+ and #)",
                flag=True),
    ServeOption("capture", "record every message in and out in capture files in DIR "
                "(docs/pipeline.md)", "DIR"),
    ServeOption("workers", "run N broker processes on the same listeners, one topic space "
                "through NATS (docs/cluster.md)", "N", type=int),
    ServeOption("app", "call FUNCTION of MODULE (./MODULE.py, or on the Python path) with the "
                "broker in each of its processes, before it starts, to register handlers "
                "(docs/embedding.md)", "MODULE:FUNCTION"),
)


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    """The table as argparse options."""
    for option in SERVE_OPTIONS:
        flags = [f"-{option.short}"] if option.short else []
        flags.append(f"--{option.name}")
        if option.flag:
            parser.add_argument(*flags, action="store_true", default=None, help=option.help)
        elif option.repeat:
            parser.add_argument(*flags, action="append", default=[], metavar=option.metavar,
                                help=option.help)
        else:
            parser.add_argument(*flags, metavar=option.metavar, type=option.type or str,
                                choices=option.choices, help=option.help)


def twistd_option_lists() -> tuple[list[list[Any]], list[list[Any]]]:
    """The table's single-valued options and flags as twisted.python.usage's optParameters and
    optFlags; the repeated ones are ``opt_NAME`` methods of the plugin's Options."""
    parameters: list[list[Any]] = []
    flags: list[list[Any]] = []
    for option in SERVE_OPTIONS:
        text = option.help[0].upper() + option.help[1:] + "."
        if option.flag:
            flags.append([option.name, option.short, text])
        elif not option.repeat:
            if option.choices:
                text = f"{text[:-1]}: {' or '.join(option.choices)}."
            parameters.append([option.name, option.short, None, text, option.type])
    return parameters, flags


def config_from_options(values: Mapping[str, Any], *, reactor: Any = None,
                        check_places: bool = False) -> Any:
    """`build_config` from parsed options, keyed by each option's `dest` or `name`."""
    def value(option: ServeOption) -> Any:
        found = values.get(option.dest, values.get(option.name))
        if option.repeat:
            return list(found or [])
        if option.flag:
            return bool(found) or None
        return found

    given = {option.dest: value(option) for option in SERVE_OPTIONS}
    given["config_file"] = given.pop("config")
    return build_config(**given, reactor=reactor, check_places=check_places)


def build_config(
    *,
    listen: Sequence[str] = (),
    attach: Sequence[str] = (),
    phyllo: Sequence[str] = (),
    config_file: str | Path | None = None,
    queue_bytes: int | None = None,
    overflow: str | None = None,
    wildcards: bool | None = None,
    capture: str | None = None,
    workers: int | None = None,
    app: str | None = None,
    reactor: Any = None,
    check_places: bool = False,
) -> Config:
    """The config for `wireproto serve` and `twistd wireproto`: the file (or the defaults), then
    the options. Listeners or links given as options replace the file's. A key or password file
    that its group or others may open is refused; with `check_places`, so is a place the broker
    would write but cannot (wireproto.config.files), as before starting it."""
    from wireproto.config.endpoints import default_reactor
    from wireproto.config.files import Place, place_problems, secret_file_problems
    from wireproto.config.forms import (
        Located,
        check_phyllo_links,
        check_shared_endpoints,
        parse_attach,
        parse_listen,
        parse_phyllo,
    )
    from wireproto.config.model import Config, ConfigError
    from wireproto.config.tables import app_setup
    from wireproto.config.toml import check_metrics_path, check_mounts, load_config
    from wireproto.settings import table_readers

    reactor = default_reactor(reactor)
    config = load_config(config_file, reactor=reactor) if config_file is not None else Config()
    if listen:
        listeners = tuple(parse_listen(spec, reactor=reactor) for spec in listen)
        labels = [f"--listen {spec!r}" for spec in listen]
        try:
            check_shared_endpoints(listeners, labels)
        except Located as problem:
            raise ConfigError(f"{labels[problem.index]}: {problem.message}") from None
        config = config.replace(listeners=listeners)
    if attach:
        links = tuple(parse_attach(spec, reactor=reactor) for spec in attach)
        config = config.replace(attach=links)
    if phyllo:
        phyllo_links = tuple(parse_phyllo(spec, reactor=reactor) for spec in phyllo)
        labels = [f"--phyllo {spec!r}" for spec in phyllo]
        try:
            check_phyllo_links(phyllo_links, labels)
        except Located as problem:
            raise ConfigError(f"{labels[problem.index]}: {problem.message}") from None
        config = config.replace(phyllo=phyllo_links)
    if phyllo and config_file is not None:  # the file's [[attach]] prefixes meet these links'
        check_mounts(config, str(config_file))
    hub = config.hub
    if queue_bytes is not None:
        if isinstance(queue_bytes, bool) or queue_bytes <= 0:
            raise ConfigError(
                f"--queue-bytes: must be a positive number of bytes, not {queue_bytes}"
            )
        hub = replace(hub, queue_bytes=queue_bytes)
    if overflow is not None:
        try:
            hub = replace(hub, overflow=table_readers(type(hub))["overflow"](overflow))
        except ValueError as error:
            raise ConfigError(f"--overflow: {error}") from None
    config = config.replace(hub=hub)
    if wildcards:
        config = config.replace(websmq=replace(config.websmq, wildcards=True))
    if capture is not None:
        if not capture:
            raise ConfigError("--capture: give a directory for the capture files")
        config = config.replace(capture=replace(config.capture, directory=capture))
    if workers is not None:
        from wireproto.cluster.settings import MAX_WORKERS

        if isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
            raise ConfigError(f"--workers: must be 1 to {MAX_WORKERS} processes, not {workers}")
        config = config.replace(cluster=replace(config.cluster, workers=workers))
    if app is not None:
        try:
            config = config.replace(app=replace(config.app, setup=app_setup(app)))
        except ValueError as error:
            raise ConfigError(f"--app {app!r}: {error}") from None
    check_metrics_path(config, "--listen" if listen else str(config_file or "the defaults"))
    given = {"listen": listen, "attach": attach, "phyllo": phyllo}

    def located(place: Place) -> str:
        """Where `place` was given: the option that named it, or the file's key."""
        specs = given.get(place.section)
        if specs and place.number is not None:
            return f"--{place.section} {specs[place.number - 1]!r}"
        if capture is not None and str(place) == "capture.directory":
            return "--capture"
        return f"{config_file}: {place}"

    problems = secret_file_problems(config)
    if check_places:
        problems += place_problems(config)
    if problems:
        raise ConfigError(*(f"{located(place)}: {problem}" for place, problem in problems))
    return config
