"""WEBSMQ client cases for what a server may send: publishes and wills, payloads empty, binary
and large, bursts, topics the client never subscribed to, the types a broker must never send,
malformed frames and WebSocket control frames. A client must not crash on any of them: it keeps
working, or closes the connection (the spec's "Protocol"; RFC 6455 for pings and fragments)."""

from __future__ import annotations

import os
import struct

from wireproto.codecs.websmq import LastWill, Publish
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level
from wireproto.conformance.websmq.client.support import (
    CLIENT,
    DECIDED,
    IN,
    kit,
    session,
)
from wireproto.conformance.websmq.support import header, publish, raw, subscribe, unsubscribe


@kit.case("websmq.client.receive.publish",
          "A Publish on a subscribed topic reaches the application with its payload",
          section="Subscribe to a topic")
async def receive_publish(ctx: Context) -> None:
    client = await session(ctx)
    await client.echoed(Publish(IN, b"hello"), "the echo of the publish")


@kit.case("websmq.client.receive.last-will",
          "A Last Will (11) frame on a subscribed topic reaches the application like a publish",
          section="Message Type")
async def receive_last_will(ctx: Context) -> None:
    client = await session(ctx)
    await client.echoed(LastWill(IN, b"someone left"), "the echo of the will")


@kit.case("websmq.client.receive.empty-payload",
          "A Publish with an empty payload reaches the application, empty", section="Payload")
async def receive_empty(ctx: Context) -> None:
    client = await session(ctx)
    await client.echoed(Publish(IN, b""), "the echo of an empty payload")


@kit.case("websmq.client.receive.every-byte",
          "A payload of every byte value, zero included, arrives unchanged", section="Payload")
async def receive_every_byte(ctx: Context) -> None:
    client = await session(ctx)
    await client.echoed(Publish(IN, bytes(range(256)) * 4), "the echo of 1024 binary bytes")


@kit.case("websmq.client.receive.large",
          "A payload of 100,000 bytes (over a WebSocket's 16-bit frame length) arrives whole",
          section="Payload", level=Level.SHOULD)
async def receive_large(ctx: Context) -> None:
    client = await session(ctx)
    await client.echoed(Publish(IN, os.urandom(100_000)), "the echo of 100,000 bytes")


@kit.case("websmq.client.receive.megabyte",
          "Reports whether a payload of 1,000,000 bytes arrives whole",
          section="Payload", level=Level.INFORMATION)
async def receive_megabyte(ctx: Context) -> str:
    client = await session(ctx)
    await client.echoed(Publish(IN, os.urandom(1_000_000)), "the echo of 1,000,000 bytes", 6.0)
    return "echoed whole"


@kit.case("websmq.client.receive.burst",
          "200 publishes sent back to back all reach the application, in order",
          section="Subscribe to a topic", level=Level.SHOULD)
async def receive_burst(ctx: Context) -> None:
    client = await session(ctx)
    for number in range(200):
        client.send(Publish(IN, b"%d" % number))
    for number in range(200):
        got = await client.out(f"the echo of publish number {number}")
        if got != b"%d" % number:
            raise CaseFailed(f"expected the echo of publish number {number}, got {got!r}")


@kit.case("websmq.client.receive.unsubscribed-topic",
          "A Publish on a topic the client never subscribed to does not crash it",
          section="Subscribe to a topic")
async def receive_unsubscribed(ctx: Context) -> str:
    client = await session(ctx)
    client.send(Publish("conformance/never", b"not yours"))
    return await client.survives()


async def _hostile(ctx: Context, frame: bytes, binary: bool = True) -> str:
    client = await session(ctx)
    client.probe.send(frame, binary)
    return await client.survives()


def _survives(id: str, title: str, section: str, frame: bytes,
              decision: str = DECIDED) -> None:
    async def body(ctx: Context) -> str:
        return await _hostile(ctx, frame)

    body.__name__ = body.__qualname__ = id.rsplit(".", 1)[1].replace("-", "_")
    kit.case(id, title, section=section, decision=decision)(body)


_survives("websmq.client.receive.subscribe-frame",
          "A Subscribe frame from the server, which a broker never sends, does not crash the "
          "client", "Message Type", subscribe(IN))
_survives("websmq.client.receive.unsubscribe-frame",
          "An Unsubscribe frame from the server, which a broker never sends, does not crash "
          "the client", "Message Type", unsubscribe(IN))
_survives("websmq.client.malformed.empty-frame",
          "An empty frame does not crash the client", "Header", b"")
_survives("websmq.client.malformed.one-byte",
          "A frame of one byte, too short for the header, does not crash the client", "Header",
          b"\x00")
_survives("websmq.client.malformed.topic-past-end",
          "A frame announcing a longer topic than follows does not crash the client", "Header",
          header(0, 300) + b"conformance/in")
_survives("websmq.client.malformed.empty-topic",
          "A Publish with an empty topic does not crash the client", "Topics",
          header(0, 0) + b"payload")
_survives("websmq.client.malformed.topic-invalid",
          "A Publish on a topic that is not URL-encoded ASCII does not crash the client",
          "Topics", raw(0, b"conformance/in \xc3\xa9", b"payload"))
_survives("websmq.client.malformed.garbage",
          "64 KiB of random bytes as one frame do not crash the client", "Protocol",
          b"\xff\xff" + os.urandom(65534))


@kit.case("websmq.client.malformed.text-frame",
          "A WebSocket text frame does not crash the client", section="Protocol",
          decision=DECIDED)
async def malformed_text(ctx: Context) -> str:
    client = await session(ctx)
    client.websocket_only("text frames")
    client.probe.send(publish(IN, b"as text"), binary=False)
    return await client.survives()


@kit.case("websmq.client.malformed.closes",
          "Reports what the client does with a malformed frame: closes the connection (with "
          "which code), or ignores it", section="Header", level=Level.INFORMATION,
          decision=CLIENT)
async def malformed_closes(ctx: Context) -> str:
    return await _hostile(ctx, b"\x40")


@kit.case("websmq.client.malformed.stream-length-over",
          "A length32 prefix of 4 GiB does not crash the client nor make it wait for 4 GiB",
          section="Protocol", decision=DECIDED)
async def stream_length_over(ctx: Context) -> str:
    client = await session(ctx)
    client.stream_only("a stream's length prefix")
    client.probe.send_raw(struct.pack("!I", 0xFFFFFFFF) + b"\x00\x0e" + IN.encode(),
                          "a length32 prefix of 4294967295 bytes")
    return await client.survives()


# --- WebSocket ------------------------------------------------------------------------------


@kit.case("websmq.client.websocket.ping",
          "The client answers a WebSocket ping with a pong of the same payload, and keeps "
          "working", section="Protocol")
async def websocket_ping(ctx: Context) -> None:
    client = await session(ctx)
    client.websocket_only("pings")
    pongs = await client.probe.ping(b"conformance")
    if b"conformance" not in pongs:  # a pong may also come unasked, as a heartbeat
        raise CaseFailed(f"expected a pong with 'conformance' within 3 s, got {pongs[:5]!r}")
    await client.works()


def _frame(opcode: int, payload: bytes, final: bool) -> bytes:
    """One unmasked WebSocket frame, as a server sends it."""
    first = (0x80 if final else 0) | opcode
    if len(payload) < 126:
        return bytes([first, len(payload)]) + payload
    return bytes([first, 126]) + struct.pack("!H", len(payload)) + payload


@kit.case("websmq.client.websocket.fragmented",
          "A Publish sent as three WebSocket fragments, a ping between them, arrives whole",
          section="Protocol")
async def websocket_fragmented(ctx: Context) -> None:
    client = await session(ctx)
    client.websocket_only("fragments")
    frame = publish(IN, b"in three parts")
    parts = [frame[:5], frame[5:12], frame[12:]]
    client.probe.send_raw(_frame(0x2, parts[0], False) + _frame(0x0, parts[1], False)
                          + _frame(0x9, b"between", True) + _frame(0x0, parts[2], True),
                          "a binary message in three fragments, a ping after the second")
    got = await client.out("the echo of the fragmented publish")
    if got != b"in three parts":
        raise CaseFailed(f"expected the echo of 'in three parts', got {got!r}")


@kit.case("websmq.client.websocket.close-echoed",
          "The client answers the server's close frame (1001, going away) with its own, "
          "closing cleanly", section="Protocol")
async def websocket_close_echoed(ctx: Context) -> str:
    client = await session(ctx)
    client.websocket_only("close frames")
    client.close_with(1001, b"going away")
    closed = await client.closed(3.0)
    if not closed.clean:
        raise CaseFailed(f"the connection closed without the close handshake ({closed.text})")
    return closed.described
