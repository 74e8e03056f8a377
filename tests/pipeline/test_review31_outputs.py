"""Where export and reindex may write (review 31 H1, H2, M1, M3): never over what they read,
never into a running store, never deleting what they did not write. Each refusal comes before
Spark is touched, so these tests need no session."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore.cli import CliError, ExitCode
from mqstore.pipeline import reindex as reindex_module
from mqstore.pipeline.outputs import check_export_target

SMALL = {"mapped_file_size_commitlog_bytes": 64 * 1024, "mapped_file_size_consume_queue_bytes": 20 * 100,
         "max_hash_slot_num": 64, "max_index_num": 256}  # fmt: skip


class _NoSpark:
    """Stands where a SparkSession would: any use fails the test (a refusal comes first)."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"Spark was used ({name}) before the target was checked")


def _store(root: Path) -> None:
    with mqstore.open(root, **SMALL) as store:
        for i in range(20):
            assert store.put(mqstore.Message("orders", b"m%d" % i, keys=[f"k{i}"])).ok


def _state(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}  # fmt: skip


@pytest.mark.parametrize("where", ["the store", "its parent", "its commitlog", "a segment's directory's child"])
def test_an_export_over_its_own_input_is_refused_and_deletes_nothing(tmp_path: Path, where: str) -> None:
    """Spark's overwrite emptied OUT before reading: OUT = the store or a directory above it
    deleted the whole store, commitlog included (H1)."""
    from mqstore.pipeline.export import export

    store = tmp_path / "data" / "store"
    _store(store)
    out = {"the store": store, "its parent": tmp_path / "data", "its commitlog": store / "commitlog",
           "a segment's directory's child": store / "commitlog" / "exported"}[where]  # fmt: skip
    before = _state(tmp_path)
    with pytest.raises(CliError) as refused:
        export(_NoSpark(), [str(store)], str(out))  # type: ignore[arg-type]
    assert refused.value.code == ExitCode.USAGE and "overlaps the input" in refused.value.message
    assert _state(tmp_path) == before


def test_an_export_replaces_only_an_earlier_export(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _store(store)
    out = tmp_path / "out"
    check_export_target(str(out), [str(store)])  # new
    out.mkdir()
    check_export_target(str(out), [str(store)])  # empty
    for name in ("topic=orders", "_corrupt", "_SUCCESS", "._SUCCESS.crc"):
        (out / name).mkdir() if not name.endswith(("SUCCESS", ".crc")) else (out / name).write_bytes(b"")
    check_export_target(str(out), [str(store)])  # an earlier export
    (out / "notes.txt").write_text("mine")
    other = tmp_path / "other-store"
    _store(other)
    for foreign in (out, tmp_path / "other-store"):  # a stray file; another store
        with pytest.raises(CliError, match="holds entries an export did not write"):
            check_export_target(str(foreign), [str(store)])
    (tmp_path / "file").write_text("x")
    with pytest.raises(CliError, match="not a directory"):
        check_export_target(str(tmp_path / "file"), [str(store)])


def test_a_reindex_into_a_running_store_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """H2: the rebuild deleted and rewrote the queue and index files the running store had
    mapped; its next units went into deleted files and were zeros on disk."""
    store = tmp_path / "store"
    _store(store)
    with mqstore.open(store, **SMALL) as running:
        data = [store / "commitlog", store / "consumequeue", store / "index"]  # the running store writes its own stats
        before = [_state(d) for d in data]
        with pytest.raises(CliError) as refused:
            reindex_module.reindex(_NoSpark(), str(store), str(store))  # type: ignore[arg-type]
        assert refused.value.code == ExitCode.LOCKED
        assert [_state(d) for d in data] == before
        assert running.put(mqstore.Message("orders", b"after")).ok


@pytest.mark.parametrize("linked", [False, True], ids=["own", "symlinked"])
def test_a_reindex_never_deletes_or_appends_to_queue_or_index_files(tmp_path: Path, linked: bool) -> None:
    """M1: the old files were deleted before anything was read (a failed run left the store
    with neither); M3: a symlinked consumequeue/ survived the silent rmtree and was appended
    to. Now existing files refuse the rebuild, and a stopped store's lock is respected."""
    store = tmp_path / "store"
    _store(store)
    if linked:
        (store / "consumequeue").rename(tmp_path / "cq-elsewhere")
        (store / "consumequeue").symlink_to(tmp_path / "cq-elsewhere")
    before = _state(tmp_path)
    with pytest.raises(CliError, match="is not empty"):
        reindex_module.reindex(_NoSpark(), str(store), str(store))  # type: ignore[arg-type]
    assert _state(tmp_path) == before
    with mqstore.open(store, **SMALL) as reopened:  # the lock taken for the check was released
        assert len(reopened.get("orders", 0, 0, 32).messages) == 20


def test_a_failed_reindex_leaves_its_empty_directories_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    _store(store)
    for sub in ("consumequeue", "index"):
        (store / sub).rename(tmp_path / f"{sub}-aside")  # the operator's step before a rebuild in place

    def fails_half_way(messages: Any, out_dir: str, mapped_file_size: int, floors: Any = None) -> list[dict[str, Any]]:
        os.makedirs(os.path.join(out_dir, "consumequeue", "orders", "0"))
        Path(out_dir, "consumequeue", "orders", "0", "00000000000000000000").write_bytes(b"\0" * 20)
        raise RuntimeError("executor lost")

    monkeypatch.setattr(reindex_module, "_messages", lambda *args: _Cached())
    monkeypatch.setattr(reindex_module, "build_consume_queues", fails_half_way)
    with pytest.raises(RuntimeError, match="executor lost"):
        reindex_module.reindex(_NoSpark(), str(store), str(store))  # type: ignore[arg-type]
    assert os.listdir(store / "consumequeue") == [] and os.listdir(store / "index") == []
    with mqstore.open(store, **SMALL) as reopened:  # rebuilt by the store itself, nothing half-written left
        assert len(reopened.get("orders", 0, 0, 32).messages) == 20


class _Cached:
    def cache(self) -> _Cached:
        return self

    def unpersist(self) -> None:
        pass


def test_an_export_stays_out_of_the_store_its_input_belongs_to(tmp_path: Path) -> None:
    """Review 33 L3: given STORE/commitlog (or its glob), OUT could be the store's empty index/
    or a future segment's name: only the literal inputs were compared."""
    store = tmp_path / "store"
    _store(store)
    commitlog = store / "commitlog"
    for out, given in ((store / "index", str(commitlog)), (commitlog / f"{1 << 30:020d}", str(commitlog / "*")),
                       (store / "consumequeue" / "x", str(commitlog / "*"))):  # fmt: skip
        with pytest.raises(CliError, match="overlaps the input"):
            check_export_target(str(out), [given])


def _hold_open(store: Path, ready: Path) -> subprocess.Popen[bytes]:
    """Another process running the store until killed (OFD lock and directory flocks held)."""
    code = ("import sys, time, mqstore; s = mqstore.open(sys.argv[1], **eval(sys.argv[3]));"
            "open(sys.argv[2], 'w').close(); time.sleep(120)")  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", code, str(store), str(ready), repr(SMALL)])
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert child.poll() is None and time.monotonic() < deadline, "the store did not open in the child"
        time.sleep(0.05)
    return child


@pytest.mark.parametrize("moved_aside", [False, True], ids=["as-it-runs", "lock-deleted-and-directories-moved"])
def test_a_reindex_into_a_store_another_process_runs_is_refused(tmp_path: Path, moved_aside: bool) -> None:
    """Review 33 L4/L5: with the running store's `lock` deleted and its queue and index
    directories moved aside (the README's step before a rebuild in place), the claim passed
    and re-created `lock` beside the running store; the held commitlog/ says it runs."""
    store = tmp_path / "store"
    _store(store)
    child = _hold_open(store, tmp_path / "ready")
    try:
        if moved_aside:
            (store / "lock").unlink()
            for sub in ("consumequeue", "index"):
                (store / sub).rename(tmp_path / f"{sub}-aside")
        before = _state(store / "commitlog")
        with pytest.raises(CliError) as refused:
            reindex_module.reindex(_NoSpark(), str(store), str(store))  # type: ignore[arg-type]
        assert refused.value.code == ExitCode.LOCKED
        assert _state(store / "commitlog") == before
        assert (store / "lock").exists() is not moved_aside  # not re-created
    finally:
        child.kill()
        child.wait()


def test_the_jobs_refuse_before_the_jvm_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 33 L6: run() started Spark (~7 s) before the check refused."""
    from mqstore.pipeline import export as export_module

    store = tmp_path / "store"
    _store(store)

    def no_jvm(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Spark started before the refusal")

    monkeypatch.setattr(export_module, "get_spark", no_jvm)
    monkeypatch.setattr(reindex_module, "get_spark", no_jvm)
    with pytest.raises(CliError, match="overlaps the input"):
        export_module.run(export_module.build_parser().parse_args([str(store), str(store)]))
    (store / "index" / "stray").write_bytes(b"x")
    with pytest.raises(CliError, match="is not empty"):
        reindex_module.run(reindex_module.build_parser().parse_args([str(store), str(store)]))


@pytest.mark.parametrize("job", ["export", "reindex"])
@pytest.mark.parametrize("where", ["root/new", "root/index/new", "root/config/new", "cl", "cl/new"])
def test_no_job_writes_into_a_store_whose_commitlog_lives_elsewhere(tmp_path: Path, job: str, where: str) -> None:
    """Review 63 F1: a store was known only by a commitlog/ directory in its root; a root
    whose commitlog lives elsewhere (store_path_commitlog), or that commitlog directory, took
    an export's partitions or a rebuild's queue and index files among its own. Read here: a
    copy of the segments, so no input overlaps."""
    from mqstore.pipeline.export import export

    root, commitlog = tmp_path / "root", tmp_path / "cl"
    with mqstore.open(root, store_path_commitlog=str(commitlog), **SMALL) as store:
        assert store.put(mqstore.Message("orders", b"m")).ok
    copy = tmp_path / "copy"
    shutil.copytree(commitlog, copy / "commitlog")
    before = _state(root), _state(commitlog)
    with pytest.raises(CliError, match="lies in the store directory|segment or queue file|did not write") as refused:
        if job == "export":
            export(_NoSpark(), [str(copy)], str(tmp_path / where))  # type: ignore[arg-type]
        else:
            reindex_module.reindex(_NoSpark(), str(copy), str(tmp_path / where))  # type: ignore[arg-type]
    assert refused.value.code == ExitCode.USAGE
    assert (_state(root), _state(commitlog)) == before



@pytest.mark.parametrize("beside", ["model/checkpoint", "site/index/", "scratch/lock", "spool/00000000000000000042"])
def test_one_common_name_above_an_output_does_not_make_a_store(tmp_path: Path, beside: str) -> None:
    """A TensorFlow model's `checkpoint`, a site's `index/`, a `lock`, a 20-digit file name two
    levels up: none is a store's root alone (review 64 F3: each refused an ordinary --out)."""
    from mqstore.pipeline.outputs import refuse_store_around

    top, name = beside.split("/", 1)
    (tmp_path / top).mkdir()
    if name.endswith("/"):
        (tmp_path / top / name).mkdir()
    else:
        (tmp_path / top / name).write_text("model_checkpoint_path: ckpt-1\n")
    refuse_store_around(str(tmp_path / top / "reports" / "run1" / "stats.json"), "--out")
    export = tmp_path / top / "reports" / "export"
    (tmp_path / "input").mkdir()
    check_export_target(str(export), [str(tmp_path / "input")])
    # Two of them, or one only a store gives, still make a store's root.
    (tmp_path / top / "checkpoint").write_bytes(bytes(4096))
    (tmp_path / top / "lock").write_bytes(b"")
    with pytest.raises(CliError):
        refuse_store_around(str(tmp_path / top / "reports" / "stats.json"), "--out")
