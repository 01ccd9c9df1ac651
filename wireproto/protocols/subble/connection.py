"""One SubbleSocket connection on the host: the handshake, events in and out, and produce requests
with their echo (docs/subblesocket.md, "The host")."""

from __future__ import annotations

from typing import Any, Protocol

from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.access import Action
from wireproto.codecs.serialization import json_loads, json_utf8, msgpack_loads
from wireproto.codecs.subble import (
    EventError,
    HandshakeRequest,
    HandshakeResponse,
    MessageCode,
    ProduceEvent,
    Sender,
    SerializationFormat,
    Version,
    decode,
    encode,
    supports_version,
)
from wireproto.errors import (
    BadEncoding,
    Forbidden,
    LimitExceeded,
    NotThisProtocol,
    ProtocolError,
    UnexpectedMessage,
)
from wireproto.hub import Hub, HubMessage, Session, describe_address, log_protocol_error
from wireproto.peerlog import address_key
from wireproto.protocols.subble.registry import (
    peer_ip,
)
from wireproto.protocols.subble.state import HandshakeState
from wireproto.transports.base import IMessageTransport, MessageProtocol

__all__ = [
    "CLIENT_EVENT_CODE",
    "hub_payload",
    "format_of",
    "WIRE_FORMAT",
    "DEFAULT_MAX_NAMES",
    "DEFAULT_MAX_EVENT_TYPE_LENGTH",
    "DEFAULT_MAX_CLIENT_ID_LENGTH",
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "ConnectionHost",
    "SubbleHostProtocol",
]

log = Logger()


# The hub wire format of every Subble connection: all of them take the same event bytes.
WIRE_FORMAT = "subble"

DEFAULT_MAX_NAMES = 1000
DEFAULT_MAX_EVENT_TYPE_LENGTH = 1024
DEFAULT_MAX_CLIENT_ID_LENGTH = 256
DEFAULT_HANDSHAKE_TIMEOUT = 30.0

CLIENT_EVENT_CODE = bytes((MessageCode.CLIENT_EVENT,))


# -- payloads -------------------------------------------------------------------------------------


def hub_payload(payload: bytes, format: SerializationFormat | int) -> bytes:
    """What the other protocols get for a Subble payload: the JSON text of the decoded value
    where JSON can say it, the bytes of a msgpack bin, else the payload as it is. Raises
    ProtocolError if a msgpack or JSON payload is not valid in its format."""
    if format == SerializationFormat.JSON:
        return json_utf8(json_loads(payload, "SubbleSocket JSON payload"))
    if format != SerializationFormat.MSGPACK:
        return payload  # the implementor's own format: nothing to read it with
    value = msgpack_loads(payload, "SubbleSocket msgpack payload")
    if isinstance(value, bytes):
        return value
    try:
        return json_utf8(value)
    except (ProtocolError, TypeError, ValueError):
        return payload  # bytes inside, NaN, ...: JSON cannot say it


def format_of(format: SerializationFormat | int) -> SerializationFormat | int:
    return SerializationFormat(format) if format in (0, 1) else int(format)


# -- one connection -------------------------------------------------------------------------------


class ConnectionHost(Protocol):
    """What a connection asks of its host (`SubbleHost`, server.py): the hub, the handshake's
    policy and limits, the handshaken clients by ID, the hooks, and the creating of a produced
    event. Declared here, so that this module need not import the host's."""

    hub: Hub
    reactor: Any
    version: Version
    handshake_timeout: float | None
    clients: dict[str, SubbleHostProtocol]

    def address_allowed(self, address: Any) -> bool: ...

    def _check_limits(self, request: HandshakeRequest) -> str | None: ...

    def _identify(self, client_id: str, address: str,
                  principal: str | None = None) -> tuple[MessageCode, str]: ...

    def _claim(self, client_id: str,
               principal: str | None) -> tuple[MessageCode, str] | None: ...

    def _hook(self, name: str, *args: Any) -> None: ...

    def _create_event(self, client: SubbleHostProtocol, request: ProduceEvent) -> None: ...

    def _encode_hub_message(self, message: HubMessage) -> tuple[bytes, bool] | None: ...

    def _event_under(self, encoded: tuple[bytes, bool], event_type: str
                     ) -> tuple[bytes, bool] | None: ...


class SubbleHostProtocol(MessageProtocol):
    """The host's side of one SubbleSocket connection; the `client` that hooks get.

    After the handshake, `client_id` is its ID, `subscribe` the event types it gets (in the
    handshake's order, without repeats), `produce` those it may produce, `handshake` the request
    itself and `session` its place in the hub.
    """

    transport: IMessageTransport  # given before any other call (makeConnection)
    # Set by the handshake, once accepted (state OPEN).
    client_id: str | None = None
    session: Session | None = None
    handshake: HandshakeRequest | None = None
    subscribe: tuple[str, ...] = ()
    produce: frozenset[str] = frozenset()
    state: HandshakeState = HandshakeState.AWAITING
    _timeout: IDelayedCall | None = None

    def __init__(self, host: ConnectionHost, mount: str | None = None) -> None:
        self.host = host
        # Where this connection's event types are on the hub (None: as they are):
        # wireproto.hub.mount. Its client ID is not mounted.
        self.mount = mount

    def __repr__(self) -> str:
        return f"<SubbleHostProtocol {self.client_id!r}>"

    def connectionMade(self) -> None:
        timeout = self.host.handshake_timeout
        if timeout is not None:
            self._timeout = self.host.reactor.callLater(timeout, self._handshakeTimedOut)

    # -- receiving ------------------------------------------------------------------------------

    def messageReceived(self, data: bytes, binary: bool) -> None:
        if self.state is HandshakeState.ENDED:
            return
        if not binary:
            self._refuse(NotThisProtocol("subble", BadEncoding(
                "SubbleSocket is binary: a text message is not SubbleSocket")))
            return
        try:
            message = decode(data, sender=Sender.CLIENT)
        except ProtocolError as error:
            self._refuse(NotThisProtocol("subble", error))
            return
        if type(message) is HandshakeRequest:
            if self.state is HandshakeState.AWAITING:
                self.state = HandshakeState.ANSWERING
                self._handshake(message)
            else:
                self._refuse(UnexpectedMessage("a second SubbleSocket handshake request"))
        elif self.state is not HandshakeState.OPEN:
            self._refuse(UnexpectedMessage(
                "a SubbleSocket produce request (27) before the handshake: the handshake "
                "request (1) comes first"
            ))
        else:
            self._produce(message)

    # -- the handshake --------------------------------------------------------------------------

    def _handshake(self, request: HandshakeRequest) -> None:
        self._cancelTimeout()
        host = self.host
        echo = request.request_data
        peer = self.transport.getPeer()
        if not host.address_allowed(peer):
            ip = peer_ip(peer)
            self._refuseHandshake(
                MessageCode.IP_NOT_ALLOWED,
                f"address {ip if ip is not None else 'without an IP'} is not allowed",
                echo,
            )
            return
        if not supports_version(request.version, host.version):
            self._refuseHandshake(
                MessageCode.UNKNOWN_HANDSHAKE_ERROR,
                f"unsupported version {request.version}; this host speaks SubbleSocket "
                f"{host.version.major}.x.y from {host.version}",
                echo,
            )
            return
        problem = host._check_limits(request)
        if problem is not None:
            self._refuseHandshake(MessageCode.UNKNOWN_HANDSHAKE_ERROR, problem, echo)
            return
        try:
            code, message = host._identify(
                request.client_id, address_key(peer), self._principal_name()
            )
        except ProtocolError as error:
            code, message = MessageCode.UNKNOWN_HANDSHAKE_ERROR, str(error)
        except Exception:
            log.failure("subble: the client registry failed", event="client_registry_failed",
                        protocol="subble")
            code = MessageCode.UNKNOWN_HANDSHAKE_ERROR
            message = "the host could not check the client ID"
        if code not in (MessageCode.OK, MessageCode.OK_NEW_CLIENT_ID):
            self._refuseHandshake(code, message, echo)
            return
        self._accept(request, code, message)

    def _accept(self, request: HandshakeRequest, code: MessageCode, message: str) -> None:
        host = self.host
        client_id = message if code == MessageCode.OK_NEW_CLIENT_ID else request.client_id
        subscribe = tuple(dict.fromkeys(request.subscribe))
        session = host.hub.attach(
            self.transport, protocol="subble", wire_format=WIRE_FORMAT,
            encode=host._encode_hub_message, client=client_id, mount=self.mount,
            retopic=host._event_under,
        )
        older = host.clients.get(client_id)
        refusal = self._access_refusal(session, subscribe, older)
        if refusal is None:
            # Answered before it subscribes (its last values follow the answer): so asked now.
            problem = session.room_for(subscribe)
            if problem is not None:
                refusal = MessageCode.UNKNOWN_HANDSHAKE_ERROR, problem
        if refusal is None:
            refusal = host._claim(client_id, self._principal_name())
        if refusal is not None:
            session.close(f"handshake refused: {refusal[1]}")
            self._refuseHandshake(*refusal, request.request_data)
            return
        self.client_id = client_id
        self.handshake = request
        self.subscribe = subscribe
        self.produce = frozenset(request.produce)
        if older is not None:
            older._replaced()
        host.clients[client_id] = self
        self.state = HandshakeState.OPEN
        self.session = session
        self._send(encode(HandshakeResponse(code, message, request.request_data)))
        for event_type in self.subscribe:
            session.subscribe(event_type)
        host._hook("on_handshake", self)

    @staticmethod
    def _access_refusal(
        session: Session, subscribe: tuple[str, ...], older: SubbleHostProtocol | None
    ) -> tuple[MessageCode, str] | None:
        """Why the handshake's principal may not have it: a type it may not subscribe to (10),
        or a client ID connected as another principal (12); None if it may."""
        for event_type in subscribe:
            try:
                session.check(Action.SUBSCRIBE, event_type)
            except ProtocolError as error:  # Forbidden, or LimitExceeded after too many
                return MessageCode.IP_NOT_ALLOWED, str(error)
        if older is not None and older.session is not None and (
            older.session.principal.name != session.principal.name
        ):
            return (MessageCode.INVALID_CLIENT_ID,
                    "this client ID is connected as another principal")
        return None

    def _principal_name(self) -> str | None:
        """The name of who the transport says the peer is (None: anonymous)."""
        principal = getattr(self.transport, "principal", None)
        return None if principal is None else principal.name

    def _refuseHandshake(self, code: MessageCode, message: str, echo: bytes) -> None:
        """Answer with a refusal, then close: nothing more is read from this connection."""
        self.state = HandshakeState.ENDED
        log.warn(
            "subble: refused {peer}: {code} {reason}", event="handshake_refused",
            protocol="subble", peer=describe_address(self.transport.getPeer()), code=int(code),
            reason=message,
        )
        data = encode(HandshakeResponse(code, message, echo))
        if len(data) > self.transport.maxMessageSize:
            data = encode(HandshakeResponse(code, message))  # too big with the echo
        self.transport.sendMessage(data, True)
        self.transport.loseConnection()

    def _replaced(self) -> None:
        """A newer connection took this client ID: no more events here, and close."""
        log.info(
            "subble: client {client!r} connected again; closing its older connection "
            "from {peer}", event="subble_client_replaced", protocol="subble",
            client=self.client_id, peer=describe_address(self.transport.getPeer()),
        )
        self.state = HandshakeState.ENDED
        if self.session is not None:
            self.session.close("replaced by a newer connection with the same client ID")
        self.transport.loseConnection()

    def _handshakeTimedOut(self) -> None:
        self._timeout = None
        self._refuse(LimitExceeded(
            f"no SubbleSocket handshake within {self.host.handshake_timeout:g} s"
        ))

    def _cancelTimeout(self) -> None:
        if self._timeout is not None:
            if self._timeout.active():
                self._timeout.cancel()
            self._timeout = None

    # -- producing ------------------------------------------------------------------------------

    def _produce(self, request: ProduceEvent) -> None:
        session = self.session
        assert session is not None  # made by the handshake, which is over
        echo = request.request_data
        if request.client_id != self.client_id:
            self._eventError(
                MessageCode.EVENT_NOT_DECLARED,
                f"client ID {request.client_id!r} is not this connection's: a client produces "
                "under its own ID only",
                echo,
            )
            return
        if request.event_type not in self.produce:
            self._eventError(
                MessageCode.EVENT_NOT_DECLARED,
                f"event type {request.event_type!r} is not in this client's produce list",
                echo,
            )
            return
        try:
            session.check(Action.PUBLISH, request.event_type)
        except Forbidden as error:
            self._eventError(MessageCode.EVENT_FORBIDDEN, str(error), echo)
            return
        except LimitExceeded as error:
            self._refuse(error)
            return
        try:
            self.host._create_event(self, request)
        except ProtocolError as error:
            self._eventError(
                MessageCode.UNKNOWN_SERVER_ERROR,
                f"event {request.event_type!r} was not created: {error}",
                echo,
            )
        except Exception as error:
            log.failure("subble: creating an event of type {type!r} failed",
                        event="event_creation_failed", protocol="subble",
                        type=request.event_type)
            self._eventError(
                MessageCode.UNKNOWN_SERVER_ERROR,
                f"event {request.event_type!r} was not created: the host failed "
                f"({type(error).__name__})",
                echo,
            )

    def _eventError(self, code: MessageCode, message: str, echo: bytes) -> None:
        data = encode(EventError(code, message, echo))
        if len(data) > self.transport.maxMessageSize:
            data = encode(EventError(code, message))  # too big with the echo
        self._send(data)

    # -- sending and closing --------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        # Through the session's queue, in order with events, bounded like them: sent once the
        # handshake is accepted, which made the session.
        session = self.session
        assert session is not None
        session.send(data, True)

    def _refuse(self, error: ProtocolError) -> None:
        """Close this one connection, telling the peer why; the host carries on."""
        self.state = HandshakeState.ENDED
        self._cancelTimeout()
        logged = error.error if isinstance(error, NotThisProtocol) else error
        log_protocol_error("subble", self.transport, logged, self.session)
        self.transport.loseConnection(error)

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        self._cancelTimeout()
        session, client_id = self.session, self.client_id
        if session is None or client_id is None:  # never accepted (both are, together)
            return
        session.close(reason)
        host = self.host
        if host.clients.get(client_id) is self:
            del host.clients[client_id]
        host._hook("on_disconnect", self, reason)
