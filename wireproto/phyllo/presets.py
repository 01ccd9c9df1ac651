"""The minimal and reduced Phyllo stacks, as compositions of the layers, and how to connect one.

docs/phyllo.md, "Composing stacks": minimal is a datagram carrying 0x60; reduced is a datagram
carrying 0x22 and a validated datagram carrying 0x60. Both sit on a frame over a chunked stream
and end in a pub-sub message link. A preset is nothing but those layers built on each other;
any other composition of the same layers is built the same way::

    link = MessageLink(ValidatedDatagramLayer(DatagramLayer(FrameLayer(ChunkedStream()))))

The standard stack (reliable buffer 0x23, Go-Back-N) is not here yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IProtocol
from twisted.internet.protocol import Factory

from wireproto.codecs.phyllo.chunks import MAX_CHUNK_LENGTH
from wireproto.codecs.phyllo.frame import MAX_FRAME_PAYLOAD

from .base import DEFAULT_MAX_QUEUE, LayerBase
from .links import ChunkedStream, DatagramLayer, FrameLayer, ValidatedDatagramLayer
from .pubsub import MessageLink

__all__ = [
    "PRESETS",
    "StackFactory",
    "build_stack",
    "connect_stack",
    "minimal_stack",
    "reduced_stack",
]

TopT = TypeVar("TopT", bound=LayerBase)


def _frame(
    bottom: LayerBase | None, max_chunk_length: int, max_frame_payload: int, max_queue: int
) -> FrameLayer:
    if bottom is None:
        bottom = ChunkedStream(max_length=max_chunk_length, max_queue=max_queue)
    return FrameLayer(bottom, max_length=max_frame_payload, max_queue=max_queue)


def minimal_stack(
    bottom: LayerBase | None = None,
    *,
    max_chunk_length: int = MAX_CHUNK_LENGTH,
    max_frame_payload: int = MAX_FRAME_PAYLOAD,
    max_queue: int = DEFAULT_MAX_QUEUE,
) -> MessageLink:
    """message link / datagram / frame / `bottom` (a new `ChunkedStream` if not given)."""
    frame = _frame(bottom, max_chunk_length, max_frame_payload, max_queue)
    return MessageLink(DatagramLayer(frame, max_queue=max_queue), max_queue=max_queue)


def reduced_stack(
    bottom: LayerBase | None = None,
    *,
    max_chunk_length: int = MAX_CHUNK_LENGTH,
    max_frame_payload: int = MAX_FRAME_PAYLOAD,
    max_queue: int = DEFAULT_MAX_QUEUE,
) -> MessageLink:
    """message link / validated datagram / datagram / frame / `bottom`."""
    frame = _frame(bottom, max_chunk_length, max_frame_payload, max_queue)
    datagram = DatagramLayer(frame, max_queue=max_queue)
    return MessageLink(ValidatedDatagramLayer(datagram, max_queue=max_queue), max_queue=max_queue)


PRESETS: dict[str, Callable[..., MessageLink]] = {
    "minimal": minimal_stack,
    "reduced": reduced_stack,
}


def build_stack(preset: str, bottom: LayerBase | None = None, **limits: int) -> MessageLink:
    """The preset named `preset` ("minimal" or "reduced"), as named in configuration."""
    try:
        build = PRESETS[preset]
    except KeyError:
        raise ValueError(
            f"unknown Phyllo stack {preset!r}: use {' or '.join(sorted(PRESETS))} (the standard "
            "stack, with the reliable buffer, is not implemented)"
        ) from None
    return build(bottom, **limits)


class StackFactory(Factory):
    """A Twisted factory that builds a new stack per connection; its bottom is the protocol.

    `build` returns the stack's top layer, and its bottom must be a Twisted protocol
    (`ChunkedStream`); `built` holds the top of every stack built, newest last.
    """

    def __init__(self, build: Callable[[], LayerBase]) -> None:
        self.build = build
        self.built: list[LayerBase] = []

    def buildProtocol(self, addr: Any) -> Any:
        top = self.build()
        bottom = top.bottom
        if not IProtocol.providedBy(bottom):
            raise TypeError(
                f"the bottom of a Phyllo stack on a stream must be a Twisted protocol such as "
                f"ChunkedStream, not {bottom!r}"
            )
        bottom.factory = self  # type: ignore[attr-defined]  # a Twisted protocol, checked above
        self.built.append(top)
        return bottom


def connect_stack(endpoint: Any, build: Callable[[], TopT]) -> Deferred[TopT]:
    """Connect a new ``build()`` stack through a Twisted client endpoint (``serial:``, ``tcp:``
    ...); fires with its top layer once the carrier is connected."""
    factory = StackFactory(build)
    connecting = endpoint.connect(factory)
    connecting.addCallback(lambda _bottom: factory.built[-1])
    return connecting
