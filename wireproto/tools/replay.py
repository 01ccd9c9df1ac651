"""``wireproto replay``: publish again what clients published in capture files, in the target's
protocol, topic and payload kept, at the recorded pace or faster: a load test made of real
traffic. See docs/tools.md.

    wireproto replay /var/lib/wireproto/capture --to ws://127.0.0.1:8765/websmq --speed 2

What is replayed: each incoming publish of a capture, as the broker put it into its hub (each
protocol's analysis module reads it: ``published(data, binary)``), so a subscriber of the target
gets what a subscriber got when it was captured. A Phyllo device's messages go under their
link's prefix, and a mounted connection's (an attached link's ``prefix``) under its mount, as
their open records name them (docs/hub.md, "Mounted connections"). Other messages (subscribes,
answers, what the broker sent) are not replayed.

Captures are found and read as the ``replay:`` endpoint reads them (`capture/walk.py`), lazily,
with plain reads; a torn last record is the end of its file, damage ends its file too.
Publishing respects the connection's backpressure: a full socket buffer pauses the reading.
The end prints one summary line on stderr (``--json``: one JSON object on stdout).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Protocol, cast

from twisted.internet import defer, task
from twisted.internet.interfaces import IConsumer, IPushProducer, IReactorTime
from zope.interface import implementer

from wireproto.capture import CaptureError, Kind, record_messages
from wireproto.capture.format import FLAG_BINARY, PROTOCOL_NAMES
from wireproto.capture.walk import CaptureRefused, RecordCursor, Stop, capture_at, to_the_end
from wireproto.errors import ProtocolError
from wireproto.protocols import PROTOCOLS
from wireproto.redaction import redact_text
from wireproto.tools._common import (
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    ToolError,
    add_common_options,
    emit,
    run_tool,
    seconds,
)
from wireproto.tools.explain import ask_protocol, closed_line, explain_refusal
from wireproto.tools.links import Link, close_link, open_link, reason_text
from wireproto.tools.registry import links
from wireproto.topics import is_pattern, pattern_matches, validate_pattern

__all__ = ["Captured", "CapturedPublishes", "Pace", "Outcome", "capture_paths", "parse_speed",
           "replay_into", "register"]

CLOSE_TIMEOUT = 10.0
DEFAULT_CONNECT_TIMEOUT = 10.0
# Records read between two turns for the reactor.
READ_AHEAD_RECORDS = 256
# Publishes in a row without giving the reactor a turn (writes flushed, Ctrl-C seen).
BURST = 64
# Phyllo links and mounted connections whose prefix is remembered at once (one per open one).
MAX_PREFIXED_CONNECTIONS = 4096
MAX_PREFIX_LENGTH = 256
_DECODE_ERRORS = (ProtocolError, ValueError, TypeError, KeyError, IndexError,
                  UnicodeDecodeError)


@dataclass(frozen=True, slots=True)
class Captured:
    """One captured publish: when (the record's time), in which protocol, and what the hub got."""

    at_ns: int
    protocol: str
    topic: str
    payload: bytes


class _PublishReader(Protocol):
    def __call__(self, data: bytes, binary: bool) -> tuple[str, bytes] | None: ...


def _publish_readers() -> dict[str, _PublishReader]:
    """Each protocol whose analysis module reads a client's publish, with that reader."""
    readers = {}
    for name, descriptor in PROTOCOLS.items():
        if descriptor.analysis is not None:
            reader = getattr(descriptor.analysis_module(), "published", None)
            if reader is not None:
                readers[name] = reader
    return readers


def capture_paths(names: list[str]) -> list[Path]:
    """The capture files CAPTURES names, each name's as the ``replay:`` endpoint finds them
    (`capture_at`: a file, or a directory's and its subdirectories' files oldest first, every
    header read). ToolError (2) for a name that is not there, cannot be read, or holds a file
    that is not a capture."""
    paths: list[Path] = []
    for name in names:
        try:
            paths.extend(to_the_end(capture_at(name)))
        except CaptureRefused as error:
            raise ToolError(str(error), EXIT_USAGE) from None
    return paths


@dataclass
class CapturedPublishes:
    """The publishes of `paths`, in order, read lazily; `protocols` and `topics` (hub topic
    patterns) keep only those that match, when given. Counts what it read as it goes."""

    paths: list[Path]
    protocols: frozenset[str] = frozenset()
    topics: tuple[str, ...] = ()
    records: int = 0
    undecodable: int = 0
    refused: int = 0
    stops: list[Stop] = field(default_factory=list)
    """The first few files that ended early (`capture/walk.py`), once read through."""
    _readers: dict[str, _PublishReader] = field(default_factory=_publish_readers)
    _prefixes: dict[int, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Captured]:
        return (message for message in self.with_turns() if message is not None)

    def with_turns(self) -> Iterator[Captured | None]:
        """The publishes, and None after every READ_AHEAD_RECORDS records read, and where the
        reader pauses: a turn for the reactor (Ctrl-C, the connection), however few of them
        are publishes. A file that ends early ends there and the replay goes on with the next;
        at the end, a ToolError (1) names the first that was damaged, replaced or cut short."""
        cursor = RecordCursor(self.paths)
        read = 0
        for record in cursor.records(lambda kind, connection: kind != Kind.OUT):
            if record is None:
                yield None
                continue
            self.records += 1
            yield from self._record(record.timestamp_ns, record.connection, record.kind,
                                    record.protocol, record.flags, record.data)
            read += 1
            if read >= READ_AHEAD_RECORDS:
                read = 0
                yield None
        self.stops = cursor.stops
        if cursor.damaged:
            first = next(stop for stop in cursor.stops if not stop.torn)
            more = (f", nor the rest of {cursor.damaged - 1} more files that ended early"
                    if cursor.damaged > 1 else "")
            raise ToolError(f"{first}; the rest of that file was not replayed{more}")

    def _record(self, at_ns: int, connection: int, kind: int, code: int, flags: int,
                data: bytes) -> Iterator[Captured]:
        protocol = PROTOCOL_NAMES.get(code)
        if kind in (Kind.OPEN, Kind.CLOSE):
            self._prefix(connection, kind, data, protocol)
            return
        if kind != Kind.IN or protocol is None or (
                self.protocols and protocol not in self.protocols):
            return
        reader = self._readers.get(protocol)
        if reader is None:
            return
        binary = bool(flags & FLAG_BINARY)
        try:
            messages = record_messages(flags, data)
        except CaptureError:  # a batch that does not split into its messages
            self.undecodable += 1
            return
        for message in messages:
            try:
                found = reader(message, binary)
            except _DECODE_ERRORS:
                self.undecodable += 1
                continue
            if found is None:
                continue
            topic, payload = found
            prefix = self._prefixes.get(connection, "phyllo" if protocol == "phyllo" else None)
            if prefix is not None:
                topic = f"{prefix}/{topic}"
            if is_pattern(topic):
                # Refused by the broker when captured (it closes a connection for it), so it
                # never reached the hub: replayed, it would end the replay the same way.
                self.refused += 1
                continue
            if self.topics and not any(pattern_matches(p, topic) for p in self.topics):
                continue
            yield Captured(at_ns, protocol, topic, payload)

    def _prefix(self, connection: int, kind: int, data: bytes, protocol: str | None) -> None:
        """Where a connection's messages went in the hub: a Phyllo link's under its open
        record's ``prefix``, else ``phyllo/LINK`` (a link's default prefix) from its ``link``;
        a mounted connection's under its ``prefix``; neither if what the record says could not
        be a prefix (a hostile capture's)."""
        if kind == Kind.CLOSE:
            self._prefixes.pop(connection, None)
            return
        if protocol is None:
            return
        from wireproto.codecs.serialization import json_parse
        from wireproto.topics import hub_topic_error, mount_error

        try:
            info = json_parse(data) if data else {}
        except (ProtocolError, ValueError):
            return
        if not isinstance(info, dict):
            return
        prefix, link = info.get("prefix"), info.get("link")
        phyllo = protocol == "phyllo"
        if phyllo and not isinstance(prefix, str) and isinstance(link, str):
            prefix = f"phyllo/{link}"
        if not isinstance(prefix, str):
            return
        prefix = prefix.rstrip("/") if phyllo else prefix
        problem = hub_topic_error(prefix) if phyllo else mount_error(prefix)
        if len(prefix) <= MAX_PREFIX_LENGTH and problem is None and \
                len(self._prefixes) < MAX_PREFIXED_CONNECTIONS:
            self._prefixes[connection] = prefix


def parse_speed(text: str) -> float:
    """--speed: a factor over the recorded pace (more than 0), or ``max`` for as fast as the
    connection takes them."""
    if text.strip().lower() == "max":
        return math.inf
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or 'max'") from None
    if not value > 0 or math.isnan(value):
        raise argparse.ArgumentTypeError(f"must be more than 0 (or 'max'), not {text}")
    return value


# -- publishing, at the recorded pace ------------------------------------------------------------


@implementer(IPushProducer)
class _Backpressure:
    """Registered with the connection's transport: a full socket buffer pauses the replay."""

    def __init__(self) -> None:
        self._resumed: defer.Deferred[None] | None = None

    def pauseProducing(self) -> None:  # noqa: N802 - Twisted's interface
        if self._resumed is None:
            self._resumed = defer.Deferred()

    def resumeProducing(self) -> None:  # noqa: N802
        resumed, self._resumed = self._resumed, None
        if resumed is not None:
            resumed.callback(None)

    def stopProducing(self) -> None:  # noqa: N802
        self.resumeProducing()

    def wait(self) -> defer.Deferred[None] | None:
        return self._resumed


def _message_transport(link: Link) -> IConsumer | None:
    """The transport `link` writes through (to register a producer with), or None."""
    client = getattr(link, "client", None)
    found = getattr(client, "transport", None) or getattr(
        getattr(client, "protocol", None), "transport", None)
    layer = getattr(link, "top", None)
    while found is None and layer is not None:
        found = getattr(layer, "transport", None)
        layer = getattr(layer, "below", None)
    return cast(IConsumer, found) if hasattr(found, "registerProducer") else None


# A step back in the records' times longer than this is another run (captures of several
# runs or brokers given together): the replay goes on from where it is.
ANOTHER_RUN_NS = 1_000_000_000


class Pace:
    """Each message's recorded offset from the first, in nanoseconds: the records' times, but
    never going back (a batch stamped a little before the one written ahead of it plays at
    once), a step back of more than a second starting another run where the replay stands,
    and, with `max_gap_ns`, no wait between two messages longer than that.

    >>> pace = Pace(max_gap_ns=5_000)
    >>> [pace.offset(at) for at in (100, 300, 250, 400, 60_000, 60_100)]
    [0, 200, 200, 300, 5300, 5400]
    """

    def __init__(self, max_gap_ns: int | None = None) -> None:
        self.max_gap_ns = max_gap_ns
        self._latest: int | None = None  # the latest record time seen in this run
        self._offset = 0

    def offset(self, at_ns: int) -> int:
        latest = self._latest
        if latest is None or at_ns < latest - ANOTHER_RUN_NS:
            self._latest = at_ns
        elif at_ns > latest:
            gap = at_ns - latest
            self._offset += gap if self.max_gap_ns is None else min(gap, self.max_gap_ns)
            self._latest = at_ns
        return self._offset


@dataclass
class Outcome:
    published: int = 0
    not_carried: int = 0
    recorded_ns: int = 0
    started: float = field(default_factory=time.monotonic)

    def summary(self, reading: CapturedPublishes) -> dict[str, float]:
        elapsed = time.monotonic() - self.started
        recorded = self.recorded_ns / 1e9
        return {"messages": self.published, "seconds": round(elapsed, 3),
                "rate": round(self.published / elapsed, 1) if elapsed > 0 else 0.0,
                "recorded_seconds": round(recorded, 3), "not_carried": self.not_carried,
                "undecodable": reading.undecodable, "refused": reading.refused,
                "records": reading.records}


async def replay_into(reactor: IReactorTime, link: Link, messages: Iterator[Captured | None],
                      speed: float,
                      outcome: Outcome, max_gap_ns: int | None = None) -> str | None:
    """Publish `messages` on `link`, each at its recorded offset (`Pace`) over `speed`, never
    faster than the connection takes them. Returns None, or why the connection was lost (which
    ends the replay at once, whatever it was waiting for)."""
    lost: list[str] = []
    waiting: list[defer.Deferred[None]] = []

    def gone(why: str) -> None:
        lost.append(why)
        for wait in list(waiting):
            wait.cancel()

    async def until(wait: defer.Deferred[None]) -> None:
        waiting.append(wait)
        try:
            await wait
        finally:
            waiting.remove(wait)

    link.on_lost(gone)
    backpressure = _Backpressure()
    transport = _message_transport(link)
    if transport is not None:
        try:
            transport.registerProducer(backpressure, True)
        except RuntimeError:  # a producer of its own: the bursts below still give turns
            transport = None
    began = reactor.seconds()
    pace = Pace(max_gap_ns)
    burst = 0
    try:
        for message in messages:
            if message is None:  # records read without a publish: a turn for the reactor
                await until(task.deferLater(reactor, 0))
                continue
            outcome.recorded_ns = offset_ns = pace.offset(message.at_ns)
            delay = began + offset_ns / 1e9 / speed - reactor.seconds()
            if delay > 0.0005:
                await until(task.deferLater(reactor, delay))
                burst = 0
            elif (burst := burst + 1) >= BURST:
                await until(task.deferLater(reactor, 0))
                burst = 0
            paused = backpressure.wait()
            if paused is not None:
                await until(paused)
            if lost:
                break
            try:
                await link.publish(message.topic, message.payload)
            except ToolError as refused:
                if refused.code != EXIT_USAGE:
                    raise
                outcome.not_carried += 1  # a payload the target's protocol cannot carry
                continue
            except (ProtocolError, ValueError):
                outcome.not_carried += 1  # a topic the target's protocol cannot carry
                continue
            outcome.published += 1
    except defer.CancelledError:
        if not lost:
            raise  # Ctrl-C or SIGTERM: run_tool's
    finally:
        if transport is not None and not lost:
            transport.unregisterProducer()
    return lost[0] if lost else None


def replay(args: argparse.Namespace) -> int:
    async def main(reactor: IReactorTime) -> int:
        for pattern in args.topic:
            try:
                validate_pattern(pattern)
            except ValueError as error:
                raise ToolError(f"--topic {pattern!r}: {error}", EXIT_USAGE) from None
        reading = CapturedPublishes(capture_paths(args.captures),
                                    frozenset(args.from_protocol), tuple(args.topic))
        messages = reading.with_turns()
        first = await _first(reactor, messages)
        if first is None:
            raise ToolError(
                f"nothing to replay: no client publishes in {reading.records} records of "
                f"{len(reading.paths)} capture files" + (
                    " (with --from-protocol or --topic)" if args.from_protocol or args.topic
                    else ""), EXIT_USAGE)
        protocol = await ask_protocol(reactor, args, "replay", list(links()),
                                      args.timeout or DEFAULT_CONNECT_TIMEOUT)
        link: Link | None = None
        lost: str | None = None
        outcome = Outcome()
        try:
            link = await open_link(reactor, args, links()[protocol], [], args.timeout
                                   ).addErrback(lambda f: explain_refusal(args, protocol, f))
            outcome.started = time.monotonic()
            lost = await replay_into(
                reactor, link, chain([first], messages), args.speed, outcome,
                None if args.max_gap is None else int(args.max_gap * 1e9))
        finally:
            if link is not None and lost is None and not link.closing:
                closed = await close_link(link, reactor, CLOSE_TIMEOUT)
                if closed is not None:
                    lost = reason_text(closed)
        if lost is not None:
            raise ToolError(closed_line(args.address, protocol, lost)
                            or f"the connection closed after {outcome.published} messages: "
                               f"{lost}", EXIT_UNREACHABLE)
        summary = outcome.summary(reading)
        emit(args.json, summary, _summary_line(summary), out=None if args.json else sys.stderr)
        return EXIT_OK

    return run_tool("replay", main, address=args.address)


async def _first(reactor: IReactorTime, messages: Iterator[Captured | None]) -> Captured | None:
    """The first publish, giving the reactor its turns on the way (Ctrl-C stops a long
    search)."""
    for message in messages:
        if message is not None:
            return message
        await task.deferLater(reactor, 0)
    return None


def _summary_line(summary: dict[str, float]) -> str:
    line = (f"wireproto replay: {summary['messages']} messages in {summary['seconds']:g} s "
            f"({summary['rate']:g}/s), recorded over {summary['recorded_seconds']:g} s")
    skipped = [f"{summary[key]} {what}" for key, what in (
        ("not_carried", "the target's protocol cannot carry"),
        ("undecodable", "that could not be decoded"),
        ("refused", "the broker refused when captured")) if summary[key]]
    return redact_text(line + (f"; skipped {', '.join(skipped)}" if skipped else ""))


# -- the command line ----------------------------------------------------------------------------


def register(commands: argparse._SubParsersAction) -> None:
    """Adds ``replay``."""
    parser = commands.add_parser(
        "replay",
        help="publish again what clients published in captures, at their pace",
        description="Publish each client publish in CAPTURES (capture files or directories) "
                    "to --to ADDRESS, topic and payload kept, at the recorded pace over "
                    "--speed; exit 0 once every message is written and the connection closed.",
        epilog="See docs/tools.md.",
    )
    parser.add_argument("captures", nargs="+", metavar="CAPTURES",
                        help="capture files, or directories of them (oldest first)")
    add_common_options(parser, list(links()), address_flag="--to")
    parser.add_argument("--speed", type=parse_speed, default=1.0, metavar="S",
                        help="S times the recorded pace (default 1), or 'max': as fast as the "
                             "connection takes them")
    parser.add_argument("--max-gap", type=seconds, metavar="SECONDS",
                        help="wait at most SECONDS between two messages (a capture's quiet "
                             "hours, or the time between captures given together)")
    parser.add_argument("--from-protocol", action="append", default=[],
                        choices=sorted(_publish_readers()), metavar="NAME",
                        help="replay only what clients of NAME published; repeatable")
    parser.add_argument("-t", "--topic", action="append", default=[], metavar="PATTERN",
                        help="replay only hub topics matching PATTERN (+ and # wildcards); "
                             "repeatable")
    parser.add_argument("--stack", choices=("minimal", "reduced"), default="reduced",
                        help="Phyllo: the device's stack (default reduced)")
    parser.set_defaults(run=replay, bytes=False)
