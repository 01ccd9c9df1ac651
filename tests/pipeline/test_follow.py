"""`start_follow`, the live path of ``wireproto analyze --follow``: per-window rates of capture
files, published to a real broker over WEBSMQ length32 and received by a WEBSMQ subscriber;
a batch Spark runs again is not published twice."""

from __future__ import annotations

import json
import re
import signal
import socket
import ssl
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, threads

from tests.support import eventually, need_module, sleep, starts_its_own_spark, wait_for
from tests.test_capture_broker import LOCAL, start
from tests.test_cli import Child
from wireproto import capture
from wireproto.codecs import ubre, websmq
from wireproto.config import CaptureSettings, Config, WebsmqSettings, parse_listen
from wireproto.protocols.websmq.client import connect as websmq_connect

need_module("pyspark", "pip install -e '.[spark]'")

from wireproto.pipeline.follow import (  # noqa: E402
    PUBLISHED_FILE,
    HubAddress,
    HubPublisher,
    parse_hub,
    rate_topic,
    start_follow,
)

SECOND = 1_000_000_000
MINUTE = 60 * SECOND
T0 = 1_700_000_040 * SECOND  # on a minute boundary: 2023-11-14T22:14:00Z


def write_traffic(directory: Path) -> None:
    """Two finished minutes of WEBSMQ and UBRE traffic, then one record a few minutes later that
    moves the watermark past them (its own minute stays unfinished)."""
    with capture.CaptureWriter(directory) as writer:
        writer.open_connection(1, "127.0.0.1:5001", "websmq", "length32", timestamp_ns=T0)
        writer.open_connection(2, "127.0.0.1:5002", "websmq", "ws", timestamp_ns=T0)
        writer.open_connection(3, "127.0.0.1:5003", "ubre", "ws", timestamp_ns=T0)
        for number in range(5):  # minute 0: 5 publishes in, each delivered once
            frame = websmq.encode(websmq.Publish("plant/temp", b"x" * (number + 1)))
            writer.message(1, "in", frame, True, T0 + number * SECOND)
            writer.message(2, "out", frame, True, T0 + number * SECOND + 1000)
        for number in range(3):  # minute 0: 3 publishes, no subscriber
            writer.message(1, "in", websmq.encode(websmq.Publish("plant/hum", b"50")), True,
                           T0 + 10 * SECOND + number)
        for number in range(2):  # minute 1: 2 publishes in a batch record, delivered in one
            frames = [websmq.encode(websmq.Publish("plant/temp", b"abcd")) for _ in range(2)]
            writer.message(2, "out", capture.encode_batch(frames), True,
                           T0 + MINUTE + number * SECOND, batch=True)
        writer.message(3, "in", ubre.encode(ubre.Request(1, {"a": 1}, name="add")), False,
                       T0 + 20 * SECOND)
        writer.message(3, "out", ubre.encode(ubre.Success(1, 2)), False, T0 + 21 * SECOND)
        # The rates' own topic is left out, so the query never counts its own messages.
        writer.message(1, "in", websmq.encode(websmq.Publish("$analytics/rates/x", b"{}")), True,
                       T0 + 30 * SECOND)
        writer.message(1, "in", websmq.encode(websmq.Publish("plant/temp", b"late")), True,
                       T0 + 4 * MINUTE)


def iso(nanoseconds: int) -> str:
    return f"2023-11-14T22:{14 + (nanoseconds - T0) // MINUTE}:00Z"


EXPECTED = {
    ("$analytics/rates/websmq/plant/temp", iso(T0)): {
        "messages": 10, "messages_in": 5, "messages_out": 5, "bytes": 30, "avg_bytes": 3.0},
    ("$analytics/rates/websmq/plant/temp", iso(T0 + MINUTE)): {
        "messages": 4, "messages_in": 0, "messages_out": 4, "bytes": 16, "avg_bytes": 4.0},
    ("$analytics/rates/websmq/plant/hum", iso(T0)): {
        "messages": 3, "messages_in": 3, "messages_out": 0, "bytes": 6, "avg_bytes": 2.0},
    ("$analytics/rates/ubre/add", iso(T0)): {
        "messages": 1, "messages_in": 1, "messages_out": 0, "bytes": 7, "avg_bytes": 7.0},
}


def rates_received(inbox: list[websmq.Publish]) -> tuple[dict[Any, Any], set[int]]:
    """The rates published, by (topic, window start), and the batch ids they came in; a rate
    published twice fails."""
    received = {}
    batch_ids = set()
    for message in inbox:
        payload = json.loads(message.payload)
        assert payload["window_end"] == iso(
            T0 + MINUTE * (1 + int(payload["window_start"][14:16]) - 14))
        batch_ids.add(payload.pop("batch_id"))
        key = (message.topic, payload.pop("window_start"))
        assert key not in received, f"published twice: {key}"
        del payload["window_end"]
        assert payload.pop("protocol") == message.topic.split("/")[2]
        assert message.topic.endswith("/" + payload.pop("topic"))
        received[key] = payload
    return received, batch_ids


def run(query: Any) -> Any:
    """Wait for an availableNow query in a thread, so the reactor keeps serving the broker."""
    def wait() -> None:
        query.awaitTermination(90)
        assert not query.isActive, "the follow query did not finish"
        error = query.exception()
        assert error is None, error
    return threads.deferToThread(wait)


@pytest_twisted.ensureDeferred
async def test_finished_windows_reach_a_subscriber_once(tmp_path: Path, spark: Any) -> None:
    captures = tmp_path / "captures"
    write_traffic(captures)
    config = Config(
        listeners=(parse_listen(f"websmq+length32@tcp:0:{LOCAL}"),),
        websmq=WebsmqSettings(wildcards=True),
        capture=CaptureSettings(directory=str(tmp_path / "broker"), flush_interval=0.05),
    )
    service, (hub,) = await start(config)
    try:
        subscriber = await wait_for(websmq_connect(reactor, hub, wildcards=True))
        inbox: list[websmq.Publish] = []
        subscriber.subscribe("$analytics/#", inbox.append)
        await eventually(lambda: service.hub.subscribers("$analytics/rates/a"))

        checkpoint = tmp_path / "checkpoint"
        query = start_follow(spark, str(captures), hub=hub, checkpoint=str(checkpoint),
                             available_now=True)
        await wait_for(run(query), timeout=120)
        await eventually(lambda: len(inbox) >= len(EXPECTED))
        await sleep(0.3)  # nothing more arrives
        received, batch_ids = rates_received(inbox)
        assert received == EXPECTED
        assert len(batch_ids) == 1
        (published_batch,) = batch_ids
        assert (checkpoint / PUBLISHED_FILE).read_text().strip() == str(published_batch)

        # Spark runs the publishing batch again, as after a crash before its commit.
        commit = checkpoint / "commits" / str(published_batch)
        commit.unlink()
        (commit.parent / f".{published_batch}.crc").unlink(missing_ok=True)
        replay = start_follow(spark, str(captures), hub=hub, checkpoint=str(checkpoint),
                              available_now=True)
        await wait_for(run(replay), timeout=120)
        assert commit.exists()  # the batch did run again
        assert replay.lastProgress["batchId"] >= published_batch
        await sleep(0.3)
        assert len(inbox) == len(EXPECTED)
        await wait_for(subscriber.disconnect())
    finally:
        await wait_for(service.stopService(), timeout=10)

    # The broker captured the publishes it got from the follow query, once each.
    received_by_broker = [
        message for path in capture.capture_files(tmp_path / "broker")
        for record in capture.iter_records(path) if record.kind == capture.Kind.IN
        for message in record.messages()]  # the subscriber's Subscribe to a pattern, publishes
    rates = [websmq.decode(message).topic for message in received_by_broker
             if websmq.decode_header(message)[0] == websmq.MessageType.PUBLISH]
    assert sorted(rates) == sorted(topic for topic, _ in EXPECTED)


FOLLOWING = re.compile(r"^wireproto: following (\S+); publishing to (\S+); Ctrl-C stops$")


@starts_its_own_spark
@pytest_twisted.ensureDeferred
async def test_the_follow_command_publishes_live_and_stops_on_ctrl_c(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    captures = tmp_path / "captures"
    write_traffic(captures)
    config = Config(listeners=(parse_listen(f"websmq+length32@tcp:0:{LOCAL}"),),
                    websmq=WebsmqSettings(wildcards=True))
    service, (hub,) = await start(config)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    child = None
    try:
        subscriber = await wait_for(websmq_connect(reactor, hub, wildcards=True))
        inbox: list[websmq.Publish] = []
        subscriber.subscribe("$analytics/#", inbox.append)
        await eventually(lambda: service.hub.subscribers("$analytics/rates/a"))
        child = Child(sys.executable, "-m", "wireproto", "analyze", str(captures), "--out",
                      str(tmp_path / "out"), "--follow", "--hub", hub, "--master", "local[2]")
        await child.line(FOLLOWING, timeout=90)
        await eventually(lambda: len(inbox) >= len(EXPECTED), timeout=90)
        await sleep(0.3)
        assert rates_received(inbox)[0] == EXPECTED
        child.process.send_signal(signal.SIGINT)  # a live query: it runs until Ctrl-C
        assert await child.exit_code(timeout=60) == 0, child.output()
        assert not [line for line in child.stderr if "Traceback" in line], child.output()
        assert (tmp_path / "out" / "checkpoint" / PUBLISHED_FILE).exists()
        await wait_for(subscriber.disconnect())
    finally:
        if child is not None:
            child.kill()
        await wait_for(service.stopService(), timeout=10)


# Twisted's ssl: endpoint parser still hands pyOpenSSL objects to pyOpenSSL; not ours to fix.
@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_rates_go_to_a_tls_hub_that_is_verified(tmp_path: Path, tls_files: Any) -> None:
    key, cert = tls_files.key, tls_files.cert
    config = Config(listeners=(
        parse_listen(f"websmq+length32@tcp:0:{LOCAL}"),
        parse_listen(f"websmq+length32@ssl:0:{LOCAL}:privateKey={key}:certKey={cert}"),
    ))
    service, (plain, secure) = await start(config)
    try:
        subscriber = await wait_for(websmq_connect(reactor, plain))
        inbox: list[websmq.Publish] = []
        subscriber.subscribe("$analytics/rates/websmq/room", inbox.append)
        await eventually(lambda: service.hub.subscribers("$analytics/rates/websmq/room"))
        host, port = secure.split(":")[1:]
        trusted = f"ssl:{host}:{port}:hostname=localhost:caCertsDir={tls_files.ca_dir}"
        rate = websmq.Publish("$analytics/rates/websmq/room", b'{"messages":1}')
        await wait_for(threads.deferToThread(
            HubPublisher(trusted, tmp_path, "$analytics").send, [rate]))
        await eventually(lambda: inbox == [rate])

        for untrusted in (f"ssl:{host}:{port}:hostname=elsewhere.example:"
                          f"caCertsDir={tls_files.ca_dir}",  # not the certificate's name
                          f"ssl:{host}:{port}:hostname=localhost"):  # not a trusted authority
            publisher = HubPublisher(untrusted, tmp_path, "$analytics")
            with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
                await wait_for(threads.deferToThread(publisher.send, [rate]))
        await sleep(0.2)
        assert inbox == [rate]
        await wait_for(subscriber.disconnect())
    finally:
        await wait_for(service.stopService(), timeout=10)


def test_hub_endpoints_and_rate_topics(tmp_path: Path) -> None:
    assert parse_hub("tcp:127.0.0.1:8766") == HubAddress(socket.AF_INET, ("127.0.0.1", 8766))
    assert parse_hub("tcp:host=localhost:port=9000") == HubAddress(
        socket.AF_INET, ("localhost", 9000))
    assert parse_hub("tcp:[::1]:8766") == HubAddress(socket.AF_INET6, ("::1", 8766))
    assert parse_hub("unix:/run/hub.sock") == HubAddress(socket.AF_UNIX, "/run/hub.sock")
    assert parse_hub("unix:path=/run/hub.sock") == HubAddress(socket.AF_UNIX, "/run/hub.sock")
    secure = parse_hub("ssl:[::1]:8766:hostname=hub.example")
    assert (secure.family, secure.address, secure.server_hostname) == (
        socket.AF_INET6, ("::1", 8766), "hub.example")
    assert secure.tls is not None and secure.tls.verify_mode == ssl.CERT_REQUIRED
    assert parse_hub("ssl:host=10.0.0.1:port=8766").server_hostname == "10.0.0.1"
    with pytest.raises(ValueError, match="no .pem files"):
        parse_hub(f"ssl:127.0.0.1:8766:caCertsDir={tmp_path}")
    for bad in ("ws://127.0.0.1:8765/", "tcp:127.0.0.1", "tcp:127.0.0.1:http", "unix:", "8766",
                "ssl:127.0.0.1"):
        with pytest.raises(ValueError, match="give the endpoint of a WEBSMQ length32 listener"):
            parse_hub(bad)
    assert rate_topic("$analytics", "websmq", "plant/temp") == "$analytics/rates/websmq/plant/temp"
    assert rate_topic("$a", "ubre", "room 1/+") == "$a/rates/ubre/room%201/%2B"
    assert rate_topic("$a", "phyllo", "caf\u00e9") == "$a/rates/phyllo/caf%C3%A9"
    with pytest.raises(ValueError, match="topic prefix 'a/#'"):
        start_follow(None, str(tmp_path), hub="tcp:127.0.0.1:1", checkpoint=str(tmp_path),
                     topic_prefix="a/#")
