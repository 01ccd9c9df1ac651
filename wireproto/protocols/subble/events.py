"""What a SubbleSocket client gets: events (`SubbleEvent`), the type of the callbacks listening
for them (`EventCallback`; a `SubbleClient` holds each as an `EventListener`), and the errors a
handshake or a produce request can end in (docs/subblesocket.md, "The client")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from wireproto.codecs import subble
from wireproto.codecs.subble import (
    Event,
    MessageCode,
    SerializationFormat,
)

FORMAT_NAMES = {"msgpack": SerializationFormat.MSGPACK, "json": SerializationFormat.JSON}

READABLE_FORMATS = frozenset({SerializationFormat.MSGPACK, SerializationFormat.JSON})

__all__ = [
    "FORMAT_NAMES",
    "READABLE_FORMATS",
    "EVENT_ERRORS",
    "parse_format",
    "HandshakeRefused",
    "EventRefused",
    "EventForbidden",
    "EventFailed",
    "SubbleEvent",
    "EventCallback",
]

# -- errors --------------------------------------------------------------------------------------


class HandshakeRefused(Exception):
    """The host refused the handshake: `code` is 10, 11, 12 or 25 and `message` its reason.

    `request_data` is what the host echoed of the handshake's request data.
    """

    def __init__(self, code: int, message: str = "", request_data: bytes = b"") -> None:
        super().__init__(code, message)
        self.code = _code(code)
        self.message = message
        self.request_data = request_data

    def __str__(self) -> str:
        name = self.code.name if isinstance(self.code, MessageCode) else "code"
        detail = f": {self.message}" if self.message else ""
        return f"SubbleSocket handshake refused with {int(self.code)} ({name}){detail}"


class EventRefused(Exception):
    """The host answered a produce with an event error (51 or 52).

    `message` is the host's, `request_data` the produce's request data as the host echoed it,
    and `event_type` the type produced (None when not known).
    """

    code: int = 0

    def __init__(
        self, message: str = "", request_data: bytes = b"", *, event_type: str | None = None
    ) -> None:
        super().__init__(message, request_data)
        self.message = message
        self.request_data = request_data
        self.event_type = event_type

    def __str__(self) -> str:
        what = f"producing {self.event_type!r}" if self.event_type is not None else "producing"
        detail = f": {self.message}" if self.message else ""
        return f"{what} failed with {int(self.code)}{detail}"


class EventForbidden(EventRefused):
    """51, Event not declared: the type is not in the produce list sent in the handshake."""

    code = MessageCode.EVENT_NOT_DECLARED


class EventFailed(EventRefused):
    """52, Unknown server error: the host did not create the event."""

    code = MessageCode.UNKNOWN_SERVER_ERROR


EVENT_ERRORS: dict[int, type[EventRefused]] = {51: EventForbidden, 52: EventFailed}


def _code(value: int) -> MessageCode | int:
    try:
        return MessageCode(value)
    except ValueError:
        return value


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubbleEvent:
    """An event the host sent: 26 (an event this client subscribed to) or 27 (the echo of one
    it produced).

    `payload` is decoded from msgpack or JSON; for an implementor-defined format (51 to 255) it
    is the raw bytes, as `raw_payload` always is. `datetime` is an aware UTC datetime.
    """

    type: str
    guid: str
    source: str
    datetime: datetime
    format: SerializationFormat | int
    payload: Any
    raw_payload: bytes
    request_data: bytes = b""
    code: MessageCode = MessageCode.SERVER_EVENT

    @classmethod
    def from_message(cls, message: Event) -> SubbleEvent:
        """The event `message` carries, its payload decoded; raises ProtocolError for a date
        time out of range or a payload that is not what its format says."""
        raw = message.payload
        payload = subble.unpack_payload(raw, message.format) if (
            message.format in READABLE_FORMATS
        ) else raw
        return cls(message.event_type, message.guid, message.source, message.datetime,
                   message.format, payload, raw, message.request_data, message.code)


EventCallback = Callable[[SubbleEvent], object]


def parse_format(value: str | int) -> SerializationFormat | int:
    if isinstance(value, str):
        try:
            return FORMAT_NAMES[value]
        except KeyError:
            raise ValueError(
                f"unknown SubbleSocket format {value!r}: use 'msgpack', 'json', a "
                "SerializationFormat, or an int from 51 to 255 with a bytes payload"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a SubbleSocket format is a str or an int, not {type(value).__name__}")
    if value in READABLE_FORMATS:
        return SerializationFormat(value)
    return value
