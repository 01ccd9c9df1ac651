"""HTTP long-polling, one carrier of an Engine.IO session: held GETs that take the queued
packets, POSTs whose payloads bring the client's; and engine.io's HTTP answers."""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from twisted.internet.error import ConnectionLost
from twisted.python.failure import Failure
from twisted.web.server import NOT_DONE_YET

from wireproto import speedups
from wireproto.codecs.engineio import (
    Packet,
    decode_payload,
)
from wireproto.codecs.serialization import json_dumps
from wireproto.errors import (
    FrameTooLarge,
    InvalidField,
    ProtocolError,
    UnexpectedMessage,
)
from wireproto.transports.engineio.options import BAD_REQUEST, ERROR_MESSAGES, FORBIDDEN
from wireproto.transports.engineio.packets import CLOSE, NOOP, Outgoing

__all__ = [
    "respond",
    "refuse",
    "PollingOwner",
    "PollingCarrier",
]


def respond(
    request: Any, code: int, body: bytes, content_type: bytes, *, no_store: bool = False
) -> None:
    request.setResponseCode(code)
    request.setHeader(b"content-type", content_type)
    request.setHeader(b"content-length", b"%d" % len(body))
    if no_store:
        request.setHeader(b"cache-control", b"no-store")
    request.write(body)
    request.finish()


def refuse(request: Any, code: int) -> int:
    """engine.io's abortRequest: 403 for FORBIDDEN, else 400, with its JSON body."""
    body = json_dumps({"code": code, "message": ERROR_MESSAGES[code]}).encode("utf-8")
    respond(request, 403 if code == FORBIDDEN else 400, body, b"application/json")
    return NOT_DONE_YET


class PollingOwner(Protocol):
    """What a `PollingCarrier` asks of its session."""

    @property
    def is_open(self) -> bool:
        """Whether the session takes the client's packets (it is OPEN)."""
        ...

    def packet_received(self, packet: Packet) -> None: ...

    def fail(self, error: ProtocolError) -> None:
        """The client broke Engine.IO: close the session."""
        ...

    def close(self, reason: Failure) -> None:
        """Close the session, telling the client if it can."""
        ...

    def poll_answered(self) -> None:
        """A GET took what was queued."""
        ...


class PollingCarrier:
    """The HTTP long-polling side of one session: the packets queued for the client's next GET,
    the GET held until there are some, and a POST held while the session's reading is paused.
    It reads and answers requests, and tells its owner what came (`PollingOwner`)."""

    def __init__(self, owner: PollingOwner, max_payload: int) -> None:
        self._owner = owner
        self._max_payload = max_payload
        self._queue: deque[Outgoing] = deque()
        # The bytes of the packets in the queue.
        self.queued_bytes = 0
        self._held_get: Any = None
        self._held_post: tuple[Any, bytes] | None = None
        self._reading_paused = False

    # -- what the session sends ----------------------------------------------------------------

    def send(self, packet: Outgoing) -> bool:
        """Queue `packet` for the client, and answer a held GET with it. False if no GET is
        held: it waits for the next."""
        self._queue.append(packet)
        self.queued_bytes += packet.size
        if self._held_get is None:
            return False
        self._answer_get(self._held_get)
        return True

    def send_close(self) -> bool:
        """Queue the close packet, and answer a held GET with it. False if no GET is held."""
        self._queue.append(CLOSE)
        if self._held_get is None:
            return False
        self._answer_get(self._held_get)
        return True

    def release(self) -> None:
        """Answer a held GET now, with what is queued (a noop if nothing is)."""
        if self._held_get is not None:
            self._answer_get(self._held_get)

    def take_queue(self) -> list[Outgoing]:
        """Everything queued, for another carrier to send; the queue is left empty."""
        packets = list(self._queue)
        self.drop_queue()
        return packets

    def drop_queue(self) -> None:
        self._queue.clear()
        self.queued_bytes = 0

    def finish(self) -> None:
        """The session is over: drop what is queued, and a held GET gets the close packet."""
        self.drop_queue()
        request, self._held_get = self._held_get, None
        if request is not None:
            respond(request, 200, CLOSE.frame, b"text/plain; charset=UTF-8", no_store=True)

    def close_held_post(self) -> None:
        """Answer a held POST without reading it: the session closed."""
        held, self._held_post = self._held_post, None
        if held is not None:
            respond(held[0], 200, b"ok", b"text/html")

    def pause_reading(self) -> None:
        """Answer no POST (so the client sends no other) until resume_reading."""
        self._reading_paused = True

    def resume_reading(self) -> None:
        self._reading_paused = False
        held, self._held_post = self._held_post, None
        if held is not None:
            self._answer_post(*held)

    # -- the client's requests -----------------------------------------------------------------

    def get(self, request: Any, *, at_once: bool) -> Any:
        """A GET: answered now if anything is queued (or `at_once`, during an upgrade, so the
        client can switch), else held until something is."""
        if self._held_get is not None:
            self._owner.fail(UnexpectedMessage(
                "Engine.IO client sent a polling GET while another was held (overlap)"
            ))
            return refuse(request, BAD_REQUEST)
        if self._queue or at_once:
            self._answer_get(request)
            return NOT_DONE_YET
        self._held_get = request
        request.notifyFinish().addErrback(self._get_lost, request)
        return NOT_DONE_YET

    def post(self, request: Any) -> Any:
        """A POST: its packets are delivered and it is answered ``ok``, or held while reading
        is paused."""
        if not self._owner.is_open:
            respond(request, 200, b"ok", b"text/html")
            return NOT_DONE_YET
        if request.getHeader(b"content-type") == b"application/octet-stream":
            self._owner.fail(InvalidField(
                "Engine.IO 4 POST bodies are text, not application/octet-stream"
            ))
            return refuse(request, BAD_REQUEST)
        limit = self._max_payload
        body = request.content.read(limit + 1)
        if len(body) > limit:
            return self.post_too_large(request)
        if self._held_post is not None:
            self._owner.fail(UnexpectedMessage(
                "Engine.IO client sent a POST while another was held"
            ))
            return refuse(request, BAD_REQUEST)
        if self._reading_paused:
            self._held_post = (request, body)
            request.notifyFinish().addErrback(self._post_lost, request)
            return NOT_DONE_YET
        self._answer_post(request, body)
        return NOT_DONE_YET

    def post_too_large(self, request: Any) -> Any:
        """A POST over max_payload: 413, and the session is closed, as engine.io does."""
        self._owner.fail(FrameTooLarge(
            f"Engine.IO POST body is over {self._max_payload} bytes (EngineIOOptions.max_payload)"
        ))
        respond(request, 413, b"", b"text/html")
        return NOT_DONE_YET

    def _answer_get(self, request: Any) -> None:
        """Answer a GET with everything queued (a noop if nothing is)."""
        if request is self._held_get:
            self._held_get = None
        queue = self._queue
        if queue:
            body = "\x1e".join(packet.segment() for packet in queue)
            self.drop_queue()
        else:
            body = NOOP.segment()
        respond(
            request, 200, body.encode("utf-8"), b"text/plain; charset=UTF-8", no_store=True
        )
        self._owner.poll_answered()

    def _get_lost(self, _reason: Failure, request: Any) -> None:
        if self._held_get is request:
            self._held_get = None
            self._owner.close(Failure(ConnectionLost(
                "the held polling GET's connection closed before it was answered"
            )))

    def _post_lost(self, _reason: Failure, request: Any) -> None:
        if self._held_post is not None and self._held_post[0] is request:
            self._held_post = None

    def _answer_post(self, request: Any, body: bytes) -> None:
        owner = self._owner
        if owner.is_open:
            try:
                packets = decode_payload(body)
            except ProtocolError as error:
                owner.fail(error)
                refuse(request, BAD_REQUEST)
                return
            # What the POST's messages publish costs each connection they reach one write.
            speedups.batch_begin()
            try:
                for packet in packets:
                    if not owner.is_open:
                        break
                    owner.packet_received(packet)
            finally:
                speedups.batch_end()
        # text/html, as engine.io: text/plain would make some browsers offer a download.
        respond(request, 200, b"ok", b"text/html")
