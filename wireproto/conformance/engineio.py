"""Recorded Engine.IO 4 connections for the nydus kit: HTTP long-polling (`Polling`, on
twisted.web's Agent) and the WebSocket transport (`EngineIOSocket`, a `Probe` whose frames are
Engine.IO packets), so a case can speak Engine.IO packet by packet, upgrade a polling session
to a WebSocket, and break either on purpose. Every request, answer and frame goes to the case's
record, as a `Probe`'s messages do.

A user gives the server's Engine.IO address as `http://host:port/engine.io/` (or `https://`,
`ws://`, `wss://`); the query (`EIO=4&transport=...&sid=...`) is the kit's to add.
"""

from __future__ import annotations

from dataclasses import dataclass
from io import BytesIO
from urllib.parse import urlsplit, urlunsplit

from twisted.internet import defer, protocol
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.python.failure import Failure
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool, ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from wireproto.codecs import engineio
from wireproto.conformance.bounded import bounded
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed
from wireproto.conformance.probe import PROBE_MAX_MESSAGE, Probe, Received
from wireproto.errors import ProtocolError

__all__ = ["Answer", "EngineIOSocket", "Polling", "engineio_urls", "open_socket"]

# The most of an HTTP answer the kit reads: well above any maxPayload, short of exhausting it.
MAX_ANSWER = PROBE_MAX_MESSAGE


def engineio_urls(address: str) -> tuple[str, str]:
    """The polling (http) and WebSocket (ws) forms of the Engine.IO address `address`, each with
    its path ending in a slash (``/engine.io/`` when it has none) and no query."""
    parts = urlsplit(address)
    scheme = parts.scheme.lower()
    secure = scheme in ("https", "wss")
    if scheme not in ("http", "https", "ws", "wss"):
        raise ValueError(f"{address!r}: an Engine.IO address is http://, https://, ws:// or "
                         "wss://HOST:PORT/engine.io/")
    path = parts.path or "/engine.io/"
    if path == "/":
        path = "/engine.io/"
    if not path.endswith("/"):
        path += "/"
    http = urlunsplit(("https" if secure else "http", parts.netloc, path, "", ""))
    ws = urlunsplit(("wss" if secure else "ws", parts.netloc, path, "", ""))
    return http, ws


class EngineIOSocket(Probe):
    """An Engine.IO session on a WebSocket: each frame is one packet. With `auto_pong`, a
    server's ping ("2") is answered with a pong at once and not queued (`pings` counts them)."""

    auto_pong = True
    pings = 0
    opened: engineio.Handshake | None = None  # once open_packet has read it

    def messageReceived(self, data: bytes, binary: bool) -> None:
        if self.auto_pong and not binary and data == b"2" and self.connected:
            self.recorder.add(self.number, "received", bytes(data), False, "ping")
            self.pings += 1
            self.send(b"3", binary=False)
            return
        super().messageReceived(data, binary)

    def send_packet(self, text: str) -> None:
        """Send one text packet (its type digit and data, e.g. ``4`` and a nydus string)."""
        self.send(text.encode("utf-8"), binary=False)

    async def packet(self, timeout: float | None = None,
                     what: str = "an Engine.IO packet") -> engineio.Packet:
        """The next packet; CaseFailed if none comes or it is not a valid Engine.IO packet."""
        return decode_frame(await self.receive(timeout, what), what)

    async def open_packet(self) -> engineio.Handshake:
        """The open packet a WebSocket without a sid starts with, checked."""
        first = await self.packet(what="the open packet")
        self.opened = check_open(first)
        return self.opened


def decode_frame(received: Received, what: str) -> engineio.Packet:
    try:
        if received.binary:
            return engineio.decode_packet(received.data)
        return engineio.decode_packet(received.data.decode("utf-8"))
    except (ProtocolError, UnicodeDecodeError) as error:
        raise CaseFailed(f"expected {what}, got a frame that is no Engine.IO packet "
                         f"({error})") from None


def check_open(packet: engineio.Packet) -> engineio.Handshake:
    if packet.type is not engineio.PacketType.OPEN or not isinstance(packet.data, str):
        raise CaseFailed(f"expected the open packet (type 0), got type {int(packet.type)} "
                         f"{str(packet.data)[:60]!r}")
    try:
        return engineio.decode_handshake(packet.data)
    except ProtocolError as error:
        raise CaseFailed(f"the open packet is not valid: {error}") from None


async def open_socket(ctx: Context, sid: str | None = None, *, query: str = "") -> EngineIOSocket:
    """A recorded Engine.IO WebSocket to the target: a session of its own without `sid`, the
    upgrade of the polling session `sid` with it. `query` replaces the kit's query (to send a
    wrong one)."""
    from wireproto.transports.connect import connect
    from wireproto.transports.websocket import WebSocketOptions

    target = ctx.target
    _, ws = engineio_urls(target.address)
    if not query:
        query = "EIO=4&transport=websocket" + (f"&sid={sid}" if sid else "")
    socket = EngineIOSocket(ctx.recorder, ctx.reactor, target.receive_timeout, target.mask)
    ctx.probes.append(socket)
    options = WebSocketOptions(max_message_size=PROBE_MAX_MESSAGE, auto_ping_interval=None,
                               auto_ping_timeout=None)
    try:
        await connect(ctx.reactor, f"{ws}?{query}", lambda: socket, websocket=options,
                      headers=target.headers, cafile=target.cafile, insecure=target.insecure,
                      certfile=target.certfile, keyfile=target.keyfile)
    except Exception as error:  # noqa: BLE001 - the reason goes to the report
        text = str(error).strip() or type(error).__name__
        ctx.recorder.add(socket.number, "event", text=f"could not connect: {text}")
        raise CaseFailed(f"could not open the Engine.IO WebSocket: {text}") from error
    return socket


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: its status and its body."""

    status: int
    body: bytes

    def packets(self, what: str = "a polling payload") -> list[engineio.Packet]:
        if self.status != 200:
            raise CaseFailed(f"expected {what} with status 200, got {self.status} "
                             f"{self.body[:80]!r}")
        try:
            return engineio.decode_payload(self.body)
        except ProtocolError as error:
            raise CaseFailed(f"expected {what}, got a body that is no Engine.IO payload "
                             f"({error}): {self.body[:80]!r}") from None


class _Collect(protocol.Protocol):
    def __init__(self, done: defer.Deferred[bytes], limit: int) -> None:
        self.done, self.limit, self.size = done, limit, 0
        self.parts: list[bytes] = []

    def dataReceived(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            stop = getattr(self.transport, "stopProducing", None)
            if stop is not None:
                stop()
            if not self.done.called:
                self.done.errback(CaseFailed(f"the answer is over {self.limit} bytes"))
            return
        self.parts.append(data)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        if self.done.called:
            return
        if reason.check(ResponseDone) or type(reason.value).__name__ == "PotentialDataLoss":
            self.done.callback(b"".join(self.parts))
        else:
            self.done.errback(reason)


@implementer(IPolicyForHTTPS)
class _TLSPolicy:
    def __init__(self, cafile: str | None, insecure: bool, certfile: str | None,
                 keyfile: str | None) -> None:
        self.cafile, self.insecure, self.certfile, self.keyfile = (cafile, insecure, certfile,
                                                                    keyfile)

    def creatorForNetloc(self, hostname: bytes, port: int) -> IOpenSSLClientConnectionCreator:
        from wireproto.transports.connect import tls_client_options
        options: IOpenSSLClientConnectionCreator = tls_client_options(
            hostname.decode("ascii"), cafile=self.cafile, insecure=self.insecure,
            certfile=self.certfile, keyfile=self.keyfile)
        return options


class Polling(Probe):
    """An Engine.IO session on HTTP long-polling, recorded. `handshake` opens it (`sid`);
    `get` polls, `post` sends packets, `request` sends anything. Requests still waiting when
    the case ends are cancelled."""

    def __init__(self, ctx: Context) -> None:
        target = ctx.target
        super().__init__(ctx.recorder, ctx.reactor, target.receive_timeout, target.mask)
        ctx.probes.append(self)
        self.base, _ = engineio_urls(target.address)
        self.headers = dict(target.headers)
        self.pool = HTTPConnectionPool(ctx.reactor, persistent=False)
        policy = _TLSPolicy(target.cafile, target.insecure, target.certfile, target.keyfile)
        self.agent = Agent(ctx.reactor, contextFactory=policy, pool=self.pool)
        self.sid: str | None = None
        self.in_flight: list[defer.Deferred[Answer]] = []
        self.pending: list[str] = []  # message packets polled but not yet taken

    def release(self) -> None:
        super().release()
        self.pending.clear()

    async def request(self, method: str, query: str, body: bytes | None = None,
                      timeout: float | None = None) -> Answer:
        """One recorded HTTP request to the Engine.IO path with `query`; CaseFailed when no
        answer comes within `timeout` or the connection fails."""
        seconds = self.receive_timeout if timeout is None else timeout
        headers = Headers({name: [value] for name, value in self.headers.items()})
        if body is not None:
            headers.setRawHeaders("content-type", ["text/plain;charset=UTF-8"])
        self.recorder.add(self.number, "sent", body if body is not None else b"", False,
                          f"{method} ?{query}")
        work = defer.ensureDeferred(self._request(method, f"{self.base}?{query}", headers,
                                                  body))
        self.in_flight.append(work)
        work.addTimeout(seconds, self.reactor)
        try:
            answer = await work
        except defer.TimeoutError:
            self.recorder.add(self.number, "event", text=f"no answer within {seconds:g} s")
            raise CaseFailed(f"expected an answer to {method} ?{query} within {seconds:g} s, "
                             "got none") from None
        except CaseFailed:
            raise
        except Exception as error:  # noqa: BLE001 - the server's doing, for the report
            text = str(error).strip() or type(error).__name__
            self.recorder.add(self.number, "event", text=f"request failed: {text}")
            raise CaseFailed(f"{method} ?{query} failed: {text}") from None
        finally:
            if work in self.in_flight:
                self.in_flight.remove(work)
        self.recorder.add(self.number, "received", answer.body, False,
                          f"HTTP {answer.status}")
        return answer

    async def _request(self, method: str, url: str, headers: Headers,
                       body: bytes | None) -> Answer:
        producer = None if body is None else FileBodyProducer(BytesIO(body))
        response = await self.agent.request(method.encode("ascii"), url.encode("ascii"),
                                            headers, producer)
        done: defer.Deferred[bytes] = defer.Deferred()
        response.deliverBody(_Collect(done, MAX_ANSWER))
        return Answer(response.code, self.mask(await done))

    def query(self, sid: str | None = None) -> str:
        sid = self.sid if sid is None else sid
        return "EIO=4&transport=polling" + (f"&sid={sid}" if sid else "")

    async def handshake(self) -> engineio.Handshake:
        """Open the session: the open packet, checked; `sid` is set."""
        answer = await self.request("GET", self.query(""))
        packets = answer.packets("the open packet")
        if not packets:
            raise CaseFailed("the handshake's payload holds no packet")
        opened = check_open(packets[0])
        self.sid = opened.sid
        return opened

    async def get(self, timeout: float | None = None,
                  what: str = "a polling payload") -> list[engineio.Packet]:
        """Poll once: the packets of the answer (status 200 expected)."""
        return (await self.request("GET", self.query(), timeout=timeout)).packets(what)

    async def get_message(self, timeout: float | None = None,
                          what: str = "a message packet") -> str:
        """Poll until a message packet comes (answering pings), and give its text."""
        deadline = self.reactor.seconds() + (self.receive_timeout if timeout is None
                                             else timeout)
        while not self.pending:
            left = deadline - self.reactor.seconds()
            if left <= 0:
                raise CaseFailed(f"expected {what} within the time given, got none")
            for packet in await self.get(left, what):
                if packet.type is engineio.PacketType.PING:
                    await self.post("3")
                elif packet.type is engineio.PacketType.MESSAGE:
                    if not isinstance(packet.data, str):
                        raise CaseFailed(f"expected {what} as text, got a binary message")
                    self.pending.append(packet.data)
                elif packet.type is not engineio.PacketType.NOOP:
                    raise CaseFailed(f"expected {what}, got packet type {int(packet.type)} "
                                     f"{bounded(packet.data)}")
        return self.pending.pop(0)

    async def post(self, payload: str | bytes, timeout: float | None = None) -> Answer:
        """POST `payload` (packets already joined) to the session."""
        body = payload.encode("utf-8") if isinstance(payload, str) else payload
        return await self.request("POST", self.query(), body, timeout)

    def close(self) -> None:
        for work in list(self.in_flight):
            work.cancel()
        self.in_flight.clear()
        self.pool.closeCachedConnections()
