"""The `lock` and `abort` files (spec §11.2)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mqstore.storage.fs import RealFileSystem, SimulatedFileSystem
from mqstore.storage.lockfiles import AbortFile, StoreLock, StoreLockedError

TRY_LOCK_IN_ANOTHER_PROCESS = """
import sys
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.lockfiles import StoreLock, StoreLockedError
try:
    StoreLock(RealFileSystem(), sys.argv[1]).acquire()
except StoreLockedError as e:
    print("LOCKED", e)
else:
    print("ACQUIRED")
"""


def other_process_tries(path: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-c", TRY_LOCK_IN_ANOTHER_PROCESS, str(path)],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return out.stdout.strip()


def test_lock_writes_lock_bytes_and_keeps_another_process_out(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    with StoreLock(RealFileSystem(), str(path)) as lock:
        assert lock.locked
        assert path.read_bytes() == b"lock"  # opening and closing the file must not drop the lock
        answer = other_process_tries(path)
        assert answer.startswith("LOCKED") and str(path) in answer
    assert other_process_tries(path) == "ACQUIRED"  # released on close


HOLD_CLASSIC_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)  # what Java's FileChannel.tryLock(0, 1) takes
print("held", flush=True)
sys.stdin.readline()
"""


def test_a_classic_posix_lock_held_elsewhere_keeps_us_out(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_CLASSIC_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreLockedError, match="another process"):
            StoreLock(RealFileSystem(), str(path)).acquire()
    finally:
        holder.communicate("\n", timeout=60)
    with StoreLock(RealFileSystem(), str(path)):
        pass


def test_second_lock_in_the_same_process_fails_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    first = StoreLock(RealFileSystem(), str(path))
    first.acquire()
    # A different spelling of the same file is the same lock (keyed by real path).
    alias = tmp_path / "." / "lock"
    with pytest.raises(StoreLockedError, match=str(tmp_path)):
        StoreLock(RealFileSystem(), str(alias)).acquire()
    first.release()
    second = StoreLock(RealFileSystem(), str(alias))
    second.acquire()
    second.release()
    second.release()  # idempotent


def test_lock_keeps_existing_content_beyond_the_four_bytes_untouched(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    path.write_bytes(b"xxxxyz")
    with StoreLock(RealFileSystem(), str(path)):
        assert path.read_bytes() == b"lockyz"  # Java writes 4 bytes at position 0, no truncation


def test_simulated_fs_lock_is_an_in_process_registry_per_fs() -> None:
    fs = SimulatedFileSystem()
    other_fs = SimulatedFileSystem()
    with StoreLock(fs, "/store/lock"):
        assert fs.read_bytes("/store/lock") == b"lock"
        with pytest.raises(StoreLockedError, match="/store/lock"):
            StoreLock(fs, "/store/lock").acquire()
        with StoreLock(other_fs, "/store/lock"):  # another simulated disk: another file
            pass
    with StoreLock(fs, "/store/lock"):
        pass


def test_failed_lock_write_leaves_no_registration() -> None:
    fs = SimulatedFileSystem()
    fs.inject_fault("write", path_contains="lock")
    with pytest.raises(OSError):
        StoreLock(fs, "/s/lock").acquire()
    with StoreLock(fs, "/s/lock"):
        pass


@pytest.mark.parametrize("real", [True, False])
def test_abort_file_create_exists_remove(real: bool, tmp_path: Path) -> None:
    fs = RealFileSystem() if real else SimulatedFileSystem()
    path = str(tmp_path / "abort") if real else "/store/abort"
    abort = AbortFile(fs, path)
    assert not abort.exists()
    abort.create()
    assert abort.exists() and fs.read_bytes(path) == b""
    abort.create()  # idempotent
    abort.remove()
    assert not abort.exists()
    abort.remove()  # a missing marker is fine


def test_an_abort_marker_already_there_is_kept_without_a_write() -> None:
    """Review 46 M6: rewriting it took a new inode (temp file and rename): with none free, a
    crashed store could not be opened at all."""
    import errno

    fs = SimulatedFileSystem()
    AbortFile(fs, "/store/abort").create()
    fs.inject_fault("write", path_contains="abort", err=errno.ENOSPC, count=10)
    AbortFile(fs, "/store/abort").create()  # no write: nothing to fail
    assert AbortFile(fs, "/store/abort").exists()


def test_abort_file_survives_a_crash_once_created() -> None:
    fs = SimulatedFileSystem()
    AbortFile(fs, "/store/abort").create()
    assert AbortFile(fs.crash(seed=5), "/store/abort").exists()


@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_the_lock_is_never_written_through_a_link(tmp_path: Path, link: str) -> None:
    """Checked by the lock itself too (O_NOFOLLOW, then the link count before any write), not
    only by the open's refusal pass: `mqstore recover` and a race with the pass take it."""
    import os

    from mqstore.storage.lockfiles import StoreDirectoryError

    other = tmp_path / "segment"
    other.write_bytes(b"\x00\x00\x00\x61record")
    lock = tmp_path / "lock"
    if link == "symbolic":
        lock.symlink_to(other)
    else:
        os.link(other, lock)
    with pytest.raises(StoreDirectoryError, match="symbolic link" if link == "symbolic" else "2 hard links"):
        StoreLock(RealFileSystem(), str(lock)).acquire()
    assert other.read_bytes() == b"\x00\x00\x00\x61record"
    lock.unlink()
    again = StoreLock(RealFileSystem(), str(lock))  # nothing held by the refused attempt
    again.acquire()
    again.release()


def test_a_directory_held_for_an_instant_by_a_tool_is_claimed_after_it(tmp_path: Path) -> None:
    """Review 53 L3: the read-only commands ask whether a store runs by taking a shared flock on
    its commitlog directory for an instant; an open meeting it waits that out instead of calling
    the directory another store's. One held for good is still refused."""
    directory = tmp_path / "commitlog"
    directory.mkdir()
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    threading.Timer(0.02, os.close, (fd,)).start()  # a tool's probe, let go
    lock = StoreLock(RealFileSystem(), str(tmp_path / "lock"))
    lock.acquire()
    try:
        lock.claim_directories([str(directory)])
    finally:
        lock.release()
    held = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_SH)
    try:
        with StoreLock(RealFileSystem(), str(tmp_path / "lock")) as lock:
            with pytest.raises(StoreLockedError, match="is held by another store"):
                lock.claim_directories([str(directory)])
    finally:
        os.close(held)


def test_a_lock_left_to_release_later_is_taken_over_by_the_next_acquire_once_its_holder_says_so(tmp_path: Path) -> None:
    """Review 144 F1: with no thread to release the lock once its last actor ends, the next
    acquire of the store in this process asks the holder first; until it says done, refused."""
    path = str(tmp_path / "lock")
    first = StoreLock(RealFileSystem(), path)
    first.acquire()
    done = [False]
    asked: list[bool] = []

    def release_if_done() -> bool:
        asked.append(done[0])
        if done[0]:
            first.release()
        return done[0]

    first.release_later(release_if_done)
    with pytest.raises(StoreLockedError, match="already started in this process"):
        StoreLock(RealFileSystem(), path).acquire()
    done[0] = True
    second = StoreLock(RealFileSystem(), path)
    second.acquire()  # the holder released it: taken
    assert asked == [False, True] and not first.locked and second.locked
    second.release()
    third = StoreLock(RealFileSystem(), path)
    third.acquire()  # asked no more: released locks drop what they left to do
    assert asked == [False, True]
    third.release()
