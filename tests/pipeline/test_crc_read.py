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
