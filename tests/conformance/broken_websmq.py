"""Deliberately broken WEBSMQ brokers for the kit's tests: one small broker, on a WebSocket and a
length32 listener on 127.0.0.1, right in every way but the `Faults` it is given. With no faults
it is a plain conforming broker (exact topics, no echo, a will on every disconnect, a malformed
frame closes its connection), the control the broken ones are compared with."""

from __future__ import annotations

from dataclasses import dataclass

from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.interfaces import IListeningPort
from twisted.python.failure import Failure

from wireproto.codecs import websmq
from wireproto.codecs.websmq import LastWill, Message, Publish, Subscribe, Unsubscribe
from wireproto.errors import BadEncoding, ProtocolError
from wireproto.transports.base import MessageProtocol
from wireproto.transports.stream import StreamOptions, stream_server_factory
from wireproto.transports.websocket import WebSocketOptions
from wireproto.transports.websocket_http import websocket_resource, websocket_site


@dataclass(frozen=True)
class Faults:
    echo: bool = False  # a publish goes back to its sender too
    forward_control: bool = False  # Subscribe and Unsubscribe frames go to the subscribers
    no_will: bool = False  # never publishes a will
    will_as_publish: bool = False  # a will goes out with the Publish (00) type
    ignore_unsubscribe: bool = False
    lenient_topics: bool = False  # takes any topic bytes, even empty or not ASCII
    one_byte_length: bool = False  # reads the topic length from the header's second byte only
    payload_cut: int | None = None  # delivers at most this many bytes of payload
    payload_padding: int = 0  # delivers the payload with this many bytes after it
    crash_on_short: bool = False  # a frame under 2 bytes stops the whole server
    hang_on_malformed: bool = False  # a malformed frame: reads nothing more, never closes
    drop_all_on_malformed: bool = False  # a malformed frame closes every connection
    delivers_nothing: bool = False  # takes every frame, sends none
    text_frames: bool = False  # delivers publishes as WebSocket text frames
    max_message_size: int = 1 << 20  # the limit its transports enforce


class BrokenBroker:
    def __init__(self, faults: Faults = Faults()) -> None:
        self.faults = faults
        self.subscribers: dict[str, list[Connection]] = {}
        self.connections: set[Connection] = set()
        self.ports: list[IListeningPort] = []

    async def start(self) -> dict[str, str]:
        """Listen; the addresses by transport, "ws" and "stream"."""
        limit = self.faults.max_message_size
        site = websocket_site({"/websmq": websocket_resource(
            lambda: Connection(self), WebSocketOptions(max_message_size=limit))})
        stream = stream_server_factory(
            lambda: Connection(self), StreamOptions(framing="length32", max_message_size=limit))
        for factory in (site, stream):
            endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
            self.ports.append(await endpoint.listen(factory))
        ws, tcp = (getattr(port.getHost(), "port") for port in self.ports)  # noqa: B009
        return {"ws": f"ws://127.0.0.1:{ws}/websmq", "stream": f"tcp:127.0.0.1:{tcp}"}

    async def stop(self) -> None:
        for port in self.ports:
            await port.stopListening()
        self.ports = []
        for connection in list(self.connections):
            connection.transport.abortConnection()

    def crash(self) -> None:
        """What a crashed process looks like from outside: nothing listens, every connection
        is gone."""
        for port in self.ports:
            port.stopListening()
        self.ports = []
        for connection in list(self.connections):
            connection.transport.abortConnection()

    def fan_out(self, message: Message, sender: Connection) -> None:
        if self.faults.delivers_nothing:
            return
        topic = message.topic.encode("latin-1")  # not validated again: lenient_topics
        frame = websmq.encode_header(message.message_type, len(topic)) + topic + message.payload
        for connection in list(self.subscribers.get(message.topic, ())):
            if connection is not sender or self.faults.echo:
                connection.deliver(frame)


class Connection(MessageProtocol):
    def __init__(self, broker: BrokenBroker) -> None:
        self.broker = broker
        self.will: LastWill | None = None
        self.deaf = False

    def connectionMade(self) -> None:
        self.broker.connections.add(self)

    def deliver(self, frame: bytes) -> None:
        faults = self.broker.faults
        if faults.payload_cut is not None:
            end = 2 + (frame[0] << 8 & 0x3F00 | frame[1])
            frame = frame[:end + faults.payload_cut]
        frame += b"\xe5" * faults.payload_padding
        self.transport.sendMessage(frame, not faults.text_frames)

    def _decode(self, data: bytes, binary: bool) -> Message:
        faults = self.broker.faults
        if not binary:
            raise BadEncoding("a text frame")
        if len(data) >= 2 and (faults.lenient_topics or faults.one_byte_length):
            length = data[1] if faults.one_byte_length else (data[0] & 0x3F) << 8 | data[1]
            if 2 + length <= len(data):
                kind = (Publish, Subscribe, Unsubscribe, LastWill)[data[0] >> 6]
                topic = data[2:2 + length].decode("latin-1")
                if faults.one_byte_length:
                    websmq.validate_topic(topic)
                return kind(topic, data[2 + length:])
        return websmq.decode(data)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        faults, broker = self.broker.faults, self.broker
        if self.deaf:
            return
        if len(data) < 2 and faults.crash_on_short:
            broker.crash()
            return
        try:
            message = self._decode(data, binary)
        except ProtocolError:
            if faults.hang_on_malformed:
                self.deaf = True
            elif faults.drop_all_on_malformed:
                for connection in list(broker.connections):
                    connection.transport.loseConnection()
            else:
                self.transport.loseConnection()
            return
        topic = message.topic
        if isinstance(message, Publish):
            broker.fan_out(message, self)
        elif isinstance(message, Subscribe):
            if faults.forward_control:
                broker.fan_out(message, self)
            if self not in broker.subscribers.setdefault(topic, []):
                broker.subscribers[topic].append(self)
        elif isinstance(message, Unsubscribe):
            if faults.forward_control:
                broker.fan_out(message, self)
            if not faults.ignore_unsubscribe and self in broker.subscribers.get(topic, []):
                broker.subscribers[topic].remove(self)
        else:
            self.will = message

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        broker = self.broker
        broker.connections.discard(self)
        for subscribers in broker.subscribers.values():
            if self in subscribers:
                subscribers.remove(self)
        if self.will is not None and not broker.faults.no_will:
            will = self.will
            if broker.faults.will_as_publish:
                broker.fan_out(Publish(will.topic, will.payload), self)
            else:
                broker.fan_out(will, self)
