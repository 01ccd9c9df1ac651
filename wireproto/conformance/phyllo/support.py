"""What the Phyllo device kit's cases share: the catalogue, the line to the device (its bytes cut
at each 0x00 delimiter and kept as they came), the stack the device speaks, and how its answers
are read and judged (docs/conformance.md, "Phyllo devices: the driver and results").

A device is judged through its driver (the contract in docs/conformance.md): it echoes every
message whose topic starts with ``echo``, answers each document on ``ping`` with a count on
``pong``, and each document on ``reply`` with ``"hello!"``. Every payload the kit sends holds a
nonce of the case's own, so that an answer left over from an earlier case is never taken for
this one's.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from twisted.internet import defer
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure

from wireproto.codecs.phyllo import (
    MINIMAL,
    REDUCED,
    Datagram,
    Document,
    PubSubMessage,
    Stack,
    ValidatedDatagram,
    decode_frame,
    deserialize,
    document_from_message,
    encode_frame,
    message_from_document,
    ray32sub8,
    serialize,
)
from wireproto.conformance.catalogue import CaseBody, Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level, NotApplicable
from wireproto.conformance.probe import Probe
from wireproto.errors import BadChecksum, ProtocolError
from wireproto.transports.base import IMessageTransport

__all__ = ["STACKS", "Answer", "Line", "case", "kit", "open_line", "stack_name"]

kit = Catalogue("phyllo", "Phyllo pub-sub (phyllo-pubsub.md)", "docs/phyllo.md",
                mode="device")

STACKS = {"minimal": MINIMAL, "reduced": REDUCED}
DEFAULT_STACK = "reduced"
# What the kit keeps of one chunk the device writes: well over the 255 a device may send, so an
# over-long chunk is judged; beyond it the rest, up to the next 0x00, is dropped and said.
LINE_LIMIT = 4096
MAX_CHUNK = 255
MAX_FRAME = 253
ANSWER_WAIT = 3.0  # how long a device has to answer one message
# How long a device has to echo once the line opens: a board that resets when its port opens
# (an Arduino does) is back within it. Each case's timeout leaves room for it.
SETTLE_WITHIN = 5.0
CASE_TIMEOUT = 10.0
QUIET_WAIT = 1.0  # how long the kit waits to see that a device does not answer
DELIMITER = b"\x00"


def case(id: str, title: str, *, section: str, level: Level = Level.MUST, decision: str = "",
         timeout: float = CASE_TIMEOUT, harmful: bool = False
         ) -> Callable[[CaseBody], CaseBody]:
    """`kit.case`, with a timeout that leaves room for the device to settle first."""
    return kit.case(id, title, section=section, level=level, decision=decision,
                    timeout=timeout, harmful=harmful)


def stack_name(ctx: Context) -> str:
    """The stack the device speaks: the target's `stack` (--stack), else its framing when that
    names a stack, else reduced."""
    target = ctx.target
    name = getattr(target, "stack", None) or (target.framing if target.framing in STACKS
                                              else DEFAULT_STACK)
    if name not in STACKS:
        raise CaseFailed(f"no Phyllo stack {name!r}: minimal or reduced")
    return name


def reduced_only(ctx: Context) -> None:
    if stack_name(ctx) != "reduced":
        raise NotApplicable("the minimal stack has no CRC")


class ChunkLine(Protocol):
    """A byte stream (serial port, pty, TCP) cut at each 0x00: each chunk goes to the probe as
    one message, with the delimiters it came with (``00 chunk 00``, or ``chunk 00`` when the
    device wrote no delimiter before it), and its COBS undecoded, for the cases to judge."""

    def __init__(self, probe: Probe) -> None:
        self.wrapped = probe
        self._partial = bytearray()
        self._after_empty = False  # the piece before this one was empty: a leading delimiter
        self._dropping = False
        self.overlong = 0
        self.closing = False

    def connectionMade(self) -> None:
        self.wrapped.makeConnection(cast(IMessageTransport, self))

    def dataReceived(self, data: bytes) -> None:
        if self.closing:
            return  # the kit closed the line: what is still in its buffers goes unread
        pieces = data.split(DELIMITER)
        tail = pieces.pop()
        for index, piece in enumerate(pieces):
            if index == 0:
                piece = bytes(self._partial) + piece
                self._partial.clear()
                if self._dropping:
                    self._dropping = False
                    self._after_empty = False
                    continue
            if not piece:
                self._after_empty = True
                continue
            led, self._after_empty = self._after_empty, False
            self.wrapped.messageReceived((DELIMITER if led else b"") + piece + DELIMITER, True)
            if self.closing:
                return
        if self._dropping:
            return
        self._partial += tail
        if len(self._partial) > LINE_LIMIT:
            self.overlong += 1
            self._partial.clear()
            self._dropping = True
            self.wrapped.recorder.add(self.wrapped.number, "event", text=(
                f"the device wrote over {LINE_LIMIT} bytes without a 0x00: the kit drops "
                "them up to the next delimiter"))

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.wrapped.connectionLost(reason)

    # What the probe asks of its transport

    def sendMessage(self, data: bytes, binary: bool = True) -> None:
        assert self.transport is not None
        self.transport.write(DELIMITER + data + DELIMITER)

    def loseConnection(self, error: object = None) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.loseConnection()

    def abortConnection(self) -> None:
        self.closing = True
        abort = getattr(self.transport, "abortConnection", None)
        if abort is not None:
            abort()
        else:
            self.loseConnection()


class _LineFactory(Factory):
    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def buildProtocol(self, addr: object) -> ChunkLine:
        return ChunkLine(self.probe)


@dataclass(frozen=True)
class Answer:
    """One chunk the device wrote, as it came (`wire`), and what it holds: `unit` when every
    layer of the stack reads it, else `error`; `led` whether a delimiter came before it;
    `topic_byte` the raw topic-length byte of a pub-sub message; `layer` where an unreadable
    chunk went wrong."""

    wire: bytes
    led: bool
    unit: PubSubMessage | Datagram | ValidatedDatagram | None
    error: str | None
    topic_byte: int | None
    layer: str  # where an unreadable chunk went wrong: chunk, frame, datagram or crc

    @property
    def message(self) -> PubSubMessage | None:
        return self.unit if isinstance(self.unit, PubSubMessage) else None

    def shown(self) -> str:
        if self.message is not None:
            return described(self.message)
        if self.unit is not None:
            return f"a layer message {self.unit!r}"
        return f"the chunk {self.wire[:48].hex(' ')}{'...' if len(self.wire) > 48 else ''}" \
               f" ({self.error})"


def described(message: PubSubMessage) -> str:
    payload = message.payload
    shown = payload[:40].hex(" ") + ("..." if len(payload) > 40 else "")
    return (f"a message of type 0x{message.payload_type:02x} on {message.topic!r} with "
            f"{len(payload)} payload bytes [{shown}]")


def judge(stack: Stack, wire: bytes) -> Answer:
    """What a chunk the device wrote holds, judged strictly: 255 bytes at most, COBS, a frame
    of 253 at most, each layer of `stack` (length, type, CRC), then the message."""
    led = wire.startswith(DELIMITER)
    chunk = wire.strip(DELIMITER)
    topic_byte = None
    if len(chunk) > MAX_CHUNK:
        return Answer(wire, led, None, f"a chunk of {len(chunk)} bytes, over {MAX_CHUNK}",
                      None, "chunk")
    try:
        decode_frame(chunk, MAX_FRAME)
    except ProtocolError as error:
        return Answer(wire, led, None, str(error), None, "frame")
    try:
        unit = stack.decode_chunk_layered(chunk)
    except ProtocolError as error:
        layer = "crc" if isinstance(error, BadChecksum) else "datagram"
        return Answer(wire, led, None, str(error), None, layer)
    if isinstance(unit, PubSubMessage):
        frame = decode_frame(chunk, len(chunk))
        topic_byte = frame[3 if stack is MINIMAL else 8]
    return Answer(wire, led, unit, None, topic_byte, "")



class ChunksSeen:
    """What a case read of a device, kept bounded however much the device writes: the first
    FIRST_KEPT chunks, the last, how many and the longest (the cases ask no more)."""

    FIRST_KEPT = 5

    def __init__(self) -> None:
        self.first: list[Answer] = []
        self.last: Answer | None = None
        self.count = 0
        self.longest = 0  # bytes of the longest chunk, delimiters aside

    def clear(self) -> None:
        self.first, self.last, self.count, self.longest = [], None, 0, 0

    def append(self, answer: Answer) -> None:
        if len(self.first) < self.FIRST_KEPT:
            self.first.append(answer)
        self.last = answer
        self.count += 1
        self.longest = max(self.longest, len(answer.wire.strip(b"\x00")))

    def __len__(self) -> int:
        return self.count

class Line:
    """The kit's end of the line to the device, in one case: it writes the stack's bytes (and
    any others), and reads the device's chunks as `Answer`s."""

    def __init__(self, ctx: Context, probe: Probe, stack: str, over_websocket: bool) -> None:
        self.ctx = ctx
        self.probe = probe
        self.stack_name = stack
        self.stack = STACKS[stack]
        self.over_websocket = over_websocket
        self.nonce = secrets.token_hex(3).encode()
        self.seen = ChunksSeen()  # what was read so far: its first and last, and counts
        self._count = 0

    def token(self, label: str = "") -> bytes:
        """A payload no other case (nor an earlier message of this one) sends."""
        self._count += 1
        return b"%s-%d%s" % (self.nonce, self._count, label.encode())

    def write(self, wire: bytes, text: str = "") -> None:
        """Bytes as they are. Over a WebSocket, each chunk between the delimiters goes as one
        binary message, and bytes that are no chunk cannot be written."""
        if not self.over_websocket:
            self.probe.send_raw(wire, text)
            return
        for piece in wire.split(DELIMITER):
            if piece:
                self.probe.send(piece)

    def send(self, message: PubSubMessage, text: str = "") -> None:
        self.write(self.stack.encode_layered(message), text)

    def send_document(self, topic: str, value: object, text: str = "") -> None:
        self.send(message_from_document(topic, serialize(value)), text)

    def frame(self, frame_payload: bytes) -> bytes:
        """The wire bytes of a frame payload (a datagram), however long, delimiters included."""
        return DELIMITER + encode_frame(frame_payload, max(1, len(frame_payload))) + DELIMITER

    def datagram(self, message: bytes, *, crc: int | None = None,
                 outer_type: int | None = None, inner_type: int = 0x60) -> bytes:
        """The frame payload of a message's bytes in this stack, with a wrong `crc` or datagram
        `outer_type` if given."""
        if self.stack is MINIMAL:
            return bytes([len(message) & 0xFF, 0x60 if outer_type is None else outer_type]) + \
                message
        body = bytes([inner_type]) + message
        check = ray32sub8(body) if crc is None else crc
        validated = check.to_bytes(4, "big") + body
        return bytes([len(validated) & 0xFF, 0x22 if outer_type is None else outer_type]) + \
            validated

    async def next(self, deadline: float, what: str) -> Answer | None:
        """The device's next chunk before `deadline` (reactor time), or None."""
        left = deadline - self.ctx.reactor.seconds()
        if left <= 0:
            return None
        try:
            received = await self.probe.receive(left, what)
        except CaseFailed:
            if self.probe.closed_as is not None:
                raise
            return None
        wire = received.data if not self.over_websocket else DELIMITER + received.data + \
            DELIMITER
        answer = judge(self.stack, wire)
        self.seen.append(answer)
        return answer

    async def answer(self, accept: Callable[[PubSubMessage], bool], what: str,
                     timeout: float = ANSWER_WAIT) -> Answer:
        """The first chunk whose message `accept` takes; others are noted and skipped.
        CaseFailed, saying what came instead, when none does within `timeout`."""
        deadline = self.ctx.reactor.seconds() + timeout
        skipped: list[Answer] = []  # the first few, for the reason: a device may flood
        while True:
            found = await self.next(deadline, what)
            if found is None:
                break
            if found.message is not None and accept(found.message):
                return found
            if len(skipped) < 3:
                skipped.append(found)
        raise CaseFailed(f"expected {what} within {timeout:g} s; "
                         + (f"got instead {', '.join(a.shown() for a in skipped[:3])}"
                            if skipped else "got nothing") + self._overlong())

    async def quiet(self, accept: Callable[[PubSubMessage], bool], what: str,
                    seconds: float = QUIET_WAIT) -> None:
        """CaseFailed if a chunk whose message `accept` takes comes within `seconds`."""
        deadline = self.ctx.reactor.seconds() + seconds
        while True:
            found = await self.next(deadline, what)
            if found is None:
                return
            if found.message is not None and accept(found.message):
                raise CaseFailed(f"expected no answer to {what}, but got {found.shown()}")

    def _overlong(self) -> str:
        line = self.probe.transport
        dropped = getattr(line, "overlong", 0)
        return f" (and {dropped} over-long chunks of over {LINE_LIMIT} bytes)" if dropped \
            else ""

    # The driver's endpoints

    async def echo(self, message: PubSubMessage, what: str = "its echo",
                   timeout: float = ANSWER_WAIT) -> Answer:
        """Send `message` and read its echo: the same type, topic and payload."""
        self.send(message, f"a message on {message.topic!r}")
        return await self.answer(lambda got: got == message, what, timeout)

    async def echo_judged(self, layers: set[str], what: str = "its echo") -> Answer:
        """Send a message on 'echo' and read its echo; CaseFailed at the first chunk before it
        that went wrong at one of `layers` (see `Answer.layer`)."""
        message = PubSubMessage(0x10, b"echo", self.token("judged"))
        self.send(message, "a message on 'echo'")
        deadline = self.ctx.reactor.seconds() + ANSWER_WAIT
        while True:
            found = await self.next(deadline, what)
            if found is None:
                seen = f"got {self.seen.last.shown()}" if self.seen.last else "got nothing"
                raise CaseFailed(f"expected {what} within {ANSWER_WAIT:g} s; {seen}")
            if found.message == message:
                return found
            if found.error is not None and found.layer in layers:
                raise CaseFailed(f"the device wrote {found.shown()}")

    async def settle(self, within: float = SETTLE_WITHIN) -> None:
        """Wait until the device echoes, sending a message on 'echo' every 0.5 s: a board that
        resets when its port opens answers nothing until it is back."""
        deadline = self.ctx.reactor.seconds() + within
        while True:
            message = PubSubMessage(0x10, b"echo", self.token("settle"))
            try:
                await self.echo(message, "the echo of a message on 'echo'", timeout=0.5)
                return
            except CaseFailed as failed:
                if self.ctx.reactor.seconds() > deadline or self.probe.closed_as is not None:
                    raise CaseFailed(f"the device did not echo within {within:g} s of the "
                                     f"line opening: {failed}") from None

    async def alive(self, what: str = "the echo of a message sent after it") -> None:
        """CaseFailed unless the device still echoes."""
        probe = PubSubMessage(0x10, b"echo", self.token("alive"))
        await self.echo(probe, what)

    async def ping(self) -> int:
        """Send a ping document; the count the device answers with on ``pong``."""
        self.send_document("ping", self.token("ping").decode(), "a document on 'ping'")
        found = await self.answer(lambda got: got.topic == b"pong", "a document on 'pong'")
        assert found.message is not None
        return pong_count(found.message)


def same_payload(message: PubSubMessage) -> Callable[[PubSubMessage], bool]:
    """Takes a message whose payload is `message`'s: its echo, whatever its topic or type."""
    return lambda got: got.payload == message.payload


def pong_count(message: PubSubMessage) -> int:
    try:
        document = document_from_message(message)
        value = deserialize(document)
    except (ProtocolError, ValueError) as error:
        raise CaseFailed(f"the answer on 'pong' is no readable document: {error} "
                         f"({described(message)})") from None
    if type(value) is not int or value < 0:
        raise CaseFailed(f"the document on 'pong' holds {value!r}, not a count of pings")
    return value


def as_document(message: PubSubMessage) -> Document:
    try:
        return document_from_message(message)
    except ProtocolError as error:
        raise CaseFailed(f"{described(message)} is no document: {error}") from None


async def open_line(ctx: Context, settle: bool = True) -> Line:
    """A recorded line to the device for this case: a stream endpoint (``serial:``, ``tcp:``,
    ``unix:``) cut into chunks by the kit itself, or a WebSocket whose binary messages are
    chunks; once the device echoes on it (`settle`), and what it wrote until then forgotten."""
    line = await _open(ctx)
    if settle:
        await line.settle()
        line.seen.clear()
    return line


async def _open(ctx: Context) -> Line:
    target = ctx.target
    stack = stack_name(ctx)
    if target.over_websocket:
        return Line(ctx, await ctx.connect(), stack, True)
    from wireproto.transports.connect import client_endpoint

    probe = Probe(ctx.recorder, ctx.reactor, target.receive_timeout, target.mask)
    ctx.probes.append(probe)
    factory = _LineFactory(probe)
    try:
        endpoint = client_endpoint(ctx.reactor, target.address, cafile=target.cafile,
                                   insecure=target.insecure, certfile=target.certfile,
                                   keyfile=target.keyfile)
        await endpoint.connect(factory)
    except defer.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - the reason goes to the report
        text = str(error).strip() or type(error).__name__
        ctx.recorder.add(probe.number, "event", text=f"could not open the line: {text}")
        raise CaseFailed(f"could not open the line to the device: {text}") from error
    return Line(ctx, probe, stack, False)
