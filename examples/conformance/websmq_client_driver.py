"""wireproto's WEBSMQ client as the driver the WEBSMQ client kit asks for (docs/conformance.md,
"WEBSMQ clients: the driver and results"): it does what the driver contract says, through the
client's public API alone.

    wireproto conform client --protocol websmq --listen ws://127.0.0.1:0/ \\
        --run "python examples/conformance/websmq_client_driver.py {url}"

The address is its argument (or WIREPROTO_CONFORM_URL): a ws:// URL, or a tcp: endpoint for a
length32 framed stream. It runs until stopped.
"""

import os
import random
import sys

from twisted.internet import reactor

from wireproto.protocols.websmq import connect

ADDRESS = sys.argv[1] if len(sys.argv) > 1 else os.environ["WIREPROTO_CONFORM_URL"]
# Connections lost in a row without one that served or lasted: the pause before the next
# attempt doubles with each (0.5 s, 1 s, 2 s ... 30 s), so that a server that accepts and drops
# at once is not hammered.
failures = 0
up_since = 0.0
# Whether the server sent anything on this connection: one that served us was no failure.
was_served = False


def served():
    global was_served
    was_served = True


def echo(client, message):
    served()
    client.publish("conformance/out", message.payload)


def command(client, message):
    served()
    verb, _, rest = message.payload.partition(b" ")
    try:
        if verb == b"subscribe":
            client.subscribe(rest.decode(), lambda got: echo(client, got))
        elif verb == b"unsubscribe":
            client.unsubscribe(rest.decode())
        elif verb == b"publish":
            topic, _, payload = rest.partition(b" ")
            client.publish(topic.decode(), payload)
        elif verb == b"close":
            client.disconnect()
    except Exception as error:  # what the library refused, told to the kit
        client.publish("conformance/out", b"error: " + str(error).encode())


def connected(client):
    global up_since
    up_since = reactor.seconds()
    client.set_will("conformance/will", b"gone")
    client.subscribe("conformance/command", lambda message: command(client, message))
    client.subscribe("conformance/in", lambda message: echo(client, message))
    client.when_closed().addCallback(lambda _: again())


def again(_reason=None):
    global failures, up_since, was_served
    if was_served or (up_since and reactor.seconds() - up_since > 10):
        failures = 0  # that connection served, or lasted: start again quickly
    up_since, was_served = 0.0, False
    reactor.callLater(min(0.5 * 2 ** failures, 30) * random.uniform(1, 1.25), start)
    failures += 1


def start():
    connect(reactor, ADDRESS).addCallbacks(connected, again)


start()
reactor.run()
