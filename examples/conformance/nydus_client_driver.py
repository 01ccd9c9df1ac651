"""A nydus client driver for `wireproto conform client --protocol nydus`: wireproto's own
nydus client (Engine.IO 4 over WebSocket) doing what the driver contract asks
(docs/conformance.md, "nydus clients: the driver and results").

    wireproto conform client --protocol nydus --listen http://127.0.0.1:0/engine.io/ \
        --run "python examples/conformance/nydus_client_driver.py {url}"
"""

import os
import sys

from twisted.internet import defer, reactor

from wireproto.protocols.nydus.client import InvokeError, NydusClient
from wireproto.protocols.rpc import RequestFailed

url = sys.argv[1] if len(sys.argv) > 1 else os.environ["WIREPROTO_CONFORM_URL"]
client = NydusClient(reactor, url, reconnect=True)


def report(path, data):
    """INVOKE `path` with `data`; its answer does not matter."""
    client.invoke(path, data).addErrback(lambda failure: None)


@defer.inlineCallbacks
def hello():
    try:
        result = yield client.invoke("/conformance/hello there", {"hello": "conformance"})
    except InvokeError as error:
        report("/conformance/answered", {"error": {"status": error.status,
                                                   "message": error.message,
                                                   "body": error.body}})
    except RequestFailed as error:
        report("/conformance/answered", {"error": error.body})
    except Exception as error:  # the connection went: the next one says hello again
        print("hello failed:", error, flush=True)
    else:
        report("/conformance/answered", {"result": result})


@client.register_route("/conformance/*")
def published(match, data):
    report("/conformance/published", {"path": match.path, "data": data})


client.on_connect = hello
client.on_unhandled = lambda path, data: print("unhandled publish", path, flush=True)
client.connect().addErrback(lambda failure: print("connect:", failure.value, flush=True))
reactor.run()
