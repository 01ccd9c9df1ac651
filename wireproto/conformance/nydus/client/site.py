"""The nydus client kit's listening side: an Engine.IO 4 site (``http://HOST:PORT/engine.io/``)
that takes a client over long-polling and over the WebSocket upgrade, as wireproto's own
Engine.IO server does (wireproto.transports.engineio), and records what the client does.

Each Engine.IO session is one `ClientProbe` of the kit's Listener: its messages are the nydus
strings the client sends, and what a case sends goes out as message packets. Besides, every
HTTP request the client makes (its query, a POST's packets), every WebSocket frame it sends
and how its WebSockets end are kept in the session's `Trace`, and noted in the case's record,
so that a case can judge the handshake's query, the polling framing, the upgrade, the pongs and
the closes. `send_packet` sends any Engine.IO packet, well-formed or not; `stop_pinging` stops
the server's heartbeat of a session.

What the site keeps is bounded: the traces of the last TRACED_SESSIONS sessions, each of its
last TRACE_LIMIT events with their first KEPT_TEXT characters; requests that belong to no
session (a refused handshake, an unknown sid) in `stray`. A POST body over max_payload is
refused (413) before it is read, as wireproto's server does.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from twisted.internet.interfaces import IProtocolFactory, IReactorTime
from twisted.web.server import NOT_DONE_YET, Request

from wireproto.codecs import engineio
from wireproto.conformance.listener import Listener
from wireproto.conformance.probe import Probe
from wireproto.errors import ProtocolError
from wireproto.redaction import REDACTED, is_secret_parameter
from wireproto.transports.engineio.options import EngineIOOptions
from wireproto.transports.engineio.packets import Outgoing
from wireproto.transports.engineio.polling import respond
from wireproto.transports.engineio.server import EngineIOResource, EngineIOServer, query_value
from wireproto.transports.engineio.session import EngineIOSession
from wireproto.transports.engineio.websocket import ServerWebSocket, WebSocketOwner
from wireproto.transports.http import HTTPLimits
from wireproto.transports.websocket import WebSocketOptions
from wireproto.transports.websocket_http import websocket_site

__all__ = ["SITE_OPTIONS", "EngineIOSite", "Seen", "Trace", "make_factory", "send_packet",
           "session_of", "stop_pinging", "trace_of"]

# What the site offers a client: engine.io's defaults, but for a heartbeat short enough for
# cases to see a few pings within their seconds.
SITE_OPTIONS = EngineIOOptions(
    ping_interval=1.5, ping_timeout=2.0, max_payload=1_000_000, max_connections=64,
    max_sessions_per_address=64, first_request_timeout=10.0,
    websocket=WebSocketOptions(auto_ping_interval=None, auto_ping_timeout=None))
TRACED_SESSIONS = 64
TRACE_LIMIT = 500
KEPT_TEXT = 1024


@dataclass(frozen=True, slots=True)
class Seen:
    """One thing the client did: an HTTP request (`kind` its method, or ``websocket`` for the
    request that opens one), a WebSocket frame it sent (``frame``), or its WebSocket's end
    (``closed``). `query` is the request's query (the last value of each name); `packets` the
    packets a POST or a frame held, each as its text form (``3``, ``2probe``, ``4...``), or
    ``!`` and why for what was no packet."""

    at: float
    kind: str
    query: dict[str, str] = field(default_factory=dict)
    packets: tuple[str, ...] = ()
    size: int = 0
    path: str = ""
    text: str = ""


class Trace:
    """What one session's client did, in order (its last TRACE_LIMIT events)."""

    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.probe: Probe | None = None  # the session's, once seen
        self.seen: deque[Seen] = deque(maxlen=TRACE_LIMIT)

    def of(self, *kinds: str) -> list[Seen]:
        return [seen for seen in self.seen if seen.kind in kinds]

    def packets(self) -> list[str]:
        """Every packet the client sent on this session, polling or WebSocket, in order."""
        return [packet for seen in self.seen for packet in seen.packets]


def _packets(body: bytes, polling: bool) -> tuple[str, ...]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return ("! not UTF-8",)
    if not polling:
        return (text[:KEPT_TEXT],)
    try:
        engineio.decode_payload(text)
    except ProtocolError as error:
        return (f"! {error}"[:KEPT_TEXT],)
    return tuple(part[:KEPT_TEXT] for part in text.split(engineio.SEPARATOR))


class _RecordingWebSocket(ServerWebSocket):
    engine: _RecordingEngine
    sid = ""
    # The request that opened it, noted once its session (one of its own) is known.
    opening: Seen | None = None

    def attach(self, owner: WebSocketOwner) -> None:
        super().attach(owner)
        opening, self.opening = self.opening, None
        if opening is not None and isinstance(owner, EngineIOSession):
            # Its session is not yet among the server's (it is being made): noted just after.
            self.engine.reactor.callLater(0, self.engine.note, owner.sid, opening)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        if isBinary:
            packets: tuple[str, ...] = ("b" + payload[:KEPT_TEXT].hex(),)
        else:
            packets = _packets(payload, polling=False)
        self.engine.note(self._sid(), Seen(self.engine.reactor.seconds(), "frame",
                                           packets=packets, size=len(payload)))
        super().onMessage(payload, isBinary)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.engine.note(self._sid(), Seen(self.engine.reactor.seconds(), "closed",
                                           text=f"code {code} {reason or ''}".strip()))
        super().onClose(wasClean, code, reason)

    def _sid(self) -> str:
        owner = self._owner
        return self.sid or (owner.sid if isinstance(owner, EngineIOSession) else "")


class _RecordingEngine(EngineIOServer):
    """wireproto's Engine.IO server, noting each request and frame of the client."""

    site: EngineIOSite
    _opening: Seen | None = None

    def handle(self, request: Request, *, passed: bool = False) -> bytes | int:
        args: dict[bytes, list[bytes]] = request.args or {}
        # A client's credentials in its query (?token=) are kept out of every record.
        query = {name: REDACTED if is_secret_parameter(name) else value
                 for name, value in ((raw.decode("utf-8", "replace"),
                                      values[-1].decode("utf-8", "replace")[:200])
                                     for raw, values in list(args.items())[:20] if values)}
        method = request.method.decode("ascii", "replace")
        body = b""
        if method == "POST" and request.content is not None:
            body = request.content.read()
            request.content.seek(0)
        sid = query_value(request, b"sid") or ""
        listener = self.site.listener
        if not sid and listener is not None and listener.refusing:
            # A refused handshake makes no session: the client never opens, as when a server
            # is overloaded (503), and its backoff is not reset by an open that dies at once.
            listener.note_attempt(refused=True)
            self.site.stray.append(Seen(self.reactor.seconds(), "refused", query))
            respond(request, 503, b"refusing sessions for now", b"text/plain")
            return NOT_DONE_YET
        before = set(self.sessions)
        upgrade = (request.getHeader(b"upgrade") or b"").lower() == b"websocket"
        seen = Seen(self.reactor.seconds(), "websocket" if upgrade else method, query,
                    _packets(body, polling=True) if body else (), len(body),
                    request.path.decode("utf-8", "replace")[:200])
        # A WebSocket without a sid has its session once it is open: its request waits.
        self._opening = seen if upgrade and not sid else None
        try:
            answer = super().handle(request, passed=passed)
        finally:
            opening, self._opening = self._opening, None
        if opening is None:
            made = [new for new in self.sessions if new not in before]
            self.note(sid or (made[0] if made else ""), seen)
        return answer

    def _websocket(self, request: Request, opened: Callable[[ServerWebSocket], None], *,
                   passed: bool = False) -> bytes | int:
        def make() -> ServerWebSocket:
            ws = _RecordingWebSocket(opened, passed=passed)
            ws.engine = self
            ws.sid = query_value(request, b"sid") or ""
            ws.opening, self._opening = self._opening, None
            return ws
        return self.ws_resource.hand_over(request, make)

    def note(self, sid: str, seen: Seen) -> None:
        session = self.sessions.get(sid) if sid else None
        if session is None and sid not in self.site.traces:
            self.site.stray.append(seen)
            return
        trace = self.site.trace(sid)
        trace.seen.append(seen)
        if session is not None and isinstance(session.protocol, Probe):
            trace.probe = session.protocol
        probe = trace.probe
        if probe is not None:
            if seen.kind in ("GET", "POST", "websocket"):
                what = f"{seen.kind} ?" + "&".join(f"{k}={v}" for k, v in seen.query.items())
                probe.recorder.add(probe.number, "event", text=f"HTTP {what}"[:300])
            for packet in seen.packets:
                if not packet.startswith("4"):  # messages are the probe's own record
                    probe.recorder.add(probe.number, "event",
                                       text=f"Engine.IO packet from the client: {packet[:80]}")
            if seen.kind == "closed":
                probe.recorder.add(probe.number, "event",
                                   text=f"the client's WebSocket closed: {seen.text}")


class EngineIOSite:
    """One run's Engine.IO site: `make_factory` is the Listener's."""

    def __init__(self, reactor: IReactorTime | None = None,
                 options: EngineIOOptions = SITE_OPTIONS) -> None:
        if reactor is None:
            from twisted.internet import reactor as global_reactor
            reactor = global_reactor
        self.reactor = reactor
        self.options = options
        self.traces: OrderedDict[str, Trace] = OrderedDict()
        self.stray: deque[Seen] = deque(maxlen=200)
        self.engine: _RecordingEngine | None = None
        self.listener: Listener | None = None

    def trace(self, sid: str) -> Trace:
        trace = self.traces.get(sid)
        if trace is None:
            trace = self.traces[sid] = Trace(sid)
            while len(self.traces) > TRACED_SESSIONS:
                self.traces.popitem(last=False)
        return trace

    def make_factory(self, make_probe: Callable[[], Probe]) -> IProtocolFactory:
        # The Listener's own method makes the probes: while it is `refusing`, handshakes are.
        owner = getattr(make_probe, "__self__", None)
        if isinstance(owner, Listener):
            self.listener = owner
        engine = _RecordingEngine(make_probe, self.options, self.reactor)
        engine.site = self
        self.engine = engine
        limits = HTTPLimits(max_body_bytes=self.options.max_payload, request_timeout=10.0,
                            max_pending_per_address=64, max_pending=128)
        return websocket_site({"/engine.io/": EngineIOResource(engine)}, limits=limits,
                              idle_timeout=10.0, served="/engine.io/ nydus")


def make_factory(make_probe: Callable[[], Probe]) -> IProtocolFactory:
    """The Listener's factory for an ``http://`` address: a new site of its own."""
    return EngineIOSite().make_factory(make_probe)


# -- what a case does with a session -----------------------------------------------------------


def session_of(probe: Probe) -> EngineIOSession:
    session = probe.transport
    if not isinstance(session, EngineIOSession):
        raise TypeError("the connection is no Engine.IO session of the kit's site")
    return session


def trace_of(probe: Probe) -> Trace:
    """What the client did on `probe`'s session."""
    session = session_of(probe)
    engine = session._server
    if not isinstance(engine, _RecordingEngine):
        raise TypeError("the session is not of the kit's site")
    return engine.site.trace(session.sid)


def send_packet(probe: Probe, segment: str, frame: bytes | None = None) -> None:
    """Send one packet as it is: `segment` in a polling payload, `frame` (its UTF-8 by default)
    as a WebSocket text frame. Nothing is checked: a case breaks the framing on purpose."""
    session = session_of(probe)
    data = segment.encode("utf-8") if frame is None else frame
    probe.recorder.add(probe.number, "sent", data, False, "Engine.IO packet")
    if session.is_open:
        session._transmit(Outgoing(data, False, segment))


def stop_pinging(probe: Probe) -> None:
    """The server stops its heartbeat of `probe`'s session: no ping, no ping timeout."""
    session_of(probe)._heartbeat.stop()

