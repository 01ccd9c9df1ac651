"""Deliberately broken nydus clients for the nydus client kit: wireproto's own client and the
driver of examples/conformance/nydus_client_driver.py, each wrong in one way (MODE):

    crash-unknown   exits (status 3) on a message that is no nydus string
    no-pong         never answers the server's pings
    no-reconnect    never connects again once a connection is lost
    tight-loop      reconnects at once, again and again, with no pause
    no-error-body   reports an ERROR without its body
    wrong-result    reports a RESULT's data as a string of its JSON
    raw-path        writes its paths raw, not URL-encoded (the spec's "should"; not a MUST)

    python broken_nydus_clients.py URL MODE
"""

import json
import os
import sys

from twisted.internet import defer, reactor

from wireproto.codecs import nydus
from wireproto.errors import ProtocolError
from wireproto.protocols.nydus import client as nydus_client
from wireproto.protocols.nydus.client import InvokeError, NydusClient
from wireproto.protocols.rpc import RequestFailed

url, mode = sys.argv[1], sys.argv[2]

if mode == "crash-unknown":
    received = nydus_client.NydusClientProtocol.messageReceived

    def crash_on_garbage(self, data, binary):
        try:
            nydus.decode(data)
        except ProtocolError:
            print("cannot parse", bytes(data[:40]), flush=True)
            os._exit(3)
        received(self, data, binary)

    nydus_client.NydusClientProtocol.messageReceived = crash_on_garbage

if mode == "no-pong":
    from wireproto.transports.engineio.client import EngineIOClientAdapter

    on_message = EngineIOClientAdapter.onMessage

    def no_pong(self, payload, isBinary):
        if isBinary or payload != b"2":
            on_message(self, payload, isBinary)

    EngineIOClientAdapter.onMessage = no_pong

if mode == "raw-path":
    nydus._encode_path = lambda path, kind: path

retry = (lambda attempt: 0.0) if mode == "tight-loop" else nydus_client.DEFAULT_RETRY
client = NydusClient(reactor, url, reconnect=mode != "no-reconnect", retry_policy=retry)


def report(path, data):
    client.invoke(path, data).addErrback(lambda failure: None)


@defer.inlineCallbacks
def hello():
    try:
        result = yield client.invoke("/conformance/hello there", {"hello": "conformance"})
    except InvokeError as error:
        body = None if mode == "no-error-body" else error.body
        report("/conformance/answered", {"error": {"status": error.status,
                                                   "message": error.message, "body": body}})
    except RequestFailed as error:
        report("/conformance/answered", {"error": error.body})
    except Exception as error:
        print("hello failed:", error, flush=True)
    else:
        if mode == "wrong-result":
            result = json.dumps(result)
        report("/conformance/answered", {"result": result})


@client.register_route("/conformance/*")
def published(match, data):
    report("/conformance/published", {"path": match.path, "data": data})


client.on_connect = hello
client.connect().addErrback(lambda failure: print("connect:", failure.value, flush=True))
reactor.run()
