"""A sixth protocol, registered here and nowhere else, is configured, served, captured and
decoded: the descriptor in wireproto.protocols is the one place a protocol is described.

The toy protocol is line-oriented text: ``S topic`` subscribes, ``P topic payload`` publishes,
and the broker sends ``P topic payload`` to the subscribers. Its one setting, ``[toy] shout``,
has the broker upper-case what it delivers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.protocols.basic import LineOnlyReceiver

from tests.brokers import start_service
from tests.support import eventually, wait_for
from wireproto import capture
from wireproto.config import ConfigError, config_from_toml, config_to_toml
from wireproto.errors import UnexpectedMessage
from wireproto.hub import Hub, HubMessage
from wireproto.payloads import NO_VALUE
from wireproto.pipeline.decode import decode_record
from wireproto.pipeline.values import numeric_values
from wireproto.protocols import ProtocolDescriptor, register_protocol, unregister_protocol
from wireproto.transports.base import MessageProtocol

TOY_CODE = 200


@dataclass(frozen=True)
class ToySettings:
    shout: bool = False


def parse(data: bytes) -> tuple[str, str, bytes]:
    kind, _, rest = data.partition(b" ")
    topic, _, payload = rest.partition(b" ")
    if kind not in (b"S", b"P") or not topic:
        raise UnexpectedMessage(f"not a toy message: {data[:20]!r}")
    return kind.decode(), topic.decode(), payload


class ToyServerProtocol(MessageProtocol):
    def __init__(self, hub: Hub, settings: ToySettings) -> None:
        self.hub = hub
        self.settings = settings

    def connectionMade(self) -> None:
        super().connectionMade()

        def encode(message: HubMessage) -> tuple[bytes, bool]:
            payload = message.payload.upper() if self.settings.shout else message.payload
            return b"P " + message.topic.encode() + b" " + payload, False

        self.session = self.hub.attach(self.transport, protocol="toy", wire_format="toy",
                                       encode=encode)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        kind, topic, payload = parse(data)
        if kind == "S":
            self.session.subscribe(topic)
        else:
            self.session.publish(topic, payload)

    def connectionLost(self, reason: Any) -> None:
        super().connectionLost(reason)
        self.session.close(reason)


def serve(hub: Hub, settings: ToySettings) -> Any:
    return lambda: ToyServerProtocol(hub, settings)


def columns(data: bytes, binary: bool, incoming: bool) -> tuple[str, str, None, int]:
    kind, topic, payload = parse(data)
    return {"S": "subscribe", "P": "publish"}[kind], topic, None, len(payload)


def value(data: bytes, binary: bool, incoming: bool) -> Any:
    kind, _, payload = parse(data)
    return float(payload) if kind == "P" and payload.replace(b".", b"").isdigit() else NO_VALUE


TOY = ProtocolDescriptor(
    name="toy",
    capture_code=TOY_CODE,
    settings=ToySettings,
    server=serve,
    transports=frozenset({"lines", "ws"}),
    default_framing="lines",
    default_path="/toy",
    analysis=SimpleNamespace(columns=columns, value=value),
    reading_types=("publish",),
)


@pytest.fixture
def toy():
    register_protocol(TOY)
    yield TOY
    unregister_protocol("toy")


class LineClient(LineOnlyReceiver):
    delimiter = b"\n"

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def lineReceived(self, line: bytes) -> None:
        self.lines.append(line)


def test_the_toy_table_is_configured_and_checked(toy):
    config = config_from_toml(
        '[[listen]]\nprotocol = "toy"\ntransport = "lines"\nendpoint = "tcp:0"\n'
        "[toy]\nshout = true\n"
    )
    assert config.toy == ToySettings(shout=True)
    assert config.listeners[0].protocol == "toy"
    assert config_from_toml(config_to_toml(config)) == config
    with pytest.raises(ConfigError, match=r"toy\.shot: unknown key; use shout"):
        config_from_toml("[toy]\nshot = true\n")
    with pytest.raises(ConfigError, match="toy does not run over cobs; use ws or lines"):
        config_from_toml('[[listen]]\nprotocol = "toy"\ntransport = "cobs"\nendpoint = "tcp:0"\n')


def test_without_its_descriptor_the_toy_is_unknown():
    with pytest.raises(ConfigError, match="unknown protocol 'toy'"):
        config_from_toml('[[listen]]\nprotocol = "toy"\ntransport = "lines"\nendpoint = "tcp:0"\n')
    with pytest.raises(ConfigError, match="toy: unknown key"):
        config_from_toml("[toy]\nshout = true\n")


@pytest_twisted.ensureDeferred
async def test_the_toy_is_served_captured_and_decoded(toy, tmp_path: Path):
    config = config_from_toml(
        '[[listen]]\nprotocol = "toy"\ntransport = "lines"\n'
        'endpoint = "tcp:0:interface=127.0.0.1"\n'
        "[toy]\nshout = true\n"
        f'[capture]\ndirectory = "{tmp_path}"\nflush_interval = 0.05\n'
    )
    service, (bound,) = await start_service(config)
    try:
        port = int(bound.address.rsplit(":", 1)[1])
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
        subscriber = await wait_for(connectProtocol(endpoint, LineClient()))
        publisher = await wait_for(connectProtocol(endpoint, LineClient()))
        subscriber.sendLine(b"S news")
        await eventually(lambda: service.hub.subscribers("news"))
        publisher.sendLine(b"P news hello")
        publisher.sendLine(b"P news 21.5")
        await eventually(lambda: len(subscriber.lines) == 2)
        assert subscriber.lines == [b"P news HELLO", b"P news 21.5"]
        assert publisher.lines == []
        subscriber.transport.loseConnection()
        publisher.transport.loseConnection()
    finally:
        await wait_for(service.stopService(), timeout=10)

    assert capture.PROTOCOLS["toy"] == TOY_CODE
    records = [record for path in capture.capture_files(tmp_path)
               for record in capture.iter_records(path)]
    assert {record.protocol_name for record in records} == {"toy"}
    rows = [(record.kind, row) for record in records for row in decode_record(record)]
    # Each publish twice: in from the publisher, out to the subscriber.
    assert sorted((kind, row.topic, row.body_size) for kind, row in rows
                  if row.message_type == "publish") == [
        (capture.Kind.IN, "news", 4), (capture.Kind.IN, "news", 5),
        (capture.Kind.OUT, "news", 4), (capture.Kind.OUT, "news", 5)]
    assert any(row.message_type == "subscribe" and row.topic == "news" for _, row in rows)
    assert all(row.decode_error is None for _, row in rows)
    assert numeric_values("toy", "in", b"P news 21.5", False) == [("value", 21.5)]
