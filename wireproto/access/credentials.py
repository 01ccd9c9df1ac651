"""How a connection proved who it is, and until when that proof holds, sans-IO.

A `Credential` rides on the `Principal` it proved. The hub closes the connection once the
credential expires (a token's ``exp``, a client certificate's notAfter), and a reload of the
[auth] files asks whether it still holds (wireproto.authentication). It never holds a secret: a
password is known by a digest of its user's line in the password file, a JWT key by a digest of
the key, and a certificate is public.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["CERTIFICATE", "PASSWORD", "TOKEN", "Credential", "stamp"]

# What a connection showed.
TOKEN = "token"
PASSWORD = "password"
CERTIFICATE = "certificate"


def stamp(data: bytes) -> str:
    """A digest of what a credential was checked against, to tell later whether that changed;
    it does not give the thing away (the secrets digested are long and random, or hashes)."""
    return hashlib.sha256(data).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Credential:
    """What proved a principal: `kind` (TOKEN, PASSWORD or CERTIFICATE), the POSIX time it stops
    being valid at (None: not by itself), and what it was checked against."""

    kind: str
    expires: float | None = None
    # How far past `expires` its own check accepted it (a token's jwt_leeway).
    leeway: float = 0.0
    # `stamp` of the password file line or the JWT key it was checked against.
    stamp: str | None = None
    # The token's key id, for the log.
    key_id: str | None = None
    # A certificate: the peer's, then the chain it was verified with, DER; and the CA file
    # of the listener that admitted it.
    chain: tuple[bytes, ...] = ()
    authority: str | None = None
