"""The SubbleSocket client role: the handshake, events to callbacks, and produce with its echo.

Implements the client side of SubbleSocket as docs/subblesocket.md describes it (the handshake,
events, produce events, errors and client IDs), on `wireproto.codecs.subble`:

- `connect` sends the handshake request and fires with the client once the host answers 2 (the
  client ID is known) or 3 (the host made one: ``client.client_id`` is it). A refusal (10, 11,
  12, 25) fails it with `HandshakeRefused`, which carries the code and the host's message. Any
  other first answer, or none within `handshake_timeout`, closes the connection;
- each event (code 26) goes to ``on_event`` and to the callbacks `listen` registered for its
  type, as a `SubbleEvent` whose payload is decoded from msgpack or JSON;
- `produce` sends a code 27 request and fires with the host's echo of the event (a `SubbleEvent`
  with code 27 and the request data), or fails with `EventForbidden` (51), `EventFailed` (52),
  `RequestTimeout`, or `ConnectionClosed`. The spec does not promise that the next message
  answers the last request; request data is how answers are matched (see `produce`);
- with ``reconnect=True`` it reconnects with backoff and handshakes again with the client ID the
  host gave the first time. A refused handshake is final: the client stops and `on_refused` is
  told. Produces are not queued while disconnected: they fail at once.

Addresses: a ``ws://``/``wss://`` URL (one message per binary frame) or a client endpoint string
(``tcp:host=...:port=...``; one message per ``length32`` frame unless `framing` says otherwise).
The request-data tail runs to the end of a message, so the framing must mark message ends.

    client = await connect(reactor, "tcp:host=127.0.0.1:port=7000",
                           subscribe=["temperature"], produce=["command"],
                           on_event=lambda event: print(event.type, event.payload))
    echo = await client.produce("command", {"heat": True})
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.codecs import subble
from wireproto.codecs.subble import (
    PROTOCOL_VERSION,
    Event,
    EventError,
    HandshakeRequest,
    HandshakeResponse,
    MessageCode,
    ProduceEvent,
    SerializationFormat,
    Version,
)
from wireproto.errors import (
    BadEncoding,
    FrameTooLarge,
    InvalidField,
    ProtocolError,
    UnexpectedMessage,
)
from wireproto.protocols.client import ClientBase
from wireproto.protocols.rpc import (
    DEFAULT_REQUEST_TIMEOUT,
    ConnectionClosed,
    PendingRequests,
    RequestTimeout,
)
from wireproto.protocols.subble.events import (
    EVENT_ERRORS,
    READABLE_FORMATS,
    EventCallback,
    EventFailed,
    EventForbidden,
    EventRefused,
    HandshakeRefused,
    SubbleEvent,
    parse_format,
)
from wireproto.protocols.subble.state import HandshakeState
from wireproto.transports.base import IMessageTransport, MessageProtocol
from wireproto.transports.connect import connect as connect_messages
from wireproto.transports.reconnect import DEFAULT_RETRY

__all__ = [
    "HandshakeRefused",
    "EventRefused",
    "EventForbidden",
    "EventFailed",
    "SubbleEvent",
    "EventListener",
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_REQUEST_TIMEOUT",
    "RequestTimeout",
    "ConnectionClosed",
    "SubbleClient",
    "SubbleClientProtocol",
    "connect",
]

log = Logger()

DEFAULT_HANDSHAKE_TIMEOUT = 10.0

_OK_CODES = frozenset({MessageCode.OK, MessageCode.OK_NEW_CLIENT_ID})


# -- one connection ------------------------------------------------------------------------------


class SubbleClientProtocol(MessageProtocol):
    """One connection of a `SubbleClient`. `handshaken` fires with it once the host accepted
    the handshake, or fails with HandshakeRefused, RequestTimeout or ConnectionClosed."""

    transport: IMessageTransport  # given by makeConnection, before any other call but cancel
    state: HandshakeState = HandshakeState.AWAITING
    # Whether the host accepted this connection (it may have ENDED since).
    accepted = False
    _timer: IDelayedCall | None = None

    def __init__(self, client: SubbleClient) -> None:
        self.client = client
        self.pending = PendingRequests(client.reactor)
        # request data -> the ids of the produces that carry it, oldest first
        self._order: dict[bytes, deque[int]] = {}
        self.handshaken: defer.Deferred[SubbleClientProtocol] = defer.Deferred(
            self._cancelHandshake
        )

    def _cancelHandshake(self, _: defer.Deferred) -> None:
        if self.connected:  # not before makeConnection; after connectionLost it has fired
            self.transport.abortConnection()

    def connectionMade(self) -> None:
        try:
            data = subble.encode(self.client._handshake_request())
        except ProtocolError as error:  # checked when the client was made; kept for safety
            self._handshakeFailed(error)
            self.transport.loseConnection()
            return
        self.transport.sendMessage(data, True)
        timeout = self.client.handshake_timeout
        if timeout is not None:
            self._timer = self.client.reactor.callLater(timeout, self._noResponse, timeout)

    def _noResponse(self, timeout: float) -> None:
        self._timer = None
        self._handshakeFailed(
            RequestTimeout(f"no SubbleSocket handshake response within {timeout:g} s")
        )
        self.transport.abortConnection()

    def _handshakeFailed(self, error: Exception) -> None:
        self.state = HandshakeState.ENDED
        self._stopTimer()
        if not self.handshaken.called:
            self.handshaken.errback(error)

    def _stopTimer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    # -- receiving -------------------------------------------------------------------------------

    def messageReceived(self, data: bytes, binary: bool) -> None:
        if self.state is HandshakeState.ENDED:
            return
        try:
            if not binary:
                raise BadEncoding("SubbleSocket is binary: the host sent a text message")
            message = subble.decode(data, sender=subble.Sender.SERVER)
            if self.state is HandshakeState.AWAITING:
                if type(message) is not HandshakeResponse:
                    raise UnexpectedMessage(
                        f"SubbleSocket code {message.code} before the handshake response"
                    )
                self._response(message)
            elif type(message) is Event:
                self._event(message)
            elif type(message) is EventError:
                self._settle(message.request_data, message)
            else:
                raise UnexpectedMessage(
                    f"SubbleSocket handshake response {message.code} after the handshake"
                )
        except ProtocolError as error:
            self._refuse(error)

    def _response(self, response: HandshakeResponse) -> None:
        self._stopTimer()
        if response.code not in _OK_CODES:
            self._handshakeFailed(
                HandshakeRefused(response.code, response.message, response.request_data)
            )
            self.transport.loseConnection()
            return
        sent = self.client.client_id or ""
        if response.code == MessageCode.OK_NEW_CLIENT_ID:
            client_id = response.message
        else:
            # 2 confirms the ID sent; a host that names it in the message is believed.
            client_id = response.message or sent
        if not client_id:
            raise InvalidField(
                f"SubbleSocket handshake response {int(response.code)} gives no client ID"
            )
        self.state = HandshakeState.OPEN
        self.accepted = True
        self.client._accepted(self, client_id, response)
        if not self.handshaken.called:
            self.handshaken.callback(self)

    def _event(self, message: Event) -> None:
        if message.code == MessageCode.CLIENT_EVENT:
            self._settle(message.request_data, message)
            return
        try:
            event = SubbleEvent.from_message(message)
        except ProtocolError as error:
            # Another producer's payload, most likely: skip the event, keep the connection.
            log.warn("SubbleSocket client: dropping event {type!r}: {error}",
                     event="client_event_dropped", protocol="subble",
                     type=message.event_type, error=error)
            return
        self.client._deliver(event)

    def _settle(self, request_data: bytes, answer: Event | EventError) -> None:
        """Give an echo or an event error to the oldest produce with this request data."""
        order = self._order.get(request_data)
        if not order:
            log.warn("SubbleSocket client: an answer ({code}) to no produce waiting, with "
                     "request data {data!r}", event="unknown_reply", protocol="subble",
                     code=int(answer.code), data=request_data)
            return
        produce_id = order.popleft()
        if not order:
            del self._order[request_data]
        # False when that produce timed out or was cancelled: its late answer is dropped.
        self.pending.resolve(produce_id, answer)

    def _refuse(self, error: ProtocolError) -> None:
        log.warn("SubbleSocket client: closing: {error}", event="client_protocol_error",
                 protocol="subble", error=error)
        self._handshakeFailed(error)
        self.transport.loseConnection(error)

    # -- sending ---------------------------------------------------------------------------------

    def produce(
        self,
        event_type: str,
        format: SerializationFormat | int,
        payload: bytes,
        request_data: bytes | None,
        timeout: float | None,
    ) -> defer.Deferred[SubbleEvent]:
        generated = request_data is None
        if request_data is None:
            request_data = secrets.token_urlsafe(9).encode()
            while request_data in self._order:
                request_data = secrets.token_urlsafe(9).encode()
        message = ProduceEvent(self.client.client_id or "", format, event_type, payload,
                               request_data)
        try:
            data = subble.encode(message)
            limit = self.transport.maxMessageSize
            if len(data) > limit:
                raise FrameTooLarge(
                    f"SubbleSocket produce event of {len(data)} bytes is over this connection's "
                    f"limit of {limit} bytes"
                )
        except ProtocolError as error:
            return defer.fail(error)
        produce_id = self.pending.next_id()
        d = self.pending.add(produce_id, timeout=timeout, what=f"produce {event_type}")
        self._order.setdefault(request_data, deque()).append(produce_id)
        if generated:
            # A generated token is unique: once its produce is over, nothing else can use it.
            d.addBoth(self._forget, request_data)
        d.addCallback(_answered, event_type)
        self.transport.sendMessage(data, True)
        return d

    def _forget(self, result: Any, request_data: bytes) -> Any:
        self._order.pop(request_data, None)
        return result

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        self._stopTimer()
        if self.accepted:
            # The client first, so code that a failing produce resumes sees it disconnected.
            self.client._disconnected(self, reason)
        else:
            self._handshakeFailed(ConnectionClosed(
                "the SubbleSocket connection closed before the handshake response: "
                f"{reason.getErrorMessage()}"
            ))
        self._order.clear()
        self.pending.fail_all(
            ConnectionClosed(f"the SubbleSocket connection closed: {reason.getErrorMessage()}")
        )


def _answered(answer: Event | EventError, event_type: str) -> SubbleEvent:
    if type(answer) is EventError:
        raise EVENT_ERRORS[answer.code](answer.message, answer.request_data,
                                         event_type=event_type)
    return SubbleEvent.from_message(answer)


# -- the client ----------------------------------------------------------------------------------


class EventListener:
    """One callback for one event type; `cancel()` removes it."""

    def __init__(self, client: SubbleClient, event_type: str, callback: EventCallback) -> None:
        self.client = client
        self.event_type = event_type
        self.callback = callback

    def cancel(self) -> None:
        listeners = self.client._listeners.get(self.event_type)
        if listeners is not None and self in listeners:
            listeners.remove(self)
            if not listeners:
                del self.client._listeners[self.event_type]


class SubbleClient(ClientBase):
    """A SubbleSocket client, connected or (with `reconnect`) reconnecting.

    `client_id` None (or "") asks the host for a new ID. `subscribe` and `produce` are the
    event types sent in the handshake, joined by `separator`; `request_data` goes with the
    handshake. `on_event(event)` is called with every event (code 26). `connect_options` go to
    `wireproto.transports.connect` (framing, websocket, stream, context_factory).

    After the handshake, `client_id` is the ID the host confirmed (2) or assigned (3), and
    `response` the host's HandshakeResponse (`response_code` its code).
    """

    what = "SubbleSocket client"

    def __init__(
        self,
        reactor: Any,
        address: str,
        *,
        client_id: str | None = None,
        subscribe: Iterable[str] = (),
        produce: Iterable[str] = (),
        separator: str = ";",
        request_data: bytes = b"",
        version: Version = PROTOCOL_VERSION,
        on_event: EventCallback | None = None,
        reconnect: bool = False,
        retry_policy: Callable[[int], float] = DEFAULT_RETRY,
        handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT,
        **connect_options: Any,
    ) -> None:
        super().__init__(reactor, address, reconnect=reconnect, retry_policy=retry_policy)
        if isinstance(subscribe, str) or isinstance(produce, str):
            raise TypeError("subscribe and produce are lists of event types, not a str")
        self.client_id = client_id or None
        self.subscribe_list = tuple(subscribe)
        self.produce_list = tuple(produce)
        self.separator = separator
        self.request_data = bytes(request_data)
        self.version = Version(*version)
        self.on_event = on_event
        self.handshake_timeout = handshake_timeout
        self.connect_options = connect_options
        self.response: HandshakeResponse | None = None
        self._listeners: dict[str, list[EventListener]] = {}
        # Refused now, not on the first connection: a bad name, separator or version.
        subble.encode(self._handshake_request())

    @property
    def response_code(self) -> MessageCode | None:
        """2 or 3 once connected; None before the first handshake."""
        return None if self.response is None else self.response.code

    # -- hooks: replace them (on_connect and on_disconnect are ClientBase's) ---------------------

    def on_refused(self, error: HandshakeRefused) -> None:
        """The host refused a handshake. The client has stopped: it does not reconnect."""

    # -- connecting ------------------------------------------------------------------------------

    def _handshake_request(self) -> HandshakeRequest:
        return HandshakeRequest(self.version, self.client_id or "", self.separator,
                                self.subscribe_list, self.produce_list, self.request_data)

    def _connect_once(self) -> defer.Deferred:
        d = connect_messages(
            self.reactor, self.address, lambda: SubbleClientProtocol(self), **self.connect_options
        )
        d.addCallback(lambda protocol: protocol.handshaken)
        d.addErrback(self._attempt_failed)
        return d

    def _attempt_failed(self, reason: Failure) -> Failure:
        if reason.check(HandshakeRefused):
            # Final: another attempt would meet the same refusal.
            self.closing = True
            if self._reconnector is not None:
                self._reconnector.stop()
            self._connect_failed(reason)
            self._hook("on_refused", reason.value)
        return reason

    def _accepted(
        self, protocol: SubbleClientProtocol, client_id: str, response: HandshakeResponse
    ) -> None:
        # Kept for every later handshake: a reconnection comes back as the same client.
        self.client_id = client_id
        self.response = response
        self._connected(protocol)

    # -- events ----------------------------------------------------------------------------------

    def listen(self, event_type: str, callback: EventCallback) -> EventListener:
        """Call `callback(event)` for each event of `event_type` (besides `on_event`). The type
        must be in the subscribe list: the host sends no other."""
        if event_type not in self.subscribe_list:
            raise ValueError(
                f"{event_type!r} is not in the subscribe list {list(self.subscribe_list)!r}: the "
                "host sends only the event types the handshake subscribed to"
            )
        listener = EventListener(self, event_type, callback)
        self._listeners.setdefault(event_type, []).append(listener)
        return listener

    def _deliver(self, event: SubbleEvent) -> None:
        callbacks: list[EventCallback] = [
            listener.callback for listener in self._listeners.get(event.type, ())
        ]
        if self.on_event is not None:
            callbacks.append(self.on_event)
        for callback in callbacks:
            try:
                callback(event)
            except Exception:
                log.failure("SubbleSocket client: a callback for {type!r} raised",
                            event="callback_failed", protocol="subble", type=event.type)

    # -- producing -------------------------------------------------------------------------------

    def produce(
        self,
        event_type: str,
        payload: Any,
        *,
        format: str | SerializationFormat | int = "msgpack",
        request_data: bytes | None = None,
        timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
    ) -> defer.Deferred[SubbleEvent]:
        """Produce an event of `event_type`; fires with the host's echo (a SubbleEvent, code
        27, with the GUID, source and date time the host gave it).

        `format` is "msgpack" (the default), "json", a SerializationFormat, or an int from 51
        to 255, for which `payload` must be bytes, sent as they are.

        Correlation: without `request_data` the client sends a random token of 12 ASCII
        characters as request data and matches the answer by it. With the caller's own
        `request_data`, an answer goes to the oldest produce still waiting with equal request
        data (the host answers a connection's produces in order); a produce that timed out
        keeps its place until its answer comes.

        Fails with EventForbidden (51), EventFailed (52), RequestTimeout after `timeout`
        seconds (None: never), ConnectionClosed (not connected, or the connection closed
        first), or a ProtocolError for a payload or a message the protocol cannot carry.
        """
        chosen = parse_format(format)
        if request_data is not None:
            if not isinstance(request_data, (bytes, bytearray, memoryview)):
                raise TypeError(
                    f"request_data is bytes, not {type(request_data).__name__}"
                )
            request_data = bytes(request_data)
        if chosen in READABLE_FORMATS:
            try:
                raw = subble.pack_payload(payload, chosen)
            except ProtocolError as error:
                return defer.fail(error)
        elif isinstance(payload, (bytes, bytearray, memoryview)):
            raw = bytes(payload)
        else:
            raise TypeError(
                f"format {chosen} is not one wireproto serializes: the payload must be bytes, "
                f"not {type(payload).__name__}"
            )
        if self.protocol is None:
            return defer.fail(ConnectionClosed("the SubbleSocket client is not connected"))
        return self.protocol.produce(event_type, chosen, raw, request_data, timeout)


def connect(
    reactor: Any,
    address: str,
    *,
    client_id: str | None = None,
    subscribe: Iterable[str] = (),
    produce: Iterable[str] = (),
    separator: str = ";",
    request_data: bytes = b"",
    version: Version = PROTOCOL_VERSION,
    on_event: EventCallback | None = None,
    reconnect: bool = False,
    **connect_options: Any,
) -> defer.Deferred[SubbleClient]:
    """Connect a `SubbleClient` to `address` and handshake; fires with the client once the host
    accepted (``client.client_id`` is the confirmed or assigned ID), or fails with
    HandshakeRefused. `connect_options` are SubbleClient's other options (retry_policy,
    handshake_timeout) and `wireproto.transports.connect`'s."""
    return SubbleClient(
        reactor, address, client_id=client_id, subscribe=subscribe, produce=produce,
        separator=separator, request_data=request_data, version=version, on_event=on_event,
        reconnect=reconnect, **connect_options,
    ).connect()
