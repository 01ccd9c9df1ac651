"""Endpoints, endpoint handlers and the router: who gets which pub-sub document.

docs/phyllo.md, "Documents, endpoints and the router", shaped like phyllo-cpp 0.2.1's classes of the
same names:

- `TopicFilter` matches a topic exactly or by prefix (phyllo-cpp's NameFilter).
- `Endpoint` is a layer over a document link (or over a router) that passes only the documents
  whose topic its filter matches, and sends on its own topic.
- `EndpointHandler` handles any document a router gives it, in its `receive(document)`.
- `SingleEndpointHandler` handles the documents of one endpoint in `on_receive(document)` and
  sends on that endpoint.
- `Router` wraps a document link and gives every document to each subscribed handler. Endpoint
  layers built on a router are subscribed to it, so several endpoints share one link. A document
  that no handler takes is counted in the router's `filtered` counter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from twisted.python.failure import Failure

from wireproto.codecs.phyllo.document import Document, Format, Schema
from wireproto.codecs.phyllo.message import MAX_TOPIC_LENGTH
from wireproto.errors import InvalidTopic

from .base import DEFAULT_MAX_QUEUE, Layer, LayerBase, log
from .pubsub import PubSubDocument, SendsValues, topic_bytes

__all__ = ["Endpoint", "EndpointHandler", "Router", "SingleEndpointHandler", "TopicFilter"]


@dataclass(frozen=True, slots=True)
class TopicFilter:
    """Matches a topic exactly, or (with `prefix`) every topic that starts with it."""

    topic: bytes
    prefix: bool = False

    def __post_init__(self) -> None:
        topic = topic_bytes(self.topic)
        if len(topic) > MAX_TOPIC_LENGTH:
            raise InvalidTopic(
                f"Phyllo topic {topic!r} is {len(topic)} bytes: at most {MAX_TOPIC_LENGTH} fit"
            )
        object.__setattr__(self, "topic", topic)

    def matches(self, topic: bytes) -> bool:
        return topic.startswith(self.topic) if self.prefix else topic == self.topic

    def suffix(self, topic: bytes) -> bytes:
        """What follows the prefix in a matching topic."""
        return topic[len(self.topic) :]


def _on_topic(filter: TopicFilter, document: Document | PubSubDocument) -> PubSubDocument:
    if isinstance(document, Document):
        return PubSubDocument(filter.topic, document)
    if not filter.matches(document.topic):
        kind = "prefix" if filter.prefix else "topic"
        raise InvalidTopic(
            f"Phyllo document on topic {document.topic!r} does not belong to the endpoint of "
            f"{kind} {filter.topic!r}"
        )
    return document


class Endpoint(Layer[PubSubDocument]):
    """A topic filter over a document link (or a router), with the service interface.

    `send` takes a `Document`, sent on the endpoint's topic (its prefix, for a prefix
    endpoint), or a `PubSubDocument` on a topic the filter matches.
    """

    name: ClassVar[str] = "endpoint"

    def __init__(
        self,
        below: LayerBase,
        topic: bytes | str,
        *,
        prefix: bool = False,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> None:
        self.filter = TopicFilter(topic_bytes(topic), prefix)
        super().__init__(below, max_queue=max_queue)

    def __repr__(self) -> str:
        kind = "prefix" if self.filter.prefix else "topic"
        return f"<Endpoint {kind} {self.filter.topic!r}>"

    @property
    def topic(self) -> bytes:
        return self.filter.topic

    def accepts(self, unit: PubSubDocument) -> bool:
        return self.filter.matches(unit.topic)

    def below_received(self, document: PubSubDocument) -> None:
        if self.filter.matches(document.topic):
            self._deliver(document)
        else:
            self.counters.filtered += 1

    def send(self, document: Document | PubSubDocument) -> None:
        self.send_below(_on_topic(self.filter, document))

    def send_value(
        self, value: Any, *, format: int = Format.MSGPACK, schema: int = Schema.SCHEMALESS
    ) -> None:
        """Serialize `value` and send it on the endpoint's topic."""
        self.send(PubSubDocument.of(self.filter.topic, value, format=format, schema=schema))


class EndpointHandler:
    """Handles pub-sub documents that a router gives it (spec: "receive ... arbitrarily").

    Override `receive`, or pass a callable that takes each document. `router` is set when the
    handler is subscribed, and `send` goes through it.
    """

    def __init__(self, receive: Callable[[PubSubDocument], object] | None = None) -> None:
        self.router: Router | None = None
        self._callback = receive

    def receive(self, document: PubSubDocument) -> bool:
        """Handle one document; return True if this handler took it."""
        if self._callback is None:
            return False
        self._callback(document)
        return True

    def link_made(self) -> None:
        """The carrier under the router's stack is connected."""

    def link_lost(self, reason: Failure) -> None:
        """The carrier under the router's stack is gone."""

    def send(self, document: PubSubDocument) -> None:
        if self.router is None:
            raise TypeError(f"{self!r} is not subscribed to a router: it cannot send")
        self.router.send(document)


class SingleEndpointHandler(EndpointHandler):
    """Handles the documents of one endpoint (a topic, or a prefix) in `on_receive`.

    Subclass and override `on_receive`, or pass `on_receive=`. `send` and `send_value` send on
    the endpoint's topic.
    """

    def __init__(
        self,
        topic: bytes | str,
        *,
        prefix: bool = False,
        on_receive: Callable[[PubSubDocument], object] | None = None,
    ) -> None:
        super().__init__()
        self.filter = TopicFilter(topic_bytes(topic), prefix)
        if on_receive is not None:
            self.on_receive = on_receive  # type: ignore[method-assign, assignment]

    def __repr__(self) -> str:
        kind = "prefix" if self.filter.prefix else "topic"
        return f"<{type(self).__name__} {kind} {self.filter.topic!r}>"

    def receive(self, document: PubSubDocument) -> bool:
        if not self.filter.matches(document.topic):
            return False
        self.on_receive(document)
        return True

    def on_receive(self, document: PubSubDocument) -> None:
        """A document arrived on this endpoint."""
        log.debug("Phyllo {handler!r}: unhandled document {document!r}",
                  event="phyllo_unhandled_document", handler=self, document=document)

    def send(self, document: Document | PubSubDocument) -> None:
        super().send(_on_topic(self.filter, document))

    def send_value(
        self, value: Any, *, format: int = Format.MSGPACK, schema: int = Schema.SCHEMALESS
    ) -> None:
        self.send(PubSubDocument.of(self.filter.topic, value, format=format, schema=schema))


class _LayerHandler(EndpointHandler):
    """An endpoint layer built on a router, subscribed to it as a handler."""

    def __init__(self, layer: LayerBase) -> None:
        super().__init__()
        self.layer = layer

    def __repr__(self) -> str:
        return f"<handler for {self.layer!r}>"

    def receive(self, document: PubSubDocument) -> bool:
        self.layer.below_received(document)
        return self.layer.accepts(document)

    def link_made(self) -> None:
        self.layer.link_made()

    def link_lost(self, reason: Failure) -> None:
        self.layer.link_lost(reason)


class Router(SendsValues, LayerBase):
    """Gives each document from a document link to every subscribed endpoint handler."""

    name: ClassVar[str] = "router"

    def __init__(self, below: LayerBase) -> None:
        self.handlers: list[EndpointHandler] = []
        super().__init__(below)

    def _attach(self, layer: LayerBase) -> None:
        self.subscribe(_LayerHandler(layer))

    def subscribe(self, handler: EndpointHandler) -> EndpointHandler:
        """Give `handler` every document from now on; returns it."""
        if handler.router is not None:
            raise ValueError(f"{handler!r} is already subscribed to a router")
        handler.router = self
        self.handlers.append(handler)
        return handler

    def unsubscribe(self, handler: EndpointHandler) -> None:
        self.handlers.remove(handler)
        handler.router = None

    def below_received(self, document: PubSubDocument) -> None:
        self.counters.received += 1
        taken = False
        for handler in list(self.handlers):  # a handler may unsubscribe while handling
            try:
                if handler.receive(document):
                    taken = True
            except Exception:
                self.counters.callback_errors += 1
                log.failure("Phyllo router: {handler!r} failed on {document!r}",
                            event="handler_failed", protocol="phyllo", handler=handler,
                            document=document)
        if not taken:
            self.counters.filtered += 1
            log.debug("Phyllo router: no handler took {document!r}",
                      event="phyllo_unhandled_document", document=document)

    def link_made(self) -> None:
        for handler in list(self.handlers):
            handler.link_made()

    def link_lost(self, reason: Failure) -> None:
        super().link_lost(reason)
        for handler in list(self.handlers):
            handler.link_lost(reason)

    def send(self, document: PubSubDocument) -> None:
        self.send_below(document)
