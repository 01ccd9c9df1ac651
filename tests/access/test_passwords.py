"""The password file: scrypt hashes in PHC strings, checks, and a file written safely."""

from __future__ import annotations

import os
import stat

import pytest

from wireproto.access.passwords import (
    PasswordFile,
    PasswordFileError,
    check_password,
    hash_password,
)

FAST = 4  # log2 of scrypt's n: the tests' hashes cost microseconds, not 32 MiB


def test_a_hash_checks_its_own_password_and_no_other():
    encoded = hash_password("correct horse", log2_n=FAST)
    assert encoded.startswith(f"$scrypt$ln={FAST},r=8,p=1$")
    assert check_password("correct horse", encoded)
    assert not check_password("correct hors", encoded)
    assert hash_password("correct horse", log2_n=FAST) != encoded  # a fresh salt each time


def test_the_default_cost_is_memory_hard():
    encoded = hash_password("pw")
    assert encoded.startswith("$scrypt$ln=15,r=8,p=1$")
    assert check_password("pw", encoded)


def test_a_file_round_trips_and_is_written_for_its_owner_only(tmp_path):
    path = tmp_path / "passwd"
    passwords = PasswordFile()
    passwords.set("alice", "wonderland", log2_n=FAST)
    passwords.set("bob", "builder", log2_n=FAST)
    passwords.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [line.split(":")[0] for line in path.read_text().splitlines()] == ["alice", "bob"]
    loaded = PasswordFile.load(path)
    assert len(loaded) == 2 and "alice" in loaded
    assert loaded.check("alice", "wonderland")
    assert not loaded.check("alice", "builder")
    assert not loaded.check("carol", "wonderland")  # unknown: checked all the same, and false
    loaded.remove("bob")
    loaded.save(path)
    assert "bob" not in PasswordFile.load(path)
    assert [p.name for p in tmp_path.iterdir()] == ["passwd"]  # no temporary left behind


@pytest.mark.parametrize(("text", "match"), [
    ("alice\n", ":1: not a user"),
    ("alice:plaintext\n", ":1: not a user"),
    ("# comment\n\nalice:$scrypt$ln=99,r=8,p=1$AAAA$AAAAAAAAAAAAAAAAAAAAAA\n", ":3: scrypt cost"),
    ("alice:$scrypt$ln=4,r=8,p=1$AAAA$AAAA\n", "too short"),
    ("a:{h}\na:{h}\n", ":2: user 'a' appears twice"),
])
def test_a_bad_line_is_refused_by_number(tmp_path, text, match):
    path = tmp_path / "passwd"
    path.write_text(text.replace("{h}", hash_password("x", log2_n=FAST)))
    with pytest.raises(PasswordFileError, match=match):
        PasswordFile.load(path)


def test_an_unreadable_file_says_so(tmp_path):
    with pytest.raises(PasswordFileError, match="cannot be read"):
        PasswordFile.load(tmp_path / "missing")


@pytest.mark.parametrize("user", ["", "a:b", "a b", "tab\tname"])
def test_a_user_name_that_would_break_the_file_is_refused(user):
    with pytest.raises(ValueError, match="user name"):
        PasswordFile().set(user, "pw", log2_n=FAST)


def test_a_users_line_stamp_changes_with_the_password_and_goes_with_the_user():
    passwords = PasswordFile()
    passwords.set("carol", "first", log2_n=4)
    before = passwords.line_stamp("carol")
    assert before is not None and "first" not in before
    passwords.set("carol", "second", log2_n=4)
    assert passwords.line_stamp("carol") not in (None, before)
    passwords.remove("carol")
    assert passwords.line_stamp("carol") is None
