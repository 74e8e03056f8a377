"""Derived files are rebuilt, never fatal (issue 19 item 6): an index or ConsumeQueue file
that is empty, short or of the wrong size is set aside as `<name>.damaged` (never deleted)
and rebuilt from the log at open; a bad consumerOffset.json falls back to an empty table;
junk in the store directory is ignored with a warning or refused with a clear error."""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

import mqstore
from mqstore import Message, PutResult
from mqstore.storage.consume_queue import list_consume_queues
from mqstore.storage.fs import NotARegularFileError, RealFileSystem
from mqstore.storage.lockfiles import StoreDirectoryError, StoreLockedError
from mqstore.storage.queue_ledger import LedgerEntry, LedgerFile, load_ledger_file, load_queue_ledger

FIXTURES = Path("/work/shared/fixtures")

SETTINGS = dict(
    mapped_file_size_commitlog_bytes=1 << 20,
    mapped_file_size_consume_queue_bytes=20 * 50,  # 50 units a file: 120 messages fill 3 files
    max_hash_slot_num=64,
    max_index_num=400,
)
N = 120


def _make(root: Path) -> None:
    with mqstore.open(root, **SETTINGS) as store:
        for i in range(N):
            assert store.put(Message(topic="T", body=b"%d" % i, keys=[f"k{i}"])).ok
        assert store.wait_for_messages("T", 0, N - 1, timeout_s=10)
        store.commit_offset("g", "T", 0, 7)


def _assert_whole(root: Path) -> None:
    """Every message readable in order, every key found: what was set aside was rebuilt."""
    with mqstore.open(root, **SETTINGS) as store:
        assert store.wait_for_messages("T", 0, N - 1, timeout_s=10)
        bodies: list[bytes] = []
        offset = 0
        while offset < N:
            got = store.get("T", 0, offset, 32)
            assert got.messages, got
            bodies += [m.body for m in got.messages]
            offset = got.next_begin_offset
        assert bodies == [b"%d" % i for i in range(N)]
        for i in (0, 57, N - 1):
            assert [m.body for m in store.query("T", f"k{i}").messages] == [b"%d" % i]


def _index_file(root: Path) -> Path:
    return root / "index" / sorted(os.listdir(root / "index"))[0]


def _cq_file(root: Path, n: int) -> Path:
    directory = root / "consumequeue" / "T" / "0"
    return directory / sorted(os.listdir(directory))[n]


def _truncate(path: Path, size: int) -> Path:
    with open(path, "r+b") as f:
        f.truncate(size)
    return path


DAMAGE: dict[str, Callable[[Path], Path]] = {
    "index_empty": lambda r: _truncate(_index_file(r), 0),
    "index_short": lambda r: _truncate(_index_file(r), 5000),
    "index_header_only": lambda r: _truncate(_index_file(r), 40),
    "cq_first_empty": lambda r: _truncate(_cq_file(r, 0), 0),
    "cq_middle_short": lambda r: _truncate(_cq_file(r, 1), 500),
    "cq_last_short": lambda r: _truncate(_cq_file(r, 2), 333),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_derived_file_is_set_aside_and_rebuilt_at_open(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "store"
    _make(root)
    damaged = DAMAGE[damage](root)
    kept = damaged.read_bytes()
    _assert_whole(root)
    set_aside = damaged.with_name(damaged.name + ".damaged")
    assert set_aside.read_bytes() == kept  # never deleted, byte for byte
    _assert_whole(root)  # and the next open is clean too


def test_files_that_hold_together_at_another_geometry_are_refused_not_rebuilt(tmp_path: Path) -> None:
    """A consistent store written with other sizes is not damage (its sizes are read from the
    files by the CLI): the open refuses, loudly, and renames nothing."""
    root = tmp_path / "store"
    _make(root)
    # Issue 14: the geometry check refuses it first, naming the setting and both values.
    with pytest.raises(mqstore.StoreConfigMismatch, match="max_index_num=401.*max_index_num=400"):
        mqstore.open(root, **{**SETTINGS, "max_index_num": 401})
    with pytest.raises(mqstore.StoreConfigMismatch, match="consume_queue_bytes=1200.*consume_queue_bytes=1000"):
        mqstore.open(root, **{**SETTINGS, "mapped_file_size_consume_queue_bytes": 20 * 60})
    assert not list(root.rglob("*.damaged"))
    _assert_whole(root)


@pytest.mark.parametrize("text", [b"garbage", b"[" * 100_000, b"\xff\xfe", b""])
def test_a_bad_consumer_offset_file_opens_with_an_empty_table(tmp_path: Path, text: bytes) -> None:
    root = tmp_path / "store"
    _make(root)
    path = root / "config" / "consumerOffset.json"
    path.write_bytes(text)
    for bak in root.glob("config/consumerOffset.json.bak"):
        bak.write_bytes(b"{")
    with mqstore.open(root, **SETTINGS) as store:
        assert store.query_offset("g", "T", 0) == -1
        store.commit_offset("g", "T", 0, 9)
    with mqstore.open(root, **SETTINGS) as store:
        assert store.query_offset("g", "T", 0) == 9
    if text.strip():
        assert (root / "config" / "consumerOffset.json.damaged").read_bytes() == text


def test_a_bad_consumer_offset_file_falls_back_to_its_bak(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _make(root)
    with mqstore.open(root, **SETTINGS) as store:
        store.commit_offset("g", "T", 0, 8)  # the previous file (offset 7) becomes the .bak
    (root / "config" / "consumerOffset.json").write_bytes(b"{" * 50_000)
    with mqstore.open(root, **SETTINGS) as store:
        assert store.query_offset("g", "T", 0) == 7


JUNK: dict[str, Callable[[Path], object]] = {
    "stray_file_in_commitlog": lambda r: (r / "commitlog" / "notes.txt").write_text("x"),
    "short_name_in_commitlog": lambda r: (r / "commitlog" / "123").write_text("x"),
    "stray_file_in_queue_dir": lambda r: (r / "consumequeue" / "T" / "0" / "junk").write_text("x"),
    "non_numeric_queue_dir": lambda r: (r / "consumequeue" / "T" / "abc").mkdir(),
    "zero_padded_queue_dir": lambda r: (r / "consumequeue" / "T" / "00").mkdir(),
    "file_not_a_topic_name": lambda r: (r / "consumequeue" / ".DS_Store").write_text("x"),
    "stray_file_in_index": lambda r: (r / "index" / "junk").write_text("x"),
}

# Named as the store names its own files and directories, but of the other kind: once the store
# gets there (a put to topic "stray" or queue T-7, the log or an index reaching that name) it
# cannot make its file. A file named as a topic stopped the store (the ConsumeQueue actor failed
# ten times) at the first put to that topic; now the open is refused, naming it.
IN_THE_WAY: dict[str, Callable[[Path], Path]] = {
    "dir_named_as_segment_in_commitlog": lambda r: _mkdir(r / "commitlog" / ("9" * 20)),
    "dir_named_as_segment_in_queue": lambda r: _mkdir(r / "consumequeue" / "T" / "0" / ("0" * 15 + "99999")),
    "file_as_queue_dir": lambda r: _write(r / "consumequeue" / "T" / "7"),
    "file_as_topic_dir": lambda r: _write(r / "consumequeue" / "stray"),
    "dir_named_as_index_file": lambda r: _mkdir(r / "index" / ("2" * 17)),
}


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _write(path: Path) -> Path:
    path.write_text("x")
    return path


@pytest.mark.parametrize("junk", sorted(JUNK))
def test_junk_in_the_store_directory_is_ignored(tmp_path: Path, junk: str) -> None:
    root = tmp_path / "store"
    _make(root)
    JUNK[junk](root)
    _assert_whole(root)


@pytest.mark.parametrize("junk", sorted(IN_THE_WAY))
def test_a_file_or_directory_in_the_way_of_the_stores_own_names_is_refused(tmp_path: Path, junk: str) -> None:
    root = tmp_path / "store"
    _make(root)
    path = IN_THE_WAY[junk](root)
    with pytest.raises(StoreDirectoryError, match=f"{path} is in the way"):
        mqstore.open(root, **SETTINGS)
    if path.is_dir():
        path.rmdir()
    else:
        path.unlink()
    _assert_whole(root)


# Where the store reads or writes one of its files, a FIFO: opening it to read (or the .tmp to
# write) blocks until another end comes, and the open hung for good with the lock taken and
# `abort` written (a review's sweep), or a commit_offset() and close() did, later.
FIFO_IN_THE_WAY: dict[str, Callable[[Path], Path]] = {
    "checkpoint": lambda r: r / "checkpoint",
    "queue_ledger": lambda r: r / "queue_ledger.msgpack",
    "index_progress": lambda r: r / "index_progress.msgpack",
    "commitlog_segment": lambda r: r / "commitlog" / ("0" * 20),
    "queue_segment": lambda r: r / "consumequeue" / "T" / "0" / ("0" * 20),
    "index_file": _index_file,
    "offsets_bak_tmp": lambda r: r / "config" / "consumerOffset.json.bak.tmp",
    "stats_snapshot_tmp": lambda r: r / "stats.msgpack.tmp",
}


@pytest.mark.parametrize("where", sorted(FIFO_IN_THE_WAY))
def test_a_fifo_where_the_store_keeps_a_file_is_refused_not_waited_on(tmp_path: Path, where: str) -> None:
    root = tmp_path / "store"
    _make(root)
    path = FIFO_IN_THE_WAY[where](root)
    saved = path.read_bytes() if path.exists() else None
    path.unlink(missing_ok=True)
    os.mkfifo(path)

    def state() -> dict[str, tuple[int, float]]:
        return {str(p): (p.lstat().st_size, p.lstat().st_mtime) for p in sorted(root.rglob("*"))}

    before = state()
    outcome: list[BaseException | None] = []

    def open_it() -> None:
        try:
            mqstore.open(root, **SETTINGS).close()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    opener = threading.Thread(target=open_it, daemon=True)
    opener.start()
    opener.join(20)
    assert outcome, "the open hung on the FIFO"
    assert isinstance(outcome[0], StoreDirectoryError) and f"{path} is " in str(outcome[0])
    assert state() == before  # refused before anything was made or written
    path.unlink()
    if saved is not None:
        path.write_bytes(saved)
    _assert_whole(root)


def test_a_fifo_left_as_a_temporary_file_fails_the_write_instead_of_blocking_it(tmp_path: Path) -> None:
    """write_atomic's temporary file is a FIFO (made after the open's check): the write raises
    NotARegularFileError instead of blocking its caller for good; a regular leftover is replaced."""
    fs = RealFileSystem()
    target = tmp_path / "f"
    os.mkfifo(tmp_path / "f.tmp")
    with pytest.raises(NotARegularFileError):
        fs.write_atomic(str(target), b"x")
    assert not target.exists()
    (tmp_path / "f.tmp").unlink()
    (tmp_path / "f.tmp").write_bytes(b"a leftover")
    fs.write_atomic(str(target), b"y")
    assert target.read_bytes() == b"y" and not (tmp_path / "f.tmp").exists()
    os.mkfifo(tmp_path / "g")
    with pytest.raises(NotARegularFileError):
        fs.read_bytes(str(tmp_path / "g"))


def test_a_store_held_by_another_opener_is_refused_as_locked_whatever_its_files_look_like(tmp_path: Path) -> None:
    """The open's refusals look at the files before taking the store: with another holder
    writing, a `.tmp` mid-rename looked like something in the way, and the error advised to
    move a live store's file aside. A held store is StoreLockedError, whatever is seen."""
    root = tmp_path / "store"
    _make(root)
    with mqstore.open(root, **SETTINGS):
        in_the_way = root / "commitlog" / ("9" * 20)
        in_the_way.mkdir()
        with pytest.raises(StoreLockedError) as refused:
            mqstore.open(root, **SETTINGS)
        assert isinstance(refused.value.__cause__, StoreDirectoryError)  # what it saw, kept
        in_the_way.rmdir()
        mid_rename = root / "config" / "consumerOffset.json.bak.tmp"
        mid_rename.mkdir()
        with pytest.raises(StoreLockedError):
            mqstore.open(root, **SETTINGS)
        mid_rename.rmdir()
    _assert_whole(root)


def test_the_probe_of_a_refused_open_keeps_this_processs_classic_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the lock is a classic POSIX lock (no OFD locks: other platforms), closing any
    descriptor of `lock` drops this process's lock on it. The refused open's probe opened and
    closed one: the store kept running unlocked, and another process opened it (the review's
    reproduction). The probe now asks this process's own registry first."""
    import subprocess
    import sys

    from mqstore.storage import lockfiles

    monkeypatch.setattr(lockfiles, "_USE_OFD", False)
    root = tmp_path / "store"
    _make(root)
    probe = ("import sys; from pathlib import Path; from mqstore.tools.inspect_cli import lock_state; "
             "print(lock_state(Path(sys.argv[1]))['held'])")  # fmt: skip

    def held_as_another_process_sees_it() -> bool:
        out = subprocess.run([sys.executable, "-c", probe, str(root)], capture_output=True, text=True, check=True)
        return out.stdout.strip() == "True"

    with mqstore.open(root, **SETTINGS):
        assert held_as_another_process_sees_it()
        in_the_way = root / "commitlog" / ("9" * 20)
        in_the_way.mkdir()
        with pytest.raises(StoreLockedError, match="in this process"):
            mqstore.open(root, **SETTINGS)
        assert held_as_another_process_sees_it()  # still ours
        in_the_way.rmdir()
    _assert_whole(root)


@pytest.mark.parametrize("name", ["abort", "lock"])
def test_a_directory_where_a_marker_file_belongs_is_a_clear_error(tmp_path: Path, name: str) -> None:
    root = tmp_path / "store"
    _make(root)
    if name == "lock":
        (root / "lock").unlink()
    (root / name).mkdir()
    with pytest.raises(StoreDirectoryError, match=f"{root / name} is a directory"):
        mqstore.open(root, **SETTINGS)
    (root / name).rmdir()
    _assert_whole(root)  # the refusal changed nothing


@pytest.mark.parametrize("segment_bytes", [1 << 20, 4096], ids=["one-segment", "many-segments"])
def test_a_queue_whose_files_were_all_deleted_is_rebuilt_and_its_offsets_are_not_reused(
    tmp_path: Path, segment_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a clean stop, every file of one queue is deleted (its directory left): the queue is
    rebuilt from the log at open, and the next put continues its queue offsets. Before, the
    queue restarted at 0, so the next put took queue offset 0 and two records claimed it; and
    over many segments, recovery's re-count of queue offsets stopped at the first segment's end
    (the next put took the offset of the first record of the second segment)."""
    monkeypatch.setitem(SETTINGS, "mapped_file_size_commitlog_bytes", segment_bytes)
    root = tmp_path / "store"
    _make(root)
    with mqstore.open(root, **SETTINGS) as store:  # another queue, written last, stays whole
        assert store.put(Message(topic="U", body=b"u")).ok
        assert store.wait_for_messages("U", 0, 0, timeout_s=10)
    directory = root / "consumequeue" / "T" / "0"
    for name in os.listdir(directory):
        (directory / name).unlink()
    _assert_whole(root)
    with mqstore.open(root, **SETTINGS) as store:
        put = store.put(Message(topic="T", body=b"next"))
        assert put.ok and put.queue_offset == N, put


U = 100  # records of another queue after T's
V = 60


def _delete(root: Path, what: str) -> None:
    queue = root / "consumequeue" / "T" / "0"
    if what.endswith("-file"):
        names = sorted(os.listdir(queue))
        assert len(names) == 3
        (queue / names[{"first-file": 0, "middle-file": 1, "last-file": -1}[what]]).unlink()
    elif what == "queue-dir":
        shutil.rmtree(queue)
    else:
        shutil.rmtree(root / "consumequeue" / "T")


@pytest.mark.parametrize("stop", ["clean", "crash"])
@pytest.mark.parametrize("what", ["first-file", "middle-file", "last-file", "queue-dir", "topic-dir"])
def test_a_queue_deleted_by_hand_is_rebuilt_from_the_ledger_and_its_offsets_are_not_reused(
    tmp_path: Path, what: str, stop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue ledger remembers each queue and its units on disk. Without it, a store whose
    queue directory (or topic directory, or a queue's last file) was deleted opened with that
    queue empty (or short): its acknowledged messages could no longer be read by offset and the
    next put took queue offsets that records in the log already held. A file missing between
    two others (not the ledger's work: the files after the gap are cut and rebuilt) left its
    units unreadable, OFFSET_FOUND_NULL, and consumers skipped them. Small segments, and
    another queue's records after T's, so that neither a clean open nor a crash's recovery
    scan would re-dispatch T's records anyway."""
    # Without the index: a crash's recovery would rebuild its only file from the log's start.
    monkeypatch.setitem(SETTINGS, "mapped_file_size_commitlog_bytes", 4096)
    monkeypatch.setitem(SETTINGS, "message_index_enable", False)
    root = tmp_path / "store"
    an_hour_ago = time.time_ns() // 1_000_000 - 3_600_000
    # T's records an hour old: a crash's recovery scan starts at the checkpoint's time less
    # 3 s, and would re-dispatch them all if they were as new as the rest.
    # V's, after them and as old, keep their units below the scan's start, so re-dispatch
    # starts after T's records (it starts at the highest unit the queues kept).
    with mqstore.open(root, clock_ms=lambda: an_hour_ago, **SETTINGS) as store:
        for i in range(N):
            assert store.put(Message(topic="T", body=b"%d" % i)).ok
        for i in range(V):
            assert store.put(Message(topic="V", body=b"v%d" % i)).ok
    with mqstore.open(root, **SETTINGS) as store:  # another queue, written last, stays whole
        for i in range(U):
            assert store.put(Message(topic="U", body=b"u%d" % i)).ok
        assert store.wait_for_messages("U", 0, U - 1, timeout_s=10)
    assert len(os.listdir(root / "commitlog")) > 4
    ledger = load_queue_ledger(RealFileSystem(), str(root / "queue_ledger.msgpack"))
    assert ledger == {("T", 0): LedgerEntry(N, 0), ("V", 0): LedgerEntry(V, 0), ("U", 0): LedgerEntry(U, 0)}
    _delete(root, what)
    if stop == "crash":
        (root / "abort").touch()  # as a kill -9 leaves it: the open recovers as after a crash
    with mqstore.open(root, **SETTINGS) as store:
        for topic, count, body in (("T", N, b"%d"), ("V", V, b"v%d"), ("U", U, b"u%d")):
            bodies: list[bytes] = []
            while len(bodies) < count and (got := store.get(topic, 0, len(bodies), 32)).messages:
                bodies += [m.body for m in got.messages]
            assert bodies == [body % i for i in range(count)], topic
        put = store.put(Message(topic="T", body=b"next"))
        assert put.ok and put.queue_offset == N, put
        assert store.put(Message(topic="U", body=b"u")).queue_offset == U


def test_a_topic_cleaned_by_clean_unused_topic_is_not_rebuilt(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _make(root)
    with mqstore.open(root, **SETTINGS) as store:
        assert store.put(Message(topic="U", body=b"u")).ok  # the log's newest record: U's
        assert store.wait_for_messages("U", 0, 0, timeout_s=10)
        assert store.clean_unused_topic(keep={"U"}) == 1
    assert load_queue_ledger(RealFileSystem(), str(root / "queue_ledger.msgpack")) == {("U", 0): LedgerEntry(1, 0)}
    with mqstore.open(root, **SETTINGS) as store:
        assert store.max_offset("T", 0) == 0
        assert store.put(Message(topic="T", body=b"again")).queue_offset == 0  # a new queue, as in RocketMQ


def test_a_restarted_consume_queue_actor_does_not_bring_back_a_cleaned_queue(tmp_path: Path) -> None:
    """Review 109 K2: after clean_unused_topic the writer forgets the queue's next offset; a
    restart of the ConsumeQueue actor re-dispatched the cleaned topic's records and rebuilt its
    queue (offsets 0..4), and the next put, given offset 0 by the writer, was acknowledged
    with an offset another message held (its unit at 5; the same after a reopen)."""
    plan = mqstore.FaultPlan()
    root = tmp_path / "store"
    with mqstore.open(root, faults=plan) as store:
        for i in range(3):
            assert store.put(Message("X", b"x%d" % i)).ok
        for i in range(5):
            assert store.put(Message("T", b"old%d" % i)).ok
        assert store.wait_for_messages("T", 0, 4, timeout_s=10)
        assert store.clean_unused_topic(["X"]) == 1
        plan.arm("consume_queue.mid_write", 1)
        assert store.put(Message("X", b"crash")).ok
        deadline = time.monotonic() + 10
        while not store.supervisor.restarts:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert store.wait_for_messages("X", 0, 3, timeout_s=10)  # re-dispatched past T's records
        put = store.put(Message("T", b"NEW"))
        assert put.ok and put.queue_offset == 0
        assert [(m.queue_offset, m.body) for m in store.get("T", 0, 0, 32).messages] == [(0, b"NEW")]
    with mqstore.open(root) as store:
        assert [(m.queue_offset, m.body) for m in store.get("T", 0, 0, 32).messages] == [(0, b"NEW")]


def test_a_clean_waits_for_dispatch_to_reach_the_puts_answered_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 113 F1: with dispatch behind at the clean, the removed queue's records dispatched
    after it rebuilt the queue at their old offsets, while the writer gave the next puts
    offsets from 0: they read OFFSET_TOO_SMALL, or offset 0 served an old message."""
    root = tmp_path / "store"
    with mqstore.open(root) as store:
        publish = store.read_view.publish_dispatched

        def late(dispatched_end: int) -> None:
            time.sleep(0.05)  # reput behind: the records it has not handed on wait
            publish(dispatched_end)

        monkeypatch.setattr(store.read_view, "publish_dispatched", late)
        for i in range(100):
            assert store.put(Message("X", b"OLDX%03d" % i)).ok
            assert store.put(Message("T", b"T%03d" % i)).ok
        assert store.clean_unused_topic(["T"]) == 1
        for i in range(20):
            put = store.put(Message("X", b"NEWX%03d" % i))
            assert put.ok and put.queue_offset == i
        assert store.wait_for_messages("X", 0, 19, timeout_s=30)
        assert [m.body for m in store.get("X", 0, 0, 32).messages] == [b"NEWX%03d" % i for i in range(20)]
    with mqstore.open(root) as store:
        assert [m.body for m in store.get("X", 0, 0, 32).messages] == [b"NEWX%03d" % i for i in range(20)]


def test_a_put_during_a_clean_never_leaves_a_removed_queue_behind_the_offsets_given_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 118 F2: a put that landed between the ConsumeQueue actor's removal of its queue
    and the writer forgetting the queue's next offset was acknowledged at the old sequence
    (N), dispatched past the floor, and rebuilt the queue at N with fillers below; the writer
    then gave the next puts offsets from 0, below the queue's min: every later put to it
    read OFFSET_TOO_SMALL, for good (563-1,546 a run in the review). Puts to a topic being
    removed are refused, unstored, until the clean returned."""
    root = tmp_path / "store"
    with mqstore.open(root) as store:
        for i in range(50):
            assert store.put(Message("T", b"OLD%03d" % i)).ok
        during: list[PutResult] = []
        ask = store._ask

        def ask_then_put(peer: str, message: object) -> object:
            answer = ask(peer, message)
            if type(message).__name__ == "CleanUnusedTopics":  # the queue removed, the writer not told yet
                done = threading.Thread(target=lambda: during.append(store.put(Message("T", b"DURING"))))
                done.start()
                done.join(10)
            return answer

        monkeypatch.setattr(store, "_ask", ask_then_put)
        assert store.clean_unused_topic([]) == 1
        monkeypatch.undo()
        assert len(during) == 1
        acked = [(r.queue_offset, b"DURING") for r in during if r.ok]
        for i in range(5):
            put = store.put(Message("T", b"NEW%d" % i))
            assert put.ok
            acked.append((put.queue_offset, b"NEW%d" % i))
        assert sorted(o for o, _ in acked) == list(range(len(acked)))  # the new queue, from 0
        assert store.wait_for_messages("T", 0, len(acked) - 1, timeout_s=10)
        assert [(m.queue_offset, m.body) for m in store.get("T", 0, 0, 32).messages] == sorted(acked)
    with mqstore.open(root) as store:
        assert [(m.queue_offset, m.body) for m in store.get("T", 0, 0, 32).messages] == sorted(acked)


def test_a_writer_restarted_during_a_clean_still_refuses_puts_to_the_topics_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 122 F1: the refusal lived in the writer's own state; a writer restarted mid-clean
    took puts to the topic being removed again, acknowledged at the old sequence, and they
    (and the puts after the clean) read OFFSET_TOO_SMALL."""
    plan = mqstore.FaultPlan()
    root = tmp_path / "store"
    with mqstore.open(root, faults=plan) as store:
        for i in range(20):
            assert store.put(Message("A", b"a%d" % i)).ok
            assert store.put(Message("T", b"OLD%d" % i)).ok
        during: list[PutResult] = []
        ask = store._ask

        def restart_then_put(peer: str, message: object) -> object:
            answer = ask(peer, message)
            if type(message).__name__ == "RefusePutsOutside" and getattr(message, "keep", None) is not None:
                restarts = len(store.supervisor.restarts)
                plan.arm("writer.mid_batch_append", 1)
                store.put(Message("A", b"crash"))  # fails the writer; the supervisor restarts it
                deadline = time.monotonic() + 10
                while len(store.supervisor.restarts) == restarts or store.supervisor.peers.get("writer") is None:
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                done = threading.Thread(target=lambda: during.append(store.put(Message("T", b"DURING"))))
                done.start()
                done.join(10)
            return answer

        monkeypatch.setattr(store, "_ask", restart_then_put)
        assert store.clean_unused_topic(["A"]) == 1
        monkeypatch.undo()
        assert [r.status for r in during] == [mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE], during
        new = [store.put(Message("T", b"NEW%d" % i)) for i in range(3)]
        assert [r.queue_offset for r in new] == [0, 1, 2]
        assert store.wait_for_messages("T", 0, 2, timeout_s=10)
        assert [m.body for m in store.get("T", 0, 0, 32).messages] == [b"NEW0", b"NEW1", b"NEW2"]


def test_a_clean_that_timed_out_or_was_interrupted_refuses_no_put_after_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 122 F2: an interrupt (a Ctrl-C) while the clean waited for the writer's first
    answer, or a reply timeout there, left the refusal set: every put to another topic was
    refused for good. The refusal is lifted after, and lapses by itself."""
    root = tmp_path / "store"
    with mqstore.open(root) as store:
        assert store.put(Message("A", b"a")).ok
        ask = store._ask

        def interrupted(peer: str, message: object) -> object:
            answer = ask(peer, message)
            if type(message).__name__ == "RefusePutsOutside" and getattr(message, "keep", None) is not None:
                raise KeyboardInterrupt
            return answer

        monkeypatch.setattr(store, "_ask", interrupted)
        with pytest.raises(KeyboardInterrupt):
            store.clean_unused_topic(["A"])
        monkeypatch.undo()
        assert store.put(Message("C", b"c")).ok
        # A refusal whose lifting never reached the writer lapses at its time.
        from mqstore.messages import RefusePutsOutside

        store._ask("writer", RefusePutsOutside(keep=frozenset({"A"}), until_ms=store.supervisor.ticker.now_ms() + 300))
        assert store.put(Message("C", b"c")).status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE
        time.sleep(0.4)
        assert store.put(Message("C", b"c")).ok


def test_an_open_on_a_log_with_a_hole_keeps_a_cleaned_queues_floor(tmp_path: Path) -> None:
    """Review 118 F3: an open that found the newest segments gone (moved away during
    maintenance: a hole below the checkpoint's flushed offset, the store degraded) lowered a
    cleaned queue's floor to the shorter log's end and wrote it to the ledger; with the
    segments back and the queue rebuilt, the removed queue's old records were dispatched into
    the new queue: each put acknowledged after the clean served an old message. A floor is
    lowered only to the log's reach (its end past the holes), which a power loss shortens."""
    root = tmp_path / "store"
    settings = dict(mapped_file_size_commitlog_bytes=64 * 1024, mapped_file_size_consume_queue_bytes=1000)
    with mqstore.open(root, **settings) as store:  # type: ignore[arg-type]
        for _ in range(100):
            assert store.put(Message("K", b"k" * 900)).ok
        for i in range(30):
            assert store.put(Message("T", b"OLD%02d" % i)).ok
        assert store.clean_unused_topic(["K"]) == 1
        for _ in range(60):
            assert store.put(Message("K", b"g" * 900)).ok
        new = [store.put(Message("T", b"NEW%d" % i)) for i in range(5)]
        assert [r.queue_offset for r in new] == list(range(5))
    floor = next(iter(load_queue_ledger_file(root).cleaned.values()))
    aside = tmp_path / "aside"
    aside.mkdir()
    for segment in sorted((root / "commitlog").iterdir()):
        if int(segment.name) > 0 and int(segment.name) + 64 * 1024 > floor - 20000:
            shutil.move(segment, aside / segment.name)
    with mqstore.open(root, **settings) as store:  # type: ignore[arg-type]
        assert not store.put(Message("K", b"probe")).ok  # degraded: the hole is known
    assert next(iter(load_queue_ledger_file(root).cleaned.values())) == floor
    for segment in aside.iterdir():
        shutil.move(segment, root / "commitlog" / segment.name)
    shutil.rmtree(root / "consumequeue" / "T")  # derived data: rebuilt from the log
    with mqstore.open(root, **settings) as store:  # type: ignore[arg-type]
        assert store.wait_for_messages("T", 0, 4, timeout_s=10)
        assert [m.body for m in store.get("T", 0, 0, 32).messages] == [b"NEW%d" % i for i in range(5)]


def load_queue_ledger_file(root: Path) -> LedgerFile:
    ledger = load_ledger_file(RealFileSystem(), str(root / "queue_ledger.msgpack"))
    assert ledger is not None
    return ledger


def test_verify_counts_a_cleaned_topics_records_and_still_finds_a_deleted_queue(tmp_path: Path) -> None:
    """Review 51: after clean_unused_topic, verify reported cq_missing for every record of the
    removed topic (the log keeps them until it is cleaned), failing a store nothing was wrong
    with. They are counted as not queued now; a queue deleted by hand, which the ledger still
    lists, is still a problem."""
    from mqstore.config import StoreConfig
    from mqstore.tools.verify import verify_store

    root = tmp_path / "store"
    _make(root)
    with mqstore.open(root, **SETTINGS) as store:
        assert store.put(Message(topic="U", body=b"u")).ok
        assert store.wait_for_messages("U", 0, 0, timeout_s=10)
        assert store.clean_unused_topic(keep={"U"}) == 1
    config = StoreConfig(store_path_root_dir=str(root), **SETTINGS)  # type: ignore[arg-type]
    report = verify_store(root, config=config)
    assert report.ok, report.problems[:3]
    assert report.not_queued == N
    shutil.rmtree(root / "consumequeue" / "U")  # the ledger lists it: damage, not a removal
    report = verify_store(root, config=config)
    assert [p.kind for p in report.problems] == ["cq_missing"] and report.not_queued == N


def test_clean_unused_topic_deletes_nothing_when_the_ledger_cannot_be_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """And the failing write is logged once, not at every attempt (every tick, on a full disk)."""
    caplog.set_level("INFO", logger="mqstore")
    root = tmp_path / "store"
    _make(root)
    ledger = root / "queue_ledger.msgpack"
    with mqstore.open(root, **SETTINGS) as store:
        assert store.put(Message(topic="U", body=b"u")).ok
        assert store.wait_for_messages("U", 0, 0, timeout_s=10)
        ledger.unlink()
        ledger.mkdir()  # a directory where the file goes: every write fails
        try:
            assert store.clean_unused_topic(keep={"U"}) == 0
            assert store.clean_unused_topic(keep={"U"}) == 0
            assert store.max_offset("T", 0) == N
            events = [r.getMessage() for r in caplog.records]
            assert events.count("queue ledger not written; retried at every tick") == 1
            assert "queue ledger written again" not in events
        finally:
            ledger.rmdir()
        assert store.clean_unused_topic(keep={"T", "U"}) == 0  # nothing to clean: no write either
        assert store.clean_unused_topic(keep={"U"}) == 1
        assert "queue ledger written again" in [r.getMessage() for r in caplog.records]
    assert load_queue_ledger(RealFileSystem(), str(ledger)) == {("U", 0): LedgerEntry(1, 0)}


def test_a_damaged_ledger_is_set_aside_and_written_again(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _make(root)
    ledger = root / "queue_ledger.msgpack"
    ledger.write_bytes(b"\x93garbage")
    _assert_whole(root)  # opens (and closes): the ledger only adds checks
    assert (root / "queue_ledger.msgpack.damaged").read_bytes() == b"\x93garbage"
    assert load_queue_ledger(RealFileSystem(), str(ledger)) == {("T", 0): LedgerEntry(N, 0)}


def test_a_broker_store_gets_a_ledger_of_its_queues(tmp_path: Path) -> None:
    """A broker's store has no ledger (RocketMQ writes none): nothing to check at the first
    open, and from then on its queues are known."""
    root = tmp_path / "store"
    shutil.copytree(FIXTURES / "broker-sample-a", root)
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    assert not (root / "queue_ledger.msgpack").exists()
    with mqstore.open(root) as store:
        queues = list_consume_queues(str(root / "consumequeue"), RealFileSystem())
        assert queues
        units = {(topic, queue_id): LedgerEntry(store.max_offset(topic, queue_id), 0) for topic, queue_id in queues}
    assert load_queue_ledger(RealFileSystem(), str(root / "queue_ledger.msgpack")) == units


@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_zeroed_units_in_a_queue_file_are_rebuilt_and_their_offsets_not_reused(tmp_path: Path, stop: str) -> None:
    """Zeros over a few units in the middle of a ConsumeQueue file of the right length: the
    queue's recovery keeps the units before them and drops the rest. Without the ledger a clean
    open took that for the queue's end: the units after the zeros were gone for readers and the
    next put reused queue offset 20 (found by the damage fuzzer, seed 10054 and 15 more). The
    queue re-dispatch would start from is another's, written last, as in the fuzzer's store."""
    root = tmp_path / "store"
    _make(root)
    with mqstore.open(root, **SETTINGS) as store:
        assert store.put(Message(topic="U", body=b"u")).ok
        assert store.wait_for_messages("U", 0, 0, timeout_s=10)
    with open(_cq_file(root, 0), "r+b") as f:
        f.seek(20 * 20)
        f.write(bytes(5 * 20))  # units 20-24
    if stop == "crash":
        (root / "abort").touch()
    _assert_whole(root)
    with mqstore.open(root, **SETTINGS) as store:
        put = store.put(Message(topic="T", body=b"next"))
        assert put.ok and put.queue_offset == N, put


def test_verify_reports_a_deleted_first_queue_file_and_recover_rebuilds_it(tmp_path: Path) -> None:
    """Without the ledger a queue whose first files are gone looks cleaned, to verify as to
    an open (records below its min offset are not expected to have units)."""
    import contextlib
    import io

    from mqstore.cli import main as cli_main
    from mqstore.config import StoreConfig
    from mqstore.tools.verify import verify_store

    root = tmp_path / "store"
    _make(root)
    (_cq_file(root, 0)).unlink()
    config = StoreConfig(**SETTINGS)
    report = verify_store(root, config=config)
    assert not report.ok and "cq_front_missing" in {p.kind for p in report.problems}, report.summary()
    toml = tmp_path / "store.toml"
    toml.write_text("".join(f"{k} = {v}\n" for k, v in SETTINGS.items()))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert cli_main(["--config", str(toml), "recover", "--no-progress", str(root)]) == 0
    assert verify_store(root, config=config).ok
    _assert_whole(root)


@pytest.mark.parametrize("bad_topic", [b"../zz", b"AB:DE"])
def test_a_record_whose_topic_cannot_name_a_queue_gets_no_queue_and_no_path(tmp_path: Path, bad_topic: bytes) -> None:
    """The body CRC does not cover a record's topic: damage (or a crafted log) can make it
    "../zz", which as a queue directory lay outside consumequeue/ (before: dispatch created
    <root>/zz/0/), or "AB:DE", whose queue the ledger could not read back. Dispatch gives such
    a record no unit, its real queue keeps the rest at their offsets, verify reports it."""
    from mqstore.config import StoreConfig
    from mqstore.tools.verify import verify_store

    root = tmp_path / "store"
    with mqstore.open(root, **SETTINGS) as store:
        for i in range(3):
            assert store.put(Message(topic="ABCDE", body=b"m%d" % i)).ok
        assert store.put(Message(topic="U", body=b"u")).ok
    segment = root / "commitlog" / ("0" * 20)
    data = bytearray(segment.read_bytes())
    second = data.index(b"ABCDE", data.index(b"ABCDE") + 5)
    data[second : second + 5] = bad_topic
    segment.write_bytes(bytes(data))
    shutil.rmtree(root / "consumequeue")  # re-dispatched from the log at the next open
    (root / "abort").touch()
    with mqstore.open(root, **SETTINGS) as store:
        assert [m.body for m in store.get("ABCDE", 0, 0, 32).messages] == [b"m0", b"m2"]
        put = store.put(Message(topic="ABCDE", body=b"m3"))
        assert put.ok and put.queue_offset == 3, put
    assert not (root / "zz").exists()
    assert sorted(os.listdir(root / "consumequeue")) == ["ABCDE", "U"]
    assert load_queue_ledger(RealFileSystem(), str(root / "queue_ledger.msgpack")) is not None
    kinds = {p.kind for p in verify_store(root, config=StoreConfig(**SETTINGS)).problems}
    assert "commitlog_bad_topic" in kinds, kinds


_CLEAN_THEN_CRASH_CHILD = r'''
import json, os, signal, sys
import mqstore
from mqstore import Message
from mqstore.faults import HoldAt

root, ackfile, hold_dispatch = sys.argv[1], sys.argv[2], sys.argv[3] == "hold"
hold = HoldAt("consume_queue.mid_write", hold_s=60)
store = mqstore.open(root, faults=hold)
for i in range(10):
    assert store.put(Message(topic="A", body=b"old-A-%d" % i)).ok
for i in range(3):
    assert store.put(Message(topic="B", body=b"B-%d" % i)).ok
assert store.clean_unused_topic({"B"}) == 1
if hold_dispatch:
    hold.armed.set()  # the next put's unit is not written before the kill
put = store.put(Message(topic="A", body=b"NEW-A-0"))
with open(ackfile, "w") as f:
    json.dump({"ok": put.ok, "queue_offset": put.queue_offset}, f)
if hold_dispatch:
    assert hold.entered.wait(10)
else:
    assert [m.body for m in store.get("A", 0, 0, 1).messages] == [b"NEW-A-0"]  # (its unit written)
os.kill(os.getpid(), signal.SIGKILL)
'''


@pytest.mark.parametrize("unit_written", [False, True], ids=["unit-not-written", "unit-written"])
def test_a_crash_after_a_clean_does_not_bring_the_cleaned_queue_back(tmp_path: Path, unit_written: bool) -> None:
    """Review 114 F1: after clean_unused_topic removed topic A's queue, a put to A was
    acknowledged with queue offset 0, and the process was killed before (or after) its unit was
    written. The crash open's re-dispatch rebuilt A from its old records: offset 0 served an old
    message, the acknowledged one moved to offset 10, and the next put was acknowledged at 10 and
    read nowhere (or, unit written, the next put went to 10, offsets 1..9 fillers). The clean's
    floor is in the queue ledger: records of a cleaned queue below it are not dispatched again."""
    import json
    import subprocess
    import sys

    root, ackfile = tmp_path / "store", tmp_path / "ack.json"
    child = subprocess.run([sys.executable, "-c", _CLEAN_THEN_CRASH_CHILD, str(root), str(ackfile),
                            "written" if unit_written else "hold"], capture_output=True, timeout=120)  # fmt: skip
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    assert json.loads(ackfile.read_text()) == {"ok": True, "queue_offset": 0}
    with mqstore.open(root) as store:
        assert [(m.queue_offset, m.body) for m in store.get("A", 0, 0, 32).messages] == [(0, b"NEW-A-0")]
        nxt = store.put(Message(topic="A", body=b"NEXT"))
        assert nxt.ok and nxt.queue_offset == 1
        assert [(m.queue_offset, m.body) for m in store.get("A", 0, 0, 32).messages] == [(0, b"NEW-A-0"), (1, b"NEXT")]
        assert [m.body for m in store.get("B", 0, 0, 32).messages] == [b"B-0", b"B-1", b"B-2"]
    with mqstore.open(root) as store:  # and after a clean reopen
        assert [(m.queue_offset, m.body) for m in store.get("A", 0, 0, 32).messages] == [(0, b"NEW-A-0"), (1, b"NEXT")]


def test_a_cleaned_queues_floor_past_the_logs_end_after_a_power_loss_drops_no_new_put(tmp_path: Path) -> None:
    """Review 117 F1: the floor is where dispatch had reached at the clean, which can be past
    what reached the disk. After a power loss the log ended below it, and the puts made there
    after the reopen were dropped as the removed queue's records: never served, and the queue
    started later once the log grew past the floor. The floor is lowered to the log's end."""
    from mqstore.tests.crash.crashlib import flushed_only_to

    root = tmp_path / "store"
    with mqstore.open(root) as store:
        at = [store.put(Message("A", b"old-A-%d" % i)).commitlog_offset for i in range(10)]
        assert store.put(Message("B", b"B-0")).ok
        assert store.clean_unused_topic({"B"}) == 1
    lost_from = at[5]  # a power loss: the log's bytes from here never reached the disk
    with open(root / "commitlog" / "00000000000000000000", "r+b") as f:
        f.seek(lost_from)
        f.write(bytes(4096))
    flushed_only_to(root, lost_from)
    (root / "abort").write_bytes(b"")
    with mqstore.open(root) as store:
        puts = [store.put(Message("A", b"NEW-A-%d" % i)) for i in range(9)]  # past the old floor too
        assert [p.queue_offset for p in puts] == list(range(9))
        got = store.get("A", 0, 0, 32)
        assert [m.body for m in got.messages] == [b"NEW-A-%d" % i for i in range(9)], got.status
    with mqstore.open(root) as store:
        assert [m.body for m in store.get("A", 0, 0, 32).messages] == [b"NEW-A-%d" % i for i in range(9)]


def test_verify_and_recover_take_a_cleaned_and_rewritten_topics_old_records_for_the_removed_queues(tmp_path: Path) -> None:
    """Review 117 L1: a topic cleaned and written again since: verify exited 3 (cq_missing for
    offsets 0..9, the removed queue's records) and `recover` said "not repaired". Records of a
    queue below the floor the ledger keeps are the removed queue's."""
    import contextlib
    import io

    from mqstore.cli import ExitCode, main

    root = tmp_path / "store"
    with mqstore.open(root) as store:
        for i in range(10):
            assert store.put(Message("A", b"old-A-%d" % i)).ok
        assert store.put(Message("B", b"B-0")).ok
        assert store.clean_unused_topic({"B"}) == 1
        for i in range(3):
            assert store.put(Message("A", b"new-A-%d" % i)).queue_offset == i
    for command in ("verify", "recover"):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            code = main([command, str(root)] + (["--no-progress"] if command == "recover" else []))
        assert code == ExitCode.OK, (command, err.getvalue())


def test_a_cleaned_queues_floor_goes_once_the_logs_head_passes_it(tmp_path: Path) -> None:
    """A floor keeps the removed queue's records out of dispatch only while they are in the log:
    once the cleaner deleted the segments below it, the ledger forgets it (and is version 2
    again, which the mqstore before the floors reads)."""
    import msgpack

    from mqstore.storage.codec import segment_file_name
    from mqstore.storage.queue_ledger import load_ledger_file

    seg = 64 << 10
    settings = {"mapped_file_size_commitlog_bytes": seg}
    root = tmp_path / "store"
    with mqstore.open(root, **settings) as store:
        for i in range(5):
            assert store.put(Message("A", b"old-A-%d" % i)).ok
        assert store.clean_unused_topic({"B"}) == 1
        while store.put(Message("B", b"b" * 500)).commitlog_offset < 2 * seg:
            pass  # the log's head can move past segment 0
    before = load_ledger_file(RealFileSystem(), str(root / "queue_ledger.msgpack"))
    assert before is not None and list(before.cleaned) == [("A", 0)]
    old = time.time() - 5 * 86400
    os.utime(root / "commitlog" / segment_file_name(0), (old, old))
    with mqstore.open(root, **settings) as store:
        assert store.delete_expired_files_now() == 1
    after = load_ledger_file(RealFileSystem(), str(root / "queue_ledger.msgpack"))
    assert after is not None and after.cleaned == {}
    assert msgpack.unpackb((root / "queue_ledger.msgpack").read_bytes())["version"] == 2
    with mqstore.open(root, **settings) as store:
        put = store.put(Message("A", b"new-A-0"))
        assert put.ok and put.queue_offset == 0
        assert [m.body for m in store.get("A", 0, 0, 32).messages] == [b"new-A-0"]

