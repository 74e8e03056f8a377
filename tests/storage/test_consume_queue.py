"""ConsumeQueue: writing rules, reads, offset-by-time, truncation, recovery (§9, §11.4, §12.6)."""

from __future__ import annotations

import os
import struct
from typing import Any

import pytest

from mqstore.storage.codec import CQ_UNIT, segment_file_name
from mqstore.storage import consume_queue
from mqstore.storage.consume_queue import (
    FILLER_UNIT,
    ConsumeQueue,
    ConsumeQueueReader,
    cq_file_size,
    iter_cq_units,
    list_consume_queues,
)
from mqstore.storage.fs import FileSystem, SimulatedFileSystem

UNITS_PER_FILE = 10
SIZE = UNITS_PER_FILE * 20


def make_cq(fs: FileSystem, root: str, clock: Any, topic: str = "T", queue_id: int = 0, size: int = SIZE) -> ConsumeQueue:
    return ConsumeQueue(fs, topic, queue_id, os.path.join(root, "consumequeue"), mapped_file_size=size, clock_ms=clock)


def units(cq: ConsumeQueue) -> list[tuple[int, int, int] | None]:
    return [cq.get_unit(i) for i in range(cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue())]


def test_file_size_rounds_up_to_units() -> None:
    assert cq_file_size(6_000_000) == 6_000_000
    assert cq_file_size(101) == 120


def test_put_and_get_units_across_files(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    for q in range(25):
        assert cq.put_message_position_info(1000 + q * 100, 100, -q, q)
    assert cq.get_max_offset_in_queue() == 25 and cq.get_min_offset_in_queue() == 0
    assert cq.get_unit(7) == (1700, 100, -7)
    assert cq.get_unit(25) is None
    assert fs.listdir(cq.store_path) == [segment_file_name(0), segment_file_name(SIZE), segment_file_name(2 * SIZE)]
    buf = cq.get_index_buffer(8)
    assert buf is not None and len(buf) == 40  # to the end of the first file
    assert CQ_UNIT.unpack_from(buf, 0) == (1800, 100, -8)
    assert cq.roll_next_file(8) == 10 and cq.roll_next_file(10) == 20
    assert cq.max_physic_offset == 1000 + 24 * 100
    assert cq.get_last_offset() == 1000 + 24 * 100 + 100
    assert os.path.join("consumequeue", "T", "0") in cq.store_path


def test_a_reader_sees_the_owners_units_through_its_own_maps(
    any_fs: tuple[FileSystem, str], clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    reader = ConsumeQueueReader(fs, os.path.join(root, "consumequeue"), mapped_file_size=SIZE)
    assert reader.read_units("T", 0, 0, 4) is None  # no file yet
    for q in range(25):
        assert cq.put_message_position_info(1000 + q * 100, 100, -q, q)
    assert reader.read_units("T", 0, 8, 800) == cq.get_index_buffer(8)  # to the file's end
    assert reader.read_units("T", 0, 20, 3) == b"".join(CQ_UNIT.pack(1000 + q * 100, 100, -q) for q in (20, 21, 22))
    assert cq.put_message_position_info(1000 + 25 * 100, 100, -25, 25)
    assert reader.read_units("T", 0, 25, 1) == CQ_UNIT.pack(3500, 100, -25), "a mapped file shows later writes"
    assert reader.read_units("T", 1, 0, 1) is None and reader.read_units("X", 0, 0, 1) is None
    # At most MAPS_MAX maps: the least recently used is closed.
    monkeypatch.setattr(ConsumeQueueReader, "MAPS_MAX", 2)
    reader.read_units("T", 0, 0, 1)
    assert [key[2] for key in reader._maps] == [2 * SIZE, 0]  # most recently used last
    assert reader.read_units("T", 0, 10, 1) == CQ_UNIT.pack(2000, 100, -10)
    assert [key[2] for key in reader._maps] == [0, SIZE]
    reader.forget()
    assert reader._maps == {} and reader.read_units("T", 0, 3, 1) == CQ_UNIT.pack(1300, 100, -3)
    reader.close()


def test_unit_bytes_match_appendix_b(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock, topic="abc", queue_id=1, size=6_000_000)
    for q in range(7):
        cq.put_message_position_info(q * 10, 10, 0, q)
    cq.put_message_position_info(1073742336, 182, 2598919, 7)
    raw = fs.read_bytes(os.path.join(cq.store_path, segment_file_name(0)))
    assert raw[140:160] == bytes.fromhex("0000000040000200000000B60000000000 27A807".replace(" ", ""))
    assert cq.get_max_offset_in_queue() == 8


def test_duplicate_guard_and_already_written_units(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    assert cq.put_message_position_info(100, 10, 0, 0)
    assert cq.put_message_position_info(200, 10, 0, 1)
    assert cq.put_message_position_info(200, 10, 0, 1)  # offset <= maxPhysicOffset: ignored
    assert cq.put_message_position_info(150, 10, 0, 5)  # also ignored (guard is on the phy offset)
    assert cq.get_max_offset_in_queue() == 2
    cq.max_physic_offset = -1  # as after a restart without recovery: the position check catches it
    assert cq.put_message_position_info(300, 10, 0, 1)
    assert cq.get_max_offset_in_queue() == 2 and cq.get_unit(1) == (200, 10, 0)


def test_a_gap_is_filled_so_the_unit_lands_at_its_queue_offset(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    """Queue offsets of records the commitlog lost or quarantined are filler units (Java would
    append at the current end, putting every later unit at the wrong queue offset)."""
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    cq.put_message_position_info(100, 10, 0, 0)
    assert cq.put_message_position_info(200, 10, 0, 3)  # expected 1: a gap
    assert cq.get_max_offset_in_queue() == 4
    assert [cq.get_unit(i) for i in range(4)] == [(100, 10, 0), (0, 0x7FFFFFFF, 0), (0, 0x7FFFFFFF, 0), (200, 10, 0)]


def test_a_huge_gap_is_a_damaged_offset_not_filled(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    cq.put_message_position_info(100, 10, 0, 0)
    assert cq.put_message_position_info(200, 10, 0, 1 << 40)
    assert cq.get_max_offset_in_queue() == 2 and cq.get_unit(1) == (200, 10, 0)


def test_first_file_not_at_zero_fills_pre_blank(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    assert cq.put_message_position_info(5000, 50, 9, 23)
    assert fs.listdir(cq.store_path) == [segment_file_name(2 * SIZE)]
    assert cq.min_logic_offset == 23 * 20 and cq.get_min_offset_in_queue() == 23
    assert cq.get_max_offset_in_queue() == 24
    assert cq.mapped_file_queue.flushed_where == 23 * 20
    raw = fs.read_bytes(os.path.join(cq.store_path, segment_file_name(2 * SIZE)))
    assert raw[:60] == FILLER_UNIT * 3
    assert struct.unpack_from(">qiq", raw, 60) == (5000, 50, 9)
    assert cq.get_unit(22) is None and cq.get_unit(23) == (5000, 50, 9)


def _fake_log(times: dict[int, int]) -> Any:
    def pickup(offset: int, size: int) -> int:
        return times.get(offset, -1)

    return pickup


def test_offset_by_time_exact_neighbours_and_ends(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock, size=6_000_000)
    times = {}
    for q in range(8):
        cq.put_message_position_info(q * 100, 100, 0, q)
        times[q * 100] = 1000 + q * 10  # 1000, 1010, ..., 1070
    pickup = _fake_log(times)
    assert cq.get_offset_in_queue_by_time(1030, pickup, 0) == 3
    assert cq.get_offset_in_queue_by_time(1033, pickup, 0) == 3  # nearer to 1030
    assert cq.get_offset_in_queue_by_time(1037, pickup, 0) == 4
    assert cq.get_offset_in_queue_by_time(1035, pickup, 0) == 3  # tie -> earlier
    assert cq.get_offset_in_queue_by_time(1, pickup, 0) == 0
    assert cq.get_offset_in_queue_by_time(99_999, pickup, 0) == 7  # last message, not max offset
    # units pointing below the commitlog min are skipped
    assert cq.get_offset_in_queue_by_time(1, pickup, 250) == 3
    # unreadable message -> 0
    assert cq.get_offset_in_queue_by_time(1030, lambda o, s: -1, 0) == 0


def test_offset_by_time_empty_queue_is_zero(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    assert cq.get_offset_in_queue_by_time(5, lambda o, s: 1, 0) == 0


def test_truncate_dirty_logic_files_zeroes_and_deletes(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    for q in range(25):
        cq.put_message_position_info(q * 100, 100, 0, q)
    cq.truncate_dirty_logic_files(1250)  # units 0..12 point below 1250
    assert cq.get_max_offset_in_queue() == 13
    assert len(cq.mapped_file_queue.mapped_files) == 2
    assert cq.max_physic_offset == 1200
    raw = fs.read_bytes(os.path.join(cq.store_path, segment_file_name(SIZE)))
    assert raw[60:] == bytes(SIZE - 60)
    assert cq.put_message_position_info(1250, 100, 0, 13)
    assert cq.get_unit(13) == (1250, 100, 0)
    cq.truncate_dirty_logic_files(0)
    assert cq.get_max_offset_in_queue() == 0 and cq.mapped_file_queue.mapped_files == []


def test_correct_min_offset_and_delete_expired(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    for q in range(25):
        cq.put_message_position_info(q * 100, 100, 0, q)
    cq.correct_min_offset(350)
    assert cq.get_min_offset_in_queue() == 4
    cq.correct_min_offset(10**9)  # nothing qualifies in the first file: unchanged
    assert cq.get_min_offset_in_queue() == 4
    assert cq.delete_expired_file(1500) == 1  # file 0 (units 0..9) all below 1500
    assert cq.get_min_offset_in_queue() == 15
    assert cq.get_unit(14) is None
    assert cq.delete_expired_file(10**9) == 1  # newest kept
    assert len(cq.mapped_file_queue.mapped_files) == 1


def test_recover_truncates_a_torn_last_unit(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    for q in range(23):
        cq.put_message_position_info(q * 100, 100, 0, q)
    last = cq.mapped_file_queue.last_mapped_file
    assert last is not None
    # a torn unit: the offset arrived, the size did not
    last.mapped_buffer[60:68] = struct.pack(">q", 2300)
    while not cq.flush(0):
        pass
    cq2 = make_cq(fs, root, clock)
    assert cq2.load()
    cq2.recover()
    assert cq2.get_max_offset_in_queue() == 23
    assert cq2.max_physic_offset == 2200
    raw = fs.read_bytes(last.file_name)
    assert raw[60:] == bytes(SIZE - 60)
    assert cq2.put_message_position_info(2300, 100, 0, 23)
    assert cq2.get_max_offset_in_queue() == 24


def test_recover_of_full_files(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    for q in range(40):
        cq.put_message_position_info(q * 100 + 1, 100, 0, q)
    cq2 = make_cq(fs, root, clock)
    cq2.load()
    cq2.recover()
    assert cq2.get_max_offset_in_queue() == 40 and cq2.max_physic_offset == 3901
    assert cq2.mapped_file_queue.flushed_where == 40 * 20


def test_destroy(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    cq.put_message_position_info(1, 1, 0, 0)
    cq.destroy()
    assert cq.max_physic_offset == -1 and not fs.exists(cq.store_path)


def test_iter_units_and_list_queues(any_fs: tuple[FileSystem, str], clock: Any) -> None:
    fs, root = any_fs
    a = make_cq(fs, root, clock, topic="A", queue_id=0)
    b = make_cq(fs, root, clock, topic="A", queue_id=3)
    c = make_cq(fs, root, clock, topic="B", queue_id=1)
    for q in range(12):
        a.put_message_position_info(q * 10, 10, q, q)
    b.put_message_position_info(5, 5, 5, 0)
    c.put_message_position_info(7, 7, 7, 0)
    fs.makedirs(os.path.join(root, "consumequeue", "A", "junk"))
    assert list_consume_queues(os.path.join(root, "consumequeue"), fs) == [("A", 0), ("A", 3), ("B", 1)]
    assert list(iter_cq_units(a.store_path, fs)) == [(q, q * 10, 10, q) for q in range(12)]


def test_flush_then_crash_keeps_units() -> None:
    clock = lambda: 1  # noqa: E731
    fs = SimulatedFileSystem(clock_ms=clock)
    fs.makedirs("/s")
    cq = make_cq(fs, "/s", clock, size=6_000_000)
    for q in range(50):
        cq.put_message_position_info(q * 100, 100, 0, q)
    assert not cq.flush(0)
    for q in range(50, 60):
        cq.put_message_position_info(q * 100, 100, 0, q)
    after = fs.crash(seed=3)
    cq2 = make_cq(after, "/s", clock, size=6_000_000)
    assert cq2.load()
    cq2.recover()
    assert cq2.get_max_offset_in_queue() >= 50
    assert [u[0] for u in units(cq2)[:50]] == [q * 100 for q in range(50)]  # type: ignore[index]


@pytest.mark.parametrize("start_q", [0, 5])
def test_get_last_offset(any_fs: tuple[FileSystem, str], clock: Any, start_q: int) -> None:
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    assert cq.get_last_offset() == -1
    cq.put_message_position_info(500, 70, 0, start_q)
    assert cq.get_last_offset() == 570


@pytest.mark.parametrize("min_phy", [0, 250, 2_500])
def test_a_reading_thread_finds_the_offset_by_time_as_the_owner_does(
    any_fs: tuple[FileSystem, str], clock: Any, min_phy: int
) -> None:
    """The reader's getOffsetInQueueByTime (a get's thread, no ask) against the owner's, over
    several files with their own modification times and a queue whose first file was cleaned."""
    fs, root = any_fs
    cq = make_cq(fs, root, clock)
    times = {}
    for q in range(3 * UNITS_PER_FILE + 2):  # three full files and two units of a fourth
        cq.put_message_position_info(q * 100, 100, 0, q)
        times[q * 100] = 1000 + q * 10
    cq.flush(0)
    for i, mapped_file in enumerate(cq.mapped_file_queue.mapped_files):
        # Each file last written at its last unit's store time (the search picks a file by it).
        last_unit = min((i + 1) * UNITS_PER_FILE, 3 * UNITS_PER_FILE + 2) - 1
        fs.set_mtime_ms(mapped_file.file_name, 1000 + last_unit * 10)
    cq.correct_min_offset(min_phy)
    pickup = _fake_log(times)
    reader = ConsumeQueueReader(fs, os.path.join(root, "consumequeue"), mapped_file_size=SIZE)
    bounds = (cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue())
    last_time = 1000 + (3 * UNITS_PER_FILE + 1) * 10
    file_ends = [1000 + ((i + 1) * UNITS_PER_FILE - 1) * 10 for i in range(3)]  # the files' mtimes
    for timestamp in [0, 999, 1000, 1005, 1015, *file_ends, 1000 + UNITS_PER_FILE * 10, last_time - 5, last_time, 10**6]:
        owner = cq.get_offset_in_queue_by_time(timestamp, pickup, min_phy)
        assert reader.offset_by_time("T", 0, bounds, timestamp, pickup, min_phy) == owner, timestamp
    # A queue with no units, and one whose directory does not exist.
    assert reader.offset_by_time("T", 0, (0, 0), 1000, pickup, 0) == 0
    assert reader.offset_by_time("nope", 3, (0, 0), 1000, pickup, 0) == 0
    reader.forget()


# -------------------------------------------------------------------------------------------
# Reserved queue offsets (recovery's `reserved`): gaps filled however long, never misplaced


def _queue(fs: SimulatedFileSystem, per_file: int = 10) -> ConsumeQueue:
    return ConsumeQueue(fs, "T", 0, "/s/consumequeue", mapped_file_size=20 * per_file, clock_ms=lambda: 0)


def test_a_reserved_gap_is_filled_across_file_boundaries() -> None:
    cq = _queue(SimulatedFileSystem())
    for i in range(7):
        assert cq.put_message_position_info(100 + i * 10, 10, 0, i)
    cq.reserved_until = 40
    assert cq.put_message_position_info(1000, 10, 0, 40)  # 40: a file boundary
    assert cq.get_max_offset_in_queue() == 41
    assert all(cq.get_unit(i) == CQ_UNIT.unpack(FILLER_UNIT) for i in range(7, 40))
    assert cq.get_unit(40) == (1000, 10, 0)
    assert len(cq.mapped_file_queue.mapped_files) == 5


def test_a_gap_past_the_damage_limit_is_filled_only_when_reserved(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_FILLED_GAP_UNITS a jump is taken for a damaged queue-offset field (the body CRC
    does not cover it; Java appends the unit where the queue ends). A reserved one is filled."""
    monkeypatch.setattr(consume_queue, "MAX_FILLED_GAP_UNITS", 5)
    cq = _queue(SimulatedFileSystem())
    assert cq.put_message_position_info(100, 10, 0, 0)
    cq.reserved_until = 23
    assert cq.put_message_position_info(1000, 10, 0, 23)
    assert cq.get_max_offset_in_queue() == 24 and cq.get_unit(23) == (1000, 10, 0)
    assert cq.get_unit(22) == CQ_UNIT.unpack(FILLER_UNIT)
    cq = _queue(SimulatedFileSystem())  # not reserved: Java's rule, the unit lands where the queue ends
    assert cq.put_message_position_info(100, 10, 0, 0)
    assert cq.put_message_position_info(1000, 10, 0, 23)
    assert cq.get_max_offset_in_queue() == 2


def test_fill_to_holds_reserved_offsets_with_and_without_files() -> None:
    cq = _queue(SimulatedFileSystem())
    assert cq.fill_to(30)  # no files: the file holding offset 29, fillers to its end
    assert cq.get_max_offset_in_queue() == 30 and cq.get_min_offset_in_queue() == 30
    assert [int(f.file_name.rsplit("/", 1)[-1]) // 20 for f in cq.mapped_file_queue.mapped_files] == [20]
    assert cq.put_message_position_info(500, 10, 0, 30) and cq.get_unit(30) == (500, 10, 0)
    other = _queue(SimulatedFileSystem())
    assert other.put_message_position_info(100, 10, 0, 0)
    assert other.fill_to(12) and other.get_max_offset_in_queue() == 12
    assert other.fill_to(5) and other.get_max_offset_in_queue() == 12  # never backwards


def test_units_below_says_what_a_cut_leaves_without_cutting() -> None:
    cq = _queue(SimulatedFileSystem())
    for i in range(25):
        assert cq.put_message_position_info(100 + i * 10, 10, 0, i)
    for phy, left in ((100, 0), (105, 1), (200, 10), (345, 25), (10_000, 25)):
        assert cq.units_below(phy) == left, phy
        assert cq.get_max_offset_in_queue() == 25
    cq.truncate_dirty_logic_files(200)
    assert cq.get_max_offset_in_queue() == 10


def test_a_queue_ending_in_filler_units_resumes_after_its_last_real_unit() -> None:
    """Found by review: the newest unit of a queue whose lost records' offsets are held by
    fillers points at commitlog offset 0; taken for the duplicate guard and the re-dispatch
    start, every open re-dispatched the whole log."""
    fs = SimulatedFileSystem()
    cq = _queue(fs)
    for i in range(14):
        assert cq.put_message_position_info(100 + i * 10, 10, 0, i)
    assert cq.fill_to(37)  # across two file boundaries
    assert cq.last_real_unit() == (230, 10, 0)
    again = _queue(fs)
    again.load()
    again.recover()
    assert again.get_max_offset_in_queue() == 37 and again.max_physic_offset == 230
    again.truncate_dirty_logic_files(10_000)
    assert again.max_physic_offset == 230
    only = _queue(SimulatedFileSystem())
    assert only.fill_to(5) and only.last_real_unit() is None


def _filler_first_file(fs: FileSystem) -> ConsumeQueue:
    """Units 0..9 (file 0) at 100_000 + 400 i; 10, a quarantined record's, a filler, first of
    file 1; 11..14 real."""
    cq = _queue(fs)
    for i in [*range(10), 11, 12, 13, 14]:
        assert cq.put_message_position_info(100_000 + 400 * i, 400, 0, i)
    assert cq.get_unit(10) == (0, consume_queue.FILLER_UNIT_SIZE, 0)
    return cq


@pytest.mark.parametrize("how", ["truncate", "keep_units_matching", "units_below"])
def test_a_cut_goes_past_a_last_file_whose_first_unit_is_a_filler(how: str) -> None:
    """Review 110 F3: a file's first unit decided whether the cut lay in it, and a filler
    (commitlog offset 0) lies below any cut: with the last file starting with one, the units of
    the file before it that point past the log's end stayed (served another topic's record,
    and the duplicate guard past the log's end dropped acknowledged puts' units)."""
    fs = SimulatedFileSystem()
    cq = _filler_first_file(fs)
    cut = 100_000 + 400 * 7  # the log ends before queue offset 7's record
    if how == "units_below":
        assert cq.units_below(cut) == 7
        return
    if how == "truncate":
        cq.truncate_dirty_logic_files(cut)
    else:
        assert cq.keep_units_matching(cut, lambda offset, size, tags, queue_offset: False) == 0
    assert cq.get_max_offset_in_queue() == 7
    assert [cq.get_unit(q) for q in range(7)] == [(100_000 + 400 * i, 400, 0) for i in range(7)]
    assert cq.max_physic_offset == 100_000 + 400 * 6


@pytest.mark.parametrize("how", ["truncate", "keep_units_matching", "units_below"])
def test_fillers_before_the_cut_stay_and_a_file_of_fillers_only_after_it_goes(how: str) -> None:
    """Fillers hold the offsets of records not in the log: those before the first unit the cut
    removes stay, and so does a file of fillers only that no removed unit precedes."""
    fs = SimulatedFileSystem()
    cq = _queue(fs)
    for i in range(8):
        assert cq.put_message_position_info(100_000 + 400 * i, 400, 0, i)
    assert cq.fill_to(25)  # 8..24: fillers, file 1 of fillers only
    assert cq.put_message_position_info(200_000, 400, 0, 25)
    for cut, left in ((200_000, 25), (100_000 + 400 * 7, 7)):
        if how == "units_below":
            assert cq.units_below(cut) == left, cut
            continue
        if how == "truncate":
            cq.truncate_dirty_logic_files(cut)
        else:
            cq.keep_units_matching(cut, lambda offset, size, tags, queue_offset: False)
        assert cq.get_max_offset_in_queue() == left, cut
        assert cq.last_real_unit() == ((100_000 + 400 * 7 if left == 25 else 100_000 + 400 * 6), 400, 0)


@pytest.mark.parametrize("min_phy_offset", [0, 50_000])
@pytest.mark.parametrize("fillers", [(4,), (0, 4, 9), (4, 5, 6, 7, 8, 9), (0, 1, 2, 3, 4)])
def test_the_time_search_steps_over_filler_units(min_phy_offset: int, fillers: tuple[int, ...]) -> None:
    """Review 110 F1, F2: a filler (commitlog offset 0) the binary search landed on was taken
    for a deleted message once the log's head had moved (the search went right, past its
    target: the store time of #1 answered 5), or, with the head at 0, its store time read -1
    and the whole answer was 0 (a consumer reset by time went back to the queue's start)."""
    from mqstore.storage.consume_queue import offset_by_time_in_file

    times = {100_000 + 400 * i: 1_000 + 10 * i for i in range(10)}
    units = b"".join(
        consume_queue.FILLER_UNIT if i in fillers else CQ_UNIT.pack(100_000 + 400 * i, 400, 0) for i in range(10)
    )

    def pickup(phy: int, size: int) -> int:
        return times.get(phy, -1) if size == 400 else -1

    real = [i for i in range(10) if i not in fillers]
    for i in real:
        assert offset_by_time_in_file(units, 0, 0, times[100_000 + 400 * i], pickup, min_phy_offset) == i, i
        # Between two messages: the nearer real one (the earlier on ties).
        between = offset_by_time_in_file(units, 0, 0, times[100_000 + 400 * i] + 4, pickup, min_phy_offset)
        assert between == i, (i, between)
    assert offset_by_time_in_file(units, 0, 0, 0, pickup, min_phy_offset) == real[0]  # before the first
    assert offset_by_time_in_file(units, 0, 0, 10**6, pickup, min_phy_offset) == real[-1]  # after the last


def test_the_min_offset_is_never_a_filler() -> None:
    """Review 110 F4: a filler at a queue's start (offset 0) was its first live unit while the
    log started at 0: the min offset moved from 1 to 0 at a reopen and the queue's earliest
    message time read -1."""
    cq = _queue(SimulatedFileSystem())
    assert cq.fill_to(1)
    for i in range(1, 5):
        assert cq.put_message_position_info(100 + i * 10, 10, 0, i)
    cq.correct_min_offset(0)
    assert cq.get_min_offset_in_queue() == 1
    cq.correct_min_offset(125)
    assert cq.get_min_offset_in_queue() == 3
