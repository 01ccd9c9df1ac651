"""One Engine.IO session on the server: the message transport its protocol sees, on whichever
carrier holds it now (polling or a WebSocket), its pings, and its end."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from twisted.internet.error import ConnectionAborted, ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto import peerlog
from wireproto.codecs.engineio import (
    Packet,
    PacketType,
)
from wireproto.errors import (
    FrameTooLarge,
    LimitExceeded,
    ProtocolError,
    UnexpectedMessage,
)
from wireproto.peerlog import address_key, describe_address
from wireproto.transports.base import (
    IMessageProtocol,
    IMessageTransport,
    close_reason,
)
from wireproto.transports.engineio.heartbeat import Heartbeat
from wireproto.transports.engineio.options import POLLING, WEBSOCKET
from wireproto.transports.engineio.packets import (
    CLOSE,
    PING,
    Outgoing,
    close_code,
    close_websocket,
    deliver,
    prepare_outgoing,
)
from wireproto.transports.engineio.polling import PollingCarrier, respond
from wireproto.transports.engineio.state import SessionState
from wireproto.transports.engineio.websocket import ServerWebSocket, WebSocketCarrier

if TYPE_CHECKING:
    from wireproto.transports.engineio.server import EngineIOServer

__all__ = ["EngineIOSession"]

log = Logger()


@implementer(IMessageTransport)
class EngineIOSession(PollingCarrier, WebSocketCarrier):
    """One Engine.IO session on the server, carried by polling or by a WebSocket, as the
    IMessageTransport of its one message protocol."""

    kind = "engineio"
    # Prepared messages are carrier-neutral (Outgoing), so every session shares one key.
    prepareKey = ("engineio",)
    textOnly = False
    protocol: IMessageProtocol | None = None

    # Who the handshake said the peer is (None: anonymous).
    principal: Any = None

    def __init__(self, server: EngineIOServer, sid: str, peer: Any, host: Any) -> None:
        self.server = server
        self.sid = sid
        self._peer = peer
        self._host = host
        # The handshake's address: what max_sessions_per_address counts.
        self.address = address_key(peer)
        self.state = SessionState.OPEN
        # Until the client's first request after the handshake (polling sessions only).
        self._first_request_deadline: IDelayedCall | None = None
        # The WebSocket carrying the session, once it is on one.
        self._ws: ServerWebSocket | None = None
        # A WebSocket in the middle of the upgrade dance, and whether it has probed.
        self._upgrading: ServerWebSocket | None = None
        self._probed = False
        self._upgrade_deadline: IDelayedCall | None = None
        # Polling: packets waiting for a GET, and the GET held until there are some.
        self._queue: deque[Outgoing] = deque()
        self._queued_bytes = 0
        self._poll: Any = None
        self._linger: IDelayedCall | None = None
        # Flow control: a producer feeding this session, and whether we paused it; a POST held
        # while the protocol has paused us.
        self._producer: Any = None
        self._streaming = True
        self._producer_paused = False
        self._reading_paused = False
        self._held_post: tuple[Any, bytes] | None = None
        options = server.options
        self._heartbeat = Heartbeat(server.reactor, options.ping_interval, options.ping_timeout,
                                    lambda: self._transmit(PING), self._ping_timed_out)

    def __repr__(self) -> str:
        return f"<EngineIOSession {self.sid} {self.transportName} {self.state.value}>"

    @property
    def transportName(self) -> str:
        """The carrier now: "polling" or "websocket"."""
        return POLLING if self._ws is None else WEBSOCKET

    @property
    def maxMessageSize(self) -> int:
        return self.server.options.max_payload

    @property
    def _reactor(self) -> Any:
        return self.server.reactor

    def _start(self, protocol: IMessageProtocol) -> None:
        self.protocol = protocol
        self._heartbeat.start()
        if self._ws is None:
            self._first_request_deadline = self._reactor.callLater(
                self.server.options.first_request_timeout, self._never_requested
            )
        protocol.makeConnection(self)

    def _requested(self) -> None:
        deadline, self._first_request_deadline = self._first_request_deadline, None
        if deadline is not None and deadline.active():
            deadline.cancel()

    def _never_requested(self) -> None:
        self._first_request_deadline = None
        timeout = self.server.options.first_request_timeout
        # No GET will come to take a close packet: the slot is freed at once.
        self._abort(Failure(ConnectionLost(f"no request within {timeout:g} s of the handshake")))

    # -- IMessageTransport -------------------------------------------------------------------

    def sendMessage(self, data: bytes, binary: bool = True) -> None:
        limit = self.server.options.max_payload
        if len(data) > limit:
            raise FrameTooLarge(
                f"Engine.IO message of {len(data)} bytes is over this connection's limit of "
                f"{limit} bytes (EngineIOOptions.max_payload)"
            )
        self.sendPrepared(prepare_outgoing(data, binary))

    def prepareMessage(self, data: bytes, binary: bool = True) -> Outgoing:
        return prepare_outgoing(data, binary)

    def sendPrepared(self, prepared: Outgoing) -> None:
        # Fan-out may race the end of a session: such sends are dropped.
        if self.state is not SessionState.OPEN:
            return
        self._transmit(prepared)
        if self._ws is None and self._queued_bytes > self.server.options.max_poll_buffer:
            limit = self.server.options.max_poll_buffer
            error = LimitExceeded(
                f"over {limit} bytes waiting for a polling GET (EngineIOOptions.max_poll_buffer)"
            )
            self._drop_queue()
            self._fail(error)

    def write(self, data: bytes) -> None:
        """IConsumer.write: one binary message."""
        self.sendMessage(data, True)

    def loseConnection(self, error: ProtocolError | None = None) -> None:
        if error is None:
            self._close(Failure(ConnectionDone("Engine.IO session closed by this side")))
        else:
            self._close(error=error)

    def abortConnection(self) -> None:
        self._abort(Failure(ConnectionAborted("Engine.IO session aborted by this side")))

    def getPeer(self) -> Any:
        return self._peer

    def getHost(self) -> Any:
        return self._host

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        if self._producer is not None:
            raise RuntimeError(f"{self!r} already has a producer: {self._producer!r}")
        self._producer, self._streaming = producer, streaming
        if self._ws is not None:
            self._ws.registerProducer(producer, streaming)
        elif self._queued_bytes > self.server.options.poll_high_water:
            self._pause_producer()
        elif not streaming:
            # A pull producer is asked for data once now and after each poll, as Twisted's
            # transports ask after each write.
            producer.resumeProducing()

    def unregisterProducer(self) -> None:
        if self._producer is not None and self._ws is not None:
            self._ws.unregisterProducer()
        self._producer = None
        self._producer_paused = False

    def pauseProducing(self) -> None:
        """Stop taking the peer's packets: a WebSocket stops reading, and a POST is not
        answered (so the client sends no other) until resumeProducing."""
        self._reading_paused = True
        if self._ws is not None:
            self._ws.transport.pauseProducing()

    def resumeProducing(self) -> None:
        self._reading_paused = False
        if self._ws is not None:
            self._ws.transport.resumeProducing()
        held, self._held_post = self._held_post, None
        if held is not None:
            self._answer_post(*held)

    def stopProducing(self) -> None:
        self.abortConnection()

    # -- sending, on either carrier ------------------------------------------------------------

    def _transmit(self, packet: Outgoing) -> None:
        ws = self._ws
        if ws is not None:
            ws.sendPacket(packet)
            return
        self._queue.append(packet)
        self._queued_bytes += packet.size
        if self._poll is not None:
            self._answer_poll(self._poll)
        elif (
            self._queued_bytes > self.server.options.poll_high_water
            and self._producer is not None
        ):
            self._pause_producer()

    def _pause_producer(self) -> None:
        if self._streaming and not self._producer_paused:
            self._producer_paused = True
            self._producer.pauseProducing()

    # -- packets from the client, on either carrier ---------------------------------------------

    def _on_packet(self, packet: Packet) -> None:
        packet_type = packet.type
        self._heartbeat.packet_received(packet_type == PacketType.PONG)
        if packet_type == PacketType.MESSAGE:
            deliver(self.protocol, packet)
        elif packet_type == PacketType.CLOSE:
            self._closed_by_peer(
                Failure(ConnectionDone("the Engine.IO client sent a close packet"))
            )
        elif packet_type == PacketType.PING:
            self._fail(UnexpectedMessage(
                "Engine.IO 4 client sent a ping: only the server pings"
            ))
        # open, upgrade and noop are ignored, as engine.io does.

    def _ping_timed_out(self) -> None:
        timeout = self.server.options.ping_timeout
        self._close(Failure(ConnectionLost(
            f"no pong within {timeout:g} s of a ping (Engine.IO ping timeout)"
        )), text="ping timeout")

    # -- the end: OPEN -> CLOSING (the protocol is told) -> CLOSED (the sid is forgotten) --------

    def _fail(self, error: ProtocolError) -> None:
        """The client broke Engine.IO: log it (within the peers' log budget) and close."""
        peerlog.warn(
            log, address_key(self._peer), "closing Engine.IO session {sid} with {peer}: {error}",
            sid=self.sid, peer=describe_address(self._peer), error=error,
        )
        self._close(error=error)

    def _close(
        self, reason: Failure | None = None, *, error: ProtocolError | None = None,
        text: str | None = None,
    ) -> None:
        """Close, telling the client: a close packet, on its WebSocket or with its next GET
        (waited for up to ping_timeout). An `error` (the peer broke the protocol, logged by
        whoever found it) becomes the reason and the WebSocket's close code; `text` is the
        close reason otherwise."""
        if reason is None:
            reason = Failure(ConnectionLost(f"closed after a protocol error: {error}"))
        if not self._begin_closing():
            return
        ws = self._ws
        if ws is not None:
            ws.sendPacket(CLOSE)
            if error is not None:
                text = close_reason(error)
            close_websocket(ws, close_code(error), text)
            self._finish()
        elif not self._queue_close():
            # Wait a little for the client's next GET, to give it the close packet.
            self._linger = self._reactor.callLater(
                self.server.options.ping_timeout, self._finish
            )
        self._closed(reason)

    def _abort(self, reason: Failure) -> None:
        """Close at once, dropping what waits: the WebSocket is dropped, a held GET gets the
        close packet, and the sid is forgotten now."""
        if not self._begin_closing():
            self._finish()
            return
        self._drop_queue()
        ws = self._ws
        if ws is not None:
            ws.dropConnection(abort=True)
            self._finish()
        elif not self._queue_close():
            self._finish()
        self._closed(reason)

    def _closed_by_peer(self, reason: Failure) -> None:
        """The client sent a close packet: close its WebSocket, or answer a held GET with a
        noop as engine.io does, and forget the sid."""
        if not self._begin_closing():
            return
        ws = self._ws
        if ws is not None:
            close_websocket(ws, close_code(None), None)
        else:
            self._drop_queue()
            if self._poll is not None:
                self._answer_poll(self._poll)
        self._finish()
        self._closed(reason)

    def _carrier_lost(self, reason: Failure) -> None:
        """The WebSocket carrying the session closed under it."""
        if self._begin_closing():
            self._finish()
            self._closed(reason)

    def _begin_closing(self) -> bool:
        """OPEN -> CLOSING: free the slot, stop the timers and any upgrade. False if the
        session had already left OPEN."""
        if self.state is not SessionState.OPEN:
            return False
        self.state = SessionState.CLOSING
        self.server.session_closing(self)
        self._requested()
        self._heartbeat.stop()
        if self._upgrading is not None:
            self._abandon_upgrade("the session is closing")
        return True

    def _closed(self, reason: Failure) -> None:
        """After any close: answer a held POST, stop the producer, and tell the protocol."""
        held, self._held_post = self._held_post, None
        if held is not None:
            respond(held[0], 200, b"ok", b"text/html")
        producer, self._producer = self._producer, None
        if producer is not None and self._ws is None:
            # As a Twisted transport does when its connection is lost.
            producer.stopProducing()
        protocol, self.protocol = self.protocol, None
        if protocol is not None:
            protocol.connectionLost(reason)

    def _queue_close(self) -> bool:
        """Queue the close packet for polling, and answer a held GET with it (which finishes
        the session). False if no GET is held."""
        self._queue.append(CLOSE)
        if self._poll is None:
            return False
        self._answer_poll(self._poll)
        return True

    def _drop_queue(self) -> None:
        self._queue.clear()
        self._queued_bytes = 0

    def _finish(self) -> None:
        """CLOSED: forget the session; later requests for its sid are refused as unknown."""
        if self.state is SessionState.CLOSED:
            return
        self.state = SessionState.CLOSED
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        self._linger = None
        self._drop_queue()
        if self._poll is not None:
            request, self._poll = self._poll, None
            respond(request, 200, CLOSE.frame, b"text/plain; charset=UTF-8", no_store=True)
        if self.server.sessions.get(self.sid) is self:
            del self.server.sessions[self.sid]
