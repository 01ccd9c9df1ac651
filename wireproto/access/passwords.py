"""The password file: one `user:hash` line per user, hashes made with scrypt, sans-IO but for
reading and writing the file.

A hash is written in the PHC string format, ``$scrypt$ln=15,r=8,p=1$SALT$HASH`` (salt and hash
in unpadded base64), so its cost travels with it and can be raised later without breaking old
lines. scrypt is the standard library's (`hashlib.scrypt`): memory-hard, and no dependency.
Checking a password costs about 32 MiB and tens of milliseconds by design, so callers run it
off the reactor thread and bound how many run at once. An unknown user costs the same as a
known one, and hashes are compared in constant time, so timing does not tell which users exist.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from .credentials import stamp

__all__ = ["PasswordFile", "PasswordFileError", "hash_password", "check_password"]

_DEFAULT_LOG2_N = 15  # n = 32768; with r = 8, 32 MiB a check
_R, _P = 8, 1
_SALT_BYTES, _HASH_BYTES = 16, 32
_LINE = re.compile(r"^([^:\s]+):(\$scrypt\$\S+)$")
_PHC = re.compile(r"^\$scrypt\$ln=(\d+),r=(\d+),p=(\d+)\$([A-Za-z0-9+/]+)\$([A-Za-z0-9+/]+)$")
_MAX_LOG2_N, _MAX_R, _MAX_P = 20, 32, 16  # a file cannot make one check cost gigabytes


class PasswordFileError(ValueError):
    """The file cannot be used; the message names the line."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4))


def _scrypt(password: str, salt: bytes, log2_n: int, r: int, p: int, length: int) -> bytes:
    n = 1 << log2_n
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p,
                          maxmem=2 * 128 * r * n * p + 1024 * 1024, dklen=length)


def hash_password(password: str, *, log2_n: int = _DEFAULT_LOG2_N) -> str:
    """A new PHC string for `password`, with a fresh random salt."""
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = _scrypt(password, salt, log2_n, _R, _P, _HASH_BYTES)
    return f"$scrypt$ln={log2_n},r={_R},p={_P}${_b64(salt)}${_b64(digest)}"


@dataclass(frozen=True)
class _Hash:
    log2_n: int
    r: int
    p: int
    salt: bytes
    digest: bytes


def _parse_hash(text: str) -> _Hash:
    match = _PHC.match(text)
    if match is None:
        raise ValueError("not a $scrypt$ln=..,r=..,p=..$salt$hash string")
    log2_n, r, p = (int(match[i]) for i in (1, 2, 3))
    if not (1 <= log2_n <= _MAX_LOG2_N and 1 <= r <= _MAX_R and 1 <= p <= _MAX_P):
        raise ValueError(f"scrypt cost ln={log2_n},r={r},p={p} is out of range")
    salt, digest = _unb64(match[4]), _unb64(match[5])
    if len(digest) < 16:
        raise ValueError("the hash is too short")
    return _Hash(log2_n, r, p, salt, digest)


def _matches(password: str, stored: _Hash) -> bool:
    digest = _scrypt(password, stored.salt, stored.log2_n, stored.r, stored.p, len(stored.digest))
    return hmac.compare_digest(digest, stored.digest)


def check_password(password: str, encoded: str) -> bool:
    """Whether `password` is the one `encoded` (a PHC string) was made from."""
    return _matches(password, _parse_hash(encoded))


# Checked against when the user is unknown, so that costs what a known user costs.
_STAND_IN = _Hash(_DEFAULT_LOG2_N, _R, _P, b"\0" * _SALT_BYTES, b"\0" * _HASH_BYTES)


class PasswordFile:
    """Users and their hashes, as read from a file (`load`) or set in memory (`set`)."""

    def __init__(self) -> None:
        self._lines: dict[str, str] = {}  # each user's PHC string, as the file holds it

    @classmethod
    def load(cls, path: str | Path) -> PasswordFile:
        """Read `path`; a bad line raises PasswordFileError naming it. Blank lines and lines
        starting with # are skipped."""
        path = Path(path)
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise PasswordFileError(f"{path}: cannot be read: {error}") from None
        passwords = cls()
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            match = _LINE.match(line)
            if match is None:
                raise PasswordFileError(f"{path}:{number}: not a user:$scrypt$... line")
            if match[1] in passwords._lines:
                raise PasswordFileError(f"{path}:{number}: user {match[1]!r} appears twice")
            try:
                passwords._add(match[1], match[2])
            except ValueError as error:
                raise PasswordFileError(f"{path}:{number}: {error}") from None
        return passwords

    def _add(self, user: str, encoded: str) -> None:
        _check_user(user)
        _parse_hash(encoded)  # refused here, not at the first check
        self._lines[user] = encoded

    def __contains__(self, user: object) -> bool:
        return user in self._lines

    def __len__(self) -> int:
        return len(self._lines)

    def line_stamp(self, user: str) -> str | None:
        """A digest of `user`'s line, None without one: it changes with the password (or only
        its hash), so a connection that proved itself with the old one can be told apart."""
        encoded = self._lines.get(user)
        return None if encoded is None else stamp(f"{user}:{encoded}".encode())

    def check(self, user: str, password: str) -> bool:
        """Whether `user` exists and `password` is theirs; slow on purpose (see the module)."""
        encoded = self._lines.get(user)
        stored = _STAND_IN if encoded is None else _parse_hash(encoded)
        return _matches(password, stored) and encoded is not None

    def set(self, user: str, password: str, *, log2_n: int = _DEFAULT_LOG2_N) -> None:
        self._add(user, hash_password(password, log2_n=log2_n))

    def remove(self, user: str) -> None:
        self._lines.pop(user, None)

    def save(self, path: str | Path) -> None:
        """Write the file whole, readable by its owner only, replacing the old one at once."""
        path = Path(path)
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        text = "".join(f"{user}:{encoded}\n" for user, encoded in sorted(self._lines.items()))
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise


def _check_user(user: str) -> None:
    if not user or ":" in user or any(c.isspace() for c in user):
        raise ValueError(f"user name {user!r}: not empty, and no ':' or white space")
