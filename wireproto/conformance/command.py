"""``wireproto conform server URL --protocol P``: run a protocol's conformance kit against someone's
server, print a line per case and a summary, and with ``--report DIR`` write the JSON report and
the HTML page (docs/conformance.md).

Exit status: 0 when no MUST case failed; 1 when one did; 2 for bad usage (an option, an address,
a report directory that cannot be written); 3 when the server could not be judged at all
(unreachable, refusing, or not serving before the first case); 130 after Ctrl-C or SIGTERM, with
the report of the cases run so far.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from datetime import UTC, datetime

from twisted.internet import defer
from twisted.internet.interfaces import IReactorCore, IReactorTime

from wireproto.conformance.catalogue import Case, CaseResult, Catalogue
from wireproto.conformance.kits import KITS, kit
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
from wireproto.redaction import redact_url
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


def register(commands: argparse._SubParsersAction) -> None:
    """Adds ``conform`` with its mode ``server``."""
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
    add_common_options(server, list(KITS))
    for action in server._actions:
        if action.dest == "address":  # --list needs none
            action.nargs, action.required, action.default = "?", False, None
            action.metavar = "URL"
            action.help = ("the server: a ws:// or wss:// URL, an http:// URL for Engine.IO, "
                           "or a client endpoint (tcp:HOST:PORT, unix:PATH) with --framing")
        elif action.dest == "timeout":
            action.default, action.type = None, seconds
            action.help = ("each case's timeout, in place of the case's own (default: the "
                           "case's, 5 s for most)")
        elif action.dest == "protocol":
            action.help = "the protocol at URL (default: from the URL's path)"
        elif action.dest == "json":
            action.help = "a JSON object per case, then one for the summary"
    server.add_argument("--cases", metavar="ID,...", type=_patterns,
                        help="run only these cases: ids, or prefixes such as websmq.topic")
    server.add_argument("--list", action="store_true",
                        help="print the catalogue (id, level, title, section) and exit")
    server.add_argument("--report", metavar="DIR",
                        help="write DIR/report.json and DIR/index.html")
    server.add_argument("--max-message-size", type=_size, default=1_048_576, metavar="BYTES",
                        help="the largest message the server takes, for the cases about "
                             "limits (default 1048576, wireproto's)")
    server.add_argument("--topic-prefix", default="conformance", metavar="TEXT",
                        help="the first level of every topic a case uses (default "
                             "conformance), for a server's access rules")
    from wireproto.transports.stream import FRAMINGS

    server.add_argument("--framing", choices=FRAMINGS,
                        help="the framing of a stream endpoint (default length32)")
    server.set_defaults(run=_run)


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


def _list(args: argparse.Namespace) -> int:
    protocols = [args.protocol] if args.protocol else list(KITS)
    for protocol in protocols:
        catalogue = kit(protocol)
        if args.json:
            for case in catalogue.cases:
                emit(True, {"id": case.id, "level": case.level.value, "title": case.title,
                            "section": case.section, "decision": case.decision or None,
                            "timeout": case.timeout, "harmful": case.harmful}, "")
        else:
            emit(False, {}, "\n".join(catalogue_lines(catalogue)))
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
                    max_message_size=args.max_message_size, topic_prefix=args.topic_prefix,
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


async def conform(reactor: IReactorTime, args: argparse.Namespace) -> int:
    """Run the kit as `args` ask; the exit status."""
    from wireproto.conformance.runner import CouldNotRun, run_cases
    from wireproto.tools.registry import protocol_of

    protocol = protocol_of(args.address, args.protocol, list(KITS))
    catalogue = kit(protocol)
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
    target, scrubber = _target(args, protocol)
    _check_address(reactor, args.address, protocol, args.framing)
    run = Run(protocol, redact_url(args.address), datetime.now(UTC), scrubber=scrubber)
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
        await run_cases(reactor, target, catalogue, cases, on_result=heard)
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


def _finish(run: Run, args: argparse.Namespace, started: float) -> None:
    """The summary (for a run that judged the server), and the report if asked for."""
    run.duration = time.monotonic() - started
    if run.status in (0, 1):
        line = summary_line(run)
        if args.json:
            from wireproto.conformance.report import to_json

            report = to_json(run)
            emit(True, {"summary": report["summary"], "status": run.status,
                        "protocol": run.protocol, "target": report["target"],
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

