"""The WEBSMQ kit's catalogue and what its cases share: frames built as the spec lays them out,
messages judged by decoding them with wireproto's codec, and a wait that knows when a server has
handled what a connection sent.

WEBSMQ has no acknowledgements, so a case cannot be told that a Subscribe took effect. `settle`
finds out instead: each connection subscribes to a topic of its own, and a helper connection
publishes there until every one has received it. A server handles one connection's frames in
order, so everything a connection sent before has been handled by then. Those "sync" publishes
are skipped wherever a case reads or waits for messages.
"""

from __future__ import annotations

import itertools
import struct

from wireproto.codecs import websmq
from wireproto.codecs.websmq import LastWill, Message, Publish, Subscribe, Unsubscribe
from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed
from wireproto.conformance.probe import Probe, Received, shown
from wireproto.errors import ProtocolError

__all__ = ["DECIDED", "kit"]

kit = Catalogue("websmq", "WEBSMQ WebSocket Message Queue", "docs/websmq.md")

# The docs/websmq.md headings where wireproto settled what the spec leaves open.
DECIDED = "docs/websmq.md#what-we-decided"
TOPICS = "docs/websmq.md#topics"
BROKER = "docs/websmq.md#the-broker"
WILDCARDS = "docs/websmq.md#wildcard-subscriptions-an-extension-off-by-default"

SYNC_MARK = "~sync-"  # in the topics `settle` uses, and no case's own
_sync_numbers = itertools.count(1)


def header(message_type: int, topic_length: int) -> bytes:
    """The two header bytes, for any type and length the 14 bits hold (the spec's "Header")."""
    return struct.pack("!H", (message_type & 3) << 14 | (topic_length & 0x3FFF))


def publish(topic: str, payload: bytes = b"") -> bytes:
    return websmq.encode(Publish(topic, payload))


def subscribe(topic: str, payload: bytes = b"") -> bytes:
    return websmq.encode(Subscribe(topic, payload))


def unsubscribe(topic: str, payload: bytes = b"") -> bytes:
    return websmq.encode(Unsubscribe(topic, payload))


def will(topic: str, payload: bytes = b"") -> bytes:
    return websmq.encode(LastWill(topic, payload))


def raw(message_type: int, topic: bytes, payload: bytes = b"") -> bytes:
    """A frame with any topic bytes, valid or not."""
    return header(message_type, len(topic)) + topic + payload


def judged(received: Received) -> Message:
    """The message a server sent, or CaseFailed saying why it is not one a broker may send:
    a text frame, bytes that are not WEBSMQ, or a Subscribe or Unsubscribe (the spec's
    "Message Type": the broker never sends those)."""
    if not received.binary:
        raise CaseFailed(f"the server sent a text frame ({shown(received)}): WEBSMQ frames are "
                         "binary")
    try:
        message = websmq.decode(received.data)
    except ProtocolError as error:
        raise CaseFailed(f"the server sent a frame that is not WEBSMQ ({error}): "
                         f"{shown(received)}") from None
    if isinstance(message, Subscribe | Unsubscribe):
        raise CaseFailed(f"the server sent a {type(message).__name__} frame "
                         f"({shown(received)}); a broker must never send one")
    return message


def _sync_topic(received: Received) -> bytes | None:
    """The topic of a sync publish (see `settle`), or None for any other message."""
    data = received.data
    if not received.binary or len(data) < 2 or data[0] >> 6 != 0:
        return None
    topic = data[2:2 + ((data[0] & 0x3F) << 8 | data[1])]
    return topic if SYNC_MARK.encode() in topic else None


def _is_sync(received: Received) -> bool:
    return _sync_topic(received) is not None


def _take_sync(probe: Probe, topic: str) -> bool:
    for index, received in enumerate(probe.received):
        if _sync_topic(received) == topic.encode():
            del probe.received[index]
            return True
    return False


def _drop_syncs(probe: Probe) -> None:
    probe.received[:] = [received for received in probe.received if not _is_sync(received)]


async def settle(ctx: Context, *probes: Probe, via: Probe | None = None,
                 timeout: float = 3.0) -> None:
    """Return once the server has handled every frame `probes` sent so far (see the module's
    doc); CaseFailed if a publish to a freshly subscribed topic does not arrive in time.

    The publishes come from `via` when given (the connection that publishes next in the case)
    or from a helper connection: a broker of several processes may learn of a subscription in
    one process a little later in another, so the path the case's own publishes take is the one
    to wait for."""
    topics = {}
    for probe in probes:
        topic = ctx.topic(f"{SYNC_MARK}{next(_sync_numbers)}")
        topics[probe] = topic
        probe.send(subscribe(topic))
    helper: Probe | None = None
    senders: dict[Probe, Probe] = {}
    for probe in probes:
        if via is None or probe is via:
            helper = helper or await ctx.connect()
            senders[probe] = helper
        else:
            senders[probe] = via
    deadline = ctx.reactor.seconds() + timeout
    waiting = dict(topics)
    while waiting:
        if ctx.reactor.seconds() > deadline:
            numbers = ", ".join(str(probe.number) for probe in waiting)
            raise CaseFailed(f"connection {numbers} subscribed to a topic, and another "
                             f"published on it for {timeout:g} s, but nothing arrived")
        for probe, topic in waiting.items():
            senders[probe].send(publish(topic, b"sync"))
        round_end = ctx.reactor.seconds() + 0.15
        while waiting and ctx.reactor.seconds() < round_end:
            for probe, topic in list(waiting.items()):
                if _take_sync(probe, topic):
                    del waiting[probe]
                elif probe.closed_as is not None:
                    raise CaseFailed(f"connection {probe.number} closed while the kit waited "
                                     f"for the server to handle its frames "
                                     f"({probe.closed_as.described})")
            await ctx.sleep(0.02)


async def next_message(probe: Probe, what: str, timeout: float | None = None) -> Message:
    """The next message the server sent `probe` (not a sync publish), judged."""
    while True:
        received = await probe.receive(timeout, what)
        if not _is_sync(received):
            return judged(received)


async def nothing(ctx: Context, probe: Probe, seconds: float, what: str) -> None:
    """CaseFailed if the server sends `probe` anything but sync publishes within `seconds`."""
    deadline = ctx.reactor.seconds() + seconds
    while True:
        _drop_syncs(probe)
        if probe.received:
            got = probe.received[0]
            try:
                message = judged(got)
            except CaseFailed as failed:
                raise CaseFailed(f"expected {what}, but {failed}") from None
            raise CaseFailed(f"expected {what}, but the server sent {described(message)}")
        if ctx.reactor.seconds() >= deadline:
            return
        await ctx.sleep(min(0.05, max(0.0, deadline - ctx.reactor.seconds())))


async def collect(ctx: Context, probe: Probe, seconds: float) -> list[Message]:
    """Every message (not sync) `probe` gets within `seconds`, judged."""
    await ctx.sleep(seconds)
    _drop_syncs(probe)
    messages = [judged(received) for received in probe.received]
    probe.received.clear()
    return messages


async def expect(probe: Probe, wanted: Message, what: str,
                 timeout: float | None = None) -> None:
    """The next message must be `wanted`, type, topic and payload."""
    got = await next_message(probe, what, timeout)
    if got != wanted:
        raise CaseFailed(f"expected {what}, {described(wanted)}, but got {described(got)}")


def described(message: Message) -> str:
    payload = message.payload
    shown_payload = repr(payload[:40]) + ("..." if len(payload) > 40 else "")
    topic = message.topic if len(message.topic) <= 60 else message.topic[:60] + "..."
    return (f"a {type(message).__name__} on {topic!r} ({len(message.topic)} bytes) with "
            f"{len(payload)} bytes of payload {shown_payload}")


async def refused(ctx: Context, frame: bytes, what: str, *, binary: bool = True,
                  timeout: float = 3.0) -> str:
    """Send `frame` on a fresh connection and expect the server to close that connection:
    WEBSMQ has no error message, so a close is the only refusal a client can see. Says how it
    closed."""
    probe = await ctx.connect()
    probe.send(frame, binary)
    closed = await probe.closed(timeout, f"the server to close the connection after {what}")
    _drop_syncs(probe)
    if probe.received:
        return f"{closed.described}, after sending {shown(probe.received[0])}"
    return closed.described
