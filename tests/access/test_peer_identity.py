"""Principals the carrier establishes: client certificates on mtls: listeners (good, untrusted
and expired), the peer's uid on unix: listeners, and a fixed principal named by the config."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import reactor, ssl
from twisted.internet.endpoints import SSL4ClientEndpoint

from tests.support import eventually, wait_for, write_secret
from wireproto.access import Action
from wireproto.config import config_from_toml
from wireproto.protocols.websmq.client import WebsmqClientProtocol
from wireproto.transports.stream import StreamOptions, stream_client_factory

NOW = datetime.datetime.now(datetime.UTC)
DAY = datetime.timedelta(days=1)

def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())

def _pem_key(key: Any) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())

def _certificate(subject: str, key: Any, issuer: str, issuer_key: Any, *, ca: bool = False,
                 not_after: datetime.datetime = NOW + DAY,
                 dns: str | None = None) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - DAY)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if dns is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]),
                                        critical=False)
    return builder.sign(issuer_key, hashes.SHA256())

@dataclass
class PKI:
    directory: Path
    ca: Path
    server_key: Path
    server_cert: Path
    clients: dict[str, ssl.PrivateCertificate]

    def endpoint(self) -> str:
        return (f"mtls:0:privateKey={self.server_key}:certKey={self.server_cert}"
                f":caCerts={self.ca}")

@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    directory = tmp_path_factory.mktemp("pki")
    ca_key, other_ca_key = _key(), _key()
    ca = _certificate("wireproto test CA", ca_key, "wireproto test CA", ca_key, ca=True)
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_key = _key()
    server = _certificate("localhost", server_key, "wireproto test CA", ca_key, dns="localhost")
    write_secret(directory / "server.key", _pem_key(server_key))
    (directory / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    clients = {}
    for name, issuer_key, not_after in (
        ("device-1", ca_key, NOW + DAY),
        ("untrusted", other_ca_key, NOW + DAY),
        ("expired", ca_key, NOW - datetime.timedelta(hours=1)),
    ):
        key = _key()
        cert = _certificate(name, key, "wireproto test CA", issuer_key, not_after=not_after,
                            dns=f"{name}.devices.example")
        pem = cert.public_bytes(serialization.Encoding.PEM) + _pem_key(key)
        clients[name] = ssl.PrivateCertificate.loadPEM(pem)
        # For the tools: the certificate and its key in files of their own.
        (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_secret(directory / f"{name}.key", _pem_key(key))
    return PKI(directory, directory / "ca.pem", directory / "server.key",
               directory / "server.pem", clients)

async def tls_connect(pki: PKI, port: int, client: str | None) -> Any:
    """A WEBSMQ length32 connection over TLS that trusts the test CA and shows the certificate
    of `client` (none if None); the client's stream adapter."""
    trust = ssl.Certificate.loadPEM(pki.ca.read_bytes())
    certificate = pki.clients[client] if client is not None else None
    options = ssl.optionsForClientTLS("localhost", trustRoot=trust, clientCertificate=certificate)
    endpoint = SSL4ClientEndpoint(reactor, "127.0.0.1", port, options)
    factory = stream_client_factory(WebsmqClientProtocol, StreamOptions(framing="length32"))
    return await wait_for(endpoint.connect(factory))


RULES = """
[[acl]]
principal = "device-1"
publish = ["devices/%u/#"]
"""

async def start_mtls(broker: Any, pki: PKI, auth: str = "",
                     listener: str = "") -> tuple[Any, int]:
    text = (f'[[listen]]\nprotocol = "websmq"\ntransport = "length32"\n'
            f'endpoint = "{pki.endpoint()}"\n{listener}[auth]\n{auth}\n{RULES}')
    service, bound = await broker.start_config(config_from_toml(text, reactor=reactor))
    return service, int(bound[0].address.rsplit(":", 1)[1])

@pytest_twisted.ensureDeferred
async def test_a_client_certificate_signed_by_the_ca_is_its_principal(
    broker: Any, pki: PKI
) -> None:
    service, port = await start_mtls(broker, pki)
    adapter = await tls_connect(pki, port, "device-1")
    await eventually(lambda: len(service.hub.sessions) == 1)
    (session,) = service.hub.sessions
    assert session.principal.name == "device-1"
    assert session.may(Action.PUBLISH, "devices/device-1/temperature")
    assert not session.may(Action.PUBLISH, "devices/device-2/temperature")
    adapter.loseConnection()

@pytest_twisted.ensureDeferred
async def test_the_principal_can_come_from_the_subject_alternative_name(
    broker: Any, pki: PKI
) -> None:
    service, port = await start_mtls(broker, pki, 'certificate_name = "san-dns"')
    adapter = await tls_connect(pki, port, "device-1")
    await eventually(lambda: len(service.hub.sessions) == 1)
    (session,) = service.hub.sessions
    assert session.principal.name == "device-1.devices.example"
    adapter.loseConnection()

@pytest.mark.parametrize("client", ["untrusted", "expired"])
@pytest_twisted.ensureDeferred
async def test_an_untrusted_or_expired_certificate_never_reaches_a_protocol(
    broker: Any, pki: PKI, client: str
) -> None:
    service, port = await start_mtls(broker, pki)
    adapter = await tls_connect(pki, port, client)
    # The broker refuses the certificate in the TLS handshake: no protocol, no session.
    await eventually(lambda: not adapter.transport.connected)
    assert service.hub.sessions == {}
    assert sum(service.hub.accepted.values()) == 0


@pytest_twisted.ensureDeferred
async def test_a_client_without_a_certificate_is_refused(broker: Any, pki: PKI) -> None:
    service, port = await start_mtls(broker, pki)
    adapter = await tls_connect(pki, port, None)
    await eventually(lambda: not adapter.transport.connected)
    assert sum(service.hub.accepted.values()) == 0


@pytest_twisted.ensureDeferred
async def test_a_stream_listener_closes_a_good_certificate_it_does_not_allow(
    broker: Any, pki: PKI
) -> None:
    service, port = await start_mtls(broker, pki, listener='allow = ["device-2"]\n')
    adapter = await tls_connect(pki, port, "device-1")
    await eventually(lambda: not adapter.transport.connected)
    assert sum(service.hub.accepted.values()) == 0
    assert service.auth.outcomes == {"listener": 1}


# -- unix: the peer's uid ------------------------------------------------------------------------

UNIX_CLIENT = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
time.sleep(5.0)
"""

@pytest.fixture
def open_directory() -> Any:
    """A directory every user may enter, outside pytest's own temporary directory (which other
    users cannot); removed after the broker (requested after this) has stopped."""
    directory = Path(tempfile.mkdtemp(prefix="wireproto-unix-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest_twisted.ensureDeferred
async def test_a_unix_listener_knows_its_peer_by_uid(open_directory: Path, broker: Any) -> None:
    system_python = Path("/usr/bin/python3")
    if os.geteuid() != 0 or not system_python.exists():
        pytest.skip("needs root and /usr/bin/python3, to connect as another user")
    path = open_directory / "broker.sock"
    text = (f'[[listen]]\nprotocol = "websmq"\ntransport = "length32"\n'
            f'endpoint = "unix:{path}:mode=666"\n[auth]\n')
    service, _ = await broker.start_config(config_from_toml(text, reactor=reactor))
    child = subprocess.Popen([str(system_python), "-c", UNIX_CLIENT, str(path)], user="nobody",
                             stdin=subprocess.DEVNULL, cwd="/")
    try:
        await eventually(lambda: len(service.hub.sessions) == 1)
        (session,) = service.hub.sessions
        assert session.principal.name == "nobody"
    finally:
        child.kill()
        child.wait()

@pytest_twisted.ensureDeferred
async def test_a_listener_may_name_the_principal_of_every_connection(broker: Any) -> None:
    text = ('[[listen]]\nprotocol = "websmq"\ntransport = "length32"\nendpoint = "tcp:0"\n'
            'principal = "lan"\n[auth]\n[[acl]]\nprincipal = "lan"\nsubscribe = ["#"]\n')
    service, bound = await broker.start_config(config_from_toml(text, reactor=reactor))
    client = await broker.client(bound[0].address, framing="length32")
    await client.subscribe("anything/at/all")
    await eventually(lambda: "anything/at/all" in service.hub.topics())
    (session,) = service.hub.sessions
    assert session.principal.name == "lan"


def test_a_phyllo_device_publishes_only_where_its_principal_may() -> None:
    from tests.support import Inbox
    from wireproto.access import AccessRule, Policy
    from wireproto.codecs.phyllo.codes import TypeCode
    from wireproto.codecs.phyllo.message import PubSubMessage
    from wireproto.hub import Hub
    from wireproto.phyllo.bridge import HubBridge

    hub = Hub()
    hub.policy = Policy([AccessRule(principal="sensor-hall", publish=("phyllo/hall/temp",))])
    bridge = HubBridge(hub, "hall", prefix="phyllo/hall", principal="sensor-hall")
    anonymous = HubBridge(hub, "yard", prefix="phyllo/yard")
    seen = Inbox()
    hub.subscribe_callback("phyllo/#", seen)
    bridge.from_device(PubSubMessage(TypeCode.BYTES_BUFFER, b"temp", b"21"))
    bridge.from_device(PubSubMessage(TypeCode.BYTES_BUFFER, b"door", b"open"))
    anonymous.from_device(PubSubMessage(TypeCode.BYTES_BUFFER, b"temp", b"5"))
    assert [message.topic for message in seen.messages] == ["phyllo/hall/temp"]
    assert (bridge.stats.denied, anonymous.stats.denied) == (1, 1)
    assert hub.denied[("phyllo", "publish")] == 2


@pytest_twisted.ensureDeferred
async def test_the_tools_show_a_client_certificate_with_cert_and_key(
    broker: Any, pki: PKI
) -> None:
    from tests.test_cli import Child

    text = (f'[[listen]]\nprotocol = "websmq"\ntransport = "length32"\n'
            f'endpoint = "{pki.endpoint()}"\n'
            '[[listen]]\nprotocol = "websmq"\ntransport = "length32"\n'
            'endpoint = "tcp:0:interface=127.0.0.1"\nprincipal = "watcher"\n'
            f'[auth]\n{RULES}\n[[acl]]\nprincipal = "watcher"\nsubscribe = ["#"]\n')
    service, bound = await broker.start_config(config_from_toml(text, reactor=reactor))
    port = int(bound[0].address.rsplit(":", 1)[1])
    watcher = await broker.client(bound[1].address)
    received: list[Any] = []
    await wait_for(watcher.subscribe("devices/device-1/temperature", received.append))
    await eventually(lambda: service.hub.subscribers("devices/device-1/temperature"))
    pub = (sys.executable, "-m", "wireproto", "pub", f"ssl:host=localhost:port={port}",
           "-p", "websmq", "-t", "devices/device-1/temperature", "-m", "21.5",
           "--cafile", str(pki.ca))
    directory = pki.directory
    shown = Child(*pub, "--cert", str(directory / "device-1.pem"),
                  "--key", str(directory / "device-1.key"))
    assert await shown.exit_code() == 0, shown.output()
    await eventually(lambda: received)
    assert received[0].payload == b"21.5"
    untrusted = Child(*pub, "--cert", str(directory / "untrusted.pem"),
                      "--key", str(directory / "untrusted.key"))
    without = Child(*pub)
    for refused in (untrusted, without):
        assert await refused.exit_code() != 0
    assert len(received) == 1
    key_alone = Child(*pub, "--key", str(directory / "device-1.key"))
    assert await key_alone.exit_code() == 2
    assert "--key without --cert" in key_alone.output()


def test_a_certificate_file_without_its_key_is_named(pki: PKI) -> None:
    from wireproto.transports.connect import tls_client_options

    with pytest.raises(ValueError, match="not a PEM certificate and its private key"):
        tls_client_options("localhost", certfile=str(pki.directory / "device-1.pem"))
    with pytest.raises(ValueError, match="without its certificate"):
        tls_client_options("localhost", keyfile=str(pki.directory / "device-1.key"))
