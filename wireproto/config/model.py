"""The run configuration of a broker, as values: listeners, attached links, Phyllo devices, and
one settings object per table.

The tables' classes are declared by the code each configures (`wireproto.config.tables` lists
them), so this module imports none of it: a `Config` looks its tables up when it is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

from wireproto.access import AccessRule
from wireproto.codecs.phyllo.chunks import MAX_CHUNK_LENGTH
from wireproto.redaction import redact_text

__all__ = [
    "ConfigError",
    "UBRE_ANNOUNCE",
    "Listener",
    "Attach",
    "PhylloLink",
    "DEFAULT_LISTENERS",
    "DEFAULT_MAX_BOARDS",
    "Config",
]

# A fleet table's bound on the boards it brings links up for: a hub of hostile or flapping
# USB devices must not grow links, timers and memory without end.
DEFAULT_MAX_BOARDS = 32


class ConfigError(ValueError):
    """A bad option or configuration file; the message says where and what is wrong. A file
    with several problems has them all in `problems`, one line each. A URL a problem repeats is
    shown without its credentials (`wireproto.redaction`): problems are printed."""

    def __init__(self, *problems: str) -> None:
        problems = tuple(redact_text(problem) for problem in problems)
        super().__init__("\n".join(problems))
        self.problems = list(problems)


ConfigError.__module__ = "wireproto.config"  # where users import it from, as tracebacks show it

# A UBRE listener's `announce`: the values wireproto.protocols.ubre.server.ANNOUNCE_MODES takes.
UBRE_ANNOUNCE = ("subscribed", "own")


@dataclass(frozen=True)
class Listener:
    """Serve `protocol` on a server endpoint string, over a WebSocket ("ws", at `path`),
    Engine.IO ("engineio", at `path`) or a framed stream ("length32", "lines" or "cobs")."""

    protocol: str
    transport: str
    endpoint: str
    path: str | None = None
    # With [auth]: how connections get their principal (wireproto.authentication.IDENTITIES;
    # None: credentials over HTTP, the certificate on mtls:, the uid on unix:, else anonymous),
    # or the one principal every connection here is.
    identity: str | None = None
    principal: str | None = None
    # With [auth]: the only principals (names, or "role:NAME") this listener admits; empty:
    # everyone the identity admits. Others get 403, or a stream is closed.
    allow: tuple[str, ...] = ()
    # UBRE only: which hub topics each connection is told of, "subscribed" (None: the default)
    # or "own" (UBRE_ANNOUNCE; docs/ubre.md).
    announce: str | None = None

    def describe(self) -> str:
        return f"{self.protocol} over {self.transport}"

    def connection_options(self) -> dict[str, Any]:
        """What this listener tells the protocol of each of its connections."""
        return {} if self.announce is None else {"announce": self.announce}


@dataclass(frozen=True)
class Attach:
    """Open a client endpoint (a serial device, or a TCP peer) and serve `protocol` on it in the
    server role, reopening it whenever it fails or closes."""

    protocol: str
    endpoint: str
    framing: str
    # With [auth]: the principal the link is (None: anonymous).
    principal: str | None = None
    # What names the link's boards (NAME.BOARD) when `each_board`; None: the protocol's name.
    name: str | None = None
    # One link per board `endpoint` matches (a serial:vid=... endpoint), at most `max_boards`.
    each_board: bool = False
    max_boards: int = DEFAULT_MAX_BOARDS
    # Where the link's topics are on the hub: its topic `t` is PREFIX/t (wireproto.hub.mount).
    # None or "": as they are; a fleet's board is mounted at PREFIX/BOARD, PREFIX being the
    # link's name when None, and not mounted when "".
    prefix: str | None = None

    @property
    def link_name(self) -> str:
        return self.name or self.protocol

    @property
    def fleet_prefix(self) -> str:
        """What a fleet's boards are mounted under ("": not mounted)."""
        return self.link_name if self.prefix is None else self.prefix

    def board_prefix(self, board: str) -> str | None:
        """Where a fleet's `board` has its topics on the hub (None: as they are)."""
        base = self.fleet_prefix
        return f"{base}/{board}" if base else None

    def describe(self) -> str:
        if self.each_board:
            mounted = self.board_prefix("BOARD")
            return (f"{self.protocol} over {self.framing}, one link per board (at most "
                    f"{self.max_boards}), each {self.link_name}.BOARD"
                    + (f" with hub topics {mounted}/..." if mounted else ""))
        if self.prefix:
            return f"{self.protocol} over {self.framing}, hub topics {self.prefix}/..."
        return f"{self.protocol} over {self.framing}"


@dataclass(frozen=True)
class PhylloLink:
    """A Phyllo device on a client address (``serial:``, ``tcp:``, ``ws://``...), reopened
    whenever it fails or closes, its topics bridged to the hub under `prefix`."""

    name: str
    endpoint: str
    stack: str = "reduced"
    prefix: str = ""
    send_format: str = "msgpack"
    # The longest chunk the device takes (phyllo-cpp's buffers; 80 suits an Arduino Uno).
    max_chunk_length: int = MAX_CHUNK_LENGTH
    # With [auth]: the principal the device is (None: anonymous).
    principal: str | None = None
    # One link per board `endpoint` matches (a serial:vid=... endpoint), at most `max_boards`:
    # link NAME.BOARD, hub topics PREFIX/BOARD/... (wireproto.service.fleet).
    each_board: bool = False
    max_boards: int = DEFAULT_MAX_BOARDS

    def describe(self) -> str:
        if self.each_board:
            return (f"phyllo fleet {self.name}: one link per board (at most {self.max_boards}), "
                    f"each {self.name}.BOARD ({self.stack} stack, hub topics "
                    f"{self.prefix}/BOARD/...)")
        return f"phyllo link {self.name} ({self.stack} stack, hub topics {self.prefix}/...)"


DEFAULT_LISTENERS = (
    Listener("websmq", "ws", "tcp:8765:interface=127.0.0.1", "/websmq"),
    Listener("websmq", "length32", "tcp:8766:interface=127.0.0.1"),
    Listener("ubre", "ws", "tcp:8765:interface=127.0.0.1", "/ubre"),
    Listener("ubre", "lines", "tcp:8767:interface=127.0.0.1"),
    Listener("nydus", "engineio", "tcp:8765:interface=127.0.0.1", "/engine.io/"),
    Listener("nydus", "lines", "tcp:8768:interface=127.0.0.1"),
    Listener("subble", "ws", "tcp:8765:interface=127.0.0.1", "/subble"),
    Listener("subble", "length32", "tcp:8769:interface=127.0.0.1"),
)


class Config:
    """A whole configuration: `listeners`, `attach`, `phyllo`, the access rules `acl`, and each
    table by name
    (``config.hub``, ``config.websocket``, ``config.ubre``...), defaults where none is given.

    Immutable; `replace` makes a changed copy. ``Config(hub=HubSettings(queue_bytes=4096))``
    sets one table and leaves the others at their defaults.
    """

    __slots__ = ("listeners", "attach", "phyllo", "acl", "tables")

    listeners: tuple[Listener, ...]
    attach: tuple[Attach, ...]
    phyllo: tuple[PhylloLink, ...]
    acl: tuple[AccessRule, ...]
    tables: Mapping[str, Any]

    def __init__(
        self,
        listeners: tuple[Listener, ...] = DEFAULT_LISTENERS,
        attach: tuple[Attach, ...] = (),
        phyllo: tuple[PhylloLink, ...] = (),
        acl: tuple[AccessRule, ...] = (),
        **tables: Any,
    ) -> None:
        from wireproto.config.tables import config_tables

        kinds = config_tables()
        unknown = sorted(set(tables) - set(kinds))
        if unknown:
            raise TypeError(f"unknown config tables {unknown}; the tables are {list(kinds)}")
        values = {name: tables[name] if name in tables else kind()
                  for name, kind in kinds.items()}
        object.__setattr__(self, "listeners", tuple(listeners))
        object.__setattr__(self, "attach", tuple(attach))
        object.__setattr__(self, "phyllo", tuple(phyllo))
        object.__setattr__(self, "acl", tuple(acl))
        object.__setattr__(self, "tables", MappingProxyType(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return object.__getattribute__(self, "tables")[name]
        except KeyError:
            raise AttributeError(f"no config table {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Config is immutable: use config.replace(...)")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return (self.listeners, self.attach, self.phyllo, self.acl, dict(self.tables)) == (
            other.listeners, other.attach, other.phyllo, other.acl, dict(other.tables))
    # With __eq__ and no __hash__, a Config is unhashable, as its tables may be.

    def __repr__(self) -> str:
        tables = ", ".join(f"{name}={value!r}" for name, value in self.tables.items())
        return (f"Config(listeners={self.listeners!r}, attach={self.attach!r}, "
                f"phyllo={self.phyllo!r}, acl={self.acl!r}, {tables})")

    def replace(self, **changes: Any) -> Config:
        """A copy with `changes`: listeners, attach, phyllo, acl or whole tables by name."""
        values: dict[str, Any] = {"listeners": self.listeners, "attach": self.attach,
                                  "phyllo": self.phyllo, "acl": self.acl, **self.tables}
        values.update(changes)
        return Config(**values)

    def protocol_options(self, protocol: str) -> dict[str, Any]:
        """`protocol`'s own table ([websmq], [ubre]...) as keyword values ({} if it has none)."""
        settings = self.tables.get(protocol)
        return asdict(settings) if settings is not None else {}
