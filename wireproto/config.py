"""The run configuration of a wireproto broker: listeners, attached links, hub and transport limits.

One `Config` comes from command-line options, from a TOML file, or both (the command line wins),
and `wireproto.service.make_service` builds the running service from it. The syntax is described
in docs/running.md:

- ``--listen PROTOCOL+TRANSPORT[/PATH]@ENDPOINT``, e.g. ``websmq+ws@tcp:8765`` or
  ``websmq+length32@unix:/tmp/websmq.sock``: serve PROTOCOL on a Twisted server endpoint string;
- ``--attach PROTOCOL[+FRAMING]@CLIENT_ENDPOINT``, e.g. ``websmq@serial:/dev/ttyACM0``: open a
  client endpoint (a device on a serial line) and serve PROTOCOL on it in the server role;
- ``--phyllo NAME[+STACK]@ADDRESS``, e.g. ``dev1@serial:/dev/ttyACM0``: open a Phyllo device
  (serial, TCP or ``ws://``) and bridge its topics to the hub under ``phyllo/NAME/``;
- TOML: ``[[listen]]``, ``[[attach]]`` and ``[[phyllo]]`` tables with the same fields, and
  ``[hub]``, ``[websocket]``, ``[http]``, ``[stream]`` and one table per protocol (``[websmq]``).

Every problem is a `ConfigError` naming where it is (the option, or the file and key) and what is
wrong. ``tcp:`` and ``ssl:`` endpoints listen on 127.0.0.1 unless they name an interface, so a
broker is reachable from other machines only when someone asks for it.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from wireproto.capture import CONFIG_FILE_BYTES, DEFAULT_FILE_MODE, DEFAULT_MAX_FILE_BYTES
from wireproto.codecs.phyllo.chunks import MAX_CHUNK_LENGTH
from wireproto.hub import (
    DEFAULT_MAX_SUBSCRIPTION_BYTES,
    DEFAULT_MAX_SUBSCRIPTIONS,
    DEFAULT_MAX_TOPIC_LENGTH,
    DEFAULT_MAX_TOTAL_SUBSCRIPTION_BYTES,
    DEFAULT_QUEUE_BYTES,
    Overflow,
)
from wireproto.phyllo.bridge import SEND_FORMATS, hub_topic_error
from wireproto.phyllo.presets import PRESETS
from wireproto.protocols import SERVER_PROTOCOLS, ServerProtocolSpec
from wireproto.protocols.subble.registry import DEFAULT_NEW_IDS_PER_MINUTE, DEFAULT_REGISTRY_TTL
from wireproto.transports.connect import split_endpoint
from wireproto.transports.http import HTTPLimits
from wireproto.transports.stream import FRAMINGS
from wireproto.transports.websocket import WebSocketOptions

__all__ = [
    "ConfigError",
    "TRANSPORTS",
    "Listener",
    "Attach",
    "PhylloLink",
    "HubSettings",
    "StreamLimits",
    "WebsmqSettings",
    "UbreSettings",
    "NydusSettings",
    "SubbleSettings",
    "EngineIOSettings",
    "LogSettings",
    "MetricsSettings",
    "CaptureSettings",
    "Config",
    "DEFAULT_LISTENERS",
    "parse_listen",
    "parse_attach",
    "parse_phyllo",
    "load_config",
    "config_from_toml",
    "config_to_toml",
    "build_config",
    "endpoint_type",
    "is_ephemeral",
    "with_default_interface",
]

TRANSPORTS = ("ws", "engineio", *FRAMINGS)
# Served by a twisted.web Site, each at its path: listeners of these share an endpoint.
HTTP_TRANSPORTS = ("ws", "engineio")
ENGINEIO_PATH = "/engine.io/"
LISTEN_SYNTAX = "PROTOCOL+TRANSPORT[/PATH]@ENDPOINT, e.g. websmq+ws@tcp:8765"
ATTACH_SYNTAX = "PROTOCOL[+FRAMING]@CLIENT_ENDPOINT, e.g. websmq@serial:/dev/ttyACM0"
PHYLLO_SYNTAX = "NAME[+STACK]@ADDRESS, e.g. dev1@serial:/dev/ttyACM0 or dev1+minimal@tcp:host:2000"


class ConfigError(ValueError):
    """A bad option or configuration file; the message says where and what is wrong. A file
    with several problems has them all in `problems`, one line each."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Listener:
    """Serve `protocol` on a server endpoint string, over a WebSocket ("ws", at `path`) or a
    framed stream ("length32", "lines" or "cobs")."""

    protocol: str
    transport: str
    endpoint: str
    path: str | None = None

    def describe(self) -> str:
        return f"{self.protocol} over {self.transport}"


@dataclass(frozen=True)
class Attach:
    """Open a client endpoint (a serial device, or a TCP peer) and serve `protocol` on it in the
    server role, reopening it whenever it fails or closes."""

    protocol: str
    endpoint: str
    framing: str

    def describe(self) -> str:
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

    def describe(self) -> str:
        return f"phyllo link {self.name} ({self.stack} stack, hub topics {self.prefix}/...)"


@dataclass(frozen=True)
class HubSettings:
    queue_bytes: int = DEFAULT_QUEUE_BYTES
    overflow: str = Overflow.DROP_OLDEST.value
    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS
    max_topic_length: int = DEFAULT_MAX_TOPIC_LENGTH
    max_subscription_bytes: int = DEFAULT_MAX_SUBSCRIPTION_BYTES
    max_total_subscription_bytes: int = DEFAULT_MAX_TOTAL_SUBSCRIPTION_BYTES


@dataclass(frozen=True)
class StreamLimits:
    """Limits for every framed-stream listener and attached link (the framing is per listener)."""

    max_message_size: int = 1 << 20
    max_connections: int = 10_000
    keepalive_idle: float = 30.0
    keepalive_interval: float = 10.0
    keepalive_count: int = 3
    idle_timeout: float = 0.0


@dataclass(frozen=True)
class WebsmqSettings:
    # MQTT-style `+` and `#` subscriptions: an extension to the spec, so off unless asked for.
    wildcards: bool = False


@dataclass(frozen=True)
class UbreSettings:
    # Tell each client which topics have subscribers: ubre.js publishes only on those.
    announce_topics: bool = True
    max_topic_length: int = 1024
    # Requests from one connection that its handlers may work on at once.
    max_pending_requests: int = 1000
    # For requests the server sends to a client.
    request_timeout: float = 30.0
    # Failed handlers' stacks go to the client: for development only.
    debug: bool = False


@dataclass(frozen=True)
class NydusSettings:
    # Failed handlers' messages and stacks go to the client (nydus's development mode).
    debug: bool = False
    # Invokes from one connection that its handlers may work on at once; more get 429.
    max_pending_invokes: int = 1000
    # /_hub/subscribe, /_hub/unsubscribe and /_hub/publish, for clients of a plain broker.
    hub_routes: bool = True


@dataclass(frozen=True)
class SubbleSettings:
    # An empty client ID gets a new one (code 3); false refuses it (code 11).
    allow_new_clients: bool = True
    # Only IDs in the registry may connect (code 12 for others).
    enforce_registry: bool = False
    # The registry's sqlite file, so clients come back after a restart; "" keeps it in memory.
    registry: str = ""
    # IDs not seen for this long are forgotten (seconds; 0 never). Not with enforce_registry.
    registry_ttl: float = DEFAULT_REGISTRY_TTL
    # The registry file's permissions.
    registry_mode: int = 0o600
    # New client IDs one address may have the registry take, per minute (then code 25).
    new_ids_per_minute: int = DEFAULT_NEW_IDS_PER_MINUTE
    # Peer addresses, as CIDR: deny wins; with an allow list only those connect (code 10).
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineIOSettings:
    """Engine.IO 4 for every engineio listener; the defaults are engine.io 6's."""

    ping_interval: float = 25.0
    ping_timeout: float = 20.0
    max_payload: int = 1_000_000
    max_connections: int = 10_000
    max_sessions_per_address: int = 100
    first_request_timeout: float = 10.0


LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_FORMATS = ("text", "json")


@dataclass(frozen=True)
class LogSettings:
    """What the broker logs, and where: `file` "" is stderr."""

    level: str = "warn"
    format: str = "text"
    file: str = ""


@dataclass(frozen=True)
class MetricsSettings:
    """Prometheus metrics, served on every HTTP listener's port at `path`."""

    enabled: bool = True
    path: str = "/metrics"

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"path {self.path!r} must start with '/'")


@dataclass(frozen=True)
class CaptureSettings:
    """Capture files (wireproto.capture) of every message in and out: `directory` "" is off."""

    directory: str = ""
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # 128 MiB
    flush_interval: float = 0.5
    # Capture files' permissions: the owner's alone unless set otherwise.
    file_mode: int = DEFAULT_FILE_MODE


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


@dataclass(frozen=True)
class Config:
    listeners: tuple[Listener, ...] = DEFAULT_LISTENERS
    attach: tuple[Attach, ...] = ()
    phyllo: tuple[PhylloLink, ...] = ()
    hub: HubSettings = field(default_factory=HubSettings)
    websocket: WebSocketOptions = field(default_factory=WebSocketOptions)
    http: HTTPLimits = field(default_factory=HTTPLimits)
    stream: StreamLimits = field(default_factory=StreamLimits)
    websmq: WebsmqSettings = field(default_factory=WebsmqSettings)
    ubre: UbreSettings = field(default_factory=UbreSettings)
    nydus: NydusSettings = field(default_factory=NydusSettings)
    subble: SubbleSettings = field(default_factory=SubbleSettings)
    engineio: EngineIOSettings = field(default_factory=EngineIOSettings)
    log: LogSettings = field(default_factory=LogSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    capture: CaptureSettings = field(default_factory=CaptureSettings)

    def protocol_options(self, protocol: str) -> dict[str, Any]:
        """The keyword options for `protocol`'s make_factory (its own TOML table)."""
        settings = getattr(self, protocol, None)
        return asdict(settings) if settings is not None else {}


# -- endpoint strings -----------------------------------------------------------------------------


def endpoint_type(endpoint: str) -> str:
    """The endpoint string's type, lower case: 'tcp', 'ssl', 'unix', 'serial', ..."""
    args, _ = split_endpoint(endpoint)
    return args[0].lower() if args else ""


# Loopback unless an interface is named: a broker must not be reachable from elsewhere by accident.
_LOOPBACK = {"tcp": "127.0.0.1", "ssl": "127.0.0.1", "tcp6": "\\:\\:1"}


def with_default_interface(endpoint: str) -> str:
    """`endpoint`, plus ``interface=`` loopback if it is a tcp:, ssl: or tcp6: naming none."""
    args, kwargs = split_endpoint(endpoint)
    kind = args[0].lower() if args else ""
    loopback = _LOOPBACK.get(kind)
    # tcp:PORT:INTERFACE names it positionally; ssl: and tcp6: take only the keyword.
    if loopback is None or "interface" in kwargs or (kind == "tcp" and len(args) > 2):
        return endpoint
    return f"{endpoint}:interface={loopback}"


def _endpoint_problem(error: Exception) -> str:
    text = str(error) or type(error).__name__
    # "_parseTCP() got an unexpected keyword argument 'x'" reads better without the function name.
    head, _, rest = text.partition("() ")
    if rest and head.replace("_", "").replace(".", "").isalnum():
        text = rest
    return text


def _check_server_endpoint(endpoint: str, reactor: Any) -> None:
    from twisted.internet.endpoints import serverFromString

    try:
        serverFromString(reactor, endpoint)
    except Exception as error:
        raise _Invalid(
            "endpoint", f"bad server endpoint {endpoint!r}: {_endpoint_problem(error)}"
        ) from None
    problem = _address_problem(endpoint)
    if problem is not None:
        raise _Invalid("endpoint", f"bad server endpoint {endpoint!r}: {problem}")


def _address_problem(endpoint: str) -> str | None:
    """What can be seen wrong with a tcp:, ssl: or tcp6: server endpoint's port and interface
    without binding it (Twisted takes tcp:70000 and interface=nonsense until it binds)."""
    args, kwargs = split_endpoint(endpoint)
    kind = args[0].lower() if args else ""
    if kind not in ("tcp", "ssl", "tcp6"):
        return None
    port = kwargs.get("port", args[1] if len(args) > 1 else "")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        return f"port {port!r} is not 0 to 65535"
    interface = kwargs.get("interface", args[2] if kind == "tcp" and len(args) > 2 else None)
    if interface is not None:
        try:
            ipaddress.ip_address(interface)
        except ValueError:
            return f"interface {interface!r} is not an IP address (0.0.0.0, ::, 127.0.0.1...)"
    return None


def _check_client_endpoint(endpoint: str, reactor: Any) -> None:
    from twisted.internet.endpoints import clientFromString

    from wireproto.transports.serial import serial_endpoint_from_string

    try:
        # serial: is parsed directly too, so it works even where Twisted's plugin scan does not.
        if endpoint_type(endpoint) == "serial":
            serial_endpoint_from_string(reactor, endpoint)
        else:
            clientFromString(reactor, endpoint)
    except Exception as error:
        raise _Invalid(
            "endpoint", f"bad client endpoint {endpoint!r}: {_endpoint_problem(error)}"
        ) from None


def _default_reactor(reactor: Any) -> Any:
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        return global_reactor
    return reactor


# -- checking one listener or link ----------------------------------------------------------------


class _Invalid(Exception):
    """One problem with one key; the caller says where the key came from."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


def _one_of(values: Iterable[str]) -> str:
    values = list(values)
    if len(values) == 1:
        return values[0]
    return ", ".join(values[:-1]) + " or " + values[-1]


def _protocol_spec(name: str) -> ServerProtocolSpec:
    spec = SERVER_PROTOCOLS.get(name)
    if spec is None:
        raise _Invalid("protocol", f"unknown protocol {name!r}; use {_one_of(SERVER_PROTOCOLS)}")
    return spec


def _check_listener(
    protocol: str, transport: str, endpoint: str, path: str | None, reactor: Any
) -> Listener:
    spec = _protocol_spec(protocol)
    if transport not in TRANSPORTS:
        raise _Invalid(
            "transport", f"unknown transport {transport!r}; use {_one_of(TRANSPORTS)}"
        )
    if transport not in spec.transports:
        allowed = [name for name in TRANSPORTS if name in spec.transports]
        raise _Invalid(
            "transport", f"{protocol} does not run over {transport}; use {_one_of(allowed)}"
        )
    if not endpoint:
        raise _Invalid("endpoint", "no endpoint given, e.g. tcp:8765")
    endpoint = with_default_interface(endpoint)
    _check_server_endpoint(endpoint, reactor)
    if transport in HTTP_TRANSPORTS:
        if path is None:
            path = ENGINEIO_PATH if transport == "engineio" else spec.default_path
        if not path.startswith("/"):
            raise _Invalid("path", f"path {path!r} must start with '/'")
        if transport == "engineio" and not path.endswith("/"):
            path += "/"  # engine.io's paths end with a slash, and its clients ask for one
    elif path is not None:
        raise _Invalid("path", f"a path is only for ws and engineio listeners, not {transport}")
    return Listener(protocol, transport, endpoint, path)


def _check_attach(protocol: str, endpoint: str, framing: str | None, reactor: Any) -> Attach:
    spec = _protocol_spec(protocol)
    if not endpoint:
        raise _Invalid("endpoint", "no endpoint given, e.g. serial:/dev/ttyACM0")
    if framing is None:
        # Serial links carry COBS (a zero byte ends every frame, so a receiver can resynchronise).
        framing = "cobs" if endpoint_type(endpoint) == "serial" else spec.default_framing
    allowed = [name for name in FRAMINGS if name in spec.transports]
    if framing == "ws":
        raise _Invalid(
            "framing", f"an attached link needs a framing, not ws; use {_one_of(allowed)}"
        )
    if framing not in FRAMINGS:
        raise _Invalid("framing", f"unknown framing {framing!r}; use {_one_of(FRAMINGS)}")
    if framing not in spec.transports:
        raise _Invalid("framing", f"{protocol} does not run over {framing}; use {_one_of(allowed)}")
    _check_client_endpoint(endpoint, reactor)
    return Attach(protocol, endpoint, framing)


def _check_phyllo(
    name: str, endpoint: str, stack: str | None, prefix: str | None, send_format: str | None,
    reactor: Any, max_chunk_length: int = MAX_CHUNK_LENGTH,
) -> PhylloLink:
    if not name or not all(char.isalnum() or char in "-_." for char in name):
        raise _Invalid(
            "name", f"a Phyllo link name is letters, digits, '-', '_' and '.', not {name!r}"
        )
    if not endpoint:
        raise _Invalid("endpoint", "no endpoint given, e.g. serial:/dev/ttyACM0")
    if endpoint.lower().startswith(("ws://", "wss://")):
        from autobahn.websocket.util import parse_url

        try:
            parse_url(endpoint)
        except Exception as error:  # Autobahn raises bare Exception for a bad URL
            raise _Invalid("endpoint", f"bad WebSocket URL {endpoint!r}: {error}") from None
    else:
        _check_client_endpoint(endpoint, reactor)
    stack = stack or "reduced"
    if stack not in PRESETS:
        raise _Invalid(
            "stack", f"unknown Phyllo stack {stack!r}; use {_one_of(PRESETS)} (the "
            "standard stack, with the reliable buffer, is not implemented)"
        )
    prefix = f"phyllo/{name}" if prefix is None else prefix.rstrip("/")
    problem = hub_topic_error(prefix)
    if problem is not None:
        raise _Invalid("prefix", f"prefix {prefix!r} cannot be a hub topic: {problem}")
    send_format = send_format or "msgpack"
    if send_format not in SEND_FORMATS:
        raise _Invalid(
            "send_format", f"unknown send_format {send_format!r}; use {_one_of(SEND_FORMATS)}"
        )
    if not 16 <= max_chunk_length <= MAX_CHUNK_LENGTH:
        raise _Invalid(
            "max_chunk_length", f"must be 16 to {MAX_CHUNK_LENGTH} bytes, not {max_chunk_length}"
        )
    return PhylloLink(name, endpoint, stack, prefix, send_format, max_chunk_length)


def _check_phyllo_links(links: Sequence[PhylloLink], labels: Sequence[str]) -> None:
    """Names and prefixes are unique, and no prefix lies under another's."""
    for index, link in enumerate(links):
        for first in range(index):
            other = links[first]
            if other.name == link.name:
                raise _Located(index, "name", f"{link.name!r} is already the name of "
                               f"{labels[first]}")
            nested = (f"{link.prefix}/".startswith(f"{other.prefix}/")
                      or f"{other.prefix}/".startswith(f"{link.prefix}/"))
            if nested:
                raise _Located(index, "prefix", f"prefix {link.prefix!r} overlaps "
                               f"{labels[first]}'s {other.prefix!r}")


def is_ephemeral(endpoint: str) -> bool:
    """True for a tcp:/ssl:/tcp6: endpoint on port 0, which gets a fresh port each time."""
    args, kwargs = split_endpoint(endpoint)
    if not args or args[0].lower() not in _LOOPBACK:
        return False
    port = kwargs.get("port", args[1] if len(args) > 1 else None)
    return port is not None and port.strip() == "0"


def _check_shared_endpoints(listeners: Sequence[Listener], labels: Sequence[str]) -> None:
    """Only ws and engineio listeners may share an endpoint (one site, one path each). A stream
    listener on port 0 is never shared: it gets a port of its own."""
    owners: dict[str, int] = {}
    paths: dict[tuple[str, str | None], int] = {}
    for index, listener in enumerate(listeners):
        websocket = listener.transport in HTTP_TRANSPORTS
        if not websocket and is_ephemeral(listener.endpoint):
            continue
        first = owners.setdefault(listener.endpoint, index)
        other = listeners[first]
        if first != index and not (websocket and other.transport in HTTP_TRANSPORTS):
            raise _Located(
                index, "endpoint",
                f"{listener.endpoint} is already used by {labels[first]} "
                f"({other.describe()}); only ws and engineio listeners may share an endpoint",
            )
        if websocket:
            same_path = paths.setdefault((listener.endpoint, listener.path), index)
            if same_path != index:
                raise _Located(
                    index, "path",
                    f"{listener.path} on {listener.endpoint} is already served by "
                    f"{labels[same_path]}",
                )


class _Located(Exception):
    def __init__(self, index: int, key: str, message: str) -> None:
        super().__init__(message)
        self.index, self.key, self.message = index, key, message


# -- the command-line forms -----------------------------------------------------------------------


def _split_spec(spec: str, option: str, syntax: str) -> tuple[str, str | None, str]:
    """'A+B@C' -> ('A', 'B', 'C'); 'A@C' -> ('A', None, 'C')."""
    head, at, endpoint = spec.partition("@")
    if not at:
        raise ConfigError(f"{option} {spec!r}: no '@' before the endpoint; use {syntax}")
    protocol, plus, rest = head.partition("+")
    if not protocol:
        raise ConfigError(f"{option} {spec!r}: no protocol before '+'/'@'; use {syntax}")
    return protocol, rest if plus else None, endpoint


def parse_listen(spec: str, *, reactor: Any = None) -> Listener:
    """A `Listener` from ``PROTOCOL+TRANSPORT[/PATH]@ENDPOINT``.

    ``websmq+ws@tcp:8765`` serves WEBSMQ over WebSocket at its default path (/websmq) on
    127.0.0.1:8765; ``websmq+ws/mq/v1@tcp:8765`` at /mq/v1; ``websmq+cobs@unix:/tmp/mq.sock``
    over COBS-framed unix sockets.
    """
    protocol, transport_path, endpoint = _split_spec(spec, "--listen", LISTEN_SYNTAX)
    if transport_path is None:
        raise ConfigError(
            f"--listen {spec!r}: no transport; use {LISTEN_SYNTAX} "
            f"(transports: {_one_of(TRANSPORTS)})"
        )
    transport, slash, path = transport_path.partition("/")
    try:
        return _check_listener(
            protocol, transport, endpoint, slash + path if slash else None,
            _default_reactor(reactor),
        )
    except _Invalid as problem:
        raise ConfigError(f"--listen {spec!r}: {problem.message}") from None


def parse_attach(spec: str, *, reactor: Any = None) -> Attach:
    """An `Attach` from ``PROTOCOL[+FRAMING]@CLIENT_ENDPOINT``; the framing defaults to cobs
    for ``serial:`` and to the protocol's default framing (length32) otherwise."""
    protocol, framing, endpoint = _split_spec(spec, "--attach", ATTACH_SYNTAX)
    try:
        return _check_attach(protocol, endpoint, framing, _default_reactor(reactor))
    except _Invalid as problem:
        raise ConfigError(f"--attach {spec!r}: {problem.message}") from None


def parse_phyllo(spec: str, *, reactor: Any = None) -> PhylloLink:
    """A `PhylloLink` from ``NAME[+STACK]@ADDRESS``: ``dev1@serial:/dev/ttyACM0`` bridges the
    device's topics to ``phyllo/dev1/...`` over the reduced stack."""
    name, stack, endpoint = _split_spec(spec, "--phyllo", PHYLLO_SYNTAX)
    try:
        return _check_phyllo(name, endpoint, stack, None, None, _default_reactor(reactor))
    except _Invalid as problem:
        raise ConfigError(f"--phyllo {spec!r}: {problem.message}") from None


# -- TOML -----------------------------------------------------------------------------------------


def _unknown_key(key: str, known: Iterable[str]) -> str:
    known = list(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.7) or [
        name for name in known if name.startswith(key)
    ]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key; use {_one_of(known)}{hint}"


def _shown(value: Any) -> str:
    """A value as the TOML file spells it (true, "text"), for error messages."""
    try:
        return _toml_value(value)
    except TypeError:
        return repr(value)


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {_shown(value)}")
    return value


def _positive_integer(value: Any) -> int:
    if _integer(value) <= 0:
        raise ValueError(f"must be a positive integer, not {value}")
    return value


def _positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number of seconds, got {_shown(value)}")
    if value <= 0:
        raise ValueError(f"must be positive, not {value}")
    return float(value)


def _seconds_or_never(value: Any) -> float:
    """Seconds, or 0 for never."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"expected a number of seconds (0: never), got {_shown(value)}")
    return float(value)


def _file_mode(value: Any) -> int:
    """File permissions, written in TOML as an octal integer: 0o600."""
    if not 0 <= _integer(value) <= 0o777:
        raise ValueError(f"expected permissions such as 0o600, got {value}")
    if not value & 0o600 == 0o600:
        raise ValueError(f"0o{value:o} does not let the broker read and write its own file")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {_shown(value)}")
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_shown(value)}")
    return value


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"expected a list of strings, got {_shown(value)}")
    return tuple(value)


def _networks(value: Any) -> tuple[str, ...]:
    """A list of CIDR networks (a bare address is a network of one)."""
    networks = _strings(value)
    for network in networks:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise ValueError(
                f"{_shown(network)} is not an IP network; write one as 10.0.0.0/8 or ::1"
            ) from None
    return networks


def _choice(choices: Sequence[str], noun: str = "value") -> Callable[[Any], str]:
    """A reader that takes one of `choices`; the error calls a wrong one an unknown `noun`."""
    def read(value: Any) -> str:
        value = _string(value)
        if value not in choices:
            raise ValueError(f"unknown {noun} {_shown(value)}; use {_one_of(choices)}")
        return value

    return read


_overflow = _choice([policy.value for policy in Overflow], "policy")


# Each table's keys and how to read each value. TOML has no null: leave an optional key out.
_HUB_KEYS: dict[str, Callable[[Any], Any]] = {
    "queue_bytes": _positive_integer,
    "overflow": _overflow,
    "max_subscriptions": _positive_integer,
    "max_topic_length": _positive_integer,
    "max_subscription_bytes": _positive_integer,
    "max_total_subscription_bytes": _positive_integer,
}
_WEBSOCKET_KEYS: dict[str, Callable[[Any], Any]] = {
    "max_message_size": _positive_integer,
    "open_handshake_timeout": _positive_number,
    "close_handshake_timeout": _positive_number,
    "auto_ping_interval": _seconds_or_never,
    "auto_ping_timeout": _seconds_or_never,
    "allowed_origins": _strings,
    "per_message_deflate": _boolean,
    "max_connections": _positive_integer,
}
_HTTP_KEYS: dict[str, Callable[[Any], Any]] = {
    "max_body_bytes": _positive_integer,
    "request_timeout": _positive_number,
    "max_pending_per_address": _positive_integer,
    "max_pending": _positive_integer,
}
_STREAM_KEYS: dict[str, Callable[[Any], Any]] = {
    "max_message_size": _positive_integer,
    "max_connections": _positive_integer,
    "keepalive_idle": _seconds_or_never,
    "keepalive_interval": _positive_number,
    "keepalive_count": _positive_integer,
    "idle_timeout": _seconds_or_never,
}
_WEBSMQ_KEYS: dict[str, Callable[[Any], Any]] = {"wildcards": _boolean}
_UBRE_KEYS: dict[str, Callable[[Any], Any]] = {
    "announce_topics": _boolean,
    "max_topic_length": _positive_integer,
    "max_pending_requests": _positive_integer,
    "request_timeout": _positive_number,
    "debug": _boolean,
}
_NYDUS_KEYS: dict[str, Callable[[Any], Any]] = {
    "debug": _boolean,
    "max_pending_invokes": _positive_integer,
    "hub_routes": _boolean,
}
_SUBBLE_KEYS: dict[str, Callable[[Any], Any]] = {
    "allow_new_clients": _boolean,
    "enforce_registry": _boolean,
    "registry": _string,
    "registry_ttl": _seconds_or_never,
    "registry_mode": _file_mode,
    "new_ids_per_minute": _positive_integer,
    "allow": _networks,
    "deny": _networks,
}
_ENGINEIO_KEYS: dict[str, Callable[[Any], Any]] = {
    "ping_interval": _positive_number,
    "ping_timeout": _positive_number,
    "max_payload": _positive_integer,
    "max_connections": _positive_integer,
    "max_sessions_per_address": _positive_integer,
    "first_request_timeout": _positive_number,
}
_LOG_KEYS: dict[str, Callable[[Any], Any]] = {
    "level": _choice(LOG_LEVELS),
    "format": _choice(LOG_FORMATS),
    "file": _string,
}
_METRICS_KEYS: dict[str, Callable[[Any], Any]] = {
    "enabled": _boolean,
    "path": _string,
}
def _capture_file_bytes(value: Any) -> int:
    low, high = CONFIG_FILE_BYTES  # 64 to 256 MiB: files small enough to give Spark many tasks
    if not low <= _integer(value) <= high:
        raise ValueError(f"must be {low} to {high} bytes (64 to 256 MiB), not {value}")
    return value


_CAPTURE_KEYS: dict[str, Callable[[Any], Any]] = {
    "directory": _string,
    "max_file_bytes": _capture_file_bytes,
    "flush_interval": _positive_number,
    "file_mode": _file_mode,
}
_LISTEN_KEYS = ("protocol", "transport", "endpoint", "path")
_ATTACH_KEYS = ("protocol", "endpoint", "framing")
_PHYLLO_KEYS = ("name", "endpoint", "stack", "prefix", "send_format", "max_chunk_length")
_TABLES: dict[str, tuple[type, dict[str, Callable[[Any], Any]]]] = {
    "hub": (HubSettings, _HUB_KEYS),
    "websocket": (WebSocketOptions, _WEBSOCKET_KEYS),
    "http": (HTTPLimits, _HTTP_KEYS),
    "stream": (StreamLimits, _STREAM_KEYS),
    "websmq": (WebsmqSettings, _WEBSMQ_KEYS),
    "ubre": (UbreSettings, _UBRE_KEYS),
    "nydus": (NydusSettings, _NYDUS_KEYS),
    "subble": (SubbleSettings, _SUBBLE_KEYS),
    "engineio": (EngineIOSettings, _ENGINEIO_KEYS),
    "log": (LogSettings, _LOG_KEYS),
    "metrics": (MetricsSettings, _METRICS_KEYS),
    "capture": (CaptureSettings, _CAPTURE_KEYS),
}
_TOP_KEYS = ("listen", "attach", "phyllo", *_TABLES)


def _read_table(
    where: str, name: str, table: Any, kind: type, readers: dict[str, Callable[[Any], Any]]
) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: {name}: expected a table ([{name}]), got {_shown(table)}")
    values = {}
    problems = []
    for key, value in table.items():
        reader = readers.get(key)
        if reader is None:
            problems.append(f"{where}: {name}.{key}: {_unknown_key(key, readers)}")
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
            f"{where}: {name}: expected [[{name}]] tables or a list of strings, got {_shown(value)}"
        )
    return value


def _read_listener(where: str, label: str, entry: Any, reactor: Any) -> Listener:
    if isinstance(entry, str):
        try:
            return parse_listen(entry, reactor=reactor)
        except ConfigError as error:
            raise ConfigError(f"{where}: {label}: {str(error).removeprefix('--listen ')}") from None
    values = _string_fields(where, label, entry, _LISTEN_KEYS, required=("protocol", "transport",
                                                                          "endpoint"))
    try:
        return _check_listener(
            values["protocol"], values["transport"], values["endpoint"], values.get("path"),
            reactor,
        )
    except _Invalid as problem:
        raise ConfigError(f"{where}: {label}.{problem.key}: {problem.message}") from None


def _read_attach(where: str, label: str, entry: Any, reactor: Any) -> Attach:
    if isinstance(entry, str):
        try:
            return parse_attach(entry, reactor=reactor)
        except ConfigError as error:
            raise ConfigError(f"{where}: {label}: {str(error).removeprefix('--attach ')}") from None
    values = _string_fields(where, label, entry, _ATTACH_KEYS, required=("protocol", "endpoint"))
    try:
        return _check_attach(
            values["protocol"], values["endpoint"], values.get("framing"), reactor
        )
    except _Invalid as problem:
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
            max_chunk_length = _integer(entry.pop("max_chunk_length"))
        except ValueError as error:
            raise ConfigError(f"{where}: {label}.max_chunk_length: {error}") from None
    else:
        max_chunk_length = MAX_CHUNK_LENGTH
    values = _string_fields(where, label, entry, _PHYLLO_KEYS, required=("name", "endpoint"))
    try:
        return _check_phyllo(
            values["name"], values["endpoint"], values.get("stack"), values.get("prefix"),
            values.get("send_format"), reactor, max_chunk_length,
        )
    except _Invalid as problem:
        raise ConfigError(f"{where}: {label}.{problem.key}: {problem.message}") from None


def _string_fields(
    where: str, label: str, entry: Any, keys: Sequence[str], required: Sequence[str]
) -> dict[str, str]:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: {label}: expected a table or a string, got {_shown(entry)}")
    for key, value in entry.items():
        if key not in keys:
            raise ConfigError(f"{where}: {label}.{key}: {_unknown_key(key, keys)}")
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {label}.{key}: expected a string, got {_shown(value)}")
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
        except _Located as problem:
            raise ConfigError(
                f"{source}: {labels[problem.index]}.{problem.key}: {problem.message}"
            ) from None
    return tuple(items)


def config_from_toml(text: str, *, source: str = "<toml>", reactor: Any = None) -> Config:
    """A `Config` from TOML text; `source` names it in error messages."""
    reactor = _default_reactor(reactor)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML: {error}") from None
    # Every problem in the file is reported, not only the first.
    problems = [f"{source}: {key}: {_unknown_key(key, _TOP_KEYS)}"
                for key in document if key not in _TOP_KEYS]
    sections: dict[str, Any] = {}

    def read(field_name: str, reading: Callable[[], Any]) -> None:
        try:
            sections[field_name] = reading()
        except ConfigError as error:
            problems.extend(error.problems)

    if "listen" in document:
        read("listeners", lambda: _read_list(source, "listen", document["listen"],
                                             _read_listener, _check_shared_endpoints, reactor))
    if "attach" in document:
        read("attach", lambda: _read_list(source, "attach", document["attach"], _read_attach,
                                          None, reactor))
    if "phyllo" in document:
        read("phyllo", lambda: _read_list(source, "phyllo", document["phyllo"], _read_phyllo,
                                          _check_phyllo_links, reactor))
    for name, (kind, readers) in _TABLES.items():
        if name in document:
            read(name, lambda name=name, kind=kind, readers=readers: _read_table(
                source, name, document[name], kind, readers))
    if problems:
        raise ConfigError(*problems)
    config = replace(Config(), **sections)
    _check_something_to_do(config, source)
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


def _check_something_to_do(config: Config, where: str) -> None:
    if not config.listeners and not config.attach and not config.phyllo:
        raise ConfigError(f"{where}: no listeners and nothing attached: nothing to serve")
    _check_metrics_path(config, where)


def _check_metrics_path(config: Config, where: str) -> None:
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


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # A TOML basic string is a JSON string for everything this config holds.
        return json.dumps(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def config_to_toml(config: Config) -> str:
    """`config` as TOML that `config_from_toml` reads back to an equal `Config`."""
    lines: list[str] = []

    def table(header: str, values: dict[str, Any]) -> None:
        lines.append(header)
        lines.extend(
            f"{key} = {_toml_value(value)}" for key, value in values.items() if value is not None
        )
        lines.append("")

    for listener in config.listeners:
        table("[[listen]]", asdict(listener))
    if not config.listeners:
        lines.extend(["listen = []", ""])
    for link in config.attach:
        table("[[attach]]", asdict(link))
    for phyllo in config.phyllo:
        table("[[phyllo]]", asdict(phyllo))
    for name in _TABLES:
        settings = getattr(config, name)
        table(f"[{name}]", {item.name: getattr(settings, item.name) for item in fields(settings)})
    return "\n".join(lines)


# -- command line and file together ---------------------------------------------------------------


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
    reactor: Any = None,
) -> Config:
    """The config for `wireproto serve` and `twistd wireproto`: the file (or the defaults), then
    the options. Listeners or links given as options replace the file's."""
    reactor = _default_reactor(reactor)
    config = load_config(config_file, reactor=reactor) if config_file is not None else Config()
    if listen:
        listeners = tuple(parse_listen(spec, reactor=reactor) for spec in listen)
        labels = [f"--listen {spec!r}" for spec in listen]
        try:
            _check_shared_endpoints(listeners, labels)
        except _Located as problem:
            raise ConfigError(f"{labels[problem.index]}: {problem.message}") from None
        config = replace(config, listeners=listeners)
    if attach:
        links = tuple(parse_attach(spec, reactor=reactor) for spec in attach)
        config = replace(config, attach=links)
    if phyllo:
        phyllo_links = tuple(parse_phyllo(spec, reactor=reactor) for spec in phyllo)
        labels = [f"--phyllo {spec!r}" for spec in phyllo]
        try:
            _check_phyllo_links(phyllo_links, labels)
        except _Located as problem:
            raise ConfigError(f"{labels[problem.index]}: {problem.message}") from None
        config = replace(config, phyllo=phyllo_links)
    hub = config.hub
    if queue_bytes is not None:
        if isinstance(queue_bytes, bool) or queue_bytes <= 0:
            raise ConfigError(
                f"--queue-bytes: must be a positive number of bytes, not {queue_bytes}"
            )
        hub = replace(hub, queue_bytes=queue_bytes)
    if overflow is not None:
        try:
            hub = replace(hub, overflow=_overflow(overflow))
        except ValueError as error:
            raise ConfigError(f"--overflow: {error}") from None
    config = replace(config, hub=hub)
    if wildcards:
        config = replace(config, websmq=replace(config.websmq, wildcards=True))
    if capture is not None:
        if not capture:
            raise ConfigError("--capture: give a directory for the capture files")
        config = replace(config, capture=replace(config.capture, directory=capture))
    _check_metrics_path(config, "--listen" if listen else config_file or "the defaults")
    return config
