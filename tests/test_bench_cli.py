"""The command line's benchmark runs every command it times, each exiting 0, and says so in a
well-formed table. No timing assertions: speed is bench/cli.py's business. This runs it with
two rounds."""

import importlib.util
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "cli.py"
spec = importlib.util.spec_from_file_location("bench_cli", BENCH)
cli = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = cli
spec.loader.exec_module(cli)


def test_every_command_runs_and_the_goals_are_reported() -> None:
    lines: list[str] = []
    medians = cli.run(cli.parse_args(["--quick"]), out=lines.append)

    expected = ["python -c pass", "wireproto --version", "wireproto pub"]
    if cli.find("mosquitto") and cli.find("mosquitto_pub"):
        expected.append("mosquitto_pub")
    else:
        assert any("mosquitto_pub: not measured" in line for line in lines), lines
    assert list(medians) == expected
    assert all(seconds > 0 for seconds in medians.values())
    for name in expected:
        row = next(line for line in lines if line.startswith(name + " "))
        cells = row[len(name):].split()
        assert len(cells) == 4 and all(re.fullmatch(r"\d+\.\d{3}", c) for c in cells[:3]), row
        assert re.fullmatch(r"\d+\.\dx", cells[3]), row
    text = "\n".join(lines)
    assert re.search(r"goal: wireproto --version within 2\.5x python -c pass: \d+\.\d\dx "
                     r"\((met|missed)\)", text)
    assert re.search(r"goal: wireproto pub to a local broker at most 0\.35 s: \d\.\d{3} s "
                     r"\((met|missed)\)", text)
