"""The compiled fast path and its plain-Python twin, on the same inputs: each piece returns the
same, calls the same callbacks in the same order, and leaves the same state behind."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.test_log_events import logged, named
from wireproto import speedups

LIMIT = 64


def both() -> list[ModuleType]:
    """The two paths, compiled first; skipped when it is not built (test_build fails that
    under CI=true)."""
    compiled = speedups.IMPLEMENTATIONS["compiled"]
    if compiled is None:
        pytest.skip("the compiled fast path is not built (make speedups)")
    pure = speedups.IMPLEMENTATIONS["pure"]
    assert pure is not None
    return [compiled, pure]


def frame(message: bytes) -> bytes:
    return struct.pack(">I", len(message)) + message


class Reader:
    """A connection reading frames: `paused` set by the delivery of message number `pause_at`."""

    def __init__(self, pause_at: int | None) -> None:
        self.paused = False
        self.pause_at = pause_at
        self.delivered: list[tuple[bytes, bool]] = []

    def deliver(self, message: bytes, binary: bool) -> None:
        self.delivered.append((message, binary))
        if len(self.delivered) == self.pause_at:
            self.paused = True


def read_stream(module: ModuleType, pieces: list[bytes], limit: int, pause_at: int | None
                ) -> tuple[list[tuple[int, int]], list[tuple[bytes, bool]]]:
    """Feed `pieces` as the length32 adapter does (the rest of one read starts the next),
    until a frame over the limit or a pause; return each call's result and what was delivered."""
    reader = Reader(pause_at)
    results = []
    rest = b""
    for piece in pieces:
        buffer = rest + piece
        offset, too_large = module.length32_deliver(buffer, limit, reader.deliver, reader)
        results.append((offset, too_large))
        if too_large >= 0 or reader.paused:
            break
        rest = buffer[offset:]
    return results, reader.delivered


def cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({point % (len(stream) + 1) for point in cuts} | {0, len(stream)})
    return [stream[a:b] for a, b in zip(points, points[1:], strict=False)] or [b""]


# Messages of any size, and often of the limit's edges.
message = st.binary(max_size=LIMIT + 8) | st.sampled_from([LIMIT - 1, LIMIT, LIMIT + 1]).map(
    lambda size: b"m" * size)


@given(
    messages=st.lists(message, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=16),
    pause_at=st.none() | st.integers(min_value=1, max_value=12),
)
def test_length32_cut_anywhere_delivers_the_same_on_both_paths(messages, cuts, pause_at):
    stream = b"".join(map(frame, messages))
    pieces = cut(stream, cuts)
    outcomes = [read_stream(module, pieces, LIMIT, pause_at) for module in both()]
    assert outcomes[0] == outcomes[1]
    results, delivered = outcomes[0]
    # And both are right: every message up to the first one over the limit (or the pause).
    expected = []
    for message in messages:
        if len(message) > LIMIT or len(expected) == pause_at:
            break
        expected.append((message, True))
    assert delivered == expected
    over = [len(m) for m in messages[:len(expected) + 1] if len(m) > LIMIT]
    if over and len(expected) != pause_at:
        assert results[-1][1] == over[0]
    else:
        assert all(too_large == -1 for _, too_large in results)


@st.composite
def hostile(draw: Callable) -> tuple[bytes, int]:
    """Frames whose length fields sit at the limit's edges or anywhere, bodies cut short,
    and trailing garbage; with the limit they are read under."""
    limit = draw(st.sampled_from([0, 1, 4, 255, 2**31 - 1, 2**31, 2**32 - 1]))
    edges = st.sampled_from(sorted({0, max(limit - 1, 0), limit, min(limit + 1, 2**32 - 1)}))
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        length = draw(edges | st.integers(0, 2**32 - 1))
        parts.append(struct.pack(">I", length) + draw(st.binary(max_size=min(length, 40))))
    parts.append(draw(st.binary(max_size=8)))
    return b"".join(parts), limit


@given(case=hostile())
def test_length32_hostile_bytes_give_the_same_on_both_paths(case):
    buffer, limit = case
    outcomes = []
    for module in both():
        reader = Reader(None)
        outcomes.append((module.length32_deliver(buffer, limit, reader.deliver, reader),
                         reader.delivered))
    assert outcomes[0] == outcomes[1]


def test_length32_lengths_with_the_top_bit_set_are_over_any_limit_below_them():
    buffer = b"\xff\xff\xff\xff" + b"x" * 8
    for module in both():
        reader = Reader(None)
        assert module.length32_deliver(buffer, 2**32 - 2, reader.deliver, reader) == (
            0, 2**32 - 1)
        assert reader.delivered == []


def test_a_pause_set_before_the_read_delivers_nothing():
    for module in both():
        reader = Reader(None)
        reader.paused = True
        assert module.length32_deliver(frame(b"a"), LIMIT, reader.deliver, reader) == (0, -1)
        assert reader.delivered == []


def test_an_error_in_delivery_stops_the_cut_the_same_way():
    for module in both():
        seen = []

        def deliver(message: bytes, binary: bool, seen: list = seen) -> None:
            seen.append(message)
            if message == b"bad":
                raise ValueError("refused")

        with pytest.raises(ValueError, match="refused"):
            module.length32_deliver(frame(b"ok") + frame(b"bad") + frame(b"never"), LIMIT,
                                    deliver, Reader(None))
        assert seen == [b"ok", b"bad"]


# -- deliver_frames ------------------------------------------------------------------------------


class Target:
    """A subscriber as the hub's fan-out loop sees it (wireproto.hub.subscribers)."""

    def __init__(self, name: str, writes_now: bool, key: str, prepares: bool,
                 journal: list) -> None:
        self.name = name
        self.writes_now = writes_now
        self.frame_key = key
        self.prepares = prepares
        self.journal = journal
        self.sent = self.sent_bytes = 0

    def frame_from_cache(self, cache: dict) -> tuple[bytes, int] | None:
        self.journal.append(("frame_from_cache", self.name))
        if not self.prepares:
            return None
        prepared = cache[self.frame_key] = (b"framed:" + self.frame_key.encode(), 7)
        return prepared

    def write_frame(self, data: bytes) -> None:
        self.journal.append(("write", self.name, data))

    def state(self) -> tuple:
        return self.name, self.sent, self.sent_bytes


subscriber = st.tuples(st.booleans(), st.sampled_from(["a", "b", "c"]), st.booleans())


@given(subscribers=st.lists(subscriber, max_size=10),
       sender=st.none() | st.integers(min_value=0, max_value=9),
       cached=st.sets(st.sampled_from(["a", "b", "c"])))
def test_deliver_frames_writes_and_leaves_the_same_on_both_paths(subscribers, sender, cached):
    outcomes = []
    for module in both():
        journal: list = []
        targets = [Target(f"s{n}", writes_now, key, prepares, journal)
                   for n, (writes_now, key, prepares) in enumerate(subscribers)]
        cache: dict[str, Any] = {key: (b"cached:" + key.encode(), 3) for key in cached}
        who = targets[sender] if sender is not None and sender < len(targets) else None
        delivered, rest = module.deliver_frames(iter(targets), who, cache)
        outcomes.append((delivered, None if rest is None else [t.name for t in rest], journal,
                         [t.state() for t in targets], sorted(cache)))
    assert outcomes[0] == outcomes[1]
    delivered, rest, journal, _, _ = outcomes[0]
    assert delivered == len(subscribers) - (sender is not None and sender < len(subscribers))
    written = [entry[1] for entry in journal if entry[0] == "write"]
    assert len(written) + len(rest or []) == delivered


def test_deliver_frames_hands_back_those_that_need_the_message():
    for module in both():
        journal: list = []
        paused = Target("paused", False, "a", True, journal)
        unprepared = Target("unprepared", True, "b", False, journal)
        ready = Target("ready", True, "a", True, journal)
        sender = Target("sender", True, "a", True, journal)
        delivered, rest = module.deliver_frames((paused, sender, unprepared, ready), sender,
                                                {"a": (b"A", 1)})
        assert (delivered, rest) == (3, [paused, unprepared])
        assert journal == [("frame_from_cache", "unprepared"), ("write", "ready", b"A")]
        assert (ready.sent, ready.sent_bytes, sender.sent, paused.sent) == (1, 1, 0, 0)
        assert module.deliver_frames([sender], sender, {}) == (0, None)


# -- Outbox, batch_begin / batch_end ------------------------------------------------------------


@pytest.fixture
def idle() -> Iterator[None]:
    """Both paths out of any read before and after the test (their state is the module's)."""
    modules = both()
    assert not any(module.batching() for module in modules)
    yield
    for module in modules:
        while module.batching():
            module.batch_end()


def outboxes(module: ModuleType, count: int, wire: list) -> list:
    def writer(name: int) -> Callable[[bytes], None]:
        return lambda data: wire.append((name, data))

    return [module.Outbox(writer(n)) for n in range(count)]


operation = st.one_of(
    st.just(("begin",)), st.just(("end",)),
    st.tuples(st.just("write"), st.integers(0, 2), st.binary(min_size=1, max_size=6)),
    st.tuples(st.just("flush"), st.integers(0, 2)),
    st.tuples(st.just("discard"), st.integers(0, 2)),
)


def run_outboxes(module: ModuleType, operations: list[tuple]) -> list:
    """Play `operations` on three outboxes of `module`; what reached each write, and the
    state seen after every step."""
    wire: list = []
    boxes = outboxes(module, 3, wire)
    depth = 0
    seen = []
    for op in operations:
        if op[0] == "begin":
            module.batch_begin()
            depth += 1
        elif op[0] == "end":
            if not depth:
                continue
            module.batch_end()
            depth -= 1
        elif op[0] == "write":
            boxes[op[1]].write(op[2])
        else:
            getattr(boxes[op[1]], op[0])()
        seen.append((len(wire), [box.waiting for box in boxes], module.batching()))
    for _ in range(depth):
        module.batch_end()
    return [wire, seen, [box.waiting for box in boxes]]


@given(operations=st.lists(operation, max_size=30))
def test_outboxes_write_the_same_on_both_paths(operations):
    for module in both():
        assert not module.batching()
    pure_run = run_outboxes(speedups._pure, operations)
    compiled_run = run_outboxes(both()[0], operations)
    assert compiled_run == pure_run
    wire, _, waiting = pure_run
    assert waiting == [0, 0, 0]
    # Per outbox, the bytes that reached the wire are those written, in order, less the
    # discarded: never reordered.
    for name in range(3):
        written = b"".join(op[2] for op in operations if op[0] == "write" and op[1] == name)
        sent = b"".join(data for box, data in wire if box == name)
        assert _is_subsequence_of_runs(sent, written)


def _is_subsequence_of_runs(sent: bytes, written: bytes) -> bool:
    position = 0
    for byte in sent:
        position = written.find(bytes([byte]), position)
        if position < 0:
            return False
        position += 1
    return True


def test_one_joined_write_per_outbox_per_outermost_read(idle):
    for module in both():
        wire: list = []
        first, second, untouched = outboxes(module, 3, wire)
        module.batch_begin()
        first.write(b"a")
        module.batch_begin()  # a read handled inside a read: still one write at the end
        second.write(b"x")
        first.write(b"b")
        module.batch_end()
        assert wire == [] and module.batching()
        first.write(b"c")
        assert (first.waiting, second.waiting, untouched.waiting) == (3, 1, 0)
        module.batch_end()
        assert wire == [(0, b"abc"), (1, b"x")]
        assert not module.batching()
        first.write(b"now")  # outside a read: at once
        assert wire[-1] == (0, b"now")


def test_flush_writes_what_waits_now_and_discard_forgets_it(idle):
    for module in both():
        wire: list = []
        kept, dropped = outboxes(module, 2, wire)
        module.batch_begin()
        kept.write(b"1")
        kept.write(b"2")
        kept.flush()
        assert wire == [(0, b"12")] and kept.waiting == 0
        kept.write(b"3")
        dropped.write(b"lost")
        dropped.discard()
        assert dropped.waiting == 0
        dropped.write(b"after")
        module.batch_end()
        assert wire == [(0, b"12"), (0, b"3"), (1, b"after")]


def test_a_failing_write_is_logged_and_the_other_outboxes_are_still_written(idle):
    for module in both():
        wire: list = []

        def broken(data: bytes) -> None:
            raise OSError("the socket is gone")

        before, failing, after = module.Outbox(wire.append), module.Outbox(broken), \
            module.Outbox(wire.append)
        with logged() as events:
            module.batch_begin()
            before.write(b"before")
            failing.write(b"failing")
            after.write(b"after")
            module.batch_end()
        assert wire == [b"before", b"after"]
        (failed,) = named(events, "write_failed")
        assert failed["log_namespace"] == "wireproto.speedups"
        assert "the socket is gone" in failed["log_failure"].getErrorMessage()
        assert not module.batching() and failing.waiting == 0


def test_an_outbox_of_the_other_path_writes_straight_through_after_use(idle):
    compiled, pure = both()
    before = speedups.implementation
    wire: list = []
    old = speedups.Outbox(lambda data: wire.append(("old", data)))
    other = "pure" if speedups.implementation == "compiled" else "compiled"
    speedups.use(other)
    try:
        new = speedups.Outbox(lambda data: wire.append(("new", data)))
        speedups.batch_begin()
        old.write(b"1")  # its own path reads nothing: written at once, in order
        new.write(b"2")
        old.write(b"3")
        assert wire == [("old", b"1"), ("old", b"3")]
        speedups.batch_end()
        assert wire == [("old", b"1"), ("old", b"3"), ("new", b"2")]
    finally:
        speedups.use(before)


def test_use_refuses_an_unknown_path_and_a_change_during_a_read(idle, monkeypatch):
    both()
    before = speedups.implementation
    with pytest.raises(ValueError, match="no fast path named 'cython'"):
        speedups.use("cython")
    speedups.batch_begin()
    try:
        with pytest.raises(RuntimeError, match="while a read is being handled"):
            speedups.use("pure")
    finally:
        speedups.batch_end()
    assert speedups.implementation == before
    monkeypatch.setitem(speedups.IMPLEMENTATIONS, "compiled", None)
    with pytest.raises(ImportError, match="not built"):
        speedups.use("compiled")
    assert speedups.implementation == before


def test_use_puts_every_piece_of_the_chosen_path_in_the_facade():
    before = speedups.implementation
    try:
        for name, module in zip(("compiled", "pure"), both(), strict=True):
            speedups.use(name)
            assert speedups.implementation == name
            for piece in speedups.PIECES:
                assert getattr(speedups, piece) is getattr(module, piece)
    finally:
        speedups.use(before)


def test_the_twins_have_the_same_pieces():
    compiled, pure = both()
    for piece in speedups.PIECES:
        assert hasattr(compiled, piece) and hasattr(pure, piece), piece
    assert set(speedups.PIECES) <= set(speedups.__all__)
    assert set(pure.__all__) == set(speedups.PIECES)


# -- where the twins part: inputs their typed signatures allow but the broker never gives --------


def test_deliver_frames_refuses_a_dict_subclass_on_both_paths():
    """The compiled loop takes exactly a dict (the hub always passes one): so does the twin."""
    class Encodings(dict):
        pass

    for module in both():
        with pytest.raises(TypeError):
            module.deliver_frames([], None, Encodings())


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_length32_refuses_other_bytes_like_buffers_on_both_paths(kind):
    """The compiled cut reads bytes in place (the stream adapter always passes bytes): both
    refuse a bytearray or a memoryview, and deliver nothing."""
    for module in both():
        reader = Reader(None)
        with pytest.raises(TypeError):
            module.length32_deliver(kind(frame(b"a")), LIMIT, reader.deliver, reader)
        assert reader.delivered == []


def test_deliver_frames_refuses_no_cache_on_both_paths():
    """None is not a dict either: the compiled loop took it when there was no one to deliver to."""
    for module in both():
        with pytest.raises(TypeError):
            module.deliver_frames([], None, None)


class OpenGate:
    open = True


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_ws_deliver_refuses_other_bytes_like_buffers_on_both_paths(kind):
    """As the length32 cut: the compiled reader takes bytes alone, and the twin read these."""
    for module in both():
        delivered: list[bytes] = []
        with pytest.raises(TypeError):
            module.ws_deliver(kind(b"\x82\x01a"), 0, False, 0, True,
                              lambda payload, binary, into=delivered: into.append(payload),
                              OpenGate())
        assert delivered == []


@pytest.mark.parametrize("start", [-3, -1, 4])
def test_ws_deliver_refuses_a_start_outside_the_buffer_on_both_paths(start):
    """The compiled reader read the bytes before its buffer for a negative start (the twin read
    from its end): both refuse it, and a start past the end."""
    for module in both():
        delivered: list[bytes] = []
        with pytest.raises(ValueError):
            module.ws_deliver(b"\x82\x01a", start, False, 0, True,
                              lambda payload, binary, into=delivered: into.append(payload),
                              OpenGate())
        assert delivered == []
