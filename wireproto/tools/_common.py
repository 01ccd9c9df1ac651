"""What the command-line clients share: exit codes, addresses, payloads, output and errors.

Exit codes (docs/tools.md):

====  =====================================================================
0     done: every message sent, every expected message received
1     the peer answered with an error (a failed call, a refused event)
2     bad usage: an option, an address, a payload that cannot be sent
3     cannot reach the peer: connection refused, no such host or device
4     the peer refused us: WebSocket handshake refused, Subble handshake code
5     timed out: no answer, or fewer messages than asked for within --timeout
130   stopped by Ctrl-C or SIGTERM with work left (pub, call, produce)
141   stdout closed by its reader (``| head -1``): the tool ends at once, quietly
====  =====================================================================

A tool whose stdout cannot be written ends at once, whatever it was doing (`emit`,
wireproto.output.write_output): 141 for a closed pipe, as a shell reports mosquitto_sub killed
by SIGPIPE, with nothing on stderr; 1 and one line for any other error, a full disk say.

Ctrl-C or SIGTERM stops every tool the same way (`run_tool`): what it was waiting for is
cancelled, its connection is closed cleanly, and it exits quietly: 0 for a tool that runs until
it is stopped (sub, events), 130 for one that had work left (pub, call, produce).

Errors are one line on stderr, ``wireproto TOOL: what went wrong``, never a traceback.
"""

from __future__ import annotations

import argparse
import base64
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import IO, Any

from twisted.internet import defer, error, task

from wireproto.codecs.serialization import json_dumps
from wireproto.output import write_output
from wireproto.redaction import has_user_information, redact_text, redact_url

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_TIMEOUT",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "ToolError",
    "add_common_options",
    "check_address",
    "connect_options",
    "emit",
    "payload_text",
    "one_line",
    "stdin_lines",
    "run_tool",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_REFUSED = 4
EXIT_TIMEOUT = 5
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C

class ToolError(Exception):
    """Ends a tool with one line on stderr and `code`."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def add_common_options(parser: argparse.ArgumentParser, protocols: Sequence[str], *,
                       address_flag: str | None = None) -> None:
    """The options every client tool takes; ADDRESS is the first argument, or with
    `address_flag` (``--to``) that option's value, required."""
    address_help = ("ws://host:port/path URL or a client endpoint string "
                    "(tcp:host:port, serial:/dev/ttyACM0...)")
    if address_flag is None:
        parser.add_argument("address", metavar="ADDRESS", help=address_help)
    else:
        parser.add_argument(address_flag, dest="address", metavar="ADDRESS", required=True,
                            help=address_help)
    parser.add_argument("-p", "--protocol", choices=protocols,
                        help="the protocol at ADDRESS (default: from the URL's path)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per line, for scripts")
    parser.add_argument("--timeout", type=seconds, default=10.0, metavar="SECONDS",
                        help="give up after this long (default 10)")
    parser.add_argument("--cafile", metavar="FILE",
                        help="trust the CA certificates in FILE (PEM) for wss:// and ssl: "
                             "(default: the system's trust roots)")
    parser.add_argument("--insecure", action="store_true",
                        help="do not verify the server's certificate (wss://, ssl:)")
    parser.add_argument("--cert", metavar="FILE",
                        help="this client's certificate (PEM), for a broker's mtls: listener; "
                             "its private key too unless --key names it")
    parser.add_argument("--key", metavar="FILE",
                        help="the private key (PEM) of --cert's certificate")
    parser.add_argument("-H", "--header", action="append", default=[], metavar="NAME:VALUE",
                        help="a header for the WebSocket handshake; repeatable")
    parser.add_argument("--token", metavar="JWT",
                        help="a token for the broker's [auth] (default: $WIREPROTO_TOKEN), "
                             "sent as Authorization: Bearer")
    parser.add_argument("-u", "--user", metavar="USER",
                        help="a user of the broker's password file (default: $WIREPROTO_USER); "
                             "the password from --password or $WIREPROTO_PASSWORD")
    parser.add_argument("--password", metavar="PASSWORD",
                        help="USER's password (prefer $WIREPROTO_PASSWORD: an argument shows "
                             "in the process list)")


def seconds(text: str) -> float:
    """A duration option's value (--timeout): a number of seconds more than 0, and finite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be more than 0, and finite, not {text}")
    return value


def connect_options(args: argparse.Namespace) -> dict[str, Any]:
    """What --cafile, --insecure, --cert, --key, -H and the credentials ask of a client's
    connection (only what was given)."""
    options: dict[str, Any] = {}
    for flag, option in (("cafile", "cafile"), ("cert", "certfile"), ("key", "keyfile")):
        path = getattr(args, flag)
        if path is not None:
            if not os.path.isfile(path):
                raise ToolError(f"--{flag} {path!r}: no such file", EXIT_USAGE)
            options[option] = path
    if args.key is not None and args.cert is None:
        raise ToolError("--key without --cert", EXIT_USAGE)
    if args.insecure:
        options["insecure"] = True
    headers = {}
    for header in args.header:
        name, colon, value = header.partition(":")
        if not colon or not name.strip():
            raise ToolError(f"-H {_shown(header)}: write it as NAME:VALUE", EXIT_USAGE)
        name, value = name.strip(), value.strip()
        from wireproto.transports.websocket import check_header

        try:
            check_header(name, value)
        except ValueError as problem:  # says what is wrong, never the value
            raise ToolError(f"-H: {problem}", EXIT_USAGE) from None
        headers[name] = value
    authorization = credentials_header(args)
    if authorization is not None:
        if any(name.lower() == "authorization" for name in headers):
            raise ToolError("-H Authorization and --token/--user: give one of them", EXIT_USAGE)
        headers["Authorization"] = authorization
    if headers:
        options["headers"] = headers
    return options


def credentials_header(args: argparse.Namespace) -> str | None:
    """The Authorization header --token or --user ask for (or their environment variables).
    Refuses a credential in ADDRESS, and a token or user a header cannot carry."""
    _no_user_information(args.address)
    token = args.token or os.environ.get("WIREPROTO_TOKEN")
    user = args.user or os.environ.get("WIREPROTO_USER")
    for text, where in ((token, "--token" if args.token else "$WIREPROTO_TOKEN"),
                        (user, "--user" if args.user else "$WIREPROTO_USER")):
        _header_text(text, where)
    if token and user:
        raise ToolError("--token and --user: give one of them", EXIT_USAGE)
    if token:
        return f"Bearer {token}"
    if user:
        password = args.password if args.password is not None else os.environ.get(
            "WIREPROTO_PASSWORD")
        if password is None:
            given = "--user" if args.user else "$WIREPROTO_USER"
            raise ToolError(f"{given} needs a password: --password or $WIREPROTO_PASSWORD",
                            EXIT_USAGE)
        try:  # base64 carries any character of it, once it is UTF-8
            password.encode("utf-8")
        except UnicodeEncodeError:
            given = "--password" if args.password is not None else "$WIREPROTO_PASSWORD"
            raise ToolError(f"{given} is not UTF-8 text (a byte of another encoding?)",
                            EXIT_USAGE) from None
        pair = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        return f"Basic {pair}"
    if args.password is not None:
        raise ToolError("--password without --user", EXIT_USAGE)
    return None


# C0 controls (tab included), DEL and C1 controls: a header's value cannot hold them.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _header_text(text: str | None, where: str) -> None:
    """Refuse a credential the Authorization header cannot carry (a line break in it would
    start a header of its own; a byte that is not UTF-8 cannot be sent), never repeating it."""
    from wireproto.transports.websocket import check_header_value

    try:
        check_header_value(text or "", where)
    except ValueError as problem:
        raise ToolError(str(problem), EXIT_USAGE) from None


# In a URL ADDRESS, what must be percent-encoded to be sent as it is.
_UNSENDABLE = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")


def check_address(address: str) -> None:
    """Refuse, in one line that never repeats it, a URL ADDRESS that cannot be sent as given:
    one holding a space, another whitespace or a control character (percent-encode them, as
    curl asks), or a fragment (``#...``), which a client never sends."""
    if "://" not in address:
        return
    unsendable = _UNSENDABLE.search(address)
    if unsendable is not None:
        if unsendable.group() == " ":
            raise ToolError("ADDRESS holds a space: percent-encode it (%20)", EXIT_USAGE)
        raise ToolError("ADDRESS holds a control character or whitespace (a tab, a line "
                        "break...): percent-encode it (%09 for a tab)", EXIT_USAGE)
    if "#" in address:
        raise ToolError("ADDRESS holds a fragment (#...), which is never sent: leave it out",
                        EXIT_USAGE)


def _shown(text: str) -> str:
    """`text` quoted for an error line if it is plain, else only how long it is (it may be
    a secret with a line break in it)."""
    return repr(text) if not _CONTROL.search(text) else f"({len(text)} characters)"


def _no_user_information(address: str) -> None:
    """Refuse ``user:password@`` (or ``user@``) in a URL ADDRESS: a password on the command
    line shows in the process list, and a broker reads credentials from a header."""
    if "://" in address and has_user_information(address):
        raise ToolError(
            "ADDRESS holds user information (user:password@), which is not sent: give "
            "--user USER with the password in $WIREPROTO_PASSWORD, or a token in "
            "$WIREPROTO_TOKEN (or --token)", EXIT_USAGE)


def stdin_lines(reactor: Any) -> defer.DeferredQueue[bytes | None]:
    """Each line of stdin as bytes, without its line ending, as it comes; None at the end. Read
    in a daemon thread with os.read, so the reactor runs meanwhile and exit never waits on it."""
    lines: defer.DeferredQueue[bytes | None] = defer.DeferredQueue()

    def read() -> None:
        pending = b""
        try:
            while chunk := os.read(0, 65536):
                *complete, pending = (pending + chunk).split(b"\n")
                for line in complete:
                    reactor.callFromThread(lines.put, line.rstrip(b"\r"))
            if pending:
                reactor.callFromThread(lines.put, pending.rstrip(b"\r"))
        except OSError:
            pass
        finally:
            reactor.callFromThread(lines.put, None)

    threading.Thread(target=read, name="wireproto stdin", daemon=True).start()
    return lines


def one_line(text: str) -> str:
    """`text` with its line breaks folded, for a one-line error."""
    return " ".join(text.split())


def payload_text(payload: bytes) -> str:
    """A payload for a terminal: its UTF-8 text, or base64 prefixed ``base64:``."""
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(payload).decode("ascii")


def emit(as_json: bool, record: dict[str, Any], human: str, out: IO[str] | None = None) -> None:
    """Print one received thing: `record` as a JSON line, or `human` text; flushed at once. A
    stdout that cannot be written ends the tool there (wireproto.output.write_output)."""
    write_output((json_dumps(record, allow_nan=True) if as_json else human) + "\n",
                 f"wireproto {_running[-1] if _running else ''}".rstrip(), out)


def _exit_code(failure: Any) -> tuple[int, str]:
    """The exit code and one line for an exception that ended a tool."""
    from wireproto.transports.serial import SerialOpenFailed
    from wireproto.transports.websocket import HandshakeFailed

    value = failure.value if hasattr(failure, "value") else failure
    if isinstance(value, ToolError):
        return value.code, str(value)
    if isinstance(value, HandshakeFailed):
        return EXIT_REFUSED, str(value)
    if isinstance(value, (SerialOpenFailed, error.ConnectError, error.DNSLookupError)):
        return EXIT_UNREACHABLE, str(value).strip() or type(value).__name__
    if isinstance(value, (defer.TimeoutError, TimeoutError, defer.CancelledError)):
        return EXIT_TIMEOUT, "timed out"
    if isinstance(value, ValueError):
        return EXIT_USAGE, str(value)
    from wireproto.protocols.rpc import ConnectionClosed

    if isinstance(value, error.ConnectionDone | error.ConnectionLost | ConnectionClosed):
        return EXIT_UNREACHABLE, f"the connection closed: {value}"
    return EXIT_FAILED, f"{type(value).__name__}: {value}"


STOP_TIMEOUT = 5.0
_running: list[str] = []  # the tool that runs, for the line of an output that cannot be written


def run_tool(name: str, main: Callable[[Any], Coroutine[Any, Any, int]], *,
             until_stopped: bool = False, address: str | None = None) -> int:
    """Run ``main(reactor)`` under the reactor; its return value is the exit status. Any
    exception becomes one line, ``wireproto NAME: ...``, and the matching exit code.

    Ctrl-C or SIGTERM cancels what `main` is waiting for, so its ``finally`` blocks close its
    connection (the reactor waits for them, up to `STOP_TIMEOUT` seconds); the status is then 0
    if the tool runs `until_stopped`, else EXIT_INTERRUPTED, with nothing on stderr.

    The tool's `address` is checked first (`check_address`), and shown in the line as
    wireproto.redaction.redact_url shows it, wherever redact_text could not find its end."""
    status: list[int] = []
    stopped: list[bool] = []
    _running.append(name)

    async def body(reactor: Any) -> None:
        async def checked() -> int:
            if address is not None:
                check_address(address)
            return await main(reactor)

        work = defer.ensureDeferred(checked())

        def stop() -> defer.Deferred | None:
            if work.called:
                return None
            stopped.append(True)
            work.cancel()
            waited: defer.Deferred = defer.Deferred()
            work.addBoth(lambda _: None if waited.called else waited.callback(None))
            return waited.addTimeout(STOP_TIMEOUT, reactor).addErrback(lambda _: None)

        trigger = reactor.addSystemEventTrigger("before", "shutdown", stop)
        try:
            status.append(await work)
        except BaseException as exception:  # noqa: BLE001 - every failure is one line
            if stopped:
                status.append(EXIT_OK if until_stopped else EXIT_INTERRUPTED)
                return
            code, line = _exit_code(exception)
            if address:
                shown = redact_url(address)
                line = line.replace(address, shown).replace(repr(address)[1:-1], shown)
            print(f"wireproto {name}: {one_line(redact_text(line))}", file=sys.stderr,
                  flush=True)
            status.append(code)
        else:
            if stopped and not until_stopped:
                status[-1] = EXIT_INTERRUPTED
        finally:
            if not stopped:
                reactor.removeSystemEventTrigger(trigger)

    try:
        task.react(lambda reactor: defer.ensureDeferred(body(reactor)))
    except SystemExit:
        pass
    return status[0] if status else EXIT_FAILED
