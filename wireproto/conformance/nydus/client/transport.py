"""The nydus client kit's Engine.IO cases: the handshake's query, long-polling's requests and
payloads, the upgrade, pings and pongs, the server's close, and packets a client must survive."""

from __future__ import annotations

from wireproto.codecs import engineio
from wireproto.conformance.context import Context
from wireproto.conformance.model import Level, NotApplicable
from wireproto.conformance.nydus.client.common import (
    ENGINEIO,
    HELLO,
    case,
    kit,
    next_invoke,
    ready,
    still_works,
)
from wireproto.conformance.nydus.client.site import (
    SITE_OPTIONS,
    Seen,
    send_packet,
    session_of,
    stop_pinging,
    trace_of,
)
from wireproto.errors import ProtocolError

PING_INTERVAL = SITE_OPTIONS.ping_interval
PING_TIMEOUT = SITE_OPTIONS.ping_timeout


@kit.liveness
async def alive(ctx: Context) -> None:
    await ready(ctx)


def _handshake(ctx: Context, seen: list[Seen]) -> Seen:
    if not seen:
        raise ctx.fail("the kit saw no handshake request of this session")
    return seen[0]


@case("nydus.client.handshake.query",
          "The handshake asks for /engine.io/ with EIO=4 and transport polling or websocket",
          section="Engine.IO 4: Handshake", decision=ENGINEIO)
async def handshake_query(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    first = _handshake(ctx, trace_of(probe).of("GET", "websocket"))
    if first.query.get("EIO") != "4":
        raise ctx.fail(f"the handshake's EIO is {first.query.get('EIO')!r}, not 4")
    transport = first.query.get("transport")
    if transport not in ("polling", "websocket"):
        raise ctx.fail(f"the handshake's transport is {transport!r}")
    if (first.kind == "websocket") != (transport == "websocket"):
        raise ctx.fail(f"a {first.kind} request says transport={transport}")
    return f"{first.path}?" + "&".join(f"{k}={v}" for k, v in first.query.items())


@case("nydus.client.handshake.transport",
          "Which transport the client starts on (engine.io-client's default is polling)",
          section="Engine.IO 4: Transports", level=Level.INFORMATION, decision=ENGINEIO)
async def handshake_transport(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    first = _handshake(ctx, trace_of(probe).of("GET", "websocket"))
    return f"starts on {first.query.get('transport')}"


@case("nydus.client.handshake.timestamp",
          "Whether polling requests carry a cache-busting t= value",
          section="Engine.IO 4: Handshake", level=Level.INFORMATION, decision=ENGINEIO)
async def handshake_timestamp(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    polls = trace_of(probe).of("GET", "POST")
    if not polls:
        raise NotApplicable("the client does not poll")
    with_t = sum(1 for seen in polls if "t" in seen.query)
    return f"{with_t} of {len(polls)} polling requests carry t="


async def _polled(ctx: Context) -> list[Seen]:
    probe, _ = await ready(ctx)
    await ctx.sleep(PING_INTERVAL + 0.8)  # a ping and its pong go over polling too
    polls = trace_of(probe).of("GET", "POST")
    if len(polls) < 2:
        raise NotApplicable("the client does not poll (it opened a WebSocket at once)")
    return polls


@case("nydus.client.polling.sid",
          "Every polling request after the handshake carries its sid, EIO=4 and "
          "transport=polling",
          section="Engine.IO 4: HTTP long-polling", decision=ENGINEIO)
async def polling_sid(ctx: Context) -> str:
    polls = await _polled(ctx)
    sid = polls[0].query.get("sid")
    for seen in polls[1:]:
        if seen.query.get("EIO") != "4" or seen.query.get("transport") != "polling":
            raise ctx.fail(f"a {seen.kind} asks for EIO={seen.query.get('EIO')!r} "
                           f"transport={seen.query.get('transport')!r}")
    sids = {seen.query.get("sid") for seen in polls[1:]}
    if sid is not None or len(sids) != 1 or None in sids:
        raise ctx.fail(f"the requests carry sids {sorted(map(str, sids))} (handshake: {sid})")
    return f"{len(polls) - 1} requests, each with the session's sid"


@case("nydus.client.polling.payload",
          "Every POST body is a payload of Engine.IO packets joined by U+001E",
          section="Engine.IO 4: HTTP long-polling", decision=ENGINEIO)
async def polling_payload(ctx: Context) -> str:
    polls = await _polled(ctx)
    posts = [seen for seen in polls if seen.kind == "POST"]
    if not posts:
        raise NotApplicable("the client POSTed nothing")
    for seen in posts:
        bad = [packet for packet in seen.packets if packet.startswith("!")]
        if bad or not seen.packets:
            raise ctx.fail(f"a POST of {seen.size} bytes is no Engine.IO payload: "
                           f"{bad[0][2:] if bad else 'empty'}")
    return f"{len(posts)} POSTs, {sum(len(s.packets) for s in posts)} packets"


async def _upgraded(ctx: Context) -> tuple[list[Seen], list[str]]:
    probe, _ = await ready(ctx)
    deadline = ctx.reactor.seconds() + 3.0
    while session_of(probe).transportName != "websocket" and \
            ctx.reactor.seconds() < deadline and probe.is_open:
        await ctx.sleep(0.1)
    trace = trace_of(probe)
    opened = trace.of("websocket")
    if not opened or not trace.of("GET"):
        raise NotApplicable("the session did not start on polling and open a WebSocket")
    return opened, [packet for seen in trace.of("frame") for packet in seen.packets]


@case("nydus.client.upgrade.taken",
          "Whether a client on polling upgrades to the WebSocket the handshake offers",
          section="Engine.IO 4: Upgrade", level=Level.INFORMATION, decision=ENGINEIO)
async def upgrade_taken(ctx: Context) -> str:
    opened, frames = await _upgraded(ctx)
    return f"upgrades; its first frames are {frames[:3]}"


@case("nydus.client.upgrade.dance",
          "An upgrade opens the WebSocket with the sid, sends 2probe, and 5 after 3probe",
          section="Engine.IO 4: Upgrade", decision=ENGINEIO)
async def upgrade_dance(ctx: Context) -> None:
    opened, frames = await _upgraded(ctx)
    query = opened[0].query
    if query.get("transport") != "websocket" or query.get("EIO") != "4" or not query.get("sid"):
        raise ctx.fail(f"the WebSocket's query is {query}")
    if frames[:2] != ["2probe", "5"]:
        raise ctx.fail(f"the WebSocket's first frames are {frames[:3]}, not 2probe then 5")


@case("nydus.client.websocket.frames",
          "Every WebSocket frame the client sends is one Engine.IO packet (a type 0-6)",
          section="Engine.IO 4: Packet encoding", decision=ENGINEIO)
async def websocket_frames(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    await ctx.sleep(PING_INTERVAL + 0.8)
    frames = [packet for seen in trace_of(probe).of("frame") for packet in seen.packets]
    if not frames:
        raise NotApplicable("the client sent no WebSocket frame")
    for frame in frames:
        try:
            engineio.decode_packet(bytes.fromhex(frame[1:]) if frame.startswith("b")
                                   else frame)
        except (ProtocolError, ValueError) as error:
            raise ctx.fail(f"the frame {frame[:60]!r} is no Engine.IO packet ({error})") \
                from None
    return f"{len(frames)} frames"


# -- pings ----------------------------------------------------------------------------------


@case("nydus.client.ping.pong",
          "Each ping of the server is answered with a pong (3), and the session lives on",
          section="Engine.IO 4: Heartbeat", decision=ENGINEIO, timeout=12.0)
async def ping_pong(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    await ctx.sleep(2 * PING_INTERVAL + PING_TIMEOUT)
    pongs = trace_of(probe).packets().count("3")
    if not probe.is_open:
        raise ctx.fail(f"the session ended after {pongs} pongs "
                       f"({probe.closed_as.text if probe.closed_as else 'closed'})")
    if pongs < 2:
        raise ctx.fail(f"{pongs} pongs in {2 * PING_INTERVAL + PING_TIMEOUT:g} s of "
                       f"pings every {PING_INTERVAL:g} s")
    return f"{pongs} pongs"


@case("nydus.client.ping.none",
          "The client sends no ping: in Engine.IO 4 only the server pings",
          section="Engine.IO 4: Heartbeat", level=Level.SHOULD, decision=ENGINEIO,
          timeout=10.0)
async def ping_none(ctx: Context) -> None:
    probe, _ = await ready(ctx)
    await ctx.sleep(2 * PING_INTERVAL + 0.5)
    pings = [packet for packet in trace_of(probe).packets() if packet.startswith("2")
             and packet != "2probe"]
    if pings:
        raise ctx.fail(f"the client sent {pings[:3]}")


@case("nydus.client.ping.missing",
          "A session the server stops pinging is given up by the client after pingInterval "
          "+ pingTimeout",
          section="Engine.IO 4: Heartbeat", level=Level.SHOULD, decision=ENGINEIO,
          timeout=12.0)
async def ping_missing(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    stop_pinging(probe)
    started = ctx.reactor.seconds()
    limit = PING_INTERVAL + PING_TIMEOUT + 2.5
    trace = trace_of(probe)
    while ctx.reactor.seconds() - started < limit:
        if not probe.is_open or trace.of("closed"):
            return f"gave it up after {ctx.reactor.seconds() - started:.1f} s"
        if ctx.listener is not None and ctx.listener.held:
            return f"connected again after {ctx.reactor.seconds() - started:.1f} s"
        await ctx.sleep(0.1)
    last = trace.seen[-1] if trace.seen else None
    if last is not None and last.kind in ("GET", "POST") and \
            ctx.reactor.seconds() - last.at > PING_TIMEOUT:
        return f"made no request for {ctx.reactor.seconds() - last.at:.1f} s"
    raise ctx.fail(f"the session without pings was still in use after {limit:g} s")


# -- the server's packets -------------------------------------------------------------------


@case("nydus.client.close.packet",
          "A close packet (1) from the server ends the session: the client stops using it "
          "within pingInterval + pingTimeout",
          section="Engine.IO 4: Close", level=Level.SHOULD, decision=ENGINEIO, timeout=10.0)
async def close_packet(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    trace = trace_of(probe)
    websocket = session_of(probe).transportName == "websocket"
    send_packet(probe, "1")
    sent = ctx.reactor.seconds()
    limit = PING_INTERVAL + PING_TIMEOUT + 1.0
    if websocket:
        while not trace.of("closed") and ctx.reactor.seconds() - sent < limit:
            await ctx.sleep(0.1)
        if not trace.of("closed"):
            raise ctx.fail(f"the WebSocket stayed open {limit:g} s after the close packet")
        return f"closed its WebSocket after {ctx.reactor.seconds() - sent:.1f} s"
    await ctx.sleep(2.5)
    later = [seen for seen in trace.of("GET", "POST") if seen.at > sent + 0.5]
    if later:
        raise ctx.fail(f"{len(later)} polling requests of the session came after the close "
                       "packet")
    return "polled no more"


@case("nydus.client.packet.noop",
          "A noop packet (6) is passed over: the client keeps working",
          section="Engine.IO 4: Packet encoding", decision=ENGINEIO)
async def packet_noop(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    send_packet(probe, "6")
    said = await still_works(ctx, probe)
    if "closed" in said:
        raise ctx.fail(f"a noop ended the session ({said})")
    return said


@case("nydus.client.packet.unknown",
          "A packet of unknown type (9) does not crash the client: it keeps working or "
          "closes and comes back",
          section="Engine.IO 4: Packet encoding", decision=ENGINEIO, timeout=12.0)
async def packet_unknown(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    send_packet(probe, "9hello")
    return await still_works(ctx, probe)


@case("nydus.client.packet.binary",
          "A binary message packet does not crash the client: it keeps working or closes "
          "and comes back",
          section="Engine.IO 4: Packet encoding", decision=ENGINEIO, timeout=12.0)
async def packet_binary(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    probe.send(b"4~/conformance/binary|1", binary=True)
    return await still_works(ctx, probe)


@case("nydus.client.packet.bad-base64",
          "A polling payload whose binary packet is not base64 does not crash the client",
          section="Engine.IO 4: HTTP long-polling", decision=ENGINEIO, timeout=12.0)
async def packet_bad_base64(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    if session_of(probe).transportName != "polling":
        raise NotApplicable("the session is on a WebSocket")
    send_packet(probe, "b!!not base64!!", b"b!!not base64!!")
    return await still_works(ctx, probe)


@case("nydus.client.packet.empty-message",
          "An empty message packet (4) does not crash the client",
          section="Engine.IO 4: Packet encoding", decision=ENGINEIO, timeout=12.0)
async def packet_empty_message(ctx: Context) -> str:
    probe, _ = await ready(ctx)
    send_packet(probe, "4")
    return await still_works(ctx, probe)


@case("nydus.client.invoke.waits-for-welcome",
          "Whether the client waits for the WELCOME before its first INVOKE",
          section="WELCOME", level=Level.INFORMATION, decision=ENGINEIO)
async def waits_for_welcome(ctx: Context) -> str:
    probe = await ctx.accept()
    try:
        await next_invoke(probe, HELLO, "an INVOKE before the WELCOME", 1.5)
    except Exception:  # noqa: BLE001 - CaseFailed: none came, as it should
        probe.send(b"0|3", binary=False)
        await next_invoke(probe, HELLO, f"the INVOKE of {HELLO} after the WELCOME", 4.0)
        return "it waits for the WELCOME"
    return "it INVOKEs before the WELCOME comes"

