"""wireproto's broker inside an existing Twisted application, beside the application's own
services.

The application is a `MultiService` (under twistd, the `application` object). Its own service,
a `TimerService`, publishes a reading into the broker's hub every 50 ms; the broker, made by
`make_service`, is added as one more child. A UBRE handler registered on the broker's shared
`UbreServer` answers from the application's state. A WEBSMQ client on a TCP listener reads a
published reading, and a UBRE client over newline-delimited JSON calls the handler.

Run it with ``python examples/embed_service.py``. It prints:

    services: ['sensor', 'wireproto']
    listening: websmq over length32, ubre over lines
    websmq client got sensors/temp b'21.5'
    ubre client: latest -> {'topic': 'sensors/temp', 'celsius': 21.5}
    stopped
"""

from twisted.application.internet import TimerService
from twisted.application.service import MultiService
from twisted.internet import defer, task

from wireproto.config import build_config
from wireproto.hub import HubMessage
from wireproto.protocols import websmq
from wireproto.protocols.ubre.client import UbreClient
from wireproto.service import make_service


class Sensor:
    """The application's own state: a reading it publishes and remembers."""

    def __init__(self, hub):
        self.hub = hub
        self.celsius = 21.5

    def publish(self):
        self.hub.publish(HubMessage("sensors/temp", b"%.1f" % self.celsius, protocol="sensor"))


async def main(reactor):
    application = MultiService()

    broker = make_service(
        build_config(listen=["websmq+length32@tcp:0", "ubre+lines@tcp:0"]), reactor
    )
    broker.setName("wireproto")
    broker.setServiceParent(application)

    sensor = Sensor(broker.hub)
    timer = TimerService(0.05, sensor.publish)
    timer.clock = reactor
    timer.setName("sensor")
    timer.setServiceParent(application)

    @broker.server("ubre").handle("latest")
    def latest(body, peer):
        return {"topic": "sensors/temp", "celsius": sensor.celsius}

    print("services:", sorted(service.name for service in application))
    application.startService()
    bound = await broker.when_listening()
    print("listening:", ", ".join(entry.listener.describe() for entry in bound))
    websmq_address, ubre_address = (entry.address for entry in bound)  # tcp:127.0.0.1:PORT

    reader = await websmq.connect(reactor, websmq_address)
    got = defer.Deferred()
    await reader.subscribe("sensors/temp", lambda message: got.called or got.callback(message))
    message = await got  # the timer keeps publishing, so the first one after subscribing
    print("websmq client got", message.topic, message.payload)
    await reader.disconnect()

    caller = await UbreClient(reactor, ubre_address, request_timeout=5).connect()
    print("ubre client: latest ->", await caller.request("latest"))
    await caller.close()

    await application.stopService()
    print("stopped")


if __name__ == "__main__":
    task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
