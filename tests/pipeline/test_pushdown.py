"""Filter pushdown in the `wirecapture` source (wireproto.pipeline.pushdown): a pushed query gives
exactly the rows of a plain read filtered by Spark, for many filter shapes; what the source
applies Spark does not apply again; a broker filter over eight brokers reads about an eighth of
the bytes, local and in object storage; records a filter rules out are never decoded."""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringStartsWith,
)

from tests.pipeline.conftest import BUCKET, S3Server
from wireproto import capture
from wireproto.codecs import nydus, ubre, websmq
from wireproto.pipeline import datasource, pushdown

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"
START_NS = 1_800_000_000 * 10**9  # 2027-01-15 08:00:00 UTC
BENCH = Path(__file__).resolve().parents[2] / "bench" / "_pushdown.py"


def _bench_pushdown() -> Any:
    """bench/_pushdown.py, whose page-cache helpers measure what a local read brings in."""
    spec = importlib.util.spec_from_file_location("bench_pushdown", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def stepping_clock(start: int = START_NS) -> Callable[[], int]:
    """A wall clock that steps back now and then, as one set by NTP does: 1 ms a call, and
    20 ms back every 100th."""
    now, calls = start, 0

    def clock() -> int:
        nonlocal now, calls
        calls += 1
        now += -20_000_000 if calls % 100 == 0 else 1_000_000
        return now

    return clock


def at(milliseconds: float) -> str:
    """The SQL literal of START_NS plus `milliseconds`."""
    return _sql_time(START_NS + int(milliseconds * 1_000_000))


def _sql_time(nanoseconds: int) -> str:
    moment = datetime.fromtimestamp(nanoseconds // 10**9, UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S}.{nanoseconds // 1000 % 1_000_000:06d}"


def write_broker(directory: Path, broker: str, messages: int, max_file_bytes: int = 6000,
                 payload: int = 20) -> list[Path]:
    """A broker's capture: WEBSMQ publishes in and fanned out in batch records, UBRE requests
    and answers, nydus invokes, and malformed frames, on a clock that steps back."""
    with capture.CaptureWriter(directory, broker=broker, max_file_bytes=max_file_bytes,
                               clock=stepping_clock()) as writer:
        writer.open_connection(1, "127.0.0.1:5001", "websmq", "ws")
        writer.open_connection(2, "127.0.0.1:5002", "websmq", "length32")
        writer.open_connection(3, "127.0.0.1:5003", "ubre", "ws")
        writer.open_connection(4, "127.0.0.1:5004", "nydus", "ws")
        fan_out: list[bytes] = []
        for number in range(messages):
            frame = websmq.encode(websmq.Publish(f"t/{number % 4}", b"v" * (number % payload)))
            writer.message(1, "in", frame, True)
            fan_out.append(frame)
            if len(fan_out) == 3:
                writer.message(2, "out", capture.encode_batch(fan_out), True, batch=True)
                fan_out = []
            if number % 3 == 0:
                writer.message(3, "in", ubre.encode(ubre.Request(number, {"n": number},
                                                                 name="add")), False)
                writer.message(3, "out", ubre.encode(ubre.Success(number, number)), False)
            if number % 5 == 0:
                writer.message(4, "in", nydus.encode(nydus.Invoke(
                    f"c{number}", f"/dev/{number % 3}", {"n": number})).encode(), False)
            if number % 17 == 0:
                writer.message(1, "in", b"\x00\x09ab", True)  # a truncated frame
        writer.close_connection(2, "bye")
    return capture.capture_files(directory)


def write_odd_records(directory: Path) -> Path:
    """Records a broker does not write but a reader meets: protocol code 0 and codes without a
    name (null protocol, transport), a kind without a name (null kind), a batch record that
    does not split."""
    directory.mkdir(parents=True)
    path = directory / "wirecapture-20270115T080000-000001.wpcap"
    websmq_code = capture.PROTOCOLS["websmq"]
    stamp = START_NS + 70_000_000
    records = [
        capture.encode_record(capture.Kind.OPEN, 9, b'{"peer": "127.0.0.1:5009"}',
                              timestamp_ns=stamp, protocol=websmq_code, transport=1),
        capture.encode_record(capture.Kind.IN, 9, b"zz", timestamp_ns=stamp + 1_000,
                              protocol=0, transport=0),
        capture.encode_record(capture.Kind.IN, 9, b"zz", timestamp_ns=stamp + 2_000,
                              protocol=99, transport=42, flags=capture.FLAG_BINARY),
        capture.encode_record(7, 9, b"?", timestamp_ns=stamp + 3_000, protocol=websmq_code,
                              transport=1),
        capture.encode_record(capture.Kind.IN, 9, capture.encode_batch(
            [websmq.encode(websmq.Publish("t/odd", b"1")), b"\x00\x02a#", b""]),
            timestamp_ns=stamp + 4_000, protocol=websmq_code, transport=3,
            flags=capture.FLAG_BATCH | capture.FLAG_BINARY),
        capture.encode_record(capture.Kind.IN, 9, b"\x00\x00\x00\x09ab",
                              timestamp_ns=stamp - 5_000, protocol=websmq_code, transport=3,
                              flags=capture.FLAG_BATCH | capture.FLAG_BINARY),
    ]
    path.write_bytes(capture.encode_file_header({"format": "wirecapture", "broker": "raw",
                                                 "created_ns": stamp}) + b"".join(records))
    return path


def write_fleet(directory: Path) -> list[Path]:
    """Four brokers (two files of broker "a", one of each other) and the odd records."""
    paths = []
    for broker in ("a", "b", "c d", "é"):
        paths += write_broker(directory / broker.replace(" ", "_"), broker, 160,
                              max_file_bytes=16000 if broker == "a" else 1 << 20)
    return paths + [write_odd_records(directory / "raw")]


@contextmanager
def pushdown_on(spark: Any) -> Iterator[None]:
    before = spark.conf.get(PUSHDOWN)
    spark.conf.set(PUSHDOWN, "true")
    try:
        yield
    finally:
        spark.conf.set(PUSHDOWN, before)


def comparable(rows: list[Any]) -> list[tuple[Any, ...]]:
    return sorted(tuple(bytes(value) if isinstance(value, (bytes, bytearray)) else value
                        for value in row) for row in rows)


def read_in_process(location: Path | str, filters: list[Any] | None = None,
                    **options: str) -> pa.Table:
    """What Spark's tasks read, in this process: the reader given the filters, its partitions
    read in turn."""
    reader = datasource.WireCaptureReader({"path": str(location), **options})
    left = reader.pushFilters(filters or [])
    assert left == [], left
    batches = [batch for part in reader.partitions() for batch in reader.read(part)]
    return pa.Table.from_batches(batches, schema=reader.schema)


# -- which filters the source takes -------------------------------------------------------------


def test_the_source_takes_the_filters_it_applies_and_leaves_the_others() -> None:
    moment = datetime(2027, 1, 15, 8, tzinfo=UTC)
    taken = [
        EqualTo(("broker",), "a"), Not(EqualTo(("protocol",), "ubre")),
        In(("kind",), ["in", "out"]), IsNull(("protocol",)), IsNotNull(("topic",)),
        GreaterThanOrEqual(("timestamp",), moment), LessThan(("offset",), 100),
        EqualNullSafe(("broker",), None), StringStartsWith(("topic",), "t/"),
        StringContains(("file",), "wpcap"), EqualTo(("binary",), True),
        LessThanOrEqual(("body_size",), 10), GreaterThan(("connection",), 2),
        EqualTo(("data",), b"\x00"), IsNotNull(("data",)),
    ]
    left = [
        LessThan(("data",), b"\x01"),  # orderings of bytes
        GreaterThan(("binary",), False),  # and of booleans
        In(("protocol",), ["ubre", None]),  # a list holding null
        In(("protocol",), []),
        EqualTo(("timestamp",), datetime(2027, 1, 15, 8)),  # a time without a zone
        EqualTo(("connection",), "2"), EqualTo(("connection",), True),
        EqualTo(("connection",), 1 << 63), EqualTo(("broker",), 1),
        EqualTo(("peer",), "x"), EqualTo(("broker", "name"), "a"),
        StringStartsWith(("connection",), "1"), EqualTo(("topic",), None),
    ]
    names = list(datasource.ARROW_SCHEMA.names)
    conditions, given_back = pushdown.conditions(taken + left, names)
    assert len(conditions) == len(taken)
    assert all(back is original for back, original in zip(given_back, left, strict=True))
    assert conditions[5] == pushdown.Condition("timestamp", ">=", START_NS // 1000)
    # A column the reader does not make (a schema of some columns) is Spark's.
    assert pushdown.conditions([EqualTo(("broker",), "a")], ["topic"])[0] == []


# -- the rows -----------------------------------------------------------------------------------

# (filter, whether the source applies all of it): every shape of filter Spark pushes, on every
# column, alone and together, and filters it cannot push or the source leaves to Spark.
SHAPES: list[tuple[str, bool | None]] = [
    ("broker = 'b'", True), ("broker <> 'b'", True), ("broker in ('a', 'é')", True),
    ("broker not in ('a', 'c d')", True), ("broker < 'b'", True), ("broker >= 'c'", True),
    ("broker like 'c%'", True), ("broker like '%é'", True), ("broker is null", True),
    ("not (broker <=> 'a')", True), ("file like '%-000002.wpcap'", True),
    (f"timestamp >= '{at(150)}'", True), (f"timestamp < '{at(80)}'", True),
    (f"timestamp <= '{at(70.001)}'", True), (f"timestamp > '{at(190)}'", True),
    (f"timestamp between '{at(50)}' and '{at(120)}'", True),
    (f"timestamp = '{at(70.004)}'", True), (f"timestamp <> '{at(70.004)}'", True),
    (f"timestamp in ('{at(70.004)}', '{at(100)}')", True),
    ("offset >= 9000", True), ("offset < 600", True), ("offset = {first}", True),
    ("connection = 2", True), ("connection in (1, 3)", True), ("connection > 2", True),
    ("kind = 'open'", True), ("kind in ('in', 'out')", True), ("kind <> 'close'", True),
    ("kind is null", True), ("protocol = 'ubre'", True), ("protocol is null", True),
    ("protocol <> 'websmq'", True), ("protocol not in ('websmq', 'ubre')", True),
    ("protocol >= 'o'", True), ("protocol like 'n%'", True),
    ("transport = 'length32'", True), ("transport is null", True), ("binary", True),
    ("not binary", True), ("message_index > 0", True), ("message_type = 'publish'", True),
    ("message_type is null", True), ("message_type in ('request', 'success')", True),
    ("message_type <> 'publish'", True), ("topic like 't/1%'", True),
    ("request_id is not null", True), ("body_size >= 10", True),
    ("decode_error is not null", True),
    (f"data = X'{websmq.encode(websmq.Publish('t/odd', b'1')).hex()}'", True),
    ("data is not null", True),
    (f"broker = 'a' and protocol = 'ubre' and timestamp >= '{at(60)}'"
     " and message_type = 'request'", True),
    ("broker in ('b', 'c d') and kind = 'in' and topic = 't/2' and connection = 1", True),
    (f"timestamp < '{at(90)}' and not binary and offset > 500", True),
    ("data > X'00'", False), ("length(topic) > 3", False),
    ("protocol = 'ubre' or broker = 'a'", False), ("broker = 'a' and length(topic) = 3", False),
    ("protocol in ('ubre', null)", False), ("date(timestamp) = '2027-01-15'", None),
]


@pytest.mark.timeout(600)
def test_pushed_filters_give_the_rows_of_a_plain_read_filtered_by_spark(
        tmp_path: Path, spark: Any) -> None:
    from pyspark.sql import functions as F

    paths = write_fleet(tmp_path)
    # The first record of every file of broker "a" (its header's length varies).
    first = str(capture.read_header(paths[0]).data_offset)
    shapes = [(shape.replace("{first}", first), whole) for shape, whole in SHAPES]
    columns = [F.col(name) for name in datasource.ARROW_SCHEMA.names]

    def every_shape(load: Callable[[], Any]) -> Any:
        """One query of every shape's rows, each tagged with its shape's number (one query:
        Spark plans and runs them together)."""
        frames = [load().where(shape).select(F.lit(number).alias("shape"), *columns)
                  for number, (shape, _) in enumerate(shapes)]
        everything = frames[0]
        for frame in frames[1:]:
            everything = everything.unionByName(frame)
        return everything

    def rows_of(frame: Any) -> list[list[tuple[Any, ...]]]:
        found: list[list[Any]] = [[] for _ in shapes]
        for row in frame.collect():
            found[row.shape].append(row[1:])
        return [comparable(rows) for rows in found]

    # Spark's own filter over every row the source makes: pushdown off, nothing is pushed.
    plain = spark.read.format("wirecapture").load(str(tmp_path)).coalesce(1).cache()
    every = plain.count()
    expected = rows_of(every_shape(lambda: plain))
    plain.unpersist()
    with pushdown_on(spark):
        pushed = every_shape(lambda: spark.read.format("wirecapture").load(str(tmp_path)))
        plan = pushed._jdf.queryExecution().executedPlan().toString()
        got = rows_of(pushed)
    for number, (shape, _) in enumerate(shapes):
        assert got[number] == expected[number], shape
    # A filter the source applies in full is not applied again: no Filter above its scan.
    branches = plan.split(" AS shape#")[1:]
    assert len(branches) == len(shapes)
    for (shape, whole), branch in zip(shapes, branches, strict=True):
        if whole is not None:
            assert ("Filter " in branch.split("BatchScan")[0]) != whole, (shape, branch)
    # Each shape keeps some rows (but one that none can match), and all but a few drop some.
    kept = [len(rows) for rows in expected]
    assert every > 1000 and kept[SHAPES.index(("broker is null", True))] == 0
    assert sum(count > 0 for count in kept) == len(shapes) - 1
    assert sum(count < every for count in kept) >= len(shapes) - 2


def test_a_stream_with_filters_gives_the_rows_of_a_batch_read(tmp_path: Path,
                                                              spark: Any) -> None:
    write_fleet(tmp_path / "fleet")
    shape = (f"broker in ('a', 'raw') and protocol = 'websmq' and timestamp >= '{at(60)}'"
             " and message_type is null")
    with pushdown_on(spark):
        query = (spark.readStream.format("wirecapture").load(str(tmp_path / "fleet"))
                 .where(shape).writeStream.format("memory").queryName("pushed_stream")
                 .trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        query.awaitTermination(120)
        streamed = comparable(spark.table("pushed_stream").collect())
        batch = comparable(spark.read.format("wirecapture").load(str(tmp_path / "fleet"))
                           .where(shape).collect())
    assert streamed == batch and len(batch) > 5


# -- what is read and decoded -------------------------------------------------------------------


def test_segments_outside_a_time_window_are_not_read(tmp_path: Path, monkeypatch: Any) -> None:
    paths = write_broker(tmp_path, "a", 3000, max_file_bytes=1 << 20)
    (path,) = paths
    monkeypatch.setattr(datasource, "SCAN_GRAIN", 4096)
    low, high = START_NS // 1000 + 900_000, START_NS // 1000 + 1_400_000
    window = [GreaterThanOrEqual(("timestamp",), datetime.fromtimestamp(low / 1e6, UTC)),
              LessThan(("timestamp",), datetime.fromtimestamp(high / 1e6, UTC))]
    assert datetime.fromtimestamp(low / 1e6, UTC).microsecond == low % 1_000_000

    reads: list[tuple[int | None, int | None]] = []
    read_batch = capture.read_batch

    def counted(path: Any, start_offset: Any = None, max_records: Any = None,
                available: Any = None) -> capture.Batch:
        batch = read_batch(path, start_offset, max_records, available)
        reads.append((start_offset, batch.end))
        return batch

    monkeypatch.setattr(capture, "read_batch", counted)
    table = read_in_process(tmp_path, window)
    # The rows of the window: those a plain read holds whose time is in it, the clock's steps
    # back included.
    every = read_in_process(tmp_path)
    micros = every.column("timestamp").cast(pa.int64()).to_pylist()
    expected = sorted((offset, index) for offset, index, stamp in zip(
        every.column("offset").to_pylist(), every.column("message_index").to_pylist(), micros,
        strict=True) if low <= stamp < high)
    assert sorted(zip(table.column("offset").to_pylist(),
                      table.column("message_index").to_pylist(), strict=True)) == expected
    assert 0 < len(expected) < len(micros) // 4
    reads.clear()
    read_in_process(tmp_path, window)
    read_bytes = sum(end - (start or 0) for start, end in reads)
    assert read_bytes < path.stat().st_size // 4, (read_bytes, path.stat().st_size)


def test_records_a_filter_rules_out_are_not_decoded(tmp_path: Path, monkeypatch: Any) -> None:
    from wireproto.pipeline import rows

    write_broker(tmp_path, "a", 400)
    decoded: list[int] = []
    decode_message = rows.decode_message

    def counted(protocol: int, kind: int, data: bytes, binary: bool) -> Any:
        decoded.append(protocol)
        return decode_message(protocol, kind, data, binary)

    monkeypatch.setattr(rows, "decode_message", counted)
    read_in_process(tmp_path)
    assert {capture.PROTOCOLS["websmq"], capture.PROTOCOLS["ubre"]} <= set(decoded)
    decoded.clear()
    table = read_in_process(tmp_path, [EqualTo(("protocol",), "ubre"),
                                       EqualTo(("message_type",), "request")])
    assert set(decoded) == {capture.PROTOCOLS["ubre"]}
    assert set(table.column("message_type").to_pylist()) == {"request"}
    assert table.num_rows == len(range(0, 400, 3))
    decoded.clear()
    assert read_in_process(tmp_path, [In(("connection",), [2]), EqualTo(("kind",), "in")]
                           ).num_rows == 0
    assert decoded == []


# -- bytes read: local files and object storage -----------------------------------------------


def write_eight_brokers(directory: Path) -> list[Path]:
    paths = []
    for number in range(8):
        paths += write_broker(directory / f"site-{number}", f"site-{number}", 6000,
                              max_file_bytes=64 << 20, payload=200)
    return paths


def test_a_broker_filter_over_eight_brokers_reads_an_eighth_of_the_local_bytes(
        tmp_path: Path, spark: Any) -> None:
    cache = _bench_pushdown()
    paths = write_eight_brokers(tmp_path)
    total = sum(path.stat().st_size for path in paths)
    assert len(paths) == 8 and total > 8 << 20

    def bytes_read(frame: Any) -> tuple[list[tuple[Any, ...]], int]:
        cache.evict(paths)
        assert cache.resident_bytes(paths) < total // 100, "the page cache kept the files"
        rows = comparable(frame.select("broker", "offset", "message_index", "topic").collect())
        return rows, cache.resident_bytes(paths)

    plain_rows, plain_bytes = bytes_read(
        spark.read.format("wirecapture").load(str(tmp_path)).where("broker = 'site-3'"))
    with pushdown_on(spark):
        rows, pushed_bytes = bytes_read(
            spark.read.format("wirecapture").load(str(tmp_path)).where("broker = 'site-3'"))
    assert rows == plain_rows and len(rows) > 6000
    assert plain_bytes > total * 0.95
    assert pushed_bytes < total * 0.14, (pushed_bytes, total)


class CountingProxy:
    """A TCP relay in front of the S3 API server that counts the bytes it sends back."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.served = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(client, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True),
                             daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
                if counted:
                    with self.lock:
                        self.served += len(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def test_filters_read_an_eighth_of_the_objects_bytes(tmp_path: Path, spark: Any,
                                                     s3: S3Server, monkeypatch: Any) -> None:
    from wireproto.capture import storage

    paths = write_eight_brokers(tmp_path / "local")
    monkeypatch.setattr(storage, "INDEX_GRAIN", 64 << 10)  # many segments in each index
    fs = s3.filesystem()
    indexes = {}
    for path in paths:
        key = f"{BUCKET}/fleet/{path.parent.name}/{path.name}"
        s3.upload(path, key.split("/", 1)[1])
        indexes[key + ".idx"] = storage.file_index(path)
        with fs.open_output_stream(key + ".idx") as out:
            out.write(indexes[key + ".idx"])
    total = sum(path.stat().st_size for path in paths)
    proxy = CountingProxy(int(s3.endpoint.rsplit(":", 1)[1]))
    options = {**s3.options, "s3.endpoint": f"http://127.0.0.1:{proxy.port}"}
    location = f"s3://{BUCKET}/fleet"
    window = f"timestamp >= '{at(2000)}' and timestamp < '{at(2600)}'"
    columns = ["broker", "offset", "message_index", "topic"]

    def served(where: str) -> tuple[list[tuple[Any, ...]], int]:
        before = proxy.served
        frame = spark.read.format("wirecapture").options(**options).load(location)
        rows = comparable(frame.where(where).select(*columns).collect())
        return rows, proxy.served - before

    try:
        local = spark.read.format("wirecapture").load(str(tmp_path / "local"))
        plain_rows, plain_bytes = served("broker = 'site-3'")
        assert plain_rows == comparable(local.where("broker = 'site-3'").select(*columns)
                                        .collect())
        assert plain_bytes > total
        with pushdown_on(spark):
            rows, pushed_bytes = served("broker = 'site-3'")
            assert rows == plain_rows
            assert pushed_bytes < total * 0.14, (pushed_bytes, total)
            # A time window skips the segments of each object outside it, by the index.
            expected = comparable(local.where(window).select(*columns).collect())
            rows, window_bytes = served(window)
            assert rows == expected and len(rows) > 1000
            assert window_bytes < total * 0.5, (window_bytes, total)
            # An index written before it held times still splits objects; the rows are the
            # same, every segment read.
            for key, index in indexes.items():
                older = json.loads(index)
                with fs.open_output_stream(key) as out:
                    out.write(json.dumps({"size": older["size"],
                                          "boundaries": older["boundaries"]}).encode())
            rows, older_bytes = served(window)
            assert rows == expected and older_bytes > total
    finally:
        proxy.close()


# -- the index ----------------------------------------------------------------------------------


def test_a_files_index_holds_the_times_of_its_segments(tmp_path: Path,
                                                       monkeypatch: Any) -> None:
    from wireproto.capture import storage

    (path,) = write_broker(tmp_path, "a", 2000, max_file_bytes=1 << 20)
    monkeypatch.setattr(storage, "INDEX_GRAIN", 8192)
    index = json.loads(storage.file_index(path))
    records = list(capture.iter_records(path))
    assert index["version"] == 2 and index["size"] == path.stat().st_size
    assert index["records"] == [records[0].offset, records[-1].offset + records[-1].size]
    starts = [index["records"][0], *index["boundaries"]]
    ends = [*index["boundaries"], index["records"][1]]
    assert len(index["times"]) == len(starts) > 10
    for start, end, (low, high) in zip(starts, ends, index["times"], strict=True):
        stamps = [record.timestamp_ns for record in records if start <= record.offset < end]
        assert stamps and (low, high) == (min(stamps), max(stamps))
    assert any(low < high - 2_000_000 for low, high in index["times"])

    store = storage.open_store(tmp_path)
    name = str(path)
    (tmp_path / f"{path.name}.idx").write_text(json.dumps(index))
    read = store.index(name, path.stat().st_size)
    assert read.boundaries == index["boundaries"]
    assert [(part.start, part.end, part.min_ns, part.max_ns) for part in read.segments] == [
        (start, end, low, high) for start, end, (low, high) in zip(
            starts, ends, index["times"], strict=True)]
    # An index of boundaries alone (one written before times were) still splits the file.
    older = {"size": index["size"], "boundaries": index["boundaries"]}
    for damaged in (older, {**index, "times": index["times"][1:]},
                    {**index, "records": [0, index["records"][1]]},
                    {**index, "times": [[2, 1]] * len(starts)},
                    {**index, "records": [index["records"][0], index["size"] + 1]}):
        (tmp_path / f"{path.name}.idx").write_text(json.dumps(damaged))
        read = store.index(name, path.stat().st_size)
        assert read.boundaries == index["boundaries"] and read.segments is None
    (tmp_path / f"{path.name}.idx").write_text(json.dumps({**index, "size": 5}))
    assert store.index(name, path.stat().st_size) is None
    # One far larger than a writer makes is not read at all.
    (tmp_path / f"{path.name}.idx").write_text(json.dumps(
        {**index, "pad": "x" * storage.MAX_INDEX_BYTES}))
    assert store.index(name, path.stat().st_size) is None


def test_a_header_is_read_without_the_records_after_it(tmp_path: Path) -> None:
    cache = _bench_pushdown()
    (path,) = write_broker(tmp_path, "a", 8000, max_file_bytes=64 << 20, payload=200)
    assert path.stat().st_size > 2 << 20
    cache.evict([path])
    assert capture.read_header(path).info["broker"] == "a"
    assert cache.resident_bytes([path]) <= 256 << 10
    # A header longer than the first read is read whole.
    long = tmp_path / "long" / path.name
    long.parent.mkdir()
    long.write_bytes(capture.encode_file_header({"format": "wirecapture", "broker": "b",
                                                 "note": "x" * 10_000}))
    assert capture.read_header(long).info["broker"] == "b"
    long.write_bytes(long.read_bytes()[:5000])
    with pytest.raises(capture.IncompleteCapture, match=str(long)):
        capture.read_header(long)


def test_a_read_with_nothing_to_read_gives_no_rows(tmp_path: Path, spark: Any) -> None:
    # Spark stands one partition of its own in for none: an empty directory, or files the
    # filters all rule out.
    (tmp_path / "empty").mkdir()
    assert spark.read.format("wirecapture").load(str(tmp_path / "empty")).count() == 0
    write_broker(tmp_path / "a", "a", 10)
    with pushdown_on(spark):
        assert spark.read.format("wirecapture").load(str(tmp_path / "a")).where(
            "broker = 'b'").count() == 0
