"""Real nats-server processes on 127.0.0.1 for the cluster's tests: one (`nats`), or a
three-node NATS cluster (`nats_cluster`). Without the binary a test is skipped on a developer's
machine and fails under CI, where `make test` installs it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import free_port, need_peer
from wireproto.supervisor.natsserver import NatsServer, NatsServerMissing, nats_server_binary


def _need_nats_server() -> None:
    try:
        nats_server_binary()
    except NatsServerMissing as missing:
        need_peer(str(missing), "the cluster")


@pytest.fixture
def nats(tmp_path) -> Iterator[NatsServer]:
    _need_nats_server()
    server = NatsServer(directory=str(tmp_path / "nats")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_cluster(tmp_path) -> Iterator[list[NatsServer]]:
    """Three nats-servers routed into one NATS cluster, each with its own client port.

    Each server's route port is picked free before the three start, so another test on another
    worker may take one meanwhile: then the cluster is started again on new ports."""
    _need_nats_server()
    for attempt in range(3):
        route_ports = [free_port() for _ in range(3)]
        routes = tuple(f"nats-route://127.0.0.1:{port}" for port in route_ports)
        servers = [
            NatsServer(directory=str(tmp_path / f"nats{attempt}-{index}"),
                       cluster_port=route_ports[index],
                       routes=tuple(route for i, route in enumerate(routes) if i != index),
                       server_name=f"n{index}")
            for index in range(3)
        ]
        try:
            for server in servers:
                server.start()
        except RuntimeError as error:
            for server in servers:
                server.stop()
            if "address already in use" not in str(error) or attempt == 2:
                raise
            continue
        break
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()
