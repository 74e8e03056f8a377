"""A store file cut short by another process while the store runs (truncate, a restore that
rewrites in place): the next touch of its lost pages was a SIGBUS that killed the host. With
the guard (storage/_mapguard.c) the host lives, no put whose bytes missed the file is
acknowledged, the store says which file (log, `stats()`, an unclean close), and the next open
(after `mqstore recover` for a commitlog segment) serves every acknowledged message that the
cut itself did not take. Each store runs in a child (cut_under_map_child.py): a SIGBUS kills
the child, not the test runner."""

from __future__ import annotations

import json
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore.read_view import in_ranges
from mqstore.storage import mapguard

from .crashlib import read_all

CHILD = str(Path(__file__).with_name("cut_under_map_child.py"))
SEGMENT = 256 * 1024  # the child's settings, for `mqstore recover`
CHILD_ENV = {
    "MQSTORE_MAPPED_FILE_SIZE_COMMITLOG_BYTES": str(SEGMENT),
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE_BYTES": "20000",
    "MQSTORE_MAX_HASH_SLOT_NUM": "1000",
    "MQSTORE_MAX_INDEX_NUM": "4000",
}

pytestmark = pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built (no C compiler)")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
    return subprocess.run([sys.executable, "-X", "faulthandler", *args], capture_output=True, text=True, timeout=120,
                          env={**env, **CHILD_ENV})  # fmt: skip


def _child(*args: str) -> dict[str, Any]:
    child = _run(CHILD, *args)
    said = f"{args}: exit {child.returncode}\n{child.stdout[-2000:]}\n{child.stderr[-3000:]}"
    assert child.returncode != -signal.SIGBUS, "killed by SIGBUS: " + said
    assert child.returncode == 0, said
    result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return result


def _cut(what: str, store: str) -> dict[str, Any]:
    cut = _child(what, store)
    assert cut["files_cut_under_map"] == [cut["cut"]]
    assert cut["clean_close"] is False  # the next open checks the files as after a crash
    assert cut["guard_faults"] > 0 or what in ("commitlog", "next_segment")  # (or reserve() saw it first)
    return cut


@pytest.mark.parametrize("what", ["queue", "index", "checkpoint"])
def test_a_queue_index_or_checkpoint_file_cut_while_open_kills_nothing_and_the_next_open_serves_every_message(
    tmp_path: Path, what: str
) -> None:
    cut = _cut(what, str(tmp_path / "store"))
    assert cut["refused_count"] == 0  # the commitlog is whole: puts go on, the queues are rebuilt later
    acked = {**cut["before"], **cut["after"]}
    assert len(acked) == 600
    reopened = _child("reopen", str(tmp_path / "store"))
    assert reopened["served"] == {key: at[0] for key, at in acked.items()}
    assert reopened["queried"] == {"b1": 1, "b399": 1, "a0": 1, "a199": 1}
    assert reopened["put"] == "PUT_OK"


@pytest.mark.parametrize("what", ["commitlog", "next_segment"])
def test_a_commitlog_segment_cut_while_open_kills_nothing_and_acknowledges_nothing_it_lost(
    tmp_path: Path, what: str
) -> None:
    """(The segment made ready ahead of the writer has no name until the writer takes it;
    another process reaches it through /proc/<pid>/fd all the same, and cuts it there.)"""
    store = str(tmp_path / "store")
    cut = _cut(what, store)
    segment_start = int(os.path.basename(cut["cut"]))
    assert cut["refused_count"] > 0
    assert all(status == "SERVICE_NOT_AVAILABLE" for status, _ in cut["refused"]), cut["refused"]
    assert "a page of the file was gone" in cut["refused"][0][1]
    for key, (_, end) in cut["after"].items():  # acknowledged only while the bytes went to the file
        assert end <= segment_start + cut["cut_at"], (key, end)
    if what == "commitlog":
        assert cut["after"] == {}  # the writer was in the cut part
    else:
        assert cut["after"]  # puts rolled into the cut segment's intact part, then were refused
    # Opened again: degraded (a wrong-sized segment is a hole), puts refused until recover.
    degraded = _child("reopen", store)
    assert degraded["put"] == "SERVICE_NOT_AVAILABLE" and "mqstore recover" in degraded["put_detail"]
    acked = {**cut["before"], **cut["after"]}
    assert degraded["served"].items() <= {key: at[0] for key, at in acked.items()}.items()
    recovered = _run("-m", "mqstore", "recover", "--no-progress", store)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    reopened = _child("reopen", store)
    # Every acknowledged record the cut did not take (what it took is reported lost by recover).
    kept = {key: at[0] for key, at in acked.items() if at[1] <= segment_start + cut["cut_at"]}
    assert reopened["served"] == kept
    assert reopened["put"] == "PUT_OK"


def test_a_fault_on_a_file_that_is_not_the_stores_still_kills_the_process(tmp_path: Path) -> None:
    # The guard answers for the store's maps only; any other SIGBUS is what it was without it
    # (here with Python's faulthandler, which the guard chains to, dumping the stack first).
    child = _run(CHILD, "foreign_fault", str(tmp_path))
    assert "touching" in child.stdout
    assert child.returncode == -signal.SIGBUS, child.stdout + child.stderr
    assert "Bus error" in child.stderr  # faulthandler's dump


def _served(store: mqstore.MessageStore) -> dict[str, int]:
    return {m.keys or "": m.queue_offset for m in read_all(store, "t", 0)}


# The child's settings (CHILD_ENV's), so `mqstore recover` and the open agree.
SETTINGS: dict[str, Any] = {"mapped_file_size_commitlog_bytes": SEGMENT, "mapped_file_size_consume_queue_bytes": 20000,
                            "max_hash_slot_num": 1000, "max_index_num": 4000}  # fmt: skip


def _put_with_a_backup(store: mqstore.MessageStore, segment: Path, count: int) -> tuple[dict[str, int], bytes]:
    """`count` keyed puts, all acknowledged ({key: queue offset}), and `segment`'s bytes as a
    backup taken after the 50th."""
    acked: dict[str, int] = {}
    older = b""
    for i in range(count):
        result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i}"]))
        assert result.ok
        acked[f"b{i}"] = result.queue_offset
        if i == 49:
            store.flush()
            older = segment.read_bytes()
    return acked, older


def _rename_over(tmp_path: Path, data: bytes, segment: Path) -> None:
    """As rsync without --inplace, or an atomic save: a new file renamed over `segment`."""
    (tmp_path / "incoming").write_bytes(data)
    os.replace(tmp_path / "incoming", segment)


def _another_stores_second_segment(tmp_path: Path) -> bytes:
    """The bytes of the second segment of another store (600 puts of `x` bodies, keys x0...)."""
    with mqstore.open(tmp_path / "theirs", **SETTINGS) as other:
        for i in range(600):
            assert other.put(mqstore.Message(topic="t", body=b"x" * 1000, keys=[f"x{i}"])).ok
    return (tmp_path / "theirs" / "commitlog" / f"{SEGMENT:020d}").read_bytes()


def _puts_past_another_file_at_the_next_path(
    store: mqstore.MessageStore, tmp_path: Path, donor: bytes, nxt: Path
) -> dict[str, int]:
    """300 keyed puts, `donor` renamed to `nxt` (the next segment's path) after the 200th, which
    fill the first segment: {key: queue offset} of those acknowledged, at least the first 200."""
    acked: dict[str, int] = {}
    for i in range(300):
        result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i}"]))
        if result.ok:
            acked[f"b{i}"] = result.queue_offset
        if i == 199:
            _rename_over(tmp_path, donor, nxt)
    assert 200 <= len(acked) < 300
    return acked


def _wait_for_the_writer_to_find(store: Any, segment: Path) -> None:
    """Until the writer's check has found `segment` replaced: its copy saved, then the segment
    listed in the read view. The copy lands first; a read between the two is stopped by the
    file's identity instead, worded otherwise (a CI run read there and failed on the wording)."""
    start = int(segment.name)
    deadline = time.monotonic() + 10
    while not (Path(f"{segment}.store-copy").exists() and in_ranges(store.read_view.view.replaced, start)):
        assert time.monotonic() < deadline, f"the writer did not find {segment} replaced in 10 s"
        time.sleep(0.05)


def _served_every_acknowledged(store_dir: Path, acked: dict[str, int]) -> dict[str, int]:
    with mqstore.open(store_dir, **SETTINGS) as reopened:
        served = _served(reopened)
    assert {key: served.get(key) for key in acked} == acked
    return served


def test_a_segment_replaced_by_rename_while_open_acknowledges_nothing_into_the_orphan_and_keeps_the_stores_copy(
    tmp_path: Path,
) -> None:
    # rsync without --inplace, or an atomic save, renames a file over the segment being
    # written: the store went on writing into the unlinked file, acknowledged every put, closed
    # clean, and the next open served the other file (100 acknowledged messages gone).
    store_dir = tmp_path / "store"
    store = mqstore.open(store_dir, **SETTINGS)
    segment = store_dir / "commitlog" / f"{0:020d}"
    acked, older = _put_with_a_backup(store, segment, 100)
    _rename_over(tmp_path, older, segment)
    # The put whose pass found the segment replaced is in the store's copy only: stored, not on
    # disk where the store opens from. Every later put is refused, unwritten.
    found = store.put(mqstore.Message(topic="t", body=b"a" * 1000, keys=["a0"]))
    assert found.status is mqstore.PutMessageStatus.FLUSH_DISK_TIMEOUT and found.stored, found
    assert "replaced, renamed away or deleted by another process" in found.detail and ".store-copy" in found.detail
    refused = store.put(mqstore.Message(topic="t", body=b"a" * 1000, keys=["a1"]))
    assert refused.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE and not refused.stored, refused
    # The file the path names now is not the log: a read into the segment stops there, the
    # offset kept, naming the copy (review 144 F2: reads served the other file, and "no message"
    # past its end moved a consumer past acknowledged ones the copy holds; review 145 F2).
    stopped = store.get("t", 0, 0, 64)
    assert (stopped.status, stopped.messages, stopped.next_begin_offset) == (
        mqstore.GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, (), 0), stopped  # fmt: skip
    assert "was replaced, renamed away or deleted by another process" in stopped.detail, stopped.detail
    assert store.stats()["files_cut_under_map"] == [str(segment)]
    assert store.close() is False
    copy = Path(f"{segment}.store-copy")
    assert copy.exists()
    with pytest.raises(mqstore.StoreDirectoryError, match="store's own copy"):
        mqstore.open(store_dir, **SETTINGS)  # the store does not choose between the two files
    from mqstore.tools.verify import verify_store

    report = verify_store(store_dir, config=mqstore.StoreConfig(**SETTINGS))  # nor says it is fine (review 143)
    assert not report.ok and [(p.kind, p.where) for p in report.problems if p.kind == "store_copy"] == [
        ("store_copy", str(copy))]
    # The owner first keeps the other file (the copy moved out of the store) and opens: the
    # queue holds filler units for what that file lacks. Then restores the store's copy: the
    # records' units replace the fillers.
    os.replace(copy, tmp_path / "kept-aside")
    with mqstore.open(store_dir, **SETTINGS) as reopened:
        assert _served(reopened).items() <= acked.items()
    os.replace(tmp_path / "kept-aside", segment)
    served = _served_every_acknowledged(store_dir, acked)
    # The put answered stored is served, the refused one is not (review 141 F2: the first was
    # answered "not stored" though served, and a producer retrying it stored it twice).
    assert set(served) == set(acked) | {"a0"}
    with mqstore.open(store_dir, **SETTINGS) as reopened:
        assert reopened.put(mqstore.Message(topic="t", body=b"c")).ok


def test_a_pass_that_finds_its_segment_replaced_and_cannot_save_the_copy_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its bytes are in no file then (a full disk, say): "not stored", not FLUSH_DISK_TIMEOUT."""
    from mqstore.storage.mapped_file import MappedFile

    store_dir = tmp_path / "store"
    store = mqstore.open(store_dir, **SETTINGS)
    segment = store_dir / "commitlog" / f"{0:020d}"
    _, older = _put_with_a_backup(store, segment, 60)

    def no_room(self: MappedFile, path: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(MappedFile, "save_copy", no_room)
    _rename_over(tmp_path, older, segment)
    refused = store.put(mqstore.Message(topic="t", body=b"a" * 1000, keys=["a0"]))
    assert refused.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE and not refused.stored, refused
    assert "its copy could not be saved" in refused.detail
    assert store.close() is False
    assert not Path(f"{segment}.store-copy").exists()
    # What says the file at the segment's name is not the store's: the open refuses it.
    assert Path(f"{segment}.store-copy-lost").stat().st_size == 0
    with pytest.raises(mqstore.StoreDirectoryError, match="could not save its copy"):
        mqstore.open(store_dir, **SETTINGS)


def test_a_copy_saved_on_a_later_check_takes_the_place_of_the_mark_that_it_could_not_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Room again (a disk freed): the copy is saved at the next check and the mark removed, so
    the open names the copy, the way out that keeps every acknowledged message."""
    from mqstore.storage.mapped_file import MappedFile

    store_dir = tmp_path / "store"
    store = mqstore.open(store_dir, **SETTINGS)
    segment = store_dir / "commitlog" / f"{0:020d}"
    acked, older = _put_with_a_backup(store, segment, 60)
    saving = MappedFile.save_copy
    room = False

    def room_later(self: MappedFile, path: str) -> None:
        if not room:
            raise OSError(errno.ENOSPC, "No space left on device (injected)", path)
        saving(self, path)

    monkeypatch.setattr(MappedFile, "save_copy", room_later)
    _rename_over(tmp_path, older, segment)
    assert not store.put(mqstore.Message(topic="t", body=b"a" * 1000, keys=["a0"])).ok
    marker, copy = Path(f"{segment}.store-copy-lost"), Path(f"{segment}.store-copy")
    assert marker.exists() and not copy.exists()
    room = True
    deadline = time.monotonic() + 10  # the writer's tick tries again
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert copy.exists() and not marker.exists()
    assert store.close() is False
    with pytest.raises(mqstore.StoreDirectoryError, match="store's own copy"):
        mqstore.open(store_dir, **SETTINGS)
    os.replace(copy, segment)
    _served_every_acknowledged(store_dir, acked)


@pytest.mark.parametrize("how", ["delete", "rename_away"])
def test_a_pass_that_fails_after_rolling_past_a_deleted_segment_keeps_its_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Review 142 F2: the segment being written deleted (or renamed away, as logrotate's
    `create`), then a pass rolled into the next segment and failed there (a writer bug). Only
    release() checked the segments, and by then the deleted one was not the newest, which it
    takes for space freed by hand: no copy, a clean close, and every acknowledged message of
    that segment gone at the next open (59 of them)."""
    from mqstore.actors import cleaner
    from mqstore.messages import Tick
    from mqstore.runtime import ask
    from mqstore.storage.commitlog import CommitLog

    monkeypatch.setattr(cleaner, "CLEAN_FIRST_DELAY_MS", 0)  # as after a minute of running
    settings = {**SETTINGS, "mapped_file_size_consume_queue_bytes": 20 * 20}  # queue files a cleaner can delete
    store_dir = tmp_path / "store"
    store = mqstore.open(store_dir, **settings)
    first, second = (store_dir / "commitlog" / f"{offset:020d}" for offset in (0, SEGMENT))
    answered: dict[str, tuple[str, int]] = {}
    i = 0
    while True:  # the first segment nearly full: the next pass rolls
        result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i}"]))
        assert result.ok
        answered[f"b{i}"] = (result.status.name, result.queue_offset)
        i += 1
        if result.commitlog_offset + result.wrote_bytes > SEGMENT - 3000:
            break
    armed = [True]

    def failing_once_the_next_segment_has_a_record(name: str) -> None:
        method = getattr(CommitLog, name)

        def wrapped(self: CommitLog, *args: Any, **kwargs: Any) -> Any:
            files = self.mapped_file_queue.mapped_files
            if armed[0] and files and files[-1].file_name == str(second) and files[-1].wrote_position > 0:
                armed[0] = False
                raise RuntimeError("a bug in the writer, mid-pass")
            return method(self, *args, **kwargs)

        monkeypatch.setattr(CommitLog, name, wrapped)

    for name in ("append_fast", "put_message", "put_messages"):
        failing_once_the_next_segment_has_a_record(name)
    if how == "delete":
        first.unlink()
    else:
        first.rename(tmp_path / "rotated")
    futures = {f"a{j}": store.put_async(mqstore.Message(topic="t", body=b"a" * 1000, keys=[f"a{j}"])) for j in range(10)}
    for key, future in futures.items():
        result = future.result(timeout=30)  # the put the failure hit: SERVICE_NOT_AVAILABLE
        if result.stored:
            answered[key] = (result.status.name, result.queue_offset)
    assert not armed[0]  # the pass failed in the next segment
    assert any(status == "FLUSH_DISK_TIMEOUT" for status, _ in answered.values())
    # The restarted writer loaded a log without the first segment. A cleaner round deleted the
    # queue and index files below its head, those of the copied segment too (review 143 F1:
    # the copy moved back served none of its messages).
    deadline = time.monotonic() + 30
    while not store.supervisor.restarts or "writer" not in store.supervisor.ctx.peers:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    cleaned = ask(store.supervisor.ctx.peers["cleaner"], Tick(now_ms=store.supervisor.ctx.clock_ms()), timeout_s=30)
    assert cleaned.ran
    assert store.close() is False
    copy = Path(f"{first}.store-copy")
    assert copy.exists()
    os.replace(copy, first)
    with mqstore.open(store_dir, **settings) as reopened:
        served = _served(reopened)
    assert {key: served.get(key) for key in answered} == {key: offset for key, (_, offset) in answered.items()}


@pytest.mark.parametrize(
    "how,then", [("rename_away", "close"), ("delete", "restart"), ("rename_over", "burst"), ("identical", "restart")]
)
def test_a_segment_swapped_under_an_idle_or_failing_writer_loses_no_acknowledged_message(
    tmp_path: Path, how: str, then: str
) -> None:
    # Review 38: a segment renamed away (logrotate's `create`) kept its link count and was not
    # seen; one swapped while the store was idle closed clean with no copy; a writer restarted
    # after the swap went on from the older file's end, over acknowledged records' offsets; a
    # burst that rolled into the next segment was checked only there.
    store_dir = tmp_path / "store"
    plan = mqstore.FaultPlan()
    store = mqstore.open(store_dir, faults=plan, **SETTINGS)
    segment = store_dir / "commitlog" / f"{0:020d}"
    acked, older = _put_with_a_backup(store, segment, 100)
    if how == "rename_away":
        os.rename(segment, f"{segment}.1")
        segment.write_bytes(older)
    elif how == "delete":
        os.remove(segment)
    elif how == "identical":  # review 39 F2: its end is the store's, so only the copy tells
        _rename_over(tmp_path, segment.read_bytes(), segment)
    else:
        _rename_over(tmp_path, older, segment)
    if then == "restart":
        plan.arm("writer.after_append", 1)
        failed = store.put(mqstore.Message(topic="t", body=b"x" * 1000, keys=["x"]))
        assert not failed.ok
        deadline = time.monotonic() + 10  # the restarted writer answers, not "restarting"
        while (not store.supervisor.restarts or store.supervisor.state.name != "RUNNING") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.supervisor.restarts
    if then == "burst":  # 200 more: the first pass ends the orphan segment and rolls on
        futures = [store.put_async(mqstore.Message(topic="t", body=b"a" * 1000, keys=[f"a{i}"])) for i in range(200)]
        results = [(f"a{i}", future.result(timeout=30)) for i, future in enumerate(futures)]
    else:
        time.sleep(1.5 if then == "close" else 0)  # a tick of an idle store, or nothing
        results = [(f"a{i}", store.put(mqstore.Message(topic="t", body=b"a" * 1000, keys=[f"a{i}"]))) for i in range(30)]
    if then == "restart":  # answered by the restarted writer, not refused as "restarting"
        assert all("restarting" not in result.detail for _, result in results), results[:3]
    for key, result in results:
        if result.ok:  # acknowledged only outside the swapped segment
            assert result.commitlog_offset >= SEGMENT, (key, result)
            acked[key] = result.queue_offset
    assert store.close() is False
    copy = Path(f"{segment}.store-copy")
    assert copy.exists()
    with pytest.raises(mqstore.StoreDirectoryError, match="store's own copy"):
        mqstore.open(store_dir, **SETTINGS)  # the owner chooses which file is the segment
    os.replace(copy, segment)
    _served_every_acknowledged(store_dir, acked)


def test_an_older_segment_replaced_while_idle_is_found_on_the_writers_tick(tmp_path: Path) -> None:
    # Not the segment being written: the writer's tick checks every segment it maps, so the
    # store's copy is saved before the close instead of the next open serving the other file.
    store_dir = tmp_path / "store"
    store = mqstore.open(store_dir, **SETTINGS)
    first = store_dir / "commitlog" / f"{0:020d}"
    acked, older = _put_with_a_backup(store, first, 300)  # two segments
    assert store.stats()["commitlog_max_offset"] > SEGMENT
    _rename_over(tmp_path, older, first)
    _wait_for_the_writer_to_find(store, first)
    assert not store.put(mqstore.Message(topic="t", body=b"a" * 1000, keys=["a0"])).ok
    assert store.close() is False
    os.replace(f"{first}.store-copy", first)
    _served_every_acknowledged(store_dir, acked)


def test_a_store_opened_by_a_relative_path_keeps_its_files_when_the_host_changes_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review 39 F3: after chdir() the writer took its own segment for a replaced one (puts
    # refused, unclean close), and queue and index files were made under the new directory.
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    store = mqstore.open("store", mapped_file_size_commitlog_bytes=SEGMENT)
    assert store.put(mqstore.Message(topic="t", body=b"b", keys=["b0"])).ok
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert store.put(mqstore.Message(topic="t", body=b"a", keys=["a0"])).ok
    assert store.put(mqstore.Message(topic="u", body=b"a", keys=["a1"])).ok  # a new queue's files
    assert store.close() is True
    assert list((tmp_path / "elsewhere").iterdir()) == []
    with mqstore.open(tmp_path / "store", mapped_file_size_commitlog_bytes=SEGMENT) as reopened:
        assert sorted(_served(reopened)) == ["a0", "b0"]


@pytest.mark.parametrize("raw", [False, True])
def test_a_middle_segment_renamed_over_by_another_segments_bytes_never_serves_a_wrong_message(
    tmp_path: Path, raw: bool
) -> None:
    """Review 144 F2: a middle segment renamed over by a copy of the first one's bytes while the
    store runs. The store found it (a copy saved, puts refused), but `get` served the first
    segment's messages at the middle one's acknowledged queue offsets, FOUND and unsaid (the
    owner's answer checked no record's identity): a consumer took 59 wrong messages and moved
    past. A read there now serves nothing it is not sure of and keeps the offset."""
    store_dir = tmp_path / "store"
    store = mqstore.open(store_dir, **SETTINGS)
    acked: dict[str, int] = {}
    for i in range(600):  # three segments
        result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i}"]))
        assert result.ok
        acked[f"b{i}"] = result.queue_offset
    store.flush()
    segments = sorted((store_dir / "commitlog").iterdir())
    assert len(segments) >= 3
    _rename_over(tmp_path, segments[0].read_bytes(), segments[1])
    by_offset = {offset: key for key, offset in acked.items()}
    try:
        stopped_at = []
        for offset in sorted(by_offset):
            got = store.get("t", 0, offset, 1, raw=raw)
            if raw:
                served = [int.from_bytes(r[20:28], "big") for r in got.raw]
                assert served in ([], [offset]), (offset, served, got.detail)
            else:
                assert [m.keys for m in got.messages] in ([], [by_offset[offset]]), (offset, got)
            if not (got.raw if raw else got.messages):
                assert got.next_begin_offset == offset, got  # never moved past
                # (said by the record, by the file's identity, or, once the writer's tick found
                # the swap, by the view)
                assert ("is not this queue's message" in got.detail or "was replaced" in got.detail
                        or "is not the one the store writes" in got.detail), got.detail  # fmt: skip
                stopped_at.append(offset)
        # Exactly the middle segment's messages were not served; the others were.
        in_middle = [o for o in sorted(by_offset) if SEGMENT <= _commitlog_offset_of(store_dir, o) < 2 * SEGMENT]
        assert in_middle and stopped_at == in_middle
    finally:
        store.close()
    copy = Path(f"{segments[1]}.store-copy")
    assert copy.exists()
    os.replace(copy, segments[1])
    _served_every_acknowledged(store_dir, acked)


def _commitlog_offset_of(store_dir: Path, queue_offset: int) -> int:
    """The commitlog offset queue t/0's unit `queue_offset` holds, read from its file."""
    units = (store_dir / "consumequeue" / "t" / "0" / f"{0:020d}").read_bytes()
    return int.from_bytes(units[queue_offset * 20 : queue_offset * 20 + 8], "big")


def test_another_stores_segment_of_the_same_shape_renamed_over_is_never_served_once_found(tmp_path: Path) -> None:
    """Review 145 F2: another store's segment, written by the same put sequence (same topics,
    queues and sizes, other bodies), renamed over a middle segment: every record there looks
    like the queue's own, and `get` and `lookup` served them, FOUND, even after the writer
    had found the swap and saved its copy. The writer publishes the segments it found
    replaced; every read into one stops there, the offset kept."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    acked: dict[str, int] = {}
    offsets: dict[int, int] = {}
    stamps: dict[int, int] = {}
    with mqstore.open(theirs, **SETTINGS) as other:  # the same keys too: only the bodies differ
        for i in range(600):
            assert other.put(mqstore.Message(topic="t", body=b"x" * 1000, keys=[f"b{i:03d}"])).ok
    store = mqstore.open(ours, **SETTINGS)
    try:
        for i in range(600):
            result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i:03d}"]))
            assert result.ok
            acked[f"b{i:03d}"] = result.queue_offset
            offsets[result.queue_offset] = result.commitlog_offset
            stamps[result.queue_offset] = result.store_timestamp
        middle = ours / "commitlog" / f"{SEGMENT:020d}"
        _rename_over(tmp_path, (theirs / "commitlog" / middle.name).read_bytes(), middle)
        _wait_for_the_writer_to_find(store, middle)
        for queue_offset, commitlog_offset in sorted(offsets.items()):
            got = store.get("t", 0, queue_offset, 1)
            if SEGMENT <= commitlog_offset < 2 * SEGMENT:
                assert (got.status, got.messages, got.next_begin_offset) == (
                    mqstore.GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, (), queue_offset), got  # fmt: skip
                assert "was replaced, renamed away or deleted by another process" in got.detail
                with pytest.raises(OSError, match="was replaced"):
                    store.lookup(commitlog_offset)
                # Review 146 F2/F3: nor by key, nor raw to a replica, nor its store time.
                found = store.query("t", f"b{queue_offset:03d}", 4, 0, 2**62)
                assert found.messages == () and "was replaced" in found.detail, found
                assert store.message_store_time("t", 0, queue_offset) == -1
                assert store.offset_for_time("t", 0, stamps[queue_offset]) == -1
            else:
                assert [bytes(m.body) for m in got.messages] == [b"b" * 1000], got
        with pytest.raises(OSError, match="was replaced"):
            store.get_commitlog_data(SEGMENT)
        # A long poll there waits its time out (it answered True at once, and a consumer's loop
        # spun on gets that served nothing); before the segment it answers at once.
        stopped = min(q for q, c in offsets.items() if SEGMENT <= c < 2 * SEGMENT)
        began = time.monotonic()
        assert store.wait_for_messages("t", 0, stopped, 0.3) is False
        assert time.monotonic() - began >= 0.3
        assert store.wait_for_messages("t", 0, stopped - 1, 30) is True
    finally:
        store.close()
    os.replace(f"{middle}.store-copy", middle)
    _served_every_acknowledged(ours, acked)


def test_a_second_segment_replaced_after_the_first_is_saved_and_stopped_at_too(tmp_path: Path) -> None:
    """Review 146 F1: once the writer had found one segment replaced it never checked again: a
    second one swapped later got no copy and was served as the other file (200 wrong of 200),
    and moving the copies back lost its 200 acknowledged messages for good."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    acked: dict[str, int] = {}
    where: dict[int, int] = {}
    with mqstore.open(theirs, **SETTINGS) as other:
        for i in range(800):
            assert other.put(mqstore.Message(topic="t", body=b"x" * 1000, keys=[f"x{i:03d}"])).ok
    store = mqstore.open(ours, **SETTINGS)
    segments = [ours / "commitlog" / f"{k * SEGMENT:020d}" for k in (1, 2)]
    try:
        for i in range(800):  # four segments
            result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i:03d}"]))
            assert result.ok
            acked[f"b{i:03d}"] = result.queue_offset
            where[result.queue_offset] = result.commitlog_offset
        for segment in segments:
            _rename_over(tmp_path, (theirs / "commitlog" / segment.name).read_bytes(), segment)
            _wait_for_the_writer_to_find(store, segment)
        for queue_offset, commitlog_offset in sorted(where.items()):
            if SEGMENT <= commitlog_offset < 3 * SEGMENT:
                got = store.get("t", 0, queue_offset, 1)
                assert (got.status, got.messages) == (mqstore.GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, ()), got
    finally:
        store.close()
    for segment in segments:
        os.replace(f"{segment}.store-copy", segment)
    _served_every_acknowledged(ours, acked)


def test_a_writer_restarted_after_a_replaced_segment_whose_copy_could_not_be_saved_takes_no_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 147 F1: the segment being written renamed over, its copy not savable (a full
    disk), and the writer crashing in the pass that found it: the restarted writer loaded the
    other file as the log and took puts again (nothing on disk said otherwise), and the next
    open served the other store's records as acknowledged ones. The store's view still says the
    segment is not the log: the restarted writer refuses every put, and reads there stop."""
    from mqstore.storage.mapped_file import MappedFile

    def no_room(self: MappedFile, path: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device (injected)", path)

    theirs = tmp_path / "theirs"
    with mqstore.open(theirs, **SETTINGS) as other:
        for i in range(100):
            assert other.put(mqstore.Message(topic="t", body=b"x" * 1000, keys=[f"b{i:03d}"])).ok
    plan = mqstore.FaultPlan()
    store_dir = tmp_path / "store"
    store = mqstore.open(store_dir, faults=plan, **{**SETTINGS, "flush_interval_commitlog_ms": 600_000})
    try:
        for i in range(100):
            assert store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i:03d}"])).ok
        monkeypatch.setattr(MappedFile, "save_copy", no_room)
        segment = store_dir / "commitlog" / f"{0:020d}"
        _rename_over(tmp_path, (theirs / "commitlog" / segment.name).read_bytes(), segment)
        plan.arm("writer.after_append")
        crashed = store.put(mqstore.Message(topic="t", body=b"c" * 1000, keys=["crash"]))
        assert not crashed.ok, crashed
        deadline = time.monotonic() + 15
        while True:  # the restarted writer answers; every put is refused from now on
            after = store.put(mqstore.Message(topic="t", body=b"a" * 1000, keys=["after"]))
            if "could not save its copy" in after.detail or time.monotonic() > deadline:
                break
            assert not after.ok, after  # (refused while it restarts, never stored)
            time.sleep(0.05)
        assert after.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE and "could not save its copy" in after.detail, after
        got = store.get("t", 0, 0, 8)
        assert (got.status, got.messages) == (mqstore.GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, ()), got
    finally:
        store.close()
    # Nor does the next open read the other file as the log: the mark the failed copy left says
    # so (it did, and served the other store's 100 messages as acknowledged ones).
    marker = Path(f"{segment}.store-copy-lost")
    assert marker.exists()
    with pytest.raises(mqstore.StoreDirectoryError, match="could not save its copy") as refused:
        mqstore.open(store_dir, **SETTINGS)
    assert marker.name in str(refused.value)
    from mqstore.tools.verify import verify_store

    report = verify_store(store_dir, config=mqstore.StoreConfig(**SETTINGS))
    assert [(p.kind, p.where) for p in report.problems if p.kind == "store_copy"] == [("store_copy", str(marker))]
    marker.unlink()  # the owner's choice: keep the other file
    with mqstore.open(store_dir, **SETTINGS) as reopened:
        assert len(read_all(reopened, "t", 0)) == 100


def _in_a_new_thread(call: Any) -> Any:
    """`call()` on a thread that never read before: its maps are made now, after a swap."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result(60)


@pytest.mark.parametrize("donor", ["other_store", "older_backup"])
def test_a_segment_replaced_before_the_writers_next_check_is_not_read_as_the_log(
    tmp_path: Path, donor: str
) -> None:
    """Review 145 F3: in the moment between a swap and the writer's next check (its tick), a
    reader that mapped the path then read the file there as the log: another store's segment
    of the same shape was served by `get`, `lookup` and `query`, and an older backup of the
    segment itself was served, its missing tail skipped as damage (a consumer moved past
    acknowledged messages). The writer publishes the identity of each file it maps; a reader
    that maps another file there reads "not now": nothing served, the offset kept."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    middle = ours / "commitlog" / f"{SEGMENT:020d}"
    if donor == "other_store":
        with mqstore.open(theirs, **SETTINGS) as other:
            for i in range(600):
                assert other.put(mqstore.Message(topic="t", body=b"x" * 1000, keys=[f"b{i:03d}"])).ok
    store = mqstore.open(ours, **{**SETTINGS, "flush_interval_commitlog_ms": 600_000})  # no tick in the test
    offsets: dict[int, int] = {}
    older = b""
    try:
        for i in range(600):
            result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i:03d}"]))
            assert result.ok
            offsets[result.queue_offset] = result.commitlog_offset
            if i == 300:  # inside the middle segment
                older = middle.read_bytes()
        assert min(c for c in offsets.values()) < SEGMENT and max(offsets.values()) >= 2 * SEGMENT
        swapped_in = (theirs / "commitlog" / middle.name).read_bytes() if donor == "other_store" else older
        _rename_over(tmp_path, swapped_in, middle)

        def read_everything() -> list[tuple[int, Any, Any]]:
            seen = []
            for queue_offset, commitlog_offset in sorted(offsets.items()):
                got = store.get("t", 0, queue_offset, 1)
                try:
                    looked: Any = store.lookup(commitlog_offset)
                except OSError as exc:
                    looked = exc
                seen.append((queue_offset, got, looked))
            return seen

        for queue_offset, got, looked in _in_a_new_thread(read_everything):
            commitlog_offset = offsets[queue_offset]
            assert [(bytes(m.body), m.keys) for m in got.messages] in ([], [(b"b" * 1000, f"b{queue_offset:03d}")]), got
            if got.messages:  # (an older backup's missing tail was skipped as damage: 173 passed over)
                assert got.next_begin_offset == queue_offset + 1, (queue_offset, got)
            assert looked is None or isinstance(looked, OSError) or bytes(looked.body) == b"b" * 1000, looked
            if SEGMENT <= commitlog_offset < 2 * SEGMENT and donor == "other_store":
                # Every record of the other file looks like its queue's own: only its identity says.
                assert not got.messages and got.next_begin_offset == queue_offset, got
            if not got.messages:
                assert got.next_begin_offset == queue_offset and got.detail, got  # never moved past
        found = _in_a_new_thread(lambda: store.query("t", "b350", 4, 0, 2**62))
        assert [bytes(m.body) for m in found.messages] in ([], [b"b" * 1000]), found
        # Nor copied to a replica (it answered None, "nothing there"), nor long-polled in a spin
        # (review 148 F2, F3).
        with pytest.raises(OSError, match="is not the one the store writes"):
            _in_a_new_thread(lambda: store.get_commitlog_data(SEGMENT + 5000))
        stopped = max(q for q, c in offsets.items() if c < SEGMENT) + 1

        def long_poll() -> tuple[bool, float]:
            store.get("t", 0, stopped, 32)  # (a consumer's loop: its get came first)
            began = time.monotonic()
            return store.wait_for_messages("t", 0, stopped, 0.3), time.monotonic() - began

        waited, took = _in_a_new_thread(long_poll)
        assert waited is False and took >= 0.3
        # Nor on a thread that never read (`mqstore.aio` waits and gets on different threads;
        # review 149 F2: True at once until the writer's tick, and its consumer spun).
        began = time.monotonic()
        assert _in_a_new_thread(lambda: store.wait_for_messages("t", 0, stopped, 0.3)) is False
        assert time.monotonic() - began >= 0.3
        assert _in_a_new_thread(lambda: store.wait_for_messages("t", 0, stopped - 1, 30)) is True
    finally:
        store.close()


@pytest.mark.parametrize("when", ["before_the_writers_check", "after_it"])
def test_dispatch_behind_a_replaced_segment_waits_there_and_moves_no_consumer_past_it(
    tmp_path: Path, when: str
) -> None:
    """Review 148 F1: dispatch (reput) read the file at a replaced segment's path as the log when
    it was behind at the swap (before or after the writer's check): an older backup's missing
    tail became 173 filler units, and a get passed over those acknowledged messages, FOUND. It
    now waits there, as at a hole; the store's copy moved back brings them all."""
    from mqstore.faults import HoldAt

    store_dir = tmp_path / "store"
    middle = store_dir / "commitlog" / f"{SEGMENT:020d}"
    hold = HoldAt("reput.mid_dispatch", hold_s=120)
    tick = 600_000 if when == "before_the_writers_check" else 100
    store = mqstore.open(store_dir, faults=hold, **{**SETTINGS, "flush_interval_commitlog_ms": tick})
    acked: dict[str, int] = {}
    older = b""
    try:
        for i in range(600):
            if i == 10:
                hold.armed.set()  # dispatch stops in the first segment from here
            result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i:03d}"]))
            assert result.ok
            acked[f"b{i:03d}"] = result.queue_offset
            if i == 300:
                older = middle.read_bytes()  # a backup of the middle segment, taken mid-way
        assert hold.entered.wait(30)
        _rename_over(tmp_path, older, middle)
        if when == "after_it":
            deadline = time.monotonic() + 10
            while not store.read_view.view.replaced and time.monotonic() < deadline:
                time.sleep(0.02)
            assert store.read_view.view.replaced
        hold.release.set()
        deadline = time.monotonic() + 4  # (it went on to the log's end, reading the other file)
        while store.read_view.view.dispatched_end < store.read_view.view.readable_end and time.monotonic() < deadline:
            time.sleep(0.05)
        offset = 0
        while True:  # a consumer
            got = _in_a_new_thread(lambda: store.get("t", 0, offset, 32))
            assert [m.keys for m in got.messages] == [f"b{q:03d}" for q in range(offset, offset + len(got.messages))], got
            if not got.messages:
                break
            assert got.next_begin_offset == offset + len(got.messages), got  # never past one unserved
            offset = got.next_begin_offset
        assert 0 < offset < 300
        # A consumer already further on (it read 237-300 some other way) is not moved past the
        # backup's missing tail either: no filler unit took their queue offsets.
        got = _in_a_new_thread(lambda: store.get("t", 0, 301, 32))
        assert (got.messages, got.next_begin_offset) == ((), 301) or got.status.name.startswith("OFFSET_"), got
        units = (store_dir / "consumequeue" / "t" / "0" / f"{0:020d}").read_bytes()
        fillers = [q for q in range(len(units) // 20) if int.from_bytes(units[q * 20 + 8 : q * 20 + 12], "big") == 0x7FFFFFFF]
        assert fillers == []
    finally:
        store.close()
    os.replace(f"{middle}.store-copy", middle)
    _served_every_acknowledged(store_dir, acked)


@pytest.mark.parametrize("dispatch", ["live", "behind"])
def test_a_writer_restarted_beside_a_replaced_segment_takes_none_of_the_other_files_damage_for_the_logs(
    tmp_path: Path, dispatch: str
) -> None:
    """Review 149 F1: an older backup renamed over a middle segment, then the writer restarted
    before its check (its stop saved the copy). The restarted writer's recovery read the backup
    and quarantined its missing tail as damage; reads skipped it (FOUND, 182 acknowledged
    messages passed over) and dispatch behind it wrote filler units for them. Damage found in
    a replaced segment is the other file's: not published, and no file there is the log."""
    from mqstore.faults import HoldAt

    store_dir = tmp_path / "store"
    middle = store_dir / "commitlog" / f"{SEGMENT:020d}"
    plan = HoldAt("reput.mid_dispatch", hold_s=120)
    store = mqstore.open(store_dir, faults=plan, **{**SETTINGS, "flush_interval_commitlog_ms": 600_000})
    acked: dict[str, int] = {}
    older = b""
    try:
        for i in range(800):
            if i == 10 and dispatch == "behind":
                plan.armed.set()
            result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i:03d}"]))
            assert result.ok
            acked[f"b{i:03d}"] = result.queue_offset
            if i == 290:
                older = middle.read_bytes()
        _rename_over(tmp_path, older, middle)
        plan.arm("writer.after_append")
        assert not store.put(mqstore.Message(topic="t", body=b"c" * 1000)).ok
        plan.release.set()  # (the restart waits for dispatch's answer; dispatch maps the other file now)
        from mqstore.read_view import NOT_THE_LOG

        deadline = time.monotonic() + 15  # the restarted writer's recovery, published beside the copy its stop saved
        while store.read_view.view.segments.get(SEGMENT) != NOT_THE_LOG and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.read_view.view.segments.get(SEGMENT) == NOT_THE_LOG
        assert store.read_view.view.quarantined == ()
        deadline = time.monotonic() + 15
        while "store-copy" not in store.put(mqstore.Message(topic="t", body=b"d")).detail:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.5)  # (dispatch, released, would read on here)
        for start in (0, 292, 400):
            got = _in_a_new_thread(lambda: store.get("t", 0, start, 32))
            keys = [m.keys for m in got.messages]
            assert keys == [f"b{q:03d}" for q in range(start, start + len(keys))], got
            assert got.next_begin_offset in (start + len(keys), 0), got  # (0: OFFSET_OVERFLOW_BADLY's, as RocketMQ)
        units = (store_dir / "consumequeue" / "t" / "0" / f"{0:020d}").read_bytes()
        assert [q for q in range(len(units) // 20) if units[q * 20 + 8 : q * 20 + 12] == b"\x7f\xff\xff\xff"] == []
    finally:
        store.close()
    os.replace(f"{middle}.store-copy", middle)
    _served_every_acknowledged(store_dir, acked)


def test_a_writer_restarted_beside_a_replaced_segment_changes_no_byte_of_the_file_there(tmp_path: Path) -> None:
    """The last segment renamed over by another store's segment whose records run past ours and
    end in a torn tail of its own, then the writer restarted (its stop saved the copy): its
    recovery cut that tail as the log's and zeroed 82 KB of the other file. That file is not
    the store's to change (the owner may keep it, or compare it with the copy)."""
    theirs, store_dir = tmp_path / "theirs", tmp_path / "store"
    with mqstore.open(theirs, **SETTINGS) as other:  # the same put sequence, further on
        for i in range(400):
            assert other.put(mqstore.Message(topic="t", body=b"x" * 1000, keys=[f"b{i}"])).ok
    last = store_dir / "commitlog" / f"{SEGMENT:020d}"
    donor = bytearray((theirs / "commitlog" / last.name).read_bytes())
    their_end = len(donor.rstrip(b"\0"))
    donor[their_end:] = bytes((7 * i + 1) % 251 + 1 for i in range(len(donor) - their_end))  # a torn tail
    plan = mqstore.FaultPlan()
    store = mqstore.open(store_dir, faults=plan, **{**SETTINGS, "flush_interval_commitlog_ms": 600_000})
    acked: dict[str, int] = {}
    try:
        for i in range(300):  # into the second segment, ending before theirs does
            result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i}"]))
            assert result.ok
            acked[f"b{i}"] = result.queue_offset
        assert SEGMENT < store.stats()["commitlog_max_offset"] < SEGMENT + their_end
        _rename_over(tmp_path, bytes(donor), last)
        plan.arm("writer.after_append")
        assert not store.put(mqstore.Message(topic="t", body=b"c" * 1000)).ok
        deadline = time.monotonic() + 15  # the restarted writer's refusal names the copy its stop saved
        while "store-copy" not in store.put(mqstore.Message(topic="t", body=b"d")).detail:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        while not store.supervisor.restarts:  # (recorded once the restart is done: a loaded run read it first)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert last.read_bytes() == donor
    finally:
        store.close()
    assert last.read_bytes() == donor
    os.replace(f"{last}.store-copy", last)
    _served_every_acknowledged(store_dir, acked)


@pytest.mark.parametrize("found", ["by_a_restarted_writer", "not_yet"])
def test_the_cleaner_deletes_no_file_at_a_replaced_segments_path(tmp_path: Path, found: str) -> None:
    """Review 151 F1: another store's segment renamed over the first one with its times kept
    (`cp -p`, `rsync -a`, `tar`: four days old), then a cleaning round. Retention took its age
    for the segment's and deleted it: another process's file, and, before the writer's check
    had saved the copy, the store's own bytes with it (its map was the last reference to them:
    237 acknowledged messages lost). Neither is deleted now; the copy brings back every one."""
    theirs, store_dir = tmp_path / "theirs", tmp_path / "store"
    with mqstore.open(theirs, **SETTINGS) as other:
        for i in range(700):
            assert other.put(mqstore.Message(topic="t", body=b"x" * 700, keys=[f"x{i}"])).ok
    plan = mqstore.FaultPlan()
    store = mqstore.open(store_dir, faults=plan, **{**SETTINGS, "flush_interval_commitlog_ms": 600_000})
    acked: dict[str, int] = {}
    first = store_dir / "commitlog" / f"{0:020d}"
    try:
        for i in range(700):  # three segments
            result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i}"]))
            assert result.ok
            acked[f"b{i}"] = result.queue_offset
        donor = (theirs / "commitlog" / first.name).read_bytes()
        (tmp_path / "incoming").write_bytes(donor)
        four_days_ago = time.time() - 4 * 86400
        os.utime(tmp_path / "incoming", (four_days_ago, four_days_ago))
        os.replace(tmp_path / "incoming", first)
        if found == "by_a_restarted_writer":  # its stop saved the copy; the view lists the segment
            plan.arm("writer.after_append")
            assert not store.put(mqstore.Message(topic="t", body=b"c")).ok
            deadline = time.monotonic() + 15
            while "store-copy" not in store.put(mqstore.Message(topic="t", body=b"d")).detail:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert store.delete_expired_files_now() == 0
        assert first.read_bytes() == donor
    finally:
        assert store.close() is False  # (not yet found: the close's check saves the copy)
    assert first.read_bytes() == donor
    os.replace(f"{first}.store-copy", first)
    _served_every_acknowledged(store_dir, acked)


def test_a_segment_swapped_back_before_the_writers_check_holds_no_wait_there(tmp_path: Path) -> None:
    """Review 152 F1: another file renamed over a segment and the store's own renamed back (the
    same inode) before the writer's check, a reader on some thread mapping the path in between.
    The store is healthy again, but every wait there, on any thread, waited its whole time out
    (False) while a get served the message, until some thread happened to map it again."""
    store_dir = tmp_path / "store"
    store = mqstore.open(store_dir, **{**SETTINGS, "flush_interval_commitlog_ms": 600_000})  # no tick in the test
    try:
        offsets = {}
        for i in range(300):  # into the second segment
            result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i}"]))
            assert result.ok
            offsets[result.queue_offset] = result.commitlog_offset
        second = store_dir / "commitlog" / f"{SEGMENT:020d}"
        in_second = [q for q, c in sorted(offsets.items()) if c >= SEGMENT]
        os.link(second, tmp_path / "kept")
        _rename_over(tmp_path, b"\0" * SEGMENT, second)
        stopped = _in_a_new_thread(lambda: store.get("t", 0, in_second[5], 1))
        assert stopped.messages == () and "is not the one the store writes" in stopped.detail, stopped
        os.replace(tmp_path / "kept", second)
        for offset in (in_second[5], in_second[-1]):
            began = time.monotonic()
            assert _in_a_new_thread(lambda: store.wait_for_messages("t", 0, offset, 5)) is True
            assert time.monotonic() - began < 4
            got = _in_a_new_thread(lambda: store.get("t", 0, offset, 1))
            assert [m.keys for m in got.messages] == [f"b{offset}"], got
        assert store.read_view.view.replaced == ()
    finally:
        assert store.close() is True  # nothing was lost: the path names the store's file again


@pytest.mark.parametrize("then", ["closed", "moved_away_while_open"])
def test_a_file_at_the_next_segments_path_is_never_written_into(tmp_path: Path, then: str) -> None:
    """Review 152 F2: another store's segment renamed to the path of the segment the writer
    was about to roll into. The writer opened it and wrote its records over the other file's
    (242,025 bytes changed) and acknowledged them. Now puts that need the segment are refused
    (CREATE_MAPPED_FILE_FAILED, the file named), nothing is written into it, and a marker
    makes the next open refuse rather than read that file as the log's next segment."""
    store_dir = tmp_path / "store"
    donor = _another_stores_second_segment(tmp_path)
    nxt = store_dir / "commitlog" / f"{SEGMENT:020d}"
    marker = Path(f"{nxt}.store-copy-none")
    store = mqstore.open(store_dir, **SETTINGS)
    acked: dict[str, int] = {}
    refused = []
    try:
        for i in range(200):  # inside the first segment
            result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i}"]))
            assert result.ok
            acked[f"b{i}"] = result.queue_offset
        assert not nxt.exists()
        _rename_over(tmp_path, donor, nxt)
        for i in range(200, 300):
            result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=[f"b{i}"]))
            if result.ok:
                acked[f"b{i}"] = result.queue_offset
            else:
                refused.append(result)
        assert refused and len(acked) < 300
        assert {r.status for r in refused} == {mqstore.PutMessageStatus.CREATE_MAPPED_FILE_FAILED}
        assert "a file the store did not make" in refused[0].detail and str(nxt) in refused[0].detail
        assert nxt.read_bytes() == donor and marker.exists()
        if then == "moved_away_while_open":  # the owner moves it out: the segment is made, the mark goes
            os.replace(nxt, tmp_path / "theirs-kept")
            result = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=["after"]))
            assert result.ok, result
            acked["after"] = result.queue_offset
            assert not marker.exists()
    finally:
        store.close()
    if then == "closed":
        assert nxt.read_bytes() == donor
        with pytest.raises(mqstore.StoreDirectoryError, match="a file it did not make"):
            mqstore.open(store_dir, **SETTINGS)
        os.replace(nxt, tmp_path / "theirs-kept")
        marker.unlink()
    assert (tmp_path / "theirs-kept").read_bytes() == donor
    served = _served_every_acknowledged(store_dir, acked)
    assert set(served) == set(acked)  # none of the other store's records


@pytest.mark.parametrize("then", ["no_empty_file_could_be_made", "moved_out_then_closed_before_any_put"])
def test_the_mark_of_a_taken_segment_path_is_made_where_it_can_be_and_left_only_while_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """Review 153: where no empty marker could be made (no inode left: F1), the next open read
    the other file as the log and served 237 of its records; the marker is then a second name
    of that file (a hard link needs no inode on most filesystems). And a file moved out as the
    refusal said, the store closed before a put made the segment (F2): the marker was left and
    the next open refused a healthy store; the close removes it."""
    from mqstore.storage.fs import RealFileSystem

    store_dir = tmp_path / "store"
    donor = _another_stores_second_segment(tmp_path)
    nxt = store_dir / "commitlog" / f"{SEGMENT:020d}"
    marker = Path(f"{nxt}.store-copy-none")
    if then == "no_empty_file_could_be_made":
        write_atomic = RealFileSystem.write_atomic

        def no_inode_for_the_mark(fs: RealFileSystem, path: str, data: bytes) -> None:
            if path.endswith(".store-copy-none"):
                raise OSError(errno.ENOSPC, "No space left on device (injected)", path)
            write_atomic(fs, path, data)

        monkeypatch.setattr(RealFileSystem, "write_atomic", no_inode_for_the_mark)
        link, links = RealFileSystem.link, [0]

        def the_first_link_fails(fs: RealFileSystem, path: str, target: str) -> None:
            links[0] += 1
            if links[0] == 1:  # (review 154 F2: a link was tried only once)
                raise OSError(errno.ENOSPC, "No space left on device (injected)", target)
            link(fs, path, target)

        monkeypatch.setattr(RealFileSystem, "link", the_first_link_fails)
    store = mqstore.open(store_dir, **SETTINGS)
    acked: dict[str, int] = {}
    try:
        acked = _puts_past_another_file_at_the_next_path(store, tmp_path, donor, nxt)
        assert marker.exists()
        if then == "no_empty_file_could_be_made":
            assert marker.stat().st_ino == nxt.stat().st_ino  # a second name of the other file
        else:
            os.replace(nxt, tmp_path / "theirs-kept")
    finally:
        assert store.close() is True  # (nothing acknowledged is missing)
    if then == "no_empty_file_could_be_made":
        with pytest.raises(mqstore.StoreDirectoryError, match="a file it did not make"):
            mqstore.open(store_dir, **SETTINGS)
        os.replace(nxt, tmp_path / "theirs-kept")
        marker.unlink()
    assert not marker.exists()
    assert (tmp_path / "theirs-kept").read_bytes() == donor
    assert set(_served_every_acknowledged(store_dir, acked)) == set(acked)


def test_a_writer_restarted_beside_the_mark_of_a_taken_path_serves_and_dispatches_none_of_that_file(
    tmp_path: Path,
) -> None:
    """The writer fails (an injected fault) in a pass whose puts it refused because another
    store's segment is at the path of its next segment, the mark beside it. The restarted
    writer's recovery maps that file as the log's next segment: none of its records may be
    served, dispatched to the queue or counted as the log's, no byte of it changed, no put
    acknowledged; once it is moved out and the store reopened, every acknowledged message is
    served and puts go on."""
    store_dir = tmp_path / "store"
    donor = _another_stores_second_segment(tmp_path)
    nxt = store_dir / "commitlog" / f"{SEGMENT:020d}"
    marker = Path(f"{nxt}.store-copy-none")
    plan = mqstore.FaultPlan()
    store = mqstore.open(store_dir, faults=plan, **SETTINGS)
    theirs = "x300"  # a key of the other store's in that file
    assert f"{theirs}\x02".encode() in donor
    acked: dict[str, int] = {}
    try:
        acked = _puts_past_another_file_at_the_next_path(store, tmp_path, donor, nxt)
        assert marker.exists()
        restarts = len(store.supervisor.restarts)
        plan.arm("writer.after_refusal", 1)
        assert not store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=["in-the-failed-pass"])).ok
        deadline = time.monotonic() + 30
        while len(store.supervisor.restarts) == restarts or "writer" not in store.supervisor.peers:
            assert time.monotonic() < deadline, "the writer was not restarted"
            time.sleep(0.05)
        assert plan.fired["writer.after_refusal"] == 1
        assert store.supervisor.restarts[-1].failed == "writer"
        after = store.put(mqstore.Message(topic="t", body=b"b" * 1000, keys=["after-the-restart"]))
        assert not after.ok, after
        time.sleep(1.0)  # (dispatch, had it taken the other file for the log, would have moved on)
        served = _in_a_new_thread(lambda: _served(store))
        assert set(served) == set(acked), sorted(set(served) ^ set(acked))[:5]
        assert all(served[key] == offset for key, offset in acked.items())
        assert store.get("t", 0, len(acked), 32).messages == ()
        assert not store.query("t", theirs).messages
        units = (store_dir / "consumequeue" / "t" / "0" / f"{0:020d}").read_bytes()
        assert len(units.rstrip(b"\0")) <= len(acked) * 20, "units past the acknowledged ones"
        assert nxt.read_bytes() == donor
    finally:
        store.close()
    assert nxt.read_bytes() == donor and marker.exists()
    os.replace(nxt, tmp_path / "theirs-kept")
    marker.unlink()
    served = _served_every_acknowledged(store_dir, acked)
    assert set(served) == set(acked)
    with mqstore.open(store_dir, **SETTINGS) as reopened:
        assert reopened.put(mqstore.Message(topic="t", body=b"b", keys=["reopened"])).ok
    assert (tmp_path / "theirs-kept").read_bytes() == donor
