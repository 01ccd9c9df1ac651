"""phyllo-python 0.2.0 (PyPI `phyllo`), the Phyllo reference, as a device for the Phyllo device
kit: the driver contract of docs/conformance.md written with phyllo-python's own classes.

It opens DEVICE with pyserial and polls it through phyllo-python's `PollingSerialAdapter`, as
tests/phyllo/phyllo_python.py does, with phyllo-python's transport preset for the stack under
its pub-sub message link; documents are read and written by phyllo-python's presentation
`Document` (msgpack)::

    python tests/conformance/phyllo_python_device.py DEVICE --stack reduced

It prints ``ready`` once the port is open, then one JSON line for each exception phyllo-python
reports, and runs until it is killed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.phyllo.phyllo_python import MESSAGES, load_phyllo, open_port, received  # noqa: E402

DOCUMENT = 0x40


def documents():  # phyllo-python's presentation Document, imported once phyllo is loaded
    from phyllo.protocol.presentation.documents import Document, DocumentHeader

    return Document, DocumentHeader


def answer(adapter, event, state: dict) -> None:
    """The contract: echo `echo*`, count pings on `pong`, say hello! on `reply`."""
    Document, DocumentHeader = documents()
    topic, payload = event.data
    if topic.startswith(b"echo"):
        adapter.send_data((topic, payload), type=event.type)
    elif topic == b"ping" and event.type == DOCUMENT:
        document = Document()
        document.read(payload)  # raises on a body it cannot read: no ping
        pong = Document(header=DocumentHeader(format=0x11, schema=0x00), payload=state["pings"])
        adapter.send_data((b"pong", pong.buffer), type=DOCUMENT)
        state["pings"] += 1
    elif topic == b"reply" and event.type == DOCUMENT:
        hello = Document(header=DocumentHeader(format=0x11, schema=0x00), payload="hello!")
        adapter.send_data((b"reply", hello.buffer), type=DOCUMENT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device")
    parser.add_argument("--stack", choices=("minimal", "reduced"), default="reduced")
    options = parser.parse_args()
    phyllo = load_phyllo()
    adapter = open_port(phyllo, options.device, options.stack, MESSAGES)
    state = {"pings": 0}
    while True:
        for event in received(phyllo, adapter, "adapter"):
            if isinstance(event, phyllo.LinkException):
                print(json.dumps({"error": str(event)}), flush=True)
                continue
            try:
                answer(adapter, event, state)
            except Exception as error:  # noqa: BLE001 - said, as phyllo-python's own loop would
                print(json.dumps({"handler": repr(error)}), flush=True)
        time.sleep(0)


if __name__ == "__main__":
    raise SystemExit(main())
