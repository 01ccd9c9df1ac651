"""The nydus kit's cases about nydus itself, on an Engine.IO WebSocket: the WELCOME, INVOKEs
and their answers paired by id, ids and paths at their limits, data none and null, no PUBLISH
unasked, messages a server should not get from a client, and every kind of malformed message
wireproto's codec refuses. Sections cite nydus-protocol's spec ("Protocol", "INVOKE", ...)."""

from __future__ import annotations

from wireproto.codecs import nydus
from wireproto.conformance.bounded import bounded
from wireproto.conformance.context import Context
from wireproto.conformance.engineio import open_socket
from wireproto.conformance.model import CaseFailed, Level
from wireproto.conformance.nydus.common import (
    DECIDED,
    SERVER,
    answer,
    ended,
    invoke,
    kit,
    no_answer,
    not_answered,
    nowhere,
    read_nydus,
    send_nydus,
    session,
)
from wireproto.conformance.nydus.transport import sized_invoke


@kit.liveness
async def alive(ctx: Context) -> None:
    """A WebSocket session whose INVOKE is answered; whatever else comes (a WELCOME right or
    wrong, say) is for the cases to judge."""
    socket = await open_socket(ctx)
    await socket.open_packet()
    invoke(socket, "alive", nowhere(ctx, "alive"))
    await socket.receive_matching(
        lambda got: not got.binary and got.data.startswith((b"42$alive|", b"43$alive|")),
        what="the answer to INVOKE alive")


# -- WELCOME --------------------------------------------------------------------------------


@kit.case("nydus.welcome.version",
          "The first message of a session is the WELCOME 0|3 (protocol version 3)",
          section="WELCOME")
async def welcome_version(ctx: Context) -> None:
    await session(ctx, strict=True)


@kit.case("nydus.welcome.once",
          "The WELCOME comes once, and nothing follows it unasked",
          section="WELCOME", level=Level.SHOULD)
async def welcome_once(ctx: Context) -> None:
    socket = await session(ctx)
    await socket.silent(1.0, "nothing after the WELCOME")


# -- INVOKE and its answer ------------------------------------------------------------------


@kit.case("nydus.invoke.not-found",
          "An INVOKE of a path the server has no route for is answered with an ERROR of "
          "the same id",
          section="Protocol")
async def invoke_not_found(ctx: Context) -> str:
    socket = await session(ctx)
    invoke(socket, "nf1", nowhere(ctx))
    got = await answer(socket, "nf1")
    if not isinstance(got, nydus.Error):
        raise ctx.fail(f"expected an ERROR for a path no server has, got {bounded(got)}")
    return f"ERROR data {bounded(got.data)}"


@kit.case("nydus.invoke.not-found-404",
          "That ERROR's data is {\"message\": ..., \"status\": 404}, as nydus answers",
          section="ERROR", level=Level.SHOULD, decision=SERVER)
async def invoke_not_found_404(ctx: Context) -> None:
    socket = await session(ctx)
    invoke(socket, "nf2", nowhere(ctx))
    got = await answer(socket, "nf2")
    data = got.data
    if not (isinstance(got, nydus.Error) and isinstance(data, dict)
            and data.get("status") == 404 and isinstance(data.get("message"), str)):
        raise ctx.fail(f"expected ERROR data with status 404 and a message, got {bounded(got)}")


@kit.case("nydus.invoke.one-answer",
          "An INVOKE gets exactly one answer",
          section="RESULT")
async def invoke_one_answer(ctx: Context) -> None:
    socket = await session(ctx)
    invoke(socket, "one", nowhere(ctx))
    await answer(socket, "one")
    await no_answer(socket, 0.7, "no second answer")


@kit.case("nydus.invoke.pairing",
          "Five INVOKEs sent at once get five answers, one for each id",
          section="INVOKE")
async def invoke_pairing(ctx: Context) -> None:
    socket = await session(ctx)
    ids = [f"pair-{n}" for n in range(5)]
    for id_ in ids:
        invoke(socket, id_, nowhere(ctx, id_))
    seen = []
    for _ in ids:
        got = await read_nydus(socket, "the answers to five INVOKEs")
        if not isinstance(got, (nydus.Result, nydus.Error)):
            raise ctx.fail(f"expected answers, got {bounded(got)}")
        seen.append(got.id)
    if sorted(seen) != ids:
        raise ctx.fail(f"the answers carry ids {seen}, not {ids} once each")
    await no_answer(socket, 0.5, "no further answer")


@kit.case("nydus.invoke.no-data",
          "An INVOKE with no data (nothing after '|') is answered",
          section="INVOKE", decision=DECIDED)
async def invoke_no_data(ctx: Context) -> None:
    socket = await session(ctx)
    invoke(socket, "none", nowhere(ctx))  # written 1$none~PATH| with nothing after '|'
    await answer(socket, "none")


@kit.case("nydus.invoke.null-data",
          "An INVOKE whose data is JSON null is answered",
          section="INVOKE", decision=DECIDED)
async def invoke_null_data(ctx: Context) -> None:
    socket = await session(ctx)
    invoke(socket, "null", nowhere(ctx), None)
    await answer(socket, "null")


@kit.case("nydus.invoke.id-shortest",
          "An INVOKE with a one-character id is answered with that id",
          section="Protocol")
async def invoke_id_shortest(ctx: Context) -> None:
    socket = await session(ctx)
    invoke(socket, "x", nowhere(ctx))
    await answer(socket, "x")


@kit.case("nydus.invoke.id-longest",
          "An INVOKE with a 32-character id is answered with that id",
          section="Protocol")
async def invoke_id_longest(ctx: Context) -> None:
    socket = await session(ctx)
    id_ = "L" * 31 + "-"
    invoke(socket, id_, nowhere(ctx))
    await answer(socket, id_)


@kit.case("nydus.invoke.id-javascript-range",
          "An id with [\\]^_` (in JavaScript's A-z range) is answered with that id",
          section="Protocol", decision=DECIDED)
async def invoke_id_range(ctx: Context) -> None:
    socket = await session(ctx)
    id_ = "a[\\]^_`z"
    invoke(socket, id_, nowhere(ctx))
    await answer(socket, id_)


@kit.case("nydus.invoke.path-escapes",
          "An INVOKE whose path is percent-encoded (a space, UTF-8, an emoji) is answered",
          section="Protocol", decision=DECIDED)
async def invoke_path_escapes(ctx: Context) -> None:
    socket = await session(ctx)
    invoke(socket, "esc", nowhere(ctx, "caf\u00e9 na\u00efve \U0001f600"))
    await answer(socket, "esc")


@kit.case("nydus.invoke.path-reserved-escapes",
          "An INVOKE whose path holds escapes decodeURI keeps (%2F, %3F) is answered",
          section="Protocol", decision=DECIDED)
async def invoke_path_reserved(ctx: Context) -> None:
    socket = await session(ctx)
    send_nydus(socket, f"1$res~{nowhere(ctx, 'a%2Fb%3Fc')}|")
    await answer(socket, "res")


@kit.case("nydus.invoke.path-raw",
          "An INVOKE whose path holds a raw space (not encoded) is answered",
          section="Protocol", level=Level.SHOULD, decision=DECIDED)
async def invoke_path_raw(ctx: Context) -> None:
    socket = await session(ctx)
    send_nydus(socket, f"1$raw~{nowhere(ctx, 'a b')}|")
    await answer(socket, "raw")


@kit.case("nydus.invoke.path-longest",
          "An INVOKE whose path is 1024 characters as written is answered",
          section="Protocol", level=Level.SHOULD, decision=DECIDED)
async def invoke_path_longest(ctx: Context) -> None:
    socket = await session(ctx)
    base = nowhere(ctx) + "/"
    invoke(socket, "long", base + "p" * (nydus.MAX_PATH_LENGTH - len(base)))
    await answer(socket, "long")


@kit.case("nydus.invoke.data-largest",
          "An INVOKE filling a frame of maxPayload bytes is answered",
          section="INVOKE", timeout=8.0)
async def invoke_data_largest(ctx: Context) -> None:
    socket = await session(ctx)
    assert socket.opened is not None
    size = min(socket.opened.max_payload, ctx.target.max_message_size)
    socket.send(sized_invoke("big", nowhere(ctx), size), binary=False)
    await answer(socket, "big", timeout=5.0)


@kit.case("nydus.invoke.data-types",
          "INVOKEs with data of every JSON type are answered",
          section="INVOKE")
async def invoke_data_types(ctx: Context) -> None:
    socket = await session(ctx)
    values = [{"a": [1, 2.5, None]}, [], "text \u2603", 0, -1.5e300, True, False]
    for n, value in enumerate(values):
        invoke(socket, f"t{n}", nowhere(ctx), value)
    for n in range(len(values)):
        await answer(socket, f"t{n}")


# -- PUBLISH --------------------------------------------------------------------------------


# The spec lets a server over-publish: who gets a PUBLISH is the server's to decide.
@kit.case("nydus.publish.unsubscribed",
          "Whether a client subscribed to nothing gets PUBLISH messages (the spec allows a "
          "server to over-publish)", section="Protocol", level=Level.INFORMATION)
async def publish_unsubscribed(ctx: Context) -> str:
    socket = await session(ctx)
    invoke(socket, "pub", nowhere(ctx))
    await answer(socket, "pub")
    try:
        got = await read_nydus(socket, "a PUBLISH", timeout=1.0, publishes=True)
    except CaseFailed as failed:
        if "got nothing" in str(failed):
            return "PUBLISH unasked: none within 1 s"
        raise
    if not isinstance(got, nydus.Publish):
        raise ctx.fail(f"expected nothing or a PUBLISH, got {bounded(got)}")
    return f"PUBLISH unasked: yes, {bounded(got)}"


# -- Messages only a server sends -----------------------------------------------------------


def _ignored(id_: str, name: str, text: str) -> None:
    @kit.case(f"nydus.ignored.{id_}",
              f"A {name} from a client: what the server does (nydus ignores it)",
              section=name, level=Level.INFORMATION, decision=SERVER, harmful=True)
    async def body(ctx: Context) -> str:
        socket = await session(ctx)
        send_nydus(socket, text)
        invoke(socket, "after", nowhere(ctx))
        try:
            got = await read_nydus(socket, f"the answer to an INVOKE after the {name}")
        except Exception as error:  # noqa: BLE001 - CaseFailed: what happened is the report
            return f"no answer to the INVOKE after it: {error}"
        if isinstance(got, (nydus.Result, nydus.Error)) and got.id == "after":
            return "ignored it: the INVOKE after it was answered"
        return f"answered with {bounded(got)}"


_ignored("welcome", "WELCOME", "0|3")
_ignored("result", "RESULT", '2$r1|"result"')
_ignored("error", "ERROR", '3$e1|{"status":500,"message":"no"}')
_ignored("publish", "PUBLISH", '4~/conformance/ignored|"news"')


# -- Malformed messages ---------------------------------------------------------------------

# (id, what it is, the nydus string, level): every kind wireproto's codec refuses. SHOULD
# marks what only wireproto's decisions refuse (nydus-protocol 3.0.0 lets it in).
MALFORMED: list[tuple[str, str, str, Level] | tuple[str, str, str, Level, str]] = [
    ("empty", "an empty message", "", Level.MUST),
    ("short", "a type without '|'", "1", Level.MUST),
    ("unknown-type", "type 5", '5|"hi"', Level.MUST),
    ("type-whitespace", "a space for the type", " |3", Level.SHOULD),
    ("bad-marker", "a section marker that is none of $ ~ |", "1x|3", Level.MUST),
    ("no-bar", "no '|' after the id", "1$abc", Level.MUST),
    ("invoke-no-id", "an INVOKE without an id", "1~/conformance|7", Level.MUST),
    ("invoke-no-path", "an INVOKE without a path", '1$m7|"hi"', Level.MUST),
    ("result-with-path", "a RESULT with a path", '2$m7~/path|"hello"', Level.MUST),
    ("publish-with-id", "a PUBLISH with an id", '4$m7~/test|"message"', Level.MUST),
    ("welcome-with-id", "a WELCOME with an id", "0$m7|3", Level.MUST),
    ("welcome-version", "a WELCOME for protocol version 1", "0|1", Level.MUST),
    ("bad-json", "data that is not JSON", "1$m7~/conformance|fail me now!", Level.MUST, "m7"),
    ("id-empty", "an empty id", "1$~/conformance|1", Level.MUST),
    ("id-characters", "an id with a space", "1$a b~/conformance|1", Level.SHOULD),
    ("id-too-long", "an id of 33 characters", f"1${'i' * 33}~/conformance|1", Level.SHOULD),
    ("path-empty", "an empty path", "1$m7~|1", Level.MUST, "m7"),
    ("path-too-long", "a path of 1025 characters",
     f"1$m7~/{'p' * (nydus.MAX_PATH_LENGTH)}|1", Level.SHOULD, "m7"),
    ("path-bad-escape", "a path with the escape %ZZ", "1$m7~/conformance/%ZZ|1", Level.MUST,
     "m7"),
    ("path-not-utf8", "a path whose escapes are no UTF-8 (%C0%80)",
     "1$m7~/conformance/%C0%80|1", Level.MUST, "m7"),
]


def _malformed(id_: str, what: str, text: str, level: Level,
               invoke_id: str | None = None) -> None:
    title = (f"A message with {what} is not answered as if valid: an ERROR for its id, or "
             "nothing (the session may end)" if invoke_id is not None else
             f"A message with {what} is not answered (the session may end)")

    @kit.case(f"nydus.malformed.{id_}", title,
              section="Protocol", level=level, decision=DECIDED if level is Level.SHOULD
              else SERVER, harmful=True)
    async def body(ctx: Context) -> str:
        socket = await session(ctx)
        send_nydus(socket, text)
        return await not_answered(socket, what, error_for=invoke_id)


for _case in MALFORMED:
    _malformed(*_case)


# The spec says only that such a message "will usually result in a disconnect"; nydus does it.
@kit.case("nydus.malformed.closes", "A message that does not parse ends its session, as nydus "
          "ends it on a parser error", section="Usage", level=Level.SHOULD, decision=SERVER,
          harmful=True)
async def malformed_closes(ctx: Context) -> str:
    socket = await session(ctx)
    send_nydus(socket, '5|"hi"')
    return await ended(socket, "a message of type 5")
