"""The filters the `wirecapture` data source applies itself (Spark's filter pushdown), and how.

Spark hands a Python data source's reader the filters of a query it could apply while reading
(`DataSourceReader.pushFilters`: each a comparison of one column with a literal, the list
ANDed). `conditions` takes those this source can apply exactly, and gives back the others for
Spark to apply. A `Pushdown` applies the ones taken, each where its column is first known:

- **per file** (`file`, `broker`, from the file's header): a file none of whose rows can match
  is not read at all;
- **per record** (`offset`, `timestamp`, `connection`, `kind`, `protocol`, `transport`,
  `binary`, from the 32-byte record header): a record that cannot match is dropped before its
  messages are split or decoded; and a segment of records whose span of offsets and times
  (`capture.Segment`, from a shipped file's index or a scan of the record headers) cannot match
  is not read;
- **per row** (`message_index` and the decoded columns): after decoding, before the rows go to
  Spark.

Every filter taken is applied in full, with SQL's rules for nulls (a comparison with null is
neither true nor false, so neither it nor its negation keeps the row), so the rows are exactly
those Spark's own filter would keep. Left to Spark: orderings of booleans and bytes, ``IN``
lists holding null, a time without a zone, and any value of a type the column does not hold.

Needs pyarrow and numpy, and pyspark for the filter classes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)

from wireproto import capture
from wireproto.capture.format import PROTOCOL_NAMES
from wireproto.pipeline.decode import KIND_NAMES

__all__ = ["Condition", "Pushdown", "conditions", "select_records"]

# What each column holds, as a pushed filter's literal is: the columns of each level.
FILE_COLUMNS = {"file": str, "broker": str}
RECORD_COLUMNS = {"offset": int, "timestamp": datetime, "connection": int, "kind": str,
                  "protocol": str, "transport": str, "binary": bool}
ROW_COLUMNS = {"message_index": int, "data": bytes, "message_type": str, "topic": str,
               "request_id": str, "body_size": int, "decode_error": str}
_TYPES: dict[str, type] = {**FILE_COLUMNS, **RECORD_COLUMNS, **ROW_COLUMNS}
_COMPARISONS: dict[type, str] = {
    EqualTo: "=", EqualNullSafe: "<=>", LessThan: "<", LessThanOrEqual: "<=",
    GreaterThan: ">", GreaterThanOrEqual: ">=", In: "in", IsNull: "null",
    IsNotNull: "not null", StringStartsWith: "starts", StringEndsWith: "ends",
    StringContains: "contains",
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_LONG = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class Condition:
    """One filter taken: `column` `test` `value` (a timestamp as microseconds since the epoch,
    an ``in`` list as a tuple), or its negation."""

    column: str
    test: str
    value: object = None
    negated: bool = False


def conditions(filters: Iterable[Filter], columns: Sequence[str]
               ) -> tuple[list[Condition], list[Filter]]:
    """The filters this source applies, as conditions, and those it leaves to Spark (the
    very objects it was given, as `pushFilters` must return them). `columns` are the reader's:
    a filter on another column is left to Spark."""
    taken: list[Condition] = []
    left: list[Filter] = []
    for spark_filter in filters:
        condition = _condition(spark_filter, columns)
        if condition is None:
            left.append(spark_filter)
        else:
            taken.append(condition)
    return taken, left


def _condition(spark_filter: Filter, columns: Sequence[str]) -> Condition | None:
    negated = isinstance(spark_filter, Not)
    leaf = spark_filter.child if isinstance(spark_filter, Not) else spark_filter
    test = _COMPARISONS.get(type(leaf))
    attribute = getattr(leaf, "attribute", None)
    if test is None or not isinstance(attribute, tuple) or len(attribute) != 1:
        return None
    column = attribute[0]
    kind = _TYPES.get(column)
    if kind is None or column not in columns:
        return None
    if test in ("null", "not null"):
        return Condition(column, test, None, negated)
    value = getattr(leaf, "value", None)
    if test == "<=>" and value is None:
        return Condition(column, "null", None, negated)
    if test in ("starts", "ends", "contains"):
        return Condition(column, test, value, negated) if kind is str and isinstance(
            value, str) else None
    if kind in (bool, bytes) and test not in ("=", "<=>", "in"):
        return None  # ordering booleans or bytes: left to Spark
    if test == "in":
        if not isinstance(value, (list, tuple)) or not value:
            return None  # an empty list, or one holding null: left to Spark
        values = [_literal(kind, item) for item in value]
        if any(item is None for item in values):
            return None
        return Condition(column, test, tuple(values), negated)
    literal = _literal(kind, value)
    return None if literal is None else Condition(column, test, literal, negated)


def _literal(kind: type, value: object) -> object:
    """`value` as a column of type `kind` holds it (a timestamp in microseconds), or None when
    it is not one."""
    if kind is datetime:
        if not isinstance(value, datetime) or value.tzinfo is None:
            return None  # a time without a zone: left to Spark
        return (value - _EPOCH) // _MICROSECOND
    if kind is int:
        in_range = isinstance(value, int) and not isinstance(value, bool) and \
            _LONG[0] <= value <= _LONG[1]
        return value if in_range else None
    if kind is bool:
        return value if isinstance(value, bool) else None
    if kind is bytes:
        return bytes(value) if isinstance(value, (bytes, bytearray)) else None
    return value if isinstance(value, str) else None


# -- evaluation -------------------------------------------------------------------------------


_ARROW_TYPES = {str: pa.string(), bool: pa.bool_(), bytes: pa.binary(), int: pa.int64(),
                datetime: pa.int64()}


def _arrow_type(column: str) -> pa.DataType:
    return _ARROW_TYPES[_TYPES[column]]


def _truth(condition: Condition, values: pa.Array) -> pa.Array:
    """The condition (not negated) for each value: true, false, or null where SQL says
    neither (a comparison with null)."""
    test = condition.test
    if test == "null":
        return pc.is_null(values)
    if test == "not null":
        return pc.is_valid(values)
    kind = _arrow_type(condition.column)
    if test == "in":
        found = pc.is_in(values, value_set=pa.array(condition.value, kind))
        return pc.if_else(pc.is_valid(values), found, pa.scalar(None, pa.bool_()))
    literal = pa.scalar(condition.value, kind)
    if test == "<=>":
        return pc.fill_null(pc.equal(values, literal), False)
    compare: Callable[[pa.Array, pa.Scalar], pa.Array] = {
        "=": pc.equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater,
        ">=": pc.greater_equal,
    }.get(test) or _STRING_TESTS[test]
    return compare(values, literal)


_STRING_TESTS: dict[str, Callable[[pa.Array, pa.Scalar], pa.Array]] = {
    "starts": lambda values, literal: pc.starts_with(values, pattern=literal.as_py()),
    "ends": lambda values, literal: pc.ends_with(values, pattern=literal.as_py()),
    "contains": lambda values, literal: pc.match_substring(values, pattern=literal.as_py()),
}


def keeps(condition: Condition, values: pa.Array) -> np.ndarray:
    """Which values the condition keeps: those for which it (or, negated, its negation) is
    true; never a null."""
    truth = _truth(condition, values)
    if condition.negated:
        truth = pc.invert(truth)
    return np.asarray(pc.fill_null(truth, False).to_numpy(zero_copy_only=False), bool)


def _name_table(names: dict[int, str]) -> pa.Array:
    """A code's name for each code 0-255 a record header can hold; null for codes without."""
    return pa.array([names.get(code) for code in range(256)], pa.string())


@dataclass(frozen=True)
class Pushdown:
    """The conditions taken from a query's filters, applied to files, segments, records and
    rows. Empty, it keeps everything."""

    taken: tuple[Condition, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.taken)

    def _on(self, columns: Mapping[str, type]) -> list[Condition]:
        return [condition for condition in self.taken if condition.column in columns]

    @property
    def needs_broker(self) -> bool:
        """Whether choosing files needs their brokers (their headers)."""
        return any(condition.column == "broker" for condition in self.taken)

    @property
    def skips_segments(self) -> bool:
        """Whether a segment's span of offsets and times can rule it out."""
        return any(condition.column in ("offset", "timestamp") for condition in self.taken)

    def keeps_file(self, file: str, broker: str | None = None) -> bool:
        """Whether rows of the file `file` (as rows name it) written by `broker` may match;
        a broker of None (not read) is not judged."""
        for condition in self._on(FILE_COLUMNS):
            value = file if condition.column == "file" else broker
            if value is not None and not keeps(condition, pa.array([value], pa.string()))[0]:
                return False
        return True

    def keeps_segment(self, segment: capture.Segment) -> bool:
        """Whether a record of the segment may match: its offsets lie from `start` up to
        before `end`, its times (in whole microseconds, as the column holds them) between its
        earliest and latest."""
        for condition in self.taken:
            if condition.column == "offset":
                low, high = segment.start, segment.end - 1
            elif condition.column == "timestamp":
                low, high = segment.min_ns // 1000, segment.max_ns // 1000
            else:
                continue
            if not _may_hold(condition, low, high):
                return False
        return True

    def record_mask(self, batch: capture.Batch) -> np.ndarray | None:
        """Which records of the batch may give a matching row, or None for all of them."""
        tests = self._on(RECORD_COLUMNS)
        if not tests or not len(batch):
            return None
        headers = np.frombuffer(batch.headers, _HEADER_DTYPE)
        mask = np.ones(len(batch), bool)
        for condition in tests:
            mask &= _record_keeps(condition, headers, batch)
        return None if mask.all() else mask

    def row_mask(self, rows: pa.RecordBatch) -> np.ndarray | None:
        """Which rows match the conditions on message_index and the decoded columns, or None
        for all of them."""
        tests = self._on(ROW_COLUMNS)
        if not tests or not rows.num_rows:
            return None
        mask = np.ones(rows.num_rows, bool)
        for condition in tests:
            mask &= keeps(condition, rows.column(condition.column))
        return None if mask.all() else mask


def _may_hold(condition: Condition, low: int, high: int) -> bool:
    """Whether some integer from `low` to `high` may satisfy the condition; True whenever
    unsure (a negation, a test a span cannot decide)."""
    if condition.negated:
        return True
    value = condition.value
    if condition.test == "in":
        assert isinstance(value, tuple)
        return any(low <= item <= high for item in value)
    if condition.test == "null":
        return False  # offsets and times are never null
    if not isinstance(value, int):
        return True
    return {"=": low <= value <= high, "<=>": low <= value <= high, "<": low < value,
            "<=": low <= value, ">": high > value, ">=": high >= value}.get(
        condition.test, True)


_HEADER_DTYPE = np.dtype([
    ("length", "<u4"), ("crc", "<u4"), ("timestamp_ns", "<i8"), ("connection", "<u8"),
    ("kind", "u1"), ("protocol", "u1"), ("transport", "u1"), ("flags", "u1"),
    ("reserved", "<u4"),
])
assert _HEADER_DTYPE.itemsize == capture.HEADER_SIZE
_NAMES: dict[str, Callable[[], dict[int, str]]] = {
    "kind": lambda: KIND_NAMES,
    "protocol": lambda: dict(PROTOCOL_NAMES),
    "transport": lambda: {code: name for name, code in capture.TRANSPORTS.items()},
}


def _record_keeps(condition: Condition, headers: np.ndarray, batch: capture.Batch
                  ) -> np.ndarray:
    """Which records the condition on a record column keeps, as the rows show the column."""
    column = condition.column
    if column in _NAMES:
        # The condition on each of the 256 codes' names, then looked up by each record's code.
        table = keeps(condition, _name_table(_NAMES[column]()))
        return table[headers[column]]
    if column == "timestamp":
        values = headers["timestamp_ns"] // 1000
    elif column == "connection":
        values = headers["connection"].astype(np.int64)
    elif column == "binary":
        return keeps(condition, pa.array((headers["flags"] & capture.FLAG_BINARY) != 0))
    else:  # offset
        values = np.asarray(batch.offset, np.int64)
    return keeps(condition, pa.array(values, pa.int64()))


def select_records(batch: capture.Batch, mask: np.ndarray) -> capture.Batch:
    """The records of `batch` that `mask` keeps, as a batch of their own."""
    chosen = np.flatnonzero(mask)
    kept = chosen.tolist()

    def pick(column: list[int]) -> list[int]:
        return [column[index] for index in kept]

    headers = np.frombuffer(batch.headers, np.dtype((np.void, capture.HEADER_SIZE)))
    return capture.Batch(
        offset=pick(batch.offset), timestamp_ns=pick(batch.timestamp_ns),
        connection=pick(batch.connection), kind=pick(batch.kind),
        protocol=pick(batch.protocol), transport=pick(batch.transport),
        flags=pick(batch.flags), data=[batch.data[index] for index in kept],
        headers=headers[chosen].tobytes(), end=batch.end, stop=batch.stop)
