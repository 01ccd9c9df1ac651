"""The nydus kit's Engine.IO 4 cases: the handshake on both transports, long-polling's
framing and refusals, the upgrade from polling to a WebSocket, pings, closes and packets of
no known type. Sections cite the Engine.IO protocol 4 ("Engine.IO 4: Handshake", ...)."""

from __future__ import annotations

import base64

from twisted.internet import defer

from wireproto.codecs import engineio, nydus
from wireproto.conformance.bounded import bounded
from wireproto.conformance.context import Context
from wireproto.conformance.engineio import EngineIOSocket, Polling, open_socket
from wireproto.conformance.model import CaseFailed, Level, NotApplicable
from wireproto.conformance.nydus.common import (
    ENGINEIO,
    ENGINEIO_DIFFERS,
    answer,
    ended,
    invoke,
    kit,
    nowhere,
    session,
    take_welcome,
)

# What a heartbeat case keeps of its timeout for what it does besides waiting for the ping.
PING_MARGIN = 2.0
# The most the kit sends to go over a server's maxPayload: a server that announces more is not
# tried (a hostile one could announce a terabyte).
MOST_SENT = 16 * 1024 * 1024


async def _polling(ctx: Context) -> Polling:
    """A polling session, past its open packet and its WELCOME."""
    poll = Polling(ctx)
    await poll.handshake()
    take_welcome(ctx, await poll.get_message(what="the nydus WELCOME"))
    return poll


def _refused(answer_status: int, body: bytes, what: str) -> None:
    if answer_status != 400:
        raise CaseFailed(f"expected {what} answered with status 400, got {answer_status} "
                         f"{body[:80]!r}")


# -- Handshake ------------------------------------------------------------------------------


@kit.case("nydus.engineio.handshake.polling",
          "A polling handshake is answered with an open packet holding sid, upgrades, "
          "pingInterval, pingTimeout and maxPayload",
          section="Engine.IO 4: Handshake", decision=ENGINEIO)
async def handshake_polling(ctx: Context) -> str:
    opened = await Polling(ctx).handshake()
    return (f"pingInterval {opened.ping_interval}, pingTimeout {opened.ping_timeout}, "
            f"maxPayload {opened.max_payload}, upgrades {list(opened.upgrades)}")


@kit.case("nydus.engineio.handshake.upgrades",
          "A polling handshake offers the upgrade to websocket",
          section="Engine.IO 4: Upgrade", level=Level.SHOULD, decision=ENGINEIO)
async def handshake_upgrades(ctx: Context) -> None:
    opened = await Polling(ctx).handshake()
    if "websocket" not in opened.upgrades:
        raise ctx.fail(f"upgrades is {list(opened.upgrades)}, without websocket")


@kit.case("nydus.engineio.handshake.websocket",
          "A WebSocket without a sid is a session of its own, opened by an open packet",
          section="Engine.IO 4: Handshake", decision=ENGINEIO)
async def handshake_websocket(ctx: Context) -> str:
    socket = await open_socket(ctx)
    opened = await socket.open_packet()
    return f"upgrades {list(opened.upgrades)}"


@kit.case("nydus.engineio.handshake.version",
          "A handshake for another Engine.IO version (EIO=3) is refused with status 400",
          section="Engine.IO 4: Handshake", level=Level.SHOULD, decision=ENGINEIO,
          harmful=True)
async def handshake_version(ctx: Context) -> None:
    got = await Polling(ctx).request("GET", "EIO=3&transport=polling")
    _refused(got.status, got.body, "EIO=3")


@kit.case("nydus.engineio.handshake.transport",
          "A handshake for an unknown transport is refused with status 400",
          section="Engine.IO 4: Handshake", level=Level.SHOULD, decision=ENGINEIO,
          harmful=True)
async def handshake_transport(ctx: Context) -> None:
    got = await Polling(ctx).request("GET", "EIO=4&transport=carrier-pigeon")
    _refused(got.status, got.body, "transport=carrier-pigeon")


# -- Long-polling ---------------------------------------------------------------------------


@kit.case("nydus.engineio.polling.payload",
          "A POST of two packets joined by U+001E is taken whole: both INVOKEs are answered",
          section="Engine.IO 4: HTTP long-polling", decision=ENGINEIO)
async def polling_payload(ctx: Context) -> None:
    poll = await _polling(ctx)
    path = nowhere(ctx)
    body = engineio.encode_payload([
        engineio.Packet(engineio.PacketType.MESSAGE, nydus.encode(nydus.Invoke("p1", path))),
        engineio.Packet(engineio.PacketType.MESSAGE, nydus.encode(nydus.Invoke("p2", path))),
    ])
    posted = await poll.post(body)
    if posted.status != 200:
        raise ctx.fail(f"the POST was answered {posted.status} {posted.body[:80]!r}")
    ids = set()
    for _ in range(2):
        message = await _polled_answer(poll, "the answers to INVOKEs p1 and p2")
        if not isinstance(message, (nydus.Result, nydus.Error)):
            raise ctx.fail(f"expected answers to p1 and p2, got {bounded(message)}")
        ids.add(message.id)
    if ids != {"p1", "p2"}:
        raise ctx.fail(f"the answers carry ids {sorted(ids)}, not p1 and p2")


async def _polled_answer(poll: Polling, what: str, timeout: float | None = None) -> nydus.Message:
    """The next nydus message a poll gets, PUBLISHes passed over (a server may over-publish)."""
    while True:
        message = _decoded(await poll.get_message(timeout=timeout, what=what))
        if not isinstance(message, nydus.Publish):
            return message


def _decoded(text: str) -> nydus.Message:
    try:
        return nydus.decode(text)
    except Exception as error:  # noqa: BLE001 - a ProtocolError: the server's doing
        raise CaseFailed(f"the server sent {text[:60]!r}, which is no nydus message "
                         f"({error})") from None


@kit.case("nydus.engineio.polling.binary",
          "A binary message packet (b and base64) holding an INVOKE: what the server does",
          section="Engine.IO 4: HTTP long-polling", level=Level.INFORMATION,
          decision=ENGINEIO, harmful=True)
async def polling_binary(ctx: Context) -> str:
    poll = await _polling(ctx)
    text = nydus.encode(nydus.Invoke("b1", nowhere(ctx)))
    posted = await poll.post("b" + base64.b64encode(text.encode()).decode("ascii"))
    if posted.status != 200:
        return f"refused the POST with status {posted.status}"
    try:
        got = await poll.get(timeout=2.0, what="an answer or the end")
    except CaseFailed as failed:
        return f"took the POST, then: {failed}"
    return f"took the POST and answered the poll with {engineio.encode_payload(got)[:80]!r}"


@kit.case("nydus.engineio.polling.unknown-sid",
          "A poll with a sid the server never gave is refused with status 400",
          section="Engine.IO 4: HTTP long-polling", decision=ENGINEIO, harmful=True)
async def polling_unknown_sid(ctx: Context) -> None:
    poll = Polling(ctx)
    got = await poll.request("GET", poll.query("conformance-no-such-sid"))
    _refused(got.status, got.body, "a GET with an unknown sid")


@kit.case("nydus.engineio.polling.unknown-sid-post",
          "A POST with a sid the server never gave is refused with status 400",
          section="Engine.IO 4: HTTP long-polling", decision=ENGINEIO, harmful=True)
async def polling_unknown_sid_post(ctx: Context) -> None:
    poll = Polling(ctx)
    got = await poll.request("POST", poll.query("conformance-no-such-sid"), b"6")
    _refused(got.status, got.body, "a POST with an unknown sid")


@kit.case("nydus.engineio.polling.largest",
          "A POST of exactly maxPayload bytes is taken and its INVOKE answered",
          section="Engine.IO 4: HTTP long-polling", decision=ENGINEIO, timeout=8.0)
async def polling_largest(ctx: Context) -> None:
    poll = Polling(ctx)
    opened = await poll.handshake()
    size = min(opened.max_payload, ctx.target.max_message_size)
    take_welcome(ctx, await poll.get_message(what="the nydus WELCOME"))
    body = sized_invoke("big", nowhere(ctx), size)
    posted = await poll.post(body, timeout=5.0)
    if posted.status != 200:
        raise ctx.fail(f"a POST of {len(body)} bytes (maxPayload {opened.max_payload}) was "
                       f"answered {posted.status} {posted.body[:80]!r}")
    message = await _polled_answer(poll, "the answer to INVOKE big", timeout=4.0)
    if not isinstance(message, (nydus.Result, nydus.Error)) or message.id != "big":
        raise ctx.fail(f"expected the answer to INVOKE big, got {bounded(message)}")


def sized_invoke(id_: str, path: str, size: int) -> bytes:
    """The Engine.IO message packet of an INVOKE whose string data makes it `size` bytes."""
    empty = "4" + nydus.encode(nydus.Invoke(id_, path, ""))
    return (empty[:-1] + "x" * max(0, size - len(empty.encode())) + '"').encode()


@kit.case("nydus.engineio.polling.over-max-payload",
          "A POST over maxPayload is refused with a 4xx status, and the server carries on",
          section="Engine.IO 4: HTTP long-polling", level=Level.SHOULD, decision=ENGINEIO,
          timeout=8.0, harmful=True)
async def polling_over(ctx: Context) -> str:
    poll = Polling(ctx)
    opened = await poll.handshake()
    if opened.max_payload >= MOST_SENT:
        return f"not tried: maxPayload {opened.max_payload} is more than the kit sends"
    take_welcome(ctx, await poll.get_message(what="the nydus WELCOME"))
    body = sized_invoke("over", nowhere(ctx), opened.max_payload + 1)
    try:
        posted = await poll.post(body, timeout=5.0)
    except CaseFailed as failed:
        if "within" in str(failed):
            raise
        return f"the server dropped the connection: {failed}"
    if not 400 <= posted.status < 500:
        raise ctx.fail(f"a POST of {len(body)} bytes, over maxPayload {opened.max_payload}, "
                       f"was answered {posted.status} {posted.body[:80]!r}")
    return f"status {posted.status}"


@kit.case("nydus.engineio.polling.close",
          "A close packet POSTed ends the session: a later poll is refused or gets a close",
          section="Engine.IO 4: Close", level=Level.SHOULD, decision=ENGINEIO)
async def polling_close(ctx: Context) -> None:
    poll = await _polling(ctx)
    await poll.post("1")
    await _session_gone(ctx, poll)


async def _session_gone(ctx: Context, poll: Polling) -> str:
    got = await poll.request("GET", poll.query(), timeout=3.0)
    if got.status == 400:
        return "the next poll was refused with 400"
    if got.status == 200:
        packets = got.packets("a close packet")
        if any(p.type is engineio.PacketType.CLOSE for p in packets):
            return "the next poll got the close packet"
    raise ctx.fail(f"the session goes on: the next poll was answered {got.status} "
                   f"{got.body[:80]!r}")


@kit.case("nydus.engineio.polling.unknown-packet",
          "A POST holding a packet of unknown type (9) ends that session",
          section="Engine.IO 4: Packet encoding", level=Level.SHOULD, decision=ENGINEIO,
          harmful=True)
async def polling_unknown_packet(ctx: Context) -> str:
    poll = await _polling(ctx)
    posted = await poll.post("9hello")
    if posted.status not in (200, 400):
        raise ctx.fail(f"the POST was answered {posted.status} {posted.body[:80]!r}")
    return await _session_gone(ctx, poll)


# -- Upgrade --------------------------------------------------------------------------------


async def _upgrading(ctx: Context) -> tuple[Polling, EngineIOSocket]:
    poll = await _polling(ctx)
    assert poll.sid is not None
    socket = await open_socket(ctx, poll.sid)
    socket.send_packet("2probe")
    pong = await socket.packet(what="the pong 3probe")
    if pong != engineio.Packet(engineio.PacketType.PONG, "probe"):
        raise CaseFailed(f"expected 3probe, got type {int(pong.type)} {str(pong.data)[:60]!r}")
    return poll, socket


@kit.case("nydus.engineio.upgrade.probe",
          "On a WebSocket with a polling session's sid, 2probe is answered with 3probe",
          section="Engine.IO 4: Upgrade", decision=ENGINEIO)
async def upgrade_probe(ctx: Context) -> None:
    await _upgrading(ctx)


@kit.case("nydus.engineio.upgrade.noop",
          "A poll pending during the upgrade is released with a noop packet (6)",
          section="Engine.IO 4: Upgrade", decision=ENGINEIO)
async def upgrade_noop(ctx: Context) -> None:
    poll = await _polling(ctx)
    assert poll.sid is not None
    pending = defer.ensureDeferred(poll.get(timeout=4.0, what="the noop"))
    await ctx.sleep(0.2)
    socket = await open_socket(ctx, poll.sid)
    socket.send_packet("2probe")
    await socket.packet(what="the pong 3probe")
    packets = await pending
    if not any(p.type is engineio.PacketType.NOOP for p in packets):
        raise ctx.fail(f"the pending poll was answered {engineio.encode_payload(packets)[:80]!r}"
                       ", without a noop")


@kit.case("nydus.engineio.upgrade.complete",
          "After the upgrade packet (5), an INVOKE on the WebSocket is answered on it",
          section="Engine.IO 4: Upgrade", decision=ENGINEIO)
async def upgrade_complete(ctx: Context) -> None:
    _, socket = await _upgrading(ctx)
    socket.send_packet("5")
    invoke(socket, "u1", nowhere(ctx))
    await answer(socket, "u1")


@kit.case("nydus.engineio.upgrade.unknown-sid",
          "A WebSocket with a sid the server never gave is refused",
          section="Engine.IO 4: Upgrade", level=Level.SHOULD, decision=ENGINEIO_DIFFERS,
          harmful=True)
async def upgrade_unknown_sid(ctx: Context) -> str:
    try:
        socket = await open_socket(ctx, "conformance-no-such-sid")
    except CaseFailed as failed:
        return str(failed)
    return "the WebSocket was " + await ended(socket, "a WebSocket with an unknown sid")


# -- Ping and pong --------------------------------------------------------------------------


@kit.case("nydus.engineio.ping.server",
          "The server pings (2) within pingInterval, and a session that answers stays open",
          section="Engine.IO 4: Heartbeat", decision=ENGINEIO, timeout=9.0)
async def ping_server(ctx: Context) -> str | None:
    socket = await open_socket(ctx)
    opened = await socket.open_packet()
    interval = opened.ping_interval / 1000
    budget = ctx.timeout - PING_MARGIN
    if interval > budget:
        raise NotApplicable(f"pingInterval is {opened.ping_interval} ms, longer than the case's "
                            f"{budget:g} s can wait (--timeout gives it longer)")
    deadline = ctx.reactor.seconds() + interval + 1.0
    while socket.pings == 0:
        if socket.closed_as is not None or ctx.reactor.seconds() > deadline:
            raise ctx.fail(f"no ping within pingInterval {opened.ping_interval} ms + 1 s")
        await ctx.sleep(0.05)
    await ctx.sleep(min(0.5, opened.ping_timeout / 2000))
    if not socket.is_open:
        raise ctx.fail("the session closed although its pong was sent")
    return None


@kit.case("nydus.engineio.ping.timeout",
          "A session that answers no ping is closed after pingInterval + pingTimeout",
          section="Engine.IO 4: Heartbeat", level=Level.SHOULD, decision=ENGINEIO, timeout=9.0)
async def ping_timeout(ctx: Context) -> str:
    socket = await open_socket(ctx)
    socket.auto_pong = False
    opened = await socket.open_packet()
    wait = (opened.ping_interval + opened.ping_timeout) / 1000
    budget = ctx.timeout - PING_MARGIN
    if wait > budget:
        raise NotApplicable(f"pingInterval + pingTimeout is {wait:g} s, longer than the case's "
                            f"{budget:g} s can wait (--timeout gives it longer)")
    await socket.closed(wait + 1.5, "the session without pongs to be closed")
    return f"closed after {wait:g} s without pongs"


@kit.case("nydus.engineio.ping.client",
          "A ping from the client ends the session: in Engine.IO 4 only the server pings",
          section="Engine.IO 4: Heartbeat", level=Level.SHOULD, decision=ENGINEIO,
          harmful=True)
async def ping_client(ctx: Context) -> str:
    socket = await session(ctx)
    socket.send_packet("2")
    return await ended(socket, "a ping from the client")


# -- Close and packets ----------------------------------------------------------------------


@kit.case("nydus.engineio.close.websocket",
          "A close packet (1) from the client ends the session and its WebSocket",
          section="Engine.IO 4: Close", level=Level.SHOULD, decision=ENGINEIO)
async def close_websocket(ctx: Context) -> str:
    socket = await session(ctx)
    socket.send_packet("1")
    closed = await socket.closed(3.0, "the WebSocket to close after the close packet")
    return f"closed ({closed.text})"


@kit.case("nydus.engineio.packet.unknown-type",
          "A packet of unknown type (9) ends the session",
          section="Engine.IO 4: Packet encoding", level=Level.SHOULD, decision=ENGINEIO,
          harmful=True)
async def packet_unknown(ctx: Context) -> str:
    socket = await session(ctx)
    socket.send_packet("9hello")
    return await ended(socket, "a packet of type 9")


@kit.case("nydus.engineio.packet.empty",
          "An empty text frame, which holds no packet type, ends the session",
          section="Engine.IO 4: Packet encoding", level=Level.SHOULD, decision=ENGINEIO,
          harmful=True)
async def packet_empty(ctx: Context) -> str:
    socket = await session(ctx)
    socket.send(b"", binary=False)
    return await ended(socket, "an empty frame")


@kit.case("nydus.engineio.packet.over-max-payload",
          "A WebSocket frame over maxPayload ends that session",
          section="Engine.IO 4: Handshake", level=Level.SHOULD, decision=ENGINEIO, timeout=8.0,
          harmful=True)
async def packet_over(ctx: Context) -> str:
    socket = await session(ctx)
    assert socket.opened is not None
    if socket.opened.max_payload >= MOST_SENT:
        return f"not tried: maxPayload {socket.opened.max_payload} is more than the kit sends"
    socket.send(sized_invoke("over", nowhere(ctx), socket.opened.max_payload + 1),
                binary=False)
    return await ended(socket, "a frame over maxPayload", timeout=5.0)
