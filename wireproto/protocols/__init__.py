"""The protocols wireproto speaks, each described once by a `ProtocolDescriptor`.

A descriptor is the one place that says everything about a spec that the rest of wireproto
needs: the config table of its settings, how the broker serves it and over which transports,
the code capture files give it, how the pipeline decodes its messages and pairs its requests
with their answers, and how the ``wireproto pub``/``sub`` tools reach it. `wireproto.config`,
`wireproto.service`, `wireproto.capture`, `wireproto.pipeline` and `wireproto.tools` read the
registry; none of them names a protocol. docs/architecture.md, "Adding a protocol", shows how to
register a new one.

Everything a descriptor points at is named as ``"module:attribute"`` (or given as the object
itself) and imported only when it is used, so reading the registry imports no protocol, no
Twisted and no codec: a Spark worker that decodes captures loads only the codecs it meets.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType

    from wireproto.hub import Hub
    from wireproto.transports.base import MessageProtocol

    # A protocol's server role: ``server(hub, settings)`` -> a factory of its protocols.
    ServerRole = Callable[[Hub, Any], Callable[[], MessageProtocol]]

__all__ = [
    "ProtocolDescriptor",
    "RequestPairing",
    "PROTOCOLS",
    "register_protocol",
    "unregister_protocol",
    "protocol",
    "protocol_by_code",
    "server_protocols",
    "load",
]


def load(ref: Any) -> Any:
    """The object a ``"module:attribute"`` string names (the module, without ``:``); any other
    value is returned as it is."""
    if not isinstance(ref, str):
        return ref
    module, _, attribute = ref.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


@dataclass(frozen=True)
class RequestPairing:
    """How the pipeline pairs a protocol's requests (in) with their answers (out).

    `by` is ``"id"`` when request and answer carry the same request id on one connection, or
    ``"order"`` when the n-th request of a connection is answered by its n-th answer. An answer
    type in `answer_codes` counts only when the message's first byte is that code.
    """

    request: str
    answers: tuple[str, ...]
    ok: tuple[str, ...]
    by: str = "id"
    answer_codes: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.by not in ("id", "order"):
            raise ValueError(f"pairing by {self.by!r}: use 'id' or 'order'")


@dataclass(frozen=True)
class ProtocolDescriptor:
    """Everything wireproto needs to know of one protocol.

    - `name`: as in ``--listen NAME+...``, the config table ``[NAME]`` and capture rows.
    - `capture_code`: the byte capture records name it by (1 to 255, unique, never reused).
    - `settings`: the frozen dataclass of its config table (see `wireproto.settings`), or None.
    - `server`: ``server(hub, settings) -> protocol factory`` for the broker's server role, or
      None for a protocol the broker only bridges (Phyllo).
    - `transports`: where it may be served (``ws``, ``engineio``, ``length32``, ``lines``,
      ``cobs``); `default_framing` for attached links, `default_path` for ``ws``.
    - `analysis`: a module with ``columns(data, binary, incoming)`` -> (message_type, topic,
      request_id, body_size), and ``value(data, binary, incoming)`` -> the decoded document a
      message carries, or `wireproto.payloads.NO_VALUE`; optionally ``published(data,
      binary)`` -> (topic, payload) of a client's publish as the broker put it into its hub, or
      None for another message (what ``wireproto replay`` publishes again).
    - `decoding_reads`: what its `columns` read besides a message's bytes: ``"binary"`` (the
      record's binary flag) and ``"direction"`` (in or out), so the pipeline decodes a message
      once per distinct bytes and these.
    - `requests`: how the pipeline pairs its requests with answers, if it has requests.
    - `reading_types`: the message types whose documents the pipeline reads numbers from.
    - `pubsub_link`: the ``wireproto pub``/``sub`` link class for it, if the tools speak it;
      `caller`: the ``wireproto call`` class for it, if it has requests the tool can make.
    """

    # Each of settings, server, analysis, pubsub_link and caller: "module:attribute", or the
    # object itself.
    name: str
    capture_code: int
    settings: str | type | None = None
    server: str | ServerRole | None = None
    transports: frozenset[str] = frozenset()
    default_framing: str | None = None
    default_path: str | None = None
    analysis: str | ModuleType | None = None
    decoding_reads: tuple[str, ...] = ()
    requests: RequestPairing | None = None
    reading_types: tuple[str, ...] = ()
    pubsub_link: str | type | None = None
    caller: str | type | None = None

    def settings_class(self) -> type | None:
        return load(self.settings)

    def make_server(self, hub: Hub, settings: object = None) -> Callable[[], MessageProtocol]:
        """A zero-argument factory of server-role protocols on `hub`, configured by
        `settings` (its table's defaults when None)."""
        if self.server is None:
            raise ValueError(f"wireproto does not serve {self.name}: it has no server role")
        if settings is None and self.settings is not None:
            settings = load(self.settings)()
        return load(self.server)(hub, settings)

    def analysis_module(self) -> Any:
        return load(self.analysis)


PROTOCOLS: dict[str, ProtocolDescriptor] = {}


def register_protocol(descriptor: ProtocolDescriptor) -> ProtocolDescriptor:
    """Add `descriptor` to the registry; its name and capture code must be new."""
    if descriptor.name in PROTOCOLS:
        raise ValueError(f"a protocol named {descriptor.name!r} is already registered")
    if not 1 <= descriptor.capture_code <= 255:
        raise ValueError(f"capture code {descriptor.capture_code} is not 1 to 255")
    for other in PROTOCOLS.values():
        if other.capture_code == descriptor.capture_code:
            raise ValueError(
                f"capture code {descriptor.capture_code} is already {other.name!r}'s"
            )
    PROTOCOLS[descriptor.name] = descriptor
    return descriptor


def unregister_protocol(name: str) -> None:
    PROTOCOLS.pop(name, None)


def protocol(name: str) -> ProtocolDescriptor:
    try:
        return PROTOCOLS[name]
    except KeyError:
        known = ", ".join(sorted(PROTOCOLS))
        raise ValueError(f"unknown protocol {name!r}: known protocols are {known}") from None


def protocol_by_code(code: int) -> ProtocolDescriptor | None:
    for descriptor in PROTOCOLS.values():
        if descriptor.capture_code == code:
            return descriptor
    return None


def server_protocols() -> dict[str, ProtocolDescriptor]:
    """The protocols the broker can serve, by name, in registration order."""
    return {name: d for name, d in PROTOCOLS.items() if d.server is not None}


# -- the five specs -------------------------------------------------------------------------------

register_protocol(ProtocolDescriptor(
    name="websmq",
    capture_code=1,
    settings="wireproto.protocols.websmq.server:WebsmqSettings",
    server="wireproto.protocols.websmq.server:serve",
    transports=frozenset({"ws", "length32", "cobs"}),
    default_framing="length32",
    default_path="/websmq",
    analysis="wireproto.protocols.websmq.analysis",
    reading_types=("publish", "last_will"),
    pubsub_link="wireproto.tools.links:WebsmqLink",
))
register_protocol(ProtocolDescriptor(
    name="ubre",
    capture_code=2,
    settings="wireproto.protocols.ubre.server:UbreSettings",
    server="wireproto.protocols.ubre.server:serve",
    transports=frozenset({"ws", "lines", "length32", "cobs"}),
    # Newline-delimited JSON, so `nc` users can type messages; length32 for binary.
    default_framing="lines",
    default_path="/ubre",
    analysis="wireproto.protocols.ubre.analysis",
    decoding_reads=("binary",),  # a text frame (or a line) holds only JSON
    requests=RequestPairing("request", ("success", "fail"), ok=("success",)),
    reading_types=("publish",),
    pubsub_link="wireproto.tools.links:UbreLink",
    caller="wireproto.tools.callers:UbreCaller",
))
register_protocol(ProtocolDescriptor(
    name="nydus",
    capture_code=3,
    settings="wireproto.protocols.nydus.server:NydusSettings",
    server="wireproto.protocols.nydus.server:serve",
    # Engine.IO is what nydus-client speaks; ws and lines are wireproto's extensions.
    transports=frozenset({"engineio", "ws", "lines"}),
    default_framing="lines",
    default_path="/nydus",
    analysis="wireproto.protocols.nydus.analysis",
    requests=RequestPairing("invoke", ("result", "error"), ok=("result",)),
    reading_types=("publish",),
    caller="wireproto.tools.callers:NydusCaller",
))
register_protocol(ProtocolDescriptor(
    name="subble",
    capture_code=4,
    settings="wireproto.protocols.subble.server:SubbleSettings",
    server="wireproto.protocols.subble.server:serve",
    # The request-data tail runs to the end of a message: only framings that mark it.
    transports=frozenset({"ws", "length32", "cobs"}),
    default_framing="length32",
    default_path="/subble",
    analysis="wireproto.protocols.subble.analysis",
    decoding_reads=("direction",),  # each side sends messages of its own
    # No request ids: the host answers each produce, in order, with the producer's own event
    # (code 27, CLIENT_EVENT) or an event error.
    requests=RequestPairing("produce_event", ("event", "event_error"), ok=("event",),
                            by="order", answer_codes=(("event", 27),)),
    reading_types=("produce_event", "event"),
))
register_protocol(ProtocolDescriptor(
    name="phyllo",
    capture_code=5,
    # Bridged from devices (--phyllo), not served: see wireproto.phyllo.bridge.
    analysis="wireproto.phyllo.analysis",
    reading_types=("document",),
    pubsub_link="wireproto.tools.links:PhylloLink",
))
register_protocol(ProtocolDescriptor(
    name="cluster",
    capture_code=6,
    # Not a protocol clients speak: the calls broker processes make to each other over NATS,
    # as capture records them (wireproto.cluster.callcapture), so the pipeline can pair them.
    analysis="wireproto.cluster.analysis",
    requests=RequestPairing("call", ("reply", "refused"), ok=("reply",)),
))
