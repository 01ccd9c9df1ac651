"""``wireproto conform server URL --protocol P``: run a protocol's conformance kit against someone's
server, print a line per case and a summary, and with ``--report DIR`` write the JSON report and
the HTML page (docs/conformance.md). ``wireproto conform client --protocol P --listen ADDRESS``
plays the server and judges the client that connects (started by the user, or by the kit for
each case with ``--run COMMAND``); ``wireproto conform device ENDPOINT --stack S`` judges a
Phyllo device.

Exit status: 0 when no MUST case failed; 1 when one did; 2 for bad usage (an option, an address,
a report directory that cannot be written); 3 when the implementation could not be judged at
all (a server unreachable, refusing, or not serving before the first case; no client connecting;
a silent device); 130 after Ctrl-C or SIGTERM, with the report of the cases run so far.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib import import_module

from twisted.internet import defer
from twisted.internet.interfaces import IReactorCore, IReactorTime

from wireproto.conformance.catalogue import Case, CaseResult, Catalogue
from wireproto.conformance.clientprocess import split_command
from wireproto.conformance.kits import CLIENT_KITS, DEVICE_KITS, KITS, kit
from wireproto.conformance.model import KIT_VERSION
from wireproto.conformance.probe import PROBE_MAX_MESSAGE, Target
from wireproto.conformance.report import (
    Run,
    Scrubber,
    case_line,
    check_directory,
    exit_status,
    printable,
    reason_shown,
    summary_line,
    write_report,
)
from wireproto.redaction import is_secret_parameter, redact_url
from wireproto.tools._common import (
    EXIT_USAGE,
    ToolError,
    add_common_options,
    connect_options,
    emit,
    run_tool,
    seconds,
)

__all__ = ["EXIT_COULD_NOT_RUN", "register", "catalogue_lines"]

EXIT_COULD_NOT_RUN = 3
# The kits of each mode, by protocol.
_MODE_KITS = {"server": KITS, "client": CLIENT_KITS, "device": DEVICE_KITS}
# Phyllo's two stacks (docs/phyllo.md): COBS frames alone, or with the reduced stack's CRC.
STACKS = ("minimal", "reduced")


def register(commands: argparse._SubParsersAction) -> None:
    """Adds ``conform`` with its modes ``server``, ``client`` and ``device``."""
    conform = commands.add_parser(
        "conform", help="judge an implementation by a protocol's conformance kit",
        description="Run a protocol's conformance kit against an implementation and report "
                    "each case (docs/conformance.md).")
    modes = conform.add_subparsers(dest="mode", required=True, metavar="MODE")
    server = modes.add_parser(
        "server", help="judge a server",
        description="Connect to the server at URL and run the cases of its protocol's kit: a "
                    "line per case, then a summary. Exit 0 when no MUST case failed, 1 when "
                    "one did, 2 for bad usage, 3 when the server could not be judged, 130 "
                    "after Ctrl-C.")
    _connecting_options(server, list(KITS), "URL",
                        "the server: a ws:// or wss:// URL, an http:// URL for Engine.IO, or a "
                        "client endpoint (tcp:HOST:PORT, unix:PATH) with --framing")
    _run_options(server, "websmq.topic", "the server")
    server.add_argument("--topic-prefix", default="conformance", metavar="TEXT",
                        help="the first level of every topic a case uses (default "
                             "conformance), for a server's access rules")
    from wireproto.transports.stream import FRAMINGS

    server.add_argument("--framing", choices=FRAMINGS,
                        help="the framing of a stream endpoint (default length32)")
    server.set_defaults(run=_run)

    client = modes.add_parser(
        "client", help="judge a client: play its server",
        description="Listen at ADDRESS as a scripted server of the protocol and run the cases "
                    "of its client kit against the client that connects: one the kit starts "
                    "for each case (--run), or one started by hand that connects again after "
                    "each case. Exit 0 when no MUST case failed, 1 when one did, 2 for bad "
                    "usage, 3 when no client connected and passed the first check, 130 after "
                    "Ctrl-C.")
    client.add_argument("-p", "--protocol", choices=list(CLIENT_KITS),
                        help="the protocol the client speaks (needed but for --list)")
    client.add_argument("--listen", metavar="ADDRESS",
                        help="where the client connects: ws://HOST:PORT/PATH (port 0: any "
                             "free port, printed), wss:// with --cert, ws+unix://PATH, "
                             "http://HOST:PORT/PATH for nydus over Engine.IO, or a stream "
                             "endpoint (tcp:PORT:interface=127.0.0.1, unix:PATH, ssl:...) "
                             "with --framing")
    client.add_argument("--run", metavar="COMMAND", dest="client_command",
                        help="start the client with COMMAND for each case, and stop it after "
                             "(split as a shell would, run without one; {url} becomes the "
                             "address, also in $WIREPROTO_CONFORM_URL)")
    client.add_argument("--wait", type=seconds, default=30.0, metavar="SECONDS",
                        help="how long the client has to connect the first time (default 30)")
    client.add_argument("--json", action="store_true",
                        help="a JSON object per case, then one for the summary")
    client.add_argument("--timeout", type=seconds, metavar="SECONDS",
                        help="each case's timeout, in place of the case's own")
    client.add_argument("--cert", metavar="FILE",
                        help="the kit's certificate (PEM), for wss:// and ssl:; its private "
                             "key too unless --key names it")
    client.add_argument("--key", metavar="FILE", help="the private key (PEM) of --cert's")
    _run_options(client, "websmq.client.publish", "the client")
    client.add_argument("--framing", choices=FRAMINGS,
                        help="the framing of a stream endpoint (default length32)")
    client.set_defaults(run=_run_client)

    device = modes.add_parser(
        "device", help="judge a Phyllo device",
        description="Open the device at ENDPOINT (a serial port, a pty, tcp:, unix: or a "
                    "WebSocket URL) and run the Phyllo kit's cases for its stack. Exit 0 when "
                    "no MUST case failed, 1 when one did, 2 for bad usage, 3 when the device "
                    "did not answer before the first case, 130 after Ctrl-C.")
    _connecting_options(device, list(DEVICE_KITS), "ENDPOINT",
                        "the device: serial:/dev/ttyACM0:baudrate=115200, a pty's path as "
                        "serial:PATH, tcp:HOST:PORT, unix:PATH or a ws:// URL")
    device.add_argument("--stack", choices=STACKS,
                        help="the Phyllo stack the device speaks (needed but for --list)")
    _run_options(device, "phyllo.cobs", "the device")
    device.add_argument("--framing", choices=FRAMINGS,
                        help="the framing of a stream endpoint (default cobs)")
    device.set_defaults(run=_run_device)


def _connecting_options(parser: argparse.ArgumentParser, protocols: list[str],
                        metavar: str, help: str) -> None:
    """The tools' options of a mode whose kit connects to the implementation."""
    add_common_options(parser, protocols)
    for action in parser._actions:
        if action.dest == "address":  # --list needs none
            action.nargs, action.required, action.default = "?", False, None
            action.metavar, action.help = metavar, help
        elif action.dest == "timeout":
            action.default, action.type = None, seconds
            action.help = ("each case's timeout, in place of the case's own (default: the "
                           "case's, 5 s for most)")
        elif action.dest == "protocol":
            action.help = f"the protocol at {metavar} (default: from the {metavar}'s path)"
        elif action.dest == "json":
            action.help = "a JSON object per case, then one for the summary"


def _run_options(parser: argparse.ArgumentParser, prefix: str, judged: str) -> None:
    """The options every mode has to choose cases and keep the report."""
    parser.add_argument("--cases", metavar="ID,...", type=_patterns,
                        help=f"run only these cases: ids, or prefixes such as {prefix}")
    parser.add_argument("--list", action="store_true",
                        help="print the catalogue (id, level, title, section) and exit")
    parser.add_argument("--report", metavar="DIR",
                        help="write DIR/report.json and DIR/index.html")
    parser.add_argument("--max-message-size", type=_size, default=1_048_576, metavar="BYTES",
                        help=f"the largest message {judged} takes, for the cases about "
                             "limits (default 1048576, wireproto's)")


def _patterns(text: str) -> list[str]:
    patterns = [pattern.strip() for pattern in text.split(",") if pattern.strip()]
    if not patterns:
        raise argparse.ArgumentTypeError("give case ids or prefixes, separated by commas")
    return patterns


def _size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of bytes") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    if value >= PROBE_MAX_MESSAGE:  # the kit could not send one byte more
        raise argparse.ArgumentTypeError(
            f"the kit judges limits below {PROBE_MAX_MESSAGE} bytes (64 MiB), not {text}")
    return value


def _run(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    if args.address is None:
        print("wireproto conform: give the server's URL (or --list)", file=sys.stderr,
              flush=True)
        return EXIT_USAGE
    return run_tool("conform", lambda reactor: conform(reactor, args), address=args.address)


def catalogue_lines(catalogue: Catalogue) -> list[str]:
    """The catalogue as ``--list`` prints it: a line per case, id, level, title, section."""
    width = max((len(case.id) for case in catalogue.cases), default=0)
    return [f"{case.id:<{width}}  {case.level.value:<11}  {case.title} ({case.section})"
            for case in catalogue.cases]


def kit_of(protocol: str, mode: str) -> Catalogue:
    """`protocol`'s kit for `mode`; a ToolError (usage) when this wireproto has none, its
    module missing or broken, rather than a traceback."""
    try:
        return kit(protocol, mode)
    except (ImportError, ValueError, TypeError) as error:
        raise ToolError(f"no {mode} kit for {protocol} in this wireproto: {error}",
                        EXIT_USAGE) from None


def _installed(protocol: str, mode: str) -> bool:
    """Whether `protocol`'s kit for `mode` is here (a kit not yet written is not)."""
    try:
        import_module(_MODE_KITS[mode][protocol])
    except ModuleNotFoundError as error:
        # A module the kit needs is missing: the kit is here, and says so when it is asked for.
        return error.name is None or not _MODE_KITS[mode][protocol].startswith(error.name)
    return True


def _list(args: argparse.Namespace) -> int:
    mode = args.mode
    if args.protocol:
        protocols = [args.protocol]
    else:  # every kit of the mode that this wireproto has
        protocols = [name for name in _MODE_KITS[mode] if _installed(name, mode)]
    try:
        for protocol in protocols:
            catalogue = kit_of(protocol, mode)
            if args.json:
                for case in catalogue.cases:
                    emit(True, {"id": case.id, "level": case.level.value,
                                "title": case.title, "section": case.section,
                                "decision": case.decision or None, "timeout": case.timeout,
                                "harmful": case.harmful}, "")
            else:
                emit(False, {}, "\n".join(catalogue_lines(catalogue)))
    except ToolError as error:
        print(f"wireproto conform: {error}", file=sys.stderr, flush=True)
        return error.code
    return 0


def _target(args: argparse.Namespace, protocol: str) -> tuple[Target, Scrubber]:
    """The target the options describe, and the scrubber of the credentials they hold."""
    options = connect_options(args)  # refuses a credential in the URL, a bad header
    headers: dict[str, str] = options.get("headers", {})
    secrets = list(headers.values())
    for value in headers.values():  # "Bearer TOKEN", "Basic PAIR": the token, the pair
        secrets.append(value.partition(" ")[2])
    secrets += [args.password or "", args.token or ""]
    secrets += [os.environ.get(name, "") for name in ("WIREPROTO_TOKEN",
                                                       "WIREPROTO_PASSWORD")]
    from urllib.parse import parse_qsl, urlsplit

    from wireproto.redaction import is_secret_parameter

    query = urlsplit(args.address).query if "://" in args.address else ""
    secrets += [value for name, value in parse_qsl(query) if is_secret_parameter(name)]
    target = Target(protocol, args.address, cafile=options.get("cafile"),
                    insecure=bool(options.get("insecure")), certfile=options.get("certfile"),
                    keyfile=options.get("keyfile"), headers=headers, framing=args.framing,
                    max_message_size=args.max_message_size,
                    topic_prefix=getattr(args, "topic_prefix", "conformance"),
                    secrets=tuple(secret for secret in secrets if secret))
    return target, Scrubber(secrets)


def _check_address(reactor: IReactorTime, address: str, protocol: str,
                   framing: str | None) -> None:
    """A ValueError for an address no connection of `protocol` can be made to, or options that
    do not fit it, before any case runs."""
    from wireproto.transports.base import MessageProtocol
    from wireproto.transports.connect import client_endpoint, is_websocket_address, websocket_client

    over_http = address.lower().startswith(("http://", "https://", "http+unix://"))
    if over_http and protocol != "nydus":
        raise ValueError(f"{protocol} is not spoken over http://: give its ws:// URL or a "
                         "client endpoint")
    if framing is not None and (over_http or is_websocket_address(address)):
        raise ValueError("--framing is for a stream endpoint (tcp:, ssl:, unix:); a WebSocket "
                         "frames its messages itself")
    if is_websocket_address(address):
        websocket_client(reactor, address, MessageProtocol)  # made, never connected
    elif not over_http:
        client_endpoint(reactor, address)


def _chosen(catalogue: Catalogue, args: argparse.Namespace) -> list[Case]:
    """The cases `args` ask for, with --timeout's timeout; a usage error for --cases that
    select nothing, or a --report directory that cannot be written."""
    try:
        cases: list[Case] = catalogue.select(args.cases)
    except ValueError as error:
        raise ToolError(str(error), EXIT_USAGE) from None
    if args.timeout is not None:
        cases = [dataclasses.replace(case, timeout=args.timeout) for case in cases]
    if args.report is not None:
        try:
            check_directory(args.report)
        except OSError as error:
            raise ToolError(f"--report {args.report}: {error.strerror or error}",
                            EXIT_USAGE) from None
    return cases


Judge = Callable[[list[Case], Callable[[CaseResult], None]], Awaitable[object]]


async def _judge(reactor: IReactorTime, args: argparse.Namespace, run: Run,
                 cases: list[Case], judge: Judge) -> int:
    """Run `judge` on `cases`, printing each result as it comes, then the summary and the
    report; the exit status."""
    from wireproto.conformance.runner import CouldNotRun

    scrubber = run.scrubber
    started = time.monotonic()
    stopping: list[bool] = []  # Ctrl-C or SIGTERM: what a case judged after it is not kept
    trigger = IReactorCore(reactor).addSystemEventTrigger("before", "shutdown", stopping.append,
                                                          True)

    def heard(result: CaseResult) -> None:
        if stopping:
            return
        run.results.append(result)
        if args.json:
            emit(True, {"id": result.case.id, "outcome": result.outcome.value,
                        "level": result.case.level.value, "title": result.case.title,
                        "reason": reason_shown(result.reason, scrubber),
                        "duration": result.duration}, "")
        else:
            emit(False, {}, case_line(result, scrubber))

    try:
        await judge(cases, heard)
    except CouldNotRun as error:
        run.status, run.error = EXIT_COULD_NOT_RUN, reason_shown(str(error), scrubber)
        _finish(run, args, started)
        raise ToolError(printable(run.error), EXIT_COULD_NOT_RUN) from None
    except (defer.CancelledError, KeyboardInterrupt):
        run.status = 130
        _finish(run, args, started)
        raise
    finally:
        if not stopping:
            IReactorCore(reactor).removeSystemEventTrigger(trigger)
    run.status = 130 if stopping else exit_status(run.results)
    _finish(run, args, started)
    return run.status


async def conform(reactor: IReactorTime, args: argparse.Namespace) -> int:
    """Run the server kit as `args` ask; the exit status."""
    from wireproto.conformance.runner import run_cases
    from wireproto.tools.registry import protocol_of

    protocol = protocol_of(args.address, args.protocol, list(KITS))
    catalogue = kit_of(protocol, "server")
    cases = _chosen(catalogue, args)
    target, scrubber = _target(args, protocol)
    _check_address(reactor, args.address, protocol, args.framing)
    run = Run(protocol, redact_url(args.address), datetime.now(UTC), scrubber=scrubber)
    return await _judge(reactor, args, run, cases, lambda chosen, heard: run_cases(
        reactor, target, catalogue, chosen, on_result=heard))


# -- devices --------------------------------------------------------------------------------------


def _run_device(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    if args.address is None or args.stack is None:
        print("wireproto conform: give the device's ENDPOINT and its --stack (minimal or "
              "reduced), or --list", file=sys.stderr, flush=True)
        return EXIT_USAGE
    return run_tool("conform", lambda reactor: conform_device(reactor, args),
                    address=args.address)


async def conform_device(reactor: IReactorTime, args: argparse.Namespace) -> int:
    """Run the Phyllo device kit as `args` ask; the exit status. A device is judged as a
    server is (docs/conformance.md, "Judging a device"): the kit opens it, checks that it
    answers, runs each case, and checks it again after each harmful one."""
    from wireproto.conformance.runner import run_cases
    from wireproto.transports.connect import is_websocket_address

    protocol = args.protocol or next(iter(DEVICE_KITS))
    catalogue = kit_of(protocol, "device")
    cases = _chosen(catalogue, args)
    target, scrubber = _target(args, protocol)
    framing = args.framing
    if framing is None and not is_websocket_address(args.address):
        framing = "cobs"  # Phyllo frames with COBS on any byte stream
    _check_address(reactor, args.address, protocol, args.framing)
    target = dataclasses.replace(target, framing=framing, stack=args.stack)
    run = Run(protocol, redact_url(args.address), datetime.now(UTC), scrubber=scrubber,
              mode="device")
    return await _judge(reactor, args, run, cases, lambda chosen, heard: run_cases(
        reactor, target, catalogue, chosen, on_result=heard))


# -- clients --------------------------------------------------------------------------------------


def _run_client(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    if args.protocol is None or args.listen is None:
        print("wireproto conform: give the client's --protocol and where it connects, "
              "--listen ADDRESS (or --list)", file=sys.stderr, flush=True)
        return EXIT_USAGE
    return run_tool("conform", lambda reactor: conform_client(reactor, args),
                    address=args.listen)


def command_secrets(arguments: list[str]) -> list[str]:
    """The values a --run command gives options named as credentials (``--token S``,
    ``--password=S``, ``api_key=S``): what the client writes may repeat them (a usage error, a
    log of its argv), and they are taken out of the lines and the report."""
    found = []
    for index, argument in enumerate(arguments):
        name, equals, value = argument.lstrip("-").partition("=")
        if not is_secret_parameter(name.lower()):
            continue
        if equals:
            found.append(value)
        elif argument.startswith("-") and index + 1 < len(arguments):
            found.append(arguments[index + 1])
    return [value for value in found if value and "{url}" not in value]


def _check_command(command: str) -> None:
    """A usage error for a --run command that cannot be started: unbalanced quotes, empty, or a
    program not found (said before the kit listens, never with the command's arguments, which
    may hold a secret)."""
    try:
        arguments = split_command(command, "")
    except ValueError as error:
        raise ToolError(str(error), EXIT_USAGE) from None
    if shutil.which(arguments[0]) is None:
        raise ToolError(f"--run: {arguments[0]!r} is not a program found on PATH (or is not "
                        "executable)", EXIT_USAGE)


async def conform_client(reactor: IReactorTime, args: argparse.Namespace) -> int:
    """Listen as `args` ask, run the client kit against the client that connects; the exit
    status."""
    from wireproto.conformance.listener import Listener
    from wireproto.conformance.runner import ClientRun, run_client_cases

    protocol = args.protocol
    catalogue = kit_of(protocol, "client")
    cases = _chosen(catalogue, args)
    if args.key is not None and args.cert is None:
        raise ToolError("--key without --cert", EXIT_USAGE)
    for flag, path in (("cert", args.cert), ("key", args.key)):
        if path is not None and not os.path.isfile(path):
            raise ToolError(f"--{flag} {path!r}: no such file", EXIT_USAGE)
    if args.client_command is not None:
        _check_command(args.client_command)
    module = import_module(CLIENT_KITS[protocol])
    # A kit that listens its own way (nydus's Engine.IO) says how.
    make_factory = getattr(module, "make_factory", None)
    try:
        listener = Listener(reactor, args.listen, framing=args.framing, certfile=args.cert,
                            keyfile=args.key, make_factory=make_factory)
        if make_factory is not None and listener.kind == "stream":
            raise ValueError(f"the {protocol} client kit listens on an http:// (or ws://) URL, "
                             "where its clients reach it; a stream endpoint carries none")
        if args.framing is not None and listener.kind != "stream":
            raise ValueError("--framing is for a stream endpoint (tcp:, ssl:, unix:); a "
                             "WebSocket frames its messages itself")
        await listener.start()
    except ValueError as error:
        raise ToolError(str(error), EXIT_USAGE) from None
    secrets = [os.environ.get(name, "") for name in ("WIREPROTO_TOKEN", "WIREPROTO_PASSWORD")]
    if args.client_command:
        secrets += command_secrets(split_command(args.client_command, "")[1:])
    scrubber = Scrubber([secret for secret in secrets if secret])
    try:
        url = listener.url
        target = Target(protocol, url, framing=args.framing,
                        max_message_size=args.max_message_size)
        run = Run(protocol, redact_url(url), datetime.now(UTC), scrubber=scrubber,
                  mode="client", client_started_by_kit=args.client_command is not None)
        started_by = "started by the kit for each case" if args.client_command else "to connect"
        emit(args.json, {"listening": url, "protocol": protocol,
                         "client_started_by_kit": args.client_command is not None},
             printable(f"waiting for a {protocol} client at {url} ({started_by})"))
        client_run = ClientRun(reactor, listener, args.client_command, first_wait=args.wait)
        return await _judge(reactor, args, run, cases, lambda chosen, heard: run_client_cases(
            client_run, target, catalogue, chosen, on_result=heard))
    finally:
        await listener.stop()


def _finish(run: Run, args: argparse.Namespace, started: float) -> None:
    """The summary (for a run that judged the implementation), and the report if asked
    for."""
    run.duration = time.monotonic() - started
    if run.status in (0, 1):
        line = summary_line(run)
        if args.json:
            from wireproto.conformance.report import to_json

            report = to_json(run)
            emit(True, {"summary": report["summary"], "status": run.status,
                        "protocol": run.protocol, "mode": run.mode, "target": report["target"],
                        "kit_version": KIT_VERSION}, "")
        else:
            emit(False, {}, line)
    if args.report is not None:
        try:
            write_report(args.report, run)
        except OSError as error:
            print(f"wireproto conform: cannot write the report in {args.report}: "
                  f"{error.strerror or error}", file=sys.stderr, flush=True)
            if run.status in (0, 1):
                run.status = EXIT_USAGE

