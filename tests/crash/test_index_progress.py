"""The index is complete after every open: the keys of every message still in the log are found.

The index files alone cannot tell a complete index from one that misses keys (the newest
file's endPhyOffset is the last message that HAD keys), so mqstore records how far the index got
(storage.index_progress) and rebuilds what is missing: keys put while the index was disabled,
index files deleted by hand, and, after a lost tail, the keys of kept messages in an index file
that had to go. Files the cleaner expired are not taken for lost, and a lost tail that only
held keyed messages does not make the open re-dispatch the whole log."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import Message
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.index import read_index_header
from mqstore.storage.index_progress import load_index_progress

# Small index files so the index rolls over: 15 usable entries per file.
SETTINGS: dict[str, Any] = dict(
    mapped_file_size_commitlog_bytes=1 << 20, mapped_file_size_consume_queue_bytes=20 * 50,
    max_hash_slot_num=16, max_index_num=16,
)  # fmt: skip
N, KEPT = 120, 100


def _keys_found(store: mqstore.MessageStore, indices: range | list[int]) -> list[int]:
    """The indices i whose key k<i> is not found exactly once."""
    missing = []
    for i in indices:
        got = [m.body for m in store.query("T", f"k{i}").messages]
        if got != [b"t%d" % i]:
            missing.append(i)
    return missing


def _torn(self: Any, phy_offset: int) -> bool:
    """truncate_entries_from on a file whose chains do not agree with its entries: refused
    when it would have to undo anything (a file with nothing to undo is kept, as for real)."""
    return self.end_phy_offset < phy_offset


def _put_keyed(store: mqstore.MessageStore, lo: int, hi: int) -> list[int]:
    offs = [store.put(Message(topic="T", body=b"t%d" % i, keys=[f"k{i}"])).commitlog_offset for i in range(lo, hi)]
    assert store.wait_for_messages("T", 0, hi - 1, timeout_s=10)
    return offs


def test_keys_put_while_the_index_was_disabled_are_found_once_it_is_enabled_again(tmp_path: Path) -> None:
    """Enabled, disabled while keyed messages are put, enabled again: the older index files
    are there, but the progress says where the index stopped, and the open indexes the rest."""
    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        _put_keyed(store, 0, 20)
    with mqstore.open(root, **{**SETTINGS, "message_index_enable": False}) as store:
        _put_keyed(store, 20, 40)
    with mqstore.open(root, **SETTINGS) as store:
        assert _keys_found(store, range(40)) == []


def test_mqstore_recover_after_a_lost_tail_with_torn_chains_keeps_the_keys_of_kept_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mqstore recover` after a lost tail, with rolled index files, drops the file whose chains
    cannot be cut short; its re-dispatch open is a clean open that sees the older files and
    nothing to cut. The progress recover wrote makes that open rebuild the dropped keys."""
    from mqstore.cli import main as cli_main
    from mqstore.storage.index import IndexFile

    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        offsets = _put_keyed(store, 0, N)
    assert len(list((root / "index").iterdir())) > 3
    with open(root / "commitlog" / ("%020d" % 0), "r+b") as f:
        f.seek(offsets[KEPT])
        f.write(b"\0" * (offsets[-1] + 256 - offsets[KEPT]))
    monkeypatch.setattr(IndexFile, "truncate_entries_from", _torn)
    toml = tmp_path / "store.toml"
    toml.write_text("".join(f"{k} = {v}\n" for k, v in SETTINGS.items()))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli_main(["--config", str(toml), "recover", "--no-progress", str(root)])
    monkeypatch.undo()
    with mqstore.open(root, **SETTINGS) as store:
        assert _keys_found(store, range(KEPT)) == []


def _lose_tail_keyed(root: Path) -> list[int]:
    with mqstore.open(root, **SETTINGS) as store:
        offsets = _put_keyed(store, 0, N)
    with open(root / "commitlog" / ("%020d" % 0), "r+b") as f:
        f.seek(offsets[KEPT])
        f.write(b"\0" * (offsets[-1] + 256 - offsets[KEPT]))
    return offsets


def test_a_clean_open_that_drops_the_newest_index_file_and_cuts_the_one_before_does_not_stall(
    tmp_path: Path,
) -> None:
    """A lost tail and a damaged newest index file (set aside): the rebuild point is taken after
    the file before it was cut back to the log's end, not before (it lay past the end, nothing
    was re-dispatched, and the open waited 2 x DISPATCH_CATCH_UP_TIMEOUT_MS for an index that
    never moved, then said its queues were behind)."""
    import time

    root = tmp_path / "s"
    offsets = _lose_tail_keyed(root)
    names = sorted((root / "index").iterdir())
    from mqstore.storage.fs import RealFileSystem
    from mqstore.storage.index import read_index_header

    headers = [read_index_header(RealFileSystem(), str(p)) for p in names]
    # the file before the newest holds entries past the new end (it must be cut back)
    assert headers[-2].begin_phy_offset < offsets[KEPT] <= headers[-2].end_phy_offset, headers[-2:]
    with open(names[-1], "r+b") as f:
        f.write(b"\0" * 8)  # beginTimestamp 0: "corrupt header"
    started = time.monotonic()
    with mqstore.open(root, **SETTINGS) as store:
        took = time.monotonic() - started
        report = store.supervisor.recovery
        assert report is not None
        view = store.supervisor.ctx.read_view.view
        assert view.indexed_end >= report.max_offset, (view.indexed_end, report.summary())
        assert took < 4, took
        assert _keys_found(store, [0, 50, KEPT - 1]) == []


def test_keys_put_while_the_index_was_off_are_indexed_by_a_queue_rebuild_as_before(tmp_path: Path) -> None:
    """The index off for a while (keyed puts), then the queues rebuilt from the log's start
    (their directory deleted) at the open that enables the index again: what readers are told
    is indexed is not what the index skips, so the re-dispatch indexes the keys past the files."""
    import shutil

    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        _put_keyed(store, 0, 20)
    with mqstore.open(root, **{**SETTINGS, "message_index_enable": False}) as store:
        _put_keyed(store, 20, 40)
    shutil.rmtree(root / "consumequeue")
    with mqstore.open(root, **SETTINGS) as store:
        assert store.wait_for_messages("T", 0, 39, timeout_s=10)
        assert _keys_found(store, range(40)) == []


def test_keys_in_an_index_file_deleted_by_hand_are_rebuilt(tmp_path: Path) -> None:
    """The newest index files deleted by hand after a clean stop (not all of them): the
    progress lists them, so the open rebuilds their keys."""
    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        _put_keyed(store, 0, N)
    names = sorted((root / "index").iterdir())
    assert len(names) > 3
    for p in names[-2:]:
        p.unlink()
    with mqstore.open(root, **SETTINGS) as store:
        assert _keys_found(store, range(N)) == []


@pytest.mark.parametrize("while_open", [False, True], ids=["restored_while_closed", "renamed_over_while_open"])
def test_an_index_file_replaced_by_an_older_copy_of_itself_is_rebuilt(tmp_path: Path, while_open: bool) -> None:
    """The newest index file replaced by a copy taken before its last keys (a restore from a
    backup while the store was closed, or a copy renamed over it while the index actor wrote
    into the file it had open): the file holds together, and a clean open took it as it was,
    so those keys were never found again. The progress recorded the file's endPhyOffset, so
    the open sees it went back, and rebuilds its keys from the file before it."""
    root = tmp_path / "s"
    backup = tmp_path / "backup"
    with mqstore.open(root, **SETTINGS) as store:
        _put_keyed(store, 0, 20)  # one full file and the newest with a few keys
        store.flush()
        newest = sorted((root / "index").iterdir())[-1]
        backup.write_bytes(newest.read_bytes())
        _put_keyed(store, 20, 25)  # more keys in that same newest file
        assert sorted((root / "index").iterdir())[-1] == newest
        if while_open:
            os.replace(backup, newest)
            _put_keyed(store, 25, 28)
    if not while_open:
        os.replace(backup, newest)
    end = 28 if while_open else 25
    with mqstore.open(root, **SETTINGS) as store:
        assert _keys_found(store, range(end)) == []


def test_a_lost_tail_that_only_held_the_first_keys_does_not_re_dispatch_the_whole_log(tmp_path: Path) -> None:
    """Only the lost messages had keys: the one index file begins past the new log end and goes,
    and it held no key of a kept message, so nothing is re-dispatched (not the whole log)."""
    root = tmp_path / "s"
    settings = {k: v for k, v in SETTINGS.items() if not k.startswith("max_")}
    with mqstore.open(root, **settings) as store:
        offsets = [store.put(Message(topic="T", body=b"t%d" % i)).commitlog_offset for i in range(KEPT)]
        offsets += _put_keyed(store, KEPT, N)
    assert len(list((root / "index").iterdir())) == 1
    with open(root / "commitlog" / ("%020d" % 0), "r+b") as f:
        f.seek(offsets[KEPT])
        f.write(b"\0" * (offsets[-1] + 256 - offsets[KEPT]))
    with mqstore.open(root, **settings) as store:
        report = store.supervisor.recovery
        assert report is not None
        assert report.index_dispatch_from == -1 and report.dispatch_from == report.max_offset, report.summary()


@pytest.mark.parametrize(("crashed", "torn"), [(False, True), (True, False), (True, True)],
                         ids=["clean open, chains torn", "crash open", "crash open, chains torn"])  # fmt: skip
def test_an_open_after_a_lost_tail_with_rolled_files_keeps_each_key_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crashed: bool, torn: bool
) -> None:
    """And keeps them at the open after it."""
    from mqstore.storage.index import IndexFile

    root = tmp_path / "s"
    _lose_tail_keyed(root)
    if crashed:
        (root / "abort").touch()
    if torn:
        monkeypatch.setattr(IndexFile, "truncate_entries_from", _torn)
    with mqstore.open(root, **SETTINGS) as store:
        monkeypatch.undo()
        assert _keys_found(store, range(KEPT)) == []
    with mqstore.open(root, **SETTINGS) as store:
        assert _keys_found(store, range(KEPT)) == []


def test_a_clean_close_records_the_log_end_and_every_index_file(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        _put_keyed(store, 0, N)
        end = store.dispatch_progress()[1]
    progress = load_index_progress(RealFileSystem(), str(root / "index_progress.msgpack"))
    assert progress is not None and progress.indexed_below == end
    names = sorted(p.name for p in (root / "index").iterdir())
    assert [name for name, _ in progress.files] == names
    headers = [read_index_header(RealFileSystem(), str(root / "index" / n)) for n in names]
    assert [e for _, e in progress.files] == [h.end_phy_offset for h in headers]
    with mqstore.open(root, **SETTINGS) as store:  # nothing to rebuild at a clean open
        report = store.supervisor.recovery
        assert report is not None and report.index_dispatch_from == -1 and report.max_offset == end


def test_index_files_the_cleaner_expired_are_not_taken_for_lost(tmp_path: Path) -> None:
    """Files whose messages left the log with its oldest segment are gone for a reason: the open
    rebuilds nothing (it would otherwise re-dispatch the whole log)."""
    settings = {**SETTINGS, "mapped_file_size_commitlog_bytes": 4096}
    root = tmp_path / "s"
    with mqstore.open(root, **settings) as store:
        _put_keyed(store, 0, N)
    segments = sorted((root / "commitlog").iterdir())
    assert len(segments) > 2
    segments[0].unlink()  # as the cleaner deletes the oldest segment, then the index files before it
    expired = [p for p in sorted((root / "index").iterdir())
               if read_index_header(RealFileSystem(), str(p)).end_phy_offset < 4096]  # fmt: skip
    assert expired
    for p in expired:
        p.unlink()
    with mqstore.open(root, **settings) as store:
        report = store.supervisor.recovery
        assert report is not None and report.min_offset == 4096
        assert report.index_dispatch_from == -1 and report.dropped_index_files == 0, report.summary()
        kept = [i for i in range(N) if store.query("T", f"k{i}").messages]
        assert kept and kept == list(range(kept[0], N))


def test_a_damaged_index_progress_is_set_aside_and_the_open_goes_on(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        _put_keyed(store, 0, 20)
    path = root / "index_progress.msgpack"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    with mqstore.open(root, **SETTINGS) as store:
        assert _keys_found(store, range(20)) == []
        _put_keyed(store, 20, 30)
    assert (root / "index_progress.msgpack.damaged").read_bytes() == bytes(data)
    progress = load_index_progress(RealFileSystem(), str(path))
    assert progress is not None and progress.indexed_below > 0


def test_a_flush_with_nothing_newly_indexed_does_not_write_the_progress_again(tmp_path: Path) -> None:
    root = tmp_path / "s"
    path = root / "index_progress.msgpack"
    with mqstore.open(root, **SETTINGS) as store:
        _put_keyed(store, 0, 5)
        store.flush()
        stamp = lambda: (path.stat().st_ino, path.stat().st_mtime_ns)  # noqa: E731  (each write: a new file renamed over)
        written = stamp()
        store.flush()
        assert stamp() == written
        _put_keyed(store, 5, 10)
        store.flush()
        assert stamp() != written


def _killed_with_the_index_behind(root: Path) -> None:
    """A child puts 120 keyed messages, the index taking the first 40 only, and dies before
    the index progress is first written (a kill within the store's first second)."""
    import os

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            from mqstore.actors import index as index_actor
            from mqstore.messages import DispatchBatch

            store = mqstore.open(root, **SETTINGS)
            _put_keyed(store, 0, 40)
            while _keys_found(store, range(40)):
                pass
            handle = index_actor.IndexActor.handle
            index_actor.IndexActor.handle = lambda self, m: None if isinstance(m, DispatchBatch) else handle(self, m)  # type: ignore[method-assign]
            _put_keyed(store, 40, N)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    (root / "index_progress.msgpack").unlink(missing_ok=True)
    assert (root / "abort").exists()


def test_an_open_with_the_index_off_after_a_crash_leaves_the_next_open_with_it_on_every_key(tmp_path: Path) -> None:
    """Review 35 F1: the keys the index had not reached at a crash were never indexed when the
    store was opened once with `message_index_enable` off in between: no index recovery ran,
    no progress said what the files lacked, and the next open with the index on took them for
    complete. Now the index's files and progress are recovered at such an open too."""
    root = tmp_path / "s"
    _killed_with_the_index_behind(root)
    with mqstore.open(root, **SETTINGS, message_index_enable=False) as store:
        assert store.get("T", 0, 0, 32).messages
    with mqstore.open(root, **SETTINGS) as store:
        assert _keys_found(store, range(N)) == []
