"""Recorded connections for the conformance kits: every message a case sends and receives, and
how each connection ended, kept in order for the report.

A `Probe` is a message protocol (wireproto.transports.base) on any transport wireproto's clients
reach: a WebSocket (``ws://``, ``wss://``, ``ws+unix://``) or a framed stream (``tcp:``,
``ssl:``, ``unix:`` endpoints with a framing). What it sends is given as bytes, so a case can send
what no codec would write; `send_raw` writes bytes under the framing, to break the framing itself.
"""

from __future__ import annotations

import base64
import functools
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import quote

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from wireproto.conformance.model import CaseFailed, Exchange
from wireproto.transports.base import MessageProtocol

__all__ = ["Closed", "Probe", "Received", "RecordBudget", "Recorder", "Target"]

# What a probe takes in one message: well above any server's limit, so that a server's largest
# message reaches the case, which judges it.
PROBE_MAX_MESSAGE = 64 * 1024 * 1024
# What one case keeps, so that a server that floods a case cannot exhaust the kit's memory: the
# exchanges recorded (the last one says the record stops there) and their bytes (beyond them, a
# message is recorded as an event that gives its length), and the messages queued
# unread on one connection (beyond them, the kit aborts that connection and says so).
RECORD_LIMIT = 500
# Of each message a record keeps its first bytes, the report's 4096 and room for a credential
# that straddles them; and a run keeps at most RUN_RECORD_BYTES in all.
KEPT_BYTES = 4096 + 8192
RUN_RECORD_BYTES = 16 * 1024 * 1024
QUEUE_LIMIT = 400  # below RECORD_LIMIT: the abort is on the record
QUEUE_BYTES = 2 * PROBE_MAX_MESSAGE


@dataclass(frozen=True)
class Target:
    """The implementation under test and how to reach it. `cafile`, `insecure`, `certfile`,
    `keyfile` and `headers` are the tools' --cafile, --insecure, --cert, --key, and -H with the
    credentials' Authorization header (wireproto.transports.connect.connect reads them the
    same way). `framing` is for stream endpoints. `max_message_size` is the largest message
    the server is said to take (the kit's --max-message-size), for the cases about limits.
    Topics a case uses start with `topic_prefix`, so that a server's access rules can allow
    them."""

    protocol: str
    address: str
    cafile: str | None = None
    insecure: bool = False
    certfile: str | None = None
    keyfile: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    framing: str | None = None
    max_message_size: int = 1_048_576
    topic_prefix: str = "conformance"
    receive_timeout: float = 2.0
    # The credentials the kit sends (header values, tokens, passwords): `mask` hides each in
    # what the server sends, before any case reads it.
    secrets: tuple[str, ...] = ()
    # A Phyllo device's stack (`conform device --stack`): "minimal" or "reduced".
    stack: str | None = None

    @property
    def over_websocket(self) -> bool:
        """Whether the target is a WebSocket URL (its frames are text or binary; a stream's
        framing is the kit's to break)."""
        from wireproto.transports.connect import is_websocket_address

        return is_websocket_address(self.address)

    @functools.cached_property
    def _masked(self) -> list[bytes]:
        return masked_forms(self.secrets)

    def mask(self, data: bytes) -> bytes:
        """`data` with every form of a credential a server may send back (plain, hex, base64,
        percent-encoded, JSON-escaped) replaced by as many ``*``: cases judge the same bytes,
        lengths and frames, and nothing they show can hold a credential, however they cut it."""
        for form in self._masked:
            if form in data:
                data = data.replace(form, b"*" * len(form))
        return data


@dataclass(frozen=True)
class Received:
    data: bytes
    binary: bool


@dataclass(frozen=True)
class Closed:
    """How a connection ended: a WebSocket's close `code` and `reason` (None without a close
    frame, and on a stream), whether it was `clean`, and the error's text."""

    code: int | None
    reason: str | None
    clean: bool
    text: str

    @property
    def described(self) -> str:
        """How a reason says it: ``close code 1002 'bad frame'``, or ``closed`` without a code."""
        if self.code is None:
            return "closed"
        return f"close code {self.code}" + (f" {self.reason!r}" if self.reason else "")


class RecordBudget:
    """The bytes the records of a whole run may keep: a server sending large messages case
    after case cannot make the kit (or its report) grow without end."""

    def __init__(self, size: int = RUN_RECORD_BYTES) -> None:
        self.left = size

    def take(self, size: int) -> bool:
        if size > self.left:
            return False
        self.left -= size
        return True


# A credential shorter than this is not looked for (it would blot out every byte that happens
# to equal it); a header value or a password is longer.
SHORTEST_SECRET = 4


def masked_forms(secrets: Iterable[str]) -> list[bytes]:
    """The forms each secret of `secrets` may come back in, longest first."""
    forms: set[bytes] = set()
    for secret in secrets:
        if len(secret) < SHORTEST_SECRET:
            continue
        raw = secret.encode("utf-8")
        forms.update({raw, raw.hex().encode(), raw.hex().upper().encode(),
                      quote(secret, safe="").encode(), repr(raw)[2:-1].encode(),
                      json.dumps(secret)[1:-1].encode(),
                      json.dumps(secret, ensure_ascii=False)[1:-1].encode("utf-8")})
        # base64 at each of the three alignments the secret may have in a longer message:
        # the characters that depend on its bytes alone.
        for skew in range(3):
            encoded = base64.b64encode(bytes(skew) + raw).rstrip(b"=")
            end = len(encoded) - (0 if (skew + len(raw)) % 3 == 0 else 4)
            core = encoded[4 if skew else 0:end]
            if len(core) >= 8:
                forms.add(core)
    return sorted(forms, key=len, reverse=True)


class Recorder:
    """The exchanges of one case, in order, with the clock they are timed by. Of each message
    it keeps the first KEPT_BYTES (the report shows fewer: a credential straddling the cut is
    still whole where the report's scrubber looks for it), within the run's `budget`."""

    def __init__(self, budget: RecordBudget | None = None) -> None:
        self.started = time.monotonic()
        self.exchanges: list[Exchange] = []
        self.connections = 0
        self.unrecorded = 0
        self.budget = budget or RecordBudget()

    def number(self) -> int:
        self.connections += 1
        return self.connections

    def add(self, connection: int, direction: str, data: bytes | None = None,
            binary: bool = True, text: str = "") -> None:
        if len(self.exchanges) >= RECORD_LIMIT:
            self.unrecorded += 1
            return
        length = 0 if data is None else len(data)
        if len(self.exchanges) == RECORD_LIMIT - 1:
            self.unrecorded += 1
            direction, data, text = "event", None, (
                f"the kit stops recording this case here ({RECORD_LIMIT} exchanges)")
        elif data is not None:
            data = data[:KEPT_BYTES]
            if not self.budget.take(len(data)):
                text = (f"{direction} {length} bytes, not kept: the run's record already "
                        f"holds {RUN_RECORD_BYTES} bytes")
                direction, data = "event", None
        self.exchanges.append(Exchange(connection, direction,
                                       round(time.monotonic() - self.started, 6),
                                       data, binary, text, length))


class Probe(MessageProtocol):
    """One recorded connection of a case. Received messages queue until a case asks for them
    (`receive`); a case that wants none checks with `silent`."""

    peer = "server"  # what is at the other end, as the record names it

    def __init__(self, recorder: Recorder, reactor: IReactorTime, receive_timeout: float,
                 mask: Callable[[bytes], bytes] | None = None) -> None:
        self.recorder = recorder
        self.mask = mask or bytes
        self.reactor = reactor
        self.receive_timeout = receive_timeout
        self.number = recorder.number()
        self.received: list[Received] = []
        self.queued_bytes = 0
        self.closed_as: Closed | None = None
        self._waiting: list[defer.Deferred[bool]] = []

    # IMessageProtocol

    def connectionMade(self) -> None:
        self.recorder.add(self.number, "event", text="connected")

    def messageReceived(self, data: bytes, binary: bool) -> None:
        data = self.mask(bytes(data))
        self.recorder.add(self.number, "received", data, binary)
        if len(self.received) >= QUEUE_LIMIT or self.queued_bytes + len(data) > QUEUE_BYTES:
            if self.transport is not None and self.connected:
                self.recorder.add(self.number, "event", text=(
                    f"the {self.peer} sent more than {QUEUE_LIMIT} messages or {QUEUE_BYTES} "
                    "bytes the kit had not read: the kit aborts the connection"))
                self.transport.abortConnection()
            return
        self.queued_bytes += len(data)
        self.received.append(Received(bytes(data), binary))
        self._wake()

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        code = getattr(self.transport, "remoteCloseCode", None)
        close_reason = getattr(self.transport, "remoteCloseReason", None)
        clean = bool(getattr(self.transport, "wasClean", True))
        text = str(reason.value).strip() or type(reason.value).__name__
        self.closed_as = Closed(code, close_reason, clean, text)
        self.recorder.add(self.number, "event", text=f"closed: {text}")
        self._wake()

    def _wake(self) -> None:
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            waiter.callback(True)

    async def _change(self, deadline: float) -> bool:
        """Wait for a message or the close, until `deadline` (the reactor's clock); False when
        the deadline came first."""
        left = deadline - self.reactor.seconds()
        if left <= 0:
            return False
        waiter: defer.Deferred[bool] = defer.Deferred()
        self._waiting.append(waiter)
        timer = self.reactor.callLater(
            left, lambda: None if waiter.called else waiter.callback(False))
        try:
            return await waiter
        finally:
            if timer.active():
                timer.cancel()
            if waiter in self._waiting:
                self._waiting.remove(waiter)

    # What a case does

    def send(self, data: bytes, binary: bool = True) -> None:
        """Send one message as it is."""
        if self.transport is None or not self.connected:
            raise CaseFailed(f"connection {self.number} closed before the kit could send: "
                             f"{self.closed_as.text if self.closed_as else 'never opened'}")
        self.recorder.add(self.number, "sent", bytes(data), binary)
        self.transport.sendMessage(bytes(data), binary)

    def send_raw(self, data: bytes, text: str = "") -> None:
        """Write `data` to the byte stream under the framing (a broken length prefix, say)."""
        byte_transport = getattr(self.transport, "transport", None)
        if byte_transport is None or not self.connected:
            raise CaseFailed(f"connection {self.number} is closed")
        self.recorder.add(self.number, "sent", bytes(data), True, text or "raw bytes")
        byte_transport.write(bytes(data))

    async def receive(self, timeout: float | None = None,
                      what: str = "a message") -> Received:
        """The next message; CaseFailed when none comes within `timeout` or the connection
        closes first. `what` names the awaited message in that failure."""
        seconds = self.receive_timeout if timeout is None else timeout
        deadline = self.reactor.seconds() + seconds
        while not self.received:
            if self.closed_as is not None:
                raise CaseFailed(f"expected {what}, but connection {self.number} closed "
                                 f"({self.closed_as.text})")
            if not await self._change(deadline):
                raise CaseFailed(f"expected {what} within {seconds:g} s, got nothing")
        message = self.received.pop(0)
        self.queued_bytes -= len(message.data)
        return message

    async def receive_matching(self, accept: Callable[[Received], bool],
                               timeout: float | None = None,
                               what: str = "a message") -> Received:
        """The next message `accept` takes, skipping others (a server's pings, say)."""
        seconds = self.receive_timeout if timeout is None else timeout
        deadline = self.reactor.seconds() + seconds
        while True:
            left = max(0.0, deadline - self.reactor.seconds())
            message = await self.receive(left if left > 0 else 0.001, what)
            if accept(message):
                return message

    async def silent(self, seconds: float, what: str = "nothing") -> None:
        """Check that no message comes within `seconds` (a close is not a message)."""
        deadline = self.reactor.seconds() + seconds
        while not self.received and self.closed_as is None:
            if not await self._change(deadline):
                return
        if self.received:
            raise CaseFailed(f"expected {what}, but got {_shown(self.received[0])}")

    async def closed(self, timeout: float | None = None,
                     what: str = "the server to close the connection") -> Closed:
        """How the connection ended, once it has; CaseFailed if it is still open after
        `timeout`. Messages received on the way are kept for `receive`."""
        seconds = self.receive_timeout if timeout is None else timeout
        deadline = self.reactor.seconds() + seconds
        while self.closed_as is None:
            if not await self._change(deadline):
                raise CaseFailed(f"expected {what} within {seconds:g} s; it stayed open")
        return self.closed_as

    def release(self) -> None:
        """Drop the messages the case did not read: the case is over."""
        self.received.clear()
        self.queued_bytes = 0

    @property
    def is_open(self) -> bool:
        return self.closed_as is None and self.connected

    def close(self) -> None:
        """Close from this side (a WebSocket with 1000); nothing is awaited."""
        if self.transport is not None and self.connected:
            self.recorder.add(self.number, "event", text="the kit closes")
            self.transport.loseConnection()

    def abort(self) -> None:
        if self.transport is not None and self.connected:
            self.recorder.add(self.number, "event", text="the kit aborts the connection")
            self.transport.abortConnection()


def _shown(message: Received, limit: int = 60) -> str:
    data = message.data[:limit]
    more = "..." if len(message.data) > limit else ""
    if not message.binary:
        return repr(data.decode("utf-8", "replace")) + more
    return f"{len(message.data)} bytes {data.hex()}{more}"


def shown(message: Received) -> str:
    """A short form of a message for a case's reason."""
    return _shown(message)
