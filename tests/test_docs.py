"""Every example in docs/*.md and README.md runs and prints what the page says it prints.

The examples are doctests (``>>>`` lines and their output) inside ```python fences. A ```python
fence holds only such examples: code that is not meant to run (an API signature, a layout) goes
in a ```text fence, so no example can silently stop being checked.
"""

import doctest
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(DOCS.glob("*.md")) + [DOCS.parent / "README.md"]
# The overview and the benchmark figures need no examples, nor the quickstart, whose steps are
# commands (its example of the default listeners is in embedding.md); every codec's page must
# have some.
MAY_HAVE_NO_EXAMPLES = {"index.md", "performance.md", "tools.md", "quickstart.md"}
OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)")


def fenced_blocks(lines: list[str]) -> list[tuple[int, int, str]]:
    """(opening line index, closing line index, info string) of every fenced block."""
    blocks = []
    opening = None
    for index, line in enumerate(lines):
        match = FENCE.match(line)
        if match is None:
            continue
        if opening is None:
            opening = (index, match["fence"], match["info"])
        elif match["fence"][0] == opening[1][0] and len(match["fence"]) >= len(opening[1]):
            blocks.append((opening[0], index, opening[2]))
            opening = None
    if opening is not None:
        blocks.append((opening[0], len(lines), opening[2]))
    return blocks


def run_examples(page: Path) -> tuple[doctest.TestResults, str]:
    """Run the page's examples as one doctest, in a namespace of their own."""
    lines = page.read_text(encoding="utf-8").splitlines()
    # A closing fence right after an example's output would be read as more output: blank every
    # fence line (keeping the line numbers, so a failure points at the right line of the page).
    for opening, closing, _ in fenced_blocks(lines):
        for index in (opening, closing):
            if index < len(lines):
                lines[index] = ""
    test = doctest.DocTestParser().get_doctest(
        "\n".join(lines) + "\n", {"__name__": "__docs__"}, page.name, str(page), 0
    )
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    results = runner.run(test, out=report.append)
    return results, "".join(report)


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_doc_examples(page: Path) -> None:
    lines = page.read_text(encoding="utf-8").splitlines()
    not_examples = [
        f"{page.name}, line {opening + 1}"
        for opening, closing, info in fenced_blocks(lines)
        if info.lower() in ("python", "py", "pycon")
        and not any(line.lstrip().startswith(">>>") for line in lines[opening + 1 : closing])
    ]
    assert not not_examples, (
        "a ```python fence holds doctest examples ('>>> ' lines); use ```text for code that "
        f"is not run: {', '.join(not_examples)}"
    )

    results, report = run_examples(page)
    assert results.failed == 0, f"{results.failed} example(s) in {page.name} failed:\n{report}"
    if page.name not in MAY_HAVE_NO_EXAMPLES:
        assert results.attempted > 0, f"{page.name} has no examples ('>>> ' lines) to run"
