"""The index cleaning deletes the oldest index files whose header says every entry lies below
the commitlog's new head. A header that faulted when it was read through the map (an I/O
error, or the file cut by another process meanwhile) reads as zeros, end_phy_offset 0: the
file looked expired and was deleted (review 67, F4's shape). Now a file whose map faulted is
kept (and the error logged): the next open reads its header again.

The fault is made for real (the file cut to nothing right after it was mapped, its bytes given
back after), in a forked child: a fault the guard did not catch kills the child only."""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore.storage import fs as storage_fs
from mqstore.storage import mapguard
from mqstore.storage.index import IndexService

pytestmark = pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built: a fault would kill the run")

GEOMETRY = {"max_hash_slot_num": 100, "max_index_num": 400}


def test_an_index_file_whose_header_faulted_is_not_deleted_as_expired(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=64 * 1024, **GEOMETRY) as s:
        for i in range(1000):  # several index files of 400 entries
            assert s.put(mqstore.Message(topic="t", body=b"x" * 100, keys=[f"k{i}"])).ok
    index_dir = root / "index"
    first = sorted(index_dir.iterdir())[0]
    saved = first.read_bytes()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            real = storage_fs.RealFileSystem.map_file

            def map_then_cut(self: Any, path: str, size: int, **kwargs: Any) -> Any:
                region = real(self, path, size, **kwargs)
                if os.path.abspath(path) == str(first):
                    os.truncate(first, 0)  # its header faults when read
                return region

            storage_fs.RealFileSystem.map_file = map_then_cut  # type: ignore[method-assign]
            service = IndexService(storage_fs.RealFileSystem(), str(index_dir), clock_ms=lambda: 0, **GEOMETRY)
            try:
                assert service.load(True, 0)
                assert len(service.files) > 1 and service.files[0].end_phy_offset == 0  # the zeros
                deleted = service.delete_expired_file(1)  # every real entry lies above 1
            finally:
                with open(first, "r+b") as f:
                    f.write(saved)
            assert deleted == 0 and first.exists(), (deleted, first.exists())
            code = 0
        except BaseException:
            traceback.print_exc()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the child: {status:#x} (its traceback above)"
    assert first.read_bytes() == saved
