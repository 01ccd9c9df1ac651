"""A fleet of boards from one table (``each_board = true``): pty stand-ins plugged and pulled
while numbered messages flow through a real broker to real WEBSMQ subscribers, the presence
topics ``$devices/LINK`` at every step, and what flapping, hostile and flooding boards cannot
do (grow links, timers or kept values, or lose another board's messages)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.logger import globalLogPublisher

from tests.support import eventually, sleep, wait_for
from wireproto.codecs.phyllo.document import Format, Schema, message_from_document, serialize
from wireproto.codecs.phyllo.stack import REDUCED
from wireproto.config import config_from_toml
from wireproto.devices import PollingWatcher
from wireproto.devices.standin import COMMON_BOARDS, StandInBoard, StandInPorts
from wireproto.hub import Session
from wireproto.protocols.websmq.client import connect
from wireproto.service import make_service
from wireproto.service.fleet import Fleet

PICO = COMMON_BOARDS["pico"]
LISTEN = '[[listen]]\nprotocol = "websmq"\ntransport = "ws"\nendpoint = "tcp:0"\n'


def fleet_config(extra: str = "", endpoint: str = "serial:vid=2e8a:pid=000a") -> str:
    return (f'{LISTEN}[[phyllo]]\nname = "sensors"\nendpoint = "{endpoint}"\n'
            f"each_board = true\n{extra}")


def frame(topic: str, value: Any) -> bytes:
    return REDUCED.encode(message_from_document(
        topic, serialize(value, Format.MSGPACK, Schema.SCHEMALESS)))


class Broker:
    """A broker with a fleet table, its port watcher on the stand-ins, and WEBSMQ browsers."""

    def __init__(self, boards: StandInPorts) -> None:
        self.boards = boards
        self.service: Any = None
        self.clients: list[Any] = []
        self.address = ""
        self.addresses: list[str] = []
        self.events: list[dict] = []

    async def start(self, toml: str) -> None:
        config = config_from_toml(toml, reactor=reactor)
        watcher = PollingWatcher(reactor, self.boards.ports, 0.05)
        self.service = make_service(config, reactor, retry_policy=lambda attempt: 0.05,
                                    ports=watcher)
        globalLogPublisher.addObserver(self.events.append)
        self.service.startService()
        bound = await wait_for(self.service.when_listening())
        self.address = bound[0].address
        self.addresses = [entry.address for entry in bound]

    @property
    def fleet(self) -> Fleet:
        (fleet,) = [part for part in self.service.links if isinstance(part, Fleet)]
        return fleet

    async def browser(self) -> Any:
        client = await wait_for(connect(reactor, self.address))
        self.clients.append(client)
        return client

    async def subscribed(self, client: Any, *topics: str) -> dict[str, list[Any]]:
        inboxes: dict[str, list[Any]] = {}
        for topic in topics:
            inbox = inboxes[topic] = []
            await client.subscribe(topic, inbox.append)
        hub = self.service.hub
        await eventually(lambda: all(
            any(isinstance(s, Session) for s in hub.subscribers(topic)) for topic in topics))
        return inboxes

    def up(self, name: str) -> bool:
        bridge = self.service.phyllo.get(name)
        return bridge is not None and bridge.connected

    def on(self, name: str, board: StandInBoard) -> bool:
        """Whether `name`'s link is open on `board`'s device now (a link still open on the
        device of a board pulled a moment ago is up too, but not on this one)."""
        state = self.presence(name)
        return self.up(name) and state is not None and state["port"] == board.device

    def presence(self, name: str) -> dict | None:
        kept = self.service.hub.retained.get(f"$devices/{name}")
        return None if kept is None else json.loads(kept[0].payload)

    def warnings(self, event: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == event]

    async def close(self) -> None:
        globalLogPublisher.removeObserver(self.events.append)
        for client in self.clients:
            closing = client.close() if hasattr(client, "close") else client.disconnect()
            await wait_for(closing, timeout=10)
        if self.service is not None and self.service.running:
            await wait_for(self.service.stopService(), timeout=10)


@pytest.fixture
def boards():
    standins = StandInPorts()
    yield standins
    standins.close()


@pytest_twisted.async_yield_fixture
async def broker(boards):
    running = Broker(boards)
    try:
        yield running
    finally:
        await running.close()


def values(inbox: list[Any]) -> list[Any]:
    return [json.loads(message.payload) for message in inbox]


def no_link_timers() -> list[Any]:
    """The delayed calls a link's reconnector or a bridge would leave behind."""
    return [call for call in reactor.getDelayedCalls()
            if "_retry_due" in repr(call.func) or "Reconnector" in repr(call.func)]


class Traffic:
    """Each board sends numbered messages on ``seq`` while it is marked up; `sent` per board."""

    def __init__(self) -> None:
        self.up: dict[str, StandInBoard] = {}
        self.sent: dict[str, list[int]] = {}
        self.running = True

    async def run(self) -> None:
        while self.running:
            for serial, board in list(self.up.items()):
                numbers = self.sent.setdefault(serial, [])
                number = len(numbers)
                board.write(frame("seq", number))
                numbers.append(number)
            await sleep(0.003)


# -- three boards, plugged and pulled while messages flow --------------------------------------


@pytest_twisted.ensureDeferred
async def test_three_boards_plugged_and_pulled_lose_nothing_and_say_where_they_are(
        broker, boards) -> None:
    await broker.start(fleet_config())
    serials = ("A1", "B2", "C3")
    names = {serial: f"sensors.{serial}" for serial in serials}
    browser = await broker.browser()
    inbox = await broker.subscribed(
        browser, *(f"phyllo/sensors/{s}/seq" for s in serials),
        *(f"$devices/{names[s]}" for s in serials))
    plugged = {serial: boards.plug(**PICO, serial_number=serial) for serial in serials}
    await eventually(lambda: all(broker.up(names[s]) for s in serials))
    for serial in serials:
        topic = f"$devices/{names[serial]}"
        (online,) = await eventually(lambda topic=topic: values(inbox[topic]))
        assert online["online"] is True and online["link"] == names[serial]
        assert online["port"] == plugged[serial].device
        assert online["identity"]["serial_number"] == serial
        assert online["identity"]["vid"] == "2e8a" and "device" not in online["identity"]

    traffic = Traffic()
    traffic.up.update(plugged)
    sending = defer.ensureDeferred(traffic.run())
    try:
        async def pull(serial: str) -> None:
            board = traffic.up.pop(serial)
            topic = f"phyllo/sensors/{serial}/seq"
            await eventually(lambda: len(inbox[topic]) == len(traffic.sent[serial]), timeout=10)
            boards.unplug(board)
            await eventually(lambda: names[serial] not in broker.service.phyllo)

        await eventually(lambda: all(len(traffic.sent.get(s, ())) > 30 for s in serials))
        await pull("B2")
        offline = broker.presence(names["B2"])
        assert offline["online"] is False and offline["port"] is None
        assert offline["identity"]["serial_number"] == "B2"
        await sleep(0.2)  # A and C go on alone
        again = boards.plug(**PICO, serial_number="B2")  # back, in another USB port
        assert again.info.location != plugged["B2"].info.location
        await eventually(lambda: broker.on(names["B2"], again))
        traffic.up["B2"] = again
        await sleep(0.2)
        await pull("A1")
        await sleep(0.1)
        await pull("B2")
        await pull("C3")
    finally:
        traffic.running = False
        await sending
    for serial in serials:
        received = values(inbox[f"phyllo/sensors/{serial}/seq"])
        assert received == traffic.sent[serial], serial  # every number, in order
        states = [(state["online"], state["port"]) for state in
                  values(inbox[f"$devices/{names[serial]}"])]
        assert states[-1] == (False, None)
        assert all(online != previous_online for (online, _), (previous_online, _)
                   in zip(states[1:], states, strict=False)), states  # each change said once
    assert len(values(inbox["$devices/sensors.B2"])) == 4  # on, off, on again, off

    # Nothing left of the boards: links, bridges, their hub subscriptions, timers.
    fleet = broker.fleet
    assert fleet.boards == {} and list(fleet) == []
    assert not [name for name in broker.service.phyllo if name.startswith("sensors.")]
    assert not [p for p in broker.service.hub.patterns() if p.startswith("phyllo/sensors/")]
    await eventually(lambda: not no_link_timers())

    # A subscriber that comes later, of another connection, gets each board's state at once.
    late = await broker.browser()
    kept = await broker.subscribed(late, "$devices/sensors.A1")
    (state,) = await eventually(lambda: values(kept["$devices/sensors.A1"]))
    assert state["online"] is False and state["identity"]["serial_number"] == "A1"


@pytest_twisted.ensureDeferred
async def test_boards_that_share_a_serial_number_are_named_by_location(broker, boards) -> None:
    await broker.start(fleet_config())
    first = boards.plug(**PICO, serial_number="CLONE", location="1-5")
    second = boards.plug(**PICO, serial_number="CLONE", location="1-6")
    await eventually(lambda: broker.up("sensors.1-5") and broker.up("sensors.1-6"))
    browser = await broker.browser()
    inbox = await broker.subscribed(browser, "phyllo/sensors/1-5/t", "phyllo/sensors/1-6/t")
    first.write(frame("t", 5))
    second.write(frame("t", 6))
    await eventually(lambda: inbox["phyllo/sensors/1-5/t"] and inbox["phyllo/sensors/1-6/t"])
    assert values(inbox["phyllo/sensors/1-5/t"]) == [5]
    assert values(inbox["phyllo/sensors/1-6/t"]) == [6]
    assert broker.presence("sensors.1-6")["port"] == second.device
    listed = broker.service.admin.api.listeners()["links"]  # the admin API lists each board
    assert [(link["name"], link["prefix"]) for link in listed] == [
        ("sensors.1-5", "phyllo/sensors/1-5"), ("sensors.1-6", "phyllo/sensors/1-6")]
    # One clone left: named by its serial number again.
    boards.unplug(second)
    await eventually(lambda: broker.up("sensors.CLONE"))
    assert set(broker.fleet.boards) == {"sensors.CLONE"}


@pytest_twisted.ensureDeferred
async def test_boards_past_max_boards_are_refused_once_each_then_taken_when_room(
        broker, boards) -> None:
    await broker.start(fleet_config("max_boards = 2\n"))
    plugged = [boards.plug(**PICO, serial_number=f"S{n}") for n in range(3)]
    await eventually(lambda: len(broker.fleet.boards) == 2
                     and broker.warnings("fleet_board_refused"))
    await sleep(0.3)  # several polls: still one warning
    (refused,) = broker.warnings("fleet_board_refused")
    assert refused["link"] == "sensors.S2" and refused["device"] == plugged[2].device
    assert "max_boards is 2" in refused["why"]
    boards.unplug(plugged[0])
    await eventually(lambda: broker.up("sensors.S2"))
    assert set(broker.fleet.boards) == {"sensors.S1", "sensors.S2"}


@pytest_twisted.ensureDeferred
async def test_a_plain_serial_phyllo_link_has_its_presence_too(broker, boards) -> None:
    board = boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    await broker.start(f'{LISTEN}[[phyllo]]\nname = "uno"\nendpoint = "serial:{board.device}"\n')
    await eventually(lambda: broker.up("uno") and broker.presence("uno"))
    state = broker.presence("uno")
    assert state["online"] and state["port"] == board.device
    assert state["identity"]["serial_number"] == "857"
    boards.unplug(board)
    await eventually(lambda: not broker.presence("uno")["online"])
    assert broker.presence("uno")["identity"]["serial_number"] == "857"


@pytest_twisted.ensureDeferred
async def test_only_the_broker_publishes_presence_without_rules(broker, boards) -> None:
    boards.plug(**PICO, serial_number="A1")
    await broker.start(fleet_config())
    await eventually(lambda: broker.up("sensors.A1") and broker.presence("sensors.A1"))
    browser = await broker.browser()
    await browser.publish("$devices/sensors.A1", b'{"online":false}')
    hub = broker.service.hub
    await eventually(lambda: hub.denied.get(("websmq", "publish")))
    assert broker.presence("sensors.A1")["online"] is True


# -- attacks: flapping, hostile identities, a frame cut by the unplug, a flood -----------------


@pytest_twisted.ensureDeferred
async def test_fifty_fast_flaps_leave_no_link_timer_or_bridge(broker, boards) -> None:
    await broker.start(fleet_config())
    board = boards.plug(**PICO, serial_number="FLAP")
    for flap in range(50):
        if flap % 10 == 9:  # now and then long enough for the watcher and the link to see it
            await eventually(lambda board=board: broker.on("sensors.FLAP", board))
        else:
            await sleep(0.01 * (flap % 4))  # mostly faster than the watcher polls
        previous, board = board, boards.replug(board)
        assert board.device != previous.device
    for flap in range(50):  # pulled and plugged back, absent a moment or a few polls
        boards.unplug(board)
        await sleep(0.02 * (flap % 8))
        board = boards.plug(**PICO, serial_number="FLAP")
        await sleep(0.01 * (flap % 3))
    # What a board sends before the host opens its port is lost, as on a real board.
    await eventually(lambda: broker.on("sensors.FLAP", board))
    browser = await broker.browser()
    inbox = await broker.subscribed(browser, "phyllo/sensors/FLAP/t")
    board.write(frame("t", "still here"))
    await eventually(lambda: values(inbox["phyllo/sensors/FLAP/t"]) == ["still here"])
    assert broker.presence("sensors.FLAP")["port"] == board.device
    boards.unplug(board)
    await eventually(lambda: not broker.fleet.boards)
    assert list(broker.fleet) == [] and "sensors.FLAP" not in broker.service.phyllo
    await eventually(lambda: not no_link_timers())
    assert broker.presence("sensors.FLAP")["online"] is False


@pytest_twisted.ensureDeferred
async def test_boards_with_a_new_serial_number_each_time_cannot_grow_what_is_kept(
        broker, boards) -> None:
    await broker.start(fleet_config("max_boards = 4\n"))
    hub = broker.service.hub
    for number in range(20):
        board = boards.plug(**PICO, serial_number=f"EVIL{number}")
        await eventually(lambda number=number: f"sensors.EVIL{number}" in broker.fleet.boards)
        boards.unplug(board)
        await eventually(lambda: not broker.fleet.boards)
    kept = [topic for topic in hub.retained.topics() if topic.startswith("$devices/")]
    assert sorted(kept) == [f"$devices/sensors.EVIL{n}" for n in range(16, 20)]
    assert len(broker.fleet.gone) == 4
    assert len(broker.service.links.presence.state) == 4
    await eventually(lambda: not no_link_timers())


@pytest_twisted.ensureDeferred
async def test_a_serial_number_that_cannot_be_a_name_is_named_by_location(broker,
                                                                         boards) -> None:
    await broker.start(fleet_config())
    boards.plug(**PICO, serial_number="bad\nname:" + "x" * 80, location="1-9")
    boards.plug(**PICO, serial_number="a:b\\c", location="1-8")
    await eventually(lambda: broker.up("sensors.1-9") and broker.up("sensors.a_b_c"))


@pytest_twisted.ensureDeferred
async def test_a_frame_cut_by_the_unplug_does_not_reach_the_board_that_comes_back(
        broker, boards) -> None:
    await broker.start(fleet_config())
    board = boards.plug(**PICO, serial_number="CUT")
    await eventually(lambda: broker.up("sensors.CUT"))
    browser = await broker.browser()
    inbox = await broker.subscribed(browser, "phyllo/sensors/CUT/t")
    whole = frame("t", "half")
    board.write(whole[: len(whole) // 2])
    await sleep(0.05)
    boards.unplug(board)
    await eventually(lambda: not broker.fleet.boards)
    boards.plug(**COMMON_BOARDS["uno"], serial_number="other")
    board = boards.plug(**PICO, serial_number="CUT")
    await eventually(lambda: broker.on("sensors.CUT", board))
    board.write(frame("t", "whole"))
    await eventually(lambda: inbox["phyllo/sensors/CUT/t"])
    await sleep(0.1)
    assert values(inbox["phyllo/sensors/CUT/t"]) == ["whole"]


@pytest_twisted.ensureDeferred
async def test_a_board_that_floods_costs_only_its_own_link(broker, boards) -> None:
    await broker.start(fleet_config())
    flood = boards.plug(**PICO, serial_number="FLOOD")
    quiet = boards.plug(**PICO, serial_number="QUIET")
    await eventually(lambda: broker.up("sensors.FLOOD") and broker.up("sensors.QUIET"))
    browser = await broker.browser()
    inbox = await broker.subscribed(browser, "phyllo/sensors/QUIET/seq")
    junk = bytes(range(1, 256)) * 4  # no delimiter: chunks far over the longest
    flooding = frame("f", "x" * 100) * 50
    sent = []
    for number in range(200):
        flood.write(junk if number % 2 else flooding)
        quiet.write(frame("seq", number))
        sent.append(number)
        await sleep(0.001)
    await eventually(lambda: len(inbox["phyllo/sensors/QUIET/seq"]) == len(sent), timeout=20)
    assert values(inbox["phyllo/sensors/QUIET/seq"]) == sent
    bridge = broker.service.phyllo["sensors.FLOOD"]
    assert bridge.connected and bridge.counters()["framing_errors"] > 0
    assert broker.presence("sensors.QUIET")["online"] is True


# -- an [[attach]] fleet: each board serves the table's protocol on a link of its own ----------


@pytest_twisted.ensureDeferred
async def test_an_attach_fleet_gives_each_board_a_link_and_a_presence(broker, boards) -> None:
    from cobs import cobs

    from wireproto.codecs.websmq import encode_publish

    await broker.start(f'{LISTEN}[[attach]]\nprotocol = "websmq"\nname = "meters"\n'
                       'endpoint = "serial:vid=0403:pid=6001"\neach_board = true\n')
    first = boards.plug(**COMMON_BOARDS["ftdi"], serial_number="M1")
    second = boards.plug(**COMMON_BOARDS["ftdi"], serial_number="M2")
    await eventually(lambda: set(broker.fleet.boards) == {"meters.M1", "meters.M2"}
                     and all((broker.presence(name) or {}).get("online")
                             for name in ("meters.M1", "meters.M2")))
    assert broker.presence("meters.M2")["port"] == second.device
    browser = await broker.browser()
    # One firmware, one topic name: each board's is its own on the hub, under NAME/BOARD.
    inbox = await broker.subscribed(browser, "meters/M1/kwh", "meters/M2/kwh")
    first.write(cobs.encode(encode_publish("kwh", b"1")) + b"\0")
    second.write(cobs.encode(encode_publish("kwh", b"2")) + b"\0")
    await eventually(lambda: inbox["meters/M1/kwh"] and inbox["meters/M2/kwh"])
    assert [m.payload for m in inbox["meters/M1/kwh"] + inbox["meters/M2/kwh"]] == [b"1", b"2"]
    boards.unplug(first)
    await eventually(lambda: set(broker.fleet.boards) == {"meters.M2"})
    assert broker.presence("meters.M1")["online"] is False


@pytest_twisted.ensureDeferred
async def test_an_attach_fleet_with_an_empty_prefix_leaves_its_boards_topics_as_they_are(
        broker, boards) -> None:
    from cobs import cobs

    from wireproto.codecs.websmq import encode_publish

    await broker.start(f'{LISTEN}[[attach]]\nprotocol = "websmq"\nname = "meters"\n'
                       'endpoint = "serial:vid=0403:pid=6001"\neach_board = true\n'
                       'prefix = ""\n')
    board = boards.plug(**COMMON_BOARDS["ftdi"], serial_number="M1")
    await eventually(lambda: (broker.presence("meters.M1") or {}).get("online"))
    browser = await broker.browser()
    inbox = await broker.subscribed(browser, "meters/M1/kwh")
    board.write(cobs.encode(encode_publish("meters/M1/kwh", b"1")) + b"\0")
    await eventually(lambda: inbox["meters/M1/kwh"])
    assert [message.payload for message in inbox["meters/M1/kwh"]] == [b"1"]


@pytest_twisted.ensureDeferred
async def test_a_ubre_subscriber_that_comes_later_gets_the_presence_as_json(broker,
                                                                           boards) -> None:
    from wireproto.protocols.ubre.client import connect as ubre_connect

    await broker.start(fleet_config() + '[[listen]]\nprotocol = "ubre"\ntransport = "ws"\n'
                       'endpoint = "tcp:0"\n')
    board = boards.plug(**PICO, serial_number="U1")
    await eventually(lambda: broker.on("sensors.U1", board))
    client = await wait_for(ubre_connect(reactor, broker.addresses[1]))
    broker.clients.append(client)
    bodies: list[Any] = []
    client.subscribe("$devices/sensors.U1", lambda message: bodies.append(message.body))
    (state,) = await eventually(lambda: bodies)
    assert state["online"] is True and state["port"] == board.device
    assert state["identity"]["product"] == "Pico" and isinstance(state["since"], float)
    boards.unplug(board)
    await eventually(lambda: len(bodies) == 2)
    assert bodies[1]["online"] is False and bodies[1]["identity"] == state["identity"]


@pytest_twisted.ensureDeferred
async def test_a_board_that_reads_nothing_lets_go_of_its_port_when_a_clone_renames_it(
        broker, boards) -> None:
    await broker.start(fleet_config())
    first = boards.plug(**PICO, serial_number="CLONE", location="1-5")
    await eventually(lambda: broker.on("sensors.CLONE", first))
    browser = await broker.browser()
    bridge = broker.service.phyllo["sensors.CLONE"]
    for number in range(1500):  # far more than the line holds: the board reads none of it
        await browser.publish("phyllo/sensors/CLONE/led", b'"%d%s"' % (number, b"x" * 180))
    await eventually(lambda: bridge._paused)  # the port's buffer is full
    second = boards.plug(**PICO, serial_number="CLONE", location="1-6")
    # Renamed by location: the first board's old link must let go of its port at once (what
    # it could not send is dropped), or the new one would share it, or never open.
    await eventually(lambda: broker.on("sensors.1-5", first) and broker.on("sensors.1-6", second))
    assert "sensors.CLONE" not in broker.service.phyllo and not broker.fleet.closing
    inbox = await broker.subscribed(browser, "phyllo/sensors/1-5/t")
    first.write(frame("t", "after the rename"))
    await eventually(lambda: values(inbox["phyllo/sensors/1-5/t"]) == ["after the rename"])


@pytest_twisted.ensureDeferred
async def test_the_broker_stops_at_once_with_a_board_that_reads_nothing(broker, boards) -> None:
    await broker.start(fleet_config())
    board = boards.plug(**PICO, serial_number="DEAF")
    await eventually(lambda: broker.on("sensors.DEAF", board))
    browser = await broker.browser()
    bridge = broker.service.phyllo["sensors.DEAF"]
    for number in range(1500):
        await browser.publish("phyllo/sensors/DEAF/led", b'"%d%s"' % (number, b"x" * 180))
    await eventually(lambda: bridge._paused)
    await wait_for(browser.disconnect(), timeout=5)
    broker.clients.remove(browser)
    await wait_for(broker.service.stopService(), timeout=5)  # as on Ctrl-C
    assert broker.presence("sensors.DEAF")["online"] is False
    assert not broker.fleet.boards and not broker.service.links.ports.running
    await eventually(lambda: not no_link_timers())


@pytest_twisted.ensureDeferred
async def test_access_rules_say_who_may_read_the_presence(broker, boards) -> None:
    listen = ('[[listen]]\nprotocol = "websmq"\ntransport = "ws"\nendpoint = "tcp:0"\n'
              'identity = "anonymous"\n')
    rules = '[auth]\n[[acl]]\nsubscribe = ["#", "$devices/sensors.OPEN"]\n'
    await broker.start(listen + rules + '[[phyllo]]\nname = "sensors"\n'
                       'endpoint = "serial:vid=2e8a:pid=000a"\neach_board = true\n')
    for serial in ("OPEN", "SHUT"):
        boards.plug(**PICO, serial_number=serial)
    await eventually(lambda: broker.presence("sensors.OPEN") and broker.presence("sensors.SHUT"))
    browser = await broker.browser()
    inbox: dict[str, list[Any]] = {"$devices/sensors.OPEN": [], "$devices/sensors.SHUT": []}
    for topic, messages in inbox.items():
        await browser.subscribe(topic, messages.append)
    await eventually(lambda: inbox["$devices/sensors.OPEN"])
    hub = broker.service.hub
    await eventually(lambda: hub.denied.get(("websmq", "subscribe")))  # "#" does not cover $
    assert inbox["$devices/sensors.SHUT"] == []


@pytest_twisted.ensureDeferred
async def test_a_board_cannot_take_another_boards_name_and_leave_it_without_a_link(
        broker, boards) -> None:
    # A device's serial number is its own string: "a:b" is "a_b" once made safe, so the board
    # plugged first took the name and the real "a_b" got no link at all. Both are named by
    # their USB location, as two boards sharing a serial number are.
    await broker.start(fleet_config())
    boards.plug(**PICO, serial_number="a:b", location="1-5")
    await eventually(lambda: broker.up("sensors.a_b"))
    twin = boards.plug(**PICO, serial_number="a_b", location="1-6")
    await eventually(lambda: broker.on("sensors.1-6", twin) and broker.up("sensors.1-5"))
    assert set(broker.fleet.boards) == {"sensors.1-5", "sensors.1-6"}
    # A serial number that is another board's location name: the board without a serial
    # number keeps its link, named by where it is.
    clone = boards.plug(**PICO, location="1-7")
    await eventually(lambda: broker.on("sensors.1-7", clone))
    boards.plug(**PICO, serial_number="1-7", location="1-8")
    await eventually(lambda: broker.up("sensors.1-8"))
    await sleep(0.2)
    assert broker.on("sensors.1-7", clone) and not broker.warnings("fleet_board_refused")
