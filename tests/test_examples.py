"""Every program under examples/ runs and prints what its docstring says it prints."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))
MARKER = "It prints:"


def expected_output(path: Path) -> str:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
    assert docstring and MARKER in docstring, f"{path.name}: its docstring must say '{MARKER}'"
    return textwrap.dedent(docstring.split(MARKER, 1)[1]).strip() + "\n"


def test_there_are_examples() -> None:
    assert EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_prints_what_it_says(path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(path.parents[1]))
    done = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=60, env=env,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected_output(path)
