"""Key and password files that their group or others may open are refused, as ssh refuses such a
private key: by `wireproto check-config`, `wireproto serve` and `twistd wireproto`, one line per
file naming the key, the file and the chmod to run, unless ``[secrets] allow_loose_permissions``.
Certificates, CAs and public keys are not secrets. Real processes, as a user runs them: as root
the mode bits do not stop reading, so the refusal is on the bits alone."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from tests.access.conftest import SECRET
from tests.test_cli import BIN, Child, children  # noqa: F401 (a fixture)
from wireproto.access.passwords import PasswordFile
from wireproto.settings import toml_value

READY = re.compile(r"^wireproto: ready")


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`args` to its end; a broker that does not refuse to start is killed after `timeout`."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def loose(path: Path) -> str:
    return f"{path} is open to group or others (mode 0{path.stat().st_mode & 0o777:o}); " \
           f"run chmod go-rwx {path}"


class Secrets:
    """Every kind of secret file a config can name, each at the mode a test gives it, and the
    public files beside them that are never refused."""

    def __init__(self, directory: Path, tls_files: Any) -> None:
        self.directory = directory
        self.tls_key = directory / "tls.key"
        self.mtls_key = directory / "mtls.key"
        for key in (self.tls_key, self.mtls_key):
            shutil.copyfile(tls_files.key, key)
        self.cert = directory / "cert.pem"  # also the CA of mtls: clients
        shutil.copyfile(tls_files.cert, self.cert)
        self.jwt_secret = directory / "jwt.secret"
        self.jwt_secret.write_bytes(SECRET)
        self.passwords = directory / "passwd"
        users = PasswordFile()
        users.set("carol", "carol's password", log2_n=10)
        users.save(self.passwords)
        self.cluster = {name: directory / f"nats.{name}" for name in (
            "password_file", "token_file", "nkey_seed_file", "creds_file", "keyfile")}
        for path in self.cluster.values():
            path.write_text("not read by check-config\n")
        self.cluster_ca = directory / "nats-ca.pem"
        self.cluster_ca.write_text("a certificate\n")

    @property
    def secret_files(self) -> list[Path]:
        return [self.tls_key, self.mtls_key, self.jwt_secret, self.passwords,
                *self.cluster.values()]

    def chmod(self, mode: int) -> None:
        for path in self.secret_files:
            path.chmod(mode)
        for public in (self.cert, self.cluster_ca):
            public.chmod(0o644)

    def config(self, extra: str = "") -> Path:
        tls = f"ssl:0:privateKey={self.tls_key}:certKey={self.cert}"
        mtls = f"mtls:0:privateKey={self.mtls_key}:certKey={self.cert}:caCerts={self.cert}"
        cluster = {"url": "nats://127.0.0.1:4222", "user": "broker", "cafile": str(self.cluster_ca),
                   "certfile": str(self.cert),
                   **{name: str(path) for name, path in self.cluster.items()}}
        text = (
            f'listen = ["websmq+ws@{tls}", "ubre+lines@{mtls}"]\n'
            "[auth]\n"
            f'jwt_algorithms = ["HS256"]\njwt_secret_file = "{self.jwt_secret}"\n'
            f'password_file = "{self.passwords}"\n'
            "[cluster]\n" + "".join(f"{key} = {toml_value(value)}\n"
                                    for key, value in cluster.items())
            + extra
        )
        path = self.directory / "wireproto.toml"
        path.write_text(text)
        return path


@pytest.fixture
def secrets(tmp_path: Path, tls_files: Any) -> Secrets:
    return Secrets(tmp_path, tls_files)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_check_config_refuses_every_secret_file_open_to_group_or_others(
    secrets: Secrets, mode: int
) -> None:
    secrets.chmod(mode)
    config = secrets.config()
    done = run(sys.executable, "-m", "wireproto", "check-config", str(config))
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    keys = ["listen[1].endpoint: privateKey", "listen[2].endpoint: privateKey",
            "auth.jwt_secret_file", "auth.password_file",
            *(f"cluster.{name}" for name in secrets.cluster)]
    assert done.stderr.splitlines() == [
        f"wireproto check-config: {config}: {key}: {loose(path)}"
        for key, path in zip(keys, secrets.secret_files, strict=True)
    ]


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_check_config_accepts_secret_files_that_are_the_owners_alone(
    secrets: Secrets, mode: int
) -> None:
    secrets.chmod(mode)
    config = secrets.config()
    done = run(sys.executable, "-m", "wireproto", "check-config", str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"wireproto: {config}: ok"
    assert done.stderr == ""


def test_a_setting_allows_loose_permissions(secrets: Secrets) -> None:
    secrets.chmod(0o644)
    config = secrets.config("[secrets]\nallow_loose_permissions = true\n")
    done = run(sys.executable, "-m", "wireproto", "check-config", str(config))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_a_cluster_certificate_holding_its_key_is_a_secret(tmp_path: Path) -> None:
    # Without keyfile, the client certificate file holds the private key too.
    both = tmp_path / "client.pem"
    both.write_text("a certificate and its key\n")
    both.chmod(0o644)
    config = tmp_path / "w.toml"
    config.write_text(f'listen = ["websmq+ws@tcp:0"]\n[cluster]\nurl = "tls://127.0.0.1:4222"\n'
                      f'certfile = "{both}"\n')
    done = run(sys.executable, "-m", "wireproto", "check-config", str(config))
    assert done.returncode == 2
    assert done.stderr == f"wireproto check-config: {config}: cluster.certfile: {loose(both)}\n"


def test_a_jwt_public_key_is_not_a_secret(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public = tmp_path / "jwt.pub"
    public.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    public.chmod(0o644)
    config = tmp_path / "w.toml"
    config.write_text(f'listen = ["websmq+ws@tcp:0"]\n[auth]\njwt_algorithms = ["ES256"]\n'
                      f'jwt_public_key_file = "{public}"\n')
    done = run(sys.executable, "-m", "wireproto", "check-config", str(config))
    assert done.returncode == 0, done.stderr


def test_serve_refuses_a_loose_key_named_on_the_command_line(secrets: Secrets) -> None:
    secrets.chmod(0o644)
    spec = f"websmq+ws@ssl:0:privateKey={secrets.tls_key}:certKey={secrets.cert}"
    done = run(sys.executable, "-m", "wireproto", "serve", "--listen", spec, timeout=15)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (f"wireproto serve: --listen '{spec}': privateKey: "
                           f"{loose(secrets.tls_key)}\n")


def test_serve_and_twistd_refuse_a_loose_password_file(secrets: Secrets) -> None:
    secrets.passwords.chmod(0o640)
    config = secrets.directory / "auth.toml"
    config.write_text(f'listen = ["websmq+ws@tcp:0"]\n[auth]\n'
                      f'password_file = "{secrets.passwords}"\n')
    line = f"{config}: auth.password_file: {loose(secrets.passwords)}"
    served = run(sys.executable, "-m", "wireproto", "serve", "--config", str(config),
                 timeout=15)
    assert served.returncode == 2
    assert (served.stdout, served.stderr) == ("", f"wireproto serve: {line}\n")
    twistd = run(str(BIN / "twistd"), "-n", "--pidfile=", "wireproto", "--config", str(config),
                 timeout=15)
    assert twistd.returncode == 2
    assert twistd.stdout == ""
    assert twistd.stderr.splitlines()[0] == f"twistd wireproto: {line}"


@pytest_twisted.ensureDeferred
async def test_serve_takes_a_key_that_is_the_owners_alone(
    secrets: Secrets, children: list[Child]  # noqa: F811
) -> None:
    secrets.chmod(0o600)
    child = Child(sys.executable, "-m", "wireproto", "serve", "--listen",
                  f"websmq+ws@ssl:0:privateKey={secrets.tls_key}:certKey={secrets.cert}")
    children.append(child)
    await child.line(READY)
    child.process.send_signal(signal.SIGINT)
    assert await child.exit_code() == 0, child.output()


@pytest_twisted.ensureDeferred
async def test_serve_takes_a_loose_key_where_the_setting_allows_it(
    secrets: Secrets, children: list[Child]  # noqa: F811
) -> None:
    secrets.chmod(0o644)
    config = secrets.directory / "loose.toml"
    config.write_text(
        f'listen = ["websmq+ws@ssl:0:privateKey={secrets.tls_key}:certKey={secrets.cert}"]\n'
        "[secrets]\nallow_loose_permissions = true\n")
    child = Child(sys.executable, "-m", "wireproto", "serve", "--config", str(config))
    children.append(child)
    await child.line(READY)
    child.process.send_signal(signal.SIGINT)
    assert await child.exit_code() == 0, child.output()


@pytest_twisted.ensureDeferred
async def test_a_reload_refuses_a_password_file_made_loose_and_keeps_the_old_one(
    secrets: Secrets, children: list[Child]  # noqa: F811
) -> None:
    from tests.support import eventually

    secrets.passwords.chmod(0o600)
    config = secrets.directory / "auth.toml"
    config.write_text(f'listen = ["websmq+ws@tcp:0"]\n[auth]\n'
                      f'password_file = "{secrets.passwords}"\n')
    child = Child(sys.executable, "-m", "wireproto", "serve", "--config", str(config))
    children.append(child)
    await child.line(READY)
    secrets.passwords.chmod(0o644)
    child.process.send_signal(signal.SIGHUP)
    expected = f"reload failed, keeping the old rules: {config}: auth.password_file: " \
               f"{loose(secrets.passwords)}"
    await eventually(lambda: any(expected in line for line in child.stderr), timeout=15)
    assert child.process.poll() is None
    child.process.send_signal(signal.SIGINT)
    assert await child.exit_code() == 0, child.output()
