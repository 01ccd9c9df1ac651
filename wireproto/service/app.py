"""An application's code in the broker's processes: ``wireproto serve --app MODULE:FUNCTION``
(``[app] setup``), as uvicorn's ``module:app`` and celery's ``-A`` (docs/embedding.md).

`load_setup` imports the function, with the current directory first on the import path as
``python -m`` has it, so ``--app myapp:setup`` finds ./myapp.py. `run_app` calls it with the
service before the service starts, and waits for what it returns: None, a Deferred or another
awaitable (an ``async def`` function's coroutine). Whatever goes wrong, a module that does not
import, a name it lacks, something that cannot be called, or the function raising or failing,
is an `AppFailed`: one line, ``app MODULE:FUNCTION: WHY``; its traceback goes to the log at
info, seen with ``-v``.

`wireproto serve` (and each worker of ``--workers``) runs the app once the reactor runs and
starts the service only when it is done. twistd starts its services before its reactor runs:
its plugin runs the app as it makes the service, and an app not done by then has the service
started by `AfterApp` once it is.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from twisted.application.service import IServiceCollection, MultiService, Service
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.service.parts import StartFailed

if TYPE_CHECKING:
    from wireproto.service import WireprotoService

__all__ = ["AppFailed", "AfterApp", "load_setup", "run_app"]

log = Logger(namespace="wireproto.service")

Setup = Callable[["WireprotoService"], object]


class AppFailed(StartFailed):
    """The application's function could not be loaded, or failed: ``app SPEC: WHY``."""

    def __init__(self, spec: str, why: str) -> None:
        super().__init__(f"app {spec}", why)


def _described(error: BaseException) -> str:
    """`error` with its type, in one line (its message's lines joined)."""
    text = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _importable_here() -> None:
    """The current directory first on the import path, as ``python -m`` and uvicorn have it
    (the ``wireproto`` script's own directory is there instead)."""
    here = os.getcwd()
    if sys.path[:1] not in ([here], [""]):
        sys.path.insert(0, here)


def load_setup(spec: str) -> Setup:
    """Import MODULE and find FUNCTION (dotted names both) of ``MODULE:FUNCTION``, without
    calling it; AppFailed says what is wrong."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise AppFailed(spec, "expected MODULE:FUNCTION, as myapp:setup")
    _importable_here()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        log.info("app {spec}: importing {module} failed", event="app_failed", spec=spec,
                 module=module_name, log_failure=Failure())
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise AppFailed(spec, f"no module named {module_name!r} in {os.getcwd()} or on "
                                  "the Python path") from None
        raise AppFailed(spec, f"importing {module_name} failed: {_described(error)}") from None
    # A syntax error, or whatever its code raised: a CancelledError or a KeyboardInterrupt
    # too (no BaseException of the app's may pass for the broker's own).
    except BaseException as error:
        log.info("app {spec}: importing {module} failed", event="app_failed", spec=spec,
                 module=module_name, log_failure=Failure())
        raise AppFailed(spec, f"importing {module_name} failed: {_described(error)}") from None
    found: object = module
    parts = name.split(".")
    for index, part in enumerate(parts):
        try:
            found = getattr(found, part)
        except AttributeError:
            where = f"{module_name}:{'.'.join(parts[:index])}" if index else f"module {module_name}"
            raise AppFailed(spec, f"{where} has no attribute {part!r}") from None
        except BaseException as error:  # a module's __getattr__ that raised
            raise AppFailed(spec, f"{name}: {_described(error)}") from None
    if not callable(found):
        raise AppFailed(spec, f"{name} is not callable: it is {type(found).__name__} "
                              f"{_short_repr(found)}")
    return found


async def _awaited(awaitable: Awaitable[object]) -> object:
    return await awaitable


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def run_app(service: WireprotoService, spec: str | None = None) -> defer.Deferred[None]:
    """Load and call `spec` (by default the service's ``[app] setup``; none, nothing to do)
    with `service`; fires once what it returned is done, or fails with AppFailed."""
    spec = service.config.app.setup if spec is None else spec
    if not spec:
        return defer.succeed(None)
    try:
        setup = load_setup(spec)
        returned = setup(service)
    except AppFailed:
        return defer.fail()
    except BaseException as error:
        log.info("app {spec} raised", event="app_failed", spec=spec, log_failure=Failure())
        return defer.fail(AppFailed(spec, f"raised {_described(error)}"))
    if returned is None:
        return defer.succeed(None)
    if isinstance(returned, defer.Deferred):
        waited: defer.Deferred[object] = returned
    elif inspect.isawaitable(returned):
        waited = defer.ensureDeferred(_awaited(returned))
    else:
        if inspect.isgenerator(returned):
            why = "returned a generator: give it @inlineCallbacks, or make it async def"
        else:
            why = (f"returned {type(returned).__name__} {_short_repr(returned)}: give None, a "
                   "Deferred or an awaitable")
        return defer.fail(AppFailed(spec, why))

    def failed(reason: Failure) -> Failure:
        if reason.check(AppFailed):
            return reason
        log.info("app {spec} failed", event="app_failed", spec=spec, log_failure=reason)
        return Failure(AppFailed(spec, f"raised {_described(reason.value)}"))

    def done(_: object) -> None:
        return None

    return waited.addCallbacks(done, failed)


class AfterApp(MultiService):
    """`service`, started once `ready` (its app's `run_app`) has fired: twistd starts the
    services it is given before its reactor runs, and an app that waits for the reactor is not
    done then. The service then binds its listeners when it starts, after twistd has dropped
    privileges. What stops it starting, `ready` failing included, goes to `failed`."""

    def __init__(self, service: WireprotoService, ready: defer.Deferred[None],
                 failed: Callable[[Failure], None]) -> None:
        super().__init__()
        self.service = service
        self.ready = ready
        self.failed = failed
        service.setServiceParent(self)

    def setServiceParent(self, parent: IServiceCollection) -> None:
        super().setServiceParent(parent)
        self.service.give_log_observer(parent)

    def privilegedStartService(self) -> None:
        pass  # its service starts whole once the app is done

    def startService(self) -> None:
        Service.startService(self)
        self.ready.addCallbacks(self._start, self._failed)

    def _start(self, _: None) -> None:
        if not self.running:
            return  # stopped while the app was still setting up
        try:
            self.service.privilegedStartService()
            self.service.startService()
        except BaseException:
            self._failed(Failure())

    def _failed(self, reason: Failure) -> None:
        if self.running:
            self.failed(reason)

    def stopService(self) -> defer.Deferred[None]:
        Service.stopService(self)
        if self.service.running:
            return defer.maybeDeferred(self.service.stopService)
        return defer.succeed(None)
