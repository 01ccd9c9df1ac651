"""`%c` in a running broker, over real sockets with wireproto's SubbleSocket client: a client
chooses its own client ID, so the ID binds to something only once a named principal owns it.
A placeholder never stands for a `$` value, `%c` grants nothing to anonymous connections, and
the first named principal to use a client ID owns it, in the registry (and its file, across a
restart), so another is refused it later, connected or not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.access.conftest import AuthFiles
from tests.support import Inbox, eventually, wait_for
from wireproto.codecs.subble import MessageCode
from wireproto.config import config_from_toml
from wireproto.hub import HubMessage
from wireproto.protocols.subble.client import EventRefused, HandshakeRefused, SubbleClient

SUBBLE_WS = '[[listen]]\nprotocol = "subble"\ntransport = "ws"\nendpoint = "tcp:0"\n'

# The rule of the report: each client to its own corner of the topic space.
OWN_CORNER = """
[[acl]]
subscribe = ["%c/#", "devices/%c/#"]
publish = ["%c/#", "devices/%c/#"]
"""


class Subble:
    """A broker with [auth] and one SubbleSocket listener; its clients are closed at the end."""

    def __init__(self, service: Any, url: str, auth_files: AuthFiles) -> None:
        self.service = service
        self.url = url
        self.auth_files = auth_files
        self.clients: list[SubbleClient] = []

    def client(self, principal: str | None, client_id: str, **options: Any) -> SubbleClient:
        url = self.url
        if principal is not None:
            url += "?access_token=" + self.auth_files.token(principal)
        client = SubbleClient(reactor, url, client_id=client_id, **options)
        self.clients.append(client)
        return client

    async def connect(self, principal: str | None, client_id: str, **options: Any
                      ) -> SubbleClient:
        client = self.client(principal, client_id, **options)
        await wait_for(client.connect())
        return client

    async def refusal(self, principal: str | None, client_id: str, **options: Any) -> int:
        with pytest.raises(HandshakeRefused) as refused:
            await wait_for(self.client(principal, client_id, **options).connect())
        return refused.value.code

    async def close(self) -> None:
        for client in self.clients:
            if client.connected:
                await wait_for(client.close())


@pytest_twisted.async_yield_fixture
async def start(broker: Any, auth_files: AuthFiles) -> Any:
    started: list[Subble] = []

    async def run(extra: str = "", **auth: Any) -> Subble:
        text = SUBBLE_WS + auth_files.auth_table(anonymous=True, **auth) + OWN_CORNER + extra
        service, bound = await broker.start_config(config_from_toml(text, reactor=reactor))
        subble = Subble(service, bound[0].address, auth_files)
        started.append(subble)
        return subble

    try:
        yield run
    finally:
        for subble in started:
            await subble.close()


# -- no $ values, no %c for anonymous ----------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_client_id_of_sys_reads_and_forges_nothing_of_the_brokers_own(start: Any) -> None:
    subble = await start()
    # Reading: the handshake's subscription to the broker's version is refused.
    for principal in (None, "alice"):
        assert await subble.refusal(
            principal, "$SYS", subscribe=["$SYS/broker/version"]
        ) == MessageCode.IP_NOT_ALLOWED
    # Forging: a produce on it is refused, and no one gets it.
    reader = Inbox()
    subble.service.hub.subscribe_callback("$SYS/broker/version", reader)
    forger = await subble.connect(None, "$SYS", produce=["$SYS/broker/version"])
    with pytest.raises(EventRefused) as refused:
        await wait_for(forger.produce("$SYS/broker/version", "9.9.9"))
    assert refused.value.code == MessageCode.EVENT_FORBIDDEN
    assert reader.messages == []


@pytest_twisted.ensureDeferred
async def test_an_anonymous_client_id_grants_nothing(start: Any) -> None:
    subble = await start()
    assert await subble.refusal(
        None, "dev1", subscribe=["devices/dev1/cmd"]
    ) == MessageCode.IP_NOT_ALLOWED
    device = await subble.connect(None, "dev2", produce=["devices/dev2/state"])
    with pytest.raises(EventRefused):
        await wait_for(device.produce("devices/dev2/state", 1))


# -- a client ID belongs to the first named principal that uses it --------------------------------


@pytest_twisted.ensureDeferred
async def test_a_client_id_is_its_first_named_users_even_when_it_is_gone(start: Any) -> None:
    subble = await start()
    heard: list[Any] = []
    alice = await subble.connect("alice", "phone-7", subscribe=["devices/phone-7/cmd"],
                                 on_event=heard.append)
    subble.service.hub.publish(HubMessage("devices/phone-7/cmd", b'"lock"'))
    await eventually(lambda: heard)  # her corner is hers to read
    await wait_for(alice.close())

    # Not connected, still hers: bob, and anonymous, are refused it.
    assert await subble.refusal("bob", "phone-7") == MessageCode.INVALID_CLIENT_ID
    assert await subble.refusal(None, "phone-7") == MessageCode.INVALID_CLIENT_ID
    again = await subble.connect("alice", "phone-7", subscribe=["devices/phone-7/cmd"])
    await wait_for(again.close())
    # An ID first used anonymously is the first named principal's from then on.
    anonymous = await subble.connect(None, "tablet-2")
    await wait_for(anonymous.close())
    await wait_for((await subble.connect("bob", "tablet-2")).close())
    assert await subble.refusal("alice", "tablet-2") == MessageCode.INVALID_CLIENT_ID
    assert await subble.refusal(None, "tablet-2") == MessageCode.INVALID_CLIENT_ID
    # A new ID the host makes for a named client is that client's.
    fresh = await subble.connect("carol", "")
    new_id = fresh.client_id
    await wait_for(fresh.close())
    assert await subble.refusal("bob", new_id) == MessageCode.INVALID_CLIENT_ID


@pytest_twisted.ensureDeferred
async def test_ownership_is_kept_in_the_registry_file_across_a_restart(
    broker: Any, auth_files: AuthFiles, start: Any, tmp_path: Path
) -> None:
    registry = f'[subble]\nregistry = "{tmp_path / "clients.sqlite"}"\n'
    first = await start(registry)
    await wait_for((await first.connect("alice", "phone-7")).close())
    await first.close()
    await wait_for(first.service.stopService())

    second = await start(registry)
    assert await second.refusal("bob", "phone-7") == MessageCode.INVALID_CLIENT_ID
    await wait_for((await second.connect("alice", "phone-7")).close())


@pytest_twisted.ensureDeferred
async def test_one_principal_owns_at_most_max_ids_per_principal(start: Any) -> None:
    subble = await start("[subble]\nmax_ids_per_principal = 2\n")
    for client_id in ("a1", "a2"):
        await wait_for((await subble.connect("alice", client_id)).close())
    refused = subble.client("alice", "a3")
    with pytest.raises(HandshakeRefused) as refusal:
        await wait_for(refused.connect())
    assert refusal.value.code == MessageCode.UNKNOWN_HANDSHAKE_ERROR
    assert "alice owns 2 client IDs" in refusal.value.message
    assert await subble.refusal("alice", "") == MessageCode.UNKNOWN_HANDSHAKE_ERROR
    # Her own IDs still work, and the one she was refused is free for another.
    await wait_for((await subble.connect("alice", "a1")).close())
    await wait_for((await subble.connect("bob", "a3")).close())
