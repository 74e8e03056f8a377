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
    saved = segment.read_bytes()
    read = ReputMessageService._read
    cuts: list[int] = []

    def read_with_the_page_faulting(self: ReputMessageService, offset: int, limit: int) -> Any:
        if cuts or offset >= SEG:
            return read(self, offset, limit)
        cuts.append(offset)
        os.truncate(segment, 8192)
        try:
            return read(self, offset, limit)
        finally:
            segment.write_bytes(saved)  # the disk reads again

    monkeypatch.setattr(ReputMessageService, "_read", read_with_the_page_faulting)
    expected = {i: bytes([65 + i % 26]) * 1000 for i in range(MESSAGES)}
    with mqstore.open(store_dir, **SETTINGS) as store:
        assert cuts == [0]
        assert store.wait_for_messages("t", 0, MESSAGES - 1, 30.0)
        assert _bodies(store) == expected
    monkeypatch.setattr(ReputMessageService, "_read", read)
    with mqstore.open(store_dir, **SETTINGS) as store:
        assert store.wait_for_messages("t", 0, MESSAGES - 1, 30.0)
        assert _bodies(store) == expected
