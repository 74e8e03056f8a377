"""Segment walking and the CLI around it (review 31: M4, M5, L2, L4, `stats --out`).

M4: bytes no file holds (a deleted middle segment, a segment cut at a record boundary, zeros
before a segment with records) were skipped silently: `stats` exited 0. M5: a FIFO named like
a segment hung every job. L4: a record cut short by the file's end was "implausible". L2: the
CLI printed Spark's first line, often only "Traceback (most recent call last):". `stats --out`
wrote over a store's own files. All but one test run without Spark."""

from __future__ import annotations

import argparse
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from mqstore.pipeline.datasource import plan_splits, read_split  # noqa: E402
from mqstore.pipeline.segments import (  # noqa: E402
    Segment,
    SegmentError,
    Step,
    discover_segments,
    open_segment,
    walk,
)
from mqstore.storage.codec import blank_record_header  # noqa: E402

h = sys.modules["mqstore_pipeline_test_helpers"]  # loaded by conftest.py (tests/ has no packages)
SEGMENT = h.SEGMENT_SIZE
MESSAGES = 220


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """About 230 KB of records in four 64 KiB segments, each ending with a blank but the last."""
    written = h.write_commitlog(tmp_path / "store", h.make_specs(MESSAGES))
    assert len(os.listdir(written.store / "commitlog")) == 4
    return Path(written.store)


def _segment_path(store: Path, i: int) -> Path:
    return store / "commitlog" / f"{i * SEGMENT:020d}"


def _rows(paths: list[Any], split_size: int = 20_000) -> list[dict[str, Any]]:
    """What the data source returns, without Spark: plan, then read every split."""
    rows: list[dict[str, Any]] = []
    for split in plan_splits([str(p) for p in paths], split_size, 4 << 20):
        for batch in read_split(split, ["commitlog_offset", "size", "error"]):
            rows.extend(batch.to_pylist())
    return rows


def _errors(paths: list[Any]) -> list[dict[str, Any]]:
    return [r for r in _rows(paths) if r["error"] is not None]


def _positions(path: Path) -> list[int]:
    seg = Segment(str(path), int(path.name), path.stat().st_size)
    return [s.pos for s in walk(open_segment(str(path)), seg) if s.step is Step.MESSAGE]


# M4 --------------------------------------------------------------------------------------


def test_a_deleted_middle_segment_is_an_error_row(store: Path) -> None:
    lost = len(_positions(_segment_path(store, 1)))
    _segment_path(store, 1).unlink()
    rows = _rows([store])
    bad = [r for r in rows if r["error"] is not None]
    assert [(r["commitlog_offset"], r["size"]) for r in bad] == [(SEGMENT, SEGMENT)]
    assert f"[{SEGMENT}, {2 * SEGMENT})" in bad[0]["error"]
    assert len(rows) - len(bad) == MESSAGES - lost


def test_a_segment_deleted_after_a_read_is_reported_by_the_next_read(store: Path) -> None:
    # The planner's cache must know a segment by its span too, not only by its file.
    assert _errors([store]) == []
    _segment_path(store, 1).unlink()  # segment 0's file is unchanged; its span is not
    assert [r["commitlog_offset"] for r in _errors([store])] == [SEGMENT]


@pytest.mark.parametrize("segment", [0, 2])
def test_a_segment_cut_at_a_record_boundary_is_an_error_row(store: Path, segment: int) -> None:
    path = _segment_path(store, segment)
    cut = _positions(path)[10]
    os.truncate(path, cut)
    bad = _errors([store])
    assert [(r["commitlog_offset"], r["size"]) for r in bad] == [(segment * SEGMENT + cut, SEGMENT - cut)]
    assert "cut short" in bad[0]["error"]


def test_the_last_segment_cut_at_a_record_boundary_is_an_error_row(store: Path) -> None:
    path = _segment_path(store, 3)
    cut = _positions(path)[5]
    os.truncate(path, cut)
    bad = _errors([store])
    assert [(r["commitlog_offset"], r["size"]) for r in bad] == [(3 * SEGMENT + cut, SEGMENT - cut)]


def test_zeros_before_a_segment_with_records_are_an_error_row(store: Path) -> None:
    path = _segment_path(store, 1)
    at = _positions(path)[5]
    data = bytearray(path.read_bytes())
    data[at:] = bytes(len(data) - at)
    path.write_bytes(bytes(data))
    bad = _errors([store])
    assert [(r["commitlog_offset"], r["size"]) for r in bad] == [(SEGMENT + at, SEGMENT - at)]
    assert "next segment holds records" in bad[0]["error"]


def test_unwritten_tail_and_preallocated_last_segments_are_not_damage(store: Path) -> None:
    # The last segment's zeros, two preallocated segments nothing was written to yet, and
    # one being created (still empty).
    for i in (4, 5):
        with open(_segment_path(store, i), "wb") as f:
            f.truncate(SEGMENT)
    _segment_path(store, 6).touch()
    assert _errors([store]) == [] and len(_rows([store])) == MESSAGES


def test_an_emptied_middle_segment_is_an_error_row(store: Path) -> None:
    os.truncate(_segment_path(store, 2), 0)
    assert [(r["commitlog_offset"], r["size"]) for r in _errors([store])] == [(2 * SEGMENT, SEGMENT)]


def test_gaps_past_the_file_are_reported_in_pieces_an_int32_holds(tmp_path: Path) -> None:
    # A 4 KiB file (a blank ends it) where 3 GiB of log belong: pieces end on GiB offsets.
    path = tmp_path / f"{1 << 30:020d}"
    data = bytearray(4096)
    data[:8] = blank_record_header(4096)
    path.write_bytes(bytes(data))
    seg = Segment(str(path), 1 << 30, 3 << 30)
    steps = [(s.step, s.pos, s.next_pos) for s in walk(bytes(data), seg)]
    assert steps == [(Step.CORRUPT, 4096, 1 << 30), (Step.CORRUPT, 1 << 30, 2 << 30), (Step.CORRUPT, 2 << 30, 3 << 30)]


def test_stats_exits_3_for_a_deleted_middle_segment(spark: Any, store: Path) -> None:
    from mqstore.pipeline.stats import compute_stats

    _segment_path(store, 2).unlink()
    got = compute_stats(spark, [str(store)])
    assert got["corrupt_records"] == 1 and got["corrupt"][0]["commitlog_offset"] == 2 * SEGMENT


# M5 --------------------------------------------------------------------------------------


def test_a_fifo_named_like_a_segment_is_an_error_naming_it(store: Path) -> None:
    fifo = _segment_path(store, 4)
    os.mkfifo(fifo)
    for fn in (lambda: discover_segments([str(store)]), lambda: _rows([store]), lambda: discover_segments([str(fifo)])):
        _, exc = h.returns_promptly(fifo, fn, timeout_s=10)
        assert isinstance(exc, SegmentError) and str(fifo) in str(exc) and "FIFO" in str(exc), exc


def test_a_file_named_past_the_largest_offset_is_an_error_naming_it(store: Path) -> None:
    """Review 52 L1: no log reaches 2^63 (its segment names are Java longs); the store and its
    tools refuse such a file, and so do the Spark jobs, listed or named by a glob."""
    stray = store / "commitlog" / f"{2**63:020d}"
    with open(stray, "wb") as f:
        f.truncate(SEGMENT)
    for paths in ([str(store)], [str(store / "commitlog" / "*")], [str(store / "commitlog" / f"{0:020d}")]):
        with pytest.raises(SegmentError, match=f"{stray.name} is named past the largest offset"):
            discover_segments(paths)


def test_open_segment_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / f"{0:020d}"
    os.mkfifo(fifo)
    _, exc = h.returns_promptly(fifo, lambda: open_segment(str(fifo)), timeout_s=10)
    assert isinstance(exc, SegmentError) and "FIFO" in str(exc), exc


# L4 --------------------------------------------------------------------------------------


def test_a_record_cut_by_the_end_of_the_file_is_cut_short_not_implausible(store: Path) -> None:
    path = _segment_path(store, 3)
    at = _positions(path)[5]
    os.truncate(path, at + 50)
    bad = _errors([store])
    assert [r["commitlog_offset"] for r in bad] == [3 * SEGMENT + at]
    assert "cut short" in bad[0]["error"] and "implausible" not in bad[0]["error"]


# L2 --------------------------------------------------------------------------------------

_PLANNER_ERROR = """[PYTHON_DATA_SOURCE_ERROR] Failed to generate Python data source read partitions: Traceback (most recent call last):
  File "/x/mqstore/pipeline/datasource.py", line 466, in plan_splits
    for seg in discover_segments(list(paths)):
  File "/x/mqstore/pipeline/segments.py", line 332, in open_segment
    with open(path, "rb") as f:
         ^^^^^^^^^^^^^^^^
IsADirectoryError: [Errno 21] Is a directory: '/s/commitlog/00000000000000065536'
 SQLSTATE: 38000"""


class _CapturedError(Exception):
    pass


_CapturedError.__module__ = "pyspark.errors.exceptions.captured"


@pytest.mark.parametrize(
    "text, cause",
    [
        (_PLANNER_ERROR, "IsADirectoryError: [Errno 21] Is a directory: '/s/commitlog/00000000000000065536'"),
        ("An exception was thrown from the Python worker:\nTraceback (most recent call last):\n  File \"w.py\", "
         "line 1, in f\n    g()\nmqstore.pipeline.segments.SegmentError: /s/x is a FIFO\n", "SegmentError: /s/x is a FIFO"),
        ("[SOMETHING] the job failed\nmore", "[SOMETHING] the job failed"),
    ],
)  # fmt: skip
def test_a_failed_job_prints_the_line_naming_its_cause(
    text: str, cause: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mqstore.pipeline import cli

    def run(ns: argparse.Namespace) -> int:
        raise _CapturedError(text)

    monkeypatch.setitem(sys.modules, "review31_failing_job", types.SimpleNamespace(run=run))
    code = cli._handler("review31_failing_job")(argparse.Namespace(spark_command="stats"))
    assert code == cli.EXIT_FAILURE
    assert capsys.readouterr().err == f"mqstore spark stats: job failed: {cause}\n"


# stats --out -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, out",
    [
        ("store", "store/checkpoint"),
        ("store/commitlog", "store/checkpoint"),
        ("store/commitlog/00000000000000000000", "store/config/stats.json"),
        ("store/commitlog/00000000000000000000", "store/commitlog/00000000000000000000"),
        ("store/commit*", "store/consumequeue/stats.json"),
        ("store", "link/checkpoint"),
    ],
)
def test_stats_out_never_writes_into_an_input_store(
    tmp_path: Path, store: Path, given: str, out: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mqstore.pipeline import stats

    (store / "checkpoint").write_bytes(b"\x01" * 16)
    (tmp_path / "link").symlink_to(store)
    monkeypatch.setattr(stats, "get_spark", lambda *a, **k: pytest.fail("the job ran"))
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    assert stats.main([str(tmp_path / given), "--out", str(tmp_path / out)]) == 2
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before


def test_stats_out_elsewhere_is_accepted(tmp_path: Path, store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mqstore.pipeline import stats

    class Ran(Exception):
        pass

    def started(*args: Any, **kwargs: Any) -> Any:
        raise Ran

    monkeypatch.setattr(stats, "get_spark", started)
    with pytest.raises(Ran):
        stats.main([str(store), "--out", str(tmp_path / "stats.json")])
