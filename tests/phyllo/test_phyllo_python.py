"""wireproto's Phyllo stacks against phyllo-python 0.2.0, the reference, as a real peer.

phyllo-python runs in a subprocess (tests/phyllo/phyllo_python.py), polling its end of a serial
line through pyserial and its own `PollingSerialAdapter`; wireproto's stack opens the other end
through the real `serial:` endpoint. The two ends are pty slaves joined by a null modem. For both
stacks the reference offers (minimal, reduced), with byte-buffer messages and msgpack documents:
phyllo-python publishes units of its own, which wireproto must read exactly; then wireproto sends
units, which phyllo-python must read exactly (it reports each one) and echo back.
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
from twisted.internet import defer, error, protocol, reactor

from tests.phyllo.conftest import (
    DOCUMENT_REDUCED_WIRE,
    MESSAGE_MINIMAL_WIRE,
    MESSAGE_REDUCED_WIRE,
    received,
)
from tests.phyllo.phyllo_python import (
    DOCUMENTS,
    MESSAGES,
    compute_reflected_crc,
    max_payload,
    peer_units,
    phyllo_missing,
)
from tests.support import need_peer, wait_for
from wireproto.phyllo import (
    DocumentLink,
    LayerBase,
    PubSubDocument,
    PubSubMessage,
    build_stack,
    connect_stack,
)
from wireproto.transports import SerialEndpoint

PEER = Path(__file__).with_name("phyllo_python.py")
STACKS = ["minimal", "reduced"]
ERROR_COUNTERS = ("crc_errors", "framing_errors", "type_errors", "decode_errors", "dropped")


@pytest.fixture
def need_phyllo_python() -> None:
    """Skip locally, fail under CI, when phyllo-python cannot be imported. A plain fixture: a
    skip raised in an async fixture's setup leaves pytest-twisted's fixture state broken."""
    missing = phyllo_missing()
    need_peer(
        None if missing is None else f"{missing}; `make test` installs it",
        "the phyllo-python interop tests",
    )


def host_units(kind: str, stack: str) -> list[PubSubMessage] | list[PubSubDocument]:
    """What wireproto sends: other topics and values than the peer's own."""
    if kind == MESSAGES:
        topic = "t\u00f3pico-m\u00e1ximo"  # a str topic, 15 bytes of UTF-8
        longest = bytes(range(255, 0, -1))[: max_payload(stack, topic.encode())]
        return [
            PubSubMessage(0x10, b"host", b"\x00\x01\x02 from wireproto \x00"),
            PubSubMessage(0x10, b"", b""),
            PubSubMessage(0x7F, b"x", b"\xff" * 40),
            PubSubMessage(0x10, topic, longest),
        ]
    longest = "z" * (max_payload(stack, b"max") - 2 - 2)  # str8 header, document header
    return [
        PubSubDocument.of("host", {"list": [1, [2, 3]], "bin": b"\x00", "f": -0.5,
                                   "big": 2**40, "neg": -(2**33), "map": {}}),
        PubSubDocument.of("string8", "abcd", schema=0x11),
        PubSubDocument.of("", [None, True, "\u2603"], schema=0x60),
        PubSubDocument.of("max", longest),
    ]


def as_tuples(value: Any) -> Any:
    """`value` with its lists as tuples, as phyllo-python reads msgpack arrays."""
    if isinstance(value, (list, tuple)):
        return tuple(as_tuples(item) for item in value)
    if isinstance(value, dict):
        return {key: as_tuples(item) for key, item in value.items()}
    return value


def as_lists(value: Any) -> Any:
    """`value` with its tuples as lists, as wireproto reads msgpack arrays."""
    if isinstance(value, (list, tuple)):
        return [as_lists(item) for item in value]
    if isinstance(value, dict):
        return {key: as_lists(item) for key, item in value.items()}
    return value


def report_of(unit: PubSubMessage | PubSubDocument) -> dict[str, Any]:
    """What the peer prints for `unit` once it has read it (phyllo_python.describe)."""
    if isinstance(unit, PubSubMessage):
        return {"topic": unit.topic.hex(), "type": unit.payload_type, "payload": unit.payload.hex()}
    document = unit.document
    return {"topic": unit.topic.hex(), "type": 0x40, "format": document.format,
            "schema": document.schema, "value": repr(as_tuples(unit.value))}


class Peer(protocol.ProcessProtocol):
    """phyllo-python in its process: `ready` once its port is open, then one JSON line a unit."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.stderr = bytearray()
        self.ready: defer.Deferred[None] = defer.Deferred()
        self.ended: defer.Deferred[None] = defer.Deferred()
        self.exit: BaseException | None = None
        self._partial = b""

    def outReceived(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            if line == b"ready":
                self.ready.callback(None)
            elif line.strip():
                self.reports.append(json.loads(line))

    def errReceived(self, data: bytes) -> None:
        self.stderr += data

    def processEnded(self, reason: Any) -> None:
        self.exit = reason.value
        self.ended.callback(None)

    def explain(self) -> str:
        return f"peer reports {self.reports}; stderr: {self.stderr.decode(errors='replace')}"

    async def stop(self) -> None:
        if not self.ended.called:
            try:
                self.transport.signalProcess("KILL")
            except error.ProcessExitedAlready:
                pass
            await wait_for(self.ended)


@pytest_twisted.async_yield_fixture
async def phyllo_python(need_phyllo_python, null_modem):
    """`await phyllo_python(kind, stack, expect)`: wireproto's `kind` stack on one end of the
    null modem and phyllo-python's on the other; returns (top layer, peer)."""
    host_device, peer_device = null_modem
    opened: list[tuple[LayerBase, Peer]] = []

    async def start(kind: str, stack: str, expect: int) -> tuple[Any, Peer]:
        def build() -> LayerBase:
            link = build_stack(stack)
            return DocumentLink(link) if kind == DOCUMENTS else link

        top = await wait_for(connect_stack(SerialEndpoint(reactor, host_device), build))
        peer = Peer()
        args = [sys.executable, str(PEER), "peer", peer_device, "--stack", stack,
                "--units", kind, "--expect", str(expect), "--timeout", "60"]
        reactor.spawnProcess(peer, sys.executable, args, env=dict(os.environ))
        opened.append((top, peer))
        try:
            await wait_for(peer.ready, 30)
        except TimeoutError:
            raise AssertionError(f"phyllo-python did not open its port: {peer.explain()}") from None
        return top, peer

    yield start
    for top, peer in opened:
        await peer.stop()
        if top.lost_reason is None:
            lost = top.when_lost()
            top.lose_connection()
            await wait_for(lost)


async def units_from(top: Any, count: int, peer: Peer) -> list[Any]:
    """The next `count` units wireproto reads; on a timeout, says what each side saw."""
    try:
        return await received(top, count, timeout=15)
    except TimeoutError:
        raise AssertionError(
            f"wireproto read fewer than {count} units; its errors {errors_of(top)}; "
            f"{peer.explain()}"
        ) from None


def errors_of(top: LayerBase) -> dict[str, int]:
    """Every non-zero error counter of the stack, by layer."""
    return {
        f"{name}.{counter}": getattr(counters, counter)
        for name, counters in top.stack_counters().items()
        for counter in ERROR_COUNTERS
        if getattr(counters, counter)
    }


def test_the_crc_stand_in_is_ray32sub8():
    assert compute_reflected_crc(b"123456789") == 0xB303B455
    # The reduced examples' CRC covers the validated datagram's type (0x60) and its payload.
    assert compute_reflected_crc(bytes.fromhex("60 10 04 65 63 68 6f 68 65 6c 6c 6f")) == 0x3DBC872B
    covered = DOCUMENT_REDUCED_WIRE[8:-1].replace(b"\x07\xa5", b"\x00\xa5")  # undo COBS
    assert compute_reflected_crc(covered).to_bytes(4, "big") == DOCUMENT_REDUCED_WIRE[4:8]


@pytest.mark.parametrize("stack, wire", [("minimal", MESSAGE_MINIMAL_WIRE),
                                         ("reduced", MESSAGE_REDUCED_WIRE)])
def test_the_peer_units_fill_a_frame_to_the_interop_limit(stack, wire):
    # NOTES.md: 253 bytes of frame payload; the NOTES example, 5 bytes of payload, sets the base.
    overhead = len(wire) - 3 - len(b"echo") - len(b"hello")  # delimiters and the COBS byte
    for kind in (MESSAGES, DOCUMENTS):
        topic, _code, payload = peer_units(kind, stack)[-1]
        if kind == DOCUMENTS:
            payload = b"\x11\x00" + msgpack.packb(payload, use_bin_type=True)
        assert overhead + len(topic) + len(payload) == 253, kind


@pytest.mark.parametrize("kind", [MESSAGES, DOCUMENTS])
@pytest.mark.parametrize("stack", STACKS)
@pytest_twisted.ensureDeferred
async def test_wireproto_and_phyllo_python_read_each_other(phyllo_python, kind, stack):
    ours = host_units(kind, stack)
    theirs = peer_units(kind, stack)
    top, peer = await phyllo_python(kind, stack, expect=len(ours))

    # phyllo-python publishes first: wireproto must read each unit exactly.
    published = await units_from(top, len(theirs), peer)
    if kind == MESSAGES:
        assert published == [PubSubMessage(code, topic, payload)
                             for topic, code, payload in theirs], peer.explain()
    else:
        assert [(d.topic, d.document.schema, d.value) for d in published] == [
            (topic, schema, as_lists(value)) for topic, schema, value in theirs
        ], peer.explain()
        assert [d.document.body for d in published] == [
            msgpack.packb(value, use_bin_type=True) for _topic, _schema, value in theirs
        ]

    # Then wireproto sends; phyllo-python reports what it read and echoes it.
    for unit in ours:
        top.send(unit)
    echoed = await units_from(top, len(ours), peer)
    await wait_for(peer.ended, 30)
    assert isinstance(peer.exit, error.ProcessDone), peer.explain()
    assert peer.reports == [report_of(unit) for unit in ours] + [{"done": len(ours)}]
    if kind == MESSAGES:
        assert echoed == ours
    else:
        assert [(d.topic, d.document, d.value) for d in echoed] == [
            (d.topic, d.document, d.value) for d in ours
        ]
    assert errors_of(top) == {}
