"""The cluster's JetStream buckets: how each is made, migrated and kept (docs/cluster.md,
"Where wills and last values live").

A bucket is a JetStream stream used as a key-value store, as NATS's own KV is: ``KV_NAME``, its
keys on ``$KV.NAME.>``. Every process `ensure`s its buckets on each new NATS connection:

- A bucket no one has made yet is made with the replicas wanted: `replicas` when it is given
  (``[cluster] replicas``), else 3 where JetStream can place 3, and 1 where it cannot. JetStream
  itself says which, by refusing 3: a single server with "replicas > 1 not supported in
  non-clustered mode" (10074), a NATS cluster with fewer than three JetStream servers up with
  "no suitable peers for placement" (10005). The servers' INFO cannot say it: `connect_urls`
  counts client addresses, not servers (one per interface of a server listening on 0.0.0.0,
  none with ``no_advertise``), servers without JetStream among them; and `$JS.API.INFO` says
  nothing of the cluster. A bucket left with 1 replica because peers were missing (a node down, or
  a NATS cluster that has just started and not yet counted its JetStream servers) is asked again
  after 1 s, then after waits that double up to a minute (`RECHECK`), so it gets its 3 once the
  NATS cluster can place them.
- A bucket that exists keeps its keys: only its replicas are changed, by STREAM.UPDATE, which a
  clustered server does without losing a message (automatically only upwards: never fewer than
  it has). Any other difference from what this process would make is logged and left as it is.
- A JetStream error is tried again after a wait that grows (`JETSTREAM_RETRY`), for as long as
  the NATS connection lasts, and logged for what it is: a timeout, a refusal with its JetStream
  error code and description, or no JetStream on the server. Nothing is given up for good: the
  next connection starts again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from twisted.application.internet import backoffPolicy
from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto.cluster.client import NatsClient, NoResponders
from wireproto.protocols.rpc import RequestTimeout
from wireproto.transports.reconnect import RetryPolicy

__all__ = [
    "AUTOMATIC_REPLICAS",
    "MAX_REPLICAS",
    "JETSTREAM_RETRY",
    "JetStreamError",
    "jetstream_api",
    "describe",
    "Retrying",
    "Bucket",
]

log = Logger(namespace="wireproto.cluster")

# Replicas of a bucket made where JetStream can place them ([cluster] replicas = 0), and the
# most JetStream allows.
AUTOMATIC_REPLICAS = 3
MAX_REPLICAS = 5

# JetStream's error codes (err_code) that this module acts on.
NO_SUITABLE_PEERS = 10005
STREAM_NAME_IN_USE = 10058
STREAM_NOT_FOUND = 10059
NOT_CLUSTERED = 10074
NOT_ENABLED = frozenset({10039, 10076})  # for the account; on the server

# 0.5 s after the first failure, growing by half each time to 10 s, with up to 1 s of jitter so
# the processes of a cluster do not ask in step.
JETSTREAM_RETRY: RetryPolicy = backoffPolicy(initialDelay=0.5, maxDelay=10.0)
# How long a bucket that JetStream could not give its automatic replicas waits before asking again.
RECHECK: RetryPolicy = backoffPolicy(initialDelay=1.0, maxDelay=60.0, factor=2.0)


class JetStreamError(Exception):
    """JetStream answered an API request with an error: its `code` (``err_code``) and
    `description`."""

    def __init__(self, code: int, description: str) -> None:
        super().__init__(f"{description} (JetStream error {code})")
        self.code = code
        self.description = description


def jetstream_api(client: NatsClient, request: str, body: Mapping[str, object] | None = None, *,
                  timeout: float = 5.0) -> defer.Deferred[dict[str, Any]]:
    """Ask ``$JS.API.REQUEST`` with `body` as JSON; fire with the JSON answer. Fails with
    JetStreamError when JetStream refuses, and as `NatsClient.request` fails: NoResponders when
    nothing answers JetStream's subjects (no JetStream), RequestTimeout, NatsUnavailable."""

    def answered(reply: tuple[bytes | None, bytes]) -> dict[str, Any]:
        answer = json.loads(reply[1])
        if not isinstance(answer, dict):
            raise ValueError(f"JetStream answered $JS.API.{request} with {reply[1][:100]!r}")
        error = answer.get("error")
        if error:
            raise JetStreamError(int(error.get("err_code") or error.get("code") or 0),
                                 str(error.get("description") or "no description"))
        return answer

    d = client.request(f"$JS.API.{request}", b"" if body is None else json.dumps(body).encode(),
                       timeout=timeout)
    return d.addCallback(answered)


def describe(error: BaseException) -> tuple[str, str]:
    """A failed JetStream request as a log event's name and what happened, in words: a timeout
    is a timeout, a refusal names its code, and "no JetStream" is said only when the server
    says so."""
    if isinstance(error, NoResponders):
        return ("cluster_no_jetstream",
                "no JetStream on the NATS server (nothing answers its API)")
    if isinstance(error, JetStreamError):
        if error.code in NOT_ENABLED:
            return "cluster_no_jetstream", f"no JetStream for this NATS account: {error}"
        return "cluster_jetstream_refused", f"JetStream refused: {error}"
    if isinstance(error, RequestTimeout | defer.TimeoutError):
        return "cluster_jetstream_timeout", f"JetStream did not answer: {error}"
    return "cluster_jetstream_failed", f"{type(error).__name__}: {error}"


class Retrying:
    """Work against JetStream done again after each failure, with waits that grow as `policy`
    says, for as long as the NATS connection it began on lasts. Each failure is logged as
    `describe` words it: the first, each that differs from the one before, and every 20th."""

    def __init__(self, client: NatsClient, what: str, *,
                 policy: RetryPolicy = JETSTREAM_RETRY) -> None:
        self.client = client
        # What the work is for, in the log: "the wills bucket (KV_wireproto_wills)".
        self.what = what
        self.policy = policy
        # Attempts that failed, all told.
        self.failures = 0
        self._generation = 0
        self._sleeping: defer.Deferred | None = None

    def run(self, attempt: Callable[[], defer.Deferred],
            lacking: Callable[[], str] | None = None) -> defer.Deferred[bool]:
        """Call `attempt` until it succeeds, on this NATS connection; a run begun before is
        abandoned. An attempt that fires with a number of seconds has more to do: it is called
        again after that long. Fires True once an attempt has succeeded (the run goes on if it
        asked for more), False if the connection went first or `stop` was called; never fails.
        `lacking()` says what is missing while it fails, for the log."""
        self.stop()
        connection = self.client.connection
        succeeded: defer.Deferred[bool] = defer.Deferred()
        if connection is None:
            succeeded.callback(False)
            return succeeded
        generation = self._generation
        self._loop(generation, connection, attempt, lacking, succeeded).addErrback(
            lambda failure: log.failure("cluster: {what}", failure,
                                        event="cluster_jetstream_stopped", what=self.what))
        return succeeded

    def stop(self) -> None:
        """Abandon the run under way: no more attempts."""
        self._generation += 1
        sleeping, self._sleeping = self._sleeping, None
        if sleeping is not None:
            sleeping.cancel()

    def current(self, generation: int, connection: object) -> bool:
        return generation == self._generation and self.client.connection is connection

    @defer.inlineCallbacks
    def _loop(self, generation: int, connection: object, attempt: Callable[[], defer.Deferred],
              lacking: Callable[[], str] | None, succeeded: defer.Deferred[bool]) -> Any:
        failed = 0
        last_logged: str | None = None
        while self.current(generation, connection):
            try:
                more = yield attempt()
            except Exception as error:
                if not self.current(generation, connection):
                    break  # the connection went: its loss is logged by the client
                failed += 1
                self.failures += 1
                delay = self.policy(failed)
                event, why = describe(error)
                if why != last_logged or failed % 20 == 0:
                    last_logged = why
                    missing = lacking() if lacking is not None else ""
                    log.warn("cluster: {what}: {why}; trying again in {delay:.1f} s{missing}",
                             event=event, what=self.what, why=why, delay=delay,
                             attempts=failed, code=getattr(error, "code", None),
                             missing=f" (until then {missing})" if missing else "")
            else:
                if failed:
                    log.info("cluster: {what}: done, after {attempts} failed attempt{s}",
                             event="cluster_jetstream_recovered", what=self.what,
                             attempts=failed, s="" if failed == 1 else "s")
                failed = 0
                last_logged = None
                if not succeeded.called:
                    succeeded.callback(True)
                if more is None:
                    break
                delay = float(more)
            if not (yield self._sleep(delay)):
                break
        if not succeeded.called:
            succeeded.callback(False)

    def _sleep(self, delay: float) -> defer.Deferred[bool]:
        """Fires True after `delay` seconds, False if `stop` cancels it first."""
        sleeping = task.deferLater(self.client.reactor, delay, lambda: True)
        self._sleeping = sleeping

        def cancelled(failure: Failure) -> bool:
            failure.trap(defer.CancelledError)
            return False

        def woke(result: bool) -> bool:
            if self._sleeping is sleeping:
                self._sleeping = None
            return result

        return sleeping.addErrback(cancelled).addCallback(woke)


class Bucket:
    """One JetStream stream used as a key-value bucket of the cluster, made and kept with the
    replicas wanted (`replicas`; 0: automatic, see the module's docstring).

    `config` is the stream's configuration as this process would make it (``num_replicas``
    aside). `ensure()` on each new NATS connection; `available` says whether the bucket is
    there to use on the current one; `stop()` when the process leaves its cluster. `what`
    names it in the log, `lacking` says what the cluster goes without while it is missing.
    """

    def __init__(self, client: NatsClient, stream: str, config: Mapping[str, object], *,
                 replicas: int = 0, what: str = "bucket", lacking: str = "",
                 timeout: float = 5.0, policy: RetryPolicy = JETSTREAM_RETRY,
                 recheck: RetryPolicy = RECHECK) -> None:
        if not 0 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be 0 (automatic) to {MAX_REPLICAS}, not {replicas}")
        self.client = client
        self.stream = stream
        self.config: dict[str, object] = {key: value for key, value in config.items()
                                           if key != "num_replicas"}
        self.config["name"] = stream
        self.wanted = replicas
        self.lacking = lacking
        self.timeout = timeout
        self.recheck = recheck
        self._rechecks = 0
        self.retrying = Retrying(client, f"{what} ({stream})", policy=policy)
        # The bucket's replicas, as JetStream last said (None: not seen yet).
        self.replicas: int | None = None
        self._ready_on: object | None = None
        self._ready: defer.Deferred[bool] | None = None
        self._placement_logged: str | None = None
        self._differences_logged: list[str] = []

    @property
    def available(self) -> bool:
        """The bucket exists, as seen on the NATS connection there is now."""
        return self._ready_on is not None and self._ready_on is self.client.connection

    @property
    def failures(self) -> int:
        """JetStream requests for this bucket that failed, all told."""
        return self.retrying.failures

    def ensure(self) -> defer.Deferred[bool]:
        """Make the bucket or bring its replicas to what is wanted, trying again after each
        failure while this NATS connection lasts. Fires True once the bucket is there to use,
        False if the connection went first (or `stop` or another `ensure` came); never fails.
        A change of replicas still refused goes on being tried after it has fired."""
        self._ready_on = None
        self._placement_logged = None
        self._rechecks = 0
        ready: defer.Deferred[bool] = defer.Deferred()
        self._ready = ready
        done = self.retrying.run(self._step, self._lacking)
        done.addCallback(lambda ok: None if ready.called else ready.callback(False))
        return ready

    def stop(self) -> None:
        self.retrying.stop()
        self._ready_on = None
        ready, self._ready = self._ready, None
        if ready is not None and not ready.called:
            ready.callback(False)

    def _lacking(self) -> str:
        return "" if self.available else self.lacking

    def _api(self, request: str, body: Mapping[str, object] | None = None) -> defer.Deferred:
        return jetstream_api(self.client, request, body, timeout=self.timeout)

    # -- one attempt -------------------------------------------------------------------------------

    @defer.inlineCallbacks
    def _step(self) -> Any:
        """Make the bucket if it is missing, then see to its replicas. Fires None when nothing
        is left to do, or the seconds after which to try again for replicas JetStream could
        not place yet; fails with what JetStream answered."""
        connection = self.client.connection
        try:
            answer = yield self._api(f"STREAM.INFO.{self.stream}")
        except JetStreamError as error:
            if error.code != STREAM_NOT_FOUND:
                raise
            answer, fewer = yield self._create()
            if answer is not None:
                self._usable(connection, answer.get("config") or {})
                return self._again() if fewer else None
            # another process made it meanwhile, otherwise
            answer = yield self._api(f"STREAM.INFO.{self.stream}")
        self._usable(connection, answer.get("config") or {})
        return (yield self._migrate(answer.get("config") or {}))

    def _usable(self, connection: object, config: dict[str, Any]) -> None:
        self.replicas = int(config.get("num_replicas") or 1)
        if connection is self.client.connection:
            self._ready_on = connection
            if self._ready is not None and not self._ready.called:
                self._ready.callback(True)

    @defer.inlineCallbacks
    def _create(self) -> Any:
        """The bucket made: JetStream's answer (None if the name was taken meanwhile), and
        whether it has fewer replicas than wanted for want of peers, to be asked again."""
        replicas = self.wanted or AUTOMATIC_REPLICAS
        fewer = False
        try:
            answer = yield self._made(replicas)
        except JetStreamError as error:
            if self.wanted or error.code not in (NO_SUITABLE_PEERS, NOT_CLUSTERED):
                raise
            self._cannot_place(error, replicas, 1)
            fewer = error.code == NO_SUITABLE_PEERS
            answer = yield self._made(1)
        if answer is not None:
            made = int((answer.get("config") or {}).get("num_replicas") or 1)
            log.info("cluster: made {what} with {replicas} replica{s}",
                     event="cluster_bucket_made", what=self.retrying.what, replicas=made,
                     s="" if made == 1 else "s")
        return answer, fewer

    @defer.inlineCallbacks
    def _made(self, replicas: int) -> Any:
        try:
            return (yield self._api(f"STREAM.CREATE.{self.stream}",
                                    {**self.config, "num_replicas": replicas}))
        except JetStreamError as error:
            if error.code == STREAM_NAME_IN_USE:
                return None
            raise

    @defer.inlineCallbacks
    def _migrate(self, existing: dict[str, Any]) -> Any:
        """Bring the replicas of the bucket that exists to what is wanted; leave the rest."""
        self._log_differences(existing)
        current = int(existing.get("num_replicas") or 1)
        target = self.wanted or max(current, AUTOMATIC_REPLICAS)
        if current == target:
            return None
        try:
            answer = yield self._api(f"STREAM.UPDATE.{self.stream}",
                                     {**existing, "num_replicas": target})
        except JetStreamError as error:
            if self.wanted or error.code not in (NO_SUITABLE_PEERS, NOT_CLUSTERED):
                raise
            self._cannot_place(error, target, current)
            return None if error.code == NOT_CLUSTERED else self._again()
        self.replicas = int((answer.get("config") or {}).get("num_replicas") or target)
        log.info("cluster: {what} now has {replicas} replica{s} (it had {before}); its keys "
                 "are kept", event="cluster_bucket_replicas", what=self.retrying.what,
                 replicas=self.replicas, s="" if self.replicas == 1 else "s", before=current)
        return None

    def _again(self) -> float:
        """Seconds before asking again for the replicas JetStream could not place."""
        self._rechecks += 1
        return self.recheck(self._rechecks - 1)

    def _cannot_place(self, error: JetStreamError, wanted: int, kept: int) -> None:
        """JetStream cannot place `wanted` replicas (automatic replicas only): said once per
        connection, since it is how a single server or a small NATS cluster is."""
        if self._placement_logged == error.description:
            return
        self._placement_logged = error.description
        again = "" if error.code == NOT_CLUSTERED else \
            "; asking again after a wait that grows to a minute"
        log.info("cluster: {what} has {kept} of the {wanted} replicas wanted: {why}{again}",
                 event="cluster_bucket_replicas", what=self.retrying.what, kept=kept,
                 wanted=wanted, why=str(error), again=again)

    def _log_differences(self, existing: dict[str, Any]) -> None:
        differences = [
            f"{key} {json.dumps(existing.get(key))} where this process would have "
            f"{json.dumps(value)}"
            for key, value in self.config.items() if _differs(existing.get(key), value)]
        if differences and differences != self._differences_logged:
            log.warn("cluster: {what} was made otherwise than this process would make it: "
                     "{differences}; it is left as it is, with its keys (edit or remove the "
                     "stream to change it)", event="cluster_bucket_differs",
                     what=self.retrying.what, differences="; ".join(differences))
        self._differences_logged = differences


def _differs(theirs: object, ours: object) -> bool:
    """Whether a stream's setting as JetStream says it differs from ours (one it leaves out is
    its zero value)."""
    if theirs is None:
        return bool(ours)
    return bool(theirs != ours)
