"""The batch jobs of `wireproto analyze`, each a Spark DataFrame of the `wirecapture` source's
rows in and a DataFrame (or, for the report's plots, a few collected rows) out.

They know the rows' columns and the protocol descriptors, not where the rows come from: the
Parquet copy of a decode, an ingested table, or any selection of them (`analyze.analyze_rows`
runs them all and writes their tables).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from wireproto.protocols import PROTOCOLS, RequestPairing

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["topic_rates", "rpc_pairs", "requests", "latency_summary", "broker_rates",
           "cluster_calls", "cluster_latency", "malformed", "windows", "rate_bucket_seconds",
           "rate_over_time", "latency_histogram", "REQUEST_TIMEOUT_MS", "WINDOW"]

# Which protocols have requests, how they pair with answers, and which answers mean the call
# worked, all come from the protocol descriptors (wireproto.protocols).
# An answer later than this came after the clients gave up (UbreClient's and nydus's default).
REQUEST_TIMEOUT_MS = 30_000.0
WINDOW = "1 minute"

READINGS_SCHEMA = "timestamp timestamp, protocol string, topic string, field string, value double"


def _messages_only(rows: Any) -> Any:
    from pyspark.sql import functions as F

    return rows.where(F.col("kind").isin("in", "out"))


def topic_rates(rows: Any, span_seconds: float) -> Any:
    """Per (protocol, topic, direction): messages, per second over the capture's span (null for
    a span of 0), and the body bytes total, mean and max. Messages that did not decode, or have
    no topic, are left out."""
    from pyspark.sql import functions as F

    per_second = (F.col("messages") / F.lit(span_seconds)) if span_seconds > 0 else F.lit(None)
    return (
        _messages_only(rows)
        .where(F.col("topic").isNotNull() & F.col("decode_error").isNull())
        .groupBy("protocol", "topic", F.col("kind").alias("direction"))
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("body_size").cast("long").alias("bytes_total"),
            F.avg("body_size").alias("bytes_mean"),
            F.max("body_size").alias("bytes_max"),
        )
        .withColumn("messages_per_second", per_second.cast("double"))
    )


def _pairings() -> dict[str, RequestPairing]:
    return {name: d.requests for name, d in PROTOCOLS.items() if d.requests is not None}


def _ok_outcomes() -> list[str]:
    return sorted({ok for pairing in _pairings().values() for ok in pairing.ok})


def _fail_outcomes() -> list[str]:
    return sorted({answer for pairing in _pairings().values() for answer in pairing.answers
                   if answer not in pairing.ok})


def _reading_types() -> list[str]:
    return sorted({kind for d in PROTOCOLS.values() for kind in d.reading_types})


def rpc_pairs(rows: Any) -> Any:
    """Each request with its answer: protocol, connection, request_id, route, outcome (the
    answer's message type), requested, answered and latency_ms, for every protocol whose
    descriptor has a `RequestPairing`. By id (UBRE requests, nydus invokes), a request pairs
    with the first answer on its connection with its id; in order (a SubbleSocket produce), the
    n-th request of a connection pairs with its n-th answer (see `_pairs_in_order`)."""
    from pyspark.sql import functions as F

    frames = [
        _pairs_by_id(rows, protocol, pairing) if pairing.by == "id"
        else _pairs_in_order(rows, protocol, pairing)
        for protocol, pairing in _pairings().items()
    ]
    pairs = frames[0]
    for frame in frames[1:]:
        pairs = pairs.unionByName(frame)
    latency = (F.unix_micros("answered") - F.unix_micros("requested")) / F.lit(1000.0)
    return pairs.withColumn("latency_ms", latency).select(
        "protocol", "connection", "request_id", "route", "outcome", "requested", "answered",
        "latency_ms")


def _answers(rows: Any, pairing: RequestPairing) -> Any:
    """The out rows that answer `pairing`'s requests (an answer type with a code counts only
    when the message's first byte is that code)."""
    from pyspark.sql import functions as F

    wanted = F.lit(False)
    codes = dict(pairing.answer_codes)
    for answer in pairing.answers:
        condition = F.col("message_type") == answer
        if answer in codes:
            condition = condition & (
                F.substring("data", 1, 1) == F.lit(bytes([codes[answer]])))
        wanted = wanted | condition
    return rows.where((F.col("kind") == "out") & wanted)


def _pairs_by_id(rows: Any, protocol: str, pairing: RequestPairing) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    of_protocol = rows.where((F.col("protocol") == protocol) & F.col("request_id").isNotNull())
    requests = of_protocol.where(
        (F.col("kind") == "in") & (F.col("message_type") == pairing.request)
    ).select("protocol", "connection", "request_id", F.col("topic").alias("route"),
             F.col("timestamp").alias("requested"))
    answers = _answers(of_protocol, pairing).select(
        "connection", "request_id", F.col("message_type").alias("outcome"),
        F.col("timestamp").alias("answered"))
    joined = requests.join(answers, ["connection", "request_id"]).where(
        F.col("answered") >= F.col("requested"))
    first = Window.partitionBy("connection", "request_id", "requested").orderBy("answered")
    return (joined.withColumn("rank", F.row_number().over(first))
            .where(F.col("rank") == 1).drop("rank"))


def _pairs_in_order(rows: Any, protocol: str, pairing: RequestPairing) -> Any:
    """A protocol without request ids whose server answers every request on its connection,
    in order, with exactly one answer (SubbleSocket: the producer's own event, code 27, or an
    event error). So the n-th request of a connection pairs with its n-th answer; request_id
    is that n (from 1) and the route is the request's topic."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    of_protocol = rows.where((F.col("protocol") == protocol) & F.col("decode_error").isNull())
    order = Window.partitionBy("connection").orderBy("timestamp", "file", "offset",
                                                     "message_index")
    requests = (
        of_protocol.where((F.col("kind") == "in") & (F.col("message_type") == pairing.request))
        .withColumn("request_id", F.row_number().over(order).cast("string"))
        .select("protocol", "connection", "request_id", F.col("topic").alias("route"),
                F.col("timestamp").alias("requested"))
    )
    answers = (
        _answers(of_protocol, pairing)
        .withColumn("request_id", F.row_number().over(order).cast("string"))
        .select("connection", "request_id", F.col("message_type").alias("outcome"),
                F.col("timestamp").alias("answered"))
    )
    return requests.join(answers, ["connection", "request_id"])


def requests(rows: Any) -> Any:
    """Every request (protocol, connection, route), paired or not."""
    from pyspark.sql import functions as F

    wanted = F.lit(False)
    for protocol, pairing in _pairings().items():
        wanted = wanted | ((F.col("protocol") == protocol)
                           & (F.col("message_type") == pairing.request))
    return rows.where((F.col("kind") == "in") & wanted).select(
        "protocol", F.col("topic").alias("route"))


def ok_answer() -> Column:
    """Whether a paired request's answer says the call worked, in time (within
    REQUEST_TIMEOUT_MS): the calls whose latency the table and the plot show."""
    from pyspark.sql import functions as F

    return F.col("outcome").isin(*_ok_outcomes()) & (
        F.col("latency_ms") <= F.lit(REQUEST_TIMEOUT_MS))


def latency_summary(rows: Any, pairs: Any) -> Any:
    """Per (protocol, route): requests; paired, and of those `ok` and `fail` (by the answer) and
    `timeout` (answered after REQUEST_TIMEOUT_MS, whatever the answer); unpaired requests (never
    answered in the capture); and the exact p50/p95/p99 and max latency in ms of the ok answers,
    so that fast failures do not pass for fast calls."""
    from pyspark.sql import functions as F

    late = F.col("latency_ms") > F.lit(REQUEST_TIMEOUT_MS)
    ok = ok_answer()
    ok_latency = F.when(ok, F.col("latency_ms"))
    stats = pairs.groupBy("protocol", "route").agg(
        F.count(F.lit(1)).alias("paired"),
        F.count(F.when(ok, 1)).alias("ok"),
        F.count(F.when(F.col("outcome").isin(*_fail_outcomes()) & ~late, 1)).alias("fail"),
        F.count(F.when(late, 1)).alias("timeout"),
        F.percentile(ok_latency, F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99))).alias("p"),
        F.max(ok_latency).alias("max_ms"),
    )
    asked = requests(rows).groupBy("protocol", "route").agg(F.count(F.lit(1)).alias("requests"))
    return (
        asked.join(stats, ["protocol", "route"], "full_outer")
        .select(
            "protocol", "route",
            F.coalesce("requests", F.lit(0)).cast("long").alias("requests"),
            F.coalesce("paired", F.lit(0)).cast("long").alias("paired"),
            *(F.coalesce(name, F.lit(0)).cast("long").alias(name)
              for name in ("ok", "fail", "timeout")),
            F.col("p")[0].alias("p50_ms"), F.col("p")[1].alias("p95_ms"),
            F.col("p")[2].alias("p99_ms"), "max_ms",
        )
        .withColumn("unpaired", F.greatest(F.col("requests") - F.col("paired"), F.lit(0)))
    )


def broker_rates(rows: Any, span_seconds: float) -> Any:
    """Per (broker, protocol): messages in and out, each per second over the capture's span (null
    for a span of 0), connections opened, and messages that did not decode."""
    from pyspark.sql import functions as F

    def per_second(name: str) -> Any:
        return ((F.col(name) / F.lit(span_seconds)) if span_seconds > 0
                else F.lit(None)).cast("double")

    counted = rows.groupBy("broker", "protocol").agg(
        F.count(F.when(F.col("kind") == "in", 1)).alias("messages_in"),
        F.count(F.when(F.col("kind") == "out", 1)).alias("messages_out"),
        # A file repeats the open records of the connections still open: count each once.
        F.countDistinct(F.when(F.col("kind") == "open", F.col("connection"))).alias(
            "connections"),
        F.count(F.when(F.col("kind").isin("in", "out") & F.col("decode_error").isNotNull(), 1))
        .alias("malformed"),
        F.min("timestamp").alias("first"), F.max("timestamp").alias("last"),
    )
    return (counted.withColumn("in_per_second", per_second("messages_in"))
            .withColumn("out_per_second", per_second("messages_out")))


def cluster_calls(rows: Any) -> Any:
    """Each call between broker processes that the caller's capture recorded
    (`wireproto.cluster.callcapture`): route (its subject), caller and answerer (brokers),
    outcome (``reply`` or ``refused``, null if unanswered), called and answered (the caller's
    clock), round_trip_ms there, handled_ms where it was answered (from the call's arrival to
    its reply, on the answerer's clock), and transit_ms, the difference: the time between the
    two processes, NATS included. Each duration is read on one clock, so the processes' clocks
    need not agree. A call pairs across captures by its NATS reply subject (its request_id)."""
    from pyspark.sql import functions as F

    legs = rows.where((F.col("protocol") == "cluster") & F.col("request_id").isNotNull()
                      & F.col("decode_error").isNull())
    is_call = F.col("message_type") == "call"
    made = legs.where((F.col("kind") == "out") & is_call).select(
        "request_id", F.col("broker").alias("caller"), F.col("topic").alias("route"),
        F.col("timestamp").alias("called"))
    back = legs.where((F.col("kind") == "in") & ~is_call).select(
        "request_id", F.col("broker").alias("caller"), F.col("message_type").alias("outcome"),
        F.col("timestamp").alias("answered"))
    arrived = legs.where((F.col("kind") == "in") & is_call).select(
        "request_id", F.col("broker").alias("answerer"), F.col("timestamp").alias("received"))
    replied = legs.where((F.col("kind") == "out") & ~is_call).select(
        "request_id", F.col("broker").alias("answerer"), F.col("timestamp").alias("replied"))
    answered = arrived.join(replied, ["request_id", "answerer"], "left")

    def first(frame: Any, key: list[str], order: str) -> Any:
        return frame.groupBy(*key).agg(F.min_by(F.struct(*frame.columns), order).alias("r")) \
            .select("r.*")

    calls = (first(made, ["request_id", "caller"], "called")
             .join(first(back, ["request_id", "caller"], "answered"), ["request_id", "caller"],
                   "left")
             .join(first(answered, ["request_id"], "received"), "request_id", "left"))
    round_trip = (F.unix_micros("answered") - F.unix_micros("called")) / F.lit(1000.0)
    handled = (F.unix_micros("replied") - F.unix_micros("received")) / F.lit(1000.0)
    return calls.select(
        "route", "caller", "answerer", "outcome", "request_id", "called", "answered",
        round_trip.alias("round_trip_ms"), handled.alias("handled_ms"),
        (round_trip - handled).alias("transit_ms"))


def cluster_latency(calls: Any) -> Any:
    """Per (caller, answerer, route): calls, replies, refused, unanswered, and the p50, p95 and
    p99 of the round trip and the p50 of the handling and the transit, of the replies."""
    from pyspark.sql import functions as F

    replied = F.col("outcome") == "reply"
    quantiles = F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99))
    return (
        calls.groupBy("caller", "answerer", "route").agg(
            F.count(F.lit(1)).alias("calls"),
            F.count(F.when(replied, 1)).alias("replies"),
            F.count(F.when(F.col("outcome") == "refused", 1)).alias("refused"),
            F.count(F.when(F.col("outcome").isNull(), 1)).alias("unanswered"),
            F.percentile(F.when(replied, F.col("round_trip_ms")), quantiles).alias("trip"),
            F.percentile(F.when(replied, F.col("handled_ms")), F.lit(0.5)).alias("handled_p50"),
            F.percentile(F.when(replied, F.col("transit_ms")), F.lit(0.5)).alias("transit_p50"),
        )
        .select("caller", "answerer", "route", "calls", "replies", "refused", "unanswered",
                F.col("trip")[0].alias("p50_ms"), F.col("trip")[1].alias("p95_ms"),
                F.col("trip")[2].alias("p99_ms"), F.col("handled_p50").alias("handled_p50_ms"),
                F.col("transit_p50").alias("transit_p50_ms"))
        .orderBy(F.desc("calls"), "caller", "answerer", "route")
    )


def malformed(rows: Any) -> Any:
    """Per (protocol, transport, connection, peer): messages with a decode error, the first and
    last time, and an example error (the first one)."""
    from pyspark.sql import functions as F

    # A file repeats the open records of the connections still open: take one per connection.
    peers = (rows.where(F.col("kind") == "open")
             .select("connection", F.get_json_object(F.col("data").cast("string"), "$.peer")
                     .alias("peer"))
             .groupBy("connection").agg(F.min("peer").alias("peer")))
    bad = (
        _messages_only(rows).where(F.col("decode_error").isNotNull())
        .groupBy("protocol", "transport", "connection")
        .agg(
            F.count(F.lit(1)).alias("malformed"),
            F.min_by("decode_error", F.struct("timestamp", "offset", "message_index"))
            .alias("example_error"),
            F.min("timestamp").alias("first_seen"),
            F.max("timestamp").alias("last_seen"),
        )
    )
    return bad.join(peers, "connection", "left").select(
        "protocol", "transport", "connection", "peer", "malformed", "example_error", "first_seen",
        "last_seen")


def windows(rows: Any) -> Any:
    """Per minute (window_start, window_end), protocol, topic and field: count, min, mean and
    max of the numeric readings in the messages that clients sent in (each reading once, not
    once per subscriber it went out to)."""
    from pyspark.sql import functions as F

    candidates = rows.where(
        (F.col("kind") == "in") & F.col("decode_error").isNull()
        & F.col("message_type").isin(*_reading_types())
    ).select("timestamp", "protocol", "topic", "kind", "binary", "data")
    readings = candidates.mapInArrow(_readings_batches, READINGS_SCHEMA)
    return (
        readings.groupBy(F.window("timestamp", WINDOW).alias("window"), "protocol", "topic",
                         "field")
        .agg(F.count(F.lit(1)).alias("count"), F.min("value").alias("min"),
             F.avg("value").alias("mean"), F.max("value").alias("max"))
        .select(F.col("window.start").alias("window_start"),
                F.col("window.end").alias("window_end"),
                "protocol", "topic", "field", "count", "min", "mean", "max")
    )


def _readings_batches(batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow: message rows in, one row per reading out."""
    import pyarrow as pa

    from wireproto.pipeline.values import numeric_values

    schema = pa.schema([("timestamp", pa.timestamp("us", tz="UTC")), ("protocol", pa.string()),
                        ("topic", pa.string()), ("field", pa.string()), ("value", pa.float64())])
    for batch in batches:
        columns = batch.to_pydict()
        take: list[int] = []
        fields: list[str] = []
        values: list[float] = []
        for row, (protocol, kind, binary, data) in enumerate(zip(
                columns["protocol"], columns["kind"], columns["binary"], columns["data"],
                strict=True)):
            for name, value in numeric_values(protocol, kind, data, bool(binary)):
                take.append(row)
                fields.append(name)
                values.append(value)
        indices = pa.array(take, pa.int64())
        yield pa.RecordBatch.from_arrays([
            batch.column("timestamp").take(indices).cast(schema.field("timestamp").type),
            batch.column("protocol").take(indices),
            batch.column("topic").take(indices),
            pa.array(fields, pa.string()),
            pa.array(values, pa.float64()),
        ], schema=schema)


# -- small aggregates for the report ------------------------------------------------------------


def rate_bucket_seconds(span_seconds: float) -> int:
    """Bucket width for the rate plot: whole seconds, at most about 500 buckets."""
    return max(1, int(-(-span_seconds // 500)))


def rate_over_time(rows: Any, span_seconds: float) -> list[Any]:
    """(protocol, bucket start in seconds since the epoch, messages, bucket width) rows."""
    from pyspark.sql import functions as F

    width = rate_bucket_seconds(span_seconds)
    bucket = (F.floor(F.unix_micros("timestamp") / F.lit(1_000_000 * width)) * width)
    return (_messages_only(rows).groupBy("protocol", bucket.alias("bucket"))
            .agg(F.count(F.lit(1)).alias("messages"))
            .withColumn("width", F.lit(width))
            .orderBy("protocol", "bucket").collect())


def latency_histogram(pairs: Any) -> list[Any]:
    """(protocol, route, bin, count): the latencies of the ok answers (`ok_answer`, as
    `latency_summary` takes them), in bins of 1/20 of a decade (log10 of ms)."""
    from pyspark.sql import functions as F

    positive = F.greatest(F.col("latency_ms"), F.lit(0.001))
    return (pairs.where(ok_answer())
            .groupBy("protocol", "route", F.floor(F.log10(positive) * 20).alias("bin"))
            .agg(F.count(F.lit(1)).alias("count"))
            .orderBy("protocol", "route", "bin").collect())
