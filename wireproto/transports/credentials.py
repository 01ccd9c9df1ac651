"""The credentials an HTTP request carries (an Authorization header, or an ``access_token`` query
parameter), read, and taken out of the request before anything else reads or logs it."""

from __future__ import annotations

import base64
import binascii
from typing import Any

__all__ = ["http_credentials", "strip_credentials"]


def http_credentials(request: Any) -> tuple[str, str] | None:
    """The credentials of an HTTP request: ("bearer", token), ("basic", "user:password"), or
    None. The Authorization header wins over the ``access_token`` query parameter."""
    raw = request.getHeader(b"authorization")
    if raw:
        header = raw.decode("latin-1")
        scheme, _, value = header.strip().partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer":
            return "bearer", value.strip()
        if scheme == "basic":
            try:
                decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return "basic", ""
            return "basic", decoded
        return scheme or "unknown", ""
    tokens = request.args.get(b"access_token")
    if tokens:
        return "bearer", tokens[-1].decode("utf-8", "replace")
    return None


def strip_credentials(request: Any) -> None:
    """Take the credentials out of `request` before anything else reads or logs it: the
    Authorization header, and the ``access_token`` query parameter from the URI."""
    request.requestHeaders.removeHeader(b"authorization")
    if b"access_token" not in request.args:
        return
    del request.args[b"access_token"]
    path, question, query = request.uri.partition(b"?")
    if question:
        kept = [part for part in query.split(b"&")
                if part.split(b"=", 1)[0] != b"access_token"]
        request.uri = path + (b"?" + b"&".join(kept) if kept else b"")
