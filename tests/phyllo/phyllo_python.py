"""phyllo-python 0.2.0 (PyPI `phyllo`), the Phyllo reference, as a real peer on a serial device.

Its wheel leaves out the module `phyllo.util`, which its code imports. `install_util()` puts the
two names it uses into `sys.modules`, written here from NOTES.md "Phyllo":

- `phyllo.util.crc.compute_reflected_crc(buffer)`: Ray32sub8, a table in pure Python as in
  phyllo-python itself (and on purpose not wireproto's code, so the two can disagree);
- `phyllo.util.logging.IndentedLogger(logger, extra)`: a logging adapter.

Run as a script, this file is a phyllo-python peer in a process of its own. It opens DEVICE with
pyserial and polls it through phyllo-python's `PollingSerialAdapter`, as phyllo-python's own
serial examples do::

    python tests/phyllo/phyllo_python.py peer DEVICE --stack reduced --units documents --expect 4
    python tests/phyllo/phyllo_python.py receive DEVICE --count 10000 --topic temp --body 81a174cb
    python tests/phyllo/phyllo_python.py send DEVICE --count 10000 --topic temp --body 81a174cb

Every mode prints `ready` once the port is open, then JSON lines. `check` prints `ok`, or why
phyllo-python cannot be imported.

- `peer` (tests/phyllo/test_phyllo_python.py) publishes `peer_units()`, then echoes every unit it
  receives on the same topic with the same type, format and schema, printing each one
  (`describe()`); it stops after `--expect` units or `--timeout` seconds.
- `receive` and `send` (bench/phyllo.py) take one msgpack document (`--topic`, `--body` in hex)
  and receive or send it `--count` times, then print the `time.monotonic()` clock of the first
  and last unit, and the CPU time (`time.process_time()`) between them. `--reads bulk` hands
  the stack whatever bytes are waiting instead of going through the adapter, which reads one
  byte per call (pyserial's `read_until`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import types
from typing import Any

import msgpack

RAY32SUB8_REFLECTED = 0xB7800000
"""Ray32sub8's polynomial 0x000001ED, bits reversed (NOTES.md)."""


def _reflected_table(polynomial: int) -> list[int]:
    table = []
    for byte in range(256):
        remainder = byte
        for _ in range(8):
            remainder = (remainder >> 1) ^ polynomial if remainder & 1 else remainder >> 1
        table.append(remainder)
    return table


_TABLE = _reflected_table(RAY32SUB8_REFLECTED)


def compute_reflected_crc(buffer: bytes) -> int:
    """Ray32sub8: reflected in and out, init and xorout 0xFFFFFFFF."""
    remainder = 0xFFFFFFFF
    for byte in buffer:
        remainder = _TABLE[(remainder ^ byte) & 0xFF] ^ (remainder >> 8)
    return remainder ^ 0xFFFFFFFF


class IndentedLogger(logging.LoggerAdapter):
    """Prefixes each record with its layer's class name, indented by the layer's depth."""

    def process(self, msg: Any, kwargs: Any) -> tuple[str, Any]:
        depth = int(self.extra.get("indentation", 0))
        return f"{'| ' * depth}[{self.extra.get('class', '')}] {msg}", kwargs


def install_util() -> None:
    """Put the stand-in `phyllo.util` modules into `sys.modules`, unless a real one is there."""
    if "phyllo.util" in sys.modules:
        return
    util = types.ModuleType("phyllo.util")
    crc = types.ModuleType("phyllo.util.crc")
    crc.compute_reflected_crc = compute_reflected_crc  # type: ignore[attr-defined]
    log = types.ModuleType("phyllo.util.logging")
    log.IndentedLogger = IndentedLogger  # type: ignore[attr-defined]
    util.crc, util.logging = crc, log  # type: ignore[attr-defined]
    sys.modules.update({"phyllo.util": util, "phyllo.util.crc": crc, "phyllo.util.logging": log})


def phyllo_missing() -> str | None:
    """Why phyllo-python cannot be imported, or None if it can."""
    try:
        load_phyllo()
    except ImportError as error:
        return f"phyllo-python (pip install phyllo==0.2.0) cannot be imported: {error}"
    return None


def load_phyllo() -> types.SimpleNamespace:
    """The parts of phyllo-python this peer uses; raises ImportError if it is not installed."""
    install_util()
    from phylline.links.events import LinkException
    from phyllo.io.polling.serial import PollingSerialAdapter
    from phyllo.protocol.application.pubsub import MessageLink
    from phyllo.protocol.application.stacks import make_pubsub
    from phyllo.protocol.communication import AutomaticStack
    from phyllo.protocol.stacks import make_stack
    from phyllo.protocol.transport.stacks import make_preset_stack

    return types.SimpleNamespace(
        LinkException=LinkException,
        PollingSerialAdapter=PollingSerialAdapter,
        MessageLink=MessageLink,
        make_pubsub=make_pubsub,
        AutomaticStack=AutomaticStack,
        make_stack=make_stack,
        make_transport=make_preset_stack,
    )


# --- the units -----------------------------------------------------------------------------------

MESSAGES, DOCUMENTS = "messages", "documents"
DOCUMENT_TYPE, MSGPACK = 0x40, 0x11
MAX_FRAME_PAYLOAD = 253  # NOTES.md: the most a frame carries for interop
STACK_OVERHEAD = {"minimal": 2, "reduced": 2 + 5}  # datagram, plus validated datagram
MESSAGE_HEADER = 2  # payload type, topic length


def max_payload(stack: str, topic: bytes) -> int:
    """The longest message payload on `topic` whose frame payload is MAX_FRAME_PAYLOAD."""
    return MAX_FRAME_PAYLOAD - STACK_OVERHEAD[stack] - MESSAGE_HEADER - len(topic)


def peer_units(kind: str, stack: str) -> list[tuple]:
    """What the peer publishes: (topic, payload type, payload) messages or (topic, schema, value)
    documents, with tuples for arrays as phyllo-python reads them (msgpack `use_list=False`)."""
    if kind == MESSAGES:
        longest = b"fifteen-bytes!!"
        return [
            (b"echo", 0x10, b"hello"),
            (b"", 0x10, b"\x00zeros\x00\x00and an empty topic\x00"),
            (b"t", 0x11, b""),
            (longest, 0x10, bytes(range(256))[: max_payload(stack, longest)]),
        ]
    # A str8 of n characters is n + 2 bytes of msgpack; a document adds format and schema.
    text = "x" * (max_payload(stack, b"big") - 2 - 2)
    return [
        (b"echo", 0x00, "hello"),
        (b"string8", 0x11, "abcd"),
        (b"pair", 0x70, (True, "abcd")),
        (b"reading", 0x00, {"t": 21.5, "n": -7, "ok": False, "raw": b"\x00\xff", "none": None,
                            "list": (1, 2, (3,)), 1: "int key", "s": "h\u00e9llo"}),
        (b"big", 0x00, text),
    ]


def describe(kind: str, event: Any) -> dict[str, Any]:
    """A unit phyllo-python handed up, as a JSON-able dict."""
    topic, payload = event.data
    if kind == MESSAGES:
        return {"topic": topic.hex(), "type": event.type, "payload": payload.hex()}
    return {"topic": topic.hex(), "type": event.type, "format": event.format,
            "schema": event.schema, "value": repr(payload)}


# --- the peer ------------------------------------------------------------------------------------


def build_stack(phyllo: types.SimpleNamespace, stack: str, kind: str) -> Any:
    """phyllo-python's `stack` preset (minimal, reduced) under a message link, and its pub-sub
    document link if `kind` is documents."""
    transport = phyllo.make_transport(logical=stack)
    if kind == DOCUMENTS:
        application = phyllo.make_pubsub()
    else:
        application = phyllo.AutomaticStack(phyllo.MessageLink(), name="Messages")
    return phyllo.make_stack(transport_stack=transport, application_stack=application)


def send(adapter: Any, kind: str, topic: bytes, code: int, payload: Any) -> None:
    """Send a message (`code` is its payload type) or a msgpack document (`code`: its schema)."""
    if kind == MESSAGES:
        adapter.send_data((topic, payload), type=code)
    else:
        adapter.send_data((topic, payload), type=DOCUMENT_TYPE, format=MSGPACK, schema=code)


def echo(adapter: Any, kind: str, event: Any) -> None:
    if kind == MESSAGES:
        adapter.send_data(event.data, type=event.type)
    else:
        adapter.send_data(event.data, type=event.type, format=event.format, schema=event.schema)


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def open_port(phyllo: types.SimpleNamespace, device: str, stack: str, kind: str) -> Any:
    import serial

    connection = serial.Serial(device, baudrate=115200, timeout=0.05)
    adapter = phyllo.PollingSerialAdapter(connection, build_stack(phyllo, stack, kind))
    adapter.start()
    print("ready", flush=True)
    return adapter


def received(phyllo: types.SimpleNamespace, adapter: Any, reads: str) -> list[Any]:
    """Read what has arrived (waiting at most the port's timeout), and the units it completed."""
    if reads == "adapter":
        adapter.to_read(block_until=b"\0")
    else:
        connection = adapter.connection
        data = connection.read(max(1, connection.in_waiting))
        if data:
            adapter.pipeline.to_read(data)
    units = []
    while adapter.has_receive():
        units.append(adapter.receive())
    return units


def run_peer(options: argparse.Namespace) -> int:
    phyllo = load_phyllo()
    adapter = open_port(phyllo, options.device, options.stack, options.units)
    for topic, code, payload in peer_units(options.units, options.stack):
        send(adapter, options.units, topic, code, payload)
    count, deadline = 0, time.monotonic() + options.timeout
    while count < options.expect and time.monotonic() < deadline:
        for event in received(phyllo, adapter, "adapter"):
            if isinstance(event, phyllo.LinkException):
                emit(error=str(event))
                continue
            emit(**describe(options.units, event))
            echo(adapter, options.units, event)
            count += 1
    emit(done=count)
    return 0 if count == options.expect else 1


def run_bench(options: argparse.Namespace) -> int:
    phyllo = load_phyllo()
    topic, body = options.topic.encode(), bytes.fromhex(options.body)
    value = msgpack.unpackb(body, use_list=False, raw=False, strict_map_key=False)
    adapter = open_port(phyllo, options.device, options.stack, DOCUMENTS)
    count = bad = 0
    first = last = cpu_first = cpu_last = None
    if options.mode == "send":
        first, cpu_first = time.monotonic(), time.process_time()
        for _ in range(options.count):
            send(adapter, DOCUMENTS, topic, options.schema, value)
        last, cpu_last = time.monotonic(), time.process_time()
        count = options.count
    else:
        deadline = time.monotonic() + options.timeout
        while count < options.count and time.monotonic() < deadline:
            for event in received(phyllo, adapter, options.reads):
                if first is None:
                    first, cpu_first = time.monotonic(), time.process_time()
                if isinstance(event, phyllo.LinkException) or event.data != (topic, value):
                    bad += 1
                else:
                    count += 1
                last, cpu_last = time.monotonic(), time.process_time()
    cpu = None if cpu_first is None else cpu_last - cpu_first
    emit(count=count, bad=bad, first=first, last=last, cpu=cpu)
    return 0 if count == options.count and not bad else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    modes.add_parser("check", help="print why phyllo-python cannot be imported, or `ok`")
    peer = modes.add_parser("peer", help="publish peer_units(), then echo what arrives")
    peer.add_argument("--units", choices=(MESSAGES, DOCUMENTS), default=DOCUMENTS)
    peer.add_argument("--expect", type=int, required=True, help="units to echo, then stop")
    for name in ("receive", "send"):
        bench = modes.add_parser(name, help=f"{name} --count msgpack documents, for bench/")
        bench.add_argument("--count", type=int, required=True)
        bench.add_argument("--topic", required=True)
        bench.add_argument("--body", required=True, help="the msgpack body, in hex")
        bench.add_argument("--schema", type=lambda s: int(s, 0), default=0)
        bench.add_argument("--reads", choices=("adapter", "bulk"), default="adapter")
    for name, mode in modes.choices.items():
        if name == "check":
            continue
        mode.add_argument("device")
        mode.add_argument("--stack", choices=sorted(STACK_OVERHEAD), default="reduced")
        mode.add_argument("--timeout", type=float, default=30.0, help="give up after (s)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if options.mode == "check":
        print(phyllo_missing() or "ok")
        return 0
    return run_peer(options) if options.mode == "peer" else run_bench(options)


if __name__ == "__main__":
    raise SystemExit(main())
