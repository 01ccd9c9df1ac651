"""The status page in headless Chromium, against a real broker with real Python clients."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest_twisted

from tests.access.conftest import AuthFiles
from tests.admin.http import LISTENERS, start
from tests.brokers import LOCAL, Broker
from tests.browser.conftest import SCREENSHOTS, Browser
from tests.browser.pages import (
    CHART_PIXELS,
    SHOWN_WITHIN_MS,
    broker_shown,
    open_page,
    open_page_behind_auth,
    overflow,
    row_with,
    submit,
    tap,
    tapped_line,
    wait_text,
    wait_updates,
)
from tests.phyllo.test_bridge import PtyDevice, document
from tests.support import Inbox, eventually, on_the_default_ports, wait_for
from wireproto.cluster.settings import ClusterSettings
from wireproto.config import parse_phyllo
from wireproto.hub import HubSettings


@pytest_twisted.ensureDeferred
async def test_the_page_lists_a_python_client_and_shows_its_publish_at_once(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker, hub=HubSettings(retain=("sensors/#",)))
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    client = await broker.client(addresses["websmq+length32"])
    shown = await browser.run(row_with, page, "sessions", "length32")
    assert "websmq" in shown and "127.0.0.1" in shown

    await browser.run(tap, page, "sensors/#")
    await wait_for(client.publish("sensors/temp", b'{"c":21.5}'))
    line = await browser.run(tapped_line, page, "sensors/temp")
    assert '{"c":21.5}' in line and "websmq" in line
    topic = await browser.run(row_with, page, "topics", "sensors/temp")
    assert '{"c":21.5}' in topic  # its last value
    # A last value is shown as it was sent, as the tap shows it, not as its JSON written again.
    await wait_for(client.publish("sensors/pressure", b'{"hPa": 10132e-1}'))
    topic = await browser.run(row_with, page, "topics", "sensors/pressure")
    assert '{"hPa": 10132e-1}' in topic, topic

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await wait_for(client.publish("sensors/humidity", b"48"))
    await browser.run(tapped_line, page, "sensors/humidity")
    await browser.run(lambda: page.set_viewport_size({"width": 1100, "height": 900}))
    await browser.run(lambda: page.screenshot(path=str(SCREENSHOTS / "status-page.png"),
                                              full_page=True))
    assert (SCREENSHOTS / "status-page.png").stat().st_size > 10_000


PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True,
         "has_touch": True}
# Where each part of the page is on the screen, and whether it shows.
BOXES = """selectors => selectors.map(selector => {
  const found = document.querySelector(selector);
  const box = found.getBoundingClientRect();
  return [selector, found.checkVisibility(), box.left, box.right, box.top, box.bottom];
})"""


@pytest_twisted.ensureDeferred
async def test_the_page_fits_a_phone(broker: Broker, browser: Browser) -> None:
    service, addresses, base = await start(broker)
    await broker.client(addresses["websmq+length32"])
    page = await open_page(browser, base, **PHONE)
    await browser.run(broker_shown, page)
    await browser.run(row_with, page, "sessions", "length32")
    await browser.run(wait_updates, page, 1)
    assert await browser.run(overflow, page) <= 0
    cells = ["#sessions tbody td:nth-child(1)", "#sessions tbody td:nth-child(3)",
             "#sessions td.peer", "#sessions td.action button", "#sessions-filter",
             "#sessions-next", "#chart-messages", "#topics-filter"]
    for selector, shown, left, right, *_ in await browser.run(page.evaluate, BOXES, cells):
        assert shown and 0 <= left < right <= 390, (selector, left, right)
    hidden = ["#sessions tbody td:nth-child(9)", "#sessions th.subscriptions"]
    for selector, shown, *_ in await browser.run(page.evaluate, BOXES, hidden):
        assert not shown, selector
    publish, call = await browser.run(page.evaluate, BOXES, ["#publish", "#call"])
    assert call[4] >= publish[5]  # the forms stack
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await browser.run(lambda: page.screenshot(path=str(SCREENSHOTS / "status-page-phone.png")))


@pytest_twisted.ensureDeferred
async def test_a_publish_and_calls_from_the_page_reach_python(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker)
    subscriber = await broker.client(addresses["websmq+length32"])
    inbox = Inbox()
    await wait_for(subscriber.subscribe("news", inbox))
    service.server("ubre").handle("add", lambda body, caller: sum(body))
    service.server("nydus").register_route("/hello/:name",
                                           lambda call: f"hello {call.params['name']}")
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)

    result = await browser.run(submit, page, "publish",
                               {"topic": "news", "payload": "from the page"})
    assert result == "delivered to 1"
    (message,) = await inbox.wait()
    assert message.payload == b"from the page"

    result = await browser.run(submit, page, "call",
                               {"protocol": "ubre", "name": "add", "body": "[1, 2]"})
    assert result == "ok: 3"
    result = await browser.run(submit, page, "call",
                               {"protocol": "nydus", "name": "/hello/page", "body": ""})
    assert result == 'ok: "hello page"'
    result = await browser.run(submit, page, "call",
                               {"protocol": "ubre", "name": "missing", "body": ""})
    assert result == 'failed: "NotFound"'


async def cluster_process(broker: Broker, nats: Any) -> tuple[Any, dict[str, str], str]:
    """A process of a cluster through the real `nats`: its service, addresses and page's base."""
    service, addresses, base = await start(
        broker, *(listener for listener in LISTENERS if "ubre" not in listener),
        cluster=ClusterSettings(url=nats.url, heartbeat_interval=0.2, lease=1.0))
    await wait_for(service.cluster.when_ready(), 10)
    return service, addresses, base


@pytest_twisted.ensureDeferred
async def test_in_a_cluster_a_publish_from_the_page_says_its_count_is_this_processs(
    broker: Broker, browser: Browser, nats: Any,
) -> None:
    first, at_first, base = await cluster_process(broker, nats)
    second, at_second, _ = await cluster_process(broker, nats)
    inboxes = []
    for addresses in (at_first, at_second):
        subscriber = await broker.client(addresses["websmq+length32"])
        inboxes.append(Inbox())
        await wait_for(subscriber.subscribe("news", inboxes[-1]))
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    await browser.run(wait_text, page, "#node", "2 processes")
    # Each process knows of the other's subscriber: the topic's count is the cluster's.
    await browser.run(lambda: page.wait_for_function(
        "() => [...document.querySelectorAll('#topics tbody tr')].some((row) => "
        "row.cells[0].textContent === 'news' && row.cells[1].textContent === '2')",
        timeout=SHOWN_WITHIN_MS * 3))

    result = await browser.run(submit, page, "publish", {"topic": "news", "payload": "one"})
    assert result == "delivered to 1 on this process"
    for inbox in inboxes:  # every process's subscriber has it
        assert [message.payload for message in await inbox.wait()] == [b"one"]
    result = await browser.run(submit, page, "call", {
        "protocol": "nydus", "name": "/_hub/publish",
        "body": '{"path": "/news", "data": "two"}'})
    assert result == 'ok: {"delivered":1,"processes":2} (delivered on this process)'
    for inbox in inboxes:
        assert [message.payload for message in await inbox.wait(2)][1] == b'"two"'


PARTIAL_SHOWN = ("() => !document.querySelector('#partial').hidden && document.querySelector("
                 "'#partial').textContent === '1 of 2 processes answered: the figures are partial'")


@pytest_twisted.ensureDeferred
async def test_in_a_cluster_a_process_left_out_is_said_and_leaves_no_dip_in_the_charts(
    broker: Broker, browser: Browser, nats: Any,
) -> None:
    """While NATS is paused, the status names only the answering process: the page says its
    figures are partial, draws no chart point from them, and when both answer again draws the
    charts from /api/history, where every second has both processes' connections."""
    first, at_first, base = await cluster_process(broker, nats)
    second, at_second, _ = await cluster_process(broker, nats)
    for addresses in (at_first, at_second):
        await broker.client(addresses["websmq+length32"])
    page = await browser.page()
    history: list[int] = []
    await browser.run(page.on, "response", lambda response: history.append(response.status)
                      if response.url.endswith("/api/history") else None)
    await browser.run(page.goto, base + "/")
    await browser.run(broker_shown, page)
    await browser.run(wait_text, page, "#node", "2 processes")
    await browser.run(lambda: page.wait_for_function(
        "() => document.querySelector('#chart-connections-now').textContent === '2'",
        timeout=SHOWN_WITHIN_MS * 3))
    await browser.run(wait_updates, page, 4)  # seconds of two connections before the pause
    assert await browser.run(page.is_hidden, "#partial")
    asked = len(history)
    paused = time.time()
    os.kill(nats.process.pid, signal.SIGSTOP)
    try:
        await browser.run(lambda: page.wait_for_function(PARTIAL_SHOWN,
                                                         timeout=SHOWN_WITHIN_MS * 3))
        await browser.run(wait_updates, page, 2)
        assert await browser.run(page.text_content, "#chart-connections-now") == "2"
    finally:
        os.kill(nats.process.pid, signal.SIGCONT)
    await browser.run(lambda: page.wait_for_function(
        "() => document.querySelector('#partial').hidden", timeout=SHOWN_WITHIN_MS * 4))
    await browser.run(wait_text, page, "#node", "2 processes")
    await browser.run(wait_updates, page, 2)  # Playwright hands over its events meanwhile
    await eventually(lambda: len(history) > asked, timeout=SHOWN_WITHIN_MS / 1000)
    # A chart shows a minute here: from a second before the pause on, connections stayed at two,
    # the chart's top; the page reloaded would draw the same.
    left = 1 - (time.time() - paused + 1) / 60
    low = await browser.run(page.evaluate, CHART_PIXELS,
                            ["chart-connections", "--connections", 0.3, 1, left])
    assert low == 0, low


@pytest_twisted.ensureDeferred
async def test_closing_a_connection_asks_first(broker: Broker, browser: Browser) -> None:
    service, addresses, base = await start(broker)
    client = await broker.client(addresses["websmq+length32"])
    (session,) = service.hub.sessions
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    peer = await browser.run(row_with, page, "sessions", "length32")
    asked: list[str] = []
    answers = [False, True]

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        if answers.pop(0):
            dialog.accept()
        else:
            dialog.dismiss()

    def click_close() -> None:
        page.on("dialog", answer)
        page.click(f"button[data-session='{session.id}']")

    await browser.run(click_close)
    await browser.run(wait_updates, page, 2)
    assert list(service.hub.sessions) == [session] and client.connected
    assert f"Close connection {session.id}" in asked[0] and session.peer in asked[0]
    assert "length32" in peer

    await browser.run(page.click, f"button[data-session='{session.id}']")
    await wait_for(client.when_closed())
    await eventually(lambda: not service.hub.sessions)
    assert len(asked) == 2

    def gone() -> None:
        page.wait_for_function("() => !document.querySelectorAll('#sessions tbody tr').length")

    await browser.run(gone)


@pytest_twisted.ensureDeferred
async def test_a_phyllo_message_from_a_serial_device_appears_in_the_tap(
    broker: Broker, browser: Browser, tmp_path: Path,
) -> None:
    device = PtyDevice(tmp_path / "ttyACM-board")
    try:
        service, addresses, base = await start(
            broker, f"websmq+ws@tcp:0:{LOCAL}",
            phyllo=(parse_phyllo(f"board@{device.endpoint}"),),
            retry_policy=lambda attempt: 0.05)
        await eventually(lambda: service.phyllo["board"].connected)
        page = await open_page(browser, base)
        await browser.run(broker_shown, page)
        link = await browser.run(row_with, page, "links", "phyllo board")
        assert "open" in link
        await browser.run(tap, page, "phyllo/#")
        device.send(document("temp", {"c": 19.5}))
        line = await browser.run(tapped_line, page, "phyllo/board/temp")
        assert "19.5" in line and "phyllo" in line
    finally:
        device.unplug()


@pytest_twisted.ensureDeferred
async def test_behind_access_control_the_page_needs_an_admin_login(
    broker: Broker, browser: Browser, auth_files: AuthFiles,
) -> None:
    service, page = await open_page_behind_auth(broker, browser, auth_files)

    def login_asked() -> tuple[bool, bool, str]:
        page.wait_for_selector("#login:not([hidden])")
        return (page.is_hidden("#broker"), page.locator("#sessions tbody tr").count() == 0,
                page.inner_text("#login-why"))

    hidden, empty, why = await browser.run(login_asked)
    assert hidden and empty and "credentials" in why

    def log_in(fields: dict[str, str]) -> None:
        for name, value in fields.items():
            page.fill(f"#login [name={name}]", value)
        page.click("#login button[type=submit]")

    await browser.run(log_in, {"user": "carol", "password": "carol's password"})
    await browser.run(lambda: page.wait_for_function(
        "() => document.querySelector('#login-why').textContent.includes('not an admin')"))
    assert await browser.run(page.is_hidden, "#broker")

    token = auth_files.token("erin", roles=["admin"])
    await browser.run(log_in, {"user": "", "password": "", "token": token})
    await browser.run(broker_shown, page)
    who = await browser.run(lambda: page.wait_for_function(
        "() => document.querySelector('#who').textContent === 'as erin'"))
    assert who
    listeners = await browser.run(row_with, page, "listeners", "websmq")
    assert "ws://127.0.0.1" in listeners


@on_the_default_ports
@pytest_twisted.ensureDeferred
async def test_the_broker_of_make_serve_shows_itself_live_at_its_address(
    broker: Broker, browser: Browser,
) -> None:
    """`make serve` runs `wireproto serve` on the built-in defaults; the README sends people to
    http://127.0.0.1:8765/ then."""
    import re
    import sys

    from tests.test_cli import Child
    from tests.test_doc_commands import DEFAULT_PORTS, port_open

    busy = [port for port in DEFAULT_PORTS if port_open(port)]
    assert not busy, f"the default ports are in use: {busy}"
    serve = Child(str(Path(sys.executable).parent / "wireproto"), "serve")
    try:
        await serve.line(re.compile(r"wireproto: ready"), timeout=30)
        page = await open_page(browser, "http://127.0.0.1:8765")
        await browser.run(broker_shown, page)
        listeners = await browser.run(row_with, page, "listeners", "engineio")
        assert "http://127.0.0.1:8765/engine.io/" in listeners
        client = await broker.client("tcp:host=127.0.0.1:port=8766")
        await browser.run(row_with, page, "sessions", "length32")
        await browser.run(tap, page, "#")
        await wait_for(client.publish("demo", b"hello"))
        assert "hello" in await browser.run(tapped_line, page, "demo")
        await wait_for(client.disconnect())
    finally:
        serve.process.terminate()
        serve.process.wait(timeout=20)
