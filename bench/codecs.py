"""Codec benchmark: encode+decode per message, each codec beside bare serializers, in one run.

For every case the same fields (the "envelope") are also round-tripped through bare msgpack,
orjson and json as a dict, so a codec's cost reads against what a hand-rolled protocol on a plain
serializer would pay. The goal (docs/performance.md) is at most 2x the bare serializer that the
codec itself stands on: msgpack for binary formats, json for JSON text formats.

    .venv/bin/python bench/codecs.py [--quick]

Figures are the best of several repeats, in microseconds per encode+decode. This is a benchmark,
not a test: run it on a quiet machine and compare columns within one run.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import orjson

from wireproto.codecs import engineio, nats, nydus, phyllo, subble, ubre, websmq, wpheader

PAYLOAD = bytes(range(32, 96))  # 64 bytes of printable ASCII, so JSON can carry it as text
TOPIC = "sensors/temps/living_room"


@dataclass
class Case:
    name: str
    roundtrip: Callable[[], Any]  # returns what it decoded, which must equal `expected`
    expected: Any
    envelope: dict[str, Any]
    baseline: str  # the bare serializer the codec stands on: "msgpack" or "orjson"


def _text_envelope(envelope: dict[str, Any]) -> dict[str, Any]:
    return {k: v.decode("ascii") if isinstance(v, bytes) else v for k, v in envelope.items()}


def bare_roundtrips(envelope: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    text = _text_envelope(envelope)
    packb, unpackb = msgpack.packb, msgpack.unpackb
    dumps, loads = json.dumps, json.loads
    return {
        "msgpack": lambda: unpackb(packb(envelope, use_bin_type=True), raw=False),
        "orjson": lambda: orjson.loads(orjson.dumps(text)),
        "json": lambda: loads(dumps(text, separators=(",", ":"))),
    }


def cases() -> list[Case]:
    result = []

    def add(name, encode, decode, message, envelope, baseline, expected=None):
        result.append(Case(name, lambda: decode(encode(message)),
                           message if expected is None else expected, envelope, baseline))

    add(
        "websmq publish", websmq.encode, websmq.decode,
        websmq.Publish(TOPIC, PAYLOAD),
        {"type": 0, "topic": TOPIC, "payload": PAYLOAD}, "msgpack",
    )

    body = {"c": 21.5, "unit": "C", "room": "living"}
    add(
        "ubre publish (JSON)", ubre.encode, ubre.decode,
        ubre.Publish(TOPIC, body),
        {"publish": TOPIC, "body": body}, "orjson",
    )
    add(
        "ubre request (JSON)", ubre.encode, ubre.decode,
        ubre.Request(17, [1, 2], name="add"),
        {"request": "add", "id": 17, "body": [1, 2]}, "orjson",
    )
    add(
        "ubre publish (binary)", lambda m: ubre.encode(m, binary=True), ubre.decode,
        ubre.Publish(TOPIC, PAYLOAD),
        {"type": 0x50, "topic": TOPIC, "body": PAYLOAD}, "msgpack",
    )

    add(
        "nydus invoke", nydus.encode, nydus.decode,
        nydus.Invoke("V1StGXR8_Z5jdHi6B-myT", "/rooms/living/temp", body),
        {"type": 1, "id": "V1StGXR8_Z5jdHi6B-myT", "path": "/rooms/living/temp", "data": body},
        "orjson",
    )
    add(
        "nydus publish", nydus.encode, nydus.decode,
        nydus.Publish("/rooms/living/temp", body),
        {"type": 4, "path": "/rooms/living/temp", "data": body}, "orjson",
    )

    add(
        "engineio message", engineio.encode, engineio.decode,
        engineio.Packet(engineio.PacketType.MESSAGE, PAYLOAD.decode("ascii")),
        {"type": 4, "data": PAYLOAD}, "orjson",
    )

    event = subble.Event(
        code=subble.MessageCode.SERVER_EVENT,
        format=subble.SerializationFormat.MSGPACK,
        datetime_ms=1_790_000_000_000,
        event_type="temperature",
        guid="0f8fad5b-d9cb-469f-a165-70867728950e",
        source="sensor-7",
        payload=PAYLOAD,
    )
    add(
        "subble event", subble.encode, lambda d: subble.decode(d, sender="server"), event,
        {"code": 26, "format": 0, "datetime": 1_790_000_000_000, "type": "temperature",
         "guid": "0f8fad5b-d9cb-469f-a165-70867728950e", "source": "sensor-7",
         "payload": PAYLOAD},
        "msgpack",
    )
    produce = subble.ProduceEvent("client-1", subble.SerializationFormat.MSGPACK,
                                  "temperature", PAYLOAD, b"req-1")
    add(
        "subble produce", subble.encode, lambda d: subble.decode(d, sender="client"), produce,
        {"code": 27, "client": "client-1", "format": 0, "type": "temperature",
         "payload": PAYLOAD, "request_data": b"req-1"},
        "msgpack",
    )

    small = PAYLOAD[:48]  # a sensor reading: fits a firmware peer's 80-byte chunk
    message = phyllo.PubSubMessage(0x10, b"temp", small)
    phyllo_envelope = {"type": 0x10, "topic": b"temp", "payload": small}
    add("phyllo message, minimal", phyllo.MINIMAL.encode, phyllo.MINIMAL.decode, message,
        phyllo_envelope, "msgpack")
    add("phyllo message, reduced", phyllo.REDUCED.encode, phyllo.REDUCED.decode, message,
        phyllo_envelope, "msgpack")
    headers = b"NATS/1.0\r\nWp: host:41/0a1b2c3d 17 - websmq\r\n\r\n"  # as the cluster sends
    delivered = nats.Msg("wireproto.topic.sensors.temps.living_room", 3, None, headers, PAYLOAD)
    add(
        "nats message (HMSG)", nats.encode, nats.decode, delivered,
        {"subject": delivered.subject, "sid": 3, "reply": None, "headers": headers,
         "payload": PAYLOAD}, "msgpack", expected=[delivered],
    )
    # The cluster's paths: the writer on the way out, the decoder on the way in.
    writer = wpheader.HeaderWriter("host:41/0a1b2c3d")
    forwarded = wpheader.WpHeader("host:41/0a1b2c3d", 17, False, "websmq")
    add(
        "wpheader forwarded", lambda h: writer.write(h.sequence, h.will, h.protocol),
        wpheader.decode, forwarded,
        {"origin": "host:41/0a1b2c3d", "sequence": 17, "will": False, "protocol": "websmq"},
        "msgpack",
    )
    add("phyllo document, minimal",
        lambda value: phyllo.MINIMAL.encode_document(b"temp", phyllo.serialize(value)),
        lambda d: phyllo.deserialize(phyllo.MINIMAL.decode_document(d)[1]),
        body, {"type": 0x40, "topic": b"temp", "body": body}, "msgpack")
    return result


def stream_feeds() -> list[tuple[str, Callable[[], Any]]]:
    """A stream delivers bytes in pieces of any size; the incremental decoders must not care.
    Each run feeds a stream of 200 messages and returns how many it decoded."""
    message = phyllo.PubSubMessage(0x10, b"temp", PAYLOAD[:48])
    phyllo_stream = phyllo.MINIMAL.encode(message) * 200
    headers = b"NATS/1.0\r\nWp: host:41/0a1b2c3d 17 - websmq\r\n\r\n"
    nats_stream = nats.encode(nats.Msg("wireproto.topic.temp", 3, None, headers, PAYLOAD)) * 200

    def feed_in(decoder: Callable[[], Any], stream: bytes, piece: int) -> Callable[[], Any]:
        pieces = [stream[i : i + piece] for i in range(0, len(stream), piece)]

        def run() -> int:
            feed = decoder().feed
            return sum(len(feed(p)) for p in pieces)

        return run

    return [
        *((f"phyllo, {piece}-byte feeds", feed_in(phyllo.StackDecoder, phyllo_stream, piece))
          for piece in (len(phyllo_stream), 64, 1)),
        *((f"nats, {piece}-byte feeds", feed_in(nats.Decoder, nats_stream, piece))
          for piece in (len(nats_stream), 4096, 64)),
    ]


def interleaved_best(funcs: dict[str, Callable[[], Any]], rounds: int, budget: float) -> dict:
    """Best microseconds per call of each function, timed in turns so that a noisy spell on a
    shared machine hits every column alike rather than one."""
    timers = {name: timeit.Timer(func) for name, func in funcs.items()}
    numbers = {}
    for name, timer in timers.items():
        number, elapsed = timer.autorange()
        numbers[name] = max(1, int(number * budget / max(elapsed, 1e-9)))
    best = dict.fromkeys(funcs, float("inf"))
    for _ in range(rounds):
        for name, timer in timers.items():
            best[name] = min(best[name], timer.timeit(numbers[name]) / numbers[name] * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats")
    args = parser.parse_args(argv)
    repeat, budget = (3, 0.02) if args.quick else (9, 0.1)

    header = f"{'case':<26} {'codec':>8} {'msgpack':>8} {'orjson':>8} {'json':>8}  vs base  goal"
    print(header)
    print("-" * len(header))
    misses = 0
    for case in cases():
        bare = interleaved_best(
            {"codec": case.roundtrip, **bare_roundtrips(case.envelope)}, repeat, budget
        )
        codec = bare["codec"]
        ratio = codec / bare[case.baseline]
        ok = ratio <= 2.0
        misses += not ok
        print(f"{case.name:<26} {codec:8.2f} {bare['msgpack']:8.2f} {bare['orjson']:8.2f}"
              f" {bare['json']:8.2f}  {ratio:5.2f}x {case.baseline:<7}"
              f" {'ok' if ok else 'MISSED'}")
    python = sys.version.split()[0]
    print(f"\nmicroseconds per encode+decode, best of {repeat} interleaved rounds; python {python}")
    print("vs base: the codec over the bare serializer it stands on; goal at most 2.00x")

    print("\nincremental decoders, 200 messages per stream (phyllo: minimal, 48-byte payloads;"
          " nats: HMSG with a Wp header, 64-byte payloads)")
    feeds = interleaved_best(dict(stream_feeds()), repeat, budget)
    for name, microseconds in feeds.items():
        print(f"  {name:<26} {microseconds / 200:8.2f} us per message")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
