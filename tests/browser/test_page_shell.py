"""The status page's frame in headless Chromium: its login form (a refusal said, no polling while
it waits), its header, its icon, and its strict content security policy."""

from __future__ import annotations

import re
import time
from html.parser import HTMLParser
from importlib import resources
from typing import Any

import pytest_twisted

from tests.access.conftest import AuthFiles
from tests.admin.http import start
from tests.brokers import Broker
from tests.browser.conftest import Browser
from tests.browser.pages import (
    broker_shown,
    open_page,
    open_page_behind_auth,
    submit,
    tap,
    tapped_line,
    wait_text,
    wait_updates,
)
from tests.support import wait_for
from wireproto import __version__
from wireproto.admin import PAGE_FILES
from wireproto.admin.static_files import PAGE_POLICY

QUIET_SECONDS = 3


def api_requests(page: Any) -> list[str]:
    """The page's requests to /api/ from now on, as they are made."""
    made: list[str] = []
    page.on("request", lambda request: made.append(request.url) if "/api/" in request.url
            else None)
    return made


def log_in(page: Any, fields: dict[str, str]) -> None:
    for name, value in fields.items():
        page.fill(f"#login [name={name}]", value)
    page.click("#login button[type=submit]")


@pytest_twisted.ensureDeferred
async def test_a_refused_login_says_so_and_a_waiting_login_form_asks_nothing(
    broker: Broker, browser: Browser, auth_files: AuthFiles,
) -> None:
    service, page = await open_page_behind_auth(broker, browser, auth_files)
    await browser.run(page.wait_for_selector, "#login:not([hidden])")
    made = await browser.run(api_requests, page)
    await browser.run(page.wait_for_timeout, QUIET_SECONDS * 1000)
    assert made == []  # the form waits for its user, not polling the API

    await browser.run(log_in, page, {"user": "carol", "password": "not her password"})
    why = await browser.run(wait_text, page, "#login-why", "refused: ")
    assert why.startswith("refused: ") and await browser.run(page.is_hidden, "#broker")
    assert [url.split("/api/")[1].split("?")[0] for url in made] == ["status"]
    await browser.run(page.wait_for_timeout, QUIET_SECONDS * 1000)
    assert len(made) == 1

    token = auth_files.token("erin", roles=["admin"])
    await browser.run(log_in, page, {"user": "", "password": "", "token": token})
    await browser.run(broker_shown, page)
    await browser.run(wait_updates, page, 2)
    started = time.monotonic()
    count = len(made)
    await browser.run(page.click, "#logout")
    await browser.run(page.wait_for_timeout, QUIET_SECONDS * 1000)
    assert len(made) <= count + 1, made[count:]  # at most the poll under way when it logged out
    assert time.monotonic() - started >= QUIET_SECONDS


@pytest_twisted.ensureDeferred
async def test_the_header_names_the_version(broker: Broker, browser: Browser) -> None:
    service, addresses, base = await start(broker)
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    header = await browser.run(wait_text, page, "h1", __version__)
    assert header == f"wireproto {__version__}"


async def watched_page(browser: Browser, base: str) -> tuple[Any, Any, list[str]]:
    """The page, its response, and what the browser complains of while it shows: script
    errors, and console errors (a policy's refusal, a resource that failed) with their URL."""
    page = await browser.page()
    complaints: list[str] = []

    def watch() -> Any:
        page.on("console", lambda message: complaints.append(
            f"{message.text} {message.location.get('url', '')}")
            if message.type == "error" else None)
        page.on("pageerror", lambda error: complaints.append(str(error)))
        return page.goto(base + "/")

    response = await browser.run(watch)
    await browser.run(broker_shown, page)
    await browser.run(wait_updates, page, 2)
    return page, response, complaints


@pytest_twisted.ensureDeferred
async def test_the_page_keeps_a_strict_policy(broker: Broker, browser: Browser) -> None:
    service, addresses, base = await start(broker)
    page, response, complaints = await watched_page(browser, base)
    policy = await browser.run(response.header_value, "content-security-policy")
    assert policy == PAGE_POLICY.decode() and "unsafe" not in policy
    await browser.run(page.click, "#sessions th[data-sort=peer] button")
    await browser.run(page.fill, "#topics-filter", "x")
    await browser.run(wait_updates, page, 1)
    assert not [text for text in complaints
                if "Content Security Policy" in text or "Error" in text.split(":")[0]]
    icon = await browser.run(page.get_attribute, "link[rel=icon]", "href")
    assert icon == "/favicon.ico"


# From the page's own context, as a script slipped into it would: a WebSocket and a fetch to
# another origin (127.0.0.2, the same port), and a WebSocket to the page's own broker. What the
# policy refuses is reported as `securitypolicyviolation` events.
REACH_OUT = """async ([elsewhere, own]) => {
  window.refused = [];
  document.addEventListener('securitypolicyviolation', (event) => window.refused.push(
    `${event.effectiveDirective} ${event.blockedURI}`));
  for (const url of [`ws://${elsewhere}/websmq`, `wss://${elsewhere}/websmq`]) {
    try { new WebSocket(url); } catch (error) { window.refused.push(`threw ${url}`); }
  }
  await fetch(`http://${elsewhere}/api/whoami`).catch(() => null);
  return await new Promise((resolve) => {
    const socket = new WebSocket(own);
    socket.onopen = () => { socket.close(); resolve('open'); };
    socket.onerror = () => resolve('refused');
  });
}"""


@pytest_twisted.ensureDeferred
async def test_the_page_may_reach_only_its_own_broker(broker: Broker, browser: Browser) -> None:
    service, addresses, base = await start(broker)
    client = await broker.client(addresses["websmq+length32"])
    page, response, complaints = await watched_page(browser, base)
    port = base.rsplit(":", 1)[1]
    own = await browser.run(page.evaluate, REACH_OUT, [f"127.0.0.2:{port}",
                                                       addresses["websmq+ws"]])
    assert own == "open"  # 'self' is the page's own origin, ws: included
    # Reported in the order tried: the fetch's last.
    await browser.run(lambda: page.wait_for_function(
        "() => window.refused.some((refusal) => refusal.endsWith('/api/whoami'))"))
    refused = sorted(await browser.run(page.evaluate, "() => window.refused"))
    assert refused == [f"connect-src http://127.0.0.2:{port}/api/whoami",
                       f"connect-src ws://127.0.0.2:{port}/websmq",
                       f"connect-src wss://127.0.0.2:{port}/websmq"], refused

    # The page itself goes on: its tap, its forms.
    await browser.run(tap, page, "reach/#")
    result = await browser.run(submit, page, "publish", {"topic": "reach/page", "payload": "hi"})
    assert result.startswith("delivered to ")
    assert "hi" in await browser.run(tapped_line, page, "reach/page")
    await wait_for(client.publish("reach/client", b"from a client"))
    assert "from a client" in await browser.run(tapped_line, page, "reach/client")
    result = await browser.run(submit, page, "call", {
        "protocol": "nydus", "name": "/_hub/publish",
        "body": '{"path": "/reach/call", "data": "called"}'})
    assert result.startswith("ok: ")
    assert "called" in await browser.run(tapped_line, page, "reach/call")
    await browser.run(wait_updates, page, 1)
    assert not [text for text in complaints if "Content Security Policy" in text
                and "127.0.0.2" not in text]


@pytest_twisted.ensureDeferred
async def test_the_page_finds_everything_it_asks_for(broker: Broker, browser: Browser) -> None:
    service, addresses, base = await start(broker)
    page, response, complaints = await watched_page(browser, base)
    await browser.run(page.focus, "#call [name=name]")  # asks for the routes
    icon = await browser.run(page.request.get, base + "/favicon.ico")
    assert icon.status == 200
    await browser.run(wait_updates, page, 1)
    assert complaints == []


class Markup(HTMLParser):
    """What in the page's HTML would need 'unsafe-inline': inline scripts, styles, handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.inline: list[str] = []
        self.scripts: list[str] = []
        self.in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        if tag == "style" or "style" in names or any(name.startswith("on") for name in names):
            self.inline.append(self.get_starttag_text() or tag)
        if tag == "script":
            self.scripts.append(names.get("src") or "")
            self.in_script = True

    def handle_endtag(self, tag: str) -> None:
        self.in_script = self.in_script and tag != "script"

    def handle_data(self, data: str) -> None:
        if self.in_script and data.strip():
            self.inline.append(data)


def test_the_page_has_no_inline_script_or_style_and_never_parses_markup() -> None:
    folder = resources.files("wireproto.admin").joinpath("static", "ui")
    markup = Markup()
    markup.feed(folder.joinpath("index.html").read_text())
    assert markup.inline == [] and markup.scripts == ["/ui/page.js"]
    scripts = [name for name in PAGE_FILES if name.endswith(".js")]
    for name in scripts:
        source = folder.joinpath(name).read_text()
        # Text from the broker goes in as text: nothing here turns a string into markup or code.
        assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|"
                             r"new Function|\.style\b|setAttribute\(\"style", source), name
        for imported in re.findall(r'from "\./([\w.]+)"', source):
            assert imported in PAGE_FILES, (name, imported)  # served, so the page can load it
    # Every script and style sheet there is served.
    assert {path.name for path in folder.iterdir()
            if path.name.endswith((".js", ".css"))} == set(PAGE_FILES)


HIDE = """hidden => {
  Object.defineProperty(document, 'hidden', { value: hidden, configurable: true });
  document.dispatchEvent(new Event('visibilitychange'));
}"""


@pytest_twisted.ensureDeferred
async def test_a_tab_not_shown_asks_nothing_until_it_is_shown(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker)
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    await browser.run(wait_updates, page, 1)
    made = await browser.run(api_requests, page)
    await browser.run(page.evaluate, HIDE, True)  # as the browser says when the tab is behind
    await browser.run(page.wait_for_timeout, QUIET_SECONDS * 1000)
    assert len(made) <= 1, made  # at most the poll under way
    asked = len(made)
    await browser.run(page.evaluate, HIDE, False)
    await browser.run(wait_updates, page, 2)
    # It catches up: the charts' history of what it missed, and the status again.
    paths = [url.split("/api/")[1].split("?")[0] for url in made[asked:]]
    assert "history" in paths and paths.count("status") >= 2


OFFERED = "() => [...document.querySelectorAll('#call-names option')].map(option => option.value)"


@pytest_twisted.ensureDeferred
async def test_the_call_form_offers_what_the_broker_answers(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker)
    service.server("ubre").handle("add", lambda body, caller: sum(body))
    service.server("nydus").register_route("/hello/:name", lambda call: "hello")
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    await browser.run(page.focus, "#call [name=name]")
    await browser.run(lambda: page.wait_for_function(f"() => ({OFFERED})().includes('add')"))
    assert await browser.run(page.get_attribute, "#call [name=name]", "list") == "call-names"
    await browser.run(page.select_option, "#call [name=protocol]", "nydus")
    offered = await browser.run(page.evaluate, OFFERED)
    assert "/hello/:name" in offered and "/_hub/publish" in offered and "add" not in offered


LABELS = ("() => Object.fromEntries([...document.querySelectorAll('#call-names option')]"
          ".map(option => [option.value, option.getAttribute('label')]))")


@pytest_twisted.ensureDeferred
async def test_the_call_form_does_not_call_a_routes_template_as_a_path(
    broker: Broker, browser: Browser,
) -> None:
    """A nydus route is offered as written (`/rooms/:room/join`); sent as it is, its handler
    would run with the room ":room". The form labels templates and says what to fill in."""
    service, addresses, base = await start(broker)
    nydus = service.server("nydus")
    called: list[Any] = []
    nydus.register_route("/rooms/:room/join",
                         lambda call: called.append(call.params["room"]) or "joined")
    nydus.register_route("/files/*", lambda call: called.append(call.splats) or "file")
    nydus.register_route("/a+b", lambda call: called.append(call.path) or "ab")
    page = await open_page(browser, base)
    await browser.run(broker_shown, page)
    await browser.run(page.select_option, "#call [name=protocol]", "nydus")
    await browser.run(page.focus, "#call [name=name]")
    await browser.run(lambda: page.wait_for_function(f"() => ({OFFERED})().includes('/a+b')"))
    labels = await browser.run(page.evaluate, LABELS)
    assert labels["/rooms/:room/join"] == "template: replace :room"
    assert labels["/files/*"] == "template: replace *"
    assert labels["/a+b"] == "pattern: write a path it matches"
    assert labels["/_hub/publish"] is None

    for name, hole in [("/rooms/:room/join", ":room"), ("/files/*", "*"),
                       ("/rooms/:room/leave", ":room")]:
        result = await browser.run(submit, page, "call",
                                   {"protocol": "nydus", "name": name, "body": ""})
        assert result.startswith(f"not sent: replace {hole} in {name}"), result
    result = await browser.run(submit, page, "call",
                               {"protocol": "nydus", "name": "/a+b", "body": ""})
    assert result.startswith("not sent: /a+b is a route written as a regular expression"), result
    assert called == []

    # Filled in, each is called; a regular expression's path, too, and the pattern itself when
    # sent again (the broker says it matches nothing).
    for name, answer in [("/rooms/lobby/join", 'ok: "joined"'), ("/files/a/b.txt", 'ok: "file"'),
                         ("/aab", 'ok: "ab"')]:
        result = await browser.run(submit, page, "call",
                                   {"protocol": "nydus", "name": name, "body": ""})
        assert result == answer, (name, result)
    result = await browser.run(submit, page, "call",
                               {"protocol": "nydus", "name": "/a+b", "body": ""})
    assert result.startswith("not sent:"), result
    result = await browser.run(submit, page, "call",
                               {"protocol": "nydus", "name": "/a+b", "body": ""})
    assert result.startswith("failed:") and "404" in result, result
    assert called == ["lobby", ["a/b.txt"], "/aab"]
