"""How a connection proved who it is, and until when that proof holds, sans-IO.

A `Credential` rides on the `Principal` it proved. The hub closes the connection once the
credential expires (a token's ``exp``, a client certificate's notAfter). It never holds a
secret: a certificate is public.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CERTIFICATE", "TOKEN", "Credential"]

# What a connection showed.
TOKEN = "token"
CERTIFICATE = "certificate"


@dataclass(frozen=True, slots=True)
class Credential:
    """What proved a principal: `kind` (TOKEN or CERTIFICATE), the POSIX time it stops being
    valid at (None: not by itself), and what it was checked against."""

    kind: str
    expires: float | None = None
    # How far past `expires` its own check accepted it (a token's jwt_leeway).
    leeway: float = 0.0
    # The token's key id, for the log.
    key_id: str | None = None
    # A certificate: the peer's, then the chain it was verified with, DER.
    chain: tuple[bytes, ...] = ()
