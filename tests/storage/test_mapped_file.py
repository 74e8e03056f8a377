"""MappedFile: positions, commit/flush page arithmetic, write buffers, ref counting (§4.3-§4.8)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from mqstore.storage.codec import segment_file_name
from mqstore.storage.fs import FileSystem, RealFileSystem, SimulatedFileSystem
from mqstore.storage.mapped_file import OS_PAGE_SIZE, MappedFile, ReserveFailureLog, TransientStorePool
from mqstore.storage.status import AppendMessageResult, AppendMessageStatus

SIZE = 64 * 1024


def make(fs: FileSystem, root: str, offset: int = 0, size: int = SIZE, **kw: object) -> MappedFile:
    return MappedFile(fs, os.path.join(root, "cl", segment_file_name(offset)), size, **kw)  # type: ignore[arg-type]


def test_name_gives_start_offset_and_file_has_full_size(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    mf = make(fs, root, offset=3 * SIZE)
    assert mf.file_from_offset == 3 * SIZE
    assert fs.getsize(mf.file_name) == SIZE
    assert (mf.wrote_position, mf.committed_position, mf.flushed_position) == (0, 0, 0)


def test_append_bytes_never_partial_and_is_full(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    mf = make(fs, root, size=100)
    assert mf.append_bytes(b"a" * 60)
    assert not mf.append_bytes(b"b" * 41)
    assert mf.wrote_position == 60
    assert mf.append_bytes(b"c" * 40)
    assert mf.is_full()
    assert mf.select(50, 20) == b"a" * 10 + b"c" * 10


def test_select_only_below_read_position(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    mf = make(fs, root)
    mf.append_bytes(b"xyz")
    assert mf.select(0) == b"xyz"
    assert mf.select(1, 2) == b"yz"
    assert mf.select(1, 3) is None
    assert mf.select(3) is None


def test_flush_least_pages_counts_crossed_page_boundaries(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    mf = make(fs, root)
    mf.append_bytes(b"x" * (OS_PAGE_SIZE * 2 - 1))  # 1 boundary crossed
    assert not mf.is_able_to_flush(2)
    assert mf.flush(2) == 0
    mf.append_bytes(b"x")  # now 2 boundaries
    assert mf.is_able_to_flush(2)
    assert mf.flush(2) == OS_PAGE_SIZE * 2
    mf.append_bytes(b"y" * 10)
    assert not mf.is_able_to_flush(1)
    assert mf.is_able_to_flush(0)
    assert mf.flush(0) == OS_PAGE_SIZE * 2 + 10


def test_full_file_is_always_able_to_flush(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    mf = make(fs, root, size=OS_PAGE_SIZE)
    mf.append_bytes(b"z" * OS_PAGE_SIZE)
    assert mf.is_able_to_flush(100)
    assert mf.flush(100) == OS_PAGE_SIZE


def test_flush_makes_bytes_durable_on_simulated_disk(clock: object) -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    mf = make(fs, "/s")
    mf.append_bytes(b"durable")
    mf.flush(0)
    mf.append_bytes(b"volatile")
    after = fs.crash(seed=1, tear=False)
    data = after.read_bytes(mf.file_name)
    assert data[:7] == b"durable"
    assert data[7:15] == bytes(8)


def test_flush_error_is_recorded_not_raised() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    mf = make(fs, "/s")
    mf.append_bytes(b"abc")
    fs.inject_fault("flush", path_contains="cl")
    assert mf.flush(0) == 0
    assert isinstance(mf.last_io_error, OSError)
    assert mf.flush(0) == 3
    assert mf.last_io_error is None


def test_a_zeroed_tail_that_cannot_be_forced_raises() -> None:
    """Review 49 L3: the failure was only recorded; a power loss then brought the stale
    records back past the new end."""
    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    mf = make(fs, "/s")
    mf.append_bytes(b"k" * 5000)
    mf.flush(0)
    mf.set_positions(1000)
    fs.inject_fault("flush", path_contains="cl")
    with pytest.raises(OSError, match="zeroed tail .* could not be forced") as raised:
        mf.zero_from(1000)
    assert raised.value.errno == errno.EIO and isinstance(mf.last_io_error, OSError)
    assert mf.mapped_buffer[1000:5000] == bytes(4000)  # readers see the zeros meanwhile


def test_write_buffer_readers_see_only_committed_and_buffer_returned_when_full(
    any_fs: tuple[FileSystem, str],
) -> None:
    fs, root = any_fs
    size = OS_PAGE_SIZE * 4
    pool = TransientStorePool(2, size)
    buf = pool.borrow_buffer()
    assert buf is not None and pool.remain_buffer_numbs() == 1
    mf = make(fs, root, size=size, write_buffer=buf, on_write_buffer_released=pool.return_buffer)
    mf.append_bytes(b"q" * 100)
    assert mf.read_position == 0 and mf.select(0) is None
    assert fs.read_bytes(mf.file_name)[:100] == bytes(100)
    assert mf.commit(1) == 0  # not a whole page yet
    assert mf.commit(0) == 100
    assert mf.select(0) == b"q" * 100
    mf.append_bytes(b"r" * (size - 100))
    assert mf.commit(4) == size
    assert mf.write_buffer is None and pool.remain_buffer_numbs() == 2
    assert mf.read_position == size
    assert mf.flush(0) == size


def test_zero_from_clears_the_tail(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    mf = make(fs, root)
    mf.append_bytes(b"k" * 5000)
    mf.flush(0)
    mf.set_positions(1000)
    mf.zero_from(1000)
    data = fs.read_bytes(mf.file_name)
    assert data[:1000] == b"k" * 1000 and data[1000:] == bytes(SIZE - 1000)


def test_ref_counting_destroy_waits_for_readers_until_forced(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    mf = make(fs, root)
    assert mf.hold()  # a reader
    assert not mf.destroy(interval_forcibly_ms=1000, now_ms=10_000)
    assert not mf.is_available() and fs.exists(mf.file_name)
    assert not mf.hold()  # no new readers once shut down
    assert not mf.destroy(1000, 10_500)  # not yet forcible
    assert mf.destroy(1000, 11_000)  # forced: the reader's reference no longer counts
    assert mf.is_cleanup_over()
    assert not fs.exists(mf.file_name)


def test_destroy_after_reader_released(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    mf = make(fs, root)
    assert mf.hold()
    assert not mf.destroy(120_000, 0)
    mf.release()
    assert mf.is_cleanup_over()
    assert mf.destroy(120_000, 1)
    assert not fs.exists(mf.file_name)


def test_warm_up_small_file_sync_and_async(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    mf = make(fs, root, size=OS_PAGE_SIZE * 8)
    mf.warm_up(sync_flush=True, flush_least_pages=2)
    assert fs.read_bytes(mf.file_name) == bytes(OS_PAGE_SIZE * 8)
    mf.munlock()
    mf2 = make(fs, root, offset=OS_PAGE_SIZE * 8, size=OS_PAGE_SIZE * 8)
    mf2.warm_up(sync_flush=False, flush_least_pages=2)
    assert mf2.append_bytes(b"after warm-up")
    assert mf2.destroy(0, 0) and not fs.exists(mf2.file_name)  # unmaps even when mlocked


def test_warm_up_sync_forces_pages_on_simulated_disk() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    mf = make(fs, "/s", size=OS_PAGE_SIZE * 8)
    mf.warm_up(sync_flush=True, flush_least_pages=3)
    assert fs.unsynced_pages() == 0


@pytest.mark.parametrize("least", [0, 1, 4])
def test_commit_without_write_buffer_returns_wrote(any_fs: tuple[FileSystem, str], least: int) -> None:
    fs, root = any_fs
    mf = make(fs, root)
    mf.append_bytes(b"d" * 10)
    assert mf.commit(least) == 10


def test_appends_reserve_blocks_a_window_ahead_not_the_whole_segment(tmp_path: Path) -> None:
    """Write faults on sparse pages cost ~10x those on reserved blocks; a whole 1 GiB segment
    reserved at creation would take disk a store may never use."""
    from mqstore.storage.mapped_file import RESERVE_AHEAD_BYTES

    fs = RealFileSystem()
    size = 4 * RESERVE_AHEAD_BYTES
    path = str(tmp_path / "00000000000000000000")
    mf = MappedFile(fs, path, size)
    assert os.stat(path).st_blocks == 0  # created sparse

    def write_4k(buf: Any, file_from_offset: int, position: int, max_blank: int) -> AppendMessageResult:
        buf[position : position + 4096] = b"\x01" * 4096
        return AppendMessageResult(status=AppendMessageStatus.PUT_OK, wrote_offset=position, wrote_bytes=4096)

    mf.append_message(write_4k)
    allocated = os.stat(path).st_blocks * 512
    if allocated < RESERVE_AHEAD_BYTES:
        pytest.skip("this filesystem does not support fallocate (the file stays sparse)")
    assert allocated < size  # a window, not the segment
    mf.destroy(0, 0)


def test_a_full_disk_makes_the_append_refuse_and_an_unsupported_filesystem_stays_sparse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from mqstore.storage import fs as fs_module
    from mqstore.storage.mapped_file import DiskFullError

    def write_4k(buf: Any, file_from_offset: int, position: int, max_blank: int) -> AppendMessageResult:
        buf[position : position + 4096] = b"\x01" * 4096
        return AppendMessageResult(status=AppendMessageStatus.PUT_OK, wrote_offset=position, wrote_bytes=4096)

    monkeypatch.setattr(fs_module, "_fallocate", lambda fd, offset, length: errno.ENOSPC)
    mf = MappedFile(RealFileSystem(), str(tmp_path / "00000000000000000000"), 1 << 20)
    with pytest.raises(DiskFullError):
        mf.append_message(write_4k)
    assert mf.wrote_position == 0  # nothing written
    monkeypatch.setattr(fs_module, "_fallocate", lambda fd, offset, length: errno.EOPNOTSUPP)
    assert mf.append_message(write_4k).status is AppendMessageStatus.PUT_OK  # sparse, as before
    mf.destroy(0, 0)


def test_a_reservation_initialises_only_pages_above_the_data_and_changes_no_byte_below(tmp_path: Path) -> None:
    """Reserved pages are written once with zeros by pwrite before the first store through the
    map (on ext4 a store into a fallocated, unwritten block can fault with SIGBUS when another
    process filled the disk). The zeros go only at or above the owner's data end: a segment
    reopened with data must keep every byte of it."""
    from mqstore.storage.mapped_file import RESERVE_AHEAD_BYTES

    fs = RealFileSystem()
    size = 4 * RESERVE_AHEAD_BYTES
    path = str(tmp_path / "00000000000000000000")
    data = bytes(range(256)) * 64  # 16 KiB, no zero page in it
    with open(path, "wb") as f:
        f.truncate(size)
        f.write(data + b"\x07" * 100)  # data, then a partial page past it
    mf = MappedFile(fs, path, size)
    mf.wrote_position = len(data) + 100  # as recovery leaves it: the data end, mid-page

    def write_4k(buf: Any, file_from_offset: int, position: int, max_blank: int) -> AppendMessageResult:
        buf[position : position + 4096] = b"\x01" * 4096
        return AppendMessageResult(status=AppendMessageStatus.PUT_OK, wrote_offset=position, wrote_bytes=4096)

    mf.append_message(write_4k)
    if os.stat(path).st_blocks * 512 < RESERVE_AHEAD_BYTES:
        pytest.skip("this filesystem does not support fallocate (the file stays sparse)")
    mf.flush(0)
    with open(path, "rb") as f:
        on_disk = f.read(RESERVE_AHEAD_BYTES)
    assert on_disk[: len(data) + 100] == data + b"\x07" * 100
    assert on_disk[len(data) + 100 : len(data) + 4196] == b"\x01" * 4096
    assert on_disk[len(data) + 4196 :] == bytes(RESERVE_AHEAD_BYTES - len(data) - 4196)
    # The window above the data holds written blocks, not unwritten (fallocated) extents.
    unwritten = _unwritten_extents(path)
    if unwritten is None:
        pytest.skip("FIEMAP is not supported here")
    assert not [e for e in unwritten if e[0] < mf.reserved_until], unwritten
    mf.destroy(0, 0)


def _unwritten_extents(path: str) -> list[tuple[int, int]] | None:
    """(logical, length) of the file's unwritten extents, after a sync (FS_IOC_FIEMAP); None
    when the filesystem has no FIEMAP."""
    import fcntl
    import struct

    count = 64
    header = struct.pack("=QQIIII", 0, 2**64 - 1, 1, 0, count, 0)  # FIEMAP_FLAG_SYNC
    buf = bytearray(header + bytes(56 * count))
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, 0xC020660B, buf)  # FS_IOC_FIEMAP
    except OSError:
        return None
    finally:
        os.close(fd)
    mapped = struct.unpack_from("=I", buf, 20)[0]
    extents = []
    for i in range(mapped):
        logical, _physical, length = struct.unpack_from("=QQQ", buf, 32 + 56 * i)
        flags = struct.unpack_from("=I", buf, 32 + 56 * i + 40)[0]
        if flags & 0x800:  # FIEMAP_EXTENT_UNWRITTEN
            extents.append((logical, length))
    return extents


def test_a_reservation_fills_the_holes_below_the_data_end_without_changing_a_byte(tmp_path: Path) -> None:
    """A file written by RocketMQ is sparse (an index's untouched slots are holes): a later store
    into such a hole must not allocate in the page fault. The reservation writes zeros into the
    holes below the data end (they read as zeros: no byte changes) and leaves the data alone."""
    from mqstore.storage.fs import RealMappedRegion

    path = str(tmp_path / "sparse")
    first, second = b"\x05" * 4096, b"\x06" * 4096
    with open(path, "wb") as f:
        f.truncate(64 * 1024)
        f.write(first)
        f.seek(32 * 1024)
        f.write(second)
    before = open(path, "rb").read()
    region = RealMappedRegion(path, 64 * 1024, create=False, readonly=False)
    try:
        assert region.reserve(48 * 1024, unwritten_from=36 * 1024)
    finally:
        region.close()
    assert open(path, "rb").read() == before
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        assert os.lseek(fd, 0, os.SEEK_HOLE) >= 48 * 1024  # no hole below the reservation's end
    finally:
        os.close(fd)
    unwritten = _unwritten_extents(path)
    if unwritten is not None:
        assert not [e for e in unwritten if e[0] < 48 * 1024], unwritten


def test_reservation_failures_are_said_once_per_directory_and_errno_then_counted() -> None:
    """Review 49 L4: one throttle for the whole process hid another store's (directory's) or a
    new errno's failures for up to 10 s."""
    now = [100.0]
    said = ReserveFailureLog(10.0, now=lambda: now[0])
    full, eio = OSError(errno.ENOSPC, "full"), OSError(errno.EIO, "eio")
    assert said("/a/commitlog/00000000000000000000", full)
    assert not said("/a/commitlog/00000000000001048576", full)  # same directory, same errno: counted
    assert said("/b/commitlog/00000000000000000000", full)  # another store
    assert said("/a/commitlog/00000000000000000000", eio)  # another errno
    now[0] += 9.9
    assert not said("/a/commitlog/00000000000000000000", full)
    now[0] += 0.1
    assert said("/a/commitlog/00000000000000000000", full)
