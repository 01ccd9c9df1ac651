"""What both UBRE roles share: hub formats, bodies, handler registries and the peer protocol.

See docs/ubre.md for how bodies map to hub payloads and back."""


from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from types import EllipsisType
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.codecs import ubre
from wireproto.codecs.serialization import json_loads, json_utf8
from wireproto.codecs.ubre import NO_BODY, Fail, Publish, Request, Subscribe, Success, Unsubscribe
from wireproto.errors import (
    Forbidden,
    FrameTooLarge,
    InvalidField,
    NotThisProtocol,
    ProtocolError,
)
from wireproto.hub import Encoder, HubMessage, describe_address
from wireproto.payloads import json_from_payload, payload_from_value
from wireproto.protocols.rpc import (
    ConnectionClosed,
    PendingRequests,
    RequestFailed,
    error_body,
    run_handler,
)
from wireproto.transports.base import IMessageTransport, MessageProtocol

__all__ = [
    "JSON_FORMAT",
    "JSON_TEXT_FORMAT",
    "BINARY_FORMAT",
    "DEFAULT_MAX_TOPIC_LENGTH",
    "DEFAULT_MAX_PENDING_REQUESTS",
    "NOT_FOUND",
    "TOO_MANY_REQUESTS",
    "Handler",
    "payload_from_body",
    "HandlerRegistry",
    "UbrePeer",
]

log = Logger()

# Hub wire formats. JSON_FORMAT sends a payload JSON cannot carry as a binary-format message;
# JSON_TEXT_FORMAT (the lines framing) cannot, and skips it.
JSON_FORMAT = "ubre-json"
JSON_TEXT_FORMAT = "ubre-json-text"
BINARY_FORMAT = "ubre-binary"

DEFAULT_MAX_TOPIC_LENGTH = 1024
DEFAULT_MAX_PENDING_REQUESTS = 1000
NOT_FOUND = "NotFound"  # ubre.js's fail body for a request no handler takes
TOO_MANY_REQUESTS = "TooManyRequests"
FORBIDDEN = "Forbidden"  # the fail body for a request this peer may not make

_BINARY_ANSWERS = (b"s", b"f")

# handler(body, peer) -> reply body, a Deferred of one, or a coroutine; raise to fail.
Handler = Callable[[Any, Any], Any]


# -- bodies and hub payloads ----------------------------------------------------------------------


def payload_from_body(body: Any) -> bytes:
    """A UBRE body as a hub payload: no body as b"", otherwise as `payload_from_value` says."""
    return b"" if body is NO_BODY else payload_from_value(body)


def _json_value_of_payload(payload: bytes) -> Any:
    """Bytes for a JSON body, read as a hub payload is (see json_from_payload)."""
    body_text = json_from_payload(payload)
    if body_text is None:
        raise InvalidField(
            "bytes that are not UTF-8 cannot be a UBRE JSON body; send the binary format"
        )
    return json_loads(body_text, "body") if body_text else NO_BODY


def json_publish(topic: str, body_text: bytes) -> bytes:
    head = b'{"publish":' + json_utf8(topic)
    return head + b',"body":' + body_text + b"}" if body_text else head + b"}"


def _encode_binary(message: HubMessage) -> tuple[bytes, bool] | None:
    try:
        return ubre.encode(Publish(message.topic, message.payload or NO_BODY), binary=True), True
    except ProtocolError:
        return None


def _encode_json_text(message: HubMessage) -> tuple[bytes, bool] | None:
    try:
        body_text = json_from_payload(message.payload)
        return None if body_text is None else (json_publish(message.topic, body_text), False)
    except ProtocolError:
        return None


def _encode_json(message: HubMessage) -> tuple[bytes, bool] | None:
    return _encode_json_text(message) or _encode_binary(message)


# By wire format, as the hub names them (any hashable).
HUB_ENCODERS: dict[Hashable, Encoder] = {
    JSON_FORMAT: _encode_json,
    JSON_TEXT_FORMAT: _encode_json_text,
    BINARY_FORMAT: _encode_binary,
}


def incoming_body(body: Any, binary_format: bool) -> Any:
    """What a handler or callback gets for a body: b"" or None when there is none."""
    if body is NO_BODY:
        return b"" if binary_format else None
    return body


def outgoing_body(value: Any, binary_format: bool) -> Any:
    """A handler's result (or a request's body) as a message body for the format. None is no
    body; the binary format takes bytes, str as UTF-8, anything else as JSON text."""
    if value is None or value is NO_BODY:
        return NO_BODY
    if not binary_format:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return _json_value_of_payload(bytes(value))
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value) or NO_BODY
    if isinstance(value, str):
        return value.encode() or NO_BODY
    return json_utf8(value)


class HandlerRegistry:
    """Request handlers by name, and the default handler for requests that name none; what a
    UbreServer and a UbreClient both answer requests with."""

    handlers: dict[str, Handler]
    default_handler: Handler | None
    # observe(seconds, succeeded) per request answered by a handler; set by wireproto.metrics.
    observe_request: Callable[[float, bool], Any] | None = None
    # The settings each connection takes (UbrePeer): a fail's detail, the requests it may have
    # waiting for answers and how long each waits (None: for ever), and the clock they wait on.
    debug: bool
    max_pending_requests: int
    request_timeout: float | None
    reactor: IReactorTime

    def handle(
        self, name: str | Mapping[str, Handler], handler: Handler | None = None
    ) -> Any:
        """Answer requests named `name` with `handler`; or many at once from a mapping; or, with
        no handler, a decorator: ``@server.handle("add")``."""
        if isinstance(name, Mapping):
            self.handlers.update(name)
            return None
        if handler is None:
            def register(fn: Handler) -> Handler:
                self.handlers[name] = fn
                return fn

            return register
        self.handlers[name] = handler
        return handler


# -- what client and server share -----------------------------------------------------------------


class UbrePeer(MessageProtocol):
    """One UBRE connection, either role: decoding, answering requests through handlers, sending
    requests and matching their replies. Subclasses say what subscribe, unsubscribe and publish
    mean for them."""

    transport: IMessageTransport  # given before any other call (makeConnection)
    # True on a text-only transport (the lines framing), which carries JSON alone.
    text_only = False
    # Format of this connection's latest subscribe: its publishes go that way.
    binary_format = False
    _failed = False
    # The broker's side says, closing a connection for a message it cannot read, that it
    # serves UBRE (NotThisProtocol): its peer may be a client of another protocol.
    serves: str | None = None

    def __init__(self, owner: HandlerRegistry) -> None:
        """`owner` (a UbreServer or a UbreClient) holds the handlers and the settings."""
        self.owner = owner
        self.handlers = owner.handlers
        self.debug = owner.debug
        self.max_pending_requests = owner.max_pending_requests
        self.request_timeout = owner.request_timeout
        self.pending = PendingRequests(owner.reactor)

    @property
    def default_handler(self) -> Handler | None:
        return self.owner.default_handler

    def makeConnection(self, transport: IMessageTransport) -> None:
        self._answering = 0
        self.text_only = transport.textOnly
        super().makeConnection(transport)

    # -- sending --------------------------------------------------------------------------------

    def _write(self, data: bytes, binary: bool) -> None:
        self.transport.sendMessage(data, binary)

    def _check_size(self, data: bytes) -> None:
        """Refuse what the peer would refuse: a message over this connection's size limit."""
        limit = self.transport.maxMessageSize
        if len(data) > limit:
            raise FrameTooLarge(
                f"UBRE message of {len(data)} bytes is over this connection's limit of {limit} "
                f"bytes (max_message_size)"
            )

    def request(
        self,
        name: str | None,
        body: Any = NO_BODY,
        *,
        timeout: float | None | EllipsisType = ...,
        binary: bool | None = None,
    ) -> defer.Deferred:
        """Ask the peer: `name` picks its handler (ubre.js's form), None sends the spec's form
        (the id alone), the only one the binary format has. The Deferred fires with the success
        body, or fails with RequestFailed (carrying the fail body), RequestTimeout or
        ConnectionClosed. `timeout` is in seconds, None for none."""
        binary_format = self.binary_format if binary is None else binary
        if binary_format and name is not None:
            raise ValueError(
                "a binary-format UBRE request carries only an id, so it cannot name a handler; "
                "pass name=None, or binary=False"
            )
        if self.text_only and binary_format:
            raise ValueError("the lines framing carries UBRE JSON only")
        if not self.connected:
            return defer.fail(ConnectionClosed("the UBRE connection is closed"))
        if isinstance(timeout, EllipsisType):  # not given: the owner's
            timeout = self.request_timeout
        request_id = self.pending.next_id()
        try:
            if binary_format and type(body) is bytes:
                data = ubre.encode_binary_regular(Request, request_id, body)
            else:
                data = ubre.encode(
                    Request(request_id, outgoing_body(body, binary_format), name=name),
                    binary=binary_format,
                )
            self._check_size(data)
        except ProtocolError as error:
            return defer.fail(error)
        d = self.pending.add(request_id, timeout=timeout, what=name if name else request_id)
        self._write(data, binary_format)
        return d

    # -- receiving ------------------------------------------------------------------------------

    def messageReceived(self, data: bytes, binary: bool) -> None:
        if self._failed:
            return
        if not binary and not data.strip():
            return  # an empty line (someone pressing Enter in nc), or an empty text frame
        if binary and data[:1] in _BINARY_ANSWERS:
            answer = ubre.decode_binary_answer(data)
            if answer is not None:  # the requester's hot path: no message object
                succeeded, request_id, body = answer
                if succeeded:
                    self.pending.resolve(request_id, body)
                else:
                    self.pending.reject(request_id, body)
                return
        try:
            message = ubre.decode(data) if binary else ubre.decode_json(data)
        except ProtocolError as error:
            self._refuse(error if self.serves is None else NotThisProtocol(self.serves, error))
            return
        try:
            binary_format = not ubre.is_json(data)
            if isinstance(message, Publish):
                self.publishReceived(message, data, binary_format)
            elif isinstance(message, Request):
                self._answer(message, binary_format)
            elif isinstance(message, Success):
                self.pending.resolve(message.id, incoming_body(message.body, binary_format))
            elif isinstance(message, Fail):
                self.pending.reject(message.id, incoming_body(message.body, binary_format))
            elif isinstance(message, Subscribe):
                self.subscribeReceived(message, binary_format)
            else:
                self.unsubscribeReceived(message, binary_format)
        except Forbidden:
            pass  # UBRE has no word for a refused publish or subscribe; the refusal is counted
        except ProtocolError as error:
            self._refuse(error)

    def publishReceived(self, message: Publish, data: bytes, binary_format: bool) -> None:
        raise NotImplementedError

    def subscribeReceived(self, message: Subscribe, binary_format: bool) -> None:
        raise NotImplementedError

    def unsubscribeReceived(self, message: Unsubscribe, binary_format: bool) -> None:
        raise NotImplementedError

    def handlerArgument(self) -> Any:
        """What a handler gets as its second argument: the peer that asked."""
        return self

    def checkCall(self, name: str) -> None:
        """Forbidden if the peer may not make the request `name` ("" for one without a name)."""

    def _answer(self, message: Request, binary_format: bool) -> None:
        if self._answering >= self.max_pending_requests:
            self._reply(Fail, message.id, TOO_MANY_REQUESTS, binary_format)
            return
        try:
            self.checkCall("" if message.name is None else message.name)
        except Forbidden:
            self._reply(Fail, message.id, FORBIDDEN, binary_format)
            return
        handler = (
            self.handlers.get(message.name) if message.name is not None else self.default_handler
        )
        if handler is None:
            self._unhandled(message, binary_format)
            return
        working = run_handler(
            handler,
            (incoming_body(message.body, binary_format), self.handlerArgument()),
            lambda value: self._reply(Success, message.id, value, binary_format),
            lambda failure: self._handler_failed(message, failure, binary_format),
            self.owner.observe_request,
        )
        if working is not None:
            self._answering += 1
            working.addBoth(self._answered)

    def _unhandled(self, message: Request, binary_format: bool) -> None:
        """A request no handler of this peer's takes."""
        self._reply(Fail, message.id, NOT_FOUND, binary_format)

    def _answered(self, result: Any) -> None:
        self._answering -= 1
        if isinstance(result, Failure):
            log.failure("ubre: sending a reply failed", result, event="reply_failed",
                        protocol="ubre")

    def _handler_failed(self, message: Request, failure: Failure, binary_format: bool) -> None:
        error = failure.value
        if isinstance(error, RequestFailed):
            body = error.body
        else:
            log.failure(
                "ubre: handler for request {what!r} raised", failure,
                event="handler_failed", protocol="ubre",
                what=message.name if message.name is not None else message.id,
            )
            body = error_body(error, debug=self.debug)
        self._reply(Fail, message.id, body, binary_format)

    def _reply(self, kind: type, request_id: Any, result: Any, binary_format: bool) -> None:
        if not self.connected or self._failed:
            return  # the requester is gone; so is its reply
        try:
            if binary_format and type(result) is bytes:
                data = ubre.encode_binary_regular(kind, request_id, result)
            else:
                data = ubre.encode(
                    kind(request_id, outgoing_body(result, binary_format)), binary=binary_format
                )
            self._check_size(data)
        except (ProtocolError, TypeError, ValueError) as error:
            log.warn("ubre: cannot send the reply to {id!r}: {error}", event="reply_not_sent",
                     protocol="ubre", id=request_id, error=error)
            body = outgoing_body(error_body(error, debug=self.debug), binary_format)
            data = ubre.encode(Fail(request_id, body), binary=binary_format)
        self._write(data, binary_format)

    def _refuse(self, error: ProtocolError) -> None:
        """Close this one connection, telling the peer why."""
        self._failed = True
        self._log_refusal(error)
        self.transport.loseConnection(error)

    def _log_refusal(self, error: ProtocolError) -> None:
        log.warn("ubre: closing {peer}: {error}", event="client_protocol_error", protocol="ubre",
                 peer=describe_address(self.transport.getPeer()), error=error)

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        self.pending.fail_all(
            ConnectionClosed(f"the UBRE connection closed: {reason.getErrorMessage()}")
        )
