"""The reader checks each record's body CRC: a record that fails is reported and counted as
corrupt, never returned as a message."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from mqstore.pipeline.datasource import count_corrupt_log, plan_splits, read_split  # noqa: E402
from mqstore.pipeline.segments import discover_segments  # noqa: E402
from mqstore.storage.codec import read_record  # noqa: E402

h = sys.modules["mqstore_pipeline_test_helpers"]


def _rows(store: Path, corrupt_log: str | None = None, check_crc: bool = True) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for split in plan_splits([str(store)], 1 << 30, 4 << 20):
        for batch in read_split(split, ["commitlog_offset", "body", "error"], corrupt_log=corrupt_log, check_crc=check_crc):
            out.extend(batch.to_pylist())
    return out


def test_a_flipped_body_byte_is_reported_not_returned(generated_store: Any, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(generated_store.store, store)
    seg = discover_segments([str(store)])[3]
    data = bytearray(Path(seg.path).read_bytes())
    rec = read_record(bytes(data), 0, read_body=True).record
    assert rec is not None and rec.body
    # The body sits right after BODYLENGTH at 84 in a V1 record with IPv4 hosts.
    data[84 + 4 + 1] ^= 0xFF
    Path(seg.path).write_bytes(bytes(data))
    damaged = seg.base_offset
    rows = _rows(store, corrupt_log=str(tmp_path / "corrupt"))
    messages = [r for r in rows if r["error"] is None]
    errors = [r for r in rows if r["error"] is not None]
    assert len(messages) == 2999 and damaged not in {r["commitlog_offset"] for r in messages}
    assert [(r["commitlog_offset"], r["error"]) for r in errors] == [(damaged, "body CRC mismatch")]
    assert count_corrupt_log(str(tmp_path / "corrupt")) == 1
    # checkCrc=false returns it as it is (for a reader who wants to see damaged bytes).
    assert len([r for r in _rows(store, check_crc=False) if r["error"] is None]) == 3000


def test_a_record_whose_offset_field_lies_is_reported_not_returned(generated_store: Any, tmp_path: Path) -> None:
    """The store's recovery quarantines a record whose own physical-offset field disagrees
    with where it lies; the body CRC cannot see that. Before: returned as a message, with the
    wrong commitlog_offset."""
    store = tmp_path / "store"
    shutil.copytree(generated_store.store, store)
    seg = discover_segments([str(store)])[3]
    data = bytearray(Path(seg.path).read_bytes())
    first = read_record(bytes(data), 0).size
    PHYS = 28  # PHYSICAL_OFFSET_POSITION
    data[first + PHYS : first + PHYS + 8] = (seg.base_offset + 4096).to_bytes(8, "big")
    Path(seg.path).write_bytes(bytes(data))
    damaged = seg.base_offset + first
    rows = _rows(store)
    messages = [r for r in rows if r["error"] is None]
    errors = [r for r in rows if r["error"] is not None]
    assert len(messages) == 2999 and seg.base_offset + 4096 not in {r["commitlog_offset"] for r in messages}
    assert [(r["commitlog_offset"], r["error"]) for r in errors] == [
        (damaged, f"record says it is at commitlog offset {seg.base_offset + 4096}")]


def test_the_stream_reader_skips_filler_units_and_damaged_records(tmp_path: Path) -> None:
    """The stream reads through ConsumeQueue units. Before: a filler unit (a queue offset whose
    record recovery quarantined: commitlog offset 0) was delivered as the log's first record,
    another queue's message, and a unit naming a record damaged after it was written
    delivered the damaged body."""
    import os

    import mqstore
    from mqstore.pipeline.stream import QueueSlice, read_queue_slice

    store = str(tmp_path / "store")
    settings: dict[str, Any] = dict(mapped_file_size_commitlog_bytes=64 * 1024, mapped_file_size_consume_queue_bytes=4000)

    def put(s: mqstore.MessageStore, topic: str, i: int) -> mqstore.PutResult:
        r = s.put(mqstore.Message(topic=topic, queue_id=0, body=b"%s-%05d" % (topic.encode(), i) * 8))
        assert r.ok, r
        return r

    def flip(offset: int, body: bytes) -> None:
        seg = os.path.join(store, "commitlog", "%020d" % 0)
        data = bytearray(Path(seg).read_bytes())
        data[offset + data[offset:].index(body) + 3] ^= 1
        Path(seg).write_bytes(bytes(data))

    with mqstore.open(store, **settings) as s:
        main = [put(s, "main", i).commitlog_offset for i in range(20)]
        other = [put(s, "other", i).commitlog_offset for i in range(5)]
        main += [put(s, "main", i).commitlog_offset for i in range(20, 40)]
    flip(other[4], b"other-00004")  # the last of its queue: after the crash, a filler unit
    (tmp_path / "store" / "abort").write_bytes(b"")
    with mqstore.open(store, **settings) as s:
        assert put(s, "other", 5).queue_offset == 5
    flip(main[3], b"main-00003")  # damaged after its unit was written
    cols = ["topic", "queue_offset", "body"]

    def rows(topic: str, end: int) -> list[tuple[str, int]]:
        got = [r for b in read_queue_slice(QueueSlice(store, topic, 0, 0, end), cols) for r in b.to_pylist()]
        assert all(r["body"] == b"%s-%05d" % (r["topic"].encode(), r["queue_offset"]) * 8 for r in got), got
        return [(r["topic"], r["queue_offset"]) for r in got]

    assert rows("other", 6) == [("other", i) for i in (0, 1, 2, 3, 5)]
    assert rows("main", 40) == [("main", i) for i in range(40) if i != 3]
