"""The status page's tables in headless Chromium: updated in place (a selection survives),
a page of rows at a time with a filter and a sort asked of the API, `$` topics folded, numbers
written for people, and text from the broker shown as text however hostile."""

from __future__ import annotations

import re
from typing import Any

import pytest_twisted
from twisted.internet import reactor

from tests.admin.http import http, start
from tests.brokers import Broker
from tests.browser.conftest import Browser
from tests.browser.pages import (
    SHOWN_WITHIN_MS,
    broker_shown,
    open_page,
    overflow,
    row_with,
    rows,
    tap,
    tapped_line,
    wait_text,
    wait_updates,
)
from tests.support import eventually, wait_for
from wireproto.admin import AdminSettings
from wireproto.hub import HubSettings
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.ubre.server import UbreSettings

SELECT_PEER = """() => {
  const cell = [...document.querySelectorAll('#sessions tbody td.peer')]
    .find(cell => cell.closest('tr').textContent.includes('length32'));
  const range = document.createRange();
  range.selectNodeContents(cell);
  getSelection().removeAllRanges();
  getSelection().addRange(range);
  return getSelection().toString();
}"""
SELECTION = """() => {
  const selection = getSelection();
  return [selection.toString(), selection.rangeCount > 0 && selection.anchorNode.isConnected];
}"""


@pytest_twisted.ensureDeferred
async def test_a_selection_in_a_row_survives_the_updates(broker: Broker, browser: Browser) -> None:
    service, addresses, base = await start(broker)
    client = await broker.client(addresses["websmq+length32"])
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    await browser.run(row_with, page, "sessions", "length32")
    (session,) = service.hub.sessions
    selected = await browser.run(page.evaluate, SELECT_PEER)
    assert selected == session.peer

    # Between updates its counters change and a row is added after it.
    await wait_for(client.publish("news", b"1"))
    await broker.client(addresses["websmq+length32"])
    await browser.run(wait_updates, page, 2)
    await wait_for(client.publish("news", b"2"))
    await browser.run(wait_updates, page, 1)
    shown = await browser.run(rows, page, "sessions")
    assert len(shown) == 2 and shown[0][8] == "2"  # its "in", changed in place

    assert await browser.run(page.evaluate, SELECTION) == [session.peer, True]


@pytest_twisted.ensureDeferred
async def test_topics_come_a_page_at_a_time_filtered_and_sorted_by_the_api(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker)
    client = await broker.client(addresses["websmq+length32"])
    for number in range(120):
        client.subscribe(f"t/{number:03}")
    await eventually(lambda: len(service.hub.subscriber_counts()) == 120)
    page = await open_page(browser, base)
    asked: list[str] = []
    await browser.run(page.on, "request", lambda request: asked.append(request.url))
    await browser.run(broker_shown, page)
    await browser.run(wait_text, page, "#topics-count", "(120 of 120)")
    assert await browser.run(page.text_content, "#topics-rows") == "rows 1-50"
    shown = await browser.run(rows, page, "topics")
    assert [row[0] for row in shown] == [f"t/{number:03}" for number in range(50)]
    assert await browser.run(page.is_disabled, "#topics-prev")

    await browser.run(page.click, "#topics-next")
    await browser.run(wait_text, page, "#topics-rows", "rows 51-100")
    assert (await browser.run(rows, page, "topics"))[0][0] == "t/050"
    await browser.run(page.click, "#topics-next")
    await browser.run(wait_text, page, "#topics-rows", "rows 101-120")
    assert await browser.run(page.is_disabled, "#topics-next")

    await browser.run(page.fill, "#topics-filter", "t/11")  # resets the page to the first
    await browser.run(wait_text, page, "#topics-count", "(10 of 120)")
    shown = await browser.run(rows, page, "topics")
    assert [row[0] for row in shown] == [f"t/{number}" for number in range(110, 120)]
    assert any("topics.q=t%2F11" in url for url in asked)

    header = "#topics th[data-sort=topic]"
    assert await browser.run(page.get_attribute, header, "aria-sort") == "ascending"
    await browser.run(page.click, f"{header} button")
    await browser.run(lambda: page.wait_for_function(
        "() => document.querySelector('#topics tbody td')?.textContent === 't/119'",
        timeout=SHOWN_WITHIN_MS))
    assert await browser.run(page.get_attribute, header, "aria-sort") == "descending"
    assert "▼" in await browser.run(page.text_content, header)
    await browser.run(page.click, "#topics th[data-sort=subscribers] button")
    await browser.run(lambda: page.wait_for_function(
        "() => document.querySelector('#topics th[data-sort=subscribers]')"
        ".getAttribute('aria-sort') === 'ascending'"))
    assert await browser.run(page.get_attribute, header, "aria-sort") is None
    assert any("topics.sort=subscribers" in url for url in asked)

    # Sessions: filtered by a peer's port, sorted by id descending.
    other = await broker.client(addresses["websmq+length32"])
    await eventually(lambda: len(service.hub.sessions) == 2)
    await browser.run(wait_text, page, "#sessions-count", "(2 of 2)")
    await browser.run(page.click, "#sessions th[data-sort=id] button")
    first, second = sorted(service.hub.sessions, key=lambda session: session.id)
    await browser.run(lambda: page.wait_for_function(
        f"() => document.querySelector('#sessions tbody td')?.textContent === '{second.id}'",
        timeout=SHOWN_WITHIN_MS))
    port = first.peer.rsplit(":", 1)[1]
    await browser.run(page.fill, "#sessions-filter", f":{port}")
    await browser.run(wait_text, page, "#sessions-count", "(1 of 2)")
    assert [row[0] for row in await browser.run(rows, page, "sessions")] == [str(first.id)]
    await wait_for(other.disconnect())


@pytest_twisted.ensureDeferred
async def test_a_filter_of_any_length_leaves_the_page_answered(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker)
    await broker.client(addresses["websmq+length32"])
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    await browser.run(wait_text, page, "#sessions-count", "(1 of 1)")
    # Pasted into both boxes: 20,000 characters of 9 each in a URL (%E6%BC%A2).
    for table in ("sessions", "topics"):
        await browser.run(page.fill, f"#{table}-filter", "漢" * 20_000)
    await browser.run(wait_text, page, "#sessions-count", "(0 of 1)")
    await browser.run(wait_updates, page, 2)
    assert await browser.run(page.is_hidden, "#problem")
    assert len(await browser.run(page.input_value, "#sessions-filter")) == 500

    await browser.run(page.fill, "#sessions-filter", "length32")
    await browser.run(wait_text, page, "#sessions-count", "(1 of 1)")
    assert await browser.run(page.is_hidden, "#problem")


@pytest_twisted.ensureDeferred
async def test_dollar_topics_are_folded_until_asked_for(broker: Broker, browser: Browser) -> None:
    service, addresses, base = await start(broker, admin=AdminSettings(sys_interval=0.5))
    client = await broker.client(addresses["websmq+length32"])
    await wait_for(client.subscribe("plain"))
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    await browser.run(page.wait_for_selector, "#show-sys:not([hidden])")
    toggle = await browser.run(page.text_content, "#show-sys")
    assert re.fullmatch(r"show [1-9]\d* \$ topics", toggle), toggle
    names = [row[0] for row in await browser.run(rows, page, "topics")]
    assert "plain" in names and not any(name.startswith("$") for name in names)

    await browser.run(page.click, "#show-sys")
    await browser.run(row_with, page, "topics", "$SYS/broker/uptime")
    assert await browser.run(page.text_content, "#show-sys") == "hide $ topics"
    await browser.run(page.click, "#show-sys")
    await browser.run(lambda: page.wait_for_function(
        "() => ![...document.querySelectorAll('#topics tbody tr')]"
        ".some(row => row.textContent.startsWith('$'))", timeout=SHOWN_WITHIN_MS))


@pytest_twisted.ensureDeferred
async def test_numbers_have_thousands_separators_and_rates_one_decimal(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker)
    client = await broker.client(addresses["websmq+length32"])
    await wait_for(client.subscribe("busy"))
    for _ in range(1234):
        client.publish("busy", b"x")
    await eventually(lambda: service.hub.stats.published >= 1234, timeout=10)
    page = await open_page(browser, base, locale="en-US")
    await browser.run(broker_shown, page)
    await browser.run(wait_text, page, "#figures", "1,234")
    session = await browser.run(row_with, page, "sessions", "length32")
    assert "1,234" in session  # in; and out, as it subscribes to its own topic
    await browser.run(row_with, page, "topics", "busy")
    for _ in range(3):
        await browser.run(wait_updates, page, 1)
        (busy,) = [row for row in await browser.run(rows, page, "topics") if row[0] == "busy"]
        assert re.fullmatch(r"\d{1,3}(,\d{3})*(\.\d)?", busy[2]), busy  # per second


HOSTILE_TOPICS = [
    "<script>window.pwned = 1</script>",
    "<img src=x onerror='window.pwned = 2'>",
    "rtl/\u202eevil\u202b/\u200f",
    "control/\x07\x1b[31m\x08\r\n\t/end",
    "long/" + "x" * 10_000,
]
HOSTILE_PAYLOAD = "<script>window.pwned = 3</script>"


@pytest_twisted.ensureDeferred
async def test_hostile_text_from_the_broker_is_shown_as_text_and_keeps_the_layout(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker, hub=HubSettings(max_topic_length=16_384),
                                           ubre=UbreSettings(max_topic_length=16_384))
    subscriber = await wait_for(ubre_connect(reactor, addresses["ubre+ws"]))
    try:
        for topic in HOSTILE_TOPICS:
            subscriber.subscribe(topic, lambda message: None)
        await eventually(lambda: len(service.hub.subscriber_counts()) == len(HOSTILE_TOPICS))
        page = await open_page(browser, base, viewport={"width": 1100, "height": 900})
        await browser.run(broker_shown, page)
        await browser.run(tap, page, "#")
        for topic in HOSTILE_TOPICS:
            answer = await http(base, "/api/publish", {"topic": topic, "payload": HOSTILE_PAYLOAD})
            assert answer.status == 200, answer.body
        await browser.run(tapped_line, page, "long/xxx")
        await browser.run(row_with, page, "topics", "long/xxx")
        await browser.run(wait_updates, page, 2)

        def looked_at() -> dict[str, Any]:
            return page.evaluate("""() => {
              const line = [...document.querySelectorAll('#tapped li')]
                .find(line => line.textContent.includes('evil'));
              const box = (element) => element.getBoundingClientRect();
              const long = [...document.querySelectorAll('#topics tbody tr')]
                .find(row => row.textContent.startsWith('long/'));
              return {
                pwned: window.pwned ?? null,
                images: document.images.length,
                scripts: document.scripts.length,
                tapped: [...document.querySelectorAll('#tapped code')]
                  .map(code => code.textContent),
                topics: [...document.querySelectorAll('#topics tbody td:first-child')]
                  .map(cell => cell.textContent),
                subscriptions: document.querySelector('#sessions td.subscriptions').title,
                order: ['time', '.topic', '.kind'].map(part => box(line.querySelector(part)))
                  .flatMap(found => [found.left, found.right]),
                longRow: box(long).height,
                longTitle: long.cells[0].title.length,
              };
            }""")

        seen = await browser.run(looked_at)
        assert seen["pwned"] is None and seen["images"] == 0 and seen["scripts"] == 1
        assert seen["tapped"].count(HOSTILE_PAYLOAD) == len(HOSTILE_TOPICS)
        for topic in HOSTILE_TOPICS[:4]:
            assert topic in seen["topics"]
            assert topic in seen["subscriptions"]
        # A right-to-left override in a topic stays in its own span: the line reads left to
        # right: time, topic, what it is, side by side.
        assert seen["order"] == sorted(seen["order"]), seen["order"]
        assert seen["longRow"] < 200 and seen["longTitle"] > 10_000 - 1  # cut, whole in its title
        assert await browser.run(overflow, page) <= 0
        await browser.run(lambda: page.set_viewport_size({"width": 390, "height": 844}))
        await browser.run(wait_updates, page, 1)
        assert await browser.run(overflow, page) <= 0
    finally:
        await wait_for(subscriber.close())
