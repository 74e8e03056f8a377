"""A commitlog page that cannot be read while recovery reads it (an I/O error on the disk, or
the file cut short by another process during the open) faults; the SIGBUS guard hands the scan
zeros for it, which read as the end of the log. Trusted, they ended the log there: after a
crash the open served 177 of 200 acknowledged messages, rewrote the queues, the index and the
checkpoint to match, and would have appended over the records it could not read. Now the open
and `mqstore recover` refuse (EIO, the file named) before changing a byte, and once the file
reads whole again the store opens with every message.

The fault is made for real: the last segment is cut short right after recovery mapped it and
before its scan reads it, then given its bytes back (the disk's error gone)."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import cli
from mqstore.storage import mapguard
from mqstore.storage.commitlog import CommitLog
from mqstore.storage.fs import UnreadDuringRecoveryError

pytestmark = pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built: a fault would kill the run")

SEG = 64 * 1024
MESSAGES = 200


def _fill(store: Path) -> None:
    with mqstore.open(store, mapped_file_size_commitlog_bytes=SEG) as s:
        for i in range(MESSAGES):
            assert s.put(mqstore.Message(topic="t", body=b"x" * 1000, keys=[f"k{i}"])).ok


def _hashes(store: Path) -> dict[str, str]:
    return {str(p.relative_to(store)): hashlib.sha1(p.read_bytes()).hexdigest() for p in store.rglob("*") if p.is_file()}


def _last_segment(store: Path) -> Path:
    return sorted((store / "commitlog").iterdir())[-1]


def _cut_as_the_scan_starts(monkeypatch: pytest.MonkeyPatch, segment: Path) -> bytes:
    """Cut `segment` to 8 KiB once recovery has mapped it, as its scan starts; its bytes."""
    saved = segment.read_bytes()
    scan = CommitLog._scan_for_recovery

    def cut_then_scan(self: CommitLog, *args: Any, **kwargs: Any) -> int:
        monkeypatch.setattr(CommitLog, "_scan_for_recovery", scan)
        os.truncate(segment, 8192)
        return scan(self, *args, **kwargs)

    monkeypatch.setattr(CommitLog, "_scan_for_recovery", cut_then_scan)
    return saved


def _served(store: Path) -> tuple[int, mqstore.PutMessageStatus]:
    with mqstore.open(store, mapped_file_size_commitlog_bytes=SEG) as s:
        return s.max_offset("t", 0), s.put(mqstore.Message(topic="t", body=b"y")).status


@pytest.mark.parametrize("crashed", [True, False], ids=["after_a_crash", "after_a_clean_stop"])
def test_an_open_whose_scan_cannot_read_a_page_refuses_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crashed: bool
) -> None:
    store = tmp_path / "store"
    _fill(store)
    if crashed:
        (store / "abort").touch()
    before = _hashes(store)
    segment = _last_segment(store)
    saved = _cut_as_the_scan_starts(monkeypatch, segment)
    with pytest.raises(UnreadDuringRecoveryError) as refused:
        mqstore.open(store, mapped_file_size_commitlog_bytes=SEG).close()
    assert refused.value.errno == errno.EIO and refused.value.filename == str(segment)
    assert "changed nothing" in str(refused.value)
    segment.write_bytes(saved)  # the disk reads again
    assert _hashes(store) == before
    assert _served(store) == (MESSAGES, mqstore.PutMessageStatus.PUT_OK)


def test_recover_whose_scan_cannot_read_a_page_exits_1_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    _fill(store)
    (store / "abort").touch()
    before = _hashes(store)
    segment = _last_segment(store)
    saved = _cut_as_the_scan_starts(monkeypatch, segment)
    monkeypatch.setenv("MQSTORE_MAPPED_FILE_SIZE_COMMITLOG_BYTES", str(SEG))
    assert cli.main(["recover", str(store)]) == 1
    said = capsys.readouterr().err
    assert "could not be read" in said and "changed nothing" in said and segment.name in said
    assert "quarantined" not in said  # refused where the walk met the fault, not past it
    segment.write_bytes(saved)
    assert _hashes(store) == before
    assert _served(store) == (MESSAGES, mqstore.PutMessageStatus.PUT_OK)
