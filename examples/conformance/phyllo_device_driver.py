"""wireproto's Phyllo stack as a device for `wireproto conform device`: the driver contract of
docs/conformance.md ("Phyllo devices: the driver and results").

On the pub-sub message link of the given stack:

- every message of payload type 0x10 or above whose topic starts with ``echo`` is sent back
  unchanged (type, topic, payload);
- every msgpack document on ``ping`` is answered with a document on ``pong`` holding how many
  pings came before it (0, 1, 2...);
- every document on ``reply`` is answered with the document ``"hello!"`` on ``reply``;
- anything else is left alone. The stack drops what it cannot read and reads on.

Run it on a serial line (it opens the port), listening on a stream endpoint, or serving
WebSocket connections on a TCP port (path ``/phyllo``, one binary message a chunk)::

    python examples/conformance/phyllo_device_driver.py serial:/dev/ttyUSB0 --stack reduced
    python examples/conformance/phyllo_device_driver.py tcp:9000:interface=127.0.0.1
    python examples/conformance/phyllo_device_driver.py tcp:9001:interface=127.0.0.1 --websocket

It prints ``ready`` once the line is open (or listening), and ends when a serial line closes.
"""

from __future__ import annotations

import argparse
import sys

from twisted.internet import defer, endpoints, task

from wireproto.codecs.phyllo import (
    PubSubMessage,
    deserialize,
    document_from_message,
    message_from_document,
    serialize,
)
from wireproto.phyllo import MessageChunks, StackFactory, build_stack, connect_stack
from wireproto.transports import websocket_resource, websocket_site
from wireproto.transports.serial import serial_endpoint_from_string


def device(stack: str, bottom=None):
    """A new stack (on `bottom`, a new ChunkedStream by default) whose message link answers as
    the contract says."""
    link = build_stack(stack, bottom)
    pings = 0

    def received(message: PubSubMessage) -> None:
        nonlocal pings
        if message.topic.startswith(b"echo"):
            link.send(message)
        elif message.topic == b"ping" and message.payload_type == 0x40:
            try:
                deserialize(document_from_message(message))
            except Exception:  # noqa: BLE001 - a document it cannot read is no ping
                return
            link.send(message_from_document("pong", serialize(pings)))
            pings += 1
        elif message.topic == b"reply" and message.payload_type == 0x40:
            link.send(message_from_document("reply", serialize("hello!")))

    link.on_receive = received
    return link


async def main(reactor, address: str, stack: str, websocket: bool) -> None:
    if address.startswith("serial:"):
        top = await connect_stack(serial_endpoint_from_string(reactor, address),
                                  lambda: device(stack))
        print("ready", flush=True)
        await top.when_lost()
        return
    if websocket:
        chunks = websocket_resource(lambda: device(stack, MessageChunks()).bottom)
        factory = websocket_site({"/phyllo": chunks})
    else:
        factory = StackFactory(lambda: device(stack))
    await endpoints.serverFromString(reactor, address).listen(factory)
    print("ready", flush=True)
    await defer.Deferred()  # serve until stopped


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="serial:DEVICE[:baudrate=N], or a server endpoint")
    parser.add_argument("--stack", choices=("minimal", "reduced"), default="reduced")
    parser.add_argument("--websocket", action="store_true",
                        help="serve WebSocket connections at /phyllo on the endpoint")
    options = parser.parse_args()
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, options.address,
                                                         options.stack, options.websocket)))
    sys.exit(0)
