"""What a tool says when the broker refuses it or closes on it: in words a user can act on.

- A refused WebSocket or Engine.IO handshake (`handshake_refused`): for 401, and a 403 with a
  WWW-Authenticate (Engine.IO's refusal of credentials), which credentials the broker takes and
  which option gives them, and whether the ones sent were the wrong kind; for another 403, what
  is refused (an Origin the broker does not take, which Engine.IO's 403 says in a
  ``wireproto-refused: origin`` header); for a 404 or a 400 that names what the port serves
  (the broker's ``wireproto-serves`` header), where to go instead; for a 2xx or 3xx, that the
  address is no WebSocket endpoint; for ``wss://`` closed before any answer, that the port may
  have no TLS. No line repeats a credential.
- A URL whose path names no protocol (`ask_protocol`): the broker is asked what it serves
  there (the ``wireproto-serves`` header of a refused handshake).
- A connection the broker closed (`closed_line`): when its reason says the address serves
  another protocol (``this serves websmq: ...``, wireproto.errors.NotThisProtocol), that
  protocol's address; on a stream endpoint, closed before any answer, that the port may serve
  another protocol.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from wireproto.tools._common import EXIT_REFUSED, ToolError

if TYPE_CHECKING:
    from twisted.internet.interfaces import IReactorTime
    from twisted.python.failure import Failure

    from wireproto.transports.websocket import HandshakeFailed

__all__ = ["handshake_refused", "closed_line", "sent_credentials", "refusal", "explain_refusal",
           "ask_protocol"]

SERVES_HEADER = "wireproto-serves"
REFUSED_HEADER = "wireproto-refused"  # "origin" on Engine.IO's 403 for an Origin it refuses
TOKEN_OPTION = "a token (--token JWT, or $WIREPROTO_TOKEN)"
PASSWORD_OPTION = "a user and password (--user USER, the password in $WIREPROTO_PASSWORD)"


def sent_credentials(args: argparse.Namespace) -> str | None:
    """What the tool sends the broker: "token", "password", "header" (-H Authorization) or
    None."""
    if getattr(args, "token", None) or os.environ.get("WIREPROTO_TOKEN"):
        return "token"
    if getattr(args, "user", None) or os.environ.get("WIREPROTO_USER"):
        return "password"
    if any(header.partition(":")[0].strip().lower() == "authorization"
           for header in getattr(args, "header", ())):
        return "header"
    return None


def _schemes(challenge: str) -> set[str]:
    """The schemes a WWW-Authenticate value offers (lower-case): bearer, basic."""
    found = set()
    for part in challenge.split(","):
        words = part.strip().split()
        if words and "=" not in words[0]:
            found.add(words[0].lower())
    return found


def _credentials_refused(challenge: str | None, sent: str | None) -> str:
    schemes = _schemes(challenge or "")
    takes = [option for scheme, option in (("bearer", TOKEN_OPTION), ("basic", PASSWORD_OPTION))
             if scheme in schemes] or [f"{TOKEN_OPTION} or {PASSWORD_OPTION}"]
    offer = " or ".join(takes)
    if sent == "token":
        if "bearer" in schemes or not schemes:
            return "the broker refused the token (expired, or not signed with a key it takes)"
        return f"the broker takes no tokens: give {offer}"
    if sent == "password":
        if "basic" in schemes or not schemes:
            return ("the broker refused the user or the password (or, after many failed "
                    "logins, waits before it checks them again)")
        return f"the broker takes no passwords: give {offer}"
    if sent == "header":
        return f"the broker refused the -H Authorization header; it takes {offer}"
    return f"the broker wants {offer}"


def _default_paths() -> dict[str, str]:
    """Each protocol's usual path on a WebSocket port (nydus: Engine.IO's /engine.io/)."""
    from wireproto.protocols import PROTOCOLS

    paths = {}
    for name, descriptor in PROTOCOLS.items():
        if "engineio" in descriptor.transports:
            paths[name] = "/engine.io/"
        elif descriptor.default_path:
            paths[name] = descriptor.default_path
    return paths


def _served(header: str) -> dict[str, str]:
    """The broker's ``wireproto-serves`` header: each path with its protocol."""
    served = {}
    for entry in header.split(","):
        path, _, protocol = entry.strip().partition(" ")
        if path and protocol:
            served[path] = protocol
    return served


def _at(address: str, path: str, *, websocket: bool = False) -> str:
    """`address` with `path` (an Engine.IO path as http://, as the tools' docs write it,
    unless `websocket`)."""
    parts = urlsplit(address)
    scheme = parts.scheme.lower()
    if path.startswith("/engine.io") and not websocket:
        scheme = {"ws": "http", "wss": "https", "ws+unix": "http+unix"}.get(scheme, scheme)
    else:
        scheme = {"http": "ws", "https": "wss", "http+unix": "ws+unix"}.get(scheme, scheme)
    if scheme.endswith("+unix"):
        from wireproto.transports.connect import split_unix_url

        return f"{scheme}://{split_unix_url(address)[0]}:{path}"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def _path(address: str) -> str:
    """The path a URL asks for (on a unix socket's URL, the part after the socket)."""
    if "+unix://" in address.lower():
        from wireproto.transports.connect import split_unix_url

        return urlsplit(split_unix_url(address)[1]).path
    return urlsplit(address).path or "/"


def _elsewhere(address: str, protocol: str, served: dict[str, str]) -> str:
    """Where on this port `protocol` is served, or that it is not."""
    paths = [path for path, name in served.items() if name == protocol]
    if paths:
        return f"for {protocol} use {_at(address, paths[0])}"
    return f"this port serves no {protocol}: it serves {_listed(served)}"


def handshake_refused(address: str, protocol: str | None, status: int | None,
                      headers: dict[str, str], reason: str, sent: str | None) -> str:
    """One line for a refused handshake: the broker's `status` and `headers` (lower-case
    names), Autobahn's `reason` when the broker gave no HTTP answer."""
    if status is None:
        said = reason.lower()
        if address.lower().startswith(("wss://", "https://")) and (
                "dropped" in said or "timeout" in said) and "certificate" not in said:
            # A wireproto port without TLS closes on a TLS handshake; another server may
            # never answer it.
            return (f"{address}: no TLS handshake: is it a port without TLS? (ws:// and "
                    "http:// for a plain port; wireproto serve's banner names each address)")
        return f"{address}: WebSocket handshake refused: {reason}"
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "refused"
    head = f"{address}: {status} {phrase}"
    challenge = headers.get("www-authenticate")
    if status == 401 or (status == 403 and challenge):
        return f"{head}: {_credentials_refused(challenge, sent)}"
    if status == 403:
        if "origin" in reason.lower() or headers.get(REFUSED_HEADER) == "origin":
            return (f"{head}: the broker does not take this Origin header (its [websocket] "
                    "allowed_origins)")
        return (f"{head}: the broker does not let this principal in here (the listener's "
                "allow list)")
    served = _served(headers.get(SERVES_HEADER, ""))
    path = _path(address)
    if served and protocol:
        here = here_of(served, path)
        if here is not None and here != protocol:
            return (f"{address} serves {here}, not {protocol}: "
                    f"{_elsewhere(address, protocol, served)}")
        if here is None and status in (400, 404):
            return f"{head}: nothing is served at {path}; {_elsewhere(address, protocol, served)}"
    if served and here_of(served, path) is None and status in (400, 404):
        return f"{head}: nothing is served at {path}; this port serves {_listed(served)}"
    if 200 <= status < 400:
        # Not a WebSocket endpoint at all: the status page, /metrics, another web server.
        return (f"{head}, not a WebSocket handshake: is it the status page or /metrics? "
                "wireproto serve's banner names each protocol's address")
    return f"{head}: WebSocket handshake refused"


def here_of(served: dict[str, str], path: str) -> str | None:
    """The protocol `served` (the broker's answer) names at `path`, with or without its
    trailing slash."""
    return served.get(path) or served.get(path.rstrip("/") + "/") or served.get(
        path.rstrip("/"))


def _listed(served: dict[str, str]) -> str:
    return ", ".join(f"{path} ({name})" for path, name in served.items())


def closed_line(address: str, protocol: str, why: str, *, answered: bool = True) -> str | None:
    """A better line than `why` for a connection the broker closed, or None: the address serves
    another protocol (the close reason says so), or, on a stream endpoint, the broker closed it
    before any answer (`answered` False)."""
    from wireproto.errors import NotThisProtocol

    served = NotThisProtocol.served_by(why)
    if served is not None and served != protocol:
        # The broker's words, less the full stop Twisted's connection errors end with.
        said = why[why.find("this serves "):].partition(": ")[2].strip().removesuffix(".")
        if "://" in address:
            path = _default_paths().get(protocol)
            where = f"; for {protocol} use {_at(address, path)}" if path else ""
        else:
            where = "; wireproto serve's banner names each port's protocol"
        return f"{address} serves {served}, not {protocol}{where} (the broker said: {said})"
    if not answered and "://" not in address:
        return (f"{address} closed the connection without an answer: does it serve "
                f"{protocol}? wireproto serve's banner names each port's protocol")
    return None


def refusal(args: argparse.Namespace, protocol: str | None,
            failed: HandshakeFailed) -> ToolError:
    """The ToolError (exit 4) for a handshake refused to a tool speaking `protocol`."""
    reason = str(failed.args[0] if failed.args and failed.args[0] else failed)
    return ToolError(handshake_refused(args.address, protocol, failed.status, failed.headers,
                                       reason, sent_credentials(args)), EXIT_REFUSED)


def explain_refusal(args: argparse.Namespace, protocol: str, failure: Failure) -> Failure:
    """An errback for a tool's connecting: a refused handshake becomes `refusal`'s ToolError;
    any other failure goes on."""
    from wireproto.transports.websocket import HandshakeFailed

    if isinstance(failure.value, HandshakeFailed):
        raise refusal(args, protocol, failure.value)
    return failure


async def ask_protocol(reactor: IReactorTime, args: argparse.Namespace, tool: str,
                       allowed: Sequence[str], timeout: float) -> str:
    """The protocol to speak at ``args.address`` (`protocol_of`); for a URL whose path names
    none, without --protocol, the one the broker serves there, from its answer to a handshake
    (a 404's ``wireproto-serves`` header names each path of the port with its protocol). No
    answer that tells: protocol_of's ToolError."""
    from twisted.internet import defer, error

    from wireproto.tools._common import EXIT_UNREACHABLE, EXIT_USAGE
    from wireproto.tools.registry import protocol_of

    address = args.address
    try:
        return protocol_of(address, args.protocol, allowed)
    except ToolError as told:
        unknown = told
    if args.protocol is not None or urlsplit(address).scheme.lower() not in (
            "ws", "wss", "http", "https", "ws+unix", "http+unix"):
        raise unknown
    path = _path(address)
    try:
        failed = await _refused_at(reactor, args, _at(address, path, websocket=True), timeout)
        if failed is None:
            # Served, but the broker names what only in a refusal: ask at a path it never
            # serves (a WebSocket path starts with a letter or a digit).
            failed = await _refused_at(
                reactor, args, _at(address, "/~wireproto-serves", websocket=True), timeout)
            if failed is None or here_of(
                    _served(failed.headers.get(SERVES_HEADER, "")), path) is None:
                raise unknown
    except (error.ConnectionRefusedError, error.DNSLookupError, error.NoRouteError) as failure:
        raise ToolError(f"cannot reach {address}: {str(failure).strip()}",
                        EXIT_UNREACHABLE) from None
    except (defer.TimeoutError, error.ConnectError):
        raise unknown from None
    served = _served(failed.headers.get(SERVES_HEADER, ""))
    here = here_of(served, path)
    if here is not None and here in allowed:
        return here
    if here is not None:
        raise ToolError(f"{address} serves {here}, which {tool} does not speak "
                        f"({', '.join(allowed)})", EXIT_USAGE)
    if failed.status in (400, 404) and served:
        ours = [f"{name} at {_at(address, where)}" for where, name in served.items()
                if name in allowed]
        go = (f"{tool} speaks {', '.join(ours)}" if ours
              else f"this port serves no {' or '.join(allowed)}: it serves {_listed(served)}")
        raise ToolError(f"{address}: {failed.status} {HTTPStatus(failed.status).phrase}: "
                        f"nothing is served at {path}; {go}", EXIT_REFUSED)
    raise refusal(args, None, failed)


async def _refused_at(reactor: IReactorTime, args: argparse.Namespace, url: str,
                      timeout: float) -> HandshakeFailed | None:
    """The broker's refusal of a WebSocket handshake at `url`, or None if it let it in (closed
    at once)."""
    from wireproto.tools._common import connect_options
    from wireproto.transports.base import MessageProtocol
    from wireproto.transports.connect import connect
    from wireproto.transports.websocket import HandshakeFailed

    probing = connect(reactor, url, MessageProtocol, **connect_options(args))
    probing.addTimeout(timeout, reactor)
    try:
        opened = await probing
    except HandshakeFailed as failed:
        return failed
    if opened.transport is not None:
        opened.transport.loseConnection()
    return None
