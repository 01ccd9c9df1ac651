"""Per-principal limits ([limits]): connections, subscriptions, and messages and bytes per second,
shared by every connection of a principal (anonymous clients: of an address), on real sockets."""

from __future__ import annotations

import time
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.access.conftest import AuthFiles
from tests.brokers import LOCAL
from tests.support import eventually, wait_for
from wireproto.access import Principal
from wireproto.access.quotas import LimitSettings, PrincipalLimits
from wireproto.config import ConfigError, config_from_toml
from wireproto.protocols.nydus.client import connect as nydus_connect
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.websmq.client import connect

# Every test on both fast paths: what the limits promise must hold on each.
pytestmark = pytest.mark.usefixtures("fast_path")

# -- the buckets and the book, sans-IO -----------------------------------------------------------


def test_a_bucket_lets_a_burst_through_then_says_how_long_to_wait() -> None:
    now = [0.0]
    limits = PrincipalLimits(LimitSettings(messages_per_second=10, message_burst=3,
                                           bytes_per_second=100, byte_burst=100),
                             clock=lambda: now[0])
    usage = limits.acquire(("principal", "p"))
    assert [limits.charge(usage, 0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limits.charge(usage, 0) == pytest.approx(0.1)  # one token in debt: 0.1 s
    assert limits.charge(usage, 0) == pytest.approx(0.2)
    now[0] = 0.5  # paid 5 tokens: 2 in debt -> 3, capped at the burst, then one taken
    assert limits.charge(usage, 0) == 0.0 and usage.messages.tokens == pytest.approx(2.0)
    now[0] = 100.0
    assert limits.charge(usage, 150) == pytest.approx(0.5)  # the byte bucket: 50 in debt
    assert usage.messages.tokens == pytest.approx(2.0)  # never above its burst


def test_usage_is_shared_by_principal_and_by_address_when_anonymous() -> None:
    limits = PrincipalLimits(LimitSettings(connections=2))
    alice = limits.key(Principal("alice"), "10.0.0.1")
    assert alice == limits.key(Principal("alice"), "10.0.0.2")
    assert limits.key(Principal(), "10.0.0.1") != limits.key(Principal(), "10.0.0.2")
    assert limits.key(Principal(), "10.0.0.1") != limits.key(Principal("10.0.0.1"), "x")
    usages = [limits.acquire(alice) for _ in range(3)]
    assert usages[0] is usages[2]
    assert [limits.open_connection(usage, "websmq") for usage in usages[:2]] == [None, None]
    problem = limits.open_connection(usages[2], "ubre")
    assert problem == "'alice': already 2 connections ([limits] connections)"
    assert limits.exceeded == {("ubre", "connections"): 1}
    for usage in usages:
        limits.release(usage)
    assert len(limits) == 0  # nothing to remember without buckets


def test_a_principal_in_debt_is_remembered_after_its_last_connection_within_a_bound() -> None:
    now = [0.0]
    limits = PrincipalLimits(LimitSettings(messages_per_second=1), clock=lambda: now[0],
                             remember_idle=3)
    first = limits.acquire(("principal", "p0"))
    assert limits.charge(first, 10) == 0.0
    assert limits.charge(first, 10) == pytest.approx(1.0)
    limits.release(first)
    again = limits.acquire(("principal", "p0"))
    assert again is first and limits.charge(again, 10) == pytest.approx(2.0)  # still in debt
    limits.release(again)
    for number in range(1, 10):
        limits.release(limits.acquire(("principal", f"p{number}")))
    assert len(limits) == 3  # the oldest idle ones are forgotten
    assert limits.usage(("principal", "p0")) is None


def test_the_limits_table_names_a_bad_value() -> None:
    for text, message in [
        ("[limits]\nconnections = -1\n", "limits.connections: expected a count (0: no limit)"),
        ("[limits]\nmessages_per_second = \"fast\"\n",
         "limits.messages_per_second: expected a rate per second"),
        ("[limits]\nconection = 3\n", "limits.conection: unknown key"),
    ]:
        with pytest.raises(ConfigError) as raised:
            config_from_toml(text, source="wireproto.toml", reactor=reactor)
        assert str(raised.value).startswith(f"wireproto.toml: {message}"), str(raised.value)


# -- connections ------------------------------------------------------------------------------


async def _refused(address: str) -> Any:
    """The close reason of a WEBSMQ client the broker turns away once it is connected."""
    client = await wait_for(connect(reactor, address))
    return await wait_for(client.when_closed())


@pytest_twisted.ensureDeferred
async def test_anonymous_connections_from_one_address_are_limited(broker: Any) -> None:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", f"websmq+length32@tcp:0:{LOCAL}",
        limits=LimitSettings(connections=2),
    )
    ws, tcp = (entry.address for entry in bound)
    first = await broker.client(ws)
    second = await broker.client(tcp)
    await eventually(lambda: len(service.hub.sessions) == 2)
    reason = await _refused(ws)
    assert "already 2 connections" in str(reason)
    await _refused(tcp)
    limits = service.hub.limits
    assert limits.exceeded == {("websmq", "connections"): 2}
    assert len(service.hub.sessions) == 2  # the refused ones never had a session

    await wait_for(second.disconnect())
    await eventually(lambda: limits.usage(("address", "127.0.0.1")).connections == 1)
    third = await broker.client(tcp)
    received: list[Any] = []
    await wait_for(first.subscribe("news", received.append))
    await eventually(lambda: service.hub.subscribers("news"))
    third.publish("news", b"back")
    await eventually(lambda: received)


LISTEN_WITH_AUTH = f"""
[[listen]]
protocol = "websmq"
transport = "ws"
endpoint = "tcp:0:{LOCAL}"
[[listen]]
protocol = "ubre"
transport = "ws"
endpoint = "tcp:0:{LOCAL}"
[[listen]]
protocol = "nydus"
transport = "engineio"
endpoint = "tcp:0:{LOCAL}"

[[acl]]
publish = ["#"]
subscribe = ["#"]
call = ["#"]
"""


async def start_with_auth(broker: Any, auth_files: AuthFiles, limits: str) -> tuple[Any, dict]:
    text = LISTEN_WITH_AUTH + auth_files.auth_table() + "[limits]\n" + limits
    service, bound = await broker.start_config(config_from_toml(text, reactor=reactor))
    return service, {entry.listener.protocol: entry.address for entry in bound}


def bearer(auth_files: AuthFiles, name: str) -> dict[str, str]:
    return {"Authorization": "Bearer " + auth_files.token(name)}


@pytest_twisted.ensureDeferred
async def test_a_principals_connections_count_across_protocols_and_listeners(
    broker: Any, auth_files: AuthFiles
) -> None:
    service, addresses = await start_with_auth(broker, auth_files, "connections = 2\n")
    await broker.client(addresses["websmq"], headers=bearer(auth_files, "alice"))
    ubre = await wait_for(ubre_connect(reactor, addresses["ubre"],
                                       headers=bearer(auth_files, "alice")))
    try:
        await eventually(lambda: len(service.hub.sessions) == 2)
        refused = await wait_for(connect(reactor, addresses["websmq"],
                                         headers=bearer(auth_files, "alice")))
        assert "'alice': already 2 connections" in str(await wait_for(refused.when_closed()))
        # Another principal, from the same address, has its own budget.
        await broker.client(addresses["websmq"], headers=bearer(auth_files, "bob"))
        await eventually(lambda: len(service.hub.sessions) == 3)
        assert service.hub.limits.exceeded == {("websmq", "connections"): 1}
    finally:
        await wait_for(ubre.close())


@pytest_twisted.ensureDeferred
async def test_an_engineio_session_past_the_limit_is_closed_before_nydus_sees_it(
    broker: Any, auth_files: AuthFiles
) -> None:
    service, addresses = await start_with_auth(broker, auth_files, "connections = 1\n")
    service.server("nydus").register_route("/ping", lambda call: "pong")
    kept = await wait_for(nydus_connect(reactor, addresses["nydus"],
                                        headers=bearer(auth_files, "alice")))
    try:
        with pytest.raises(Exception):  # noqa: B017 - closed before its WELCOME, however it ends
            await wait_for(nydus_connect(reactor, addresses["nydus"],
                                         headers=bearer(auth_files, "alice"), reconnect=False))
        assert service.hub.limits.exceeded == {("nydus", "connections"): 1}
        assert len(service.hub.sessions) == 1
        assert await wait_for(kept.invoke("/ping")) == "pong"
    finally:
        await wait_for(kept.close())


# -- subscriptions ------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_principals_subscriptions_count_across_its_connections(
    broker: Any, auth_files: AuthFiles
) -> None:
    service, addresses = await start_with_auth(broker, auth_files, "subscriptions = 3\n")
    one = await broker.client(addresses["websmq"], headers=bearer(auth_files, "alice"))
    other = await broker.client(addresses["websmq"], headers=bearer(auth_files, "alice"))
    bob = await broker.client(addresses["websmq"], headers=bearer(auth_files, "bob"))
    usage = service.hub.limits.usage(("principal", "alice"))
    received: list[Any] = []
    for topic in ("a", "b"):
        await wait_for(one.subscribe(topic, received.append))
    await wait_for(other.subscribe("c"))
    await eventually(lambda: usage.subscriptions == 3)
    await wait_for(other.subscribe("d"))  # the fourth: the connection that asked is closed
    assert "already 3 subscriptions" in str(await wait_for(other.when_closed()))
    assert service.hub.limits.exceeded == {("websmq", "subscriptions"): 1}
    await eventually(lambda: usage.subscriptions == 2)  # its "c" went with it
    await wait_for(one.subscribe("e", received.append))
    await eventually(lambda: usage.subscriptions == 3)
    for topic in ("a", "e"):
        bob.publish(topic, b"still here")
    await eventually(lambda: len(received) == 2)


# -- rates ------------------------------------------------------------------------------------


async def _publish_all(publisher: Any, subscriber: Any, count: int, payload: bytes,
                       service: Any) -> tuple[list[Any], float]:
    received: list[Any] = []
    await wait_for(subscriber.subscribe("flood", received.append))
    await eventually(lambda: service.hub.subscribers("flood"))
    started = time.monotonic()
    for number in range(count):
        publisher.publish("flood", payload + str(number).encode())
    await eventually(lambda: len(received) == count, timeout=30)
    return received, time.monotonic() - started


@pytest_twisted.ensureDeferred
async def test_past_its_message_rate_a_connection_is_slowed_and_loses_nothing(
    broker: Any
) -> None:
    service, bound = await broker.start(
        f"websmq+length32@tcp:0:{LOCAL}",
        limits=LimitSettings(messages_per_second=20, message_burst=5),
    )
    address = bound[0].address
    subscriber = await broker.client(address)
    publisher = await broker.client(address)
    # The subscriber's own subscribe took a token from the same address's bucket.
    received, elapsed = await _publish_all(publisher, subscriber, 45, b"m", service)
    assert [message.payload for message in received] == [b"m%d" % n for n in range(45)]
    assert elapsed >= 1.5  # 41 messages past the burst, at 20 a second
    assert service.hub.limits.exceeded[("websmq", "messages")] >= 1


@pytest_twisted.ensureDeferred
async def test_past_its_byte_rate_a_connection_is_slowed_and_loses_nothing(
    broker: Any
) -> None:
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}",
        limits=LimitSettings(bytes_per_second=4000, byte_burst=2500),
    )
    subscriber = await broker.client(bound[0].address)
    publisher = await broker.client(bound[0].address)
    received, elapsed = await _publish_all(publisher, subscriber, 6, b"x" * 2000, service)
    assert len(received) == 6
    assert elapsed >= 1.5  # about 12 KB past a 2.5 KB burst, at 4 KB a second
    assert service.hub.limits.exceeded[("websmq", "bytes")] >= 1


@pytest_twisted.ensureDeferred
async def test_one_principal_in_debt_does_not_slow_another(
    broker: Any, auth_files: AuthFiles
) -> None:
    service, addresses = await start_with_auth(
        broker, auth_files, "messages_per_second = 10\nmessage_burst = 2\n")
    subscriber = await broker.client(addresses["websmq"], headers=bearer(auth_files, "carol"))
    alice = await broker.client(addresses["websmq"], headers=bearer(auth_files, "alice"))
    bob = await broker.client(addresses["websmq"], headers=bearer(auth_files, "bob"))
    received: list[Any] = []
    await wait_for(subscriber.subscribe("flood", received.append))
    await eventually(lambda: service.hub.subscribers("flood"))
    for number in range(20):  # about 1.8 s of debt
        alice.publish("flood", b"alice %d" % number)
    await eventually(lambda: service.hub.limits.exceeded.get(("websmq", "messages")))
    bob.publish("flood", b"bob")
    await eventually(lambda: len(received) == 21, timeout=30)
    payloads = [message.payload for message in received]
    assert payloads.index(b"bob") < payloads.index(b"alice 19")
    assert [p for p in payloads if p != b"bob"] == [b"alice %d" % n for n in range(20)]


@pytest_twisted.ensureDeferred
async def test_the_limits_are_on_metrics(broker: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.access.conftest import http_handshake

    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", limits=LimitSettings(connections=1))
    await broker.client(bound[0].address)
    await _refused(bound[0].address)
    port = int(bound[0].address.split(":")[2].split("/")[0])
    answer = await http_handshake(port, "/metrics", websocket=False)
    text = answer.raw.partition(b"\r\n\r\n")[2].decode()
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(text) for sample in family.samples}
    assert samples[("wireproto_limited_total",
                    (("limit", "connections"), ("protocol", "websmq")))] == 1
    assert samples[("wireproto_principals", ())] >= 1


# -- budgets the whole broker shares --------------------------------------------------------------


def test_no_one_takes_more_than_its_share_and_a_full_budget_still_serves_a_newcomer() -> None:
    limits = PrincipalLimits(LimitSettings(max_share=0.25))
    hogs = [limits.acquire(limits.key(Principal(), f"10.0.0.{n}")) for n in range(1, 5)]
    hog = hogs[0]
    assert limits.take_subscription_bytes(hog, 250, 0, 1000, "websmq") is None
    problem = limits.take_subscription_bytes(hog, 1, 250, 1000, "websmq")
    assert problem == ("anonymous clients from 10.0.0.1: 250 bytes of subscribed topics "
                       "already, and no one may hold more than 25% of the broker's 1000 "
                       "([limits] max_share)")
    for number, other in enumerate(hogs[1:], 1):
        assert limits.take_subscription_bytes(other, 250, 250 * number, 1000, "websmq") is None
    # The budget is full (four such addresses took it): a fifth, holding nothing, is under
    # an equal share (1000 / 5) and is served; the first is over it.
    newcomer = limits.acquire(limits.key(Principal(), "10.0.0.9"))
    assert limits.take_subscription_bytes(newcomer, 100, 1000, 1000, "websmq") is None
    assert limits.take_subscription_bytes(newcomer, 150, 1100, 1000, "websmq") is not None
    limits.release_subscription_bytes(hog, 250)
    assert limits.subscription_holders == 4
    assert limits.take_subscription_bytes(hog, 10, 850, 1000, "ubre") is None
    assert limits.subscription_holders == 5
    assert "an equal share of them or more" in limits.take_subscription_bytes(
        hogs[1], 1, 1010, 1000, "websmq")
    assert limits.exceeded == {("websmq", "shared_budget"): 3}


def test_ipv6_peers_count_by_their_network_and_mapped_ipv4_as_ipv4() -> None:
    from twisted.internet.address import IPv4Address, IPv6Address

    from wireproto.peerlog import address_key, count_ipv6_by

    one_host = [IPv6Address("TCP", f"2001:db8:1:2:{n:x}::1", 5000) for n in range(3)]
    assert {address_key(peer) for peer in one_host} == {"2001:db8:1:2::/64"}
    assert address_key(IPv6Address("TCP", "2001:db8:1:3::1", 1)) == "2001:db8:1:3::/64"
    assert address_key(IPv6Address("TCP", "::ffff:192.0.2.7", 1)) == "192.0.2.7"
    assert address_key(IPv4Address("TCP", "192.0.2.7", 2)) == "192.0.2.7"
    try:
        count_ipv6_by(128)
        assert len({address_key(peer) for peer in one_host}) == 3
    finally:
        count_ipv6_by(64)


@pytest_twisted.ensureDeferred
async def test_addresses_that_fill_the_subscription_budget_shut_out_no_newcomer(
        broker: Any) -> None:
    """Four addresses take their quarter each of a 2000-byte budget; a fifth still subscribes
    and is served, and an address past its quarter is refused alone."""
    hub = config_from_toml("[hub]\nmax_subscription_bytes = 500\n"
                           "max_total_subscription_bytes = 2000\n", reactor=reactor).hub
    service, bound = await broker.start(f"websmq+length32@tcp:0:{LOCAL}", hub=hub)
    address = bound[0].address
    topic = "t" * 99
    for host in range(2, 6):
        hog = await broker.client(f"{address}:bindAddress=127.0.0.{host}")
        for number in range(5):  # 500 bytes: this address's 25% of 2000
            hog.subscribe(f"{number}{topic}", lambda message: None)
    await eventually(lambda: service.hub.subscription_bytes == 2000)
    greedy = await broker.client(f"{address}:bindAddress=127.0.0.2")
    greedy.subscribe("x", lambda message: None)
    await wait_for(greedy.when_closed())
    assert service.hub.limits.exceeded == {("websmq", "shared_budget"): 1}
    newcomer = await broker.client(f"{address}:bindAddress=127.0.0.9")
    received: list = []
    newcomer.subscribe("news", received.append)
    await eventually(lambda: service.hub.subscribers("news"))
    publisher = await broker.client(f"{address}:bindAddress=127.0.0.9")
    publisher.publish("news", b"still served")
    await eventually(lambda: received)
    assert newcomer.connected
