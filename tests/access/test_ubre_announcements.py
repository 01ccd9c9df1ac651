"""What a UBRE client hears of other connections' topics, with the real ubre.js 0.0.23 as the
client: the broker announces a topic (`{"subscribe": topic}`) so that ubre.js publishes on it,
and must not tell a client about topics it could not publish on anyway: with [auth], only those
its rules let it publish on; with a listener's `announce = "own"`, only those it subscribes to
itself. Each test ends an announcement wait with a later topic the client may hear of, so that
anything it must not hear would already be in (announcements go in order on one connection)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.access.conftest import AuthFiles
from tests.node_peer import NodePeer, NodePeers
from tests.support import Inbox, eventually, need_interop_peer, wait_for
from wireproto.access import AccessRule
from wireproto.codecs.ubre import Publish
from wireproto.config import ConfigError, config_from_toml
from wireproto.protocols.ubre.client import UbreClient

INTEROP = Path(__file__).resolve().parents[1] / "interop"
CLIENT = INTEROP / "ubre_ws_client.js"

SECRET_TOPIC = "users/bob/inbox-7f3a9c-secret-room"

UBRE_WS = '[[listen]]\nprotocol = "ubre"\ntransport = "ws"\nendpoint = "tcp:0"\n'

RULES = """
[[acl]]
principal = "alice"
publish = ["chat/+"]
subscribe = ["chat/#"]

[[acl]]
principal = "bob"
publish = ["users/%u/#"]
subscribe = ["users/%u/#"]

[[acl]]
publish = ["public/#"]
subscribe = ["public/#"]
"""


@pytest.fixture
def node_executable() -> str:
    need_interop_peer(INTEROP / "node_modules" / "ws7", "ubre.js's WebSocket wrapper")
    return need_interop_peer(INTEROP / "node_modules" / "ubre", "ubre.js")


@pytest_twisted.async_yield_fixture
async def node(node_executable: str) -> Any:
    peers = NodePeers(node_executable)
    try:
        yield peers
    finally:
        await peers.stop()


class Ubre:
    """A broker's one UBRE listener, and the Python clients a test makes on it."""

    def __init__(self, service: Any, url: str) -> None:
        self.service = service
        self.url = url
        self.clients: list[UbreClient] = []

    def address(self, token: str | None = None) -> str:
        return self.url if token is None else f"{self.url}?access_token={token}"

    async def client(self, token: str | None = None) -> UbreClient:
        client = UbreClient(reactor, self.address(token))
        self.clients.append(client)
        return await wait_for(client.connect())

    async def subscribed(self, topic: str) -> None:
        await eventually(lambda: bool(self.service.hub.subscribers(topic)))

    async def close(self) -> None:
        for client in self.clients:
            await wait_for(client.close())


@pytest_twisted.async_yield_fixture
async def start(broker: Any) -> Any:
    started: list[Ubre] = []

    async def run(text: str) -> Ubre:
        service, bound = await broker.start_config(config_from_toml(text, reactor=reactor))
        ubre = Ubre(service, bound[0].address)
        started.append(ubre)
        return ubre

    try:
        yield run
    finally:
        for ubre in started:
            await ubre.close()


async def ubre_js(node: NodePeers, address: str, *commands: str) -> NodePeer:
    return await node.start(CLIENT, address, *commands, ready="open")


def heard(peer: NodePeer) -> list[str]:
    return [event["topic"] for event in peer.of("peer-subscribe")]


# -- with [auth]: only topics the client may publish on -----------------------------------------


@pytest_twisted.ensureDeferred
async def test_with_auth_a_ubre_js_client_hears_only_topics_it_may_publish_on(
    start: Any, node: NodePeers, auth_files: AuthFiles
) -> None:
    ubre = await start(UBRE_WS + auth_files.auth_table(anonymous=True) + RULES)
    bob = await ubre.client(auth_files.token("bob"))
    bob.subscribe(SECRET_TOPIC, Inbox())
    await ubre.subscribed(SECRET_TOPIC)
    chat = Inbox()
    (await ubre.client(auth_files.token("alice"))).subscribe("chat/room", chat)
    await ubre.subscribed("chat/room")

    alice = await ubre_js(node, ubre.address(auth_files.token("alice")))
    stranger = await ubre_js(node, ubre.address())  # anonymous
    await alice.wait("peer-subscribe", topic="chat/room")

    watcher = await ubre.client(auth_files.token("alice"))
    watcher.subscribe("public/news", Inbox())  # a topic everyone may publish on, started later
    await stranger.wait("peer-subscribe", topic="public/news")
    await alice.wait("peer-subscribe", topic="public/news")
    assert heard(stranger) == ["public/news"]
    assert heard(alice) == ["chat/room", "public/news"]

    # Bob leaving is not announced either.
    await wait_for(bob.close())
    await eventually(lambda: not ubre.service.hub.subscribers(SECRET_TOPIC))
    watcher.unsubscribe("public/news")
    await stranger.wait("peer-unsubscribe", topic="public/news")
    await alice.wait("peer-unsubscribe", topic="public/news")
    for peer in (stranger, alice):
        assert [event["topic"] for event in peer.of("peer-unsubscribe")] == ["public/news"]

    # What alice may publish on she still can: ubre.js sends it, and it arrives.
    alice.command('pub chat/room {"from":"ubre.js"}')
    assert await chat.wait() == [Publish("chat/room", {"from": "ubre.js"})]
    assert not alice.of("close") and not stranger.of("close")


@pytest_twisted.ensureDeferred
async def test_a_reload_announces_what_the_new_rules_allow_and_withdraws_the_rest(
    start: Any, node: NodePeers, auth_files: AuthFiles
) -> None:
    ubre = await start(UBRE_WS + auth_files.auth_table() + RULES)
    (await ubre.client(auth_files.token("alice"))).subscribe("chat/room", Inbox())
    (await ubre.client(auth_files.token("bob"))).subscribe(SECRET_TOPIC, Inbox())
    await ubre.subscribed("chat/room")
    await ubre.subscribed(SECRET_TOPIC)
    alice = await ubre_js(node, ubre.address(auth_files.token("alice")))
    await alice.wait("peer-subscribe", topic="chat/room")

    # Alice may no longer publish on chat/+, and now may on bob's inbox (she may not read it).
    rules = (AccessRule(principal="alice", subscribe=("chat/#",), publish=("users/bob/#",)),
             AccessRule(principal="bob", publish=("users/%u/#",), subscribe=("users/%u/#",)))
    assert ubre.service.reload_auth(rules)
    await alice.wait("peer-unsubscribe", topic="chat/room")
    await alice.wait("peer-subscribe", topic=SECRET_TOPIC)
    assert heard(alice) == ["chat/room", SECRET_TOPIC]


# -- without [auth] ------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_without_auth_the_brokers_own_sys_topics_are_not_announced(
    start: Any, node: NodePeers
) -> None:
    # Without rules only the broker publishes on $SYS: announcing one would have ubre.js send a
    # publish the broker refuses.
    ubre = await start(UBRE_WS)
    (await ubre.client()).subscribe("$SYS/broker/version", Inbox())
    await ubre.subscribed("$SYS/broker/version")
    peer = await ubre_js(node, ubre.address())
    (await ubre.client()).subscribe("later", Inbox())
    await peer.wait("peer-subscribe", topic="later")
    assert heard(peer) == ["later"]


@pytest_twisted.ensureDeferred
async def test_a_listener_with_announce_own_tells_a_client_only_its_own_topics(
    start: Any, node: NodePeers
) -> None:
    ubre = await start(UBRE_WS + 'announce = "own"\n')
    secret = await ubre.client()
    secret.subscribe(SECRET_TOPIC, Inbox())
    chat = Inbox()
    (await ubre.client()).subscribe("chat/room", chat)
    await ubre.subscribed(SECRET_TOPIC)

    peer = await ubre_js(node, ubre.address())
    # Its own subscription is announced back, so ubre.js publishes on it; nothing else is.
    peer.command("sub chat/room")
    await peer.wait("peer-subscribe", topic="chat/room")
    peer.command('pub chat/room {"n":1}')
    assert await chat.wait() == [Publish("chat/room", {"n": 1})]

    await wait_for(secret.close())
    await eventually(lambda: not ubre.service.hub.subscribers(SECRET_TOPIC))
    peer.command("unsub chat/room")
    await peer.wait("peer-unsubscribe", topic="chat/room")
    assert heard(peer) == ["chat/room"]
    assert [event["topic"] for event in peer.of("peer-unsubscribe")] == ["chat/room"]


@pytest_twisted.ensureDeferred
async def test_announce_own_with_auth_keeps_to_what_the_client_may_publish_on(
    start: Any, node: NodePeers, auth_files: AuthFiles
) -> None:
    rules = RULES + '[[acl]]\nprincipal = "carol"\nsubscribe = ["news/#"]\npublish = ["news/a"]\n'
    ubre = await start(UBRE_WS + 'announce = "own"\n' + auth_files.auth_table() + rules)
    carol = await ubre_js(node, ubre.address(auth_files.token("carol")))
    carol.command("sub news/b")  # she may read it, not publish on it
    carol.command("sub news/a")
    await carol.wait("peer-subscribe", topic="news/a")
    assert heard(carol) == ["news/a"]


@pytest_twisted.ensureDeferred
async def test_announce_own_follows_a_reload_too(
    start: Any, node: NodePeers, auth_files: AuthFiles
) -> None:
    rules = RULES + '[[acl]]\nprincipal = "carol"\nsubscribe = ["news/#"]\npublish = ["news/a"]\n'
    ubre = await start(UBRE_WS + 'announce = "own"\n' + auth_files.auth_table() + rules)
    carol = await ubre_js(node, ubre.address(auth_files.token("carol")), "sub news/a", "sub news/b")
    await carol.wait("peer-subscribe", topic="news/a")
    assert ubre.service.reload_auth(
        (AccessRule(principal="carol", subscribe=("news/#",), publish=("news/b",)),))
    await carol.wait("peer-unsubscribe", topic="news/a")
    await carol.wait("peer-subscribe", topic="news/b")
    assert heard(carol) == ["news/a", "news/b"]


# -- the option in the config file ----------------------------------------------------------------


def test_announce_is_a_ubre_listeners_option_with_two_values() -> None:
    config = config_from_toml(UBRE_WS + 'announce = "own"\n', reactor=reactor)
    assert config.listeners[0].announce == "own"
    with pytest.raises(ConfigError,
                       match=r"listen\[1\]\.announce: unknown value 'none'; use subscribed or own"):
        config_from_toml(UBRE_WS + 'announce = "none"\n', reactor=reactor)
    websmq = UBRE_WS.replace('"ubre"', '"websmq"') + 'announce = "own"\n'
    with pytest.raises(ConfigError, match=r"listen\[1\]\.announce: .*UBRE"):
        config_from_toml(websmq, reactor=reactor)
