"""The broker's per-delivery work, compiled when it can be: `_compiled` (Cython, built by
`make serve`, `make test` and every wheel) or its plain-Python twin `_pure`, which behave the same
(tests/speedups holds them to it, and the tests of what the fast path must keep run on both).
docs/performance.md, "The compiled fast path", says what each piece is for and what it saves.

Callers read the pieces from this module when they use them (`speedups.deliver_frames(...)`),
or once per connection (`speedups.Outbox`), so `use` switches every later connection.
WIREPROTO_PURE_PYTHON=1 in the environment chooses the plain-Python path at start."""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path
from types import ModuleType

from wireproto.speedups import _pure

# What each path provides, name for name: the plain twin's names.
PIECES = tuple(_pure.__all__)

__all__ = ["IMPLEMENTATIONS", "implementation", "use", "compiled_available",
           "compiled_problem", *PIECES]


# Why the compiled path is not run, when it is not: "" when it is available.
compiled_problem = ""


def _load_compiled() -> ModuleType | None:
    """The compiled path, if it is built from the source beside it (a build older than its
    source, after a pull or an edit without `make speedups`, would run other code)."""
    global compiled_problem
    try:
        module = importlib.import_module("wireproto.speedups._compiled")
    except ImportError:  # not built: the plain-Python path serves
        compiled_problem = "not built (make speedups; pip needs Cython and a C compiler)"
        return None
    source = Path(__file__).with_name("_compiled.pyx")
    built_from = getattr(module, "SOURCE_DIGEST", "")
    if built_from and source.exists() and \
            hashlib.sha256(source.read_bytes()).hexdigest() != built_from:
        compiled_problem = "built from an older _compiled.pyx (make speedups builds it again)"
        return None
    missing = [piece for piece in PIECES if not hasattr(module, piece)]
    if missing:
        compiled_problem = f"lacks {', '.join(missing)} (make speedups builds it again)"
        return None
    return module


IMPLEMENTATIONS: dict[str, ModuleType | None] = {"compiled": _load_compiled(), "pure": _pure}

# The pieces, typed as the plain-Python twin's; `use` puts the chosen path's here.
implementation = "pure"
Outbox = _pure.Outbox
batch_begin = _pure.batch_begin
batch_end = _pure.batch_end
batching = _pure.batching
deliver_frames = _pure.deliver_frames
length32_deliver = _pure.length32_deliver
# websocket
FrameGate = _pure.FrameGate
ws_frame = _pure.ws_frame
ws_unmask = _pure.ws_unmask
ws_deliver = _pure.ws_deliver
# readers: the lines and COBS cuts
lines_deliver = _pure.lines_deliver
cobs_deliver = _pure.cobs_deliver
COBS_TOO_LARGE = _pure.COBS_TOO_LARGE
COBS_UNDECODABLE = _pure.COBS_UNDECODABLE


def compiled_available() -> bool:
    """Whether the compiled fast path was built for this Python."""
    return IMPLEMENTATIONS["compiled"] is not None


def use(name: str) -> None:
    """Run the fast path `name` ("compiled" or "pure") from now on. Connections made before
    keep their outboxes, which write straight through once their path's reads are over.
    ValueError for an unknown name; ImportError for "compiled" when it is not built;
    RuntimeError while a read is being handled."""
    global implementation
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"no fast path named {name!r}: 'compiled' or 'pure'")
    module = IMPLEMENTATIONS[name]
    if module is None:
        raise ImportError(f"the compiled fast path is {compiled_problem or 'not built'}")
    if batching():
        raise RuntimeError("cannot change the fast path while a read is being handled")
    namespace = globals()
    for piece in PIECES:
        namespace[piece] = getattr(module, piece)
    implementation = name


if os.environ.get("WIREPROTO_PURE_PYTHON") != "1" and compiled_available():
    use("compiled")
