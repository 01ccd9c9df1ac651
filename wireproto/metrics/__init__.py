"""Prometheus metrics for a running broker: ``GET /metrics`` on each HTTP listener's port.

`ServiceMetrics` gives a `WireprotoService` its own `CollectorRegistry` (never the global one, so
two services in one process do not clash), holding:

- `BrokerCollector`, which reads the hub's, the sessions' and the Phyllo links' counters when
  Prometheus scrapes, so publishing costs nothing more than the counting the hub already does;
- the histogram ``wireproto_rpc_handling_seconds``, observed once per UBRE request and nydus
  invoke that a handler answers (from the request's arrival to its reply being sent).

`MetricsResource` is the twisted.web resource that serves the registry; the service mounts it at
``[metrics] path`` beside the WebSocket and Engine.IO paths. docs/observability.md lists every
metric.

In a cluster (wireproto.cluster), a scrape of any process asks every other process for its
metrics over NATS and serves them all: each sample once per process with a ``worker`` label (its
node name), and once more with ``worker="total"``: summed, but for the gauges a sum would
misstate (`GAUGE_TOTALS`). ``?scope=process`` serves the process's own metrics alone.

Each registry also holds prometheus_client's process collector (``process_*``: memory, open
descriptors, CPU seconds, start time; empty where there is no /proc) and
``wireproto_build_info``. A worker of ``serve --workers`` adds its supervisor's process metrics
and build info to the scrapes it answers (``worker="HOST/supervisor"``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from wireproto import __version__, peerlog
from wireproto.broker import BrokerView
from wireproto.hub import SessionStats
from wireproto.hub.federation import ProcessGroup, Reply
from wireproto.metrics.settings import MetricsSettings

if TYPE_CHECKING:
    from wireproto.access.quotas import PrincipalLimits
    from wireproto.authentication import Authentication
    from wireproto.capture.wrapper import BrokerCapture
    from wireproto.hub import Hub
    from wireproto.phyllo.bridge import HubBridge
    from wireproto.transports.http import GuardedSite

__all__ = [
    "MetricsSettings", "BrokerCollector", "MetricsResource", "ServiceMetrics", "RPC_BUCKETS",
    "WORKER_LABEL", "family_rows", "MergedFamilies", "GAUGE_TOTALS", "BuildInfo", "process_rows",
]

# The label that says which broker process of a cluster a sample is from ("total": summed).
WORKER_LABEL = "worker"
# What a process of a cluster asks the others for its /metrics.
METRICS_QUESTION = "metrics"

# The gauges whose worker="total" is not the sum of the processes' values, and what it is
# instead (None: there is none). Each process counts itself and the others it hears from, and
# is connected or not; a topic may have subscribers in several processes, and every process
# keeps the cluster's last values: neither adds up across processes.
GAUGE_TOTALS: dict[str, Callable[[list[float]], float] | None] = {
    "wireproto_cluster_processes": max,
    "wireproto_cluster_connected": min,
    "wireproto_hub_topics": None,
    "wireproto_hub_retained": None,
    "wireproto_hub_retained_bytes": None,
    # Each process's own: a sum of start times, limits or versions means nothing.
    "process_start_time_seconds": None,
    "process_max_fds": None,
    "wireproto_build_info": None,
    # A link is opened by one process: the latest frame of any.
    "wireproto_phyllo_last_frame_timestamp_seconds": max,
}

# Handlers on the broker often answer in well under a millisecond: finer buckets than the
# client library's default at the low end.
RPC_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
)

# Session counters (SessionStats fields), by protocol: metric name, help.
_SESSION_COUNTERS = (
    ("received", "wireproto_messages_received",
     "Messages published into the hub by connections, by protocol."),
    ("sent", "wireproto_messages_sent",
     "Messages sent to connections (deliveries, replies, announcements), by protocol."),
    ("sent_bytes", "wireproto_bytes_sent",
     "Bytes of messages sent to connections, before transport framing, by protocol."),
    ("dropped_messages", "wireproto_dropped_messages",
     "Messages dropped from full send queues (policy drop-oldest), by protocol."),
    ("dropped_bytes", "wireproto_dropped_bytes",
     "Bytes of messages dropped from full send queues, by protocol."),
    ("overflow_disconnects", "wireproto_overflow_disconnects",
     "Connections closed because their send queue overflowed (policy disconnect), by "
     "protocol."),
    ("too_large", "wireproto_too_large_messages",
     "Messages not sent to a connection because, in its format, they were larger than it "
     "takes, by protocol."),
)

# Phyllo link counters (HubBridge.counters() keys): help.
_PHYLLO_COUNTERS = {
    "connections": "Times the link's carrier opened.",
    "to_hub": "Device messages published into the hub.",
    "to_device": "Hub messages sent to the device.",
    "crc_errors": "Frames that failed their CRC.",
    "framing_errors": "Malformed frames or chunks.",
    "type_errors": "Messages of a type the stack does not take.",
    "dropped": "Hub messages dropped from the link's full send queue (oldest first).",
    "stack_dropped": "Units a layer's full receive queue dropped.",
    "offline": "Hub messages for the device while it was away.",
    "unmapped": "Messages whose topic has no counterpart on the other side.",
    "unsendable": "Hub payloads the link's send format or frame size cannot carry.",
    "denied": "Device messages on topics the link's principal may not publish on.",
    "frames": "Frames (chunks) the device sent, those then dropped for a bad CRC included.",
    "bytes_received": "Bytes the device sent, noise included.",
    "bytes_sent": "Bytes sent to the device, delimiters included.",
    "resyncs": "Over-long chunks dropped up to the next delimiter (line noise, a lost "
               "delimiter).",
    "reopens": "Times the link's carrier opened again after its first open.",
}


class BrokerCollector(Collector):
    """Every broker metric but the latency histogram, read from `service` at scrape time."""

    def __init__(self, service: BrokerView) -> None:
        self.service = service
        # What the config serves is shown from the start, at 0.
        config = service.config
        self._served = {(listener.protocol, listener.transport) for listener in config.listeners}
        self._served |= {(link.protocol, link.framing) for link in config.attach}

    def collect(self) -> Iterator[Metric]:
        hub = self.service.hub
        yield from self._connections(hub)
        stats = hub.protocol_stats()
        for protocol, _ in self._served:
            stats.setdefault(protocol, SessionStats())
        for field, name, documentation in _SESSION_COUNTERS:
            family = CounterMetricFamily(name, documentation, labels=["protocol"])
            for protocol in sorted(stats):
                family.add_metric([protocol], getattr(stats[protocol], field))
            yield family
        yield from self._queues(hub, stats)
        yield from self._hub(hub)
        yield from self._phyllo(self.service.phyllo)
        yield from self._capture(self.service.capture)
        yield from self._refusals(self.service.http_sites)
        yield from self._handovers(self.service.engineio_handovers)
        yield from self._access(hub, self.service.auth)
        yield from self._limits(hub.limits)
        yield from self._cluster(self.service.cluster)
        yield CounterMetricFamily(
            "wireproto_log_lines_suppressed",
            "Warnings about peers held back by the log budget (and summed up in one line).",
            value=peerlog.BUDGET.suppressed_total,
        )

    def _access(self, hub: Hub, auth: Authentication | None) -> Iterator[Metric]:
        if auth is None:
            return
        outcomes = CounterMetricFamily(
            "wireproto_authentications",
            "Handshakes authenticated (ok) or refused, by reason.", labels=["outcome"],
        )
        for outcome, count in sorted({"ok": 0, **auth.outcomes}.items()):
            outcomes.add_metric([outcome], count)
        yield outcomes
        yield CounterMetricFamily(
            "wireproto_password_checks",
            "Passwords checked against the password file (each one scrypt).",
            value=auth.password_checks,
        )
        throttled = CounterMetricFamily(
            "wireproto_password_logins_throttled",
            "Password logins refused unchecked because their address (by=address), or their "
            "user from that address (by=user), failed too often.", labels=["by"],
        )
        tracked = GaugeMetricFamily(
            "wireproto_password_failures_tracked",
            "Addresses (by=address), and users at an address (by=user), whose failed logins "
            "the broker remembers.", labels=["by"],
        )
        logins = auth.logins
        for by, table in (("address", logins.addresses), ("user", logins.users)):
            throttled.add_metric([by], logins.throttled[by])
            tracked.add_metric([by], len(table))
        yield throttled
        yield tracked
        denied = CounterMetricFamily(
            "wireproto_denied", "Messages the access rules refused, by protocol and action.",
            labels=["protocol", "action"],
        )
        for (protocol, action), count in sorted(hub.denied.items()):
            denied.add_metric([protocol, action], count)
        yield denied

    def _limits(self, limits: PrincipalLimits) -> Iterator[Metric]:
        limited = CounterMetricFamily(
            "wireproto_limited",
            "Connections and subscriptions refused, and connections paused for their rate, "
            "because a principal reached its [limits], by protocol and limit.",
            labels=["protocol", "limit"],
        )
        for (protocol, limit), count in sorted(limits.exceeded.items()):
            limited.add_metric([protocol, limit], count)
        yield limited
        yield GaugeMetricFamily(
            "wireproto_principals",
            "Principals (anonymous clients: addresses) whose usage the broker keeps.",
            value=len(limits),
        )

    def _cluster(self, group: ProcessGroup | None) -> Iterator[Metric]:
        if group is None:
            return
        stats = group.stats()
        yield GaugeMetricFamily(
            "wireproto_cluster_connected",
            "1 while this process has a NATS server (total: 1 while every one has).",
            value=1 if stats.connected else 0)
        yield GaugeMetricFamily(
            "wireproto_cluster_processes",
            "Broker processes of the cluster this one hears from, itself included (total: "
            "the most any one hears from).",
            value=stats.processes)
        for name, documentation, value in (
            ("forwarded", "Publishes made here and sent to NATS for the other processes.",
             stats.forwarded),
            ("received", "Publishes that came through NATS delivered here: from the other "
             "processes, or from NATS clients that are not brokers.", stats.received),
            ("duplicates", "Second copies of a publish (overlapping subscriptions) dropped.",
             stats.duplicates),
            ("refused", "Messages on the topics' NATS subjects ignored: a malformed Wp header, "
             "or a subject that is no topic; and last values and wills from NATS ignored for "
             "being on a pattern.", stats.refused),
            ("dropped", "NATS messages this process did not send (publishes for the other "
             "processes, wills and last values to keep, answers): no NATS server, or over its "
             "backlog or message size limit.", stats.dropped),
            ("reconnects", "Times this process connected to a NATS server again.",
             stats.reconnects),
            ("calls_made", "Calls made to other processes, those that failed at once for "
             "want of a NATS server included.", stats.calls_made),
            ("calls_answered", "Calls from other processes answered here.",
             stats.calls_answered),
            ("calls_refused", "Calls from other processes refused: max_remote_calls at work.",
             stats.calls_refused),
            ("wills_published", "Wills of processes whose lease was over published here.",
             stats.wills_published),
            ("fenced", "Times this process found its lease lost (a pause, a partition) and was "
             "fenced: it closed its connections whose wills it kept, and took a new identity.",
             stats.fenced),
        ):
            yield CounterMetricFamily(f"wireproto_cluster_{name}", documentation, value=value)

    def _refusals(self, sites: list[GuardedSite]) -> Iterator[Metric]:
        reasons: Counter[str] = Counter(dict.fromkeys(
            ("body_too_large", "request_timeout", "too_many_pending", "displaced",
             "line_too_long"), 0))
        for site in sites:
            reasons.update(site.refusals)
        family = CounterMetricFamily(
            "wireproto_http_refused",
            "HTTP requests refused before a resource saw them whole, by reason.",
            labels=["reason"],
        )
        for reason in sorted(reasons):
            family.add_metric([reason], reasons[reason])
        yield family

    def _handovers(self, counts: Counter[str] | None) -> Iterator[Metric]:
        if counts is None:
            return
        family = CounterMetricFamily(
            "wireproto_engineio_handovers",
            "Engine.IO requests for a session another worker holds, passed to it (passed), "
            "refused as its socket was gone (unreachable) or cut off (lost); and requests "
            "another worker passed here (taken).",
            labels=["outcome"],
        )
        for outcome in ("passed", "taken", "unreachable", "lost"):
            family.add_metric([outcome], counts[outcome])
        yield family

    def _connections(self, hub: Hub) -> Iterator[Metric]:
        accepted = dict.fromkeys(self._served, 0)
        accepted.update(hub.accepted)
        open_now = dict.fromkeys(accepted, 0)
        for session in hub.sessions:
            key = (session.protocol, session.transport_name)
            open_now[key] = open_now.get(key, 0) + 1
        labels = ["protocol", "transport"]
        gauge = GaugeMetricFamily(
            "wireproto_connections", "Connections open now, by protocol and transport.",
            labels=labels,
        )
        for key in sorted(open_now):
            gauge.add_metric(list(key), open_now[key])
        yield gauge
        counter = CounterMetricFamily(
            "wireproto_connections_accepted",
            "Connections accepted (SubbleSocket: handshakes accepted), by protocol and "
            "transport.",
            labels=labels,
        )
        for key in sorted(accepted):
            counter.add_metric(list(key), accepted[key])
        yield counter

    def _queues(self, hub: Hub, stats: dict[str, SessionStats]) -> Iterator[Metric]:
        queued_bytes = dict.fromkeys(stats, 0)
        queued_messages = dict.fromkeys(stats, 0)
        for session in hub.sessions:
            queued_bytes[session.protocol] += session.queued_bytes
            queued_messages[session.protocol] += session.queued_messages
        for name, documentation, values in (
            ("wireproto_queued_bytes",
             "Bytes waiting in send queues for slow connections, by protocol.", queued_bytes),
            ("wireproto_queued_messages",
             "Messages waiting in send queues for slow connections, by protocol.",
             queued_messages),
        ):
            gauge = GaugeMetricFamily(name, documentation, labels=["protocol"])
            for protocol in sorted(values):
                gauge.add_metric([protocol], values[protocol])
            yield gauge

    def _hub(self, hub: Hub) -> Iterator[Metric]:
        stats = hub.stats
        yield CounterMetricFamily(
            "wireproto_hub_published", "Messages published into the hub, wills included.",
            value=stats.published,
        )
        yield CounterMetricFamily(
            "wireproto_hub_delivered", "Deliveries from the hub to subscribers.",
            value=stats.delivered,
        )
        yield CounterMetricFamily(
            "wireproto_hub_wills", "Last wills published.", value=stats.wills_published
        )
        yield GaugeMetricFamily(
            "wireproto_hub_topics", "Exact topics with at least one subscriber.",
            value=len(hub.topics()),
        )
        retained = hub.retained
        if retained is not None:
            yield GaugeMetricFamily(
                "wireproto_hub_retained", "Topics whose last value the hub keeps ([hub] retain).",
                value=len(retained))
            yield GaugeMetricFamily(
                "wireproto_hub_retained_bytes", "Bytes of the last values kept.",
                value=retained.bytes)
            yield CounterMetricFamily(
                "wireproto_hub_retained_refused",
                "Last values not kept: max_retained or max_retained_bytes reached.",
                value=retained.refused)

    def _phyllo(self, links: dict[str, HubBridge]) -> Iterator[Metric]:
        if not links:
            return
        connected = GaugeMetricFamily(
            "wireproto_phyllo_connected", "1 while the Phyllo link's carrier is open.",
            labels=["link"],
        )
        last_frame = GaugeMetricFamily(
            "wireproto_phyllo_last_frame_timestamp_seconds",
            "When the device last sent a frame, in Unix seconds (no sample before the first).",
            labels=["link"],
        )
        # Read at each scrape: links come and go while the broker runs (a fleet's boards).
        counters: dict[str, dict[str, int]] = {}
        for name, link in sorted(links.items()):
            connected.add_metric([name], 1 if link.top is not None else 0)
            counts = counters[name] = link.counters()
            counts["reopens"] = max(0, counts["connections"] - 1)
            if link.last_frame is not None:
                last_frame.add_metric([name], link.last_frame)
        yield connected
        yield last_frame
        for field, documentation in _PHYLLO_COUNTERS.items():
            family = CounterMetricFamily(
                f"wireproto_phyllo_{field}", documentation, labels=["link"]
            )
            for name, values in counters.items():
                family.add_metric([name], values.get(field, 0))
            yield family


    def _capture(self, capture: BrokerCapture | None) -> Iterator[Metric]:
        writer = None if capture is None else capture.writer
        if writer is None:
            return
        counters = writer.counters
        for field, documentation in _CAPTURE_COUNTERS.items():
            yield CounterMetricFamily(f"wireproto_capture_{field}", documentation,
                                      value=getattr(counters, field))


_CAPTURE_COUNTERS = {
    "records": "Capture records written (a batch record holds a turn's messages of one "
               "connection and direction).",
    "bytes": "Capture bytes written, record headers included.",
    "files": "Capture files started.",
    "dropped_batches": "Write batches dropped: the writer's queue was full, or a write failed.",
    "dropped_records": "Capture records in the dropped batches.",
}


class BuildInfo(Collector):
    """``wireproto_build_info{version="..."} 1``: the version this process runs (or
    `version`, another process's)."""

    def __init__(self, version: str = __version__) -> None:
        self.version = version

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("wireproto_build_info",
                                 "Always 1; the version of wireproto this process runs.",
                                 labels=["version"])
        info.add_metric([self.version], 1)
        yield info


def process_rows(pid: int, version: str = "") -> list[list]:
    """The process metrics of another process of this user, `pid`, as `family_rows` gives
    them (none once it is gone, or where there is no /proc), with its build info if its
    `version` is known."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(pid=lambda: pid, registry=registry)
    if version:
        registry.register(BuildInfo(version))
    return family_rows(registry)


class MetricsResource(Resource):
    """twisted.web resource serving `registry` in the text format a scraper asks for."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__()
        self.registry = registry

    def render_GET(self, request: Any) -> Any:
        return self.encoder_for(request)(self.registry)

    @staticmethod
    def encoder_for(request: Any) -> Callable[[CollectorRegistry], bytes]:
        """The encoder of the format the scraper asks for; sets the response's type."""
        accept = request.getHeader(b"accept")
        encoder, content_type = choose_encoder(accept.decode("latin-1") if accept else "")
        request.setHeader(b"content-type", content_type.encode("ascii"))
        return encoder


def family_rows(registry: CollectorRegistry) -> list[list]:
    """The registry's metrics as plain lists (for msgpack): name, help, type, unit, and
    samples as [name, labels, value]."""
    return [
        [family.name, family.documentation, family.type, family.unit,
         [[sample.name, sample.labels, sample.value] for sample in family.samples]]
        for family in registry.collect()
    ]


class MergedFamilies(Collector):
    """The metrics of several processes, `parts` as [(node, family_rows), ...]: each sample
    labelled with its process, and their total as ``worker="total"``: the sum (but of the
    ``_created`` timestamps), or what `GAUGE_TOTALS` says."""

    def __init__(self, parts: list[tuple[str, list]]) -> None:
        self.parts = parts

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        values: dict[str, dict[tuple, list[float]]] = {}
        for node, rows in self.parts:
            for name, documentation, kind, unit, samples in rows:
                metric = merged.get(name)
                if metric is None:
                    metric = merged[name] = Metric(name, documentation, kind, unit)
                    values[name] = {}
                each = values[name]
                for sample_name, labels, value in samples:
                    metric.add_sample(sample_name, {**labels, WORKER_LABEL: node}, value)
                    if not sample_name.endswith("_created"):
                        each.setdefault((sample_name, tuple(sorted(labels.items()))),
                                        []).append(value)
        for name, metric in merged.items():
            total = GAUGE_TOTALS.get(name, sum) if metric.type == "gauge" else sum
            if total is not None:
                for (sample_name, labels), found in values[name].items():
                    metric.add_sample(sample_name, {**dict(labels), WORKER_LABEL: "total"},
                                      total(found))
            yield metric


class ClusterMetricsResource(MetricsResource):
    """/metrics of a process in a cluster: every process's metrics, gathered over NATS when
    scraped, and their totals; ``?scope=process`` for this process's alone."""

    def __init__(self, registry: CollectorRegistry, group: ProcessGroup,
                 supervisor: tuple[int, str, str] | None = None) -> None:
        super().__init__(registry)
        self.group = group
        # A worker's supervisor, (pid, name, version), whose process metrics and build info
        # this one serves too.
        self.supervisor = supervisor

    def render_GET(self, request: Any) -> Any:
        if request.args.get(b"scope") == [b"process"]:
            return super().render_GET(request)
        encoder = self.encoder_for(request)
        gone: list[Any] = []
        request.notifyFinish().addErrback(gone.append)

        def gathered(replies: list[Reply]) -> None:
            if gone:
                return  # the scraper hung up meanwhile
            parts = [(reply.node, reply.answer) for reply in replies]
            if self.supervisor is not None:
                pid, name, version = self.supervisor
                parts.append((name, process_rows(pid, version)))
            merged = CollectorRegistry(auto_describe=False)
            merged.register(MergedFamilies(parts))
            request.write(encoder(merged))
            request.finish()

        self.group.ask_others(METRICS_QUESTION, [], family_rows(self.registry)).addCallback(
            gathered)
        return NOT_DONE_YET


class ServiceMetrics:
    """One service's registry: the broker's counters, the RPC latency histogram, the process's
    metrics and the build's. `supervisor`, (pid, name, version): a worker's supervisor, whose
    process metrics and build info a scrape of the cluster shows too."""

    def __init__(self, service: BrokerView,
                 supervisor: tuple[int, str, str] | None = None) -> None:
        self.service = service
        self.supervisor = supervisor
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(BrokerCollector(service))
        ProcessCollector(registry=self.registry)
        self.registry.register(BuildInfo())
        self.rpc_seconds = Histogram(
            "wireproto_rpc_handling_seconds",
            "Time from a request's arrival to its reply, for requests a handler answers "
            "(UBRE requests, nydus invokes), by protocol and outcome.",
            ["protocol", "outcome"],
            buckets=RPC_BUCKETS,
            registry=self.registry,
        )
        # A scrape of any process of a cluster asks the others for theirs.
        group = service.cluster
        if group is not None:
            registry = self.registry
            group.answer_others(METRICS_QUESTION, lambda request: family_rows(registry))

    def instrument(self, protocol: str, server: Any) -> None:
        """Time the requests `server` answers, if it answers any (a UbreServer, a
        NydusServer)."""
        if hasattr(server, "observe_request"):
            server.observe_request = self.request_observer(protocol)

    def request_observer(self, protocol: str) -> Callable[[float, bool], None]:
        """`observe(seconds, succeeded)` for `protocol`'s requests."""
        success = self.rpc_seconds.labels(protocol, "success")
        fail = self.rpc_seconds.labels(protocol, "fail")

        def observe(seconds: float, succeeded: bool) -> None:
            (success if succeeded else fail).observe(seconds)

        return observe


    def resource(self) -> Resource:
        group = self.service.cluster
        if group is not None:
            return ClusterMetricsResource(self.registry, group, self.supervisor)
        return MetricsResource(self.registry)
