"""docs/phyllo.md's table of the common boards' USB identities is COMMON_BOARDS, the identities
the tests' stand-in boards carry: a board added, or an id changed, on one side alone fails."""

from __future__ import annotations

from pathlib import Path

from wireproto.devices.standin import COMMON_BOARDS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "phyllo.md"


def documented_boards() -> dict[str, dict[str, object]]:
    """The table under "### The common boards": its rows by stand-in name."""
    section = PAGE.read_text(encoding="utf-8").split("\n### The common boards\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header[:6] == ["board", "stand-in", "VID", "PID", "manufacturer", "product"], header
    boards: dict[str, dict[str, object]] = {}
    for row in rows[1:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        _, name, vid, pid, manufacturer, product = cells[:6]
        boards[name.strip("`")] = {
            "vid": int(vid.strip("`"), 16), "pid": int(pid.strip("`"), 16),
            "manufacturer": None if manufacturer == "-" else manufacturer,
            "product": None if product == "-" else product,
        }
    return boards


def test_the_doc_table_of_common_boards_is_what_the_stand_ins_carry():
    documented = documented_boards()
    assert list(documented) == list(COMMON_BOARDS)
    for name, identity in COMMON_BOARDS.items():
        expected = {key: identity[key] for key in ("vid", "pid", "manufacturer", "product")}
        assert documented[name] == expected, name
