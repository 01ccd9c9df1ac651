"""Calls across processes: a UBRE handler or a nydus route on one broker process answers
clients of every process (docs/cluster.md, "Calls").

A protocol server that answers calls registers with its hub (`Hub.add_call_server`) and says
what it serves. For each name it serves, the process subscribes to the name's subject
(``PREFIX.call.PROTOCOL.NAME``, see `Subjects.call`) in the queue group ``wireproto``, so that
each call reaches one of the processes that serve it. A process that gets a call it has no
handler for asks NATS; when no process serves the name, NATS says so at once ("no responders"),
and the client gets its protocol's not-found answer.

Each process also announces what it serves in its heartbeat (wireproto.cluster.roster). nydus
needs that: a route is a pattern, so the calling process matches the path against the routes
that the others serve to find the subject.

A call is a `wireproto.protocols.calls.Call`, and its answer an `Answer`; this module alone
knows how they cross NATS: the request is msgpack ``[caller, path, id, binary, kind, body]``
(the caller as `pack_caller` packs it, the body as `pack_body` does), the answer msgpack
``[succeeded, kind, body]``, and a process that will not answer says why in a ``Wp-Status``
header (``busy`` or ``failed``). It also bounds how many calls from elsewhere a process works
on at once (`[cluster] max_remote_calls`).

A call goes to a queue group, so its caller does not know which process took it until that
process says so: a request carries ``Wp-Call: 2`` (the version of this format its caller
speaks), and a process that cannot answer it at once first replies with an acknowledgement, no
payload and ``Wp-Taken: ORIGIN`` (its origin as the roster knows it), then with the answer on
the same inbox. When the roster forgets a process (its goodbye, or its silence), every call it
took and has not answered fails at once with CallUnavailable, rather than after call_timeout.
A request without ``Wp-Call`` (version 1, wireproto before acknowledgements) gets no
acknowledgement, and a reply without ``Wp-Taken`` is the answer whoever sends it, so processes
of both versions answer each other.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import msgpack
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.access.policy import Principal
from wireproto.cluster.client import NatsClient, NatsUnavailable, NoResponders
from wireproto.cluster.roster import Roster
from wireproto.cluster.subjects import Subjects
from wireproto.codecs.nats import header_values, headers_block
from wireproto.codecs.wpheader import STATUS_HEADER
from wireproto.errors import ProtocolError
from wireproto.protocols.calls import (
    Answer,
    Call,
    CallName,
    CallNotFound,
    CallServer,
    CallTimeout,
    CallTooManyRequests,
    CallUnavailable,
    RemoteCaller,
    pack_body,
    unpack_body,
)
from wireproto.protocols.rpc import RequestTimeout

__all__ = ["RemoteCalls", "pack_caller", "unpack_caller"]

log = Logger(namespace="wireproto.cluster")

QUEUE_GROUP = "wireproto"
BUSY = headers_block({STATUS_HEADER: "busy"})
FAILED = headers_block({STATUS_HEADER: "failed"})
# The version of the call format this process speaks: 2 takes acknowledgements.
VERSION_HEADER = "Wp-Call"
VERSION = 2
ASKING = headers_block({VERSION_HEADER: str(VERSION)})
# Who took a call, in its acknowledgement.
TAKEN_HEADER = "Wp-Taken"
_TAKEN = TAKEN_HEADER.encode()
_ORIGIN = re.compile(r"[A-Za-z0-9_-]+")
_MALFORMED = (ValueError, TypeError, IndexError, ProtocolError, msgpack.UnpackException)


def pack_caller(caller: RemoteCaller, node: str) -> list:
    """`caller` as msgpack values, from the process `node`."""
    principal = caller.principal
    return [caller.protocol, caller.peer, caller.session, caller.client, principal.name,
            sorted(principal.roles), principal.client_id, node]


def unpack_caller(fields: list) -> RemoteCaller:
    protocol, peer, session, client, name, roles, client_id, node = fields
    return RemoteCaller(protocol, peer, session, client,
                        Principal(name=name, roles=frozenset(roles), client_id=client_id), node)


class RemoteCalls:
    """One process's side of calls across the cluster: serving its names, calling the others'.

    `servers` gives the protocol servers of this process that answer calls, by protocol;
    `origin` is this process's name in the callers it sends."""

    def __init__(self, client: NatsClient, subjects: Subjects, roster: Roster, *, origin: str,
                 timeout: float, max_answering: int,
                 servers: Callable[[], Mapping[str, CallServer]]) -> None:
        self.client = client
        self.subjects = subjects
        self.roster = roster
        self.origin = origin
        self.timeout = timeout
        self.max_answering = max_answering
        self.servers = servers
        # subject -> (sid, protocol, name)
        self._serving: dict[str, tuple[int, str, CallName]] = {}
        # Calls from elsewhere being answered here now, by reply subject.
        self._answering: dict[str, None] = {}
        # The acknowledgement's header, made again when this process's origin changes (a
        # fenced process goes on under a new one, and the others know only that).
        self._taken = headers_block({TAKEN_HEADER: roster.origin})
        self._taken_as = roster.origin
        self.answered = self.refused = 0
        self.made = 0
        # protocol -> names the other processes serve, and a count bumped when they change
        self._elsewhere: dict[str, list[CallName]] | None = None
        self.version = 0
        # With capture on: records the calls made and answered (wireproto.cluster.callcapture).
        self.recorder: Any = None
        self.roster.on_change.append(self._others_changed)
        self.roster.on_gone.append(self._gone)

    @property
    def answering(self) -> int:
        """How many calls from elsewhere this process is answering now."""
        return len(self._answering)

    # -- serving -----------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Subscribe to what this process's servers answer now, and announce it."""
        wanted: dict[str, tuple[str, CallName]] = {}
        announced: dict[str, list[CallName]] = {}
        for protocol, server in self.servers().items():
            names = server.served_calls()
            if names:
                announced[protocol] = names
            for name in names:
                wanted[self.subjects.call(protocol, name)] = (protocol, name)
        for subject in [subject for subject in self._serving if subject not in wanted]:
            self.client.unsubscribe(self._serving.pop(subject)[0])
        for subject, (protocol, name) in wanted.items():
            if subject not in self._serving:
                sid = self.client.subscribe(
                    subject, self._handler(protocol, name), queue=QUEUE_GROUP)
                self._serving[subject] = (sid, protocol, name)
        self.roster.announce(msgpack.packb({"calls": announced}) if announced else b"")

    def stop(self) -> None:
        """Serve no more: each call still being answered here is refused now (its answer could
        no longer be sent), so its caller is told at once, whatever its version."""
        for sid, _, _ in self._serving.values():
            self.client.unsubscribe(sid)
        self._serving.clear()
        for reply in list(self._answering):
            self._send_reply(reply, b"", FAILED)
        self._answering.clear()
        if self._others_changed in self.roster.on_change:
            self.roster.on_change.remove(self._others_changed)
        if self._gone in self.roster.on_gone:
            self.roster.on_gone.remove(self._gone)

    def serving(self) -> list[str]:
        """The subjects this process answers calls on."""
        return list(self._serving)

    def _handler(self, protocol: str, name: CallName) -> Any:
        def received(subject: str, reply: str | None, headers: bytes | None,
                     payload: bytes) -> None:
            if self.recorder is not None:
                self.recorder.received(subject, reply, headers, payload)
            self._answer(protocol, name, reply, headers, payload)

        return received

    def _answer(self, protocol: str, name: CallName, reply: str | None, headers: bytes | None,
                payload: bytes) -> None:
        if reply is None or reply in self._answering:
            return  # a publish, not a request (no one to answer), or a copy of one being answered
        if self.answering >= self.max_answering:
            self.refused += 1
            self._send_reply(reply, b"", BUSY)
            return
        try:
            fields, path, call_id, binary, kind, data = msgpack.unpackb(payload)
            caller = unpack_caller(fields)
        except _MALFORMED:
            log.warn("cluster: a call to {protocol} {name!r} that is not wireproto's; ignored",
                     event="cluster_refused", protocol=protocol, name=name)
            return
        try:
            call = Call(protocol, name, unpack_body(kind, data), caller, path=path, id=call_id,
                        binary=bool(binary))
        except _MALFORMED as error:
            # Its caller is told at once, rather than after its call_timeout.
            log.warn("cluster: a call to {protocol} {name!r} whose body cannot be read: "
                     "{error}", event="cluster_refused", protocol=protocol, name=name,
                     error=str(error))
            self._send_reply(reply, b"", FAILED)
            return
        server = self.servers().get(protocol)
        if server is None:
            self._send_reply(reply, b"", FAILED)
            return
        self._answering[reply] = None
        d = defer.maybeDeferred(server.answer, call)
        if not d.called and headers is not None and _version(headers) >= 2:
            # Not recorded in a capture: the capture pairs a call with its answer.
            if self._taken_as != self.roster.origin:
                self._taken_as = self.roster.origin
                self._taken = headers_block({TAKEN_HEADER: self._taken_as})
            self.client.publish(reply, b"", headers=self._taken)
        d.addCallback(self._pack_answer)
        d.addCallbacks(lambda answer: self._reply(reply, answer),
                       lambda failure: self._failed(reply, protocol, name, failure))

    @staticmethod
    def _pack_answer(answer: Answer) -> bytes:
        packed = answer.packed or pack_body(answer.body)
        return msgpack.packb([answer.succeeded, *packed])

    def _reply(self, reply: str, answer: bytes) -> None:
        if reply not in self._answering:
            return  # refused as this process stopped
        del self._answering[reply]
        self.answered += 1
        self._send_reply(reply, answer)

    def _failed(self, reply: str, protocol: str, name: CallName, failure: Failure) -> None:
        if reply not in self._answering:
            return
        del self._answering[reply]
        log.failure("cluster: answering a {protocol} call to {name!r} failed", failure,
                    event="handler_failed", protocol=protocol, name=name)
        self._send_reply(reply, b"", FAILED)

    def _send_reply(self, reply: str, answer: bytes, headers: bytes | None = None) -> None:
        self.client.publish(reply, answer, headers=headers)
        if self.recorder is not None:
            self.recorder.sent(reply, None, headers, answer)

    # -- calling -----------------------------------------------------------------------------------

    def call(self, call: Call) -> defer.Deferred[Answer]:
        """Ask a process that serves `call.name` of `call.protocol`; fires with its Answer.
        Fails with CallNotFound when no process serves it, CallTooManyRequests when the one
        that does is busy, CallTimeout after [cluster] call_timeout, or CallUnavailable while
        NATS is out of reach, when that process could not answer, or as soon as the process
        that took it is gone."""
        try:
            payload = msgpack.packb([pack_caller(call.caller, call.caller.node or self.origin),
                                     call.path, call.id,
                                     call.binary, *pack_body(call.body)])
        except (TypeError, ValueError):
            # A body JSON cannot say (the codec let it in): no process could take it.
            return defer.fail(CallNotFound("the call's body cannot cross to another process"))
        self.made += 1
        d = self.client.request(self.subjects.call(call.protocol, call.name), payload,
                                timeout=self.timeout, headers=ASKING, recorder=self.recorder,
                                acknowledgement=_taken_by)
        return d.addCallbacks(self._answered, self._not_answered)

    def taken_by(self, origin: str) -> int:
        """How many calls made here the process `origin` took and has not answered yet."""
        return self.client.acknowledged(origin)

    def _gone(self, origin: str) -> None:
        failed = self.client.fail_acknowledged(
            origin, CallUnavailable("the process that took it is gone"))
        if failed:
            log.info("cluster: {origin} is gone; {count} calls it took fail as unavailable",
                     event="cluster_calls_orphaned", count=failed, origin=origin)

    @staticmethod
    def _answered(answer: tuple[bytes | None, bytes]) -> Answer:
        headers, payload = answer
        if headers is not None:
            status = header_values(headers).get(STATUS_HEADER)
            if status == "busy":
                raise CallTooManyRequests("the process that serves it is busy")
            if status:
                raise CallUnavailable(f"the process that serves it answered {status!r}")
        try:
            succeeded, kind, data = msgpack.unpackb(payload)
            return Answer(bool(succeeded), unpack_body(kind, data))
        except _MALFORMED:
            raise CallUnavailable("an answer that is not wireproto's") from None

    @staticmethod
    def _not_answered(failure: Failure) -> Failure:
        if failure.check(NoResponders):
            raise CallNotFound("no broker process serves this call")
        if failure.check(RequestTimeout):
            raise CallTimeout(str(failure.value))
        if failure.check(NatsUnavailable):
            raise CallUnavailable(str(failure.value))
        return failure

    # -- what the others serve ---------------------------------------------------------------------

    def _others_changed(self) -> None:
        self._elsewhere = None
        self.version += 1

    def elsewhere(self, protocol: str) -> list[CallName]:
        """The names of `protocol` that other live processes serve, in the order of their
        origins and then their own order, each once."""
        if self._elsewhere is None:
            collected: dict[str, dict[CallName, None]] = {}
            announced = self.roster.announced
            for origin in sorted(announced):
                payload = announced[origin]
                if not payload:
                    continue
                try:
                    calls = msgpack.unpackb(payload).get("calls") or {}
                    for name_protocol, names in calls.items():
                        served = collected.setdefault(str(name_protocol), {})
                        for name in names:
                            if name is None or isinstance(name, str):
                                served[name] = None
                except (ValueError, TypeError, AttributeError, msgpack.UnpackException):
                    continue
            self._elsewhere = {key: list(names) for key, names in collected.items()}
        return self._elsewhere.get(protocol, [])


def _version(headers: bytes) -> int:
    """The version of the call format a request's caller speaks (1 when it does not say)."""
    if headers == ASKING:
        return VERSION
    value = header_values(headers).get(VERSION_HEADER, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 6 else 1


def _taken_by(headers: bytes) -> str | None:
    """Who took a call, if this reply is its acknowledgement (None: it is the answer); "" for
    one that names no process (malformed: it is no answer either)."""
    if _TAKEN not in headers:
        return None
    taker = header_values(headers).get(TAKEN_HEADER, "")
    return taker if _ORIGIN.fullmatch(taker) else ""
