"""twistd plugin: ``twistd -n wireproto --listen ...`` runs the same broker as ``wireproto serve``.

Kept small: its options come from the table `wireproto serve` uses too
(wireproto.config.options, which imports nothing else), and the broker is imported only when
the plugin is used, so ``twistd --help`` stays fast. No ``__init__.py`` here or in
``twisted/``: Twisted finds this file through its plugin path.
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.application.service import IServiceMaker
from twisted.plugin import IPlugin
from twisted.python import usage
from zope.interface import implementer

from wireproto.config.options import SERVE_OPTIONS, twistd_option_lists


class Options(usage.Options):
    synopsis = "[--listen SPEC]... [--attach SPEC]... [--phyllo SPEC]... [--config FILE] [options]"
    longdesc = (
        "Serve wireproto protocols. --listen PROTOCOL+TRANSPORT[/PATH]@ENDPOINT, e.g. "
        "websmq+ws@tcp:8765 or websmq+length32@unix:/tmp/websmq.sock; --attach "
        "PROTOCOL[+FRAMING]@CLIENT_ENDPOINT, e.g. websmq@serial:/dev/ttyACM0; --phyllo "
        "NAME[+STACK]@ADDRESS, e.g. dev1@serial:/dev/ttyACM0 (hub topics phyllo/dev1/...). "
        "Defaults: "
        "websmq+ws@tcp:8765, websmq+length32@tcp:8766, ubre+ws@tcp:8765, ubre+lines@tcp:8767, "
        "nydus+engineio@tcp:8765, nydus+lines@tcp:8768, subble+ws@tcp:8765 and "
        "subble+length32@tcp:8769 on 127.0.0.1. See docs/running.md."
    )
    # The options of `wireproto serve`, from its one table (wireproto.config.options).
    optParameters, optFlags = twistd_option_lists()

    def parseOptions(self, options: Any = None) -> None:
        # A bad option is one line and status 2, as with `wireproto serve`, not twistd's
        # usage block followed by the error.
        try:
            super().parseOptions(options)
        except usage.UsageError as error:
            for line in str(error).splitlines():
                print(f"twistd wireproto: {line}", file=sys.stderr, flush=True)
            print("twistd wireproto: see twistd wireproto --help", file=sys.stderr, flush=True)
            raise SystemExit(2) from None

    def __init__(self) -> None:
        super().__init__()
        for option in SERVE_OPTIONS:
            if option.repeat:
                self[option.name] = []

    def postOptions(self) -> None:
        from wireproto.config import ConfigError, config_from_options

        try:
            # The places the broker writes are checked as `wireproto serve` checks them.
            self["wireproto"] = config_from_options(self, check_places=True)
        except ConfigError as error:
            raise usage.UsageError("\n".join(error.problems)) from None


def _repeated(name: str, help: str) -> Any:
    def opt(self: Options, value: str) -> None:
        self[name].append(value)

    opt.__doc__ = f"{help[0].upper()}{help[1:]} (repeatable)."
    return opt


for _option in SERVE_OPTIONS:
    if _option.repeat:
        setattr(Options, f"opt_{_option.dest}", _repeated(_option.name, _option.help))


@implementer(IServiceMaker, IPlugin)
class WireprotoServiceMaker:
    tapname = "wireproto"
    description = "wireproto broker: WEBSMQ and friends over WebSocket, TCP, unix and serial."
    options = Options

    def makeService(self, options: Options) -> Any:
        from wireproto.cli import announce, banner, cannot_start
        from wireproto.config import ConfigError, config_from_options
        from wireproto.service import ListenFailed, make_service, reload_on_sighup

        config = options["wireproto"]
        if config.cluster.workers > 1:
            return _supervisor(config, options)
        # Before twistd logs: what cannot be made is one line on stderr, as under `wireproto
        # serve`, not a traceback.
        try:
            service = make_service(config)
        except ConfigError as error:
            print(f"twistd wireproto: {error}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        except Exception as error:
            cannot_start(error)
            raise SystemExit(1) from None
        from twisted.internet import reactor

        # SIGHUP rereads the file's [[acl]] rules and the [auth] files, as under `wireproto serve`.
        reload_on_sighup(service, lambda: config_from_options(options).acl, reactor)
        twistd_options = getattr(options, "parent", None)
        if twistd_options is not None:
            service.parent_log_observer = _twistd_log_observer(twistd_options, config.log.level)

        def listening(bound: list[Any]) -> None:
            # twistd sends sys.stdout to its log; these lines go to the real stdout, as
            # `wireproto serve` prints them, for scripts that wait for the ports. Not before
            # the reactor runs: twistd binds the ports before it takes SIGTERM, and "ready"
            # promises a clean stop on it.
            reactor.callWhenRunning(
                announce, [*banner(config, bound), "ready"], sys.__stdout__)

        def cannot_listen(reason: Any) -> None:
            reason.trap(ListenFailed)  # already logged; twistd stops on it

        service.when_listening().addCallbacks(listening, cannot_listen)
        return _after_app(service, reactor)


def _after_app(service: Any, reactor: Any) -> Any:
    """The application's function ([app] setup, --app) run now, before twistd starts the
    service, binds its listeners and drops privileges: what fails is one line on stderr and
    status 1. An app still running (waiting for the reactor) has the service started once it
    is done (wireproto.service.app.AfterApp)."""
    from twisted.python.failure import Failure

    from wireproto.cli import cannot_start, why_not_started
    from wireproto.service.app import AfterApp, run_app

    ready = run_app(service)
    if ready.called:
        outcome: list[Any] = []
        ready.addBoth(outcome.append)
        if isinstance(outcome[0], Failure):
            cannot_start(outcome[0].value)
            raise SystemExit(1)
        return service

    def failed(reason: Failure) -> None:
        if not reason.check(SystemExit):  # a SystemExit's reason is logged already
            from twisted.logger import Logger

            Logger(namespace="wireproto.service").error(
                "wireproto: {error}", event="start_failed", error=why_not_started(reason.value))
        _exit_status_after_twistd(1)
        reactor.callWhenRunning(reactor.stop)

    return AfterApp(service, ready, failed)


def _supervisor(config: Any, options: Options) -> Any:
    """`twistd wireproto --workers N`: the supervisor of N broker processes, as under
    `wireproto serve --workers N` (wireproto.supervisor.workers)."""
    import signal

    from twisted.internet import reactor

    from wireproto.cli import announce, banner
    from wireproto.supervisor.workers import Supervisor

    values = {option.dest: options.get(option.name) for option in SERVE_OPTIONS}
    supervisor = Supervisor(config, values, reactor)
    signal.signal(signal.SIGHUP, lambda number, frame: reactor.callFromThread(
        supervisor.signal_workers, signal.SIGHUP))

    def ready(bound: list[Any]) -> None:
        announce([*banner(config, bound), f"{supervisor.count} workers, pids "
                  + " ".join(map(str, supervisor.worker_pids())), "ready"], sys.__stdout__)

    def failed(reason: Any) -> None:
        # A listener, the private nats-server or a worker that could not start: one line
        # in twistd's log, then twistd stops, with status 1.
        from twisted.logger import Logger

        from wireproto.cli import why_not_started

        Logger(namespace="wireproto.cluster").error(
            "wireproto: {error}", event="start_failed", error=why_not_started(reason.value))
        _exit_status_after_twistd(1)
        reactor.callWhenRunning(reactor.stop)

    supervisor.when_ready().addCallbacks(ready, failed)
    return supervisor


def _exit_status_after_twistd(status: int) -> None:
    """Have the process exit with `status` once twistd is done (its reactor stopped, its pid
    file removed): twistd itself exits 0 after a reactor that stopped, whatever stopped it."""
    import atexit
    import os

    def exit_now() -> None:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            if stream is not None:
                stream.flush()
        os._exit(status)

    atexit.register(exit_now)


def _twistd_log_observer(twistd_options: Any, level: str) -> Any:
    """twistd's own log observer (--logfile, --syslog, stdout with -n), with wireproto's events
    below the [log] level filtered out; twistd's own lines pass as before."""
    from twisted.logger import (
        FilteringLogObserver,
        ILogObserver,
        LegacyLogObserverWrapper,
        LogLevel,
        LogLevelFilterPredicate,
    )
    from twisted.scripts.twistd import _SomeApplicationRunner

    from wireproto.logs import set_debugging

    set_debugging(level == "debug")  # what logs often at debug builds no event otherwise
    inner = _SomeApplicationRunner.loggerFactory(twistd_options)._getLogObserver()
    if not ILogObserver.providedBy(inner):
        inner = LegacyLogObserverWrapper(inner)
    predicate = LogLevelFilterPredicate(defaultLogLevel=LogLevel.info)
    predicate.setLogLevelForNamespace("wireproto", LogLevel.levelWithName(level))
    return FilteringLogObserver(inner, [predicate])


serviceMaker = WireprotoServiceMaker()
