"""The ``wireproto`` command. ``wireproto serve`` runs a broker; see docs/running.md.

With no options it serves WEBSMQ, UBRE and SubbleSocket over WebSocket on 127.0.0.1:8765 (paths
/websmq, /ubre, /subble) and nydus over Engine.IO there (/engine.io/); WEBSMQ over length32-framed
TCP on 8766, UBRE as newline-delimited JSON on 8767, nydus as lines on 8768 and SubbleSocket over
length32 on 8769. It prints one line per listener, then a ready line::

    wireproto: websmq over ws on ws://127.0.0.1:8765/websmq
    wireproto: websmq over length32 on tcp:127.0.0.1:8766
    wireproto: ubre over ws on ws://127.0.0.1:8765/ubre
    wireproto: ubre over lines on tcp:127.0.0.1:8767
    wireproto: nydus over engineio on http://127.0.0.1:8765/engine.io/
    wireproto: nydus over lines on tcp:127.0.0.1:8768
    wireproto: subble over ws on ws://127.0.0.1:8765/subble
    wireproto: subble over length32 on tcp:127.0.0.1:8769
    wireproto: status page at http://127.0.0.1:8765/, metrics at http://127.0.0.1:8765/metrics
    wireproto: ready; Ctrl-C stops

With ``--app MODULE:FUNCTION`` (``[app] setup``) it first calls the application's function
with the broker (wireproto.service.app), and starts the broker once it is done.

Exit status: 0 after Ctrl-C or SIGTERM; 1 when a listener cannot bind, another part the config
asks for cannot start, or the application cannot be loaded or fails (``wireproto: WHAT: WHY``);
2 for a bad option or config file, or a place it would write but cannot. Every error is one line
on stderr, never a traceback.

``wireproto analyze CAPTURES --out DIR`` runs the Spark jobs over capture files
(docs/pipeline.md): 0 when done, 1 when Spark fails, 2 for bad usage or a missing spark extra.
``wireproto ingest CAPTURES --table TABLE`` decodes them once into a partitioned Parquet table,
with the same statuses (and 0 when Ctrl-C ends it following the captures).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, NamedTuple, NoReturn, cast

from wireproto.output import output_failed, write_output
from wireproto.program import PROG, start_logging
from wireproto.redaction import redact_text, redact_url
from wireproto.stopping import Stopping, stop_on_signals, stop_requested

if TYPE_CHECKING:
    from _typeshed import SupportsWrite
    from twisted.internet.defer import Deferred
    from twisted.python.failure import Failure

    from wireproto.broker import BoundListener
    from wireproto.config import Config

__all__ = ["main", "build_parser", "announce"]

LISTEN_HELP = """\
--listen PROTOCOL+TRANSPORT[/PATH]@ENDPOINT (repeatable; replaces the default listeners)
  TRANSPORT is ws (WebSocket, at PATH, default /PROTOCOL), engineio (Engine.IO 4, for nydus,
  at /engine.io/), or a stream framing: length32, lines, cobs.
  ENDPOINT is a Twisted server endpoint string. tcp: and ssl: listen on 127.0.0.1 unless they
  name an interface (interface=0.0.0.0 for every interface). ws and engineio listeners may share
  an endpoint, each at its own path.
    websmq+ws@tcp:8765                    ws://127.0.0.1:8765/websmq
    websmq+ws/mq/v1@tcp:8765              ws://127.0.0.1:8765/mq/v1
    websmq+length32@tcp:8766:interface=0.0.0.0
    websmq+ws@ssl:8443:privateKey=key.pem:certKey=cert.pem
    websmq+cobs@unix:/tmp/websmq.sock

--attach PROTOCOL[+FRAMING]@CLIENT_ENDPOINT (repeatable)
  Open a client endpoint and serve PROTOCOL on it, as if the device at the other end had
  connected; reopened with a backoff whenever it fails or closes. FRAMING defaults to cobs for
  serial: and to length32 otherwise.
    websmq@serial:/dev/ttyACM0:baudrate=115200

--phyllo NAME[+STACK]@ADDRESS (repeatable)
  Open a Phyllo device and bridge its topics to the hub: device topic temp on link dev1 is hub
  topic phyllo/dev1/temp, both ways. STACK is reduced (default) or minimal. ADDRESS is a
  serial:, tcp: or other client endpoint string, or a ws:// URL (one binary message per chunk);
  reopened with a backoff whenever it fails or closes, as when a USB device is unplugged.
    dev1@serial:/dev/ttyACM0:baudrate=115200
    esp32+minimal@tcp:192.168.1.40:2000

Defaults: websmq+ws@tcp:8765, websmq+length32@tcp:8766, ubre+ws@tcp:8765, ubre+lines@tcp:8767,
nydus+engineio@tcp:8765, nydus+lines@tcp:8768, subble+ws@tcp:8765 and subble+length32@tcp:8769,
on 127.0.0.1.
See docs/running.md for the TOML config file.
"""



class Command(NamedTuple):
    """A subcommand as the top-level parser lists it. Its module, imported only when the
    command is the one run (so ``--version``, ``--help`` and each command's ``--help`` import
    no more than they need), adds its subcommands with ``register(commands)`` and
    ``set_defaults(run=...)``; None for this module's own."""

    help: str
    module: str | None
    stopped: int
    """The exit status when Ctrl-C or SIGTERM stops it: 0 for a command that runs until it is
    stopped, 130 (128 + SIGINT, as shells report it) for one that had work left."""
    handles_interrupt: bool = False
    """Once running, it is stopped by a KeyboardInterrupt (SIGTERM too), its `finally` blocks
    run (a terminal's echo restored, a half-written output removed), then the status."""
    short_lived: bool = False
    """It does one bounded piece of work and exits: it starts without Autobahn's native code
    (AUTOBAHN_USE_NVX=0, unless set), whose set-up costs more than it saves on a few messages."""


INTERRUPTED = 130
# In the order --help lists them; a module's commands next to each other.
COMMANDS = {
    "serve": Command("run a broker", None, 0),
    "check-config": Command("check a TOML config file", None, INTERRUPTED),
    "analyze": Command("analyze capture files on Spark", "wireproto.pipeline.command",
                       INTERRUPTED, handles_interrupt=True),
    "ingest": Command("ingest capture files into a Parquet table on Spark",
                      "wireproto.pipeline.ingest_command", INTERRUPTED, handles_interrupt=True),
    "pub": Command("publish messages (WEBSMQ, UBRE, Phyllo)", "wireproto.tools.pubsub",
                   INTERRUPTED, short_lived=True),
    "sub": Command("print messages on topics (WEBSMQ, UBRE, Phyllo)", "wireproto.tools.pubsub",
                   0),
    "call": Command("send one UBRE request or nydus invoke and print the answer",
                    "wireproto.tools.rpc", INTERRUPTED, short_lived=True),
    "produce": Command("produce SubbleSocket events", "wireproto.tools.rpc", INTERRUPTED,
                       short_lived=True),
    "events": Command("print SubbleSocket events", "wireproto.tools.rpc", 0),
    "replay": Command("publish again what clients published in captures, at their pace",
                      "wireproto.tools.replay", INTERRUPTED),
    "conform": Command("judge an implementation by a protocol's conformance kit",
                       "wireproto.conformance.command", INTERRUPTED),
    "devices": Command("list serial ports and their USB identity", "wireproto.tools.devices",
                       INTERRUPTED, handles_interrupt=True, short_lived=True),
    "passwd": Command("set or delete a user's password in a password file",
                      "wireproto.tools.passwd", INTERRUPTED, handles_interrupt=True),
}


class _Parser(argparse.ArgumentParser):
    """Errors in one line, without the usage block: a script or a log shows the whole story."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        # argparse drops an OSError here (--version and --help to a full disk said nothing and
        # exited 0): the help and the version are output as any other.
        if message:
            write_output(message, PROG, stream=cast("IO[str]", file or sys.stderr))

    def parse_words(self, words: Sequence[str]) -> argparse.Namespace:
        """parse_args, but an unknown option is the command's: ``wireproto pub: unrecognized
        arguments: ...``."""
        parsed, extras = self.parse_known_args(words)
        if extras:
            chosen = next((action.choices.get(str(getattr(parsed, "command", "")))
                           for action in self._actions
                           if isinstance(action, argparse._SubParsersAction)), None)
            (chosen or self).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def build_parser(command: str | None = None) -> _Parser:
    """The ``wireproto`` parser: every command's options, or given `command` that command's
    alone ("" for none), the others listed by name and help line, their modules not
    imported."""
    parser = _Parser(prog=PROG, description="Small message protocols on Twisted.")
    from wireproto import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = COMMANDS.get(command) if command else None
    registered: set[str] = set()
    for name, entry in COMMANDS.items():
        if name in registered:
            continue
        if command is not None and name != command and (
                chosen is None or entry.module is None or entry.module != chosen.module):
            commands.add_parser(name, help=entry.help)
        elif name == "serve":
            _add_serve(commands)
        elif name == "check-config":
            _add_check_config(commands)
        else:
            assert entry.module is not None
            before = set(commands.choices)
            importlib.import_module(entry.module).register(commands)
            registered.update(set(commands.choices) - before)
            continue
        registered.add(name)
    return parser


def _add_serve(commands: argparse._SubParsersAction) -> None:
    from wireproto.config.options import add_serve_options

    serve = commands.add_parser(
        "serve",
        help=COMMANDS["serve"].help,
        description="Run a wireproto broker until Ctrl-C or SIGTERM.",
        epilog=LISTEN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_serve_options(serve)
    serve.add_argument("-v", "--verbose", action="store_true",
                       help="log connections and other events (default: warnings and errors)")


def _add_check_config(commands: argparse._SubParsersAction) -> None:
    check = commands.add_parser(
        "check-config",
        help=COMMANDS["check-config"].help,
        description="Read FILE as `wireproto serve --config FILE` would, and say what it "
                    "serves; exit 2 with the file, the key and what is wrong if it is bad.",
    )
    check.add_argument("file", metavar="FILE")


def announce(lines: Iterable[str], stream: IO[str], *, broker: bool = False) -> None:
    """Write `lines` each as ``wireproto: LINE``, flushed at once (scripts wait for them); a URL
    in a line without its credentials. A `broker` goes on serving when its banner cannot be
    written (its reader gone, as in ``wireproto serve | head -1``): it is said for whoever
    started it, and network servers outlive a closed pipe (mosquitto ignores SIGPIPE)."""
    text = "".join(f"{PROG}: {redact_text(line)}\n" for line in lines)
    if not broker:
        write_output(text, stream=stream)
        return
    try:
        stream.write(text)
        stream.flush()
    except OSError:
        # What is left unwritten, and any later line, goes nowhere: as Python's docs advise for
        # a closed pipe, so that the exit's flush meets no error either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
        try:
            stream.flush()
        except OSError:
            pass


def banner(config: Config, bound: Sequence[BoundListener]) -> list[str]:
    """One line per listener (``websmq over ws on ws://...``), one for the status page and
    /metrics, then one per attached link."""
    lines = [entry.describe() for entry in bound]
    # Served on every HTTP listener's port: the first one's URLs.
    http = next((entry.address for entry in bound
                 if entry.address.startswith(("ws://", "wss://", "http://", "https://"))), None)
    if http is not None:
        scheme, rest = http.split("://", 1)
        base = f"{'https' if scheme in ('wss', 'https') else 'http'}://{rest.split('/', 1)[0]}"
        served = [f"status page at {base}/"] if config.admin.enabled else []
        served += [f"metrics at {base}{config.metrics.path}"] if config.metrics.enabled else []
        lines += [", ".join(served)] if served else []
    lines += [f"{link.describe()} attached to {redact_url(link.endpoint)}"
              for link in config.attach]
    lines += [f"{link.describe()} on {redact_url(link.endpoint)}" for link in config.phyllo]
    if config.capture.directory:
        lines.append(f"capture: every message in and out to {config.capture.directory}")
    return lines


def serve(args: argparse.Namespace) -> int:
    from twisted.internet import reactor

    from wireproto.config import ConfigError, config_from_options

    try:
        # The places it writes are checked too: a broker that cannot start what its config
        # asks for says so before it starts anything.
        config = config_from_options(vars(args), reactor=reactor, check_places=True)
    except ConfigError as error:
        for problem in error.problems:
            print(f"{PROG} serve: {problem}", file=sys.stderr, flush=True)
        return 2

    from wireproto.service import ListenFailed, make_service
    from wireproto.service.app import run_app

    try:
        start_logging(config.log, args.verbose)
    except OSError as error:
        print(f"{PROG} serve: log file {config.log.file}: {error.strerror}", file=sys.stderr,
              flush=True)
        return 2
    if config.cluster.workers > 1:
        return supervise(config, args)
    try:
        service = make_service(config, reactor)
    except ConfigError as error:
        print(f"{PROG} serve: {error}", file=sys.stderr, flush=True)
        return 2
    except Exception as error:  # a part that cannot be made: one line, not a traceback
        cannot_start(error)
        return 1
    service.log_listen_errors = False  # reported below, in one line
    exit_code = 0

    def listening(bound: list[BoundListener]) -> None:
        if not stop_requested():
            announce([*banner(config, bound), "ready; Ctrl-C stops"], sys.stdout, broker=True)

    def cannot_listen(reason: Failure) -> None:
        nonlocal exit_code
        reason.trap(ListenFailed)
        print(f"{PROG}: {redact_text(str(reason.value))}", file=sys.stderr, flush=True)
        exit_code = 1
        reactor.stop()

    stopping = False

    def start() -> None:
        # The application's function first ([app] setup, --app): its handlers are in place
        # before anything listens or the cluster hears what this process serves.
        run_app(service).addCallbacks(start_service, app_failed)

    def app_failed(reason: Failure) -> None:
        nonlocal exit_code
        if not stopping and not stop_requested():
            cannot_start(reason.value)
            exit_code = 1
            reactor.stop()

    def start_service(_: None) -> None:
        nonlocal exit_code
        if stopping or stop_requested():  # stopped while the application's function ran
            return
        try:
            service.startService()
        except Exception as error:
            cannot_start(error)
            exit_code = 1
            reactor.stop()
            return
        service.when_listening().addCallbacks(listening, cannot_listen)

    def stop() -> Deferred[None] | None:
        nonlocal stopping
        stopping = True
        return service.stopService() if service.running else None

    from wireproto.service import reload_on_sighup

    # The same options and file again: new [[acl]] rules, and the [auth] files reread.
    reload_on_sighup(service, lambda: config_from_options(vars(args), reactor=reactor).acl,
                     reactor)
    reactor.callWhenRunning(start)
    reactor.addSystemEventTrigger("before", "shutdown", stop)
    # Twisted's own SIGINT/SIGTERM handlers stop the reactor, which stops the service first.
    reactor.run()
    return exit_code


def cannot_start(error: BaseException) -> None:
    """A broker that cannot start part of what its config asks for: one line on stderr."""
    print(f"{PROG}: {redact_text(why_not_started(error))}", file=sys.stderr, flush=True)


def why_not_started(error: BaseException) -> str:
    """What could not start, and why, in one line."""
    from wireproto.service import ListenFailed, StartFailed, describe_error
    from wireproto.supervisor.natsserver import NatsServerMissing

    if isinstance(error, StartFailed | ListenFailed | NatsServerMissing):
        return str(error)  # it says what could not start
    return f"cannot start: {describe_error(error)}"


def supervise(config: Config, args: argparse.Namespace) -> int:
    """`wireproto serve --workers N`: the supervisor of N broker processes."""
    from twisted.internet import reactor
    from twisted.internet.interfaces import IReactorFromThreads

    from wireproto.supervisor.workers import Supervisor

    options = {name: value for name, value in vars(args).items() if name != "command"}
    supervisor = Supervisor(config, options, reactor)
    exit_code = 0

    def ready(bound: list[BoundListener]) -> None:
        if stop_requested():
            return
        announce([*banner(config, bound), f"{supervisor.count} workers, pids "
                  + " ".join(map(str, supervisor.worker_pids())), "ready; Ctrl-C stops"],
                 sys.stdout, broker=True)

    def failed(reason: Failure) -> None:
        # A listener, the private nats-server or a worker that could not start.
        nonlocal exit_code
        if stop_requested():
            # Stopped while starting: a terminal's Ctrl-C or systemd's SIGTERM reached the
            # workers too, which may end before the supervisor has stopped them.
            return
        cannot_start(reason.value)
        exit_code = 1
        reactor.stop()

    def start() -> None:
        supervisor.startService()
        supervisor.when_ready().addCallbacks(ready, failed)

    signal.signal(signal.SIGHUP, lambda number, frame: IReactorFromThreads(reactor).callFromThread(
        supervisor.signal_workers, signal.SIGHUP))
    reactor.callWhenRunning(start)
    reactor.addSystemEventTrigger(
        "before", "shutdown", lambda: supervisor.stopService() if supervisor.running else None)
    reactor.run()
    return exit_code


def check_config(path: str) -> int:
    """``wireproto check-config FILE``: 0 and a summary if FILE is good, else 2 and the error."""
    from wireproto.authentication import check_auth_files
    from wireproto.config import ConfigError, build_config

    try:
        # As `wireproto serve --config FILE` reads it: its key files' permissions, and the
        # places it writes, checked too.
        config = build_config(config_file=path, check_places=True)
        problems = []
        try:
            check_auth_files(config.auth, config.acl)
        except ValueError as error:
            problems.append(f"{path}: auth.{error}")
        why = app_problem(config.app.setup)
        if why is not None:
            problems.append(f"{path}: app.setup: {why}")
        if problems:
            raise ConfigError(*problems)
    except ConfigError as error:
        for problem in error.problems:  # every problem of the file, one line each
            print(f"{PROG} check-config: {problem}", file=sys.stderr, flush=True)
        return 2
    lines = [f"{path}: ok"]
    lines += [f"listen: {listener.describe()} on {redact_url(listener.endpoint)}"
              + (f" at {listener.path}" if listener.path else "")
              for listener in config.listeners]
    lines += [f"attach: {link.describe()} on {redact_url(link.endpoint)}"
              for link in config.attach]
    lines += [f"phyllo: {link.describe()} on {redact_url(link.endpoint)}"
              for link in config.phyllo]
    if config.auth.enabled:
        lines.append(f"auth: on, {len(config.acl)} access rules")
    if config.app.setup:
        lines.append(f"app: {config.app.setup}")
    warning = config.cluster.open_membership_warning()
    if warning is not None:
        lines.append(f"warning: {warning}")
    announce(lines, sys.stdout)
    return 0


def app_problem(spec: str) -> str | None:
    """What keeps the application's function from loading, as `wireproto serve` would load
    it (its module imported, its function found), without calling it; None if nothing."""
    if not spec:
        return None
    from wireproto.service.app import AppFailed, load_setup

    try:
        load_setup(spec)
    except AppFailed as failed:
        return str(failed.error)
    return None


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command `argv` runs: its first word that is no option, if it names one (the
    top-level options, --help and --version, take no value)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``wireproto`` command; returns its exit status. As the program (`argv` None),
    Ctrl-C and SIGTERM end it quietly, from its start, with the status the command documents
    for a stop."""
    words = sys.argv[1:] if argv is None else list(argv)
    command = chosen_command(words)
    entry = COMMANDS.get(command or "")
    if argv is not None or threading.current_thread() is not threading.main_thread():
        return _run(words, command, entry, None)
    stopping = stop_on_signals(entry.stopped if entry is not None else INTERRUPTED)
    if entry is not None and entry.short_lived:
        os.environ.setdefault("AUTOBAHN_USE_NVX", "0")
    status: int | str | None = 1
    try:
        status = _run(words, command, entry, stopping)
        return status
    except SystemExit as exit:  # argparse's, after --help or a bad option
        status = exit.code
        raise
    except BrokenPipeError as error:  # stdout's reader gone (``--help | head -1``)
        output_failed(error)
    finally:
        stopping.finish(status if isinstance(status, int) else 1 if status else 0)
        try:
            sys.stdout.flush()
        except OSError as error:
            output_failed(error)
        if stopping.interrupted:
            # Python 3.11 remembers a KeyboardInterrupt that went through code run by exec()
            # (a dataclass being made while it imported) and, caught or not, ends the process
            # by SIGINT at its exit, whatever the status: the command is done, so it ends now.
            stopping.exit()
        # Left to examine at exit, the objects of every module imported cost the interpreter
        # about 50 ms to tear down, a sixth of a short `pub`; frozen, it skips them.
        gc.freeze()


def _run(words: list[str], command: str | None, entry: Command | None,
         stopping: Stopping | None) -> int:
    args = build_parser(command or "").parse_words(words)
    if stopping is not None and args.command != "check-config" and (
            entry is None or not entry.handles_interrupt):
        stopping.keep_when_running()  # serve and the tools run a reactor
    if args.command == "serve":
        return serve(args)
    if args.command == "check-config":
        return check_config(args.file)
    if hasattr(args, "run"):
        if entry is None or not entry.handles_interrupt or stopping is None:
            return int(args.run(args))
        stopping.interrupt = True
        try:
            return int(args.run(args))
        except KeyboardInterrupt:
            if sys.stdin is not None and sys.stdin.isatty():
                print(file=sys.stderr, flush=True)  # past the prompt or progress line
            return entry.stopped
    raise AssertionError(f"unhandled command {args.command!r}")
