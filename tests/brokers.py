"""The one way tests run a broker: `Broker` starts services (and WEBSMQ clients) for a test and
stops every one of them at its end; the `broker` fixture in tests/conftest.py gives one to each
test that asks."""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor

from tests.support import wait_for
from wireproto.config import Config, parse_listen
from wireproto.protocols.websmq.client import WebsmqClientProtocol, connect
from wireproto.service import BoundListener, WireprotoService, make_service

LOCAL = "interface=127.0.0.1"


async def start_service(
    config: Config, **options: Any
) -> tuple[WireprotoService, list[BoundListener]]:
    """`config`'s broker, started, once every listener has bound; the caller stops it."""
    service = make_service(config, reactor, **options)
    service.startService()
    return service, await wait_for(service.when_listening())


class Broker:
    """Starts services and clients for one test, and stops every one of them at its end."""

    def __init__(self) -> None:
        self.services: list[WireprotoService] = []
        self.clients: list[WebsmqClientProtocol] = []

    async def start(
        self, *listeners: str, **config: Any
    ) -> tuple[WireprotoService, list[BoundListener]]:
        """A broker on `listeners` (``--listen`` forms) with `config`'s tables."""
        retry_policy = config.pop("retry_policy", None)
        listening = tuple(parse_listen(spec) for spec in listeners)
        return await self.start_config(Config(listeners=listening, **config), retry_policy)

    async def start_config(
        self, config: Config, retry_policy: Any = None
    ) -> tuple[WireprotoService, list[BoundListener]]:
        options = {"retry_policy": retry_policy} if retry_policy else {}
        service = make_service(config, reactor, **options)
        self.services.append(service)
        service.startService()
        return service, await wait_for(service.when_listening())

    async def client(self, address: str, **options: Any) -> WebsmqClientProtocol:
        client = await wait_for(connect(reactor, address, **options))
        self.clients.append(client)
        return client

    async def close(self) -> None:
        for client in self.clients:
            await wait_for(client.disconnect(), timeout=10)
        for service in self.services:
            if service.running:
                await wait_for(service.stopService(), timeout=10)
