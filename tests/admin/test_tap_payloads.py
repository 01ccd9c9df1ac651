"""The tap's lines carry each message's time and its payload as it was sent (`text` when it is
UTF-8, exactly as written, else `hex`), beside the decoded `json` and `msgpack` fields; hostile
payloads (not UTF-8, control characters, line breaks, huge) stay one bounded JSON line each.
Over real HTTP, from real clients of a real broker."""

from __future__ import annotations

import time

import msgpack
import orjson
import pytest_twisted

from tests.admin.http import open_tap, start
from tests.brokers import Broker
from tests.support import eventually, wait_for
from wireproto.admin.tap import SHOWN_PAYLOAD_BYTES

SENT = {
    "json": b'{"t": 234e-1, "unit": "\\u00b0C"}',
    "msgpack": msgpack.packb({"t": 23.4}),
    "text": "caf\u00e9 \u2615".encode(),
    "controls": b"\x00\x1b[2J\x07bell\r\nnext\tline\x7f",
    "not-utf8": b"\xff\xfe\x00ok",
    "surrogate": b"\xed\xa0\x80",  # a UTF-16 surrogate written as UTF-8: no UTF-8 at all
    "empty": b"",
}


@pytest_twisted.ensureDeferred
async def test_each_line_has_its_time_and_the_payload_as_sent(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    response, reader = await open_tap(base, "raw/#")
    await eventually(lambda: reader.lines)
    publisher = await broker.client(addresses["websmq+length32"])
    before = time.time()
    for name, payload in SENT.items():
        await wait_for(publisher.publish(f"raw/{name}", payload))
    await eventually(lambda: len(reader.lines) == 1 + len(SENT))
    after = time.time()
    shown = {line["topic"].split("/")[1]: line for line in reader.lines[1:]}
    for name, line in shown.items():
        assert before - 0.01 <= line["time"] <= after + 0.01, name
        assert isinstance(line["time"], float), name
        assert line["size"] == len(SENT[name]), name
        assert "truncated" not in line, name

    assert shown["json"]["text"] == '{"t": 234e-1, "unit": "\\u00b0C"}'  # not 23.4, not "°C"
    assert shown["json"]["json"] == {"t": 23.4, "unit": "\u00b0C"}  # still, for scripts
    assert shown["msgpack"]["msgpack"] == {"t": 23.4}
    assert shown["msgpack"]["hex"] == SENT["msgpack"].hex()
    assert shown["text"]["text"] == "caf\u00e9 \u2615"
    assert shown["controls"]["text"] == SENT["controls"].decode()
    assert shown["not-utf8"]["hex"] == "fffe006f6b" and "text" not in shown["not-utf8"]
    assert shown["surrogate"]["hex"] == "eda080" and "text" not in shown["surrogate"]
    assert shown["empty"]["text"] == ""
    response._transport.stopProducing()


@pytest_twisted.ensureDeferred
async def test_a_huge_payload_is_one_bounded_line(broker: Broker) -> None:
    service, addresses, base = await start(broker)
    response, reader = await open_tap(base, "huge/#")
    await eventually(lambda: reader.lines)
    publisher = await broker.client(addresses["websmq+length32"])
    # A character of three bytes sits across the limit.
    text = ("xx" + "\u20ac" * 100_000).encode()
    assert (SHOWN_PAYLOAD_BYTES - 2) % 3
    binary = bytes(range(256)) * 800
    controls = b"\x00" * 200_000
    for name, payload in (("text", text), ("binary", binary), ("controls", controls)):
        await wait_for(publisher.publish(f"huge/{name}", payload))
    await eventually(lambda: len(reader.lines) == 4, timeout=10)
    shown = {line["topic"].split("/")[1]: line for line in reader.lines[1:]}

    cut = shown["text"]
    assert cut["truncated"] is True and cut["size"] == len(text)
    kept = cut["text"].encode()
    assert text.startswith(kept) and SHOWN_PAYLOAD_BYTES - 3 < len(kept) <= SHOWN_PAYLOAD_BYTES
    assert shown["binary"]["hex"] == binary[:SHOWN_PAYLOAD_BYTES].hex()
    assert shown["binary"]["truncated"] is True and "text" not in shown["binary"]
    assert shown["controls"]["text"] == "\x00" * SHOWN_PAYLOAD_BYTES
    # Bounded however big: JSON's six bytes a NUL, the decoded view's hex, and the rest.
    assert max(len(orjson.dumps(line)) for line in reader.lines) < 10 * SHOWN_PAYLOAD_BYTES
    response._transport.stopProducing()
