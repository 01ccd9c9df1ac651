"""Twisted endpoint strings as a config holds them: their type, the loopback default, the
checks that can be made without binding, and the problems Twisted's parsers report.

``tcp:`` and ``ssl:`` endpoints listen on 127.0.0.1 unless they name an interface, so a broker is
reachable from other machines only when someone asks for it.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from wireproto.transports.connect import split_endpoint

__all__ = [
    "endpoint_type",
    "with_default_interface",
    "is_ephemeral",
    "server_endpoint_problem",
    "client_endpoint_problem",
    "default_reactor",
]


def endpoint_type(endpoint: str) -> str:
    """The endpoint string's type, lower case: 'tcp', 'ssl', 'unix', 'serial', ..."""
    args, _ = split_endpoint(endpoint)
    return args[0].lower() if args else ""


# Loopback unless an interface is named: a broker must not be reachable from elsewhere by accident.
_LOOPBACK = {"tcp": "127.0.0.1", "ssl": "127.0.0.1", "mtls": "127.0.0.1", "tcp6": "\\:\\:1"}


def with_default_interface(endpoint: str) -> str:
    """`endpoint`, plus ``interface=`` loopback if it is a tcp:, ssl:, mtls: or tcp6: naming
    none."""
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


def server_endpoint_problem(endpoint: str, reactor: Any) -> str | None:
    """What is wrong with a server endpoint string, or None."""
    from wireproto.transports.identity import server_endpoint

    try:
        server_endpoint(reactor, endpoint)
    except Exception as error:
        return f"bad server endpoint {endpoint!r}: {_endpoint_problem(error)}"
    problem = _address_problem(endpoint)
    if problem is not None:
        return f"bad server endpoint {endpoint!r}: {problem}"
    return None


def _address_problem(endpoint: str) -> str | None:
    """What can be seen wrong with a tcp:, ssl: or tcp6: server endpoint's port and interface
    without binding it (Twisted takes tcp:70000 and interface=nonsense until it binds)."""
    args, kwargs = split_endpoint(endpoint)
    kind = args[0].lower() if args else ""
    if kind not in ("tcp", "ssl", "mtls", "tcp6"):
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


def client_endpoint_problem(endpoint: str, reactor: Any, *, protocol: str | None = None,
                            stack: str | None = None) -> str | None:
    """What is wrong with a client endpoint string (``serial:`` and ``replay:`` included), or
    None. A ``replay:`` endpoint is checked against its capture: for a link of `protocol`, or
    a Phyllo link whose stack is `stack`."""
    from twisted.internet.endpoints import clientFromString

    from wireproto.transports.serial import serial_endpoint_from_string

    if endpoint_type(endpoint) == "replay":
        from wireproto.capture.replay import replay_problem

        problem = replay_problem(endpoint, protocol=protocol, stack=stack)
        return None if problem is None else f"bad client endpoint {endpoint!r}: {problem}"
    try:
        # serial: is parsed directly too, so it works even where Twisted's plugin scan does not.
        if endpoint_type(endpoint) == "serial":
            serial_endpoint_from_string(reactor, endpoint)
        else:
            clientFromString(reactor, endpoint)
    except Exception as error:
        return f"bad client endpoint {endpoint!r}: {_endpoint_problem(error)}"
    return None


def default_reactor(reactor: Any) -> Any:
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        return global_reactor
    return reactor


def is_ephemeral(endpoint: str) -> bool:
    """True for a tcp:/ssl:/tcp6: endpoint on port 0, which gets a fresh port each time."""
    args, kwargs = split_endpoint(endpoint)
    if not args or args[0].lower() not in _LOOPBACK:
        return False
    port = kwargs.get("port", args[1] if len(args) > 1 else None)
    return port is not None and port.strip() == "0"
