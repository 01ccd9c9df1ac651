"""The WEBSMQ client kit's catalogue and what its cases share: the driver contract's topics, a
session on the client's connection that judges every frame the client sends with wireproto's
codec, and the checks that the client still works.

The driver contract (docs/conformance.md, "WEBSMQ clients: the driver and results"): once
connected, the client declares its last will on `conformance/will` (payload `gone`), subscribes
to `conformance/command` and `conformance/in`; it publishes the payload of every message it
gets on a topic it subscribed to (but the command topic) on `conformance/out`; it obeys the
commands `subscribe TOPIC`, `unsubscribe TOPIC`, `publish TOPIC PAYLOAD` and `close`, and
publishes `error: ...` on `conformance/out` when its library refuses one; it connects again when
the connection is lost (or lets --run start it again).
"""

from __future__ import annotations

import itertools

from autobahn.websocket.protocol import WebSocketProtocol

from wireproto.codecs import websmq
from wireproto.codecs.websmq import Message, Publish, Subscribe
from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.listener import ClientProbe
from wireproto.conformance.model import CaseFailed, NotApplicable
from wireproto.conformance.probe import Closed, Received, shown
from wireproto.conformance.websmq.support import described
from wireproto.errors import ProtocolError

__all__ = ["COMMAND", "IN", "OUT", "WILL", "Session", "kit", "session"]

kit = Catalogue("websmq", "WEBSMQ WebSocket Message Queue", "docs/websmq.md", mode="client")

DECIDED = "docs/websmq.md#what-we-decided"
TOPICS = "docs/websmq.md#topics"
CLIENT = "docs/websmq.md#the-client"

# The driver contract's topics.
IN = "conformance/in"
OUT = "conformance/out"
COMMAND = "conformance/command"
WILL = "conformance/will"
WILL_PAYLOAD = b"gone"

# How long a case waits for the client to answer what it sent (an echo, a command's frame).
ANSWER_WAIT = 3.0
_tokens = itertools.count(1)

# How long a client's process is watched for a crash after a hostile message.
CRASH_WAIT = 0.5


def client_frame(received: Received) -> Message:
    """The message the client sent, or CaseFailed saying why it is not WEBSMQ: a text frame,
    or bytes the codec refuses (a topic length past the end, an invalid topic)."""
    if not received.binary:
        raise CaseFailed(f"the client sent a text frame ({shown(received)}): WEBSMQ frames are "
                         "binary")
    try:
        return websmq.decode(received.data)
    except ProtocolError as error:
        raise CaseFailed(f"the client sent a frame that is not WEBSMQ ({error}): "
                         f"{shown(received)}") from None


class Session:
    """The client's connection for one case, and every frame it sent on it, judged."""

    def __init__(self, ctx: Context, probe: ClientProbe) -> None:
        self.ctx = ctx
        self.probe = probe
        self.sent: list[Message] = []

    async def frame(self, what: str, timeout: float | None = None) -> Message:
        """The client's next frame, judged."""
        received = await self.probe.receive(ANSWER_WAIT if timeout is None else timeout, what)
        message = client_frame(received)
        self.sent.append(message)
        return message

    async def until(self, wanted: type[Message], topic: str, what: str,
                    timeout: float | None = None) -> Message:
        """The client's next `wanted` frame on `topic`, every frame before it judged too."""
        seconds = ANSWER_WAIT if timeout is None else timeout
        deadline = self.ctx.reactor.seconds() + seconds
        while True:
            left = deadline - self.ctx.reactor.seconds()
            if left <= 0:
                raise CaseFailed(f"expected {what} within {seconds:g} s; the client sent "
                                 f"{self.shown_sent()}")
            try:
                message = await self.frame(what, left)
            except CaseFailed as failed:
                if self.probe.closed_as is not None or "got nothing" not in str(failed):
                    raise
                raise CaseFailed(f"expected {what} within {seconds:g} s; the client sent "
                                 f"{self.shown_sent()}") from None
            if isinstance(message, wanted) and message.topic == topic:
                return message

    def shown_sent(self, last: int = 4) -> str:
        """The last frames the client sent, for a reason."""
        if not self.sent:
            return "nothing"
        return "; ".join(described(message) for message in self.sent[-last:])

    async def ready(self, timeout: float | None = None) -> None:
        """Wait for the driver's Subscribe to the `in` topic (its last step on connecting), at
        most `timeout` seconds (the case's own timeout by default)."""
        await self.until(Subscribe, IN, f"the client's Subscribe to {IN!r}",
                         self.ctx.timeout if timeout is None else timeout)

    def send(self, message: Message) -> None:
        self.probe.send(websmq.encode(message))

    def command(self, text: bytes) -> None:
        self.send(Publish(COMMAND, text))

    async def answer(self, seconds: float) -> bytes | None:
        """The payload of a Publish on `out` within `seconds`, or None when none came (an
        invalid frame still fails the case)."""
        deadline = self.ctx.reactor.seconds() + seconds
        while True:
            left = deadline - self.ctx.reactor.seconds()
            if left <= 0 or not await self._more(left):
                return None
            message = await self.frame("a frame")
            if isinstance(message, Publish) and message.topic == OUT:
                return message.payload

    async def _more(self, seconds: float) -> bool:
        """Whether a frame is there to read within `seconds` (a close is none)."""
        deadline = self.ctx.reactor.seconds() + seconds
        while not self.probe.received:
            if self.probe.closed_as is not None or self.ctx.reactor.seconds() >= deadline:
                return False
            await self.ctx.sleep(0.02)
        return True

    async def out(self, what: str, timeout: float | None = None) -> bytes:
        """The payload of the client's next Publish on the `out` topic."""
        published = await self.until(Publish, OUT, what, timeout)
        return published.payload

    async def echoed(self, message: Message, what: str, timeout: float | None = None) -> None:
        """Send `message` (on a topic the driver echoes) and expect its payload back on
        `out`."""
        self.send(message)
        got = await self.out(what, timeout)
        if got != message.payload:
            raise CaseFailed(f"expected {what}, the payload {_bytes(message.payload)}, but the "
                             f"client published {_bytes(got)}")

    async def works(self, what: str = "the echo of a publish after it") -> None:
        """The client still echoes what is published on the `in` topic."""
        token = b"still-there-%d" % next(_tokens)
        await self.echoed(Publish(IN, token), what)

    async def survives(self) -> str:
        """After something hostile was sent: the client either keeps working (it still echoes)
        or closes the connection; its process (with --run) must not crash (a failure status or
        a signal). Says which."""
        try:
            await self.works()
            said = "kept working (it echoed a publish after it)"
        except CaseFailed as failed:
            if self.probe.closed_as is None:
                raise CaseFailed(f"the client neither kept working nor closed the connection: "
                                 f"{failed}") from None
            said = f"closed the connection ({self.probe.closed_as.described})"
        client = self.ctx.client
        if client is not None and await client.ended(CRASH_WAIT):
            # A driver may end when its connection is lost: only a failure is a crash.
            if client.crashed:
                raise CaseFailed(f"it {said}, and its process {client.described()}")
            return f"{said}, and its process {client.described()}"
        return said

    @property
    def over_websocket(self) -> bool:
        listener = self.ctx.listener
        return listener is not None and listener.kind == "websocket"

    @property
    def websocket(self) -> WebSocketProtocol | None:
        """The connection's Autobahn protocol, over WebSocket (for control frames)."""
        transport = self.probe.transport
        return transport if isinstance(transport, WebSocketProtocol) else None

    def websocket_only(self, what: str) -> None:
        if not self.over_websocket:
            raise NotApplicable(f"{what}: a framed stream has none")

    def stream_only(self, what: str) -> None:
        if self.over_websocket:
            raise NotApplicable(f"{what}: a WebSocket has no length prefix of the kit's own")

    def close_with(self, code: int, reason: bytes = b"") -> None:
        """Close from the kit's side: a WebSocket with `code`, a stream as a stream closes."""
        websocket = self.websocket
        if websocket is not None and self.probe.is_open:
            self.ctx.note(f"the kit closes with code {code}")
            # sendCloseFrame takes any code, sendClose only a few.
            websocket.sendCloseFrame(code=code, reasonUtf8=reason or None)
        else:
            self.probe.close()

    async def closed(self, timeout: float) -> Closed:
        return await self.probe.closed(timeout, "the connection to close")


def _bytes(data: bytes) -> str:
    if len(data) > 40:
        return f"{len(data)} bytes {data[:40]!r}..."
    return repr(data)


async def session(ctx: Context) -> Session:
    """The client's next connection, once the driver has subscribed as it does on connecting."""
    probe = await ctx.accept()
    started = Session(ctx, probe)
    await started.ready()
    return started
