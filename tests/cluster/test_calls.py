"""Calls across broker processes: a UBRE handler or a nydus route on one process answers the
clients of every process, through a real nats-server (NATS request/reply, queue groups, and its
"no responders" answer).

As in test_link.py, each broker is a whole service with its own hub and NATS connection; they
share this test's reactor."""

from __future__ import annotations

import re

import pytest
import pytest_twisted
from twisted.internet import defer, reactor

from tests.brokers import LOCAL, Broker
from tests.support import eventually, failure_of, wait_for
from wireproto.cluster.settings import ClusterSettings
from wireproto.config import config_from_toml
from wireproto.protocols.nydus.client import connect as nydus_connect
from wireproto.protocols.nydus.invocation import InvokeError
from wireproto.protocols.rpc import RequestFailed
from wireproto.protocols.ubre.client import connect as ubre_connect


def cluster_table(nats, **settings) -> ClusterSettings:
    return ClusterSettings(url=nats.url, heartbeat_interval=0.2, lease=1.0, **settings)


async def broker_on(broker: Broker, nats, **cluster) -> tuple:
    service, bound = await broker.start(
        f"ubre+lines@tcp:0:{LOCAL}", f"nydus+lines@tcp:0:{LOCAL}",
        cluster=cluster_table(nats, **cluster))
    await wait_for(service.cluster.when_ready(), 10)
    return service, {entry.listener.protocol: entry.address for entry in bound}


async def ubre_client(address: str):
    client = await wait_for(ubre_connect(reactor, address))
    return client


async def serving(*services) -> None:
    """Wait until NATS has every subscription the services made for their calls, and every
    process has heard what each other one announces it serves."""
    for service in services:
        await wait_for(service.cluster.client.flush())

    def heard() -> bool:
        return all(
            other.cluster.roster.announced.get(service.cluster.origin_token)
            == service.cluster.roster.announcement
            for service in services for other in services if other is not service)

    await eventually(heard, timeout=10)


@pytest_twisted.ensureDeferred
async def test_a_ubre_handler_on_one_process_answers_clients_of_another(broker, nats):
    first, at_first = await broker_on(broker, nats)
    second, at_second = await broker_on(broker, nats)
    callers = []

    def add(numbers, peer):
        callers.append(peer)
        return sum(numbers)

    first.server("ubre").handle("add", add)
    first.server("ubre").default_handler = lambda body, peer: body[::-1]
    await serving(first, second)
    client = await ubre_client(at_second["ubre"])
    try:
        assert await wait_for(client.request("add", [1, 2, 39])) == 42
        assert await wait_for(client.request(None, "abc")) == "cba"
        no_one = await failure_of(client.request("subtract", [1]))
        assert isinstance(no_one, RequestFailed) and no_one.body == "NotFound"
    finally:
        await wait_for(client.close())
    caller = callers[0]
    assert caller.remote and caller.protocol == "ubre" and caller.node == second.cluster.origin
    session = next(iter(second.hub.sessions))
    assert (caller.session, caller.peer) == (session.id, session.peer)
    assert first.cluster.calls.answered == 2 and second.cluster.calls.made == 3


@pytest_twisted.ensureDeferred
async def test_a_failing_remote_handler_fails_the_request_as_a_local_one_would(broker, nats):
    first, _ = await broker_on(broker, nats)
    second, at_second = await broker_on(broker, nats)
    ubre = first.server("ubre")

    def refuse(body, peer):
        raise RequestFailed({"why": "no", "body": body})

    def crash(body, peer):
        raise KeyError("the stack stays home")

    ubre.handle({"refuse": refuse, "crash": crash})
    await serving(first, second)
    client = await ubre_client(at_second["ubre"])
    try:
        refused = await failure_of(client.request("refuse", {"x": [1, None]}))
        assert refused.body == {"why": "no", "body": {"x": [1, None]}}
        crashed = await failure_of(client.request("crash"))
        assert crashed.body == {"name": "KeyError", "message": "'the stack stays home'"}
    finally:
        await wait_for(client.close())


@pytest_twisted.ensureDeferred
async def test_processes_serving_the_same_name_share_its_calls(broker, nats):
    first, _ = await broker_on(broker, nats)
    second, _ = await broker_on(broker, nats)
    third, at_third = await broker_on(broker, nats)
    answered_by: list[str] = []
    for name, service in (("first", first), ("second", second)):
        service.server("ubre").handle(
            "who", lambda body, peer, name=name: answered_by.append(name) or name)
    await serving(first, second, third)
    client = await ubre_client(at_third["ubre"])
    try:
        answers = await wait_for(defer.gatherResults(
            [client.request("who", index) for index in range(60)]))
    finally:
        await wait_for(client.close())
    assert sorted(answers) == sorted(answered_by) and len(answered_by) == 60
    assert {"first", "second"} == set(answers)  # NATS spreads a queue group's messages


@pytest_twisted.ensureDeferred
async def test_a_local_handler_answers_before_any_other_process(broker, nats):
    first, _ = await broker_on(broker, nats)
    second, at_second = await broker_on(broker, nats)
    first.server("ubre").handle("where", lambda body, peer: "first")
    second.server("ubre").handle("where", lambda body, peer: "second")
    await serving(first, second)
    client = await ubre_client(at_second["ubre"])
    try:
        assert [await wait_for(client.request("where")) for _ in range(5)] == ["second"] * 5
    finally:
        await wait_for(client.close())
    assert first.cluster.calls.answered == 0


@pytest_twisted.ensureDeferred
async def test_a_nydus_route_on_one_process_answers_invokes_on_another(broker, nats):
    first, _ = await broker_on(broker, nats)
    second, at_second = await broker_on(broker, nats)
    nydus = first.server("nydus")
    invocations = []

    def user(invocation):
        invocations.append(invocation)
        return {"id": invocation.params["id"], "body": invocation.body}

    nydus.register_route("/users/:id", user)
    nydus.register_route(re.compile(r"^/files/(\w+)\.txt$"),
                         lambda invocation: invocation.splats)
    nydus.register_route("/nothing", lambda invocation: None)

    def teapot(invocation):
        raise InvokeError(418, body={"brew": "tea"})

    nydus.register_route("/teapot", teapot)
    await serving(first, second)
    client = await wait_for(nydus_connect(reactor, at_second["nydus"]))
    try:
        assert await wait_for(client.invoke("/USERS/42", [1])) == {"id": "42", "body": [1]}
        assert await wait_for(client.invoke("/files/notes.txt")) == ["notes"]
        assert await wait_for(client.invoke("/nothing")) is None
        brewed = await failure_of(client.invoke("/teapot"))
        assert (brewed.status, brewed.body) == (418, {"brew": "tea"})
        missing = await failure_of(client.invoke("/users"))
        assert (missing.status, missing.message) == (404, "Not Found")
    finally:
        await wait_for(client.close())
    invocation = invocations[0]
    assert invocation.route == "/users/:id" and invocation.path == "/USERS/42"
    assert invocation.client.remote and invocation.client.protocol == "nydus"
    client_id = next(iter(second.server("nydus").clients))
    assert invocation.client.client == client_id


@pytest_twisted.ensureDeferred
async def test_a_route_added_later_is_reachable_once_its_process_says_so(broker, nats):
    first, _ = await broker_on(broker, nats)
    second, at_second = await broker_on(broker, nats)
    await serving(first, second)
    client = await wait_for(nydus_connect(reactor, at_second["nydus"]))
    try:
        assert (await failure_of(client.invoke("/late"))).status == 404
        first.server("nydus").register_route("/late", lambda invocation: "here")
        await eventually(lambda: second.server("nydus").remote_route("/late"), timeout=5)
        assert await wait_for(client.invoke("/late")) == "here"
    finally:
        await wait_for(client.close())


@pytest_twisted.ensureDeferred
async def test_a_process_that_dies_takes_its_routes_and_names_with_it(broker, nats):
    first, _ = await broker_on(broker, nats)
    second, at_second = await broker_on(broker, nats)
    first.server("nydus").register_route("/gone", lambda invocation: "here")
    first.server("ubre").handle("gone", lambda body, peer: "here")
    await serving(first, second)
    nydus = await wait_for(nydus_connect(reactor, at_second["nydus"]))
    ubre = await ubre_client(at_second["ubre"])
    try:
        assert await wait_for(nydus.invoke("/gone")) == "here"
        assert await wait_for(ubre.request("gone")) == "here"
        await wait_for(first.stopService())
        assert (await failure_of(ubre.request("gone"))).body == "NotFound"
        assert (await failure_of(nydus.invoke("/gone"))).status == 404
        await eventually(lambda: not second.cluster.roster.members(), timeout=5)
        assert second.server("nydus").remote_route("/gone") is None
    finally:
        await wait_for(nydus.close())
        await wait_for(ubre.close())


@pytest_twisted.ensureDeferred
async def test_a_remote_call_that_takes_too_long_times_out_in_every_protocol(broker, nats):
    first, _ = await broker_on(broker, nats)
    second, at_second = await broker_on(broker, nats, call_timeout=0.5)
    never: list[defer.Deferred] = []

    def hang(*args):
        never.append(defer.Deferred())
        return never[-1]

    first.server("ubre").handle("hang", hang)
    first.server("nydus").register_route("/hang", hang)
    await serving(first, second)
    ubre = await ubre_client(at_second["ubre"])
    nydus = await wait_for(nydus_connect(reactor, at_second["nydus"]))
    try:
        assert (await failure_of(ubre.request("hang"))).body == "Timeout"
        timed_out = await failure_of(nydus.invoke("/hang"))
        assert (timed_out.status, timed_out.message) == (504, "Gateway Timeout")
    finally:
        for d in never:
            d.callback("too late")
        await wait_for(ubre.close())
        await wait_for(nydus.close())


@pytest_twisted.ensureDeferred
async def test_a_process_works_on_at_most_max_remote_calls_from_elsewhere(broker, nats):
    first, _ = await broker_on(broker, nats, max_remote_calls=2)
    second, at_second = await broker_on(broker, nats)
    waiting: list[defer.Deferred] = []

    def slow(body, peer):
        waiting.append(defer.Deferred())
        return waiting[-1]

    first.server("ubre").handle("slow", slow)
    await serving(first, second)
    client = await ubre_client(at_second["ubre"])
    try:
        held = [client.request("slow", index) for index in range(2)]
        await eventually(lambda: len(waiting) == 2)
        busy = await failure_of(client.request("slow", 3))
        assert busy.body == "TooManyRequests" and first.cluster.calls.refused == 1
        for index, d in enumerate(waiting):
            d.callback(index)
        assert await wait_for(defer.gatherResults(held)) == [0, 1]
        assert first.cluster.calls.answering == 0
    finally:
        await wait_for(client.close())


@pytest_twisted.ensureDeferred
async def test_rights_to_call_are_checked_where_the_client_is(broker, nats, tmp_path):
    text = f"""
[auth]
[[listen]]
protocol = "ubre"
transport = "lines"
endpoint = "tcp:0:{LOCAL}"
principal = "alice"
[[listen]]
protocol = "nydus"
transport = "lines"
endpoint = "tcp:0:{LOCAL}"
principal = "alice"
[[acl]]
principal = "alice"
call = ["echo", "open/#"]
[cluster]
url = "{nats.url}"
heartbeat_interval = 0.2
lease = 1.0
"""
    services = []
    for _ in range(2):
        service, bound = await broker.start_config(config_from_toml(text, reactor=reactor))
        await wait_for(service.cluster.when_ready(), 10)
        services.append((service, {entry.listener.protocol: entry.address for entry in bound}))
    (first, _), (second, at_second) = services
    principals = []
    first.server("ubre").handle({
        "echo": lambda body, peer: principals.append(peer.principal.name) or body,
        "secret": lambda body, peer: "the secret",
    })
    first.server("nydus").register_route("/:zone/x", lambda invocation: invocation.params)
    await serving(first, second)
    ubre = await ubre_client(at_second["ubre"])
    nydus = await wait_for(nydus_connect(reactor, at_second["nydus"]))
    try:
        assert await wait_for(ubre.request("echo", "hi")) == "hi"
        assert (await failure_of(ubre.request("secret"))).body == "Forbidden"
        assert await wait_for(nydus.invoke("/open/x")) == {"zone": "open"}
        assert (await failure_of(nydus.invoke("/closed/x"))).status == 403
    finally:
        await wait_for(ubre.close())
        await wait_for(nydus.close())
    assert principals == ["alice"]
    assert first.cluster.calls.answered == 2  # the forbidden ones never left their process


@pytest.mark.parametrize("body", [None, "", 0, [], {"a": {"b": [1.5, True, None]}}, "ünï"])
@pytest_twisted.ensureDeferred
async def test_any_json_body_crosses_as_itself(broker, nats, body):
    first, _ = await broker_on(broker, nats)
    second, at_second = await broker_on(broker, nats)
    first.server("ubre").handle("echo", lambda value, peer: value)
    await serving(first, second)
    client = await ubre_client(at_second["ubre"])
    try:
        assert await wait_for(client.request("echo", body)) == body
    finally:
        await wait_for(client.close())


@pytest_twisted.ensureDeferred
async def test_a_call_whose_body_cannot_be_read_is_refused_at_once_not_left_to_time_out(
        broker, nats):
    first, _ = await broker_on(broker, nats, call_timeout=30.0)
    second, _ = await broker_on(broker, nats)
    first.server("ubre").handle("echo", lambda value, peer: value)
    await serving(first, second)
    # An envelope of wireproto's whose JSON body does not parse.
    import msgpack

    from wireproto.access.policy import Principal
    from wireproto.cluster.calls import pack_caller
    from wireproto.protocols.calls import RemoteCaller

    caller = RemoteCaller("ubre", "127.0.0.1:1", 1, None, Principal("someone"), "")
    payload = msgpack.packb([pack_caller(caller, "elsewhere/1"), None, None, False, 1, b"{nope"])
    subject = first.cluster.subjects.call("ubre", "echo")
    headers, body = await wait_for(
        second.cluster.client.request(subject, payload, timeout=5.0), 10)
    assert b"Wp-Status: failed" in headers and body == b""


@pytest_twisted.ensureDeferred
async def test_an_admin_call_answered_elsewhere_names_the_admin_pages_process(broker, nats):
    """Where an admin call is answered does not change who its handler sees calling: the node
    the admin page gave its caller."""
    from wireproto.access.policy import Principal
    from wireproto.protocols.calls import RemoteCaller

    first, _ = await broker_on(broker, nats)
    second, _ = await broker_on(broker, nats)
    first.server("ubre").handle("who", lambda value, caller: [caller.node, caller.protocol])
    await serving(first, second)
    admin = RemoteCaller("admin", "127.0.0.1:1", 0, None, Principal("root"), second.node)
    answer = await wait_for(second.server("ubre").call("who", None, admin), 10)
    assert answer.succeeded and answer.body == [second.node, "admin"]


@pytest_twisted.ensureDeferred
async def test_a_stopping_link_asks_no_other_process(broker, nats):
    first, _ = await broker_on(broker, nats)
    second, _ = await broker_on(broker, nats)
    first.server("nydus").register_route("/far", lambda invocation: "far")
    await serving(first, second)
    link = second.cluster
    assert link.served_elsewhere("nydus").names
    link.running = False  # as between stop()'s first line and the hub leaving the link
    try:
        from wireproto.access.policy import Principal
        from wireproto.protocols.calls import Call, CallNotFound, RemoteCaller

        call = Call("nydus", "p/far", None, RemoteCaller("nydus", "-", 0, None,
                                                          Principal("x"), ""), path="/far")
        assert isinstance(await failure_of(link.call(call)), CallNotFound)
        assert link.served_elsewhere("nydus").names == []
    finally:
        link.running = True
