"""The Engine.IO server: its sessions and slots, the handshake, request routing, and the
twisted.web resource."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger
from twisted.web.iweb import IRequest
from twisted.web.pages import notFound
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from wireproto import peerlog
from wireproto.codecs.engineio import (
    encode_handshake,
)
from wireproto.peerlog import address_key, describe_address
from wireproto.transports.base import (
    IMessageProtocol,
)
from wireproto.transports.engineio.handover import SessionOwners, pass_request
from wireproto.transports.engineio.options import (
    BAD_HANDSHAKE_METHOD,
    BAD_REQUEST,
    CLOSE_NORMAL,
    FORBIDDEN,
    POLLING,
    UNKNOWN_SID,
    UNKNOWN_TRANSPORT,
    UNSUPPORTED_PROTOCOL_VERSION,
    WEBSOCKET,
    EngineIOOptions,
)
from wireproto.transports.engineio.packets import Outgoing
from wireproto.transports.engineio.polling import refuse, respond
from wireproto.transports.engineio.session import EngineIOSession
from wireproto.transports.engineio.websocket import ServerWebSocket, ServerWebSocketFactory
from wireproto.transports.http import HTTPRefusal, Identify, admit, origin_allowed
from wireproto.transports.websocket_http import MessageWebSocketResource

if TYPE_CHECKING:
    from wireproto.access import Principal

__all__ = [
    "query_value",
    "EngineIOServer",
    "EngineIOResource",
    "engineio_resource",
]

log = Logger()

# -- the resource ---------------------------------------------------------------------------------


def query_value(request: Any, name: bytes) -> str | None:
    values = request.args.get(name)
    # URLSearchParams, as engine.io reads the query: the last value wins.
    return values[-1].decode("utf-8", "replace") if values else None


class EngineIOServer:
    """Every session of one engineio_resource, and the request handling."""

    def __init__(
        self, protocol_factory: Callable[[], IMessageProtocol], options: EngineIOOptions,
        reactor: Any, identify: Identify | None = None, owners: SessionOwners | None = None,
    ) -> None:
        self.protocol_factory = protocol_factory
        self.identify = identify
        # The other processes that share the listener, whose sessions' requests are passed to
        # them (wireproto.transports.engineio.handover).
        self.owners = owners
        self.options = options
        self.reactor = reactor
        # Every session until it is forgotten, open or closing (waiting to give a GET the close
        # packet); only open ones take a slot.
        self.sessions: dict[str, EngineIOSession] = {}
        self.open_sessions = 0
        self._open_by_address: Counter[str] = Counter()
        self.ws_factory = ServerWebSocketFactory(options.websocket)
        self.ws_resource = MessageWebSocketResource(self.ws_factory)

    def _slot_refusal(self, address: str) -> str | None:
        """Why a new session from `address` cannot have a slot, or None if it can."""
        options = self.options
        if self.open_sessions >= options.max_connections:
            return f"already {options.max_connections} sessions (max_connections)"
        if self._open_by_address[address] >= options.max_sessions_per_address:
            return (f"already {options.max_sessions_per_address} sessions from that address "
                    "(max_sessions_per_address)")
        return None

    def _add_session(self, session: EngineIOSession) -> None:
        self.sessions[session.sid] = session
        self.open_sessions += 1
        self._open_by_address[session.address] += 1

    def session_closing(self, session: EngineIOSession) -> None:
        """`session` left the open state: its slot is free."""
        self.open_sessions -= 1
        left = self._open_by_address[session.address] - 1
        if left > 0:
            self._open_by_address[session.address] = left
        else:
            del self._open_by_address[session.address]

    def session_finished(self, session: EngineIOSession) -> None:
        """`session` is over: its sid is unknown from now on."""
        if self.sessions.get(session.sid) is session:
            del self.sessions[session.sid]

    def _new_sid(self) -> str:
        # engine.io's base64id: 15 random bytes, URL-safe base64; marked as this process's
        # when others share the listener.
        while True:
            sid = secrets.token_urlsafe(15)
            if self.owners is not None:
                sid = self.owners.new_sid(sid)
            if sid not in self.sessions:
                return sid

    def handle(self, request: Any, *, passed: bool = False) -> Any:
        """Answer `request`; `passed` by another process that shares the listener, for a
        session of this one's."""
        if request.postpath != [b""]:
            # engine.io's path is "/engine.io/", trailing slash included.
            return notFound().render(request)
        if self._cors(request):
            return b""  # a preflight, answered
        transport = query_value(request, b"transport")
        sid = query_value(request, b"sid")
        version = query_value(request, b"EIO")
        upgrade = (request.getHeader(b"upgrade") or b"").lower() == b"websocket"
        if transport not in (POLLING, WEBSOCKET):
            return refuse(request, UNKNOWN_TRANSPORT)
        owners = self.owners
        if passed and owners is not None:
            owners.counts["taken"] += 1
        if sid:
            session = self.sessions.get(sid)
            if session is None:
                owner = None if passed or owners is None else owners.owner_of(sid)
                if owner is None:
                    return refuse(request, UNKNOWN_SID)
                assert owners is not None
                # A client gives up on a session by then (engine.io-client's ping timeout).
                deadline = self.options.ping_interval + self.options.ping_timeout
                return pass_request(request, owner, owners, deadline, self.reactor)
            if version != "4":
                return refuse(request, BAD_REQUEST)
            if upgrade:
                if transport != WEBSOCKET or not self.options.upgrades or not session.can_upgrade:
                    return refuse(request, BAD_REQUEST)
                return self._websocket(request, session.upgrade_opened, passed=passed)
            if transport != session.transportName:
                return refuse(request, BAD_REQUEST)
            if request.method == b"GET":
                return session.poll(request)
            if request.method == b"POST":
                return session.post(request)
            return refuse(request, BAD_REQUEST)
        if passed:
            return refuse(request, BAD_REQUEST)  # a handshake is never passed
        if request.method != b"GET":
            return refuse(request, BAD_HANDSHAKE_METHOD)
        if (transport == WEBSOCKET) != upgrade:
            return refuse(request, BAD_REQUEST)
        if not origin_allowed(request, self.options.allowed_origins):
            origin = request.getHeader(b"origin")
            log.info("refused an Engine.IO handshake from {peer}: origin {origin} is not allowed",
                     event="engineio_handshake_refused",
                     peer=describe_address(request.getClientAddress()),
                     origin=None if origin is None else origin.decode("latin-1"))
            # engine.io's 403 body is the same for every refusal: a client learns why here.
            request.setHeader(b"wireproto-refused", b"origin")
            return refuse(request, FORBIDDEN)
        allow = self.options.allow_request
        if allow is not None and not allow(request):
            return refuse(request, FORBIDDEN)
        if version != "4":
            return refuse(request, UNSUPPORTED_PROTOCOL_VERSION)
        if self.identify is not None:
            # Refused credentials get engine.io's own 403, which nydus-client reports as
            # "unauthorized" (and stops retrying); on a 401 it would retry forever. The
            # schemes the broker takes go with it, as with a 401 (RFC 9110 allows it).
            return admit(request, self.identify,
                         lambda principal: self._handshake(request, upgrade, principal),
                         _refuse_credentials)
        return self._handshake(request, upgrade, None)

    def _cors(self, request: Any) -> bool:
        """Let a page of an allowed origin read the answers to its polls, as engine.io's cors
        option does; answer its preflight (True when it was one). Without allowed_origins no
        page elsewhere may, as engine.io without that option. No credentials mode: a page
        sends its token itself, in a header."""
        origin = request.getHeader(b"origin")
        allowed_origins = self.options.allowed_origins
        allowed = (origin is not None and allowed_origins is not None
                   and origin_allowed(request, allowed_origins))
        if allowed:
            request.setHeader(b"access-control-allow-origin", origin)
            request.setHeader(b"vary", b"Origin")
        if request.method != b"OPTIONS":
            return False
        if not allowed:
            request.setResponseCode(403)
            return True
        request.setResponseCode(204)
        request.setHeader(b"access-control-allow-methods", b"GET, POST, OPTIONS")
        wanted = request.getHeader(b"access-control-request-headers")
        if wanted:
            names = [name.strip() for name in wanted.split(b",")]
            request.setHeader(b"access-control-allow-headers", b", ".join(
                name for name in names if name and name.replace(b"-", b"").isalnum()))
        request.setHeader(b"access-control-max-age", b"86400")
        return True

    def _handshake(self, request: Any, upgrade: bool, principal: Principal | None) -> Any:
        """A new session for `principal`, on a WebSocket or polling, if there is a slot."""
        peer = request.getClientAddress()
        refusal = self._slot_refusal(address_key(peer))
        if refusal is not None:
            peerlog.warn(log, address_key(peer), "refused an Engine.IO handshake from {peer}: "
                         "{why}", event="engineio_handshake_refused", peer=describe_address(peer),
                         why=refusal)
            respond(request, 503, b"Too many Engine.IO sessions", b"text/plain")
            return NOT_DONE_YET
        if upgrade:
            return self._websocket(
                request, lambda ws: self._open_websocket_session(ws, principal)
            )
        return self._polling_handshake(request, principal)

    def _polling_handshake(self, request: Any, principal: Principal | None) -> Any:
        protocol = self.protocol_factory()
        sid = self._new_sid()
        session = EngineIOSession(self, sid, request.getClientAddress(), request.getHost(),
                                  principal=principal)
        self._add_session(session)
        upgrades = (WEBSOCKET,) if self.options.upgrades else ()
        body = "0" + encode_handshake(self.options._handshake(sid, upgrades))
        respond(request, 200, body.encode("utf-8"), b"text/plain; charset=UTF-8", no_store=True)
        # After the answer, as engine.io: what the protocol sends now goes with the next GET.
        session.start(protocol)
        return NOT_DONE_YET

    def _websocket(self, request: Any, opened: Callable[[ServerWebSocket], None], *,
                   passed: bool = False) -> Any:
        """Hand the request to a WebSocket of its own, for `opened` once it is open."""
        return self.ws_resource.hand_over(request, lambda: ServerWebSocket(opened, passed=passed))

    def _open_websocket_session(self, ws: ServerWebSocket,
                                principal: Principal | None) -> None:
        peer, host = ws.addresses()
        if self._slot_refusal(address_key(peer)) is not None:
            ws.close_with(CLOSE_NORMAL, "too many Engine.IO sessions")
            return
        protocol = self.protocol_factory()
        sid = self._new_sid()
        session = EngineIOSession(self, sid, peer, host, principal=principal, websocket=ws)
        self._add_session(session)
        open_packet = "0" + encode_handshake(self.options._handshake(sid, ()))
        ws.send_packet(Outgoing(open_packet.encode("utf-8"), False))
        session.start(protocol)


class EngineIOResource(Resource):
    isLeaf = True

    def __init__(self, engine: EngineIOServer, *, passed: bool = False) -> None:
        super().__init__()
        # Not "server": twisted.web gives every Resource a `server` attribute of its own.
        self.engine = engine
        # Serves the requests other processes pass to this one (see for_passed_requests).
        self.passed = passed
        # A polling POST's payload: a GuardedSite refuses a larger body before reading it.
        self.max_request_body = engine.options.max_payload

    @property
    def checks_credentials(self) -> bool:
        """Whether its handshakes carry credentials, which engine.io clients repeat with every
        poll (the access log shows no query value)."""
        return self.engine.identify is not None

    def render(self, request: Any) -> Any:
        return self.engine.handle(request, passed=self.passed)

    def for_passed_requests(self) -> EngineIOResource:
        """The same server, for the requests that other processes sharing its listener pass to
        it (`SessionOwners`): it serves those for its own sessions, passes none on, and refuses
        any handshake."""
        return EngineIOResource(self.engine, passed=True)

    def render_content_too_large(self, request: Any) -> None:
        """A GuardedSite's answer to a POST over max_payload, which it did not read: 413, and
        the session that sent it is closed, as engine.io does."""
        session = self.engine.sessions.get(query_value(request, b"sid") or "")
        if session is not None and request.method == b"POST":
            session.post_too_large(request)
        else:
            respond(request, 413, b"", b"text/html")


DEFAULT_OPTIONS = EngineIOOptions()


def _refuse_credentials(request: IRequest, refusal: HTTPRefusal) -> None:
    if refusal.status == 401 and refusal.challenge:
        request.setHeader(b"www-authenticate", refusal.challenge.encode("ascii"))
    refuse(request, FORBIDDEN)


def engineio_resource(
    protocol_factory: Callable[[], IMessageProtocol],
    options: EngineIOOptions = DEFAULT_OPTIONS,
    *,
    reactor: Any = None,
    identify: Identify | None = None,
    owners: SessionOwners | None = None,
) -> EngineIOResource:
    """A twisted.web resource serving `protocol_factory()` protocols over Engine.IO 4, timing
    its pings and deadlines on `reactor` (the global reactor if None).

    Mount it as the child b"engine.io" of a Site's root (or at "/engine.io/" with
    `websocket_site`); it answers at "/engine.io/", trailing slash included. With `identify`,
    each handshake's principal comes from it first, and a refused one gets its HTTP status
    (nydus-client fires "unauthorized" on 403) without any session being made.

    With `owners`, other processes share its listener: its sids say they are this process's,
    and a request for a session of another one is passed to it
    (wireproto.transports.engineio.handover); its `for_passed_requests()` serves theirs.
    """
    if reactor is None:
        from twisted.internet import reactor
    return EngineIOResource(EngineIOServer(protocol_factory, options, reactor, identify, owners))
