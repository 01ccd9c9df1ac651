"""One connection to one NATS server, for a `NatsClient` (wireproto.cluster.client): the
handshake (credentials, TLS), what the server says, its PINGs, and why it closed.

The connection is the client's part: it tells its client what happens through the client's
own methods, and the client alone decides what to do about it.

What the client sends in one reactor turn (its PUBs, SUBs, PINGs...) is collected by `send`
and written as one write when the turn ends (a call made with no delay, which the reactor runs
before it next waits), or as soon as `BATCH_LIMIT` bytes are waiting: the transport gets one
write per turn rather than one per publish, in the order they were sent, and nothing waits for
a timer (the transport itself sends only in the reactor's next turn, batched or not).
"""

from __future__ import annotations

import base64
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from twisted.internet import defer
from twisted.internet.error import ConnectionAborted, ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto import speedups
from wireproto.codecs.nats import (
    PING_COMMAND,
    PONG_COMMAND,
    Connect,
    Decoder,
    Err,
    Info,
    Msg,
    Ok,
    Ping,
    Pong,
    ServerEvent,
    encode,
)
from wireproto.errors import ProtocolError
from wireproto.transports.connect import tls_client_options

__all__ = [
    "BATCH_LIMIT",
    "DEFAULT_PORT",
    "ERRORS_THAT_KEEP_THE_CONNECTION",
    "NatsError",
    "NoResponders",
    "NatsUnavailable",
    "NatsOptions",
    "NatsConnection",
    "ConnectionOwner",
    "Server",
    "why_closed",
]

log = Logger(namespace="wireproto.cluster")

DEFAULT_PORT = 4222
# The most bytes `send` collects before it writes them at once, without waiting for the turn
# to end: the transport's own buffer size, past which it pauses its producer.
BATCH_LIMIT = 64 * 1024


class NatsError(Exception):
    """The NATS server refused something (an -ERR), or cannot be reached."""


class NoResponders(NatsError):
    """A request that no subscriber of its subject was there to answer."""


class NatsUnavailable(NatsError):
    """No NATS server is connected at the moment."""


@dataclass(frozen=True)
class NatsOptions:
    """How to reach the NATS servers: `servers` are ``nats://[user:password@]host:port`` or
    ``tls://host:port`` URLs (the cluster's others are learnt from the servers); a token, user
    and password, an NKey seed file or a creds file (JWT and seed) authenticate; `cafile`,
    `certfile` and `keyfile` are for TLS."""

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    name: str = "wireproto"
    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkey_seed_file: str | None = None
    creds_file: str | None = None
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    connect_timeout: float = 5.0
    ping_interval: float = 10.0
    max_pings_out: int = 2
    # The retry policy: each server once without waiting, then 0.1 s doubling with each round
    # of the list up to 2 s (shortened by up to half at random), as `backoff_per_round` makes.
    reconnect_wait: float = 0.1
    max_reconnect_wait: float = 2.0
    # Bytes a publish may add to a socket the server is not reading before publishes are
    # dropped (and counted) rather than held.
    max_pending_bytes: int = 8 << 20


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    tls: bool
    user: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> Server:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        if parts.scheme not in ("nats", "tls"):
            raise ValueError(f"NATS server {url!r}: the scheme must be nats:// or tls://")
        if not parts.hostname:
            raise ValueError(f"NATS server {url!r} has no host")
        return cls(parts.hostname, parts.port or DEFAULT_PORT, parts.scheme == "tls",
                   unquote(parts.username) if parts.username else None,
                   unquote(parts.password) if parts.password else None)


def _read_creds(path: str) -> tuple[str, bytes]:
    """The JWT and NKey seed of a NATS creds file."""
    with open(path, encoding="utf-8") as file:
        lines = [line.strip() for line in file]
    found: list[str] = []
    for index, line in enumerate(lines):
        if line.startswith("-----BEGIN") and index + 1 < len(lines):
            found.append(lines[index + 1])
    if len(found) < 2:
        raise ValueError(f"{path}: not a NATS creds file (a JWT and an NKey seed)")
    return found[0], found[1].encode()


def _sign_nonce(seed: bytes, nonce: str) -> tuple[str, str]:
    """The signature of `nonce` with an NKey seed, and the seed's public key."""
    import nkeys

    keys = nkeys.from_seed(bytearray(seed))
    try:
        return base64.b64encode(keys.sign(nonce.encode())).decode(), keys.public_key.decode()
    finally:
        keys.wipe()


class _NatsTransport(typing.Protocol):
    """What a NATS connection's transport is: TCP that can start TLS, and a consumer whose
    producer (this connection) is paused while its buffer is full."""

    def write(self, data: bytes) -> None: ...

    def startTLS(self, contextFactory: Any) -> None: ...

    def registerProducer(self, producer: object, streaming: bool) -> None: ...

    def unregisterProducer(self) -> None: ...

    def loseConnection(self) -> None: ...

    def abortConnection(self) -> None: ...


class ConnectionOwner(typing.Protocol):
    """The client a connection belongs to (wireproto.cluster.client.NatsClient), as the
    connection sees it: what it reads, and what it tells."""

    options: NatsOptions
    reactor: IReactorTime
    last_error: str | None

    def connection_opened(self, connection: NatsConnection) -> None: ...

    def connection_ready(self, connection: NatsConnection) -> None: ...

    def connection_closed(self, connection: NatsConnection, reason: Failure | None) -> None: ...

    def message(self, subject: str, sid: int, reply: str | None, headers: bytes | None,
                payload: bytes) -> None: ...

    def learn_servers(self, info: Mapping[str, object]) -> None: ...

    def server_error(self, connection: NatsConnection, text: str) -> None: ...

    def describe(self, server: Server) -> str: ...


@implementer(IPushProducer)
class NatsConnection(Protocol):
    """One connection to one NATS server, for its `NatsClient`."""

    def __init__(self, client: ConnectionOwner, server: Server) -> None:
        self.client = client
        self.server = server
        self.parser = Decoder()
        self.ready = False
        self.info: dict[str, Any] = {}
        self.pings_out = 0
        self.pongs: list[defer.Deferred] = []
        # Bytes written while the socket's buffer is full (None: it is not).
        self.backlog: int | None = None
        self._pinger: Any = None
        # Fires once the server has answered the CONNECT; fails if the connection closes first.
        self.handshaken: defer.Deferred = defer.Deferred()
        # Why this side aborted the connection, and the -ERR the server closed it after.
        self.aborted_because: str | None = None
        self.error: str | None = None
        # What `send` collected in this reactor turn, its size, and the call that writes it.
        self._outgoing: list[bytes] = []
        self._outgoing_size = 0
        self._writer: IDelayedCall | None = None

    # The connected transport, as what it is: TCP that can start TLS (set once connected, the
    # client uses none before; an attribute, since every publish writes through it).
    wire: _NatsTransport

    # -- the handshake ---------------------------------------------------------------------------

    def connectionMade(self) -> None:
        self.wire = typing.cast(_NatsTransport, self.transport)
        # A server that accepts (its kernel does, even while it is paused) but never finishes
        # the handshake is given up, as one that cannot be reached, so the next one is tried.
        self._pinger = self.client.reactor.callLater(
            self.client.options.connect_timeout, self._handshake_too_slow)
        self.client.connection_opened(self)

    def _handshake_too_slow(self) -> None:
        self._pinger = None
        self.client.last_error = (f"no answer to the handshake within "
                                  f"{self.client.options.connect_timeout:g} s")
        self.wire.abortConnection()

    def _handshake(self, info: dict[str, Any]) -> None:
        options = self.client.options
        self.info = info
        if self.server.tls or info.get("tls_required") or options.certfile or options.cafile:
            self.wire.startTLS(tls_client_options(
                self.server.host, cafile=options.cafile, certfile=options.certfile,
                keyfile=options.keyfile))
        connect: dict[str, Any] = {
            "verbose": False, "pedantic": False, "lang": "python-twisted",
            "version": "wireproto", "protocol": 1, "name": options.name,
            "echo": False, "headers": True, "no_responders": True,
        }
        user = options.user or self.server.user
        password = options.password or self.server.password
        if user is not None:
            connect["user"] = user
            connect["pass"] = password or ""
        if options.token is not None:
            connect["auth_token"] = options.token
        nonce = info.get("nonce")
        if options.creds_file is not None:
            jwt, seed = _read_creds(options.creds_file)
            connect["jwt"] = jwt
            if nonce:
                connect["sig"] = _sign_nonce(seed, nonce)[0]
        elif options.nkey_seed_file is not None:
            with open(options.nkey_seed_file, "rb") as file:
                seed = file.read().strip()
            signature, public = _sign_nonce(seed, nonce or "")
            connect["nkey"] = public
            if nonce:
                connect["sig"] = signature
        self.wire.write(encode(Connect(connect)) + PING_COMMAND)

    # -- what the client sends ---------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Write `data` after everything sent before it: at the end of this reactor turn, with
        the rest of the turn's, or at once with them when `BATCH_LIMIT` bytes are waiting."""
        outgoing = self._outgoing
        outgoing.append(data)
        self._outgoing_size += len(data)
        if self._outgoing_size >= BATCH_LIMIT:
            self.write_outgoing()
        elif self._writer is None:
            self._writer = self.client.reactor.callLater(0, self._end_of_turn)

    def _end_of_turn(self) -> None:
        self._writer = None
        self.write_outgoing()

    def write_outgoing(self) -> None:
        """Write what `send` collected now, as one write."""
        if self._outgoing:
            data = b"".join(self._outgoing) if len(self._outgoing) > 1 else self._outgoing[0]
            self._outgoing = []
            self._outgoing_size = 0
            self.wire.write(data)

    # -- what the server says --------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        try:
            events = self.parser.feed(data)
        except ProtocolError as error:
            log.error("NATS server {server}: {error}", event="cluster_protocol_error",
                      server=self.client.describe(self.server), error=str(error))
            self.aborted_because = f"it broke the NATS protocol: {error}"
            self.wire.abortConnection()
            return
        # Messages from the other processes are published to this one's subscribers: what a
        # read brings costs each of them one write (wireproto.speedups).
        speedups.batch_begin()
        try:
            self._handle(events)
        finally:
            speedups.batch_end()

    def _handle(self, events: list[ServerEvent]) -> None:
        client = self.client
        for event in events:
            if type(event) is Msg:
                client.message(*event)  # subject, sid, reply, headers, payload
            elif type(event) is Ping:
                self.wire.write(PONG_COMMAND)
            elif type(event) is Pong:
                self.pings_out = 0
                if self.pongs:
                    self.pongs.pop(0).callback(None)
                elif not self.ready:
                    self.ready = True
                    if self._pinger is not None and self._pinger.active():
                        self._pinger.cancel()
                    self._pinger = client.reactor.callLater(
                        client.options.ping_interval, self._ping)
                    self.wire.registerProducer(self, True)
                    client.connection_ready(self)
            elif type(event) is Info:
                if not self.info:
                    self._handshake(event.properties)
                else:
                    self.info = {**self.info, **event.properties}
                    client.learn_servers(event.properties)
            elif type(event) is Err:
                client.server_error(self, event.text)
            elif type(event) is not Ok:
                raise AssertionError(event)

    def ping(self) -> defer.Deferred:
        """Fires when the server has answered: everything written before has reached it."""
        d: defer.Deferred = defer.Deferred()
        self.pongs.append(d)
        self.send(PING_COMMAND)
        return d

    def _ping(self) -> None:
        self._pinger = None
        options = self.client.options
        if self.pings_out >= options.max_pings_out:
            self.aborted_because = (f"no answer to {self.pings_out} PINGs in "
                            f"{self.pings_out * options.ping_interval:g} s")
            self.wire.abortConnection()
            return
        self.pings_out += 1
        self.send(PING_COMMAND)
        self._pinger = self.client.reactor.callLater(
            self.client.options.ping_interval, self._ping)

    # -- the socket's buffer, as a producer -------------------------------------------------------

    def pauseProducing(self) -> None:
        # The transport says so again on every write while its buffer is over its size: the
        # bytes counted since the first time stay counted.
        if self.backlog is None:
            self.backlog = 0

    def resumeProducing(self) -> None:
        self.backlog = None

    def stopProducing(self) -> None:
        self.backlog = None

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if self._pinger is not None and self._pinger.active():
            self._pinger.cancel()
        self._pinger = None
        # What was sent in the turn the connection was lost in goes nowhere, as it would had it
        # been written to the transport: the socket is gone.
        if self._writer is not None and self._writer.active():
            self._writer.cancel()
        self._writer = None
        self._outgoing = []
        self._outgoing_size = 0
        pongs, self.pongs = self.pongs, []
        for d in pongs:
            d.errback(NatsUnavailable("the NATS connection closed"))
        self.client.connection_closed(self, reason)


# -ERRs after which the server keeps the connection open (every other one closes it).
ERRORS_THAT_KEEP_THE_CONNECTION = ("permissions violation", "invalid subject")


def why_closed(connection: NatsConnection, reason: Failure | None) -> str:
    """Why `connection` closed, in words: this side's reason for closing it, the -ERR the
    server closed it after, or what became of the socket."""
    if connection.aborted_because is not None:
        return connection.aborted_because
    if connection.error is not None:
        return f"the server closed the connection after -ERR '{connection.error}'"
    if reason is None or reason.check(ConnectionDone):
        if connection.info.get("ldm"):
            return "the server closed the connection: it was shutting down (lame duck mode)"
        return "the server closed the connection without an error"
    if reason.check(ConnectionAborted):
        return "this side aborted the connection"
    if reason.check(ConnectionLost):
        return "the connection broke: reset, or cut without a clean close"
    if reason.check("OpenSSL.SSL.Error"):
        return f"TLS error: {reason.getErrorMessage()}"
    return reason.getErrorMessage()
