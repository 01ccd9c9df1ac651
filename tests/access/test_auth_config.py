"""[auth] and [[acl]] in config files: how they read, what check-config refuses, and the docs'
examples."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from twisted.internet import reactor

from tests.access.conftest import AuthFiles
from tests.support import write_secret
from wireproto.access import AccessRule
from wireproto.config import ConfigError, config_from_toml, config_to_toml

ROOT = Path(__file__).resolve().parents[2]


def read(text: str):
    return config_from_toml(text, source="w.toml", reactor=reactor)


def test_an_auth_table_turns_authentication_on_and_rules_read_back() -> None:
    assert not read("").auth.enabled
    config = read('[auth]\n[[acl]]\nprincipal = "alice"\npublish = ["users/%u/#"]\n'
                  '[[acl]]\nsubscribe = ["public/#"]\n')
    assert config.auth.enabled
    assert config.acl == (AccessRule(principal="alice", publish=("users/%u/#",)),
                          AccessRule(subscribe=("public/#",)))
    assert read(config_to_toml(config)) == config
    assert "[auth]" not in config_to_toml(read(""))


LISTENER = '[[listen]]\nprotocol = "websmq"\ntransport = "ws"\nendpoint = "tcp:0"\n'


def test_a_listeners_allow_list_reads_back() -> None:
    config = read(LISTENER + 'allow = ["carol", "role:admin"]\n[auth]\n')
    assert config.listeners[0].allow == ("carol", "role:admin")
    assert read(config_to_toml(config)) == config
    listen_table = config_to_toml(read(LISTENER)).split("[[listen]]")[1].split("\n\n")[0]
    assert "endpoint" in listen_table and "allow" not in listen_table


@pytest.mark.parametrize(("text", "message"), [
    (LISTENER + 'allow = ["carol"]\n', "w.toml: listen[1].allow: takes effect with an [auth]"),
    (LISTENER + 'allow = "carol"\n[auth]\n', "w.toml: listen[1].allow: expected a list"),
    (LISTENER + 'allow = ["role:"]\n[auth]\n', "w.toml: listen[1].allow: a principal is a"),
    (LISTENER + 'principal = "lan"\nallow = ["carol"]\n[auth]\n',
     "w.toml: listen[1].allow: a listener whose connections are one principal"),
    ('[[acl]]\nsubscribe = ["a"]', "w.toml: acl: [[acl]] rules take effect with an [auth] table"),
    ('[auth]\n[[acl]]\nprincipal = "a"', "w.toml: acl[1]: grants nothing"),
    ('[auth]\n[[acl]]\nrole = "admin"\nsubscribe = ["#"]',
     "w.toml: acl[1].role: can never match: roles come only in JWT claims"),
    ('[auth]\n[[acl]]\nprincipal = "a"\nrole = "b"\nsubscribe = ["#"]',
     "w.toml: acl[1]: an access rule is for a principal or for a role, not both"),
    ('[auth]\n[[acl]]\nsubscrib = ["#"]',
     "w.toml: acl[1].subscrib: unknown key; use principal, role, publish, subscribe, call or "
     "serve (did you mean 'subscribe'?)"),
    ('[auth]\n[[acl]]\nsubscribe = "#"', "w.toml: acl[1].subscribe: expected a list of strings"),
    ('[auth]\n[[acl]]\nsubscribe = ["a/#/b"]', "w.toml: acl[1]: "),
    ('[auth]\n[[acl]]\nsubscribe = ["%x"]', "w.toml: acl[1]: pattern '%x': '%x' is no placeholder"),
    ('[auth]\njwt_algorithms = ["none"]\njwt_secret_file = "s"',
     "w.toml: auth: jwt_algorithms: unknown algorithm 'none'"),
    ('[auth]\njwt_secret_file = "s"', "w.toml: auth: jwt_secret_file needs jwt_algorithms"),
    ('[auth]\nanonymos = true', "w.toml: auth.anonymos: unknown key"),
    ('[auth]\nfailed_login_delay = 10\nfailed_login_max_delay = 5',
     "w.toml: auth: failed_login_max_delay (5) is below failed_login_delay (10)"),
    ('[auth]\nfailed_logins_per_user = -1',
     "w.toml: auth.failed_logins_per_user: expected a count"),
    ('[auth]\nmax_pending_password_checks_per_address = 0',
     "w.toml: auth.max_pending_password_checks_per_address: must be a positive integer"),
    ('[[listen]]\nprotocol = "websmq"\ntransport = "length32"\nendpoint = "tcp:0"\n'
     'identity = "credentials"', "w.toml: listen[1].identity: credentials come with a ws or "
     "engineio handshake"),
    ('[[listen]]\nprotocol = "websmq"\ntransport = "ws"\nendpoint = "tcp:0"\n'
     'identity = "anonymous"\nprincipal = "lan"',
     "w.toml: listen[1].principal: a listener has an identity or a principal, not both"),
    ('[[listen]]\nprotocol = "websmq"\ntransport = "ws"\nendpoint = "tcp:0"\n'
     'identity = "psychic"', "w.toml: listen[1].identity: unknown identity 'psychic'"),
])
def test_bad_auth_config_is_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        read(text)
    assert message in str(raised.value)


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wireproto", "check-config", str(path)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          stdin=subprocess.DEVNULL)


def test_check_config_reads_the_key_and_password_files(auth_files: AuthFiles) -> None:
    good = auth_files.directory / "good.toml"
    good.write_text(auth_files.auth_table() + '[[acl]]\nsubscribe = ["#"]\n')
    done = check_config(good)
    assert done.returncode == 0, done.stderr
    assert "auth: on, 1 access rules" in done.stdout
    missing = auth_files.directory / "missing.toml"
    missing.write_text(auth_files.auth_table(jwt_secret_file="/nonexistent/secret"))
    done = check_config(missing)
    assert done.returncode == 2
    assert f"{missing}: auth.jwt_secret_file: cannot read /nonexistent/secret" in done.stderr
    short = auth_files.directory / "short.secret"
    write_secret(short, b"too short")
    weak = auth_files.directory / "weak.toml"
    weak.write_text(auth_files.auth_table(jwt_secret_file=str(short)))
    done = check_config(weak)
    assert done.returncode == 2 and "the HMAC secret is 9 bytes" in done.stderr
    broken = auth_files.directory / "broken.passwd"
    write_secret(broken, b"alice:plaintext\n")
    bad_passwords = auth_files.directory / "passwords.toml"
    bad_passwords.write_text(auth_files.auth_table(password_file=str(broken)))
    done = check_config(bad_passwords)
    assert done.returncode == 2 and "auth.password_file:" in done.stderr
