"""Review 53 M1: the Spark jobs on a store whose cleaner deletes its oldest segments meanwhile.

The jobs list the commitlog (and ConsumeQueue) files, then open them; a running store's
retention may delete the oldest ones in between. Such a file, gone (ENOENT) and below the
log's current first file, was expired: it is skipped (the stats job counts it), never a failed
job. A file gone from anywhere else (older files remain) is damage and reported as a hole is.

Each test deletes the file between the listing and the open, deterministically (no cleaner
timing). All but one run without Spark."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("pyspark")

import mqstore  # noqa: E402
from mqstore.pipeline import datasource, lookup, stream  # noqa: E402
from mqstore.pipeline.bounds import ReadBounds  # noqa: E402
from mqstore.pipeline.datasource import plan_splits, read_split, segment_ranges  # noqa: E402
from mqstore.pipeline.segments import SegmentError, _directory_segments, discover_segments  # noqa: E402
from mqstore.pipeline.stream import QueueSlice, read_queue_slice  # noqa: E402

h = sys.modules["mqstore_pipeline_test_helpers"]  # loaded by conftest.py (tests/ has no packages)
SEGMENT = h.SEGMENT_SIZE
MESSAGES = 220
COLUMNS = ["commitlog_offset", "size", "topic", "keys", "segment_file", "error"]


def _rows_of(splits: list[Any], **kw: Any) -> list[dict[str, Any]]:
    return [r for s in splits for b in read_split(s, COLUMNS, **kw) for r in b.to_pylist()]


def _seg(store: Path, i: int, size: int = SEGMENT) -> Path:
    return store / "commitlog" / f"{i * size:020d}"


# The data source's reader and planner (a written commitlog, four 64 KiB segments) -----------


@pytest.fixture
def clog(tmp_path: Path) -> Path:
    written = h.write_commitlog(tmp_path / "store", h.make_specs(MESSAGES))
    assert len(os.listdir(written.store / "commitlog")) == 4
    return Path(written.store)


def test_a_head_segment_deleted_after_planning_is_skipped_not_a_failed_task(clog: Path) -> None:
    whole = _rows_of(plan_splits([str(clog)], 20_000, 4 << 20))
    splits = plan_splits([str(clog)], 20_000, 4 << 20)
    head = str(_seg(clog, 0))
    head_splits = [s for s in splits if s.path == head]
    assert len(head_splits) > 1
    os.unlink(head)  # the cleaner, between the plan and the tasks
    got = _rows_of(splits)
    assert [r for r in got if r["error"] is not None] == []
    assert got == [r for r in whole if r["segment_file"] != head]
    # Asked to (the stats job), each split of the expired segment is one row saying so.
    marked = _rows_of(splits, mark_expired=True)
    markers = [r for r in marked if r["topic"] is None and r["error"] is None]
    assert [(r["segment_file"], r["commitlog_offset"]) for r in markers] == [(head, s.start) for s in head_splits]
    assert [r for r in marked if r not in markers] == got


def test_jobs_with_a_read_log_are_told_of_each_expired_segment(clog: Path, tmp_path: Path) -> None:
    """Review 56 M2: export (and reindex) skipped the segments retention deleted mid-job without
    a word, a hole in every queue of the export. Tasks given a corruptLog now name each expired
    segment there (`.expired` files, not corrupt ranges), and the jobs count them."""
    splits = plan_splits([str(clog)], 20_000, 4 << 20)
    head = str(_seg(clog, 0))
    os.unlink(head)
    log_dir = str(tmp_path / "log")
    for split in splits:
        list(read_split(split, COLUMNS, corrupt_log=log_dir))
    assert datasource.count_expired_log(log_dir) == 1
    assert datasource.count_corrupt_log(log_dir) == 0  # not damage
    assert datasource.count_expired_log(str(tmp_path / "none")) == 0


def test_a_middle_segment_deleted_after_planning_is_reported_as_a_hole(clog: Path) -> None:
    splits = plan_splits([str(clog)], 20_000, 4 << 20)
    middle = str(_seg(clog, 1))
    os.unlink(middle)  # older segments remain: damage, not retention
    got = _rows_of(splits, mark_expired=True)
    bad = [r for r in got if r["error"] is not None]
    planned = [(s.start, s.end) for s in splits if s.path == middle]
    assert [(r["commitlog_offset"] - SEGMENT, r["commitlog_offset"] - SEGMENT + r["size"]) for r in bad] == planned
    assert all(r["segment_file"] == middle and "no segment file holds commitlog offsets" in r["error"] for r in bad)
    assert not [r for r in got if r["topic"] is None and r["error"] is None]  # no marker: not expired
    with pytest.raises(datasource.CorruptRecordError, match="no segment file holds"):
        _rows_of([s for s in splits if s.path == middle], strict=True)
    # The next plan sees the hole, as any deleted middle segment (review 31 M4).
    assert [r["commitlog_offset"] for r in _rows_of(plan_splits([str(clog)], 20_000, 4 << 20)) if r["error"]] == [SEGMENT]


def test_the_planner_skips_a_head_segment_deleted_after_the_listing(clog: Path) -> None:
    segments = discover_segments([str(clog)])
    os.unlink(segments[0].path)
    # One split over its span, which the reader then finds expired (and counts, if asked).
    assert segment_ranges(segments[0], 20_000, 4 << 20) == [(0, segments[0].file_size)]
    split = datasource.SegmentSplit(segments[0].path, 0, segments[0].file_size, 0, segments[0].file_size)
    assert list(read_split(split, COLUMNS)) == []


def test_the_listing_drops_head_files_deleted_while_it_stats_them(clog: Path) -> None:
    names = sorted(os.listdir(clog / "commitlog"))
    os.unlink(_seg(clog, 0))
    got = _directory_segments(str(clog / "commitlog"), names)
    assert [os.path.basename(s.path) for s in got] == names[1:]
    os.unlink(_seg(clog, 2))  # a middle file gone: an error naming it, as before
    with pytest.raises(SegmentError, match=names[2]):
        _directory_segments(str(clog / "commitlog"), names)


def test_a_head_segment_that_is_a_link_to_nothing_is_an_error_not_expired(clog: Path) -> None:
    """Review 56 H1: the listing took a first segment that is a symbolic link to nothing for
    one the cleaner had deleted and dropped it, so spark stats called the store healthy."""
    names = sorted(os.listdir(clog / "commitlog"))
    head = Path(_seg(clog, 0))
    head.unlink()
    head.symlink_to(clog / "not-mounted")
    with pytest.raises(SegmentError, match=names[0]):
        _directory_segments(str(clog / "commitlog"), names)
    with pytest.raises(SegmentError, match=names[0]):
        discover_segments([str(clog)])


def test_the_reader_option_marks_expired_splits(clog: Path) -> None:
    from pyspark.sql.types import StructType

    from mqstore.pipeline.datasource import SCHEMA, RocketMQReader
    from mqstore.pipeline.stats import STATS_COLUMNS

    schema = StructType([f for f in SCHEMA.fields if f.name in STATS_COLUMNS])
    reader = RocketMQReader({"paths": json.dumps([str(clog)]), "markexpired": "true", "splitsize": "20k"}, schema)
    parts = reader.partitions()
    os.unlink(_seg(clog, 0))
    rows = [r for p in parts for b in reader.read(p) for r in b.to_pylist()]
    markers = {r["segment_file"] for r in rows if r["topic"] is None and r["error"] is None}
    assert markers == {str(_seg(clog, 0))}
    plain = RocketMQReader({"paths": json.dumps([str(clog)]), "splitsize": "20k"}, schema)
    assert not [r for p in plain.partitions() for b in plain.read(p) for r in b.to_pylist() if r["topic"] is None]


def test_stats_counts_expired_segments_apart_from_messages_and_damage(spark: Any, clog: Path) -> None:
    import pyarrow as pa

    from mqstore.pipeline.columnar import arrow_schema
    from mqstore.pipeline.stats import STATS_COLUMNS, summarize

    splits = plan_splits([str(clog)], 20_000, 4 << 20)
    alive = sum(1 for r in _rows_of(splits) if r["segment_file"] != str(_seg(clog, 0)))
    os.unlink(_seg(clog, 0))
    batches = [b for s in splits for b in read_split(s, STATS_COLUMNS, mark_expired=True)]
    df = spark.createDataFrame(pa.Table.from_batches(batches, schema=arrow_schema(STATS_COLUMNS)))
    got = summarize(df, [str(clog)])
    assert (got["messages"], got["expired_segments"], got["corrupt_records"]) == (alive, 1, 0)
    assert all(q["topic"] is not None for q in got["queues"])


# A store written by mqstore: ConsumeQueue and index files too -----------------------------

LIVE_SEGMENT = 64 * 1024
CQ_UNITS = 50  # units per ConsumeQueue file


def _body(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * 30


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 messages of ~1 KiB on queues 0 and 1 of topic T: six 64 KiB segments, three
    ConsumeQueue files per queue, index files."""
    path = tmp_path_factory.mktemp("live") / "store"
    with mqstore.open(path, mapped_file_size_commitlog_bytes=LIVE_SEGMENT,
                      mapped_file_size_consume_queue_bytes=20 * CQ_UNITS) as s:  # fmt: skip
        for i in range(300):
            assert s.put(mqstore.Message(topic="T", body=_body(i), keys=[f"k{i}"], queue_id=i % 2)).ok
    return path


@pytest.fixture
def store(written: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(written, copy)
    return copy


def _segments(store: Path) -> list[str]:
    return sorted(str(store / "commitlog" / n) for n in os.listdir(store / "commitlog"))


def _keys_in(store: Path, segment: str) -> set[str]:
    split = [s for s in plan_splits([str(store)], 1 << 30, 4 << 20) if s.path == segment]
    return {r["keys"] for s in split for b in read_split(s, ["keys"]) for r in b.to_pylist()}


def _delete_after(module: Any, name: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`module.name` (a listing) deletes `path` once it has listed: the cleaner in between."""
    real: Callable[..., Any] = getattr(module, name)

    def listed_then_cleaned(*args: Any) -> Any:
        got = real(*args)
        if os.path.exists(path):
            os.unlink(path)
        return got

    monkeypatch.setattr(module, name, listed_then_cleaned)


def _streamed(store: Path, queue_id: int, start: int, end: int) -> list[int]:
    rows = [r for b in read_queue_slice(QueueSlice(str(store), "T", queue_id, start, end), ["keys", "body"])
            for r in b.to_pylist()]  # fmt: skip
    got = [int(r["keys"][1:]) for r in rows]
    assert all(r["body"] == _body(i) for r, i in zip(rows, got))  # never a wrong body
    return got


def test_the_stream_skips_a_head_segment_deleted_after_its_listing(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head = _segments(store)[0]
    gone = {int(k[1:]) for k in _keys_in(store, head)}
    assert gone and max(gone) < 300
    _delete_after(stream, "discover_segments", head, monkeypatch)
    assert _streamed(store, 0, 0, 150) == [i for i in range(0, 300, 2) if i not in gone]


def test_the_stream_skips_and_reports_a_middle_segment_deleted_after_its_listing(
    store: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    middle = _segments(store)[2]
    gone = {int(k[1:]) for k in _keys_in(store, middle)}
    _delete_after(stream, "discover_segments", middle, monkeypatch)
    with caplog.at_level("WARNING", logger="mqstore"):
        assert _streamed(store, 1, 0, 150) == [i for i in range(1, 300, 2) if i not in gone]
    skipped = [r for r in caplog.records if "stream_record_skipped" in r.getMessage()]
    assert len(skipped) == len([i for i in gone if i % 2 == 1])
    assert all(r.__dict__["mqstore_event"]["segment"] == middle for r in skipped)


def test_the_stream_skips_a_consume_queue_file_deleted_after_its_listing(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = store / "consumequeue" / "T" / "0"
    first = sorted(queue.iterdir())[0]
    _delete_after(stream, "_queue_files", str(first), monkeypatch)
    assert _streamed(store, 0, 0, 150) == list(range(2 * CQ_UNITS, 300, 2))


def test_lookup_by_index_skips_a_head_segment_deleted_after_its_listing(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head = _segments(store)[0]
    assert "k0" in _keys_in(store, head)
    _delete_after(lookup, "discover_segments", head, monkeypatch)
    corrupt: list[dict[str, Any]] = []
    assert lookup.lookup_by_index([str(store)], "k0", corrupt=corrupt) == []  # expired, as the broker says
    hits = lookup.lookup_by_index([str(store)], "k299", corrupt=corrupt)
    assert hits is not None and [h["keys"] for h in hits] == ["k299"] and corrupt == []


def test_lookup_by_index_reports_a_middle_segment_deleted_after_its_listing(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    middle = _segments(store)[2]
    key = sorted(_keys_in(store, middle))[0]
    _delete_after(lookup, "discover_segments", middle, monkeypatch)
    corrupt: list[dict[str, Any]] = []
    assert lookup.lookup_by_index([str(store)], key, corrupt=corrupt) == []
    assert corrupt and all(c["segment_file"] == middle for c in corrupt)


def test_planning_by_consume_queue_takes_an_expired_unit_as_saying_nothing(store: Path) -> None:
    segments = discover_segments([str(store)])
    head_keys = _keys_in(store, segments[0].path)
    n_head = len([k for k in head_keys if int(k[1:]) % 2 == 0])  # queue 0's units in the head
    bounds = ReadBounds(topics=frozenset({"T"}), queue_ids=frozenset({0}), starting={"T": {0: 1}}, ending={"T": {0: n_head + 3}})
    lo, hi = bounds.commitlog_range(str(store), segments)
    assert hi < segments[-1].base_offset  # type: ignore[operator]
    os.unlink(segments[0].path)
    # Queue offset 1's record is gone with its segment: that end stays open; the other holds.
    assert bounds.commitlog_range(str(store), segments) == (0, hi)
