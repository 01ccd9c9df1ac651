"""wireproto's clients from `async def` code, and host code listening to the hub.

A broker (`make_service`) serves WEBSMQ and UBRE over WebSocket on one port. Host code follows
every ``sensors/...`` topic with ``hub.subscribe_callback``; a WEBSMQ client publishes a reading,
and a UBRE client gets it as a JSON body. Coroutines become Deferreds with
``Deferred.fromCoroutine`` (or ``ensureDeferred``), and Deferreds are awaited in coroutines.

Run it with ``python examples/embed_async.py``. It prints:

    listening: websmq over ws, ubre over ws
    host code got sensors/kitchen/temp b'{"celsius":21.5}' from websmq
    ubre client got sensors/kitchen/temp {'celsius': 21.5}
    both done: ['websmq publisher', 'ubre subscriber']
    stopped
"""

from twisted.internet import defer, task
from twisted.internet.defer import Deferred

from wireproto.config import build_config
from wireproto.protocols import websmq
from wireproto.protocols.ubre.client import UbreClient
from wireproto.service import make_service


async def publish_reading(reactor, address, subscribed):
    """A WEBSMQ client: publish once the UBRE client's subscription is in the hub."""
    client = await websmq.connect(reactor, address)
    await subscribed
    await client.publish("sensors/kitchen/temp", b'{"celsius":21.5}')
    await client.disconnect()
    return "websmq publisher"


async def read_one(reactor, address, subscribed):
    """A UBRE client: subscribe, then wait for one message."""
    client = await UbreClient(reactor, address, request_timeout=5).connect()
    got = Deferred()
    client.subscribe("sensors/kitchen/temp", got.callback)
    # UBRE has no acknowledgements: a reply shows the server has read the subscribe before it.
    await client.request("ping")
    subscribed.callback(None)
    message = await got
    print("ubre client got", message.topic, message.body)
    await client.close()
    return "ubre subscriber"


async def main(reactor):
    service = make_service(build_config(listen=["websmq+ws@tcp:0", "ubre+ws@tcp:0"]), reactor)
    service.server("ubre").handle("ping", lambda body, peer: "pong")
    service.startService()
    bound = await service.when_listening()
    print("listening:", ", ".join(entry.listener.describe() for entry in bound))
    websmq_url, ubre_url = (entry.address for entry in bound)

    # Host code: a callback for every message on a matching topic, from any protocol.
    def host_callback(message):
        print("host code got", message.topic, message.payload, "from", message.protocol)

    listening = service.hub.subscribe_callback("sensors/#", host_callback)

    # Two coroutines at once, each as a Deferred; gatherResults waits for both.
    subscribed = Deferred()
    results = await defer.gatherResults([
        Deferred.fromCoroutine(publish_reading(reactor, websmq_url, subscribed)),
        Deferred.fromCoroutine(read_one(reactor, ubre_url, subscribed)),
    ], consumeErrors=True)
    print("both done:", results)

    listening.cancel()
    await service.stopService()
    print("stopped")


if __name__ == "__main__":
    task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
