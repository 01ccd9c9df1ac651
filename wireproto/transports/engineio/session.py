"""One Engine.IO session on the server: the message transport its protocol sees, its state (a
`SessionMachine`), its carriers, its upgrade from polling to a WebSocket, its pings and its end.

The session alone moves its state. It talks to its carriers, a `PollingCarrier` and (once it is
on one) a `ServerWebSocket`, through their public methods, and they tell it what comes through
its own (`PollingOwner`, `WebSocketOwner`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.error import ConnectionAborted, ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto import peerlog
from wireproto.codecs.engineio import Packet, PacketType
from wireproto.errors import FrameTooLarge, LimitExceeded, ProtocolError, UnexpectedMessage
from wireproto.peerlog import address_key, describe_address
from wireproto.transports.base import IMessageProtocol, IMessageTransport, close_reason
from wireproto.transports.engineio.heartbeat import Heartbeat
from wireproto.transports.engineio.options import CLOSE_NORMAL, POLLING, WEBSOCKET, EngineIOOptions
from wireproto.transports.engineio.packets import (
    CLOSE,
    PING,
    PROBE_PONG,
    Outgoing,
    close_code,
    deliver,
    prepare_outgoing,
)
from wireproto.transports.engineio.polling import PollingCarrier
from wireproto.transports.engineio.state import (
    CarrierState,
    SessionEvent,
    SessionMachine,
    SessionState,
)
from wireproto.transports.engineio.websocket import ServerWebSocket, decode_frame

if TYPE_CHECKING:
    from wireproto.access import Principal

__all__ = ["SessionHost", "EngineIOSession"]

log = Logger()


class SessionHost(Protocol):
    """What a session asks of the server that holds it."""

    options: EngineIOOptions
    reactor: Any

    def session_closing(self, session: EngineIOSession) -> None:
        """`session` left the open state: its slot is free."""
        ...

    def session_finished(self, session: EngineIOSession) -> None:
        """`session` is over: forget its sid."""
        ...


@implementer(IMessageTransport)
class EngineIOSession:
    """One Engine.IO session on the server, carried by polling or by a WebSocket, as the
    IMessageTransport of its one message protocol."""

    kind = "engineio"
    # Prepared messages are carrier-neutral (Outgoing), so every session shares one key.
    prepareKey = ("engineio",)
    textOnly = False
    protocol: IMessageProtocol | None = None

    def __init__(
        self, server: SessionHost, sid: str, peer: Any, host: Any, *,
        principal: Principal | None = None,
        websocket: ServerWebSocket | None = None,
    ) -> None:
        """A session opened by a polling handshake, or on `websocket`, a WebSocket of its own;
        `peer` and `host` are the handshake's addresses."""
        self._server = server
        self._options = options = server.options
        self.sid = sid
        self._peer = peer
        self._host = host
        # Who the handshake said the peer is (None: anonymous).
        self.principal = principal
        # The handshake's address: what max_sessions_per_address counts.
        self.address = address_key(peer)
        self._machine = SessionMachine(
            CarrierState.POLLING if websocket is None else CarrierState.WEBSOCKET
        )
        # Polling: one born on a WebSocket never polls, and its polling carrier stays empty.
        self._polling = PollingCarrier(self, options.max_payload)
        # The WebSocket carrying the session, once it is on one.
        self._websocket = websocket
        if websocket is not None:
            websocket.attach(self)
        # A WebSocket in the middle of the upgrade, and when it must be done.
        self._upgrading: ServerWebSocket | None = None
        self._upgrade_deadline: IDelayedCall | None = None
        # Until the client's first request after the handshake (polling sessions only).
        self._first_request_deadline: IDelayedCall | None = None
        # A closing polling session's wait for a GET to take its close packet.
        self._linger: IDelayedCall | None = None
        # Flow control: a producer feeding this session, and whether we paused it; whether the
        # protocol paused our reading.
        self._producer: Any = None
        self._streaming = True
        self._producer_paused = False
        self._reading_paused = False
        self._heartbeat = Heartbeat(server.reactor, options.ping_interval, options.ping_timeout,
                                    lambda: self._transmit(PING), self._ping_timed_out)

    def __repr__(self) -> str:
        return f"<EngineIOSession {self.sid} {self.transportName} {self.state.value}>"

    @property
    def state(self) -> SessionState:
        return self._machine.state

    @property
    def is_open(self) -> bool:
        return self._machine.state is SessionState.OPEN

    @property
    def transportName(self) -> str:
        """The carrier now: "polling" or "websocket"."""
        return WEBSOCKET if self._machine.carrier is CarrierState.WEBSOCKET else POLLING

    @property
    def queued_bytes(self) -> int:
        """The bytes waiting for a polling GET."""
        return self._polling.queued_bytes

    @property
    def maxMessageSize(self) -> int:
        return self._options.max_payload

    def start(self, protocol: IMessageProtocol) -> None:
        """Serve `protocol`: the heartbeat begins, and a polling session's wait for its first
        request."""
        self.protocol = protocol
        self._heartbeat.start()
        if self._websocket is None:
            self._first_request_deadline = self._server.reactor.callLater(
                self._options.first_request_timeout, self._never_requested
            )
        protocol.makeConnection(self)

    def _requested(self) -> None:
        deadline, self._first_request_deadline = self._first_request_deadline, None
        if deadline is not None and deadline.active():
            deadline.cancel()

    def _never_requested(self) -> None:
        self._first_request_deadline = None
        timeout = self._options.first_request_timeout
        # No GET will come to take a close packet: the slot is freed at once.
        self._abort(Failure(ConnectionLost(f"no request within {timeout:g} s of the handshake")))

    # -- IMessageTransport -------------------------------------------------------------------

    def sendMessage(self, data: bytes, binary: bool = True) -> None:
        limit = self._options.max_payload
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
        if not self.is_open:
            return
        self._transmit(prepared)
        limit = self._options.max_poll_buffer
        if self._websocket is None and self._polling.queued_bytes > limit:
            error = LimitExceeded(
                f"over {limit} bytes waiting for a polling GET (EngineIOOptions.max_poll_buffer)"
            )
            self._polling.drop_queue()
            self.fail(error)

    def write(self, data: bytes) -> None:
        """IConsumer.write: one binary message."""
        self.sendMessage(data, True)

    def loseConnection(self, error: ProtocolError | None = None) -> None:
        if error is None:
            self.close(Failure(ConnectionDone("Engine.IO session closed by this side")))
        else:
            self.close(error=error)

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
        if self._websocket is not None:
            self._websocket.registerProducer(producer, streaming)
        elif self._polling.queued_bytes > self._options.poll_high_water:
            self._pause_producer()
        elif not streaming:
            # A pull producer is asked for data once now and after each poll, as Twisted's
            # transports ask after each write.
            producer.resumeProducing()

    def unregisterProducer(self) -> None:
        if self._producer is not None and self._websocket is not None:
            self._websocket.unregisterProducer()
        self._producer = None
        self._producer_paused = False

    def pauseProducing(self) -> None:
        """Stop taking the peer's packets: a WebSocket stops reading, and a POST is not
        answered (so the client sends no other) until resumeProducing."""
        self._reading_paused = True
        self._polling.pause_reading()
        if self._websocket is not None:
            self._websocket.pause_reading()

    def resumeProducing(self) -> None:
        self._reading_paused = False
        if self._websocket is not None:
            self._websocket.resume_reading()
        self._polling.resume_reading()

    def stopProducing(self) -> None:
        self.abortConnection()

    # -- sending, on either carrier ------------------------------------------------------------

    def _transmit(self, packet: Outgoing) -> None:
        if self._websocket is not None:
            self._websocket.send_packet(packet)
            return
        if (
            not self._polling.send(packet)
            and self._polling.queued_bytes > self._options.poll_high_water
            and self._producer is not None
        ):
            self._pause_producer()

    def _pause_producer(self) -> None:
        if self._streaming and not self._producer_paused:
            self._producer_paused = True
            self._producer.pauseProducing()

    def poll_answered(self) -> None:
        """A GET took what was queued: the close packet ends a closing session; an open one's
        producer may go on."""
        if self.state is SessionState.CLOSING:
            self.finish()
            return
        producer = self._producer
        if producer is not None:
            if self._producer_paused:
                self._producer_paused = False
                producer.resumeProducing()
            elif not self._streaming:
                producer.resumeProducing()

    # -- the client's requests and packets, on either carrier ----------------------------------

    def poll(self, request: Any) -> Any:
        """A polling GET (twisted.web's render answer)."""
        self._requested()
        return self._polling.get(request, at_once=self._machine.carrier is CarrierState.PROBED)

    def post(self, request: Any) -> Any:
        """A polling POST (twisted.web's render answer)."""
        self._requested()
        return self._polling.post(request)

    def post_too_large(self, request: Any) -> Any:
        """A POST over max_payload that was not read: 413, and the session is closed."""
        return self._polling.post_too_large(request)

    def websocket_message(self, ws: ServerWebSocket, payload: bytes, binary: bool) -> None:
        if ws is self._websocket:
            if not self.is_open:
                return
            try:
                packet = decode_frame(payload, binary, self._options.max_payload)
            except ProtocolError as error:
                self.fail(error)
                return
            self.packet_received(packet)
        elif ws is self._upgrading:
            self._upgrade_frame(ws, payload, binary)

    def websocket_closed(self, ws: ServerWebSocket, reason: Failure) -> None:
        if ws is self._websocket:
            # The WebSocket carrying the session closed under it.
            if self._begin_closing():
                self.finish()
                self._closed(reason)
        elif ws is self._upgrading:
            # A failed upgrade leaves the session on polling.
            self._end_upgrade()

    def packet_received(self, packet: Packet) -> None:
        packet_type = packet.type
        self._heartbeat.packet_received(packet_type == PacketType.PONG)
        if packet_type == PacketType.MESSAGE:
            protocol = self.protocol
            if protocol is not None:  # None once the session closed
                deliver(protocol, packet)
        elif packet_type == PacketType.CLOSE:
            self._closed_by_peer(
                Failure(ConnectionDone("the Engine.IO client sent a close packet"))
            )
        elif packet_type == PacketType.PING:
            self.fail(UnexpectedMessage(
                "Engine.IO 4 client sent a ping: only the server pings"
            ))
        # open, upgrade and noop are ignored, as engine.io does.

    def _ping_timed_out(self) -> None:
        timeout = self._options.ping_timeout
        self.close(Failure(ConnectionLost(
            f"no pong within {timeout:g} s of a ping (Engine.IO ping timeout)"
        )), text="ping timeout")

    # -- the upgrade: POLLING -> UPGRADING -> PROBED -> WEBSOCKET ------------------------------

    @property
    def can_upgrade(self) -> bool:
        return self._machine.allows(SessionEvent.UPGRADE_OPENED)

    def upgrade_opened(self, ws: ServerWebSocket) -> None:
        """`ws`, opened with this session's sid, is to carry it once the client is done."""
        self._requested()
        if not self.can_upgrade:
            ws.close_with(CLOSE_NORMAL, "the session cannot be upgraded now")
            return
        self._machine.process(SessionEvent.UPGRADE_OPENED)
        ws.attach(self)
        self._upgrading = ws
        self._upgrade_deadline = self._server.reactor.callLater(
            self._options.upgrade_timeout, self._upgrade_timed_out
        )

    def _upgrade_frame(self, ws: ServerWebSocket, payload: bytes, binary: bool) -> None:
        if not binary and payload == b"2probe":
            self._machine.process(SessionEvent.PROBE)
            ws.send_packet(PROBE_PONG)
            # Polls are answered at once from now on, so the client can switch.
            self._polling.release()
        elif not binary and payload == b"5":
            self._switch_to(ws)
        else:
            # engine.io closes an upgrading WebSocket that sends anything else.
            self._abandon_upgrade("unexpected packet during the upgrade")

    def _upgrade_timed_out(self) -> None:
        self._upgrade_deadline = None
        self._abandon_upgrade("the upgrade did not finish in time")

    def _abandon_upgrade(self, why: str) -> None:
        ws = self._upgrading
        self._end_upgrade()
        if ws is not None:
            ws.detach()
            ws.close_with(CLOSE_NORMAL, why)

    def _end_upgrade(self) -> None:
        """The upgrade failed: the session stays on polling."""
        self._machine.process(SessionEvent.UPGRADE_FAILED)
        self._forget_upgrade()

    def _forget_upgrade(self) -> None:
        self._upgrading = None
        deadline, self._upgrade_deadline = self._upgrade_deadline, None
        if deadline is not None and deadline.active():
            deadline.cancel()

    def _switch_to(self, ws: ServerWebSocket) -> None:
        """The client's upgrade packet: the session moves to `ws`, with what was queued."""
        self._machine.process(SessionEvent.UPGRADE)
        self._forget_upgrade()
        self._websocket = ws
        if not ws.passed:  # else its peer is the process that passed it: the handshake's stays
            self._peer, self._host = ws.addresses()
        for packet in self._polling.take_queue():
            ws.send_packet(packet)
        # A GET held through an upgrade without a probe took nothing: it gets a noop.
        self._polling.release()
        if self._reading_paused:
            ws.pause_reading()
        producer = self._producer
        if producer is not None:
            ws.registerProducer(producer, self._streaming)
            if self._producer_paused:
                self._producer_paused = False
                producer.resumeProducing()

    # -- the end: OPEN -> CLOSING (the protocol is told) -> CLOSED (the sid is forgotten) --------

    def fail(self, error: ProtocolError) -> None:
        """The client broke Engine.IO: log it (within the peers' log budget) and close."""
        peerlog.warn(
            log, address_key(self._peer), "closing Engine.IO session {sid} with {peer}: {error}",
            event="engineio_protocol_error", sid=self.sid, peer=describe_address(self._peer),
            error=error,
        )
        self.close(error=error)

    def close(
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
        ws = self._websocket
        if ws is not None:
            ws.send_packet(CLOSE)
            if error is not None:
                text = close_reason(error)
            ws.close_with(close_code(error), text)
            self.finish()
        elif not self._polling.send_close():
            # Wait a little for the client's next GET, to give it the close packet.
            self._linger = self._server.reactor.callLater(
                self._options.ping_timeout, self.finish
            )
        self._closed(reason)

    def _abort(self, reason: Failure) -> None:
        """Close at once, dropping what waits: the WebSocket is dropped, a held GET gets the
        close packet, and the sid is forgotten now."""
        if not self._begin_closing():
            self.finish()
            return
        self._polling.drop_queue()
        ws = self._websocket
        if ws is not None:
            ws.drop()
            self.finish()
        elif not self._polling.send_close():
            self.finish()
        self._closed(reason)

    def _closed_by_peer(self, reason: Failure) -> None:
        """The client sent a close packet: close its WebSocket, or answer a held GET with a
        noop as engine.io does, and forget the sid."""
        if not self._begin_closing():
            return
        ws = self._websocket
        if ws is not None:
            ws.close_with(close_code(None), None)
        else:
            self._polling.drop_queue()
            self._polling.release()
        self.finish()
        self._closed(reason)

    def _begin_closing(self) -> bool:
        """OPEN -> CLOSING: end any upgrade, free the slot, stop the timers. False if the
        session had already left OPEN."""
        if not self.is_open:
            return False
        if self._upgrading is not None:
            self._abandon_upgrade("the session is closing")
        self._machine.process(SessionEvent.CLOSE)
        self._server.session_closing(self)
        self._requested()
        self._heartbeat.stop()
        return True

    def _closed(self, reason: Failure) -> None:
        """After any close: answer a held POST, stop the producer, and tell the protocol."""
        self._polling.close_held_post()
        producer, self._producer = self._producer, None
        if producer is not None and self._websocket is None:
            # As a Twisted transport does when its connection is lost.
            producer.stopProducing()
        protocol, self.protocol = self.protocol, None
        if protocol is not None:
            protocol.connectionLost(reason)

    def finish(self) -> None:
        """CLOSING -> CLOSED: forget the session; later requests for its sid are refused as
        unknown. Nothing if it is over already."""
        if self.state is SessionState.CLOSED:
            return
        self._machine.process(SessionEvent.FINISH)
        linger, self._linger = self._linger, None
        if linger is not None and linger.active():
            linger.cancel()
        self._polling.finish()
        self._server.session_finished(self)
