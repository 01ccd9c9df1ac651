"""``wireproto passwd``, run as a user runs it, with the password on stdin."""

from __future__ import annotations

import subprocess
import sys

from wireproto.access.passwords import PasswordFile


def passwd(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wireproto", "passwd", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_set_change_and_delete_a_user(tmp_path):
    path = tmp_path / "passwd"
    done = passwd(str(path), "alice", stdin="wonderland\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"wireproto passwd: {path}: user 'alice' set\n"
    assert "wonderland" not in path.read_text()
    assert PasswordFile.load(path).check("alice", "wonderland")

    assert passwd(str(path), "bob", stdin="builder").returncode == 0  # no newline: all of it
    assert passwd(str(path), "alice", stdin="looking glass\n").returncode == 0
    passwords = PasswordFile.load(path)
    assert passwords.check("alice", "looking glass") and passwords.check("bob", "builder")

    deleted = passwd(str(path), "alice", "--delete")
    assert deleted.returncode == 0 and "'alice' deleted" in deleted.stdout
    assert "alice" not in PasswordFile.load(path)
    missing = passwd(str(path), "alice", "--delete")
    assert missing.returncode == 1 and "no user 'alice'" in missing.stderr


def test_an_empty_password_or_a_bad_name_changes_nothing(tmp_path):
    path = tmp_path / "passwd"
    empty = passwd(str(path), "alice", stdin="\n")
    assert empty.returncode == 1 and "empty password" in empty.stderr
    assert not path.exists()
    bad = passwd(str(path), "a:b", stdin="pw\n")
    assert bad.returncode == 2 and "user name" in bad.stderr
    assert not path.exists()


def test_a_bad_file_is_named_and_left_alone(tmp_path):
    path = tmp_path / "passwd"
    path.write_text("alice:plain\n")
    done = passwd(str(path), "bob", stdin="pw\n")
    assert done.returncode == 2 and f"{path}:1: not a user" in done.stderr
    assert path.read_text() == "alice:plain\n"
