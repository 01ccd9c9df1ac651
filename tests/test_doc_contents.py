"""docs/configuration.md's contents list every table a config file takes, each a link to the
section that describes it; the quickstart's steps are commands, not Python, and it ends with
the status page and /metrics."""

from __future__ import annotations

import re
from pathlib import Path

from wireproto.config.tables import config_tables

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGE = DOCS / "configuration.md"
# The arrays of tables, beside config_tables()'s tables.
ARRAYS = ("listen", "attach", "phyllo", "acl")


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_contents_name_every_table_and_link_to_its_section() -> None:
    text = PAGE.read_text(encoding="utf-8")
    contents = text.split("\n## ", 1)[0].split("\n- [", 1)[1]  # the list before ## Checking
    anchors = {anchor(line.lstrip("#")) for line in text.splitlines()
               if re.match(r"#{2,4} ", line)}
    # [label](#anchor), the label perhaps holding `[table]` or `[[array]]`
    links = re.findall(r"\[((?:[^\[\]]|\[\[?\w+\]\]?)+)\]\(#([\w-]+)\)", contents)
    assert links, contents
    for _, target in links:
        assert target in anchors, f"the contents link to #{target}, which no heading has"
    listed = " ".join(label for label, _ in links)
    for table in config_tables():
        assert f"`[{table}]`" in listed, f"the contents omit [{table}]"
    for array in ARRAYS:
        assert f"`[[{array}]]`" in listed, f"the contents omit [[{array}]]"


def test_the_quickstart_has_no_doctest_and_ends_with_the_page_and_metrics() -> None:
    text = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    assert not [line for line in text.splitlines() if line.lstrip().startswith(">>>")]
    steps = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    numbered = [step for step in steps if re.match(r"\d+\. ", step)]
    last = numbered[-1]
    assert steps[steps.index(last) + 1:] == [steps[-1]] and steps[-1].startswith("Next")
    assert last.startswith(f"{len(numbered)}. The status page and metrics")
    assert "http://127.0.0.1:8765/" in last and "http://127.0.0.1:8765/metrics" in last
