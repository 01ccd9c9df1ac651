"""UBRE from `async def` code: a broker on a hub, two clients, pub/sub and requests both ways.

Run it with ``python examples/ubre_rpc.py``. It prints:

    add -> 3
    alice got {'from': 'bob', 'text': 'hi'}
    greet -> hello, bob
    nope -> NotFound
"""

from twisted.internet import defer, task
from twisted.internet.endpoints import TCP4ServerEndpoint

from wireproto.hub import Hub
from wireproto.protocols.rpc import RequestFailed
from wireproto.protocols.ubre.client import connect
from wireproto.protocols.ubre.server import UbreServer
from wireproto.transports.websocket_http import websocket_resource, websocket_site


async def main(reactor):
    server = UbreServer(Hub())

    @server.handle("add")
    def add(numbers, peer):
        return sum(numbers)

    @server.handle("greet")
    async def greet(body, peer):
        name = await peer.request("whoami", timeout=5)  # UBRE is symmetric: ask the client
        return f"hello, {name}"

    site = websocket_site({"/ubre": websocket_resource(server)})
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site)
    url = f"ws://127.0.0.1:{port.getHost().port}/ubre"

    alice = await connect(reactor, url)
    bob = await connect(reactor, url, request_timeout=5)
    bob.handle("whoami", lambda body, client: "bob")

    got = defer.Deferred()
    alice.subscribe("chat", lambda message: got.callback(message.body))
    # Subscribing has no reply; a request's reply shows the server has read the subscribe.
    print("add ->", await alice.request("add", [1, 2]))
    await bob.publish("chat", {"from": "bob", "text": "hi"})
    print("alice got", await got)
    print("greet ->", await bob.request("greet"))
    try:
        await bob.request("nope")
    except RequestFailed as failure:
        print("nope ->", failure.body)

    await alice.close()
    await bob.close()
    await port.stopListening()


if __name__ == "__main__":
    task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
