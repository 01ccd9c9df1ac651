"""A fleet table's keys (``each_board``, ``max_boards``, an ``[[attach]]`` table's ``name``),
what is refused and why, ``[devices]``, how check-config shows a fleet, the watcher the
service picks here, and the hub keeping the presence topics within its bounds."""

from __future__ import annotations

import pytest
from twisted.internet import reactor

from wireproto.cli import check_config
from wireproto.config import ConfigError, config_from_toml, config_to_toml
from wireproto.devices import PollingWatcher, UdevWatcher
from wireproto.devices.ports import PortInfo
from wireproto.devices.standin import StandInPorts
from wireproto.devices.watch import udev_running
from wireproto.hub import Hub, HubMessage
from wireproto.service import make_service
from wireproto.service.fleet import board_endpoint, fleet_names

FLEET = '[[phyllo]]\nname = "sensors"\nendpoint = "serial:vid=2e8a:pid=000a"\neach_board = true\n'


def read(text: str):
    return config_from_toml(text, source="fleet.toml", reactor=reactor)


def test_a_fleet_table_reads_shows_and_writes_back() -> None:
    config = read(FLEET + 'max_boards = 8\nprefix = "lab"\n'
                  '[[attach]]\nprotocol = "websmq"\nname = "meters"\n'
                  'endpoint = "serial:vid=0403:pid=6001:baudrate=9600"\neach_board = true\n'
                  "[devices]\npoll_interval = 0.5\n")
    (phyllo,), (attach,) = config.phyllo, config.attach
    assert phyllo.each_board and phyllo.max_boards == 8 and phyllo.prefix == "lab"
    assert attach.each_board and attach.link_name == "meters" and attach.max_boards == 32
    assert config.devices.poll_interval == 0.5
    assert phyllo.describe() == ("phyllo fleet sensors: one link per board (at most 8), each "
                                 "sensors.BOARD (reduced stack, hub topics lab/BOARD/...)")
    assert "one link per board (at most 32), each meters.BOARD" in attach.describe()
    assert read(config_to_toml(config)) == config
    plain = read('[[phyllo]]\nname = "one"\nendpoint = "serial:/dev/ttyACM0"\n')
    assert "each_board" not in config_to_toml(plain)  # a plain link is written as before


def test_check_config_shows_a_fleet(tmp_path, capsys) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    assert check_config(str(path)) == 0
    assert ("phyllo: phyllo fleet sensors: one link per board (at most 32), each sensors.BOARD"
            in capsys.readouterr().out)


@pytest.mark.parametrize(("text", "problem"), [
    ('[[phyllo]]\nname = "s"\nendpoint = "serial:/dev/ttyACM0"\neach_board = true\n',
     "phyllo[1].each_board: each_board needs an endpoint that matches boards by their USB "
     "identity, such as serial:vid=2341:pid=0043; 'serial:/dev/ttyACM0' names one port"),
    ('[[phyllo]]\nname = "s"\nendpoint = "serial:device=/dev/ttyACM0"\n'
     "each_board = true\n", "names one port"),
    ('[[phyllo]]\nname = "s"\nendpoint = "tcp:host:2000"\neach_board = true\n',
     "names no serial board (a tcp: endpoint)"),
    ('[[attach]]\nprotocol = "websmq"\nendpoint = "serial:/dev/ttyUSB0"\neach_board = true\n',
     "attach[1].each_board: each_board needs an endpoint that matches boards"),
    ('[[phyllo]]\nname = "s"\nendpoint = "serial:vid=2e8a"\neach_board = "yes"\n',
     "phyllo[1].each_board: expected true or false"),
    ('[[phyllo]]\nname = "s"\nendpoint = "serial:vid=2e8a"\nmax_boards = 4\n',
     "phyllo[1].max_boards: max_boards bounds the links of each_board = true"),
    (FLEET + "max_boards = 0\n", "phyllo[1].max_boards: must be 1 to 1024, not 0"),
    (FLEET + "max_boards = 100000\n", "must be 1 to 1024"),
    (FLEET + '[[phyllo]]\nname = "sensors.E661"\nendpoint = "tcp:h:1"\n',
     "phyllo[2].name: 'sensors.E661' is a name 'sensors''s boards may take"),
    (FLEET + '[[attach]]\nprotocol = "websmq"\nname = "sensors"\n'
     'endpoint = "serial:vid=0403"\neach_board = true\n',
     "attach[1].name: 'sensors' would name links as phyllo[1]'s 'sensors' does"),
    ('[[attach]]\nprotocol = "websmq"\nname = "bad name"\nendpoint = "serial:vid=0403"\n',
     "attach[1].name: a link name is letters"),
    ('[[phyllo]]\nname = "s"\nendpoint = "tcp:h:1"\nprefix = "$devices/s"\n',
     "phyllo[1].prefix: $devices/ is where the broker says which devices are present"),
    ("[devices]\npoll_interval = 0.001\n",
     "devices.poll_interval: the ports are listed at most every 0.05 s, not 0.001"),
])
def test_what_a_fleet_table_refuses(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        read('listen = ["websmq+ws@tcp:0"]\n' + text)
    assert problem in str(refused.value)


def test_each_board_is_named_by_serial_number_else_location_and_narrowed_to_it() -> None:
    ports = [PortInfo("/dev/ttyACM0", vid=1, serial_number="A", location="1-1"),
             PortInfo("/dev/ttyACM1", vid=1, serial_number="C", location="1-2"),
             PortInfo("/dev/ttyACM2", vid=1, serial_number="C", location="1-3:1.0"),
             PortInfo("/dev/ttyACM3", vid=1),  # neither: cannot be followed, left out
             PortInfo("/dev/ttyACM4", vid=1, serial_number="x\x1b[2J", location="1-4")]
    names = fleet_names(ports)
    assert {name: port.device for name, (port, _) in names.items()} == {
        "A": "/dev/ttyACM0", "1-2": "/dev/ttyACM1", "1-3_1.0": "/dev/ttyACM2",
        "1-4": "/dev/ttyACM4"}
    assert board_endpoint("serial:vid=2341:baudrate=9600", ports[0], True) == (
        "serial:baudrate=9600:vid=2341:serial_number=A")
    assert board_endpoint("serial:vid=2341:serial_number=C", ports[2], False) == (
        "serial:vid=2341:serial_number=C:location=1-3\\:1.0")
    odd = PortInfo("/dev/ttyACM5", vid=1, serial_number="a:b\\c")
    assert board_endpoint("serial:vid=1", odd, True) == "serial:vid=1:serial_number=a\\:b\\\\c"


def test_the_hub_keeps_presence_within_its_bounds_whatever_retain_says() -> None:
    hub = Hub(max_retained=2)
    assert hub.retained is None
    kept = hub.keep_last_values("$devices/#")
    for name in ("a", "b", "c"):
        hub.publish(HubMessage(f"$devices/{name}", b"{}"))
    hub.publish(HubMessage("other", b"1"))
    assert kept.topics() == ["$devices/a", "$devices/b"] and kept.refused == 1
    both = Hub(retain=("tt/#",))
    both.keep_last_values("$devices/#")
    both.publish(HubMessage("$devices/a", b"{}"))
    both.publish(HubMessage("tt/x", b"1"))
    assert sorted(both.retained.topics()) == ["$devices/a", "tt/x"]


def test_the_service_watches_by_polling_at_the_configured_pace_where_udev_is_not() -> None:
    if udev_running():
        pytest.skip("udev runs here: the service watches its events, not by polling")
    config = read('listen = []\n' + FLEET + "[devices]\npoll_interval = 0.25\n")
    service = make_service(config, reactor)
    watcher = service.links.watcher()
    assert isinstance(watcher, PollingWatcher) and watcher.interval == 0.25


def test_the_udev_watcher_starts_and_stops_where_udev_runs() -> None:
    if not udev_running():
        reason = ("no pyudev" if not _has_pyudev() else
                  "udev does not run here (/run/udev/control is missing)")
        pytest.skip(f"the udev watcher needs pyudev and a running udev: {reason}")
    boards = StandInPorts()
    watcher = UdevWatcher(reactor, boards.ports)
    try:
        watcher.start()
        assert watcher.running and watcher.fileno() >= 0
        watcher.start()  # a second start changes nothing
    finally:
        watcher.stop()
        boards.close()
    assert not watcher.running and watcher.fileno() == -1
    assert watcher._pending is None and watcher._safety is None  # no timer left


def _has_pyudev() -> bool:
    try:
        import pyudev  # noqa: F401
    except ImportError:
        return False
    return True
