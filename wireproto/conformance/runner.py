"""Running a kit's cases against an implementation, one after another, each with its own
connections, its timeout and its record (docs/conformance.md, "How a run goes").

Before the first case the kit checks that the server serves at all (the catalogue's liveness
check); a server that does not is "could not run", not a list of failed cases. After each
harmful case a fresh connection checks again, and a server that stopped serving fails that case
whatever its level.

A client kit listens instead (`ClientRun`): before the first case a client must connect and
pass the liveness check; each case then takes the client's next connection, on a client process
of its own when the kit starts one (--run).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime

from wireproto.conformance.catalogue import Case, CaseBody, CaseResult, Catalogue
from wireproto.conformance.clientprocess import ClientProcess
from wireproto.conformance.context import Context
from wireproto.conformance.listener import Listener
from wireproto.conformance.model import (
    CaseFailed,
    Level,
    NotApplicable,
    Outcome,
    kept_reason,
    outcome_of,
)
from wireproto.conformance.probe import RecordBudget, Recorder, Target

__all__ = ["ClientRun", "CouldNotRun", "check_alive", "check_client", "run_case", "run_cases",
           "run_client_case", "run_client_cases"]

class CouldNotRun(Exception):
    """The server could not be judged at all: unreachable, or not serving before any case."""


async def _run_body(body: CaseBody, context: Context, timeout: float) -> str | None:
    work: defer.Deferred[str | None] = defer.ensureDeferred(body(context))
    work.addTimeout(timeout, context.reactor)
    try:
        return await work
    except defer.TimeoutError:
        raise CaseFailed(f"no outcome within the case's {timeout:g} s") from None


def _judged(catalogue: Catalogue) -> str:
    """What a kit that connects judges, in its lines: a server, or a (Phyllo) device."""
    return "device" if catalogue.mode == "device" else "server"


async def _judge(case: Case, context: Context) -> tuple[bool, str, bool]:
    """Run `case`'s body: whether its behaviour was met, the reason, and whether it applied.
    CancelledError (Ctrl-C) goes through: the case has no outcome."""
    try:
        said = await _run_body(case.body, context, case.timeout)
    except NotApplicable as inapplicable:
        return True, f"not applicable: {inapplicable}", False
    except CaseFailed as failed:
        return False, str(failed), True
    except defer.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - a connection error, say: the peer's doing
        return False, f"{type(error).__name__}: {error}", True
    return True, said or "", True


def _outcome(case: Case, met: bool, reason: str, applies: bool) -> tuple[Outcome, str]:
    """The outcome of `case`, and its reason as the report gives it."""
    if case.level is Level.INFORMATION and not met:
        reason = f"not seen: {reason}"
    return (outcome_of(case.level, met) if applies else Outcome.INFORMATION), reason


async def check_alive(reactor: IReactorTime, target: Target, catalogue: Catalogue,
                      recorder: Recorder | None = None, run_id: str = "alive") -> str | None:
    """None when the server serves (the catalogue's liveness check passes), else why not."""
    if catalogue.alive is None:
        raise ValueError(f"the {catalogue.protocol} kit has no liveness check")
    context = Context(reactor, target, recorder or Recorder(), run_id)
    try:
        await _run_body(catalogue.alive, context, 10.0)
    except CaseFailed as failed:
        return str(failed)
    except defer.CancelledError:
        raise  # the run was stopped (Ctrl-C): no verdict on the server
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"
    finally:
        await context.close_all()
    return None


async def run_case(reactor: IReactorTime, target: Target, catalogue: Catalogue, case: Case,
                   run_id: str, budget: RecordBudget | None = None) -> CaseResult:
    """Run one case on connections of its own; `budget` is what its record may keep of the
    run's bytes."""
    recorder = Recorder(budget)
    context = Context(reactor, target, recorder, run_id)
    context.timeout = case.timeout
    started = time.monotonic()
    try:
        met, reason, applies = await _judge(case, context)
    finally:
        await context.close_all()
    outcome, reason = _outcome(case, met, reason, applies)
    if case.harmful:
        recorder.add(0, "event", text=f"the kit checks that the {_judged(catalogue)} "
                                      "still serves")
        stopped = await check_alive(reactor, target, catalogue, recorder, run_id)
        if stopped is not None:
            outcome = Outcome.FAIL
            reason = (f"{reason}; " if reason else "") + \
                f"the {_judged(catalogue)} stopped serving after this case: {stopped}"
    return CaseResult(case, outcome, kept_reason(reason), round(time.monotonic() - started, 3),
                      recorder.exchanges)


async def run_cases(reactor: IReactorTime, target: Target, catalogue: Catalogue,
                    cases: Sequence[Case] | None = None,
                    on_result: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Run `cases` (all of the catalogue's by default) in order; `on_result` hears each result
    as it comes. CouldNotRun when the server does not serve before the first case."""
    run_id = secrets.token_hex(4)
    stopped = await check_alive(reactor, target, catalogue, run_id=run_id)
    if stopped is not None:
        raise CouldNotRun(kept_reason(f"{target.protocol} {_judged(catalogue)} does not "
                                      f"serve: {stopped}"))
    results = []
    budget = RecordBudget()
    for case in cases if cases is not None else catalogue.cases:
        result = await run_case(reactor, target, catalogue, case, run_id, budget)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


# How long a client kit waits for the client's first connection before the first case: a
# client started by hand may need a moment, and one started by --run a runtime's start.
FIRST_CONNECTION_WAIT = 30.0


class ClientRun:
    """What a client kit's run needs besides the catalogue: where it listens, and the client's
    command when the kit starts a client for each case (None: the user started one, which
    connects again after each case)."""

    def __init__(self, reactor: IReactorTime, listener: Listener,
                 command: str | None = None, first_wait: float = FIRST_CONNECTION_WAIT) -> None:
        self.reactor = reactor
        self.listener = listener
        self.command = command
        self.first_wait = first_wait

    async def ready(self) -> None:
        """Listen, taking connections, as each case expects to find the listener: a case
        that failed between a pause and its resume (or while refusing) must not leave the next
        ones without a client."""
        self.listener.refusing = False
        await self.listener.resume()

    def start_client(self) -> ClientProcess | None:
        if self.command is None:
            return None
        self.listener.drop_held()  # a new client starts with no connection of an old one's
        client = ClientProcess(self.reactor, self.command, self.listener.url)
        client.start()
        return client

    async def client_back(self, cases_run: int) -> None:
        """A client started by hand: wait (up to the first wait, --wait) for its next
        connection before a case starts, so that its reconnection pause does not eat the
        case's timeout; CouldNotRun when it does not come, as every case after would fail for
        that one fact."""
        if self.command is not None:
            return
        try:
            await self.ready()  # the case before may have left the listener paused
        except ValueError:
            return  # the case says so
        if await self.listener.wait_held(self.first_wait):
            return
        raise CouldNotRun(f"the client did not connect again within {self.first_wait:g} s "
                          f"(--wait) after {cases_run} case(s): a client started by hand must "
                          "connect again after each case")

    @staticmethod
    async def end_client(client: ClientProcess | None, recorder: Recorder,
                         told: bool, when: str = "during the case") -> str | None:
        """Stop `client`; say (in the record, and as the return value) how it ended when it
        ended on its own during the case, and with `told`, what it wrote."""
        if client is None:
            return None
        # A client that crashed on what the case sent may not have been reaped yet.
        ended_alone = not client.running or (told and await client.ended(0.3))
        await client.stop()
        said = None
        if ended_alone:
            said = f"the client {client.described()} {when}"
            recorder.add(0, "event", text=said)
        if (told or ended_alone) and client.output():
            recorder.add(0, "event", text="the client wrote: " + client.output())
        return said


async def check_client(run: ClientRun, target: Target, catalogue: Catalogue,
                       recorder: Recorder | None = None,
                       run_id: str = "alive") -> str | None:
    """None when a client connects and passes the catalogue's liveness check (within the run's
    first wait), else why not."""
    if catalogue.alive is None:
        raise ValueError(f"the {catalogue.protocol} client kit has no liveness check")
    recorder = recorder or Recorder()
    try:
        client = run.start_client()
    except ValueError as error:
        return str(error)
    context = Context(run.reactor, target, recorder, run_id, listener=run.listener,
                      client=client)
    context.timeout = run.first_wait
    failed = None
    try:
        await _run_body(catalogue.alive, context, run.first_wait + 10.0)
    except CaseFailed as failure:
        failed = str(failure)
    except defer.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001
        failed = f"{type(error).__name__}: {error}"
    finally:
        await context.close_all()
        ended = await run.end_client(client, recorder, told=True,
                                     when="before the first case")
    if failed is not None and ended is not None and client is not None and \
            client.described() not in failed:
        failed = f"{failed}; {ended}"
    if failed is not None and client is not None and client.output():
        failed = f"{failed}; it wrote: {client.output()[-500:]}"
    return failed


async def run_client_case(run: ClientRun, target: Target, case: Case, run_id: str,
                          budget: RecordBudget | None = None) -> CaseResult:
    """Run one client case: with --run on a client started for it alone, else on the next
    connection the user's client makes."""
    recorder = Recorder(budget)
    started = time.monotonic()
    met, reason, applies = True, "", True
    client = None
    try:
        await run.ready()  # ValueError: its port was taken while it was paused
        client = run.start_client()
    except ValueError as error:
        met, reason = False, str(error)
    context = Context(run.reactor, target, recorder, run_id, listener=run.listener,
                      client=client)
    context.timeout = case.timeout
    if met:
        try:
            met, reason, applies = await _judge(case, context)
        except defer.CancelledError:
            await context.close_all()
            if client is not None:
                await client.stop()
            raise
    await context.close_all()
    ended = await run.end_client(client, recorder, told=not met)
    if ended is not None and not met:
        reason = f"{reason}; {ended}"
    outcome, reason = _outcome(case, met, reason, applies)
    return CaseResult(case, outcome, kept_reason(reason), round(time.monotonic() - started, 3),
                      recorder.exchanges)


async def run_client_cases(run: ClientRun, target: Target, catalogue: Catalogue,
                           cases: Sequence[Case] | None = None,
                           on_result: Callable[[CaseResult], None] | None = None
                           ) -> list[CaseResult]:
    """Run a client kit's `cases` in order; CouldNotRun when no client connects and passes the
    liveness check before the first case."""
    run_id = secrets.token_hex(4)
    stopped = await check_client(run, target, catalogue, run_id=run_id)
    if stopped is not None:
        raise CouldNotRun(kept_reason(f"{target.protocol} client could not be judged: "
                                      f"{stopped}"))
    results: list[CaseResult] = []
    budget = RecordBudget()
    for case in cases if cases is not None else catalogue.cases:
        await run.client_back(len(results))
        result = await run_client_case(run, target, case, run_id, budget)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
