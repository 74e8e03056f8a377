"""The `rocketmq` Spark data source over CommitLog segments (Spark 4 Python data source API).

    spark.read.format("rocketmq").option("splitSize", "64m").load([store_dir, ...])

Options:
  splitSize       target bytes per partition (default 64m); cuts fall on record boundaries
  strict          "true": a corrupt record fails the job, naming file and offset
  maxMessageSize  bound on a plausible TOTALSIZE (default 4 MiB, RocketMQ's maxMessageSize)
  corruptLog      a directory: each task writes the corrupt ranges it met as JSON lines there
  decoder         "fast" (default) or "exact" (the codec per record; for tests and doubts)
  batchRows       rows per Arrow batch (default 8192)
  topics          comma-separated topics: only their records are decoded past the topic
                  (corrupt ranges are still reported). Not filter pushdown on purpose: a
                  reader with pushFilters fails in sessions without
                  spark.sql.python.filterPushdown.enabled, and this source must work anywhere.

Columns: see `SCHEMA`. Pass a narrower schema (`.schema("topic string, size int")` or
`read_commitlog(spark, paths, columns=[...])`) and only those fields are decoded: the Python
data source API has no column pruning, so the user schema is the pruning.

Planning (why the driver walks): records are only self-describing from a segment's start, so
the planner walks every segment once, reading 8-byte headers and jumping by TOTALSIZE, and
cuts splits at positions the walk visits. That costs one header read per record on the
driver (about 0.5 s per GiB of 1 KiB messages, and it warms the page cache the local readers
use), against walking from the segment start in every task, which costs O(splits^2).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from mqstore.storage.codec import DEFAULT_MAX_MESSAGE_SIZE

from .columnar import COLUMNS, corrupt_values, decode_batch, rows_to_batch
from .segments import Segment, discover_segments, message_runs, open_segment, parse_size, plan_segment

from mqstore.log import get_logger

log = get_logger(__name__)

FORMAT_NAME = "rocketmq"
DEFAULT_SPLIT_SIZE = "64m"
DEFAULT_BATCH_ROWS = 8192
MAX_BATCH_BYTES = 64 << 20  # keeps int32 Arrow offsets of a body column far from overflow

_T = {"bigint": LongType(), "int": IntegerType(), "string": StringType(), "timestamp": TimestampType(),
      "binary": BinaryType(), "map": MapType(StringType(), StringType(), True)}  # fmt: skip
_COLUMN_TYPES = {
    "commitlog_offset": "bigint",
    "size": "int",
    "topic": "string",
    "queue_id": "int",
    "queue_offset": "bigint",
    "sys_flag": "int",
    "flag": "int",
    "born_timestamp": "timestamp",
    "store_timestamp": "timestamp",
    "born_host": "string",
    "store_host": "string",
    "reconsume_times": "int",
    "tags": "string",
    "keys": "string",
    "properties": "map",
    "body": "binary",
    "msg_id": "string",
    "segment_file": "string",
    "body_crc": "int",
    "prepared_transaction_offset": "bigint",
    "uniq_key": "string",
    "tags_code": "bigint",
    "error": "string",
}
# Built by hand: parsing DDL needs a running SparkContext, and planner workers have none.
SCHEMA: StructType = StructType([StructField(n, _T[t], True) for n, t in _COLUMN_TYPES.items()])
_DDL_BY_NAME = {f.name: f for f in SCHEMA.fields}
assert list(_DDL_BY_NAME) == list(COLUMNS), "the Spark and Arrow column lists must agree"


class CorruptRecordError(RuntimeError):
    """strict mode met a corrupt record."""


@dataclass(frozen=True)
class SegmentSplit(InputPartition):
    """Bytes [start, end) of one segment; both ends are positions the walk visits."""

    path: str
    base_offset: int | None
    file_size: int
    start: int
    end: int

    @property
    def segment(self) -> Segment:
        return Segment(self.path, self.base_offset, self.file_size)


@dataclass(frozen=True)
class CommitLogPartition(InputPartition):
    """One Spark task: consecutive splits, packed up to splitSize so that many small
    segments (8 KiB test brokers, archives of small files) do not each cost a task."""

    splits: tuple[SegmentSplit, ...]


def pack_splits(splits: Sequence[SegmentSplit], split_size: int) -> list[CommitLogPartition]:
    parts: list[CommitLogPartition] = []
    current: list[SegmentSplit] = []
    size = 0
    for split in splits:
        if current and size + (split.end - split.start) > split_size:
            parts.append(CommitLogPartition(tuple(current)))
            current, size = [], 0
        current.append(split)
        size += split.end - split.start
    if current:
        parts.append(CommitLogPartition(tuple(current)))
    return parts


def _bool(options: dict[str, str], key: str) -> bool:
    return str(options.get(key, "false")).strip().lower() in ("1", "true", "yes", "on")


def _paths(options: dict[str, str]) -> list[str]:
    if "paths" in options:
        raw = options["paths"]
        paths = json.loads(raw) if raw.startswith("[") else raw.split(",")
    elif "path" in options:
        paths = options["path"].split(",")
    else:
        raise ValueError("rocketmq data source: give paths with load(path or [paths])")
    return [p for p in paths if p]


# (path, size, mtime_ns, split_size, max_message_size) -> ranges; the planner process is
# reused across queries (spark.python.worker.reuse), so a second query skips the walk.
_PLAN_CACHE: dict[tuple[str, int, int, int, int], list[tuple[int, int]]] = {}
PLAN_CACHE_MAX_SEGMENTS = 16384  # about 16 TiB of 1 GiB segments; then start over


def plan_splits(paths: Sequence[str], split_size: int, max_message_size: int) -> list[SegmentSplit]:
    splits: list[SegmentSplit] = []
    for seg in discover_segments(list(paths)):
        st = os.stat(seg.path)
        key = (seg.path, st.st_size, st.st_mtime_ns, split_size, max_message_size)
        ranges = _PLAN_CACHE.get(key)
        if ranges is None:
            buf = open_segment(seg.path)
            ranges = plan_segment(buf, seg, split_size, max_message_size) if len(buf) else []
            if len(_PLAN_CACHE) >= PLAN_CACHE_MAX_SEGMENTS:
                _PLAN_CACHE.clear()
            _PLAN_CACHE[key] = ranges
        splits.extend(SegmentSplit(seg.path, seg.base_offset, seg.file_size, s, e) for s, e in ranges)
    return splits


class RocketMQDataSource(DataSource):
    """CommitLog segments (RocketMQ 4.x, or written by mqstore) as a table."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        # Spark hands options over case-insensitively (lower-cased keys); normalise here.
        return RocketMQReader({str(k).lower(): str(v) for k, v in self.options.items()}, schema)


class RocketMQReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        options = {k.lower(): v for k, v in options.items()}
        for f in schema.fields:
            known = _DDL_BY_NAME.get(f.name)
            if known is None or known.dataType != f.dataType:
                raise ValueError(f"rocketmq data source: unknown column or type {f.simpleString()}; "
                                 f"columns are {SCHEMA.simpleString()}")  # fmt: skip
        self.columns = [f.name for f in schema.fields]
        self.paths = _paths(options)
        self.split_size = parse_size(options.get("splitsize", DEFAULT_SPLIT_SIZE))
        self.strict = _bool(options, "strict")
        self.max_message_size = int(options.get("maxmessagesize", DEFAULT_MAX_MESSAGE_SIZE))
        self.corrupt_log = options.get("corruptlog")
        self.fast = options.get("decoder", "fast").lower() != "exact"
        self.batch_rows = int(options.get("batchrows", DEFAULT_BATCH_ROWS))
        topics = options.get("topics")
        self.topics = tuple(t for t in topics.split(",") if t) if topics else None

    def partitions(self) -> list[InputPartition]:
        splits = plan_splits(self.paths, self.split_size, self.max_message_size)
        parts = pack_splits(splits, self.split_size)
        log.info("planned", segments=len({s.path for s in splits}), splits=len(splits), partitions=len(parts),
                 split_size=self.split_size)  # fmt: skip
        # Spark substitutes a partition of its own for an empty list; give it ours.
        return list(parts) or [CommitLogPartition(())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, CommitLogPartition)
        for split in partition.splits:
            yield from read_split(
                split,
                self.columns,
                strict=self.strict,
                fast=self.fast,
                max_message_size=self.max_message_size,
                batch_rows=self.batch_rows,
                corrupt_log=self.corrupt_log,
                topics=self.topics,
            )


def read_split(
    split: SegmentSplit,
    columns: Sequence[str],
    *,
    strict: bool = False,
    fast: bool = True,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    corrupt_log: str | None = None,
    topics: Sequence[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of one split: message rows, and one row per corrupt range."""
    from .columnar import arrow_schema

    import numpy as np

    schema = arrow_schema(columns)
    seg = split.segment
    buf = open_segment(seg.path)
    if not len(buf):
        return
    a = np.frombuffer(buf, dtype=np.uint8)
    positions: list[int] = []
    corrupt: list[dict[str, Any]] = []
    check = strict or bool(corrupt_log) or "error" in columns

    topic_schema = arrow_schema(["topic"])
    wanted = pa.array(list(topics), pa.string()) if topics else None

    def decoded() -> pa.RecordBatch:
        nonlocal positions
        if wanted is not None:
            # Topic first (cheap), then everything else for the records that match.
            got = decode_batch(buf, seg, positions, topic_schema, fast=fast, max_message_size=max_message_size, a=a)
            col = got.column(0)
            # A null topic is a record that failed decoding: keep it, so it is reported.
            keep = pc.or_kleene(pc.is_in(col, value_set=wanted), pc.is_null(col)).to_numpy(zero_copy_only=False)
            positions = [p for p, k in zip(positions, keep) if k]
            if not positions:
                return pa.RecordBatch.from_pylist([], schema=schema)
        batch = decode_batch(buf, seg, positions, schema, fast=fast, max_message_size=max_message_size, a=a)
        if check:
            _check_decoded(batch, buf, seg, positions, strict, corrupt, fast, max_message_size)
        return batch

    for item in message_runs(buf, seg, split.start, split.end, max_message_size, batch_rows, MAX_BATCH_BYTES):
        if isinstance(item, list):
            positions = item
            batch = decoded()
            if batch.num_rows:
                yield batch
            continue
        res = item
        where = f"{seg.path} at position {res.pos} (commitlog offset {(seg.base_offset or 0) + res.pos})"
        if strict:
            raise CorruptRecordError(f"corrupt record in {where}: {res.reason}")
        log.warning("corrupt_record", segment=seg.path, position=res.pos, length=res.next_pos - res.pos, reason=res.reason)
        row = corrupt_values(seg, res.pos, res.next_pos - res.pos, res.reason)
        corrupt.append(row)
        yield rows_to_batch([row], schema)
    if corrupt_log and corrupt:
        _write_corrupt_log(corrupt_log, split, corrupt)


def _check_decoded(
    batch: pa.RecordBatch,
    buf: Any,
    seg: Segment,
    positions: list[int],
    strict: bool,
    corrupt: list[dict[str, Any]],
    fast: bool,
    max_message_size: int,
) -> None:
    """Records whose header was fine but whose fields do not add up (found by full decode)."""
    if "error" in batch.schema.names and batch.column("error").null_count == batch.num_rows:
        return  # the common case: nothing to report, nothing decoded twice
    from .columnar import arrow_schema

    check = decode_batch(buf, seg, positions, arrow_schema(["commitlog_offset", "size", "error"]),
                         fast=fast, max_message_size=max_message_size)  # fmt: skip
    if check.column("error").null_count == check.num_rows:
        return
    rows = [r for r in check.to_pylist() if r["error"] is not None]
    for r in rows:
        if strict:
            raise CorruptRecordError(f"corrupt record in {seg.path} at commitlog offset {r['commitlog_offset']}: {r['error']}")
        corrupt.append({"commitlog_offset": r["commitlog_offset"], "size": r["size"], "segment_file": seg.path, "error": r["error"]})


def _write_corrupt_log(directory: str, split: SegmentSplit, corrupt: list[dict[str, Any]]) -> None:
    os.makedirs(directory, exist_ok=True)
    name = f"{os.path.basename(split.path)}-{abs(hash(split.path)) % 10**8:08d}-{split.start:012d}.jsonl"
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
        for row in corrupt:
            f.write(json.dumps(row, sort_keys=True) + "\n")


def count_corrupt_log(directory: str) -> int:
    """The counter of corrupt ranges the tasks of a job reported through `corruptLog`."""
    if not os.path.isdir(directory):
        return 0
    n = 0
    for name in os.listdir(directory):
        if name.endswith(".jsonl"):
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                n += sum(1 for _ in f)
    return n


_REGISTERED: set[int] = set()


def register(spark: SparkSession) -> None:
    """Make `spark.read.format("rocketmq")` available in this session (once: Spark warns on
    every re-registration)."""
    if id(spark) not in _REGISTERED:
        spark.dataSource.register(RocketMQDataSource)
        _REGISTERED.add(id(spark))


def read_commitlog(
    spark: SparkSession,
    paths: str | Sequence[str],
    *,
    columns: Sequence[str] | None = None,
    split_size: str | int | None = None,
    strict: bool = False,
    corrupt_log: str | None = None,
    topics: Sequence[str] | None = None,
    options: dict[str, str] | None = None,
) -> DataFrame:
    """A DataFrame of the records under `paths`, decoding only `columns` (default: all)."""
    register(spark)
    reader = spark.read.format(FORMAT_NAME)
    if columns is not None:
        unknown = [c for c in columns if c not in _DDL_BY_NAME]
        if unknown:
            raise ValueError(f"unknown columns {unknown}; columns are {list(_DDL_BY_NAME)}")
        reader = reader.schema(StructType([_DDL_BY_NAME[c] for c in columns]))
    if split_size is not None:
        reader = reader.option("splitSize", str(split_size))
    if strict:
        reader = reader.option("strict", "true")
    if corrupt_log:
        reader = reader.option("corruptLog", corrupt_log)
    if topics:
        reader = reader.option("topics", ",".join(topics))
    for k, v in (options or {}).items():
        reader = reader.option(k, v)
    path_list = [paths] if isinstance(paths, str) else list(paths)
    # json keeps commas in paths intact; the reader accepts both forms.
    return reader.option("paths", json.dumps([os.path.abspath(p) for p in path_list])).load()
