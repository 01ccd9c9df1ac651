"""A microcontroller's Phyllo firmware, simulated on a pty master, for the tests.

Written from the byte formats of specs/NOTES.md "Phyllo" alone, with `cobs`, `msgpack` and the
CRC below; it never imports wireproto. It runs in its own process:

    python tests/phyllo/firmware.py --fd FD --stack minimal|reduced [--echo] [--lifetime S]

FD is the pty master, inherited from the test. With --echo every message received is sent back
on the same topic with the same payload.

Commands, one JSON object a line on stdin:
    {"cmd": "send", "topic": "echo", "type": 16, "payload": "68656c6c6f"}   payload in hex
    {"cmd": "document", "topic": "echo", "value": "hello"}       msgpack, schemaless
    {"cmd": "publish", "topic": "temp", "count": 100, "start": 0, "seed": 1,
     "garbage": 24, "corrupt": 0.01}
        `count` documents `reading(seq)`; before each frame up to `garbage` random bytes, and each
        byte of a frame (delimiters included) replaced with probability `corrupt`.
    {"cmd": "raw"}      every byte read from the line so far
    {"cmd": "stats"}    the counters
    {"cmd": "quit"}

Reports, one JSON object a line on stdout (bytes in hex; topics are bytes too):
    {"event": "ready", "stack": ..., "wireproto_loaded": false}
    {"event": "message", "type": 16, "topic": "6563686f", "payload": "..."}
        a document (type 0x40) also has "format", "schema" and "body"
    {"event": "sent", "wire": "..."}
    {"event": "published", "sent": [{"seq": 0, "body": "...", "intact": true}, ...]}
    {"event": "raw", "wire": "..."}
    {"event": "stats", "received": 0, "crc_errors": 0, "framing_errors": 0, ...}
    {"event": "dropped", "reason": "crc" | "framing" | "type" | "decode", "detail": "..."}
    {"event": "exit", "reason": ...}

It exits when stdin closes, when the line closes (EIO or EOF on the master), on "quit", or after
--lifetime seconds.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import select
import sys
import time
from typing import Any

import msgpack
from cobs import cobs

DELIMITER = 0x00
MAX_CHUNK = 255  # phyllo-cpp's default chunk buffer
DATAGRAM = 0x22  # what the reduced stack's datagram carries
PUBSUB = 0x60
BYTES_BUFFER = 0x10
DOCUMENT = 0x40
MSGPACK = 0x11
SCHEMALESS = 0x00
LAYER_TYPES = 0x10  # types below are the layers' own messages


# --- CRC Ray32sub8: reflected poly 0xB7800000, init and xorout 0xFFFFFFFF ------------------------


def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = ((c >> 1) ^ 0xB7800000) if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32(b"123456789") == 0xB303B455


# --- encoding ---------------------------------------------------------------------------------


class Dropped(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def encode(stack: str, payload_type: int, topic: bytes, payload: bytes) -> bytes:
    """A pub-sub message on the wire: `00 COBS(datagram) 00`."""
    assert len(topic) <= 15
    message = bytes([payload_type, len(topic)]) + topic + payload
    if stack == "reduced":
        typed = bytes([PUBSUB]) + message
        validated = crc32(typed).to_bytes(4, "big") + typed  # the CRC covers type and payload
        datagram = bytes([len(validated), DATAGRAM]) + validated
    else:
        datagram = bytes([len(message), PUBSUB]) + message
    return bytes([DELIMITER]) + cobs.encode(datagram) + bytes([DELIMITER])


def document_payload(value: Any) -> bytes:
    return bytes([MSGPACK, SCHEMALESS]) + msgpack.packb(value, use_bin_type=True)


def reading(seq: int) -> dict[str, Any]:
    """The document a publish sends as number `seq`: a str, a float and bytes with a 0x00."""
    return {
        "seq": seq,
        "unit": "C",
        "temp": 20 + (seq % 100) / 8,
        "raw": bytes([seq & 0xFF, (seq >> 8) & 0xFF, 0x00, 0xFF]),
    }


# --- decoding ---------------------------------------------------------------------------------


def decode(stack: str, chunk: bytes) -> tuple[int, bytes, bytes]:
    """(payload type, topic, payload) of one chunk, or Dropped."""
    try:
        datagram = cobs.decode(chunk)
    except cobs.DecodeError as error:
        raise Dropped("framing", f"bad COBS: {error}") from None
    if len(datagram) < 2 or datagram[0] != len(datagram) - 2:
        raise Dropped("framing", f"datagram length {datagram[:1].hex()} of {len(datagram)} bytes")
    kind, body = datagram[1], datagram[2:]
    if stack == "reduced":
        if kind != DATAGRAM:
            raise Dropped("type", f"datagram type 0x{kind:02x}")
        if len(body) < 5:
            raise Dropped("framing", "validated datagram too short")
        if int.from_bytes(body[:4], "big") != crc32(body[4:]):
            raise Dropped("crc", f"CRC {body[:4].hex()} over {body[4:].hex()}")
        kind, body = body[4], body[5:]
    if kind != PUBSUB:
        raise Dropped("type", f"payload type 0x{kind:02x}")
    if len(body) < 2:
        raise Dropped("framing", "message too short")
    topic_length = body[1] & 0x0F
    if len(body) < 2 + topic_length:
        raise Dropped("framing", "topic cut short")
    return body[0], bytes(body[2 : 2 + topic_length]), bytes(body[2 + topic_length :])


class ChunkReader:
    """Cuts the byte stream at 0x00; a chunk over MAX_CHUNK is dropped up to the next 0x00."""

    def __init__(self) -> None:
        self.partial = bytearray()
        self.overlong = False

    def feed(self, data: bytes) -> tuple[list[bytes], int]:
        """(complete chunks, count of over-long chunks dropped)."""
        chunks, dropped = [], 0
        for piece_index, piece in enumerate(data.split(b"\x00")):
            if piece_index > 0:  # a delimiter ends the chunk so far
                if self.overlong:
                    dropped += 1
                elif self.partial:
                    chunks.append(bytes(self.partial))
                self.partial.clear()
                self.overlong = False
            if not self.overlong:
                self.partial += piece
                if len(self.partial) > MAX_CHUNK:
                    self.partial.clear()
                    self.overlong = True
        return chunks, dropped


# --- the firmware -----------------------------------------------------------------------------


class Firmware:
    def __init__(self, fd: int, stack: str, echo: bool, deadline: float) -> None:
        self.fd = fd
        self.stack = stack
        self.echo = echo
        self.deadline = deadline
        self.reader = ChunkReader()
        self.raw = bytearray()
        self.unread = bytearray()  # read while waiting to write, handled afterwards
        self.stats = {
            "received": 0, "sent": 0, "crc_errors": 0, "framing_errors": 0, "type_errors": 0,
            "decode_errors": 0, "layer_messages": 0,
        }
        os.set_blocking(fd, False)

    # -- the line --

    def read_line(self) -> bool:
        """Read what the line has; False once it is closed."""
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return True
        except OSError as error:
            if error.errno == errno.EIO:
                return False
            raise
        if not data:
            return False
        self.raw += data
        self.unread += data
        return True

    def write_line(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:
                if time.monotonic() > self.deadline:
                    raise TimeoutError("the line stayed full") from None
                readable, _, _ = select.select([self.fd], [self.fd], [], 0.5)
                if readable and not self.read_line():
                    raise EOFError("the line closed") from None

    def send(self, payload_type: int, topic: bytes, payload: bytes) -> bytes:
        wire = encode(self.stack, payload_type, topic, payload)
        self.write_line(wire)
        self.stats["sent"] += 1
        return wire

    # -- received bytes --

    def handle_unread(self) -> None:
        data, self.unread = bytes(self.unread), bytearray()
        chunks, overlong = self.reader.feed(data)
        for _ in range(overlong):
            self.drop(Dropped("framing", f"chunk over {MAX_CHUNK} bytes"))
        for chunk in chunks:
            try:
                self.handle_message(*decode(self.stack, chunk))
            except Dropped as dropped:
                self.drop(dropped)

    def handle_message(self, payload_type: int, topic: bytes, payload: bytes) -> None:
        if payload_type < LAYER_TYPES:
            self.stats["layer_messages"] += 1
            return
        event: dict[str, Any] = {
            "event": "message", "type": payload_type, "topic": topic.hex(),
            "payload": payload.hex(),
        }
        if payload_type == DOCUMENT:
            if len(payload) < 2:
                raise Dropped("framing", "document too short")
            event.update(format=payload[0], schema=payload[1], body=payload[2:].hex())
            if payload[0] == MSGPACK:
                try:
                    msgpack.unpackb(payload[2:], raw=False)
                except Exception as error:
                    raise Dropped("decode", f"msgpack body: {error}") from None
        self.stats["received"] += 1
        report(event)
        if self.echo:
            self.send(payload_type, topic, payload)

    def drop(self, dropped: Dropped) -> None:
        self.stats[f"{dropped.reason}_errors"] += 1
        report({"event": "dropped", "reason": dropped.reason, "detail": str(dropped)})

    # -- commands --

    def command(self, cmd: dict[str, Any]) -> bool:
        """Run one command; False to stop."""
        name = cmd.get("cmd")
        if name == "quit":
            return False
        if name == "send":
            wire = self.send(cmd.get("type", BYTES_BUFFER), cmd["topic"].encode(),
                             bytes.fromhex(cmd.get("payload", "")))
            report({"event": "sent", "wire": wire.hex()})
        elif name == "document":
            wire = self.send(DOCUMENT, cmd["topic"].encode(), document_payload(cmd["value"]))
            report({"event": "sent", "wire": wire.hex()})
        elif name == "publish":
            self.publish(cmd)
        elif name == "raw":
            report({"event": "raw", "wire": self.raw.hex()})
        elif name == "stats":
            report({"event": "stats", **self.stats})
        else:
            report({"event": "unknown command", "command": cmd})
        return True

    def publish(self, cmd: dict[str, Any]) -> None:
        rng = random.Random(cmd.get("seed", 0))
        topic = cmd.get("topic", "temp").encode()
        garbage, corrupt = cmd.get("garbage", 0), cmd.get("corrupt", 0.0)
        start = cmd.get("start", 0)
        sent = []
        for seq in range(start, start + cmd["count"]):
            payload = document_payload(reading(seq))
            wire = encode(self.stack, DOCUMENT, topic, payload)
            noisy = bytes(b ^ rng.randrange(1, 256) if rng.random() < corrupt else b for b in wire)
            self.write_line(rng.randbytes(rng.randrange(garbage + 1)) + noisy)
            self.stats["sent"] += 1
            sent.append({"seq": seq, "body": payload[2:].hex(), "intact": noisy == wire})
        report({"event": "published", "sent": sent})

    # -- main loop --

    def run(self) -> str:
        stdin = sys.stdin.fileno()
        pending = b""
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                return "lifetime over"
            readable, _, _ = select.select([self.fd, stdin], [], [], min(remaining, 1.0))
            if self.fd in readable and not self.read_line():
                return "line closed"
            if self.unread:
                self.handle_unread()
            if stdin in readable:
                data = os.read(stdin, 65536)
                if not data:
                    return "stdin closed"
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip() and not self.command(json.loads(line)):
                        return "quit"
                    if self.unread:
                        self.handle_unread()


def report(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="the pty master, inherited")
    parser.add_argument("--stack", choices=["minimal", "reduced"], required=True)
    parser.add_argument("--echo", action="store_true", help="send every message back")
    parser.add_argument("--lifetime", type=float, default=60.0, help="exit after this many s")
    args = parser.parse_args()
    firmware = Firmware(args.fd, args.stack, args.echo, time.monotonic() + args.lifetime)
    report({"event": "ready", "stack": args.stack,
            "wireproto_loaded": any(m.split(".")[0] == "wireproto" for m in sys.modules)})
    try:
        reason = firmware.run()
    except EOFError:
        reason = "line closed"
    except TimeoutError as error:
        reason = str(error)
    report({"event": "exit", "reason": reason, **firmware.stats})
    return 0


if __name__ == "__main__":
    sys.exit(main())
