"""No way into the hub publishes on a pattern: a topic with `+` as a whole level or `#` as the
whole last one (``tt/+``, ``tt/#``) is what a subscriber matches, never where a message is
published, so every `#` subscriber would get a message whose topic is a pattern. Each protocol
refuses it as it refuses a bad topic, on a real broker over real sockets."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.admin.http import base_of, http
from tests.brokers import LOCAL, Broker
from tests.support import eventually, wait_for
from wireproto.errors import InvalidTopic
from wireproto.hub import HubMessage
from wireproto.protocols.nydus.client import connect as nydus_connect
from wireproto.protocols.nydus.invocation import InvokeError
from wireproto.protocols.subble.client import EventFailed
from wireproto.protocols.subble.client import connect as subble_connect
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.websmq.server import WebsmqSettings

LISTENERS = (f"websmq+length32@tcp:0:{LOCAL}", f"ubre+lines@tcp:0:{LOCAL}",
             f"nydus+lines@tcp:0:{LOCAL}", f"subble+length32@tcp:0:{LOCAL}",
             f"websmq+ws@tcp:0:{LOCAL}")
PATTERNS = ("tt/+", "tt/#", "+", "#", "a/+/b")


async def start(broker: Broker, wildcards: bool) -> tuple:
    service, bound = await broker.start(*LISTENERS, websmq=WebsmqSettings(wildcards=wildcards))
    at = {f"{b.listener.protocol}+{b.listener.transport}": b.address for b in bound}
    seen: list[str] = []
    service.hub.subscribe_callback("#", lambda message: seen.append(message.topic))
    return service, at, seen


def sessions_of(service, protocol: str) -> list:
    return [session for session in service.hub.sessions if session.protocol == protocol]


@pytest.mark.parametrize("wildcards", [False, True])
@pytest_twisted.ensureDeferred
async def test_websmq_and_ubre_close_a_connection_that_publishes_on_a_pattern(
        broker: Broker, wildcards: bool) -> None:
    service, at, seen = await start(broker, wildcards)
    # WEBSMQ: '+' is a topic character, so "tt/+" is a frame the codec reads; '#' is not, and
    # the codec refused it before (a will on a pattern likewise: published at the close).
    for topic, will in [("tt/+", False), ("+", False), ("a/+/b", False), ("tt/+", True)]:
        client = await broker.client(at["websmq+length32"])
        await (client.set_will if will else client.publish)(topic, b"x")
        await wait_for(client.when_closed())
        await eventually(lambda: not sessions_of(service, "websmq"))
    for topic in PATTERNS:
        ubre = await wait_for(ubre_connect(reactor, at["ubre+lines"]))
        await eventually(lambda: sessions_of(service, "ubre"))
        await ubre.publish(topic, 1)
        await eventually(lambda: not sessions_of(service, "ubre"))
        await wait_for(ubre.close())
    assert seen == []
    assert service.hub.stats.published == 0
    # A '+' or '#' inside a level is no wildcard: such a topic is published as before.
    ubre = await wait_for(ubre_connect(reactor, at["ubre+lines"]))
    await ubre.publish("tt/a+b/#c", 1)
    await eventually(lambda: seen == ["tt/a+b/#c"])
    await wait_for(ubre.close())


@pytest_twisted.ensureDeferred
async def test_nydus_subble_the_admin_page_and_host_code_are_refused_a_pattern(
        broker: Broker) -> None:
    service, at, seen = await start(broker, False)
    nydus = await wait_for(nydus_connect(reactor, at["nydus+lines"]))
    subble = await wait_for(subble_connect(reactor, at["subble+length32"], produce=PATTERNS))
    base = base_of(at["websmq+ws"])
    try:
        for topic in PATTERNS:
            # A nydus client's /_hub/publish: ERROR 400, and the connection stays.
            with pytest.raises(InvokeError) as refused:
                await wait_for(nydus.invoke("/_hub/publish", {"path": "/" + topic, "data": 0}))
            assert refused.value.status == 400, topic
            assert "not a pattern" in refused.value.message, topic
            # The same route called from the admin page's Call form.
            answer = await http(base, "/api/call", {
                "protocol": "nydus", "name": "/_hub/publish",
                "body": {"path": "/" + topic, "data": 0}})
            assert answer.json["ok"] is False, topic
            assert answer.json["body"]["status"] == 400, topic
            assert "not a pattern" in answer.json["body"]["message"], topic
            # The admin API's own publish refused it before.
            answer = await http(base, "/api/publish", {"topic": topic, "payload": "0"})
            assert answer.status == 400, topic
            # SubbleSocket: the produce is answered 52, the event not created.
            with pytest.raises(EventFailed, match="not a pattern"):
                await wait_for(subble.produce(topic, 0))
            # Host code publishing into the hub.
            with pytest.raises(InvalidTopic, match="not a pattern"):
                service.hub.publish(HubMessage(topic, b"0"))
        assert nydus.connected and subble.connected
    finally:
        await wait_for(nydus.close())
        await wait_for(subble.close())
    assert seen == []
    assert service.hub.stats.published == 0
