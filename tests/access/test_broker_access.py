"""Access control in a running broker, on real sockets: who gets in over WebSocket and Engine.IO,
and what each principal may publish, subscribe and call in WEBSMQ, UBRE, nydus and
SubbleSocket."""

from __future__ import annotations

import re
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.logger import globalLogPublisher

from tests.access.conftest import AuthFiles, basic, http_handshake
from tests.node_peer import NodePeers
from tests.support import Inbox, eventually, need_interop_peer, sleep, wait_for
from wireproto.access import Action
from wireproto.codecs.subble import MessageCode
from wireproto.config import config_from_toml
from wireproto.protocols.rpc import RequestFailed
from wireproto.protocols.subble.client import EventRefused, HandshakeRefused, SubbleClient
from wireproto.protocols.ubre.client import UbreClient
from wireproto.protocols.ubre.peer import FORBIDDEN
from wireproto.protocols.websmq.client import connect

# Tests whose promises the fast path must keep run on both of its paths.
on_both_fast_paths = pytest.mark.usefixtures("fast_path")


LISTEN = """
[[listen]]
protocol = "websmq"
transport = "ws"
endpoint = "tcp:0"
[[listen]]
protocol = "ubre"
transport = "ws"
endpoint = "tcp:0"
[[listen]]
protocol = "nydus"
transport = "engineio"
endpoint = "tcp:0"
"""

RULES = """
[[acl]]
principal = "alice"
publish = ["users/%u/#", "chat/+"]
subscribe = ["users/%u/#", "chat/#"]
call = ["echo"]

[[acl]]
role = "admin"
publish = ["#"]
subscribe = ["#"]
call = ["#"]

[[acl]]
principal = "carol"
call = ["echo"]

[[acl]]
subscribe = ["public/#"]

[websmq]
wildcards = true
"""


@dataclass
class Running:
    """A broker with [auth] on the listeners above: its service and each protocol's address."""

    service: Any
    addresses: dict[str, str]

    def port(self, protocol: str) -> int:
        return int(self.addresses[protocol].split(":")[2].split("/")[0])


async def start(broker: Any, auth_files: AuthFiles, extra: str = "", **auth: Any) -> Running:
    text = LISTEN + auth_files.auth_table(**auth) + RULES + extra
    config = config_from_toml(text, reactor=reactor)
    service, bound = await broker.start_config(config)
    ubre = service.server("ubre")
    ubre.handle("echo", lambda body, peer: body)
    ubre.handle("secret", lambda body, peer: "the secret")
    return Running(service, {b.listener.protocol: b.address for b in bound})


# -- who gets in ------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_websocket_handshake_without_good_credentials_is_refused_with_401(
    broker: Any, auth_files: AuthFiles
) -> None:
    running = await start(broker, auth_files)
    port = running.port("websmq")
    service = running.service
    cases = {
        "none": {},
        "a wrong key": {"Authorization": "Bearer " + auth_files.token(key=b"k" * 32)},
        "expired": {"Authorization": "Bearer " + auth_files.token(lifetime=-60)},
        "garbage": {"Authorization": "Bearer not.a.token"},
        "a wrong password": {"Authorization": basic("carol", "guess")},
        "an unknown user": {"Authorization": basic("mallory", "guess")},
        "an unknown scheme": {"Authorization": "Digest abc"},
    }
    for what, headers in cases.items():
        answer = await http_handshake(port, "/websmq", headers)
        assert answer.status == 401, what
        assert answer.headers["www-authenticate"].startswith('Bearer realm="wireproto"'), what
        assert "Basic" in answer.headers["www-authenticate"]
    assert service.hub.sessions == {}
    outcomes = service.auth.outcomes
    assert outcomes["missing"] == 1 and outcomes["bad_password"] == 2
    assert outcomes["expired"] == 1


@pytest_twisted.ensureDeferred
async def test_good_credentials_open_a_websocket_as_their_principal(
    broker: Any, auth_files: AuthFiles
) -> None:
    running = await start(broker, auth_files)
    service = running.service
    by_header = await broker.client(
        running.addresses["websmq"], headers={"Authorization": "Bearer " + auth_files.token()}
    )
    by_query = await broker.client(running.addresses["websmq"] + "?access_token="
                                   + auth_files.token("bob"))
    by_password = await broker.client(
        running.addresses["websmq"], headers={"Authorization": basic("carol", "carol's password")}
    )
    await eventually(lambda: len(service.hub.sessions) == 3)
    names = sorted(session.principal.name for session in service.hub.sessions)
    assert names == ["alice", "bob", "carol"]
    for client in (by_header, by_query, by_password):
        assert client.connected


@pytest_twisted.ensureDeferred
async def test_anonymous_connections_get_in_only_when_the_auth_table_says_so(
    broker: Any, auth_files: AuthFiles
) -> None:
    running = await start(broker, auth_files, anonymous=True)
    service = running.service
    client = await broker.client(running.addresses["websmq"])
    await eventually(lambda: len(service.hub.sessions) == 1)
    (session,) = service.hub.sessions
    assert session.principal.name is None
    # Only the rule for everyone applies.
    assert session.may(Action.SUBSCRIBE, "public/news")
    assert not session.may(Action.SUBSCRIBE, "chat/room")
    assert client.connected


@on_both_fast_paths
@pytest_twisted.ensureDeferred
async def test_the_token_never_reaches_the_log_or_a_capture(
    broker: Any, auth_files: AuthFiles, tmp_path: Path
) -> None:
    captures = tmp_path / "captures"
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        running = await start(broker, auth_files, f'[capture]\ndirectory = "{captures}"\n'
                                                  "flush_interval = 0.05\n")
        good = auth_files.token()
        expired = auth_files.token(lifetime=-60)
        client = await broker.client(running.addresses["websmq"] + "?access_token=" + good)
        await client.subscribe("users/alice/inbox")
        await http_handshake(running.port("websmq"), "/websmq?access_token=" + expired)
        await http_handshake(running.port("websmq"), "/websmq",
                             {"Authorization": basic("carol", "carol's password")})
        await sleep(0.2)
        await wait_for(running.service.stopService())  # writes out the capture
    finally:
        globalLogPublisher.removeObserver(events.append)
    text = repr(events)
    assert good not in text and expired not in text
    assert "carol's password" not in text
    captured = b"".join(path.read_bytes() for path in captures.iterdir())
    assert b"users/alice/inbox" in captured  # the capture has the connection's messages ...
    assert good.encode() not in captured and b"access_token" not in captured  # ... no token
    assert any(event.get("event") == "auth_failed" for event in events)
    assert any(event.get("event") == "authenticated" and event.get("principal") == "alice"
               for event in events)


# -- WEBSMQ ------------------------------------------------------------------------------------


@on_both_fast_paths
@pytest_twisted.ensureDeferred
async def test_websmq_does_only_what_the_rules_allow(broker: Any, auth_files: AuthFiles) -> None:
    running = await start(broker, auth_files)
    service = running.service
    address = running.addresses["websmq"]
    alice = await broker.client(address, wildcards=True, headers={
        "Authorization": "Bearer " + auth_files.token()})
    admin = await broker.client(address, wildcards=True, headers={
        "Authorization": "Bearer " + auth_files.token("root", roles=["admin"])})
    alice_wide = await broker.client(address, wildcards=True, headers={
        "Authorization": "Bearer " + auth_files.token()})
    seen_by_admin, seen_by_alice, seen_wide = Inbox(), Inbox(), Inbox()
    admin.subscribe("#", seen_by_admin)
    alice.subscribe("users/alice/inbox", seen_by_alice)  # allowed
    alice.subscribe("users/bob/inbox", seen_by_alice)  # not: silently not subscribed
    alice_wide.subscribe("users/#", seen_wide)  # wider than allowed
    await eventually(lambda: service.hub.denied.get(("websmq", "subscribe")) == 2)
    alice.publish("admin/shutdown", b"no")  # not allowed: never delivered
    alice.publish("chat/room", b"hello")  # allowed
    await seen_by_admin.wait(1)
    admin.publish("users/bob/inbox", b"for bob")
    admin.publish("users/alice/inbox", b"for alice")
    await seen_by_alice.wait(1)
    await sleep(0.1)
    assert [(m.topic, m.payload) for m in seen_by_admin.messages] == [("chat/room", b"hello")]
    assert [(m.topic, m.payload) for m in seen_by_alice.messages] == [
        ("users/alice/inbox", b"for alice")]
    assert seen_wide.messages == []
    assert service.hub.denied[("websmq", "publish")] == 1
    assert alice.connected and alice_wide.connected


@on_both_fast_paths
@pytest_twisted.ensureDeferred
async def test_a_repeat_offender_is_closed_after_close_after_denials(
    broker: Any, auth_files: AuthFiles
) -> None:
    running = await start(broker, auth_files, close_after_denials=3)
    alice = await broker.client(running.addresses["websmq"], headers={"Authorization": "Bearer "
                                                               + auth_files.token()})
    for number in range(3):
        alice.publish(f"admin/{number}", b"x")
    await sleep(0.2)
    assert alice.connected
    alice.publish("admin/3", b"x")
    await eventually(lambda: not alice.connected)


# -- UBRE ---------------------------------------------------------------------------------------


@on_both_fast_paths
@pytest_twisted.ensureDeferred
async def test_ubre_requests_and_subscriptions_follow_the_rules(
    broker: Any, auth_files: AuthFiles
) -> None:
    running = await start(broker, auth_files)
    service = running.service
    url = running.addresses["ubre"] + "?access_token=" + auth_files.token()
    client = UbreClient(reactor, url)
    await wait_for(client.connect())
    try:
        assert await wait_for(client.request("echo", {"a": 1})) == {"a": 1}
        refused = client.request("secret", None)
        with pytest.raises(RequestFailed) as failed:
            await wait_for(refused)
        assert failed.value.body == FORBIDDEN
        got = Inbox()
        client.subscribe("users/bob/inbox", got)
        client.subscribe("users/alice/inbox", got)
        await eventually(lambda: service.hub.denied.get(("ubre", "subscribe")) == 1)
        await eventually(lambda: "users/alice/inbox" in service.hub.topics())
        assert "users/bob/inbox" not in service.hub.topics()
        assert service.hub.denied[("ubre", "call")] == 1
    finally:
        await wait_for(client.close())


# -- nydus, with the real nydus-client --------------------------------------------------------

INTEROP = Path(__file__).resolve().parents[1] / "interop"
NYDUS_CLIENT = INTEROP / "nydus_client.mjs"


@pytest_twisted.async_yield_fixture
async def node() -> Any:
    need_interop_peer(INTEROP / "node_modules" / "nydus-client", "nydus-client")
    peers = NodePeers(shutil.which("node") or "node")
    try:
        yield peers.start
    finally:
        await peers.stop()


def nydus_url(address: str) -> str:
    return address.removesuffix("/engine.io/")


@pytest.mark.parametrize("mode", ["default", "websocket", "polling"])
@pytest_twisted.ensureDeferred
async def test_nydus_client_with_a_token_calls_subscribes_and_is_refused_what_it_may_not(
    broker: Any, auth_files: AuthFiles, node: Any, mode: str
) -> None:
    running = await start(broker, auth_files)
    service = running.service
    nydus = service.server("nydus")
    nydus.register_route("/echo", lambda call: call.body)
    nydus.register_route("/secret", lambda call: "the secret")
    client = await node(NYDUS_CLIENT, nydus_url(running.addresses["nydus"]), mode,
                        auth_files.token(), ready="connect")
    client.command('invoke 1 /echo {"a":1}')
    client.command("invoke 2 /secret")
    client.command('invoke 3 /_hub/subscribe "/users/alice/inbox"')
    client.command('invoke 4 /_hub/subscribe "/users/bob/inbox"')
    client.command('invoke 5 /_hub/publish {"path":"/admin/x","data":1}')
    client.command('invoke 6 /_hub/publish {"path":"/chat/room","data":2}')
    assert (await client.wait("result", id="1"))[0]["data"] == {"a": 1}
    assert (await client.wait("error", id="2"))[0]["status"] == 403
    await client.wait("result", id="3")
    refused = (await client.wait("error", id="4"))[0]
    assert (refused["status"], refused["message"]) == (403, "Forbidden")
    assert (await client.wait("error", id="5"))[0]["status"] == 403
    assert (await client.wait("result", id="6"))[0]["data"] == {"delivered": 0, "processes": 1}
    assert "users/alice/inbox" in service.hub.topics()
    assert "users/bob/inbox" not in service.hub.topics()
    (session,) = service.hub.sessions
    assert session.principal.name == "alice"
    denied = service.hub.denied
    assert (denied[("nydus", "call")], denied[("nydus", "subscribe")],
            denied[("nydus", "publish")]) == (1, 1, 1)


@pytest_twisted.ensureDeferred
async def test_nydus_client_without_a_token_hears_unauthorized(
    broker: Any, auth_files: AuthFiles, node: Any
) -> None:
    running = await start(broker, auth_files)
    client = await node(NYDUS_CLIENT, nydus_url(running.addresses["nydus"]), "default",
                        ready="unauthorized")
    assert client.of("connect") == []
    answer = await http_handshake(running.port("nydus"),
                                  "/engine.io/?EIO=4&transport=polling", websocket=False)
    assert answer.status == 403
    assert answer.raw.endswith(b'{"code":4,"message":"Forbidden"}')
    assert running.service.hub.sessions == {}


@pytest_twisted.ensureDeferred
async def test_an_engineio_handshake_takes_the_token_in_the_query_too(
    broker: Any, auth_files: AuthFiles, node: Any
) -> None:
    running = await start(broker, auth_files)
    url = nydus_url(running.addresses["nydus"]) + "?access_token=" + auth_files.token("bob")
    await node(NYDUS_CLIENT, url, "polling", ready="connect")
    (session,) = running.service.hub.sessions
    assert session.principal.name == "bob"


# -- SubbleSocket ------------------------------------------------------------------------------


@on_both_fast_paths
@pytest_twisted.ensureDeferred
async def test_subble_handshake_and_events_follow_the_rules(
    broker: Any, auth_files: AuthFiles
) -> None:
    text = (auth_files.auth_table() + RULES
            + '[[listen]]\nprotocol = "subble"\ntransport = "ws"\nendpoint = "tcp:0"\n')
    service, bound = await broker.start_config(config_from_toml(text, reactor=reactor))
    url = bound[0].address + "?access_token=" + auth_files.token()
    refused = SubbleClient(reactor, url, subscribe=["users/bob/inbox"])
    with pytest.raises(HandshakeRefused) as handshake:
        await wait_for(refused.connect())
    assert handshake.value.code == MessageCode.IP_NOT_ALLOWED
    client = SubbleClient(reactor, url, subscribe=["users/alice/inbox"],
                          produce=["chat/room", "admin/x"])
    await wait_for(client.connect())
    try:
        assert (await wait_for(client.produce("chat/room", {"hi": 1}))).type == "chat/room"
        with pytest.raises(EventRefused) as event:
            await wait_for(client.produce("admin/x", {"no": 1}))
        assert event.value.code == MessageCode.EVENT_FORBIDDEN
        assert client.connected
    finally:
        await wait_for(client.close())
    assert service.hub.denied[("subble", "subscribe")] == 1
    assert service.hub.denied[("subble", "publish")] == 1


# -- reloading on SIGHUP ----------------------------------------------------------------------


async def in_output(child: Any, pattern: str) -> None:
    """`pattern` in a line of the log (stderr for `wireproto serve`, stdout under twistd -n)."""
    found = re.compile(pattern)
    await eventually(lambda: any(map(found.search, child.stderr + child.stdout)), timeout=15)


TWISTD = str(Path(sys.executable).parent / "twistd")


@on_both_fast_paths
@pytest.mark.parametrize("runner", ["serve", "twistd"])
@pytest_twisted.ensureDeferred
async def test_sighup_rereads_the_rules_and_ends_a_revoked_subscription(
    auth_files: AuthFiles, runner: str
) -> None:
    from tests.test_cli import LISTENER_LINE, Child

    config = auth_files.directory / "wireproto.toml"
    listen = '[[listen]]\nprotocol = "websmq"\ntransport = "length32"\nendpoint = "tcp:0"\n'
    listen += 'principal = "alice"\n[log]\nlevel = "info"\n'
    allowed = '[[acl]]\nprincipal = "alice"\npublish = ["chat/#"]\nsubscribe = ["chat/#"]\n'
    config.write_text(listen + auth_files.auth_table() + allowed)
    if runner == "serve":
        child = Child(sys.executable, "-m", "wireproto", "serve", "--config", str(config))
    else:
        child = Child(TWISTD, "-n", "--pidfile=", "wireproto", "--config", str(config))
    try:
        address = (await child.line(LISTENER_LINE)).group(3)
        subscriber = await wait_for(connect(reactor, address, framing="length32"))
        publisher = await wait_for(connect(reactor, address, framing="length32"))
        received = Inbox()
        subscriber.subscribe("chat/room", received)

        def delivered() -> bool:
            if not received.messages:
                publisher.publish("chat/room", b"before")
            return bool(received.messages)

        await eventually(delivered, interval=0.05)
        # A bad file first: the old rules stay.
        config.write_text(listen + auth_files.auth_table() + "[[acl]]\nprincipal = 'alice'\n")
        child.process.send_signal(signal.SIGHUP)
        await in_output(child, r"reload failed, keeping the old rules.*grants nothing")
        config.write_text(listen + auth_files.auth_table()
                          + '[[acl]]\nprincipal = "alice"\npublish = ["chat/#"]\n')
        child.process.send_signal(signal.SIGHUP)
        await in_output(child, r"reload: 1 access rules; 1 subscriptions ended")
        count = len(received.messages)
        publisher.publish("chat/room", b"after")
        await sleep(0.3)
        assert len(received.messages) == count
        assert subscriber.connected and publisher.connected
        for client in (subscriber, publisher):
            await wait_for(client.disconnect())
    finally:
        child.kill()


@pytest_twisted.ensureDeferred
async def test_metrics_count_authentications_and_denials(
    broker: Any, auth_files: AuthFiles
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    running = await start(broker, auth_files)
    port = running.port("websmq")
    await http_handshake(port, "/websmq")
    alice = await broker.client(running.addresses["websmq"], headers={"Authorization": "Bearer "
                                                               + auth_files.token()})
    alice.publish("admin/x", b"no")
    service = running.service
    await eventually(lambda: service.hub.denied.get(("websmq", "publish")) == 1)
    answer = await http_handshake(port, "/metrics", websocket=False)
    text = answer.raw.partition(b"\r\n\r\n")[2].decode()
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(text) for sample in family.samples}
    assert samples[("wireproto_authentications_total", (("outcome", "ok"),))] == 1
    assert samples[("wireproto_authentications_total", (("outcome", "missing"),))] == 1
    assert samples[("wireproto_denied_total", (("action", "publish"),
                                               ("protocol", "websmq")))] == 1


@on_both_fast_paths
@pytest_twisted.ensureDeferred
async def test_a_listener_admits_only_the_principals_it_allows_403_for_the_others(
    broker: Any, auth_files: AuthFiles
) -> None:
    text = ('[[listen]]\nprotocol = "websmq"\ntransport = "ws"\nendpoint = "tcp:0"\n'
            'allow = ["carol", "role:admin"]\n' + auth_files.auth_table() + RULES)
    service, bound = await broker.start_config(config_from_toml(text, reactor=reactor))
    port = int(bound[0].address.split(":")[2].split("/")[0])
    alice = {"Authorization": "Bearer " + auth_files.token()}
    admin = {"Authorization": "Bearer " + auth_files.token("root", roles=["admin"])}
    carol = {"Authorization": basic("carol", "carol's password")}
    refused = await http_handshake(port, "/websmq", alice)
    assert refused.status == 403
    assert "www-authenticate" not in refused.headers  # known, just not here: no challenge
    assert (await http_handshake(port, "/websmq", {})).status == 401
    assert service.hub.sessions == {}
    for headers in (admin, carol):
        await broker.client(bound[0].address, headers=headers)
    await eventually(lambda: len(service.hub.sessions) == 2)
    assert service.auth.outcomes["listener"] == 1


# -- the command-line tools take credentials ---------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_the_call_tool_sends_a_token_or_a_user_and_password(
    broker: Any, auth_files: AuthFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_cli import Child

    running = await start(broker, auth_files)
    url = running.addresses["ubre"]
    call = (sys.executable, "-m", "wireproto", "call", url, "echo", '{"a":1}')
    with_token = Child(*call, "--token", auth_files.token())
    assert await with_token.exit_code() == 0, with_token.output()
    assert with_token.stdout == ['{"a":1}']
    monkeypatch.setenv("WIREPROTO_PASSWORD", "carol's password")
    with_password = Child(*call, "--user", "carol")
    assert await with_password.exit_code() == 0, with_password.output()
    monkeypatch.setenv("WIREPROTO_TOKEN", auth_files.token("root", roles=["admin"]))
    from_environment = Child(sys.executable, "-m", "wireproto", "call", url, "secret")
    assert await from_environment.exit_code() == 0, from_environment.output()
    assert from_environment.stdout == ['"the secret"']
    monkeypatch.delenv("WIREPROTO_TOKEN")
    without = Child(*call)
    assert await without.exit_code() != 0
    assert "401" in without.output()
    forbidden = Child(sys.executable, "-m", "wireproto", "call", url, "secret", "--token",
                      auth_files.token())
    assert await forbidden.exit_code() != 0
    assert "Forbidden" in forbidden.output()


@pytest_twisted.ensureDeferred
async def test_a_megabyte_token_is_refused_unread(broker: Any, auth_files: AuthFiles) -> None:
    running = await start(broker, auth_files)
    port = running.port("websmq")
    service = running.service
    huge = auth_files.token(padding="x" * (1 << 20))
    as_header = await http_handshake(port, "/websmq", {"Authorization": "Bearer " + huge})
    as_query = await http_handshake(port, "/websmq?access_token=" + huge)
    just_over = auth_files.token(padding="x" * 9000)  # fits HTTP's limits, not the verifier's
    over_limit = await http_handshake(port, "/websmq", {"Authorization": "Bearer " + just_over})
    # Refused by HTTP's own limits on a request's head, before any credential is read.
    assert as_header.status in (0, 400, 431) and as_query.status in (0, 400, 414)
    assert over_limit.status == 401
    assert service.hub.sessions == {}
    assert service.auth.outcomes.get("too_large") == 1
