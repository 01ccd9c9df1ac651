"""Connections end with their credentials, on real sockets: a token or a client certificate that
expires closes its connection (after [auth] expiry_leeway), in every protocol; a reload that
removes a password file user, changes their password, or drops a JWT key closes the
connections that proved themselves with it, and only those."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest_twisted
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm
from twisted.internet import reactor, ssl
from twisted.logger import globalLogPublisher

from tests.access.conftest import SECRET, AuthFiles, basic
from tests.access.test_peer_identity import _certificate, _key, _pem_key, tls_connect
from tests.support import eventually, sleep, wait_for
from wireproto.access.passwords import PasswordFile
from wireproto.config import config_from_toml
from wireproto.protocols.nydus.client import NydusClient
from wireproto.protocols.subble.client import SubbleClient
from wireproto.protocols.ubre.client import UbreClient

POLICY_VIOLATION = 1008
PEM = serialization.Encoding.PEM

LISTEN = "".join(
    f'[[listen]]\nprotocol = "{protocol}"\ntransport = "{transport}"\nendpoint = "tcp:0"\n'
    for protocol, transport in (("websmq", "ws"), ("ubre", "ws"), ("nydus", "engineio"),
                                ("subble", "ws"))
)

RULES = """
[[acl]]
subscribe = ["chat/#"]
publish = ["chat/#"]
"""


async def start(broker: Any, auth_files: AuthFiles, **auth: Any) -> tuple[Any, dict[str, str]]:
    text = LISTEN + auth_files.auth_table(**auth) + RULES
    service, bound = await broker.start_config(config_from_toml(text, reactor=reactor))
    return service, {b.listener.protocol: b.address for b in bound}


class Reasons:
    """Why each client's connection closed, by name, as its on_disconnect hook heard it."""

    def __init__(self) -> None:
        self.by_name: dict[str, str] = {}

    def watch(self, name: str, client: Any) -> Any:
        client.on_disconnect = lambda reason: self.by_name.setdefault(
            name, reason.getErrorMessage())
        return client


class Events:
    """The log events of a test, to look for one and to make sure no credential is in them."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Events:
        globalLogPublisher.addObserver(self.events.append)
        return self

    def __exit__(self, *exc: Any) -> None:
        globalLogPublisher.removeObserver(self.events.append)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]


# -- expiry --------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_every_protocol_is_closed_when_its_token_expires(
    broker: Any, auth_files: AuthFiles
) -> None:
    service, addresses = await start(broker, auth_files, expiry_leeway=0.2)
    expires = int(time.time()) + 3
    token = jwt.encode({"sub": "alice", "exp": expires}, SECRET, algorithm="HS256")
    bearer = {"Authorization": "Bearer " + token}
    lasting = await broker.client(addresses["websmq"] + "?access_token=" + auth_files.token("bob"))
    with Events() as log:
        websmq = await broker.client(addresses["websmq"] + "?access_token=" + token)
        reasons = Reasons()
        ubre = reasons.watch("ubre", UbreClient(reactor, addresses["ubre"], headers=bearer))
        nydus = reasons.watch("nydus", NydusClient(reactor, addresses["nydus"], headers=bearer))
        subble = reasons.watch("subble", SubbleClient(reactor, addresses["subble"],
                                                      headers=bearer, subscribe=["chat/room"]))
        for client in (ubre, nydus, subble):
            await wait_for(client.connect())
        await eventually(lambda: len(service.hub.sessions) == 5)
        closed = await wait_for(websmq.when_closed(), timeout=8)
        await eventually(lambda: len(reasons.by_name) == 3)
    # Not before the token's exp and its leeway; a second or so after, the test's bound.
    assert time.time() >= expires + 0.2
    assert websmq.transport.closeCode == POLICY_VIOLATION
    assert websmq.transport.closeReason == "credential expired"
    assert "credential expired" in str(closed)
    for name in ("ubre", "subble"):
        assert "WebSocket closed with code 1008: credential expired" in reasons.by_name[name]
    assert "nydus" in reasons.by_name
    assert lasting.connected
    (session,) = service.hub.sessions
    assert session.principal.name == "bob"
    expired = log.named("credential_expired")
    assert sorted(event["protocol"] for event in expired) == ["nydus", "subble", "ubre",
                                                              "websmq"]
    assert {event["principal"] for event in expired} == {"alice"}
    assert token not in repr(log.events)


@pytest_twisted.ensureDeferred
async def test_a_connection_closed_before_its_token_expires_leaves_no_timer(
    broker: Any, auth_files: AuthFiles
) -> None:
    service, addresses = await start(broker, auth_files)
    client = await broker.client(addresses["websmq"] + "?access_token="
                                 + auth_files.token(lifetime=600))
    await eventually(lambda: len(service.hub.sessions) == 1)
    (session,) = service.hub.sessions
    timer = session.expiry
    assert timer is not None and timer.active()
    assert abs(timer.getTime() - (int(time.time() + 600) + 5.0)) < 2  # exp + the default leeway
    await wait_for(client.disconnect())
    await eventually(lambda: not service.hub.sessions)
    assert not timer.active() and session.expiry is None


class TwoCAs:
    """Two CAs, "a" and "b"; a server certificate from "a", and client certificates from
    either. The listener's CA file (`ca_file`) holds the CAs a test says; the clients trust
    the server by `server_ca`, a file of its own. `tls_connect` takes it as its PKI."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.keys = {"a": _key(), "b": _key()}
        self.cas = {name: _certificate(f"CA {name}", key, f"CA {name}", key, ca=True)
                    for name, key in self.keys.items()}
        server_key = _key()
        server = _certificate("localhost", server_key, "CA a", self.keys["a"], dns="localhost")
        (directory / "server.key").write_bytes(_pem_key(server_key))
        (directory / "server.pem").write_bytes(server.public_bytes(PEM))
        self.ca = directory / "server-ca.pem"
        self.ca.write_bytes(self.cas["a"].public_bytes(PEM))
        self.ca_file = directory / "client-cas.pem"
        self.trust("a")
        self.clients: dict[str, ssl.PrivateCertificate] = {}

    def trust(self, *names: str) -> None:
        """Have the listener's CA file hold these CAs."""
        self.ca_file.write_bytes(b"".join(self.cas[name].public_bytes(PEM) for name in names))

    def client(self, name: str, ca: str, lifetime: float = 86400.0) -> float:
        """Make a client certificate `name` from CA `ca`; its notAfter, a POSIX time."""
        key = _key()
        not_after = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=lifetime)
        certificate = _certificate(name, key, f"CA {ca}", self.keys[ca], not_after=not_after)
        self.clients[name] = ssl.PrivateCertificate.loadPEM(certificate.public_bytes(PEM)
                                                            + _pem_key(key))
        return certificate.not_valid_after_utc.timestamp()

    async def start(self, broker: Any, auth: str = "") -> tuple[Any, int]:
        endpoint = (f"mtls:0:privateKey={self.directory / 'server.key'}"
                    f":certKey={self.directory / 'server.pem'}:caCerts={self.ca_file}")
        text = (f'[[listen]]\nprotocol = "websmq"\ntransport = "length32"\n'
                f'endpoint = "{endpoint}"\n[auth]\n{auth}\n{RULES}')
        service, bound = await broker.start_config(config_from_toml(text, reactor=reactor))
        return service, int(bound[0].address.rsplit(":", 1)[1])


@pytest_twisted.ensureDeferred
async def test_a_client_certificate_that_expires_closes_its_connection(
    broker: Any, tmp_path: Path
) -> None:
    pki = TwoCAs(tmp_path)
    not_after = pki.client("device-1", "a", lifetime=3)
    service, port = await pki.start(broker, "expiry_leeway = 0.2")
    with Events() as log:
        adapter = await tls_connect(pki, port, "device-1")
        await eventually(lambda: len(service.hub.sessions) == 1)
        (session,) = service.hub.sessions
        assert session.principal.name == "device-1"
        await wait_for(adapter.wrapped.when_closed(), timeout=8)
    assert time.time() >= not_after + 0.2
    assert not service.hub.sessions
    (event,) = log.named("credential_expired")
    assert event["principal"] == "device-1" and event["credential"] == "certificate"


# -- reloading ---------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_reload_closes_connections_whose_password_file_user_went_or_changed(
    broker: Any, auth_files: AuthFiles
) -> None:
    passwords = PasswordFile.load(auth_files.passwords)
    for user in ("dave", "erin"):
        passwords.set(user, f"{user}'s password", log2_n=10)
    passwords.save(auth_files.passwords)
    service, addresses = await start(broker, auth_files)
    clients = {
        user: await broker.client(addresses["websmq"], headers={
            "Authorization": basic(user, f"{user}'s password")})
        for user in ("carol", "dave", "erin")
    }
    await eventually(lambda: len(service.hub.sessions) == 3)
    passwords.remove("carol")
    passwords.set("dave", "dave's new password", log2_n=10)
    passwords.save(auth_files.passwords)
    with Events() as log:
        assert service.reload_auth()
        await wait_for(clients["carol"].when_closed())
        await wait_for(clients["dave"].when_closed())
    await sleep(0.2)
    assert clients["erin"].connected
    assert [s.principal.name for s in service.hub.sessions] == ["erin"]
    carol, dave = clients["carol"].transport, clients["dave"].transport
    assert (carol.closeCode, carol.closeReason) == (
        POLICY_VIOLATION, "credential withdrawn: the user is no longer in the password file")
    assert (dave.closeCode, dave.closeReason) == (
        POLICY_VIOLATION, "credential withdrawn: the user's password changed")
    withdrawn = log.named("credential_withdrawn")
    assert sorted(event["principal"] for event in withdrawn) == ["carol", "dave"]
    assert "carol's password" not in repr(log.events)
    (reloaded,) = log.named("auth_reloaded")
    assert reloaded["closed"] == 2


def _ec_jwk(kid: str) -> tuple[ec.EllipticCurvePrivateKey, dict[str, Any]]:
    key = ec.generate_private_key(ec.SECP256R1())
    jwk = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
    return key, {**jwk, "kid": kid, "alg": "ES256", "use": "sig"}


@pytest_twisted.ensureDeferred
async def test_a_reload_closes_connections_whose_jwt_key_is_gone(
    broker: Any, auth_files: AuthFiles
) -> None:
    old_key, old_jwk = _ec_jwk("old")
    new_key, new_jwk = _ec_jwk("new")
    jwks = auth_files.directory / "jwks.json"
    jwks.write_text(json.dumps({"keys": [old_jwk, new_jwk]}))
    service, addresses = await start(broker, auth_files, jwt_algorithms=["ES256"],
                                     jwt_secret_file="", jwt_jwks_file=str(jwks))

    def token(key: Any, kid: str, sub: str) -> str:
        return jwt.encode({"sub": sub, "exp": int(time.time() + 600)}, key, algorithm="ES256",
                          headers={"kid": kid})

    old = await broker.client(addresses["websmq"] + "?access_token=" + token(old_key, "old", "a"))
    new = await broker.client(addresses["websmq"] + "?access_token=" + token(new_key, "new", "b"))
    await eventually(lambda: len(service.hub.sessions) == 2)
    jwks.write_text(json.dumps({"keys": [new_jwk]}))
    assert service.reload_auth()
    await wait_for(old.when_closed())
    assert (old.transport.closeCode, old.transport.closeReason) == (
        POLICY_VIOLATION, "credential withdrawn: its signing key is no longer configured")
    await sleep(0.2)
    assert new.connected
    # The same key under a new key id is still the key: a token signed by it stays.
    jwks.write_text(json.dumps({"keys": [{**new_jwk, "kid": "renamed"}]}))
    assert service.reload_auth()
    await sleep(0.2)
    assert new.connected



@pytest_twisted.ensureDeferred
async def test_a_reload_closes_connections_whose_certificate_no_ca_signs_now(
    broker: Any, tmp_path: Path
) -> None:
    pki = TwoCAs(tmp_path)
    pki.client("device-1", "a")
    pki.client("device-2", "b")
    service, port = await pki.start(broker)
    first = await tls_connect(pki, port, "device-1")
    await eventually(lambda: len(service.hub.sessions) == 1)
    # A reload that keeps CA a keeps its connection, and admits CA b's from then on.
    pki.trust("a", "b")
    assert service.reload_auth()
    second = await tls_connect(pki, port, "device-2")
    await eventually(lambda: len(service.hub.sessions) == 2)
    # A bad CA file changes nothing.
    pki.ca_file.write_bytes(b"not a certificate")
    assert not service.reload_auth()
    assert len(service.hub.sessions) == 2
    with Events() as log:
        pki.trust("b")
        assert service.reload_auth()
        await wait_for(first.wrapped.when_closed())
    await sleep(0.2)
    assert second.wrapped.connected
    assert [s.principal.name for s in service.hub.sessions] == ["device-2"]
    (event,) = log.named("credential_withdrawn")
    assert event["principal"] == "device-1" and event["credential"] == "certificate"
    assert event["why"] == "its certificate is signed by no CA the listener trusts now"
    # And CA a's certificates are refused at the handshake from now on.
    again = await tls_connect(pki, port, "device-1")
    await eventually(lambda: not again.transport.connected)
    assert len(service.hub.sessions) == 1
