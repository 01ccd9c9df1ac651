"""Mounted connections: an attached link with a `prefix` has its topics under it on the hub,
both ways, in every protocol (wireproto.hub.mount). Each device is wireproto's own client of its
protocol, joined to the broker's attached link through a relay on real sockets, so the broker
dials it as it dials a board."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import protocol, reactor

from tests.brokers import LOCAL, Broker
from tests.support import eventually, sleep, wait_for
from wireproto import capture
from wireproto.access import Action
from wireproto.capture import Kind, capture_files, iter_records
from wireproto.codecs import websmq
from wireproto.config import (
    Attach,
    CaptureSettings,
    ConfigError,
    HubSettings,
    WebsmqSettings,
    config_from_toml,
    config_to_toml,
)
from wireproto.hub import Hub, HubMessage, MountedSession
from wireproto.hub.mount import topic_below
from wireproto.protocols.nydus.client import connect as nydus_connect
from wireproto.protocols.subble.client import connect as subble_connect
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.websmq.client import connect as websmq_connect
from wireproto.tools.replay import CapturedPublishes, capture_paths
from wireproto.topics import mount_error


class _End(protocol.Protocol):
    """One end of the relay: what it reads goes to the other end once both are there."""

    def connectionMade(self) -> None:
        self.factory.relay.arrived(self)

    def dataReceived(self, data: bytes) -> None:
        self.factory.relay.forward(self, data)

    def connectionLost(self, reason: object) -> None:
        self.factory.relay.left(self)


class Relay:
    """Two listeners on 127.0.0.1 whose connections are joined byte for byte: the broker's
    attached link dials one, a device's client dials the other."""

    def __init__(self) -> None:
        self.ends: dict[str, _End | None] = {"broker": None, "device": None}
        self.waiting: dict[str, list[bytes]] = {"broker": [], "device": []}
        self.ports: dict[str, Any] = {}
        for side in self.ends:
            factory = protocol.ServerFactory.forProtocol(_End)
            factory.relay = self
            factory.side = side
            self.ports[side] = reactor.listenTCP(0, factory, interface="127.0.0.1")

    def address(self, side: str) -> str:
        return f"tcp:127.0.0.1:{self.ports[side].getHost().port}"

    def _side(self, end: _End) -> str:
        return end.factory.side

    def _other(self, side: str) -> str:
        return "device" if side == "broker" else "broker"

    def arrived(self, end: _End) -> None:
        side = self._side(end)
        self.ends[side] = end
        for data in self.waiting[self._other(side)]:
            end.transport.write(data)
        self.waiting[self._other(side)].clear()

    def forward(self, end: _End, data: bytes) -> None:
        other = self.ends[self._other(self._side(end))]
        if other is None:
            self.waiting[self._side(end)].append(data)
        else:
            other.transport.write(data)

    def left(self, end: _End) -> None:
        side = self._side(end)
        if self.ends[side] is end:
            self.ends[side] = None
            other = self.ends[self._other(side)]
            if other is not None:
                other.transport.loseConnection()

    async def close(self) -> None:
        for end in self.ends.values():
            if end is not None:
                end.transport.abortConnection()
        for port in self.ports.values():
            await wait_for(port.stopListening())


@pytest_twisted.async_yield_fixture
async def relay():
    joined = Relay()
    try:
        yield joined
    finally:
        await joined.close()


async def mounted_broker(broker: Broker, relay: Relay, protocol_name: str, framing: str,
                         prefix: str = "lab/dev1", also: str | None = None,
                         name: str | None = "dev1", **config: Any) -> Any:
    link = Attach(protocol_name, relay.address("broker"), framing, name=name, prefix=prefix)
    listeners = (f"websmq+ws@tcp:0:{LOCAL}",) + (() if also is None else (also,))
    service, bound = await broker.start(*listeners, attach=(link,),
                                        retry_policy=lambda attempt: 0.05, **config)
    await eventually(lambda: relay.ends["broker"] is not None)
    return service, [entry.address for entry in bound]


async def websmq_device(broker: Broker, relay: Relay, wildcards: bool = False) -> Any:
    """A WEBSMQ device on the relay's far end (the broker's attached link), closed with the
    test's broker."""
    device = await wait_for(websmq_connect(reactor, relay.address("device"), framing="length32",
                                           wildcards=wildcards))
    broker.clients.append(device)
    return device


def subscribed(service: Any, topic: str) -> bool:
    return any(True for _ in service.hub.subscribers(topic))


# -- WEBSMQ ------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_mounted_websmq_device_has_its_topics_under_the_prefix(broker: Broker,
                                                                      relay: Relay) -> None:
    service, (address, *_) = await mounted_broker(broker, relay, "websmq", "length32",
                                            websmq=WebsmqSettings(wildcards=True))
    device = await websmq_device(broker, relay, wildcards=True)
    browser = await broker.client(address, wildcards=True)
    at_device: list = []
    device.subscribe("in", at_device.append)
    device.subscribe("pattern/#", at_device.append)
    await eventually(lambda: subscribed(service, "lab/dev1/in")
                     and "lab/dev1/pattern/#" in service.hub.patterns())
    assert not subscribed(service, "in")
    at_browser: list = []
    browser.subscribe("lab/dev1/#", at_browser.append)
    await eventually(lambda: "lab/dev1/#" in service.hub.patterns())

    browser.publish("in", b"not the device's")
    browser.publish("lab/dev1/in", b"blink")
    browser.publish("lab/dev1/pattern/a/b", b"deep")
    device.publish("out", b"pressed")
    await eventually(lambda: len(at_device) == 2 and len(at_browser) == 1)
    assert at_device == [websmq.Publish("in", b"blink"), websmq.Publish("pattern/a/b", b"deep")]
    assert at_browser == [websmq.Publish("lab/dev1/out", b"pressed")]

    # Its will is the hub's under the prefix too, published when the device goes away.
    device.set_will("status", b"gone")
    await eventually(lambda: any(session.will is not None for session in service.hub.sessions))
    (session,) = [s for s in service.hub.sessions if isinstance(s, MountedSession)]
    assert session.will.topic == "lab/dev1/status"
    relay.ends["device"].transport.loseConnection()
    await eventually(lambda: len(at_browser) == 2)
    assert at_browser[1] == websmq.LastWill("lab/dev1/status", b"gone")


@pytest_twisted.ensureDeferred
async def test_a_mounted_device_never_hears_of_topics_outside_its_mount(broker: Broker,
                                                                       relay: Relay) -> None:
    service, (address, *_) = await mounted_broker(broker, relay, "websmq", "length32",
                                            websmq=WebsmqSettings(wildcards=True))
    device = await websmq_device(broker, relay, wildcards=True)
    at_device: list = []
    device.subscribe("#", at_device.append)
    await eventually(lambda: "lab/dev1/#" in service.hub.patterns())
    browser = await broker.client(address)
    # The prefix itself is matched by PREFIX/#, but the device has no name for it.
    for topic in ("lab/dev1", "lab/dev2/x", "lab/dev10/x", "lab", "x"):
        browser.publish(topic, b"no")
    browser.publish("lab/dev1/x", b"yes")
    await eventually(lambda: at_device)
    await sleep(0.2)
    assert at_device == [websmq.Publish("x", b"yes")]


@pytest_twisted.ensureDeferred
async def test_a_mounted_device_gets_last_values_under_its_own_names(broker: Broker,
                                                                    relay: Relay) -> None:
    service, (address, *_) = await mounted_broker(broker, relay, "websmq", "length32",
                                            hub=HubSettings(retain=("lab/#",)))
    browser = await broker.client(address)
    browser.publish("lab/dev1/config", b'{"rate":5}')
    await eventually(lambda: service.hub.retained.get("lab/dev1/config") is not None)
    device = await websmq_device(broker, relay)
    at_device: list = []
    device.subscribe("config", at_device.append)
    await eventually(lambda: at_device)
    assert at_device == [websmq.Publish("config", b'{"rate":5}')]


@pytest_twisted.ensureDeferred
async def test_rules_judge_a_mounted_device_by_the_hub_topics(broker: Broker,
                                                             relay: Relay) -> None:
    toml = f"""
[[listen]]
protocol = "websmq"
transport = "ws"
endpoint = "tcp:0:{LOCAL}"
[[attach]]
protocol = "websmq"
endpoint = "{relay.address('broker')}"
framing = "length32"
principal = "board"
prefix = "lab/dev1"
[auth]
anonymous = true
[[acl]]
principal = "board"
publish = ["lab/dev1/out"]
[[acl]]
subscribe = ["#"]
"""
    service, bound = await broker.start_config(config_from_toml(toml, reactor=reactor),
                                               retry_policy=lambda attempt: 0.05)
    device = await websmq_device(broker, relay)
    browser = await broker.client(bound[0].address)
    at_browser: list = []
    browser.subscribe("lab/dev1/out", at_browser.append)
    (session,) = await eventually(lambda: [s for s in service.hub.sessions
                                           if isinstance(s, MountedSession)])
    assert session.may(Action.PUBLISH, "out") and not session.may(Action.PUBLISH, "in")
    assert session.may_publish("out") and not session.may_publish("lab/dev1/out")
    at_device: list = []
    device.subscribe("in", at_device.append)
    await eventually(lambda: subscribed(service, "lab/dev1/in"))
    device.publish("out", b"allowed")
    await eventually(lambda: at_browser)
    assert at_browser == [websmq.Publish("lab/dev1/out", b"allowed")]
    # A topic the rules do not give it is refused by its hub name.
    device.publish("in", b"forbidden")
    await eventually(lambda: session.denials == 1)
    await sleep(0.1)
    assert at_device == [] and at_browser == [websmq.Publish("lab/dev1/out", b"allowed")]


@pytest_twisted.ensureDeferred
async def test_a_mounted_link_s_capture_replays_on_the_hub_topics(broker: Broker, relay: Relay,
                                                                  tmp_path: Path) -> None:
    service, (address, *_) = await mounted_broker(
        broker, relay, "websmq", "length32",
        capture=CaptureSettings(directory=str(tmp_path), flush_interval=0.05))
    device = await wait_for(websmq_connect(reactor, relay.address("device"),
                                           framing="length32"))
    browser = await broker.client(address)
    at_browser: list = []
    browser.subscribe("lab/dev1/out", at_browser.append)
    await eventually(lambda: subscribed(service, "lab/dev1/out"))
    device.publish("out", b"1")
    device.publish("out", b"2")
    await eventually(lambda: len(at_browser) == 2)
    await wait_for(device.disconnect())
    await wait_for(service.stopService(), timeout=10)
    # The device's connection's open record says its mount; the browser's has none.
    opened = [json.loads(record.data) for path in capture.capture_files(tmp_path)
              for record in capture.iter_records(path)
              if record.kind == capture.Kind.OPEN and record.protocol_name == "websmq"]
    assert sorted((info.get("link", ""), info.get("prefix", "")) for info in opened) == [
        ("", ""), ("dev1", "lab/dev1")]
    replayed = list(CapturedPublishes(capture_paths([str(tmp_path)])))
    assert [(m.topic, m.payload) for m in replayed] == [("lab/dev1/out", b"1"),
                                                        ("lab/dev1/out", b"2")]
    # Played again by link name into a broker whose replay link has the same mount.
    link = Attach("websmq", f"replay:path={tmp_path}:link=dev1:speed=max:loop=yes",
                  "length32", prefix="lab/dev1")
    _, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}", attach=(link,))
    watcher = await broker.client(bound[0].address)
    at_watcher: list = []
    watcher.subscribe("lab/dev1/out", at_watcher.append)
    # Looped (a pass a second at most), so a pass begins after the watcher subscribed.
    whole_pass = [websmq.Publish("lab/dev1/out", b"1"), websmq.Publish("lab/dev1/out", b"2")]
    await eventually(lambda: any(at_watcher[at:at + 2] == whole_pass
                                 for at in range(len(at_watcher))), timeout=10)
    assert {message.topic for message in at_watcher} == {"lab/dev1/out"}


@pytest_twisted.ensureDeferred
async def test_a_mounted_links_capture_opens_with_its_link_name_and_prefix(
        broker: Broker, relay: Relay, tmp_path: Any) -> None:
    # The table has no name: its link is named by its protocol, as everywhere else.
    directory = tmp_path / "capture"
    service, (address, *_) = await mounted_broker(
        broker, relay, "websmq", "length32", name=None,
        capture=CaptureSettings(directory=str(directory), flush_interval=0.05))
    await websmq_device(broker, relay)
    await wait_for(broker.client(address))

    def opened() -> list[dict]:
        return [json.loads(record.data) for path in capture_files(directory)
                for record in iter_records(path) if record.kind == Kind.OPEN]

    records = await eventually(lambda: len(opened()) == 2 and opened())
    mounted = [record for record in records if "prefix" in record]
    assert [(record.get("link"), record["prefix"]) for record in mounted] == [
        ("websmq", "lab/dev1")]
    assert [record for record in records if "link" in record] == mounted


@pytest_twisted.ensureDeferred
async def test_the_admin_api_says_where_a_session_is_mounted(broker: Broker,
                                                             relay: Relay) -> None:
    from tests.admin.http import base_of, http

    service, (address, *_) = await mounted_broker(broker, relay, "websmq", "length32")
    device = await websmq_device(broker, relay)
    device.subscribe("in", lambda message: None)
    await eventually(lambda: subscribed(service, "lab/dev1/in"))
    await broker.client(address)
    await eventually(lambda: len(service.hub.sessions) == 2)
    sessions = (await http(base_of(address), "/api/sessions")).json["items"]
    # Its subscriptions are the hub's topics; the mount says what the device calls them.
    assert sorted((row["transport"], row["mount"], row["subscriptions"]) for row in sessions) \
        == [("length32", "lab/dev1", ["lab/dev1/in"]), ("ws", None, [])]


# -- UBRE ----------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_mounted_ubre_device_is_told_of_the_topics_under_its_mount_only(
        broker: Broker, relay: Relay) -> None:
    service, (address, *_) = await mounted_broker(broker, relay, "ubre", "lines")
    told: list = []
    device = await wait_for(ubre_connect(reactor, relay.address("device")))
    device.on_subscribe = lambda topic, body: told.append(topic)
    # A WEBSMQ browser's subscriptions make the hub's topics; the UBRE device hears of its own.
    websmq_browser = await broker.client(address)
    websmq_browser.subscribe("elsewhere/temp", lambda message: None)
    at_browser: list = []
    websmq_browser.subscribe("lab/dev1/temp", at_browser.append)
    await eventually(lambda: "temp" in told)
    await sleep(0.2)
    assert told == ["temp"]
    await wait_for(device.publish("temp", 21.5))
    await eventually(lambda: at_browser)
    assert at_browser == [websmq.Publish("lab/dev1/temp", b"21.5")]
    at_device: list = []
    device.subscribe("set", lambda message: at_device.append((message.topic, message.body)))
    await eventually(lambda: subscribed(service, "lab/dev1/set"))
    websmq_browser.publish("lab/dev1/set", b'{"on":true}')
    await eventually(lambda: at_device)
    assert at_device == [("set", {"on": True})]
    # Host code speaks to the device in its own names too.
    (peer,) = service.server("ubre").peers
    assert peer.publish("set", {"from": "host"}) and not peer.publish("lab/dev1/set", 1)
    await eventually(lambda: len(at_device) == 2)
    assert at_device[1] == ("set", {"from": "host"})
    await wait_for(device.close())


# -- nydus ---------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_mounted_nydus_device_subscribes_and_publishes_under_its_mount(
        broker: Broker, relay: Relay) -> None:
    service, (address, *_) = await mounted_broker(broker, relay, "nydus", "lines")
    device = await wait_for(nydus_connect(reactor, relay.address("device")))
    at_device: list = []
    device.register_route("/in/:what", lambda match, data: at_device.append(
        (match.params["what"], data)))
    await wait_for(device.invoke("/_hub/subscribe", "/in/led"))
    assert subscribed(service, "lab/dev1/in/led") and not subscribed(service, "in/led")
    browser = await broker.client(address)
    at_browser: list = []
    browser.subscribe("lab/dev1/out", at_browser.append)
    await eventually(lambda: subscribed(service, "lab/dev1/out"))
    answer = await wait_for(device.invoke("/_hub/publish", {"path": "/out", "data": {"v": 1}}))
    assert answer["delivered"] == 1
    await eventually(lambda: at_browser)
    assert [(m.topic, json.loads(m.payload)) for m in at_browser] == [("lab/dev1/out", {"v": 1})]
    browser.publish("lab/dev1/in/led", b'"on"')
    await eventually(lambda: at_device)
    assert at_device == [("led", "on")]
    # Host code names the hub's topic; the device's subscription is its own name for it.
    server = service.server("nydus")
    (client,) = server.clients.values()
    assert client.subscriptions == {"/in/led"}
    assert server.unsubscribe_all("/lab/dev1/in/led") and not subscribed(service,
                                                                         "lab/dev1/in/led")
    assert client.subscriptions == frozenset()
    await wait_for(device.close())


@pytest_twisted.ensureDeferred
async def test_a_mounted_nydus_devices_publish_is_held_to_max_topic_length_by_its_hub_topic(
        broker: Broker, relay: Relay) -> None:
    from tests.support import failure_of
    from wireproto.protocols.nydus.server import InvokeError

    service, _ = await mounted_broker(broker, relay, "nydus", "lines",
                                      hub=HubSettings(max_topic_length=20))
    device = await wait_for(nydus_connect(reactor, relay.address("device")))
    # lab/dev1/ and 11 characters: 20 on the hub.
    assert await wait_for(device.invoke("/_hub/publish", {"path": "/" + "x" * 11,
                                                          "data": 1})) is not None
    failure = await failure_of(device.invoke("/_hub/publish", {"path": "/" + "x" * 12,
                                                               "data": 1}))
    assert isinstance(failure, InvokeError) and "topic of 21 characters" in failure.message
    await eventually(lambda: not service.server("nydus").clients)


# -- SubbleSocket --------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_mounted_subble_device_has_its_event_types_under_its_mount(
        broker: Broker, relay: Relay) -> None:
    service, (address, subble_address) = await mounted_broker(
        broker, relay, "subble", "length32", also=f"subble+ws@tcp:0:{LOCAL}")
    at_device: list = []
    device = await wait_for(subble_connect(
        reactor, relay.address("device"), client_id="board", subscribe=["in"], produce=["out"],
        on_event=at_device.append, framing="length32"))
    await eventually(lambda: subscribed(service, "lab/dev1/in"))
    browser = await broker.client(address)
    at_browser: list = []
    browser.subscribe("lab/dev1/out", at_browser.append)
    await eventually(lambda: subscribed(service, "lab/dev1/out"))
    other: list = []
    listener = await wait_for(subble_connect(
        reactor, subble_address, subscribe=["lab/dev1/out"],
        on_event=other.append))
    await wait_for(device.produce("out", {"kwh": 3}))
    await eventually(lambda: at_browser and other)
    assert [(m.topic, json.loads(m.payload)) for m in at_browser] == [
        ("lab/dev1/out", {"kwh": 3})]
    # Another SubbleSocket client sees the event under the hub's name, from the board's ID.
    assert [(event.type, event.payload, event.source) for event in other] == [
        ("lab/dev1/out", {"kwh": 3}, "board")]
    await wait_for(listener.close())
    browser.publish("lab/dev1/in", b'{"reset":true}')
    await eventually(lambda: at_device)
    assert [(event.type, event.payload) for event in at_device] == [("in", {"reset": True})]
    await wait_for(device.close())


@pytest_twisted.ensureDeferred
async def test_a_mounted_subble_devices_event_is_one_event_for_every_subble_client(
        broker: Broker, relay: Relay) -> None:
    # As from an unmounted producer: another SubbleSocket client gets the event the producer's
    # echo names (its GUID, date time and format, the payload's bytes), under the hub's name.
    service, (_, subble_address) = await mounted_broker(
        broker, relay, "subble", "length32", also=f"subble+ws@tcp:0:{LOCAL}")
    device = await wait_for(subble_connect(
        reactor, relay.address("device"), client_id="board", produce=["out"],
        framing="length32"))
    other: list = []
    listener = await wait_for(subble_connect(
        reactor, subble_address, subscribe=["lab/dev1/out"], on_event=other.append))
    await eventually(lambda: subscribed(service, "lab/dev1/out"))
    echoes = [await wait_for(device.produce("out", {"kwh": 3})),
              await wait_for(device.produce("out", b"\x01raw", format=60))]
    await eventually(lambda: len(other) == 2)
    assert [(event.type, event.guid, event.datetime, event.format, event.raw_payload,
             event.source)
            for event in other] == [
        ("lab/dev1/out", echo.guid, echo.datetime, echo.format, echo.raw_payload, "board")
        for echo in echoes]
    await wait_for(listener.close())
    old_end = relay.ends["broker"]
    await wait_for(device.close())
    # The broker's link opened again (the relay closed it with the device).
    await eventually(lambda: relay.ends["broker"] not in (None, old_end))
    # The other way: the board gets an unmounted client's event as every client does, under
    # its own name for the type.
    at_device: list = []
    device = await wait_for(subble_connect(
        reactor, relay.address("device"), client_id="board", subscribe=["in"],
        on_event=at_device.append, framing="length32"))
    await eventually(lambda: subscribed(service, "lab/dev1/in"))
    producer = await wait_for(subble_connect(reactor, subble_address, client_id="prod",
                                             produce=["lab/dev1/in"]))
    echoes = [await wait_for(producer.produce("lab/dev1/in", {"on": 1})),
              await wait_for(producer.produce("lab/dev1/in", b"\x01raw", format=60))]
    await eventually(lambda: len(at_device) == 2)
    assert [(event.type, event.guid, event.datetime, event.format, event.raw_payload,
             event.source) for event in at_device] == [
        ("in", echo.guid, echo.datetime, echo.format, echo.raw_payload, "prod")
        for echo in echoes]
    await wait_for(producer.close())
    await wait_for(device.close())


# -- the session and the config ------------------------------------------------------------------


def test_a_mount_strips_only_what_lies_below_it_and_refuses_what_cannot_hold_topics() -> None:
    # The strip both the encoder and own_topic use: the prefix itself, a sibling that starts
    # alike and anything outside have no name below it.
    assert [topic_below("a/b/", t) for t in ("a/b/x", "a/b/x/y", "a/b", "a/b/", "a/bc/x", "x")] \
        == ["x", "x/y", None, None, None, None]
    assert mount_error("lab/dev1") is None
    for prefix in ("", "a/#", "a/+/b", "$SYS/x", "a/", "a\x00b"):
        assert mount_error(prefix) is not None, prefix


def _attach_toml(extra: str) -> str:
    return ('[[listen]]\nprotocol = "websmq"\ntransport = "ws"\nendpoint = "tcp:0"\n'
            f'[[attach]]\nprotocol = "websmq"\nendpoint = "tcp:127.0.0.1:9"\n{extra}')


def test_an_attach_table_takes_a_prefix_and_writes_it_back() -> None:
    config = config_from_toml(_attach_toml('prefix = "lab/dev1/"\n'), reactor=reactor)
    (link,) = config.attach
    assert link.prefix == "lab/dev1" and "hub topics lab/dev1/..." in link.describe()
    assert config_from_toml(config_to_toml(config), reactor=reactor) == config
    (unmounted,) = config_from_toml(_attach_toml(""), reactor=reactor).attach
    assert unmounted.prefix is None and unmounted.describe() == "websmq over length32"


@pytest.mark.parametrize("prefix, problem", [
    ("a/#", "holds '#'"), ("$devices/x", "the broker's own"), ("a/+/b", "holds '+'"),
])
def test_an_attach_prefix_that_cannot_hold_topics_is_refused(prefix: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=rf"attach\[1\]\.prefix: .*{problem.replace('+', '[+]')}"):
        config_from_toml(_attach_toml(f'prefix = "{prefix}"\n'), reactor=reactor)


def test_a_prefix_that_leaves_no_room_under_max_topic_length_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"attach\[1\]\.prefix: .*leaves no room"):
        config_from_toml(_attach_toml(f'prefix = "{"p" * 20}"\n[hub]\nmax_topic_length = 21\n'),
                         reactor=reactor)
    config_from_toml(_attach_toml(f'prefix = "{"p" * 19}"\n[hub]\nmax_topic_length = 21\n'),
                     reactor=reactor)
    fleet = ('name = "m"\nendpoint = "serial:vid=0403"\neach_board = true\n'
             '[hub]\nmax_topic_length = 4\n')
    with pytest.raises(ConfigError, match="leaves no room"):
        config_from_toml(_attach_toml(fleet).replace('endpoint = "tcp:127.0.0.1:9"\n', ""),
                         reactor=reactor)


def test_a_fleet_board_is_mounted_under_the_table_name_or_prefix() -> None:
    fleet = Attach("websmq", "serial:vid=0403:pid=6001", "cobs", name="meters", each_board=True)
    assert fleet.board_prefix("M1") == "meters/M1"
    assert Attach("websmq", "serial:vid=0403", "cobs", each_board=True,
                  prefix="site/meters").board_prefix("M1") == "site/meters/M1"
    assert Attach("websmq", "serial:vid=0403", "cobs", each_board=True,
                  prefix="").board_prefix("M1") is None



@pytest.mark.parametrize("tables, problem", [
    # Two boards at one prefix would share their topics: each hears what the other says.
    ('[[attach]]\nprotocol = "websmq"\nendpoint = "tcp:127.0.0.1:9"\nprefix = "lab/dev1"\n'
     '[[attach]]\nprotocol = "websmq"\nendpoint = "tcp:127.0.0.1:10"\nname = "b"\n'
     'prefix = "lab/dev1/"\n', r"attach\[2\]\.prefix: .*'lab/dev1'.* attach\[1\]'s 'lab/dev1'"),
    ('[[attach]]\nprotocol = "websmq"\nendpoint = "tcp:127.0.0.1:9"\nprefix = "lab"\n'
     '[[attach]]\nprotocol = "websmq"\nendpoint = "tcp:127.0.0.1:10"\nname = "b"\n'
     'prefix = "lab/dev1"\n', r"attach\[2\]\.prefix: .*'lab/dev1'.* attach\[1\]'s 'lab'"),
    # A fleet's boards are under its name when it gives no prefix.
    ('[[attach]]\nprotocol = "websmq"\nendpoint = "serial:vid=0403"\nframing = "cobs"\n'
     'name = "meters"\neach_board = true\n'
     '[[attach]]\nprotocol = "websmq"\nendpoint = "tcp:127.0.0.1:10"\nname = "m1"\n'
     'prefix = "meters/M1"\n', r"attach\[2\]\.prefix: .*'meters/M1'.* attach\[1\]'s 'meters'"),
    ('[[phyllo]]\nname = "dev1"\nendpoint = "tcp:127.0.0.1:11"\n'
     '[[attach]]\nprotocol = "websmq"\nendpoint = "tcp:127.0.0.1:10"\nprefix = "phyllo/dev1"\n',
     r"attach\[1\]\.prefix: .*'phyllo/dev1'.* phyllo\[1\]'s 'phyllo/dev1'"),
])
def test_attach_prefixes_that_meet_another_links_are_refused(tables: str, problem: str) -> None:
    toml = '[[listen]]\nprotocol = "websmq"\ntransport = "ws"\nendpoint = "tcp:0"\n' + tables
    with pytest.raises(ConfigError, match=problem):
        config_from_toml(toml, reactor=reactor)


def test_attach_prefixes_apart_and_unmounted_links_are_taken() -> None:
    config = config_from_toml(
        '[[listen]]\nprotocol = "websmq"\ntransport = "ws"\nendpoint = "tcp:0"\n'
        '[[attach]]\nprotocol = "websmq"\nendpoint = "tcp:127.0.0.1:9"\nprefix = "lab/dev1"\n'
        '[[attach]]\nprotocol = "websmq"\nendpoint = "tcp:127.0.0.1:10"\nname = "b"\n'
        'prefix = "lab/dev10"\n'
        '[[attach]]\nprotocol = "websmq"\nendpoint = "tcp:127.0.0.1:12"\nname = "c"\n'
        '[[attach]]\nprotocol = "websmq"\nendpoint = "serial:vid=0403"\nframing = "cobs"\n'
        'name = "d"\neach_board = true\nprefix = ""\n'
        '[[phyllo]]\nname = "lab"\nendpoint = "tcp:127.0.0.1:11"\n', reactor=reactor)
    assert [link.prefix for link in config.attach] == ["lab/dev1", "lab/dev10", None, ""]


def test_a_phyllo_option_whose_prefix_meets_the_files_attach_prefix_is_refused(
        tmp_path: Any) -> None:
    from wireproto.config.options import build_config

    path = tmp_path / "wireproto.toml"
    path.write_text(_attach_toml('prefix = "phyllo/dev1/x"\n'))
    with pytest.raises(ConfigError, match=r"attach\[1\]\.prefix: .*phyllo\[1\]'s 'phyllo/dev1'"):
        build_config(phyllo=["dev1@tcp:127.0.0.1:11"], config_file=path, reactor=reactor)
    assert build_config(phyllo=["dev2@tcp:127.0.0.1:11"], config_file=path,
                        reactor=reactor).attach[0].prefix == "phyllo/dev1/x"

class _Transport:
    """Just enough of a message transport for two hundred sessions made without connections
    (the hub's own table is what is counted)."""

    kind = "test"
    prepareKey = None
    maxMessageSize = 1 << 20

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def getPeer(self) -> Any:
        from twisted.internet.address import IPv4Address

        return IPv4Address("TCP", "127.0.0.1", 1)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        pass

    def prepareMessage(self, data: bytes, binary: bool) -> bytes:
        return data

    def sendPrepared(self, prepared: bytes) -> None:
        self.sent.append(prepared)


def _encode(message: HubMessage) -> tuple[bytes, bool]:
    return f"{message.topic}={message.payload.decode()}".encode(), False



def test_boards_mounted_and_gone_leave_the_hub_no_bigger() -> None:
    # A fleet's boards come and go, each at a prefix of its own (a hostile device can take a
    # new serial number each time): what the hub keeps per wire format must not grow with them.
    hub = Hub()
    hub.attach(_Transport(), protocol="test", wire_format="t", encode=_encode).close()
    kept = len(hub._prepared_keys)
    sessions = [hub.attach(_Transport(), protocol="test", wire_format="t", encode=_encode,
                           mount=f"lab/board{number}") for number in range(200)]
    for session in sessions:
        session.set_wire_format("u", _encode)
        session.subscribe("in")
    hub.publish(HubMessage("lab/board7/in", b"1"))
    assert [session.transport.sent for session in sessions[6:9]] == [[], [b"in=1"], []]
    for session in sessions:
        session.close()
    assert len(hub._prepared_keys) == kept
