"""JWT credentials: what a verifier accepts, and every attack in the issue refused by reason."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from wireproto.access.tokens import AuthenticationFailed, TokenVerifier

SECRET = b"s" * 32
NOW = int(time.time())


def _pem(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.PEM,
                                   serialization.PublicFormat.SubjectPublicKeyInfo)


RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
RSA_PEM = _pem(RSA_KEY.public_key())
EC_KEY = ec.generate_private_key(ec.SECP256R1())
ED_KEY = ed25519.Ed25519PrivateKey.generate()


def claims(**extra):
    return {"sub": "alice", "exp": NOW + 600, **extra}


def refused(verifier: TokenVerifier, token) -> str:
    with pytest.raises(AuthenticationFailed) as info:
        verifier.principal(token)
    if len(token) >= 8:  # the message never quotes the token
        shown = token if isinstance(token, str) else token.decode("utf-8", "replace")
        assert shown not in str(info.value)
    return info.value.reason


def test_an_hs256_token_names_its_principal_roles_and_narrowing():
    verifier = TokenVerifier(("HS256",), secret=SECRET, topics_claim="topics")
    token = jwt.encode(claims(roles=["ops", "dev"], topics=["chat/#"]), SECRET, "HS256")
    principal = verifier.principal(token, client_id="phone-1")
    assert principal.name == "alice"
    assert principal.roles == {"ops", "dev"}
    assert principal.client_id == "phone-1"
    assert principal.narrowed_to == ("chat/#",)


@pytest.mark.parametrize(("algorithm", "private", "public"), [
    ("RS256", RSA_KEY, RSA_KEY.public_key()),
    ("ES256", EC_KEY, EC_KEY.public_key()),
    ("EdDSA", ED_KEY, ED_KEY.public_key()),
])
def test_public_key_algorithms_verify_with_the_pem_key(algorithm, private, public):
    verifier = TokenVerifier((algorithm,), public_key=_pem(public))
    assert verifier.principal(jwt.encode(claims(roles="ops"), private, algorithm)).roles == {"ops"}


def test_alg_none_is_refused():
    header = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps(claims()).encode()).rstrip(b"=")
    token = (header + b"." + body + b".").decode()
    assert refused(TokenVerifier(("HS256",), secret=SECRET), token) == "algorithm"
    assert refused(TokenVerifier(("RS256",), public_key=RSA_PEM), token) == "algorithm"


def test_an_hs256_token_signed_with_the_rsa_public_key_is_refused():
    header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps(claims()).encode()).rstrip(b"=")
    signature = hmac.new(RSA_PEM, header + b"." + body, hashlib.sha256).digest()
    token = (header + b"." + body + b"." + base64.urlsafe_b64encode(signature).rstrip(b"="))
    assert refused(TokenVerifier(("RS256",), public_key=RSA_PEM), token.decode()) == "algorithm"


def test_a_token_signed_with_another_key_is_refused():
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    verifier = TokenVerifier(("RS256",), public_key=RSA_PEM)
    assert refused(verifier, jwt.encode(claims(), other, "RS256")) == "bad_signature"
    hs = TokenVerifier(("HS256",), secret=SECRET)
    assert refused(hs, jwt.encode(claims(), b"t" * 32, "HS256")) == "bad_signature"


AUDIENCE = {"aud": "app", "iss": "login"}


@pytest.mark.parametrize(("payload", "reason"), [
    (claims(**AUDIENCE, exp=NOW - 10), "expired"),
    (claims(**AUDIENCE, nbf=NOW + 600), "not_yet_valid"),
    (claims(aud="other-app", iss="login"), "wrong_audience"),
    (claims(aud="app", iss="someone-else"), "wrong_issuer"),
    (claims(iss="login"), "missing_claim"),  # no aud
    ({"sub": "alice", **AUDIENCE}, "missing_claim"),  # no exp
    ({"exp": NOW + 600, **AUDIENCE}, "missing_claim"),  # no sub
    (claims(**{**AUDIENCE, "sub": ""}), "missing_claim"),
    (claims(**AUDIENCE, roles=[1, 2]), "malformed"),
    (claims(**AUDIENCE, topics=["a/#/b"]), "malformed"),
])
def test_claims_are_checked(payload, reason):
    verifier = TokenVerifier(("HS256",), secret=SECRET, audience="app", issuer="login",
                             topics_claim="topics")
    assert refused(verifier, jwt.encode(payload, SECRET, "HS256")) == reason


def test_a_token_good_in_every_claim_passes_the_same_verifier():
    verifier = TokenVerifier(("HS256",), secret=SECRET, audience="app", issuer="login")
    assert verifier.principal(jwt.encode(claims(**AUDIENCE), SECRET, "HS256")).name == "alice"


def test_a_one_megabyte_token_is_refused_before_it_is_read():
    token = "a" * (1024 * 1024)
    assert refused(TokenVerifier(("HS256",), secret=SECRET), token) == "too_large"


@pytest.mark.parametrize("token", ["", "not a token", "a.b.c", "e30.e30.", b"\xff\xfe"])
def test_garbage_is_malformed(token):
    assert refused(TokenVerifier(("HS256",), secret=SECRET), token) in {"malformed", "algorithm"}


def test_a_jwks_picks_the_key_the_token_names():
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(RSA_KEY.public_key()))
    jwks = {"keys": [{**jwk, "kid": "k1", "alg": "RS256", "use": "sig"}]}
    verifier = TokenVerifier(("RS256",), jwks=jwks)
    good = jwt.encode(claims(), RSA_KEY, "RS256", headers={"kid": "k1"})
    assert verifier.principal(good).name == "alice"
    assert refused(verifier, jwt.encode(claims(), RSA_KEY, "RS256", headers={"kid": "k2"})) == (
        "unknown_key")
    assert refused(verifier, jwt.encode(claims(), RSA_KEY, "RS256")) == "unknown_key"


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(algorithms=("none",), secret=SECRET), "not allowed"),
    (dict(algorithms=("HS256",), public_key=RSA_PEM), "do not fit public keys"),
    (dict(algorithms=("RS256",), secret=SECRET), "do not fit a shared secret"),
    (dict(algorithms=("HS256",), secret=b"short"), "at least 32"),
    (dict(algorithms=("HS256",)), "exactly one"),
    (dict(algorithms=("HS256",), secret=SECRET, public_key=RSA_PEM), "exactly one"),
    (dict(algorithms=("ES256",), public_key=RSA_PEM), "does not fit ES256"),
    (dict(algorithms=("RS256",), public_key=RSA_KEY.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())), "public key"),
    (dict(algorithms=(), secret=SECRET), "at least one algorithm"),
])
def test_a_verifier_that_would_be_unsafe_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TokenVerifier(**kwargs)


def test_a_token_principal_carries_its_expiry_and_the_key_that_verified_it():
    verifier = TokenVerifier(("HS256",), secret=SECRET, leeway=2.0)
    credential = verifier.principal(jwt.encode(claims(), SECRET, "HS256")).credential
    assert (credential.kind, credential.expires, credential.leeway) == ("token", NOW + 600, 2.0)
    assert credential.stamp in verifier.key_stamps
    assert SECRET.decode() not in repr(credential) and credential.stamp != SECRET.hex()
    other = TokenVerifier(("HS256",), secret=b"t" * 32)
    assert credential.stamp not in other.key_stamps
    # Who the principal is does not depend on what proved it.
    later = verifier.principal(jwt.encode(claims(exp=NOW + 900), SECRET, "HS256"))
    assert later == verifier.principal(jwt.encode(claims(), SECRET, "HS256"))
    assert later.credential.expires == NOW + 900


def test_a_jwks_key_is_known_by_what_it_is_not_by_its_kid():
    first, second = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())

    def jwk(key, kid):
        return {**jwt.algorithms.ECAlgorithm.to_jwk(key.public_key(), as_dict=True), "kid": kid,
                "alg": "ES256"}

    verifier = TokenVerifier(("ES256",), jwks={"keys": [jwk(first, "a"), jwk(second, "b")]})
    token = jwt.encode(claims(), second, "ES256", headers={"kid": "b"})
    credential = verifier.principal(token).credential
    assert credential.key_id == "b"
    renamed = TokenVerifier(("ES256",), jwks={"keys": [jwk(second, "renamed")]})
    assert credential.stamp in renamed.key_stamps
    without = TokenVerifier(("ES256",), jwks={"keys": [jwk(first, "b")]})
    assert credential.stamp not in without.key_stamps
