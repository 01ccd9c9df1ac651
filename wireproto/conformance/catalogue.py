"""A kit's cases and the catalogue that holds them, in the order they run
(docs/conformance.md, "What a case is")."""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from wireproto.conformance.context import Context
from wireproto.conformance.model import Exchange, Level, Outcome

__all__ = ["MODES", "Case", "CaseBody", "CaseResult", "Catalogue", "count"]

CaseBody = Callable[[Context], Coroutine[Any, Any, str | None]]

_ID = re.compile(r"^[a-z][a-z0-9]*(\.[a-z0-9][a-z0-9-]*)+$")


@dataclass(frozen=True, slots=True)
class Case:
    """One check. `id` is dotted and stable (``websmq.topic.longest``): reports are compared
    across versions by it. `section` cites the upstream spec (``"Message format"``); `decision`
    names the section of docs/<spec>.md where wireproto decided what the spec leaves open, or is
    empty. A `harmful` case may hurt a server that handles it badly, so a fresh connection
    checks afterwards that the server still serves."""

    id: str
    title: str
    section: str
    level: Level
    body: CaseBody
    decision: str = ""
    timeout: float = 5.0
    harmful: bool = False

    def __post_init__(self) -> None:
        if not _ID.match(self.id):
            raise ValueError(f"case id {self.id!r}: lower-case dotted words, "
                             "e.g. websmq.topic.longest")

    @property
    def group(self) -> str:
        """The id without its last part: the report's section for this case."""
        return self.id.rsplit(".", 1)[0]


@dataclass(slots=True)
class CaseResult:
    """What running one case gave. `reason` says what was seen when it did not pass (and what
    an information case saw); `exchanges` are kept for every case."""

    case: Case
    outcome: Outcome
    reason: str = ""
    duration: float = 0.0
    exchanges: list[Exchange] = field(default_factory=list)


# What a kit judges: a server (the kit is a client), a client (the kit is a scripted server
# the client connects to), or a device (a Phyllo peer, which the kit opens as a client does).
MODES = ("server", "client", "device")


class Catalogue:
    """The cases of one protocol's kit for one mode, in the order they run, with the check that
    the implementation still serves (`alive`): for a server or a device, before the first case
    and after each harmful one; for a client, before the first case (a client's cases judge its
    survival themselves, on the connection they hold)."""

    def __init__(self, protocol: str, spec: str, docs: str, mode: str = "server") -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        self.protocol = protocol
        self.spec = spec  # the upstream spec's title, as cited
        self.docs = docs  # docs/<spec>.md
        self.mode = mode
        self.cases: list[Case] = []
        self.alive: CaseBody | None = None

    @property
    def id_prefix(self) -> str:
        """What every case id of this catalogue starts with: ``websmq.`` for a server kit,
        ``websmq.client.`` for a client kit, so that ids stay unique across modes."""
        return f"{self.protocol}.client." if self.mode == "client" else f"{self.protocol}."

    def case(self, id: str, title: str, *, section: str, level: Level = Level.MUST,
             decision: str = "", timeout: float = 5.0,
             harmful: bool = False) -> Callable[[CaseBody], CaseBody]:
        """Add the decorated coroutine as a case with these particulars."""
        def add(body: CaseBody) -> CaseBody:
            if any(existing.id == id for existing in self.cases):
                raise ValueError(f"two cases are {id}")
            if not id.startswith(self.id_prefix):
                raise ValueError(f"case {id} of the {self.protocol} {self.mode} kit must "
                                 f"start with {self.id_prefix}")
            if self.mode == "server" and id.startswith(f"{self.protocol}.client."):
                raise ValueError(f"case {id}: {self.protocol}.client. is the client kit's")
            self.cases.append(Case(id, title, section, level, body, decision, timeout,
                                   harmful))
            return body
        return add

    def liveness(self, body: CaseBody) -> CaseBody:
        """Use the decorated coroutine as this kit's check that a server still serves: it
        raises CaseFailed when it does not."""
        self.alive = body
        return body

    def select(self, patterns: Sequence[str] | None) -> list[Case]:
        """The cases whose id is one of `patterns` or starts with one of them followed by a
        dot (``websmq.topic`` takes ``websmq.topic.longest``), in catalogue order; all without
        patterns. A pattern that selects nothing is an error naming it."""
        if not patterns:
            return list(self.cases)
        chosen = []
        for pattern in patterns:
            if not any(_matches(case.id, pattern) for case in self.cases):
                raise ValueError(f"no {self.protocol} case is or starts with {pattern!r} "
                                 "(--list shows them)")
        for case in self.cases:
            if any(_matches(case.id, pattern) for pattern in patterns):
                chosen.append(case)
        return chosen


def _matches(case_id: str, pattern: str) -> bool:
    pattern = pattern.rstrip(".")
    return case_id == pattern or case_id.startswith(pattern + ".")


def count(results: Iterable[CaseResult]) -> dict[Outcome, int]:
    totals = dict.fromkeys(Outcome, 0)
    for result in results:
        totals[result.outcome] += 1
    return totals
