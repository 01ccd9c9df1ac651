"""The $SYS topics: the broker's own figures, off by default, never published by a client, and
matched by no pattern that starts with a wildcard."""

from __future__ import annotations

import pytest_twisted
from twisted.internet import reactor

from tests.brokers import LOCAL, Broker
from tests.support import Inbox, eventually, sleep, wait_for
from wireproto.admin import AdminSettings
from wireproto.hub import HubMessage
from wireproto.protocols.ubre.client import connect as ubre_connect


@pytest_twisted.ensureDeferred
async def test_the_broker_publishes_its_figures_on_sys_topics(broker: Broker) -> None:
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}", f"ubre+ws@tcp:0:{LOCAL}",
                                        admin=AdminSettings(sys_interval=0.2))
    client = await broker.client(bound[0].address)
    connected = Inbox()
    await wait_for(client.subscribe("$SYS/broker/clients/connected", connected))
    await connected.wait()
    assert int(connected.messages[-1].payload) == 1

    everything, own = Inbox(), Inbox()
    service.hub.subscribe_callback("#", everything)
    service.hub.subscribe_callback("$SYS/#", own)
    await own.wait(20)
    topics = {message.topic for message in own.messages}
    assert {"$SYS/broker/uptime", "$SYS/broker/messages/published",
            "$SYS/broker/protocols/websmq/connected",
            "$SYS/broker/protocols/ubre/connected"} <= topics
    assert everything.messages == []  # '#' is not '$SYS/#'

    ubre = await wait_for(ubre_connect(reactor, bound[1].address))
    try:
        await eventually(lambda: [m for m in own.messages[-40:]
                                  if m.topic == "$SYS/broker/protocols/ubre/connected"
                                  and m.payload == b"1"])
    finally:
        await wait_for(ubre.close())


@pytest_twisted.ensureDeferred
async def test_sys_topics_are_off_by_default(broker: Broker) -> None:
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}")
    own = Inbox()
    service.hub.subscribe_callback("$SYS/#", own)
    await sleep(0.5)
    assert own.messages == [] and service.hub.stats.published == 0


@pytest_twisted.ensureDeferred
async def test_a_client_may_not_publish_on_sys_topics(broker: Broker) -> None:
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}")
    own = Inbox()
    service.hub.subscribe_callback("$SYS/#", own)
    client = await broker.client(bound[0].address)
    await wait_for(client.publish("$SYS/broker/clients/connected", b"9999"))
    await wait_for(client.set_will("$SYS/broker/uptime", b"0"))
    await eventually(lambda: service.hub.denied.get(("websmq", "publish"), 0) >= 1)
    await wait_for(client.publish("not/sys", b"x"))
    await eventually(lambda: service.hub.stats.published == 1)
    await wait_for(client.disconnect())
    await sleep(0.1)
    assert own.messages == []


@pytest_twisted.ensureDeferred
async def test_with_access_rules_only_the_admins_read_sys_topics(broker: Broker,
                                                                 auth_files) -> None:
    from wireproto.access import AccessRule
    from wireproto.authentication import AuthSettings

    auth = AuthSettings(enabled=True, jwt_algorithms=("HS256",),
                        jwt_secret_file=str(auth_files.secret))
    everything = AccessRule(role="staff", subscribe=("#",), publish=("#",))
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}", auth=auth,
                                        acl=(everything,),
                                        admin=AdminSettings(sys_interval=0.2))
    address = bound[0].address
    admin = await broker.client(
        f"{address}?access_token={auth_files.token('erin', roles=['admin'])}")
    staff = await broker.client(
        f"{address}?access_token={auth_files.token('dave', roles=['staff'])}")
    seen_by_admin, seen_by_staff = Inbox(), Inbox()
    await wait_for(admin.subscribe("$SYS/broker/uptime", seen_by_admin))
    await wait_for(staff.subscribe("$SYS/broker/uptime", seen_by_staff))
    await seen_by_admin.wait()
    await eventually(lambda: service.hub.denied.get(("websmq", "subscribe"), 0) == 1)
    await sleep(0.5)
    assert seen_by_staff.messages == []
    # '#' granted to staff covers every topic but the broker's own
    await wait_for(staff.subscribe("news", seen_by_staff))
    await eventually(lambda: "news" in service.hub.topics())
    service.hub.publish(HubMessage("news", b"x"))
    await seen_by_staff.wait()
