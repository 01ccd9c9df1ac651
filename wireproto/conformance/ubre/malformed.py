"""The UBRE kit's malformed input: one case for every kind of message wireproto's codec
refuses (wireproto.codecs.ubre), and a few that are valid JSON but hard to carry.

UBRE has no error message for what cannot be read (a fail needs a request's id), so a server
may close the connection or ignore the message; it must not act on it, and it must go on
serving everyone else (docs/ubre.md, "The broker: wireproto's UBRE server")."""

from __future__ import annotations

import struct
from collections.abc import Callable

from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level
from wireproto.conformance.ubre.common import (
    BINARY_FORMAT,
    BROKER,
    DECIDED,
    FORMATS,
    JSON_FORMAT,
    expect_publish,
    json_bytes,
    kit,
    refused,
    subscriber,
)

# Each malformed message is (bytes, send as a binary frame), made for the watched topic.
Malformed = Callable[[str], bytes]


def _header(code: int, name_length: int, body_length: int) -> bytes:
    return struct.pack(">BHI", code, name_length, body_length)


async def _judge(ctx: Context, make: Malformed, binary: bool) -> str:
    topic = ctx.topic("malformed")
    watcher = await subscriber(ctx, topic)
    probe = await ctx.connect()
    probe.send(make(topic), binary=binary)
    return await refused(ctx, probe, watcher, topic)


def _case(id: str, title: str, make: Malformed, *, binary: bool, section: str,
          level: Level = Level.MUST, decision: str = "") -> None:
    async def body(ctx: Context) -> str:
        return await _judge(ctx, make, binary)

    body.__name__ = id.rsplit(".", 1)[1].replace("-", "_")
    kit.case(id, title, section=section, level=level, decision=decision, harmful=True)(body)


def _json(text: str) -> Malformed:
    return lambda topic: text.replace("TOPIC", json_bytes(topic).decode()).encode()


_case("ubre.malformed.json-invalid", "Invalid JSON (a message cut short) is refused",
      _json('{"publish":TOPIC,"body":'), binary=False, section=JSON_FORMAT)
_case("ubre.malformed.json-not-object", "A JSON array instead of an object is refused",
      _json('["publish",TOPIC]'), binary=False, section=JSON_FORMAT)
_case("ubre.malformed.json-scalar", "A JSON string instead of an object is refused",
      _json("TOPIC"), binary=False, section=JSON_FORMAT)
_case("ubre.malformed.json-no-type-key", "A JSON object with no type key is refused",
      _json('{"topic":TOPIC,"body":1}'), binary=False, section=JSON_FORMAT)
_case("ubre.malformed.json-two-type-keys", "A JSON object with two type keys (subscribe and "
      "publish) is refused", _json('{"subscribe":TOPIC,"publish":TOPIC,"body":1}'),
      binary=False, section=JSON_FORMAT, level=Level.SHOULD, decision=DECIDED)
_case("ubre.malformed.json-topic-not-string", "A publish whose topic is not a string is "
      "refused", _json('{"publish":[TOPIC],"body":1}'), binary=False, section=JSON_FORMAT)
_case("ubre.malformed.json-id-true", "A request whose id is true is refused, not answered",
      _json('{"request":true}'), binary=False, section=JSON_FORMAT, level=Level.SHOULD,
      decision=DECIDED)
_case("ubre.malformed.json-id-fraction", "A request whose id is 1.5 is refused, not answered",
      _json('{"request":"x","id":1.5}'), binary=False, section=JSON_FORMAT,
      level=Level.SHOULD, decision=DECIDED)
_case("ubre.malformed.json-id-null", "A request whose id is null is refused, not answered",
      _json('{"request":null}'), binary=False, section=JSON_FORMAT, level=Level.SHOULD,
      decision=DECIDED)
_case("ubre.malformed.json-id-structured", "A request whose id is an array is refused, not "
      "answered", _json('{"request":[1]}'), binary=False, section=JSON_FORMAT,
      level=Level.SHOULD, decision=DECIDED)
_case("ubre.malformed.json-name-not-string", "A ubre.js-form request whose handler name is not "
      "a string is refused, not answered", _json('{"request":5,"id":1}'), binary=False,
      section=JSON_FORMAT, level=Level.SHOULD, decision=DECIDED)
_case("ubre.malformed.json-not-utf8", "JSON that is not UTF-8 (in a binary frame) is refused",
      lambda topic: b'{"publish":' + json_bytes(topic) + b',"body":"\xff\xfe"}', binary=True,
      section=JSON_FORMAT)
_case("ubre.malformed.json-deep-nesting", "A body of 100000 nested arrays is refused without "
      "harm", lambda topic: b'{"publish":' + json_bytes(topic) + b',"body":' + b"[" * 100000
      + b"]" * 100000 + b"}", binary=False, section=JSON_FORMAT, level=Level.SHOULD)
_case("ubre.malformed.empty", "An empty binary message is refused",
      lambda topic: b"", binary=True, section=BINARY_FORMAT)
_case("ubre.malformed.unknown-type", "A binary message of an unknown type ('X') is refused",
      lambda topic: _header(0x58, len(topic.encode()), 1) + topic.encode() + b"1",
      binary=True, section=BINARY_FORMAT)
_case("ubre.malformed.binary-short-header", "A binary message shorter than its 7-byte header "
      "is refused", lambda topic: b"P\x00\x01", binary=True, section=BINARY_FORMAT)
_case("ubre.malformed.binary-name-truncated", "A binary message whose name length is more "
      "than the bytes that follow is refused",
      lambda topic: _header(0x50, len(topic.encode()) + 100, 0) + topic.encode(),
      binary=True, section=BINARY_FORMAT)
_case("ubre.malformed.binary-body-truncated", "A binary publish whose body length is more than "
      "the bytes that follow is refused, not delivered",
      lambda topic: _header(0x50, len(topic.encode()), 100) + topic.encode() + b"abc",
      binary=True, section=BINARY_FORMAT)
_case("ubre.malformed.binary-trailing-bytes", "A binary publish with bytes after its declared "
      "body is refused, not delivered",
      lambda topic: _header(0x50, len(topic.encode()), 1) + topic.encode() + b"ab",
      binary=True, section=BINARY_FORMAT, level=Level.SHOULD, decision=DECIDED)
_case("ubre.malformed.binary-no-body-trailing", "A binary publish with body length 0 (no "
      "body) followed by bytes is refused, not delivered",
      lambda topic: _header(0x50, len(topic.encode()), 0) + topic.encode() + b"ab",
      binary=True, section=BINARY_FORMAT, level=Level.SHOULD, decision=DECIDED)
_case("ubre.malformed.binary-name-not-utf8", "A binary publish whose topic is not UTF-8 is "
      "refused", lambda topic: _header(0x50, len(topic.encode()) + 2, 1) + topic.encode()
      + b"\xff\xfe" + b"1", binary=True, section=BINARY_FORMAT, level=Level.SHOULD,
      decision=DECIDED)


@kit.case("ubre.malformed.binary-in-text-frame", "A binary-format publish in a WebSocket text "
          "frame is refused (text frames carry JSON)", section=BINARY_FORMAT,
          level=Level.SHOULD, decision=FORMATS, harmful=True)
async def binary_in_text_frame(ctx: Context) -> str:
    if not ctx.target.over_websocket:
        return "not a WebSocket: frames have no type"
    return await _judge(ctx, lambda topic: _header(0x50, len(topic.encode()), 1)
                        + topic.encode() + b"1", binary=False)


@kit.case("ubre.malformed.closes", "A message that is not UBRE closes the connection that sent "
          "it (1002 on WebSocket), so its sender learns it was not read", section=JSON_FORMAT,
          level=Level.SHOULD, decision=BROKER, harmful=True)
async def malformed_closes(ctx: Context) -> str:
    probe = await ctx.connect()
    probe.send(b'{"publish":', binary=False)
    closed = await probe.closed(2.0)
    if ctx.target.over_websocket and closed.code != 1002:
        raise ctx.fail(f"{closed.described}, not 1002")
    return closed.described


async def _valid_but_hard(ctx: Context, body: bytes) -> str:
    topic = ctx.topic("hard")
    listener = await subscriber(ctx, topic)
    probe = await ctx.connect()
    probe.send(b'{"publish":' + json_bytes(topic) + b',"body":' + body + b"}", binary=False)
    try:
        got = await expect_publish(listener, topic, timeout=1.0)
    except CaseFailed:
        how = "closed the connection" if probe.closed_as is not None else "dropped it"
        return f"not delivered: the server {how}"
    return f"delivered, the body as {got.body!r:.60}"


@kit.case("ubre.malformed.json-huge-integer", "What the server does with a body that is an "
          "integer of 5000 digits (valid JSON)", section=JSON_FORMAT,
          level=Level.INFORMATION, harmful=True)
async def huge_integer(ctx: Context) -> str:
    return await _valid_but_hard(ctx, b"9" * 5000)


@kit.case("ubre.malformed.json-number-overflow", "What the server does with a body of 1e999 "
          "(valid JSON, beyond a double)", section=JSON_FORMAT, level=Level.INFORMATION,
          harmful=True)
async def number_overflow(ctx: Context) -> str:
    return await _valid_but_hard(ctx, b"1e999")
