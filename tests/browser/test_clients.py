"""Browser clients in headless Chromium: wireproto's own ES modules (/js/websmq.js, /js/ubre.js)
on the broker's page, and the real ubre.js and nydus-client, bundled for the browser with esbuild,
on a page of another origin that the broker allows."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.web.resource import Resource
from twisted.web.server import Site
from twisted.web.static import Data

from tests.admin.http import start
from tests.brokers import Broker
from tests.browser.conftest import Browser
from tests.support import Inbox, eventually, need_interop_peer, wait_for
from wireproto.transports.websocket import WebSocketOptions

INTEROP = Path(__file__).resolve().parents[1] / "interop"
BUNDLE_ENTRY = """
import Ubre from "ubre";
import nydusClient from "nydus-client";
window.Ubre = Ubre;
window.nydusClient = nydusClient;
"""


async def open_page(browser: Browser, url: str) -> Any:
    page = await browser.page()
    await browser.run(page.goto, url)
    return page


def ws_session(service: Any, protocol: str) -> Any:
    (session,) = [s for s in service.hub.sessions
                  if s.protocol == protocol and s.transport_name == "ws"]
    return session


@pytest_twisted.ensureDeferred
async def test_the_websmq_module_publishes_subscribes_leaves_a_will_and_comes_back(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker)
    python = await broker.client(addresses["websmq+length32"])
    from_browser, wills = Inbox(), Inbox()
    await wait_for(python.subscribe("from/browser", from_browser))
    await wait_for(python.subscribe("clients/tab", wills))
    page = await open_page(browser, base + "/")
    await browser.run(page.evaluate, """async (url) => {
        const { connect } = await import("/js/websmq.js");
        window.received = [];
        window.client = connect(url, { minDelay: 0.05, maxDelay: 0.2 });
        client.subscribe("to/browser", (message) => received.push(message.text()));
        client.setWill("clients/tab", "offline");
        await client.ready();
        client.publish("from/browser", { hello: "python" });
    }""", addresses["websmq+ws"])
    (message,) = await from_browser.wait()
    assert message.payload == b'{"hello":"python"}'
    await eventually(lambda: ws_session(service, "websmq").topics == {"to/browser"})
    await wait_for(python.publish("to/browser", b"hello browser"))
    await browser.run(page.wait_for_function, "() => received.includes('hello browser')")

    # The broker drops the tab: its will is published, and it comes back with its
    # subscription and its will.
    first = ws_session(service, "websmq")
    service.close_session(first, "the test")
    (will,) = await wills.wait()
    assert will.payload == b"offline"
    await eventually(lambda: [s for s in service.hub.sessions if s is not first
                              and s.topics == {"to/browser"} and s.will is not None])
    await wait_for(python.publish("to/browser", b"again"))
    await browser.run(page.wait_for_function, "() => received.includes('again')")
    # A second callback on the topic; the first taken away: still subscribed. Then the
    # second: unsubscribed.
    await browser.run(page.evaluate, """() => {
        window.cancel = client.subscribe("to/browser", (m) => received.push("2 " + m.text()));
        client.unsubscribe("to/browser", client.subscriptions.get("to/browser").values().next()
                           .value);
    }""")
    await wait_for(python.publish("to/browser", b"still"))  # still subscribed: it arrives
    await browser.run(page.wait_for_function, "() => received.includes('2 still')")
    assert not await browser.run(page.evaluate, "() => received.includes('still')")
    await browser.run(page.evaluate, "() => { cancel(); }")
    await eventually(lambda: not ws_session(service, "websmq").topics)
    checked = await browser.run(page.evaluate, """async () => {
        const { checkTopic, topicFromText } = await import("/js/websmq.js");
        let refused = null;
        try { checkTopic("has space"); } catch (error) { refused = error.name; }
        return [topicFromText("living room/temp"), refused];
    }""")
    assert checked == ["living%20room/temp", "TypeError"]


@pytest_twisted.ensureDeferred
async def test_the_ubre_module_requests_with_timeouts_and_resubscribes(
    broker: Broker, browser: Browser,
) -> None:
    service, addresses, base = await start(broker)
    ubre = service.server("ubre")
    ubre.handle("add", lambda body, caller: sum(body))
    never: defer.Deferred = defer.Deferred()
    ubre.handle("slow", lambda body, caller: never)
    python = await broker.client(addresses["websmq+length32"])
    from_browser = Inbox()
    await wait_for(python.subscribe("from/browser", from_browser))
    page = await open_page(browser, base + "/")
    answers = await browser.run(page.evaluate, """async (url) => {
        const { connect } = await import("/js/ubre.js");
        window.bodies = [];
        window.client = connect(url, { minDelay: 0.05, maxDelay: 0.2 });
        client.subscribe("news", (body, topic) => bodies.push([topic, body]));
        await client.ready();
        client.publish("from/browser", { n: 1 });
        const failed = (promise) => promise.then(() => "answered", (error) => error.body);
        return [await client.request("add", [1, 2]),
                await failed(client.request("nobody", null)),
                await failed(client.request("slow", null, { timeout: 0.3 }))];
    }""", addresses["ubre+ws"])
    assert answers == [3, "NotFound", "Timeout"]
    (message,) = await from_browser.wait()
    assert message.payload == b'{"n":1}'
    await eventually(lambda: ws_session(service, "ubre").topics == {"news"})
    await wait_for(python.publish("news", b'{"headline": 1}'))
    await browser.run(page.wait_for_function, "() => bodies.length === 1")

    first = ws_session(service, "ubre")
    service.close_session(first, "the test")
    await eventually(lambda: [s for s in service.hub.sessions
                              if s is not first and s.topics == {"news"}])
    await wait_for(python.publish("news", b"again"))
    bodies = await browser.run(page.evaluate, """async () => {
        const started = Date.now();
        while (bodies.length < 2 && Date.now() - started < 5000) {
            await new Promise((resolve) => setTimeout(resolve, 20));
        }
        return bodies;
    }""")
    assert bodies == [["news", {"headline": 1}], ["news", "again"]]
    never.callback("late")


@pytest.fixture(scope="module")
def reference_bundle(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The real ubre.js and nydus-client as one script for the browser, made by esbuild."""
    need_interop_peer(INTEROP / "node_modules" / "esbuild", "bundling the reference clients")
    out = tmp_path_factory.mktemp("bundle") / "bundle.js"
    subprocess.run(
        [str(INTEROP / "node_modules" / ".bin" / "esbuild"), "--bundle", "--format=iife",
         "--platform=browser", "--log-level=warning", f"--outfile={out}"],
        input=BUNDLE_ENTRY, text=True, cwd=INTEROP, check=True, timeout=120)
    return out.read_bytes()


async def serve_page(bundle: bytes) -> tuple[Any, str]:
    """A web server of its own (another origin than the broker's) with a page that loads the
    bundle."""
    root = Resource()
    root.putChild(b"", Data(b'<!doctype html><meta charset="utf-8"><title>app</title>'
                            b'<script src="/bundle.js"></script>', "text/html"))
    root.putChild(b"bundle.js", Data(bundle, "text/javascript"))
    port = reactor.listenTCP(0, Site(root), interface="127.0.0.1")
    return port, f"http://127.0.0.1:{port.getHost().port}"


NYDUS_SESSION = """async (url) => {
    const events = [];
    const client = nydusClient(url, { reconnectionAttempts: 1 });
    window.nydus = client;
    client.on("connect", () => {
        events.push("connect " + client.conn.transport.name);
        client.conn.on("upgrade", (transport) => events.push("upgrade " + transport.name));
    });
    client.on("error", (error) => events.push("error " + (error && error.message)));
    client.on("unauthorized", () => events.push("unauthorized"));
    client.on("disconnect", () => events.push("disconnect"));
    client.connect();
    const started = Date.now();
    while (!events.some((e) => !e.startsWith("connect")) && Date.now() - started < 8000) {
        await new Promise((resolve) => setTimeout(resolve, 20));
    }
    if (!events.some((e) => e.startsWith("upgrade"))) return { events };
    const answer = await client.invoke("/hello/browser", { from: "page" });
    return { events, answer };
}"""


@pytest_twisted.ensureDeferred
async def test_the_real_ubre_js_and_nydus_client_from_a_page_of_an_allowed_origin(
    broker: Broker, browser: Browser, reference_bundle: bytes,
) -> None:
    page_port, page_origin = await serve_page(reference_bundle)
    try:
        service, addresses, base = await start(
            broker, websocket=WebSocketOptions(allowed_origins=(page_origin,)))
        service.server("ubre").handle("add", lambda body, caller: sum(body))
        service.server("nydus").register_route(
            "/hello/:name", lambda call: {"hello": call.params["name"], "data": call.body})
        page = await open_page(browser, page_origin + "/")

        total = await browser.run(page.evaluate, """async (url) => {
            const socket = new WebSocket(url);
            const ubre = Ubre.ws(socket);
            await new Promise((resolve) => socket.addEventListener("open", resolve));
            return await ubre.request("add", [20, 22]);
        }""", addresses["ubre+ws"])
        assert total == 42

        nydus = await browser.run(page.evaluate, NYDUS_SESSION,
                                  addresses["nydus+engineio"].removesuffix("/engine.io/"))
        assert nydus["events"] == ["connect polling", "upgrade websocket"]
        assert nydus["answer"] == {"hello": "browser", "data": {"from": "page"}}
        (session,) = [s for s in service.hub.sessions if s.protocol == "nydus"]
        assert session.transport_name == "engineio"
    finally:
        await page_port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_page_of_another_origin_is_refused(
    broker: Broker, browser: Browser, reference_bundle: bytes,
) -> None:
    page_port, page_origin = await serve_page(reference_bundle)
    try:
        service, addresses, base = await start(
            broker, websocket=WebSocketOptions(allowed_origins=("https://app.example:443",)))
        page = await open_page(browser, page_origin + "/")
        refused = await browser.run(page.evaluate, """async (url) => {
            const socket = new WebSocket(url);
            return await new Promise((resolve) => {
                socket.onopen = () => resolve("open");
                socket.onclose = (event) => resolve("closed " + event.code);
            });
        }""", addresses["ubre+ws"])
        assert refused == "closed 1006"
        # engine.io-client's first request, a polling handshake: refused with 403, which
        # names no origin for the browser, so the page cannot even read that.
        handshake = await browser.run(page.evaluate, """async (url) => {
            try {
                return (await fetch(url + "?EIO=4&transport=polling")).status;
            } catch (error) {
                return error.name;
            }
        }""", addresses["nydus+engineio"])
        assert handshake == "TypeError"
        assert not service.hub.sessions
    finally:
        await page_port.stopListening()
