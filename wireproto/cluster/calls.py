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

What a call carries is the protocol's business (`answer_remote_call` makes the reply's bytes);
this module adds who is calling (`RemoteCaller`) and bounds how many calls from elsewhere a
process works on at once (`[cluster] max_remote_calls`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgpack
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.access.policy import Principal
from wireproto.cluster.client import NoResponders
from wireproto.codecs.nats import header_values, headers_block
from wireproto.codecs.wpheader import STATUS_HEADER
from wireproto.protocols.rpc import CallNotServed, CallRefused

if TYPE_CHECKING:
    from wireproto.cluster.link import ClusterLink
    from wireproto.hub import Session

__all__ = ["CallServer", "RemoteCaller", "RemoteCalls"]

log = Logger(namespace="wireproto.cluster")

QUEUE_GROUP = "wireproto"
BUSY = headers_block({STATUS_HEADER: "busy"})
FAILED = headers_block({STATUS_HEADER: "failed"})


class CallServer(Protocol):
    """What a protocol server that answers calls from other processes provides."""

    def served_calls(self) -> list[Any]:
        """The names (or route patterns) this server answers, in its order; msgpack values."""

    def call_subject_name(self, name: Any) -> str | None:
        """The name's part of its subject: a topic-like string, or None for the protocol's
        unnamed call (UBRE's default handler)."""

    def answer_remote_call(self, name: Any, request: bytes,
                           caller: RemoteCaller) -> defer.Deferred:
        """Answer a call made on another process; fires with the reply's bytes."""


@dataclass(frozen=True)
class RemoteCaller:
    """The client behind a call made on another broker process: what a handler gets where it
    would get the calling connection. It cannot be written to; `remote` is True.

    `protocol` is the caller's protocol, `peer` its address as that process saw it, `session`
    its session id there, `client` the protocol's own name for it (a nydus id), `principal`
    who it authenticated as, and `node` the process (its cluster origin)."""

    protocol: str
    peer: str
    session: int
    client: str | None
    principal: Principal
    node: str
    remote = True

    def pack(self) -> list:
        principal = self.principal
        return [self.protocol, self.peer, self.session, self.client, principal.name,
                sorted(principal.roles), principal.client_id, self.node]

    @classmethod
    def unpack(cls, fields: list) -> RemoteCaller:
        protocol, peer, session, client, name, roles, client_id, node = fields
        return cls(protocol, peer, session, client,
                   Principal(name=name, roles=frozenset(roles), client_id=client_id), node)

    @classmethod
    def of(cls, session: Session, node: str) -> RemoteCaller:
        return cls(session.protocol, session.peer, session.id, session.client, session.principal,
                   node)


class RemoteCalls:
    """One process's side of calls across the cluster: serving its names, calling the others'."""

    def __init__(self, link: ClusterLink) -> None:
        self.link = link
        self.client = link.client
        self.subjects = link.subjects
        self.roster = link.roster
        self.timeout = link.settings.call_timeout
        self.max_answering = link.settings.max_remote_calls
        # subject -> (sid, protocol, name)
        self._serving: dict[str, tuple[int, str, Any]] = {}
        # Calls from elsewhere being answered here now.
        self.answering = 0
        self.answered = self.refused = 0
        self.made = 0
        # protocol -> names the other processes serve, and a count bumped when they change
        self._elsewhere: dict[str, list] | None = None
        self.version = 0
        # With capture on: records the calls made and answered (wireproto.cluster.callcapture).
        self.recorder: Any = None
        self.roster.on_change.append(self._others_changed)

    # -- serving -----------------------------------------------------------------------------------

    def subject(self, protocol: str, server: CallServer, name: Any) -> str:
        return self.subjects.call(protocol, server.call_subject_name(name))

    def refresh(self) -> None:
        """Subscribe to what this process's servers answer now, and announce it."""
        wanted: dict[str, tuple[str, Any]] = {}
        announced: dict[str, list] = {}
        for protocol, server in self.link.hub.call_servers.items():
            names = server.served_calls()
            if names:
                announced[protocol] = names
            for name in names:
                wanted[self.subject(protocol, server, name)] = (protocol, name)
        for subject in [subject for subject in self._serving if subject not in wanted]:
            self.client.unsubscribe(self._serving.pop(subject)[0])
        for subject, (protocol, name) in wanted.items():
            if subject not in self._serving:
                sid = self.client.subscribe(
                    subject, self._handler(protocol, name), queue=QUEUE_GROUP)
                self._serving[subject] = (sid, protocol, name)
        self.roster.announce(msgpack.packb({"calls": announced}) if announced else b"")

    def stop(self) -> None:
        for sid, _, _ in self._serving.values():
            self.client.unsubscribe(sid)
        self._serving.clear()
        if self._others_changed in self.roster.on_change:
            self.roster.on_change.remove(self._others_changed)

    def serving(self) -> list[str]:
        """The subjects this process answers calls on."""
        return list(self._serving)

    def _handler(self, protocol: str, name: Any) -> Any:
        def received(subject: str, reply: str | None, headers: bytes | None,
                     payload: bytes) -> None:
            if self.recorder is not None:
                self.recorder.received(subject, reply, headers, payload)
            self._answer(protocol, name, reply, payload)

        return received

    def _answer(self, protocol: str, name: Any, reply: str | None, payload: bytes) -> None:
        if reply is None:
            return  # a publish, not a request: no one to answer
        if self.answering >= self.max_answering:
            self.refused += 1
            self._send_reply(reply, b"", BUSY)
            return
        server = self.link.hub.call_servers.get(protocol)
        try:
            fields, request = msgpack.unpackb(payload)
            caller = RemoteCaller.unpack(fields)
        except (ValueError, TypeError, msgpack.UnpackException):
            log.warn("cluster: a call to {protocol} {name!r} that is not wireproto's; ignored",
                     event="cluster_refused", protocol=protocol, name=name)
            return
        if server is None:
            self._send_reply(reply, b"", FAILED)
            return
        self.answering += 1
        d = defer.maybeDeferred(server.answer_remote_call, name, request, caller)
        d.addCallbacks(lambda answer: self._reply(reply, answer),
                       lambda failure: self._failed(reply, protocol, name, failure))

    def _reply(self, reply: str, answer: bytes) -> None:
        self.answering -= 1
        self.answered += 1
        self._send_reply(reply, answer)

    def _failed(self, reply: str, protocol: str, name: Any, failure: Failure) -> None:
        self.answering -= 1
        log.failure("cluster: answering a {protocol} call to {name!r} failed", failure,
                    protocol=protocol, name=name)
        self._send_reply(reply, b"", FAILED)

    def _send_reply(self, reply: str, answer: bytes, headers: bytes | None = None) -> None:
        self.client.publish(reply, answer, headers=headers)
        if self.recorder is not None:
            self.recorder.sent(reply, None, headers, answer)

    # -- calling -----------------------------------------------------------------------------------

    def call(self, protocol: str, name: Any, request: bytes, session: Session) -> defer.Deferred:
        """Ask a process that serves `name` (as the protocol's servers name what they serve)
        of `protocol`; fires with its reply's bytes. Fails with CallNotServed when no process
        serves it, CallRefused, RequestTimeout after [cluster] call_timeout, or
        NatsUnavailable while NATS is out of reach."""
        return self.call_as(RemoteCaller.of(session, self.link.origin), protocol, name, request)

    def call_as(self, caller: RemoteCaller, protocol: str, name: Any,
                request: bytes) -> defer.Deferred:
        """`call` for a caller that is no connection (the admin API)."""
        payload = msgpack.packb([caller.pack(), request])
        self.made += 1
        subject = self.subject(protocol, self.link.hub.call_servers[protocol], name)
        d = self.client.request(subject, payload, timeout=self.timeout,
                                recorder=self.recorder)
        return d.addCallbacks(self._answered, self._not_answered)

    @staticmethod
    def _answered(answer: tuple[bytes | None, bytes]) -> bytes:
        headers, payload = answer
        if headers is not None:
            status = header_values(headers).get(STATUS_HEADER)
            if status:
                raise CallRefused(status)
        return payload

    @staticmethod
    def _not_answered(failure: Failure) -> Failure:
        if failure.check(NoResponders):
            raise CallNotServed("no broker process serves this call")
        return failure

    # -- what the others serve ---------------------------------------------------------------------

    def _others_changed(self) -> None:
        self._elsewhere = None
        self.version += 1

    def elsewhere(self, protocol: str) -> list:
        """The names (or routes) of `protocol` that other live processes serve, in the order of
        their origins and then their own order, each once."""
        if self._elsewhere is None:
            collected: dict[str, dict[Any, None]] = {}
            announced = self.roster.announced
            for origin in sorted(announced):
                payload = announced[origin]
                if not payload:
                    continue
                try:
                    calls = msgpack.unpackb(payload, use_list=False).get("calls") or {}
                except (ValueError, TypeError, AttributeError, msgpack.UnpackException):
                    continue
                for name_protocol, names in calls.items():
                    served = collected.setdefault(name_protocol, {})
                    for name in names:
                        served[name] = None
            self._elsewhere = {key: list(names) for key, names in collected.items()}
        return self._elsewhere.get(protocol, [])
