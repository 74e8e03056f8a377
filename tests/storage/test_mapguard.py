"""The SIGBUS guard of the store's file maps (storage/_mapguard.c) and what its owners do with
a map it reports cut: the writer acknowledges no put of the pass, the store names the file
and the close is unclean. The end-to-end runs with real files are in
tests/crash/test_cut_under_map.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mqstore
from mqstore.storage import mapguard
from mqstore.storage.fs import SimulatedFileSystem

SETTINGS = dict(
    mapped_file_size_commitlog_bytes=64 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 200,
    max_hash_slot_num=64,
    max_index_num=400,
)

GUARDED_READ_AND_WRITE = """
import mmap, os, sys
from mqstore.storage import mapguard
path = sys.argv[1]
with open(path, "wb") as f:
    f.write(b"\\1" * 3 * 4096)
with open(path, "r+b") as f:
    region = mmap.mmap(f.fileno(), 3 * 4096)
slot = mapguard.guard(region)
before = mapguard.total_faults()
os.truncate(path, 4096)
assert region[0] == 1                       # the part left in the file
assert region[4096:4100] == bytes(4)        # a lost page reads zeros, once per page
region[2 * 4096] = 7                        # a write there lands in memory only
assert region[2 * 4096] == 7
region.flush()
print(mapguard.faults(slot), mapguard.total_faults() - before, os.path.getsize(path))
mapguard.release(slot)
region.close()
"""


def test_the_guard_is_built() -> None:
    # `optional=True` lets an install without a compiler succeed; CI must not lose the guard
    # (it is not one of the kernels MQSTORE_PURE_PYTHON turns off).
    assert mapguard.available, "storage/_mapguard.c was not built: `pip install -e .` needs a C compiler"


@pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built")
def test_a_page_cut_from_a_guarded_map_reads_zeros_and_is_counted(tmp_path: object) -> None:
    child = subprocess.run([sys.executable, "-c", GUARDED_READ_AND_WRITE, f"{tmp_path}/f"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert child.returncode == 0, child.stderr
    faults, total, size = map(int, child.stdout.split())
    assert (faults, total, size) == (2, 2, 4096)  # two pages, and the file was not grown back


def test_a_pass_whose_segment_was_cut_acknowledges_no_put_and_the_store_says_which_file() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    store = mqstore.open("/sim/store", fs=fs, **SETTINGS)
    try:
        first = store.put(mqstore.Message(topic="T", body=b"x" * 100))
        assert first.ok
        segment = f"/sim/store/commitlog/{0:020d}"
        fs.cut_file_under_map(segment)
        refused = store.put(mqstore.Message(topic="T", body=b"y" * 100))
        assert refused.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "a page of the file was gone" in refused.detail
        assert store.stats()["files_cut_under_map"] == [segment]
    finally:
        clean = store.close()
    assert clean is False  # the next open checks the files as after a crash
