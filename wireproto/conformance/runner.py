"""Running a kit's cases against an implementation, one after another, each with its own
connections, its timeout and its record (docs/conformance.md, "How a run goes").

Before the first case the kit checks that the server serves at all (the catalogue's liveness
check); a server that does not is "could not run", not a list of failed cases. After each
harmful case a fresh connection checks again, and a server that stopped serving fails that case
whatever its level.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime

from wireproto.conformance.catalogue import Case, CaseBody, CaseResult, Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.model import (
    CaseFailed,
    Level,
    NotApplicable,
    Outcome,
    kept_reason,
    outcome_of,
)
from wireproto.conformance.probe import RecordBudget, Recorder, Target

__all__ = ["CouldNotRun", "check_alive", "run_case", "run_cases"]

class CouldNotRun(Exception):
    """The server could not be judged at all: unreachable, or not serving before any case."""


async def _run_body(body: CaseBody, context: Context, timeout: float) -> str | None:
    work: defer.Deferred[str | None] = defer.ensureDeferred(body(context))
    work.addTimeout(timeout, context.reactor)
    try:
        return await work
    except defer.TimeoutError:
        raise CaseFailed(f"no outcome within the case's {timeout:g} s") from None


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
    met, reason, applies = True, "", True
    try:
        said = await _run_body(case.body, context, case.timeout)
        reason = said or ""
    except NotApplicable as inapplicable:
        applies, reason = False, f"not applicable: {inapplicable}"
    except CaseFailed as failed:
        met, reason = False, str(failed)
    except defer.CancelledError:
        raise  # the run was stopped (Ctrl-C): the case has no outcome
    except Exception as error:  # noqa: BLE001 - a connection error, say: the server's doing
        met, reason = False, f"{type(error).__name__}: {error}"
    finally:
        await context.close_all()
    outcome = outcome_of(case.level, met) if applies else Outcome.INFORMATION
    if case.level is Level.INFORMATION and not met:
        reason = f"not seen: {reason}"
    if case.harmful:
        recorder.add(0, "event", text="the kit checks that the server still serves")
        stopped = await check_alive(reactor, target, catalogue, recorder, run_id)
        if stopped is not None:
            outcome = Outcome.FAIL
            reason = (f"{reason}; " if reason else "") + \
                f"the server stopped serving after this case: {stopped}"
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
        raise CouldNotRun(kept_reason(f"{target.protocol} server does not serve: {stopped}"))
    results = []
    budget = RecordBudget()
    for case in cases if cases is not None else catalogue.cases:
        result = await run_case(reactor, target, catalogue, case, run_id, budget)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
