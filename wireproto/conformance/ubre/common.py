"""The UBRE kit's catalogue and what its cases share: sending UBRE in either format, reading
what the server sends (its topic announcements set aside), waiting until it has read what came
before, and judging a refusal (docs/conformance.md, "Writing a case").

UBRE has no acknowledgement, so a case knows the server has read its subscribe when the server
answers a request sent after it (docs/ubre.md, "The client"). A server that never answers is
judged by the request cases; the other cases then wait a little and go on.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import reprlib

from wireproto.codecs import ubre
from wireproto.codecs.ubre import (
    NO_BODY,
    Fail,
    Id,
    Message,
    Publish,
    Request,
    Subscribe,
    Success,
    Unsubscribe,
)
from wireproto.conformance.bounded import bounded
from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed
from wireproto.conformance.probe import Probe, Received, shown
from wireproto.errors import ProtocolError

__all__ = [
    "DECIDED", "BROKER", "FORMATS", "JSON_FORMAT", "BINARY_FORMAT", "kit", "json_bytes", "send",
    "send_json", "decoded", "next_message", "quiet", "sync", "subscriber", "expect_publish",
    "answer_to", "refused", "show", "alive", "still_serves",
]

kit = Catalogue("ubre", "UBRE", "docs/ubre.md")

# Where wireproto decided what the spec leaves open (docs/ubre.md headings).
DECIDED = "docs/ubre.md#what-we-decided"
BROKER = "docs/ubre.md#the-broker-wireprotos-ubre-server"
FORMATS = "docs/ubre.md#formats-and-transports"
# The spec's sections, as it names them.
JSON_FORMAT = "JSON Message Format"
BINARY_FORMAT = "Binary Message Format"

# How long a case waits for the answer that shows the server has read what came before.
SYNC_WAIT = 1.5
# What stands for that answer once a server has not given one.
UNANSWERED_WAIT = 0.2
# The ids of the kit's own requests (sync and refused), whose answers cases never look at.
SYNC = "conformance-sync-"
_ids = itertools.count(1)
# The runs whose server left a request unanswered (Context.run_id).
_unanswering: set[str] = set()
# The runs whose server answered one of them.
_answered: set[str] = set()


def json_bytes(value: object) -> bytes:
    """Compact JSON, UTF-8, as ubre.js writes it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def send(probe: Probe, message: Message, binary: bool = False) -> None:
    """Send `message` in the JSON format (a text frame) or the binary one (a binary frame)."""
    probe.send(ubre.encode(message, binary=binary), binary=binary)


def send_json(probe: Probe, value: object) -> None:
    """Send any JSON value as it is (what no codec would write, too) in a text frame."""
    probe.send(json_bytes(value), binary=False)


_short = reprlib.Repr()
_short.maxstring, _short.maxother, _short.maxlevel = 80, 120, 3


def show(value: object) -> str:
    """A value, shortened, for a case's reason (a message field by field, never written out
    whole first)."""
    if isinstance(value, (bytes, bytearray)) or (dataclasses.is_dataclass(value)
                                                 and not isinstance(value, type)):
        return bounded(value, 80)
    return _short.repr(value)


def decoded(received: Received) -> Message:
    """The message the server sent, read by wireproto's codec; CaseFailed if it does not
    decode."""
    try:
        return ubre.decode(received.data if received.binary else received.data.decode())
    except (ProtocolError, UnicodeDecodeError) as error:
        raise CaseFailed(f"the server sent what is not UBRE ({error}): {shown(received)}") \
            from None


def _announcement(message: Message) -> bool:
    """A message cases pass over: a server may say which topics it wants, as a ubre.js peer
    does (docs/ubre.md, "The broker"), and an answer to the kit's own sync requests (a second
    one, from a server that answers twice) is for the request cases to judge."""
    return isinstance(message, (Subscribe, Unsubscribe)) or (
        isinstance(message, (Success, Fail)) and isinstance(message.id, str)
        and message.id.startswith(SYNC))


async def next_message(probe: Probe, what: str, timeout: float | None = None,
                       announcements: bool = False) -> Message:
    """The next message the server sends, its subscribes and unsubscribes skipped unless
    `announcements`."""
    seconds = probe.receive_timeout if timeout is None else timeout
    deadline = probe.reactor.seconds() + seconds
    while True:
        left = max(0.001, deadline - probe.reactor.seconds())
        message = decoded(await probe.receive(left, what))
        if announcements or not _announcement(message):
            return message


async def quiet(probe: Probe, seconds: float, what: str) -> None:
    """Check that nothing but announcements comes within `seconds` (a close is not a
    message)."""
    deadline = probe.reactor.seconds() + seconds
    while True:
        if not probe.received:
            left = deadline - probe.reactor.seconds()
            if left <= 0 or probe.closed_as is not None:
                return
            try:
                await probe.silent(left, what)
            except CaseFailed:
                pass  # a message came: judged below
            if not probe.received:
                return
        message = decoded(probe.received.pop(0))
        if not _announcement(message):
            raise CaseFailed(f"expected {what}, but got {show(message)}")


def answer_to(message: Message, request_id: Id) -> bool:
    """Whether `message` answers the request `request_id` (same id, same JSON type)."""
    return isinstance(message, (Success, Fail)) and type(message.id) is type(request_id) \
        and message.id == request_id


async def sync(ctx: Context, probe: Probe, binary: bool = False) -> bool:
    """Wait until the server has read what this connection sent so far: it answers a request
    sent now. Messages that come meanwhile stay queued. False (and the case goes on) when no
    answer comes within SYNC_WAIT; from then on, in this run, a short wait stands for the
    answer, so that a server that never answers is judged in reasonable time."""
    if ctx.run_id in _unanswering:
        await ctx.sleep(UNANSWERED_WAIT)
        return False
    request_id = f"{SYNC}{next(_ids)}"
    send(probe, Request(request_id), binary)
    kept: list[Received] = []
    deadline = probe.reactor.seconds() + SYNC_WAIT
    try:
        while True:
            left = deadline - probe.reactor.seconds()
            if left <= 0:
                _unanswering.add(ctx.run_id)
                return False
            try:
                received = await probe.receive(left, "the answer to a request")
            except CaseFailed:
                if probe.closed_as is None:
                    _unanswering.add(ctx.run_id)
                return False
            try:
                message = ubre.decode(received.data if received.binary
                                      else received.data.decode())
            except (ProtocolError, UnicodeDecodeError):
                kept.append(received)
                continue
            if isinstance(message, (Success, Fail)) and str(message.id) == request_id:
                _answered.add(ctx.run_id)
                return True
            kept.append(received)
    finally:
        probe.received[0:0] = kept


async def still_serves(ctx: Context, probe: Probe, what: str) -> None:
    """Check that the connection is still open and, from a server that answers requests,
    that a request sent now is answered."""
    if not await sync(ctx, probe) and (ctx.run_id in _answered or not probe.is_open):
        raise CaseFailed(f"no answer to a request sent after {what}"
                         + ("; the connection closed" if not probe.is_open else ""))
    if not probe.is_open:
        raise CaseFailed(f"the server closed the connection after {what}")


async def subscriber(ctx: Context, topic: str, binary: bool = False,
                     body: object = NO_BODY) -> Probe:
    """A new connection subscribed to `topic`, once the server has read the subscribe."""
    probe = await ctx.connect()
    send(probe, Subscribe(topic, body), binary)
    await sync(ctx, probe, binary)
    return probe


async def expect_publish(probe: Probe, topic: str, timeout: float | None = None) -> Publish:
    """The next message, which must be a publish on `topic`."""
    message = await next_message(probe, f"the publish on {show(topic)}", timeout)
    if not isinstance(message, Publish) or message.topic != topic:
        raise CaseFailed(f"expected the publish on {show(topic)}, got {show(message)}")
    return message


async def refused(ctx: Context, probe: Probe, watcher: Probe | None = None,
                  topic: str | None = None) -> str:
    """Judge a message the server must not act on: it closes the connection, or ignores the
    message and answers a request sent after it; and `watcher`, subscribed to `topic`, gets
    nothing. Returns how the server refused, for the report."""
    if ctx.run_id in _unanswering and ctx.run_id not in _answered:
        # A server that answers no request: only a close, or nothing, can be seen.
        try:
            closed = await probe.closed(1.0)
        except CaseFailed:
            how = "ignored (the connection stayed open)"
        else:
            how = closed.described
        if probe.received:
            raise CaseFailed(f"the server acted on the message: it sent "
                             f"{show(decoded(probe.received[0]))}")
        if watcher is not None:
            await quiet(watcher, 0.3, f"no publish on {show(topic)}")
        return how
    request_id = f"conformance-after-{next(_ids)}"
    try:
        send(probe, Request(request_id))
    except CaseFailed:
        pass  # already closed
    how = ""
    deadline = ctx.reactor.seconds() + 3.0
    while not how:
        left = deadline - ctx.reactor.seconds()
        if left <= 0:
            raise CaseFailed("the server neither closed the connection nor answered a request "
                             "sent after the message within 3 s")
        try:
            message = await next_message(probe, "a close or an answer", left)
        except CaseFailed:
            if probe.closed_as is not None:
                how = probe.closed_as.described
                break
            raise CaseFailed("the server neither closed the connection nor answered a request "
                             "sent after the message within 3 s") from None
        if answer_to(message, request_id):
            how = "ignored (it answered the next request)"
        else:
            raise CaseFailed(f"the server acted on the message: it sent {show(message)}")
    if watcher is not None:
        await quiet(watcher, 0.3, f"no publish on {show(topic)}")
    return how


@kit.liveness
async def alive(ctx: Context) -> None:
    """A subscriber gets another connection's publish: the cheapest full round trip."""
    topic = ctx.topic("alive")
    listener = await subscriber(ctx, topic)
    publisher = await ctx.connect()
    send(publisher, Publish(topic, "alive"))
    message = await expect_publish(listener, topic)
    if message.body != "alive":
        raise ctx.fail(f"the publish came with the body {show(message.body)}, not 'alive'")
