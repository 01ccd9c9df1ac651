"""Who may use the admin API: with [auth], the principals [admin] allow names; without it, only
clients on the broker's own machine, asking for it by a loopback name.

Either way, a request from a web page elsewhere is refused before anything else: a browser that
says where a request comes from (its Origin header) must name the broker's own origin, or one
[websocket] allowed_origins lists (a broker behind a proxy, whose page's origin is not the Host
it sees). A GET needs no preflight, so a page elsewhere could make one through the browser of
someone on this machine, or of an admin, even without reading the answer: open every tap, say.
Such a GET may carry no Origin; the browser's Sec-Fetch-Site, else its Referer, says where it
comes from instead. Clients that send none of them (curl, scripts) are not browsers and are let
through.

A request that changes something must also be one a web page elsewhere cannot make: a JSON body
(a cross-site form cannot send one without the browser asking first) and, when the browser says
where it comes from, the broker's own origin.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.python.failure import Failure

from wireproto.access import Principal
from wireproto.admin.refusals import RefusedLogins
from wireproto.transports.http import HTTPRefusal, origin_allowed

if TYPE_CHECKING:
    from wireproto.authentication import Authentication

__all__ = ["AdminGate", "LOCAL_ADMIN", "PAGE_HEADER", "is_local_address", "same_origin"]

# The principal of a request from the broker's own machine when there is no [auth].
LOCAL_ADMIN = Principal("local", frozenset({"admin"}))
# Sent by the status page: a 401 then carries no challenge, so the browser shows the page's own
# login form rather than its dialog.
PAGE_HEADER = b"x-wireproto-page"
_LOOPBACK_NAMES = {"localhost", "localhost.", "ip6-localhost"}


def is_local_address(address: Any) -> bool:
    """Whether a peer address is this machine: a loopback address or a unix socket."""
    if isinstance(address, UNIXAddress):
        return True
    if isinstance(address, IPv4Address | IPv6Address):
        try:
            return ipaddress.ip_address(address.host.split("%", 1)[0]).is_loopback
        except ValueError:
            return False
    return False


def _loopback_host(request: Any) -> bool:
    """Whether the request names this machine in its Host header (an address or localhost), so
    a page whose own name was made to point here (DNS rebinding) cannot read the answer."""
    host = (request.getHeader(b"host") or b"").decode("latin-1").strip().lower()
    if host.startswith("["):
        name = host[1:].split("]", 1)[0]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class AdminGate:
    """Admits a request to the admin API, or refuses it with an HTTPRefusal."""

    def __init__(self, allow: tuple[str, ...], auth: Authentication | None = None,
                 allowed_origins: tuple[str, ...] | None = None,
                 logins: RefusedLogins | None = None) -> None:
        self.allow = allow
        self.auth = auth
        # Pages elsewhere that may use the API too ([websocket] allowed_origins); None: none.
        self.allowed_origins = allowed_origins
        # How refused credentials are logged; None: as every listener's are.
        self.logins = logins

    def origin_admitted(self, request: Any) -> bool:
        """Whether the browser's Origin header, if it sent one, is the broker's own or one
        `allowed_origins` matches."""
        if same_origin(request):
            return True
        return self.allowed_origins is not None and origin_allowed(request,
                                                                   self.allowed_origins)

    def admits(self, principal: Principal) -> bool:
        if principal.name is not None and principal.name in self.allow:
            return True
        return any(f"role:{role}" in self.allow for role in principal.roles)

    def principal(self, request: Any) -> defer.Deferred[Principal]:
        """The admin principal of `request`; fails with HTTPRefusal (401 or 403)."""
        if not self.origin_admitted(request):
            return defer.fail(HTTPRefusal(
                403, "origin", "a request from another origin (not this broker's, nor one "
                "[websocket] allowed_origins names)"))
        auth = self.auth
        if auth is None:
            if not is_local_address(request.getClientAddress()):
                return defer.fail(HTTPRefusal(
                    403, "not_local", "without [auth], the admin API answers only this machine"))
            if not _loopback_host(request):
                return defer.fail(HTTPRefusal(
                    403, "host", "without [auth], the admin API answers only to a loopback "
                    "host name"))
            return defer.succeed(LOCAL_ADMIN)

        def admitted(principal: Principal) -> Principal:
            if principal.name is None and not self.admits(principal):
                raise HTTPRefusal(401, "missing", "log in as an admin", auth.challenge)
            if not self.admits(principal):
                raise HTTPRefusal(403, "not_admin",
                                  f"{principal.name or 'anonymous'} is not an admin ([admin] "
                                  "allow)")
            return principal

        logins = self.logins
        d = auth.authenticate_http(request, log_refusals=logins is None)
        if logins is not None:
            peer = request.getClientAddress()

            def refused(failure: Failure) -> Failure:
                if isinstance(failure.value, HTTPRefusal):
                    logins.refused(peer, failure.value)
                return failure

            d.addErrback(refused)
        return d.addCallback(admitted)


def same_origin(request: Any) -> bool:
    """Whether the page a browser sends `request` from, if it says, is this broker's own.

    A browser sends no Origin on a plain GET made by an ``<img>``, a ``<script>`` or a no-cors
    fetch; it still says whether the request comes from elsewhere (``Sec-Fetch-Site``, which
    every current browser sends) and, unless told not to, from where (Referer). A request
    with none of them is not from a browser's page."""
    host = (request.getHeader(b"host") or b"").lower()
    origin = request.getHeader(b"origin")
    if origin is not None:
        return origin.split(b"://", 1)[-1].lower() == host
    site = request.getHeader(b"sec-fetch-site")
    if site is not None:
        return site.lower() in (b"same-origin", b"none")  # "none": typed in, or a bookmark
    referer = request.getHeader(b"referer")
    if referer is None:
        return True
    return referer.split(b"://", 1)[-1].split(b"/", 1)[0].lower() == host
