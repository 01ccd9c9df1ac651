"""The compiled and plain twins at edges tests/speedups/test_twins.py does not draw, found by a
review of the fast path: each test here failed before its fix. Where the compiled twin read
memory it does not own, the call runs in a child interpreter (boundscheck=False,
wraparound=False in _compiled.pyx)."""

from __future__ import annotations

import array
import subprocess
import sys

import pytest

from wireproto.speedups import IMPLEMENTATIONS

compiled = pytest.mark.skipif(IMPLEMENTATIONS["compiled"] is None,
                              reason="the compiled fast path is not built")
TWINS = [pytest.param("compiled", marks=compiled), "pure"]

MASK = b"abcd"
# One masked binary frame carrying b"hello".
FRAME = bytes([0x82, 0x85]) + MASK + bytes(x ^ MASK[i % 4] for i, x in enumerate(b"hello"))


class Gate:
    open = True


def ws_deliver(name: str, *args):
    got: list = []
    try:
        end = IMPLEMENTATIONS[name].ws_deliver(*args, lambda p, b: got.append((bytes(p), b)),
                                               Gate())
    except (TypeError, ValueError) as error:
        return type(error).__name__
    return end, got


@compiled
@pytest.mark.parametrize("args", [
    pytest.param((bytearray(FRAME), 0, True, 0, True), id="bytearray buffer"),
    pytest.param((FRAME, 0, 1, 0, True), id="masked given as 1"),  # pure: `is not masked`
    pytest.param((FRAME, 0, True, None, True), id="limit None"),
])
def test_ws_deliver_gives_the_same_on_both_paths(args):
    assert ws_deliver("compiled", *args) == ws_deliver("pure", *args)


def child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


@compiled
def test_ws_deliver_with_a_start_before_the_buffer_does_not_crash_the_process():
    # pure: buffer[-N] reads from the end (or IndexError); compiled: data[start] unchecked.
    done = child("import wireproto.speedups._compiled as C\n"
                 "class G: open = True\n"
                 "try: C.ws_deliver(b'\\x82\\x01a', -100000000, False, 0, True, print, G())\n"
                 "except (ValueError, IndexError): pass\n")
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])


@compiled
def test_deliver_frames_with_a_prepared_tuple_too_short_raises_as_its_twin_does():
    # A FrameSubscriber whose prepared frame is (frame,): the compiled loop once read past the
    # tuple's end (boundscheck is off); both now refuse it as an unpacking does.
    done = child("import wireproto.speedups._compiled as C\n"
                 "class T:\n"
                 "    writes_now = True; frame_key = 'k'; sent = 0; sent_bytes = 0\n"
                 "    def frame_from_cache(self, cache): return None\n"
                 "    def write_frame(self, frame): pass\n"
                 "try: C.deliver_frames([T()], None, {'k': (b'f',)})\n"
                 "except ValueError: print('ValueError')\n")
    assert (done.returncode, done.stdout.strip()) == (0, "ValueError"), done


@pytest.mark.parametrize("name", TWINS)
def test_ws_frame_refuses_a_memoryview_of_wider_items(name):
    # The plain twin once framed it by its item count (3 for 12 bytes): a malformed frame.
    payload = memoryview(array.array("i", [1, 2, 3]))
    with pytest.raises(TypeError):
        IMPLEMENTATIONS[name].ws_frame(payload, True)


@pytest.mark.parametrize("name", TWINS)
def test_ws_unmask_refuses_an_int(name):
    # compiled: bytes(3) is three zero bytes, "unmasked" into b"abc".
    with pytest.raises(TypeError):
        IMPLEMENTATIONS[name].ws_unmask(3, MASK)


# h42-readers: the lines and COBS cuts, held to 30d6917's rule (a buffer that is not bytes is
# refused alike): the compiled twins refuse a bytearray, the plain ones cut it.
class Reader:
    paused = False


@compiled
@pytest.mark.parametrize("piece, args", [("lines_deliver", (10,)),
                                         ("cobs_deliver", (10, 10))])
def test_lines_and_cobs_refuse_a_bytearray_on_both_paths(piece, args):
    if not hasattr(IMPLEMENTATIONS["pure"], piece):
        pytest.skip("h42-readers not merged")
    for name in ("compiled", "pure"):
        with pytest.raises(TypeError):
            getattr(IMPLEMENTATIONS[name], piece)(bytearray(b"a\n\x01\x00"), *args,
                                                  lambda m, b: None, Reader())
