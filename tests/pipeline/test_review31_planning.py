"""Review 31, H3 and H4: a plan never stops short of records written since an earlier plan,
and ConsumeQueue pruning never drops a record it cannot prove unwanted. No Spark session:
the planner and the reader are called directly."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("pyspark")

import mqstore  # noqa: E402
from mqstore.pipeline import datasource  # noqa: E402
from mqstore.pipeline.datasource import (  # noqa: E402
    DEFAULT_SCHEMA,
    RocketMQPushdownReader,
    RocketMQReader,
    SegmentSplit,
    plan_splits,
)
from mqstore.pipeline.segments import Segment, Step, discover_segments, open_segment, plan_segment, walk  # noqa: E402

h = sys.modules["mqstore_pipeline_test_helpers"]  # loaded by conftest.py (tests/ has no packages)

pytestmark = pytest.mark.spark

SMALL = {"mapped_file_size_commitlog_bytes": 64 * 1024, "mapped_file_size_consume_queue_bytes": 600}
CQ_UNIT = struct.Struct(">qiq")


# ---- H3: the plan cache ----------------------------------------------------------------------


@contextmanager
def frozen_times(directory: Path, first: dict[str, os.stat_result]) -> Iterator[None]:
    real_stat = os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> Any:
        st = real_stat(path, *args, **kwargs)
        if isinstance(path, str) and path.startswith(str(directory)) and not args and not kwargs:
            return h.FrozenTimes(st, first.setdefault(path, st))
        return st

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "stat", stat)
        yield


def planned_messages(splits: list[SegmentSplit]) -> int:
    """Messages the planned ranges hold, by the walk (as every reader walks them)."""
    return sum(
        1 for s in splits for r in walk(open_segment(s.path), s.segment, s.start, s.end) if r.step is Step.MESSAGE
    )


def test_a_live_segment_is_planned_as_far_as_its_data_goes(tmp_path: Path) -> None:
    path = tmp_path / "live"
    first: dict[str, os.stat_result] = {}
    with mqstore.open(path, **SMALL) as store:
        acked = 0
        for round_ in range(6):
            for _ in range(40):
                assert store.put(mqstore.Message(topic="orders", body=b"x" * 300)).ok
            acked += 40
            with frozen_times(path / "commitlog", first):
                splits = plan_splits([str(path)], 4096, 4 << 20)
            assert planned_messages(splits) == acked, f"round {round_}"
            # The resumed plan is the one a fresh walk gives.
            fresh = [(g.path, r) for g in discover_segments([str(path)]) for r in plan_segment(open_segment(g.path), g, 4096)]
            assert [(sp.path, (sp.start, sp.end)) for sp in splits] == fresh
        # 240 records of ~400 bytes: the first segment rolled, so its plan is sealed and served
        # from the cache without opening the file again; nothing was written to the live one
        # since, where its walk met zeros, so its plan is served too.
        assert len(os.listdir(path / "commitlog")) > 1
        opened: list[str] = []
        real_open = datasource.open_segment
        with frozen_times(path / "commitlog", first), pytest.MonkeyPatch.context() as mp:
            mp.setattr(datasource, "open_segment", lambda p: opened.append(p) or real_open(p))
            assert planned_messages(plan_splits([str(path)], 4096, 4 << 20)) == acked
        assert opened == []


def test_a_replaced_segment_is_not_read_with_the_old_files_cuts(tmp_path: Path) -> None:
    # Two sealed segments (each ends with a blank, so its plan is reused whole) of the same
    # size and name, with records of other sizes, so other cuts; the second copied over the
    # first keeping its mtime (cp -p, rsync -t). Only the inode and ctime tell them apart.
    a = h.write_commitlog(tmp_path / "a", h.make_specs(200, body_size=300)).store / "commitlog" / "00000000000000000000"
    b = h.write_commitlog(tmp_path / "b", h.make_specs(200, seed=8, body_size=500)).store / "commitlog" / "00000000000000000000"
    assert a.stat().st_size == b.stat().st_size
    seg_b = Segment(str(b), 0, b.stat().st_size)
    b_ranges = plan_segment(open_segment(str(b)), seg_b, 4096)
    b_messages = sum(1 for r in walk(open_segment(str(b)), seg_b) if r.step is Step.MESSAGE)
    old = plan_splits([str(a)], 4096, 4 << 20)
    assert datasource._PLAN_CACHE[(str(a), 4096, 4 << 20)].sealed
    assert [(s.start, s.end) for s in old] != b_ranges
    mtime = a.stat().st_mtime_ns
    shutil.copyfile(b, a.with_name("tmp"))
    os.replace(a.with_name("tmp"), a)
    os.utime(a, ns=(mtime, mtime))
    splits = plan_splits([str(a)], 4096, 4 << 20)
    assert [(s.start, s.end) for s in splits] == b_ranges
    assert planned_messages(splits) == b_messages


@pytest.mark.parametrize("split_size", [1000, 4096, 20_000])
def test_planning_from_a_cut_gives_the_rest_of_the_segments_plan(tmp_path: Path, split_size: int) -> None:
    written = h.write_commitlog(tmp_path / "s", h.make_specs(150, body_size=500))
    segs = discover_segments([str(written.store)])
    # Damage: a bad magic code in the first segment, a zeroed header in the second.
    with open(segs[0].path, "r+b") as f:
        f.seek(written.offsets[7] + 4)
        f.write(b"\0\0\0\1")
    base = segs[1].base_offset
    assert base is not None
    second = [o - base for o in written.offsets if base <= o < base + segs[1].file_size]
    with open(segs[1].path, "r+b") as f:
        f.seek(second[5])
        f.write(bytes(8))
    for seg in segs:
        buf = open_segment(seg.path)
        whole = plan_segment(buf, seg, split_size)
        assert datasource.plan_from(buf, seg, 0, split_size, 4 << 20) == whole
        for i, (start, _) in enumerate(whole):
            assert datasource.plan_from(buf, seg, start, split_size, 4 << 20) == whole[i:]


# ---- H4: ConsumeQueue pruning ----------------------------------------------------------------


def make_store(path: Path, puts: list[tuple[str, int]]) -> Path:
    with mqstore.open(path, **SMALL) as store:
        for topic, queue_id in puts:
            assert store.put(mqstore.Message(topic=topic, queue_id=queue_id, body=topic[0].encode() * 200)).ok
    return path


def read_rows(paths: list[Path], options: dict[str, str], queue_ids: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
    """The rows a read returns, with `queue_ids` pushed as Spark pushes `queue_id IN (...)`."""
    from pyspark.sql.datasource import In

    opts = {"paths": json.dumps([str(p) for p in paths]), "splitsize": "4k", **{k.lower(): v for k, v in options.items()}}
    reader: RocketMQReader
    if queue_ids is None:
        reader = RocketMQReader(opts, DEFAULT_SCHEMA)
    else:
        reader = RocketMQPushdownReader(opts, DEFAULT_SCHEMA)
        assert not list(reader.pushFilters([In(("queue_id",), queue_ids)]))
    return [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]


def keyed(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((r["commitlog_offset"], r["topic"], r["queue_id"], r["queue_offset"], r["error"]) for r in rows)


def scan(paths: list[Path], options: dict[str, str], queue_ids: tuple[int, ...] | None = None) -> list[tuple[Any, ...]]:
    return keyed(read_rows(paths, {**options, "useConsumeQueue": "false"}, queue_ids))


def planned_bytes(paths: list[Path], options: dict[str, str], queue_ids: tuple[int, ...]) -> int:
    from pyspark.sql.datasource import In

    reader = RocketMQPushdownReader({"paths": json.dumps([str(p) for p in paths]), "splitsize": "4k", **options},
                                    DEFAULT_SCHEMA)  # fmt: skip
    list(reader.pushFilters([In(("queue_id",), queue_ids)]))
    return sum(s.end - s.start for p in reader.partitions() for s in p.splits)  # type: ignore[attr-defined]


FROM_40 = {"topics": "orders", "startingOffsets": '{"orders":{"0":40}}'}


@pytest.mark.parametrize("queue_ids", [None, (0,)])
def test_one_stores_consume_queue_does_not_prune_another_store(tmp_path: Path, queue_ids: tuple[int, ...] | None) -> None:
    a = make_store(tmp_path / "A", [("audit", 0)] * 100 + [("orders", 0)] * 50)
    b = make_store(tmp_path / "B", [("orders", 0)] * 50)
    shutil.rmtree(b / "consumequeue")  # B: a bare commitlog
    got = keyed(read_rows([a, b], FROM_40, queue_ids))
    assert got == scan([a, b], FROM_40, queue_ids)
    assert sum(1 for r in got if r[2] == 0) == 20  # queue offsets 40..49 of each store


def test_a_store_is_still_pruned_by_its_own_trusted_consume_queue(tmp_path: Path) -> None:
    a = make_store(tmp_path / "A", [("audit", 0)] * 100 + [("orders", 0)] * 50)
    b = make_store(tmp_path / "B", [("orders", 0)] * 50)
    shutil.rmtree(b / "consumequeue")
    opts = {"topics": "orders", "startingoffsets": '{"orders":{"0":40}}'}
    everything = planned_bytes([a], {**opts, "useconsumequeue": "false"}, (0,))
    assert 0 < planned_bytes([a], opts, (0,)) < everything / 4
    # B has no ConsumeQueue: read whole, beside a pruned A.
    b_bytes = planned_bytes([b], opts, (0,))
    assert planned_bytes([a, b], opts, (0,)) == planned_bytes([a], opts, (0,)) + b_bytes
    assert b_bytes == planned_bytes([b], {**opts, "useconsumequeue": "false"}, (0,))


@pytest.mark.parametrize("queue_ids", [None, (0, 1)])
def test_a_queue_without_a_consume_queue_directory_is_read_whole(tmp_path: Path, queue_ids: tuple[int, ...] | None) -> None:
    store = make_store(tmp_path / "s", [("orders", i % 2) for i in range(100)])
    shutil.rmtree(store / "consumequeue" / "orders" / "1")
    got = keyed(read_rows([store], FROM_40, queue_ids))
    assert got == scan([store], FROM_40, queue_ids)
    assert sorted(r[3] for r in got if r[2] == 1) == list(range(50))


def flip_unit(store: Path, queue_offset: int, change: Any, queue_id: int = 0) -> None:
    """Rewrite one unit of orders' queue: change(offset, size) -> (offset, size)."""
    per = 600 // CQ_UNIT.size
    queue_dir = store / "consumequeue" / "orders" / str(queue_id)
    path = sorted(queue_dir.iterdir())[queue_offset // per]
    with open(path, "r+b") as f:
        f.seek((queue_offset % per) * CQ_UNIT.size)
        offset, size, tags = CQ_UNIT.unpack(f.read(CQ_UNIT.size))
        f.seek((queue_offset % per) * CQ_UNIT.size)
        f.write(CQ_UNIT.pack(*change(offset, size), tags))


def unit_of(store: Path, queue_offset: int, queue_id: int = 0) -> tuple[int, int]:
    per = 600 // CQ_UNIT.size
    path = sorted((store / "consumequeue" / "orders" / str(queue_id)).iterdir())[queue_offset // per]
    offset, size, _ = CQ_UNIT.unpack_from(path.read_bytes(), (queue_offset % per) * CQ_UNIT.size)
    return offset, size


def undispatch(store: Path, from_offset: int) -> None:
    """Zero queue 0's units from `from_offset` on: records the ConsumeQueue has not seen yet."""
    for q in range(from_offset, 100):
        flip_unit(store, q, lambda off, size: (0, 0))


def _high_bit(store: Path) -> None:  # review31's repro: one flipped bit, far past every segment
    flip_unit(store, 40, lambda off, size: (off | 1 << 40, size))


def _last_moved(store: Path) -> None:  # the last unit moved inside its segment: nothing after it disagrees
    flip_unit(store, 99, lambda off, size: (off + 5000, size))


def _size(store: Path) -> None:  # the last dispatched unit's size is no record's
    undispatch(store, 95)
    flip_unit(store, 94, lambda off, size: (off, 1 << 30))


def _end_unit(store: Path) -> None:  # the unit ending a read names record 10
    other = unit_of(store, 10)
    flip_unit(store, 49, lambda off, size: other)


@pytest.mark.parametrize(
    ("damage", "start", "end"),
    [(_high_bit, 40, None), (_last_moved, 99, None), (_size, 97, None), (_end_unit, None, 50), (None, 97, None)],
)
def test_a_damaged_consume_queue_unit_does_not_prune(tmp_path: Path, damage: Any, start: int | None, end: int | None) -> None:
    store = make_store(tmp_path / "s", [("orders", 0)] * 100)
    options = {"topics": "orders"}
    if start is not None:
        options["startingOffsets"] = json.dumps({"orders": {"0": start}})
    if end is not None:
        options["endingOffsets"] = json.dumps({"orders": {"0": end}})
    expected = scan([store], options, (0,))
    assert expected
    if damage is not None:
        damage(store)
    else:
        undispatch(store, 95)  # no damage: records past the last unit are read all the same
    assert keyed(read_rows([store], options, (0,))) == expected
    # The damaged ConsumeQueue is not trusted: the read plans every byte a scan plans. With no
    # damage (records past the last unit), the units before it still prune.
    pruned, everything = planned_bytes([store], options, (0,)), planned_bytes([store], {**options, "useConsumeQueue": "false"}, (0,))
    assert pruned < everything if damage is None else pruned == everything


def test_a_unit_pointing_at_another_queues_record_does_not_prune(tmp_path: Path) -> None:
    # Every unit plausible and in order, but queue 0's last unit (59) names queue 1's record
    # 80, which lies 40 records later: only reading the record shows the unit is not its own.
    store = make_store(tmp_path / "s", [("orders", i % 2) for i in range(120)] + [("orders", 1)] * 40)
    other = unit_of(store, 80, queue_id=1)
    flip_unit(store, 59, lambda off, size: other)
    opts = {"topics": "orders", "startingOffsets": '{"orders":{"0":59,"1":90}}'}
    expected = scan([store], opts, (0, 1))
    assert (0, 59) in {(r[2], r[3]) for r in expected}
    assert keyed(read_rows([store], opts, (0, 1))) == expected
