"""Re-entrancy: a write made while one outbox is being flushed (a transport's write that calls
back: a producer's pauseProducing that sends a notice, an in-memory or loopback transport, a log
observer that publishes) waits behind the frames still waiting in another outbox, since the
batch stays open until every outbox is empty: nothing overtakes what waits, on both paths."""

from __future__ import annotations

import pytest

from wireproto.speedups import IMPLEMENTATIONS

compiled = pytest.mark.skipif(IMPLEMENTATIONS["compiled"] is None,
                              reason="the compiled fast path is not built")


@pytest.mark.parametrize("name", [pytest.param("compiled", marks=compiled), "pure"])
def test_a_write_made_during_a_flush_does_not_overtake_what_waits(name):
    speedups = IMPLEMENTATIONS[name]
    wire_b: list[bytes] = []
    b = speedups.Outbox(wire_b.append)

    def write_a(data: bytes) -> None:  # A's transport calls back into B as it is written
        b.write(b"notice")

    a = speedups.Outbox(write_a)
    speedups.batch_begin()
    try:
        a.write(b"to a")
        b.write(b"first")
        b.write(b"second")
    finally:
        speedups.batch_end()
    assert b"".join(wire_b) == b"firstsecondnotice", wire_b
    assert not speedups.batching()
