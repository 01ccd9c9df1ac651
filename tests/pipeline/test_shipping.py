"""Shipping capture files to a real S3 API server (moto_server on 127.0.0.1): each closed file is
uploaded and then removed, a failed upload keeps its file and is retried, and a broker ships
what its previous run left."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.brokers import LOCAL, start_service
from tests.pipeline.conftest import BUCKET, S3Server
from tests.support import eventually, wait_for
from wireproto import capture
from wireproto.capture.shipping import Shipper
from wireproto.config import CaptureSettings, Config, parse_listen
from wireproto.protocols.websmq.client import connect as websmq_connect


def stored(s3: S3Server, prefix: str, suffix: str = ".wpcap") -> dict[str, bytes]:
    """The objects under `prefix` whose names end with `suffix` (capture files, or their
    indexes with ".idx")."""
    fs = s3.filesystem()
    found = fs.get_file_info(pafs.FileSelector(f"{BUCKET}/{prefix}", allow_not_found=True))
    return {info.base_name: fs.open_input_file(info.path).readall() for info in found
            if info.base_name.endswith(suffix)}


def write_files(directory: Path, shipper: Shipper | None, count: int,
                clock: Any = time.time_ns) -> dict[str, bytes]:
    """Capture files written with a small rotation size; each, once closed, as it is."""
    closed: dict[str, bytes] = {}

    def on_closed(path: Path) -> None:
        closed[path.name] = path.read_bytes()
        if shipper is not None:
            shipper.file_closed(path)

    writer = capture.ThreadedCaptureWriter(directory, max_file_bytes=4096, broker="edge-1",
                                           clock=clock)
    writer.on_file_closed = on_closed
    writer.open_connection(1, "127.0.0.1:5000", "websmq", "ws")
    for number in range(count):
        writer.message(1, "in", b"\x00\x01t" + b"x" * 200 + str(number).encode(), True)
    writer.close()
    return closed


@pytest_twisted.ensureDeferred
async def test_each_closed_file_is_uploaded_then_removed(tmp_path: Path, s3: S3Server) -> None:
    shipper = Shipper(tmp_path, f"s3://{BUCKET}/ship", reactor, options=s3.options)
    shipper.start()
    try:
        closed = write_files(tmp_path, shipper, 80)
        assert len(closed) >= 4
        await eventually(lambda: shipper.counters.shipped == len(closed), timeout=30)
        assert stored(s3, "ship") == closed  # every file, byte for byte
        # Each with its index beside it: its size, its record boundaries (none this small),
        # where its records start and end, and their earliest and latest times.
        indexes = stored(s3, "ship", ".idx")
        assert {name.removesuffix(".idx") for name in indexes} == set(closed)
        for name, data in closed.items():
            records = capture.read_batch_from(
                data, 0, capture.decode_file_header(data).data_offset, name)
            assert json.loads(indexes[name + ".idx"]) == {
                "size": len(data), "boundaries": [], "version": 2,
                "records": [records.offset[0], len(data)],
                "times": [[min(records.timestamp_ns), max(records.timestamp_ns)]]}
        assert capture.capture_files(tmp_path) == []  # removed once confirmed
    finally:
        shipper.stop()


@pytest_twisted.ensureDeferred
async def test_a_failed_upload_keeps_the_file_and_is_retried(tmp_path: Path,
                                                             s3: S3Server) -> None:
    shipper = Shipper(tmp_path, "s3://later/ship", reactor, options=s3.options,
                      min_retry=0.1, max_retry=0.5)
    shipper.start()
    try:
        closed = write_files(tmp_path, shipper, 40)
        await eventually(lambda: shipper.counters.failed >= 2, timeout=30)
        assert {path.name for path in capture.capture_files(tmp_path)} == set(closed)
        assert shipper.counters.shipped == 0
        s3.filesystem().create_dir("later")  # the bucket is there now: the retries get in
        await eventually(lambda: shipper.counters.shipped == len(closed), timeout=30)
        assert capture.capture_files(tmp_path) == []
        fs = s3.filesystem()
        names = {info.base_name for info in fs.get_file_info(pafs.FileSelector("later/ship"))}
        assert names == set(closed) | {name + ".idx" for name in closed}
    finally:
        shipper.stop()


@pytest_twisted.ensureDeferred
async def test_brokers_sharing_a_target_keep_files_of_the_same_name_apart(
        tmp_path: Path, s3: S3Server) -> None:
    written = {}
    for broker in ("edge-1", "edge 2/b"):
        directory = tmp_path / broker.replace("/", "_")
        shipper = Shipper(directory, f"s3://{BUCKET}/fleet", reactor, options=s3.options,
                          broker=broker)
        shipper.start()
        try:
            written[broker] = write_files(directory, shipper, 30,
                                          clock=lambda: 1_800_000_000_000_000_000)
            await eventually(lambda shipper=shipper, broker=broker:
                             shipper.counters.shipped == len(written[broker]), timeout=30)
        finally:
            shipper.stop()
    # Both brokers wrote files of the same names (the same clock second, the same sequence).
    assert set(written["edge-1"]) == set(written["edge 2/b"])
    assert stored(s3, "fleet/edge-1") == written["edge-1"]
    assert stored(s3, "fleet/edge_2_b") == written["edge 2/b"]


def test_an_unreachable_upload_target_is_a_config_error(tmp_path: Path) -> None:
    from wireproto.config import ConfigError
    from wireproto.service import make_service

    config = Config(listeners=(parse_listen(f"websmq+length32@tcp:0:{LOCAL}"),),
                    capture=CaptureSettings(directory=str(tmp_path), upload="nope://x/y"))
    with pytest.raises(ConfigError, match="^capture: "):
        make_service(config, reactor)


@pytest_twisted.ensureDeferred
async def test_a_broker_ships_what_its_last_run_left(tmp_path: Path, s3: S3Server,
                                                      monkeypatch: Any) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wireproto")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wireproto-secret")
    settings = CaptureSettings(directory=str(tmp_path), flush_interval=0.05, node="edge-9",
                               upload=f"s3://{BUCKET}/brokers",
                               upload_endpoint=s3.endpoint, upload_region="us-east-1")
    config = Config(listeners=(parse_listen(f"websmq+length32@tcp:0:{LOCAL}"),),
                    capture=settings)
    for run in range(2):
        service, (bound,) = await start_service(config)
        try:
            client = await wait_for(websmq_connect(reactor, bound.address))
            await wait_for(client.publish("t", b"run %d" % run))
            await wait_for(client.disconnect())
        finally:
            await wait_for(service.stopService(), timeout=10)
        if run == 0:
            (left,) = capture.capture_files(tmp_path)  # closed at stop, not shipped yet
            first = left.read_bytes()
    # The second run shipped the first run's file when it started.
    # Under a folder of the broker's name: a fleet shares one target.
    await eventually(lambda: stored(s3, "brokers/edge-9").get(left.name) == first, timeout=30)
    assert not left.exists()
    assert capture.read_header(capture.capture_files(tmp_path)[0]).info["broker"] == "edge-9"
