"""The UBRE client kit's catalogue and what its cases share (docs/conformance.md, "UBRE clients:
the driver and results").

The kit plays a UBRE server. The client under test runs a DRIVER, a few lines written with its
library's public API (the driver contract, in docs/conformance.md):

1. subscribe to ``conformance/in``, ``conformance/ask`` and ``conformance/leave``;
2. answer a request named ``echo`` with its body, and fail one named ``fail`` with its body (in
   the binary format, where requests have no name, answer every request with its body);
3. publish the body of each publish on ``conformance/in``, as it came, on ``conformance/out``;
4. for each publish on ``conformance/ask``, request ``echo`` with its body and publish the
   success body on ``conformance/answer``, or the fail body on ``conformance/failed``;
5. on a publish on ``conformance/leave``, unsubscribe from ``conformance/in`` (or, when it has,
   subscribe to it again);
6. reconnect when the connection is lost (or exit, and let ``--run`` start it again).

A case starts a `Session`: it takes the client's connection, waits for its three subscribes
(their format tells the client's: JSON or binary) and says, as a broker does, that it
subscribes to the topics the driver publishes on (ubre.js publishes only on those).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

from wireproto.codecs import ubre
from wireproto.codecs.ubre import Message, Publish, Subscribe
from wireproto.conformance.bounded import bounded
from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.listener import ClientProbe
from wireproto.conformance.model import CaseFailed, NotApplicable
from wireproto.conformance.probe import Received, shown
from wireproto.errors import ProtocolError

__all__ = [
    "ANSWER", "ASK", "DECIDED", "FAILED", "IN", "LEAVE", "OUT", "Session", "kit", "session",
    "show", "still_works",
]

kit = Catalogue("ubre", "UBRE", "docs/ubre.md", mode="client")

DECIDED = "docs/ubre.md#what-we-decided"
JSON_FORMAT = "JSON Message Format"
BINARY_FORMAT = "Binary Message Format"

IN, ASK, LEAVE = "conformance/in", "conformance/ask", "conformance/leave"
OUT, ANSWER, FAILED = "conformance/out", "conformance/answer", "conformance/failed"
SUBSCRIBED = (IN, ASK, LEAVE)
PUBLISHED = (OUT, ANSWER, FAILED)

# How long a case waits for the driver's echo of what the kit sent.
ECHO_WAIT = 3.0
# How long a case waits for a client that closed its connection to come back.
RETURN_WAIT = 6.0
_tokens = itertools.count(1)


def show(value: object) -> str:
    return bounded(value, 80)


def json_bytes(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class Session:
    """One connection of the client under test, past its subscribes. `binary` says the client
    speaks the binary format (its subscribes came so); `text_only` that the connection carries
    text alone (the ``lines`` framing)."""

    ctx: Context
    probe: ClientProbe
    binary: bool
    text_only: bool

    @property
    def over_websocket(self) -> bool:
        return self.ctx.listener is not None and self.ctx.listener.kind == "websocket"

    def send(self, message: Message, binary: bool | None = None) -> None:
        """`message` in the client's format (or the one asked for)."""
        binary = self.binary if binary is None else binary
        self.probe.send(ubre.encode(message, binary=binary), binary=binary)

    def send_raw(self, data: bytes, binary: bool) -> None:
        """Bytes as one message: a text frame (binary False) or a binary frame."""
        if binary and self.text_only:
            raise NotApplicable("the lines framing carries text alone")
        self.probe.send(data, binary=binary)

    def body(self, value: object) -> object:
        """A body for the client's format: JSON values as they are, bytes in binary."""
        if not self.binary:
            return value
        return value if isinstance(value, bytes) else json_bytes(value)

    async def message(self, what: str, timeout: float = ECHO_WAIT) -> Message:
        """The next message the client sends, decoded (CaseFailed if it does not decode)."""
        return decoded(await self.probe.receive(timeout, what))

    async def publish_on(self, topic: str, what: str,
                         timeout: float = ECHO_WAIT) -> Publish:
        """The next publish the client sends on `topic`, its other messages recorded and passed
        over (a subscribe again, say)."""
        deadline = self.ctx.reactor.seconds() + timeout
        while True:
            left = deadline - self.ctx.reactor.seconds()
            if left <= 0:
                raise CaseFailed(f"expected {what} within {timeout:g} s, got nothing")
            message = await self.message(what, left)
            if isinstance(message, Publish) and message.topic == topic:
                return message

    async def echo(self, body: object, what: str = "the echo") -> Publish:
        """Publish `body` on conformance/in; the client's publish of it on conformance/out."""
        self.send(Publish(IN, self.body(body)))
        return await self.publish_on(OUT, f"{what} on {OUT}")

    async def rejoin(self) -> None:
        """After a case that made the client leave conformance/in: have it join again (a client
        the user started serves the next case too). Not judged: a client that does not join
        again is judged by the next case."""
        self.send(Publish(LEAVE, self.body("join")))
        deadline = self.ctx.reactor.seconds() + 2.0
        try:
            while True:
                message = await self.message("the subscribe again",
                                             max(0.01, deadline - self.ctx.reactor.seconds()))
                if isinstance(message, Subscribe) and message.topic == IN:
                    return
        except CaseFailed:
            self.ctx.note("the client did not subscribe to conformance/in again")

    async def works(self, what: str) -> None:
        """The client still echoes on this connection."""
        token = f"still-{next(_tokens)}"
        echoed = await self.echo(token, f"the echo of a publish sent after {what}")
        if _plain(echoed.body) != token:
            raise CaseFailed(f"after {what}, the echo came with the body {show(echoed.body)}, "
                             f"not {token!r}")


def _plain(body: object) -> object:
    if isinstance(body, bytes):
        try:
            return json.loads(body)
        except ValueError:
            return body
    return body


def decoded(received: Received) -> Message:
    """What the client sent, read by wireproto's codec; CaseFailed if it is not UBRE."""
    try:
        return ubre.decode(received.data if received.binary else received.data.decode())
    except (ProtocolError, UnicodeDecodeError) as error:
        raise CaseFailed(f"the client sent what is not UBRE ({error}): {shown(received)}") \
            from None


async def session(ctx: Context, timeout: float | None = None) -> Session:
    """The client's next connection, once it has subscribed to the driver's three topics; the
    kit then says it subscribes to the three the driver publishes on. The wait is the case's
    timeout (--timeout's) by default: a client started by --run may be slow to start."""
    if timeout is None:
        timeout = ctx.timeout
    probe = await ctx.accept(timeout, "the client to connect")
    listener = ctx.listener
    text_only = listener is not None and listener.kind == "stream" and \
        (listener.framing or "length32") == "lines"
    wanted = set(SUBSCRIBED)
    binary: bool | None = None
    deadline = ctx.reactor.seconds() + timeout
    while wanted:
        left = deadline - ctx.reactor.seconds()
        if left <= 0:
            raise CaseFailed(f"the client did not subscribe to {', '.join(sorted(wanted))} "
                             f"within {timeout:g} s of connecting (the driver contract)")
        received = await probe.receive(left, "the client's subscribes")
        message = decoded(received)
        if isinstance(message, Subscribe):
            wanted.discard(message.topic)
            if binary is None:
                binary = not ubre.is_json(received.data)
    result = Session(ctx, probe, bool(binary), text_only)
    for topic in PUBLISHED:
        result.send(Subscribe(topic))
    return result


async def still_works(ctx: Context, current: Session, what: str) -> str:
    """Judge a client after something that may hurt it: it still echoes on its connection, or
    it closed that connection (and came back, or did not, its process still running). A client
    whose process ended fails. Returns what was seen, for the report."""
    if current.probe.is_open:
        try:
            await current.works(what)
            return "it kept working"
        except CaseFailed as failure:
            if current.probe.is_open:
                raise CaseFailed(f"it stopped answering after {what}: {failure}") from None
    closed = current.probe.closed_as
    how = closed.described if closed is not None else "closed"
    if ctx.client is not None and await ctx.client.ended(1.0):
        # A driver may exit when its connection is lost (--run starts it again): only a
        # failure status, or a signal, is a crash.
        if ctx.client.status != 0:
            raise CaseFailed(f"{what} ended the client")
        return f"it closed the connection ({how}) and exited with status 0"
    try:
        again = await session(ctx, RETURN_WAIT)
    except CaseFailed:
        if ctx.client is None:
            return f"it closed the connection ({how}) and did not come back within " \
                   f"{RETURN_WAIT:g} s (the kit cannot tell whether it still runs)"
        return f"it closed the connection ({how}); its process still runs"
    await again.works(what)
    return f"it closed the connection ({how}) and came back"


@kit.liveness
async def alive(ctx: Context) -> None:
    """The client connects, subscribes as the driver contract says, and echoes a publish."""
    current = await session(ctx, ctx.timeout)
    await current.works("connecting")
