"""A small WEBSMQ catalogue of the kit's own tests, one case of each kind (a MUST met and one not,
a SHOULD not met, an information case, a harmful case, a case that never ends, one that reports
what the server sent), so that the runner, the report and the command are tested against a real
broker without the protocol kits; and `ToyServer`, a WEBSMQ server of a few lines that the tests
make misbehave: it dies on a poison message, floods, or sends hostile bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint

from wireproto.codecs import websmq
from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level
from wireproto.conformance.probe import shown
from wireproto.transports.base import MessageProtocol
from wireproto.transports.websocket import websocket_server_factory

kit = Catalogue("websmq", "WEBSMQ", "docs/websmq.md")
POISON = b"\xde\xad"  # ToyServer(dies=True) stops serving when it receives this message


async def _round_trip(ctx: Context, name: str, payload: bytes) -> bytes:
    subscriber, publisher = await ctx.connect(), await ctx.connect()
    topic = ctx.topic(name)
    subscriber.send(websmq.encode(websmq.Subscribe(topic)))
    await ctx.sleep(0.2)  # WEBSMQ acknowledges no subscription
    publisher.send(websmq.encode(websmq.Publish(topic, payload)))
    got = await subscriber.receive_matching(lambda message: message.binary, what="the publish")
    message = websmq.decode(got.data)
    if not isinstance(message, websmq.Publish) or message.topic != topic:
        raise ctx.fail(f"expected the publish on {topic}, got {shown(got)}")
    return message.payload


@kit.liveness
async def alive(ctx: Context) -> None:
    await _round_trip(ctx, "alive", b"x")


@kit.case("websmq.sample.delivered", "A publish reaches a subscriber whole",
          section="Message format")
async def delivered(ctx: Context) -> None:
    payload = await _round_trip(ctx, "whole", b"hello")
    if payload != b"hello":
        raise ctx.fail(f"the payload came as {payload!r}")


@kit.case("websmq.sample.echo-back", "A publisher hears nothing of its own publish on a topic "
          "it does not subscribe to", section="Message format", level=Level.SHOULD,
          decision="docs/websmq.md#what-we-decided")
async def echo_back(ctx: Context) -> None:
    probe = await ctx.connect()
    probe.send(websmq.encode(websmq.Publish(ctx.topic("lone"), b"x")))
    await probe.silent(0.3, "nothing")


@kit.case("websmq.sample.never-answers", "A lone subscriber receives a message nobody sent",
          section="Message format", level=Level.SHOULD)
async def never_answers(ctx: Context) -> None:
    probe = await ctx.connect()
    probe.send(websmq.encode(websmq.Subscribe(ctx.topic("empty"))))
    await probe.receive(timeout=0.3, what="a message nobody sent")


@kit.case("websmq.sample.impossible", "A subscriber receives a message nobody sent",
          section="Message format")
async def impossible(ctx: Context) -> None:
    probe = await ctx.connect()
    probe.send(websmq.encode(websmq.Subscribe(ctx.topic("nothing"))))
    await probe.receive(timeout=0.3, what="a message nobody sent")


@kit.case("websmq.sample.own-publish", "Whether a publish reaches its own subscribed publisher",
          section="Message format", level=Level.INFORMATION)
async def own_publish(ctx: Context) -> str:
    probe = await ctx.connect()
    topic = ctx.topic("own")
    probe.send(websmq.encode(websmq.Subscribe(topic)))
    await ctx.sleep(0.2)
    probe.send(websmq.encode(websmq.Publish(topic, b"mine")))
    try:
        got = await probe.receive(timeout=0.5, what="its own publish")
    except CaseFailed:
        return "delivered to its own publisher: no"
    return f"delivered to its own publisher: yes ({shown(got)})"


@kit.case("websmq.sample.poison", "A message of two unknown bytes closes that connection alone",
          section="Message format", harmful=True)
async def poison(ctx: Context) -> None:
    probe = await ctx.connect()
    probe.send(POISON)
    await probe.closed(what="the connection closed for a bad header")


@kit.case("websmq.sample.stuck", "The kit's own case that never ends", section="Message format",
          level=Level.SHOULD, timeout=0.5)
async def stuck(ctx: Context) -> None:
    await ctx.connect()
    await ctx.sleep(30)


@kit.case("websmq.sample.hostile", "The server's first message, whatever it is, is reported",
          section="Message format", level=Level.INFORMATION)
async def hostile(ctx: Context) -> str:
    probe = await ctx.connect()
    probe.send(websmq.encode(websmq.Subscribe(ctx.topic("hostile"))))
    got = await probe.receive(timeout=0.5, what="the server's first message")
    raise ctx.fail(f"the server sent {got.data.decode('utf-8', 'replace')}")


# -- a server the tests make misbehave ------------------------------------------------------------


class ToyServer:
    """A WEBSMQ server of a few lines (subscribe and publish, nothing else) on 127.0.0.1: with
    `dies`, it stops serving (closes its port and every connection) on the message POISON; with
    `greeting`, it sends those bytes to each connection first (as a text frame); with `flood`,
    it sends that many messages to each connection as fast as it can."""

    def __init__(self, *, dies: bool = False, greeting: bytes | None = None,
                 flood: int = 0) -> None:
        self.dies, self.greeting, self.flood = dies, greeting, flood
        self.flood_size = 1000
        self.subscribers: dict[str, list[Any]] = {}
        self.connections: list[Any] = []
        self.port: Any = None
        self.dead = False

    def _protocol(self) -> MessageProtocol:
        server = self

        class Connection(MessageProtocol):
            def connectionMade(self) -> None:
                server.connections.append(self)
                if server.greeting is not None:
                    self.transport.sendMessage(server.greeting, False)
                for _ in range(server.flood):
                    self.transport.sendMessage(b"f" * server.flood_size, True)

            def messageReceived(self, data: bytes, binary: bool) -> None:
                if data == POISON and server.dies:
                    server.die()
                    return
                try:
                    message = websmq.decode(data)
                except Exception:  # noqa: BLE001 - a bad message closes that connection
                    self.transport.loseConnection()
                    return
                if isinstance(message, websmq.Subscribe):
                    server.subscribers.setdefault(message.topic, []).append(self)
                elif isinstance(message, websmq.Publish):
                    for peer in server.subscribers.get(message.topic, []):
                        if peer.connected:
                            peer.transport.sendMessage(data, True)

        return Connection()

    async def start(self) -> str:
        endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
        self.port = await endpoint.listen(websocket_server_factory(self._protocol))
        return f"ws://127.0.0.1:{self.port.getHost().port}/websmq"

    def die(self) -> None:
        self.dead = True
        self.port.stopListening()
        for connection in self.connections:
            if connection.connected:
                connection.transport.abortConnection()

    async def stop(self) -> None:
        if not self.dead:
            self.dead = True
            await self.port.stopListening()
        for connection in self.connections:
            if connection.connected:
                connection.transport.abortConnection()


def kit_with(*names: str) -> Callable[[], Catalogue]:
    """A catalogue of this kit's cases `names` alone (ids after ``websmq.sample.``)."""
    def make() -> Catalogue:
        chosen = Catalogue(kit.protocol, kit.spec, kit.docs)
        chosen.alive = kit.alive
        chosen.cases = [case for case in kit.cases
                        if case.id.removeprefix("websmq.sample.") in names]
        return chosen
    return make
