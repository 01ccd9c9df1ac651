"""wireproto's UBRE client, driven as the UBRE client kit's driver contract asks
(docs/conformance.md, "UBRE clients: the driver and results").

    wireproto conform client --protocol ubre --listen ws://127.0.0.1:8780/ubre \\
        --run "python examples/conformance/ubre_client_driver.py {url}"

Add ``--binary`` for the binary format (on a stream, ``--framing length32``).
"""

import sys

from twisted.internet import defer, task

from wireproto.protocols.rpc import RequestFailed
from wireproto.protocols.ubre.client import connect


async def main(reactor, url, binary=False):
    client = await connect(reactor, url, binary=binary, reconnect=True, request_timeout=10)
    name = None if binary else "echo"  # a binary request has an id and no handler name

    def echo(body, client):
        return body

    def fail(body, client):
        raise RequestFailed(body)

    client.handle("echo", echo)
    client.handle("fail", fail)
    client.default_handler = echo  # binary requests, which name no handler

    def ask(message):
        asked = client.request(name, message.body)
        asked.addCallbacks(
            lambda body: client.publish("conformance/answer", body),
            lambda failure: client.publish(
                "conformance/failed",
                failure.value.body if failure.check(RequestFailed) else str(failure.value)))

    def echo_in(message):
        client.publish("conformance/out", message.body)

    joined = [client.subscribe("conformance/in", echo_in)]

    def leave(message):  # leave conformance/in, or join it again
        if joined:
            joined.pop().cancel()
        else:
            joined.append(client.subscribe("conformance/in", echo_in))

    client.subscribe("conformance/ask", ask)
    client.subscribe("conformance/leave", leave)
    await task.deferLater(reactor, 1e9, lambda: None)  # until the kit stops it


if __name__ == "__main__":
    arguments = [argument for argument in sys.argv[1:] if argument != "--binary"]
    task.react(lambda reactor: defer.ensureDeferred(
        main(reactor, arguments[0], "--binary" in sys.argv)))
