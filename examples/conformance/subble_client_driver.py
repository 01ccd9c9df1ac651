"""wireproto's SubbleSocket client as the driver the client conformance kit asks for
(docs/conformance.md, "SubbleSocket clients: the driver and results"):

    wireproto conform client --protocol subble --listen ws://127.0.0.1:9400/ \\
        --run "python examples/conformance/subble_client_driver.py {url}"

It handshakes with no client ID (the kit gives one), subscribes to conformance/in, echoes every
event it gets by producing it on conformance/out in the same format with the same payload,
reports each event error a produce gets by producing {"code", "message"} in JSON on
conformance/error, and reconnects with backoff when the connection is lost. A refused handshake
ends it.
"""

import os
import sys

from twisted.internet import reactor

from wireproto.protocols.subble.client import EventRefused, HandshakeRefused, SubbleClient

url = sys.argv[1] if len(sys.argv) > 1 else os.environ["WIREPROTO_CONFORM_URL"]
client = SubbleClient(reactor, url, subscribe=["conformance/in"],
                      produce=["conformance/out", "conformance/error"], reconnect=True)


def report(failure):
    """An event error (51, 52) for a produce goes back to the kit; a timeout or a closed
    connection needs no report."""
    error = failure.value
    if isinstance(error, EventRefused):
        client.produce("conformance/error", {"code": int(error.code), "message": error.message},
                       format="json").addErrback(lambda _: None)


def echo(event):
    client.produce("conformance/out", event.payload, format=event.format).addErrback(report)


def refused(error):
    """A refusal is final: the client has stopped, and so does the driver."""
    print(f"handshake refused: {error}", flush=True)
    reactor.stop()


client.on_event = echo
client.on_refused = refused
client.connect().addErrback(lambda failure: failure.trap(HandshakeRefused))
reactor.run()
