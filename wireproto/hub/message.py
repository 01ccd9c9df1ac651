"""What travels through the hub and what it counts: `HubMessage`, the [hub] table's
`HubSettings` with its defaults, the overflow policies, and the hub's and sessions' counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from wireproto.codecs.serialization import (
    DEFAULT_MAX_DOCUMENT_DEPTH,
    DEFAULT_MAX_DOCUMENT_ELEMENTS,
    unchecked_constructor,
)
from wireproto.settings import choice, integer, setting, strings
from wireproto.topics import validate_pattern

__all__ = [
    "DEFAULT_QUEUE_BYTES",
    "DEFAULT_MAX_SUBSCRIPTIONS",
    "DEFAULT_MAX_TOPIC_LENGTH",
    "DEFAULT_MAX_SUBSCRIPTION_BYTES",
    "DEFAULT_MAX_TOTAL_SUBSCRIPTION_BYTES",
    "DEFAULT_RETAINED_EXAMINED_PER_SECOND",
    "Overflow",
    "HubSettings",
    "HubMessage",
    "new_message",
    "HubStats",
    "SessionStats",
    "Encoder",
]

DEFAULT_QUEUE_BYTES = 1 << 20
DEFAULT_MAX_SUBSCRIPTIONS = 1000
# What subscriptions may make the hub hold: the topic (or pattern) of one, in characters; their
# topics' UTF-8 bytes for one connection, and for all connections together.
DEFAULT_MAX_TOPIC_LENGTH = 1024
DEFAULT_MAX_SUBSCRIPTION_BYTES = 65_536
DEFAULT_MAX_TOTAL_SUBSCRIPTION_BYTES = 64 << 20
# Last values ([hub] retain): how many topics' and how many bytes the hub keeps at most.
DEFAULT_MAX_RETAINED = 10_000
DEFAULT_MAX_RETAINED_BYTES = 16 << 20
# How many kept values (nodes of the kept topics' tree) one principal's pattern subscribes may
# examine a second before its reading pauses (0: no limit).
DEFAULT_RETAINED_EXAMINED_PER_SECOND = 100_000


def _count_or_off(value: Any) -> int:
    if integer(value) < 0:
        raise ValueError(f"expected a count (0: no limit), got {value}")
    return value


def _positive(value: Any) -> int:
    if integer(value) < 1:
        raise ValueError(f"expected a count of at least 1, got {value}")
    return value


def _patterns(value: Any) -> tuple[str, ...]:
    patterns = strings(value)
    for pattern in patterns:
        validate_pattern(pattern)  # a ValueError says what is wrong with it
    return patterns


class Overflow(StrEnum):
    """What a session does when its send queue would pass its byte limit."""

    DROP_OLDEST = "drop-oldest"
    DISCONNECT = "disconnect"


@dataclass(frozen=True)
class HubSettings:
    """The [hub] table: the `Hub`'s send queues and subscription limits."""

    queue_bytes: int = DEFAULT_QUEUE_BYTES
    overflow: str = setting(Overflow.DROP_OLDEST.value,
                            read=choice([policy.value for policy in Overflow], "policy"))
    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS
    max_topic_length: int = DEFAULT_MAX_TOPIC_LENGTH
    max_subscription_bytes: int = DEFAULT_MAX_SUBSCRIPTION_BYTES
    max_total_subscription_bytes: int = DEFAULT_MAX_TOTAL_SUBSCRIPTION_BYTES
    # Topic patterns whose last message is kept for later subscribers (docs/hub.md).
    retain: tuple[str, ...] = setting((), read=_patterns)
    max_retained: int = DEFAULT_MAX_RETAINED
    max_retained_bytes: int = DEFAULT_MAX_RETAINED_BYTES
    retained_examined_per_second: int = setting(DEFAULT_RETAINED_EXAMINED_PER_SECOND,
                                                read=_count_or_off)
    # A sqlite file that keeps the last values across restarts ("": memory only).
    retain_file: str = ""
    # What one decoded JSON or msgpack document may hold, in every protocol: its values (a
    # map's keys too) and how deep its arrays and maps nest (wireproto.codecs.serialization).
    max_document_elements: int = setting(DEFAULT_MAX_DOCUMENT_ELEMENTS, read=_positive)
    max_document_depth: int = setting(DEFAULT_MAX_DOCUMENT_DEPTH, read=_positive)


@dataclass(frozen=True, slots=True, eq=False)
class HubMessage:
    """A message on its way through the hub.

    `sender` is the subscriber that published it (it never gets its own message back), and
    `protocol` names the spec it came in on. `will` marks a last will.
    """

    topic: str
    payload: bytes
    will: bool = False
    sender: Any = None
    protocol: str = ""


# Every field, in order, without the frozen dataclass __init__: the publish path builds one per
# message.
new_message = unchecked_constructor(HubMessage)


@dataclass
class HubStats:
    published: int = 0
    delivered: int = 0
    wills_published: int = 0
    dropped_messages: int = 0
    dropped_bytes: int = 0
    overflow_disconnects: int = 0


@dataclass
class SessionStats:
    received: int = 0
    sent: int = 0
    sent_bytes: int = 0
    dropped_messages: int = 0
    dropped_bytes: int = 0
    overflow_disconnects: int = 0
    # Messages not sent because they came out larger than the connection takes.
    too_large: int = 0



# encode(message) -> (data, binary), or None when the message cannot be said in this format.
Encoder = Callable[[HubMessage], "tuple[bytes, bool] | None"]
