"""Shared test protocols and fixtures for the transport adapters.

`net` tracks every message protocol, listening port and raw connection a test opens and closes
them all at the end, so tests do not leak into each other. `tls_files` is a self-signed
certificate for "localhost"; `null_modem` joins two pty pairs into a serial cable.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import tty
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import defer, fdesc, reactor
from twisted.internet.abstract import FileDescriptor
from twisted.internet.endpoints import TCP4ClientEndpoint, serverFromString
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from tests.support import eventually, wait_for, write_secret
from wireproto.transports import MessageProtocol


class Recorder(MessageProtocol):
    """Records every message and how the connection ended; answers nothing."""

    def __init__(self) -> None:
        self.messages: list[tuple[bytes, bool]] = []
        self.reason: Failure | None = None
        self.lost_calls = 0
        # Fires with None: a Deferred given a Failure would take its error path.
        self.lost: defer.Deferred[None] = defer.Deferred()

    def messageReceived(self, data: bytes, binary: bool) -> None:
        self.messages.append((data, binary))

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        self.lost_calls += 1
        if self.lost_calls == 1:
            self.reason = reason
            self.lost.callback(None)

    async def received(self, count: int, timeout: float = 5.0) -> list[tuple[bytes, bool]]:
        await eventually(lambda: len(self.messages) >= count, timeout=timeout)
        return self.messages


class Echo(Recorder):
    """Sends every message straight back, with the same binary flag."""

    def messageReceived(self, data: bytes, binary: bool) -> None:
        super().messageReceived(data, binary)
        self.transport.sendMessage(data, binary)


class ProducerProbe:
    """A push producer that only records what its consumer asks of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pauseProducing(self) -> None:
        self.calls.append("pause")

    def resumeProducing(self) -> None:
        self.calls.append("resume")

    def stopProducing(self) -> None:
        self.calls.append("stop")


class Flooder(Recorder):
    """Registers a push producer as soon as it is connected, as the hub's send queues do."""

    def connectionMade(self) -> None:
        self.probe = ProducerProbe()
        self.transport.registerProducer(self.probe, True)


# Backpressure tests shrink the socket buffers to 16 KiB; this is many times what they hold.
CHUNK = b"z" * 65536
CHUNKS = 8


class RawClient(Protocol):
    """A byte-level peer, for sending what a well-behaved adapter never would."""

    def __init__(self) -> None:
        self.received = b""
        self.closed: defer.Deferred[None] = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure) -> None:
        self.closed.callback(None)


class Net:
    """Everything one test opened, closed again at its end."""

    def __init__(self) -> None:
        self.protocols: list[Recorder] = []
        self.ports: list[Any] = []
        self.raw: list[RawClient] = []
        self.cleanups: list[Callable[[], Any]] = []

    def factory(self, cls: type[Recorder] = Echo, *args: Any) -> Callable[[], Recorder]:
        """A zero-argument protocol factory whose protocols this Net will close."""

        def build() -> Recorder:
            protocol = cls(*args)
            self.protocols.append(protocol)
            return protocol

        return build

    async def listen(self, factory: Any, description: str = "tcp:0:interface=127.0.0.1") -> Any:
        port = await wait_for(serverFromString(reactor, description).listen(factory))
        self.ports.append(port)
        return port

    async def listen_tcp(self, factory: Any) -> int:
        return (await self.listen(factory)).getHost().port

    async def raw_connect(self, port: int, source: str | None = None) -> RawClient:
        """A raw TCP connection to `port`, from the loopback address `source` if given (all
        of 127.0.0.0/8 is this host, so tests can be several peers)."""
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port,
                                      bindAddress=(source, 0) if source else None)
        client = await wait_for(endpoint.connect(Factory.forProtocol(RawClient)))
        self.raw.append(client)
        return client

    async def close(self) -> None:
        for protocol in self.protocols:
            if protocol.connected:
                protocol.transport.abortConnection()
        for client in self.raw:
            if client.transport.connected:
                client.transport.abortConnection()
        for protocol in self.protocols:
            if protocol.transport is not None:
                await wait_for(protocol.lost)
        # Every adapter must report the end of a connection exactly once.
        assert [p.lost_calls for p in self.protocols if p.transport is not None] == [
            1 for p in self.protocols if p.transport is not None
        ]
        for client in self.raw:
            await wait_for(client.closed)
        for port in self.ports:
            await wait_for(defer.maybeDeferred(port.stopListening))
        for cleanup in reversed(self.cleanups):
            cleanup()


@pytest_twisted.async_yield_fixture
async def net():
    tracker = Net()
    try:
        yield tracker
    finally:
        await tracker.close()


@dataclass(frozen=True)
class TLSFiles:
    key: Path
    cert: Path
    ca_dir: Path

    @property
    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A self-signed certificate for localhost and 127.0.0.1, made fresh for this run."""
    directory = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path = directory / "key.pem"
    write_secret(key_path, key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ))
    ca_dir = directory / "ca"
    ca_dir.mkdir()
    cert_path = ca_dir / "cert.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return TLSFiles(key=key_path, cert=cert_path, ca_dir=ca_dir)


class _PtyMaster(FileDescriptor):
    """One end of the null modem: a pty master, passing what it reads to the other end."""

    def __init__(self, fd: int) -> None:
        super().__init__(reactor)
        self.fd = fd
        self.other: _PtyMaster | None = None
        # FileDescriptor.write drops data unless connected.
        self.connected = 1
        fdesc.setNonBlocking(fd)

    def fileno(self) -> int:
        return self.fd

    def doRead(self) -> Any:
        return fdesc.readFromFD(self.fd, self.other.write)

    def writeSomeData(self, data: bytes) -> Any:
        return fdesc.writeToFD(self.fd, data)


@pytest.fixture
def pty_pair():
    """One pty pair in raw mode: yields (master fd, slave device path)."""
    master, slave = os.openpty()
    try:
        tty.setraw(slave)
        yield master, os.ttyname(slave)
    finally:
        os.close(master)
        os.close(slave)


@pytest.fixture
def null_modem():
    """Two pty pairs whose masters are cross-connected: yields the two slave device paths.

    A serial endpoint on each path talks to the other, as over a null-modem cable.
    """
    fds: list[int] = []
    ends: list[_PtyMaster] = []
    try:
        devices = []
        for _ in range(2):
            master, slave = os.openpty()
            fds += [master, slave]
            # Raw from the start, so nothing is echoed back before a SerialPort opens it.
            tty.setraw(slave)
            devices.append(os.ttyname(slave))
            ends.append(_PtyMaster(master))
        ends[0].other, ends[1].other = ends[1], ends[0]
        for end in ends:
            end.startReading()
        yield devices
    finally:
        for end in ends:
            end.stopReading()
            end.stopWriting()
        for fd in fds:
            os.close(fd)
