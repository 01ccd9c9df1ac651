"""The admin API on a real broker, over real HTTP: what it shows, what it does, and who may."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.admin.http import http, open_tap, start
from tests.brokers import Broker
from tests.support import Inbox, eventually, wait_for
from wireproto.admin import AdminSettings
from wireproto.admin.gate import is_local_address
from wireproto.hub import HubSettings
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.websmq.client import connect as websmq_connect
from wireproto.transports import WebSocketOptions


@pytest_twisted.ensureDeferred
async def test_status_shows_listeners_sessions_topics_rates_and_last_values(
    broker: Broker,
) -> None:
    service, addresses, base = await start(broker, hub=HubSettings(retain=("sensors/#",)))
    subscriber = await broker.client(addresses["websmq+ws"])
    inbox = Inbox()
    await wait_for(subscriber.subscribe("sensors/temp", inbox))
    publisher = await broker.client(addresses["websmq+length32"])
    for _ in range(5):
        await wait_for(publisher.publish("sensors/temp", b'{"c": 21.5}'))
    await inbox.wait(5)
    service.admin.rates.sample()

    status = (await http(base, "/api/status")).json
    assert {(entry["protocol"], entry["transport"]) for entry in status["listeners"]} == {
        ("websmq", "ws"), ("ubre", "ws"), ("nydus", "engineio"), ("websmq", "length32")}
    sessions = {session["transport"]: session for session in status["sessions"]}
    assert sessions["ws"]["protocol"] == "websmq"
    assert sessions["ws"]["subscriptions"] == ["sensors/temp"]
    assert sessions["ws"]["sent"] == 5
    assert sessions["length32"]["received"] == 5
    (topic,) = [entry for entry in status["topics"] if entry["topic"] == "sensors/temp"]
    assert topic["subscribers"] == 1
    assert topic["last_value"] == {"size": 11, "json": {"c": 21.5}, "text": '{"c": 21.5}'}
    assert status["broker"]["published"] == 5
    assert status["broker"]["retained"] == 1

    one = (await http(base, f"/api/sessions/{sessions['ws']['id']}")).json
    assert one["peer"] == sessions["ws"]["peer"]
    assert (await http(base, "/api/sessions/999999")).status == 404
    assert (await http(base, "/api/no/such/thing")).status == 404


@pytest_twisted.ensureDeferred
async def test_a_last_value_is_shown_as_sent_as_the_tap_shows_it(broker: Broker) -> None:
    """Text with a format character (a direction override) was shown as hex, where the tap
    showed the same payload as text."""
    service, addresses, base = await start(broker, hub=HubSettings(retain=("kept/#",)))
    response, reader = await open_tap(base, "kept/#")
    await eventually(lambda: reader.lines)
    publisher = await broker.client(addresses["websmq+length32"])
    sent = {
        "rtl": "<b>bold</b><script>alert(2)</script>\u202eRTL".encode(),
        "controls": b"\x00\x1b[2J\x07bell",
        "json": b'{"c": 234e-1}',
        "bytes": b"\xff\xfe",
        "long": "\u00e9".encode() * 600,
    }
    for name, payload in sent.items():
        await wait_for(publisher.publish(f"kept/{name}", payload))
    await eventually(lambda: len(reader.lines) == 1 + len(sent))
    response._transport.stopProducing()
    topics = (await http(base, "/api/topics?q=kept/")).json["items"]
    shown = {row["topic"].split("/")[1]: row["last_value"] for row in topics}
    tapped = {line["topic"].split("/")[1]: line for line in reader.lines[1:]}
    assert shown["rtl"] == {"size": len(sent["rtl"]), "text": sent["rtl"].decode()}
    assert shown["controls"] == {"size": 10, "text": sent["controls"].decode()}
    assert shown["json"] == {"size": 13, "json": {"c": 23.4}, "text": '{"c": 234e-1}'}
    assert shown["bytes"] == {"size": 2, "hex": "fffe"}
    # Over the 1024 bytes shown, its start, to a whole character.
    assert shown["long"] == {"size": 1200, "text": "\u00e9" * 512, "truncated": True}
    for name in sent:  # the tap shows more of a long one: 16 KiB
        assert tapped[name].get("text", "").startswith(shown[name].get("text", "")), name
        assert tapped[name].get("hex", "").startswith(shown[name].get("hex", "")), name


@pytest_twisted.ensureDeferred
async def test_topic_rates_are_publishes_per_second(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    publisher = await broker.client(addresses["websmq+length32"])
    rates = service.admin.rates
    rates.sample()
    for _ in range(30):
        await wait_for(publisher.publish("busy", b"x"))
    await eventually(lambda: service.hub.topic_counts.get("busy") == 30)
    rates._last_time -= 2.0  # as if the 30 publishes came over 2 s and more
    rates.sample()
    (topic,) = [entry for entry in (await http(base, "/api/topics")).json["items"]
                if entry["topic"] == "busy"]
    assert 0 < topic["rate"] <= 15
    rates.sample()  # quiet since, and no subscriber: forgotten
    assert "busy" not in service.hub.topic_counts


@pytest_twisted.ensureDeferred
async def test_counted_topics_are_bounded(broker: Broker) -> None:
    service, addresses, base = await start(broker, admin=AdminSettings(max_counted_topics=3))
    publisher = await broker.client(addresses["websmq+length32"])
    for number in range(10):
        await wait_for(publisher.publish(f"t{number}", b"x"))
    await eventually(lambda: service.hub.stats.published == 10)
    assert len(service.hub.topic_counts) == 3
    assert service.hub.uncounted_publishes == 7


@pytest_twisted.ensureDeferred
async def test_closing_a_session_closes_it_and_publishes_its_will(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    watcher = await broker.client(addresses["websmq+length32"])
    wills = Inbox()
    await wait_for(watcher.subscribe("clients/doomed", wills))
    doomed = await wait_for(websmq_connect(reactor, addresses["websmq+ws"]))
    await wait_for(doomed.set_will("clients/doomed", b"gone"))
    await eventually(lambda: any(s.will for s in service.hub.sessions))
    (session,) = [s for s in service.hub.sessions if s.will is not None]

    answer = await http(base, f"/api/sessions/{session.id}/close", {})
    assert answer.status == 200 and answer.json == {"closed": session.id}
    await wait_for(doomed.when_closed())
    (will,) = await wills.wait()
    assert will.payload == b"gone"
    assert session not in service.hub.sessions
    assert (await http(base, f"/api/sessions/{session.id}/close", {})).status == 404


@pytest_twisted.ensureDeferred
async def test_publish_from_the_api_reaches_a_tcp_subscriber(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    subscriber = await broker.client(addresses["websmq+length32"])
    inbox = Inbox()
    await wait_for(subscriber.subscribe("news", inbox))
    for payload, encoding, expected in [("hello", "text", b"hello"),
                                        ({"a": [1, 2]}, "json", b'{"a":[1,2]}'),
                                        ("00ff", "hex", b"\x00\xff"),
                                        ("AAE=", "base64", b"\x00\x01")]:
        answer = await http(base, "/api/publish",
                            {"topic": "news", "payload": payload, "encoding": encoding})
        assert answer.json == {"delivered": 1, "processes": 1}
        (message,) = await inbox.wait()
        assert message.payload == expected
        inbox.messages.clear()


@pytest_twisted.ensureDeferred
async def test_a_publishs_delivered_counts_connections_not_taps(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    subscriber = await broker.client(addresses["websmq+length32"])
    inbox = Inbox()
    await wait_for(subscriber.subscribe("news", inbox))
    taps = [await open_tap(base, pattern) for pattern in ("#", "news")]
    for _, reader in taps:
        await eventually(lambda reader=reader: reader.lines)
    answer = await http(base, "/api/publish", {"topic": "news", "payload": "1"})
    assert answer.json == {"delivered": 1, "processes": 1}
    called = await http(base, "/api/call", {"protocol": "nydus", "name": "/_hub/publish",
                                            "body": {"path": "/news", "data": 2}})
    assert called.json["body"]["delivered"] == 1, called.json
    for _, reader in taps:  # the taps got both, and are not counted
        await eventually(lambda reader=reader: len(reader.lines) == 3)
    assert service.hub.stats.delivered == 2 + 4
    for response, _ in taps:
        response._transport.stopProducing()
    await eventually(lambda: not service.admin.api.taps)


@pytest.mark.parametrize("body, status, error", [
    ({"payload": "x"}, 400, "topic"),
    ({"topic": "a/#", "payload": "x"}, 400, "pattern"),
    ({"topic": "$SYS/broker/uptime", "payload": "1"}, 403, "broker's own"),
    ({"topic": "a", "payload": "zz", "encoding": "hex"}, 400, "not hex"),
    ({"topic": "a", "payload": "x", "encoding": "rot13"}, 400, "encoding"),
    ({"topic": "x" * 2000, "payload": "x"}, 400, "characters"),
])
@pytest_twisted.ensureDeferred
async def test_a_bad_publish_is_refused_with_a_clear_error(
    broker: Broker, body: dict, status: int, error: str,
) -> None:
    service, addresses, base = await start(broker)
    answer = await http(base, "/api/publish", body)
    assert answer.status == status
    assert error in answer.json["error"]
    assert service.hub.stats.published == 0


@pytest_twisted.ensureDeferred
async def test_a_post_another_page_could_make_is_refused(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    form = await http(base, "/api/publish", raw=b"topic=a&payload=x",
                      headers={"content-type": "application/x-www-form-urlencoded"})
    assert form.status == 415
    elsewhere = await http(base, "/api/publish", {"topic": "a", "payload": "x"},
                           headers={"origin": "http://evil.example"})
    assert elsewhere.status == 403 and "origin" in elsewhere.json["error"]
    not_json = await http(base, "/api/publish", raw=b"{nope")
    assert not_json.status == 400 and "not JSON" in not_json.json["error"]
    port = base.rsplit(":", 1)[1]
    own = await http(base, "/api/publish", {"topic": "a", "payload": "x"},
                     headers={"origin": f"http://127.0.0.1:{port}"})
    assert own.status == 200
    assert service.hub.stats.published == 1


@pytest_twisted.ensureDeferred
async def test_a_page_elsewhere_cannot_use_the_api_at_all(broker: Broker) -> None:
    # Sixteen taps opened by a page elsewhere, through a browser on this machine, took every
    # tap slot; a GET needs no preflight, so its answer need not be readable to do harm.
    service, addresses, base = await start(broker)
    port = base.rsplit(":", 1)[1]
    for _ in range(16):
        response, _reader = await open_tap(base, "#", {"origin": "http://evil.example"})
        assert response.code == 403
    assert not service.admin.api.taps
    for origin in ("null", f"http://127.0.0.1:{int(port) + 1}", f"https://127.0.0.1:{port}x"):
        refused = await http(base, "/api/status", headers={"origin": origin})
        assert refused.status == 403 and "origin" in refused.json["error"], origin
    own = await http(base, "/api/status", headers={"origin": f"http://127.0.0.1:{port}"})
    assert own.status == 200
    assert (await http(base, "/api/status")).status == 200  # no Origin: curl, a script
    response, reader = await open_tap(base, "#", {"origin": f"http://127.0.0.1:{port}"})
    assert response.code == 200
    await eventually(lambda: reader.lines == [{"tap": "#"}])
    response._transport.stopProducing()


@pytest_twisted.ensureDeferred
async def test_a_page_elsewhere_cannot_open_taps_through_requests_without_an_origin(
        broker: Broker) -> None:
    # An <img>, a <script> or a no-cors fetch sends a GET without an Origin header; the
    # browser still says where it comes from.
    service, addresses, base = await start(broker)
    port = base.rsplit(":", 1)[1]
    elsewhere = [{"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors",
                  "referer": "https://evil.example/"},
                 {"sec-fetch-site": "same-site"},
                 {"referer": "https://evil.example/page"}]  # a browser without Fetch Metadata
    for headers in elsewhere * 6:
        response, _reader = await open_tap(base, "#", headers)
        assert response.code == 403, headers
    assert not service.admin.api.taps
    own_page = [{"sec-fetch-site": "same-origin", "referer": f"http://127.0.0.1:{port}/"},
                {"sec-fetch-site": "none"}, {"referer": f"http://127.0.0.1:{port}/"}]
    for headers in own_page:
        assert (await http(base, "/api/status", headers=headers)).status == 200, headers


@pytest_twisted.ensureDeferred
async def test_an_allowed_origin_may_read_the_api_but_change_nothing(broker: Broker) -> None:
    # A broker behind a proxy: its page's origin is not the Host the broker sees.
    service, addresses, base = await start(
        broker, websocket=WebSocketOptions(allowed_origins=("https://broker.example:*",)))
    proxied = {"origin": "https://broker.example"}
    assert (await http(base, "/api/status", headers=proxied)).status == 200
    elsewhere = await http(base, "/api/status", headers={"origin": "https://app.example"})
    assert elsewhere.status == 403
    publish = await http(base, "/api/publish", {"topic": "a", "payload": "x"}, headers=proxied)
    assert publish.status == 403 and service.hub.stats.published == 0


@pytest_twisted.ensureDeferred
async def test_without_auth_only_a_loopback_host_name_is_answered(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    port = base.rsplit(":", 1)[1]
    rebound = await http(base, "/api/status", headers={"host": f"attacker.example:{port}"})
    assert rebound.status == 403 and "loopback" in rebound.json["error"]
    assert (await http(base, "/api/status", headers={"host": f"localhost:{port}"})).status == 200
    assert (await http(base, "/api/status", headers={"host": f"[::1]:{port}"})).status == 200


def test_only_loopback_and_unix_peers_are_local() -> None:
    from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress

    assert is_local_address(IPv4Address("TCP", "127.0.0.1", 1))
    assert is_local_address(IPv6Address("TCP", "::1", 1))
    assert is_local_address(UNIXAddress(b"/tmp/x"))
    assert not is_local_address(IPv4Address("TCP", "192.168.1.5", 1))
    assert not is_local_address(IPv6Address("TCP", "2001:db8::1", 1))


@pytest_twisted.ensureDeferred
async def test_calls_reach_a_ubre_handler_and_a_nydus_route(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    ubre = service.server("ubre")
    callers = []

    def add(body: Any, caller: Any) -> int:
        callers.append(caller)
        return sum(body)

    ubre.handle("add", add)
    service.server("nydus").register_route("/double/:n", lambda call: int(call.params["n"]) * 2)

    answer = await http(base, "/api/call", {"protocol": "ubre", "name": "add", "body": [1, 2]})
    assert answer.json == {"ok": True, "body": 3}
    assert callers[0].protocol == "admin" and callers[0].principal.name == "local"
    answer = await http(base, "/api/call", {"protocol": "nydus", "name": "/double/21"})
    assert answer.json == {"ok": True, "body": 42}
    answer = await http(base, "/api/call", {"protocol": "ubre", "name": "missing"})
    assert answer.json == {"ok": False, "body": "NotFound"}
    answer = await http(base, "/api/call", {"protocol": "nydus", "name": "/nowhere"})
    assert answer.json["ok"] is False and answer.json["body"]["status"] == 404
    answer = await http(base, "/api/call", {"protocol": "smtp", "name": "x"})
    assert answer.status == 400


@pytest_twisted.ensureDeferred
async def test_a_tap_shows_messages_as_they_pass_decoded(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    response, reader = await open_tap(base, "sensors/+")
    assert response.code == 200
    await eventually(lambda: reader.lines == [{"tap": "sensors/+"}])
    publisher = await broker.client(addresses["websmq+length32"])
    ubre = await wait_for(ubre_connect(reactor, addresses["ubre+ws"]))
    try:
        await wait_for(publisher.publish("sensors/a", b'{"c": 1}'))
        await wait_for(publisher.publish("sensors/b", msgpack.packb({"c": 2})))
        await wait_for(publisher.publish("sensors/c", b"\xff\xfe"))
        await wait_for(publisher.publish("other", b"not tapped"))
        ubre.publish("sensors/d", "hello")
        await eventually(lambda: len(reader.lines) == 5)
    finally:
        await wait_for(ubre.close())
    shown = {line["topic"]: line for line in reader.lines[1:]}
    assert shown["sensors/a"]["json"] == {"c": 1}
    assert shown["sensors/a"]["protocol"] == "websmq"
    assert shown["sensors/b"]["msgpack"] == {"c": 2}
    assert shown["sensors/c"]["hex"] == "fffe"
    assert shown["sensors/d"]["json"] == "hello"
    assert shown["sensors/d"]["protocol"] == "ubre"
    assert "other" not in shown
    response._transport.stopProducing()
    await wait_for(reader.done)
    await eventually(lambda: not service.admin.api.taps)
    assert service.hub.subscriber_counts() == {}


@pytest_twisted.ensureDeferred
async def test_a_plus_or_hash_that_is_no_wildcard_is_published_and_tapped_as_a_topic(
    broker: Broker,
) -> None:
    # The hub and every protocol take these for topics (docs/hub.md); so does the API.
    topics = ("tt/a+b", "tt/x#", "tt/#/x")
    service, addresses, base = await start(broker)
    seen: list[str] = []
    service.hub.subscribe_callback("#", lambda message: seen.append(message.topic))
    taps = [await open_tap(base, topic) for topic in topics]
    for (response, reader), topic in zip(taps, topics, strict=True):
        assert response.code == 200, topic
        await eventually(lambda reader=reader, topic=topic: reader.lines == [{"tap": topic}])
    for topic in topics:
        answer = await http(base, "/api/publish", {"topic": topic, "payload": topic})
        assert answer.status == 200, (topic, answer.json)
    await eventually(lambda: seen == list(topics))
    for (response, reader), topic in zip(taps, topics, strict=True):
        # Each tap is on its one topic: no other of the three reaches it.
        await eventually(lambda reader=reader: len(reader.lines) >= 2)
        assert [(line["topic"], line["text"]) for line in reader.lines[1:]] == [(topic, topic)]
        response._transport.stopProducing()
    await eventually(lambda: not service.admin.api.taps)


@pytest_twisted.ensureDeferred
async def test_a_tap_that_is_not_read_skips_messages_rather_than_holding_them(
    broker: Broker,
) -> None:
    service, addresses, base = await start(broker)
    response, reader = await open_tap(base, "#")
    await eventually(lambda: reader.lines)
    response._transport.pauseProducing()  # the reader stops reading
    publisher = service.server("ubre")
    payload = "x" * 16_000
    for _ in range(2000):
        publisher.publish("flood", payload)
    (tap,) = service.admin.api.taps
    assert tap.skipped > 0
    assert tap.shown * 16_000 < 8 << 20  # nowhere near the 32 MB published
    response._transport.resumeProducing()
    await eventually(lambda: any("skipped" in line for line in reader.lines), timeout=20)
    response._transport.stopProducing()


@pytest_twisted.ensureDeferred
async def test_taps_are_bounded(broker: Broker) -> None:
    service, addresses, base = await start(broker, admin=AdminSettings(max_taps=2))
    opened = [await open_tap(base, "#") for _ in range(2)]
    third = await http(base, "/api/tap?pattern=%23")
    assert third.status == 503 and "max_taps" in third.json["error"]
    bad = await http(base, "/api/tap?pattern=a%2F%23%2F%2B")  # a/#/+
    assert bad.status in (400, 503)
    for response, _ in opened:
        response._transport.stopProducing()
    await eventually(lambda: not service.admin.api.taps)
    bad = await http(base, "/api/tap?pattern=a%2F%23%2F%2B")
    assert bad.status == 400 and "'#' must be a whole level" in bad.json["error"]


@pytest_twisted.ensureDeferred
async def test_the_page_and_the_clients_are_served_from_the_package(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    page = await http(base, "/")
    assert page.status == 200 and b"<title>wireproto</title>" in page.body
    assert "script-src 'self'" in page.header("content-security-policy")
    for path in ("/ui/page.js", "/ui/page.css", "/js/websmq.js", "/js/ubre.js", "/js/socket.js"):
        assert (await http(base, path)).status == 200, path
    for path in ("/js/", "/js/../setup.cfg", "/ui/index.html/x", "/js/nothing.js"):
        assert (await http(base, path)).status == 404, path


@pytest_twisted.ensureDeferred
async def test_a_page_elsewhere_may_import_the_clients_and_read_nothing_else(
    broker: Broker,
) -> None:
    service, addresses, base = await start(broker)
    elsewhere = {"origin": "https://app.example"}
    for path in ("/js/websmq.js", "/js/ubre.js", "/js/socket.js"):
        client = await http(base, path, headers=elsewhere)
        assert client.status == 200, path
        assert client.header("access-control-allow-origin") == "*", path
        assert client.header("access-control-allow-credentials") is None
    for path in ("/", "/ui/page.js", "/api/status", "/engine.io/?EIO=4&transport=polling"):
        answer = await http(base, path, headers=elsewhere)
        assert answer.header("access-control-allow-origin") is None, path


@pytest_twisted.ensureDeferred
async def test_admin_disabled_serves_no_page_and_no_api(broker: Broker) -> None:
    service, addresses, base = await start(broker, admin=AdminSettings(enabled=False))
    assert (await http(base, "/")).status == 404
    assert (await http(base, "/api/status")).status == 404


@pytest_twisted.ensureDeferred
async def test_a_call_that_is_never_answered_gets_504(broker: Broker, monkeypatch) -> None:
    from twisted.internet import defer

    from wireproto.admin import api

    monkeypatch.setattr(api, "CALL_TIMEOUT", 0.2)
    service, addresses, base = await start(broker)
    never: defer.Deferred = defer.Deferred()
    service.server("ubre").handle("stuck", lambda body, caller: never)
    answer = await http(base, "/api/call", {"protocol": "ubre", "name": "stuck"})
    assert answer.status == 504 and "no answer" in answer.json["error"]
