"""The HTTP side of every WebSocket and Engine.IO listener: a twisted.web Site with limits.

twisted.web reads a request body whole (into memory, or a temporary file above 100 kB) before a
resource sees it, restarts its idle timer on every byte, and takes any number of requests that
are still arriving. `GuardedSite` closes those doors:

- **Bodies.** A resource says how large a body it takes in `max_request_body` (an attribute, 0
  when it takes none; Engine.IO's POSTs take its max_payload). A request whose Content-Length is
  over what its path takes, or over `HTTPLimits.max_body_bytes`, gets 413 at once, before any of
  the body is read; a chunked body is cut off with 413 as soon as it passes the limit. A body
  sent to a path that takes none is not read: the request is answered as if it had none, and the
  connection is closed after the answer.
- **Deadlines.** A request's whole head and body must arrive within `request_timeout` seconds of
  its first byte (of the connection, for the first request), however slowly it drips: 408, then
  the connection is closed. The idle timeout (between requests) stays the Site's own.
- **Pending requests.** A connection whose request has not fully arrived is pending; past
  `max_pending_per_address` pending connections from one address, a new connection gets 503
  and is closed, so slow or silent connections cannot take every file descriptor. When
  `max_pending` are pending in all, a newcomer from an address with fewer pending than the
  address with the most takes the place of that address's oldest (503), so a few addresses
  that drip requests cannot keep everyone else out; otherwise it gets 503. A WebSocket that
  finished its handshake, or a held Engine.IO poll, is not pending.
- **What a port serves.** A WebSocket or Engine.IO handshake answered 400 or 404 (a path
  nothing is served at, a protocol the path does not serve) carries `SERVES_HEADER`, every
  path of the port with its protocol (``/websmq websmq, /engine.io/ nydus``), so a client
  can say where it should have gone.
- **TLS on a plain port.** A connection whose first byte opens a TLS handshake (a ``wss://``
  or ``https://`` client) is closed at once, so the client fails now rather than at its
  handshake timeout.
- **The access log.** Each answered request is one ``http_request`` event at debug (nothing is
  built when debug is off), in place of twisted.web's Combined Log Format line. Its target and
  Referer are logged as `wireproto.redaction` shows a URL: no ``user:password@`` and no
  ``access_token`` value; on a path whose resource says `checks_credentials` (a listener or
  the admin API with [auth]) no query value at all, since engine.io clients repeat their token
  with every poll.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes, urlsplit

from autobahn.util import wildcards2patterns
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, ITCPTransport
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel
from twisted.web.http import Request as HTTPRequest
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from wireproto.logs import debugging
from wireproto.peerlog import address_key, describe_address
from wireproto.redaction import redact_url

if TYPE_CHECKING:
    from wireproto.access import Principal

__all__ = ["HTTPLimits", "GuardedSite", "max_request_body", "HTTPRefusal", "Identify", "admit",
           "origin_allowed", "SERVES_HEADER", "NotServed", "ServedDirectory", "text_answer"]

log = Logger()


class HTTPRefusal(Exception):
    """A handshake refused before any session exists: HTTP `status` (401 without credentials
    or with bad ones, 403 for a principal not allowed here, 503 when too busy to check), a
    `reason` code for the counters, and a message for the log; the client gets the status and
    `challenge` (a WWW-Authenticate value) only."""

    def __init__(self, status: int, reason: str, message: str, challenge: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.challenge = challenge


# A handshake's principal from its request (credentials, the TLS peer); fails with HTTPRefusal.
Identify = Callable[[Any], "defer.Deferred[Principal]"]

_REFUSAL_PHRASES = {401: b"Unauthorized", 403: b"Forbidden", 503: b"Service Unavailable"}
SERVES_HEADER = b"wireproto-serves"
TLS_HANDSHAKE = 0x16  # the first byte of a TLS ClientHello: no HTTP request starts so


def text_answer(request: IRequest, code: int, phrase: bytes, text: str) -> bytes:
    """Answer `request` with `code` and one line of plain text; returns the body to render."""
    body = f"{code} {phrase.decode('ascii')}: {text}\n".encode()
    request.setResponseCode(code, phrase)
    request.setHeader(b"content-type", b"text/plain; charset=utf-8")
    request.setHeader(b"x-content-type-options", b"nosniff")  # it may quote the request's path
    request.setHeader(b"content-length", b"%d" % len(body))
    return body


class NotServed(Resource):
    """404 for a path a listener's port serves nothing at, naming what it serves."""

    isLeaf = True

    def __init__(self, served: str) -> None:
        super().__init__()
        self.served = served

    def render(self, request: IRequest) -> bytes:
        path = request.path.decode("utf-8", "replace")
        what = f"; this port serves {self.served}" if self.served else ""
        return text_answer(request, 404, b"Not Found", f"nothing at {path}{what}")


class ServedDirectory(Resource):
    """A path above a port's routes: 404 for itself and for any child that is not a route,
    naming what the port serves."""

    def __init__(self, served: str) -> None:
        super().__init__()
        self.served = served

    def getChild(self, path: bytes, request: IRequest) -> IResource:
        return NotServed(self.served)

    def render(self, request: IRequest) -> bytes:
        return NotServed(self.served).render(request)


def admit(request: Any, identify: Identify, proceed: Callable[[Principal], Any],
          answer_refusal: Callable[[Any, HTTPRefusal], object] | None = None) -> Any:
    """Render `request` by `proceed(principal)` once `identify` gives its principal, or answer
    with the refusal's status (or by `answer_refusal(request, refusal)`, for a protocol with
    its own way to say no). `proceed` returns a body or NOT_DONE_YET, as render does."""

    def identified(principal: Principal) -> None:
        if getattr(request, "_disconnected", False):
            return  # gave up while its credentials were checked
        body = proceed(principal)
        if body is not NOT_DONE_YET:
            request.write(body)
            request.finish()

    def refused(failure: Failure) -> None:
        if getattr(request, "_disconnected", False):
            return
        error = failure.value
        if not isinstance(error, HTTPRefusal):
            log.failure("authenticating an HTTP handshake failed", failure,
                        event="handshake_auth_error")
            error = HTTPRefusal(503, "error", "authentication failed")
        if answer_refusal is not None and error.status in (401, 403):
            answer_refusal(request, error)
            return
        request.setResponseCode(error.status, _REFUSAL_PHRASES.get(error.status))
        if error.challenge:
            request.setHeader(b"www-authenticate", error.challenge.encode("ascii"))
        body = b"%d %s\n" % (error.status, _REFUSAL_PHRASES.get(error.status, b"Refused"))
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        request.setHeader(b"content-length", b"%d" % len(body))
        request.setHeader(b"cache-control", b"no-store")
        request.write(body)
        request.finish()

    defer.maybeDeferred(identify, request).addCallbacks(identified, refused).addErrback(
        lambda failure: log.failure("answering an HTTP handshake failed", failure,
                                     event="handshake_error")
    )
    return NOT_DONE_YET


def origin_allowed(request: IRequest, allowed: tuple[str, ...] | None) -> bool:
    """Whether a request's Origin header matches `allowed`, ``scheme://host:port`` patterns
    where ``*`` matches anything (None: any origin); a request without one is allowed."""
    origin = request.getHeader(b"origin")
    if allowed is None or origin is None:
        return True
    try:
        parts = urlsplit(origin.decode("ascii"))
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme.lower())
    except (UnicodeDecodeError, ValueError):
        return False
    if not parts.hostname or port is None:  # "null" (a sandboxed page, a file) and the like
        return False
    text = f"{parts.scheme.lower()}://{parts.hostname}:{port}"
    return any(pattern.match(text) for pattern in wildcards2patterns(allowed))


@dataclass(frozen=True)
class HTTPLimits:
    """Limits for every HTTP listener (the [http] table). Times are in seconds."""

    # The largest request body any path takes; each path may take less (or none).
    max_body_bytes: int = 1_048_576
    # A request's whole head and body, from its first byte.
    request_timeout: float = 10.0
    # Connections whose request is still arriving, from one address and in all (per listener).
    max_pending_per_address: int = 32
    max_pending: int = 512

    def __post_init__(self) -> None:
        if self.request_timeout <= 0:
            raise ValueError(f"request_timeout must be positive, not {self.request_timeout}")
        for name in ("max_body_bytes", "max_pending_per_address", "max_pending"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")


def max_request_body(resource: Any) -> int:
    """The largest body `resource` takes: its `max_request_body`, or 0."""
    return int(getattr(resource, "max_request_body", 0))


def checks_credentials(resource: Any) -> bool:
    """Whether requests to `resource` carry credentials: its `checks_credentials`, or False."""
    return bool(getattr(resource, "checks_credentials", False))


def _status_only(code: int, phrase: bytes) -> bytes:
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s\n" % (code, phrase, len(phrase) + 1, phrase)
    )


_TOO_SLOW = _status_only(408, b"Request Timeout")
_BUSY = _status_only(503, b"Service Unavailable")
_URI_TOO_LONG = _status_only(414, b"URI Too Long")
_HEADER_TOO_LONG = _status_only(431, b"Request Header Fields Too Large")


class _GuardedRequest(Request):
    """Counts the body as it arrives, and stops taking it the moment it passes the limit."""

    channel: _GuardedChannel
    body_limit: int | None = None
    # Set when the body was over the limit: it was not read (or only in part).
    content_too_large = False
    _body_bytes = 0

    def handleContentChunk(self, data: bytes) -> None:
        if self.content_too_large:
            return
        limit = self.body_limit
        if limit is not None:
            self._body_bytes += len(data)
            if self._body_bytes > limit:
                self.channel.body_over_limit(self)
                return
        super().handleContentChunk(data)

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        super().setResponseCode(code, message)
        served = self.channel.site.served if self.channel is not None else ""
        if code in (400, 404) and served and (
                (self.getHeader(b"upgrade") or b"").lower() == b"websocket"
                or b"EIO" in (self.args or {})):
            self.setHeader(SERVES_HEADER, served.encode("utf-8"))

    def render(self, resource: Any) -> None:
        if self.content_too_large:
            answer = getattr(resource, "render_content_too_large", None)
            if answer is not None:
                answer(self)
                return
            self.setResponseCode(413)
            self.setHeader(b"content-type", b"text/plain")
            self.write(b"Content Too Large\n")
            self.finish()
            return
        super().render(resource)


class _GuardedChannel(HTTPChannel):
    site: GuardedSite
    # TCP, TLS or unix: each can abortConnection, which ITransport does not name
    transport: ITCPTransport | None
    _pending = False
    _refused = False
    # The rest of a body that was over the limit: not read.
    _discarding = False
    _deadline: IDelayedCall | None = None
    _abort_call: IDelayedCall | None = None
    _address: str = ""
    _spoke = False  # whether any byte came yet

    def connectionMade(self) -> None:
        super().connectionMade()
        self._address = address_key(self.getPeer())
        if not self.site.admit(self._address):
            self.refuse(_BUSY, "too_many_pending", "too many pending requests", quiet=True)
            return
        self.site.channels.add(self)
        self._begin_request()

    def dataReceived(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._spoke and data:
            self._spoke = True
            if data[0] == TLS_HANDSHAKE:
                # A TLS client (wss://, https://) on this plain port: closed at once, so it
                # fails now rather than waiting out its handshake timeout.
                self._refused = True
                self._end_request()
                if self.transport is not None:
                    self.transport.abortConnection()
                return
        if not self._pending and not self._handlingRequest:
            # The first bytes of the next request on a kept-alive connection.
            self._begin_request()
        super().dataReceived(data)

    def rawDataReceived(self, data: bytes) -> None:
        if not self._discarding:
            super().rawDataReceived(data)

    def lineLengthExceeded(self, line: bytes) -> None:
        # A line of the head past MAX_LENGTH (16 KiB), which twisted.web closes without a
        # word: its request line (no line of this request counted yet) or a header's.
        first = self._receivedHeaderSize == 0
        self.refuse(_URI_TOO_LONG if first else _HEADER_TOO_LONG, "line_too_long",
                    f"{'its request line' if first else 'a header line'} is over "
                    f"{self.MAX_LENGTH} bytes", quiet=True)

    def lineReceived(self, line: bytes) -> None:
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            # The head's lines together past 16 KiB, each within it: twisted.web answers a
            # bare 400 with no word of why.
            self.refuse(_HEADER_TOO_LONG, "line_too_long",
                        f"its head is over {self.totalHeadersSize} bytes", quiet=True)
            return
        super().lineReceived(line)

    def allHeadersReceived(self) -> None:
        takes = min(self.site.body_limit_for(self._path), self.site.limits.max_body_bytes)
        announced = self.length  # None for a chunked body: counted as it comes
        if announced <= takes if announced is not None else takes > 0:
            super().allHeadersReceived()
            self.requests[-1].body_limit = takes
            return
        # Not read at all: the request goes on without its body, and the connection closes
        # after the answer. A path that takes a body answers 413. No "100 Continue" invites
        # the body either.
        self.length, self._transferDecoder = 0, None
        self.requests[-1].requestHeaders.removeHeader(b"expect")
        super().allHeadersReceived()
        self.requests[-1].body_limit = takes
        self._stop_reading_body(self.requests[-1], too_large=takes > 0)

    def body_over_limit(self, request: _GuardedRequest) -> None:
        """A chunked body just passed the limit: answer now, and read no more of it."""
        self._stop_reading_body(request, too_large=True)
        self.allContentReceived()

    def _stop_reading_body(self, request: _GuardedRequest, *, too_large: bool) -> None:
        self.persistent = False
        self._discarding = True
        if too_large:
            request.content_too_large = True
            self.site.refusals["body_too_large"] += 1
            # Counted here; the resource that answers says more (Engine.IO logs the session).
            log.debug("refused a request body from {peer}: over {limit} bytes",
                      event="http_refused", reason="body_too_large", peer=self._address,
                      limit=request.body_limit)

    def _finishRequestBody(self, data: bytes) -> None:
        if not self._discarding:  # a chunked body cut off: its end was not waited for
            super()._finishRequestBody(data)

    def allContentReceived(self) -> None:
        self._end_request()
        super().allContentReceived()

    def _respondToBadRequestAndDisconnect(self) -> None:
        self._end_request()
        if not self._discarding:  # the rest of a cut-off body is not parsed
            super()._respondToBadRequestAndDisconnect()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._end_request()
        if self._abort_call is not None and self._abort_call.active():
            self._abort_call.cancel()
        super().connectionLost(reason)

    # -- pending requests and their deadline -----------------------------------------------------

    def _begin_request(self) -> None:
        self._pending = True
        self.site.pending_began(self)
        self._deadline = self.callLater(self.site.limits.request_timeout, self._too_slow)

    def _end_request(self) -> None:
        if not self._pending:
            return
        self._pending = False
        self.site.pending_ended(self)
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        timeout = self.site.limits.request_timeout
        self.refuse(_TOO_SLOW, "request_timeout", f"not whole within {timeout:g} s", quiet=True)

    def refuse(self, response: bytes, reason: str, detail: str, *, quiet: bool = False) -> None:
        """Answer with a bare status, read nothing more, and close the connection. `reason` is
        counted in the site's `refusals`."""
        if self._refused:
            return
        self._refused = True
        self._end_request()
        self.site.refusals[reason] += 1
        (log.debug if quiet else log.info)(
            "refused an HTTP request from {peer}: {detail}", event="http_refused",
            peer=self._address, reason=reason, detail=detail,
        )
        self.setTimeout(None)
        transport = self.transport
        if transport is None:  # gone already
            return
        transport.write(response)
        transport.loseConnection()
        # A peer that does not read the answer does not keep the connection either.
        self._abort_call = self.callLater(self.site.limits.request_timeout,
                                          transport.abortConnection)


class GuardedSite(Site):
    """A Site whose requests are bounded as the module docstring says."""

    # a plain HTTP/1.1 channel, where Twisted's own type names its HTTP/2-negotiating wrapper
    protocol = _GuardedChannel  # type: ignore[assignment]
    requestFactory = _GuardedRequest

    def __init__(self, root: IResource, limits: HTTPLimits, *, idle_timeout: float,
                 served: str = "") -> None:
        super().__init__(root, timeout=idle_timeout)
        self.limits = limits
        # Each WebSocket and Engine.IO path with its protocol, for SERVES_HEADER.
        self.served = served
        # The pending connections of each address, oldest first.
        self._pending_by_address: dict[str, dict[_GuardedChannel, None]] = {}
        # Open HTTP connections (weakly: one taken over by a WebSocket is no longer HTTP).
        self.channels: weakref.WeakSet[_GuardedChannel] = weakref.WeakSet()
        self.pending = 0
        # Refused connections by reason: body_too_large, request_timeout, too_many_pending,
        # displaced, line_too_long.
        self.refusals: Counter[str] = Counter()

    def close_http_connections(self) -> int:
        """Close every connection still speaking HTTP once what was written to it (an answered
        poll, say) is sent; how many were still open."""
        open_now = 0
        for channel in list(self.channels):
            transport = channel.transport
            if transport is None or getattr(transport, "protocol", channel) is not channel:
                continue  # closed, or taken over by a WebSocket
            if not getattr(transport, "disconnected", False):
                open_now += 1
                channel.loseConnection()
        return open_now

    def admit(self, address: str) -> bool:
        """Whether a new connection from `address` may be pending, making room for it by
        refusing the oldest pending connection of the address with the most if need be."""
        limits = self.limits
        mine = len(self._pending_by_address.get(address, ()))
        if mine >= limits.max_pending_per_address:
            return False
        if self.pending < limits.max_pending:
            return True
        heaviest = max(self._pending_by_address.values(), key=len)
        if len(heaviest) <= mine + 1:
            return False  # as fair as it gets: everyone waits its turn
        oldest = next(iter(heaviest))
        oldest.refuse(_BUSY, "displaced", "made room for an address with fewer pending",
                      quiet=True)
        return True

    def pending_began(self, channel: _GuardedChannel) -> None:
        self.pending += 1
        self._pending_by_address.setdefault(channel._address, {})[channel] = None

    def pending_ended(self, channel: _GuardedChannel) -> None:
        self.pending -= 1
        pending = self._pending_by_address[channel._address]
        del pending[channel]
        if not pending:
            del self._pending_by_address[channel._address]

    def log(self, request: HTTPRequest) -> None:
        """`request`, answered, as an ``http_request`` event at debug, without the credentials
        it carried (twisted.web would write its Combined Log Format line)."""
        if not debugging():
            return
        every_value = checks_credentials(self.resource_at(request.uri))
        referer = request.getHeader(b"referer")
        agent = request.getHeader(b"user-agent")
        log.debug(
            "HTTP {method} {target} from {peer}: {status}, {bytes} bytes", event="http_request",
            peer=describe_address(request.getClientAddress()),
            method=request.method.decode("latin-1"),
            target=redact_url(request.uri.decode("latin-1"), every_value=every_value),
            status=request.code, bytes=request.sentLength,
            referer=None if referer is None else redact_url(referer.decode("latin-1")),
            user_agent=None if agent is None else agent.decode("latin-1"),
        )

    def body_limit_for(self, target: bytes) -> int:
        """What the resource at request target `target` takes as a body."""
        return max_request_body(self.resource_at(target))

    def resource_at(self, target: bytes) -> Any:
        """The resource at request target `target`, found as twisted.web finds it: through the
        static children down to a leaf; None where there is none."""
        path = target.split(b"?", 1)[0]
        resource: Any = self.resource
        for segment in path.split(b"/")[1:]:
            if getattr(resource, "isLeaf", False):
                break
            # twisted.web unquotes each segment before it looks for a child: /%65ngine.io/ is
            # /engine.io/ to it, so to its body limit and its access log too.
            resource = getattr(resource, "children", {}).get(unquote_to_bytes(segment))
            if resource is None:
                return None
        return resource

