"""Re-dispatch (the reput actor) reading a commitlog page that faults (an I/O error, or the file
cut short by another process meanwhile) got the SIGBUS guard's zeros, took them for damage below
the watermark, skipped the rest of the segment and wrote filler units for the skipped messages'
queue offsets: 52 of 100 acknowledged messages were unreachable, for good once the checkpoint
moved on (review 67 F2). Now reput does not dispatch from a read whose page faulted: it maps the
segment again and reads it once it reads whole, so every message gets its unit.

The fault is made for real: segment 0 is cut short for reput's first read of it, and its bytes
are written back right after (an I/O error that clears)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore.actors.reput import ReputMessageService
from mqstore.storage import mapguard

pytestmark = pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built: a fault would kill the run")

SEG = 64 * 1024
MESSAGES = 100
SETTINGS: dict[str, Any] = dict(mapped_file_size_commitlog_bytes=SEG, message_index_enable=False)


def _fault_reput_once(monkeypatch: pytest.MonkeyPatch, segment: Path, cut_to: int) -> list[int]:
    """Reput's first read of `segment` (segment 0) runs with it cut to `cut_to` bytes, and the
    bytes are written back right after (in place: never shorter meanwhile). The offsets cut."""
    saved = segment.read_bytes()
    read = ReputMessageService._read
    cuts: list[int] = []

    def read_with_the_page_faulting(self: ReputMessageService, offset: int, limit: int) -> Any:
        if cuts or offset >= SEG:
            return read(self, offset, limit)
        cuts.append(offset)
        os.truncate(segment, cut_to)
        try:
            return read(self, offset, limit)
        finally:
            with open(segment, "r+b") as f:  # the disk reads again
                f.write(saved)

    monkeypatch.setattr(ReputMessageService, "_read", read_with_the_page_faulting)
    return cuts


def _bodies(store: mqstore.MessageStore) -> dict[int, bytes]:
    served: dict[int, bytes] = {}
    offset = 0
    while offset < MESSAGES:
        got = store.get("t", 0, offset, 32)
        served.update((m.queue_offset, m.body) for m in got.messages)
        if got.next_begin_offset <= offset:
            break
        offset = got.next_begin_offset
    return served


def test_dispatch_that_reads_a_faulted_page_waits_and_gives_every_message_its_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_dir = tmp_path / "store"
    with mqstore.open(store_dir, **SETTINGS) as store:
        for i in range(MESSAGES):
            assert store.put(mqstore.Message(topic="t", body=bytes([65 + i % 26]) * 1000)).ok
    shutil.rmtree(store_dir / "consumequeue")  # derived: the open dispatches the log again
    segment = store_dir / "commitlog" / f"{0:020d}"
    cuts = _fault_reput_once(monkeypatch, segment, 8192)
    expected = {i: bytes([65 + i % 26]) * 1000 for i in range(MESSAGES)}
    with mqstore.open(store_dir, **SETTINGS) as store:
        assert cuts == [0]
        assert store.wait_for_messages("t", 0, MESSAGES - 1, 30.0)
        assert _bodies(store) == expected
    monkeypatch.undo()  # reput reads as it does
    with mqstore.open(store_dir, **SETTINGS) as store:
        assert store.wait_for_messages("t", 0, MESSAGES - 1, 30.0)
        assert _bodies(store) == expected


def test_dispatch_takes_no_record_whose_properties_lie_in_a_page_that_faulted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last record of a read decoded with its properties in the faulted page (the body CRC
    does not cover them): dispatched with the guard's zeros for its TAGS, its unit got tags
    code 0 and a consumer filtering on its tag skipped it for good (review 68 F2)."""
    store_dir = tmp_path / "store"
    long_key = "p" * 300
    with mqstore.open(store_dir, **SETTINGS) as store:
        # Put until a record's properties straddle a page boundary before its TAGS (KEYS first).
        for i in range(200):
            put = store.put(mqstore.Message(topic="t", body=b"b" * (900 + i * 37 % 200), tags="A", keys=[f"k{i}", long_key]))
            assert put.ok
            properties = len(f"KEYS\x01k{i} {long_key}\x02TAGS\x01A\x02".encode())
            tags_at = put.commitlog_offset + put.wrote_bytes - len("TAGS\x01A\x02")
            page = (put.commitlog_offset // 4096 + 1) * 4096
            if put.commitlog_offset + put.wrote_bytes - properties + 10 < page <= tags_at < SEG:
                break
        else:
            pytest.fail("no record's properties straddle a page boundary")
    count = i + 1
    shutil.rmtree(store_dir / "consumequeue")
    segment = store_dir / "commitlog" / f"{0:020d}"
    cuts = _fault_reput_once(monkeypatch, segment, page)
    with mqstore.open(store_dir, **SETTINGS) as store:
        assert store.wait_for_messages("t", 0, count - 1, 30.0)
        got = store.get("t", 0, 0, count, tags="A")
        assert cuts == [0] and [m.queue_offset for m in got.messages] == list(range(count)), got
