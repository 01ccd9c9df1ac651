"""JSON Web Tokens as credentials: a verified token becomes a `Principal`, sans-IO.

PyJWT does the cryptography. This module decides what is accepted:

- an explicit list of algorithms, which must fit the key: HMAC (HS256/384/512) with a shared
  secret only, RSA, RSA-PSS, ECDSA and EdDSA with public keys only (a PEM key or a JWKS), so a
  token cannot choose how it is checked, and `none` is never among them;
- a token over `max_token_bytes` is refused before it is parsed;
- `exp` (required unless told otherwise), `nbf`, and `aud` and `iss` when configured;
- the principal is `sub`; roles come from the `roles` claim (a string or a list of strings); an
  optional claim (`topics_claim`) lists the topic patterns the token's rights are narrowed to.

The principal carries a `Credential`: the token's ``exp``, and a digest of the key that verified
it (`key_stamps` holds those of every key the verifier has), so a connection can be closed when
the token expires or its key is withdrawn.

Every refusal is an `AuthenticationFailed` whose `reason` is a short code for metrics and logs;
neither the message nor the reason ever holds the token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from jwt.algorithms import get_default_algorithms

from wireproto.errors import InvalidTopic
from wireproto.topics import validate_pattern

from .credentials import TOKEN, Credential, stamp
from .policy import Principal

__all__ = [
    "AuthenticationFailed",
    "HMAC_ALGORITHMS",
    "PUBLIC_KEY_ALGORITHMS",
    "TokenVerifier",
]

HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
PUBLIC_KEY_ALGORITHMS = frozenset({
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA",
})
_MIN_SECRET_BYTES = 32  # HS256's own hash length: a shorter secret is guessable offline


class AuthenticationFailed(Exception):
    """A credential was refused. `reason` is a short code ("expired", "bad_signature"...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class TokenVerifier:
    """Checks tokens against one key source: `secret` (bytes, for HMAC), `public_key` (PEM
    bytes) or `jwks` (a JWKS document, its keys chosen by the token's `kid`)."""

    algorithms: tuple[str, ...]
    secret: bytes | None = field(default=None, repr=False)
    public_key: bytes | None = None
    jwks: Mapping[str, Any] | None = None
    audience: str | None = None
    issuer: str | None = None
    require_exp: bool = True
    leeway: float = 0.0
    roles_claim: str = "roles"
    topics_claim: str | None = None
    max_token_bytes: int = 8192
    _keys: Any = field(init=False, repr=False, compare=False)
    # `stamp` of each key: the one key's, or a JWKS's by kid.
    _stamps: dict[str | None, str] = field(init=False, repr=False, compare=False)
    # The `stamp` of every key this verifier checks tokens with.
    key_stamps: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        algorithms = tuple(self.algorithms)
        object.__setattr__(self, "algorithms", algorithms)
        sources = [s for s in (self.secret, self.public_key, self.jwks) if s is not None]
        if len(sources) != 1:
            raise ValueError("a token verifier takes exactly one of secret, public_key and jwks")
        if not algorithms:
            raise ValueError("a token verifier needs at least one algorithm")
        unknown = [a for a in algorithms if a not in HMAC_ALGORITHMS | PUBLIC_KEY_ALGORITHMS]
        if unknown:
            raise ValueError(
                f"algorithms {unknown}: not allowed; choose from "
                f"{sorted(HMAC_ALGORITHMS | PUBLIC_KEY_ALGORITHMS)}"
            )
        fitting = HMAC_ALGORITHMS if self.secret is not None else PUBLIC_KEY_ALGORITHMS
        misfits = [a for a in algorithms if a not in fitting]
        if misfits:
            kind = "a shared secret" if self.secret is not None else "public keys"
            raise ValueError(f"algorithms {misfits} do not fit {kind}")
        if self.secret is not None:
            if len(self.secret) < _MIN_SECRET_BYTES:
                raise ValueError(
                    f"the HMAC secret is {len(self.secret)} bytes; use at least "
                    f"{_MIN_SECRET_BYTES} random bytes"
                )
            keys: Any = self.secret
        elif self.public_key is not None:
            keys = _public_key(self.public_key, algorithms)
        elif self.jwks is not None:  # the one source left (checked above)
            try:
                keys = jwt.PyJWKSet.from_dict(dict(self.jwks))
            except jwt.PyJWTError as error:
                raise ValueError(f"the JWKS cannot be read: {error}") from None
        object.__setattr__(self, "_keys", keys)
        stamps: dict[str | None, str] = {}
        if isinstance(keys, jwt.PyJWKSet):
            for jwk in keys.keys:
                stamps.setdefault(jwk.key_id, _key_stamp(jwk.key))  # the one a lookup finds
            every = frozenset(_key_stamp(jwk.key) for jwk in keys.keys)
        else:
            stamps[None] = _key_stamp(keys)
            every = frozenset(stamps.values())
        object.__setattr__(self, "_stamps", stamps)
        object.__setattr__(self, "key_stamps", every)

    def principal(self, token: str | bytes, *, client_id: str | None = None) -> Principal:
        """The principal a valid token names; raises AuthenticationFailed otherwise."""
        if isinstance(token, str):
            size = len(token.encode("utf-8", "replace"))
        else:
            size = len(token)
        if size > self.max_token_bytes:
            raise AuthenticationFailed(
                "too_large", f"token of {size} bytes is over the {self.max_token_bytes}-byte limit"
            )
        claims, kid = self._verified_claims(token)
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise AuthenticationFailed("missing_claim", "token has no sub (subject) string")
        expires = claims.get("exp")
        credential = Credential(
            TOKEN, expires=None if expires is None else float(expires), leeway=self.leeway,
            stamp=self._stamps[kid], key_id=kid,
        )
        return Principal(
            subject,
            roles=self._roles(claims),
            client_id=client_id,
            narrowed_to=self._narrowing(claims),
            credential=credential,
        )

    def _verified_claims(self, token: str | bytes) -> tuple[dict[str, Any], str | None]:
        """The claims of a valid token, and the kid of the JWKS key that verified it."""
        key = self._keys
        kid = None
        try:
            if isinstance(key, jwt.PyJWKSet):
                kid, key = self._jwk_for(token)
            required = ["sub"] + (["exp"] if self.require_exp else [])
            return jwt.decode(
                token, key, algorithms=list(self.algorithms), audience=self.audience,
                issuer=self.issuer, leeway=self.leeway,
                options={"require": required, "verify_aud": self.audience is not None},
            ), kid
        except AuthenticationFailed:
            raise
        except jwt.ExpiredSignatureError:
            raise AuthenticationFailed("expired", "token has expired") from None
        except jwt.ImmatureSignatureError:
            raise AuthenticationFailed("not_yet_valid", "token is not valid yet (nbf)") from None
        except jwt.InvalidAudienceError:
            raise AuthenticationFailed("wrong_audience", "token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise AuthenticationFailed("wrong_issuer", "token is from another issuer") from None
        except jwt.MissingRequiredClaimError as error:
            raise AuthenticationFailed(
                "missing_claim", f"token has no {error.claim!r} claim"
            ) from None
        except jwt.InvalidAlgorithmError:
            raise AuthenticationFailed(
                "algorithm", "token is signed with an algorithm this listener does not accept"
            ) from None
        except jwt.InvalidSignatureError:
            raise AuthenticationFailed("bad_signature", "token signature does not verify") from None
        except (jwt.PyJWTError, ValueError, TypeError):
            # DecodeError, InvalidKeyError and the like: the token is not one we can read.
            raise AuthenticationFailed("malformed", "token cannot be read") from None

    def _jwk_for(self, token: str | bytes) -> tuple[str, Any]:
        header = jwt.get_unverified_header(token)
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise AuthenticationFailed("unknown_key", "token names no key (kid)")
        try:
            jwk = self._keys[kid]
        except KeyError:
            raise AuthenticationFailed(
                "unknown_key", "token names a key this listener lacks"
            ) from None
        if jwk.algorithm_name not in self.algorithms:
            raise AuthenticationFailed(
                "algorithm", "token's key is for an algorithm this listener does not accept"
            )
        return kid, jwk.key

    def _roles(self, claims: Mapping[str, Any]) -> frozenset[str]:
        roles = claims.get(self.roles_claim, ())
        if isinstance(roles, str):
            roles = (roles,)
        if not isinstance(roles, list | tuple) or not all(isinstance(r, str) for r in roles):
            raise AuthenticationFailed(
                "malformed", f"token's {self.roles_claim!r} claim is not a list of strings"
            )
        return frozenset(roles)

    def _narrowing(self, claims: Mapping[str, Any]) -> tuple[str, ...] | None:
        if self.topics_claim is None or self.topics_claim not in claims:
            return None
        patterns = claims[self.topics_claim]
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise AuthenticationFailed(
                "malformed", f"token's {self.topics_claim!r} claim is not a list of patterns"
            )
        try:
            for pattern in patterns:
                validate_pattern(pattern)
        except InvalidTopic:
            raise AuthenticationFailed(
                "malformed", f"token's {self.topics_claim!r} claim holds an invalid pattern"
            ) from None
        return tuple(patterns)


def _key_stamp(key: Any) -> str:
    """`stamp` of a key: of an HMAC secret's bytes, or of a public key's SubjectPublicKeyInfo."""
    if isinstance(key, bytes):
        return stamp(key)
    return stamp(key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo))


def _public_key(pem: bytes, algorithms: Iterable[str]) -> Any:
    """The key object of a PEM public key, checked to fit every algorithm allowed."""
    implementations = get_default_algorithms()
    keys = []
    for algorithm in algorithms:
        try:
            key = implementations[algorithm].prepare_key(pem)
        except (jwt.InvalidKeyError, ValueError, TypeError) as error:
            raise ValueError(f"the public key does not fit {algorithm}: {error}") from None
        if not hasattr(key, "public_bytes") or hasattr(key, "private_bytes"):
            raise ValueError("the key must be a public key, not a private one")
        keys.append(key)
    return keys[0]  # one key, and it fits every algorithm allowed
