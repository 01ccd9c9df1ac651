"""Where a client kit, as a scripted server, waits for the client under test
(docs/conformance.md, "Judging a client").

A `Listener` listens on one address: a WebSocket URL (``ws://HOST:PORT/PATH``,
``wss://...`` with the kit's certificate and key, ``ws+unix://PATH``), a stream endpoint with a
framing (``tcp:PORT:interface=HOST``, ``unix:PATH``, ``ssl:...``), or Engine.IO over HTTP
(``http://HOST:PORT/PATH``, for nydus). Every connection the client makes becomes a `Probe`,
the same recorded connection server kits use, held until a case takes it with `accept`: a
client that reconnects between cases is taken by the next case, its first messages kept.
A case can also refuse connections for a while (`refusing`), or stop listening altogether and
listen again on the same port (`pause`, `resume`), to see how the client reconnects.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IProtocolFactory, IReactorTime

from wireproto.conformance.clientprocess import ClientProcess
from wireproto.conformance.model import CaseFailed, NotApplicable
from wireproto.conformance.probe import PROBE_MAX_MESSAGE, Probe, Recorder

__all__ = ["ClientProbe", "Listener", "listening_endpoint"]

# A kit's own way to listen (nydus's Engine.IO site): given how to make each connection's probe.
MakeFactory = Callable[[Callable[[], Probe]], IProtocolFactory]

# How often a wait for the connection of a client the kit started looks whether it has ended.
PROCESS_CHECK = 0.2

# Connections the client made that no case has taken yet: beyond these, the oldest are closed
# (a client reconnecting in a loop cannot make the kit hold sockets without end).
HELD_LIMIT = 16
# What those connections may hold of the client's unread messages, all together: a connection
# that brings more is aborted (without it, 16 connections could each hold a probe's 128 MiB).
HELD_BYTES = 2 * PROBE_MAX_MESSAGE
# The times of connection attempts kept (the newest): a client reconnecting in a tight loop for
# a long run cannot grow the list without end. A case reads them by time, not by index.
ATTEMPTS_KEPT = 10_000


def listening_endpoint(address: str, certfile: str | None = None,
                       keyfile: str | None = None) -> tuple[str, str]:
    """The Twisted server endpoint to listen on for `address`, and its kind: ``websocket``,
    ``engineio`` or ``stream``. ValueError for an address the kit cannot listen on."""
    if "://" not in address:
        if not address.startswith(("tcp:", "unix:", "ssl:")):
            raise ValueError(f"cannot listen on {address!r}: a ws:// or http:// URL, or a "
                             "tcp:, unix: or ssl: endpoint")
        if address.startswith("ssl:") and "privateKey=" not in address:
            if not certfile:
                raise ValueError(f"listening on {address!r} needs the kit's certificate and "
                                 "key (--cert, --key)")
            address += f":certKey={certfile}:privateKey={keyfile or certfile}"
        return address, "stream"
    parts = urlsplit(address)
    scheme = parts.scheme
    if scheme == "ws+unix":
        path = parts.netloc + parts.path.split(":", 1)[0]
        return f"unix:{path}", "websocket"
    if scheme not in ("ws", "wss", "http", "https"):
        raise ValueError(f"cannot listen on {address!r}: its scheme is not ws, wss, ws+unix, "
                         "http or https")
    host = parts.hostname or "127.0.0.1"
    port = parts.port if parts.port is not None else 0
    kind = "websocket" if scheme.startswith("ws") else "engineio"
    interface = host.replace(":", r"\:")
    if scheme in ("wss", "https"):
        if not certfile:
            raise ValueError(f"listening on {address!r} needs the kit's certificate and key "
                             "(--cert, --key)")
        key = keyfile or certfile
        return (f"ssl:{port}:interface={interface}:certKey={certfile}:privateKey={key}",
                kind)
    return f"tcp:{port}:interface={interface}", kind


class ClientProbe(Probe):
    """A connection the client under test made: recorded apart until a case takes it."""

    listener: Listener
    peer = "client"

    def connectionMade(self) -> None:
        super().connectionMade()
        self.listener._arrived(self)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        super().messageReceived(data, binary)
        held = self.listener.held
        if self in held and sum(probe.queued_bytes for probe in held) > HELD_BYTES:
            self.recorder.add(self.number, "event", text=(
                f"the connections no case has taken hold more than {HELD_BYTES} bytes the kit "
                "has not read: the kit aborts this one"))
            held.remove(self)
            self.abort()

    async def ping(self, payload: bytes, timeout: float = 3.0) -> list[bytes]:
        """Send a WebSocket ping carrying `payload`; the pongs that came, until one carried
        it or `timeout` passed. A pong may come unasked (RFC 6455, 5.5.3: a heartbeat), so a
        case judges whether any carried the payload, not the first. NotApplicable off a
        WebSocket."""
        from wireproto.transports.websocket import WebSocketServerAdapter

        transport = self.transport
        if not isinstance(transport, WebSocketServerAdapter):
            raise NotApplicable("a WebSocket ping: this connection is no WebSocket")
        pongs: list[bytes] = []
        own = transport.onPong

        def heard(data: bytes) -> None:
            if len(pongs) < 100:
                pongs.append(bytes(data))
                self.recorder.add(self.number, "received", bytes(data), True, "a pong")
            own(data)

        # Autobahn tells of a pong through onPong, a method: this connection's own, for now.
        setattr(transport, "onPong", heard)  # noqa: B010
        try:
            self.recorder.add(self.number, "sent", payload, True, "a WebSocket ping")
            transport.sendPing(payload)
            deadline = self.reactor.seconds() + timeout
            while payload not in pongs and self.is_open:
                left = deadline - self.reactor.seconds()
                if left <= 0:
                    break
                waiter: defer.Deferred[None] = defer.Deferred()
                self.reactor.callLater(min(left, 0.05), waiter.callback, None)
                await waiter
        finally:
            setattr(transport, "onPong", own)  # noqa: B010
        return pongs

    def adopt(self, recorder: Recorder) -> None:
        """From now on record into `recorder` (a case's), with what was recorded since the
        connection was made."""
        if recorder is self.recorder:
            return
        number = recorder.number()
        held = self.recorder
        for exchange in held.exchanges:
            recorder.add(number, exchange.direction, exchange.data, exchange.binary,
                         exchange.text)
        self.recorder, self.number = recorder, number


class Listener:
    """The kit's listening side for one run. `probe_options` are the keyword arguments each
    Probe is made with (its receive timeout); `make_factory(make_probe)`, when given, is the
    factory to listen with (a kit's own Engine.IO site, say) in place of the one the address
    implies."""

    def __init__(self, reactor: IReactorTime, address: str, *, framing: str | None = None,
                 certfile: str | None = None, keyfile: str | None = None,
                 receive_timeout: float = 2.0,
                 make_factory: MakeFactory | None = None) -> None:
        self.reactor = reactor
        self.address = address
        self.framing = framing
        self.endpoint, self.kind = listening_endpoint(address, certfile, keyfile)
        self.receive_timeout = receive_timeout
        self._make_factory = make_factory
        self._port: IListeningPort | None = None
        self.held: list[ClientProbe] = []
        self._waiting: list[defer.Deferred[None]] = []
        # When each connection was made (the reactor's clock), refused ones included.
        self.attempts: list[float] = []
        # While True, each new connection is closed as soon as it is made.
        self.refusing = False
        self.refused = 0
        self.bound_port: int | None = None
        self.stopped = False

    # -- listening --------------------------------------------------------------------------------

    def _factory(self) -> IProtocolFactory:
        if self._make_factory is not None:
            return self._make_factory(self._new_probe)
        if self.kind == "websocket":
            from wireproto.transports.websocket import WebSocketOptions, websocket_server_factory

            options = WebSocketOptions(max_message_size=PROBE_MAX_MESSAGE,
                                       auto_ping_interval=None, auto_ping_timeout=None)
            return websocket_server_factory(self._new_probe, options)
        if self.kind == "stream":
            from wireproto.transports.stream import StreamOptions, stream_server_factory

            stream = StreamOptions(framing=self.framing or "length32",
                                   max_message_size=PROBE_MAX_MESSAGE, keepalive_idle=0)
            return stream_server_factory(self._new_probe, stream)
        raise ValueError(f"the {self.address!r} address needs its kit's own listening factory "
                         "(Engine.IO is nydus's)")

    async def start(self) -> None:
        """Listen; ValueError (with why) when the address cannot be listened on."""
        factory = self._factory()  # its own ValueError: no listening was tried
        try:
            endpoint = serverFromString(self.reactor, self._endpoint_now())
        except Exception as error:  # noqa: BLE001 - OpenSSL's own, for a certificate it cannot read
            detail = str(error) or type(error).__name__
            if self.endpoint.startswith("ssl:"):
                detail = (f"the certificate and key (--cert, --key; a --cert without --key must "
                          f"hold its key too) could not be read: {detail}")
            raise ValueError(f"cannot listen on {self.address}: {detail}") from error
        try:
            self._port = await endpoint.listen(factory)
        except Exception as error:  # noqa: BLE001 - said to the user, who gave the address
            raise ValueError(f"cannot listen on {self.address}: {error}") from error
        host = self._port.getHost()
        self.bound_port = getattr(host, "port", None)

    def _endpoint_now(self) -> str:
        """The endpoint, with the port bound the first time when it was 0: a pause and a
        resume listen on the same port again."""
        fields = self.endpoint.split(":")
        if self.bound_port is None or fields[0] not in ("tcp", "ssl"):
            return self.endpoint
        return ":".join([fields[0], str(self.bound_port), *fields[2:]])

    @property
    def url(self) -> str:
        """The address a client connects to: the one given, with the port bound for port 0."""
        if "://" not in self.address:
            if self.bound_port is None or self.kind != "stream" or \
                    self.endpoint.startswith("unix:"):
                return self.address
            return _stream_address(self.endpoint, self.bound_port)
        parts = urlsplit(self.address)
        if parts.scheme == "ws+unix" or self.bound_port is None:
            return self.address
        host = parts.hostname or "127.0.0.1"
        shown = f"[{host}]" if ":" in host else host
        return parts._replace(netloc=f"{shown}:{self.bound_port}").geturl()

    async def pause(self) -> None:
        """Stop listening (the client's next connections are refused by the system); the
        connections already made stay."""
        port, self._port = self._port, None
        if port is not None:
            await defer.maybeDeferred(port.stopListening)

    async def resume(self) -> None:
        """Listen again, on the same port."""
        if self._port is None:
            await self.start()

    async def stop(self) -> None:
        """Stop listening and close every connection; one whose handshake ends later is
        closed as it arrives."""
        self.stopped = True
        await self.pause()
        for probe in self.held:
            probe.abort()
        self.held.clear()

    # -- connections ------------------------------------------------------------------------------

    def _new_probe(self) -> Probe:
        probe = ClientProbe(Recorder(), self.reactor, self.receive_timeout)
        probe.listener = self
        return probe

    def note_attempt(self, refused: bool = False) -> None:
        """Count a connection the client made (or, `refused`, one refused), keeping the times
        of the newest ATTEMPTS_KEPT: a kit that refuses in its own way (nydus's handshakes)
        says so here."""
        self.attempts.append(self.reactor.seconds())
        if len(self.attempts) > 2 * ATTEMPTS_KEPT:  # trimmed now and then, not at each one
            del self.attempts[:-ATTEMPTS_KEPT]
        if refused:
            self.refused += 1

    def _arrived(self, probe: ClientProbe) -> None:
        if self.stopped:
            self.note_attempt()
            probe.abort()
            return
        self.note_attempt(refused=self.refusing)
        if self.refusing:
            probe.abort()
            return
        self.held.append(probe)
        while len(self.held) > HELD_LIMIT:
            self.held.pop(0).abort()
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            waiter.callback(None)

    async def accept(self, recorder: Recorder, timeout: float,
                     what: str = "the client to connect",
                     client: ClientProcess | None = None) -> ClientProbe:
        """The next connection the client made that is still open (or closed with messages
        unread), recorded from now on into `recorder`; CaseFailed when none comes within
        `timeout` seconds, or as soon as `client` (the process the kit started) has ended
        with none held."""
        deadline = self.reactor.seconds() + timeout
        while True:
            while self.held:
                probe = self.held.pop(0)
                probe.adopt(recorder)
                if probe.is_open or probe.received:
                    return probe
                recorder.add(probe.number, "event",
                             text="this connection closed before the case took it")
            if client is not None and client.status is not None:
                raise CaseFailed(f"expected {what}, but the client {client.described()}")
            left = deadline - self.reactor.seconds()
            if left <= 0:
                raise CaseFailed(f"expected {what} within {timeout:g} s; no connection came")
            # A started client is looked at again every PROCESS_CHECK seconds: one that ended
            # will never connect.
            await self._arrival(min(left, PROCESS_CHECK) if client is not None else left)

    async def wait_held(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a connection no case has taken yet; whether there
        is one (it stays held for the next `accept`)."""
        deadline = self.reactor.seconds() + timeout
        while not any(probe.is_open or probe.received for probe in self.held):
            left = deadline - self.reactor.seconds()
            if left <= 0:
                return False
            await self._arrival(left)
        return True

    async def _arrival(self, seconds: float) -> None:
        """Wait for a connection to arrive, or `seconds`."""
        waiter: defer.Deferred[None] = defer.Deferred()
        self._waiting.append(waiter)
        timer = self.reactor.callLater(
            seconds, lambda: None if waiter.called else waiter.callback(None))
        try:
            await waiter
        finally:
            if timer.active():
                timer.cancel()
            if waiter in self._waiting:
                self._waiting.remove(waiter)

    def drop_held(self) -> int:
        """Close the connections no case took (a new client process starts with none)."""
        dropped = len(self.held)
        for probe in self.held:
            probe.abort()
        self.held.clear()
        return dropped


def _stream_address(endpoint: str, port: int) -> str:
    """A client endpoint for the stream server endpoint `endpoint` bound to `port`."""
    fields = dict(part.split("=", 1) for part in endpoint.split(":")[2:] if "=" in part)
    host = fields.get("interface", "127.0.0.1").replace("\\:", ":")
    kind = "ssl" if endpoint.startswith("ssl:") else "tcp"
    return f"{kind}:{host}:{port}"

