"""wireproto's WebSocket protocols inside your own twisted.web Site, sharing the broker's hub.

Your Site has its own resources (a page at ``/``, a JSON status at ``/status``) and mounts
WEBSMQ over WebSocket at ``/ws/websmq`` with `websocket_resource`. The protocol server it mounts
is the broker's own (``broker.server("websmq")``), so a browser on your site and a device on the
broker's TCP listener are on one hub: a publish from either reaches the other.

Run it with ``python examples/embed_site.py``. It prints:

    GET / -> 200 hello from my site
    websocket client subscribed to news
    GET /status -> 200 {"topics": ["news"], "connections": 1}
    websocket client got news b'from tcp'
    GET /nothing -> 404
    stopped
"""

import json

from twisted.internet import defer, task
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.protocol import Protocol
from twisted.web.client import Agent
from twisted.web.resource import Resource
from twisted.web.server import Site
from twisted.web.static import Data

from wireproto.config import build_config
from wireproto.protocols import websmq
from wireproto.service import make_service
from wireproto.transports.websocket import WebSocketOptions
from wireproto.transports.websocket_http import websocket_resource


class Status(Resource):
    """Your own resource, reading the shared hub."""

    isLeaf = True

    def __init__(self, hub):
        super().__init__()
        self.hub = hub

    def render_GET(self, request):
        request.setHeader(b"content-type", b"application/json")
        status = {"topics": self.hub.topics(), "connections": len(self.hub.sessions)}
        return json.dumps(status).encode()


class TopicStarted:
    """A hub topic observer: fires `started` when `topic` gets its first subscriber."""

    def __init__(self, topic):
        self.topic = topic
        self.started = defer.Deferred()

    def topic_started(self, topic):
        if topic == self.topic and not self.started.called:
            self.started.callback(topic)

    def topic_ended(self, topic):
        pass


class Body(Protocol):
    """Collects a response body; `done` fires with it."""

    def __init__(self):
        self.parts = []
        self.done = defer.Deferred()

    def dataReceived(self, data):
        self.parts.append(data)

    def connectionLost(self, reason):
        self.done.callback(b"".join(self.parts))


async def get(agent, url):
    response = await agent.request(b"GET", url.encode())
    body = Body()
    response.deliverBody(body)
    return f"{response.code} {(await body.done).decode()}".rstrip()


async def main(reactor):
    # The broker: one TCP listener of its own, and the hub your site shares.
    broker = make_service(build_config(listen=["websmq+length32@tcp:0"]), reactor)
    broker.startService()
    [tcp] = await broker.when_listening()

    root = Resource()
    root.putChild(b"", Data(b"hello from my site", "text/plain"))
    root.putChild(b"status", Status(broker.hub))
    ws = Resource()
    options = WebSocketOptions(allowed_origins=("https://example.com:443",))
    ws.putChild(b"websmq", websocket_resource(broker.server("websmq"), options))
    root.putChild(b"ws", ws)
    # timeout: drop connections that send no whole request within 10 s (twisted.web's is 12 h).
    site = Site(root, timeout=10)
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site)
    base = f"http://127.0.0.1:{port.getHost().port}"

    agent = Agent(reactor)
    print("GET / ->", await get(agent, base + "/"))

    observer = TopicStarted("news")
    broker.hub.add_topic_observer(observer)
    browser = await websmq.connect(reactor, f"ws://127.0.0.1:{port.getHost().port}/ws/websmq")
    got = defer.Deferred()
    await browser.subscribe("news", got.callback)
    print("websocket client subscribed to", await observer.started)
    print("GET /status ->", await get(agent, base + "/status"))

    device = await websmq.connect(reactor, tcp.address)
    await device.publish("news", b"from tcp")
    message = await got
    print("websocket client got", message.topic, message.payload)
    print("GET /nothing ->", (await get(agent, base + "/nothing")).split()[0])

    await device.disconnect()
    await browser.disconnect()
    await port.stopListening()
    await broker.stopService()
    print("stopped")


if __name__ == "__main__":
    task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
