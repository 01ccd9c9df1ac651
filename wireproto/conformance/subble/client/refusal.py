"""The SubbleSocket client kit's cases on refused handshakes (the spec's "Handshake codes" 10,
11, 12 and 25): a refused client must not go on as if accepted, nor come back in a tight loop.
They run last: a client that stops after a refusal, as wireproto's does, is started again for
each case by --run, but a client started by hand has to be started again by its user."""

from __future__ import annotations

from wireproto.codecs.subble import HandshakeResponse, MessageCode, ProduceEvent, encode
from wireproto.conformance.bounded import bounded
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level
from wireproto.conformance.subble.client.common import (
    Session,
    allowed,
    client_message,
    kit,
    read_handshake,
    send_event,
)

CODES = "Handshake codes"


# -- refusals ---------------------------------------------------------------------------------

REFUSALS = {
    10: "address not allowed",
    11: "this host does not create client IDs",
    12: "unknown client ID",
    25: "unsupported, for a reason of the host's",
}


def _refusal_case(code: int, message: str) -> None:
    @kit.case(f"subble.client.refusal.{code}",
              f"A client refused with {code} does not go on as if accepted: it produces "
              "nothing on that connection", section=CODES)
    async def refused(ctx: Context) -> str:
        probe = await ctx.accept()
        request = await read_handshake(probe)
        probe.send(encode(HandshakeResponse(MessageCode(code), message,
                                            request.request_data)))
        await ctx.sleep(0.2)
        session = Session(probe, request, "")
        if probe.is_open:
            # A host closes after a refusal; this one goes on, to see whether the client does.
            send_event(session, "after a refusal")
        deadline = ctx.reactor.seconds() + 1.5
        while probe.is_open or probe.received:
            left = deadline - ctx.reactor.seconds()
            if left <= 0:
                break
            try:
                sent = client_message(await probe.receive(left, "nothing"))
            except CaseFailed as error:
                if "not SubbleSocket" in str(error) or "text message" in str(error):
                    raise
                continue
            if type(sent) is ProduceEvent:
                raise ctx.fail(f"after the refusal {code} the client produced an event of "
                               f"type {bounded(sent.event_type)}")
        closed = "closed the connection" if not probe.is_open else "left the connection open"
        if ctx.client is not None and await ctx.client.ended(0.3) and ctx.client.status:
            raise ctx.fail(f"the client {ctx.client.described()} after the refusal")
        return f"it {closed}"


for _code, _message in REFUSALS.items():
    _refusal_case(_code, _message)


@kit.case("subble.client.refusal.retry",
          "A refused client does not reconnect in a tight loop (at most 4 connections in 3 s, "
          "each refused again)", section=CODES, level=Level.SHOULD, timeout=8.0)
async def refusal_retry(ctx: Context) -> str:
    refused = 0
    deadline = ctx.reactor.seconds() + allowed(ctx, 3.0, 1.0)
    while True:
        left = deadline - ctx.reactor.seconds()
        if left <= 0:
            break
        try:
            probe = await ctx.accept(left, "another connection")
        except CaseFailed:
            break
        try:
            request = await read_handshake(probe, min(1.0, max(0.1, left)))
        except CaseFailed:
            continue
        probe.send(encode(HandshakeResponse(MessageCode.UNKNOWN_HANDSHAKE_ERROR,
                                            "refused by the kit", request.request_data)))
        probe.close()
        refused += 1
    if refused > 4 + 1:
        raise ctx.fail(f"the client connected {refused} times in 3 s, refused each time")
    return f"{refused} connection(s) in 3 s, the first included"
