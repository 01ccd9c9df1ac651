"""How much of wireproto's typing is given up: ``Any`` in annotations and ``# type: ignore``.

mypy itself runs in the lint step (``make lint``, ``make test``); these counts are its ratchet.
Each may fall, never grow: lower the ceiling when a change brings a count down.
``python -m tests.test_typing`` prints both counts, with the modules that hold the most.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections import Counter
from pathlib import Path

import wireproto

PACKAGE = Path(wireproto.__file__).parent

# Ceilings: the counts when the last change was made (docs/architecture.md, "Types").
MOST_ANY_ANNOTATIONS = 785
MOST_TYPE_IGNORES = 12


def _annotations(tree: ast.AST) -> list[ast.expr]:
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            found.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
            found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
    return found


def _count_any(annotation: ast.expr) -> int:
    count = 0
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Any":
            count += 1
        elif isinstance(node, ast.Attribute) and node.attr == "Any":
            count += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # a quoted annotation ("dict[str, Any]") is parsed for what it names
            try:
                count += _count_any(ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                pass
    return count


def any_annotations(source: str) -> int:
    """How many times ``Any`` is named in the annotations of one module's source."""
    return sum(_count_any(annotation) for annotation in _annotations(ast.parse(source)))


def type_ignores(source: str) -> int:
    """How many ``# type: ignore`` comments one module's source holds."""
    return sum(
        1 for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT and "type: ignore" in token.string
    )


def counts() -> tuple[Counter[str], Counter[str]]:
    """``Any`` in annotations and ``type: ignore``, by module path under wireproto/."""
    anys: Counter[str] = Counter()
    ignores: Counter[str] = Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        name = str(path.relative_to(PACKAGE.parent))
        anys[name] = any_annotations(source)
        ignores[name] = type_ignores(source)
    return +anys, +ignores


def test_the_counts_see_what_they_count() -> None:
    source = (
        "from typing import Any\n"
        "import typing\n"
        "x: Any = 1  # type: ignore[assignment]\n"
        "def f(a: dict[str, Any], b: 'list[Any]', *c: typing.Any) -> Any:\n"
        "    y = Any  # names Any, but not in an annotation\n"
        "    return 'type: ignore'\n"
    )
    assert any_annotations(source) == 5
    assert type_ignores(source) == 1


def test_any_in_annotations_does_not_grow() -> None:
    anys, _ = counts()
    assert sum(anys.values()) <= MOST_ANY_ANNOTATIONS, anys.most_common(10)


def test_type_ignores_do_not_grow() -> None:
    _, ignores = counts()
    assert sum(ignores.values()) <= MOST_TYPE_IGNORES, ignores.most_common(10)


if __name__ == "__main__":
    anys, ignores = counts()
    print(f"Any in annotations: {sum(anys.values())}")
    for name, count in anys.most_common(15):
        print(f"  {count:4d}  {name}")
    print(f"type: ignore: {sum(ignores.values())}")
    for name, count in ignores.most_common(15):
        print(f"  {count:4d}  {name}")
