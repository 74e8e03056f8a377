"""The `rocketmq` data source: every column against the codec, splits, pruning, corruption."""

from __future__ import annotations

import shutil
import struct
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("pyspark")  # an optional extra: without it these tests are skipped, not errors

from mqstore.pipeline.columnar import COLUMNS, arrow_schema, decode_batch  # noqa: E402
from mqstore.pipeline.datasource import SegmentSplit, plan_splits, read_split  # noqa: E402
from mqstore.pipeline.segments import Step, discover_segments, open_segment, walk  # noqa: E402

h = sys.modules["mqstore_pipeline_test_helpers"]  # loaded by conftest.py (tests/ has no packages)
BROKER_SAMPLES = h.BROKER_SAMPLES
Written = Any  # pipeline_helpers.Written
expected_row, reference_records = h.expected_row, h.reference_records

pytestmark = pytest.mark.spark

TS_COLUMNS = ("born_timestamp", "store_timestamp")


def spark_rows(spark: Any, paths: list[Any], columns: list[str] | None = None, **kw: Any) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    from mqstore.pipeline.datasource import read_commitlog

    # Every column unless told otherwise (the source's default schema is a subset).
    df = read_commitlog(spark, [str(p) for p in paths], columns=list(COLUMNS) if columns is None else columns, **kw)
    # Epoch ms, not datetimes: collect() would convert to the Python process's time zone.
    df = df.select(*[F.unix_millis(c).alias(c) if c in TS_COLUMNS else F.col(c) for c in df.columns])
    rows = [r.asDict() for r in df.collect()]
    return sorted(rows, key=lambda r: (r.get("segment_file") or "", r.get("commitlog_offset") or 0))


def local_rows(paths: list[Any], split_size: int, columns: list[str], fast: bool = True) -> list[dict[str, Any]]:
    """The same reader without Spark: plan, then read every split."""
    rows: list[dict[str, Any]] = []
    for split in plan_splits([str(p) for p in paths], split_size, 4 * 1024 * 1024):
        for batch in read_split(split, columns, fast=fast):
            rows.extend(batch.to_pylist())
    return rows


def test_every_column_of_both_broker_samples_matches_the_codec(spark: Any) -> None:
    expected = [expected_row(p, rec) for p, _, rec in reference_records(BROKER_SAMPLES)]
    assert len(expected) == 94
    assert spark_rows(spark, BROKER_SAMPLES, split_size="4k") == expected


def test_every_column_of_a_generated_commitlog_matches_the_codec(spark: Any, generated_store: Written) -> None:
    expected = [expected_row(p, rec) for p, _, rec in reference_records([generated_store.store])]
    assert len(expected) == 3000 and len(discover_segments([str(generated_store.store)])) > 40
    got = spark_rows(spark, [generated_store.store], split_size="200k")
    assert got == expected


def test_a_narrow_schema_returns_the_same_values_as_the_full_one(spark: Any, generated_store: Written) -> None:
    cols = ["topic", "queue_id", "size", "store_timestamp", "commitlog_offset"]
    full = [{c: r[c] for c in cols} for r in spark_rows(spark, [generated_store.store])]
    narrow = spark_rows(spark, [generated_store.store], columns=cols)
    assert sorted(narrow, key=lambda r: r["commitlog_offset"]) == sorted(full, key=lambda r: r["commitlog_offset"])


@pytest.mark.parametrize("columns", [["topic", "queue_id", "size", "store_timestamp"], list(COLUMNS)])
def test_many_split_sizes_give_identical_rows(generated_store: Written, columns: list[str]) -> None:
    baseline = local_rows([generated_store.store], 1 << 30, columns)
    assert len(baseline) == 3000
    sizes = (1, 173, 1000, 4096, 8191, 30_000, 65_536) if len(columns) < 10 else (173, 8191, 65_536)
    for split_size in sizes:
        assert local_rows([generated_store.store], split_size, columns) == baseline, split_size


def test_split_starts_fall_on_record_boundaries(generated_store: Written) -> None:
    starts = set(generated_store.offsets)
    for split in plan_splits([str(generated_store.store)], 5000, 4 * 1024 * 1024):
        assert split.start == 0 or (split.base_offset or 0) + split.start in starts


def test_spark_honours_split_size_in_partitions(spark: Any, generated_store: Written) -> None:
    from mqstore.pipeline.datasource import read_commitlog

    df = read_commitlog(spark, [str(generated_store.store)], columns=["size"], split_size="16k")
    segments = len(discover_segments([str(generated_store.store)]))
    assert df.rdd.getNumPartitions() >= 3 * segments
    # Small segments are packed together up to the split size: 3 MB in 1 MB tasks.
    packed = read_commitlog(spark, [str(generated_store.store)], columns=["size"], split_size="1m")
    assert 3 <= packed.rdd.getNumPartitions() <= 4 and packed.count() == 3000


def test_default_split_size_is_sparks_file_partition_size(generated_store: Written) -> None:
    """Without splitSize a task reads up to 128 MiB, Spark's own spark.sql.files.maxPartitionBytes:
    each task costs about 0.1 CPU s of fixed overhead (JVM and Python worker), which at 64 MiB
    tasks was a fifth of a default-schema scan's CPU (bench_spark)."""
    from mqstore.pipeline.datasource import DEFAULT_SCHEMA, RocketMQReader

    reader = RocketMQReader({"path": str(generated_store.store)}, DEFAULT_SCHEMA)
    assert reader.split_size == 128 << 20
    assert RocketMQReader({"path": "x", "splitSize": "1m"}, DEFAULT_SCHEMA).split_size == 1 << 20


_FREEZE_PROBE = """
import gc, json, sys
from mqstore.pipeline.datasource import DEFAULT_SCHEMA, RocketMQReader
reader = RocketMQReader({"path": sys.argv[1], "decoder": sys.argv[2], "splitSize": "256k"}, DEFAULT_SCHEMA)
counts = []
for part in reader.partitions():
    rows = sum(b.num_rows for b in reader.read(part))
    counts.append(gc.get_freeze_count())
print(json.dumps([rows, counts]))
"""


@pytest.mark.parametrize("reuse", ["1", None])
def test_reused_spark_worker_freezes_its_heap_once(generated_store: Written, reuse: str | None) -> None:
    """Spark's daemon runs a full gc.collect() after every task of a reused worker (pyspark
    daemon.py); with pyarrow, numpy and pyspark loaded that scans ~60k objects, 16-40 ms a task.
    A reused worker's reader moves what is alive at its first task out of the collector's
    sight (gc.freeze) once; any other process (a driver, a test, a worker that is not reused,
    where no collection follows each task) is left alone."""
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "SPARK_REUSE_WORKER"}
    if reuse is not None:
        env["SPARK_REUSE_WORKER"] = reuse
    out = subprocess.run([sys.executable, "-c", _FREEZE_PROBE, str(generated_store.store), "fast"], env=env,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    rows, counts = json.loads(out)
    assert rows > 0 and counts
    if reuse is None:
        assert set(counts) == {0}
    else:
        assert len(counts) > 1 and counts[0] > 0 and len(set(counts)) == 1  # frozen at the first task only


def test_fast_and_exact_decoders_agree_on_every_column(generated_store: Written) -> None:
    cols = list(COLUMNS)
    assert local_rows([generated_store.store], 20_000, cols, fast=True) == local_rows(
        [generated_store.store], 20_000, cols, fast=False
    )


def test_decode_of_ipv6_records_falls_back_to_the_codec(generated_store: Written) -> None:
    seg = discover_segments([str(generated_store.store)])[0]
    buf = open_segment(seg.path)
    positions = [s.pos for s in walk(buf, seg) if s.step is Step.MESSAGE]
    batch = decode_batch(buf, seg, positions, arrow_schema(["store_host", "msg_id"]))
    assert batch.num_rows == len(positions)


# ---------------------------------------------------------------------------------------
# corrupt input


def _damaged_copy(src: Written, dst: Path, damage: Callable[[bytearray, int], None], record_index: int) -> tuple[Path, int]:
    """A copy of the store with one record damaged in place; returns (store, its offset)."""
    shutil.copytree(src.store, dst)
    offset = src.offsets[record_index]
    seg_start = offset - offset % src.segment_size
    path = dst / "commitlog" / f"{seg_start:020d}"
    data = bytearray(path.read_bytes())
    damage(data, offset - seg_start)
    path.write_bytes(bytes(data))
    return dst, offset


def _flip_magic(data: bytearray, pos: int) -> None:
    data[pos + 4] ^= 0xFF


def _zero_header(data: bytearray, pos: int) -> None:
    data[pos : pos + 8] = bytes(8)


def _middle_of_a_segment(w: Written) -> int:
    seg = w.offsets[1500] - w.offsets[1500] % w.segment_size
    in_seg = [i for i, o in enumerate(w.offsets) if seg <= o < seg + w.segment_size]
    return in_seg[len(in_seg) // 2]


@pytest.mark.parametrize("damage", [_flip_magic, _zero_header], ids=["flipped-magic", "zeroed-header"])
def test_a_corrupt_record_is_reported_and_the_rest_is_read(
    spark: Any, generated_store: Written, tmp_path: Path, damage: Callable[[bytearray, int], None]
) -> None:
    idx = _middle_of_a_segment(generated_store)
    store, offset = _damaged_copy(generated_store, tmp_path / "store", damage, idx)
    rows = spark_rows(spark, [store], columns=["commitlog_offset", "size", "error"], split_size="256k",
                      corrupt_log=str(tmp_path / "corrupt"))  # fmt: skip
    bad = [r for r in rows if r["error"] is not None]
    assert len(bad) == 1 and bad[0]["commitlog_offset"] == offset
    # The walk resynchronises at the next record, so exactly one message is lost.
    assert bad[0]["size"] == generated_store.offsets[idx + 1] - offset
    good = {r["commitlog_offset"] for r in rows if r["error"] is None}
    assert good == set(generated_store.offsets) - {offset}
    from mqstore.pipeline.datasource import count_corrupt_log

    assert count_corrupt_log(str(tmp_path / "corrupt")) == 1


def test_strict_mode_fails_the_job_naming_file_and_offset(spark: Any, generated_store: Written, tmp_path: Path) -> None:
    idx = _middle_of_a_segment(generated_store)
    store, offset = _damaged_copy(generated_store, tmp_path / "store", _flip_magic, idx)
    with pytest.raises(Exception) as info:
        spark_rows(spark, [store], columns=["size"], strict=True)
    text = str(info.value)
    assert f"commitlog offset {offset}" in text and f"{offset - offset % generated_store.segment_size:020d}" in text


def test_a_body_length_that_does_not_add_up_is_a_corrupt_row(generated_store: Written, tmp_path: Path) -> None:
    def bad_body_len(data: bytearray, pos: int) -> None:
        body_len = struct.unpack_from(">i", data, pos + 84)[0]
        struct.pack_into(">i", data, pos + 84, body_len + 3)

    idx = _middle_of_a_segment(generated_store)
    store, offset = _damaged_copy(generated_store, tmp_path / "store", bad_body_len, idx)
    rows = local_rows([store], 10_000, ["commitlog_offset", "topic", "error"])
    bad = [r for r in rows if r["error"] is not None]
    assert [r["commitlog_offset"] for r in bad] == [offset] and bad[0]["topic"] is None
    assert len(rows) == 3000


def test_a_torn_tail_is_reported_once(tmp_path: Path) -> None:
    src = BROKER_SAMPLES[0] / "commitlog" / "00000000000000000000"
    dst = tmp_path / "commitlog"
    dst.mkdir()
    data = bytearray(src.read_bytes())
    data[8084:] = bytes(len(data) - 8084)  # drop the blank, then a half-written record
    data[8084:8100] = b"\x00\x00\x00\xac\xda\xa3\x20\xa7garbage!"[:16]
    (dst / "00000000000000000000").write_bytes(bytes(data))
    rows = local_rows([dst], 1024, ["commitlog_offset", "error"])
    assert len(rows) == 48 and rows[-1]["error"] and rows[-1]["commitlog_offset"] == 8084


def test_import_mqstore_does_not_import_pyspark() -> None:
    import subprocess
    import sys

    code = "import sys, mqstore, mqstore.cli; mqstore.cli.build_parser(); print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_split_partitions_pickle(generated_store: Written) -> None:
    import pickle

    split = plan_splits([str(generated_store.store)], 10_000, 1 << 22)[3]
    assert isinstance(split, SegmentSplit) and pickle.loads(pickle.dumps(split)) == split


@pytest.mark.parametrize(
    "odd",
    ["K\x01\x02TAGS\x01T\x02", "TAGS\x01a\x02TAGS\x01b\x02", "a\x01b\x01c\x02KEYS\x01x y\x02", "\x01v\x02", "TAGS\x01\u00e9\u4e2d\x02"],
    ids=["empty-value", "repeated-name", "extra-separator", "empty-name", "non-ascii"],
)
def test_odd_property_strings_decode_as_java_does(tmp_path: Path, odd: str) -> None:
    specs = h.make_specs(40)
    specs[7]["properties"] = odd
    w = h.write_commitlog(tmp_path / "store", specs)
    expected = [expected_row(p, rec) for p, _, rec in reference_records([w.store])]
    got = local_rows([w.store], 1 << 20, list(COLUMNS))
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    for row in got:
        for c in TS_COLUMNS:
            row[c] = (row[c] - epoch) // timedelta(milliseconds=1)  # exact, unlike float seconds
        row["properties"] = dict(row["properties"])
    assert got == expected


def test_the_topics_option_keeps_only_those_topics_and_still_reports_corruption(generated_store: Written, tmp_path: Path) -> None:
    cols = ["commitlog_offset", "topic", "keys", "error"]
    everything = local_rows([generated_store.store], 1 << 20, cols)
    only: list[dict[str, Any]] = []
    for split in plan_splits([str(generated_store.store)], 1 << 20, 4 * 1024 * 1024):
        for batch in read_split(split, cols, topics=["orders", "audit-log"]):
            only.extend(batch.to_pylist())
    assert only == [r for r in everything if r["topic"] in ("orders", "audit-log")] and len(only) > 1000
    idx = _middle_of_a_segment(generated_store)
    store, offset = _damaged_copy(generated_store, tmp_path / "store", _flip_magic, idx)
    damaged = [r for s in plan_splits([str(store)], 1 << 20, 1 << 22) for b in read_split(s, cols, topics=["orders"])
               for r in b.to_pylist()]  # fmt: skip
    assert [r["commitlog_offset"] for r in damaged if r["error"]] == [offset]
