"""The words of the conformance kits' case model (docs/conformance.md, "What a case is"); the
cases themselves are in wireproto.conformance.catalogue.

A case is one check of one behaviour a spec asks of an implementation. It runs on recorded
connections and either sees that behaviour or raises `CaseFailed` with what it saw instead. The
outcome follows from the case's level, as in the Autobahn Testsuite: a MUST not met fails, a
SHOULD not met is non-strict, and an information case only reports what it saw.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["KIT_VERSION", "CaseFailed", "Exchange", "Level", "NotApplicable", "Outcome",
           "kept_reason", "outcome_of"]

# The version of the kits' cases and report schema together: a case's meaning or id changing,
# or the report's schema changing, is a new version (docs/conformance.md, "Versions").
KIT_VERSION = "1.0"


class Level(enum.StrEnum):
    MUST = "MUST"
    SHOULD = "SHOULD"
    INFORMATION = "information"


class Outcome(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NON_STRICT = "non-strict"  # a SHOULD not met
    INFORMATION = "information"


class NotApplicable(Exception):
    """The case does not apply to this target (a WebSocket text frame, sent on a framed
    stream): reported as information, neither a pass nor a fail, with the reason."""


class CaseFailed(Exception):
    """What a case saw instead of the behaviour it checks: one sentence for the report."""


@dataclass(frozen=True, slots=True)
class Exchange:
    """One thing that happened on a case's connections, in order: bytes sent or received
    (`data`, with `binary` False for a text WebSocket frame or a text packet), or an event
    without bytes (`data` None: connected, closed with a code, an HTTP status) told in `text`.
    `at` is seconds since the case started; `connection` numbers the case's connections from
    1, so a report can tell them apart. `data` holds the first bytes only of a long message;
    `length` is the whole message's."""

    connection: int
    direction: str  # "sent", "received" or "event"
    at: float
    data: bytes | None = None
    binary: bool = True
    text: str = ""
    length: int = 0


# What a run keeps of a reason: a report shows 2000 characters, and the rest is room for a
# credential straddling that cut to be found whole by the report's scrubber.
REASON_KEPT = 2000 + 8192


def kept_reason(text: str) -> str:
    """`text` cut to what a run keeps of a reason (a server's whole message may be in it)."""
    return text if len(text) <= REASON_KEPT else text[:REASON_KEPT] + "..."


def outcome_of(level: Level, met: bool) -> Outcome:
    """The outcome of a case of `level` whose behaviour was (or was not) `met`."""
    if level is Level.INFORMATION:
        return Outcome.INFORMATION
    if met:
        return Outcome.PASS
    return Outcome.FAIL if level is Level.MUST else Outcome.NON_STRICT
