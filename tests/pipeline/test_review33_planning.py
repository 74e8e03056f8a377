"""Review 33: segment walking and planning of the `rocketmq` data source.

M2: missing log ranges were silent when segments were named by a glob (`STORE/commitlog/*`)
or one by one. M3: a FIFO named like a ConsumeQueue file hung the planner and the stream.
M1: records over the default 4 MiB maxMessageSize were called corrupt, though the store
reads them. L1: an unsealed segment's zero tail was walked again by every plan. L5: the
`_end_of_data` "written meanwhile" re-check had no test. L6: `stats --out` through a hard
link to STORE/checkpoint truncated the store's file. No Spark session: the planner and the
readers are called directly."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import mqstore  # noqa: E402
from mqstore.pipeline import datasource, segments  # noqa: E402
from mqstore.pipeline.datasource import plan_splits, read_split  # noqa: E402
from mqstore.pipeline.segments import Segment, SegmentError, Step, open_segment, step_at, walk  # noqa: E402

h = sys.modules["mqstore_pipeline_test_helpers"]  # loaded by conftest.py (tests/ has no packages)
SEGMENT = h.SEGMENT_SIZE
# Small index files too: tests here read every byte of a store before and after (a default index is 420 MB).
SMALL = {"mapped_file_size_commitlog_bytes": SEGMENT, "mapped_file_size_consume_queue_bytes": 600,
         "max_hash_slot_num": 100, "max_index_num": 400}  # fmt: skip


def _rows(paths: list[Any], max_message_size: int = 4 << 20, columns: tuple[str, ...] = ("commitlog_offset", "size", "error")) -> list[dict[str, Any]]:
    """What the data source returns, without Spark: plan, then read every split."""
    return [
        r
        for split in plan_splits([str(p) for p in paths], 20_000, max_message_size)
        for batch in read_split(split, list(columns), max_message_size=max_message_size)
        for r in batch.to_pylist()
    ]


def _errors(paths: list[Any]) -> list[tuple[int, int]]:
    return [(r["commitlog_offset"], r["size"]) for r in _rows(paths) if r["error"] is not None]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """220 records in four 64 KiB segments, each ending with a blank but the last."""
    written = h.write_commitlog(tmp_path / "store", h.make_specs(220))
    assert len(os.listdir(written.store / "commitlog")) == 4
    return Path(written.store)


def _seg(store: Path, i: int) -> Path:
    return store / "commitlog" / f"{i * SEGMENT:020d}"


# M2: globs and segments named one by one --------------------------------------------------


def test_a_deleted_segment_is_an_error_row_when_segments_are_named_by_glob_or_one_by_one(store: Path, tmp_path: Path) -> None:
    # First no false damage: segment 1 there but not asked for, segment 3 (the last) alone, a
    # renamed copy that says nothing of where it lies, a file named twice.
    shutil.copy(_seg(store, 1), tmp_path / "renamed.bin")
    for paths in ([_seg(store, 0), _seg(store, 2)], [_seg(store, 3)], [store / "commitlog" / "*[02]"],
                  [tmp_path / "renamed.bin"], [_seg(store, 1), _seg(store, 1)]):  # fmt: skip
        assert _errors(paths) == [], paths
    _seg(store, 1).unlink()
    expected = [(SEGMENT, SEGMENT)]
    assert _errors([store]) == expected
    assert _errors([store / "commitlog" / "*"]) == expected
    assert _errors([_seg(store, 0), _seg(store, 2), _seg(store, 3)]) == expected
    assert _errors([_seg(store, 0)]) == expected  # its span reaches the next file there is


# M3: a FIFO named like a ConsumeQueue file -------------------------------------------------


@pytest.fixture
def fifo_store(tmp_path: Path) -> tuple[Path, Path]:
    """One queue of 210 units (seven full 600-byte ConsumeQueue files), and a FIFO under the
    next file's name."""
    path = tmp_path / "store"
    with mqstore.open(path, **SMALL) as st:
        for i in range(210):
            assert st.put(mqstore.Message(topic="orders", body=b"o-%d" % i)).ok
    queue = path / "consumequeue" / "orders" / "0"
    names = sorted(os.listdir(queue))
    fifo = queue / f"{int(names[-1]) + 600:020d}"
    os.mkfifo(fifo)
    return path, fifo


def test_a_fifo_named_like_a_consume_queue_file_does_not_hang_a_pruned_read(fifo_store: tuple[Path, Path]) -> None:
    from pyspark.sql.datasource import In

    path, fifo = fifo_store

    def read() -> list[int]:
        opts = {"paths": json.dumps([str(path)]), "topics": "orders", "startingoffsets": '{"orders":{"0":150}}'}
        reader = datasource.RocketMQPushdownReader(opts, datasource.DEFAULT_SCHEMA)
        assert not list(reader.pushFilters([In(("queue_id",), (0,))]))
        return sorted(r["queue_offset"] for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist())

    got, exc = h.returns_promptly(fifo, read)
    assert exc is None and got == list(range(150, 210))  # the ConsumeQueue is not trusted: a scan


def test_a_fifo_named_like_a_consume_queue_file_is_an_error_naming_it_in_the_stream(fifo_store: tuple[Path, Path]) -> None:
    from mqstore.pipeline.stream import queue_bounds

    path, fifo = fifo_store
    _, exc = h.returns_promptly(fifo, lambda: queue_bounds(str(fifo.parent)))
    assert isinstance(exc, SegmentError) and str(fifo) in str(exc) and "FIFO" in str(exc), exc


# M1: records over the default maxMessageSize ----------------------------------------------


@pytest.mark.parametrize("native", [True, False])
def test_a_record_over_4_mib_that_the_store_reads_is_not_corrupt(tmp_path: Path, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from mqstore.storage import speedups

    from mqstore.pipeline.stream import QueueSlice, read_queue_slice

    if not native:  # the reference checks (MQSTORE_PURE_PYTHON=1, or no built extension)
        monkeypatch.setattr(speedups, "native", None)
    path = tmp_path / "store"
    big = b"B" * (5 << 20)
    with mqstore.open(path, mapped_file_size_commitlog_bytes=16 << 20, max_message_size_bytes=8 << 20) as st:
        for body in (b"small-1", big, b"small-2"):
            assert st.put(mqstore.Message(topic="orders", body=body)).ok
        assert st.get("orders", 0, 1, 1).messages[0].body == big
    rows = _rows([path], columns=("size", "body", "error"))
    assert [(r["body"] == big, r["error"]) for r in rows] == [(False, None), (True, None), (False, None)]
    streamed = [r for b in read_queue_slice(QueueSlice(str(path), "orders", 0, 0, 3), ["body", "error"]) for r in b.to_pylist()]
    assert [(r["body"] == big, r["error"]) for r in streamed] == [(False, None), (True, None), (False, None)]


# L1: the plan of an unsealed segment ------------------------------------------------------


def _planned(path: Path, opened: list[str], first: dict[str, os.stat_result], mp: pytest.MonkeyPatch) -> int:
    """Messages of a plan of the store at path, made with frozen file times; the segments the
    planner mapped go to `opened`."""
    real_stat, real_open = os.stat, datasource.open_segment

    def frozen(p: Any, *args: Any, **kwargs: Any) -> Any:
        st = real_stat(p, *args, **kwargs)
        if isinstance(p, str) and p.startswith(str(path)) and not args and not kwargs:
            return h.FrozenTimes(st, first.setdefault(p, st))
        return st

    mp.setattr(os, "stat", frozen)
    mp.setattr(datasource, "open_segment", lambda p: opened.append(p) or real_open(p))
    try:
        splits = plan_splits([str(path)], 4096, 4 << 20)
    finally:
        mp.undo()
    return sum(1 for s in splits for r in walk(open_segment(s.path), s.segment, s.start, s.end) if r.step is Step.MESSAGE)


def test_an_unchanged_unsealed_segment_is_not_walked_again_but_an_appended_one_is(tmp_path: Path) -> None:
    path = tmp_path / "live"
    first: dict[str, os.stat_result] = {}
    with mqstore.open(path, **SMALL) as st, pytest.MonkeyPatch.context() as mp:
        for _ in range(20):
            assert st.put(mqstore.Message(topic="orders", body=b"x" * 300)).ok
        opened: list[str] = []
        assert _planned(path, opened, first, mp) == 20 and opened  # walked once
        opened.clear()
        assert _planned(path, opened, first, mp) == 20 and opened == []  # nothing written: the plan stands
        assert st.put(mqstore.Message(topic="orders", body=b"x" * 300)).ok
        assert _planned(path, opened, first, mp) == 21 and opened  # written where the walk met zeros


def test_an_unsealed_segments_plan_stands_until_the_next_segment_gets_records(store: Path, tmp_path: Path) -> None:
    # Segment 0 without its blank: its records end at zeros. With segment 1 away that is its
    # unwritten tail, and a second plan does not walk it again; with segment 1 back (segment 0
    # untouched) the records between are missing, and the plan says so.
    for i in (2, 3):
        _seg(store, i).unlink()
    data = bytearray(_seg(store, 0).read_bytes())
    end = list(walk(bytes(data), Segment(str(_seg(store, 0)), 0, SEGMENT)))[-1].next_pos  # where the blank is
    data[end : end + 8] = bytes(8)
    _seg(store, 0).write_bytes(bytes(data))
    _seg(store, 1).rename(tmp_path / "away")
    assert _errors([store]) == []
    opened: list[str] = []
    real_open = datasource.open_segment
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasource, "open_segment", lambda p: opened.append(p) or real_open(p))
        plan_splits([str(store)], 20_000, 4 << 20)
    assert opened == []
    (tmp_path / "away").rename(_seg(store, 1))
    assert _errors([store]) == [(end, SEGMENT - end)]


# L5: `_end_of_data` decides again when the zeros it met were written meanwhile --------------


def test_zeros_written_meanwhile_are_read_again_not_called_missing_records(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The last segment's records end at zeros; while the walk asks whether the next segment
    # holds records (it does: a writer rolled), the writer fills those zeros with a record.
    last = _seg(store, 3)
    seg = Segment(str(last), 3 * SEGMENT, SEGMENT)
    steps = list(walk(open_segment(str(last)), seg))
    end = steps[-1].next_pos
    record = last.read_bytes()[steps[-1].pos : end]

    def rolled_meanwhile(s: Segment) -> bool:
        fd = os.open(last, os.O_WRONLY)
        try:
            os.pwrite(fd, record, end)
        finally:
            os.close(fd)
        return True

    buf = open_segment(str(last))  # a shared mapping: it sees the write
    monkeypatch.setattr(segments, "_next_segment_has_data", rolled_meanwhile)
    got = step_at(buf, end, seg)
    assert (got.step, got.pos, got.next_pos) == (Step.MESSAGE, end, end + len(record))


# L6: stats --out through a hard link ------------------------------------------------------


def test_stats_out_through_a_hard_link_to_a_store_file_is_refused(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mqstore.pipeline import stats

    checkpoint = store / "checkpoint"
    checkpoint.write_bytes(b"\x01" * 16)
    link = tmp_path / "stats.json"
    os.link(checkpoint, link)
    monkeypatch.setattr(stats, "get_spark", lambda *a, **k: pytest.fail("the job ran"))
    assert stats.main([str(store), "--out", str(link)]) == 2
    assert checkpoint.read_bytes() == b"\x01" * 16


def test_stats_out_linked_to_a_store_file_during_the_job_leaves_that_file(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mqstore.pipeline import stats

    # The job runs for minutes after the check: --out made a hard link to STORE/checkpoint
    # meanwhile. The result is written to a new file renamed over --out; the store's file stays.
    checkpoint, out = store / "checkpoint", tmp_path / "stats.json"
    checkpoint.write_bytes(b"\x01" * 16)

    def job(*args: Any, **kwargs: Any) -> dict[str, Any]:
        os.link(checkpoint, out)
        return {"messages": 0, "corrupt_records": 0}

    monkeypatch.setattr(stats, "get_spark", lambda *a, **k: None)
    monkeypatch.setattr(stats, "compute_stats", job)
    assert stats.main([str(store), "--out", str(out)]) == 0
    assert checkpoint.read_bytes() == b"\x01" * 16 and json.loads(out.read_text())["messages"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.json", "store"]


@pytest.mark.parametrize("where", ["checkpoint", "commitlog/00000000000000000000", "new.json", "config/new.json"])
def test_stats_out_into_another_store_is_refused(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Not an input, still a store: --out OTHER/checkpoint replaced its checkpoint with JSON."""
    from mqstore.pipeline import stats

    other = tmp_path / "other"
    with mqstore.open(other, **SMALL) as s:
        assert s.put(mqstore.Message("t", b"x")).ok
    before = {p: p.read_bytes() for p in other.rglob("*") if p.is_file() and p.name != "lock"}
    monkeypatch.setattr(stats, "get_spark", lambda *a, **k: pytest.fail("the job ran"))
    assert stats.main([str(store), "--out", str(other / where)]) == 2
    assert {p: p.read_bytes() for p in other.rglob("*") if p.is_file() and p.name != "lock"} == before
    # Beside a store (not in it) is fine: the check looks at ancestors, not siblings.
    monkeypatch.setattr(stats, "get_spark", lambda *a, **k: None)
    monkeypatch.setattr(stats, "compute_stats", lambda *a, **k: {"messages": 1, "corrupt_records": 0})
    assert stats.main([str(store), "--out", str(tmp_path / "beside.json")]) == 0


@pytest.fixture
def commitlog_elsewhere(tmp_path: Path) -> tuple[Path, Path]:
    """(root, commitlog) of a closed store whose commitlog lives outside its root
    (store_path_commitlog): the root has no commitlog/ (review 63 F1)."""
    root, commitlog = tmp_path / "root", tmp_path / "cl"
    with mqstore.open(root, store_path_commitlog=str(commitlog), **SMALL) as s:
        assert s.put(mqstore.Message("t", b"x")).ok
    assert not (root / "commitlog").exists() and (root / "checkpoint").is_file()
    return root, commitlog


def _bytes_under(*dirs: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for d in dirs for p in d.rglob("*") if p.is_file()}


@pytest.mark.parametrize("where", ["root/checkpoint", "root/new.json", "root/config/new.json", "root/index/new.json",
                                   "cl/00000000000000000000", "cl/new.json"])  # fmt: skip
@pytest.mark.parametrize("given", ["cl", "copy"])
def test_stats_out_into_a_store_whose_commitlog_lives_elsewhere_is_refused(
    commitlog_elsewhere: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, given: str
) -> None:
    """Review 63 F1: the store was known only by a commitlog/ directory in its root, so
    --out ROOT/checkpoint replaced the checkpoint of a store keeping its commitlog elsewhere
    with JSON (exit 0), whether it read that store or a copy of its segments."""
    from mqstore.pipeline import stats

    root, commitlog = commitlog_elsewhere
    shutil.copytree(commitlog, tmp_path / "copy" / "commitlog")
    before = _bytes_under(root, commitlog)
    monkeypatch.setattr(stats, "get_spark", lambda *a, **k: pytest.fail("the job ran"))
    assert stats.main([str(tmp_path / given), "--out", str(tmp_path / where)]) == 2
    assert _bytes_under(root, commitlog) == before


def test_stats_out_replaces_only_a_new_empty_or_earlier_stats_file(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 63 F1: the result replaces --out whole; a file there that this job did not
    write (a store's file moved or copied out, anyone's notes) is refused, not replaced."""
    from mqstore.pipeline import stats

    monkeypatch.setattr(stats, "get_spark", lambda *a, **k: None)
    monkeypatch.setattr(stats, "compute_stats", lambda *a, **k: {"paths": [str(store)], "messages": 1, "corrupt_records": 0})
    out = tmp_path / "stats.json"
    for prepare in (lambda: None, lambda: out.write_bytes(b""), lambda: None):  # new, empty, earlier output
        prepare()
        assert stats.main([str(store), "--out", str(out)]) == 0
        assert json.loads(out.read_text())["messages"] == 1
    checkpoint_copy = tmp_path / "saved-checkpoint"
    checkpoint_copy.write_bytes(b"\0" * 8 + b"\x01" * 4088)
    notes = tmp_path / "notes.json"
    notes.write_text('{"paths": "mine"}')
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for foreign in (checkpoint_copy, notes, fifo, tmp_path / "link-to-notes"):
        if foreign.name == "link-to-notes":
            foreign.symlink_to(notes)
        kept = None if foreign == fifo else foreign.read_bytes()
        assert stats.main([str(store), "--out", str(foreign)]) == 2
        assert kept is None or foreign.read_bytes() == kept

