"""The nydus client kit's nydus cases: the INVOKEs the client sends, how it takes RESULTs,
ERRORs and PUBLISHes, what it does with messages a server must not send or that do not parse,
and how it reconnects."""

from __future__ import annotations

import json
import re

from wireproto.codecs import nydus
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level
from wireproto.conformance.nydus.client import transport  # noqa: F401 - its cases go first
from wireproto.conformance.nydus.client.common import (
    CLIENT,
    DECIDED,
    HELLO,
    HELLO_DATA,
    PUBLISHED,
    RECONNECTING,
    answer,
    answered,
    case,
    next_invoke,
    publish,
    published,
    ready,
    still_works,
    welcomed,
)

SPEC = "nydus-protocol: Protocol"
_ID = re.compile(r"^[A-z0-9-]{1,32}$")


def _shown(data: object) -> str:
    return "no data" if data is nydus.NO_DATA else json.dumps(data)[:100]


# -- what the client sends --------------------------------------------------------------------


@case("nydus.client.invoke.valid",
          "The driver's INVOKE is a nydus INVOKE: type 1, an id, the path and JSON data",
          section="INVOKE", decision=DECIDED)
async def invoke_valid(ctx: Context) -> str:
    _, hello = await ready(ctx)
    return f"id {hello.id!r}"


@case("nydus.client.invoke.id",
          "An INVOKE's id is 1 to 32 characters of A-z, 0-9 and -",
          section=SPEC, decision=DECIDED)
async def invoke_id(ctx: Context) -> str:
    _, hello = await ready(ctx)
    if not _ID.match(hello.id):
        raise ctx.fail(f"the id {hello.id!r} is not 1-32 characters of [A-z0-9-]")
    return f"{len(hello.id)} characters"


@case("nydus.client.invoke.path",
          "An INVOKE's path is URL-encoded: /conformance/hello there as "
          "/conformance/hello%20there",
          # The spec: the path "should be" URL-encoded; a raw one works with every server.
          section=SPEC, decision=DECIDED, level=Level.SHOULD)
async def invoke_path(ctx: Context) -> None:
    probe = await welcomed(ctx)
    raw = await probe.receive_matching(lambda m: m.data.startswith(b"1"), 5.0,
                                       "the driver's INVOKE")
    if b"~/conformance/hello%20there|" not in raw.data:
        raise ctx.fail(f"the INVOKE is {raw.data[:100]!r}")


@case("nydus.client.invoke.data",
          "An INVOKE's data is the JSON of the driver's argument",
          section="INVOKE", decision=DECIDED)
async def invoke_data(ctx: Context) -> None:
    _, hello = await ready(ctx)
    if hello.data != HELLO_DATA:
        raise ctx.fail(f"the INVOKE of {HELLO} carries {_shown(hello.data)}")


@case("nydus.client.invoke.unique",
          "INVOKEs in flight at once have distinct ids",
          section="INVOKE", level=Level.SHOULD, decision=DECIDED)
async def invoke_unique(ctx: Context) -> str:
    probe, hello = await ready(ctx)
    for number in range(3):
        publish(probe, f"/conformance/many/{number}", number)
    ids = {hello.id}
    for _ in range(3):
        got = await next_invoke(probe, PUBLISHED, "the driver's reports of three PUBLISHes")
        ids.add(got.id)
    if len(ids) != 4:
        raise ctx.fail(f"four INVOKEs in flight used {len(ids)} ids: {sorted(ids)}")
    return "four distinct ids"


# -- answers ----------------------------------------------------------------------------------


@case("nydus.client.result.data",
          "A RESULT's data is what the INVOKE resolves with",
          section="RESULT", decision=DECIDED)
async def result_data(ctx: Context) -> None:
    probe, hello = await ready(ctx)
    answer(probe, nydus.encode(nydus.Result(hello.id, {"n": [1, "two", None]})))
    got = await answered(probe)
    if got != {"result": {"n": [1, "two", None]}}:
        raise ctx.fail(f"the driver reported {_shown(got)}")


@case("nydus.client.result.null",
          "A RESULT of null resolves the INVOKE with null",
          section="RESULT", decision=DECIDED)
async def result_null(ctx: Context) -> None:
    probe, hello = await ready(ctx)
    answer(probe, f"2${hello.id}|null")
    got = await answered(probe)
    if got != {"result": None}:
        raise ctx.fail(f"the driver reported {_shown(got)}")


@case("nydus.client.result.no-data",
          "What a RESULT without data (2$id|) resolves the INVOKE with",
          section="RESULT", level=Level.INFORMATION, decision=DECIDED)
async def result_no_data(ctx: Context) -> str:
    probe, hello = await ready(ctx)
    answer(probe, f"2${hello.id}|")
    return f"the driver reported {_shown(await answered(probe))}"


@case("nydus.client.result.unknown-id",
          "A RESULT for an id never INVOKEd is passed over: the real one still resolves",
          section="RESULT", decision=DECIDED, timeout=12.0)
async def result_unknown(ctx: Context) -> str:
    probe, hello = await ready(ctx)
    answer(probe, '2$conformance-no-such-id|"stray"')
    await ctx.sleep(0.3)
    if not probe.is_open:
        return await still_works(ctx, probe)
    answer(probe, nydus.encode(nydus.Result(hello.id, "real")))
    got = await answered(probe)
    if got != {"result": "real"}:
        raise ctx.fail(f"the driver reported {_shown(got)}")
    return "passed over"


@case("nydus.client.error.status",
          "An ERROR's status and message reach the INVOKE's caller",
          section="ERROR", decision=DECIDED)
async def error_status(ctx: Context) -> None:
    probe, hello = await ready(ctx)
    answer(probe, f'3${hello.id}|{{"status":404,"message":"Not Found"}}')
    got = await answered(probe)
    error = got.get("error") if isinstance(got, dict) else None
    if not isinstance(error, dict) or error.get("status") != 404 or \
            error.get("message") != "Not Found":
        raise ctx.fail(f"the driver reported {_shown(got)}")


@case("nydus.client.error.body",
          "An ERROR's body reaches the INVOKE's caller",
          section="ERROR", level=Level.SHOULD, decision=DECIDED)
async def error_body(ctx: Context) -> None:
    probe, hello = await ready(ctx)
    answer(probe, f'3${hello.id}|{{"status":418,"message":"teapot","body":{{"reset":true}}}}')
    got = await answered(probe)
    error = got.get("error") if isinstance(got, dict) else None
    if not isinstance(error, dict) or error.get("body") != {"reset": True}:
        raise ctx.fail(f"the driver reported {_shown(got)}")


@case("nydus.client.error.other",
          "What an ERROR whose data is no {status, message} object gives the caller",
          section="ERROR", level=Level.INFORMATION, decision=DECIDED)
async def error_other(ctx: Context) -> str:
    probe, hello = await ready(ctx)
    answer(probe, f'3${hello.id}|"oops"')
    return f"the driver reported {_shown(await answered(probe))}"


# -- PUBLISH ----------------------------------------------------------------------------------


@case("nydus.client.publish.data",
          "A PUBLISH reaches the route its path matches, with its data",
          section="PUBLISH", decision=DECIDED)
async def publish_data(ctx: Context) -> None:
    probe, _ = await ready(ctx)
    publish(probe, "/conformance/news", {"message": "hello"})
    got = await published(probe)
    if got != {"path": "/conformance/news", "data": {"message": "hello"}}:
        raise ctx.fail(f"the driver reported {_shown(got)}")


@case("nydus.client.publish.encoded-path",
          "A PUBLISH's URL-encoded path is decoded: /conformance/a%20b is /conformance/a b",
          section=SPEC, level=Level.SHOULD, decision=DECIDED)
async def publish_encoded(ctx: Context) -> None:
    probe, _ = await ready(ctx)
    answer(probe, '4~/conformance/a%20b|1')
    got = await published(probe)
    if got.get("path") != "/conformance/a b":
        raise ctx.fail(f"the driver reported the path {got.get('path')!r}")


@case("nydus.client.publish.no-data",
          "What a PUBLISH without data (4~path|) gives its route",
          section="PUBLISH", level=Level.INFORMATION, decision=DECIDED)
async def publish_no_data(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    answer(probe, "4~/conformance/empty|")
    return f"the driver reported {_shown(await published(probe))}"


@case("nydus.client.publish.large",
          "A PUBLISH of 500 000 bytes reaches its route whole",
          section="PUBLISH", level=Level.SHOULD, decision=DECIDED, timeout=10.0)
async def publish_large(ctx: Context) -> None:
    probe, _ = await ready(ctx)
    data = "x" * 500_000
    publish(probe, "/conformance/large", data)
    got = await published(probe, timeout=6.0)
    if got.get("data") != data:
        shown = got.get("data")
        size = len(shown) if isinstance(shown, str) else repr(shown)[:60]
        raise ctx.fail(f"the driver reported data of {size} characters, not 500000")


@case("nydus.client.publish.unrouted",
          "A PUBLISH no route matches does not crash the client",
          section="PUBLISH", decision=DECIDED, timeout=12.0)
async def publish_unrouted(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    publish(probe, "/elsewhere/nobody/listens", 1)
    return await still_works(ctx, probe)


# -- what a server must not send ----------------------------------------------------------------


async def _survives(ctx: Context, text: str) -> str:
    probe, _ = await ready(ctx)
    answer(probe, text)
    return await still_works(ctx, probe)


@case("nydus.client.message.invoke",
          "An INVOKE from the server (only clients INVOKE) does not crash the client",
          section="INVOKE", decision=CLIENT, timeout=12.0)
async def message_invoke(ctx: Context) -> str:
    return await _survives(ctx, '1$server1~/conformance/call|1')


@case("nydus.client.message.welcome-again",
          "A second WELCOME does not crash the client",
          section="WELCOME", decision=CLIENT, timeout=12.0)
async def message_welcome_again(ctx: Context) -> str:
    return await _survives(ctx, "0|3")


@case("nydus.client.message.unknown-type",
          "A message of unknown type (5|\"hi\") does not crash the client: it keeps working "
          "or closes and comes back",
          section=SPEC, decision=CLIENT, timeout=12.0)
async def message_unknown_type(ctx: Context) -> str:
    return await _survives(ctx, '5|"hi"')


@case("nydus.client.message.garbage",
          "A message that is no nydus string does not crash the client",
          section=SPEC, decision=CLIENT, timeout=12.0)
async def message_garbage(ctx: Context) -> str:
    return await _survives(ctx, "not nydus at all")


@case("nydus.client.message.bad-json",
          "A RESULT whose data is not JSON does not crash the client",
          section=SPEC, decision=CLIENT, timeout=12.0)
async def message_bad_json(ctx: Context) -> str:
    probe, hello = await ready(ctx)
    answer(probe, f"2${hello.id}|fail me now!")
    return await still_works(ctx, probe)


@case("nydus.client.welcome.version",
          "A WELCOME of another protocol version (0|4) makes the client close the session",
          section="WELCOME", level=Level.SHOULD, decision=CLIENT, timeout=8.0)
async def welcome_version(ctx: Context) -> str:
    probe = await ctx.accept()
    probe.send(b"0|4", binary=False)
    closed = await probe.closed(5.0, "the client to close a session WELCOMEd as version 4")
    return f"closed ({closed.text})"


# -- reconnecting -----------------------------------------------------------------------------


async def _back(ctx: Context, since: float, what: str, timeout: float) -> str:
    try:
        again = await welcomed(ctx, timeout)
    except CaseFailed:
        raise CaseFailed(f"the client did not connect again within {timeout:g} s {what}") \
            from None
    await next_invoke(again, HELLO, "the driver's INVOKE on its new session", 5.0)
    return f"connected again {ctx.reactor.seconds() - since:.1f} s {what}"


@case("nydus.client.reconnect.closed",
          "After the server ends its session, the client connects again by itself",
          section="nydus-client: reconnection", level=Level.INFORMATION,
          decision=RECONNECTING, timeout=16.0)
async def reconnect_closed(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    probe.close()
    return await _back(ctx, ctx.reactor.seconds(), "after the server closed", 12.0)


@case("nydus.client.reconnect.vanished",
          "After the server vanishes for 2 s, the client connects again once it is back",
          section="nydus-client: reconnection", level=Level.INFORMATION,
          decision=RECONNECTING, timeout=20.0)
async def reconnect_vanished(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    assert ctx.listener is not None
    await ctx.listener.pause()
    probe.abort()
    await ctx.sleep(2.0)
    await ctx.listener.resume()
    return await _back(ctx, ctx.reactor.seconds(), "after the server came back", 14.0)


@case("nydus.client.reconnect.backoff",
          "While every session is refused, the client's pauses between attempts grow",
          section="nydus-client: reconnection", level=Level.SHOULD, decision=RECONNECTING,
          timeout=20.0)
async def reconnect_backoff(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    listener = ctx.listener
    assert listener is not None
    listener.refusing = True
    first = len(listener.attempts)
    try:
        probe.close()
        await ctx.sleep(12.0)
    finally:
        listener.refusing = False
    times = listener.attempts[first:]
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    shown = ", ".join(f"{gap:.1f}" for gap in gaps)
    if len(times) > 60:
        raise ctx.fail(f"{len(times)} attempts in 12 s: a tight loop")
    half = len(gaps) // 2
    if len(gaps) >= 3 and max(gaps[half:]) <= min(gaps[:half]):
        raise ctx.fail(f"{len(times)} attempts, pauses of {shown} s: not growing")
    if len(times) < 2:
        return f"{len(times)} attempts in 12 s"
    return f"{len(times)} attempts, pauses of {shown} s"

