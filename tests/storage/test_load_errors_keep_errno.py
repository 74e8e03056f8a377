"""An index or ConsumeQueue file the store may not open (a root `mqstore recover` left it
root-owned: EACCES; chattr +i: EPERM) refuses the open with an OSError that keeps the errno and
names the file (review 65 F4). The refusal said "an I/O error, or its files hold together at
another size than max_hash_slot_num..." for the index, and "cannot load consume queue U/0" for a
queue, with no errno and no path; the geometry wording is kept for the geometry case only."""

from __future__ import annotations

import errno
import os

import pytest

import mqstore
from mqstore.storage.fs import SimulatedFileSystem

SETTINGS = dict(mapped_file_size_commitlog_bytes=64 * 1024, mapped_file_size_consume_queue_bytes=20 * 50,
                max_hash_slot_num=64, max_index_num=200)  # fmt: skip


def _store_with_messages() -> SimulatedFileSystem:
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        for i in range(5):
            assert store.put(mqstore.Message(topic="U", body=b"b", keys=[f"k{i}"])).ok
    return fs


@pytest.mark.parametrize("err", [errno.EACCES, errno.EPERM])
@pytest.mark.parametrize("where", ["/index/", "/consumequeue/U/0/"])
def test_a_file_the_store_may_not_open_refuses_the_open_with_its_errno_and_name(where: str, err: int) -> None:
    fs = _store_with_messages()
    fs.inject_fault("map_writable", path_contains=where, err=err, count=1_000_000)
    with pytest.raises(OSError) as refused:
        mqstore.open("/sim/store", fs=fs, **SETTINGS)
    exc = refused.value
    assert exc.errno == err, repr(exc)
    assert exc.filename is not None and where in exc.filename, repr(exc)
    assert exc.strerror is not None and exc.strerror.endswith(os.strerror(err)), repr(exc)
    assert "max_hash_slot_num" not in str(exc)  # not the geometry's wording
    what = "cannot load the index" if where == "/index/" else "cannot load consume queue U/0"
    assert what in str(exc), str(exc)
    fs.clear_faults()
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:  # nothing changed: it opens once it may
        assert len(store.get("U", 0, 0, 10).messages) == 5


@pytest.mark.parametrize("err", [errno.ENOMEM, errno.EMFILE])
def test_a_commitlog_segment_that_cannot_be_mapped_refuses_the_open_with_its_errno(err: int) -> None:
    """Review 90 M3: the commitlog's load failure said its cause in words only (errno None), so
    a writer restarted while the process was short of memory or maps counted each try against
    the restart budget, as a broken writer, and the store was given up for good."""
    fs = _store_with_messages()
    fs.inject_fault("map", path_contains="/commitlog/", err=err, count=1_000_000)
    with pytest.raises(OSError) as refused:
        mqstore.open("/sim/store", fs=fs, **SETTINGS)
    assert refused.value.errno == err, repr(refused.value)
    assert "cannot load the commitlog" in str(refused.value)
    fs.clear_faults()
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        assert len(store.get("U", 0, 0, 10).messages) == 5


def test_a_map_the_process_has_no_address_space_for_names_the_file(tmp_path: object) -> None:
    """Review 119 F3: under RLIMIT_AS the open of a store with a default 420 MB index file
    failed with a bare "[Errno 12] Cannot allocate memory", naming neither file nor size."""
    import subprocess
    import sys

    child = """
import resource, sys
from mqstore.storage.fs import RealFileSystem
path = sys.argv[1]
with open(path, "wb") as f:
    f.truncate(1 << 30)
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (512 << 20 if hard == resource.RLIM_INFINITY else min(hard, 512 << 20), hard))
try:
    RealFileSystem().map_file(path, 1 << 30, create=False, readonly=True)
except OSError as exc:
    print(exc.errno, exc.filename == path, "1073741824 bytes" in str(exc))
"""
    done = subprocess.run([sys.executable, "-c", child, f"{tmp_path}/big"], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == [str(errno.ENOMEM), "True", "True"], (done.stdout, done.stderr[-2000:])
