"""What the hub says of a connection's peer: its transport's name, whether it may publish on a
topic, and the log lines of a connection closed for breaking its protocol and of its
subscriptions."""

from __future__ import annotations

from typing import Protocol

from twisted.logger import Logger

from wireproto import peerlog
from wireproto.access import Action, Grants, Principal
from wireproto.logs import debugging
from wireproto.peerlog import address_key, describe_address
from wireproto.transports.base import IMessageTransport

__all__ = ["Identified", "is_reserved", "publish_allowed", "transport_name", "log_protocol_error",
           "log_subscription", "log_revoked", "log_credential_ended", "log_will", "log_too_large"]

log = Logger(namespace="wireproto.hub")


class Identified(Protocol):
    """A connection as the log names it (a Session is one)."""

    @property
    def id(self) -> int: ...

    @property
    def client(self) -> str | None: ...


class Subscribing(Identified, Protocol):
    """A connection as its subscriptions' log lines name it (a Session is one)."""

    protocol: str
    transport_name: str
    peer: str
    principal: Principal


class Sending(Subscribing, Protocol):
    """A connection as the log lines of what it sends name it (a Session is one)."""

    max_frame: int | None

    @property
    def transport(self) -> IMessageTransport: ...


RESERVED = ("$SYS", "$devices")


def is_reserved(topic: str) -> bool:
    """Whether `topic` is one of the broker's own: ``$SYS/...``, and ``$devices/...`` (the
    serial devices' presence)."""
    return topic[:1] == "$" and topic.split("/", 1)[0] in RESERVED


def publish_allowed(grants: Grants | None, topic: str) -> bool:
    """Whether a session with `grants` (None: no rules) may publish on `topic`, as its
    `publish` decides: without rules, anywhere but the broker's own topics (`is_reserved`)."""
    if grants is None:
        return not is_reserved(topic)
    return grants.allows(Action.PUBLISH, topic)


def transport_name(transport: IMessageTransport) -> str:
    """The transport as a listener names it: ``ws``, ``engineio``, or a stream's framing."""
    return getattr(transport, "framing", "") or transport.kind


def log_protocol_error(
    protocol: str, transport: IMessageTransport, error: Exception,
    session: Identified | None = None,
) -> None:
    """Log the event for a connection closed because its peer broke `protocol` (within the
    peers' log budget, wireproto.peerlog)."""
    peer = transport.getPeer()
    peerlog.warn(
        log, address_key(peer),
        "{protocol}: closing the connection from {peer} over {transport}: {error}",
        event="protocol_error", protocol=protocol, transport=transport_name(transport),
        peer=describe_address(peer), error=str(error),
        session=None if session is None else session.id,
        client=None if session is None else session.client,
    )


def log_subscription(session: Subscribing, subscribed: bool, topic: str, pattern: bool) -> None:
    """Log `session`'s subscribe (or unsubscribe) to `topic` (a pattern if `pattern`), at debug:
    nothing is built when debug is off."""
    if not debugging():
        return
    log.debug(
        "{protocol} session {session} from {peer} "
        + ("subscribed to {topic!r}" if subscribed else "unsubscribed from {topic!r}"),
        event="subscribe" if subscribed else "unsubscribe", protocol=session.protocol,
        transport=session.transport_name, peer=session.peer, session=session.id,
        client=session.client, principal=session.principal.name, topic=topic, pattern=pattern,
    )


def log_revoked(session: Subscribing, topic: str) -> None:
    """Log the end of `session`'s subscription to `topic` that a reload's rules forbid."""
    log.info(
        "{protocol} session {session} from {peer}: subscription to {topic!r} ended: the "
        "rules no longer allow it", event="subscription_revoked", protocol=session.protocol,
        peer=session.peer, session=session.id, client=session.client,
        principal=session.principal.name, topic=topic,
    )


def log_credential_ended(session: Subscribing, event: str, why: str | None) -> None:
    """Log that `session` closes because its credential expired (`why` None) or was
    withdrawn, as `event`: never with the credential itself."""
    credential = session.principal.credential
    log.info(
        "{protocol} session {session} from {peer}: the {credential} of {principal!r} "
        + ("expired" if why is None else "was withdrawn: {why}") + "; closing",
        event=event, protocol=session.protocol, transport=session.transport_name,
        peer=session.peer, session=session.id, client=session.client,
        principal=session.principal.name,
        credential=None if credential is None else credential.kind,
        key_id=None if credential is None else credential.key_id, why=why,
    )


def log_will(session: Subscribing, topic: str, delivered: int | None) -> None:
    """Log `session`'s will on `topic`: published to `delivered` subscribers, or (None) not
    published because the rules no longer allow it."""
    if delivered is None:
        log.info(
            "{protocol} session {session} from {peer}: its will on {topic!r} is no longer "
            "allowed; not published", event="will_forbidden", protocol=session.protocol,
            peer=session.peer, session=session.id, principal=session.principal.name,
            topic=topic,
        )
        return
    log.info(
        "{protocol} session {session} from {peer}: will published on {topic!r} to "
        "{delivered} subscribers",
        event="will", protocol=session.protocol, peer=session.peer, session=session.id,
        client=session.client, topic=topic, delivered=delivered,
    )


def log_too_large(session: Sending, topic: str, size: int) -> None:
    """Log a message on `topic` not sent to `session`: `size` bytes in its format, over what
    its connection takes (within the peers' log budget)."""
    peerlog.warn(
        log, address_key(session.transport.getPeer()),
        "{protocol} session {session} to {peer}: a message on {topic!r} of {size} bytes "
        "in its format is over the {limit} its connection takes; not sent",
        event="too_large", protocol=session.protocol, peer=session.peer, session=session.id,
        topic=topic, size=size, limit=session.max_frame,
    )
