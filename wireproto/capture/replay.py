"""The ``replay:`` endpoint: what one captured connection received from its peer, played again
as the bytes that peer sent, so a bridge, a dashboard or the pipeline runs without the hardware
through the same code as the live link (docs/phyllo.md, "Replaying a capture").

``replay:path=CAPTURE[:connection=ID | :link=NAME][:speed=S][:loop=yes][:stack=reduced|minimal]``

- Each in record of the selected connection(s) is played at its recorded time: the gaps between
  records divided by `speed` (``speed=max``: no waiting, a bounded burst each reactor turn).
  The messages of one batch record arrive together, as they did.
- A Phyllo link's messages (pub-sub messages in their minimal-stack bytes) are encoded with the
  link's stack and chunk limits into the byte stream the device sent (`PhylloEncoding`); an
  attached protocol's messages are framed with the link's framing (`FramedEncoding`).
- ``link=NAME`` plays every connection of that link, in capture order (the link's reopens).
- ``loop=yes`` plays the capture again from the start, each pass starting at least
  `MIN_PASS_SECONDS` (over the speed) after the one before began.
- At the end, without ``loop=yes``, the carrier stays open and quiet, like a device with
  nothing more to say: the dashboard keeps its last values and the link reads as up. A carrier
  closed and opened again (the link's reconnector) goes on from where the replay was, never
  from the start: an ended replay gives a quiet carrier.
- What is written to the carrier is discarded and counted; closing it cancels every timer.
- The capture is found and read as ``wireproto replay`` reads it (`capture/walk.py`): the first
  connect searches it a bounded part each reactor turn, and a file that ends early (damage, a
  file replaced or cut short) ends there with a warning, the replay going on with the next.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import asdict, dataclass
from typing import cast

from twisted.internet import defer
from twisted.internet.error import ConnectError, ConnectionDone
from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IProtocol,
    IProtocolFactory,
    IPushProducer,
    IReactorCore,
    IReactorTime,
    IStreamClientEndpoint,
    IStreamClientEndpointStringParserWithReactor,
    ITransport,
)
from twisted.logger import Logger
from twisted.plugin import IPlugin
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto.capture.format import Kind, Record
from wireproto.capture.replay_source import (
    Captured,
    ReplayError,
    ReplayOptions,
    capture_paths,
    find_selection,
    matches,
    options_from_fields,
    parse_replay,
)
from wireproto.capture.walk import RecordCursor, Steps, in_turns, to_the_end
from wireproto.codecs import phyllo as phyllo_codec
from wireproto.codecs.phyllo.chunks import MAX_CHUNK_LENGTH
from wireproto.codecs.phyllo.frame import MAX_FRAME_PAYLOAD
from wireproto.codecs.phyllo.message import PubSubMessage
from wireproto.errors import ProtocolError
from wireproto.phyllo.links import ChunkedStream
from wireproto.phyllo.presets import build_stack
from wireproto.transports.stream import (
    CobsMessageTransport,
    Length32MessageTransport,
    LinesMessageTransport,
    StreamOptions,
)

__all__ = [
    "ReplayError",
    "ReplayOpenFailed",
    "ReplayOptions",
    "ReplayStats",
    "ReplayAddress",
    "PhylloEncoding",
    "FramedEncoding",
    "ReplayEndpoint",
    "ReplayEndpointParser",
    "parse_replay",
    "replay_endpoint",
    "phyllo_replay",
    "attach_replay",
    "replay_problem",
]

log = Logger(namespace="wireproto.capture")

# At speed=max, or catching up, one reactor turn delivers at most this much.
BURST_RECORDS = 512
BURST_BYTES = 1 << 20
# With loop=yes, a pass starts at least this long (over speed) after the one before began: a
# capture of one record, or of records all stamped alike, has no pace of its own to keep.
MIN_PASS_SECONDS = 1.0
# A file's problems (damage, a file replaced) logged at most, over every pass.
MAX_SAID = 64
# link=NAME: at most this many of its connections open at once in the capture.
MAX_SELECTED = 1024


class _Breath:
    """What `ReplayEndpoint._next_record` says when it has read far without finding one."""


BREATH = _Breath()


class ReplayOpenFailed(ConnectError):
    """Cannot replay the capture"""


@implementer(IAddress)
@dataclass(frozen=True)
class ReplayAddress:
    """Where a replay carrier's bytes come from: the capture's path."""

    path: str
    type: str = "REPLAY"

    def __str__(self) -> str:
        return f"replay:{self.path}"


@dataclass
class ReplayStats:
    """What a replay has played, over every carrier it has had."""

    connections: int = 0
    passes: int = 0
    """Times the replay reached the end of the capture."""
    records: int = 0
    messages: int = 0
    bytes: int = 0
    """Bytes delivered to the carrier's protocol."""
    unencodable: int = 0
    """Captured messages the link's stack or framing cannot carry (too long, not a message)."""
    skipped_records: int = 0
    writes_discarded: int = 0
    bytes_discarded: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class PhylloEncoding:
    """A captured Phyllo message (a pub-sub message in minimal-stack bytes) as the device sent
    it: the message encoded by a device's own stack of the `stack` preset, with the link's
    chunk and frame limits, onto a stream whose bytes are collected."""

    def __init__(self, stack: str = "reduced", *, max_chunk_length: int = MAX_CHUNK_LENGTH,
                 max_frame_payload: int = MAX_FRAME_PAYLOAD) -> None:
        self.name = stack
        self._wire: list[bytes] = []
        bottom = ChunkedStream(max_length=max_chunk_length)
        self._top = build_stack(stack, bottom, max_chunk_length=max_chunk_length,
                                max_frame_payload=max_frame_payload)
        bottom.makeConnection(cast(ITransport, _Collector(self._wire)))

    def encode(self, message: bytes) -> bytes:
        decoded = phyllo_codec.decode(message)
        if not isinstance(decoded, PubSubMessage):
            raise ProtocolError("a Phyllo layer message, not a pub-sub message")
        self._top.send(decoded)
        wire, self._wire[:] = b"".join(self._wire), []
        return wire


class _Collector:
    """The device stack's carrier: what it writes, kept for `PhylloEncoding`."""

    def __init__(self, wire: list[bytes]) -> None:
        self.write = wire.append

    def registerProducer(self, producer: object, streaming: bool) -> None:
        pass


class FramedEncoding:
    """A captured message framed as an attached link's stream carries it: ``cobs``,
    ``length32`` or ``lines``; longer than `max_message_size` is refused, as the link would."""

    _FRAMERS = {"cobs": CobsMessageTransport, "length32": Length32MessageTransport,
                "lines": LinesMessageTransport}

    def __init__(self, framing: str, max_message_size: int = StreamOptions.max_message_size
                 ) -> None:
        if framing not in self._FRAMERS:
            raise ValueError(f"unknown framing {framing!r}: use {', '.join(self._FRAMERS)}")
        self.name = framing
        self.max_message_size = max_message_size
        self._frame = self._FRAMERS[framing](max_message_size).prepareMessage

    def encode(self, message: bytes) -> bytes:
        if len(message) > self.max_message_size:
            raise ProtocolError(f"{len(message)} bytes, over the link's {self.max_message_size}")
        return self._frame(message)


Encoding = PhylloEncoding | FramedEncoding


@implementer(ITransport, IPushProducer)
class ReplayTransport:
    """The carrier a replay plays into: its protocol's writes are discarded and counted, and
    closing it stops the replay where it is."""

    disconnecting = False

    def __init__(self, endpoint: ReplayEndpoint, protocol: IProtocol) -> None:
        self.endpoint = endpoint
        self.protocol = protocol
        self.connected = True
        self.paused = False
        self._address = ReplayAddress(endpoint.options.path)
        self._closing: IDelayedCall | None = None

    def write(self, data: bytes) -> None:
        stats = self.endpoint.stats
        stats.writes_discarded += 1
        stats.bytes_discarded += len(data)

    def writeSequence(self, data: Iterable[bytes]) -> None:
        for part in data:
            self.write(part)

    def loseConnection(self) -> None:
        if not self.connected:
            return
        self.connected = False
        self.disconnecting = True
        self.endpoint._detach(self)
        # As a socket does: the protocol hears of it on a later turn, never inside its call.
        self._closing = self.endpoint.reactor.callLater(0, self._lost)

    abortConnection = loseConnection

    def _lost(self) -> None:
        self._closing = None
        self.protocol.connectionLost(Failure(ConnectionDone("the replay's carrier was closed")))

    def getPeer(self) -> ReplayAddress:
        return self._address

    def getHost(self) -> ReplayAddress:
        return self._address

    def registerProducer(self, producer: object, streaming: bool) -> None:
        pass  # writes never back up: they are discarded

    def unregisterProducer(self) -> None:
        pass

    # IPushProducer: the protocol pauses and resumes what it is given, as it would a socket.
    def pauseProducing(self) -> None:
        self.paused = True
        self.endpoint._cancel_timer()

    def resumeProducing(self) -> None:
        if self.paused:
            self.paused = False
            self.endpoint._resume()

    def stopProducing(self) -> None:
        self.loseConnection()


@implementer(IStreamClientEndpoint)
class ReplayEndpoint:
    """Plays the connection(s) `options` select, encoded by `encoding` (by default chosen from
    the capture: a Phyllo link's captured stack, else the captured framing, else length32).
    `protocol`, when given, is what the captured connection must have spoken. One carrier at a
    time; its position outlives the carrier (see the module's docstring)."""

    def __init__(self, reactor: IReactorTime, options: ReplayOptions,
                 encoding: Encoding | None = None, *, protocol: str | None = None) -> None:
        self.reactor = reactor
        self.options = options
        self.encoding = encoding
        self.protocol = protocol
        self.stats = ReplayStats()
        self.finished = False
        self.carrier: ReplayTransport | None = None
        self.selection: Captured | None = None
        self._cursor: RecordCursor | None = None
        self._records: Generator[Record | None, None, None] | None = None  # while playing
        self._selected: set[int] = set()
        self._pending: Record | None = None
        self._previous_ns: int | None = None
        self._anchor = 0.0  # when the previous record was due (reactor seconds)
        self._pass_began: float | None = None  # when this pass played its first record
        self._not_before = 0.0  # the next pass's first record, not sooner (loop=yes)
        self._said: set[str] = set()  # the files' problems logged
        self._in_pass = 0
        self._timer: IDelayedCall | None = None
        self._opening: defer.Deferred[None] | None = None  # the first connect's search
        self._finish_waiters: list[defer.Deferred[dict[str, int]]] = []

    def __repr__(self) -> str:
        return f"ReplayEndpoint({self.options.describe()})"

    def when_finished(self) -> defer.Deferred[dict[str, int]]:
        """Fires with `stats` once the last record has been played (never with loop=yes)."""
        if self.finished:
            return defer.succeed(self.stats.as_dict())
        waiter: defer.Deferred[dict[str, int]] = defer.Deferred()
        self._finish_waiters.append(waiter)
        return waiter

    # -- opening --------------------------------------------------------------------------------

    def prepare(self) -> Captured:
        """Find the capture's files and the selected connection (once), all at once; a
        `ReplayError` if they cannot be played as asked. `connect` does it a reactor turn at a
        time."""
        if self.selection is None:
            to_the_end(self._preparing())
        assert self.selection is not None
        return self.selection

    def _preparing(self) -> Steps[None]:
        paths = yield from capture_paths(self.options.path)
        selection = yield from find_selection(self.options, paths)
        if (self.protocol is not None and selection.protocol is not None
                and selection.protocol != self.protocol):
            raise ReplayError(
                f"replay: connection {selection.connection} of {self.options.path} spoke "
                f"{selection.protocol}; this link serves {self.protocol}")
        if self.selection is not None:  # found meanwhile by prepare(): keep its position
            return
        if self.encoding is None:
            self.encoding = default_encoding(self.options, selection)
        self.selection = selection
        self._cursor = RecordCursor(paths)
        if self.options.connection is not None:
            self._selected = {self.options.connection}

    def connect(self, protocolFactory: IProtocolFactory) -> defer.Deferred[IProtocol]:
        """The carrier, once the capture's files and the selected connection are found: on
        the first connect, a bounded part of the search each reactor turn (a directory of
        thousands of files does not hold the reactor)."""
        if self.selection is not None:
            return self._connected(protocolFactory)
        if self._opening is not None:
            return defer.fail(ReplayOpenFailed(
                string=f"{self.options.describe()} is opening on another carrier"))
        opening = self._opening = in_turns(self.reactor, self._preparing())

        def opened(_: None) -> defer.Deferred[IProtocol]:
            self._opening = None
            return self._connected(protocolFactory)

        def refused(failure: Failure) -> Failure:
            self._opening = None
            if failure.check(ReplayError):
                return Failure(ReplayOpenFailed(string=str(failure.value)))
            return failure

        return opening.addCallbacks(opened, refused)

    def _connected(self, protocolFactory: IProtocolFactory) -> defer.Deferred[IProtocol]:
        if self.carrier is not None:
            return defer.fail(ReplayOpenFailed(
                string=f"{self.options.describe()} is playing on another carrier"))
        address = ReplayAddress(self.options.path)
        protocol = protocolFactory.buildProtocol(address)
        if protocol is None:
            return defer.fail(ReplayOpenFailed(string="the protocol factory refused to connect"))
        carrier = self.carrier = ReplayTransport(self, protocol)
        self.stats.connections += 1
        protocol.makeConnection(carrier)
        if self.carrier is carrier and not self.finished:
            self._resume()
        return defer.succeed(protocol)

    # -- playing -------------------------------------------------------------------------------

    def _resume(self) -> None:
        """Play from the position on, the next record's wait counted from now."""
        self._anchor = self.reactor.seconds()
        self._schedule(0.0)

    def _schedule(self, delay: float) -> None:
        self._cancel_timer()
        self._timer = self.reactor.callLater(max(0.0, delay), self._play)

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _detach(self, carrier: ReplayTransport) -> None:
        if carrier is self.carrier:
            self.carrier = None
            self._cancel_timer()
            self._close_records()

    def _close_records(self) -> None:
        records, self._records = self._records, None
        if records is not None:
            records.close()  # closes the file it has open

    def _wanted(self, kind: int, connection: int) -> bool:
        if kind == Kind.OPEN:
            return self.options.link is not None or connection == self.options.connection
        return connection in self._selected and kind in (Kind.IN, Kind.CLOSE)

    def _next_record(self) -> Record | None | _Breath:
        """The next in record of a selected connection, None at the end of the capture, or
        BREATH after many records of other connections (go on next turn)."""
        if self._records is None:
            assert self._cursor is not None
            self._records = self._cursor.records(self._wanted)
        for record in self._records:
            if record is None:
                return BREATH
            if record.kind == Kind.IN:
                return record
            if self.options.link is None:
                continue
            if record.kind == Kind.OPEN and matches(self.options, record):
                if len(self._selected) < MAX_SELECTED:
                    self._selected.add(record.connection)
            elif record.kind == Kind.CLOSE:
                self._selected.discard(record.connection)
        self._close_records()
        return None

    def _play(self) -> None:
        self._timer = None
        carrier = self.carrier
        if carrier is None or carrier.paused or self.finished:
            return
        now = self.reactor.seconds()
        speed = self.options.speed
        wire: list[bytes] = []
        size = count = 0
        while True:
            record = self._pending
            if record is None:
                found = self._next_record()
                if isinstance(found, _Breath):
                    self._schedule(0.0)
                    break
                if found is None:
                    if not self._end_of_pass():
                        break
                    continue
                record = self._pending = found
            if speed is not None and self._previous_ns is not None:
                gap = max(0, record.timestamp_ns - self._previous_ns) / 1e9 / speed
                due = self._anchor + gap
                if due > now:
                    self._schedule(due - now)
                    break
                self._anchor = due
            else:
                if speed is not None and self._not_before > now:
                    self._schedule(self._not_before - now)
                    break
                self._anchor = now
            if self._pass_began is None:
                self._pass_began = now
            self._pending = None
            self._previous_ns = record.timestamp_ns
            part = self._encoded(record)
            wire.append(part)
            size += len(part)
            count += 1
            if count >= BURST_RECORDS or size >= BURST_BYTES:
                self._schedule(0.0)
                break
        if wire:
            self.stats.bytes += size
            # Last: the protocol may close the carrier in there, which cancels what is due.
            carrier.protocol.dataReceived(b"".join(wire))
        if self.finished:  # told once what was played has been delivered
            waiters, self._finish_waiters = self._finish_waiters, []
            for waiter in waiters:
                waiter.callback(self.stats.as_dict())

    def _encoded(self, record: Record) -> bytes:
        assert self.encoding is not None
        self.stats.records += 1
        self._in_pass += 1
        parts = []
        try:
            messages = record.messages()
        except ValueError:  # a batch that does not split: the record is damaged
            messages = []
            self.stats.unencodable += 1
        for message in messages:
            try:
                parts.append(self.encoding.encode(message))
            except (ProtocolError, ValueError):
                self.stats.unencodable += 1
                continue
            self.stats.messages += 1
        return b"".join(parts)

    def _end_of_pass(self) -> bool:
        """The capture is played through: True to go on (loop=yes, from the start)."""
        assert self._cursor is not None
        self.stats.passes += 1
        self.stats.skipped_records = self._cursor.skipped
        for problem in self._cursor.problems:  # each said once, a looped pass's too
            if problem in self._said or len(self._said) >= MAX_SAID:
                continue
            self._said.add(problem)
            log.warn("replay {what}: {problem}", event="replay_file_stopped",
                     what=self.options.describe(), problem=problem)
        self._cursor.stops.clear()
        played, self._in_pass = self._in_pass, 0
        if self.options.loop and played:
            self._cursor.rewind()
            self._previous_ns = None
            if self.options.speed is not None and self._pass_began is not None:
                self._not_before = self._pass_began + MIN_PASS_SECONDS / self.options.speed
            self._pass_began = None
            if self.options.link is not None:
                self._selected.clear()
            return True
        self.finished = True
        log.info("replay {what} ended: {messages} messages played; the carrier stays open",
                 event="replay_ended", what=self.options.describe(),
                 messages=self.stats.messages)
        return False


def default_encoding(options: ReplayOptions, selection: Captured) -> Encoding:
    """How a replay made without a link plays `selection`: a Phyllo link's messages over the
    stack asked for (else the captured one, else reduced), a framed stream's in its framing,
    anything else in length32."""
    if selection.phyllo or options.stack is not None:
        return PhylloEncoding(options.stack or selection.stack or "reduced")
    if selection.transport in FramedEncoding._FRAMERS:
        return FramedEncoding(selection.transport)
    return FramedEncoding("length32")


def replay_endpoint(reactor: IReactorTime, description: str) -> ReplayEndpoint:
    """The endpoint of a ``replay:`` string, its encoding chosen from the capture."""
    return ReplayEndpoint(reactor, parse_replay(description))


def phyllo_replay(reactor: IReactorTime, description: str, *, stack: str,
                  max_chunk_length: int = MAX_CHUNK_LENGTH,
                  max_frame_payload: int = MAX_FRAME_PAYLOAD) -> ReplayEndpoint:
    """A Phyllo link's ``replay:`` endpoint: its messages in the link's `stack` and limits."""
    options = parse_replay(description)
    if options.stack is not None and options.stack != stack:
        raise ReplayError(f"replay: stack={options.stack}, but the link's stack is {stack}: "
                          "leave stack= out, the link's own is used")
    return ReplayEndpoint(reactor, options, PhylloEncoding(
        stack, max_chunk_length=max_chunk_length, max_frame_payload=max_frame_payload),
        protocol="phyllo")


def attach_replay(reactor: IReactorTime, description: str, *, protocol: str, framing: str,
                  max_message_size: int = StreamOptions.max_message_size) -> ReplayEndpoint:
    """An attached link's ``replay:`` endpoint: `protocol`'s messages in the link's framing."""
    options = parse_replay(description)
    if options.stack is not None:
        raise ReplayError("replay: stack= is for a Phyllo link's replay, not an attached "
                          f"{protocol} link's")
    return ReplayEndpoint(reactor, options, FramedEncoding(framing, max_message_size),
                          protocol=protocol)


def replay_problem(description: str, *, protocol: str | None = None,
                   stack: str | None = None) -> str | None:
    """What is wrong with a ``replay:`` endpoint (a link of `protocol`, a Phyllo link's
    `stack`), read from the capture itself, or None."""
    from wireproto.phyllo.presets import PRESETS

    try:
        if stack in PRESETS:  # an unknown stack is the link's own problem
            endpoint = phyllo_replay(_NO_REACTOR, description, stack=stack)
        elif protocol is not None:
            endpoint = attach_replay(_NO_REACTOR, description, protocol=protocol,
                                     framing="length32")
        else:
            endpoint = replay_endpoint(_NO_REACTOR, description)
        endpoint.prepare()
    except ReplayError as error:
        return str(error).removeprefix("replay: ")
    return None


_NO_REACTOR = cast(IReactorTime, None)  # a check plays nothing


@implementer(IPlugin, IStreamClientEndpointStringParserWithReactor)
class ReplayEndpointParser:
    """The ``replay:`` prefix for `twisted.internet.endpoints.clientFromString`."""

    prefix = "replay"

    def parseStreamClient(self, reactor: IReactorCore, *args: object,
                          **kwargs: object) -> ReplayEndpoint:
        return ReplayEndpoint(cast(IReactorTime, reactor), options_from_fields(
            tuple(map(str, args)), {key: str(value) for key, value in kwargs.items()}))
