"""The admin API's two lists, sessions and topics, a page at a time (docs/browser.md): the
parameters of a page (`ListQuery`, from a request's query string), a process's own page, and the
pages of the processes of a cluster merged into one.

A page is ``{"items": [...], "total": N, "matched": M, "offset": O, "limit": L}``: `total` rows
before the filter, `matched` after it. Rows are sorted by one field, ascending or descending,
their ties by id (sessions; then by process) or by topic, ascending; so each process's rows in
the asked order, merged, are the cluster's in that order.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cmp_to_key
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar

from wireproto.hub import Session
from wireproto.topics import PatternTree

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "MAX_OFFSET",
    "SESSIONS",
    "TOPICS",
    "ListKind",
    "ListQuery",
    "ListingError",
    "Row",
    "age",
    "merge_answers",
    "merge_session_pages",
    "merge_status",
    "page",
    "read_query",
    "session_page",
    "status_lists",
    "status_queries",
    "topic_list",
    "topic_page",
]

# Rows a page holds unless asked otherwise, and at most.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# The furthest a page may start: past every row there could be, and a number JSON keeps exact.
MAX_OFFSET = 1_000_000_000
_DIGITS = re.compile(rb"[0-9]{1,10}")

Row = dict[str, Any]
Item = TypeVar("Item")

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison


class ListingError(ValueError):
    """A list's parameter that is wrong: the API answers 400 with its message."""


@dataclass(frozen=True)
class ListKind:
    """One of the lists: the fields it sorts by, the first being its default."""

    name: str
    fields: tuple[str, ...]

    def tie(self, row: Row) -> tuple[object, ...]:
        """What orders rows of one sort value: a session's id and process, a topic."""
        if self.name == "sessions":
            return (row["id"], row["node"])
        return (row["topic"],)


SESSIONS = ListKind("sessions", ("id", "age", "peer", "protocol", "transport", "principal",
                                 "received", "sent", "queued_bytes", "dropped", "node"))
TOPICS = ListKind("topics", ("topic", "subscribers", "rate"))


@dataclass(frozen=True)
class ListQuery:
    """Which page of a list: `limit` rows from `offset`, of the rows `q` finds (a substring,
    any case), sorted by `sort`; a topics list without the ``$`` topics unless `sys`."""

    sort: str
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    q: str = ""
    descending: bool = False
    sys: bool = True

    def first_rows(self) -> ListQuery:
        """The query of the rows up to this page's end, which each process of a cluster
        answers so that their merge holds the page."""
        return replace(self, offset=0, limit=self.offset + self.limit)

    def as_message(self) -> Row:
        return {"sort": self.sort, "limit": self.limit, "offset": self.offset, "q": self.q,
                "descending": self.descending, "sys": self.sys}

    @classmethod
    def from_message(cls, kind: ListKind, message: object, name: str) -> ListQuery | None:
        """The query of `kind` that another process sent as `message[name]` (None: that list
        is not asked for); ValueError if it is no such query."""
        if not isinstance(message, dict):
            raise ValueError(f"not a question of lists: {message!r}")
        asked = message.get(name)
        if asked is None:
            return None
        try:
            query = cls(sort=str(asked["sort"]), limit=int(asked["limit"]),
                        offset=int(asked["offset"]), q=str(asked["q"]),
                        descending=bool(asked["descending"]), sys=bool(asked["sys"]))
        except (KeyError, TypeError) as error:
            raise ValueError(f"not a query of {kind.name}: {asked!r}") from error
        if query.sort not in kind.fields or query.limit < 0 or query.offset < 0:
            raise ValueError(f"not a query of {kind.name}: {asked!r}")
        return query


def read_query(args: Mapping[bytes, Sequence[bytes]], kind: ListKind, prefix: str = "",
               limit: int = DEFAULT_LIMIT) -> ListQuery:
    """The query of `kind` in a request's query string (`args`, as twisted.web parses it), its
    parameters' names after `prefix` (``sessions.`` in a status request); ListingError if one
    is wrong. The last of a repeated parameter counts."""

    def given(name: str) -> bytes | None:
        return _given(args, prefix + name)

    limit = _number(args, prefix + "limit", limit, MAX_LIMIT)
    offset = _number(args, prefix + "offset", 0, MAX_OFFSET)
    q = given("q") or b""
    try:
        text = q.decode("utf-8")
    except UnicodeDecodeError:
        raise ListingError(f"{prefix}q is not UTF-8") from None
    sort = (given("sort") or kind.fields[0].encode()).decode("utf-8", "replace")
    field = sort.removeprefix("-")
    if field not in kind.fields:
        raise ListingError(f"{prefix}sort {sort[:40]!r}: sort {kind.name} by one of "
                           f"{', '.join(kind.fields)} (-FIELD for descending)")
    sys = given("sys") if kind is TOPICS else None
    if sys not in (None, b"0", b"1"):
        raise ListingError(f"{prefix}sys is 1 (with the $ topics) or 0 (without)")
    return ListQuery(sort=field, limit=limit, offset=offset, q=text,
                     descending=sort.startswith("-"), sys=sys != b"0")


def status_queries(args: Mapping[bytes, Sequence[bytes]]) -> tuple[ListQuery, ListQuery]:
    """The two lists' queries of a status request: ``limit`` for both, and each list's own
    (``sessions.limit``, ``topics.q``...)."""
    limit = _number(args, "limit", DEFAULT_LIMIT, MAX_LIMIT)
    return (read_query(args, SESSIONS, "sessions.", limit),
            read_query(args, TOPICS, "topics.", limit))


def _given(args: Mapping[bytes, Sequence[bytes]], name: str) -> bytes | None:
    values = args.get(name.encode())
    return values[-1] if values else None


def _number(args: Mapping[bytes, Sequence[bytes]], name: str, default: int, most: int) -> int:
    value = _given(args, name)
    if value is None:
        return default
    if _DIGITS.fullmatch(value) is None or int(value) > most:
        raise ListingError(f"{name} is a whole number from 0 to {most}")
    return int(value)


def page(query: ListQuery, items: list[Row], total: int, matched: int) -> Row:
    """A page object: `items`, the rows `query` asks for, of `total` rows, `matched` found."""
    return {"items": items, "total": total, "matched": matched, "offset": query.offset,
            "limit": query.limit}


# -- ordering ----------------------------------------------------------------------------------

def _value(value: object) -> tuple[bool, object]:
    """A sort value that orders None (an anonymous principal) before any other."""
    return (value is not None, value)


def _ordered(items: Iterable[Item], value: Callable[[Item], object],
             tie: Callable[[Item], SupportsRichComparison], descending: bool) -> list[Item]:
    """`items` by `value`, ascending or descending, and by `tie` ascending where values are
    equal (a sort keeps the order of equal items, reversed or not)."""
    ordered = sorted(items, key=tie)
    ordered.sort(key=lambda item: _value(value(item)), reverse=descending)
    return ordered


def _row_value(field: str) -> Callable[[Row], object]:
    """A row's sort value of `field`: by `age`, its open time's, youngest first (each process
    counts an age from its own moment; an open time is the same on every one of a host)."""
    if field == "age":
        return lambda row: None if row.get("opened") is None else -row["opened"]
    return lambda row: row[field]


def _row_order(kind: ListKind, query: ListQuery) -> Callable[[Row, Row], int]:
    """The comparison of two rows that `_ordered` sorts them by, to merge sorted rows."""
    value, sign = _row_value(query.sort), -1 if query.descending else 1

    def compare(one: Row, other: Row) -> int:
        first, second = _value(value(one)), _value(value(other))
        if first != second:
            return sign if first > second else -sign
        tie, other_tie = kind.tie(one), kind.tie(other)
        return (tie > other_tie) - (tie < other_tie)

    return compare


def _finds(needle: str, texts: Iterable[str | None]) -> bool:
    return any(text is not None and needle in text.casefold() for text in texts)


# -- sessions ----------------------------------------------------------------------------------

def age(opened: float, now: float) -> float:
    """Seconds from `opened` to `now` (Unix seconds, to the millisecond), so that two sessions
    of one open time have one age and a younger one a smaller age, on any process of a host."""
    return round(max(0.0, now - opened), 3)


def _session_value(field: str, node: str) -> Callable[[Session], object]:
    """A session's sort value of `field`, as `_row_value` takes it from its row."""
    if field == "age":
        return lambda session: -session.opened_at
    if field == "node":
        return lambda session: node
    if field == "transport":
        return lambda session: session.transport_name
    if field == "principal":
        return lambda session: session.principal.name
    if field == "dropped":
        return lambda session: session.dropped_messages
    return lambda session: getattr(session, field)


def _session_texts(session: Session, node: str) -> Iterable[str | None]:
    yield str(session.id)
    yield from (node, session.protocol, session.transport_name, session.peer, session.client,
                session.principal.name)
    yield from session.topics
    yield from session.patterns


def session_page(sessions: Iterable[Session], query: ListQuery, node: str
                 ) -> tuple[list[Session], int, int]:
    """The sessions of the page `query` asks for, with how many there are and how many it
    finds; `node` as the rows show it (their process)."""
    every = list(sessions)
    found = every
    if query.q:
        needle = query.q.casefold()
        found = [session for session in every if _finds(needle, _session_texts(session, node))]
    ordered = _ordered(found, _session_value(query.sort, node),
                       lambda session: session.id, query.descending)
    return ordered[query.offset:query.offset + query.limit], len(every), len(found)


def merge_session_pages(query: ListQuery, answers: Iterable[Row], now: float | None = None
                        ) -> Row:
    """The cluster's page of sessions from each process's first rows, in `query`'s order, up
    to the page's end (`ListQuery.first_rows`); with `now` (Unix seconds), each row's age is
    counted again from it and its open time, so the ages of every process agree."""
    answers = list(answers)
    merged = heapq.merge(*(answer["items"] for answer in answers),
                         key=cmp_to_key(_row_order(SESSIONS, query)))
    items = list(islice(merged, query.offset, query.offset + query.limit))
    if now is not None:
        for row in items:
            if row.get("opened") is not None:
                row["age"] = age(row["opened"], now)
    return page(query, items, sum(answer["total"] for answer in answers),
                sum(answer["matched"] for answer in answers))


# -- topics ------------------------------------------------------------------------------------

def topic_list(rows: Iterable[Row], query: ListQuery,
               patterns: Mapping[str, list[int]] | None = None) -> Row:
    """What a process answers for the topics of a cluster's page: every row `query` finds,
    and the names of the others (of the ``$`` topics it finds but leaves out, apart), so the
    merged counts count each topic once; and the ids of the sessions that hold each pattern
    (`patterns`), for the topics that only other processes list."""
    found: list[Row] = []
    sys: list[str] = []
    others: list[str] = []
    needle = query.q.casefold()
    for row in rows:
        name = row["topic"]
        if needle and needle not in name.casefold():
            others.append(name)
        elif not query.sys and name.startswith("$"):
            sys.append(name)
        else:
            found.append(row)
    return {"items": found, "sys": sys, "others": others, "patterns": dict(patterns or {})}


def _reached_by_patterns(patterns: Mapping[str, list[int]]) -> Callable[[str], int]:
    """How many of one process's sessions a message on a topic reaches through `patterns`
    (the ids of the sessions holding each), each once, by the publish path's matching."""
    tree: PatternTree[str] = PatternTree()
    for pattern in patterns:
        tree.add(pattern, pattern)

    # Topics matched by the same patterns reach the same sessions: counted once for all.
    counted: dict[frozenset[str], int] = {}

    def reached(topic: str) -> int:
        matching = frozenset(pattern for group in tree.groups(topic) for pattern in group)
        count = counted.get(matching)
        if count is None:
            count = counted[matching] = len(set().union(
                *(patterns[pattern] for pattern in matching)))
        return count

    return reached


def topic_page(query: ListQuery, lists: Iterable[Row]) -> Row:
    """The page of topics from the lists (`topic_list`) of one process or several: the rows of
    one topic summed (its sessions on each process, its rates), then sorted."""
    merged: dict[str, Row] = {}
    sys: set[str] = set()
    others: set[str] = set()
    lists = list(lists)
    for answer in lists:
        sys.update(answer["sys"])
        others.update(answer["others"])
        for row in answer["items"]:
            kept = merged.get(row["topic"])
            if kept is None:
                merged[row["topic"]] = dict(row)
            else:
                kept["subscribers"] += row["subscribers"]
                kept["rate"] = round(kept["rate"] + row["rate"], 3)
    # A topic that a process does not list still reaches the sessions of its patterns there.
    for answer in lists:
        if answer["patterns"]:
            listed = {row["topic"] for row in answer["items"]}
            reached = _reached_by_patterns(answer["patterns"])
            for name, row in merged.items():
                if name not in listed and not row.get("pattern"):
                    row["subscribers"] += reached(name)
    ordered = _ordered(merged.values(), lambda row: row[query.sort],
                       lambda row: row["topic"], query.descending)
    result = page(query, ordered[query.offset:query.offset + query.limit],
                  len(merged) + len(sys) + len(others), len(merged))
    result["sys"] = len(sys)
    return result


# -- a cluster's answers -----------------------------------------------------------------------

def merge_answers(answers: Sequence[object], sessions: ListQuery | None, topics: ListQuery | None,
                  last_values: Callable[[Row], Row], *, status: bool,
                  now: float | None = None) -> Row:
    """The cluster's page of sessions or of topics, or its status with both, from each
    process's answer (this one's first; those of another version, which asks otherwise, are
    left out); `last_values` adds the topics' last values to a page of them; the sessions'
    ages are counted from `now` (`merge_session_pages`)."""
    usable = [answer for answer in answers if isinstance(answer, dict)
              and answer.keys() >= {"status", "sessions", "topics"}]
    pages: dict[str, Row] = {}
    if sessions is not None:
        pages["sessions"] = merge_session_pages(
            sessions, [answer["sessions"] for answer in usable], now)
    if topics is not None:
        pages["topics"] = last_values(topic_page(
            topics, [answer["topics"] for answer in usable]))
    if not status:
        return pages.popitem()[1]
    return {**merge_status([answer["status"] for answer in usable]), **status_lists(pages)}


def merge_status(statuses: Sequence[Row]) -> Row:
    """The statuses (without lists) of several processes, this one's first, as one: their
    nodes and links side by side, their figures summed.

    >>> one = {"broker": {"node": "a", "published": 2, "uptime": 5.0}, "nodes": ["a"],
    ...        "listeners": [], "links": []}
    >>> two = {"broker": {"node": "b", "published": 3, "uptime": 9.0}, "nodes": ["b"],
    ...        "listeners": [], "links": [{"kind": "attach", "node": "b"}]}
    >>> merged = merge_status([one, two])
    >>> merged["nodes"], merged["broker"]["published"], merged["links"]
    (['a', 'b'], 5, [{'kind': 'attach', 'node': 'b'}])
    """
    first = statuses[0]
    merged = {**first, "broker": dict(first["broker"]), "nodes": [], "links": []}
    for index, status in enumerate(statuses):
        merged["nodes"] += status["nodes"]
        merged["links"] += status["links"]
        if index:
            for name in ("published", "delivered", "dropped"):
                if name in status["broker"]:
                    merged["broker"][name] += status["broker"][name]
    return merged


def status_lists(pages: dict[str, Row]) -> Row:
    """A status's lists from their pages: each page's rows, and its counts under
    ``"pages"``."""
    if not pages:
        return {}
    lists: Row = {name: shown["items"] for name, shown in pages.items()}
    lists["pages"] = {name: {key: value for key, value in shown.items() if key != "items"}
                      for name, shown in pages.items()}
    return lists
