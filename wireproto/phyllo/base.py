"""The service interface every Phyllo layer offers, and how a layer wraps the one below it.

Phyllo gives each layer a service interface (docs/phyllo.md, "The service interface"): *send*, *has
receive* and *receive*. `Layer` offers them to synchronous code, plus an `on_receive` callback and
`next_receive()`, a Deferred for Twisted code. A layer wraps the layer below it, in the manner of
`twisted.protocols.policies.ProtocolWrapper`: sending goes down through `below.send()`, and whatever
the layer below decodes comes up through `below_received()`.

A received unit goes to the first of these that is there:

1. the layer above, if this layer is wrapped (a wrapped layer keeps no queue of its own);
2. the oldest `next_receive()` Deferred still waiting;
3. the `on_receive` callback;
4. the receive queue, read with `has_receive()` and `receive()`. The queue is bounded
   (`max_queue`): when it is full the new unit is dropped and counted in `counters.dropped`, so
   what was already accepted is never lost.

Bad input never raises out of a layer: the unit is dropped, counted on the layer that found the
fault (`Counters`) and logged, and the layers above never see it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto import peerlog
from wireproto.errors import BadChecksum, BadEncoding, BadJSON, ProtocolError, UnknownType

__all__ = ["DEFAULT_MAX_QUEUE", "Counters", "Layer", "LayerBase", "error_counter"]

DEFAULT_MAX_QUEUE = 64
"""Units a layer's receive queue holds before it drops new ones."""

log = Logger(namespace="wireproto.phyllo")

UnitT = TypeVar("UnitT")


@dataclass
class Counters:
    """What one layer saw. Every dropped unit is counted under exactly one reason."""

    received: int = 0
    """Good units this layer decoded and passed on (including those the full queue dropped)."""
    sent: int = 0
    """Units this layer passed to the layer (or the carrier) below."""
    dropped: int = 0
    """Good units dropped because the receive queue was full."""
    crc_errors: int = 0
    """Validated datagrams whose CRC did not match."""
    framing_errors: int = 0
    """Over-long chunks, bad COBS, bad lengths, truncated headers."""
    type_errors: int = 0
    """Units of a type (or document format) the layer above does not take."""
    decode_errors: int = 0
    """Document bodies that are not valid msgpack or JSON."""
    layer_messages: int = 0
    """Layer messages (type below 0x10): counted, never handed up."""
    filtered: int = 0
    """Documents whose topic no endpoint or handler took."""
    unsent: int = 0
    """Sends dropped because the carrier was not connected."""
    callback_errors: int = 0
    """Exceptions raised by an `on_receive` callback or an endpoint handler (logged)."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def error_counter(error: ProtocolError) -> str:
    """The `Counters` field that a unit dropped for `error` is counted in."""
    if isinstance(error, BadChecksum):
        return "crc_errors"
    if isinstance(error, UnknownType):
        return "type_errors"
    if isinstance(error, (BadEncoding, BadJSON)):
        return "decode_errors"
    return "framing_errors"


class LayerBase:
    """A link in a stack: knows the layer below and the one above, counts, and passes on the
    carrier's connection events (`link_made`, `link_lost`)."""

    name: ClassVar[str] = "layer"

    if TYPE_CHECKING:  # every layer that is below another sends what that one gives it
        def send(self, unit: Any) -> None: ...

    def __init__(self, below: LayerBase | None = None) -> None:
        self.below = below
        self.above: LayerBase | None = None
        self.counters = Counters()
        self.lost_reason: Failure | None = None
        self._lost_waiters: list[defer.Deferred[None]] = []
        if below is not None:
            below._attach(self)

    def __repr__(self) -> str:
        below = f" over {self.below.name}" if self.below is not None else ""
        return f"<{type(self).__name__} {self.name}{below}>"

    def _attach(self, layer: LayerBase) -> None:
        """Called by `layer`, which is being built on top of this one."""
        if self.above is not None:
            raise ValueError(
                f"the Phyllo {self.name} layer is already wrapped by the {self.above.name} "
                "layer: a layer has one layer above it (a Router shares a document link)"
            )
        self.above = layer

    # -- the stack ------------------------------------------------------------------------

    @property
    def bottom(self) -> LayerBase:
        """The lowest layer of this stack: the one on the carrier."""
        layer = self
        while layer.below is not None:
            layer = layer.below
        return layer

    @property
    def top(self) -> LayerBase:
        """The highest layer above this one (a Router is a top: it fans out)."""
        layer = self
        while layer.above is not None:
            layer = layer.above
        return layer

    def layers(self) -> list[LayerBase]:
        """This layer and every layer under it, bottom first."""
        stack: list[LayerBase] = []
        layer: LayerBase | None = self
        while layer is not None:
            stack.append(layer)
            layer = layer.below
        return stack[::-1]

    def stack_counters(self) -> dict[str, Counters]:
        """The counters of `layers()`, by layer name (a repeated name gets ' #2', ' #3'...)."""
        result: dict[str, Counters] = {}
        for layer in self.layers():
            key, n = layer.name, 1
            while key in result:
                n += 1
                key = f"{layer.name} #{n}"
            result[key] = layer.counters
        return result

    # -- from the layer below ---------------------------------------------------------------

    def below_received(self, unit: Any) -> None:
        """A unit decoded by the layer below arrived. Each layer decodes its own."""
        raise NotImplementedError

    def accepts(self, unit: Any) -> bool:
        """Whether this layer takes `unit` (an endpoint filters by topic); for routers."""
        return True

    def link_made(self) -> None:
        """The carrier under the stack is connected."""
        if self.above is not None:
            self.above.link_made()

    def link_lost(self, reason: Failure) -> None:
        """The carrier under the stack is gone; `reason` says why."""
        self.lost_reason = reason
        waiters, self._lost_waiters = self._lost_waiters, []
        for waiter in waiters:
            waiter.callback(None)
        if self.above is not None:
            self.above.link_lost(reason)

    def when_lost(self) -> defer.Deferred[None]:
        """Fires (with None; the reason is in `lost_reason`) once the carrier is gone."""
        if self.lost_reason is not None:
            return defer.succeed(None)
        waiter: defer.Deferred[None] = defer.Deferred()
        self._lost_waiters.append(waiter)
        return waiter

    def lose_connection(self) -> None:
        """Close the carrier under the stack."""
        bottom = self.bottom
        if bottom is self:
            raise TypeError(f"the Phyllo {self.name} layer sits on no carrier")
        bottom.lose_connection()

    # -- helpers for subclasses ---------------------------------------------------------------

    def send_below(self, unit: Any) -> None:
        if self.below is None:
            raise TypeError(f"the Phyllo {self.name} layer has no layer below to send through")
        self.below.send(unit)
        self.counters.sent += 1

    def _reject(self, error: ProtocolError, counter: str | None = None) -> None:
        """Drop a bad unit: count it and say why. The layers above never see it."""
        field = counter or error_counter(error)
        setattr(self.counters, field, getattr(self.counters, field) + 1)
        # Line noise drops many units: counted always, logged within the log budget.
        peerlog.warn(
            log, f"phyllo {self.name}",
            "Phyllo {layer}: dropped a unit ({counter}): {error}",
            event="phyllo_unit_dropped",
            layer=self.name,
            counter=field,
            error=error,
        )

    def _layer_message(self, unit: Any) -> None:
        """A layer's own message (type below 0x10): counted and offered to
        `on_layer_message`, never handed up as data."""
        self.counters.layer_messages += 1
        log.debug("Phyllo {layer}: layer message {unit!r}", event="phyllo_layer_message",
                  layer=self.name, unit=unit)
        callback = getattr(self, "on_layer_message", None)
        if callback is not None:
            self._call(callback, unit)

    def _call(self, callback: Callable[[Any], object], unit: Any) -> None:
        # A faulty callback must not stop the stream: later units still arrive.
        try:
            callback(unit)
        except Exception:
            self.counters.callback_errors += 1
            log.failure("Phyllo {layer}: callback {callback!r} failed", event="callback_failed",
                        layer=self.name, callback=callback)


class Layer(LayerBase, Generic[UnitT]):
    """A layer with the service interface: send, has_receive, receive, on_receive and
    next_receive. `UnitT` is what it hands up (and, for most layers, what `send` takes)."""

    def __init__(self, below: LayerBase | None = None, *, max_queue: int = DEFAULT_MAX_QUEUE):
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, not {max_queue}")
        self.max_queue = max_queue
        self._queue: deque[UnitT] = deque()
        self._waiters: deque[defer.Deferred[UnitT]] = deque()
        self._on_receive: Callable[[UnitT], object] | None = None
        self._overflowing = False  # logged once per episode of a full queue, not per unit
        super().__init__(below)

    # -- service interface ------------------------------------------------------------------

    def send(self, unit: Any) -> None:
        """Send one unit to the peer, through the layers below."""
        raise NotImplementedError

    def has_receive(self) -> bool:
        """Whether a received unit waits in the queue."""
        return bool(self._queue)

    def receive(self) -> UnitT:
        """The oldest received unit; raises LookupError if there is none (see has_receive)."""
        if not self._queue:
            raise LookupError(
                f"nothing received on the Phyllo {self.name} layer: check has_receive() first"
            )
        self._overflowing = False
        return self._queue.popleft()

    def next_receive(self) -> defer.Deferred[UnitT]:
        """A Deferred that fires with the next received unit (at once if one is queued).

        Fails with the carrier's reason if the connection is lost first. Cancelling it (as
        `addTimeout` does) gives up its turn; the unit goes to the next consumer.
        """
        self._check_unwrapped("next_receive()")
        if self._queue:
            return defer.succeed(self.receive())
        if self.lost_reason is not None:
            return defer.fail(self.lost_reason)
        waiter: defer.Deferred[UnitT] = defer.Deferred(canceller=self._forget_waiter)
        self._waiters.append(waiter)
        return waiter

    def _forget_waiter(self, waiter: defer.Deferred[UnitT]) -> None:
        # A canceller that raised would leave the Deferred unfired for ever.
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    @property
    def on_receive(self) -> Callable[[UnitT], object] | None:
        """Called with each received unit instead of queueing it. Setting it hands it the
        units already queued, oldest first."""
        return self._on_receive

    @on_receive.setter
    def on_receive(self, callback: Callable[[UnitT], object] | None) -> None:
        if callback is not None:
            self._check_unwrapped("on_receive")
        self._on_receive = callback
        while callback is not None and self._queue and self._on_receive is callback:
            self._call(callback, self._queue.popleft())
        self._overflowing = False

    # -- receiving ------------------------------------------------------------------------------

    def _deliver(self, unit: UnitT) -> None:
        """Pass a good unit on, to the first consumer there is (module docstring)."""
        self.counters.received += 1
        if self.above is not None:
            self.above.below_received(unit)
        elif self._waiters:
            self._waiters.popleft().callback(unit)
        elif self._on_receive is not None:
            self._call(self._on_receive, unit)
        elif len(self._queue) < self.max_queue:
            self._queue.append(unit)
        else:
            self.counters.dropped += 1
            if not self._overflowing:
                self._overflowing = True
                log.warn(
                    "Phyllo {layer}: receive queue full ({max_queue} units); dropping new "
                    "units until it is read",
                    event="phyllo_queue_full",
                    layer=self.name,
                    max_queue=self.max_queue,
                )

    def link_lost(self, reason: Failure) -> None:
        waiters = list(self._waiters)
        self._waiters.clear()
        super().link_lost(reason)
        for waiter in waiters:
            waiter.errback(reason)

    def _check_unwrapped(self, what: str) -> None:
        # A wrapped layer hands every unit up, so its own consumers would wait forever.
        if self.above is not None:
            raise ValueError(
                f"the Phyllo {self.name} layer is wrapped by the {self.above.name} layer, "
                f"which takes every unit it receives: use {what} on the top layer"
            )
