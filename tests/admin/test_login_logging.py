"""What refused admin logins write to the log: a request without credentials (the status page
asking whether to show its login form, a form left open) is no warning; refused credentials are,
but one line per peer address a minute, the rest counted in the next line, so a flood of wrong
passwords from one address, or of bad tokens from many, cannot flood the log.

Real HTTP against a real broker with [auth], from real addresses (127.0.0.N); the minutes of
the many-peers bound run on twisted's Clock."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.logger import LogLevel, globalLogPublisher

from tests.access.conftest import AuthFiles, basic, http_handshake
from tests.admin.http import base_of, http
from tests.brokers import LOCAL, Broker
from tests.support import eventually, wait_for
from wireproto.admin import refusals
from wireproto.admin.refusals import MAX_PEERS, RefusedLogins
from wireproto.authentication import AuthSettings
from wireproto.transports.http import HTTPRefusal

REFUSALS = ("auth_failed", "auth_failed_not_logged")


@pytest.fixture
def events() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(seen.append)
    try:
        yield seen
    finally:
        globalLogPublisher.removeObserver(seen.append)


def warnings(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event for event in events
            if event.get("event") in REFUSALS and event["log_level"] >= LogLevel.warn]


def refused_in_all(events: list[dict[str, Any]]) -> int:
    """The refusals the warnings account for: each line's own, and the counts of those held."""
    return sum(event.get("count", 1) for event in warnings(events))


async def start(broker: Broker, files: AuthFiles) -> tuple[Any, str]:
    auth = AuthSettings(enabled=True, jwt_algorithms=("HS256",),
                        jwt_secret_file=str(files.secret), password_file=str(files.passwords))
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}", auth=auth)
    return service, base_of(bound[0].address)


@pytest_twisted.ensureDeferred
async def test_a_request_without_credentials_is_no_warning(
    broker: Broker, auth_files: AuthFiles, events: list[dict[str, Any]],
) -> None:
    service, base = await start(broker, auth_files)
    for headers in ({"x-wireproto-page": "1"}, {}) * 10:  # the page's polls, and curl's
        assert (await http(base, "/api/status", headers=headers)).status == 401
    quiet = [event for event in events if event.get("event") == "auth_failed"]
    assert len(quiet) == 20
    assert {event["log_level"] for event in quiet} == {LogLevel.debug}
    assert {event["reason"] for event in quiet} == {"missing"}
    # A listener's own handshake without credentials is a warning as it was.
    assert (await http_handshake(int(base.rsplit(":", 1)[1]), "/websmq")).status == 401
    assert any(event.get("event") == "auth_failed" and event["log_level"] == LogLevel.warn
               for event in events)


@pytest_twisted.ensureDeferred
async def test_a_flood_of_wrong_passwords_is_one_warning_and_a_count(
    broker: Broker, auth_files: AuthFiles, events: list[dict[str, Any]],
) -> None:
    service, base = await start(broker, auth_files)
    sent = 120
    for number in range(sent):
        answer = await http(base, "/api/status",
                            headers={"authorization": basic("carol", f"guess {number}")})
        assert answer.status in (401, 503)
    (line,) = warnings(events)  # the first; the others are held
    assert line["event"] == "auth_failed" and line["reason"] == "bad_password"
    assert "guess" not in repr(events)  # and no password, ever
    await wait_for(service.stopService(), 10)  # says what it held
    lines = warnings(events)
    assert [event["event"] for event in lines] == list(REFUSALS)
    assert lines[1]["count"] == sent - 1 and lines[1]["peer"] == "127.0.0.1"
    assert refused_in_all(events) == sent


@pytest_twisted.ensureDeferred
async def test_a_peer_gets_one_line_a_minute_with_the_count_of_the_rest(
    broker: Broker, auth_files: AuthFiles, events: list[dict[str, Any]], monkeypatch,
) -> None:
    monkeypatch.setattr(refusals, "PERIOD", 1.0)  # a minute, shortened
    service, base = await start(broker, auth_files)
    bad = {"authorization": "Bearer not-a-token"}
    sent = 0
    for _ in range(3):  # three periods of refusals and more
        for _ in range(5):
            assert (await http(base, "/api/status", headers=bad)).status == 401
            sent += 1
        await eventually(lambda sent=sent: refused_in_all(events) == sent, timeout=10)
    lines = warnings(events)
    assert lines[0]["event"] == "auth_failed" and lines[0]["reason"] != "missing"
    assert {event["event"] for event in lines[1:]} == {"auth_failed_not_logged"}
    times = [event["log_time"] for event in lines]
    assert all(later - earlier >= 0.9 for earlier, later in pairwise(times))
    await wait_for(service.stopService(), 10)
    assert refused_in_all(events) == sent


@pytest_twisted.ensureDeferred
async def test_bad_tokens_from_many_addresses_are_bounded(
    broker: Broker, auth_files: AuthFiles, events: list[dict[str, Any]],
) -> None:
    service, base = await start(broker, auth_files)
    port = int(base.rsplit(":", 1)[1])
    addresses = [f"127.0.0.{number}" for number in range(2, MAX_PEERS + 52)]
    for address in addresses:
        answer = await http_handshake(port, "/api/status", {"Authorization": "Bearer nothing"},
                                      websocket=False, source=address)
        assert answer.status == 401
    first = warnings(events)
    assert len(first) == MAX_PEERS + 1  # the peers followed, and one line for the others
    assert {event["peer"].split(":")[0] for event in first} == set(addresses[:MAX_PEERS + 1])
    await wait_for(service.stopService(), 10)
    (others,) = [event for event in warnings(events) if event["peer"] == "other addresses"]
    assert others["count"] == len(addresses) - MAX_PEERS - 1
    assert refused_in_all(events) == len(addresses)


def test_held_refusals_stay_bounded_over_many_minutes(events: list[dict[str, Any]]) -> None:
    clock = Clock()
    logins = RefusedLogins(clock, period=60)
    refusal = HTTPRefusal(401, "bad_password", "wrong user or password for 'x'")
    sent = 0
    for minute in range(30):
        for number in range(5_000):  # a new address each time, for half an hour
            logins.refused(IPv4Address("TCP", f"10.{minute}.{number // 250}.{number % 250}",
                                       5000), refusal)
            sent += 1
            assert len(logins._held) <= MAX_PEERS + 1
        clock.advance(60)
    per_minute = len(warnings(events)) / 30
    assert per_minute <= 2 * (MAX_PEERS + 1)  # each peer's line, and the others' count
    logins.stop()
    assert not clock.getDelayedCalls()
    assert refused_in_all(events) == sent
