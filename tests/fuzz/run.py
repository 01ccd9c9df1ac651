"""Run one fuzz target under atheris (libFuzzer), coverage-guided over wireproto's codecs.

    python -m tests.fuzz.run TARGET [libFuzzer options, e.g. -runs=100000 -max_total_time=60]

Exits 0 when the runs end with no finding. A decoder that raises anything but ProtocolError
stops the run with the input and a traceback, libFuzzer writes the input to ``crash-*``, and the
exit status is non-zero. `make fuzz` runs every target for longer; the test suite briefly.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import atheris

with atheris.instrument_imports(include=["wireproto"]):
    from tests.fuzz.targets import TARGETS

from wireproto.errors import ProtocolError


def fuzz(decode: Callable[[Any], Any], takes: str, options: list[str]) -> None:
    """Fuzz `decode` with libFuzzer `options`; never returns (libFuzzer exits the process)."""
    if takes == "text":
        def one_input(data: bytes) -> None:
            text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(len(data))
            try:
                decode(text)
            except ProtocolError:
                pass
    else:
        def one_input(data: bytes) -> None:
            try:
                decode(data)
            except ProtocolError:
                pass

    atheris.Setup([sys.argv[0], *options], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        print(f"usage: python -m tests.fuzz.run TARGET [libFuzzer options]\n"
              f"targets: {', '.join(TARGETS)}", file=sys.stderr)
        sys.exit(2)
    target = TARGETS[sys.argv[1]]
    fuzz(target.decode, target.takes, sys.argv[2:])
