"""MappedFileQueue: load, lookup, roll-over, truncation and cleaning (§4.2, §4.9, §12.4, §12.6)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from mqstore.storage.codec import segment_file_name
from mqstore.storage.fs import FileSystem, SimulatedFileSystem
from mqstore.storage.mapped_file import MappedFile
from mqstore.storage.mapped_file_queue import DELETE_FILES_BATCH_MAX, MappedFileQueue

SIZE = 4096


def make_queue(fs: FileSystem, root: str, clock: object, **kw: object) -> MappedFileQueue:
    return MappedFileQueue(fs, os.path.join(root, "q"), SIZE, clock_ms=clock, **kw)  # type: ignore[arg-type]


def fill_files(q: MappedFileQueue, n: int) -> None:
    for i in range(n):
        mf = q.get_last_mapped_file(0)
        assert mf is not None
        assert mf.append_bytes(bytes([i + 1]) * SIZE)


def test_roll_over_creates_contiguous_files_and_first_create_flag(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = make_queue(fs, root, clock)
    assert q.get_last_mapped_file(0, need_create=False) is None
    first = q.get_last_mapped_file(5000)
    assert first is not None and first.file_from_offset == 4096 and first.first_create_in_queue
    assert q.get_last_mapped_file(0) is first  # not full: same file
    first.append_bytes(b"x" * SIZE)
    second = q.get_last_mapped_file(0)
    assert second is not None and second.file_from_offset == 8192 and not second.first_create_in_queue
    assert q.check_self() == []
    assert q.min_offset() == 4096
    assert q.max_offset() == 8192
    second.append_bytes(b"y" * 10)
    assert q.max_offset() == 8202 == q.max_wrote_position()


def test_find_by_offset_and_return_first(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = make_queue(fs, root, clock)
    assert q.find_mapped_file_by_offset(0) is None
    fill_files(q, 3)
    files = q.mapped_files
    assert q.find_mapped_file_by_offset(0) is files[0]
    assert q.find_mapped_file_by_offset(SIZE - 1) is files[0]
    assert q.find_mapped_file_by_offset(SIZE) is files[1]
    assert q.find_mapped_file_by_offset(3 * SIZE + 5) is None
    assert q.find_mapped_file_by_offset(3 * SIZE + 5, True) is files[0]
    q.delete_expired_file_by_time(0, 0, 0, True, 0, lambda ms: None)
    assert q.find_mapped_file_by_offset(0) is None
    assert q.find_mapped_file_by_offset(0, True) is q.mapped_files[0]


def test_load_stops_at_wrong_sized_file(tmp_path: object, real_fs: FileSystem, clock: object) -> None:
    root = str(tmp_path)
    d = os.path.join(root, "q")
    os.makedirs(d)
    for i in range(4):
        with open(os.path.join(d, segment_file_name(i * SIZE)), "wb") as f:
            f.write(b"\x01" * (SIZE if i != 2 else SIZE - 1))
    with open(os.path.join(d, "not-a-segment"), "wb") as f:
        f.write(b"zz")
    q = make_queue(real_fs, root, clock)
    assert q.load()
    assert [m.file_from_offset for m in q.mapped_files] == [0, SIZE]
    assert all(m.wrote_position == m.committed_position == m.flushed_position == SIZE for m in q.mapped_files)


def test_load_of_missing_dir_is_ok_and_io_error_fails(clock: object) -> None:
    fs = SimulatedFileSystem()
    q = MappedFileQueue(fs, "/nope", SIZE, clock_ms=clock)  # type: ignore[arg-type]
    assert q.load() and q.mapped_files == []
    fs.makedirs("/q")
    fs.map_file("/q/" + segment_file_name(0), SIZE)
    fs.inject_fault("map")
    assert not MappedFileQueue(fs, "/q", SIZE, clock_ms=clock).load()  # type: ignore[arg-type]


def test_flush_one_file_per_call_and_reports_progress(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = make_queue(fs, root, clock)
    fill_files(q, 2)
    q.get_last_mapped_file(0)
    q.mapped_files[0].store_timestamp = 111
    assert q.flush(0) is False and q.flushed_where == SIZE and q.store_timestamp == 111
    assert q.flush(0) is False and q.flushed_where == 2 * SIZE
    assert q.flush(0) is True  # third file is empty
    assert q.commit(0) is False and q.committed_where == SIZE


def test_truncate_dirty_files_zeroes_tail_and_destroys_later(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = make_queue(fs, root, clock)
    fill_files(q, 3)
    third = q.mapped_files[2].file_name
    q.truncate_dirty_files(SIZE + 100)
    assert len(q.mapped_files) == 2
    assert not fs.exists(third)
    second = q.mapped_files[1]
    assert second.wrote_position == second.flushed_position == second.committed_position == 100
    assert fs.read_bytes(second.file_name) == b"\x02" * 100 + bytes(SIZE - 100)
    assert q.max_offset() == SIZE + 100


def test_reset_offset_intended_behaviour(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = make_queue(fs, root, clock)
    fill_files(q, 4)
    assert not q.reset_offset(10)  # more than two files back
    assert q.reset_offset(2 * SIZE + 7)
    assert [m.file_from_offset for m in q.mapped_files] == [0, SIZE, 2 * SIZE]
    assert q.max_offset() == 2 * SIZE + 7


def test_delete_last_mapped_file(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = make_queue(fs, root, clock)
    fill_files(q, 2)
    path = q.mapped_files[1].file_name
    q.delete_last_mapped_file()
    assert len(q.mapped_files) == 1 and not fs.exists(path)


def _aged_queue(fs: FileSystem, root: str, clock: object, n: int, mtimes: list[int]) -> MappedFileQueue:
    q = make_queue(fs, root, clock)
    fill_files(q, n)
    for mf, mtime in zip(q.mapped_files, mtimes):
        fs.set_mtime_ms(mf.file_name, mtime)
    return q


def test_delete_by_time_keeps_newest_and_stops_at_not_expired(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = _aged_queue(fs, root, clock, 5, [1000, 1000, 5000, 1000, 1000])
    sleeps: list[int] = []
    deleted = q.delete_expired_file_by_time(2000, 100, 120_000, False, 4000, sleeps.append)
    assert deleted == 2
    assert [m.file_from_offset for m in q.mapped_files] == [2 * SIZE, 3 * SIZE, 4 * SIZE]
    assert sleeps == [100, 100]
    # everything expired: newest kept
    deleted = q.delete_expired_file_by_time(0, 0, 120_000, True, 10_000, sleeps.append)
    assert deleted == 2 and len(q.mapped_files) == 1


def test_delete_by_time_batch_max(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = _aged_queue(fs, root, clock, 14, [0] * 14)
    sleeps: list[int] = []
    assert q.delete_expired_file_by_time(10, 5, 1000, False, 100, sleeps.append) == DELETE_FILES_BATCH_MAX
    assert len(q.mapped_files) == 4
    assert len(sleeps) == DELETE_FILES_BATCH_MAX - 1  # no sleep after the batch's last deletion


def test_delete_by_time_stops_at_a_referenced_file(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = _aged_queue(fs, root, clock, 3, [0, 0, 0])
    held = q.mapped_files[1]
    assert held.hold()
    assert q.delete_expired_file_by_time(10, 0, 120_000, False, 100, lambda ms: None) == 1
    assert q.mapped_files[0] is held and not held.is_available()
    assert not q.retry_delete_first_file(120_000, 200)
    assert q.retry_delete_first_file(120_000, 200_000)  # forced after the interval
    assert len(q.mapped_files) == 1


def append_units(q: MappedFileQueue, file_index: int, numbers: range) -> None:
    """Units pointing at commitlog offsets file_index * 1000 + n, into the queue's last file."""
    mf = q.get_last_mapped_file(0)
    assert mf is not None
    for n in numbers:
        assert mf.append_bytes(struct.pack(">qiq", file_index * 1000 + n, 10, 0))


def test_delete_by_offset_uses_last_unit(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = MappedFileQueue(fs, os.path.join(root, "cq"), 2000, clock_ms=clock)  # type: ignore[arg-type]
    for file_index in range(3):
        append_units(q, file_index, range(100))
    assert q.delete_expired_file_by_offset(99, 20) == 0  # file 0's last unit points at 99
    assert q.delete_expired_file_by_offset(1050, 20) == 1
    assert q.min_offset() == 2000
    assert q.delete_expired_file_by_offset(10**9, 20) == 1  # the newest file is always kept
    assert len(q.mapped_files) == 1


def test_files_deleted_ahead_of_the_flush_do_not_stop_it(any_fs: tuple[FileSystem, str], clock: object) -> None:
    """Review 118 F1: a queue's first files deleted (the log's head passed them) while its flush
    position still lay in them: the flush looked for the file holding that position, found
    none, and never moved again; the thorough flush said durable what was not, and a power
    loss lost units (SYNC_FLUSH-acknowledged messages never served again)."""
    fs, root = any_fs
    q = MappedFileQueue(fs, os.path.join(root, "cq"), 2000, clock_ms=clock)  # type: ignore[arg-type]
    append_units(q, 0, range(41))
    assert q.flush(0) is False and q.flushed_where == 41 * 20
    assert q.commit(0) is False
    append_units(q, 0, range(41, 100))
    append_units(q, 1, range(100))
    append_units(q, 2, range(10))
    assert q.delete_expired_file_by_offset(1050, 20) == 1
    assert q.mapped_files[0].file_from_offset == 2000 > q.flushed_where
    assert q.flush(0) is False and q.flushed_where == 4000
    assert q.flush(0) is False and q.flushed_where == 4000 + 10 * 20
    assert q.commit(0) is False and q.committed_where == 4000
    assert q.last_io_error is None


FILLER = struct.pack(">qiq", 0, 0x7FFFFFFF, 0)


def _files_of_units_then_fillers(fs: FileSystem, root: str, clock: object, files: list[list[tuple[int, int, int]]]) -> MappedFileQueue:
    """A queue of 10-unit files, each holding its `files` entry's units then fillers."""
    q = MappedFileQueue(fs, os.path.join(root, "cq"), 200, clock_ms=clock)  # type: ignore[arg-type]
    for units in files:
        mf = q.get_last_mapped_file(0)
        assert mf is not None
        for unit in units:
            assert mf.append_bytes(struct.pack(">qiq", *unit))
        while mf.wrote_position < 200:
            assert mf.append_bytes(FILLER)
    return q


def test_delete_by_offset_judges_a_file_by_its_last_unit_that_is_not_a_filler(any_fs: tuple[FileSystem, str], clock: object) -> None:
    """Review 108 F1: a filler unit (a queue offset held for a record not in the log) points at
    commitlog offset 0; a file ending in fillers was deleted once the log's head moved, with the
    live units before them. A file of fillers only holds no message: RocketMQ's rule (0 is below
    any head) deletes it, as it deletes a file of its own pre-blank units."""
    fs, root = any_fs
    q = _files_of_units_then_fillers(fs, root, clock, [[(100 + i, 10, 0) for i in range(7)], [], [(300 + i, 10, 0) for i in range(10)]])
    assert q.delete_expired_file_by_offset(106, 20, FILLER) == 0  # file 0's last message is at 106
    assert q.delete_expired_file_by_offset(107, 20, FILLER) == 2  # then the fillers' own file
    assert q.min_offset() == 400
    assert q.delete_expired_file_by_offset(10**9, 20, FILLER) == 0  # the newest file is always kept


def test_get_mapped_file_by_time(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = _aged_queue(fs, root, clock, 3, [100, 200, 300])
    assert q.get_mapped_file_by_time(150) is q.mapped_files[1]
    assert q.get_mapped_file_by_time(999) is q.mapped_files[2]


def test_allocator_is_used_and_fallback_on_failure(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    calls: list[tuple[str, str, int]] = []

    def allocator(next_path: str, next_next_path: str, size: int) -> MappedFile | None:
        calls.append((next_path, next_next_path, size))
        return MappedFile(fs, next_path, size) if len(calls) == 1 else None

    q = make_queue(fs, root, clock, allocator=allocator)
    first = q.get_last_mapped_file(0)
    assert first is not None and first.first_create_in_queue
    assert calls[0] == (os.path.join(q.store_path, segment_file_name(0)), os.path.join(q.store_path, segment_file_name(SIZE)), SIZE)
    first.append_bytes(bytes(SIZE))
    assert q.get_last_mapped_file(0) is None  # allocator failed, no fallback
    q.create_on_allocator_failure = True
    second = q.get_last_mapped_file(0)
    assert second is not None and second.file_from_offset == SIZE


def test_no_segment_is_made_or_asked_for_past_the_largest_offset(any_fs: tuple[FileSystem, str], clock: object) -> None:
    """Review 52 L1: a segment named 2^63 made the store unopenable. The last segment a log can
    have is made without a next one ahead; after it, none."""
    fs, root = any_fs
    calls: list[tuple[str, str | None, int]] = []

    def allocator(next_path: str, next_next_path: str | None, size: int) -> MappedFile | None:
        calls.append((next_path, next_next_path, size))
        return MappedFile(fs, next_path, size)

    q = make_queue(fs, root, clock, allocator=allocator)
    last = q.get_last_mapped_file(2**63 - SIZE)
    assert last is not None and last.file_from_offset == 2**63 - SIZE
    assert calls == [(os.path.join(q.store_path, segment_file_name(2**63 - SIZE)), None, SIZE)]
    last.append_bytes(bytes(SIZE))
    assert q.get_last_mapped_file(0) is None and len(calls) == 1
    assert q.last_create_error is not None and "past the largest offset" in q.last_create_error
    assert fs.listdir(q.store_path) == [segment_file_name(2**63 - SIZE)]


def test_destroy_removes_files_and_empty_dir(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = make_queue(fs, root, clock)
    fill_files(q, 2)
    q.destroy()
    assert q.mapped_files == [] and not fs.exists(q.store_path)


def test_check_self_reports_holes(any_fs: tuple[FileSystem, str], clock: object) -> None:
    fs, root = any_fs
    q = make_queue(fs, root, clock)
    fill_files(q, 3)
    del q.mapped_files[1]
    assert len(q.check_self()) == 1


def test_a_queue_file_cut_between_the_cleanings_two_reads_is_not_judged(
    tmp_path: Path, clock: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 109 K1: a file ending in a filler is read twice (its last unit, then all of it);
    cut short by another process in between, the second read was zeros, taken for a unit at
    offset 0, below any head: the file went with its live units."""
    from mqstore.storage.fs import RealFileSystem

    q = _files_of_units_then_fillers(RealFileSystem(), str(tmp_path), clock, [[(100 + i, 10, 0) for i in range(9)], [(300 + i, 10, 0) for i in range(10)]])
    first = q.mapped_files[0]
    read_long = MappedFile.read_long

    def then_cut(self: MappedFile, pos: int) -> int | None:
        value = read_long(self, pos)
        if self is first:
            os.truncate(self.file_name, 0)
        return value

    monkeypatch.setattr(MappedFile, "read_long", then_cut)
    assert q.delete_expired_file_by_offset(200, 20, FILLER) == 0
    assert q.mapped_files[0] is first and os.path.exists(first.file_name)
