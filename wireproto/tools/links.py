"""One pub/sub connection, whatever the protocol: a `Link` per protocol the tools speak (named by
each protocol's descriptor), what a tool receives, and payloads as values."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from twisted.internet import defer, error
from twisted.python.failure import Failure

from wireproto.payloads import value_from_payload
from wireproto.tools._common import (
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    ToolError,
    connect_options,
)

if TYPE_CHECKING:
    from wireproto.codecs.phyllo.message import PubSubMessage
    from wireproto.codecs.ubre import Publish
    from wireproto.phyllo.pubsub import MessageLink
    from wireproto.protocols.websmq.client import WebsmqClientProtocol

__all__ = [
    "NO_VALUE",
    "Link",
    "reason_text",
    "open_link",
    "close_link",
    "Received",
    "WebsmqLink",
    "UbreLink",
    "PhylloLink",
]

# -- what a tool receives, and payloads as values ------------------------------------------------


NO_VALUE = object()


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    value: Any = NO_VALUE
    """The decoded JSON or msgpack value, for UBRE and Phyllo documents."""
    will: bool = False


def _json_value(payload: bytes) -> Any:
    """A payload as a JSON value (see `value_from_payload`); ToolError for bytes that are not
    UTF-8."""
    value = value_from_payload(payload)
    if isinstance(value, bytes):
        raise ToolError("a payload that is not UTF-8 cannot be a JSON value", EXIT_USAGE)
    return value


def _value_payload(value: Any) -> bytes | None:
    """What sub prints for a value: a string as its text, bytes as they are, None (no body) as
    nothing, anything else as compact JSON; None if JSON cannot say it."""
    from wireproto.codecs.serialization import json_utf8
    from wireproto.errors import ProtocolError

    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace")
    if value is None:
        return b""
    try:
        return json_utf8(value)
    except ProtocolError:
        return None


def _is_json(value: Any) -> bool:
    from wireproto.codecs.serialization import json_utf8
    from wireproto.errors import ProtocolError

    try:
        json_utf8(value)
    except ProtocolError:
        return False
    return True


# -- one connection, whatever the protocol -------------------------------------------------------


class Link:
    """A connection of one protocol: publish, subscribe, lost, close."""

    protocol = ""

    def __init__(self) -> None:
        self.closing = False
        self._lost: list[Callable[[str], object]] = []

    def on_lost(self, callback: Callable[[str], object]) -> None:
        """Call `callback(why)` if the connection is lost before `close()`."""
        self._lost.append(callback)

    def _was_lost(self, why: str) -> None:
        if not self.closing:
            for callback in self._lost:
                callback(why)

    async def publish(self, topic: str, payload: bytes) -> None:
        raise NotImplementedError

    def subscribe(self, topics: list[str], deliver: Callable[[Received], object]) -> None:
        raise NotImplementedError

    def close(self) -> defer.Deferred:
        """Close after everything written; fires with None, or the reason for an unclean
        close."""
        raise NotImplementedError

    @classmethod
    def check_topics(cls, topics: list[str], patterns: bool) -> None:
        """Refuse, with a ToolError or a ValueError, a topic (or with `patterns`, a pattern)
        the protocol cannot carry."""
        raise NotImplementedError

    @classmethod
    def open(cls, reactor: Any, args: argparse.Namespace,
             topics: list[str]) -> defer.Deferred[Self]:
        """Connect to ``args.address``, to publish or subscribe to `topics`."""
        raise NotImplementedError


def reason_text(reason: Any) -> str:
    value = reason.value if isinstance(reason, Failure) else reason
    return str(value).strip() or type(value).__name__


class WebsmqLink(Link):
    protocol = "websmq"

    def __init__(self, client: WebsmqClientProtocol) -> None:
        super().__init__()
        self.client = client
        client.when_closed().addCallback(lambda reason: self._was_lost(reason_text(reason)))

    @classmethod
    def check_topics(cls, topics: list[str], patterns: bool) -> None:
        from wireproto.codecs import websmq
        from wireproto.protocols.websmq.patterns import validate_websmq_pattern
        from wireproto.topics import is_pattern

        for topic in topics:
            if patterns and is_pattern(topic):
                validate_websmq_pattern(topic)
            else:
                websmq.validate_topic(topic)

    @classmethod
    def open(cls, reactor: Any, args: argparse.Namespace,
             topics: list[str]) -> defer.Deferred[Self]:
        from wireproto.protocols import websmq
        from wireproto.topics import is_pattern

        wildcards = any(map(is_pattern, topics))
        return websmq.connect(reactor, args.address, wildcards=wildcards,
                              **connect_options(args)).addCallback(cls)

    async def publish(self, topic: str, payload: bytes) -> None:
        await self.client.publish(topic, payload)

    def subscribe(self, topics: list[str], deliver: Callable[[Received], object]) -> None:
        from wireproto.codecs.websmq import LastWill

        self.client.on_message = lambda message: deliver(Received(
            message.topic, message.payload, will=isinstance(message, LastWill)
        ))
        for topic in topics:
            self.client.subscribe(topic)

    def close(self) -> defer.Deferred:
        self.closing = True
        return self.client.disconnect().addCallback(
            lambda reason: None if isinstance(reason, error.ConnectionDone) else reason
        )


class UbreLink(Link):
    protocol = "ubre"

    def __init__(self, client: Any) -> None:
        super().__init__()
        self.client = client
        self._lost_reason: Failure | None = None
        client.on_disconnect = self._disconnected

    def _disconnected(self, reason: Failure) -> None:
        self._lost_reason = reason
        self._was_lost(reason_text(reason))

    @classmethod
    def check_topics(cls, topics: list[str], patterns: bool) -> None:
        pass  # any text is a UBRE topic

    @classmethod
    def open(cls, reactor: Any, args: argparse.Namespace,
             topics: list[str]) -> defer.Deferred[Self]:
        from wireproto.protocols.ubre import client as ubre_client

        return ubre_client.connect(reactor, args.address,
                                   **connect_options(args)).addCallback(cls)

    async def publish(self, topic: str, payload: bytes) -> None:
        from wireproto.codecs.ubre import NO_BODY
        from wireproto.protocols.rpc import ConnectionClosed

        value = _json_value(payload)
        try:
            await self.client.publish(topic, NO_BODY if value is None else value)
        except ConnectionClosed as closed:
            raise ToolError(str(closed), EXIT_UNREACHABLE) from None

    def subscribe(self, topics: list[str], deliver: Callable[[Received], object]) -> None:
        def received(message: Publish) -> None:
            payload = _value_payload(message.body)
            if isinstance(message.body, bytes) or payload is None:
                deliver(Received(message.topic, payload or b""))
            else:
                deliver(Received(message.topic, payload, message.body))

        for topic in dict.fromkeys(topics):
            self.client.subscribe(topic, received)

    def close(self) -> defer.Deferred:
        self.closing = True
        # An unclean close is the broker refusing what was sent (a WEBSMQ path, say).
        return self.client.close().addCallback(lambda _: _unclean(self._lost_reason))


class PhylloLink(Link):
    protocol = "phyllo"

    def __init__(self, top: MessageLink, send_format: str) -> None:
        super().__init__()
        self.top = top
        self.send_format = send_format
        top.when_lost().addCallback(lambda _: self._was_lost(reason_text(top.lost_reason)))

    @classmethod
    def check_topics(cls, topics: list[str], patterns: bool) -> None:
        from wireproto.codecs.phyllo.message import MAX_TOPIC_LENGTH
        from wireproto.topics import is_pattern, validate_pattern

        for topic in topics:
            if patterns and is_pattern(topic):
                validate_pattern(topic)
            elif not topic or len(topic.encode("utf-8")) > MAX_TOPIC_LENGTH:
                raise ToolError(
                    f"Phyllo topic {topic!r}: a device topic is 1 to {MAX_TOPIC_LENGTH} bytes",
                    EXIT_USAGE,
                )

    @classmethod
    def open(cls, reactor: Any, args: argparse.Namespace,
             topics: list[str]) -> defer.Deferred[Self]:
        from wireproto.phyllo import build_stack, connect_stack
        from wireproto.phyllo.links import MessageChunks
        from wireproto.transports.connect import client_endpoint, connect, is_websocket_address

        options = connect_options(args)
        send_format = "bytes" if getattr(args, "bytes", False) else "msgpack"
        if is_websocket_address(args.address):
            # A device behind a WebSocket: one chunk per binary message, as the broker's
            # --phyllo ws:// links carry it.
            built: list[MessageLink] = []

            def chunks() -> MessageChunks:
                bottom = MessageChunks()
                built.append(build_stack(args.stack, bottom))
                return bottom

            opening = connect(reactor, args.address, chunks, **options)
            return opening.addCallback(lambda _bottom: cls(built[-1], send_format))
        if "headers" in options:
            raise ToolError("-H is for WebSocket URLs", EXIT_USAGE)
        endpoint = client_endpoint(reactor, args.address, **options)
        return connect_stack(endpoint, lambda: build_stack(args.stack)).addCallback(
            cls, send_format
        )

    async def publish(self, topic: str, payload: bytes) -> None:
        from wireproto.phyllo.bridge import device_message

        message = device_message(topic.encode("utf-8"), payload, self.send_format)
        assert message is not None  # msgpack and bytes, the tools' formats, carry any payload
        self.top.send(message)

    def subscribe(self, topics: list[str], deliver: Callable[[Received], object]) -> None:
        from wireproto.topics import is_pattern, pattern_matches

        exact = {topic for topic in topics if not is_pattern(topic)}
        patterns = [topic for topic in topics if is_pattern(topic)]

        def received(message: PubSubMessage) -> None:
            topic = message.topic.decode("utf-8", "backslashreplace")
            if topic in exact or any(pattern_matches(p, topic) for p in patterns):
                deliver(_phyllo_received(topic, message))

        self.top.on_receive = received

    def close(self) -> defer.Deferred:
        self.closing = True
        if self.top.lost_reason is None:
            self.top.lose_connection()
        return self.top.when_lost().addCallback(lambda _: _unclean(self.top.lost_reason))


def _unclean(reason: Failure | None) -> BaseException | None:
    if reason is None or reason.check(error.ConnectionDone):
        return None
    return reason.value


def _phyllo_received(topic: str, message: PubSubMessage) -> Received:
    """A device message: a msgpack or JSON document by its value, anything else by its
    payload (a CBOR document by its body)."""
    from wireproto.codecs.phyllo.codes import TypeCode
    from wireproto.codecs.phyllo.document import Format, decode_document, deserialize
    from wireproto.errors import ProtocolError

    if message.payload_type != TypeCode.DOCUMENT:
        return Received(topic, message.payload)
    try:
        document = decode_document(message.payload)
        if document.format not in (Format.MSGPACK, Format.JSON):
            return Received(topic, document.body)
        value = deserialize(document)
    except ProtocolError:
        return Received(topic, message.payload)
    payload = _value_payload(value)
    if payload is None:
        return Received(topic, document.body)
    return Received(topic, payload, value) if _is_json(value) else Received(topic, payload)


def open_link(reactor: Any, args: argparse.Namespace, link: type[Link], topics: list[str],
              timeout: float | None) -> defer.Deferred[Link]:
    """Connect a `link` (a Link class) to ``args.address``; fails with a ToolError the tool
    reports (it cannot reach the address, or did not within `timeout` seconds) or with what else
    went wrong. Cancelling it cancels the connecting."""
    opening = link.open(reactor, args, topics)
    if timeout is not None:
        opening.addTimeout(timeout, reactor)

    def failed(reason: Failure) -> Failure:
        if reason.check(defer.TimeoutError):
            raise ToolError(f"no connection to {args.address} within {timeout:g} s",
                            EXIT_TIMEOUT)
        from wireproto.transports.websocket import HandshakeFailed

        if reason.check(error.ConnectionRefusedError, error.DNSLookupError, error.NoRouteError):
            raise ToolError(f"cannot reach {args.address}: {reason_text(reason.value)}",
                            EXIT_UNREACHABLE)
        if reason.check(error.ConnectError) and not reason.check(HandshakeFailed):
            # Twisted's own words for it (a unix socket that is not there) name no address.
            said = reason.value.args[0] if reason.value.args else reason_text(reason.value)
            raise ToolError(f"cannot reach {args.address}: {said}", EXIT_UNREACHABLE)
        return reason

    return opening.addErrback(failed)


async def close_link(link: Link, reactor: Any, timeout: float) -> BaseException | None:
    closing = link.close()
    closing.addTimeout(timeout, reactor)
    try:
        return await closing
    except defer.TimeoutError:
        raise ToolError(f"the connection did not close within {timeout:g} s",
                        EXIT_TIMEOUT) from None
