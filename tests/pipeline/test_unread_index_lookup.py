"""The pipeline's index lookup reads the store's index through the store's guarded maps: a page
that could not be read (an I/O error, or the file cut meanwhile) read as empty hash slots, and
the lookup answered "no hit" for a key the index holds (review 68 F4). Now it raises EIO naming
the file. The fault is made for real: the index file is cut as the walk starts, its bytes
written back after."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore.pipeline import lookup
from mqstore.storage import mapguard

pytestmark = pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built: a fault would kill the run")


def test_an_index_lookup_whose_index_page_faults_raises_instead_of_finding_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    with mqstore.open(store, max_index_num=400) as s:  # (the default hash slots: 20 MB, sparse)
        offsets = [s.put(mqstore.Message(topic="t", body=b"x" * 100, keys=[f"k{i}"])).commitlog_offset for i in range(50)]
    (index,) = sorted((store / "index").iterdir())
    assert [h["commitlog_offset"] for h in lookup.lookup_by_index([str(store)], "k7") or []] == [offsets[7]]
    saved = index.read_bytes()
    walk = lookup._snapshot_offsets

    def walk_with_the_page_faulting(*args: Any) -> Any:
        os.truncate(index, 4096)  # the slots past the first page, and every entry
        try:
            return walk(*args)
        finally:
            with open(index, "r+b") as f:  # the disk reads again
                f.write(saved)

    monkeypatch.setattr(lookup, "_snapshot_offsets", walk_with_the_page_faulting)
    with pytest.raises(OSError) as unread:
        lookup.lookup_by_index([str(store)], "k7")
    assert unread.value.errno == errno.EIO and unread.value.filename == str(index)
    monkeypatch.setattr(lookup, "_snapshot_offsets", walk)
    assert [h["commitlog_offset"] for h in lookup.lookup_by_index([str(store)], "k7") or []] == [offsets[7]]
