"""The status page's Devices table, in headless Chromium, against a real broker with a Phyllo
link to a stand-in board (a pty with an Uno's USB identity)."""

from __future__ import annotations

import pytest_twisted
from twisted.internet import reactor

from tests.admin.http import base_of
from tests.brokers import LOCAL, Broker
from tests.browser.conftest import Browser
from tests.browser.pages import SHOWN_WITHIN_MS, broker_shown, open_page, overflow, rows
from tests.phyllo.test_health import OVER_LONG, bad_crc, reading
from tests.support import eventually, wait_for
from wireproto.config import Config, parse_listen, parse_phyllo
from wireproto.devices import PollingWatcher
from wireproto.devices.standin import COMMON_BOARDS, StandInPorts
from wireproto.service import make_service

COLUMNS = ["link", "port", "online", "frames", "bytes in", "bytes out", "CRC errors", "resyncs",
           "reopens", "last frame"]


def device_row(page, text: str) -> dict[str, str]:
    """The Devices row once its cells hold `text` (a JS condition on `cells`), by column."""
    page.wait_for_function(
        f"() => [...document.querySelectorAll('#devices tbody tr')].some(row => {{"
        f" const cells = [...row.cells].map(cell => cell.textContent); return {text}; }})",
        timeout=SHOWN_WITHIN_MS * 2)
    (row,) = rows(page, "devices")
    return dict(zip(COLUMNS, row, strict=True))


def headers(page) -> list[str]:
    return page.eval_on_selector_all("#devices thead th", "cells => cells.map(c => c.textContent)")


@pytest_twisted.ensureDeferred
async def test_a_boards_frames_errors_and_reopen_are_counted_on_the_page(
    broker: Broker, browser: Browser,
) -> None:
    boards = StandInPorts()
    try:
        board = boards.plug(**COMMON_BOARDS["uno"], serial_number="85735313")
        config = Config(listeners=(parse_listen(f"websmq+ws@tcp:0:{LOCAL}"),),
                        phyllo=(parse_phyllo("uno@serial:vid=2341:pid=0043"),))
        service = make_service(config, reactor, retry_policy=lambda attempt: 0.05,
                               ports=PollingWatcher(reactor, boards.ports, interval=0.05))
        broker.services.append(service)  # stopped at the test's end
        service.startService()
        bound = await wait_for(service.when_listening())
        bridge = service.phyllo["uno"]
        await eventually(lambda: bridge.connected)

        page = await open_page(browser, base_of(bound[0].address))
        await browser.run(broker_shown, page)
        assert await browser.run(headers, page) == COLUMNS
        shown = await browser.run(device_row, page, "cells[9] === 'never'")
        assert shown["port"] == board.device and shown["online"] == "yes"
        assert shown["frames"] == "0"

        sent = reading(1) + bad_crc(reading(2)) + OVER_LONG + reading(3)
        board.write(sent)
        await eventually(lambda: bridge.counters()["to_hub"] == 2)
        shown = await browser.run(device_row, page, "cells[3] === '3'")
        assert shown["bytes in"] == f"{len(sent):,}"
        assert (shown["CRC errors"], shown["resyncs"], shown["reopens"]) == ("1", "1", "0")
        assert shown["last frame"].endswith(" s ago")

        boards.unplug(board)
        shown = await browser.run(device_row, page, "cells[2] === 'no'")
        assert shown["port"] == "" and shown["frames"] == "3"

        again = boards.plug(**COMMON_BOARDS["uno"], serial_number="85735313")
        await eventually(lambda: bridge.connected)
        shown = await browser.run(device_row, page, "cells[8] === '1'")
        assert shown["port"] == again.device and shown["online"] == "yes"
        assert shown["frames"] == "3"  # kept across the reopen

        def on_a_phone() -> int:
            page.set_viewport_size({"width": 390, "height": 800})
            return overflow(page)

        assert await browser.run(on_a_phone) <= 0
    finally:
        boards.close()
