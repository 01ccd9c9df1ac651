"""The live pipeline behind ``wireproto analyze --follow``: per-window message rates, published
back to the hub.

`start_follow` reads capture files as a stream (the ``wirecapture`` data source), counts the
in and out messages of each (protocol, topic) per event-time window, and, once the watermark
says a window is finished, publishes its figures as one JSON message on
``{topic_prefix}/rates/{protocol}/{topic}`` through a WEBSMQ length32 listener of the hub.

Publishing happens in ``foreachBatch`` on the driver, over a plain blocking socket. A batch
Spark runs again (after a failure between publishing and committing) is not published twice:
the last published batch id is kept in the checkpoint directory, and a batch id at or below it
is skipped. Every message carries its ``batch_id`` too.

Needs the ``spark`` extra.
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from wireproto.codecs import websmq
from wireproto.codecs.serialization import json_utf8
from wireproto.errors import InvalidTopic
from wireproto.pipeline.datasource import WireCaptureDataSource
from wireproto.topics import is_pattern

__all__ = ["start_follow", "HubPublisher", "HubAddress", "parse_hub", "rate_topic",
           "PUBLISHED_FILE"]

# The last batch id published, in the checkpoint directory.
PUBLISHED_FILE = "wireproto-published-batch"
_LENGTH32 = struct.Struct(">I")


@dataclass(frozen=True)
class HubAddress:
    """Where `HubPublisher` connects: a socket family and address, and for ``ssl:`` the TLS
    context and the name the certificate must have."""

    family: int
    address: Any
    tls: ssl.SSLContext | None = None
    server_hostname: str | None = None


def parse_hub(hub: str) -> HubAddress:
    """A hub endpoint: ``tcp:HOST:PORT`` (or ``tcp:host=HOST:port=PORT``), ``unix:PATH`` (or
    ``unix:path=PATH``), or ``ssl:HOST:PORT`` with the keywords of Twisted's ``ssl:`` client
    endpoints: ``hostname=`` (the name to verify; the host by default) and ``caCertsDir=`` (PEM
    files of the authorities to trust; the system's by default). TLS always verifies."""
    kind, _, rest = hub.partition(":")
    if kind in ("tcp", "ssl") and rest:
        parts = rest.split(":")
        fields: dict[str, str] = {}
        while parts and "=" in parts[-1]:  # keywords follow HOST:PORT, or stand alone
            name, _, value = parts.pop().partition("=")
            fields[name] = value
        if parts:
            host, _, port = ":".join(parts).rpartition(":")
            host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        else:
            host, port = fields.get("host", ""), fields.get("port", "")
        if host and port.isdigit() and 0 < int(port) < 65536:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            if kind == "tcp":
                return HubAddress(family, (host, int(port)))
            return HubAddress(family, (host, int(port)), _tls_context(fields.get("caCertsDir")),
                              fields.get("hostname") or host)
    elif kind == "unix" and rest:
        path = rest[len("path="):] if rest.startswith("path=") else rest
        if path:
            return HubAddress(socket.AF_UNIX, path)
    raise ValueError(f"hub {hub!r}: give the endpoint of a WEBSMQ length32 listener, as "
                     "tcp:HOST:PORT (tcp:127.0.0.1:8766), ssl:HOST:PORT or unix:PATH")


def _tls_context(ca_certs_dir: str | None) -> ssl.SSLContext:
    """A client context that verifies the hub: against the certificates in `ca_certs_dir`
    alone, as Twisted's caCertsDir does, or else against the system's authorities."""
    if not ca_certs_dir:
        return ssl.create_default_context()
    pems = sorted(Path(ca_certs_dir).glob("*.pem"))
    if not pems:
        raise ValueError(f"caCertsDir={ca_certs_dir}: no .pem files there")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, and checks the hostname
    context.load_verify_locations(cadata="".join(path.read_text() for path in pems))
    return context


def rate_topic(prefix: str, protocol: str | None, topic: str) -> str:
    """The WEBSMQ topic for a (protocol, topic) pair's rates. A captured topic that is not a
    valid WEBSMQ topic, or would be a wildcard pattern, is percent-encoded."""
    try:
        websmq.validate_topic(topic)
        valid = not is_pattern(topic) and "+" not in topic.split("/")
    except InvalidTopic:
        valid = False
    if not valid:
        topic = websmq.topic_from_text(topic)
    return f"{prefix}/rates/{protocol or 'unknown'}/{topic}"


class HubPublisher:
    """The foreachBatch function: each micro-batch's finished windows, one message each, sent
    to the hub; then the batch id is recorded, so a batch run again is skipped."""

    def __init__(self, hub: str, checkpoint: str | os.PathLike[str], topic_prefix: str,
                 timeout: float = 10.0) -> None:
        self.target = parse_hub(hub)
        self.hub = hub
        self.state = Path(checkpoint) / PUBLISHED_FILE
        self.topic_prefix = topic_prefix
        self.timeout = timeout

    def last_published(self) -> int | None:
        try:
            return int(self.state.read_text().strip())
        except FileNotFoundError:
            return None
        except ValueError:
            raise ValueError(f"{self.state}: not a batch id; remove the file to publish "
                             "again") from None

    def record(self, batch_id: int) -> None:
        self.state.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.state.with_name(self.state.name + ".tmp")
        temporary.write_text(f"{batch_id}\n")
        os.replace(temporary, self.state)

    def messages(self, rows: list[Any], batch_id: int) -> list[websmq.Publish]:
        published = []
        for row in rows:
            payload = {
                "protocol": row.protocol,
                "topic": row.topic,
                "window_start": _iso(row.window_start_us),
                "window_end": _iso(row.window_end_us),
                "messages": row.messages,
                "messages_in": row.messages_in,
                "messages_out": row.messages_out,
                "bytes": row.bytes,
                "avg_bytes": row.avg_bytes,
                "batch_id": batch_id,
            }
            published.append(websmq.Publish(
                rate_topic(self.topic_prefix, row.protocol, row.topic),
                json_utf8(payload, allow_nan=True)))
        return published

    def send(self, messages: list[websmq.Publish]) -> None:
        """Send the messages over one connection, then wait for the hub to close it after our
        end: it has then taken every frame."""
        frames = b"".join(_LENGTH32.pack(len(frame)) + frame
                          for frame in map(websmq.encode, messages))
        target = self.target
        try:
            with socket.socket(target.family, socket.SOCK_STREAM) as connection:
                connection.settimeout(self.timeout)
                connection.connect(target.address)
                if target.tls is None:
                    connection.sendall(frames)
                    connection.shutdown(socket.SHUT_WR)
                    while connection.recv(65536):
                        pass
                    return
                with target.tls.wrap_socket(
                        connection, server_hostname=target.server_hostname) as secure:
                    secure.sendall(frames)
                    # close_notify, and the hub's own: it has taken every frame.
                    secure.unwrap()
        except OSError as error:
            raise ConnectionError(f"hub {self.hub}: cannot publish: {error}") from error

    def __call__(self, frame: Any, batch_id: int) -> None:
        # Always run the whole batch: Spark checks that every state store partition committed.
        rows = frame.collect()
        last = self.last_published()
        if last is not None and batch_id <= last:
            return  # published before this batch was run again
        if rows:
            self.send(self.messages(rows, batch_id))
        self.record(batch_id)


def _iso(micros: int) -> str:
    return datetime.fromtimestamp(micros / 1_000_000, UTC).isoformat().replace("+00:00", "Z")


def window_rates(messages: Any, *, window: str, watermark: str, topic_prefix: str) -> Any:
    """Per (window, protocol, topic): messages (in, out, both) and body bytes (sum, mean), for
    in and out messages with a topic, leaving out the rates' own topics."""
    topic = F.col("topic")
    own = (topic == topic_prefix) | topic.startswith(topic_prefix + "/")
    return (
        messages.where(F.col("kind").isin("in", "out") & topic.isNotNull() & ~own)
        .withWatermark("timestamp", watermark)
        .groupBy(F.window("timestamp", window), "protocol", "topic")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.count_if(F.col("kind") == "in").alias("messages_in"),
            F.count_if(F.col("kind") == "out").alias("messages_out"),
            F.sum("body_size").alias("bytes"),
            F.avg("body_size").alias("avg_bytes"),
        )
        .select(
            F.unix_micros(F.col("window.start")).alias("window_start_us"),
            F.unix_micros(F.col("window.end")).alias("window_end_us"),
            "protocol", "topic", "messages", "messages_in", "messages_out", "bytes",
            "avg_bytes",
        )
    )


def start_follow(spark: Any, captures: str, *, hub: str, checkpoint: str,
                 window: str = "1 minute", watermark: str = "1 minute",
                 topic_prefix: str = "$analytics", trigger_seconds: float = 5.0,
                 available_now: bool = False, options: dict[str, str] | None = None) -> Any:
    """Start the streaming query over the capture directory `captures` and return it (a
    `pyspark.sql.streaming.StreamingQuery`). Each finished window's rates go to the hub `hub`
    (a WEBSMQ length32 listener) on ``{topic_prefix}/rates/{protocol}/{topic}``. `checkpoint`
    is a local directory: Spark's checkpoint and the last published batch id. With
    `available_now`, the query reads what is there and stops; otherwise it runs a micro-batch
    every `trigger_seconds`. `options` reach captures in object storage
    (wireproto.capture.storage)."""
    try:
        websmq.validate_topic(topic_prefix)
    except InvalidTopic as error:
        raise ValueError(f"topic prefix {topic_prefix!r}: {error}") from None
    if is_pattern(topic_prefix) or topic_prefix.endswith("/"):
        raise ValueError(f"topic prefix {topic_prefix!r}: use levels without wildcards and no "
                         "trailing '/'")
    if not available_now and not trigger_seconds > 0:
        raise ValueError(f"trigger_seconds must be positive, not {trigger_seconds}")
    publisher = HubPublisher(hub, checkpoint, topic_prefix)
    spark.dataSource.register(WireCaptureDataSource)
    rates = window_rates(spark.readStream.format("wirecapture").options(**(options or {}))
                         .load(captures),
                         window=window, watermark=watermark, topic_prefix=topic_prefix)
    writer = (rates.writeStream.outputMode("append").foreachBatch(publisher)
              .option("checkpointLocation", os.fspath(checkpoint)))
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    return writer.start()
