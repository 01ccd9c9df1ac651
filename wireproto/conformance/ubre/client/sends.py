"""What the client sends: its subscribes, its publishes and their bodies, its requests and their
ids, its unsubscribes."""

from __future__ import annotations

import json

from wireproto.codecs import ubre
from wireproto.codecs.ubre import NO_BODY, Publish, Request, Subscribe, Unsubscribe
from wireproto.conformance.context import Context
from wireproto.conformance.model import Level, NotApplicable
from wireproto.conformance.ubre.client.session import (
    ASK,
    DECIDED,
    IN,
    JSON_FORMAT,
    LEAVE,
    OUT,
    Session,
    kit,
    session,
    show,
)

PUBSUB = "JSON Message Format: pub / sub"
REQRES = "JSON Message Format: req / res"


@kit.case("ubre.client.send.subscribe",
          "The client's subscribe is a UBRE subscribe: a JSON object whose \"subscribe\" is the "
          "topic as a string, or a binary message of type S whose name is the topic",
          section=PUBSUB)
async def send_subscribe(ctx: Context) -> str:
    probe = await ctx.accept()
    received = await probe.receive(what="the client's first message")
    data = received.data
    if ubre.is_json(data):
        value = json.loads(data)
        if not isinstance(value, dict) or not isinstance(value.get("subscribe"), str):
            raise ctx.fail(f"its first message is not a subscribe: {show(data)}")
        return "JSON"
    message = ubre.decode(data)
    if not isinstance(message, Subscribe) or data[:1] != b"S":
        raise ctx.fail(f"its first message is not a subscribe: {show(message)}")
    return "binary"


@kit.case("ubre.client.send.text-frames",
          "Over WebSocket, a JSON client sends its messages in text frames, compact, starting "
          "with '{' (what a ubre.js peer reads)",
          section=JSON_FORMAT, level=Level.SHOULD, decision=DECIDED)
async def text_frames(ctx: Context) -> None:
    s = await session(ctx)
    if s.binary or not s.over_websocket:
        raise NotApplicable("JSON over WebSocket only")
    s.send(Publish(IN, {"a": [1, 2]}))
    await s.publish_on(OUT, "the echo")
    for exchange in s.probe.recorder.exchanges:
        if exchange.direction != "received" or exchange.connection != s.probe.number:
            continue
        data = exchange.data or b""
        if exchange.binary:
            raise ctx.fail(f"it sent JSON in a binary frame: {show(data)}")
        if data[:1] != b"{" or data != json.dumps(json.loads(data), separators=(",", ":"),
                                                    ensure_ascii=False).encode():
            raise ctx.fail(f"it sent JSON that is not compact: {show(data)}")


@kit.case("ubre.client.send.publish",
          "The client's publish names the topic and carries the body it was given",
          section=PUBSUB)
async def send_publish(ctx: Context) -> None:
    s = await session(ctx)
    echoed = await s.echo("hello")
    if echoed.body != s.body("hello"):
        raise ctx.fail(f"the publish came with the body {show(echoed.body)}")


# JSON values of each kind, and the bytes a binary client must carry as they are.
JSON_BODIES = ["text", "", 0, -12, 2**53 - 1, 1.5, True, False, [], [1, "a", None],
               {}, {"nested": {"list": [1, {"x": "y"}]}}, "\u00e9\u4e2d\U0001f600",
               "quote \" and \\ and \n"]
BINARY_BODIES = [b"\x00", b"\xff\xfe\x00\x01", bytes(range(256)), b"{not json", b"\n\r\n"]


@kit.case("ubre.client.send.bodies",
          "Every JSON value (or, in binary, any bytes) the client publishes arrives as it was "
          "given: strings, numbers, booleans, arrays, objects, nested, non-ASCII",
          section=PUBSUB)
async def bodies(ctx: Context) -> None:
    s = await session(ctx)
    for body in BINARY_BODIES if s.binary else JSON_BODIES:
        echoed = await s.echo(body, f"the echo of {show(body)}")
        if echoed.body != body or type(echoed.body) is not type(body):
            raise ctx.fail(f"the body {show(body)} came back as {show(echoed.body)}")


@kit.case("ubre.client.send.null-body",
          "A publish whose body is null is passed on with a null body: no body and null are not "
          "the same",
          section=PUBSUB, level=Level.SHOULD, decision=DECIDED)
async def null_body(ctx: Context) -> None:
    s = await session(ctx)
    if s.binary:
        raise NotApplicable("the binary format has no null")
    s.send(Publish(IN, None))
    echoed = await s.publish_on(OUT, "the echo")
    if echoed.body is not None:
        raise ctx.fail(f"the null body came back as {show(echoed.body)}")


@kit.case("ubre.client.send.no-body",
          "A publish without a body is passed on without one (no \"body\" key, or body length 0)",
          section=PUBSUB, level=Level.SHOULD, decision=DECIDED)
async def no_body(ctx: Context) -> None:
    s = await session(ctx)
    s.send(Publish(IN))
    echoed = await s.publish_on(OUT, "the echo")
    if echoed.body is not NO_BODY:
        raise ctx.fail(f"the publish without a body came back with {show(echoed.body)}")


@kit.case("ubre.client.send.request",
          "The client's request carries an id and the body it was given; in JSON it names the "
          "handler as {\"request\": name, \"id\": id} (or is the spec's {\"request\": id})",
          section=REQRES)
async def send_request(ctx: Context) -> str:
    s = await session(ctx)
    body = s.body({"question": 42})
    s.send(Publish(ASK, body))
    request = await _request(s)
    if request.body != body:
        raise ctx.fail(f"the request came with the body {show(request.body)}, not {show(body)}")
    if not s.binary and request.name is not None and request.name != "echo":
        raise ctx.fail(f"the request names {show(request.name)}, not 'echo'")
    form = "ubre.js's named form" if request.name is not None else "the spec's id form"
    return f"{form}, id {request.id!r}"


async def _request(s: Session, what: str = "the client's request") -> Request:
    deadline = s.ctx.reactor.seconds() + 3.0
    while True:
        message = await s.message(what, max(0.01, deadline - s.ctx.reactor.seconds()))
        if isinstance(message, Request):
            return message


@kit.case("ubre.client.send.request-id",
          "A request's id is a JSON string or integer (what a reply can give back unchanged)",
          section=REQRES, level=Level.SHOULD, decision=DECIDED)
async def request_id(ctx: Context) -> str:
    s = await session(ctx)
    s.send(Publish(ASK, s.body("id")))
    request = await _request(s)
    # The codec refuses any other id; a binary id is text by construction.
    return f"{type(request.id).__name__} {request.id!r}"


@kit.case("ubre.client.send.request-ids-unique",
          "Requests waiting for their replies at the same time have different ids",
          section=REQRES)
async def ids_unique(ctx: Context) -> None:
    s = await session(ctx)
    for n in range(5):
        s.send(Publish(ASK, s.body(f"q{n}")))
    seen: dict[str, object] = {}
    for n in range(5):
        request = await _request(s, f"request {n + 1} of 5")
        key = json.dumps(request.id)
        if key in seen:
            raise ctx.fail(f"two requests waiting at once share the id {request.id!r}")
        seen[key] = request.body


@kit.case("ubre.client.send.unsubscribe",
          "The client tells the server when it unsubscribes: {\"unsubscribe\": topic} (in binary, "
          "wireproto's U 0x55)",
          section=PUBSUB, level=Level.SHOULD, decision=DECIDED)
async def send_unsubscribe(ctx: Context) -> str:
    s = await session(ctx)
    s.send(Publish(LEAVE, s.body("go")))
    deadline = ctx.reactor.seconds() + 3.0
    while True:
        message = await s.message("the unsubscribe from conformance/in",
                                  max(0.01, deadline - ctx.reactor.seconds()))
        if isinstance(message, Unsubscribe) and message.topic == IN:
            await s.rejoin()
            return "with a body" if message.body is not NO_BODY else "without a body"
