"""``wireproto passwd FILE USER``: set or delete a user's password in a password file.

The password is asked twice on a terminal (never echoed, never an argument, so it stays out of
shell history and the process list), or read as the first line of stdin when stdin is not a
terminal, for scripts. The file is created if it is missing and always written whole, readable
by its owner only (wireproto.access.passwords).
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path

from wireproto.access.passwords import PasswordFile, PasswordFileError
from wireproto.output import write_output

__all__ = ["register"]

PROG = "wireproto passwd"


def register(commands: argparse._SubParsersAction) -> None:
    """Adds ``passwd``."""
    passwd = commands.add_parser(
        "passwd",
        help="set or delete a user's password in a password file",
        description="Set USER's password in FILE (created if missing), asked twice on a "
                    "terminal or read as stdin's first line; or --delete USER. The file holds "
                    "scrypt hashes only.",
        epilog="See docs/tools.md.",
    )
    passwd.add_argument("file", metavar="FILE")
    passwd.add_argument("user", metavar="USER")
    passwd.add_argument("-d", "--delete", action="store_true", help="remove USER instead")
    passwd.set_defaults(run=run)


def _read_password() -> str | None:
    if not sys.stdin.isatty():
        line = sys.stdin.readline()
        return line[:-1] if line.endswith("\n") else line
    try:
        first = getpass.getpass("Password: ")
        again = getpass.getpass("Again: ")
    except EOFError:  # Ctrl-D at the prompt
        print(file=sys.stderr)  # past the prompt
        print(f"{PROG}: no password given; nothing changed", file=sys.stderr)
        return None
    if again != first:
        print(f"{PROG}: the passwords differ; nothing changed", file=sys.stderr)
        return None
    return first


def run(args: argparse.Namespace) -> int:
    passwords = PasswordFile()
    if Path(args.file).exists():
        try:
            passwords = PasswordFile.load(args.file)
        except PasswordFileError as error:
            print(f"{PROG}: {error}", file=sys.stderr)
            return 2
    if args.delete:
        if args.user not in passwords:
            print(f"{PROG}: {args.file}: no user {args.user!r}", file=sys.stderr)
            return 1
        passwords.remove(args.user)
        what = "deleted"
    else:
        password = _read_password()
        if password is None:
            return 1
        if not password:
            print(f"{PROG}: an empty password is not one; nothing changed", file=sys.stderr)
            return 1
        try:
            passwords.set(args.user, password)
        except ValueError as error:
            print(f"{PROG}: {error}", file=sys.stderr)
            return 2
        what = "set"
    try:
        passwords.save(args.file)
    except OSError as error:
        print(f"{PROG}: {args.file}: cannot be written: {error.strerror}", file=sys.stderr)
        return 2
    write_output(f"{PROG}: {args.file}: user {args.user!r} {what}\n")
    return 0
