"""A consume queue or index page that cannot be read while the open's recovery reads it (an
I/O error, or the file cut short meanwhile) reads as the SIGBUS guard's zeros. Review 67 F3:
taken for the queue's end, they made recovery delete the queue's later files (200 acknowledged
messages unreachable, the next put reusing queue offset 100), silently; an index header read
as zeros ended "below the progress" and the file was dropped. Now the open refuses (EIO, the
file named) before it cuts, zeroes or deletes anything, and opens whole once the file reads.

The fault is made for real: the file is cut short once it is mapped, before recovery reads it,
and its bytes are written back after that read."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore.storage import mapguard
from mqstore.storage.consume_queue import ConsumeQueue
from mqstore.storage.fs import RealFileSystem, UnreadDuringRecoveryError
from mqstore.storage.index import IndexFile

pytestmark = pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built: a fault would kill the run")

SEG = 64 * 1024
CQ = {"mapped_file_size_commitlog_bytes": SEG, "mapped_file_size_consume_queue_bytes": 2000}  # 100 units a file


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def _read_all(s: mqstore.MessageStore, queue_id: int) -> list[int]:
    got: list[int] = []
    offset = 0
    while offset < s.max_offset("t", queue_id):
        r = s.get("t", queue_id, offset, 32)
        assert r.next_begin_offset > offset, r
        got += [m.queue_offset for m in r.messages]
        offset = r.next_begin_offset
    return got


@pytest.mark.parametrize("crashed", [False, True], ids=["after_a_clean_stop", "after_a_crash"])
@pytest.mark.parametrize("how", ["page_faults", "cut_before_the_scan"])
def test_a_queue_page_that_cannot_be_read_during_recovery_refuses_the_open_and_deletes_no_queue_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crashed: bool, how: str
) -> None:
    """`page_faults`: the read faults (cut between the scan's look for data and its read, as an
    I/O error does); `cut_before_the_scan` (the review's repro): the file reads as a hole, no
    fault, and the queue's later files show that it is no end."""
    store = tmp_path / "store"
    with mqstore.open(store, **CQ) as s:
        for i in range(600):
            assert s.put(mqstore.Message(topic="t", queue_id=i % 2, body=b"m" * 100)).ok
    (store / "queue_ledger.msgpack").unlink()  # a broker's or an older mqstore's store: no ledger to compare
    if crashed:
        (store / "abort").touch()
    queue_dir = store / "consumequeue" / "t" / "0"
    before = _hashes(queue_dir)
    assert len(before) == 3
    first = queue_dir / ("%020d" % 0)
    saved = first.read_bytes()
    recover = ConsumeQueue.recover
    data_extents = RealFileSystem.data_extents

    def cut_after_the_look_for_data(self: RealFileSystem, path: str, start: int, end: int) -> list[tuple[int, int]]:
        extents = data_extents(self, path, start, end)
        if path == str(first):
            monkeypatch.setattr(RealFileSystem, "data_extents", data_extents)
            os.truncate(first, 0)
        return extents

    def cut_while_it_reads(self: ConsumeQueue, *args: Any, **kwargs: Any) -> None:
        if (self.topic, self.queue_id) != ("t", 0):
            return recover(self, *args, **kwargs)
        monkeypatch.setattr(ConsumeQueue, "recover", recover)
        if how == "page_faults":
            monkeypatch.setattr(RealFileSystem, "data_extents", cut_after_the_look_for_data)
        else:
            os.truncate(first, 0)  # mapped already (loaded)
        try:
            return recover(self, *args, **kwargs)
        finally:
            with open(first, "r+b") as f:  # the disk reads again, in place
                f.write(saved)

    monkeypatch.setattr(ConsumeQueue, "recover", cut_while_it_reads)
    faults = mapguard.total_faults()
    with pytest.raises(UnreadDuringRecoveryError) as refused:
        mqstore.open(store, **CQ).close()
    assert (mapguard.total_faults() > faults) == (how == "page_faults")
    assert refused.value.errno == errno.EIO and refused.value.filename == str(first)
    assert _hashes(queue_dir) == before  # no queue file deleted, cut or zeroed
    with mqstore.open(store, **CQ) as s:
        assert _read_all(s, 0) == list(range(300))
        assert s.put(mqstore.Message(topic="t", queue_id=0, body=b"new")).queue_offset == 300


def test_an_index_header_that_faults_during_recovery_refuses_the_open_and_drops_no_index_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = {"mapped_file_size_commitlog_bytes": SEG, "max_hash_slot_num": 100, "max_index_num": 100}
    store = tmp_path / "store"
    with mqstore.open(store, **settings) as s:
        for i in range(300):
            assert s.put(mqstore.Message(topic="t", body=b"m" * 100, keys=[f"k{i}"])).ok
    index_dir = store / "index"
    files = sorted(index_dir.iterdir())
    assert len(files) >= 2
    before = _hashes(index_dir)
    first = files[0]
    saved = first.read_bytes()
    reload_header = IndexFile.reload_header

    def cut_while_it_reads(self: IndexFile) -> None:
        if self.path != str(first):
            return reload_header(self)
        monkeypatch.setattr(IndexFile, "reload_header", reload_header)
        os.truncate(first, 0)  # mapped already: the header's page faults
        try:
            return reload_header(self)
        finally:
            with open(first, "r+b") as f:  # the disk reads again, in place
                f.write(saved)

    monkeypatch.setattr(IndexFile, "reload_header", cut_while_it_reads)
    with pytest.raises(UnreadDuringRecoveryError) as refused:
        mqstore.open(store, **settings).close()
    assert refused.value.errno == errno.EIO and refused.value.filename == str(first)
    assert _hashes(index_dir) == before  # none set aside, deleted or rebuilt
    with mqstore.open(store, **settings) as s:
        assert [m.body for m in s.query("t", "k5").messages] == [b"m" * 100]
