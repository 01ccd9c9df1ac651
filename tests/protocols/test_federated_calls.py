"""How the UBRE and nydus servers use the hub's federation for the calls no handler of theirs
takes (wireproto.hub.federation, wireproto.protocols.calls): whatever way the federation fails,
the client is answered, and the admin page's calls mean what they say.

The federation here is one of its own, a second implementation of the seam's public Protocol,
whose failures a test chooses; the clients are real, over TCP."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import defer, reactor

from tests.brokers import LOCAL
from tests.support import failure_of, wait_for
from wireproto.access.policy import Principal
from wireproto.hub.federation import Alone, ServedElsewhere
from wireproto.protocols import calls
from wireproto.protocols.calls import Answer, Call, RemoteCaller
from wireproto.protocols.nydus.client import connect as nydus_connect
from wireproto.protocols.nydus.invocation import InvokeError
from wireproto.protocols.rpc import RequestFailed
from wireproto.protocols.ubre.client import connect as ubre_connect


class FailingFederation(Alone):
    """Another process serves everything, and every call to it fails with `error`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def call(self, call: Call) -> defer.Deferred[Answer]:
        return defer.fail(self.error)

    def served_elsewhere(self, protocol: str) -> ServedElsewhere:
        return ServedElsewhere(1, ["p/far"])


ADMIN = RemoteCaller("admin", "127.0.0.1:1", 0, None, Principal("root"), "here")


@pytest.mark.parametrize("error, ubre_body, nydus_status", [
    (ConnectionResetError("the other side hung up"), "Unavailable", 503),
    (calls.CallUnavailable("out of reach"), "Unavailable", 503),
    (calls.CallNotFound("no one serves it"), "NotFound", 404),
    (calls.CallTimeout("too slow"), "Timeout", 504),
    (calls.CallTooManyRequests("busy"), "TooManyRequests", 429),
])
@pytest_twisted.ensureDeferred
async def test_every_failure_of_a_federated_call_answers_the_client(
        broker, error, ubre_body, nydus_status):
    service, bound = await broker.start(f"ubre+lines@tcp:0:{LOCAL}",
                                        f"nydus+lines@tcp:0:{LOCAL}")
    service.hub.join(FailingFederation(error))
    ubre_address, nydus_address = (entry.address for entry in bound)
    ubre = await wait_for(ubre_connect(reactor, ubre_address))
    nydus = await wait_for(nydus_connect(reactor, nydus_address))
    try:
        failed = await failure_of(ubre.request("far", 1))
        assert isinstance(failed, RequestFailed) and failed.body == ubre_body
        failed = await failure_of(nydus.invoke("/far", 1))
        assert isinstance(failed, InvokeError) and failed.status == nydus_status
    finally:
        await wait_for(ubre.close())
        await wait_for(nydus.close())
    # The admin page's calls too: an Answer, never a failure.
    answer = await wait_for(service.server("ubre").call("far", 1, ADMIN))
    assert answer == Answer(False, ubre_body)
    answer = await wait_for(service.server("nydus").call("/far", 1, ADMIN))
    assert not answer.succeeded and answer.body["status"] == nydus_status


@pytest_twisted.ensureDeferred
async def test_an_admin_invoke_without_data_gives_its_handler_none(broker):
    from wireproto.codecs.nydus import NO_DATA

    service, _ = await broker.start(f"nydus+lines@tcp:0:{LOCAL}")
    seen = []
    service.server("nydus").register_route("/here", lambda invocation: seen.append(
        invocation.body))
    for data in (None, NO_DATA):
        answer = await wait_for(service.server("nydus").call("/here", data, ADMIN))
        assert answer.succeeded
    assert seen == [None, None]
