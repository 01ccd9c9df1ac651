"""Phyllo device cases for the layers under the pub-sub message: the chunked stream's delimiters,
COBS frames, the datagram's length and type, the validated datagram's CRC (reduced stack), the
limits of a chunk and a frame, and resynchronising after noise, garbage and broken units (the
layer table of docs/phyllo.md, "Message model" and "What we decided")."""

from __future__ import annotations

from wireproto.codecs.phyllo import PubSubMessage, encode_message
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level, NotApplicable
from wireproto.conformance.phyllo.support import (
    MAX_CHUNK,
    MAX_FRAME,
    STACKS,
    Answer,
    Line,
    case,
    open_line,
    reduced_only,
)

MODEL = "docs/phyllo.md#message-model"
DECIDED = "docs/phyllo.md#what-we-decided"
BAD_INPUT = "docs/phyllo.md#bad-input"
STREAM = "Chunked stream"
FRAME = "Frame"
DATAGRAM = "Datagram"
VALIDATED = "Validated datagram"


def _echo_of(line: Line, label: str = "") -> PubSubMessage:
    return PubSubMessage(0x10, b"echo", line.token(label))


async def _echoed(ctx: Context, label: str = "") -> Answer:
    line = await open_line(ctx)
    return await line.echo(_echo_of(line, label))


# --- The chunked stream and the frame -------------------------------------------------------


@case("phyllo.frame.cobs",
      "Each chunk the device writes is at most 255 bytes of valid COBS, ended by a 0x00",
      section=FRAME, decision=MODEL)
async def frame_cobs(ctx: Context) -> None:
    line = await open_line(ctx)
    await line.echo_judged({"chunk", "frame"})


@case("phyllo.chunk.leading-delimiter",
      "The device writes a 0x00 delimiter before each chunk as well as after it",
      section=STREAM, level=Level.SHOULD, decision=MODEL)
async def chunk_leading(ctx: Context) -> None:
    line = await open_line(ctx)
    if line.over_websocket:
        raise NotApplicable("a WebSocket message is a chunk without delimiters")
    first = await line.echo(_echo_of(line, "first"))
    second = await line.echo(_echo_of(line, "second"))
    unled = [answer for answer in (first, second) if not answer.led]
    if unled:
        raise CaseFailed(f"no 0x00 came before the chunk {unled[0].wire.hex(' ')}: a receiver "
                         "that joined mid-chunk cannot resynchronise on it alone")


@case("phyllo.chunk.empty-ignored",
      "Empty chunks (delimiters one after another) are ignored", section=STREAM,
      decision=MODEL)
async def chunk_empty(ctx: Context) -> None:
    line = await open_line(ctx)
    if line.over_websocket:
        raise NotApplicable("a WebSocket message is a chunk without delimiters")
    message = _echo_of(line)
    line.write(b"\x00" * 32, "32 delimiters")
    await line.echo(message, "the echo of a message sent after 32 empty chunks")


@case("phyllo.chunk.split-writes",
      "A chunk that arrives a few bytes at a time is read whole", section=STREAM)
async def chunk_split(ctx: Context) -> None:
    line = await open_line(ctx)
    if line.over_websocket:
        raise NotApplicable("a WebSocket carries each chunk whole")
    message = _echo_of(line, "split")
    wire = line.stack.encode_layered(message)
    for start in range(0, len(wire), 3):
        line.write(wire[start:start + 3], "3 bytes of a chunk")
        await ctx.sleep(0.02)
    await line.answer(lambda got: got == message, "the echo of a chunk written 3 bytes at a time")


@case("phyllo.frame.largest",
      "A message whose frame payload is 253 bytes, the most a frame carries, is echoed (a "
      "board with smaller buffers, 80 bytes on an Uno, does not)",
      section=FRAME, level=Level.SHOULD, decision=DECIDED)
async def frame_largest(ctx: Context) -> None:
    line = await open_line(ctx)
    head = len(line.datagram(encode_message(PubSubMessage(0x10, b"echo", b""))))
    token = line.token("largest")
    payload = token + b"\x00\x01" * ((MAX_FRAME - head - len(token)) // 2)
    payload += b"\xff" * (MAX_FRAME - head - len(payload))
    message = PubSubMessage(0x10, b"echo", payload)
    await line.echo(message, "the echo of a message of 253 frame-payload bytes")


def _over_limit(line: Line) -> PubSubMessage:
    """A message whose datagram is as long as its length byte allows (255): a frame payload of
    257 bytes, 4 over the limit, in a chunk of 259."""
    head = len(line.datagram(encode_message(PubSubMessage(0x10, b"echo", b""))))
    token = line.token("over")
    return PubSubMessage(0x10, b"echo", token + b"\x55" * (MAX_FRAME + 4 - head - len(token)))


@case("phyllo.frame.over-limit",
      "After chunks longer than 255 bytes (259 and 600) the device still echoes", section=FRAME,
      decision=DECIDED, harmful=True)
async def frame_over(ctx: Context) -> None:
    line = await open_line(ctx)
    if line.over_websocket:
        raise NotApplicable("the kit does not send over-long WebSocket messages")
    line.write(line.frame(line.datagram(encode_message(_over_limit(line)))),
               "a chunk of 259 bytes, its datagram's length byte 255")
    line.write(b"\x00" + b"\x55" * 600 + b"\x00", "a chunk of 600 bytes")
    await line.alive("the echo of a good message sent after chunks of 259 and 600 bytes")


@case("phyllo.frame.over-limit.dropped",
      "A chunk of 259 bytes (a frame payload of 257) is dropped, not echoed", section=FRAME,
      level=Level.SHOULD, decision=DECIDED)
async def frame_over_dropped(ctx: Context) -> None:
    line = await open_line(ctx)
    message = _over_limit(line)
    line.write(line.frame(line.datagram(encode_message(message))),
               "a chunk of 259 bytes, its datagram's length byte 255")
    await line.quiet(lambda got: got.payload == message.payload,
                     "a message in a chunk of 259 bytes", 1.5)
    if line.seen.longest > MAX_CHUNK:
        raise CaseFailed(f"the device took the chunk and wrote one of {line.seen.longest} "
                         "bytes back")


@case("phyllo.frame.bad-cobs",
      "A chunk that is not valid COBS is dropped, and the next chunk is read",
      section=FRAME, decision=BAD_INPUT)
async def frame_bad_cobs(ctx: Context) -> None:
    line = await open_line(ctx)
    message = _echo_of(line, "cobs")
    good = line.frame(line.datagram(encode_message(message)))
    # The first code byte claims more bytes than the chunk has.
    broken = b"\x00" + bytes([len(good)]) + good[2:-1] + b"\x00"
    line.write(broken, "a chunk whose COBS code runs past its end")
    await line.quiet(lambda got: got.payload == message.payload, "a chunk of broken COBS")
    await line.alive("the echo of a good message sent after broken COBS")


# --- The datagram and the validated datagram ------------------------------------------------


@case("phyllo.datagram.well-formed",
      "The device's datagrams carry the stack's type, a length that counts the payload, "
      "and on the reduced stack a validated datagram carrying 0x60",
      section=DATAGRAM, decision=MODEL)
async def datagram_well_formed(ctx: Context) -> None:
    line = await open_line(ctx)
    await line.echo_judged({"datagram"})


@case("phyllo.datagram.bad-length",
      "A datagram whose length byte does not match its payload is dropped, and the next "
      "chunk is read", section=DATAGRAM, decision=MODEL)
async def datagram_bad_length(ctx: Context) -> None:
    line = await open_line(ctx)
    message = _echo_of(line, "length")
    datagram = bytearray(line.datagram(encode_message(message)))
    datagram[0] = (datagram[0] + 3) & 0xFF
    line.write(line.frame(bytes(datagram)), "a datagram whose length says 3 bytes more")
    await line.quiet(lambda got: got.payload == message.payload, "a datagram of a wrong length")
    await line.alive("the echo of a good message sent after a datagram of a wrong length")


@case("phyllo.datagram.other-stack",
      "A datagram of the other stack's type (0x22 on minimal, 0x60 on reduced) is not "
      "handed up", section=DATAGRAM, level=Level.SHOULD, decision=DECIDED)
async def datagram_other_stack(ctx: Context) -> None:
    line = await open_line(ctx)
    message = _echo_of(line, "other")
    other = "minimal" if line.stack_name == "reduced" else "reduced"
    line.write(STACKS[other].encode_layered(message), f"a message of the {other} stack")
    await line.quiet(lambda got: got.payload == message.payload,
                     f"a message of the {other} stack")
    await line.alive(f"the echo of a good message sent after one of the {other} stack")


@case("phyllo.datagram.layer-message",
      "A datagram layer's own message (type 0x05, info) is not handed up, and the device "
      "still echoes after it", section=DATAGRAM, decision=DECIDED, harmful=True)
async def datagram_layer_message(ctx: Context) -> None:
    line = await open_line(ctx)
    line.write(line.frame(bytes([4, 0x05]) + b"boot"), "a datagram of type 0x05 (info)")
    await line.alive("the echo of a message sent after a datagram-layer info message")


@case("phyllo.crc.sent",
      "The CRC of each validated datagram the device writes is Ray32sub8 of its type and "
      "payload (reduced stack)", section=VALIDATED, decision=DECIDED)
async def crc_sent(ctx: Context) -> None:
    reduced_only(ctx)
    line = await open_line(ctx)
    await line.echo_judged({"crc"})


@case("phyllo.crc.bad-dropped",
      "A validated datagram with a wrong CRC is dropped, and the next chunk is read "
      "(reduced stack)", section=VALIDATED, decision=BAD_INPUT)
async def crc_bad(ctx: Context) -> None:
    reduced_only(ctx)
    line = await open_line(ctx)
    message = _echo_of(line, "badcrc")
    good = line.datagram(encode_message(message))
    crc = int.from_bytes(good[2:6], "big") ^ 0x00010000
    line.write(line.frame(line.datagram(encode_message(message), crc=crc)),
               "a message whose CRC has one bit wrong")
    await line.quiet(lambda got: got.payload == message.payload, "a message of a wrong CRC")
    await line.alive("the echo of a good message sent after one of a wrong CRC")


@case("phyllo.crc.other-polynomial",
      "A validated datagram checked with the common CRC-32 instead of Ray32sub8 is dropped "
      "(reduced stack)", section=VALIDATED, level=Level.SHOULD, decision=DECIDED)
async def crc_other(ctx: Context) -> None:
    import zlib

    reduced_only(ctx)
    line = await open_line(ctx)
    message = _echo_of(line, "crc32")
    body = b"\x60" + encode_message(message)
    line.write(line.frame(line.datagram(encode_message(message), crc=zlib.crc32(body))),
               "a message checked with CRC-32 (zlib)")
    await line.quiet(lambda got: got.payload == message.payload, "a message checked with CRC-32")


# --- Resynchronising --------------------------------------------------------------------------


@case("phyllo.resync.noise",
      "Noise before a delimiter is dropped, and the chunk after it is read",
      section=STREAM, decision=BAD_INPUT)
async def resync_noise(ctx: Context) -> None:
    line = await open_line(ctx)
    message = _echo_of(line, "noise")
    line.write(b"\x17noise\xff\x80", "noise")
    await line.echo(message, "the echo of a message sent after noise")


@case("phyllo.resync.partial-chunk",
      "A chunk cut short and followed by a whole chunk costs only the cut one",
      section=STREAM, decision=BAD_INPUT)
async def resync_partial(ctx: Context) -> None:
    line = await open_line(ctx)
    if line.over_websocket:
        raise NotApplicable("a WebSocket carries each chunk whole")
    cut = _echo_of(line, "cut")
    wire = line.stack.encode_layered(cut)
    line.write(wire[: len(wire) // 2], "the first half of a chunk")
    await line.echo(_echo_of(line, "whole"), "the echo of the whole chunk sent after it")


@case("phyllo.resync.garbage",
      "After 4 KiB of garbage without a delimiter (longer than any chunk buffer) the device "
      "reads the next chunk",
      section=STREAM, decision=BAD_INPUT, harmful=True, timeout=20.0)
async def resync_garbage(ctx: Context) -> None:
    line = await open_line(ctx)
    if line.over_websocket:
        raise NotApplicable("a WebSocket carries each chunk whole")
    garbage = bytes((n * 37 + 11) % 255 + 1 for n in range(4096))
    line.write(garbage, "4 KiB without a 0x00")
    await line.echo(_echo_of(line, "garbage"), "the echo of a message sent after the garbage",
                    timeout=10.0)


@case("phyllo.resync.zeros-in-garbage",
      "Garbage with zeros in it (random-looking chunks) costs no good chunk after it",
      section=STREAM, decision=BAD_INPUT, harmful=True)
async def resync_zeros(ctx: Context) -> None:
    line = await open_line(ctx)
    garbage = bytes((n * 131 + 7) % 256 for n in range(2048))
    line.write(garbage, "2 KiB of garbage with zeros")
    await line.echo(_echo_of(line, "zeros"), "the echo of a message sent after the garbage")


@case("phyllo.resync.burst",
      "Twenty messages written at once are all echoed, in order", section=STREAM,
      level=Level.SHOULD, timeout=15.0)
async def resync_burst(ctx: Context) -> None:
    line = await open_line(ctx)
    messages = [_echo_of(line, f"burst{n}") for n in range(20)]
    line.write(b"".join(line.stack.encode_layered(m) for m in messages), "20 messages at once")
    for number, message in enumerate(messages, 1):
        await line.answer(message.__eq__, f"echo {number} of 20, in order",
                          timeout=5.0)
