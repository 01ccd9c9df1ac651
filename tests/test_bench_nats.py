"""bench/nats_client.py publishes through each client, checks every message arrived, and prints
one row per client. No timing assertions: this runs it with tiny counts."""

import re
import subprocess
import sys
from pathlib import Path

from tests.cluster.conftest import _need_nats_server

BENCH = Path(__file__).resolve().parent.parent / "bench" / "nats_client.py"


def test_every_client_delivers_every_message_and_gets_a_row():
    _need_nats_server()
    run = subprocess.run([sys.executable, str(BENCH), "--count", "3000", "--rounds", "1"],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines()
            if re.fullmatch(r".+ reactor +\d+ +\d+\.\d\d +\d+\.\d\dx", line)]
    assert [row.split(",")[0] for row in rows] == [
        "wireproto client", "nats-py", "wireproto client"]
