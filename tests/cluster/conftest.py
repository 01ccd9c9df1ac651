"""Real nats-server processes on 127.0.0.1 for the cluster's tests: one (`nats`), or a
three-node NATS cluster (`nats_cluster`). Without the binary a test is skipped on a developer's
machine and fails under CI, where `make test` installs it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support import need_peer, quiet_port
from wireproto.supervisor.natsserver import NatsServer, NatsServerMissing, nats_server_binary


def _need_nats_server() -> None:
    try:
        nats_server_binary()
    except NatsServerMissing as missing:
        need_peer(str(missing), "the cluster")


@pytest.fixture
def nats(tmp_path) -> Iterator[NatsServer]:
    _need_nats_server()
    server = start_quietly(lambda attempt: [
        NatsServer(directory=str(tmp_path / f"nats{attempt}"), port=quiet_port())])[0]
    try:
        yield server
    finally:
        server.stop()


def start_quietly(make: Callable[[int], list[NatsServer]],
                  starting: slice = slice(None)) -> list[NatsServer]:
    """Start the servers `make(attempt)` gives (those in `starting`), on ports below the
    ephemeral range (`quiet_port`), so that a test may stop one and start it again where it
    was. A port another test took between its choice and the start is chosen again."""
    for attempt in range(3):
        servers = make(attempt)
        try:
            for server in servers[starting]:
                server.start()
        except RuntimeError as error:
            for server in servers:
                server.stop()
            if "address already in use" not in str(error) or attempt == 2:
                raise
            continue
        return servers
    raise AssertionError("unreachable")


@pytest.fixture
def nats_cluster(tmp_path) -> Iterator[list[NatsServer]]:
    """Three nats-servers routed into one NATS cluster, each with its own client port.

    Its client and route ports are below the ephemeral range, so a test may stop a node and
    start it again where it was (see `start_quietly`)."""
    _need_nats_server()

    def make(attempt: int) -> list[NatsServer]:
        route_ports = [quiet_port() for _ in range(3)]
        routes = tuple(f"nats-route://127.0.0.1:{port}" for port in route_ports)
        return [
            NatsServer(directory=str(tmp_path / f"nats{attempt}-{index}"), port=quiet_port(),
                       cluster_port=route_ports[index],
                       routes=tuple(route for i, route in enumerate(routes) if i != index),
                       server_name=f"n{index}")
            for index in range(3)
        ]

    servers = start_quietly(make)
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()
