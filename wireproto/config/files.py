"""The files a config names, checked before the broker starts.

The places the broker writes must be places it can write: the capture directory, the ``[log]``
file and the ``[hub]`` retain file (when last values are kept) are each a directory that exists
or can be made, and be written in. The check tries, as the broker would (a file made and removed
at once, a directory made and removed), rather than reading mode bits that root passes anyway;
it leaves nothing behind.

Key and password files must be their owner's alone, as ssh wants of a private key: one that its
group or others may open is refused, naming the file and the ``chmod`` to run, unless
``[secrets] allow_loose_permissions`` is on. The secrets are the TLS private keys of endpoints
(``privateKey=`` of ``ssl:``/``mtls:`` listeners, of ``ssl:``/``tls:`` client endpoints), the
``[auth]`` password file and JWT HMAC secret, and the ``[cluster]`` password, token, NKey seed,
creds and TLS key files. Certificates, CAs and public keys are not secrets.

Each check gives (place, problem) pairs: the caller says where the place came from (a file, an
option).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wireproto.transports.connect import split_endpoint

if TYPE_CHECKING:
    from wireproto.config.model import Attach, Config, Listener, PhylloLink

__all__ = [
    "Place",
    "endpoint_key_file",
    "secret_files",
    "loose_permissions",
    "secret_file_problems",
    "place_problems",
]


@dataclass(frozen=True)
class Place:
    """Where a config names a file: `key` of table `section`, or of its [[section]] entry
    `number` (from 1); `part` is the piece of that value meant (an endpoint's privateKey)."""

    section: str
    number: int | None
    key: str
    part: str = ""

    def __str__(self) -> str:
        entry = self.section if self.number is None else f"{self.section}[{self.number}]"
        return f"{entry}.{self.key}"


def endpoint_key_file(endpoint: str, *, server: bool) -> str | None:
    """The private key file an endpoint string names, or None: ``privateKey`` of an ``ssl:`` or
    ``mtls:`` server endpoint (Twisted's ``ssl:`` reads ``server.pem`` without it), or of an
    ``ssl:`` or ``tls:`` client endpoint, whose certificate file holds the key when it is
    given alone."""
    args, kwargs = split_endpoint(endpoint)
    kind = args[0].lower() if args else ""
    if server and kind in ("ssl", "mtls"):
        # ssl:PORT:KEY and mtls:PORT:KEY name it positionally too.
        key = kwargs.get("privateKey") or (args[2] if len(args) > 2 else None)
        return key or ("server.pem" if kind == "ssl" else None)
    if not server and kind == "ssl":
        return kwargs.get("privateKey") or kwargs.get("certKey")
    if not server and kind == "tls":
        return kwargs.get("privateKey") or kwargs.get("certificate")
    return None


def secret_files(config: Config) -> Iterator[tuple[Place, str]]:
    """Each secret file `config` names, as (place, path), in the order a file shows them."""
    places: tuple[tuple[str, Sequence[Listener | Attach | PhylloLink], bool], ...] = (
        ("listen", config.listeners, True), ("attach", config.attach, False),
        ("phyllo", config.phyllo, False))
    for section, links, server in places:
        for number, link in enumerate(links, 1):
            key = endpoint_key_file(link.endpoint, server=server)
            if key:
                yield Place(section, number, "endpoint", "privateKey"), key
    auth = config.auth
    if auth.enabled:
        for name in ("jwt_secret_file", "password_file"):
            if getattr(auth, name):
                yield Place("auth", None, name), getattr(auth, name)
    cluster = config.cluster
    for name in ("password_file", "token_file", "nkey_seed_file", "creds_file", "keyfile"):
        if getattr(cluster, name):
            yield Place("cluster", None, name), getattr(cluster, name)
    if cluster.certfile and not cluster.keyfile:
        # Without keyfile, the client certificate's file holds its private key too.
        yield Place("cluster", None, "certfile"), cluster.certfile


def loose_permissions(path: str) -> str | None:
    """What is wrong with `path` as a secret file if its group or others may open it, or None.
    A file that cannot be looked at is left to the code that reads it to report."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    if not mode & 0o077:
        return None
    return f"{path} is open to group or others (mode 0{mode:o}); run chmod go-rwx {path}"


def secret_file_problems(config: Config) -> list[tuple[Place, str]]:
    """(place, problem) for each secret file of `config` that its group or others may open,
    unless [secrets] allows it."""
    if config.secrets.allow_loose_permissions:
        return []
    problems = []
    for place, path in secret_files(config):
        problem = loose_permissions(path)
        if problem is not None:
            problems.append((place, f"{place.part}: {problem}" if place.part else problem))
    return problems


def _existing(path: str) -> bool:
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def directory_problem(path: str) -> str | None:
    """What stops the broker from making directory `path` (its parents too) and writing files
    in it, or None."""
    try:
        if _existing(path):
            if not os.path.isdir(path):
                return f"{path} is not a directory"
            with tempfile.TemporaryFile(dir=path):
                return None
        # The nearest directory that exists takes the first one made.
        made = os.path.abspath(path)
        ancestor = os.path.dirname(made)
        while not _existing(ancestor):
            made, ancestor = ancestor, os.path.dirname(ancestor)
        if not os.path.isdir(ancestor):
            return f"cannot create {made}: {ancestor} is not a directory"
        try:
            os.rmdir(tempfile.mkdtemp(dir=ancestor))
        except OSError as error:
            return f"cannot create {made} in {ancestor}: {error.strerror}"
        return None
    except OSError as error:
        return f"cannot write in {path}: {error.strerror}"


def file_problem(path: str, *, flags: int, directory_too: bool = False) -> str | None:
    """What stops the broker from opening file `path` with `flags` (O_WRONLY | O_APPEND for a
    log, O_RDWR for a database), or from making it, and its directory, if it is missing; with
    `directory_too`, from writing beside it as well. None if nothing does."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        if not _existing(path):
            return directory_problem(directory)
        if os.path.isdir(path):
            return f"{path} is a directory"
        os.close(os.open(path, flags | os.O_CLOEXEC))
    except OSError as error:
        return f"cannot open {path}: {error.strerror}"
    return directory_problem(directory) if directory_too else None


def place_problems(config: Config) -> list[tuple[Place, str]]:
    """(place, problem) for each place the broker writes that it cannot make or write."""
    checks: list[tuple[Place, str | None]] = []
    hub = config.hub
    if hub.retain and hub.retain_file:
        # sqlite writes its -wal and -shm files beside the database.
        checks.append((Place("hub", None, "retain_file"),
                       file_problem(hub.retain_file, flags=os.O_RDWR, directory_too=True)))
    if config.log.file:
        checks.append((Place("log", None, "file"),
                       file_problem(config.log.file, flags=os.O_WRONLY | os.O_APPEND)))
    if config.capture.directory:
        checks.append((Place("capture", None, "directory"),
                       directory_problem(config.capture.directory)))
    return [(place, problem) for place, problem in checks if problem is not None]
