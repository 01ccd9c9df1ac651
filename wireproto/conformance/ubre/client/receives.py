"""How the client handles what a server may send: requests (answered, failed, unknown), replies
to its own requests, announcements, topics it did not subscribe to, the binary format's corners,
large messages, pings, and malformed input (it must not crash: it keeps working, or closes the
connection cleanly)."""

from __future__ import annotations

import itertools

from wireproto.codecs import ubre
from wireproto.codecs.ubre import (
    Fail,
    Message,
    Publish,
    Request,
    Subscribe,
    Success,
    Unsubscribe,
)
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level, NotApplicable
from wireproto.conformance.ubre.client.sends import PUBSUB, REQRES, _request
from wireproto.conformance.ubre.client.session import (
    ANSWER,
    ASK,
    BINARY_FORMAT,
    DECIDED,
    FAILED,
    IN,
    JSON_FORMAT,
    OUT,
    Session,
    kit,
    session,
    show,
    still_works,
)

_ids = itertools.count(1)


async def _reply(s: Session, request_id: object, what: str,
                 timeout: float = 3.0) -> Message:
    """The client's success or fail for the kit's request `request_id`."""
    deadline = s.ctx.reactor.seconds() + timeout
    while True:
        message = await s.message(what, max(0.01, deadline - s.ctx.reactor.seconds()))
        if isinstance(message, (Success, Fail)) and str(message.id) == str(request_id):
            return message


def _request_to(s: Session, name: str, body: object, request_id: int | str) -> None:
    if s.binary:
        s.send(Request(str(request_id), s.body(body)))
    else:
        s.send(Request(request_id, body, name=name))


@kit.case("ubre.client.receive.request",
          "The client answers a request with a success that carries the request's id, of the "
          "same JSON type, and the handler's result",
          section=REQRES, timeout=8.0)
async def answers_request(ctx: Context) -> str | None:
    s = await session(ctx)
    spec_form = False
    for request_id in (next(_ids), f"kit-{next(_ids)}"):
        if s.binary:
            request_id = str(request_id)
        if spec_form:
            s.send(Request(request_id, {"n": 1}))
        else:
            _request_to(s, "echo", {"n": 1}, request_id)
        try:
            reply = await _reply(s, request_id, f"the answer to request {request_id!r}")
        except CaseFailed:
            if s.binary or spec_form:
                raise
            # Either dialect is the spec's: a client that reads only its own form (the
            # spec's, with no handler name) answers that one.
            spec_form = True
            request_id = f"spec-{request_id}"
            s.send(Request(request_id, {"n": 1}))
            reply = await _reply(s, request_id, f"the answer to request {request_id!r} (in "
                                 "the spec's form, the named one having gone unanswered)")
        if not isinstance(reply, Success):
            raise ctx.fail(f"request {request_id!r} was answered with {show(reply)}")
        if type(reply.id) is not type(request_id) or reply.id != request_id:
            raise ctx.fail(f"the answer to request {request_id!r} has the id {reply.id!r}")
        if reply.body != s.body({"n": 1}):
            raise ctx.fail(f"the answer's body is {show(reply.body)}, not the request's")
    return "answered requests in the spec's form only" if spec_form else None


@kit.case("ubre.client.receive.request-fail",
          "A handler that fails is answered with a fail that carries the request's id and the "
          "failure's body",
          section=REQRES, level=Level.SHOULD)
async def answers_fail(ctx: Context) -> None:
    s = await session(ctx)
    if s.binary:
        raise NotApplicable("binary requests name no handler")
    request_id = next(_ids)
    _request_to(s, "fail", "no good", request_id)
    reply = await _reply(s, request_id, "the fail")
    if not isinstance(reply, Fail) or reply.id != request_id:
        raise ctx.fail(f"the request was answered with {show(reply)}")
    if reply.body != "no good":
        raise ctx.fail(f"the fail's body is {show(reply.body)}, not the one failed with")


@kit.case("ubre.client.receive.request-unknown",
          "A request for a handler the client does not have is answered with a fail (ubre.js "
          "says \"NotFound\"), not left waiting",
          section=REQRES, level=Level.SHOULD, decision=DECIDED)
async def unknown_handler(ctx: Context) -> str:
    s = await session(ctx)
    if s.binary:
        raise NotApplicable("binary requests name no handler")
    request_id = next(_ids)
    _request_to(s, "conformance-no-such-handler", None, request_id)
    reply = await _reply(s, request_id, "the fail")
    if not isinstance(reply, Fail):
        raise ctx.fail(f"it was answered with {show(reply)}")
    return f"fail body {show(reply.body)}"


@kit.case("ubre.client.receive.request-spec-form",
          "What the client does with a request in the spec's form, {\"request\": id} with no "
          "handler name",
          section=REQRES, level=Level.INFORMATION)
async def spec_form(ctx: Context) -> str:
    s = await session(ctx)
    if s.binary:
        raise NotApplicable("the binary format has only this form")
    request_id = f"spec-{next(_ids)}"
    s.send(Request(request_id, "spec"))
    try:
        reply = await _reply(s, request_id, "an answer", 1.5)
    except CaseFailed:
        await still_works(ctx, s, "a spec-form request")
        return "no answer (the request was dropped)"
    return f"answered with {show(reply)}"


@kit.case("ubre.client.receive.success",
          "A success for the client's request delivers its body to the requester",
          section=REQRES)
async def gets_success(ctx: Context) -> None:
    s = await session(ctx)
    s.send(Publish(ASK, s.body("q")))
    request = await _request(s)
    s.send(Success(request.id, s.body({"answer": [1, 2]})))
    published = await s.publish_on(ANSWER, f"the success body published on {ANSWER}")
    if published.body != s.body({"answer": [1, 2]}):
        raise ctx.fail(f"the requester got {show(published.body)}")


@kit.case("ubre.client.receive.fail",
          "A fail for the client's request delivers its body to the requester as a failure",
          section=REQRES)
async def gets_fail(ctx: Context) -> None:
    s = await session(ctx)
    s.send(Publish(ASK, s.body("q")))
    request = await _request(s)
    s.send(Fail(request.id, s.body("refused")))
    published = await s.publish_on(FAILED, f"the fail body published on {FAILED}")
    if published.body != s.body("refused"):
        raise ctx.fail(f"the requester's failure was {show(published.body)}")


@kit.case("ubre.client.receive.reply-id-type",
          "Whether a success whose id has another JSON type than the request's (\"1\" for 1) is "
          "taken as its reply",
          section=REQRES, level=Level.INFORMATION, decision=DECIDED)
async def reply_id_type(ctx: Context) -> str:
    s = await session(ctx)
    if s.binary:
        raise NotApplicable("binary ids are text")
    s.send(Publish(ASK, "q"))
    request = await _request(s)
    other: int | str = str(request.id)
    if isinstance(request.id, str):
        if not request.id.isdigit():
            raise NotApplicable(f"the id {request.id!r} has no integer twin")
        other = int(request.id)
    s.send(Success(other, "mistyped"))
    try:
        published = await s.publish_on(ANSWER, "an answer", 1.0)
    except CaseFailed:
        s.send(Success(request.id, "typed"))
        await s.publish_on(ANSWER, "the answer with the right id")
        return f"the reply with id {other!r} was not taken for request {request.id!r}"
    return f"the reply with id {other!r} was taken for request {request.id!r} " \
        f"({show(published.body)})"


@kit.case("ubre.client.receive.unsolicited-reply",
          "A success or fail for an id the client never used is ignored, and the client keeps "
          "working",
          section=REQRES)
async def unsolicited(ctx: Context) -> str:
    s = await session(ctx)
    s.send(Success("conformance-never-asked", s.body("x")))
    s.send(Fail(987654321 if not s.binary else "987654321", s.body("y")))
    return await still_works(ctx, s, "replies to requests never made")


@kit.case("ubre.client.receive.announcements",
          "The server's own subscribes and unsubscribes, with and without a body, are taken "
          "without harm",
          section=PUBSUB)
async def announcements(ctx: Context) -> str:
    s = await session(ctx)
    s.send(Subscribe("conformance/x", s.body({"since": 5})))
    s.send(Unsubscribe("conformance/x"))
    s.send(Unsubscribe("conformance/never-subscribed", s.body("b")))
    return await still_works(ctx, s, "announcements")


@kit.case("ubre.client.receive.other-topic",
          "A publish on a topic the client did not subscribe to reaches none of its callbacks",
          section=PUBSUB, level=Level.SHOULD)
async def other_topic(ctx: Context) -> None:
    s = await session(ctx)
    s.send(Publish("conformance/in/other", s.body("not for you")))
    s.send(Publish(IN, s.body("for you")))
    echoed = await s.publish_on(OUT, "the echo")
    if echoed.body != s.body("for you"):
        raise ctx.fail(f"it echoed {show(echoed.body)}: the publish on another topic reached "
                       "the callback of conformance/in")


@kit.case("ubre.client.receive.after-unsubscribe",
          "After unsubscribing, a publish on that topic reaches no callback",
          section=PUBSUB, level=Level.SHOULD)
async def after_unsubscribe(ctx: Context) -> None:
    s = await session(ctx)
    from wireproto.conformance.ubre.client.session import LEAVE

    s.send(Publish(LEAVE, s.body("go")))
    deadline = ctx.reactor.seconds() + 3.0
    while True:
        message = await s.message("the unsubscribe", max(0.01, deadline - ctx.reactor.seconds()))
        if isinstance(message, Unsubscribe) and message.topic == IN:
            break
    s.send(Publish(IN, s.body("late")))
    try:
        echoed = await s.publish_on(OUT, "no echo", 1.0)
    except CaseFailed:
        await s.rejoin()
        return
    raise ctx.fail(f"it still echoed {show(echoed.body)} after unsubscribing")


@kit.case("ubre.client.receive.burst",
          "200 publishes sent at once all reach the callback, in order",
          section=PUBSUB, level=Level.SHOULD, timeout=8.0)
async def burst(ctx: Context) -> None:
    s = await session(ctx)
    for n in range(200):
        s.send(Publish(IN, s.body(n)))
    for n in range(200):
        echoed = await s.publish_on(OUT, f"echo {n + 1} of 200")
        if echoed.body != s.body(n):
            raise ctx.fail(f"echo {n + 1} of 200 carried {show(echoed.body)}")


@kit.case("ubre.client.receive.large",
          "A publish with a 256 KiB body is delivered whole",
          section=PUBSUB, level=Level.SHOULD, timeout=8.0)
async def large(ctx: Context) -> None:
    s = await session(ctx)
    body = "x" * (256 * 1024)
    echoed = await s.echo(body, "the echo of 256 KiB")
    if echoed.body != s.body(body):
        raise ctx.fail(f"the echo's body has {len(echoed.body)} characters")


@kit.case("ubre.client.receive.huge",
          "A 20 MiB publish (over most clients' limits) does not crash the client: it is "
          "delivered, or the client closes the connection",
          section=PUBSUB, timeout=15.0)
async def huge(ctx: Context) -> str:
    s = await session(ctx)
    s.send(Publish(IN, s.body("y" * (20 * 1024 * 1024))))
    try:
        echoed = await s.publish_on(OUT, "the echo", 6.0)
        return f"delivered ({len(echoed.body or '')} characters echoed)"
    except CaseFailed:
        return await still_works(ctx, s, "a 20 MiB publish")


@kit.case("ubre.client.receive.ping",
          "A WebSocket ping is answered with a pong carrying its payload (RFC 6455)",
          section="RFC 6455 5.5.2")
async def ping(ctx: Context) -> None:
    s = await session(ctx)
    if not s.over_websocket:
        raise NotApplicable("WebSocket only")
    pongs = await s.probe.ping(b"conformance")
    if not pongs:
        raise ctx.fail("no pong came within 3 s")
    if b"conformance" not in pongs:  # a pong may also come unasked, as a heartbeat
        raise ctx.fail(f"no pong carried the ping's payload: {pongs[:5]!r}")


# Malformed and unexpected input: each must leave the client working, or closed cleanly.
HOSTILE_JSON = {
    "invalid-json": b"{not json",
    "truncated-json": b'{"publish":"conformance/in","body":',
    "not-an-object": b'["publish","conformance/in"]',
    "unknown-type": b'{"hello":"conformance/in","body":1}',
    "wrong-types": b'{"publish":5,"body":1}',
    "bad-reply-id": b'{"success":{"id":1},"body":1}',
    "request-without-name": b'{"request":null,"id":3}',
    "two-types": b'{"publish":"conformance/in","subscribe":"conformance/in","body":"two"}',
    "deep-nesting": b'{"publish":"conformance/x","body":' + b"[" * 5000 + b"]" * 5000 + b"}",
}


def _hostile(name: str, data: bytes) -> None:
    async def body(ctx: Context) -> str:
        s = await session(ctx)
        s.send_raw(data, binary=False)
        return await still_works(ctx, s, f"the {name} message")

    body.__name__ = name.replace("-", "_")
    kit.case(f"ubre.client.malformed.{name}",
             f"A malformed or unexpected JSON message ({name.replace('-', ' ')}) does not crash "
             "the client: it keeps working, or closes the connection",
             section=JSON_FORMAT)(body)


for _name, _data in HOSTILE_JSON.items():
    _hostile(_name, _data)


@kit.case("ubre.client.malformed.empty",
          "Empty messages (a text and a binary frame) do not crash the client",
          section=JSON_FORMAT)
async def empty(ctx: Context) -> str:
    s = await session(ctx)
    s.send_raw(b"", binary=False)
    if not s.text_only:
        s.send_raw(b"", binary=True)
    return await still_works(ctx, s, "empty messages")


@kit.case("ubre.client.malformed.binary-truncated",
          "A truncated binary message (a short header; a body length past the end) does not "
          "crash the client",
          section=BINARY_FORMAT)
async def binary_truncated(ctx: Context) -> str:
    s = await session(ctx)
    s.send_raw(b"P\x00", binary=True)
    s.send_raw(b"P\x00\x10\x00\x00\x00\x05conformance/in", binary=True)
    return await still_works(ctx, s, "truncated binary messages")


@kit.case("ubre.client.malformed.binary-unknown-type",
          "A binary message of an unknown type does not crash the client",
          section=BINARY_FORMAT)
async def binary_unknown(ctx: Context) -> str:
    s = await session(ctx)
    s.send_raw(b"Z\x00\x02\x00\x00\x00\x01abc", binary=True)
    return await still_works(ctx, s, "a binary message of type Z")


@kit.case("ubre.client.receive.binary-to-json-client",
          "What a JSON client does with a binary-format publish on its topic",
          section=BINARY_FORMAT, level=Level.INFORMATION)
async def binary_to_json(ctx: Context) -> str:
    s = await session(ctx)
    if s.binary or s.text_only:
        raise NotApplicable("a JSON client over a transport with binary frames")
    s.send_raw(ubre.encode(Publish(IN, b'"bin"'), binary=True), binary=True)
    try:
        echoed = await s.publish_on(OUT, "the echo", 1.5)
        return f"delivered: it echoed {show(echoed.body)}"
    except CaseFailed:
        how = await still_works(ctx, s, "a binary publish")
        return f"not delivered; {how}"


@kit.case("ubre.client.receive.binary-streaming",
          "A binary publish with body length 0xFFFFFFFF delivers the body that runs to the end of "
          "the message",
          section=BINARY_FORMAT, level=Level.SHOULD)
async def streaming(ctx: Context) -> None:
    s = await session(ctx)
    if not s.binary:
        raise NotApplicable("binary clients only")
    s.send(Publish(IN, b"streamed body", streaming=True))
    echoed = await s.publish_on(OUT, "the echo")
    if echoed.body != b"streamed body":
        raise ctx.fail(f"the streamed body came back as {show(echoed.body)}")


@kit.case("ubre.client.receive.binary-fail-0x63",
          "A binary fail of type 0x63 (the spec table's typo for 'f') is read as a fail",
          section=BINARY_FORMAT, level=Level.SHOULD, decision=DECIDED)
async def fail_0x63(ctx: Context) -> None:
    s = await session(ctx)
    if not s.binary:
        raise NotApplicable("binary clients only")
    s.send(Publish(ASK, b"q"))
    request = await _request(s)
    name = str(request.id).encode()
    s.send_raw(b"c" + len(name).to_bytes(2, "big") + (4).to_bytes(4, "big") + name + b"nope",
               binary=True)
    published = await s.publish_on(FAILED, f"the fail body published on {FAILED}")
    if published.body != b"nope":
        raise ctx.fail(f"the requester's failure was {show(published.body)}")



