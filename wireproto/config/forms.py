"""The forms a listener, an attached link and a Phyllo device take, on the command line and in
a file, and the checks each must pass.

- ``--listen PROTOCOL+TRANSPORT[/PATH]@ENDPOINT``, e.g. ``websmq+ws@tcp:8765`` or
  ``websmq+length32@unix:/tmp/websmq.sock``: serve PROTOCOL on a Twisted server endpoint string;
- ``--attach PROTOCOL[+FRAMING]@CLIENT_ENDPOINT``, e.g. ``websmq@serial:/dev/ttyACM0``: open a
  client endpoint (a device on a serial line) and serve PROTOCOL on it in the server role;
- ``--phyllo NAME[+STACK]@ADDRESS``, e.g. ``dev1@serial:/dev/ttyACM0``: open a Phyllo device
  (serial, TCP or ``ws://``) and bridge its topics to the hub under ``phyllo/NAME/``.

The protocols and where each may run come from their descriptors (`wireproto.protocols`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wireproto.authentication import IDENTITIES
from wireproto.codecs.phyllo.chunks import MAX_CHUNK_LENGTH
from wireproto.config.endpoints import (
    client_endpoint_problem,
    default_reactor,
    endpoint_type,
    is_ephemeral,
    server_endpoint_problem,
    with_default_interface,
)
from wireproto.config.model import (
    DEFAULT_MAX_BOARDS,
    UBRE_ANNOUNCE,
    Attach,
    ConfigError,
    Listener,
    PhylloLink,
)
from wireproto.devices.matching import MATCH_KEYS
from wireproto.phyllo.bridge import SEND_FORMATS
from wireproto.phyllo.presets import PRESETS
from wireproto.protocols import ProtocolDescriptor, server_protocols
from wireproto.settings import one_of
from wireproto.topics import hub_topic_error, mount_error
from wireproto.transports.connect import split_endpoint
from wireproto.transports.stream import FRAMINGS

__all__ = [
    "TRANSPORTS",
    "HTTP_TRANSPORTS",
    "ENGINEIO_PATH",
    "LISTEN_SYNTAX",
    "ATTACH_SYNTAX",
    "PHYLLO_SYNTAX",
    "Invalid",
    "Located",
    "check_listener",
    "check_attach",
    "check_phyllo",
    "check_fleet",
    "MAX_BOARDS",
    "PRESENCE_PREFIX",
    "check_shared_endpoints",
    "check_phyllo_links",
    "parse_listen",
    "parse_attach",
    "parse_phyllo",
]

TRANSPORTS = ("ws", "engineio", *FRAMINGS)
# Served by a twisted.web Site, each at its path: listeners of these share an endpoint.
HTTP_TRANSPORTS = ("ws", "engineio")
ENGINEIO_PATH = "/engine.io/"
LISTEN_SYNTAX = "PROTOCOL+TRANSPORT[/PATH]@ENDPOINT, e.g. websmq+ws@tcp:8765"
ATTACH_SYNTAX = "PROTOCOL[+FRAMING]@CLIENT_ENDPOINT, e.g. websmq@serial:/dev/ttyACM0"
PHYLLO_SYNTAX = "NAME[+STACK]@ADDRESS, e.g. dev1@serial:/dev/ttyACM0 or dev1+minimal@tcp:host:2000"
# The most boards one fleet table may bring links up for.
MAX_BOARDS = 1024
# Where the broker keeps each serial link's presence (wireproto.service.fleet): its own.
PRESENCE_PREFIX = "$devices"


class Invalid(Exception):
    """One problem with one key; the caller says where the key came from."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


def _protocol_spec(name: str) -> ProtocolDescriptor:
    served = server_protocols()
    spec = served.get(name)
    if spec is None:
        raise Invalid("protocol", f"unknown protocol {name!r}; use {one_of(served)}")
    return spec


def check_listener(
    protocol: str, transport: str, endpoint: str, path: str | None, reactor: Any,
    identity: str | None = None, principal: str | None = None, allow: Any = (),
    announce: str | None = None,
) -> Listener:
    spec = _protocol_spec(protocol)
    if transport not in TRANSPORTS:
        raise Invalid(
            "transport", f"unknown transport {transport!r}; use {one_of(TRANSPORTS)}"
        )
    if transport not in spec.transports:
        allowed = [name for name in TRANSPORTS if name in spec.transports]
        raise Invalid(
            "transport", f"{protocol} does not run over {transport}; use {one_of(allowed)}"
        )
    if not endpoint:
        raise Invalid("endpoint", "no endpoint given, e.g. tcp:8765")
    endpoint = with_default_interface(endpoint)
    problem = server_endpoint_problem(endpoint, reactor)
    if problem is not None:
        raise Invalid("endpoint", problem)
    if transport in HTTP_TRANSPORTS:
        if path is None:
            path = ENGINEIO_PATH if transport == "engineio" else spec.default_path
        if path is None:  # a protocol may be served on ws without a path of its own
            raise Invalid("path", f"{protocol} has no default path: give one, e.g. /{protocol}")
        if not path.startswith("/"):
            raise Invalid("path", f"path {path!r} must start with '/'")
        if transport == "engineio" and not path.endswith("/"):
            path += "/"  # engine.io's paths end with a slash, and its clients ask for one
    elif path is not None:
        raise Invalid("path", f"a path is only for ws and engineio listeners, not {transport}")
    _check_identity(transport, endpoint, identity, principal)
    if announce is not None:
        if protocol != "ubre":
            raise Invalid("announce", "only UBRE listeners announce topics to their clients")
        if announce not in UBRE_ANNOUNCE:
            raise Invalid("announce", f"unknown value {announce!r}; use {one_of(UBRE_ANNOUNCE)}")
    return Listener(protocol, transport, endpoint, path, identity, principal,
                    _check_allow(allow, identity, principal), announce)


def _check_allow(allow: Any, identity: str | None, principal: str | None) -> tuple[str, ...]:
    if not isinstance(allow, list | tuple) or not all(isinstance(name, str) for name in allow):
        raise Invalid("allow", f"expected a list of principals and \"role:NAME\"s, got "
                      f"{allow!r}")
    for name in allow:
        check_principal_name(name.removeprefix("role:"), "allow")
    if allow and (principal is not None or identity == "anonymous"):
        raise Invalid("allow", "a listener whose connections are one principal, or anonymous, "
                      "has no one else to allow")
    return tuple(allow)


def _check_identity(
    transport: str, endpoint: str, identity: str | None, principal: str | None
) -> None:
    if principal is not None:
        if identity is not None:
            raise Invalid("principal", "a listener has an identity or a principal, not both")
        check_principal_name(principal)
        return
    if identity is None:
        return
    if identity not in IDENTITIES:
        raise Invalid("identity", f"unknown identity {identity!r}; use {one_of(IDENTITIES)}")
    kind = endpoint_type(endpoint)
    if identity == "credentials" and transport not in HTTP_TRANSPORTS:
        raise Invalid("identity", "credentials come with a ws or engineio handshake; a "
                      f"{transport} listener's clients have no way to send them")
    if identity == "certificate" and kind != "mtls":
        raise Invalid("identity", "client certificates need an mtls: endpoint, e.g. "
                      "mtls:8883:privateKey=key.pem:certKey=cert.pem:caCerts=ca.pem")
    if identity == "unix-peer" and kind != "unix":
        raise Invalid("identity", "the peer's uid is known on unix: endpoints only")


def check_principal_name(name: str, key: str = "principal") -> None:
    if not name or not name.isprintable():
        raise Invalid(key, f"a principal is a printable name, not {name!r}")


def _check_link_name(name: str, what: str) -> None:
    if not name or not all(char.isalnum() or char in "-_." for char in name):
        raise Invalid("name", f"a {what} name is letters, digits, '-', '_' and '.', not {name!r}")


def check_fleet(endpoint: str, each_board: bool, max_boards: int) -> None:
    """A table with `each_board` brings up one link per board its endpoint matches: it must
    match by identity (``serial:vid=...``), not name one port."""
    if not each_board:
        if max_boards != DEFAULT_MAX_BOARDS:
            raise Invalid("max_boards", "max_boards bounds the links of each_board = true")
        return
    args, kwargs = split_endpoint(endpoint)
    kind = args[0].lower() if args else ""
    identity = [key for key in MATCH_KEYS if key in kwargs]
    if kind != "serial" or not identity or len(args) > 1 or "device" in kwargs:
        raise Invalid(
            "each_board", f"each_board needs an endpoint that matches boards by their USB "
            f"identity, such as serial:vid=2341:pid=0043; {endpoint!r} names "
            f"{'one port' if kind == 'serial' else f'no serial board (a {kind}: endpoint)'}")
    if not 1 <= max_boards <= MAX_BOARDS:
        raise Invalid("max_boards", f"must be 1 to {MAX_BOARDS}, not {max_boards}")


def check_attach(protocol: str, endpoint: str, framing: str | None, reactor: Any,
                 principal: str | None = None, name: str | None = None,
                 each_board: bool = False, max_boards: int = DEFAULT_MAX_BOARDS,
                 prefix: str | None = None) -> Attach:
    spec = _protocol_spec(protocol)
    if name is not None:
        _check_link_name(name, "link")
    if not endpoint:
        raise Invalid("endpoint", "no endpoint given, e.g. serial:/dev/ttyACM0")
    if framing is None:
        # Serial links carry COBS (a zero byte ends every frame, so a receiver can resynchronise).
        framing = "cobs" if endpoint_type(endpoint) == "serial" else spec.default_framing
    allowed = [name for name in FRAMINGS if name in spec.transports]
    if framing == "ws":
        raise Invalid(
            "framing", f"an attached link needs a framing, not ws; use {one_of(allowed)}"
        )
    if framing not in FRAMINGS:
        raise Invalid("framing", f"unknown framing {framing!r}; use {one_of(FRAMINGS)}")
    if framing not in spec.transports:
        raise Invalid("framing", f"{protocol} does not run over {framing}; use {one_of(allowed)}")
    problem = client_endpoint_problem(endpoint, reactor, protocol=protocol)
    if problem is not None:
        raise Invalid("endpoint", problem)
    if principal is not None:
        check_principal_name(principal)
    check_fleet(endpoint, each_board, max_boards)
    if prefix is not None:
        prefix = prefix.rstrip("/")
        problem = mount_error(prefix) if prefix else None
        if problem is not None:
            raise Invalid("prefix", f"prefix {prefix!r} cannot hold the link's topics: {problem}")
    return Attach(protocol, endpoint, framing, principal, name, each_board, max_boards, prefix)


def check_phyllo(
    name: str, endpoint: str, stack: str | None, prefix: str | None, send_format: str | None,
    reactor: Any, max_chunk_length: int = MAX_CHUNK_LENGTH, principal: str | None = None,
    each_board: bool = False, max_boards: int = DEFAULT_MAX_BOARDS,
) -> PhylloLink:
    _check_link_name(name, "Phyllo link")
    if not endpoint:
        raise Invalid("endpoint", "no endpoint given, e.g. serial:/dev/ttyACM0")
    if endpoint.lower().startswith(("ws://", "wss://")):
        from autobahn.websocket.util import parse_url

        try:
            parse_url(endpoint)
        except Exception as error:  # Autobahn raises bare Exception for a bad URL
            raise Invalid("endpoint", f"bad WebSocket URL {endpoint!r}: {error}") from None
    else:
        problem = client_endpoint_problem(endpoint, reactor, stack=stack or "reduced")
        if problem is not None:
            raise Invalid("endpoint", problem)
    stack = stack or "reduced"
    if stack not in PRESETS:
        raise Invalid(
            "stack", f"unknown Phyllo stack {stack!r}; use {one_of(PRESETS)} (the "
            "standard stack, with the reliable buffer, is not implemented)"
        )
    prefix = f"phyllo/{name}" if prefix is None else prefix.rstrip("/")
    problem = hub_topic_error(prefix)
    if problem is not None:
        raise Invalid("prefix", f"prefix {prefix!r} cannot be a hub topic: {problem}")
    if f"{prefix}/".startswith(f"{PRESENCE_PREFIX}/"):
        raise Invalid("prefix", f"{PRESENCE_PREFIX}/ is where the broker says which devices "
                      "are present: choose another prefix")
    send_format = send_format or "msgpack"
    if send_format not in SEND_FORMATS:
        raise Invalid(
            "send_format", f"unknown send_format {send_format!r}; use {one_of(SEND_FORMATS)}"
        )
    if not 16 <= max_chunk_length <= MAX_CHUNK_LENGTH:
        raise Invalid(
            "max_chunk_length", f"must be 16 to {MAX_CHUNK_LENGTH} bytes, not {max_chunk_length}"
        )
    if principal is not None:
        check_principal_name(principal)
    check_fleet(endpoint, each_board, max_boards)
    return PhylloLink(name, endpoint, stack, prefix, send_format, max_chunk_length, principal,
                      each_board, max_boards)


def check_phyllo_links(links: Sequence[PhylloLink], labels: Sequence[str]) -> None:
    """Names and prefixes are unique, and no prefix lies under another's."""
    for index, link in enumerate(links):
        for first in range(index):
            other = links[first]
            if other.name == link.name:
                raise Located(index, "name", f"{link.name!r} is already the name of "
                               f"{labels[first]}")
            for fleet, board in ((other, link), (link, other)):
                if fleet.each_board and board.name.startswith(f"{fleet.name}."):
                    raise Located(index, "name", f"{board.name!r} is a name {fleet.name!r}'s "
                                  "boards may take (each_board): choose another")
            nested = (f"{link.prefix}/".startswith(f"{other.prefix}/")
                      or f"{other.prefix}/".startswith(f"{link.prefix}/"))
            if nested:
                raise Located(index, "prefix", f"prefix {link.prefix!r} overlaps "
                               f"{labels[first]}'s {other.prefix!r}")




def check_shared_endpoints(listeners: Sequence[Listener], labels: Sequence[str]) -> None:
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
            raise Located(
                index, "endpoint",
                f"{listener.endpoint} is already used by {labels[first]} "
                f"({other.describe()}); only ws and engineio listeners may share an endpoint",
            )
        if websocket:
            same_path = paths.setdefault((listener.endpoint, listener.path), index)
            if same_path != index:
                raise Located(
                    index, "path",
                    f"{listener.path} on {listener.endpoint} is already served by "
                    f"{labels[same_path]}",
                )


class Located(Exception):
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
            f"(transports: {one_of(TRANSPORTS)})"
        )
    transport, slash, path = transport_path.partition("/")
    try:
        return check_listener(
            protocol, transport, endpoint, slash + path if slash else None,
            default_reactor(reactor),
        )
    except Invalid as problem:
        raise ConfigError(f"--listen {spec!r}: {problem.message}") from None


def parse_attach(spec: str, *, reactor: Any = None) -> Attach:
    """An `Attach` from ``PROTOCOL[+FRAMING]@CLIENT_ENDPOINT``; the framing defaults to cobs
    for ``serial:`` and to the protocol's default framing (length32) otherwise."""
    protocol, framing, endpoint = _split_spec(spec, "--attach", ATTACH_SYNTAX)
    try:
        return check_attach(protocol, endpoint, framing, default_reactor(reactor))
    except Invalid as problem:
        raise ConfigError(f"--attach {spec!r}: {problem.message}") from None


def parse_phyllo(spec: str, *, reactor: Any = None) -> PhylloLink:
    """A `PhylloLink` from ``NAME[+STACK]@ADDRESS``: ``dev1@serial:/dev/ttyACM0`` bridges the
    device's topics to ``phyllo/dev1/...`` over the reduced stack."""
    name, stack, endpoint = _split_spec(spec, "--phyllo", PHYLLO_SYNTAX)
    try:
        return check_phyllo(name, endpoint, stack, None, None, default_reactor(reactor))
    except Invalid as problem:
        raise ConfigError(f"--phyllo {spec!r}: {problem.message}") from None

