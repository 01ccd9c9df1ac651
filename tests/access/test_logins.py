"""Password logins under guessing, in a running broker on real sockets: a flood of wrong
passwords from some addresses neither denies nor delays a login from another, and past its
budget an address (or a user from one address) is answered at once, without scrypt.

The clients bind to other loopback addresses (127.0.0.2, ...): all of 127.0.0.0/8 is this host
on Linux, and the broker counts each as an address of its own."""

from __future__ import annotations

from itertools import count
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress

from tests.access.conftest import AuthFiles, basic, http_handshake
from tests.access.test_broker_access import start
from tests.support import eventually, wait_for
from wireproto.access.logins import (
    FailureTable,
    FairQueue,
    LoginThrottle,
    QueueFull,
)
from wireproto.peerlog import address_key

FLOODERS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
LEGITIMATE = "127.0.0.9"
# Small budgets, and a first delay no test outlasts.
LOGIN_LIMITS = {
    "failed_logins_per_address": 5,
    "failed_logins_per_user": 3,
    "failed_login_delay": 120.0,
    "max_pending_password_checks_per_address": 4,
}
CAROL = {"Authorization": basic("carol", "carol's password")}
# Users nobody has: each guess names another, as a guesser going through a list would.
UNKNOWN = (f"user{n}" for n in count())


async def metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    answer = await http_handshake(port, "/metrics", websocket=False)
    text = answer.raw.partition(b"\r\n\r\n")[2].decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


async def password_checks(port: int) -> float:
    return (await metrics(port))[("wireproto_password_checks_total", ())]


async def throttled(port: int, by: str) -> float:
    return (await metrics(port))[("wireproto_password_logins_throttled_total", (("by", by),))]


async def guess(port: int, source: str, user: str | None = None, password: str = "guess",
                timeout: float = 5.0) -> int:
    """Try a wrong password (by default for a user nobody has) from `source`."""
    user = next(UNKNOWN) if user is None else user
    answer = await http_handshake(port, "/websmq", {"Authorization": basic(user, password)},
                                  source=source, timeout=timeout)
    return answer.status


async def flood(port: int, source: str, statuses: list[int], stop: list[bool], *,
                workers: int, attempts: int) -> None:
    """`workers` clients at once from `source`, each guessing again as soon as it is answered,
    `attempts` times at most or until `stop` is set. An unknown user costs a full scrypt check."""

    async def worker() -> None:
        for _ in range(attempts):
            if stop:
                return
            try:
                statuses.append(await guess(port, source, timeout=30))
            except TimeoutError:
                statuses.append(0)

    await defer.gatherResults([defer.ensureDeferred(worker()) for _ in range(workers)])


@pytest_twisted.ensureDeferred
async def test_a_flood_of_wrong_passwords_neither_denies_nor_delays_a_login_from_elsewhere(
    broker: Any, auth_files: AuthFiles
) -> None:
    running = await start(broker, auth_files, **LOGIN_LIMITS)
    port = running.port("websmq")
    statuses: dict[str, list[int]] = {source: [] for source in FLOODERS}
    stop: list[bool] = []
    # 72 guesses in flight at once, more than max_pending_password_checks (64).
    floods = [defer.ensureDeferred(flood(port, source, statuses[source], stop, workers=18,
                                         attempts=20))
              for source in FLOODERS]
    try:
        # Flooding in earnest: every flooder has been answered, and guesses are turned away.
        await eventually(lambda: all(statuses.values())
                         and any(503 in answered for answered in statuses.values()), timeout=30)
        started = reactor.seconds()
        answer = await http_handshake(port, "/websmq", CAROL, source=LEGITIMATE, timeout=10)
        waited = reactor.seconds() - started
    finally:
        stop.append(True)
        await wait_for(defer.gatherResults(floods), timeout=120)
    assert answer.status == 101, answer.raw[:200]
    assert waited < 5, f"the login waited {waited:.1f} s behind the flood"
    assert all(set(answered) <= {401, 503} for answered in statuses.values()), statuses

    # Past its budget, an address is answered 401 at once and costs no scrypt check.
    flooder = FLOODERS[0]
    for _ in range(LOGIN_LIMITS["failed_logins_per_address"] + 2):
        if await throttled(port, "address"):
            break
        assert await guess(port, flooder) == 401
    else:
        raise AssertionError("the flooding address was never throttled")
    checks, refused = await password_checks(port), await throttled(port, "address")
    for _ in range(10):
        assert await guess(port, flooder) == 401
    assert await password_checks(port) == checks
    assert await throttled(port, "address") == refused + 10
    # Each flooding address had its budget and the checks already running when it ran out.
    threads = running.service.auth.settings.password_threads
    assert checks <= len(FLOODERS) * (LOGIN_LIMITS["failed_logins_per_address"] + threads) + 1
    # Not even the right password gets in from there before the delay passes; from elsewhere
    # it does.
    assert (await http_handshake(port, "/websmq", CAROL, source=flooder)).status == 401
    assert (await http_handshake(port, "/websmq", CAROL, source=LEGITIMATE)).status == 101


@pytest_twisted.ensureDeferred
async def test_a_user_guessed_from_one_address_is_throttled_there_and_nowhere_else(
    broker: Any, auth_files: AuthFiles
) -> None:
    running = await start(broker, auth_files, **LOGIN_LIMITS)
    port = running.port("websmq")
    guesser = "127.0.0.10"
    for _ in range(LOGIN_LIMITS["failed_logins_per_user"]):
        assert await guess(port, guesser, "carol") == 401
    checks = await password_checks(port)
    assert await guess(port, guesser, "carol") == 401
    assert (await http_handshake(port, "/websmq", CAROL, source=guesser)).status == 401
    assert await password_checks(port) == checks
    assert await throttled(port, "user") == 2
    # The address still has budget for other users, and carol gets in from elsewhere.
    assert await guess(port, guesser, "dave") == 401
    assert await password_checks(port) == checks + 1
    assert (await http_handshake(port, "/websmq", CAROL, source="127.0.0.11")).status == 101
    assert await throttled(port, "address") == 0


# -- the tables and the queue, sans-IO ----------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_past_its_budget_a_key_waits_twice_as_long_after_each_failure_up_to_the_cap() -> None:
    clock = Clock()
    table = FailureTable(3, 1.0, 5.0, 60.0, clock=clock)
    for _ in range(2):
        table.failed("a")
        assert table.wait("a") == 0
    waits = []
    for _ in range(5):
        table.failed("a")
        waits.append(table.wait("a"))
        clock.now += waits[-1]
        assert table.wait("a") == 0
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert table.wait("b") == 0


def test_a_quiet_key_is_forgotten_and_starts_its_budget_again() -> None:
    clock = Clock()
    table = FailureTable(2, 10.0, 100.0, 60.0, clock=clock)
    table.failed("a")
    table.failed("a")
    assert table.wait("a") == 10.0
    clock.now += 59
    assert table.wait("a") == 0 and len(table) == 1
    clock.now += 1
    assert table.wait("a") == 0 and len(table) == 0
    table.failed("a")
    assert table.wait("a") == 0


def test_a_budget_of_0_never_waits() -> None:
    table = FailureTable(0, 1.0, 5.0, 60.0, clock=Clock())
    for _ in range(100):
        table.failed("a")
    assert table.wait("a") == 0 and len(table) == 0


def test_the_tables_stay_bounded_however_many_addresses_fail() -> None:
    clock = Clock()
    throttle = LoginThrottle(per_address=1, per_user=1, delay=1.0, max_delay=5.0,
                             forget_after=60.0, clock=clock, remembered=100)
    for n in range(1000):
        throttle.failed(f"10.0.{n // 256}.{n % 256}", "x" * 10_000)
    assert len(throttle.addresses) == 100 and len(throttle.users) == 100
    # The newest are the ones kept.
    assert throttle.refusal("10.0.3.231", "x" * 10_000) == "address"
    assert throttle.refusal("10.0.0.0", "x" * 10_000) is None


def test_a_user_is_throttled_from_the_address_that_guessed_it_only() -> None:
    clock = Clock()
    throttle = LoginThrottle(per_address=10, per_user=2, delay=1.0, max_delay=5.0,
                             forget_after=60.0, clock=clock)
    throttle.failed("10.0.0.1", "carol")
    throttle.failed("10.0.0.1", "carol")
    assert throttle.refusal("10.0.0.1", "carol") == "user"
    assert throttle.refusal("10.0.0.1", "dave") is None
    assert throttle.refusal("10.0.0.2", "carol") is None
    assert throttle.throttled == {"address": 0, "user": 1}
    # Her right password, once the delay has passed, clears her record there, not the
    # address's.
    clock.now += 1
    throttle.succeeded("10.0.0.1", "carol")
    assert len(throttle.users) == 0 and len(throttle.addresses) == 1


@pytest.mark.parametrize(("host", "network"), [
    ("192.0.2.7", "192.0.2.7"),
    ("::ffff:192.0.2.7", "192.0.2.7"),
    ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
])
def test_an_ipv6_client_counts_by_its_64_and_a_mapped_ipv4_one_as_ipv4(
    host: str, network: str
) -> None:
    assert address_key(IPv6Address("TCP", host, 5000) if ":" in host
                          else IPv4Address("TCP", host, 5000)) == network


def test_a_unix_socket_client_counts_as_one() -> None:
    assert address_key(UNIXAddress(None)) == address_key(UNIXAddress(None))


def test_the_queue_serves_each_key_in_turn() -> None:
    queue: FairQueue[str] = FairQueue(per_key=4, in_all=64)
    for n in range(4):
        queue.push("a", f"a{n}")
    queue.push("b", "b0")
    queue.push("c", "c0")
    queue.push("b", "b1")
    served = []
    while (taken := queue.pop()) is not None:
        served.append(taken[1])
        queue.done(taken[0])
    assert served == ["a0", "b0", "c0", "a1", "b1", "a2", "a3"]
    assert queue.held == 0


def test_a_key_holds_a_few_items_and_a_newcomer_takes_the_place_of_the_fullest() -> None:
    queue: FairQueue[str] = FairQueue(per_key=3, in_all=6)
    for n in range(3):
        queue.push("a", f"a{n}")
    with pytest.raises(QueueFull, match="from this address"):
        queue.push("a", "a3")
    taken = queue.pop()  # being worked on: still a's until done
    assert taken == ("a", "a0")
    with pytest.raises(QueueFull, match="from this address"):
        queue.push("a", "a3")
    for n in range(3):
        queue.push("b", f"b{n}")
    # Full: c takes the newest place of a key holding more than c will.
    assert queue.push("c", "c0") == ["a2"]
    assert queue.push("c", "c1") == ["b2"]
    with pytest.raises(QueueFull, match="6 password checks"):
        queue.push("c", "c2")
    # a holds 2 (one being worked on), b 2 and c 2: newcomers even them out.
    assert queue.push("d", "d0") == ["a1"]
    assert queue.push("e", "e0") == ["b1"]
    assert queue.push("f", "f0") == ["c1"]
    with pytest.raises(QueueFull, match="6 password checks"):
        queue.push("g", "g0")  # each holds one
    queue.done("a")
    assert queue.push("g", "g0") == []
    assert len(queue) == 6 and queue.held == 6
