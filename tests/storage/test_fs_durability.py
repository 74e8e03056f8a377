"""A new file's or directory's name is made durable in its parent when it is created: msync
makes a segment's data durable, not the directory entry that finds it, and a segment that
vanished at a power loss with flushed records in it would be a hole (POSIX wants the
directory fsynced; ext4's ordered journal usually covers for it, other filesystems do not)."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import pytest

from mqstore.storage import fs as fs_module
from mqstore.storage import mapguard
from mqstore.storage.fs import RealFileSystem


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = fs_module.fsync_dir

    def spy(directory: str) -> None:
        calls.append(directory)
        real(directory)

    monkeypatch.setattr(fs_module, "fsync_dir", spy)
    return calls


def test_a_created_file_has_its_directory_synced_once(tmp_path: Path, synced: list[str]) -> None:
    fs = RealFileSystem()
    path = tmp_path / ("%020d" % 0)
    region = fs.map_file(str(path), 8192, create=True)
    region.close()
    assert synced == [str(tmp_path)]
    for readonly in (False, True):  # opening it again creates nothing
        region = fs.map_file(str(path), 8192, create=not readonly, readonly=readonly)
        region.close()
    assert synced == [str(tmp_path)]


def test_created_directories_are_synced_in_their_parents(tmp_path: Path, synced: list[str]) -> None:
    fs = RealFileSystem()
    fs.makedirs(str(tmp_path / "consumequeue" / "T" / "0"))
    assert synced == [str(tmp_path), str(tmp_path / "consumequeue"), str(tmp_path / "consumequeue" / "T")]
    synced.clear()
    fs.makedirs(str(tmp_path / "consumequeue" / "T" / "0"))
    fs.makedirs(str(tmp_path / "consumequeue" / "T" / "1"))
    assert synced == [str(tmp_path / "consumequeue" / "T")]


def test_a_file_that_cannot_be_mapped_is_not_left_open(tmp_path: Path, synced: list[str]) -> None:
    fs = RealFileSystem()
    with pytest.raises(OSError):
        fs.map_file(str(tmp_path / "missing"), 8192, create=False)
    assert synced == []


def test_a_new_file_whose_set_up_failed_is_removed_so_the_retry_syncs_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: after a failed directory sync the file stayed, and the retry opened it
    as an old file and never synced its name."""
    import errno

    calls: list[str] = []

    def failing_once(directory: str) -> None:
        calls.append(directory)
        if len(calls) == 1:
            raise OSError(errno.EIO, "injected", directory)

    monkeypatch.setattr(fs_module, "fsync_dir", failing_once)
    path = str(tmp_path / ("%020d" % 0))
    with pytest.raises(OSError):
        RealFileSystem().map_file(path, 4096)
    RealFileSystem().map_file(path, 4096).close()
    assert calls == [str(tmp_path), str(tmp_path)]


def _descriptors_of(path: Path) -> int:
    """Open descriptors of this process naming `path` (mmap's own included)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == str(path):
                count += 1
        except OSError:
            pass  # the listing's own descriptor, closed meanwhile
    return count


def test_a_writable_map_keeps_no_descriptor_and_reserve_opens_the_file_again(tmp_path: Path) -> None:
    """Review 58 F2: a writable map kept its own descriptor for reserve() beside mmap's, so
    each consume queue cost 2 (EMFILE at ~500 queues under `ulimit -n 1024`); then mmap's
    alone, and now none (mapguard.map_keeping_no_descriptor): reserve() opens the file for each
    window it reserves, then closes it."""
    fs = RealFileSystem()
    path = tmp_path / ("%020d" % 0)
    region = fs.map_file(str(path), 1 << 20, create=True)
    kept = 0 if mapguard.available or sys.version_info >= (3, 13) else 1
    try:
        assert _descriptors_of(path) == kept
        region.buf[:5] = b"hello"
        assert region.reserve(1 << 18, unwritten_from=5)
        assert _descriptors_of(path) == kept
        assert region.buf[:5] == b"hello" and not region.replaced()
    finally:
        region.close()
    assert _descriptors_of(path) == 0


def test_reserve_on_a_file_replaced_under_the_map_writes_nothing_into_the_new_one(tmp_path: Path) -> None:
    """With no descriptor kept, reserve() opens the path again: a file renamed over it by
    another process is not ours to grow or write zeros into. It counts as a cut (the owner's
    checks name the file), as a file cut short under the map does."""
    fs = RealFileSystem()
    path = tmp_path / ("%020d" % 0)
    region = fs.map_file(str(path), 1 << 20, create=True)
    try:
        other = tmp_path / "other"
        other.write_bytes(b"theirs")
        os.replace(other, path)
        mark = fs.cut_mark()
        with pytest.raises(fs_module.FileReplacedUnderMapError):
            region.reserve(1 << 18)
        assert path.read_bytes() == b"theirs"
        assert str(path) in fs.cut_under_map(mark) and region.replaced()
        os.remove(path)
        with pytest.raises(fs_module.FileReplacedUnderMapError):  # deleted: the same
            region.reserve(1 << 18)
    finally:
        region.close()


def test_a_filesystem_that_cannot_punch_holes_is_not_asked_at_every_eviction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 89: where fallocate cannot punch a hole, each idle file's give-back opened the
    file again and asked once more, at every eviction. Refused once, that filesystem is not
    asked again; nothing else changes (the blocks stay reserved, the call says False)."""
    fs = RealFileSystem()
    real_fallocate = fs_module._fallocate
    punches: list[int] = []

    def no_punching(fd: int, offset: int, length: int, mode: int = 0) -> int:
        if mode:
            punches.append(offset)
            return errno.EOPNOTSUPP
        return real_fallocate(fd, offset, length, mode)

    monkeypatch.setattr(fs_module, "_fallocate", no_punching)
    monkeypatch.setattr(fs_module, "_NO_HOLE_PUNCHING", set())
    regions = [fs.map_file(str(tmp_path / ("%020d" % n)), 1 << 20, create=True) for n in range(3)]
    try:
        for region in regions:
            assert region.reserve(1 << 18)
            assert region.unreserve(8192, 1 << 18) is False
        assert len(punches) == 1
    finally:
        for region in regions:
            region.close()


@pytest.mark.parametrize("fails", ["ftruncate", "fsync"])
def test_a_store_copy_that_cannot_be_written_whole_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  fails: str) -> None:  # fmt: skip
    """Review 142 F1: a copy cut short by a full disk (or whose fsync failed) stayed under its
    name; the next open named it the store's copy to move over the segment, and that served
    puts the writer had answered "not stored"."""
    region = RealFileSystem().map_file(str(tmp_path / "segment"), 8192)
    region.buf[:5] = b"bytes"
    copy = tmp_path / "segment.store-copy"

    def failing(*_: object) -> None:
        raise OSError(errno.ENOSPC if fails == "ftruncate" else errno.EIO, f"injected {fails} failure")

    with monkeypatch.context() as patched:
        patched.setattr(os, fails, failing)
        with pytest.raises(OSError, match=f"injected {fails} failure"):
            region.save_copy(str(copy), 5)
    assert not copy.exists()
    region.save_copy(str(copy), 5)  # and the name is free for the next attempt
    assert copy.read_bytes() == b"bytes".ljust(8192, b"\0")
    region.close()


def test_a_whole_store_copy_whose_directory_cannot_be_forced_is_kept(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Its bytes are on disk, only its name is not known to be: dropping it would drop the
    acknowledged puts it holds (the pass that found the segment replaced says FLUSH_DISK_TIMEOUT)."""
    region = RealFileSystem().map_file(str(tmp_path / "segment"), 8192)
    region.buf[:5] = b"bytes"
    copy = tmp_path / "segment.store-copy"

    def failing(path: str) -> None:
        raise OSError(errno.EIO, "injected directory fsync failure", path)

    with monkeypatch.context() as patched:
        patched.setattr(fs_module, "fsync_dir", failing)
        region.save_copy(str(copy), 5)
    assert copy.read_bytes() == b"bytes".ljust(8192, b"\0")
    region.close()
