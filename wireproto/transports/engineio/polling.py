"""HTTP long-polling: answering a session's GETs and POSTs, and engine.io's refusals."""

from __future__ import annotations

from typing import Any

from twisted.internet.error import ConnectionLost
from twisted.python.failure import Failure
from twisted.web.server import NOT_DONE_YET

from wireproto.codecs.engineio import (
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
from wireproto.transports.engineio.packets import NOOP
from wireproto.transports.engineio.state import SessionState

__all__ = [
    "respond",
    "refuse",
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


class PollingCarrier:
    """The HTTP long-polling side of an `EngineIOSession`: held GETs that take the queued
    packets, and POSTs whose payloads bring the client's. Mixed into the session, whose queue,
    producer and state it shares."""

    def _answer_poll(self, request: Any) -> None:
        """Answer a GET with everything queued (a noop if nothing is)."""
        if request is self._poll:
            self._poll = None
        queue = self._queue
        if queue:
            body = "\x1e".join(packet.segment() for packet in queue)
            queue.clear()
            self._queued_bytes = 0
        else:
            body = NOOP.segment()
        respond(
            request, 200, body.encode("utf-8"), b"text/plain; charset=UTF-8", no_store=True
        )
        if self.state is SessionState.CLOSING:
            # The close packet was the last thing queued: it is out, the session is over.
            self._finish()
            return
        producer = self._producer
        if producer is not None:
            if self._producer_paused:
                self._producer_paused = False
                producer.resumeProducing()
            elif not self._streaming:
                producer.resumeProducing()

    # -- polling requests ----------------------------------------------------------------------

    def _on_poll(self, request: Any) -> Any:
        self._requested()
        if self._poll is not None:
            self._fail(UnexpectedMessage(
                "Engine.IO client sent a polling GET while another was held (overlap)"
            ))
            return refuse(request, BAD_REQUEST)
        if self._queue or self._probed:
            # During the upgrade, a GET is released at once so the client can switch.
            self._answer_poll(request)
            return NOT_DONE_YET
        self._poll = request
        request.notifyFinish().addErrback(self._poll_lost, request)
        return NOT_DONE_YET

    def _poll_lost(self, _reason: Failure, request: Any) -> None:
        if self._poll is request:
            self._poll = None
            self._close(Failure(ConnectionLost(
                "the held polling GET's connection closed before it was answered"
            )))

    def _on_post(self, request: Any) -> Any:
        self._requested()
        if self.state is not SessionState.OPEN:
            respond(request, 200, b"ok", b"text/html")
            return NOT_DONE_YET
        if request.getHeader(b"content-type") == b"application/octet-stream":
            self._fail(InvalidField(
                "Engine.IO 4 POST bodies are text, not application/octet-stream"
            ))
            return refuse(request, BAD_REQUEST)
        limit = self.server.options.max_payload
        body = request.content.read(limit + 1)
        if len(body) > limit:
            return self._post_too_large(request)
        if self._held_post is not None:
            self._fail(UnexpectedMessage(
                "Engine.IO client sent a POST while another was held"
            ))
            return refuse(request, BAD_REQUEST)
        if self._reading_paused:
            self._held_post = (request, body)
            request.notifyFinish().addErrback(self._post_lost, request)
            return NOT_DONE_YET
        self._answer_post(request, body)
        return NOT_DONE_YET

    def _post_too_large(self, request: Any) -> Any:
        limit = self.server.options.max_payload
        self._fail(FrameTooLarge(
            f"Engine.IO POST body is over {limit} bytes (EngineIOOptions.max_payload)"
        ))
        respond(request, 413, b"", b"text/html")
        return NOT_DONE_YET

    def _post_lost(self, _reason: Failure, request: Any) -> None:
        if self._held_post is not None and self._held_post[0] is request:
            self._held_post = None

    def _answer_post(self, request: Any, body: bytes) -> None:
        if self.state is SessionState.OPEN:
            try:
                packets = decode_payload(body)
            except ProtocolError as error:
                self._fail(error)
                refuse(request, BAD_REQUEST)
                return
            for packet in packets:
                if self.state is not SessionState.OPEN:
                    break
                self._on_packet(packet)
        # text/html, as engine.io: text/plain would make some browsers offer a download.
        respond(request, 200, b"ok", b"text/html")
