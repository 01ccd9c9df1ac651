"""What the status page shows as it happens, in headless Chromium: the tap (each message's time
and payload, a pause, a bounded buffer), the charts of the last minutes, and the time each update
takes."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest_twisted

from tests.admin.http import start
from tests.brokers import Broker
from tests.browser.conftest import Browser
from tests.browser.pages import (
    CHART_PIXELS,
    SHOWN_WITHIN_MS,
    broker_shown,
    open_page,
    tap,
    tapped_line,
    updates,
    wait_text,
    wait_updates,
)
from tests.support import Inbox, eventually, sleep, wait_for

TAPPED = "() => [...document.querySelectorAll('#tapped li')].map(line => line.textContent)"


@pytest_twisted.ensureDeferred
async def test_a_tap_line_shows_its_time_and_the_tap_pauses(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker)
    client = await broker.client(addresses["websmq+length32"])
    page = await open_page(browser, base, timezone_id="UTC")
    await browser.run(broker_shown, page)
    await browser.run(tap, page, "news/#")
    await wait_for(client.publish("news/first", b"hello"))
    sent = datetime.now(UTC)
    line = await browser.run(tapped_line, page, "news/first")
    shown = re.match(r"(\d\d):(\d\d):(\d\d)\.(\d{3})news/first", line)
    assert shown, line
    hours, minutes, seconds, milliseconds = map(int, shown.groups())
    when = sent.replace(hour=hours, minute=minutes, second=seconds,
                        microsecond=milliseconds * 1000)
    assert abs((when - sent).total_seconds()) < 5 or abs((when - sent).total_seconds()) > 86000
    assert "websmq" in line and "hello" in line

    await browser.run(page.click, "#tap-pause")
    assert await browser.run(page.text_content, "#tap-pause") == "resume"
    for number in range(3):
        await wait_for(client.publish(f"news/paused/{number}", b"while paused"))
    await browser.run(wait_text, page, "#tap-waiting", "3 waiting")
    assert not any("paused" in text for text in await browser.run(page.evaluate, TAPPED))

    await browser.run(page.click, "#tap-pause")
    await browser.run(tapped_line, page, "news/paused/2")
    lines = await browser.run(page.evaluate, TAPPED)
    assert [re.search(r"news/(first|paused/\d)", text)[1] for text in lines] == [
        "paused/2", "paused/1", "paused/0", "first"]  # newest first
    assert await browser.run(page.text_content, "#tap-waiting") == ""


@pytest_twisted.ensureDeferred
async def test_the_tap_keeps_the_last_500_lines_paused_or_not(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker)
    client = await broker.client(addresses["websmq+length32"])
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    await browser.run(tap, page, "many/#")

    for number in range(600):
        client.publish(f"many/{number}", b"x")
    await browser.run(tapped_line, page, "many/599")
    lines = await browser.run(page.evaluate, TAPPED)
    assert len(lines) == 500 and "many/599websmq" in lines[0]
    if not any("skipped" in text for text in lines):  # the broker skips for a slow reader
        # The newest, and a note of those that came at once beyond the 500 kept.
        shown = [int(found[1]) for text in lines if (found := re.search(r"many/(\d+)", text))]
        assert shown == list(range(599, 599 - len(shown), -1)) and len(shown) >= 499

    await browser.run(page.click, "#tap-pause")
    for number in range(600):
        client.publish(f"many/more/{number}", b"y")
    await browser.run(tap_waiting, page, "500 waiting")
    assert len(await browser.run(page.evaluate, TAPPED)) == 500
    await browser.run(page.click, "#tap-pause")
    await browser.run(tapped_line, page, "many/more/599")
    lines = await browser.run(page.evaluate, TAPPED)
    assert len(lines) == 500 and "many/more/599websmq" in lines[0]
    assert re.fullmatch(r"\d+ messages dropped while paused \(the page keeps 500\)", lines[-1])


# Every line the tap list is ever given, from now on (the list keeps only the last 500).
WATCH_TAPPED = """() => {
  window.tappedEver = [];
  new MutationObserver((changes) => {
    for (const change of changes) {
      for (const line of change.addedNodes) window.tappedEver.push(line.textContent);
    }
  }).observe(document.querySelector('#tapped'), { childList: true });
}"""
# How many messages on burst/N the page has shown or said it did not show: each line
# once, plus the counts of its notes and of the broker's.
ACCOUNTED = """() => {
  const shown = new Set();
  let counted = 0;
  for (const text of window.tappedEver) {
    const message = text.match(/burst\\/(\\d+)/);
    const note = text.match(/^([\\d,]+) messages (not shown|skipped)/);
    if (message) shown.add(Number(message[1]));
    else if (note) counted += Number(note[1].replaceAll(',', ''));
  }
  return shown.size + counted;
}"""
BURST = 800


def wait_accounted(page: Any, count: int) -> None:
    """Until `count` messages are accounted for, or a while: the test then says how many."""
    from playwright.sync_api import TimeoutError as NotYet

    try:
        page.wait_for_function(f"() => ({ACCOUNTED})() >= {count}", timeout=SHOWN_WITHIN_MS * 2)
    except NotYet:
        pass


@pytest_twisted.ensureDeferred
async def test_a_burst_beyond_what_the_tap_keeps_is_counted_not_lost(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker)
    client = await broker.client(addresses["websmq+length32"])
    last = Inbox()
    await wait_for((await broker.client(addresses["websmq+length32"])).subscribe(
        f"burst/{BURST - 1}", last))
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    await browser.run(tap, page, "burst/#")
    await browser.run(page.evaluate, WATCH_TAPPED)
    (tapped,) = service.admin.api.taps

    # The browser freezes the page (as it does a tab in the background) while a burst goes by:
    # when it thaws, all of it comes in one frame, more than the page keeps.
    cdp = await browser.run(page.context.new_cdp_session, page)
    await browser.run(cdp.send, "Page.setWebLifecycleState", {"state": "frozen"})
    for number in range(BURST):
        client.publish(f"burst/{number}", b"x")
    await last.wait()
    await eventually(lambda: tapped.skipped == 0)  # all written, the broker's count too
    await browser.run(cdp.send, "Page.setWebLifecycleState", {"state": "active"})
    # Each message shown, or counted by the page's note or the broker's (a reader behind).
    await browser.run(wait_accounted, page, BURST)
    assert await browser.run(page.evaluate, ACCOUNTED) == BURST
    assert len(await browser.run(page.evaluate, TAPPED)) == 500
    # In the place of those it stands for, the oldest: a line that comes after pushes it out.
    notes = [text for text in await browser.run(page.evaluate, "() => window.tappedEver")
             if "not shown" in text]
    assert len(notes) == 1, notes
    assert re.fullmatch(r"[\d,]+ messages not shown: more came at once than the page keeps "
                        r"\(500\)", notes[0])


def tap_waiting(page: Any, text: str) -> None:
    page.wait_for_function(
        "text => document.querySelector('#tap-waiting').textContent.startsWith(text)", arg=text,
        timeout=SHOWN_WITHIN_MS * 2)


@pytest_twisted.ensureDeferred
async def test_a_tap_line_shows_the_payload_as_sent(broker: Broker, browser: Browser) -> None:
    service, addresses, base = await start(broker)
    client = await broker.client(addresses["websmq+length32"])
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    await browser.run(tap, page, "raw/#")
    await wait_for(client.publish("raw/json", b'{"t": 234e-1}'))
    await wait_for(client.publish("raw/control", "bell \x07 rtl \u202e end".encode()))
    await wait_for(client.publish("raw/bytes", b"\xff\x00\x01"))
    assert '{"t": 234e-1}' in await browser.run(tapped_line, page, "raw/json")
    assert "bell \x07 rtl \u202e end" in await browser.run(tapped_line, page, "raw/control")
    line = await browser.run(tapped_line, page, "raw/bytes")
    assert "ff0001" in line and "hex" in line


@pytest_twisted.ensureDeferred
async def test_the_charts_draw_what_each_poll_adds(broker: Broker, browser: Browser) -> None:
    service, addresses, base = await start(broker)
    client = await broker.client(addresses["websmq+length32"])
    await wait_for(client.subscribe("busy"))
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    for _ in range(4):
        for _ in range(50):
            client.publish("busy", b"x")
        await browser.run(wait_updates, page, 1)
    await browser.run(wait_text, page, "#chart-connections-now", "1")
    drawn = {colour: await browser.run(page.evaluate, CHART_PIXELS, [f"chart-{name}", colour])
             for name, colour in [("connections", "--connections"), ("messages", "--in"),
                                  ("messages", "--out")]}
    # A few seconds of a 10 minutes' chart: a few pixels at its right edge.
    assert all(count > 0 for count in drawn.values()), drawn
    assert re.fullmatch(r"[\d,.]+/s", await browser.run(page.text_content, "#chart-messages-in"))


@pytest_twisted.ensureDeferred
async def test_the_charts_start_from_the_brokers_history(broker: Broker, browser: Browser) -> None:
    service, addresses, base = await start(broker)
    client = await broker.client(addresses["websmq+length32"])
    await wait_for(client.subscribe("busy"))
    for _ in range(4):
        for _ in range(50):
            client.publish("busy", b"x")
        await sleep(1)
    # Listening before the page loads: its history may be asked for before goto returns.
    page = await browser.page()
    history: list[Any] = []
    await browser.run(page.on, "response", lambda response: history.append(response.status)
                      if response.url.endswith("/api/history") else None)
    await browser.run(page.goto, base + "/")
    await browser.run(broker_shown, page)
    await browser.run(wait_updates, page, 1)
    await eventually(lambda: history == [200], timeout=SHOWN_WITHIN_MS / 1000)
    await browser.run(wait_updates, page, 1)
    # Messages in, above the line of none: from the history, as the polls since saw none.
    drawn = await browser.run(page.evaluate, CHART_PIXELS, ["chart-messages", "--in", 0, 0.75])
    assert drawn > 0


@pytest_twisted.ensureDeferred
async def test_each_update_is_measured(broker: Broker, browser: Browser) -> None:
    service, addresses, base = await start(broker)
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    started = time.monotonic()
    await browser.run(wait_updates, page, 3)
    measures = await browser.run(page.evaluate, """() => performance.getEntriesByName(
        'wireproto-update').map(entry => [entry.entryType, entry.duration])""")
    assert len(measures) >= 3 and await browser.run(updates, page) == len(measures)
    assert all(kind == "measure" and 0 < duration < 1000 for kind, duration in measures)
    assert time.monotonic() - started > 1.5  # once a second, not more
