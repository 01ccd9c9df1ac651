"""Phyllo devices that are each wrong in one way, for the device kit's tests: the driver contract
of docs/conformance.md written by hand (as firmware is, byte by byte, like docs/phyllo.md's
Arduino sketch) on a tty, with one fault chosen by `--fault`::

    python tests/conformance/broken_devices.py DEVICE --stack reduced --fault no-crc-check

Faults (FAULTS): `none` (a correct device), `wrong-crc` (every CRC it writes is off by one
bit), `no-crc-check` (takes any CRC), `no-length-check` (takes any datagram length),
`no-resync` (stops reading after the first chunk it cannot read), `crash-on-garbage` (exits on
it), `no-leading-delimiter` (writes `chunk 00`), `wrong-delimiter` (ends chunks with 0x0a),
`topic-nibble` (writes the topic length with its upper nibble set), `layer-types` (hands
messages of a type below 0x10 to the application), `long-chunks` (reads chunks of any length),
`ping-stuck` (answers every ping with 0), `debug-prints` (writes a line of text to the same
line before each answer, as a sketch's `Serial.println` does), `boots-slowly` (a correct
device that reads nothing for its first 2 s, as a board that resets when its port opens),
`flood` (writes without end, as
fast as the line takes them, 64 KiB without a 0x00 then 30000 one-byte chunks, and answers
nothing). It prints ``ready`` once the tty is open (on stderr when DEVICE is ``-``, its
stdout).
"""

from __future__ import annotations

import argparse
import os
import sys
import termios
import time
import tty
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from wireproto.codecs.phyllo import decode_frame, encode_frame, ray32sub8  # noqa: E402

FAULTS = ("none", "wrong-crc", "no-crc-check", "no-length-check", "no-resync",
          "crash-on-garbage", "no-leading-delimiter", "wrong-delimiter", "topic-nibble",
          "layer-types", "long-chunks", "ping-stuck", "debug-prints", "boots-slowly", "flood")
MAX_CHUNK = 255
PUBSUB, VALIDATED, DOCUMENT = 0x60, 0x22, 0x40


class Unreadable(Exception):
    pass


class Device:
    def __init__(self, fd: int, stack: str, fault: str) -> None:
        self.fd, self.stack, self.fault = fd, stack, fault
        self.pings = 0
        self.stuck = False

    # --- sending --------------------------------------------------------------------------

    def send(self, payload_type: int, topic: bytes, payload: bytes) -> None:
        nibble = 0x50 if self.fault == "topic-nibble" else 0x00
        message = bytes([payload_type, nibble | len(topic)]) + topic + payload
        if self.stack == "reduced":
            body = bytes([PUBSUB]) + message
            crc = ray32sub8(body) ^ (1 if self.fault == "wrong-crc" else 0)
            datagram = bytes([len(body) + 4, VALIDATED]) + crc.to_bytes(4, "big") + body
        else:
            datagram = bytes([len(message), PUBSUB]) + message
        chunk = encode_frame(datagram, len(datagram))
        if self.fault == "debug-prints":
            os.write(self.fd, b"debug: answering\r\n")
        if self.fault == "wrong-delimiter":
            wire = b"\n" + chunk + b"\n"
        elif self.fault == "no-leading-delimiter":
            wire = chunk + b"\x00"
        else:
            wire = b"\x00" + chunk + b"\x00"
        os.write(self.fd, wire)

    # --- receiving ------------------------------------------------------------------------

    def read_chunk(self, chunk: bytes) -> None:
        try:
            self.read_frame(decode_frame(chunk, len(chunk)))
        except (Unreadable, ValueError) as error:  # the codec's errors are ValueErrors
            if self.fault == "crash-on-garbage":
                sys.exit(f"cannot read a chunk: {error}")
            if self.fault == "no-resync":
                self.stuck = True

    def read_frame(self, frame: bytes) -> None:
        if len(frame) < 2:
            raise Unreadable("short datagram")
        length, datagram_type, payload = frame[0], frame[1], frame[2:]
        if length != len(payload) and self.fault != "no-length-check":
            raise Unreadable("datagram length")
        if datagram_type < 0x10:
            return  # the datagram layer's own message
        if self.stack == "reduced":
            if datagram_type != VALIDATED:
                raise Unreadable("datagram type")
            crc, body = payload[:4], payload[4:]
            if int.from_bytes(crc, "big") != ray32sub8(body) and self.fault != "no-crc-check":
                raise Unreadable("CRC")
            if not body or body[0] != PUBSUB:
                raise Unreadable("validated datagram type")
            message = body[1:]
        else:
            if datagram_type != PUBSUB:
                raise Unreadable("datagram type")
            message = payload
        if len(message) < 2 or len(message) < 2 + (message[1] & 0x0F):
            raise Unreadable("message")
        payload_type, end = message[0], 2 + (message[1] & 0x0F)
        if payload_type < 0x10 and self.fault != "layer-types":
            return
        self.answer(payload_type, message[2:end], message[end:])

    def answer(self, payload_type: int, topic: bytes, payload: bytes) -> None:
        if topic.startswith(b"echo"):
            self.send(payload_type, topic, payload)
        elif topic == b"ping" and payload_type == DOCUMENT and len(payload) >= 2:
            try:
                msgpack.unpackb(payload[2:])
            except ValueError:
                return
            count = 0 if self.fault == "ping-stuck" else self.pings
            self.send(DOCUMENT, b"pong", b"\x11\x00" + msgpack.packb(count))
            self.pings += 1
        elif topic == b"reply" and payload_type == DOCUMENT:
            self.send(DOCUMENT, b"reply", b"\x11\x00" + msgpack.packb("hello!"))

    def flood(self) -> None:
        while True:
            os.write(self.fd, b"\x55" * 65536)
            os.write(self.fd, b"\x00\x01" * 30000)

    def run(self) -> None:
        if self.fault == "flood":
            self.flood()
        if self.fault == "boots-slowly":
            time.sleep(2.0)
            termios.tcflush(self.fd, termios.TCIFLUSH)  # what came while it booted is lost
        limit = 1 << 30 if self.fault == "long-chunks" else MAX_CHUNK
        partial, dropping = bytearray(), False
        while True:
            data = os.read(self.fd, 4096)
            if not data:
                return
            if self.stuck:
                continue
            for byte in data:
                if byte != 0:
                    if len(partial) < limit:
                        partial.append(byte)
                    else:
                        dropping = True
                    continue
                if partial and not dropping:
                    self.read_chunk(bytes(partial))
                partial.clear()
                dropping = False
                if self.stuck:
                    break


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device", help="a tty's path, or - for this process's stdout")
    parser.add_argument("--stack", choices=("minimal", "reduced"), default="reduced")
    parser.add_argument("--fault", choices=FAULTS, default="none")
    options = parser.parse_args()
    if options.device == "-":  # the line is this process's stdout (a pty master, say)
        fd = sys.stdout.fileno()
        print("ready", file=sys.stderr, flush=True)
    else:
        fd = os.open(options.device, os.O_RDWR | os.O_NOCTTY)
        tty.setraw(fd)
        print("ready", flush=True)
    Device(fd, options.stack, options.fault).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
