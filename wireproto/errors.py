"""Errors raised for bytes or text that do not follow a spec.

Every codec raises only `ProtocolError` subclasses on bad input. A message names the spec, the
thing being read and what was wrong with it, so that a user can act on it, for example
"WEBSMQ frame of 1 byte: the header needs 2".

`ProtocolError` subclasses `ValueError`, so code that already guards against bad values catches it.
"""

from __future__ import annotations

__all__ = [
    "ProtocolError",
    "TruncatedFrame",
    "BadLength",
    "FrameTooLarge",
    "UnknownType",
    "InvalidTopic",
    "InvalidField",
    "BadEncoding",
    "BadJSON",
    "BadChecksum",
    "LimitExceeded",
    "Forbidden",
    "CredentialEnded",
    "UnexpectedMessage",
    "NotThisProtocol",
]


class ProtocolError(ValueError):
    """Input that breaks a spec.

    `offset`, when known, is the byte (or character) position in the input where the problem was
    found. Protocols use the message as the reason when they close the offending connection.
    """

    def __init__(self, message: str, *, offset: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset

    @property
    def message(self) -> str:
        return str(self.args[0])


class TruncatedFrame(ProtocolError):
    """The input ends before a header or a field it announced is complete."""


class BadLength(ProtocolError):
    """A length field disagrees with the data, or is out of the range the spec allows."""


class FrameTooLarge(BadLength):
    """A message or chunk is longer than the configured or specified maximum."""


class UnknownType(ProtocolError):
    """A type or code that the spec does not define (or does not allow in this direction)."""


class InvalidTopic(ProtocolError):
    """A topic, path or event name that breaks the spec's naming rules."""


class InvalidField(ProtocolError):
    """A field whose value the spec does not allow: an id, a version, a separator, a format."""


class BadEncoding(ProtocolError):
    """Text that is not valid in its declared encoding (UTF-8 or ASCII)."""


class BadJSON(ProtocolError):
    """Text that should be JSON and is not, or JSON of the wrong shape."""


class BadChecksum(ProtocolError):
    """A CRC that does not match the data it covers."""


class LimitExceeded(ProtocolError):
    """The peer went past a configured limit (subscriptions, connections, queue bytes)."""


class Forbidden(ProtocolError):
    """The peer's principal may not do this: `action` (publish, subscribe, call, serve) on
    `topic`. A protocol answers it in its own words where it has them; one that does not catch
    it closes the connection, as for any other ProtocolError."""

    def __init__(self, action: str, topic: str, principal: str | None) -> None:
        who = "an anonymous client" if principal is None else repr(principal)
        super().__init__(f"{who} may not {action} {topic!r}")
        self.action = action
        self.topic = topic
        self.principal = principal


class CredentialEnded(ProtocolError):
    """The credential a connection proved its principal with has expired, or a reload of the
    [auth] files withdrew it: the broker closes the connection for policy (a WebSocket's close
    code 1008). The message says which, never the credential itself."""


class UnexpectedMessage(ProtocolError):
    """A well-formed message that this role must never receive (a broker-only frame at a broker)."""


_SERVES = "this serves "


class NotThisProtocol(ProtocolError):
    """A message the protocol served here cannot read, most often one from a client of another
    protocol. Its message, the reason a broker closes the connection with, names the protocol
    first (``this serves websmq: WEBSMQ frames are binary...``), so the client can say where
    it went wrong (`served_by`)."""

    def __init__(self, served: str, error: ProtocolError) -> None:
        super().__init__(f"{_SERVES}{served}: {error}", offset=error.offset)
        self.served = served
        self.error = error

    @staticmethod
    def served_by(reason: str) -> str | None:
        """The protocol a close reason says is served where it came from (one of this
        class's), or None."""
        at = reason.find(_SERVES)
        if at < 0:
            return None
        name, colon, _ = reason[at + len(_SERVES):].partition(":")
        return name if colon and name.isidentifier() else None
