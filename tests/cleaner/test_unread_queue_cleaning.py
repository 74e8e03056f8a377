"""The ConsumeQueue cleaning judges a queue file by its last unit, read through the map. A page
that faults there (an I/O error, or the file cut short meanwhile) reads as the SIGBUS guard's
zeros: commitlog offset 0, below any min offset. Review 67 F4: the file was deleted, and 40
acknowledged messages still in the log became OFFSET_TOO_SMALL for good. Now the file is kept,
the pass stops (said once, EIO), and the file's map is given back, so the queue's min offset
and the next pass read the file again.

The fault is made for real: the queue file is cut short while the cleaning reads it, and its
bytes are written back right after."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import mqstore
from mqstore.storage import mapguard
from mqstore.storage.mapped_file_queue import MappedFileQueue

pytestmark = pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built: a fault would kill the run")

CFG = {"mapped_file_size_commitlog_bytes": 64 * 1024, "mapped_file_size_consume_queue_bytes": 2000,
       "file_reserved_time_hours": 1}  # fmt: skip


def test_a_queue_file_whose_last_unit_faults_is_kept_and_cleaned_by_the_next_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    with mqstore.open(store, **CFG) as s:
        for _ in range(300):
            assert s.put(mqstore.Message(topic="t", body=b"m" * 1000)).ok
    segments = sorted((store / "commitlog").iterdir())
    old = time.time() - 7200
    os.utime(segments[0], (old, old))  # only the first commitlog segment expires
    first = store / "consumequeue" / "t" / "0" / ("%020d" % 0)  # units 0..99; 60..99 point past segment 0
    saved = first.read_bytes()
    clean = MappedFileQueue.delete_expired_file_by_offset
    passes: list[int] = []

    def cut_while_it_reads(self: MappedFileQueue, min_offset: int, unit_size: int, filler: bytes | None = None) -> int:
        if self.store_path != str(first.parent):
            return clean(self, min_offset, unit_size, filler)
        passes.append(min_offset)
        if len(passes) > 1:
            return clean(self, min_offset, unit_size, filler)
        os.truncate(first, 0)  # mapped: its last unit's page faults
        try:
            return clean(self, min_offset, unit_size, filler)
        finally:
            with open(first, "r+b") as f:  # the disk reads again, in place
                f.write(saved)

    monkeypatch.setattr(MappedFileQueue, "delete_expired_file_by_offset", cut_while_it_reads)
    with mqstore.open(store, **CFG) as s:
        faults = mapguard.total_faults()
        assert s.delete_expired_files_now() == 1
        assert mapguard.total_faults() > faults and len(passes) == 1
        assert first.read_bytes() == saved
        assert s.min_offset("t", 0) == 60  # its units 0..59 point into the deleted segment
        r = s.get("t", 0, 60, 32)
        assert r.status is mqstore.GetMessageStatus.FOUND and r.messages[0].queue_offset == 60, r
        said = [rec for rec in caplog.records if "could not be read; kept" in rec.getMessage()]
        assert len(said) == 1, [rec.getMessage() for rec in caplog.records]
        # The next pass reads the file again (mapped anew), and cleans it as its units say:
        # with the second segment gone too, every unit of it points at a deleted record.
        os.utime(segments[1], (old, old))
        assert s.delete_expired_files_now() == 1
        assert len(passes) == 2 and not first.exists()
        assert 100 < s.min_offset("t", 0) < 200
        assert len([rec for rec in caplog.records if "could not be read; kept" in rec.getMessage()]) == 1
        low = s.min_offset("t", 0)
    with mqstore.open(store, **CFG) as s:
        assert (s.min_offset("t", 0), s.max_offset("t", 0)) == (low, 300)
