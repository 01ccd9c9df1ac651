"""A broker with [auth] for the access tests: an HS256 secret, a password file, and tokens."""

from __future__ import annotations

import base64
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory, Protocol

from tests.support import eventually, wait_for, write_secret
from wireproto.access.passwords import PasswordFile
from wireproto.settings import toml_value

SECRET = secrets.token_bytes(32)


@dataclass
class AuthFiles:
    directory: Path
    secret: Path
    passwords: Path

    def token(self, sub: str | None = "alice", *, lifetime: float = 300, key: bytes = SECRET,
              **claims: Any) -> str:
        payload: dict[str, Any] = {"exp": int(time.time() + lifetime), **claims}
        if sub is not None:
            payload["sub"] = sub
        return jwt.encode(payload, key, algorithm="HS256")

    def auth_table(self, **overrides: Any) -> str:
        values = {
            "jwt_algorithms": ["HS256"],
            "jwt_secret_file": str(self.secret),
            "password_file": str(self.passwords),
            **overrides,
        }
        lines = ["[auth]", *(f"{key} = {toml_value(value)}" for key, value in values.items())]
        return "\n".join(lines) + "\n"


@pytest.fixture
def auth_files(tmp_path: Path) -> AuthFiles:
    secret = tmp_path / "jwt.secret"
    write_secret(secret, SECRET)
    passwords = PasswordFile()
    passwords.set("carol", "carol's password", log2_n=10)
    path = tmp_path / "passwd"
    passwords.save(path)
    return AuthFiles(tmp_path, secret, path)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class _Collector(Protocol):
    def __init__(self) -> None:
        self.received = b""
        self.closed = False

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Any) -> None:
        self.closed = True


def _complete(raw: bytes) -> bool:
    head, found, body = raw.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return True


@dataclass
class HTTPAnswer:
    status: int
    headers: dict[str, str]
    raw: bytes


async def http_handshake(port: int, target: str, headers: dict[str, str] | None = None,
                         websocket: bool = True, *, source: str | None = None,
                         timeout: float = 5.0) -> HTTPAnswer:
    """Send one GET (a WebSocket upgrade unless `websocket` is false) and read the answer's
    head, within `timeout` seconds; status 0 if the connection closed without one. `source`
    is the client's own address (any of 127.0.0.0/8 is this host on Linux)."""
    lines = [f"GET {target} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    if websocket:
        lines += ["Upgrade: websocket", "Connection: Upgrade",
                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port,
                                  bindAddress=None if source is None else (source, 0))
    client = await wait_for(endpoint.connect(Factory.forProtocol(_Collector)))
    client.transport.write(request)
    await eventually(lambda: _complete(client.received) or client.closed, timeout)
    client.transport.loseConnection()
    if not client.received:
        return HTTPAnswer(0, {}, b"")  # closed without an answer
    head = client.received.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    answer_headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        answer_headers[name.strip().lower()] = value.strip()
    return HTTPAnswer(int(head[0].split()[1]), answer_headers, client.received)
