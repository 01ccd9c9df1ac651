"""The cluster's JetStream buckets on real nats-servers: three replicas on a three-node NATS
cluster and one on a single server, `[cluster] replicas` over both, a bucket of one replica made
by an older process given three with its keys, and every JetStream error (a refusal, a
timeout, no JetStream) logged for what it is and tried again until the bucket is there."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from typing import Any

import msgpack
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.logger import formatEvent

from tests.brokers import LOCAL
from tests.support import eventually, quiet_port, sleep, wait_for
from tests.test_cli import LISTENER_LINE, Child
from tests.test_log_events import logged, named
from wireproto.cluster.client import NatsClient, NatsOptions
from wireproto.cluster.jetstream import Bucket, JetStreamError, jetstream_api
from wireproto.cluster.lastvalues import key_of_topic
from wireproto.cluster.settings import ClusterSettings
from wireproto.config import ConfigError, config_from_toml
from wireproto.hub import HubSettings
from wireproto.supervisor.natsserver import NatsServer

RETAIN = HubSettings(retain=("sensors/#",))
READY = re.compile(r"^wireproto: ready; Ctrl-C stops$")
WILLS, RETAINED = "KV_wireproto_wills", "KV_wireproto_retained"
# The buckets as wireproto made them before they had replicas.
OLD_WILLS = {"name": WILLS, "subjects": ["$KV.wireproto_wills.>"], "max_msgs_per_subject": 1,
             "discard": "new", "allow_direct": True, "storage": "file", "num_replicas": 1}
OLD_RETAINED = {"name": RETAINED, "subjects": ["$KV.wireproto_retained.>"],
                "max_msgs_per_subject": 1, "max_msgs": RETAIN.max_retained,
                "max_bytes": 2 * RETAIN.max_retained_bytes, "discard": "old",
                "allow_direct": True, "allow_rollup_hdrs": True, "deny_delete": True,
                "storage": "file", "num_replicas": 1}


class JetStream:
    """A NATS client of the test's own, to ask JetStream what the brokers made."""

    def __init__(self, url: str) -> None:
        self.client = NatsClient(reactor, NatsOptions(servers=(url,)))

    async def __aenter__(self) -> JetStream:
        self.client.start()
        await wait_for(self.client.when_ready(), 10)
        return self

    async def __aexit__(self, *_: Any) -> None:
        await wait_for(self.client.stop())

    async def ask(self, request: str, body: dict | None = None, timeout: float = 5) -> dict:
        return await wait_for(jetstream_api(self.client, request, body, timeout=timeout),
                              timeout + 1)

    async def eventually(self, request: str, body: dict | None = None,
                         timeout: float = 30) -> dict:
        """The answer to `request` once JetStream gives one (a NATS cluster just started, or
        just lost a node, refuses or says nothing for a few seconds)."""
        answers: list[dict] = []
        errors: list[str] = []

        async def answered() -> bool:
            try:
                answers.append(await self.ask(request, body, timeout=2))
            except (JetStreamError, TimeoutError) as error:
                errors.append(repr(error))
                await sleep(0.2)
            return bool(answers)

        for _ in range(int(timeout / 2.2) + 1):
            if await answered():
                return answers[0]
        raise TimeoutError(f"JetStream gave no answer to {request} within {timeout} s "
                           f"(the last: {errors[-3:]})")

    async def replicas(self, stream: str) -> int:
        return (await self.eventually(f"STREAM.INFO.{stream}"))["config"]["num_replicas"]

    async def value(self, stream: str, subject: str) -> bytes | None:
        headers, payload = await wait_for(self.client.request(
            f"$JS.API.DIRECT.GET.{stream}", b'{"last_by_subj": "%s"}' % subject.encode(),
            timeout=5))
        return payload if payload else None


async def start_broker(broker, url: str, *, replicas: int = 0, hub: HubSettings = RETAIN):
    service, bound = await broker.start(
        f"websmq+length32@tcp:0:{LOCAL}",
        cluster=ClusterSettings(url=url, heartbeat_interval=0.2, lease=1.0,
                                replicas=replicas), hub=hub)
    await wait_for(service.cluster.when_ready(), 10)
    return service, bound[0].address


def buckets_ready(service) -> bool:
    return service.cluster.wills.available and service.cluster.last_values.available


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP has taken hold)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def texts(events: list[dict], name: str) -> list[str]:
    return [formatEvent(event) for event in named(events, name)]


# -- replicas ------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_the_buckets_have_three_replicas_on_a_three_node_nats_cluster(broker, nats_cluster):
    """A NATS cluster just started may not count its JetStream servers yet, and refuse three:
    the buckets are then made with one and given three as soon as it can place them."""
    with logged() as events:
        service, _ = await start_broker(broker, nats_cluster[1].url)
        await eventually(lambda: service.cluster.wills.store.replicas == 3
                         and service.cluster.last_values.store.replicas == 3, timeout=30)
        assert buckets_ready(service)
    async with JetStream(nats_cluster[2].url) as jetstream:
        assert await jetstream.replicas(WILLS) == 3
        assert await jetstream.replicas(RETAINED) == 3
    # Errors of a NATS cluster that is starting, if any, are timeouts or refusals: never
    # taken for a server without JetStream.
    assert not named(events, "cluster_bucket_differs") and not named(events,
                                                                     "cluster_no_jetstream")


@pytest_twisted.ensureDeferred
async def test_the_buckets_have_one_replica_on_a_single_server_said_once(broker, nats):
    with logged() as events:
        service, _ = await start_broker(broker, nats.url)
        await eventually(lambda: buckets_ready(service), timeout=10)
    async with JetStream(nats.url) as jetstream:
        assert await jetstream.replicas(WILLS) == 1
        assert await jetstream.replicas(RETAINED) == 1
    # JetStream's own answer says why, once a bucket, and it is no failure.
    said = texts(events, "cluster_bucket_replicas")
    assert len(said) == 2 and all("not supported in non-clustered mode" in text
                                  and "asking again" not in text for text in said), said
    assert not any(named(events, name) for name in (
        "cluster_jetstream_refused", "cluster_jetstream_timeout", "cluster_no_jetstream"))


@pytest_twisted.ensureDeferred
async def test_cluster_replicas_sets_their_number(broker, nats_cluster):
    service, _ = await start_broker(broker, nats_cluster[0].url, replicas=2)
    await eventually(lambda: buckets_ready(service), timeout=30)
    async with JetStream(nats_cluster[0].url) as jetstream:
        assert await jetstream.replicas(WILLS) == 2
        assert await jetstream.replicas(RETAINED) == 2
    await wait_for(service.stopService(), 10)
    # Set lower later, it is obeyed: the keys stay with the replica that is kept.
    service, _ = await start_broker(broker, nats_cluster[0].url, replicas=1)
    await eventually(lambda: service.cluster.wills.store.replicas == 1, timeout=30)
    async with JetStream(nats_cluster[0].url) as jetstream:
        assert await jetstream.replicas(WILLS) == 1


@pytest.mark.parametrize("value, accepted", [
    ("0", True), ("1", True), ("5", True), ("6", False), ("-1", False), ("true", False),
    ('"3"', False)])
def test_cluster_replicas_is_checked(value, accepted):
    text = f'[cluster]\nurl = "nats://127.0.0.1:4222"\nreplicas = {value}\n'
    if accepted:
        assert config_from_toml(text, reactor=reactor).cluster.replicas == int(value)
    else:
        with pytest.raises(ConfigError, match="cluster.replicas"):
            config_from_toml(text, reactor=reactor)


# -- buckets made before -------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_bucket_of_one_replica_made_before_gets_three_and_keeps_its_keys(
        broker, nats_cluster):
    values = {f"sensors/{name}": name.encode() * 3 for name in ("a", "b", "c")}
    async with JetStream(nats_cluster[0].url) as jetstream:
        for config in (OLD_WILLS, OLD_RETAINED):
            await jetstream.eventually(f"STREAM.CREATE.{config['name']}", config)
        for topic, value in values.items():
            await wait_for(jetstream.client.request(
                f"$KV.wireproto_retained.{key_of_topic(topic)}",
                msgpack.packb([topic, value, "websmq", []]), timeout=5))
        # The will of a process that died before the upgrade.
        await wait_for(jetstream.client.request(
            "$KV.wireproto_wills.w.gone.7", msgpack.packb(["left/gone", b"bye", "websmq"]),
            timeout=5))
    with logged() as events:
        service, address = await start_broker(broker, nats_cluster[1].url)
        wills: list = []
        listener = await broker.client(address)
        listener.subscribe("left/gone", wills.append)
        await eventually(lambda: service.cluster.last_values.store.replicas == 3
                         and service.cluster.wills.store.replicas == 3, timeout=30)
        await eventually(lambda: wills, timeout=15)
    async with JetStream(nats_cluster[2].url) as jetstream:
        assert await jetstream.replicas(WILLS) == 3
        assert await jetstream.replicas(RETAINED) == 3
        for topic, value in values.items():
            kept = await jetstream.value(RETAINED, f"$KV.wireproto_retained.{key_of_topic(topic)}")
            assert msgpack.unpackb(kept)[1] == value
    for topic, value in values.items():
        assert service.hub.retained.get(topic)[0].payload == value
    assert [message.payload for message in wills] == [b"bye"]
    migrated = texts(events, "cluster_bucket_replicas")
    assert sum("now has 3 replicas (it had 1); its keys are kept" in text
               for text in migrated) == 2, migrated
    assert not named(events, "cluster_bucket_differs") and not named(events, "cluster_bucket_made")


@pytest_twisted.ensureDeferred
async def test_a_bucket_made_otherwise_is_left_as_it_is_and_said_so(broker, nats):
    other = {**OLD_RETAINED, "max_msgs": 10}
    async with JetStream(nats.url) as jetstream:
        await jetstream.eventually(f"STREAM.CREATE.{RETAINED}", other)
        await wait_for(jetstream.client.request(
            f"$KV.wireproto_retained.{key_of_topic('sensors/x')}",
            msgpack.packb(["sensors/x", b"1", "websmq", []]), timeout=5))
    with logged() as events:
        service, _ = await start_broker(broker, nats.url)
        await eventually(lambda: buckets_ready(service), timeout=10)
        await eventually(lambda: service.hub.retained.get("sensors/x"), timeout=10)
    (said,) = texts(events, "cluster_bucket_differs")
    assert f"max_msgs 10 where this process would have {RETAIN.max_retained}" in said
    assert "left as it is, with its keys" in said
    async with JetStream(nats.url) as jetstream:
        info = await jetstream.ask(f"STREAM.INFO.{RETAINED}")
    assert info["config"]["max_msgs"] == 10 and info["state"]["messages"] == 1


# -- JetStream errors ----------------------------------------------------------------------------


def two_nodes_of_three(tmp_path) -> list[NatsServer]:
    """A NATS cluster of three nodes, two of them started: the third has never been seen, so
    JetStream knows two servers and cannot place three replicas."""
    from tests.cluster.conftest import start_quietly

    def make(attempt: int) -> list[NatsServer]:
        ports = [quiet_port() for _ in range(3)]
        routes = [f"nats-route://127.0.0.1:{port}" for port in ports]
        return [NatsServer(directory=str(tmp_path / f"nodes{attempt}-{index}"),
                           port=quiet_port(), cluster_port=ports[index], server_name=f"n{index}",
                           routes=tuple(r for i, r in enumerate(routes) if i != index))
                for index in range(3)]

    return start_quietly(make, slice(0, 2))


@pytest_twisted.ensureDeferred
async def test_a_refusal_is_logged_with_its_code_and_tried_again_until_it_succeeds(
        broker, tmp_path):
    """Three replicas asked for where JetStream knows two servers: it refuses ("no suitable
    peers"), and the bucket is made once the third server has joined."""
    from tests.cluster.conftest import _need_nats_server

    _need_nats_server()
    servers = two_nodes_of_three(tmp_path)
    try:
        with logged() as events:
            service, _ = await start_broker(broker, servers[0].url, replicas=3)
            await eventually(lambda: any(event.get("code") == 10005 for event in
                                         named(events, "cluster_jetstream_refused")), timeout=30)
            wills = service.cluster.wills
            await eventually(lambda: wills.store.failures >= 3, timeout=30)
            assert not wills.available
            servers[2].start()
            await eventually(lambda: buckets_ready(service), timeout=60)
        refused = [event for event in named(events, "cluster_jetstream_refused")
                   if event.get("code") == 10005]
        text = formatEvent(refused[0])
        assert "JetStream refused: no suitable peers for placement (JetStream error 10005); " \
               "trying again in" in text, text
        assert " (until then " in text
        # Said once a bucket, not at each attempt.
        assert len([e for e in refused if e["what"].startswith("the wills")]) == 1
        assert named(events, "cluster_jetstream_recovered")
        assert not named(events, "cluster_no_jetstream")
        async with JetStream(servers[1].url) as jetstream:
            assert await jetstream.replicas(WILLS) == 3
            assert await jetstream.replicas(RETAINED) == 3
    finally:
        await wait_for(broker.close(), 20)
        for server in servers:
            server.stop()


@pytest_twisted.ensureDeferred
async def test_a_timeout_is_logged_as_one_and_tried_again(nats):
    """The NATS server paused (SIGSTOP) while the bucket is asked for: a timeout, said as a
    timeout, then the bucket once the server runs again."""
    client = NatsClient(reactor, NatsOptions(servers=(nats.url,)))
    client.start()
    await wait_for(client.when_ready(), 10)
    bucket = Bucket(client, "KV_paused", {"subjects": ["$KV.paused.>"]}, timeout=1.0,
                    what="the test's bucket")
    try:
        with logged() as events:
            os.kill(nats.process.pid, signal.SIGSTOP)
            try:
                await eventually(lambda: stopped(nats.process.pid))
                ready = bucket.ensure()
                await eventually(lambda: named(events, "cluster_jetstream_timeout"), timeout=10)
                await eventually(lambda: bucket.failures >= 2, timeout=10)
                assert not bucket.available and not ready.called
            finally:
                os.kill(nats.process.pid, signal.SIGCONT)
            assert await wait_for(ready, 20) is True
        assert bucket.available and bucket.replicas == 1
        (said, *_) = texts(events, "cluster_jetstream_timeout")
        assert said.startswith("cluster: the test's bucket (KV_paused): JetStream did not "
                               "answer: request '$JS.API.STREAM.INFO.KV_paused' got no reply "
                               "within 1 s; trying again in"), said
        assert not named(events, "cluster_no_jetstream")
    finally:
        bucket.stop()
        await wait_for(client.stop())


@pytest_twisted.ensureDeferred
async def test_brokers_started_before_their_nats_cluster_has_jetstream_make_it_later(
        broker, nats_cluster):
    """One node of three up: no JetStream quorum, so JetStream's API says nothing (timeouts);
    the other two come back, and the buckets are made, without a reconnect."""
    first, second, third = nats_cluster
    async with JetStream(first.url) as jetstream:
        await jetstream.eventually("STREAM.CREATE.warmup",
                                   {"name": "warmup", "subjects": ["warmup"], "num_replicas": 3})
    second.stop()
    third.stop()
    with logged() as events:
        service, _ = await start_broker(broker, first.url)
        await eventually(lambda: named(events, "cluster_jetstream_timeout"), timeout=30)
        assert not buckets_ready(service)
        second.start()
        third.start()
        await eventually(lambda: buckets_ready(service), timeout=60)
        # Made with one replica if the third was not counted yet, then given three.
        await eventually(lambda: service.cluster.wills.store.replicas == 3
                         and service.cluster.last_values.store.replicas == 3, timeout=30)
    assert service.cluster.client.reconnects == 0
    assert not named(events, "cluster_no_jetstream")
    async with JetStream(first.url) as jetstream:
        assert await jetstream.replicas(WILLS) == 3


@pytest_twisted.ensureDeferred
async def test_no_jetstream_is_said_only_when_the_server_has_none_and_is_asked_again(
        broker, tmp_path):
    from tests.cluster.conftest import _need_nats_server

    _need_nats_server()
    server = NatsServer(directory=str(tmp_path / "nojs"), extra_config="jetstream: disabled")
    server.start()
    try:
        with logged() as events:
            service, _ = await start_broker(broker, server.url)
            await eventually(lambda: service.cluster.wills.store.failures >= 3, timeout=15)
        assert not buckets_ready(service)
        said = texts(events, "cluster_no_jetstream")
        assert said and said[0].startswith(
            "cluster: the wills bucket (KV_wireproto_wills): no JetStream on the NATS server "
            "(nothing answers its API); trying again in"), said
        assert not named(events, "cluster_jetstream_timeout")
    finally:
        await wait_for(service.stopService(), 10)
        server.stop()


@pytest_twisted.ensureDeferred
async def test_a_last_values_consumer_that_is_lost_is_made_again(broker, nats):
    """The consumer a process follows the bucket with has one replica, so it can be lost (with
    its NATS node, or deleted, as here) while the process's connection stays: its heartbeats
    stop, and the process follows the bucket again."""
    first, at_first = await start_broker(broker, nats.url)
    second, _ = await start_broker(broker, nats.url)
    await eventually(lambda: buckets_ready(first) and buckets_ready(second), timeout=10)
    async with JetStream(nats.url) as jetstream:
        names = (await jetstream.ask(f"CONSUMER.NAMES.{RETAINED}"))["consumers"]
        assert len(names) == 2
        with logged() as events:
            for name in names:
                await jetstream.ask(f"CONSUMER.DELETE.{RETAINED}.{name}")
            publisher = await broker.client(at_first)
            await wait_for(publisher.publish("sensors/lost", b"1"))
            await eventually(lambda: second.hub.retained.get("sensors/lost"), timeout=20)
    assert first.cluster.last_values.refollowed == second.cluster.last_values.refollowed == 1
    said = texts(events, "cluster_jetstream_consumer_lost")
    assert len(said) == 2 and said[0] == (
        "cluster: the last-values consumer (KV_wireproto_retained) sent nothing for 6 s, not "
        "even a heartbeat; following the bucket again")


# -- a NATS node lost ----------------------------------------------------------------------------


@pytest.mark.alone  # a 1 s lease and a node killed: other tests' load overran it
@pytest_twisted.ensureDeferred
async def test_wills_and_last_values_outlive_the_nats_node_that_leads_the_wills(
        broker, nats_cluster, tmp_path):
    """A broker process (`wireproto serve`) holding a client's will is killed together with
    the NATS node that leads the wills bucket: the surviving brokers publish the will within
    15 s, and the last values are still there to read and to write."""
    survivor, at_survivor = await start_broker(broker, nats_cluster[0].url)
    await eventually(lambda: survivor.cluster.wills.store.replicas == 3
                     and survivor.cluster.last_values.store.replicas == 3, timeout=30)
    async with JetStream(nats_cluster[0].url) as jetstream:
        # Just after its replicas changed, a stream may be between leaders for a moment, and
        # its new replicas catching up: a bucket whose followers have not caught up does not
        # outlive its leader (JetStream's promise, not wireproto's), so both must have.
        leader = await replicated(jetstream, WILLS)
        await replicated(jetstream, RETAINED)
    doomed_node = next(node for node in nats_cluster if node.server_name == leader)
    elsewhere = next(node for node in nats_cluster if node is not doomed_node)

    config = tmp_path / "doomed.toml"
    config.write_text(f'listen = ["websmq+length32@tcp:0:{LOCAL}"]\n'
                      '[hub]\nretain = ["sensors/#"]\n'
                      f'[cluster]\nurl = "{elsewhere.url}"\nheartbeat_interval = 0.2\n'
                      'lease = 1.0\n')
    doomed = Child(sys.executable, "-m", "wireproto", "serve", "--config", str(config))
    try:
        await doomed.line(READY, 30)
        (address,) = [match.group(3) for match in map(LISTENER_LINE.match, doomed.stdout)
                      if match]
        listener = await broker.client(at_survivor)
        wills: list = []
        listener.subscribe("gone/a", wills.append)
        await eventually(lambda: survivor.cluster.roster.members(), timeout=30)
        client = await broker.client(address)
        await wait_for(client.set_will("gone/a", b"bye"))
        await wait_for(client.publish("sensors/before", b"1"))
        await eventually(lambda: survivor.hub.retained.get("sensors/before"), timeout=30)
        async with JetStream(elsewhere.url) as jetstream:
            await eventually_async(lambda: will_keys(jetstream), timeout=30)
        # A third broker, on a node that stays, follows the last values.
        watcher, _ = await start_broker(broker, elsewhere.url)
        await eventually(lambda: watcher.hub.retained.get("sensors/before"), timeout=30)

        doomed_node.stop(kill=True)
        doomed.process.kill()
        killed = time.monotonic()
        await eventually(lambda: wills, timeout=30)
        took = time.monotonic() - killed
        assert [message.payload for message in wills] == [b"bye"], took
        await sleep(2.0)  # a lease and more: nothing is published twice
        assert len(wills) == 1

        # Written once the bucket has a leader again, a value reaches the watcher (whose
        # consumer may have been lost with the node: it is made again), and a newcomer reads
        # the values from before and after.
        async with JetStream(elsewhere.url) as jetstream:
            await jetstream.eventually(f"STREAM.INFO.{RETAINED}", timeout=60)
        publisher = await broker.client(at_survivor)
        await wait_for(publisher.publish("sensors/after", b"2"))
        await eventually(lambda: watcher.hub.retained.get("sensors/after"), timeout=30)
        newcomer, _ = await start_broker(broker, elsewhere.url)
        await eventually(lambda: newcomer.hub.retained.get("sensors/before")
                         and newcomer.hub.retained.get("sensors/after"), timeout=30)
        assert newcomer.hub.retained.get("sensors/before")[0].payload == b"1"
    finally:
        doomed.kill()


async def replicated(jetstream: JetStream, stream: str, timeout: float = 60) -> str:
    """The leader of `stream` once it has one and both its other replicas are current."""
    deadline = time.monotonic() + timeout
    cluster: dict = {}
    while time.monotonic() < deadline:
        cluster = (await jetstream.eventually(f"STREAM.INFO.{stream}")).get("cluster") or {}
        followers = cluster.get("replicas") or []
        if (cluster.get("leader") and len(followers) == 2
                and all(follower.get("current") for follower in followers)):
            return cluster["leader"]
        await sleep(0.5)
    raise TimeoutError(f"{stream} has no leader and two current replicas: {cluster}")


async def will_keys(jetstream: JetStream) -> list[str]:
    info = await jetstream.ask(f"STREAM.INFO.{WILLS}",
                               {"subjects_filter": "$KV.wireproto_wills.w.>"})
    return list((info.get("state") or {}).get("subjects") or {})


async def eventually_async(check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = await check()
        if result:
            return result
        await sleep(0.1)
    raise TimeoutError(f"condition not met within {timeout} s: {check}")
