"""Each device's health, counted where the bytes arrive and summed over every time the board
was opened: a real broker with a Phyllo link on a stand-in board (a pty with a USB identity),
scraped over HTTP at /metrics and asked at /api/status."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory, Protocol

from tests.admin.http import http
from tests.support import eventually, sleep, wait_for
from tests.test_metrics import http_base, scrape
from wireproto.codecs.phyllo.document import Format, Schema, message_from_document, serialize
from wireproto.codecs.phyllo.stack import REDUCED
from wireproto.config import Config, parse_listen, parse_phyllo
from wireproto.devices import PollingWatcher
from wireproto.devices.standin import COMMON_BOARDS, StandInPorts
from wireproto.hub import HubMessage
from wireproto.metrics import MergedFamilies
from wireproto.phyllo.bridge import HubBridge
from wireproto.service import make_service

LOCAL = "interface=127.0.0.1"


def reading(value: Any) -> bytes:
    """What the board sends: a msgpack document on topic ``temp``, on the reduced stack."""
    return REDUCED.encode(
        message_from_document("temp", serialize(value, Format.MSGPACK, Schema.SCHEMALESS)))


def bad_crc(wire: bytes) -> bytes:
    corrupt = bytearray(wire)
    corrupt[8] ^= 0x40  # inside the CRC-covered part
    return bytes(corrupt)


OVER_LONG = b"\x00" + b"\x7f" * 300 + b"\x00"  # over the 255-byte chunk limit: a resync


@pytest.fixture
def boards():
    standins = StandInPorts()
    yield standins
    standins.close()


@pytest_twisted.async_yield_fixture
async def broker_with_board(boards):
    """A broker with an HTTP port and the link ``uno`` to the Uno plugged in: (service, base
    URL, board)."""
    board = boards.plug(**COMMON_BOARDS["uno"], serial_number="85735313")
    watcher = PollingWatcher(reactor, boards.ports, interval=0.05)
    config = Config(listeners=(parse_listen(f"websmq+ws@tcp:0:{LOCAL}"),),
                    phyllo=(parse_phyllo("uno@serial:vid=2341:pid=0043"),))
    service = make_service(config, reactor, ports=watcher, retry_policy=lambda attempt: 0.05)
    service.startService()
    try:
        bound = await wait_for(service.when_listening())
        await eventually(lambda: service.phyllo["uno"].connected)
        yield service, http_base(bound[0].address), board
    finally:
        await wait_for(service.stopService(), timeout=10)


async def pour(board: Any, data: bytes, within: float = 20.0) -> None:
    """Write `data` as the board, as fast as the line takes it, letting the broker read."""
    view, deadline = memoryview(data), time.monotonic() + within
    while view:
        assert time.monotonic() < deadline, f"{len(view)} bytes still unwritten"
        try:
            view = view[os.write(board.master, view[:65536]):]
        except BlockingIOError:
            await sleep(0.005)


def link_entry(status: dict, name: str) -> dict:
    (entry,) = [link for link in status["links"] if link["name"] == name]
    return entry


@pytest_twisted.ensureDeferred
async def test_frames_bytes_crc_errors_resyncs_and_reopens_on_metrics_and_status(
    boards, broker_with_board,
) -> None:
    service, base, board = broker_with_board
    bridge: HubBridge = service.phyllo["uno"]
    page = await scrape(base)
    assert page.value("wireproto_phyllo_frames_total", link="uno") == 0
    assert not page.families["wireproto_phyllo_last_frame_timestamp_seconds"].samples
    assert bridge.health()["last_frame"] is None

    sent = [reading(1), reading(2), bad_crc(reading(3)), OVER_LONG, reading(4)]
    before = time.time()
    for wire in sent:
        board.write(wire)
    await eventually(lambda: bridge.counters()["to_hub"] == 3)
    after = time.time()
    service.hub.publish(HubMessage("phyllo/uno/led", json.dumps(True).encode()))
    to_board = await eventually(lambda: board.read(0.05))

    page = await scrape(base)
    assert page.value("wireproto_phyllo_frames_total", link="uno") == 4  # the bad CRC's too
    assert page.value("wireproto_phyllo_bytes_received_total", link="uno") == sum(map(len, sent))
    assert page.value("wireproto_phyllo_bytes_sent_total", link="uno") == len(to_board)
    assert page.value("wireproto_phyllo_crc_errors_total", link="uno") == 1
    assert page.value("wireproto_phyllo_resyncs_total", link="uno") == 1
    assert page.value("wireproto_phyllo_reopens_total", link="uno") == 0
    last = page.value("wireproto_phyllo_last_frame_timestamp_seconds", link="uno")
    assert before <= last <= after

    # Pulled mid-frame and plugged back: another device name, the counts carried over, and the
    # half frame neither a frame nor an error.
    half = reading(9)[:10]
    sent.append(half)
    board.write(half)
    await eventually(lambda: bridge.health()["bytes_received"] == sum(map(len, sent)))
    again = boards.replug(board)
    await eventually(lambda: bridge.connected and bridge.port == again.device)
    again.write(reading(5))
    await eventually(lambda: bridge.counters()["to_hub"] == 4)
    page = await scrape(base)
    assert page.value("wireproto_phyllo_reopens_total", link="uno") == 1
    assert page.value("wireproto_phyllo_connections_total", link="uno") == 2
    assert page.value("wireproto_phyllo_frames_total", link="uno") == 5
    assert page.value("wireproto_phyllo_bytes_received_total", link="uno") == (
        sum(map(len, sent)) + len(reading(5)))
    assert page.value("wireproto_phyllo_crc_errors_total", link="uno") == 1
    assert page.value("wireproto_phyllo_resyncs_total", link="uno") == 1
    assert page.value("wireproto_phyllo_last_frame_timestamp_seconds", link="uno") > last

    status = (await http(base, "/api/status")).json
    entry = link_entry(status, "uno")
    assert entry["endpoint"] == "serial:vid=2341:pid=0043"
    assert entry["port"] == again.device
    assert entry["connected"] is True
    assert (entry["frames"], entry["crc_errors"], entry["resyncs"], entry["reopens"]) == (
        5, 1, 1, 1)
    assert entry["bytes_received"] == sum(map(len, sent)) + len(reading(5))
    assert entry["bytes_sent"] == len(to_board)
    assert 0 <= entry["last_frame_age"] < 5
    assert entry == {**entry, **link_entry((await http(base, "/api/listeners")).json, "uno"),
                     "last_frame_age": entry["last_frame_age"]}

    # Away: no port, the counts and the last frame kept.
    boards.unplug(again)
    await eventually(lambda: not bridge.connected)
    health = bridge.health()
    assert health["port"] is None and health["frames"] == 5
    assert health["last_frame"] == page.value(
        "wireproto_phyllo_last_frame_timestamp_seconds", link="uno")
    entry = link_entry((await http(base, "/api/status")).json, "uno")
    assert entry["port"] is None and entry["connected"] is False and entry["frames"] == 5


@pytest_twisted.ensureDeferred
async def test_the_api_counts_the_errors_of_the_connection_open_now(broker_with_board) -> None:
    # /api/listeners gave the counts of closed connections only: a CRC error on the open one
    # showed as 0 until the board was pulled.
    service, base, board = broker_with_board
    board.write(bad_crc(reading(1)) + reading(2))
    await eventually(lambda: service.phyllo["uno"].counters()["to_hub"] == 1)
    entry = link_entry((await http(base, "/api/listeners")).json, "uno")
    assert entry["crc_errors"] == 1 and entry["to_hub"] == 1


@pytest_twisted.ensureDeferred
async def test_links_added_while_running_are_scraped_and_listed(broker_with_board) -> None:
    # A fleet adds a link for each board it finds: the scrape and the API read them as they are.
    service, base, _ = broker_with_board
    service.phyllo["uno.spare"] = HubBridge(service.hub, "uno.spare")
    try:
        page = await scrape(base)
        assert page.value("wireproto_phyllo_connected", link="uno.spare") == 0
        assert page.value("wireproto_phyllo_frames_total", link="uno.spare") == 0
        entry = link_entry((await http(base, "/api/status")).json, "uno.spare")
        assert entry["endpoint"] == "serial:vid=2341:pid=0043"  # its table's
        assert entry["last_frame"] is None and entry["last_frame_age"] is None
    finally:
        service.phyllo.pop("uno.spare").close()
    page = await scrape(base)
    assert {"link": "uno"} in page.labels("wireproto_phyllo_connected")
    assert {"link": "uno.spare"} not in page.labels("wireproto_phyllo_connected")


@pytest_twisted.ensureDeferred
async def test_a_board_flooding_garbage_grows_counters_not_memory(broker_with_board) -> None:
    service, base, board = broker_with_board
    bridge: HubBridge = service.phyllo["uno"]
    top = bridge.top
    assert top is not None
    bottom: Any = top.bottom
    noise = bytes(range(1, 256)) * 16  # 4080 bytes with no delimiter: one over-long chunk
    chunks = (b"\x55" * 40 + b"\x00") * 100  # short chunks that are no frame
    flood = (noise + b"\x00" + chunks) * 50
    await pour(board, flood + reading(7))
    await eventually(lambda: bridge.counters()["to_hub"] == 1, timeout=10)
    health = bridge.health()
    assert health["bytes_received"] == len(flood) + len(reading(7))
    assert health["resyncs"] == 50
    assert health["frames"] == 50 * 100 + 1
    assert all(type(health[key]) is int for key in (
        "frames", "bytes_received", "bytes_sent", "crc_errors", "resyncs", "reopens"))
    assert len(bottom._splitter._partial) <= bottom.max_length  # nothing of the noise kept
    assert not bottom.has_receive()
    page = await scrape(base)
    assert page.value("wireproto_phyllo_resyncs_total", link="uno") == 50
    assert page.value("wireproto_phyllo_framing_errors_total", link="uno") >= 50 * 100


def test_in_a_cluster_the_last_frame_total_is_the_latest() -> None:
    # Summed, two processes' timestamps would be a time far in the future.
    def rows(link: str, when: float) -> list:
        return [["wireproto_phyllo_last_frame_timestamp_seconds", "", "gauge", "",
                 [["wireproto_phyllo_last_frame_timestamp_seconds", {"link": link}, when]]]]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(MergedFamilies([("a", rows("uno", 100.0)), ("b", rows("uno", 250.0))]))
    assert registry.get_sample_value("wireproto_phyllo_last_frame_timestamp_seconds",
                                     {"link": "uno", "worker": "total"}) == 250.0


@pytest_twisted.ensureDeferred
async def test_over_tcp_the_port_is_the_peers_address(broker_with_board) -> None:
    service, _, _ = broker_with_board
    listening = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
    bridge = HubBridge(service.hub, "bench")
    try:
        address = listening.getHost()
        bottom = await wait_for(TCP4ClientEndpoint(reactor, "127.0.0.1", address.port).connect(
            Factory.forProtocol(bridge.build_protocol)))
        assert bridge.health()["port"] == f"127.0.0.1:{address.port}"
        bottom.lose_connection()
        await eventually(lambda: not bridge.connected)
        assert bridge.health()["port"] is None
    finally:
        bridge.close()
        await wait_for(listening.stopListening())
