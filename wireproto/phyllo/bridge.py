"""A Phyllo link joined to the hub: device topic ``temp`` on link ``dev1`` is hub topic
``phyllo/dev1/temp``, in both directions.

`HubBridge` lives as long as the link's configuration. Each time the carrier opens (the serial
port, the TCP stream, the WebSocket), it builds a new stack (`build_protocol` for a byte stream,
`build_message_protocol` for WebSocket binary) and puts a `BridgeLayer` on top of it. The bridge
holds one hub subscription, ``PREFIX/#``, for the life of the link.

Each carrier connection is also a message connection like any listener's: a `LinkTransport` (an
`IMessageTransport` whose messages are pub-sub messages in their minimal-stack bytes) under a
`BridgeConnection` (the `IMessageProtocol` that hands them to the bridge). So a service that
wraps every connection's protocol (capture does) wraps these too, through `protocol_wrapper`.
Without a wrapper, nothing needs the bytes: messages go between the stack and the bridge as
they are.

Topics: a device topic is bytes; it maps to the hub as its UTF-8 text after ``PREFIX/``. A topic
that is not UTF-8, is empty, or holds ``+``, ``#`` or NUL cannot be a hub topic: the message is
dropped and counted in `unmapped`. A hub topic maps back by removing ``PREFIX/`` (the prefix
itself maps to nothing, and a topic over 15 bytes cannot be said in Phyllo: `unmapped`).

Payloads, device to hub:

- a msgpack (0x11) or JSON (0x50) document becomes the compact JSON text of its value, as every
  JSON protocol (UBRE, nydus, SubbleSocket) writes a value into the hub; a bytes value becomes
  those bytes; a value JSON cannot say (bytes inside a map, for example) travels as its msgpack
  body;
- a CBOR document (0x12) travels as its body, and any other message (0x10 byte buffers and the
  rest) as its payload.

Payloads, hub to device, by the link's `send_format`:

- ``msgpack`` (default): a msgpack document of the payload's value: JSON text as that value,
  other UTF-8 as a string, other bytes as bin, an empty payload as nil;
- ``json``: a JSON document of the same value (a payload that is not UTF-8 is `unsendable`);
- ``bytes``: a 0x10 byte buffer holding the payload as it is.

Its health (`health()`: frames, bytes, CRC errors, resyncs, reopens, the last frame's time, the
port open now) is counted by the stack's bottom and summed here over every connection.

While the device is away, what the hub sends it is dropped and counted in `offline`, as MQTT
does at QoS 0. While the carrier's buffer is full (a serial line runs at ~11 KB/s), messages wait
in a queue of at most `queue_bytes`, and the oldest are dropped (`dropped`) to make room.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto.access import ANONYMOUS, Action, Grants, Policy, Principal
from wireproto.codecs import phyllo as phyllo_codec
from wireproto.codecs.phyllo.codes import TypeCode
from wireproto.codecs.phyllo.document import (
    Format,
    Schema,
    decode_document,
    deserialize,
    message_from_document,
    serialize,
)
from wireproto.codecs.phyllo.message import MAX_TOPIC_LENGTH, PubSubMessage
from wireproto.codecs.serialization import json_utf8
from wireproto.errors import ProtocolError
from wireproto.hub import DEFAULT_QUEUE_BYTES, Hub, HubMessage
from wireproto.payloads import value_from_payload
from wireproto.topics import hub_topic_error
from wireproto.transports.base import IMessageTransport, MessageProtocol

from .base import LayerBase
from .links import BottomHealth, ChunkedStream, MessageChunks
from .presets import build_stack

if TYPE_CHECKING:
    from wireproto.transports.base import IMessageProtocol

__all__ = [
    "BridgeLayer",
    "BridgeStats",
    "BridgeConnection",
    "LinkTransport",
    "HubBridge",
    "LinkHealth",
    "SEND_FORMATS",
    "carrier_port",
    "hub_topic_error",
]

log = Logger(namespace="wireproto.phyllo")

SEND_FORMATS = ("msgpack", "json", "bytes")
PROTOCOL_NAME = "phyllo"


@dataclass
class BridgeStats:
    """One link's traffic through the bridge, over every connection it has had."""

    connections: int = 0
    to_hub: int = 0
    """Device messages published into the hub."""
    to_device: int = 0
    """Hub messages sent to the device."""
    unmapped: int = 0
    """Messages whose topic has no counterpart on the other side."""
    unsendable: int = 0
    """Hub payloads the link's send format cannot carry (or too large for a frame)."""
    offline: int = 0
    """Hub messages for the device while it was away."""
    dropped: int = 0
    """Hub messages dropped from a full send queue (oldest first)."""
    denied: int = 0
    """Device messages on topics the link's principal may not publish on."""
    # The stack's own counters, summed over its layers and over every connection.
    crc_errors: int = 0
    framing_errors: int = 0
    type_errors: int = 0
    stack_dropped: int = 0
    """Units a layer's full receive queue dropped."""
    # The carrier's, as the stack's bottom counts them (`BottomHealth`).
    frames: int = 0
    """Chunks received (those the layers above then dropped included)."""
    bytes_received: int = 0
    bytes_sent: int = 0
    resyncs: int = 0
    """Over-long chunks dropped up to the next delimiter."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


_STACK_COUNTERS = {
    "crc_errors": "crc_errors",
    "framing_errors": "framing_errors",
    "type_errors": "type_errors",
    "dropped": "stack_dropped",
}

LinkHealth = dict[str, int | float | str | None]


def _add_bottom(totals: dict[str, int], bottom: LayerBase) -> None:
    """Add what the carrier's bottom layer counted to `totals` (BridgeStats fields)."""
    health = getattr(bottom, "health", None)
    if isinstance(health, BottomHealth):
        totals["frames"] += bottom.counters.received
        totals["bytes_received"] += health.bytes_received
        totals["bytes_sent"] += health.bytes_sent
        totals["resyncs"] += health.resyncs


class _Carrier(Protocol):
    def getPeer(self) -> object: ...


def carrier_port(transport: _Carrier) -> str | None:
    """What a link's carrier is open on: a serial port's device, else the peer's address."""
    try:
        peer = transport.getPeer()
    except Exception:  # a carrier that cannot say is still a carrier
        return None
    device = getattr(peer, "device", None)
    if isinstance(device, str):
        return device
    host, port = getattr(peer, "host", None), getattr(peer, "port", None)
    if host is not None and port is not None:
        return f"{host}:{port}"
    return None if peer is None else str(peer)


class BridgeLayer(LayerBase):
    """The top of a bridged stack: gives what the message link receives to the bridge."""

    name: ClassVar[str] = "hub bridge"

    # The wrapped message protocol this carrier connection delivers to, if the bridge has a
    # protocol_wrapper (see HubBridge.link_made); otherwise messages go to the bridge as they are.
    connection: IMessageProtocol | None = None

    def __init__(self, below: LayerBase, bridge: HubBridge) -> None:
        self.bridge = bridge
        super().__init__(below)

    def below_received(self, message: PubSubMessage) -> None:
        if self.connection is not None:
            self.connection.messageReceived(phyllo_codec.encode(message), True)
        else:
            self.bridge.from_device(message)

    def link_made(self) -> None:
        self.bridge.link_made(self)

    def link_lost(self, reason: Failure) -> None:
        super().link_lost(reason)
        self.bridge.link_lost(self, reason)

    def send(self, message: PubSubMessage) -> None:
        self.send_below(message)


def _message(data: bytes) -> PubSubMessage:
    """The pub-sub message in the minimal-stack bytes that `phyllo_codec.encode` wrote (those
    bytes never hold a datagram layer's own message)."""
    message = phyllo_codec.decode(data)
    assert isinstance(message, PubSubMessage)
    return message


class BridgeConnection(MessageProtocol):
    """A carrier connection's message protocol: each message is one pub-sub message from the
    device, in its minimal-stack bytes, for the bridge."""

    transport: IMessageTransport  # the link's, as the protocol wrapper gives it

    def __init__(self, bridge: HubBridge) -> None:
        self.bridge = bridge

    def messageReceived(self, data: bytes, binary: bool) -> None:
        self.bridge.from_device(_message(data))


@implementer(IMessageTransport)
class LinkTransport:
    """The top of a bridged stack as a message transport: each message is one pub-sub message
    in its minimal-stack bytes (`wireproto.codecs.phyllo.encode`), sent down the stack. Named,
    as capture names a transport, by its carrier: "stream" (a byte stream) or "chunks"
    (WebSocket binary messages, one chunk each)."""

    prepareKey = ("phyllo",)
    textOnly = False
    maxMessageSize = 1 << 16

    def __init__(self, top: BridgeLayer, carrier: Any) -> None:
        self.top = top
        self.carrier = carrier
        self.framing = "chunks" if isinstance(top.bottom, MessageChunks) else "stream"
        self.kind = getattr(carrier, "kind", "serial")

    def sendMessage(self, data: bytes, binary: bool = True) -> None:
        self.top.send(_message(data))

    def prepareMessage(self, data: bytes, binary: bool = True) -> bytes:
        return data

    def sendPrepared(self, prepared: bytes) -> None:
        self.sendMessage(prepared)

    def write(self, data: bytes) -> None:
        self.sendMessage(data)

    def loseConnection(self, error: ProtocolError | None = None) -> None:
        self.top.lose_connection()

    def abortConnection(self) -> None:
        self.top.lose_connection()

    def getPeer(self) -> Any:
        return self.carrier.getPeer() if self.carrier is not None else self.top.bridge.name

    def getHost(self) -> Any:
        return self.carrier.getHost() if self.carrier is not None else self.top.bridge.name

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        if self.carrier is not None:
            self.carrier.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        if self.carrier is not None:
            self.carrier.unregisterProducer()

    def pauseProducing(self) -> None:
        if self.carrier is not None:
            self.carrier.pauseProducing()

    def resumeProducing(self) -> None:
        if self.carrier is not None:
            self.carrier.resumeProducing()

    def stopProducing(self) -> None:
        self.top.lose_connection()


@implementer(IPushProducer)
class HubBridge:
    """Joins one Phyllo link (`name`, mounted at `prefix`) to `hub`, across reconnections."""

    def __init__(
        self,
        hub: Hub,
        name: str,
        *,
        prefix: str | None = None,
        stack: str = "reduced",
        send_format: str = "msgpack",
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
        protocol_wrapper: Callable[[IMessageProtocol], IMessageProtocol] | None = None,
        principal: str | None = None,
        **stack_limits: int,
    ) -> None:
        prefix = f"phyllo/{name}" if prefix is None else prefix
        problem = hub_topic_error(prefix)
        if problem is not None:
            raise ValueError(f"Phyllo link {name!r}: prefix {prefix!r} cannot be used: {problem}")
        if send_format not in SEND_FORMATS:
            raise ValueError(
                f"Phyllo link {name!r}: send_format must be one of {', '.join(SEND_FORMATS)}, "
                f"not {send_format!r}"
            )
        build_stack(stack)  # refuses an unknown preset now, not at the first connection
        self.hub = hub
        self.name = name
        self.prefix = prefix.rstrip("/")
        self.stack = stack
        self.send_format = send_format
        self.queue_bytes = queue_bytes
        self.stack_limits = stack_limits
        self.stats = BridgeStats()
        self.top: BridgeLayer | None = None
        # The device opened now (None while it is away), and the last frame of a closed one.
        self.port: str | None = None
        self._last_frame: float | None = None
        self._queue: deque[PubSubMessage] = deque()
        self._queued_bytes = 0
        self._paused = False
        self._link_waiters: list[Callable[[BridgeLayer], object]] = []
        self._subscription = hub.subscribe_callback(f"{self.prefix}/#", self.from_hub)
        # Wraps each carrier connection's message protocol, as the service wraps every
        # listener's (capture records the link as a connection of protocol "phyllo").
        self.protocol_wrapper = protocol_wrapper
        self.connection: IMessageProtocol | None = None
        # The protocol inside that wrapping: what goes to the device is sent through its transport.
        self._bridged: BridgeConnection | None = None
        # Who the device is, under the hub's policy (its grants follow a reloaded policy).
        self.principal = Principal(principal) if principal is not None else ANONYMOUS
        self._grants: tuple[Policy, Grants] | None = None

    def __repr__(self) -> str:
        return f"<HubBridge {self.name!r} at {self.prefix!r}>"

    @property
    def connected(self) -> bool:
        """Whether the device's link is open now."""
        return self.top is not None and self.top.lost_reason is None

    # -- building stacks ----------------------------------------------------------------------

    def build_protocol(self) -> ChunkedStream:
        """A new stack over a byte stream; its bottom is the Twisted protocol to connect."""
        bottom = ChunkedStream(**self._bottom_limits())
        self._build_on(bottom)
        return bottom

    def build_message_protocol(self) -> MessageChunks:
        """A new stack over WebSocket binary messages, one chunk per message."""
        bottom = MessageChunks(**self._bottom_limits())
        self._build_on(bottom)
        return bottom

    def _bottom_limits(self) -> dict[str, int]:
        limits = {}
        if "max_chunk_length" in self.stack_limits:
            limits["max_length"] = self.stack_limits["max_chunk_length"]
        if "max_queue" in self.stack_limits:
            limits["max_queue"] = self.stack_limits["max_queue"]
        return limits

    def _build_on(self, bottom: LayerBase) -> BridgeLayer:
        return BridgeLayer(build_stack(self.stack, bottom, **self.stack_limits), self)

    # -- the link's life ------------------------------------------------------------------------

    def link_made(self, top: BridgeLayer) -> None:
        if self.top is not None and self.top.lost_reason is None:
            log.warn("Phyllo link {link}: a second carrier opened; the newer one is used",
                     event="link_carrier_replaced", protocol="phyllo", link=self.name)
        self.top = top
        self.stats.connections += 1
        self._paused = False
        transport = getattr(top.bottom, "transport", None)
        self.port = None if transport is None else carrier_port(transport)
        if transport is not None:
            transport.registerProducer(self, True)
        if self.protocol_wrapper is not None:
            bridged = self._bridged = BridgeConnection(self)
            connection = self.protocol_wrapper(bridged)
            top.connection = self.connection = connection
            connection.makeConnection(LinkTransport(top, transport))
        log.info("Phyllo link {link} is up ({stack} stack, hub topics {prefix}/...)",
                 event="link_up", protocol=PROTOCOL_NAME, link=self.name, stack=self.stack,
                 prefix=self.prefix, connections=self.stats.connections)
        waiters, self._link_waiters = self._link_waiters, []
        for waiter in waiters:
            waiter(top)

    def link_lost(self, top: BridgeLayer, reason: Failure) -> None:
        for layer in top.layers():
            for field, total in _STACK_COUNTERS.items():
                value = getattr(layer.counters, field)
                setattr(self.stats, total, getattr(self.stats, total) + value)
        carried = dict.fromkeys(("frames", "bytes_received", "bytes_sent", "resyncs"), 0)
        _add_bottom(carried, top.bottom)
        for field, value in carried.items():
            setattr(self.stats, field, getattr(self.stats, field) + value)
        self._last_frame = self._latest_frame(top)
        if top is not self.top:
            return
        self.top = None
        self.port = None
        connection, self.connection, self._bridged = self.connection, None, None
        if connection is not None:
            connection.connectionLost(reason)
        lost = len(self._queue)
        self._queue.clear()
        self._queued_bytes = 0
        self.stats.offline += lost
        counts = self.counters()
        log.info("Phyllo link {link} is down: {reason} ({to_hub} to the hub, {to_device} to the "
                 "device so far)", event="link_down", protocol=PROTOCOL_NAME, link=self.name,
                 reason=reason.getErrorMessage(), to_hub=counts["to_hub"],
                 to_device=counts["to_device"], crc_errors=counts["crc_errors"],
                 framing_errors=counts["framing_errors"], dropped=counts["dropped"])

    def when_up(self, callback: Callable[[BridgeLayer], object]) -> None:
        """Call `callback(top)` when the link is next up (now, if it is)."""
        if self.top is not None:
            callback(self.top)
        else:
            self._link_waiters.append(callback)

    def counters(self) -> dict[str, int]:
        """`stats`, with the counters of the stack now open added in."""
        totals = self.stats.as_dict()
        if self.top is not None:
            for layer in self.top.layers():
                for field, total in _STACK_COUNTERS.items():
                    totals[total] += getattr(layer.counters, field)
            _add_bottom(totals, self.top.bottom)
        return totals

    def _latest_frame(self, top: BridgeLayer | None) -> float | None:
        # The connection's own, once it has had a frame: it came after any of an earlier one
        # (whatever the clock did meanwhile).
        health = None if top is None else getattr(top.bottom, "health", None)
        now = health.last_chunk_at if isinstance(health, BottomHealth) else None
        return self._last_frame if now is None else now

    @property
    def last_frame(self) -> float | None:
        """Unix time of the last frame (chunk) the device sent, over every connection."""
        return self._latest_frame(self.top)

    def health(self) -> LinkHealth:
        """The device's health, over every connection the link has had: `frames` (chunks
        received), `bytes_received`, `bytes_sent`, `crc_errors`, `resyncs` (over-long chunks
        dropped up to the next delimiter), `reopens` (opens after the first), `last_frame` (Unix
        time of the last chunk, or None) and `port` (what is open now, or None)."""
        counts = self.counters()
        return {
            "frames": counts["frames"],
            "bytes_received": counts["bytes_received"],
            "bytes_sent": counts["bytes_sent"],
            "crc_errors": counts["crc_errors"],
            "resyncs": counts["resyncs"],
            "reopens": max(0, counts["connections"] - 1),
            "last_frame": self.last_frame,
            "port": self.port if self.connected else None,
        }

    def close(self) -> None:
        """Stop taking hub messages; the carrier is closed by whoever opened it."""
        self._subscription.cancel()
        if self.top is not None and self.top.lost_reason is None:
            self.top.lose_connection()

    # -- device to hub --------------------------------------------------------------------------

    def from_device(self, message: PubSubMessage) -> None:
        problem: str | None
        try:
            topic = message.topic.decode("utf-8")
        except UnicodeDecodeError:
            topic, problem = repr(message.topic), "it is not UTF-8"
        else:
            problem = hub_topic_error(topic)
        if problem is not None:
            self.stats.unmapped += 1
            log.warn("Phyllo link {link}: device topic {topic} cannot be a hub topic: {problem}",
                     event="link_unmapped", protocol="phyllo", link=self.name, topic=topic,
                     problem=problem)
            return
        hub_topic = f"{self.prefix}/{topic}"
        if not self._may_publish(hub_topic):
            return
        self.stats.to_hub += 1
        self.hub.publish(HubMessage(
            hub_topic, hub_payload(message), sender=self._subscription, protocol=PROTOCOL_NAME,
        ))

    def _may_publish(self, topic: str) -> bool:
        policy = self.hub.policy
        if self._grants is None or self._grants[0] is not policy:
            self._grants = (policy, policy.grants(self.principal))
        if self._grants[1].allows(Action.PUBLISH, topic):
            return True
        self.stats.denied += 1
        self.hub.note_denial(PROTOCOL_NAME, Action.PUBLISH.value, topic, self.principal.name,
                             f"phyllo/{self.name}", link=self.name)
        return False

    # -- hub to device --------------------------------------------------------------------------

    def from_hub(self, hub_message: HubMessage) -> None:
        suffix = hub_message.topic[len(self.prefix) + 1 :].encode("utf-8")
        if not suffix or len(suffix) > MAX_TOPIC_LENGTH:
            self.stats.unmapped += 1
            log.debug("Phyllo link {link}: hub topic {topic!r} has no device topic",
                      event="link_unmapped", protocol="phyllo", link=self.name,
                      topic=hub_message.topic, problem="it has no device topic")
            return
        message = device_message(suffix, hub_message.payload, self.send_format)
        if message is None:
            self.stats.unsendable += 1
            log.warn("Phyllo link {link}: a payload on {topic!r} cannot be sent as {send_format}",
                     event="link_unsendable", protocol="phyllo", link=self.name,
                     topic=hub_message.topic, send_format=self.send_format)
            return
        if self.top is None:
            self.stats.offline += 1
            return
        if self._paused or self._queue:
            self._enqueue(message)
        else:
            self._send(message)

    def _send(self, message: PubSubMessage) -> None:
        assert self.top is not None
        try:
            bridged = self._bridged
            if bridged is None:
                self.top.send(message)
            else:
                bridged.transport.sendMessage(phyllo_codec.encode(message), True)
        except ProtocolError as error:  # larger than a frame or chunk can hold
            self.stats.unsendable += 1
            log.warn("Phyllo link {link}: cannot send on {topic!r}: {error}",
                     event="link_unsendable", protocol="phyllo", link=self.name,
                     topic=message.topic, error=error)
            return
        self.stats.to_device += 1

    def _enqueue(self, message: PubSubMessage) -> None:
        size = len(message.topic) + len(message.payload)
        self._queue.append(message)
        self._queued_bytes += size
        while self._queued_bytes > self.queue_bytes and len(self._queue) > 1:
            oldest = self._queue.popleft()
            self._queued_bytes -= len(oldest.topic) + len(oldest.payload)
            self.stats.dropped += 1

    # -- IPushProducer: the carrier's buffer is full, or has drained -----------------------------

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        while self._queue and not self._paused and self.top is not None:
            message = self._queue.popleft()
            self._queued_bytes -= len(message.topic) + len(message.payload)
            self._send(message)

    def stopProducing(self) -> None:
        self._paused = True


def hub_payload(message: PubSubMessage) -> bytes:
    """What a device message carries into the hub (module docstring)."""
    if message.payload_type != TypeCode.DOCUMENT:
        return message.payload
    try:
        document = decode_document(message.payload)
    except ProtocolError:
        return message.payload
    if document.format not in (Format.MSGPACK, Format.JSON):
        return document.body
    try:
        value = deserialize(document)
    except ProtocolError:
        return document.body
    if isinstance(value, bytes):
        return value
    try:
        return json_utf8(value)
    except ProtocolError:
        return document.body


def device_message(topic: bytes, payload: bytes, send_format: str) -> PubSubMessage | None:
    """The message a hub payload becomes for the device, or None if the format cannot carry it."""
    if send_format == "bytes":
        return PubSubMessage(TypeCode.BYTES_BUFFER, topic, payload)
    value = value_from_payload(payload)
    if send_format == "json":
        if isinstance(value, bytes):
            return None
        document = serialize(value, Format.JSON, Schema.SCHEMALESS)
    else:
        document = serialize(value, Format.MSGPACK, Schema.SCHEMALESS)
    return message_from_document(topic, document)
