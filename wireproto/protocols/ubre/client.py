"""The UBRE client role: subscribe with callbacks, publish, requests with timeouts, handlers for
the server's requests, and optional reconnection.

A `UbreClient` outlives its connections, as a ubre.js instance outlives its sockets. With
``reconnect=True`` it reconnects with backoff, subscribes again to everything it subscribed to,
and holds what is published or requested while it is disconnected in a bounded queue, sent on
reconnection. A request already sent when the connection drops fails with `ConnectionClosed`:
its reply can never come.

    client = await connect(reactor, "ws://127.0.0.1:8765/ubre")
    client.subscribe("news", lambda message: print(message.body))
    await client.publish("news", {"title": "hello"})
    total = await client.request("add", [1, 2], timeout=5)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from types import EllipsisType
from typing import Any, Literal

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.codecs import ubre
from wireproto.codecs.ubre import NO_BODY, Publish, Subscribe, Unsubscribe
from wireproto.errors import LimitExceeded, ProtocolError
from wireproto.protocols.client import ClientBase
from wireproto.protocols.rpc import DEFAULT_REQUEST_TIMEOUT, ConnectionClosed, RequestTimeout
from wireproto.protocols.ubre.peer import (
    Handler,
    HandlerRegistry,
    UbrePeer,
    incoming_body,
    outgoing_body,
)
from wireproto.transports.connect import connect as connect_messages
from wireproto.transports.connect import is_websocket_address
from wireproto.transports.reconnect import DEFAULT_RETRY

__all__ = [
    "DEFAULT_OFFLINE_QUEUE",
    "OfflineQueueFull",
    "Subscription",
    "UbreClient",
    "UbreClientProtocol",
    "connect",
]

log = Logger()

DEFAULT_OFFLINE_QUEUE = 1000

Callback = Callable[[Publish], object]


class OfflineQueueFull(LimitExceeded):
    """Disconnected, and the queue of what waits for the next connection is full."""


class Subscription:
    """One callback on one topic; `cancel()` removes it (and unsubscribes when it is the last)."""

    def __init__(self, client: UbreClient, topic: str, callback: Callback | None) -> None:
        self.client = client
        self.topic = topic
        self.callback = callback

    def cancel(self) -> None:
        self.client._cancel(self)

    unsubscribe = cancel  # ubre.js's name


class UbreClientProtocol(UbrePeer):
    """One connection of a `UbreClient`."""

    def __init__(self, client: UbreClient) -> None:
        super().__init__(client)
        self.client = client
        self.binary_format = client.binary

    def handlerArgument(self) -> Any:
        return self.client

    def connectionMade(self) -> None:
        self.client._connected(self)

    def send(self, message: ubre.Message) -> None:
        self._write(ubre.encode(message, binary=self.binary_format), self.binary_format)

    def publishReceived(self, message: Publish, data: bytes, binary_format: bool) -> None:
        self.client._published(
            Publish(message.topic, incoming_body(message.body, binary_format),
                    streaming=message.streaming)
        )

    def subscribeReceived(self, message: Subscribe, binary_format: bool) -> None:
        self.client.server_topics.add(message.topic)
        self.client._hook("on_subscribe", message.topic,
                          incoming_body(message.body, binary_format))

    def unsubscribeReceived(self, message: Unsubscribe, binary_format: bool) -> None:
        self.client.server_topics.discard(message.topic)
        self.client._hook("on_unsubscribe", message.topic,
                          incoming_body(message.body, binary_format))

    def connectionLost(self, reason: Failure) -> None:
        # The client first, so code that a failing request resumes sees it disconnected (and,
        # with reconnect, a retry goes to the offline queue, not to this dead connection).
        self.client._disconnected(self, reason)
        super().connectionLost(reason)


# What waits for a connection: a publish, or a request (its handler name, body and deadline).
_QueuedPublish = tuple[Literal["publish"], Publish, "defer.Deferred[None]"]
_QueuedRequest = tuple[Literal["request"], str | None, Any, float | None, "defer.Deferred[Any]"]
_Queued = _QueuedPublish | _QueuedRequest


class UbreClient(ClientBase[UbreClientProtocol], HandlerRegistry):
    """A UBRE client, connected or (with `reconnect`) reconnecting.

    `address` is a ``ws://``/``wss://`` URL or a client endpoint string. On a stream the framing
    is ``lines`` for JSON and ``length32`` for the binary format, unless `framing` says otherwise
    (``cobs`` on ``serial:``). With ``binary=True`` bodies are bytes and requests carry no name.
    `connect_options` go to `wireproto.transports.connect` (framing, WebSocket and TLS options).
    """

    what = "UBRE client"

    def __init__(
        self,
        reactor: Any,
        address: str,
        *,
        binary: bool = False,
        reconnect: bool = False,
        retry_policy: Callable[[int], float] = DEFAULT_RETRY,
        request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
        offline_queue: int = DEFAULT_OFFLINE_QUEUE,
        max_pending_requests: int = 1000,
        debug: bool = False,
        **connect_options: Any,
    ) -> None:
        super().__init__(reactor, address, reconnect=reconnect, retry_policy=retry_policy)
        self.binary = binary
        self.request_timeout = request_timeout
        self.offline_queue = offline_queue
        self.max_pending_requests = max_pending_requests
        self.debug = debug
        if not is_websocket_address(address) and connect_options.get("framing") is None:
            connect_options["framing"] = (
                "cobs" if address.startswith("serial:") else "length32" if binary else "lines"
            )
        self.connect_options = connect_options
        self.handlers: dict[str, Handler] = {}
        self.default_handler: Handler | None = None
        # topic -> its subscriptions, and the subscribe message sent on each connection
        self._subscriptions: dict[str, tuple[list[Subscription], Subscribe]] = {}
        self.server_topics: set[str] = set()
        self._queue: deque[_Queued] = deque()

    # -- hooks: replace them (on_connect and on_disconnect are ClientBase's) ---------------------

    def on_subscribe(self, topic: str, body: Any) -> None:
        """The server said it wants `topic` (a broker says so for every topic it has
        subscribers for)."""

    def on_unsubscribe(self, topic: str, body: Any) -> None:
        """The server no longer wants `topic`."""

    # -- connecting ------------------------------------------------------------------------------

    def _connect_once(self) -> defer.Deferred:
        return connect_messages(
            self.reactor, self.address, lambda: UbreClientProtocol(self), **self.connect_options
        )

    def _on_connected(self, protocol: UbreClientProtocol) -> None:
        for _, message in self._subscriptions.values():
            protocol.send(message)
        self._flush()

    def _on_disconnected(self, reason: Failure, final: bool) -> None:
        self.server_topics.clear()
        if final:
            self._fail_queue(ConnectionClosed(
                f"the UBRE connection closed: {reason.getErrorMessage()}"
            ))

    # -- pub/sub ---------------------------------------------------------------------------------

    def subscribe(
        self, topic: str, callback: Callback | None = None, *, body: Any = NO_BODY
    ) -> Subscription:
        """Call `callback` with each message published on `topic` (a `ubre.Publish` whose body is
        decoded JSON, or bytes in the binary format). The subscribe carries `body` if given.
        UBRE has no acknowledgement, so this returns at once; the subscribe is sent now, or on
        the next connection."""
        if not isinstance(topic, str):
            raise TypeError(f"a UBRE topic is a str, not {type(topic).__name__}")
        subscription = Subscription(self, topic, callback)
        entry = self._subscriptions.get(topic)
        if entry is None:
            message = Subscribe(topic, outgoing_body(body, self.binary))
            ubre.encode(message, binary=self.binary)  # refused now, not on a reconnection
            self._subscriptions[topic] = ([subscription], message)
            if self.protocol is not None:
                self.protocol.send(message)
        else:
            entry[0].append(subscription)
        return subscription

    def unsubscribe(self, topic: str, *, body: Any = NO_BODY) -> None:
        """Drop every callback on `topic` and tell the server."""
        if self._subscriptions.pop(topic, None) is not None and self.protocol is not None:
            self.protocol.send(Unsubscribe(topic, outgoing_body(body, self.binary)))

    def _cancel(self, subscription: Subscription) -> None:
        entry = self._subscriptions.get(subscription.topic)
        if entry is None or subscription not in entry[0]:
            return
        entry[0].remove(subscription)
        if not entry[0]:
            self.unsubscribe(subscription.topic)

    def publish(
        self, topic: str, body: Any = NO_BODY, *, streaming: bool = False
    ) -> defer.Deferred:
        """Publish `body` on `topic`. Fires once it is handed to the connection (at once when
        connected); fails with ConnectionClosed, or OfflineQueueFull while reconnecting.
        `streaming` (binary format only) sends body length 0xFFFFFFFF: the body runs to the end
        of the message, whatever its size."""
        if streaming and not self.binary:
            raise ValueError("a streaming body exists only in the binary format (binary=True)")
        body = outgoing_body(body, self.binary)
        if streaming and body is NO_BODY:
            body = b""
        message = Publish(topic, body, streaming=streaming)
        if self.protocol is not None:
            try:
                self.protocol.send(message)
            except ProtocolError as error:
                return defer.fail(error)
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._enqueue(("publish", message, d), d)
        return d

    def _published(self, message: Publish) -> None:
        entry = self._subscriptions.get(message.topic)
        if entry is None:
            return
        for subscription in tuple(entry[0]):
            if subscription.callback is None:
                continue
            try:
                subscription.callback(message)
            except Exception:
                log.failure("ubre client: callback for {topic!r} raised", event="callback_failed",
                            protocol="ubre", topic=message.topic)

    # -- requests --------------------------------------------------------------------------------

    def request(
        self, name: str | None, body: Any = NO_BODY, *, timeout: float | None | EllipsisType = ...
    ) -> defer.Deferred:
        """Ask the server's handler `name` (None: the spec's id-only form, the only one in the
        binary format). Fires with the success body; fails with RequestFailed (its `body` is the
        fail body), RequestTimeout, or ConnectionClosed. `timeout` defaults to the client's
        request_timeout; it counts time spent in the offline queue too."""
        if isinstance(timeout, EllipsisType):  # not given: the client's
            timeout = self.request_timeout
        if self.binary and name is not None:
            # Refused now, connected or not: queued, it could never be sent.
            raise ValueError(
                "a binary-format UBRE request carries only an id, so it cannot name a handler; "
                "pass name=None"
            )
        if self.protocol is not None:
            return self.protocol.request(name, body, timeout=timeout)
        d: defer.Deferred[Any] = defer.Deferred()
        deadline = None if timeout is None else self.reactor.seconds() + timeout
        item: _QueuedRequest = ("request", name, body, deadline, d)
        if not self._enqueue(item, d):
            return d
        if timeout is not None:
            timer = self.reactor.callLater(timeout, self._queued_request_timed_out, item, timeout)
            d.addBoth(lambda result: (timer.active() and timer.cancel(), result)[1])
        return d

    def _queued_request_timed_out(self, item: _QueuedRequest, timeout: float) -> None:
        try:
            self._queue.remove(item)
        except ValueError:
            return
        what = item[1] if item[1] is not None else "request"
        item[4].errback(RequestTimeout(
            f"request {what!r} got no reply within {timeout:g} s (not connected)"
        ))

    # -- the offline queue -----------------------------------------------------------------------

    def _enqueue(self, item: _Queued, d: defer.Deferred[Any]) -> bool:
        if self._reconnector is None or self.closing:
            d.errback(ConnectionClosed("the UBRE client is not connected"))
            return False
        if len(self._queue) >= self.offline_queue:
            d.errback(OfflineQueueFull(
                f"not connected, and {self.offline_queue} messages already wait for the "
                f"connection (offline_queue)"
            ))
            return False
        self._queue.append(item)
        return True

    def _flush(self) -> None:
        protocol = self.protocol
        while self._queue and protocol is self.protocol and protocol is not None:
            item = self._queue.popleft()
            if item[0] == "publish":
                _, message, d = item
                try:
                    protocol.send(message)
                except ProtocolError as error:
                    d.errback(error)
                    continue
                d.callback(None)
            else:
                _, name, body, deadline, d = item
                timeout = None if deadline is None else max(0.0, deadline - self.reactor.seconds())
                try:
                    sent = protocol.request(name, body, timeout=timeout)
                except ValueError as error:  # not something this connection can send
                    d.errback(error)
                    continue
                sent.chainDeferred(d)

    def _fail_queue(self, error: Exception) -> None:
        queue, self._queue = self._queue, deque()
        for item in queue:
            item[-1].errback(error)


def connect(reactor: Any, address: str, **options: Any) -> defer.Deferred[UbreClient]:
    """Connect a `UbreClient` to `address` (a ``ws://``/``wss://`` URL or an endpoint string);
    the Deferred fires with the client once connected. `options` are UbreClient's."""
    return UbreClient(reactor, address, **options).connect()
