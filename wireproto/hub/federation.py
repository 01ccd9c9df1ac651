"""The hub's one seam to other broker processes (docs/architecture.md, "The cluster").

A hub can be joined to other broker processes so that they are one broker to their clients
(wireproto.cluster does it through NATS). The hub, its sessions and the protocol servers know
such a thing only as a `Federation`: what it is told (a publish made here, a last value kept, a
will held and released, the calls served here changed) and what it is asked (a call that no
handler here takes, the names the others serve). A hub joined to none holds `ALONE`, which keeps
everything in this process.

What a federation may do to the hub, through its public methods only: publish into it as the
sender (`Hub.fan_out` with itself as `sender`, so the message is not sent back out), follow its
topics and patterns (`Hub.add_topic_observer`), and read the call servers
(`Hub.call_servers`), the portable formats (`Hub.portable_formats`) and the last values
(`Hub.retained`).

The parts that watch a broker (the admin API, the metrics) see a federation as a
`ProcessGroup`: who this process is among the others, how to ask them all a question and
answer theirs, and its counters.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from twisted.internet import defer

from wireproto.protocols.calls import Answer, Call, CallName, CallNotFound

if TYPE_CHECKING:
    from wireproto.hub.message import HubMessage

__all__ = [
    "ALONE",
    "Encodings",
    "Federation",
    "FederationStats",
    "ProcessGroup",
    "Reply",
    "ServedElsewhere",
]

# A message's encodings in wire formats, as the fan-out caches them: {format: (data, binary)}.
Encodings = dict[Hashable, tuple[bytes, bool]]


class ServedElsewhere(NamedTuple):
    """The call names of a protocol that other processes serve, and a version that changes
    whenever they do (so a protocol may keep what it builds from them until then)."""

    version: int
    names: list[CallName]


class Federation(Protocol):
    """What the hub, its sessions and the protocol servers may tell and ask of the processes
    the hub is joined to."""

    # False when nothing leaves this process: the fan-out then tells it of no publish.
    joined: bool

    def forward(self, topic: str, payload: bytes, will: bool, protocol: str,
                encodings: Encodings) -> bool:
        """A message published in this process (the hub's fan-out calls this once per
        publish): send it to the others, with its encodings in the hub's portable formats.
        False: this process has just found it must not serve the connections it was holding
        wills for, and closed them; the message goes nowhere, here either."""

    def keep_last_value(self, topic: str, payload: bytes, protocol: str,
                        encodings: Encodings) -> None:
        """The hub kept a topic's last value: keep it for the others too."""

    def hold_will(self, session: int, will: HubMessage) -> None:
        """Session `session` has a will: if this process dies, another is to publish it."""

    def release_will(self, session: int) -> bool:
        """Session `session` is closing: whether its will (if it may publish one) is to be
        published here. False when another process publishes it, because this one gave up
        the place in which it held it (docs/cluster.md, "Leases and fencing")."""

    def calls_changed(self) -> None:
        """What the hub's call servers answer changed."""

    def call(self, call: Call) -> defer.Deferred[Answer]:
        """Have another process answer `call`; fails with a `CallUnanswered` error."""

    def served_elsewhere(self, protocol: str) -> ServedElsewhere:
        """What other processes answer of `protocol`."""

    def processes(self) -> int:
        """How many processes a message published here goes to now, this one included (1
        alone): each delivers it to its own subscribers, the others after a publish returns."""


class Alone:
    """The federation of a hub joined to no other process: nothing leaves this process."""

    _nothing = ServedElsewhere(0, [])
    joined = False

    def forward(self, topic: str, payload: bytes, will: bool, protocol: str,
                encodings: Encodings) -> bool:
        return True

    def keep_last_value(self, topic: str, payload: bytes, protocol: str,
                        encodings: Encodings) -> None:
        pass

    def hold_will(self, session: int, will: HubMessage) -> None:
        pass

    def release_will(self, session: int) -> bool:
        return True

    def calls_changed(self) -> None:
        pass

    def call(self, call: Call) -> defer.Deferred[Answer]:
        return defer.fail(CallNotFound("no other broker process to ask"))

    def served_elsewhere(self, protocol: str) -> ServedElsewhere:
        return self._nothing

    def processes(self) -> int:
        return 1

    def __repr__(self) -> str:
        return "<alone>"


ALONE: Federation = Alone()


class Reply(NamedTuple):
    """One process's answer to a question asked of every process of a group."""

    origin: str
    node: str
    answer: Any


@dataclass(frozen=True)
class FederationStats:
    """A process group's counters since this process joined it (wireproto.metrics shows
    them)."""

    connected: bool
    processes: int
    forwarded: int
    received: int
    duplicates: int
    refused: int
    dropped: int
    reconnects: int
    calls_made: int
    calls_answered: int
    calls_refused: int
    wills_published: int
    # Times this process found its lease lost and was fenced (docs/cluster.md).
    fenced: int = 0


# Answers a question from another process: its answer (msgpack values), or None for none.
Answerer = Callable[[list[Any]], Any]


class ProcessGroup(Protocol):
    """The broker processes a federation joins, as the parts that watch a broker see them."""

    @property
    def origin(self) -> str:
        """This process, unique among the group's and fresh each time it starts."""

    @property
    def node(self) -> str:
        """This process's name, as its configuration gives it."""

    @property
    def running(self) -> bool:
        """Whether this process is in the group now."""

    def ask_others(self, question: str, request: list[Any], own: Any,
                   timeout: float = 1.0) -> defer.Deferred[list[Reply]]:
        """Every process's answer to `request`, this one's (`own`) first, then those of the
        others that answer `question` within `timeout` seconds."""

    def answer_others(self, question: str, answerer: Answerer) -> None:
        """Answer the other processes' `question`s with `answerer`."""

    def stats(self) -> FederationStats:
        """The group's counters, as this process sees them."""
