"""The admin API: JSON over HTTP at ``/api/`` on every HTTP listener's port (docs/browser.md).

=======  ==========================  ==========================================================
method   path                        answer
=======  ==========================  ==========================================================
GET      /api/status                 broker, listeners, links, a page of sessions and of topics
GET      /api/whoami                 the admin principal the request was admitted as
GET      /api/listeners              the bound listeners and the attached and Phyllo links
GET      /api/sessions               a page of connections: peer, protocol, principal...
GET      /api/sessions/ID            one connection
POST     /api/sessions/ID/close      close one connection (its will is published)
GET      /api/topics                 a page of topics: subscribers, rates, last values
POST     /api/publish                publish ``{"topic", "payload", "encoding"}`` on the hub
POST     /api/call                   call ``{"protocol", "name", "body"}`` (UBRE or nydus)
GET      /api/tap?pattern=P          the messages on topics P matches, as they pass (NDJSON)
GET      /api/routes                 the UBRE request names and nydus routes /api/call answers
GET      /api/history                the broker's figures each second over the last 10 minutes
=======  ==========================  ==========================================================

The lists are pages, filtered and sorted (`?limit`, `?offset`, `?q`, `?sort`: `listing`).
Every request is admitted by `AdminGate`; a POST must carry a JSON body and come from the
broker's own origin. Errors are JSON too: ``{"error": "..."}`` with the HTTP status.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from wireproto import __version__
from wireproto.access import Principal
from wireproto.admin import listing
from wireproto.admin.gate import PAGE_HEADER, AdminGate, same_origin
from wireproto.admin.history import History, history_answer, merge_rows
from wireproto.admin.listing import SESSIONS, TOPICS, ListingError, ListQuery, Row
from wireproto.admin.payloads import describe_payload
from wireproto.admin.rates import TopicRates
from wireproto.admin.tap import Tap
from wireproto.broker import BrokerView
from wireproto.errors import InvalidTopic
from wireproto.hub import HubMessage, MountedSession, Session
from wireproto.hub.federation import ProcessGroup, Reply
from wireproto.peerlog import describe_address
from wireproto.protocols.calls import NO_BODY, Answer, RemoteCaller
from wireproto.topics import is_pattern, refuse_pattern, validate_pattern
from wireproto.transports.http import HTTPRefusal, admit

__all__ = ["ADMIN_QUESTION", "AdminApi", "ApiError"]

log = Logger(namespace="wireproto.admin")

# The largest request body the API takes (a publish's payload, a call's body).
MAX_BODY = 1 << 20
# A call from the page that gets no answer in this many seconds is answered 504.
CALL_TIMEOUT = 30.0
# What a process of a cluster asks the others for their status or history, or to close a
# session.
ADMIN_QUESTION = "admin"
# The protocols whose calls the page makes.
CALLED = ("ubre", "nydus")
# At most this many bytes of a last value are shown by /api/topics.
SHOWN_VALUE_BYTES = 1024
# The lists of a status asked for nothing but its defaults.
FIRST_SESSIONS = ListQuery(sort="id")
FIRST_TOPICS = ListQuery(sort="topic")


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json(request: Any, status: int, value: Any) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def _finish(request: Any, status: int, value: Any) -> None:
    """Answer a request that waited (a gathered status, a call), if its client still waits."""
    if not request.finished and not request._disconnected:
        request.write(_json(request, status, value))
        request.finish()


def _refused(request: Any, refusal: HTTPRefusal) -> None:
    """A refusal as JSON; the page's own requests get no challenge (it shows its login form)."""
    if refusal.challenge and not request.getHeader(PAGE_HEADER):
        request.setHeader(b"www-authenticate", refusal.challenge.encode("ascii"))
    request.write(_json(request, refusal.status, {"error": str(refusal)}))
    request.finish()


class AdminApi(Resource):
    """The ``/api`` resource of one service (shared by all its HTTP ports)."""

    isLeaf = True
    max_request_body = MAX_BODY

    def __init__(self, service: BrokerView, gate: AdminGate, rates: TopicRates,
                 max_taps: int, *, history: History) -> None:
        super().__init__()
        self.history = history
        self.service = service
        self.hub = service.hub
        self.gate = gate
        self.rates = rates
        self.max_taps = max_taps
        self.taps: set[Tap] = set()
        self.started = time.time()

    @property
    def checks_credentials(self) -> bool:
        """Whether its requests carry credentials (the access log shows no query value)."""
        return self.gate.auth is not None

    # -- dispatch -------------------------------------------------------------------------------

    def render(self, request: Any) -> Any:
        return admit(request, self.gate.principal,
                     lambda principal: self._answer(request, principal), _refused)

    def _answer(self, request: Any, principal: Principal) -> Any:
        method = request.method.decode("ascii", "replace")
        path = [segment.decode("utf-8", "replace") for segment in request.postpath if segment]
        try:
            if method == "GET":
                return self._get(request, path, principal)
            if method == "POST":
                if not same_origin(request):
                    raise ApiError(403, "a request from another origin")
                return self._post(request, path, principal)
            raise ApiError(405, f"{method} is not an admin API method")
        except ApiError as error:
            return _json(request, error.status, {"error": str(error)})

    def _get(self, request: Any, path: list[str], principal: Principal) -> Any:
        whole = _query(request, b"scope") != "process" and self._cluster() is not None
        match path:
            case [] | ["status"]:
                sessions, topics = _list_query(listing.status_queries, request.args)
                if whole:
                    return self._gathered(request, sessions, topics, status=True)
                return _json(request, 200, self.local_status(sessions, topics))
            case ["whoami"]:
                return _json(request, 200, {"name": principal.name,
                                            "roles": sorted(principal.roles)})
            case ["listeners"]:
                return _json(request, 200, self.listeners())
            case ["sessions"]:
                query = _list_query(listing.read_query, request.args, SESSIONS)
                if whole:
                    return self._gathered(request, query, None)
                return _json(request, 200, self.sessions(query))
            case ["sessions", number]:
                return _json(request, 200, self._describe(self._session(number)))
            case ["topics"]:
                query = _list_query(listing.read_query, request.args, TOPICS)
                if whole:
                    return self._gathered(request, None, query)
                return _json(request, 200, self.topics(query))
            case ["tap"]:
                return self._tap(request)
            case ["routes"]:
                return _json(request, 200, self.routes())
            case ["history"]:
                if whole:
                    return self._gathered_history(request)
                return _json(request, 200, history_answer(self.history.rows(), [self.node]))
        raise ApiError(404, f"no admin API at /api/{'/'.join(path)}")

    def _post(self, request: Any, path: list[str], principal: Principal) -> Any:
        match path:
            case ["sessions", number, "close"]:
                node = _query(request, b"node")
                if node is not None and node != self.node:
                    return self._close_elsewhere(request, node, number, principal)
                if not self.close_local(_session_id(number), str(principal.name)):
                    raise ApiError(404, f"no session {number}")
                return _json(request, 200, {"closed": int(number)})
            case ["publish"]:
                return _json(request, 200, self.publish(_body(request), principal))
            case ["call"]:
                return self._call(request, _body(request), principal)
        raise ApiError(404, f"no admin API at POST /api/{'/'.join(path)}")

    # -- the other processes of a cluster ---------------------------------------------------------

    @property
    def node(self) -> str:
        """This process, as the API names it: in a cluster its origin (its node name and a
        token of this start, never shared by two processes)."""
        group = self._cluster()
        return self.service.node if group is None else group.origin

    def _cluster(self) -> ProcessGroup | None:
        group = self.service.cluster
        return group if group is not None and group.running else None

    def _gathered(self, request: Any, sessions: ListQuery | None, topics: ListQuery | None,
                  *, status: bool = False) -> Any:
        """Answer with the page of sessions or of topics of the whole cluster, or its status
        with both: each process gives its first rows of the sessions up to the page's end and
        all the topic rows `topics` finds (`listing`), which are merged here."""
        group = self._cluster()
        assert group is not None
        first = None if sessions is None else sessions.first_rows()
        asked = {"sessions": None if first is None else first.as_message(),
                 "topics": None if topics is None else topics.as_message()}

        def merged(replies: list[Reply]) -> None:
            _finish(request, 200, listing.merge_answers(
                [reply.answer for reply in replies], sessions, topics,
                self._with_last_values, status=status, now=round(time.time(), 3)))

        def failed(failure: Failure) -> None:
            log.failure("gathering the cluster's status failed", failure,
                        event="admin_status_failed")
            _finish(request, 500, {"error": "the cluster's answers could not be merged"})

        own = self.lists_answer(first, topics)
        d = group.ask_others(ADMIN_QUESTION, ["lists", asked], own)
        d.addCallback(merged).addErrback(failed)
        return NOT_DONE_YET

    def _gathered_history(self, request: Request) -> int:
        group = self._cluster()
        assert group is not None
        d = group.ask_others(ADMIN_QUESTION, ["history"], self.history.rows())
        d.addCallback(lambda replies: _finish(request, 200, history_answer(
            merge_rows(reply.answer for reply in replies),
            [reply.origin for reply in replies if isinstance(reply.answer, list)]))).addErrback(
            lambda failure: log.failure("gathering the cluster's history failed", failure,
                                        event="admin_status_failed"))
        return NOT_DONE_YET

    def answer_question(self, request: list[Any]) -> Any:
        """Another process's admin API asks for this one's lists or history, or to close a
        session of this one's; None when the question is not for this process. (``["status"]``
        is an earlier version's question: its status, with the first page of each list.)"""
        if request[0] == "lists":
            return self.lists_answer(ListQuery.from_message(SESSIONS, request[1], "sessions"),
                                     ListQuery.from_message(TOPICS, request[1], "topics"))
        if request == ["status"]:
            return self.local_status()
        if request == ["history"]:
            return self.history.rows()
        if request[0] == "close" and request[1] == self.node:
            return self.close_local(int(request[2]), str(request[3]))
        return None

    def lists_answer(self, sessions: ListQuery | None, topics: ListQuery | None) -> Row:
        """This process's part of the cluster's lists: its status without lists, the
        sessions' rows `sessions` asks for with their counts, and all the topic rows `topics`
        finds (with the names of the others, for the counts)."""
        return {
            "status": self.local_status(None, None),
            "sessions": None if sessions is None else self.sessions(sessions),
            "topics": None if topics is None else listing.topic_list(
                self._topic_rows(), topics, self._pattern_holders()),
        }

    def _pattern_holders(self) -> dict[str, list[int]]:
        """The ids of the sessions that subscribe to each pattern."""
        holders: dict[str, list[int]] = {}
        for session in self.hub.sessions:
            for pattern in session.patterns:
                holders.setdefault(pattern, []).append(session.id)
        return holders

    def _close_elsewhere(self, request: Any, node: str, number: str,
                         principal: Principal) -> Any:
        group = self._cluster()
        if group is None:
            raise ApiError(404, f"no process {node}")
        d = group.ask_others(ADMIN_QUESTION,
                             ["close", node, _session_id(number), str(principal.name)], False)

        def answered(replies: list[Reply]) -> None:
            closed = any(reply.answer is True for reply in replies if reply.origin == node)
            if closed:
                _finish(request, 200, {"closed": int(number)})
            else:
                _finish(request, 404, {"error": f"no session {number} on {node}"})

        d.addCallback(answered)
        return NOT_DONE_YET

    # -- what it shows --------------------------------------------------------------------------

    def local_status(self, sessions: ListQuery | None = FIRST_SESSIONS,
                     topics: ListQuery | None = FIRST_TOPICS) -> Row:
        """This process's broker figures, listeners, links, and the pages of its sessions and
        topics that `sessions` and `topics` ask for (none without them)."""
        hub = self.hub
        stats = hub.stats
        node = self.node
        listed = self.listeners()
        return {
            "broker": {
                "node": node,
                "version": __version__,
                "started": self.started,
                "uptime": round(time.time() - self.started, 3),
                "published": stats.published,
                "delivered": stats.delivered,
                "dropped": stats.dropped_messages,
                "retained": 0 if hub.retained is None else len(hub.retained),
            },
            "nodes": [node],
            "listeners": listed["listeners"],
            "links": [{**link, "node": node} for link in listed["links"]],
            **listing.status_lists({} if sessions is None or topics is None else {
                "sessions": self.sessions(sessions), "topics": self.topics(topics)}),
        }

    def close_local(self, number: int, admin: str) -> bool:
        """Close this process's session `number`; False if it has none."""
        for session in self.hub.sessions:
            if session.id == number:
                self.service.close_session(session, f"closed by admin {admin}")
                return True
        return False

    def listeners(self) -> dict[str, Any]:
        service = self.service
        links: list[dict[str, Any]] = [
            {"kind": "attach", "name": link.protocol, "endpoint": link.endpoint}
            for link in service.config.attach
        ]
        # Every bridge there is now, those a fleet adds as boards come included.
        endpoints = {link.name: link.endpoint for link in service.config.phyllo}
        now = time.time()
        for name, bridge in sorted(service.phyllo.items()):
            health = bridge.health()
            last_frame = health["last_frame"]
            links.append({
                "kind": "phyllo", "name": name,
                "endpoint": endpoints.get(name, endpoints.get(name.rpartition(".")[0], "")),
                "prefix": bridge.prefix, "connected": bridge.connected,
                **bridge.counters(), **health,
                "last_frame_age": None if not isinstance(last_frame, float)
                else round(max(0.0, now - last_frame), 3),
            })
        return {
            "listeners": [
                {"protocol": bound.listener.protocol, "transport": bound.listener.transport,
                 "endpoint": bound.listener.endpoint, "address": bound.address}
                for bound in service.bound
            ],
            "links": links,
        }

    def sessions(self, query: ListQuery) -> Row:
        """The page of this process's sessions that `query` asks for."""
        node, now = self.node, round(time.time(), 3)
        shown, total, matched = listing.session_page(self.hub.sessions, query, node)
        return listing.page(query, [self._describe(session, now) for session in shown],
                            total, matched)

    def _describe(self, session: Session, now: float | None = None) -> Row:
        principal = session.principal
        now = round(time.time(), 3) if now is None else now
        return {
            "id": session.id,
            "node": self.node,
            "protocol": session.protocol,
            "transport": session.transport_name,
            "peer": session.peer,
            "client": session.client,
            "principal": principal.name,
            "roles": sorted(principal.roles),
            "age": listing.age(session.opened_at, now),
            "opened": session.opened_at,
            "subscriptions": sorted(session.topics) + sorted(session.patterns),
            "queued_bytes": session.queued_bytes,
            "queued_messages": session.queued_messages,
            "received": session.received,
            "sent": session.sent,
            "sent_bytes": session.sent_bytes,
            "dropped": session.dropped_messages,
            "will": None if session.will is None else session.will.topic,
            # Where its topics are on the hub (wireproto.hub.mount), or None.
            "mount": session.mount if isinstance(session, MountedSession) else None,
        }

    def _session(self, number: str) -> Session:
        for session in self.hub.sessions:
            if str(session.id) == number:
                return session
        raise ApiError(404, f"no session {number}")

    def topics(self, query: ListQuery) -> Row:
        """The page of this process's topics that `query` asks for."""
        return self._with_last_values(listing.topic_page(
            query, [listing.topic_list(self._topic_rows(), query)]))

    def _topic_rows(self) -> list[Row]:
        """Every topic subscribed to, published on lately or kept, with the sessions a
        message on it reaches; and every pattern subscribed to (``"pattern": true``), with
        the sessions that subscribe to it."""
        hub = self.hub
        patterns = set(hub.patterns())
        rates = self.rates.rates()
        kept = [] if hub.retained is None else hub.retained.topics()
        topics = set(hub.topics()).union(rates, kept).difference(patterns)
        reached = hub.sessions_reached(topics)
        rows = []
        for topic in topics.union(patterns):
            pattern = topic in patterns
            row: Row = {
                "topic": topic,
                "subscribers": hub.pattern_sessions(topic) if pattern else reached[topic],
                "rate": rates.get(topic, 0.0),
            }
            if pattern:
                row["pattern"] = True
            rows.append(row)
        return rows

    def _with_last_values(self, page: Row) -> Row:
        """`page` with its topics' last values, as this process keeps them (in a cluster,
        every process keeps every topic's)."""
        retained = self.hub.retained
        if retained is not None:
            for row in page["items"]:
                kept = retained.get(row["topic"])
                if kept is not None:
                    row["last_value"] = describe_payload(kept[0].payload, SHOWN_VALUE_BYTES)
        return page

    def routes(self) -> dict[str, list[str]]:
        """What `POST /api/call` answers: each UBRE request name and nydus route, of any
        process of the cluster."""
        servers = self.hub.call_servers
        return {protocol: servers[protocol].callable_names() if protocol in servers else []
                for protocol in CALLED}

    # -- what it does ---------------------------------------------------------------------------

    def publish(self, body: dict[str, Any], principal: Principal) -> dict[str, Any]:
        topic = body.get("topic")
        if not isinstance(topic, str) or not topic:
            raise ApiError(400, "publish needs a \"topic\" string")
        if topic.startswith("$"):
            raise ApiError(403, "the $ topics are the broker's own")
        if len(topic) > self.hub.max_topic_length:
            raise ApiError(400, f"a topic of {len(topic)} characters; at most "
                                f"{self.hub.max_topic_length}")
        try:
            refuse_pattern(topic)  # the hub's own test: `tt/a+b` and `tt/#/x` are topics
        except InvalidTopic as error:
            raise ApiError(400, str(error)) from None
        payload = _payload(body.get("payload", ""), body.get("encoding", "text"))
        self.hub.publish(HubMessage(topic, payload, protocol="admin"))
        delivered = self.hub.reached(topic)  # connections: a tap is none
        log.info("admin {principal} published {size} bytes on {topic!r}", event="admin_publish",
                 principal=principal.name, topic=topic, size=len(payload))
        # Delivered here; the others deliver it after this answer (`processes` says how many).
        return {"delivered": delivered, "processes": self.hub.federation.processes()}

    def _call(self, request: Any, body: dict[str, Any], principal: Principal) -> Any:
        protocol = body.get("protocol")
        name = body.get("name")
        if protocol not in CALLED:
            raise ApiError(400, "call needs \"protocol\": \"ubre\" or \"nydus\"")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "call needs a \"name\" (a UBRE request name, a nydus path)")
        server = self.hub.call_servers.get(protocol)
        if server is None:
            raise ApiError(404, f"this broker serves no {protocol} calls")
        caller = RemoteCaller("admin", describe_address(request.getClientAddress()), 0, None,
                              principal, self.service.node)
        d = defer.maybeDeferred(server.call, name, body.get("body"), caller)

        def respond(status: int, value: Any) -> None:
            if timer.active():
                timer.cancel()
            _finish(request, status, value)

        def answered(answer: Answer) -> None:
            body = None if answer.body is NO_BODY else answer.body
            respond(200, {"ok": answer.succeeded, "body": body})

        def failed(failure: Any) -> None:
            log.failure("admin call of {name!r} failed", failure, event="admin_call_failed",
                        name=name)
            respond(500, {"error": failure.getErrorMessage()})

        # The handler goes on; only the page stops waiting for it.
        timer = self.service.reactor.callLater(
            CALL_TIMEOUT, respond, 504, {"error": f"no answer within {CALL_TIMEOUT:g} s"})
        d.addCallbacks(answered, failed)
        return NOT_DONE_YET

    def _tap(self, request: Any) -> Any:
        patterns = request.args.get(b"pattern") or [b"#"]
        pattern = patterns[-1].decode("utf-8", "replace")
        try:
            if is_pattern(pattern):  # else a tap on that one topic, as subscribe_callback takes it
                validate_pattern(pattern)
        except InvalidTopic as error:
            raise ApiError(400, str(error)) from None
        if len(self.taps) >= self.max_taps:
            raise ApiError(503, f"{self.max_taps} taps are open already ([admin] max_taps)")
        tap = Tap(self.hub, pattern, request, self.taps.discard)
        self.taps.add(tap)
        return NOT_DONE_YET

    def close(self) -> None:
        for tap in tuple(self.taps):
            tap.stop()


Parsed = TypeVar("Parsed")


def _list_query(read: Callable[..., Parsed], *args: object) -> Parsed:
    """A list's parameters as `read` reads them; a wrong one is answered 400."""
    try:
        return read(*args)
    except ListingError as error:
        raise ApiError(400, str(error)) from None


def _query(request: Any, name: bytes) -> str | None:
    values = request.args.get(name)
    return values[-1].decode("utf-8", "replace") if values else None


def _session_id(number: str) -> int:
    try:
        return int(number)
    except ValueError:
        raise ApiError(404, f"no session {number}") from None


def _body(request: Any) -> dict[str, Any]:
    kind = (request.getHeader(b"content-type") or b"").split(b";", 1)[0].strip().lower()
    if kind != b"application/json":
        raise ApiError(415, "send the request as application/json")
    try:
        value = orjson.loads(request.content.read())
    except orjson.JSONDecodeError as error:
        raise ApiError(400, f"the body is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "the body must be a JSON object")
    return value


def _payload(value: Any, encoding: Any) -> bytes:
    """A publish's payload from the form: text as UTF-8, JSON as its text, hex or base64."""
    if encoding == "json":
        return orjson.dumps(value)
    if not isinstance(value, str):
        raise ApiError(400, f"a {encoding} payload is a string")
    try:
        if encoding == "text":
            return value.encode("utf-8")
        if encoding == "hex":
            return bytes.fromhex(value)
        if encoding == "base64":
            return base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error) as error:
        raise ApiError(400, f"not {encoding}: {error}") from None
    raise ApiError(400, "encoding is one of text, json, hex, base64")
