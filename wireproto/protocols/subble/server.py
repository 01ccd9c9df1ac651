"""SubbleSocket 1.0.0 over any message transport: the host (server role), on the hub.

Implements SubbleSocket as docs/subblesocket.md describes it (the handshake and its response,
events, produce events, errors, client IDs and the Subble codes). The reference (C#
`Subble/SocketCommunication`) is a codec only; this host's behaviour where the spec is silent is
decided here:

- **Transports.** Request data runs to the end of a message, so SubbleSocket needs message
  boundaries: TCP (or TLS, unix) with the ``length32`` framing, or WebSocket binary frames. A text
  frame is not SubbleSocket and closes the connection.
- **The handshake comes first.** Until it completes nothing is answered: any other message closes
  the connection, and so does a second handshake, or none within `handshake_timeout` seconds.
  The checks run in this order, each refusal with its code, the request data echoed, and then the
  connection closed: the peer's address (10), the version (25), the limits (25), the client ID
  (11, 12). An accepted handshake gets 2, or 3 with a new ID as the message.
- **Versions.** A client at version v is accepted when v is compatible with the host's version
  under the C# SemVersion rule read from the client's side: the same major, and a greater minor,
  or the same minor with the same or a greater patch. A 1.0.0 host accepts 1.0.0, 1.0.5 and
  1.3.0, and refuses 0.9.0 and 2.0.0 with 25, naming what it speaks.
- **Client IDs.** An empty ID gets a new one (a uuid4, code 3) unless `allow_new_clients` is off
  (11). A known ID gets 2. An unknown ID gets 12 when `enforce_registry` is on; otherwise it is
  accepted (2) and remembered. The registry (`ClientRegistry`) is in memory or in a sqlite file,
  so clients come back after a restart.
- **Client IDs have owners** when the broker has access rules: the first named principal to use
  an ID owns it, in the registry, until the ID expires; any other principal, anonymous too, is
  refused it with 12, connected or not, since `%c` in a rule stands for the ID. A principal
  owns at most `max_ids_per_principal` IDs; past that a new one is refused with 25.
- **One connection per client ID.** A handshake with an ID that is already connected takes over,
  as an MQTT session does: the older connection stops getting events at once and is closed
  cleanly. A client whose old connection is half-open (its network went away) can therefore
  come back without waiting for the host to notice.
- **Addresses.** `allow` and `deny` are CIDR lists, IPv4 and IPv6 (an IPv4-mapped IPv6 peer is
  checked as IPv4). Deny wins; with an allow list only those addresses get in. A peer with no IP
  address (a unix socket) gets in unless there is an allow list. The address is the connection's
  own: no proxy header is trusted.
- **Event types are hub topics, 1:1**: type ``temperature`` is hub topic ``temperature``, exact
  and case-sensitive. The handshake's subscribe list becomes the connection's hub subscriptions;
  its produce list is what the connection may produce.
- **Producing (27).** The client ID in the request must be the connection's own, and the type in
  its produce list; otherwise error 51 (C#'s name for it is Event_Forbidden), with the request
  data echoed, and the connection stays open. An authorized request that cannot become an event
  gets 52 (C#'s Event_Error_Unknown: the event was not created), with the request data echoed: a
  payload that is not valid in its declared format (msgpack and JSON are checked; formats 51 to
  255 are passed on as they are), an event too large to send back on this connection, or an
  exception in the `on_event` hook or while publishing. An accepted event is a server event (26)
  with a new GUID (uuid4), the producer's client ID as its source, the time now (UTC), the payload
  in its original format and no request data, sent to every other subscriber of its type on every
  protocol. The producer gets it back with code 27 (the spec's "Client Event": its own event) and
  its request data, whether or not it subscribes to the type, and never a second copy.
- **Payloads through the hub.** A produced event is encoded once for every Subble subscriber. Its
  hub payload, for the other protocols, is the JSON text of the decoded payload where JSON can
  say it (a msgpack string ``"hi"`` becomes ``"hi"`` with its quotes), the bytes themselves for a
  msgpack bin, and otherwise the raw payload. The other way, a hub message from another protocol
  (WEBSMQ, UBRE, nydus, host code) reaches Subble subscribers as a server event whose payload is
  the message in JSON format if it is JSON text, else msgpack bin of its bytes; its source is the
  publishing protocol's name ("websmq", "ubre", ...; "host" when none), and each message gets one
  GUID.
- **Host code** publishes server events with `SubbleHost.publish`, its source a plugin name.
- **Limits**, on by default: names per list (`max_names`, and no more than the hub's subscription
  limit), event type length (`max_event_type_length`), client ID length, the handshake timeout,
  and the registry's size. Everything sent goes through the session's bounded send queue."""


from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from twisted.internet import task
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.codecs.serialization import json_loads, msgpack_dumps
from wireproto.codecs.subble import (
    PROTOCOL_VERSION,
    Event,
    HandshakeRequest,
    MessageCode,
    ProduceEvent,
    SerializationFormat,
    Version,
    encode,
    pack_payload,
)
from wireproto.codecs.subble import decode as subble_decode
from wireproto.errors import (
    InvalidField,
    InvalidTopic,
    LimitExceeded,
    ProtocolError,
)
from wireproto.hub import Hub, HubMessage, Session
from wireproto.protocols.subble.connection import (
    CLIENT_EVENT_CODE,
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_MAX_CLIENT_ID_LENGTH,
    DEFAULT_MAX_EVENT_TYPE_LENGTH,
    DEFAULT_MAX_NAMES,
    WIRE_FORMAT,
    SubbleHostProtocol,
    format_of,
    hub_payload,
)
from wireproto.protocols.subble.registry import (
    DEFAULT_MAX_IDS_PER_OWNER,
    DEFAULT_MAX_REGISTRY_IDS,
    DEFAULT_NEW_IDS_PER_MINUTE,
    DEFAULT_REGISTRY_TTL,
    ClientRegistry,
    NewIdBudget,
    parse_networks,
    peer_ip,
)
from wireproto.settings import file_mode, networks, seconds_or_never, setting

__all__ = [
    "serve",
    "SubbleSettings",
    "SubbleHost",
    "server_factory",
]

log = Logger()

@dataclass(frozen=True)
class SubbleSettings:
    """The [subble] table: how the broker hosts SubbleSocket."""

    # An empty client ID gets a new one (code 3); false refuses it (code 11).
    allow_new_clients: bool = True
    # Only IDs in the registry may connect (code 12 for others).
    enforce_registry: bool = False
    # The registry's sqlite file, so clients come back after a restart; "" keeps it in memory.
    registry: str = ""
    # IDs not seen for this long are forgotten (seconds; 0 never). Not with enforce_registry.
    registry_ttl: float = setting(DEFAULT_REGISTRY_TTL, read=seconds_or_never)
    # The registry file's permissions.
    registry_mode: int = setting(0o600, read=file_mode)
    # New client IDs one address may have the registry take, per minute (then code 25).
    new_ids_per_minute: int = DEFAULT_NEW_IDS_PER_MINUTE
    # With [auth]: client IDs one principal may own (then a new one is refused, code 25).
    max_ids_per_principal: int = DEFAULT_MAX_IDS_PER_OWNER
    # Peer addresses, as CIDR: deny wins; with an allow list only those connect (code 10).
    allow: tuple[str, ...] = setting((), read=networks)
    deny: tuple[str, ...] = setting((), read=networks)


# -- the host -------------------------------------------------------------------------------------


class SubbleHost:
    """The SubbleSocket host on a hub: the handshake's policy, the client registry, hooks, and
    the zero-argument protocol factory the transports take (`host()` is a new connection).

    `registry` is a ClientRegistry the caller owns; or `registry_path` names a sqlite file for a
    registry the host opens and `close` closes (at most `max_registry_ids` IDs); with neither,
    IDs are kept in memory. Hooks are methods to replace::

        host.on_event = lambda client, event_type, payload, format: ...
    """

    def __init__(
        self,
        hub: Hub,
        *,
        version: Version | tuple[int, int, int] = PROTOCOL_VERSION,
        allow_new_clients: bool = True,
        enforce_registry: bool = False,
        registry: ClientRegistry | None = None,
        registry_path: str | os.PathLike | None = None,
        max_registry_ids: int = DEFAULT_MAX_REGISTRY_IDS,
        max_ids_per_principal: int = DEFAULT_MAX_IDS_PER_OWNER,
        registry_ttl: float | None = DEFAULT_REGISTRY_TTL,
        registry_mode: int = 0o600,
        new_ids_per_minute: int = DEFAULT_NEW_IDS_PER_MINUTE,
        allow: Iterable[str] = (),
        deny: Iterable[str] = (),
        max_names: int = DEFAULT_MAX_NAMES,
        max_event_type_length: int = DEFAULT_MAX_EVENT_TYPE_LENGTH,
        max_client_id_length: int = DEFAULT_MAX_CLIENT_ID_LENGTH,
        handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT,
        reactor: Any = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor
        if registry is not None and registry_path is not None:
            raise ValueError("give a registry or a registry_path, not both")
        self.hub = hub
        self.reactor = reactor
        self.version = Version(*version)
        self.allow_new_clients = allow_new_clients
        self.enforce_registry = enforce_registry
        self._owns_registry = registry is None
        # With the registry enforced, its IDs are the ones handed out: they never expire.
        ttl = None if enforce_registry or not registry_ttl else registry_ttl
        self.registry = (
            registry if registry is not None
            else ClientRegistry(registry_path, max_ids=max_registry_ids, ttl=ttl,
                                mode=registry_mode, max_ids_per_owner=max_ids_per_principal)
        )
        self._new_ids = NewIdBudget(new_ids_per_minute, reactor.seconds)
        self._expiring: task.LoopingCall | None = None
        if self.registry.ttl is not None:
            self._expiring = task.LoopingCall(self.registry.expire)
            self._expiring.clock = reactor
            self._expiring.start(min(self.registry.ttl / 10, 3600.0), now=False)
        self.allow = parse_networks(allow, "allow")
        self.deny = parse_networks(deny, "deny")
        self.max_names = max_names
        self.max_event_type_length = max_event_type_length
        self.max_client_id_length = max_client_id_length
        self.handshake_timeout = handshake_timeout
        self.clients: dict[str, SubbleHostProtocol] = {}
        # An event's id, source and time are in its encoding: other broker processes send on
        # these bytes, not an encoding of their own.
        hub.portable_formats.add(WIRE_FORMAT)

    # -- hooks: replace them ---------------------------------------------------------------------

    def on_handshake(self, client: SubbleHostProtocol) -> None:
        """A client completed its handshake (its response is sent, its subscriptions made)."""

    def on_disconnect(self, client: SubbleHostProtocol, reason: Failure) -> None:
        """A handshaken client's connection closed."""

    def on_event(
        self,
        client: SubbleHostProtocol,
        event_type: str,
        payload: bytes,
        format: SerializationFormat | int,
    ) -> None:
        """A client produced an event it may produce, before it is created. Raising refuses it:
        the client gets 52, and no one gets the event."""

    def _hook(self, name: str, *args: Any) -> None:
        try:
            getattr(self, name)(*args)
        except Exception:
            log.failure("subble: the {hook} hook raised", event="hook_failed", protocol="subble",
                        hook=name)

    # -- policy -----------------------------------------------------------------------------------

    def address_allowed(self, address: Any) -> bool:
        """Whether a peer at `address` (a Twisted address) may connect: deny wins; with an
        allow list only those; a peer without an IP only when there is no allow list."""
        ip = peer_ip(address)
        if ip is None:
            return not self.allow
        if any(ip in network for network in self.deny):
            return False
        return not self.allow or any(ip in network for network in self.allow)

    def _check_limits(self, request: HandshakeRequest) -> str | None:
        """Why a handshake request passes a limit, or None."""
        if len(request.client_id) > self.max_client_id_length:
            return (
                f"client ID of {len(request.client_id)} characters: this host takes at most "
                f"{self.max_client_id_length}"
            )
        max_subscribe = min(self.max_names, self.hub.max_subscriptions)
        for what, names, limit in (
            ("subscribe", request.subscribe, max_subscribe),
            ("produce", request.produce, self.max_names),
        ):
            if len(names) > limit:
                return f"{len(names)} names in the {what} list: this host takes at most {limit}"
            for name in names:
                if len(name) > self.max_event_type_length:
                    return (
                        f"event type of {len(name)} characters in the {what} list: this host "
                        f"takes at most {self.max_event_type_length}"
                    )
        return None

    def _owner(self, principal: str | None) -> str | None:
        """Who would own a client ID a connection of `principal` uses: that principal, when it
        has a name and the broker has access rules (without them, `%c` means nothing)."""
        return None if self.hub.policy.allows_everything else principal

    def _identify(self, client_id: str, address: str,
                  principal: str | None = None) -> tuple[MessageCode, str]:
        """The handshake code for `client_id` from `address`, and its message. `principal`
        (None: anonymous) is who asks: no one gets an ID another principal owns, and a named
        principal that may own no more IDs gets no new one (`_claim` gives it the ID once its
        handshake is accepted)."""
        registry = self.registry
        owner = self._owner(principal)
        if not client_id:
            if not self.allow_new_clients:
                return (
                    MessageCode.NEW_CLIENTS_NOT_ALLOWED,
                    "this host does not create client IDs: send one it knows",
                )
            if owner is not None:
                registry.check_room(owner)
            if not self._new_ids.take(address):
                return MessageCode.UNKNOWN_HANDSHAKE_ERROR, self._too_many_new_ids()
            return MessageCode.OK_NEW_CLIENT_ID, registry.new_id()
        if client_id in registry:
            current = None if self.hub.policy.allows_everything else registry.owner(client_id)
            if current is not None and current != principal:
                return self._owned_by_another(client_id)
            if current is None and owner is not None:
                registry.check_room(owner)
            registry.seen(client_id)
            return MessageCode.OK, ""
        if self.enforce_registry:
            return MessageCode.INVALID_CLIENT_ID, f"unknown client ID {client_id!r}"
        if owner is not None:
            registry.check_room(owner)
        if not self._new_ids.take(address):
            return MessageCode.UNKNOWN_HANDSHAKE_ERROR, self._too_many_new_ids()
        registry.add(client_id)
        return MessageCode.OK, ""

    def _claim(self, client_id: str, principal: str | None) -> tuple[MessageCode, str] | None:
        """Make `client_id` the named `principal`'s, if no one owns it, as its handshake is
        accepted; why the handshake is refused after all (another took it meanwhile, or the
        principal owns as many as it may), or None."""
        owner = self._owner(principal)
        if owner is None:
            return None
        try:
            if self.registry.add(client_id, owner) != owner:
                return self._owned_by_another(client_id)
        except ProtocolError as error:
            return MessageCode.UNKNOWN_HANDSHAKE_ERROR, str(error)
        except Exception:
            log.failure("subble: the client registry failed", event="client_registry_failed",
                        protocol="subble")
            return MessageCode.UNKNOWN_HANDSHAKE_ERROR, "the host could not check the client ID"
        return None

    @staticmethod
    def _owned_by_another(client_id: str) -> tuple[MessageCode, str]:
        return MessageCode.INVALID_CLIENT_ID, f"client ID {client_id!r} is another principal's"

    def _too_many_new_ids(self) -> str:
        return (f"more than {self._new_ids.per_minute} new client IDs a minute from this "
                "address; connect again later, or with an ID this host knows")

    # -- events -----------------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self.reactor.seconds() * 1000)

    def _create_event(self, client: SubbleHostProtocol, request: ProduceEvent) -> None:
        """Publish an authorized event and send the producer its copy; raises if it cannot."""
        session = client.session
        assert session is not None  # a produce comes after the handshake, which made it
        payload = hub_payload(request.payload, request.format)
        self.on_event(client, request.event_type, request.payload, request.format)
        # The request's client ID is the connection's own (SubbleHostProtocol._produce).
        event = Event(
            MessageCode.SERVER_EVENT, request.format, self._now_ms(), request.event_type,
            str(uuid.uuid4()), request.client_id, request.payload,
        )
        data = encode(event)
        # The producer's copy differs only in its code (the first byte) and the request data.
        own = CLIENT_EVENT_CODE + data[1:] + request.request_data
        limit = client.transport.maxMessageSize
        if len(own) > limit:
            raise LimitExceeded(
                f"the event would be {len(own)} bytes, over this connection's limit of {limit}"
            )
        topic = session.hub_topic(request.event_type)
        if topic != request.event_type:
            # A mounted connection (wireproto.hub.mount): the same event for everyone else,
            # under the hub's name for its type; Session.publish, as the encoding names it.
            data = encode(replace(event, event_type=topic))
        Session.publish(session, topic, payload, encodings={WIRE_FORMAT: (data, True)})
        client._send(own)

    @staticmethod
    def _event_under(encoded: tuple[bytes, bool], event_type: str) -> tuple[bytes, bool] | None:
        """An event as encoded for other clients, for a mounted connection: the same event
        (GUID, format, payload) under its own name for the type (wireproto.hub.mount)."""
        try:
            event = subble_decode(encoded[0], sender="server")
            if not isinstance(event, Event):
                return None
            return encode(replace(event, event_type=event_type)), True
        except (ProtocolError, ValueError):
            return None

    def _encode_hub_message(self, message: HubMessage) -> tuple[bytes, bool] | None:
        """A hub message from another protocol as a server event. The hub calls this once per
        message for all Subble sessions, so each message gets one GUID."""
        payload = message.payload
        try:
            json_loads(payload, "payload")
            format, data = SerializationFormat.JSON, payload
        except ProtocolError:
            format, data = SerializationFormat.MSGPACK, msgpack_dumps(payload)
        try:
            return encode(Event(
                MessageCode.SERVER_EVENT, format, self._now_ms(), message.topic,
                str(uuid.uuid4()), message.protocol or "host", data,
            )), True
        except ProtocolError:
            return None

    def publish(
        self,
        event_type: str,
        payload: Any,
        *,
        source: str = "host",
        format: SerializationFormat | int = SerializationFormat.MSGPACK,
    ) -> int:
        """A server event (26) from host code, `source` naming the plugin, to every subscriber
        of `event_type` on every protocol. `payload` is packed with `format` unless it is
        already bytes (then it must be valid in `format`). Returns how many got it."""
        if len(event_type) > self.max_event_type_length:
            raise InvalidTopic(
                f"event type of {len(event_type)} characters: this host takes at most "
                f"{self.max_event_type_length}"
            )
        format = format_of(format)
        if format not in (0, 1) and not 51 <= format <= 255:
            raise InvalidField(
                f"serialization format {format} is not allowed (0 msgpack, 1 JSON, 51 to 255 "
                "implementor defined)"
            )
        if isinstance(payload, (bytes, bytearray, memoryview)):
            data = bytes(payload)
        else:
            data = pack_payload(payload, format)
        data_event = encode(Event(
            MessageCode.SERVER_EVENT, format, self._now_ms(), event_type, str(uuid.uuid4()),
            source, data,
        ))
        message = HubMessage(event_type, hub_payload(data, format), protocol="subble")
        return self.hub.publish(message, {WIRE_FORMAT: (data_event, True)})

    # -- connections -----------------------------------------------------------------------------

    def __call__(self, mount: str | None = None) -> SubbleHostProtocol:
        """A new connection's protocol (its event types under `mount` on the hub, if given):
        the host is the factory the transports take."""
        return SubbleHostProtocol(self, mount)

    def close(self) -> None:
        """Close the registry if the host opened it (connections are closed by their
        listeners)."""
        if self._expiring is not None and self._expiring.running:
            self._expiring.stop()
        if self._owns_registry:
            self.registry.close()


def server_factory(hub: Hub, **options: Any) -> SubbleHost:
    """The SubbleSocket host for `hub`; it is also the zero-argument protocol factory the
    transport adapters take. `options` are SubbleHost's."""
    return SubbleHost(hub, **options)


def serve(hub: Hub, settings: SubbleSettings) -> SubbleHost:
    """The broker's SubbleSocket host, as its [subble] table says; `registry` names the sqlite
    file ("" keeps the registry in memory)."""
    options = asdict(settings)
    registry = options.pop("registry")
    return SubbleHost(hub, registry_path=registry or None, **options)
