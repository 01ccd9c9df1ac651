"""The bare WEBSMQ brokers that bench/pubsub.py measures wireproto against.

Each does the least a WEBSMQ broker must (docs/websmq.md): read the two-byte header far
enough to tell Subscribe, Unsubscribe and Publish apart and to find the topic, keep a dict of topic
to subscribed connections, and forward a Publish byte for byte to every other subscriber, framed
once for all of them. No topic validation, no last will, no queue limits: a floor, not a broker.

    python bench/_pubsub_brokers.py forwarder --listen tcp:0:interface=127.0.0.1
    python bench/_pubsub_brokers.py autobahn --listen tcp:0:interface=127.0.0.1

`forwarder` speaks WEBSMQ over a 4-byte big-endian length prefix (Twisted's
Int32StringReceiver); `autobahn` speaks WEBSMQ over WebSocket at path /websmq, fanning out with
`prepareMessage` and `sendPreparedMessage`. Each prints one line per listener, flushed, in the
form the wireproto CLI uses, so that the bench parses every broker's address the same way:

    bare-forwarder: websmq over length32 on tcp:127.0.0.1:PORT
    bare-autobahn: websmq over ws on ws://127.0.0.1:PORT/websmq
"""

from __future__ import annotations

import argparse
import struct
import sys
from collections.abc import Callable
from typing import Any

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.types import ConnectionDeny
from twisted.internet import reactor
from twisted.internet.endpoints import serverFromString
from twisted.internet.protocol import Factory
from twisted.protocols.basic import Int32StringReceiver

_HEADER = struct.Struct(">H")
_LENGTH = struct.Struct(">I")
PUBLISH, SUBSCRIBE, UNSUBSCRIBE = 0, 1, 2
WEBSOCKET_PATH = "/websmq"


class Topics:
    """topic bytes -> the connections subscribed to it, shared by one listener's connections."""

    def __init__(self) -> None:
        self.subscribers: dict[bytes, set[Any]] = {}

    def handle(self, connection: Any, frame: bytes, fan_out: Callable[[list, bytes], None]) -> bool:
        """Act on one WEBSMQ frame; False if it is too short to be one."""
        if len(frame) < 2:
            return False
        (header,) = _HEADER.unpack_from(frame)
        kind = header >> 14
        topic = frame[2 : 2 + (header & 0x3FFF)]
        if kind == PUBLISH:
            peers = self.subscribers.get(topic)
            if peers:
                fan_out([peer for peer in peers if peer is not connection], frame)
        elif kind == SUBSCRIBE:
            self.subscribers.setdefault(topic, set()).add(connection)
        elif kind == UNSUBSCRIBE:
            self.subscribers.get(topic, set()).discard(connection)
        return True

    def drop(self, connection: Any) -> None:
        for peers in self.subscribers.values():
            peers.discard(connection)


class ForwarderProtocol(Int32StringReceiver):
    topics: Topics

    def stringReceived(self, frame: bytes) -> None:
        if not self.topics.handle(self, frame, self._fan_out):
            self.transport.loseConnection()

    @staticmethod
    def _fan_out(peers: list, frame: bytes) -> None:
        framed = _LENGTH.pack(len(frame)) + frame  # framed once, written to every peer
        for peer in peers:
            peer.transport.write(framed)

    def connectionLost(self, reason: Any = None) -> None:
        self.topics.drop(self)


class BroadcasterProtocol(WebSocketServerProtocol):
    topics: Topics

    def onConnect(self, request: Any) -> None:
        if request.path != WEBSOCKET_PATH:
            raise ConnectionDeny(404, f"WEBSMQ is served at {WEBSOCKET_PATH}")

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        if not self.topics.handle(self, payload, self._fan_out):
            self.sendClose(1002, "a WEBSMQ frame needs a two-byte header")

    def _fan_out(self, peers: list, frame: bytes) -> None:
        prepared = self.factory.prepareMessage(frame, isBinary=True)
        for peer in peers:
            peer.sendPreparedMessage(prepared)

    def onClose(self, wasClean: bool, code: Any, reason: Any) -> None:
        self.topics.drop(self)


def forwarder_factory() -> Factory:
    protocol = type("Forwarder", (ForwarderProtocol,), {"topics": Topics()})
    return Factory.forProtocol(protocol)


def broadcaster_factory() -> WebSocketServerFactory:
    factory = WebSocketServerFactory()
    factory.protocol = type("Broadcaster", (BroadcasterProtocol,), {"topics": Topics()})
    return factory


BROKERS = {
    # name: (factory, carrier, how to show the listening address)
    "forwarder": (forwarder_factory, "length32", lambda a: f"tcp:{a.host}:{a.port}"),
    "autobahn": (
        broadcaster_factory, "ws", lambda a: f"ws://{a.host}:{a.port}{WEBSOCKET_PATH}"
    ),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("broker", choices=sorted(BROKERS))
    parser.add_argument("--listen", action="append", required=True,
                        help="a Twisted server endpoint, e.g. tcp:0:interface=127.0.0.1")
    args = parser.parse_args(argv)
    make_factory, carrier, show = BROKERS[args.broker]

    def announce(port: Any) -> None:
        print(f"bare-{args.broker}: websmq over {carrier} on {show(port.getHost())}", flush=True)

    def fail(failure: Any) -> None:
        print(f"bare-{args.broker}: cannot listen: {failure.getErrorMessage()}", file=sys.stderr)
        reactor.stop()

    for description in args.listen:
        d = serverFromString(reactor, description).listen(make_factory())
        d.addCallbacks(announce, fail)
    reactor.run()


if __name__ == "__main__":
    main()
