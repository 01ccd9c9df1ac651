"""A ``serial:`` identity in a config file or on the command line: `wireproto check-config` and
`wireproto serve --phyllo` refuse a bad one in one line naming the table, the endpoint and what
is wrong, and take good ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wireproto.config import ConfigError, parse_attach, parse_phyllo


def wireproto(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wireproto", *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd)


BAD = [
    ("serial:vid=zz:pid=0043", "serial vid is a USB id in hex, such as 2341 or 0x2341, not 'zz'"),
    ("serial:vid=2341:colour=red", "unknown serial endpoint option(s) colour: use baudrate,"),
    ("serial:/dev/ttyACM0:vid=2341",
     "a serial endpoint takes a device or identity fields (vid=2341), not both"),
    ("serial:device=/dev/ttyACM0:serial_number=857",
     "a serial endpoint takes a device or identity fields (serial_number=857), not both"),
    ("serial:vid=2341:vid=2342", "serial vid is given twice"),
    ("serial:serial_number=", "serial serial_number is empty"),
    ("serial:vid=12345", "serial vid is a USB id in hex"),
]


@pytest.mark.parametrize("endpoint, problem", BAD)
def test_a_bad_identity_is_refused_by_phyllo_and_attach(endpoint, problem):
    with pytest.raises(ConfigError) as phyllo:
        parse_phyllo(f"dev1@{endpoint}")
    assert str(phyllo.value).startswith(
        f"--phyllo 'dev1@{endpoint}': bad client endpoint {endpoint!r}: {problem}")
    assert "\n" not in str(phyllo.value)
    with pytest.raises(ConfigError, match="bad client endpoint"):
        parse_attach(f"websmq@{endpoint}")


@pytest.mark.parametrize("endpoint", [
    "serial:vid=2341:pid=0043",
    "serial:vid=0x2341:pid=0x0043:serial_number=85735313:baudrate=115200",
    "serial:location=1-1.2",
    "serial:manufacturer=Arduino (www.arduino.cc)",
    "serial:vid=2e8a:product=Pico:rtscts=yes",
])
def test_a_good_identity_is_taken(endpoint):
    assert parse_phyllo(f"dev1@{endpoint}").endpoint == endpoint
    assert parse_attach(f"websmq@{endpoint}").framing == "cobs"


def test_check_config_names_each_bad_identity_in_a_line(tmp_path):
    (tmp_path / "lab.toml").write_text(
        '[[phyllo]]\nname = "dev1"\nendpoint = "serial:vid=zz:pid=0043"\n\n'
        '[[attach]]\nprotocol = "websmq"\nendpoint = "serial:/dev/ttyACM0:vid=2341"\n')
    done = wireproto("check-config", "lab.toml", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert sorted(done.stderr.splitlines()) == [
        "wireproto check-config: lab.toml: attach[1].endpoint: bad client endpoint "
        "'serial:/dev/ttyACM0:vid=2341': a serial endpoint takes a device or identity fields "
        "(vid=2341), not both",
        "wireproto check-config: lab.toml: phyllo[1].endpoint: bad client endpoint "
        "'serial:vid=zz:pid=0043': serial vid is a USB id in hex, such as 2341 or 0x2341, not "
        "'zz'",
    ]


def test_check_config_takes_good_identities_and_says_them(tmp_path):
    (tmp_path / "lab.toml").write_text(
        '[[phyllo]]\nname = "dev1"\n'
        'endpoint = "serial:vid=2341:pid=0043:serial_number=857:baudrate=115200"\n\n'
        '[[attach]]\nprotocol = "websmq"\nendpoint = "serial:location=1-1.2"\n')
    done = wireproto("check-config", "lab.toml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "wireproto: attach: websmq over cobs on serial:location=1-1.2" in lines
    assert ("wireproto: phyllo: phyllo link dev1 (reduced stack, hub topics phyllo/dev1/...) on "
            "serial:vid=2341:pid=0043:serial_number=857:baudrate=115200") in lines


def test_serve_refuses_a_bad_identity_before_it_starts():
    done = wireproto("serve", "--listen", "websmq+ws@tcp:0", "--phyllo",
                     "dev1@serial:vid=2341:bogus=1")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("wireproto serve: --phyllo 'dev1@serial:vid=2341:bogus=1': "
                                  "bad client endpoint 'serial:vid=2341:bogus=1': unknown serial "
                                  "endpoint option(s) bogus")
    assert done.stderr.count("\n") == 1
