"""The UBRE kit's request/response cases: answers, ids and their types, pairing, both formats.

The spec's request is `{"request": id}`: it names no handler, and a success and a fail are both
answers. The MUST cases send that form and take either answer. ubre.js's form (a handler's
name and an `id`) and its habits (a fail "NotFound" for a name no handler has, ids matched with
`===`) are SHOULD cases: the kit asks for names no server has (docs/ubre.md, "The broker:
wireproto's UBRE server")."""

from __future__ import annotations

from wireproto.codecs.ubre import Fail, Id, Message, Request, Success
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level
from wireproto.conformance.probe import Probe
from wireproto.conformance.ubre.common import (
    BINARY_FORMAT,
    BROKER,
    DECIDED,
    answer_to,
    decoded,
    kit,
    next_message,
    quiet,
    send,
    send_json,
    show,
    still_serves,
    sync,
)

REQRES = "JSON Message Format: req / res"
UNKNOWN = "conformance.no-such-request"


async def _answer(probe: Probe, request_id: Id, what: str = "") -> Message:
    """The next message, which must answer `request_id` (same id, same type)."""
    message = await next_message(probe, f"the answer to request {show(request_id)}{what}")
    if not isinstance(message, (Success, Fail)):
        raise CaseFailed(f"expected a success or fail for {show(request_id)}, got "
                         f"{show(message)}")
    if not answer_to(message, request_id):
        raise CaseFailed(f"the answer to request {show(request_id)} has the id "
                         f"{show(message.id)} ({type(message.id).__name__})")
    return message


@kit.case("ubre.request.unknown-name", "A request (ubre.js form) to a name no handler has gets "
          "one answer, a fail, with its id", section=REQRES, level=Level.SHOULD,
          decision=BROKER)
async def request_unknown(ctx: Context) -> None:
    probe = await ctx.connect()
    send(probe, Request(1, [1, 2], name=UNKNOWN))
    answer = await _answer(probe, 1)
    if not isinstance(answer, Fail):
        raise ctx.fail(f"a request no handler takes succeeded: {show(answer)}")
    await quiet(probe, 0.4, "one answer only")


@kit.case("ubre.request.not-found-body", "The fail for a request no handler takes has the body "
          "\"NotFound\", as ubre.js says", section=REQRES, level=Level.SHOULD, decision=BROKER)
async def request_not_found_body(ctx: Context) -> None:
    probe = await ctx.connect()
    send(probe, Request(1, name=UNKNOWN))
    answer = await _answer(probe, 1)
    if not isinstance(answer, Fail) or answer.body != "NotFound":
        raise ctx.fail(f"the answer is {show(answer)}")


@kit.case("ubre.request.spec-form", "A request in the spec's form ({\"request\": id}) gets one "
          "answer, a success or a fail, with that id", section=REQRES)
async def request_spec_form(ctx: Context) -> None:
    probe = await ctx.connect()
    send_json(probe, {"request": "unique id", "body": "some request body"})
    await _answer(probe, "unique id")
    await quiet(probe, 0.4, "one answer only")


@kit.case("ubre.request.int-id", "A request with the integer id 7 is answered with 7, an "
          "integer, not \"7\" (ubre.js matches ids with ===)", section=REQRES,
          level=Level.SHOULD, decision=DECIDED)
async def request_int_id(ctx: Context) -> None:
    probe = await ctx.connect()
    send(probe, Request(7, name=UNKNOWN))
    await _answer(probe, 7)


@kit.case("ubre.request.string-id", "A request with the string id \"7\" is answered with \"7\", "
          "a string", section=REQRES)
async def request_string_id(ctx: Context) -> None:
    probe = await ctx.connect()
    send(probe, Request("7"))
    await _answer(probe, "7")


@kit.case("ubre.request.spec-form-int-id", "A spec-form request whose id is an integer is "
          "answered with that integer", section=REQRES, level=Level.SHOULD, decision=DECIDED)
async def request_spec_int(ctx: Context) -> None:
    probe = await ctx.connect()
    send(probe, Request(42))
    await _answer(probe, 42)


@kit.case("ubre.request.unicode-id", "A request whose id is non-ASCII text is answered with the "
          "same text", section=REQRES)
async def request_unicode_id(ctx: Context) -> None:
    probe = await ctx.connect()
    request_id = "zé-中-\U0001f600"
    send(probe, Request(request_id))
    await _answer(probe, request_id)


@kit.case("ubre.request.pairing", "Twelve requests at once, with ids 1 and \"1\" among them, "
          "each get one answer with their own id and id type", section=REQRES,
          level=Level.SHOULD, decision=DECIDED)
async def request_pairing(ctx: Context) -> None:
    probe = await ctx.connect()
    ids: list[Id] = [1, "1", 2, "2", 0, "", "a", -5, 2**53, "x y", "\"q\"", 99]
    for request_id in ids:
        send(probe, Request(request_id, {"n": show(request_id)}, name=UNKNOWN))
    waiting = list(ids)
    while waiting:
        message = await next_message(probe, f"answers to {len(waiting)} more requests")
        if not isinstance(message, (Success, Fail)):
            raise ctx.fail(f"expected an answer, got {show(message)}")
        match = next((i for i, want in enumerate(waiting) if answer_to(message, want)), None)
        if match is None:
            raise ctx.fail(f"an answer with the id {show(message.id)} "
                           f"({type(message.id).__name__}) matches no request still waiting")
        waiting.pop(match)
    await quiet(probe, 0.4, "no more answers")


@kit.case("ubre.request.spec-form-pairing", "Twelve spec-form requests at once, with string "
          "ids, each get one answer with their own id", section=REQRES)
async def request_spec_pairing(ctx: Context) -> None:
    probe = await ctx.connect()
    ids = [str(n) for n in range(1, 10)] + ["", "x y", "\"q\""]
    for request_id in ids:
        send(probe, Request(request_id, {"n": request_id}))
    waiting = list(ids)
    while waiting:
        message = await next_message(probe, f"answers to {len(waiting)} more requests")
        if not isinstance(message, (Success, Fail)) or not isinstance(message.id, str) \
                or message.id not in waiting:
            raise ctx.fail(f"expected an answer to one of {len(waiting)} requests, got "
                           f"{show(message)}")
        waiting.remove(message.id)
    await quiet(probe, 0.4, "no more answers")


@kit.case("ubre.request.answered-once", "A request gets exactly one answer", section=REQRES)
async def request_once(ctx: Context) -> None:
    probe = await ctx.connect()
    send(probe, Request("once"))
    await _answer(probe, "once")
    await quiet(probe, 0.8, "no second answer")


@kit.case("ubre.request.bodies", "Requests with a null, empty-string, array and object body "
          "and with none are each answered", section=REQRES)
async def request_bodies(ctx: Context) -> None:
    probe = await ctx.connect()
    bodies: list[object] = [None, "", [], {"a": [1, {"b": None}]}]
    send(probe, Request("none"))
    for number, body in enumerate(bodies):
        send(probe, Request(f"b{number}", body))
    await _answer(probe, "none")
    for number in range(len(bodies)):
        await _answer(probe, f"b{number}")


@kit.case("ubre.request.other-connection", "An answer goes only to the connection that asked",
          section=REQRES)
async def request_other_connection(ctx: Context) -> None:
    asker, other = await ctx.connect(), await ctx.connect()
    await sync(ctx, other)
    send(asker, Request("5"))
    await _answer(asker, "5")
    await quiet(other, 0.4, "no answer to another connection's request")


@kit.case("ubre.request.binary", "A binary request gets one answer with its id, a success or "
          "a fail", section=BINARY_FORMAT)
async def request_binary(ctx: Context) -> None:
    probe = await ctx.connect()
    send(probe, Request("b1", b"body"), binary=True)
    message = await next_message(probe, "the answer to the binary request")
    if not isinstance(message, (Success, Fail)) or str(message.id) != "b1":
        raise ctx.fail(f"expected an answer to b1, got {show(message)}")
    await quiet(probe, 0.4, "one answer only")


@kit.case("ubre.request.binary-answer-format", "A binary request is answered in the binary "
          "format (on WebSocket, in a binary frame)", section=BINARY_FORMAT,
          level=Level.SHOULD, decision=BROKER)
async def request_binary_format(ctx: Context) -> None:
    probe = await ctx.connect()
    send(probe, Request("b2"), binary=True)
    while True:
        received = await probe.receive(what="the answer to the binary request")
        message = decoded(received)
        if isinstance(message, (Success, Fail)):
            break
    if received.data[:1] == b"{" or received.data[:1].isspace():
        raise ctx.fail("the answer came in the JSON format")
    if ctx.target.over_websocket and not received.binary:
        raise ctx.fail("the answer came in a text frame")


@kit.case("ubre.request.binary-fail-type", "A binary fail is written with type 0x66 ('f'; the "
          "spec's 0x63 is a typo)", section=BINARY_FORMAT, level=Level.SHOULD,
          decision=DECIDED)
async def request_binary_fail(ctx: Context) -> str | None:
    probe = await ctx.connect()
    send(probe, Request("b3"), binary=True)
    while True:
        received = await probe.receive(what="the answer to the binary request")
        message = decoded(received)
        if isinstance(message, (Success, Fail)):
            break
    if isinstance(message, Success):
        return "the request succeeded: no fail to look at"
    if received.data[:1] != b"f":
        raise ctx.fail(f"the fail's type byte is 0x{received.data[0]:02x}")
    return None


@kit.case("ubre.request.binary-longest-id", "A binary request whose id is 65535 bytes (the most "
          "the name length holds) is answered with that id", section=BINARY_FORMAT,
          level=Level.SHOULD)
async def request_binary_longest_id(ctx: Context) -> None:
    probe = await ctx.connect()
    request_id = ("id-" + "x" * 0xFFFF)[:0xFFFF]
    send(probe, Request(request_id), binary=True)
    message = await next_message(probe, "the answer to the request")
    if not isinstance(message, (Success, Fail)) or str(message.id) != request_id:
        raise ctx.fail(f"expected an answer to the long id, got {show(message)}")


# The spec says nothing of an answer to no request (nor of integer ids): ignoring it is
# wireproto's decision, and a server may as well close; the check after the case still fails
# a server that stops serving.
@kit.case("ubre.success.unsolicited", "A success for a request the server never made is "
          "ignored: the connection stays and answers", section=REQRES, level=Level.SHOULD,
          decision=DECIDED, harmful=True)
async def success_unsolicited(ctx: Context) -> None:
    probe = await ctx.connect()
    send(probe, Success("never-asked", {"x": 1}))
    send(probe, Success(123))
    await still_serves(ctx, probe, "the success")


@kit.case("ubre.fail.unsolicited", "A fail for a request the server never made is ignored: the "
          "connection stays and answers", section=REQRES, level=Level.SHOULD, decision=DECIDED,
          harmful=True)
async def fail_unsolicited(ctx: Context) -> None:
    probe = await ctx.connect()
    send(probe, Fail("never-asked", "NotFound"))
    send(probe, Fail(456))
    await still_serves(ctx, probe, "the fail")


@kit.case("ubre.success.binary-unsolicited", "A binary success and fail (0x66 and 0x63) for "
          "requests never made are ignored", section=BINARY_FORMAT, level=Level.SHOULD,
          harmful=True, decision=DECIDED)
async def binary_unsolicited(ctx: Context) -> None:
    probe = await ctx.connect()
    send(probe, Success("never", b"x"), binary=True)
    send(probe, Fail("never", b"y"), binary=True)
    probe.send(b"c\x00\x05\x00\x00\x00\x00never")
    await still_serves(ctx, probe, "them")


@kit.case("ubre.request.json-in-binary-frame", "Whether a JSON request in a WebSocket binary "
          "frame is answered", section=REQRES, level=Level.INFORMATION,
          decision="docs/ubre.md#formats-and-transports", harmful=True)
async def json_in_binary_frame(ctx: Context) -> str:
    if not ctx.target.over_websocket:
        return "not a WebSocket: frames have no type"
    probe = await ctx.connect()
    probe.send(b'{"request":"jb"}', binary=True)
    message = await next_message(probe, "the answer")
    if not answer_to(message, "jb"):
        return f"answered: no, it sent {show(message)}"
    return "answered: yes"
