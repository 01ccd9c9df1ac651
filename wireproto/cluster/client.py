"""A NATS client as a Twisted protocol: publish, subscribe (with queue groups), request/reply
with "no responders", TLS, credentials, and reconnection that subscribes again.

docs/cluster.md says why the broker speaks NATS through this rather than nats-py under the
asyncio reactor, with the measurements. What the client does while the server is away is
simple and counted: a publish is dropped (`dropped`), never queued to be sent twice, and every
subscription is made again once a server is back.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.cluster.connection import (
    ERRORS_THAT_KEEP_THE_CONNECTION,
    NatsConnection,
    NatsError,
    NatsOptions,
    NatsUnavailable,
    NoResponders,
    Server,
    why_closed,
)
from wireproto.codecs.nats import (
    Sub,
    Unsub,
    encode,
    encode_pub,
    header_status,
)
from wireproto.protocols.rpc import PendingRequests
from wireproto.transports.reconnect import Reconnector, Rotation, backoff_per_round

__all__ = [
    "NatsOptions",
    "NatsClient",
    "NatsError",
    "NoResponders",
    "NatsUnavailable",
    "MessageHandler",
]

log = Logger(namespace="wireproto.cluster")

# handler(subject, reply, headers, payload)
MessageHandler = Callable[[str, "str | None", "bytes | None", bytes], object]

class NatsClient:
    """A NATS client that keeps itself connected to one of `options.servers`.

    `subscribe` and `unsubscribe` hold while the client reconnects: each subscription is made
    again on every new connection. `publish` returns False (and counts the message in `dropped`)
    while no server is connected, or when the server has not read `max_pending_bytes`.
    """

    def __init__(self, reactor: Any, options: NatsOptions) -> None:
        if not options.servers:
            raise ValueError("no NATS servers")
        self.reactor = reactor
        self.options = options
        self.servers = [Server.parse(url) for url in options.servers]
        self.connection: NatsConnection | None = None
        self._pending: NatsConnection | None = None
        self._sids = itertools.count(1)
        # sid -> (subject, queue, handler)
        self._subscriptions: dict[int, tuple[str, str | None, MessageHandler]] = {}
        self._inbox = f"_INBOX.{secrets.token_hex(8)}."
        self._inbox_sid: int | None = None
        # Reply subject -> who records the reply (requests made with a recorder).
        self._recorders: dict[str, Any] = {}
        # Requests that take an acknowledgement: token -> how to read one, token -> who sent
        # it, and who acknowledged -> its requests waiting on their answers.
        self._acknowledging: dict[str, Callable[[bytes], str | None]] = {}
        self._acknowledger: dict[str, str] = {}
        self._acknowledged: dict[str, dict[str, None]] = {}
        self._requests = PendingRequests(reactor)
        self._waiting_ready: list[defer.Deferred] = []
        # Round the servers, with those the servers name as they are learnt.
        rotation = Rotation(self.servers)
        self._reconnector: Reconnector[Server] = Reconnector(
            reactor, self._connect, targets=rotation,
            retry_policy=backoff_per_round(rotation, options.reconnect_wait,
                                           options.max_reconnect_wait),
            what="NATS", log_retries=False,
        )
        # Connections made again after one was lost (the first connection is not one).
        self.reconnects = 0
        self.published = self.dropped = self.received = 0
        # When the last connection was lost, while none has been made since.
        self._lost_at: float | None = None
        # The largest message the server takes (its INFO says; a larger one would close the
        # connection, so it is dropped here and counted in `too_large`).
        self.max_payload = 1 << 20
        self.too_large = 0
        self.last_error: str | None = None
        # Told of each connection made and lost: on_ready(), on_lost(reason text).
        self.on_ready: Callable[[], object] | None = None
        self.on_lost: Callable[[str], object] | None = None

    # -- running ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._reconnector.start()

    @property
    def stopped(self) -> bool:
        return not self._reconnector.running

    def when_ready(self) -> defer.Deferred:
        """Fires once a server is connected (at once if one is)."""
        if self.connection is not None:
            return defer.succeed(self)
        d: defer.Deferred = defer.Deferred()
        self._waiting_ready.append(d)
        return d

    def stop(self) -> defer.Deferred:
        """Close the connection and stop reconnecting; fires when it has closed."""
        self._reconnector.stop()
        for connection in (self.connection, self._pending):
            if connection is not None and connection.transport is not None:
                closed: defer.Deferred = defer.Deferred()
                connection._on_closed = closed  # type: ignore[attr-defined]
                connection.write_outgoing()  # sent before the close, as if written already
                if connection.ready:
                    # A TLS transport does not close while a producer is registered.
                    connection.wire.unregisterProducer()
                connection.wire.loseConnection()
                return closed
        return defer.succeed(None)

    @property
    def connected(self) -> bool:
        return self.connection is not None

    # -- publishing and subscribing ----------------------------------------------------------------

    def publish(self, subject: str, payload: bytes, *, reply: str | None = None,
                headers: bytes | None = None) -> bool:
        connection = self.connection
        if connection is None:
            self.dropped += 1
            return False
        data = encode_pub(subject, payload, reply, headers)
        if len(payload) + (len(headers) if headers else 0) > self.max_payload:
            self.dropped += 1
            self.too_large += 1
            return False
        backlog = connection.backlog
        if backlog is not None:
            if backlog + len(data) > self.options.max_pending_bytes:
                self.dropped += 1
                return False
            connection.backlog = backlog + len(data)
        connection.send(data)
        self.published += 1
        return True

    def subscribe(self, subject: str, handler: MessageHandler, *,
                  queue: str | None = None) -> int:
        """Call `handler(subject, reply, headers, payload)` for each message on `subject` (which
        may have wildcards); with `queue`, the message goes to one member of that queue group.
        Returns the subscription's id, for `unsubscribe`."""
        sid = next(self._sids)
        self._subscriptions[sid] = (subject, queue, handler)
        if self.connection is not None:
            self.connection.send(encode(Sub(subject, sid, queue)))
        return sid

    def unsubscribe(self, sid: int) -> None:
        if self._subscriptions.pop(sid, None) is not None and self.connection is not None:
            self.connection.send(encode(Unsub(sid)))

    def flush(self) -> defer.Deferred:
        """Fires once the server has read everything written before (a PING's PONG)."""
        if self.connection is None:
            return defer.fail(NatsUnavailable("no NATS server is connected"))
        return self.connection.ping()

    def request(self, subject: str, payload: bytes, *, timeout: float,
                headers: bytes | None = None, recorder: Any = None,
                acknowledgement: Callable[[bytes], str | None] | None = None) -> defer.Deferred:
        """Publish a request and fire with the first reply as ``(headers, payload)``; fails with
        NoResponders if no one subscribes to `subject`, RequestTimeout after `timeout`, or
        NatsUnavailable while no server is connected. A `recorder`
        (wireproto.cluster.callcapture.CallCapture) is told of the request sent and of its
        reply, each as ``(subject, reply, headers, payload)``.

        With `acknowledgement`, the one who takes the request may first acknowledge it: for a
        reply with headers, `acknowledgement(headers)` is None if it is the answer, else who
        sent it ("" for no one that can be named); the request then waits on for its answer,
        and `fail_acknowledged` can fail it. An acknowledgement is not recorded."""
        if self.connection is None:
            return defer.fail(NatsUnavailable("no NATS server is connected"))
        if self._inbox_sid is None:
            self._inbox_sid = self.subscribe(self._inbox + "*", self._reply)
        token = self._requests.next_id()
        d = self._requests.add(token, timeout=timeout, what=subject)
        if acknowledgement is not None:
            self._acknowledging[str(token)] = acknowledgement
            d.addBoth(self._settled, str(token))
        inbox = f"{self._inbox}{token}"
        if not self.publish(subject, payload, reply=inbox, headers=headers):
            self._requests.fail(token, NatsUnavailable(f"could not send the request on "
                                                      f"{subject!r}"))
        elif recorder is not None:
            recorder.sent(subject, inbox, headers, payload)
            self._recorders[inbox] = recorder
            d.addBoth(lambda result: (self._recorders.pop(inbox, None), result)[1])
        return d

    def acknowledged(self, by: str) -> int:
        """How many requests `by` acknowledged and has not answered."""
        return len(self._acknowledged.get(by, ()))

    def fail_acknowledged(self, by: str, error: Exception) -> int:
        """Fail with `error` every request that `by` acknowledged and has not answered; how
        many."""
        tokens = self._acknowledged.pop(by, {})
        return sum(self._requests.fail(token, error) for token in list(tokens))

    def _settled(self, result: object, token: str) -> object:
        del self._acknowledging[token]
        by = self._acknowledger.pop(token, None)
        tokens = self._acknowledged.get(by) if by else None
        if by and tokens is not None:
            tokens.pop(token, None)
            if not tokens:
                del self._acknowledged[by]
        return result

    def gather(self, subject: str, payload: bytes, *, expected: int,
               timeout: float) -> defer.Deferred:
        """Publish a request that many subscribers answer; fire with every reply's payload that
        came, once `expected` have come or after `timeout` seconds, whichever is first."""
        if self.connection is None:
            return defer.fail(NatsUnavailable("no NATS server is connected"))
        replies: list[bytes] = []
        done: defer.Deferred = defer.Deferred()
        inbox = f"_INBOX.{secrets.token_hex(8)}"

        def finish() -> None:
            if not done.called:
                self.unsubscribe(sid)
                if timer.active():
                    timer.cancel()
                done.callback(replies)

        def received(subject: str, reply: str | None, headers: bytes | None,
                     answer: bytes) -> None:
            replies.append(answer)
            if len(replies) >= expected:
                finish()

        sid = self.subscribe(inbox, received)
        timer = self.reactor.callLater(timeout, finish)
        if expected <= 0 or not self.publish(subject, payload, reply=inbox):
            finish()
        return done

    def _reply(self, subject: str, reply: str | None, headers: bytes | None,
               payload: bytes) -> None:
        token = subject[len(self._inbox):]
        acknowledgement = self._acknowledging.get(token) if headers is not None else None
        if acknowledgement is not None and headers is not None:
            by = acknowledgement(headers)
            if by is not None:
                if by and token not in self._acknowledger:  # the first to take it did
                    self._acknowledger[token] = by
                    self._acknowledged.setdefault(by, {})[token] = None
                return
        recorder = self._recorders.get(subject)
        if recorder is not None:
            recorder.received(subject, reply, headers, payload)
        if headers is not None and not payload and header_status(headers) == 503:
            self._requests.fail(token, NoResponders("no responders"))
        else:
            self._requests.resolve(token, (headers, payload))

    # -- the connection's life -------------------------------------------------------------------

    def _connect(self, server: Server) -> defer.Deferred:
        """One attempt: fires once `server` has answered the CONNECT; fails if it cannot be
        reached, or if the connection closes first."""
        endpoint = HostnameEndpoint(self.reactor, server.host, server.port,
                                    timeout=self.options.connect_timeout)
        factory = Factory.forProtocol(lambda: NatsConnection(self, server))
        attempt: defer.Deferred = endpoint.connect(factory)
        attempt.addCallback(lambda connection: connection.handshaken)
        return attempt.addErrback(self._failed, server)

    def _failed(self, reason: Failure, server: Server) -> Failure:
        if reason.check(defer.CancelledError) or self.stopped:
            # Stopped: an attempt still under way fails as the reactor stops (its name
            # lookup's threads go), which is no news.
            return reason
        why = reason.getErrorMessage()
        self.last_error = why
        attempts = self._reconnector.failed_attempts + 1
        if attempts == 1 or attempts % 50 == 0:
            log.warn("cannot reach NATS server {server}: {why}; retrying",
                     event="cluster_unreachable", server=self.describe(server), why=why,
                     attempts=attempts)
        return reason

    def connection_opened(self, connection: NatsConnection) -> None:
        self._pending = connection

    def connection_ready(self, connection: NatsConnection) -> None:
        if self.stopped:
            return  # stop() is closing it
        self._reconnector.connected()
        connection.handshaken.callback(connection)
        self._pending = None
        self.connection = connection
        commands = [encode(Sub(subject, sid, queue))
                    for sid, (subject, queue, _) in self._subscriptions.items()]
        if commands:
            connection.send(b"".join(commands))
        self.learn_servers(connection.info)
        self.max_payload = int(connection.info.get("max_payload") or self.max_payload)
        lost_at, self._lost_at = self._lost_at, None
        if lost_at is None:
            log.info("connected to NATS server {server}", event="cluster_connected",
                     server=self.describe(connection.server), away=None)
        else:
            self.reconnects += 1
            log.info("connected to NATS server {server} again, after {away:.1f} s without one",
                     event="cluster_connected", server=self.describe(connection.server),
                     away=self.reactor.seconds() - lost_at)
        waiting, self._waiting_ready = self._waiting_ready, []
        for d in waiting:
            d.callback(self)
        if self.on_ready is not None:
            self.on_ready()

    def learn_servers(self, info: Mapping[str, object]) -> None:
        """Add the cluster's other servers, as the server tells them (connect_urls)."""
        known = {(server.host, server.port) for server in self.servers}
        tls = any(server.tls for server in self.servers)
        addresses = info.get("connect_urls")
        for address in addresses if isinstance(addresses, list) else ():
            try:
                server = Server.parse(f"{'tls' if tls else 'nats'}://{address}")
            except ValueError:
                continue
            if (server.host, server.port) not in known:
                self.servers.append(server)
                known.add((server.host, server.port))

    def server_error(self, connection: NatsConnection, text: str) -> None:
        self.last_error = text
        if not text.lower().startswith(ERRORS_THAT_KEEP_THE_CONNECTION):
            connection.error = text
        log.warn("NATS server {server}: {error}", event="cluster_server_error",
                 server=self.describe(connection.server), error=text)

    def connection_closed(self, connection: NatsConnection, reason: Failure | None) -> None:
        on_closed = getattr(connection, "_on_closed", None)
        why = why_closed(connection, reason)
        if connection is self._pending:
            self._pending = None
        if not connection.handshaken.called:
            connection.handshaken.errback(NatsUnavailable(why))
        if connection is self.connection:
            self.connection = None
            self._requests.fail_all(NatsUnavailable("the NATS connection closed"))
            if not self.stopped:
                self._lost_at = self.reactor.seconds()
                log.warn("lost NATS server {server}: {why}; reconnecting",
                         event="cluster_disconnected", server=self.describe(connection.server),
                         why=why)
                self._reconnector.lost()
            if self.on_lost is not None:
                self.on_lost(why)
        if on_closed is not None:
            on_closed.callback(None)

    def message(self, subject: str, sid: int, reply: str | None, headers: bytes | None,
                 payload: bytes) -> None:
        self.received += 1
        subscription = self._subscriptions.get(sid)
        if subscription is None:
            return
        try:
            subscription[2](subject, reply, headers, payload)
        except Exception:
            log.failure("NATS subscriber of {subject!r} raised", event="callback_failed",
                        subject=subscription[0])

    @staticmethod
    def describe(server: Server) -> str:
        return f"{'tls' if server.tls else 'nats'}://{server.host}:{server.port}"

    def __repr__(self) -> str:
        state = "connected" if self.connected else "disconnected"
        return f"<NatsClient {state} {', '.join(map(self.describe, self.servers))}>"

