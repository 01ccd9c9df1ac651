"""wireproto's Phyllo stacks against a simulated firmware peer (tests/phyllo/firmware.py).

The firmware runs in a subprocess on the pty master and is written from the NOTES.md byte formats,
not with wireproto's codec; the host stack opens the pty slave through the real `serial:` endpoint.
Both directions, both preset stacks, documents and byte buffers, and line noise.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
import pytest_twisted
from twisted.internet import error, protocol, reactor
from twisted.logger import LogLevel, globalLogPublisher

from tests.phyllo.conftest import (
    DOCUMENT_MINIMAL_WIRE,
    DOCUMENT_REDUCED_WIRE,
    MESSAGE_MINIMAL_WIRE,
    MESSAGE_REDUCED_WIRE,
    received,
)
from tests.phyllo.firmware import crc32
from tests.support import eventually
from wireproto.peerlog import PER_KEY
from wireproto.phyllo import (
    DocumentLink,
    Endpoint,
    PubSubDocument,
    PubSubMessage,
    Router,
    SingleEndpointHandler,
    build_stack,
)

FIRMWARE = Path(__file__).with_name("firmware.py")
STACKS = ["minimal", "reduced"]
ECHO = PubSubMessage(0x10, b"echo", b"hello")
HELLO = PubSubDocument.of("echo", "hello")
NOISE_SEED = 2024


class Firmware(protocol.ProcessProtocol):
    """The firmware process: commands go to its stdin, its reports come back as events."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.stderr = bytearray()
        self.exit: BaseException | None = None
        self._partial = b""

    def outReceived(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        self.events += [json.loads(line) for line in lines if line.strip()]

    def errReceived(self, data: bytes) -> None:
        self.stderr += data

    def processEnded(self, reason: Any) -> None:
        self.exit = reason.value

    def command(self, cmd: str, **fields: Any) -> None:
        self.transport.write(json.dumps({"cmd": cmd, **fields}).encode() + b"\n")

    def _take(self, kind: str) -> dict[str, Any] | None:
        for index, event in enumerate(self.events):
            if event["event"] == kind:
                return self.events.pop(index)
        return None

    async def next(self, kind: str, timeout: float = 10.0) -> dict[str, Any]:
        """The oldest report of `kind` not taken yet."""
        try:
            return await eventually(lambda: self._take(kind), timeout)
        except TimeoutError:
            raise AssertionError(
                f"no {kind!r} from the firmware; stderr: {self.stderr.decode(errors='replace')}"
            ) from None

    async def messages(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return [await self.next("message", timeout) for _ in range(count)]

    async def stop(self) -> None:
        """Close its stdin, which ends it; it must have exited cleanly."""
        if self.exit is None:
            self.transport.closeStdin()
            try:
                await eventually(lambda: self.exit is not None, timeout=10)
            except TimeoutError:
                self.transport.signalProcess("KILL")
                raise
        assert isinstance(self.exit, error.ProcessDone), (self.exit, self.stderr.decode())


async def spawn(master: int, stack: str, *, echo: bool = False) -> Firmware:
    """The firmware on the pty `master` (its fd 3), once it says it is ready."""
    peer = Firmware()
    args = [sys.executable, str(FIRMWARE), "--fd", "3", "--stack", stack, "--lifetime", "90"]
    reactor.spawnProcess(
        peer, sys.executable, args + (["--echo"] if echo else []), env=dict(os.environ),
        childFDs={0: "w", 1: "r", 2: "r", 3: master},
    )
    try:
        ready = await peer.next("ready")
    except AssertionError:
        peer.transport.signalProcess("KILL")
        raise
    assert ready == {"event": "ready", "stack": stack, "wireproto_loaded": False}
    return peer


@pytest_twisted.async_yield_fixture
async def firmware(line):
    """Starts the firmware on the line's pty master: `await firmware(stack, echo=False)`."""
    started: list[Firmware] = []

    async def start(stack: str, *, echo: bool = False) -> Firmware:
        started.append(await spawn(line.master, stack, echo=echo))
        return started[-1]

    yield start
    for peer in started:
        await peer.stop()


def as_message(event: dict[str, Any]) -> PubSubMessage:
    return PubSubMessage(event["type"], bytes.fromhex(event["topic"]),
                         bytes.fromhex(event["payload"]))


def as_value(event: dict[str, Any]) -> Any:
    assert (event["type"], event["format"], event["schema"]) == (0x40, 0x11, 0x00)
    return msgpack.unpackb(bytes.fromhex(event["body"]), raw=False)


def test_the_firmware_crc_is_ray32sub8():
    assert crc32(b"123456789") == 0xB303B455
    # The CRC bytes of the NOTES reduced examples, over type 0x60 and the message.
    for wire in (MESSAGE_REDUCED_WIRE, DOCUMENT_REDUCED_WIRE):
        start = wire.index(b"\x60")
        covered = wire[start:-1].replace(b"\x07\xa5", b"\x00\xa5")  # undo COBS in the document
        assert crc32(covered).to_bytes(4, "big") == wire[4:8]


@pytest_twisted.ensureDeferred
async def test_the_firmware_exits_when_the_line_closes():
    master, slave = os.openpty()
    try:
        peer = await spawn(master, "minimal")
        os.close(slave)
        slave = -1
        assert (await peer.next("exit"))["reason"] == "line closed"
        await peer.stop()
    finally:
        for fd in (master, slave):
            if fd >= 0:
                os.close(fd)


# --- the NOTES.md wire examples, byte for byte ------------------------------------------------

EXAMPLES = [
    pytest.param("minimal", False, MESSAGE_MINIMAL_WIRE, id="message-minimal"),
    pytest.param("reduced", False, MESSAGE_REDUCED_WIRE, id="message-reduced"),
    pytest.param("minimal", True, DOCUMENT_MINIMAL_WIRE, id="document-minimal"),
    pytest.param("reduced", True, DOCUMENT_REDUCED_WIRE, id="document-reduced"),
]


def host_stack(stack: str, documents: bool):
    if documents:
        return lambda: DocumentLink(build_stack(stack))
    return lambda: build_stack(stack)


@pytest.mark.parametrize("stack, documents, wire", EXAMPLES)
@pytest_twisted.ensureDeferred
async def test_the_firmware_sends_the_wire_examples_and_wireproto_reads_them(
    line, firmware, stack, documents, wire
):
    top = await line.open(host_stack(stack, documents))
    peer = await firmware(stack)
    if documents:
        peer.command("document", topic="echo", value="hello")
    else:
        peer.command("send", topic="echo", type=0x10, payload=b"hello".hex())
    assert bytes.fromhex((await peer.next("sent"))["wire"]) == wire
    assert await received(top, 1) == [HELLO if documents else ECHO]
    assert [c.received for c in top.stack_counters().values()] == [1] * len(top.layers())


@pytest.mark.parametrize("stack, documents, wire", EXAMPLES)
@pytest_twisted.ensureDeferred
async def test_wireproto_sends_the_wire_examples_and_the_firmware_reads_them(
    line, firmware, stack, documents, wire
):
    top = await line.open(host_stack(stack, documents))
    peer = await firmware(stack)
    top.send(HELLO if documents else ECHO)
    [event] = await peer.messages(1)
    if documents:
        assert bytes.fromhex(event["topic"]) == b"echo" and as_value(event) == "hello"
    else:
        assert as_message(event) == ECHO
    peer.command("raw")
    assert bytes.fromhex((await peer.next("raw"))["wire"]) == wire


# --- documents and byte buffers, both ways ----------------------------------------------------

VALUES = [
    "hello",
    -1.25,
    2**40,
    None,
    [],
    b"\x00bytes\xff",
    {"seq": 1, "name": "sensor", "raw": b"\x00\x01\x00", "list": [1, -2, 3.5, None, True]},
    {"nested": {"deeper": {"empty": {}, "text": "é, ü"}}},
]


@pytest.mark.parametrize("stack", STACKS)
@pytest_twisted.ensureDeferred
async def test_documents_both_ways_through_a_document_link(line, firmware, stack):
    top = await line.open(lambda: DocumentLink(build_stack(stack)))
    peer = await firmware(stack, echo=True)
    sent = [PubSubDocument.of("doc", value) for value in VALUES]
    for document in sent:
        top.send(document)
    # The firmware read each one as msgpack, str and bytes apart, and echoed it back.
    events = await peer.messages(len(VALUES))
    assert [as_value(event) for event in events] == VALUES
    assert {bytes.fromhex(event["topic"]) for event in events} == {b"doc"}
    assert await received(top, len(VALUES)) == sent
    peer.command("stats")
    stats = await peer.next("stats")
    assert (stats["received"], stats["sent"]) == (len(VALUES), len(VALUES))
    assert stats["crc_errors"] == stats["framing_errors"] == stats["decode_errors"] == 0


@pytest.mark.parametrize("stack", STACKS)
@pytest_twisted.ensureDeferred
async def test_documents_both_ways_through_a_router_and_endpoints(line, firmware, stack):
    parts: dict[str, Any] = {}
    led_documents: list[PubSubDocument] = []

    def build() -> Endpoint:
        router = parts["router"] = Router(DocumentLink(build_stack(stack)))
        parts["led"] = router.subscribe(
            SingleEndpointHandler("led", on_receive=led_documents.append)
        )
        return Endpoint(router, "temp")

    temp = await line.open(build)
    peer = await firmware(stack)
    for topic, value in [("temp", 21.5), ("led", True), ("other", 1), ("temp", 22.0)]:
        peer.command("document", topic=topic, value=value)
    assert await received(temp, 2) == [PubSubDocument.of("temp", 21.5),
                                       PubSubDocument.of("temp", 22.0)]
    await eventually(lambda: parts["router"].counters.received == 4)
    assert led_documents == [PubSubDocument.of("led", True)]
    assert parts["router"].counters.filtered == 1  # "other" has no handler
    # And back: each sends on its own topic.
    temp.send_value({"set": 19.0})
    parts["led"].send_value("off")
    events = await peer.messages(2)
    assert [(bytes.fromhex(e["topic"]), as_value(e)) for e in events] == [
        (b"temp", {"set": 19.0}), (b"led", "off"),
    ]


def largest_payload(stack: str) -> bytes:
    """The payload that fills a 253-byte frame on a 15-byte topic, 0x00 bytes included."""
    room = 253 - 2 - 2 - 15 - (5 if stack == "reduced" else 0)
    return bytes(n % 256 for n in range(room))


@pytest.mark.parametrize("stack", STACKS)
@pytest_twisted.ensureDeferred
async def test_byte_buffers_both_ways(line, firmware, stack):
    top = await line.open(lambda: build_stack(stack))
    peer = await firmware(stack, echo=True)
    sent = [
        PubSubMessage(0x10, b"echo", b"hello"),
        PubSubMessage(0x10, b"z", b""),
        PubSubMessage(0x10, b"\x00\x01", b"\x00" * 10),
        PubSubMessage(0x10, b"fifteen-bytes-t", largest_payload(stack)),
    ]
    for message in sent:
        top.send(message)
    assert [as_message(event) for event in await peer.messages(len(sent))] == sent
    assert await received(top, len(sent)) == sent


# --- noise ------------------------------------------------------------------------------------


def delivered_bodies(documents: list[PubSubDocument]) -> list[tuple[int, bytes]]:
    return [(document.value["seq"], document.document.body) for document in documents]


async def publish(peer: Firmware, timeout: float = 60.0, **fields: Any) -> list[dict[str, Any]]:
    peer.command("publish", topic="temp", **fields)
    return (await peer.next("published", timeout))["sent"]


@pytest.mark.parametrize("stack", STACKS)
@pytest_twisted.ensureDeferred
async def test_garbage_between_frames_costs_no_message(line, firmware, stack, record_property):
    got: list[PubSubDocument] = []
    top = await line.open(lambda: DocumentLink(build_stack(stack)))
    top.on_receive = got.append
    peer = await firmware(stack)
    sent = await publish(peer, count=500, seed=NOISE_SEED, garbage=40)
    await eventually(lambda: len(got) >= len(sent), timeout=30)
    assert delivered_bodies(got) == [(s["seq"], bytes.fromhex(s["body"])) for s in sent]
    assert {document.topic for document in got} == {b"temp"}
    counters = top.stack_counters()
    record_property("counters", {name: c.as_dict() for name, c in counters.items()})
    # The garbage was seen and dropped, below the document link.
    assert sum(c.framing_errors + c.crc_errors + c.type_errors for c in counters.values()) > 0
    assert counters["document link"].received == len(sent)


@pytest_twisted.ensureDeferred
async def test_one_percent_corruption_on_the_reduced_stack(line, firmware, record_property):
    got: list[PubSubDocument] = []
    top = await line.open(lambda: DocumentLink(build_stack("reduced")))
    top.on_receive = got.append
    peer = await firmware("reduced")
    warnings: list[dict] = []

    def keep_warning(event: dict) -> None:
        if event.get("log_level") is LogLevel.warn:
            warnings.append(event)

    globalLogPublisher.addObserver(keep_warning)
    try:
        noisy = await publish(peer, count=2000, seed=NOISE_SEED, garbage=24, corrupt=0.01)
        clean = await publish(peer, count=100, start=len(noisy))
        sent = noisy + clean
        await eventually(lambda: got and got[-1].value["seq"] == sent[-1]["seq"], timeout=60)
    finally:
        globalLogPublisher.removeObserver(keep_warning)

    bodies = {s["seq"]: bytes.fromhex(s["body"]) for s in sent}
    delivered = delivered_bodies(got)
    # No corrupted message is delivered: each one is a document the firmware sent, exactly,
    # once and in order.
    for seq, body in delivered:
        assert body == bodies[seq]
    assert all(d.value == msgpack.unpackb(d.document.body, raw=False) for d in got)
    seqs = [seq for seq, _ in delivered]
    assert seqs == sorted(set(seqs))
    # Every frame that crossed the line intact arrived; so did the clean burst after the noise.
    intact = [s["seq"] for s in sent if s["intact"]]
    assert set(intact) <= set(seqs)
    assert seqs[-len(clean):] == [s["seq"] for s in clean]
    lost = len(sent) - len(delivered)
    assert 0 < lost <= len(sent) - len(intact)

    counters = top.stack_counters()
    record_property("counters", {name: c.as_dict() for name, c in counters.items()})
    record_property("lost", lost)
    record_property("corrupted", len(sent) - len(intact))
    assert counters["validated datagram"].crc_errors > 0
    assert counters["frame"].framing_errors + counters["datagram"].framing_errors > 0
    # Each lost frame was counted as an error somewhere below the document link.
    errors = sum(c.framing_errors + c.crc_errors + c.type_errors for c in counters.values())
    assert errors >= lost
    assert counters["document link"].received == len(delivered)
    assert all(c.dropped == c.decode_errors == 0 for c in counters.values())
    # Every drop is counted, but the log holds a few lines per layer, not one per drop.
    dropped_lines = [w for w in warnings if "dropped a unit" in w.get("log_format", "")]
    layers = {w["layer"] for w in dropped_lines}
    assert 0 < len(dropped_lines) <= PER_KEY * len(layers) < errors
