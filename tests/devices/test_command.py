"""`wireproto devices`: the real command lists what system_ports() lists here; its table, its
JSON and --match, given pty stand-ins for boards in this process; a hostile device's strings
kept off the terminal; a bad --match refused in one line; output that cannot be written."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from wireproto.devices import resolve, system_ports
from wireproto.devices.standin import COMMON_BOARDS, StandInPorts
from wireproto.tools import devices


def wireproto(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wireproto", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def boards():
    standins = StandInPorts()
    yield standins
    standins.close()


def run(capsys, lister, *words: str) -> tuple[int, str, str]:
    args = argparse.Namespace(json="--json" in words, match=None)
    if "--match" in words:
        args.match = words[words.index("--match") + 1]
    status = devices.run(args, lister=lister)
    said = capsys.readouterr()
    return status, said.out, said.err


def test_the_command_lists_what_the_system_lists():
    done = wireproto("devices", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [port.as_json() for port in system_ports()]
    table = wireproto("devices")
    assert table.returncode == 0 and table.stderr == ""
    for port in system_ports():
        assert port.device in table.stdout


def test_the_table_shows_each_board_and_how_to_open_it(capsys, boards):
    uno = boards.plug(**COMMON_BOARDS["uno"], serial_number="85735313", location="1-1.2:1.0")
    clone = boards.plug(**COMMON_BOARDS["nano-ch340"], location="1-1.3")
    status, out, _ = run(capsys, boards.ports)
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == ["DEVICE", "VID:PID", "SERIAL", "NUMBER", "LOCATION",
                                "MANUFACTURER", "PRODUCT"]
    row = next(line for line in lines if line.startswith(uno.device + " "))
    assert row.split()[1:4] == ["2341:0043", "85735313", "1-1.2:1.0"]
    assert "Arduino (www.arduino.cc)" in row
    assert "    open with: serial:vid=2341:pid=0043:serial_number=85735313" in lines
    # a clone without a serial number is opened by the USB port it is in
    assert "    open with: serial:vid=1a86:pid=7523:location=1-1.3" in lines
    assert any(line.startswith(clone.device + " ") and " - " in line for line in lines)


def test_the_json_is_every_port_as_json(capsys, boards):
    boards.plug(**COMMON_BOARDS["pico"], serial_number="E6614C311B4B7E2A")
    status, out, _ = run(capsys, boards.ports, "--json")
    assert status == 0
    assert json.loads(out) == [port.as_json() for port in boards.ports()]
    assert json.loads(out)[0]["vid"] == "2e8a" and json.loads(out)[0]["pid"] == "000a"


def test_no_ports_is_said_plainly_and_is_an_empty_list(capsys):
    assert run(capsys, list) == (0, "no serial ports found\n", "")
    assert run(capsys, list, "--json") == (0, "[]\n", "")


def test_match_shows_the_port_a_link_would_open(capsys, boards):
    first = boards.plug(**COMMON_BOARDS["uno"], serial_number="857")
    second = boards.plug(**COMMON_BOARDS["uno"], serial_number="858")
    boards.plug(**COMMON_BOARDS["ftdi"], serial_number="A1")
    status, out, _ = run(capsys, boards.ports, "--match", "vid=2341:pid=0043")
    assert status == devices.NOT_ONE
    assert first.device in out and second.device in out and "0403:6001" not in out
    assert "2 serial ports have vid=2341:pid=0043" in out and "add serial_number=" in out
    status, out, _ = run(capsys, boards.ports,
                         "--match", "serial:vid=2341:pid=0043:serial_number=858:baudrate=9600")
    assert status == 0
    assert out.splitlines()[-1] == (
        f"vid=2341:pid=0043:serial_number=858 opens {second.device} (2341:0043 serial 858 "
        f"at {second.info.location})")
    status, out, _ = run(capsys, boards.ports, "--match", "vid=2e8a")
    assert status == devices.NOT_ONE
    assert out.startswith("no serial port has vid=2e8a: found ") and first.device in out
    status, out, err = run(capsys, boards.ports, "--json", "--match", "vid=0403")
    assert status == 0 and [port["serial_number"] for port in json.loads(out)] == ["A1"]


@pytest.mark.parametrize("match, problem", [
    ("vid=zz", "serial vid is a USB id in hex"),
    ("colour=red", "'colour' is not an identity field"),
    ("/dev/ttyACM0", "not KEY=VALUE"),
    ("vid=2341:vid=2342", "vid is given twice"),
])
def test_a_bad_match_is_one_line_and_status_2(match, problem):
    done = wireproto("devices", "--match", match)
    assert done.returncode == devices.BAD_MATCH and done.stdout == ""
    assert done.stderr.startswith(f"wireproto devices: --match {match!r}: ")
    assert problem in done.stderr and done.stderr.count("\n") == 1


def test_a_hostile_devices_strings_do_not_reach_the_terminal_raw(capsys, boards):
    boards.plug(0x2341, 0x0043, serial_number="\x1b[2J\x1b]0;owned\x07",
                manufacturer="A" * 500, product="line\nbreak")
    status, out, _ = run(capsys, boards.ports)
    assert status == 0
    assert "\x1b" not in out and "\x07" not in out and "A" * 41 not in out
    assert "\\x1b[2J" in out and "line\\nbreak" in out
    # whose serial number cannot be written in an endpoint is opened by its USB port
    assert "open with: serial:vid=2341:pid=0043:location=1-1\n" in out
    # JSON escapes them itself
    status, out, _ = run(capsys, boards.ports, "--json")
    assert json.loads(out)[0]["serial_number"] == "\x1b[2J\x1b]0;owned\x07"
    assert "\x1b" not in out


def test_a_match_that_opens_a_hostile_board_does_not_echo_its_strings_raw(capsys, boards):
    # The line saying which port a link would open named the board's identity raw: its
    # serial number cleared the screen and set the terminal's title, 10 KB long.
    boards.plug(0x2341, 0x0043, serial_number="\x1b[2J\x1b]0;owned\x07" + "S" * 10_000,
                location="1-1\x1b[31m")
    status, out, _ = run(capsys, boards.ports, "--match", "vid=2341")
    assert status == 0
    assert "\x1b" not in out and "\x07" not in out and "S" * 100 not in out
    (said,) = [line for line in out.splitlines() if " opens " in line]
    assert "serial \\x1b[2J\\x1b]0;owned\\x07SSS" in said and "at 1-1\\x1b[31m" in said


def test_output_that_cannot_be_written_is_one_line_and_status_1():
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "wireproto", "devices", "--json"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr == "wireproto devices: cannot write the output: No space left on device\n"


def test_the_endpoint_shown_opens_that_board_even_with_a_colon_in_its_serial(capsys, boards):
    from twisted.internet import reactor

    from wireproto.transports.serial import serial_endpoint_from_string

    boards.plug(**COMMON_BOARDS["esp32-s3"], serial_number="F4:12:FA:00:11:23")
    esp = boards.plug(**COMMON_BOARDS["esp32-s3"], serial_number="F4:12:FA:00:11:22")
    _, out, _ = run(capsys, boards.ports)
    hint = "serial:vid=303a:pid=1001:serial_number=F4\\:12\\:FA\\:00\\:11\\:22"
    assert f"    open with: {hint}" in out.splitlines()
    match = serial_endpoint_from_string(reactor, hint, lister=boards.ports).match
    assert match is not None and resolve(match, boards.ports()).device == esp.device


def test_ports_that_cannot_be_listed_are_one_line_and_status_1(capsys):
    def broken() -> list:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    status, out, err = run(capsys, broken)
    assert (status, out) == (1, "")
    assert err == ("wireproto devices: cannot list serial ports: 'utf-8' codec can't decode "
                   "byte 0xff in position 0: invalid start byte\n")


def test_fifty_boards_are_listed_and_a_match_names_a_bounded_few(capsys, boards):
    plugged = [boards.plug(**COMMON_BOARDS["nano-ch340"], location=f"1-{n}") for n in range(50)]
    status, out, _ = run(capsys, boards.ports)
    assert status == 0
    assert sum(line.startswith("/dev/") for line in out.splitlines()) == 50
    status, out, _ = run(capsys, boards.ports, "--match", "vid=1a86")
    said = out.splitlines()[-1]
    assert status == devices.NOT_ONE and said.startswith("50 serial ports have vid=1a86: found ")
    assert "; and 42 more; add serial_number= or location= to choose one" in said
    assert len(said) < 1000 and sum(board.device + " " in said for board in plugged) == 8


def test_match_takes_the_endpoint_the_table_says_opens_a_board(capsys, boards):
    esp = boards.plug(**COMMON_BOARDS["esp32-s3"], serial_number="F4:12:FA:00:11:22")
    clone = boards.plug(**COMMON_BOARDS["nano-ch340"], location="1-1.3:1.0")
    _, out, _ = run(capsys, boards.ports)
    hints = [line.removeprefix("    open with: ") for line in out.splitlines()
             if line.startswith("    open with: ")]
    assert len(hints) == 2
    for hint, board in zip(hints, (esp, clone) if esp.device < clone.device else (clone, esp),
                           strict=True):
        status, out, _ = run(capsys, boards.ports, "--match", hint)
        assert status == 0, out
        assert f" opens {board.device} (" in out.splitlines()[-1]


def test_the_port_a_match_opens_is_said_without_its_strings_raw(capsys, boards):
    boards.plug(0x2341, 0x0043, serial_number="\x1b[2J\x1b]0;owned\x07", location="1-1.\x1b[K")
    status, out, _ = run(capsys, boards.ports, "--match", "vid=2341")
    assert status == 0
    assert "\x1b" not in out and "\x07" not in out
    assert "serial \\x1b[2J\\x1b]0;owned\\x07 at 1-1.\\x1b[K)" in out.splitlines()[-1]
