"""The status page and the browser clients, served from the package's own files: a fixed set,
read once, so no request can name anything else."""

from __future__ import annotations

from importlib import resources
from typing import Any

from twisted.web.resource import Resource

__all__ = ["StaticFiles", "PAGE_POLICY"]

_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".png": b"image/png",
    ".ico": b"image/x-icon",
}
# The page runs only its own scripts and styles, and talks only to its own broker: 'self' is
# its own origin, a WebSocket to it included (CSP 3); `ws:` would let it reach any host.
PAGE_POLICY = (b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
               b"connect-src 'self'; base-uri 'none'; form-action 'none'; "
               b"frame-ancestors 'none'")


def _read(folder: str, name: str) -> bytes:
    return resources.files(__package__).joinpath("static", folder, name).read_bytes()


class StaticFiles(Resource):
    """`names` from the package's static/`folder`; with `index`, that file at the resource's
    own path (``/``). With `any_origin`, a page of any origin may read them (CORS without
    credentials), as it must to import an ES module from here. With `max_age`, a browser may
    keep them that many seconds without asking again; without, it asks each time."""

    isLeaf = True

    def __init__(self, folder: str, names: tuple[str, ...], index: str | None = None,
                 *, any_origin: bool = False, max_age: int | None = None) -> None:
        super().__init__()
        self.files = {name: (_read(folder, name), _TYPES[name[name.rindex("."):]])
                      for name in names}
        self.index = index
        self.any_origin = any_origin
        self.cache_control = (b"no-cache" if max_age is None
                              else b"public, max-age=%d" % max_age)

    def render_GET(self, request: Any) -> bytes:
        path = [segment for segment in request.postpath if segment]
        if not path and self.index is not None:
            name = self.index
        elif len(path) == 1:
            name = path[0].decode("utf-8", "replace")
        else:
            name = ""
        found = self.files.get(name)
        if found is None:
            request.setResponseCode(404)
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            return b"404 Not Found\n"
        body, kind = found
        if self.any_origin:
            request.setHeader(b"access-control-allow-origin", b"*")
        request.setHeader(b"content-type", kind)
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.setHeader(b"cache-control", self.cache_control)
        if kind.startswith(b"text/html"):
            request.setHeader(b"content-security-policy", PAGE_POLICY)
            request.setHeader(b"x-frame-options", b"DENY")
            request.setHeader(b"referrer-policy", b"no-referrer")
        return body

    def render_HEAD(self, request: Any) -> bytes:
        return self.render_GET(request)
