"""The tap's lines carry each message's time and its payload as it was sent (`text` when it is
UTF-8, exactly as written, else `hex`, never both), beside the decoded `json` and `msgpack`
fields; hostile payloads (not UTF-8, control characters, line breaks, huge, a decoded value many
times its size) stay one bounded JSON line each. Over real HTTP, from real clients of a real
broker."""

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
    "rtl": "<b>bold</b><script>alert(2)</script>\u202eRTL".encode(),
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
    assert shown["rtl"]["text"] == SENT["rtl"].decode()  # a format character is text too
    # The payload as sent is text or hex, never both (the decoded view's hex was beside the
    # text of control characters, of a direction override).
    for name, line in shown.items():
        assert ("text" in line) != ("hex" in line), name
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
    # At most the limit, but many times as long decoded: 16,000 msgpack nils are 80 kB of
    # JSON nulls, 1e15 is 1000000000000000.0 to orjson.
    nils = b"\xdc" + (16_000).to_bytes(2, "big") + b"\xc0" * 16_000
    floats = b"[" + b",".join([b"1e15"] * 3200) + b"]"
    assert len(nils) <= SHOWN_PAYLOAD_BYTES and len(floats) <= SHOWN_PAYLOAD_BYTES
    sent = {"text": text, "binary": binary, "controls": controls, "nils": nils,
            "floats": floats, "accents": "\u00e9".encode() * 9000}
    for count, (name, payload) in enumerate(sent.items(), 2):
        # One at a time: lines this long may fill the socket's buffer, and a tap skips
        # what comes while it is full.
        await wait_for(publisher.publish(f"huge/{name}", payload))
        await eventually(lambda count=count: len(reader.lines) == count, timeout=10)
    shown = {line["topic"].split("/")[1]: line for line in reader.lines[1:]}

    cut = shown["text"]
    assert cut["truncated"] is True and cut["size"] == len(text)
    kept = cut["text"].encode()
    assert text.startswith(kept) and SHOWN_PAYLOAD_BYTES - 3 < len(kept) <= SHOWN_PAYLOAD_BYTES
    assert shown["binary"]["hex"] == binary[:SHOWN_PAYLOAD_BYTES].hex()
    assert shown["binary"]["truncated"] is True and "text" not in shown["binary"]
    # Text over the limit is text alone: not 32 KiB of its hex beside it.
    accents = shown["accents"]
    assert accents["text"] == "\u00e9" * (SHOWN_PAYLOAD_BYTES // 2) and accents["truncated"]
    # JSON's escapes are six bytes a NUL: the text is cut where its JSON reaches 32 KiB.
    nuls = shown["controls"]["text"]
    assert shown["controls"]["truncated"] is True and nuls == "\x00" * len(nuls)
    assert 2 * SHOWN_PAYLOAD_BYTES - 6 < len(orjson.dumps(nuls)) <= 2 * SHOWN_PAYLOAD_BYTES + 2
    # A decoded value that would pass 32 KiB of JSON is left out; the payload as sent stays.
    assert "msgpack" not in shown["nils"] and shown["nils"]["hex"] == nils.hex()
    assert "json" not in shown["floats"] and shown["floats"]["text"] == floats.decode()
    for name, line in shown.items():
        assert ("text" in line) != ("hex" in line), name
    # Bounded however big: the payload as sent and the decoded value, 32 KiB each at most.
    longest = max(len(orjson.dumps(line)) for line in reader.lines)
    assert longest <= 4 * SHOWN_PAYLOAD_BYTES + 200
    response._transport.stopProducing()
