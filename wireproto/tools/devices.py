"""``wireproto devices``: the serial ports of this machine with their USB identity, as a table
or (``--json``) a JSON list, and with ``--match`` the port a ``serial:`` identity would open.

What a port reports (its serial number, manufacturer, product) comes from the USB device
itself: the table shows it with anything unprintable escaped and long values cut, so a hostile
or broken device cannot move the terminal's cursor or widen the table without bound.
"""

from __future__ import annotations

import argparse
import json
import sys

from wireproto.devices.matching import (
    MATCH_KEYS,
    NoMatchingPort,
    PortMatch,
    SeveralMatchingPorts,
    resolve,
)
from wireproto.devices.ports import PortInfo, PortLister, system_ports
from wireproto.logs import escape_controls
from wireproto.output import write_output
from wireproto.transports.serial import split_fields

__all__ = ["register", "run", "table", "parse_match"]

PROG = "wireproto devices"
WIDEST = 40
"""Characters of a field the table shows; a USB string descriptor may hold 126."""

# Exit statuses: 0 listed (and with --match, exactly one port matched); 1 --match found no port
# or several; 2 a bad --match.
NOT_ONE = 1
BAD_MATCH = 2


def register(commands: argparse._SubParsersAction) -> None:
    """Adds ``devices``."""
    devices = commands.add_parser(
        "devices",
        help="list serial ports and their USB identity",
        description="List this machine's serial ports with what pyserial knows of each: "
                    "device, /dev/serial/by-id name, USB VID and PID, serial number, "
                    "manufacturer, product and location (the USB port path).",
        epilog="Exit status: 0; with --match, 1 when no port or several ports match, 2 for "
               "a bad --match. See docs/tools.md and docs/phyllo.md, \"Boards by identity\".",
    )
    devices.add_argument("--json", action="store_true",
                         help="a JSON list, one object a port ([] when there are none)")
    devices.add_argument(
        "--match", metavar="IDENTITY",
        help="only the ports a serial: endpoint with these identity fields matches, e.g. "
             "vid=2341:pid=0043 or serial:vid=2341:pid=0043:serial_number=857, and the one it "
             f"would open (fields: {', '.join(MATCH_KEYS)})")
    devices.set_defaults(run=run)


def parse_match(text: str) -> PortMatch:
    """``vid=2341:pid=0043`` (or a whole ``serial:vid=...`` endpoint, such as the table's
    "open with", ``\\:`` escapes included) as a PortMatch; line settings (``baudrate=``) are
    ignored, a device is refused. Raises ValueError."""
    fields = split_fields(text)
    if fields[0] == "serial":
        fields = fields[1:]
    identity: dict[str, str] = {}
    for field in fields:
        key, equals, value = field.partition("=")
        if not equals:
            raise ValueError(f"{field!r} is not KEY=VALUE: --match takes identity fields, such "
                             "as vid=2341:pid=0043, not a device")
        if key in ("baudrate", "bytesize", "parity", "stopbits", "xonxoff", "rtscts"):
            continue
        if key in identity:
            raise ValueError(f"{key} is given twice")
        identity[key] = value
    return PortMatch.from_options(identity)


def _shown(value: str | None) -> str:
    """`value` safe for a terminal: unprintable characters escaped, at most WIDEST long."""
    if not value:
        return "-"
    text = "".join(char if char.isprintable() else ascii(char)[1:-1] for char in value)
    return text if len(text) <= WIDEST else text[:WIDEST - 3] + "..."


def _usb_id(port: PortInfo) -> str:
    if port.vid is None:
        return "-"
    return f"{port.vid:04x}:{port.pid or 0:04x}"


def _escaped(value: str) -> str:
    """`value` as an endpoint string's field: ``\\`` and ``:`` escaped (an ESP32-S3's serial
    number is its MAC address, ``F4:12:FA:...``)."""
    return value.replace("\\", "\\\\").replace(":", "\\:")


def _endpoint(port: PortInfo) -> str | None:
    """The ``serial:`` identity that opens this board alone wherever it is plugged, if it has
    a serial number (one a terminal can show); else by the USB port it is in."""
    if port.vid is None:
        return None
    identity = f"serial:vid={port.vid:04x}:pid={port.pid or 0:04x}"
    if port.serial_number and port.serial_number.isprintable():
        return f"{identity}:serial_number={_escaped(port.serial_number)}"
    if port.location and port.location.isprintable():
        return f"{identity}:location={_escaped(port.location)}"
    return identity


def table(ports: list[PortInfo], match: PortMatch | None = None) -> list[str]:
    """The ports as `wireproto devices` prints them: a row each, then under it its
    /dev/serial/by-id name and the endpoint that opens it by identity."""
    if match is not None:
        ports = match.select(ports)
    if not ports:
        if match is not None:
            return [f"no serial port has {match.describe()}"]
        return ["no serial ports found"]
    header = ("DEVICE", "VID:PID", "SERIAL NUMBER", "LOCATION", "MANUFACTURER", "PRODUCT")
    rows = [header] + [
        (_shown(port.device), _usb_id(port), _shown(port.serial_number), _shown(port.location),
         _shown(port.manufacturer), _shown(port.product))
        for port in ports
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(rows[0], widths, strict=True))
             .rstrip()]
    for port, row in zip(ports, rows[1:], strict=True):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                     .rstrip())
        if port.by_id:
            lines.append(f"    by-id: {''.join(c if c.isprintable() else '?' for c in port.by_id)}")
        endpoint = _endpoint(port)
        if endpoint is not None:
            lines.append(f"    open with: {endpoint}")
    return lines


def choice(ports: list[PortInfo], match: PortMatch) -> tuple[str, bool]:
    """What a link with `match` would open now: the line saying so, and whether it is one."""
    try:
        port = resolve(match, ports)
    except (NoMatchingPort, SeveralMatchingPorts) as error:
        said = str(error.args[0])  # without ConnectError's "An error occurred while connecting"
        return "".join(c if c.isprintable() else "?" for c in said), False
    # The board's own strings (its serial number) may hold a terminal's control sequences.
    return escape_controls(f"{match.describe()} opens {port.device} ({port.identity()})"), True


def run(args: argparse.Namespace, lister: PortLister = system_ports) -> int:
    match = None
    if args.match is not None:
        try:
            match = parse_match(args.match)
        except ValueError as error:
            print(f"{PROG}: --match {args.match!r}: {error}", file=sys.stderr, flush=True)
            return BAD_MATCH
    try:
        ports = lister()
    except Exception as error:  # /sys or /dev unreadable, or a device's strings undecodable
        print(f"{PROG}: cannot list serial ports: {error}", file=sys.stderr, flush=True)
        return 1
    if args.json:
        shown = ports if match is None else match.select(ports)
        write_output(json.dumps([port.as_json() for port in shown], indent=2) + "\n", PROG)
    else:
        lines = table(ports, match)
        if match is not None:
            # what a link would open, or why none: naming every port when none matched
            said = choice(ports, match)[0]
            lines = [*lines, "", said] if match.select(ports) else [said]
        write_output("".join(f"{line}\n" for line in lines), PROG)
    if match is None:
        return 0
    said, one = choice(ports, match)
    if not one and args.json:
        print(f"{PROG}: {said}", file=sys.stderr, flush=True)
    return 0 if one else NOT_ONE
