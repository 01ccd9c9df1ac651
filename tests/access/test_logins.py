"""Password logins under guessing: failures remembered by address and by user from one
address, with growing delays, and a fair queue for the checks (wireproto.access.logins)."""

from __future__ import annotations

import pytest
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress

from wireproto.access.logins import (
    FailureTable,
    FairQueue,
    LoginThrottle,
    QueueFull,
    client_network,
)

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
    assert client_network(IPv6Address("TCP", host, 5000) if ":" in host
                          else IPv4Address("TCP", host, 5000)) == network


def test_a_unix_socket_client_counts_as_one() -> None:
    assert client_network(UNIXAddress(None)) == client_network(UNIXAddress(None))


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
